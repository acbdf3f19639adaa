//! What the `cistern` binary shares as a library: the config file parser,
//! so that the fuzz targets (`fuzz/`, decision 0027) reach it without
//! running the daemon.

pub mod config;
