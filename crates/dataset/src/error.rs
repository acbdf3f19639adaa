use thiserror::Error;

/// Errors the engine reports to the front ends. Each variant maps to one
/// HTTP status / NBD errno at the edge; the message names the problem.
#[derive(Debug, Error)]
pub enum Error {
    #[error("{0} does not exist")]
    NotFound(String),
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// The message says what is in the way.
    #[error("{0}")]
    Busy(String),
    /// Out of space or over a quota (ENOSPC/EDQUOT); the message says which.
    #[error("{0}")]
    NoSpace(String),
    #[error("{0} is read-only")]
    ReadOnly(String),
    #[error("data error: {0}")]
    Corrupt(String),
    #[error("I/O error: {0}")]
    Io(String),
    /// A pool in an older format; the message names `pool upgrade`.
    #[error("{0}")]
    NeedsUpgrade(String),
    /// An encrypted dataset whose key is not loaded, or a wrong key given
    /// (decision 0026); the message names the dataset.
    #[error("{0}")]
    KeyUnavailable(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
