//! The NBD server: fixed newstyle handshake, option haggling, transmission
//! phase with structured replies. Knows nothing about pools; it serves any
//! [`ExportProvider`].
//!
//! PUBLIC API CONTRACT (the daemon codes against exactly these items).

use std::sync::Arc;

/// Why a request failed; mapped to the NBD error codes on the wire.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ExportError {
    #[error("I/O error: {0}")]
    Io(String), // NBD_EIO
    #[error("permission denied: {0}")]
    Perm(String), // NBD_EPERM
    #[error("no space: {0}")]
    NoSpace(String), // NBD_ENOSPC
    #[error("invalid: {0}")]
    Invalid(String), // NBD_EINVAL
    #[error("not supported: {0}")]
    NotSupported(String), // NBD_ENOTSUP
}

/// One piece of a read reply, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadChunk {
    Data(Vec<u8>),
    /// `len` bytes of zeros that are not allocated (sent as NBD_REPLY_TYPE_OFFSET_HOLE).
    Hole(u64),
}

/// One descriptor of a BLOCK_STATUS reply: `len` bytes with these flags
/// (for base:allocation: bit 0 = NBD_STATE_HOLE, bit 1 = NBD_STATE_ZERO).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusExtent {
    pub len: u64,
    pub flags: u32,
}

/// One export. All methods are blocking; the server calls them from
/// tokio's blocking pool, many at once (they must be thread-safe).
/// The server validates offsets/lengths against `size()` before calling.
pub trait BlockExport: Send + Sync + 'static {
    fn size(&self) -> u64;
    fn read_only(&self) -> bool;
    /// Preferred block size (volblocksize); advertised in NBD_INFO_BLOCK_SIZE.
    fn preferred_block_size(&self) -> u32;
    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError>;
    /// `fua`: durable before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    /// Every write completed before this call, on any connection, becomes durable.
    fn flush(&self) -> Result<(), ExportError>;
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError>;
    /// `allocate` = NBD_CMD_FLAG_NO_HOLE was set.
    fn write_zeroes(&self, offset: u64, len: u64, allocate: bool, fua: bool) -> Result<(), ExportError>;
    /// Meta contexts this export offers besides `base:allocation` (e.g. "cistern:changed:snap1").
    fn extra_meta_contexts(&self) -> Vec<String> {
        Vec::new()
    }
    /// Block status for one meta context name (always called with "base:allocation"
    /// or a name from `extra_meta_contexts`). Extents cover a prefix of the range, in order.
    fn block_status(&self, context: &str, offset: u64, len: u64) -> Result<Vec<StatusExtent>, ExportError>;
}

/// An export the server lists and opens by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    pub name: String,
    pub description: String,
}

/// What the server serves: looked up on every OPT_GO / OPT_INFO / OPT_LIST,
/// so exports created or destroyed while the daemon runs appear or vanish.
pub trait ExportProvider: Send + Sync + 'static {
    fn list(&self) -> Vec<ExportInfo>;
    /// `None` if no such export (the client gets NBD_REP_ERR_UNKNOWN).
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>>;
}
