//! `cistern bench`: measure and size storage honestly.
//!
//! * [`cli`]: the `cistern bench` subcommands (`iops`, `chart`, `provision`,
//!   `latency`, `list`, `compress`) and [`cli::run`].
//! * [`stats`]: per-second series, latency histogram, quantiles, "X or better".
//! * [`provision`]: nodes needed for a target IOPS (Monte Carlo and exact).
//! * [`plan`]: pool layouts for N drives: capacity, failures, predicted speed
//!   (`cistern pool plan`); [`measure`] measures one drive for it.
//! * [`target`]: what a benchmark writes to (file/device, NBD, S3: [`s3`]).
//! * [`s3_client`], [`sigv4`]: a small blocking S3 client and its signing.
//! * [`list`]: `bench list`, listings of a bucket of N objects.
//! * [`nbd_client`]: a small blocking NBD client.
//! * [`svg`]: hand-written SVG charts.

pub mod cli;
pub mod compress;
pub mod interrupt;
pub mod iops;
pub mod latency;
pub mod list;
pub mod measure;
pub mod nbd_client;
pub mod plan;
pub mod provision;
pub mod s3;
pub mod s3_client;
pub mod sigv4;
pub mod stats;
pub mod svg;
pub mod target;
pub mod util;
