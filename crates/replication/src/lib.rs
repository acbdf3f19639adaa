//! Replication jobs between two Cistern daemons (issue 14): push (this
//! daemon sends its snapshots into the other's `POST /v1/receive`) or pull
//! (this daemon fetches the other's `POST /v1/send`), over the other
//! daemon's HTTPS API with its token. See README.md.
//!
//! - [`job`]: what a job is (`[replication.NAME]`, `cistern replication add`).
//! - [`side`]: one end of a job, here (the engine) or there (the API).
//! - [`run`]: one run: resume, divergence check, streams, holds, pruning.
//! - [`stream`]: the bounded pipe between the ends, `--bwlimit`, progress.
//! - [`manager`]: the jobs in the daemon: persistence, scheduler, retries,
//!   status, events, metrics; [`routes`]: its `/v1/replication` API.

pub mod engine_io;
pub mod job;
pub mod manager;
pub mod routes;
pub mod run;
pub mod side;
pub mod stream;

pub use job::{AddJob, Direction, JobConfig};
pub use manager::{JobStatus, Manager, ProgressView, RunRecord, RunRequest};

/// Why a job or a run failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Exists(String),
    #[error("{0}")]
    Busy(String),
    /// The target changed since the last common snapshot (what changed is in the message).
    #[error("{0}")]
    Diverged(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("the other daemon: {0}")]
    Remote(api::ClientError),
    #[error("{0}")]
    Engine(dataset::Error),
    #[error("{0}")]
    Stream(String),
    #[error("{0}")]
    Io(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}
