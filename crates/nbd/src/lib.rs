//! The NBD server: fixed newstyle handshake, option haggling, transmission
//! phase with structured replies. Knows nothing about pools; it serves any
//! [`ExportProvider`].
//!
//! PUBLIC API CONTRACT (the daemon codes against exactly these items).
//!
//! # Serving
//! [`serve`] (or [`serve_with_config`]) runs the accept loop on a bound
//! [`tokio::net::TcpListener`], one task per connection, until the
//! `shutdown` watch value becomes `true` (dropping every sender does *not*
//! stop the server). It then stops accepting, lets open connections finish
//! the requests they already sent (up to [`ServerConfig::shutdown_grace`]),
//! closes them, and returns.
//!
//! # Counters
//! [`stats()`] returns the process-wide [`ServerStats`] (atomic counters:
//! connections, requests per command, bytes read/written, errors), shared by
//! every server in the process; export them as Prometheus metrics.
//!
//! # Protocol notes
//! - Fixed newstyle only; `NBD_FLAG_C_NO_ZEROES` honoured.
//! - TLS ([`ServerConfig::tls`]): `NBD_OPT_STARTTLS` upgrades the
//!   connection (rustls; client certificates when the config asks for
//!   them). Without it STARTTLS gets `NBD_REP_ERR_POLICY`. With
//!   [`Tls::require`] (proto.md's FORCEDTLS) every option but STARTTLS and
//!   ABORT gets `NBD_REP_ERR_TLS_REQD` before the upgrade, and
//!   `NBD_OPT_EXPORT_NAME` closes the connection; otherwise (SELECTIVETLS)
//!   exports the provider calls [`Access::TlsRequired`] are left out of
//!   LIST and refused with `NBD_REP_ERR_TLS_REQD`. Who may open what:
//!   [`ExportProvider::access`] with the [`Client`]'s certificate CN.
//! - The empty export name `""` opens `provider.open("")` if that exists,
//!   otherwise the first export of `provider.list()`.
//! - Meta contexts: `base:allocation` plus [`BlockExport::extra_meta_contexts`].
//!   `NBD_OPT_LIST_META_CONTEXT`: no query lists all; a query ending in `:`
//!   (e.g. `base:`, `cistern:`) lists every context with that prefix; other
//!   queries match exact names. `NBD_OPT_SET_META_CONTEXT` selects exact
//!   names only; unknown names are ignored. Both need the export to exist.
//! - Block size constraints advertised: minimum 1, preferred
//!   [`BlockExport::preferred_block_size`] (rounded to a power of two in
//!   512..=32 MiB), maximum payload 32 MiB. Larger WRITEs close the
//!   connection; larger READs get `EOVERFLOW` (structured) or `EINVAL`.
//! - Errors: out of range -> `EINVAL` (`ENOSPC` for WRITE and
//!   WRITE_ZEROES), writes on a read-only export -> `EPERM`, unknown
//!   command or flag -> `EINVAL`. Zero-length requests succeed (after the
//!   range check) except BLOCK_STATUS, which gets `EINVAL`.
//! - See `README.md` in this crate for the full list.

use std::sync::Arc;

#[doc(hidden)]
pub mod fuzzing;
mod handshake;
mod limits;
pub mod proto;
mod server;
mod sink;
mod stats;
mod transmission;

#[cfg(test)]
mod tests;

pub use server::{ServerConfig, Tls};
pub use stats::{stats, ServerStats, StatsSnapshot};

/// Serves NBD on `listener` with the default [`ServerConfig`] until
/// `*shutdown` becomes `true`; see the crate documentation.
///
/// Errors from `accept` are logged and retried, so this only returns once
/// shut down (the `io::Result` is kept for future fatal errors).
pub async fn serve(
    listener: tokio::net::TcpListener,
    provider: Arc<dyn ExportProvider>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    server::serve_with_config(listener, provider, shutdown, ServerConfig::default()).await
}

/// [`serve`] with explicit limits and timeouts.
pub async fn serve_with_config(
    listener: tokio::net::TcpListener,
    provider: Arc<dyn ExportProvider>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    config: ServerConfig,
) -> std::io::Result<()> {
    server::serve_with_config(listener, provider, shutdown, config).await
}

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
    /// The export was taken away (its dataset destroyed, pool exported):
    /// NBD_ESHUTDOWN, and the connection is closed soon after.
    #[error("export closed: {0}")]
    Shutdown(String), // NBD_ESHUTDOWN
}

/// Bytes an export shares with a reply (a cached block's buffer, a heap
/// vector or one a device read landed in): never changed while shared.
pub type SharedBytes = std::sync::Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One piece of a read reply, in order.
#[derive(Clone)]
pub enum ReadChunk {
    Data(Vec<u8>),
    /// A range of a buffer the export shares (a cached block): sent from
    /// there without a copy. A range outside the buffer fails the read (EIO).
    Shared(SharedBytes, std::ops::Range<usize>),
    /// `len` bytes of zeros that are not allocated (sent as NBD_REPLY_TYPE_OFFSET_HOLE).
    Hole(u64),
}

impl ReadChunk {
    /// Bytes this chunk covers.
    pub fn len(&self) -> u64 {
        match self {
            ReadChunk::Data(d) => d.len() as u64,
            ReadChunk::Shared(_, r) => r.len() as u64,
            ReadChunk::Hole(n) => *n,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of a data chunk (None for a hole, or a shared range
    /// outside its buffer).
    pub fn data(&self) -> Option<&[u8]> {
        match self {
            ReadChunk::Data(d) => Some(d),
            ReadChunk::Shared(b, r) => (**b).as_ref().get(r.clone()),
            ReadChunk::Hole(_) => None,
        }
    }
}

/// Equal when they send the same thing (shared buffers by their bytes).
impl PartialEq for ReadChunk {
    fn eq(&self, other: &ReadChunk) -> bool {
        match (self, other) {
            (ReadChunk::Data(a), ReadChunk::Data(b)) => a == b,
            (ReadChunk::Shared(a, ra), ReadChunk::Shared(b, rb)) => {
                ra == rb && (**a).as_ref() == (**b).as_ref()
            }
            (ReadChunk::Hole(a), ReadChunk::Hole(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for ReadChunk {}

impl std::fmt::Debug for ReadChunk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadChunk::Data(d) => f.debug_tuple("Data").field(d).finish(),
            ReadChunk::Shared(b, r) => f
                .debug_tuple("Shared")
                .field(&(**b).as_ref())
                .field(r)
                .finish(),
            ReadChunk::Hole(n) => f.debug_tuple("Hole").field(n).finish(),
        }
    }
}

/// Called once when a FLUSH started by [`BlockExport::flush_start`] is
/// durable (`true`) or must run [`BlockExport::flush`] (`false`).
pub type FlushDone = Box<dyn FnOnce(bool) + Send>;

/// What [`BlockExport::flush_start`] did with a FLUSH.
pub enum FlushStart {
    /// Already durable: answer at once (`done` handed back uncalled).
    Done(FlushDone),
    /// Whoever makes it durable calls `done`.
    Queued,
    /// Queued; the server runs this on a thread that may block (it writes
    /// and calls `done` of the FLUSHes it makes durable).
    Drive(Box<dyn FnOnce() + Send>),
    /// Run [`BlockExport::flush`] on a worker as usual (`done` uncalled).
    Blocking(FlushDone),
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
    /// A READ tried on the connection's reader task, in place of a hand-off
    /// to a worker thread (decision 0062): what [`BlockExport::read`] would
    /// return, if that needs no I/O (cached data). It must not block. `None`:
    /// it would (or it failed), and the server runs `read` on a worker
    /// instead. Default: always `None`.
    fn try_read(&self, offset: u64, len: u64) -> Option<Vec<ReadChunk>> {
        let _ = (offset, len);
        None
    }
    /// `fua`: durable before returning.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError>;
    /// A WRITE without FUA tried on the connection's reader task, in place
    /// of a hand-off to a worker thread (decision 0053). It must not block:
    /// no waiting for I/O, a commit, a suspended pool or a lock held for
    /// long. `None`: it would, nothing was changed, and the server runs
    /// [`BlockExport::write`] on a worker instead. Default: always `None`.
    fn try_write(&self, offset: u64, data: &[u8]) -> Option<Result<(), ExportError>> {
        let _ = (offset, data);
        None
    }
    /// Every write completed before this call, on any connection, becomes durable.
    fn flush(&self) -> Result<(), ExportError>;
    /// A FLUSH started on the connection's reader task without a thread of
    /// its own (decision 0057). Must not block. `done(true)` is called
    /// (from any thread) once what [`BlockExport::flush`] promises holds;
    /// `done(false)` has the server run `flush` on a worker instead (which
    /// reports the error, or waits). Default: always `flush`.
    fn flush_start(&self, done: FlushDone) -> FlushStart {
        FlushStart::Blocking(done)
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError>;
    /// `allocate` = NBD_CMD_FLAG_NO_HOLE was set.
    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        allocate: bool,
        fua: bool,
    ) -> Result<(), ExportError>;
    /// Meta contexts this export offers besides `base:allocation` (e.g. "cistern:changed:snap1").
    fn extra_meta_contexts(&self) -> Vec<String> {
        Vec::new()
    }
    /// Block status for one meta context name (always called with "base:allocation"
    /// or a name from `extra_meta_contexts`). Extents cover a prefix of the range, in order.
    fn block_status(
        &self,
        context: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<StatusExtent>, ExportError>;
    /// Turns `true` when the export is taken away from its clients (e.g.
    /// `destroy -f`): from then on the server answers every request with
    /// `NBD_ESHUTDOWN` for [`ServerConfig::revoke_grace`] and then closes
    /// the connection. `None`: never.
    fn revoked(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        None
    }
    /// The connection is done with the export: called once, after its last
    /// request finished and before its socket is closed, so that whatever
    /// the export holds open is released before the client sees the end.
    fn close(&self) {}
}

/// Who is asking: the peer, whether the connection is TLS, and the common
/// name of its verified client certificate (if it sent one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub peer: std::net::SocketAddr,
    pub tls: bool,
    pub common_name: Option<String>,
}

/// What a [`Client`] may do with one export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    ReadWrite,
    /// Served read-only (writes get `EPERM`) whatever the export says.
    ReadOnly,
    /// Only over TLS (the client gets `NBD_REP_ERR_TLS_REQD` before it).
    TlsRequired,
    /// Not for this client: `NBD_REP_ERR_POLICY` (the message is logged,
    /// not sent).
    Denied(String),
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
    /// [`ExportProvider::open`] for the client at `peer` (the handshake
    /// calls this one; providers that track who has what open override it).
    fn open_from(&self, name: &str, peer: std::net::SocketAddr) -> Option<Arc<dyn BlockExport>> {
        let _ = peer;
        self.open(name)
    }
    /// The exports `client` may see in `NBD_OPT_LIST` (default: all).
    fn list_for(&self, client: &Client) -> Vec<ExportInfo> {
        let _ = client;
        self.list()
    }
    /// What `client` may do with the export `name` (asked before it is
    /// opened; default: everything). An unknown name may answer anything:
    /// the server asks `open` next.
    fn access(&self, name: &str, client: &Client) -> Access {
        let _ = (name, client);
        Access::ReadWrite
    }
}

/// An export served read-only to one client ([`Access::ReadOnly`]).
pub(crate) struct ReadOnlyExport(pub Arc<dyn BlockExport>);

impl BlockExport for ReadOnlyExport {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_only(&self) -> bool {
        true
    }
    fn preferred_block_size(&self) -> u32 {
        self.0.preferred_block_size()
    }
    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError> {
        self.0.read(offset, len)
    }
    fn try_read(&self, offset: u64, len: u64) -> Option<Vec<ReadChunk>> {
        self.0.try_read(offset, len)
    }
    fn write(&self, _: u64, _: &[u8], _: bool) -> Result<(), ExportError> {
        Err(ExportError::Perm("read-only grant".into()))
    }
    fn flush(&self) -> Result<(), ExportError> {
        self.0.flush()
    }
    fn trim(&self, _: u64, _: u64, _: bool) -> Result<(), ExportError> {
        Err(ExportError::Perm("read-only grant".into()))
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool, _: bool) -> Result<(), ExportError> {
        Err(ExportError::Perm("read-only grant".into()))
    }
    fn extra_meta_contexts(&self) -> Vec<String> {
        self.0.extra_meta_contexts()
    }
    fn block_status(
        &self,
        context: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<StatusExtent>, ExportError> {
        self.0.block_status(context, offset, len)
    }
    fn revoked(&self) -> Option<tokio::sync::watch::Receiver<bool>> {
        self.0.revoked()
    }
    fn close(&self) {
        self.0.close()
    }
}
