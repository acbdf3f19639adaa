//! The engine as an NBD export provider: every volume `pool/vol` and every
//! snapshot `pool/vol@snap` (read-only) is the export of the same name.
//! Besides `base:allocation`, each export offers a meta context
//! `cistern:changed:SNAP` per older snapshot of its volume: flag 1 marks
//! ranges whose blocks changed since that snapshot.

use dataset::props::{parse_nbd_clients, NBD_CLIENTS};
use dataset::{Engine, EventKind, Extent, OpenHandle, ReadPiece, Volume, WriteMark};
use nbd::{
    Access, BlockExport, Client, ExportError, ExportInfo, ExportProvider, ReadChunk, StatusExtent,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::sync::watch;

/// NBD_STATE_HOLE / NBD_STATE_ZERO of the `base:allocation` context.
pub const NBD_STATE_HOLE: u32 = 1;
pub const NBD_STATE_ZERO: u32 = 2;
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const CHANGED_PREFIX: &str = "cistern:changed:";
/// Flag of `cistern:changed:SNAP`: the range changed since the snapshot.
pub const NBD_STATE_CHANGED: u32 = 1;

pub struct EngineExports {
    engine: Arc<Engine>,
}

impl EngineExports {
    pub fn new(engine: Arc<Engine>) -> Self {
        Self { engine }
    }
}

impl ExportProvider for EngineExports {
    fn list(&self) -> Vec<ExportInfo> {
        self.engine
            .volume_names()
            .into_iter()
            .map(|name| ExportInfo {
                description: format!("Cistern volume {name}"),
                name,
            })
            .collect()
    }

    /// For OPT_INFO and meta-context queries: a look, not a hold.
    fn open(&self, name: &str) -> Option<Arc<dyn BlockExport>> {
        open_logged(name, self.engine.open_volume(name).map(VolumeExport::new))
    }

    /// For transmission: the client holds the dataset open (destroy,
    /// rollback and pool export refuse, or with -f revoke it).
    fn open_from(&self, name: &str, peer: SocketAddr) -> Option<Arc<dyn BlockExport>> {
        open_logged(name, VolumeExport::held(&self.engine, name, peer))
    }

    /// Exports the client may open (the others look absent).
    fn list_for(&self, client: &Client) -> Vec<ExportInfo> {
        self.list()
            .into_iter()
            .filter(|e| {
                matches!(
                    self.access(&e.name, client),
                    Access::ReadWrite | Access::ReadOnly
                )
            })
            .collect()
    }

    /// `nbd:clients` (inherited): when set, only TLS clients whose
    /// certificate CN is listed may open the export, `:ro` ones read-only.
    fn access(&self, name: &str, client: &Client) -> Access {
        let Ok(value) = self.engine.property_value(name, NBD_CLIENTS) else {
            // No such dataset: `open` says so.
            return Access::ReadWrite;
        };
        access_for(&value, client)
    }
}

/// What `nbd:clients = value` grants `client`.
pub fn access_for(value: &str, client: &Client) -> Access {
    let list = match parse_nbd_clients(value) {
        Ok(None) => return Access::ReadWrite,
        Ok(Some(list)) => list,
        // Checked when set; a bad value that got in some other way shuts
        // the door rather than opening it.
        Err(e) => return Access::Denied(format!("bad nbd:clients value: {e}")),
    };
    if !client.tls {
        return Access::TlsRequired;
    }
    let Some(cn) = client.common_name.as_deref() else {
        return Access::Denied("no client certificate, and nbd:clients is set".into());
    };
    match list.iter().find(|c| c.common_name == cn) {
        Some(c) if c.read_only => Access::ReadOnly,
        Some(_) => Access::ReadWrite,
        None => Access::Denied(format!("certificate CN '{cn}' is not in nbd:clients")),
    }
}

fn open_logged(name: &str, r: dataset::Result<VolumeExport>) -> Option<Arc<dyn BlockExport>> {
    match r {
        Ok(v) => Some(Arc::new(v)),
        Err(dataset::Error::NotFound(_)) => None,
        Err(e) => {
            tracing::warn!(export = %name, "cannot open volume: {e}");
            None
        }
    }
}

#[cfg(test)]
mod access_tests {
    use super::*;

    fn client(tls: bool, cn: Option<&str>) -> Client {
        Client {
            peer: "127.0.0.1:1".parse().unwrap(),
            tls,
            common_name: cn.map(str::to_owned),
        }
    }

    #[test]
    fn grants() {
        let alice = client(true, Some("alice"));
        assert_eq!(access_for("-", &client(false, None)), Access::ReadWrite);
        assert_eq!(access_for("none", &alice), Access::ReadWrite);
        assert_eq!(access_for("alice", &alice), Access::ReadWrite);
        assert_eq!(access_for("bob,alice:ro", &alice), Access::ReadOnly);
        assert_eq!(
            access_for("alice", &client(false, Some("alice"))),
            Access::TlsRequired
        );
        assert!(matches!(access_for("bob", &alice), Access::Denied(_)));
        assert!(matches!(
            access_for("alice", &client(true, None)),
            Access::Denied(_)
        ));
        assert!(matches!(access_for("a,,b", &alice), Access::Denied(_)));
    }
}

/// One open volume as an NBD export.
pub struct VolumeExport {
    gate: Arc<Gate>,
    block_size: u32,
}

/// The volume, while the export may still touch it. Every call holds `vol`
/// for reading; revoking (or closing) takes it for writing and drops the
/// volume (and with it the pool it keeps alive), so it waits for calls in
/// progress and none starts after it.
struct Gate {
    vol: RwLock<Option<Arc<Volume>>>,
    handle: Mutex<Option<OpenHandle>>,
    revoked: watch::Sender<bool>,
    /// Last size and read-only flag seen while open: a revoked export
    /// keeps answering these as before, so its clients get ESHUTDOWN
    /// rather than range errors or EPERM from a vanished dataset.
    size: AtomicU64,
    read_only: AtomicBool,
    /// Set on the first successful write, trim or zeroing: the last client
    /// to disconnect after writing takes an `nbd-disconnect` event snapshot.
    wrote: std::sync::OnceLock<WriteMark>,
}

impl Gate {
    fn new() -> Arc<Gate> {
        Arc::new(Gate {
            vol: RwLock::new(None),
            handle: Mutex::new(None),
            revoked: watch::channel(false).0,
            size: AtomicU64::new(0),
            read_only: AtomicBool::new(false),
            wrote: std::sync::OnceLock::new(),
        })
    }

    /// A change went through (see `wrote`).
    fn changed(&self) {
        if let Some(m) = self.wrote.get() {
            m.mark();
        }
    }

    /// Runs `f` on the volume unless the export was revoked or closed.
    fn with<T>(&self, f: impl FnOnce(&Volume) -> Result<T, ExportError>) -> Result<T, ExportError> {
        let g = self.vol.read().unwrap_or_else(|e| e.into_inner());
        match g.as_deref() {
            Some(v) => f(v),
            None => Err(ExportError::Shutdown(
                "the volume was taken away from its clients".into(),
            )),
        }
    }

    fn open(&self, vol: Arc<Volume>) {
        self.size.store(vol.size(), Ordering::Relaxed);
        self.read_only.store(vol.read_only(), Ordering::Relaxed);
        *self.vol.write().unwrap_or_else(|e| e.into_inner()) = Some(vol);
    }

    /// Closes the gate and releases the hold; `revoke`: tell the connection.
    /// Under the `handle` lock, which `VolumeExport::held` opens the gate
    /// under: a revoke racing with the open cannot leave the gate open.
    fn shut(&self, revoke: bool) {
        let mut handle = self.handle.lock().unwrap_or_else(|e| e.into_inner());
        if revoke {
            self.revoked.send_replace(true);
        }
        let vol = self.vol.write().unwrap_or_else(|e| e.into_inner()).take();
        let handle = handle.take();
        drop((vol, handle));
    }
}

impl VolumeExport {
    /// An export that holds nothing (a look at size and contexts).
    pub fn new(vol: Arc<Volume>) -> Self {
        let gate = Gate::new();
        let block_size = vol.block_size();
        gate.open(vol);
        Self { gate, block_size }
    }

    /// An export held open by the client at `peer`: registered with the
    /// engine first, so a destroy in progress refuses it.
    pub fn held(engine: &Engine, name: &str, peer: SocketAddr) -> dataset::Result<Self> {
        let gate = Gate::new();
        let weak = Arc::downgrade(&gate);
        let revoke: dataset::Revoke = Arc::new(move |reason: &str| {
            if let Some(g) = weak.upgrade() {
                tracing::info!(%peer, "NBD client disconnected: {reason}");
                g.shut(true);
            }
        });
        let handle = engine.open_handle(name, &format!("NBD client {peer}"), revoke)?;
        handle.snapshot_on_close(EventKind::NbdDisconnect);
        let _ = gate.wrote.set(handle.write_mark());
        let vol = engine.open_volume(name)?;
        let block_size = vol.block_size();
        // Revoked in between: the handle is gone and the volume stays out.
        let mut h = gate.handle.lock().unwrap_or_else(|e| e.into_inner());
        if !*gate.revoked.borrow() {
            *h = Some(handle);
            gate.open(vol);
        }
        drop(h);
        Ok(Self { gate, block_size })
    }
}

impl Drop for VolumeExport {
    fn drop(&mut self) {
        self.gate.shut(false);
    }
}

/// dataset::Error -> the NBD error the client sees.
pub fn map_error(e: dataset::Error) -> ExportError {
    use dataset::Error as E;
    match e {
        E::ReadOnly(m) => ExportError::Perm(format!("{m} is read-only")),
        E::NoSpace(m) => ExportError::NoSpace(m),
        E::InvalidArgument(m) => ExportError::Invalid(m),
        other => {
            // One line a minute (with the count left out), not one per request.
            static FAILED: pool::RateLog = pool::RateLog::new(std::time::Duration::from_secs(60));
            if let Some(more) = FAILED.admit("volume I/O") {
                tracing::warn!(more_not_logged = more, "volume I/O failed: {other}");
            }
            ExportError::Io(other.to_string())
        }
    }
}

pub fn map_piece(p: ReadPiece) -> ReadChunk {
    match p {
        ReadPiece::Data(b, r) => ReadChunk::Shared(b.shared(), r),
        ReadPiece::Hole(n) => ReadChunk::Hole(n),
    }
}

/// Allocation extents -> base:allocation descriptors, merging neighbours
/// with equal flags and dropping empty ones (NBD forbids zero-length extents).
pub fn map_extents(extents: &[Extent]) -> Vec<StatusExtent> {
    let mut out: Vec<StatusExtent> = Vec::with_capacity(extents.len());
    for e in extents {
        if e.len == 0 {
            continue;
        }
        let mut flags = 0;
        if e.hole {
            flags |= NBD_STATE_HOLE;
        }
        if e.zero || e.hole {
            flags |= NBD_STATE_ZERO;
        }
        match out.last_mut() {
            Some(last)
                if last.flags == flags
                    && last
                        .len
                        .checked_add(e.len)
                        .is_some_and(|l| l <= u32::MAX as u64) =>
            {
                last.len += e.len
            }
            _ => out.push(StatusExtent { len: e.len, flags }),
        }
    }
    out
}

impl BlockExport for VolumeExport {
    fn size(&self) -> u64 {
        let g = &self.gate;
        g.with(|v| Ok(v.size()))
            .inspect(|s| g.size.store(*s, Ordering::Relaxed))
            .unwrap_or_else(|_| g.size.load(Ordering::Relaxed))
    }

    fn read_only(&self) -> bool {
        let g = &self.gate;
        g.with(|v| Ok(v.read_only()))
            .unwrap_or_else(|_| g.read_only.load(Ordering::Relaxed))
    }

    fn preferred_block_size(&self) -> u32 {
        self.block_size
    }

    fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadChunk>, ExportError> {
        // Cached blocks go to the socket as they are (no copy).
        let pieces = self
            .gate
            .with(|v| v.read_pieces(offset, len).map_err(map_error))?;
        Ok(pieces.into_iter().map(map_piece).collect())
    }

    fn try_read(&self, offset: u64, len: u64) -> Option<Vec<ReadChunk>> {
        // A gate being shut (revoke, close) waits for no one here.
        let g = self.gate.vol.try_read().ok()?;
        let pieces = g.as_deref()?.try_read_pieces(offset, len)?;
        Some(pieces.into_iter().map(map_piece).collect())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), ExportError> {
        self.gate
            .with(|v| v.write(offset, data, fua).map_err(map_error))?;
        self.gate.changed();
        Ok(())
    }

    fn try_write(&self, offset: u64, data: &[u8]) -> Option<Result<(), ExportError>> {
        // A gate being shut (revoke, close) waits for no one here.
        let g = self.gate.vol.try_read().ok()?;
        let r = g.as_deref()?.try_write(offset, data)?.map_err(map_error);
        drop(g);
        if r.is_ok() {
            self.gate.changed();
        }
        Some(r)
    }

    fn flush(&self) -> Result<(), ExportError> {
        self.gate.with(|v| v.flush().map_err(map_error))
    }

    fn flush_start(&self, done: nbd::FlushDone) -> nbd::FlushStart {
        // A gate being shut (revoke, close) waits for no one here.
        let Ok(g) = self.gate.vol.try_read() else {
            return nbd::FlushStart::Blocking(done);
        };
        let Some(v) = g.as_deref() else {
            return nbd::FlushStart::Blocking(done);
        };
        match v.flush_deferred(done) {
            dataset::FlushStart::Done(w) => nbd::FlushStart::Done(w),
            dataset::FlushStart::Queued => nbd::FlushStart::Queued,
            dataset::FlushStart::Drive(f) => nbd::FlushStart::Drive(f),
            dataset::FlushStart::Refused(w) => nbd::FlushStart::Blocking(w),
        }
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), ExportError> {
        self.gate
            .with(|v| v.trim(offset, len, fua).map_err(map_error))?;
        self.gate.changed();
        Ok(())
    }

    fn revoked(&self) -> Option<watch::Receiver<bool>> {
        Some(self.gate.revoked.subscribe())
    }

    fn close(&self) {
        self.gate.shut(false);
    }

    fn write_zeroes(
        &self,
        offset: u64,
        len: u64,
        allocate: bool,
        fua: bool,
    ) -> Result<(), ExportError> {
        self.gate.with(|v| {
            v.write_zeroes(offset, len, allocate, fua)
                .map_err(map_error)
        })?;
        self.gate.changed();
        Ok(())
    }

    fn extra_meta_contexts(&self) -> Vec<String> {
        self.gate
            .with(|v| Ok(v.older_snapshots()))
            .unwrap_or_default()
            .into_iter()
            .map(|s| format!("{CHANGED_PREFIX}{s}"))
            .collect()
    }

    fn block_status(
        &self,
        context: &str,
        offset: u64,
        len: u64,
    ) -> Result<Vec<StatusExtent>, ExportError> {
        self.gate.with(|v| block_status(v, context, offset, len))
    }
}

/// Block status of one meta context (see the module documentation).
fn block_status(
    vol: &Volume,
    context: &str,
    offset: u64,
    len: u64,
) -> Result<Vec<StatusExtent>, ExportError> {
    {
        if let Some(snap) = context.strip_prefix(CHANGED_PREFIX) {
            let runs = vol.changed_since(snap, offset, len).map_err(map_error)?;
            return Ok(runs
                .into_iter()
                .filter(|(n, _)| *n > 0)
                .map(|(n, changed)| StatusExtent {
                    len: n,
                    flags: if changed { NBD_STATE_CHANGED } else { 0 },
                })
                .collect());
        }
        if context != BASE_ALLOCATION {
            return Err(ExportError::NotSupported(format!("meta context {context}")));
        }
        let extents = vol.allocation(offset, len).map_err(map_error)?;
        let out = map_extents(&extents);
        if out.is_empty() {
            return Err(ExportError::Io(format!(
                "no allocation information for {len} bytes at {offset}"
            )));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dataset::Error as E;

    #[test]
    fn maps_errors() {
        assert!(matches!(
            map_error(E::ReadOnly("tank/v".into())),
            ExportError::Perm(_)
        ));
        assert!(matches!(
            map_error(E::NoSpace("tank".into())),
            ExportError::NoSpace(_)
        ));
        assert!(matches!(
            map_error(E::InvalidArgument("x".into())),
            ExportError::Invalid(_)
        ));
        assert!(matches!(
            map_error(E::Corrupt("x".into())),
            ExportError::Io(_)
        ));
        assert!(matches!(map_error(E::Io("x".into())), ExportError::Io(_)));
        assert!(matches!(
            map_error(E::NotFound("x".into())),
            ExportError::Io(_)
        ));
        assert!(matches!(map_error(E::Busy("x".into())), ExportError::Io(_)));
    }

    #[test]
    fn maps_read_segments() {
        let buf = Arc::new(vec![1, 2, 3]);
        let got = map_piece(ReadPiece::Data(buf.clone().into(), 1..3));
        assert_eq!(got, ReadChunk::Shared(buf, 1..3));
        assert_eq!(got.data(), Some(&[2u8, 3][..]));
        assert_eq!(map_piece(ReadPiece::Hole(4096)), ReadChunk::Hole(4096));
    }

    #[test]
    fn maps_extents_to_allocation_flags() {
        let ext = |len, hole, zero| Extent { len, hole, zero };
        let got = map_extents(&[
            ext(4096, true, true),
            ext(4096, true, false), // a hole always reads as zeros
            ext(0, false, false),
            ext(8192, false, false),
            ext(4096, false, true),
            ext(4096, false, false),
        ]);
        assert_eq!(
            got,
            vec![
                StatusExtent {
                    len: 8192,
                    flags: NBD_STATE_HOLE | NBD_STATE_ZERO
                },
                StatusExtent {
                    len: 8192,
                    flags: 0
                },
                StatusExtent {
                    len: 4096,
                    flags: NBD_STATE_ZERO
                },
                StatusExtent {
                    len: 4096,
                    flags: 0
                },
            ]
        );
    }

    #[test]
    fn does_not_merge_past_u32() {
        let big = Extent {
            len: u32::MAX as u64,
            hole: true,
            zero: true,
        };
        assert_eq!(map_extents(&[big, big]).len(), 2);
    }
}
