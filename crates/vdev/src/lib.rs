//! One device of a pool: positioned I/O, error counters and the labels at both ends.

pub mod blockbuf;
pub mod bucket;
pub use blockbuf::BlockBuf;
mod cache;
pub mod size;
pub use cache::CacheStats;
pub mod compact;
pub mod irq;
mod label;
mod mmp;
pub mod standby;

/// Points where a test can hold a thread to force an interleaving; not
/// part of the API. Costs one relaxed load when no hook is set.
#[doc(hidden)]
pub mod hooks {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, RwLock};

    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Point {
        /// A write to a bounded bucket cache pinned its lines and has not
        /// written its bytes yet.
        WritePinned { offset: u64 },
        /// An I/O found a cache line another write is landing and waits.
        WaitLanding { line: u64 },
    }

    pub type Hook = Arc<dyn Fn(Point) + Send + Sync>;
    static ARMED: AtomicBool = AtomicBool::new(false);
    static HOOK: RwLock<Option<Hook>> = RwLock::new(None);

    /// Sets (or with `None` clears) the process-wide hook.
    pub fn set(hook: Option<Hook>) {
        let armed = hook.is_some();
        *HOOK.write().unwrap_or_else(|e| e.into_inner()) = hook;
        ARMED.store(armed, Ordering::SeqCst);
    }

    // Pending faults, one per offset: tests of one binary run at once, each
    // at offsets of its own, so arming one must not disarm another's.
    static TEAR: std::sync::Mutex<Vec<(u64, usize)>> = std::sync::Mutex::new(Vec::new());
    static TEAR_ARMED: AtomicBool = AtomicBool::new(false);

    /// The next `write_at` at `offset` writes only its first `keep` bytes
    /// and fails with EIO: a torn local write, which a test cannot cause
    /// on a healthy disk.
    pub fn tear_next_write(offset: u64, keep: usize) {
        let mut t = TEAR.lock().unwrap_or_else(|e| e.into_inner());
        t.retain(|&(at, _)| at != offset);
        t.push((offset, keep));
        TEAR_ARMED.store(true, Ordering::SeqCst);
    }

    pub(crate) fn torn(offset: u64) -> Option<usize> {
        if !TEAR_ARMED.load(Ordering::Relaxed) {
            return None;
        }
        let mut t = TEAR.lock().unwrap_or_else(|e| e.into_inner());
        let i = t.iter().position(|&(at, _)| at == offset)?;
        Some(t.swap_remove(i).1)
    }

    static PUT_BACK: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());
    static PUT_BACK_ARMED: AtomicBool = AtomicBool::new(false);

    /// The next put-back of log-only bytes (after a failed whole-line
    /// write, decision 0063) into the cache line starting at `line_offset`
    /// fails with EIO: a second local failure in a row, which a test cannot
    /// cause on a healthy disk.
    pub fn fail_next_put_back(line_offset: u64) {
        let mut t = PUT_BACK.lock().unwrap_or_else(|e| e.into_inner());
        if !t.contains(&line_offset) {
            t.push(line_offset);
        }
        PUT_BACK_ARMED.store(true, Ordering::SeqCst);
    }

    pub(crate) fn put_back_fails(line_offset: u64) -> bool {
        if !PUT_BACK_ARMED.load(Ordering::Relaxed) {
            return false;
        }
        let mut t = PUT_BACK.lock().unwrap_or_else(|e| e.into_inner());
        match t.iter().position(|&at| at == line_offset) {
            Some(i) => {
                t.swap_remove(i);
                true
            }
            None => false,
        }
    }

    pub(crate) fn at(p: Point) {
        if !ARMED.load(Ordering::Relaxed) {
            return;
        }
        let hook = HOOK.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(h) = hook {
            h(p);
        }
    }
}

pub use label::{
    GroupLayout, Label, LabelError, LayoutKind, Regions, LABEL_SIZE, LABEL_VERSION,
    LABEL_VERSION_PLAIN, LABEL_VERSION_RAIDZ,
};
/// Entry points for the fuzz targets (`fuzz/`, decision 0027); not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use crate::{Label, LabelError, MmpStamp};

    /// One label area as read from a device: `Ok(None)` when blank.
    pub fn decode_label(area: &[u8]) -> Result<Option<Label>, LabelError> {
        crate::label::decode_area("fuzz", area)
    }

    /// The label area written at both ends of a device.
    pub fn encode_label(label: &Label) -> Result<Vec<u8>, LabelError> {
        crate::label::encode_area(label)
    }

    /// The MMP slot: `None` when blank, damaged or newer.
    pub fn decode_mmp(slot: &[u8]) -> Option<MmpStamp> {
        crate::mmp::decode(slot)
    }

    pub fn encode_mmp(stamp: &MmpStamp) -> Vec<u8> {
        crate::mmp::encode(stamp).as_slice().to_vec()
    }
}

pub use mmp::{MmpKind, MmpStamp, Owner, PoolState, MMP_SLOT_OFFSET, MMP_SLOT_SIZE, MMP_VERSION};

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Sector size every allocation is rounded to (ZFS ashift=12).
pub const SECTOR: u64 = 4096;

#[derive(Debug, thiserror::Error)]
pub enum VdevError {
    #[error("{path}: {source}")]
    Open { path: PathBuf, source: io::Error },
    #[error("{path}: device is {size} bytes, at least {min} needed")]
    TooSmall { path: PathBuf, size: u64, min: u64 },
    #[error("{path}: I/O of {len} bytes at offset {offset} beyond device end {size}")]
    OutOfRange {
        path: PathBuf,
        offset: u64,
        len: usize,
        size: u64,
    },
    #[error("{path}: {op} at offset {offset}: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        offset: u64,
        source: io::Error,
    },
}

/// Health of one device as `pool status` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DeviceState {
    Online = 0,
    Degraded = 1,
    Faulted = 2,
    Unavail = 3,
    Offline = 4,
    /// The device vanished while in use (its path is gone or names another file).
    Removed = 5,
}

impl DeviceState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceState::Online => "ONLINE",
            DeviceState::Degraded => "DEGRADED",
            DeviceState::Faulted => "FAULTED",
            DeviceState::Unavail => "UNAVAIL",
            DeviceState::Offline => "OFFLINE",
            DeviceState::Removed => "REMOVED",
        }
    }
    fn from_u8(v: u8) -> Self {
        match v {
            0 => DeviceState::Online,
            1 => DeviceState::Degraded,
            2 => DeviceState::Faulted,
            3 => DeviceState::Unavail,
            5 => DeviceState::Removed,
            _ => DeviceState::Offline,
        }
    }
}

/// READ / WRITE / CKSUM counters, as in `zpool status`.
#[derive(Debug, Default)]
pub struct ErrorCounters {
    pub read: AtomicU64,
    pub write: AtomicU64,
    pub checksum: AtomicU64,
}

/// Buckets of the latency histograms: bucket `i` counts I/Os that took
/// [2^i, 2^(i+1)) ns, the last one everything slower (as `zpool iostat -w`).
pub const LATENCY_BUCKETS: usize = 38;

/// Cumulative I/O counters of one device for `pool iostat`: operations,
/// bytes, time spent in the system call (disk wait) and its histogram.
#[derive(Debug)]
pub struct IoStats {
    pub read_ops: AtomicU64,
    pub write_ops: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub read_nanos: AtomicU64,
    pub write_nanos: AtomicU64,
    pub read_hist: [AtomicU64; LATENCY_BUCKETS],
    pub write_hist: [AtomicU64; LATENCY_BUCKETS],
}

impl Default for IoStats {
    fn default() -> Self {
        IoStats {
            read_ops: AtomicU64::new(0),
            write_ops: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            read_nanos: AtomicU64::new(0),
            write_nanos: AtomicU64::new(0),
            read_hist: std::array::from_fn(|_| AtomicU64::new(0)),
            write_hist: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

/// The histogram bucket of a latency of `nanos`.
pub fn latency_bucket(nanos: u64) -> usize {
    (63 - nanos.max(1).leading_zeros() as usize).min(LATENCY_BUCKETS - 1)
}

impl IoStats {
    fn record(&self, write: bool, bytes: usize, started: std::time::Instant) {
        let nanos = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let (ops, b, t, h) = if write {
            (
                &self.write_ops,
                &self.write_bytes,
                &self.write_nanos,
                &self.write_hist,
            )
        } else {
            (
                &self.read_ops,
                &self.read_bytes,
                &self.read_nanos,
                &self.read_hist,
            )
        };
        ops.fetch_add(1, Ordering::Relaxed);
        b.fetch_add(bytes as u64, Ordering::Relaxed);
        t.fetch_add(nanos, Ordering::Relaxed);
        h[latency_bucket(nanos)].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug)]
pub struct Vdev {
    path: PathBuf,
    file: File,
    /// The same device opened O_DSYNC: a write through it is durable when it
    /// returns, without flushing unrelated dirty data of the device (the
    /// intent log relies on this so a sync write does not wait for a txg).
    dsync_file: File,
    /// The same device opened O_DIRECT where the filesystem allows it: txg
    /// data goes through it, bypassing the page cache, whose writeback is
    /// several times slower than the device here (decision 0004).
    direct_file: Option<File>,
    size: u64,
    state: AtomicU8,
    pub errors: ErrorCounters,
    /// Operations, bytes and latencies for `pool iostat`.
    pub io: IoStats,
    /// Why the device was last FAULTED or REMOVED (for `pool status` and the log).
    reason: parking_lot::Mutex<Option<String>>,
    /// (st_dev, st_ino) of the file opened, to notice the path being
    /// deleted or replaced by another file while the device is in use.
    identity: (u64, u64),
    /// Set for a device that lives in a bucket: `path` is its location and
    /// `file` its local cache; writes are shipped at sync (decision 0039).
    bucket: Option<Box<bucket::Shipper>>,
    /// A bucket device's heartbeat object writer (decision 0048).
    heartbeat: Option<standby::Heartbeat>,
}

/// What [`Vdev::probe`] found wrong with a device that is still open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeFault {
    /// The path is gone or names another file: REMOVED.
    Gone(String),
    /// The device is shorter than when it was opened: FAULTED.
    Shrunk { size: u64, expected: u64 },
}

impl Vdev {
    /// Opens an existing file or block device read-write.
    pub fn open(path: &Path) -> Result<Vdev, VdevError> {
        if bucket::is_location(path) {
            return Vdev::open_location(path, None);
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|source| VdevError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        let size = device_size(&file).map_err(|source| VdevError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let dsync_file = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DSYNC)
                .open(path)
                .map_err(|source| VdevError::Open {
                    path: path.to_path_buf(),
                    source,
                })?
        };
        let direct_file = {
            use std::os::unix::fs::OpenOptionsExt;
            // Read and write: runs of blocks are also read through it.
            OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
                .ok()
        };
        let identity = {
            use std::os::unix::fs::MetadataExt;
            file.metadata()
                .map(|m| (m.dev(), m.ino()))
                .unwrap_or((0, 0))
        };
        Ok(Vdev {
            path: path.to_path_buf(),
            file,
            dsync_file,
            direct_file,
            size,
            state: AtomicU8::new(DeviceState::Online as u8),
            errors: ErrorCounters::default(),
            io: IoStats::default(),
            reason: parking_lot::Mutex::new(None),
            identity,
            bucket: None,
            heartbeat: None,
        })
    }

    /// Opens a device that lives in a bucket (`s3://…`, `file:///…`): the
    /// log is opened as `how.mode` says and replayed into the local cache.
    pub fn open_bucket(how: bucket::BucketOpen<'_>) -> Result<Vdev, VdevError> {
        Vdev::open_bucket_with(how, None)
    }

    /// [`Vdev::open_bucket`] with a bounded cache filled on demand when
    /// `cache_bytes` is set (decision 0054).
    pub fn open_bucket_with(
        how: bucket::BucketOpen<'_>,
        cache_bytes: Option<u64>,
    ) -> Result<Vdev, VdevError> {
        let bound = cache_bytes.map_or(bucket::CacheBound::Full, bucket::CacheBound::Bytes);
        Vdev::open_bucket_bounded(how, bound)
    }

    /// [`Vdev::open_bucket`] with its local cache bounded as `bound` says
    /// (the daemon: `[bucket] cache_bytes` or the default, decision 0063).
    pub fn open_bucket_bounded(
        how: bucket::BucketOpen<'_>,
        bound: bucket::CacheBound,
    ) -> Result<Vdev, VdevError> {
        let url = how.url.to_string();
        let cache = how.cache.to_path_buf();
        let (shipper, _size) =
            bucket::Shipper::open(how, bound).map_err(|why| VdevError::Open {
                path: PathBuf::from(&url),
                source: io::Error::other(why),
            })?;
        Vdev::from_bucket_cache(&url, &cache, shipper)
    }

    /// The device over a bucket device's cache and its shipper; starts the
    /// owner's heartbeat object.
    pub(crate) fn from_bucket_cache(
        url: &str,
        cache: &Path,
        shipper: bucket::Shipper,
    ) -> Result<Vdev, VdevError> {
        let mut dev = Vdev::open(cache)?;
        dev.path = PathBuf::from(url);
        // Only a daemon's devices beat (tests opening devices directly count PUTs).
        if let Some(st) = bucket::settings() {
            let (store, prefix, epoch) = shipper.location();
            dev.heartbeat = Some(standby::Heartbeat::start(
                store,
                prefix,
                format!("{} {epoch:016x}", st.node),
                standby::heartbeat_every(&st.config),
                shipper.appended.clone(),
            ));
        }
        dev.bucket = Some(Box::new(shipper));
        Ok(dev)
    }

    /// `pool takeover`: claims the log of the bucket device at `path`
    /// (fencing its owner) and replays it into this daemon's cache.
    pub fn take_over(path: &Path) -> Result<Vdev, VdevError> {
        Vdev::open_location_as(path, None, objstore::OpenMode::Takeover)
    }

    /// Opens a bucket device with the daemon's settings ([`bucket::configure`]).
    fn open_location(path: &Path, create: Option<u64>) -> Result<Vdev, VdevError> {
        let mode = if create.is_some() {
            objstore::OpenMode::Create
        } else {
            objstore::OpenMode::Resume
        };
        Vdev::open_location_as(path, create, mode)
    }

    fn open_location_as(
        path: &Path,
        create: Option<u64>,
        mode: objstore::OpenMode,
    ) -> Result<Vdev, VdevError> {
        let err = |why: String| VdevError::Open {
            path: path.to_path_buf(),
            source: io::Error::other(why),
        };
        let Some(settings) = bucket::settings() else {
            return Err(err(
                "bucket pools need the daemon's [bucket] settings".into()
            ));
        };
        let url = path.to_string_lossy().to_string();
        let cache = bucket::cache_path(&settings.state_dir, &url);
        Vdev::open_bucket_bounded(
            bucket::BucketOpen {
                url: &url,
                cache: &cache,
                size: create,
                mode,
                s3: settings.config.s3(),
                node: &settings.node,
                inline_max: settings
                    .config
                    .inline_max
                    .unwrap_or(bucket::DEFAULT_INLINE_MAX),
                store: None,
            },
            bucket::CacheBound::from_config(settings.config.cache_bytes),
        )
        .inspect(|dev| dev.start_bucket_background(&settings.config))
    }

    /// What an owner of a bucket device runs beside its writes, however it
    /// came to own it (open, takeover, a standby's takeover): background
    /// compaction and a first physical figure for `pool list` (best effort).
    pub(crate) fn start_bucket_background(&self, config: &bucket::BucketConfig) {
        if let Some(policy) = config.compact_policy() {
            self.start_bucket_compactor(policy);
        }
        if let Some(Err(e)) = self.bucket_refresh_space() {
            tracing::warn!(device = %self.path().display(), "listing the bucket: {e}");
        }
    }

    /// Whether this device lives in a bucket.
    pub fn is_bucket(&self) -> bool {
        self.bucket.is_some()
    }

    /// Why a bucket device stopped shipping (fenced, or a failed PUT).
    pub fn bucket_failure(&self) -> Option<String> {
        self.bucket.as_ref().and_then(|b| b.failure())
    }

    /// Shipping counters of a bucket device.
    pub fn bucket_stats(&self) -> Option<&bucket::ShipStats> {
        self.bucket.as_ref().map(|b| &b.stats)
    }

    /// The bucket's physical figures (decision 0049), as of the last listing.
    pub fn bucket_space(&self) -> Option<compact::Space> {
        self.bucket.as_ref().map(|b| compact::Space {
            cache: b.ondemand.as_ref().map(|c| c.figures()),
            ..b.compactor.space()
        })
    }

    /// Lists the bucket now and returns its physical figures.
    pub fn bucket_refresh_space(&self) -> Option<Result<compact::Space, String>> {
        self.bucket.as_ref().map(|b| b.compactor.refresh())
    }

    /// Runs one compaction now (a checkpoint even if little would be freed
    /// when `force`); `None` for a device not in a bucket.
    pub fn bucket_compact(
        &self,
        policy: &compact::Policy,
        force: bool,
    ) -> Option<Result<compact::Report, String>> {
        self.bucket.as_ref().map(|b| b.compactor.run(policy, force))
    }

    /// Starts background compaction of a bucket device (no-op otherwise).
    pub fn start_bucket_compactor(&self, policy: compact::Policy) {
        if let Some(b) = &self.bucket {
            b.compactor.start(policy);
        }
    }

    /// A write reached the cache: remember it for the next ship.
    fn shipped_later(&self, offset: u64, len: usize) -> Result<(), VdevError> {
        if let Some(b) = &self.bucket {
            if let Some(why) = b.failure() {
                return Err(self.ship_failed(why));
            }
            b.mark(offset, len as u64);
        }
        Ok(())
    }

    /// A failed write or sync of this device: counted in its write errors.
    /// A failed read, counted in the device's read errors.
    fn read_failed(&self, offset: u64, source: io::Error) -> VdevError {
        self.errors.read.fetch_add(1, Ordering::Relaxed);
        VdevError::Io {
            path: self.path.clone(),
            op: "read",
            offset,
            source,
        }
    }

    fn write_failed(&self, op: &'static str, offset: u64, source: io::Error) -> VdevError {
        self.errors.write.fetch_add(1, Ordering::Relaxed);
        VdevError::Io {
            path: self.path.clone(),
            op,
            offset,
            source,
        }
    }

    /// Makes the cached lines of an I/O resident and pins them (a bucket
    /// device with a bounded cache, decision 0054); `None` otherwise.
    fn cache_pin(
        &self,
        offset: u64,
        len: usize,
        write: bool,
    ) -> Result<Option<cache::Pins<'_>>, VdevError> {
        let Some(c) = self.bucket.as_ref().and_then(|b| b.ondemand.as_ref()) else {
            return Ok(None);
        };
        c.pin(offset, len as u64, write).map(Some).map_err(|why| {
            if write {
                self.errors.write.fetch_add(1, Ordering::Relaxed);
            } else {
                self.errors.read.fetch_add(1, Ordering::Relaxed);
            }
            VdevError::Io {
                path: self.path.clone(),
                op: "fetch",
                offset,
                source: io::Error::other(why),
            }
        })
    }

    /// The pool freed `[offset, offset+len)`. A bucket device ships it as
    /// zeros, so compaction can drop it from the bucket (decision 0054);
    /// other devices ignore it. Call only once no committed state names it
    /// and before the space can be allocated again.
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), VdevError> {
        let Some(b) = &self.bucket else {
            return Ok(());
        };
        self.check_range(offset, len as usize)?;
        let r = match &b.ondemand {
            Some(c) => c.discard(offset, len),
            None => bucket::punch_zeros(&self.file, offset, len).map_err(|e| e.to_string()),
        };
        r.map_err(|why| VdevError::Io {
            path: self.path.clone(),
            op: "discard",
            offset,
            source: io::Error::other(why),
        })?;
        self.shipped_later(offset, len as usize)
    }

    /// Counters of a bucket device's bounded cache and the bytes it holds.
    pub fn bucket_cache(&self) -> Option<(&CacheStats, u64)> {
        let c = self.bucket.as_ref()?.ondemand.as_ref()?;
        Some((&c.stats, c.occupied_bytes()))
    }

    fn ship_failed(&self, why: String) -> VdevError {
        if let Some(h) = &self.heartbeat {
            h.stop();
        }
        self.errors.write.fetch_add(1, Ordering::Relaxed);
        if self.state() != DeviceState::Faulted {
            self.set_failed(DeviceState::Faulted, why.clone());
        }
        bucket::ship_error(&self.path, why)
    }

    /// Creates a sparse file of `size` bytes if `path` does not exist, then opens it.
    pub fn open_or_create(path: &Path, size: Option<u64>) -> Result<Vdev, VdevError> {
        if bucket::is_location(path) {
            // Only `pool create`/`add` come here: a new pool in the bucket.
            let size = size
                .or_else(|| bucket::settings().and_then(|st| st.config.cache_size))
                .unwrap_or(bucket::DEFAULT_CACHE_SIZE);
            return Vdev::open_location(path, Some(size));
        }
        if let (Some(size), false) = (size, path.exists()) {
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .map_err(|source| VdevError::Open {
                    path: path.to_path_buf(),
                    source,
                })?;
            file.set_len(size).map_err(|source| VdevError::Open {
                path: path.to_path_buf(),
                source,
            })?;
        }
        Vdev::open(path)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn state(&self) -> DeviceState {
        DeviceState::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub fn set_state(&self, state: DeviceState) {
        self.state.store(state as u8, Ordering::Relaxed);
        if state == DeviceState::Online {
            *self.reason.lock() = None;
        }
    }

    /// Sets a failed state (FAULTED, REMOVED) with the reason `pool status` shows.
    pub fn set_failed(&self, state: DeviceState, reason: String) {
        *self.reason.lock() = Some(reason);
        self.state.store(state as u8, Ordering::Relaxed);
    }

    /// Why the device is FAULTED or REMOVED, if it is.
    pub fn reason(&self) -> Option<String> {
        self.reason.lock().clone()
    }

    /// Checks that the path still names the file opened and that it is as
    /// large as it was (zed's removal and size checks, done by polling).
    pub fn probe(&self) -> Option<ProbeFault> {
        use std::os::unix::fs::MetadataExt;
        let local = self.bucket.as_ref().map_or(&self.path, |b| &b.cache);
        match std::fs::metadata(local) {
            Err(e) => return Some(ProbeFault::Gone(format!("{}: {e}", self.path.display()))),
            Ok(m) if (m.dev(), m.ino()) != self.identity && self.identity != (0, 0) => {
                return Some(ProbeFault::Gone(format!(
                    "{} now names another file",
                    self.path.display()
                )));
            }
            Ok(_) => {}
        }
        match device_size(&self.file) {
            Ok(size) if size < self.size => Some(ProbeFault::Shrunk {
                size,
                expected: self.size,
            }),
            Ok(_) => None,
            Err(e) => Some(ProbeFault::Gone(format!("{}: {e}", self.path.display()))),
        }
    }

    fn check_range(&self, offset: u64, len: usize) -> Result<(), VdevError> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|end| end > self.size)
        {
            return Err(VdevError::OutOfRange {
                path: self.path.clone(),
                offset,
                len,
                size: self.size,
            });
        }
        Ok(())
    }

    /// Reads exactly `buf.len()` bytes; a short read (truncated file) is an error.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), VdevError> {
        self.check_range(offset, buf.len())?;
        let _pins = self.cache_pin(offset, buf.len(), false)?;
        let started = std::time::Instant::now();
        let r = self.file.read_exact_at(buf, offset);
        self.io.record(false, buf.len(), started);
        r.map_err(|source| self.read_failed(offset, source))
    }

    pub fn write_at(&self, offset: u64, data: &[u8]) -> Result<(), VdevError> {
        self.check_range(offset, data.len())?;
        let pins = self.cache_pin(offset, data.len(), true)?;
        if pins.is_some() {
            hooks::at(hooks::Point::WritePinned { offset });
        }
        let started = std::time::Instant::now();
        let r = match hooks::torn(offset) {
            Some(keep) => self
                .file
                .write_all_at(&data[..keep.min(data.len())], offset)
                .and_then(|()| Err(io::Error::from_raw_os_error(libc::EIO))),
            None => self.file.write_all_at(data, offset),
        };
        self.io.record(true, data.len(), started);
        r.map_err(|source| self.write_failed("write", offset, source))?;
        self.shipped_later(offset, data.len())?;
        if let Some(p) = pins {
            p.written();
        }
        Ok(())
    }

    /// Writes `bufs` back to back starting at `offset` (one pwritev per
    /// batch of at most IOV_MAX buffers), so callers need not copy many
    /// blocks into one buffer first.
    pub fn write_vectored_at(&self, offset: u64, bufs: &[&[u8]]) -> Result<(), VdevError> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        self.check_range(offset, total)?;
        let pins = self.cache_pin(offset, total, true)?;
        let mut at = offset;
        let mut rest: Vec<&[u8]> = bufs.iter().copied().filter(|b| !b.is_empty()).collect();
        let mut first = 0;
        while first < rest.len() {
            let batch = &rest[first..rest.len().min(first + 1024)];
            let iov: Vec<libc::iovec> = batch
                .iter()
                .map(|b| libc::iovec {
                    iov_base: b.as_ptr() as *mut libc::c_void,
                    iov_len: b.len(),
                })
                .collect();
            let started = std::time::Instant::now();
            // SAFETY: every iovec points into a live slice borrowed for this call.
            let n = unsafe {
                libc::pwritev(
                    self.file.as_raw_fd(),
                    iov.as_ptr(),
                    iov.len() as libc::c_int,
                    at as libc::off_t,
                )
            };
            if n < 0 {
                let source = io::Error::last_os_error();
                if source.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(self.write_failed("write", at, source));
            }
            if n == 0 {
                let source = io::Error::new(io::ErrorKind::WriteZero, "device accepted no bytes");
                return Err(self.write_failed("write", at, source));
            }
            self.io.record(true, n as usize, started);
            // Skip what was written; a partially written buffer is resumed.
            let mut n = n as usize;
            at += n as u64;
            while n > 0 {
                let len = rest[first].len();
                if n >= len {
                    n -= len;
                    first += 1;
                } else {
                    rest[first] = &rest[first][n..];
                    n = 0;
                }
            }
        }
        self.shipped_later(offset, total)?;
        if let Some(p) = pins {
            p.written();
        }
        Ok(())
    }

    /// Writes an aligned buffer at an aligned offset bypassing the page
    /// cache where the device allows it (falls back to a buffered write).
    /// Durable only after [`Vdev::sync`], like any other write.
    pub fn write_direct_at(&self, offset: u64, data: &AlignedBuf) -> Result<(), VdevError> {
        let Some(direct) = self.direct_file.as_ref().filter(|_| offset % SECTOR == 0) else {
            return self.write_at(offset, data.as_slice());
        };
        self.check_range(offset, data.len())?;
        let pins = self.cache_pin(offset, data.len(), true)?;
        let started = std::time::Instant::now();
        match direct.write_all_at(data.as_slice(), offset) {
            Ok(()) => {
                self.io.record(true, data.len(), started);
                self.shipped_later(offset, data.len())?;
                if let Some(p) = pins {
                    p.written();
                }
                Ok(())
            }
            // Some filesystems accept O_DIRECT at open and refuse it at write.
            // Our pins go first: `write_at` pins the same lines again and
            // would wait for a line this very write is landing.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                drop(pins);
                self.write_at(offset, data.as_slice())
            }
            Err(source) => Err(self.write_failed("write", offset, source)),
        }
    }

    /// Reads into an aligned buffer bypassing the page cache where the
    /// device allows it: large reads then cost no kernel copy (decision 0004).
    pub fn read_direct_at(&self, offset: u64, buf: &mut AlignedBuf) -> Result<(), VdevError> {
        let Some(direct) = self.direct_file.as_ref().filter(|_| offset % SECTOR == 0) else {
            return self.read_at(offset, buf.as_mut_slice());
        };
        self.check_range(offset, buf.len())?;
        let _pins = self.cache_pin(offset, buf.len(), false)?;
        let started = std::time::Instant::now();
        match direct.read_exact_at(buf.as_mut_slice(), offset) {
            Ok(()) => {
                self.io.record(false, buf.len(), started);
                Ok(())
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.read_at(offset, buf.as_mut_slice())
            }
            Err(source) => Err(self.read_failed(offset, source)),
        }
    }

    /// Reads `bufs.iter().map(len).sum()` bytes from `offset` into `bufs` in
    /// order (one scatter read; O_DIRECT where the device allows it, so the
    /// buffers must be sector-aligned whole sectors for that, as
    /// [`BlockBuf`]s are). A short read is an error.
    pub fn read_direct_vectored(
        &self,
        offset: u64,
        bufs: &mut [&mut [u8]],
    ) -> Result<(), VdevError> {
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        self.check_range(offset, len)?;
        let _pins = self.cache_pin(offset, len, false)?;
        let aligned = offset % SECTOR == 0
            && bufs
                .iter()
                .all(|b| b.as_ptr() as u64 % SECTOR == 0 && b.len() as u64 % SECTOR == 0);
        let started = std::time::Instant::now();
        let mut r = match self.direct_file.as_ref().filter(|_| aligned) {
            Some(direct) => preadv_exact(direct, offset, bufs),
            None => preadv_exact(&self.file, offset, bufs),
        };
        if matches!(&r, Err(e) if e.raw_os_error() == Some(libc::EINVAL)) && aligned {
            // Some filesystems accept O_DIRECT at open and refuse it at read.
            r = preadv_exact(&self.file, offset, bufs);
        }
        self.io.record(false, len, started);
        r.map_err(|source| self.read_failed(offset, source))
    }

    /// Writes and returns once those bytes are durable (O_DSYNC).
    pub fn write_durable_at(&self, offset: u64, data: &[u8]) -> Result<(), VdevError> {
        self.check_range(offset, data.len())?;
        let started = std::time::Instant::now();
        if let Some(b) = &self.bucket {
            let pins = self.cache_pin(offset, data.len(), true)?;
            let r = b.write_durable(&self.file, offset, data);
            if let Some(p) = pins {
                p.written();
            }
            self.io.record(true, data.len(), started);
            return r.map_err(|why| self.ship_failed(why));
        }
        let r = self.dsync_file.write_all_at(data, offset);
        self.io.record(true, data.len(), started);
        r.map_err(|source| self.write_failed("write", offset, source))
    }

    /// The descriptor an asynchronous durable write goes through (the
    /// intent log's io_uring path, decision 0068): the O_DSYNC one, or with
    /// `direct` the O_DIRECT one (the caller asks for RWF_DSYNC). `None` for
    /// a bucket device (its writes are shipped) or when O_DIRECT is missing.
    pub fn durable_write_fd(&self, direct: bool) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        if self.bucket.is_some() {
            return None;
        }
        if direct {
            self.direct_file.as_ref().map(|f| f.as_raw_fd())
        } else {
            Some(self.dsync_file.as_raw_fd())
        }
    }

    /// Whether `len` bytes at `offset` lie inside the device.
    pub fn in_range(&self, offset: u64, len: usize) -> bool {
        self.check_range(offset, len).is_ok()
    }

    /// Accounts an asynchronous durable write that succeeded (`pool iostat`).
    pub fn durable_write_done(&self, len: usize, started: std::time::Instant) {
        self.io.record(true, len, started);
    }

    /// Makes every completed write durable (fdatasync).
    pub fn sync(&self) -> Result<(), VdevError> {
        if let Some(b) = &self.bucket {
            // The bucket is the durable copy; the cache is rebuilt from it.
            return b.sync(&self.file).map_err(|why| self.ship_failed(why));
        }
        self.file
            .sync_data()
            .map_err(|source| self.write_failed("sync", 0, source))
    }

    /// Writes zeros over a range and syncs it. Used for the intent-log
    /// region at pool creation: on ext4 an O_DSYNC write into a written
    /// extent costs half of one into a preallocated (unwritten) extent,
    /// measured here with fio: 6080 against 2936 IOPS.
    pub fn fill_zeros(&self, offset: u64, len: u64) -> Result<(), VdevError> {
        const CHUNK: u64 = 4 << 20;
        let zeros = AlignedBuf::zeroed(CHUNK as usize);
        let mut at = offset;
        while at < offset + len {
            let n = CHUNK.min(offset + len - at);
            if n == CHUNK {
                self.write_direct_at(at, &zeros)?;
            } else {
                self.write_at(at, &zeros[..n as usize])?;
            }
            at += n;
        }
        self.sync()
    }

    pub fn read_label(&self) -> Result<Label, LabelError> {
        label::read_label(self)
    }

    /// Whether both ends hold exactly `label` (a scrub rewrites them if not).
    pub fn labels_match(&self, label: &Label) -> Result<bool, LabelError> {
        label::labels_match(self, label)
    }

    /// Writes the label at both ends and syncs.
    pub fn write_label(&self, label: &Label) -> Result<(), LabelError> {
        label::write_label(self, label)
    }

    /// Overwrites both labels with zeros so the device is no longer part of any pool.
    pub fn clear_label(&self) -> Result<(), VdevError> {
        let zeros = vec![0u8; LABEL_SIZE as usize];
        self.write_at(0, &zeros)?;
        self.write_at(self.size - LABEL_SIZE, &zeros)?;
        self.sync()
    }
}

/// A byte buffer whose start is SECTOR-aligned and whose length is a
/// multiple of SECTOR, as O_DIRECT requires.
pub struct AlignedBuf {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// Bytes allocated (>= len): a reused spare may be larger than asked.
    cap: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

/// Large read buffers kept for reuse (see [`AlignedBuf::for_read`]), bounded
/// in count and bytes. Each entry is an allocation of `cap` bytes with
/// [`AlignedBuf::layout`], initialized (it held an earlier read).
struct Spares {
    bufs: Vec<(std::ptr::NonNull<u8>, usize)>,
    bytes: usize,
}

// SAFETY: the spares are plain owned allocations, handed out one owner at a time.
unsafe impl Send for Spares {}

static SPARES: parking_lot::Mutex<Spares> = parking_lot::Mutex::new(Spares {
    bufs: Vec::new(),
    bytes: 0,
});
/// Buffers smaller than this come and go through malloc cheaply.
const SPARE_MIN: usize = 64 << 10;
const SPARE_MAX_COUNT: usize = 32;
const SPARE_MAX_BYTES: usize = 64 << 20;

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes rounded up to whole sectors.
    pub fn zeroed(len: usize) -> AlignedBuf {
        let len = Self::round(len);
        let layout = Self::layout(len);
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else {
            std::alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len, cap: len }
    }

    /// An aligned copy of `bytes`, which are whole sectors: what an O_DIRECT
    /// write of them needs.
    pub fn copy_of(bytes: &[u8]) -> AlignedBuf {
        let mut a = AlignedBuf::for_read(bytes.len());
        a.as_mut_slice().copy_from_slice(bytes);
        a
    }

    /// A buffer of `len` bytes (rounded up to whole sectors) that a device
    /// read is about to fill: its bytes are unspecified (an earlier read's),
    /// never uninitialized. A fresh zeroed buffer per run read cost a fifth
    /// of a cold read's CPU in memset, page faults and munmap (decision 0042).
    pub fn for_read(len: usize) -> AlignedBuf {
        let len = Self::round(len);
        if len >= SPARE_MIN {
            let mut spares = SPARES.lock();
            // The smallest spare that fits without wasting more than half.
            let best = spares
                .bufs
                .iter()
                .enumerate()
                .filter(|(_, (_, cap))| *cap >= len && *cap / 2 <= len)
                .min_by_key(|(_, (_, cap))| *cap)
                .map(|(i, _)| i);
            if let Some(i) = best {
                let (ptr, cap) = spares.bufs.swap_remove(i);
                spares.bytes -= cap;
                return AlignedBuf { ptr, len, cap };
            }
        }
        Self::zeroed(len)
    }

    fn round(len: usize) -> usize {
        len.div_ceil(SECTOR as usize).max(1) * SECTOR as usize
    }

    fn layout(len: usize) -> std::alloc::Layout {
        match std::alloc::Layout::from_size_align(len, SECTOR as usize) {
            Ok(l) => l,
            Err(_) => panic!("aligned buffer of {len} bytes is not representable"),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for cap >= len initialized bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl std::ops::Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap >= SPARE_MIN {
            let mut spares = SPARES.lock();
            if spares.bufs.len() < SPARE_MAX_COUNT && spares.bytes + self.cap <= SPARE_MAX_BYTES {
                spares.bytes += self.cap;
                spares.bufs.push((self.ptr, self.cap));
                return;
            }
        }
        // SAFETY: allocated in `zeroed` with the layout of `cap` bytes.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

/// Fills `bufs` in order from `offset` with `preadv`, resuming after short
/// reads; reaching the end of the file first is `UnexpectedEof`.
fn preadv_exact(file: &File, mut offset: u64, bufs: &mut [&mut [u8]]) -> io::Result<()> {
    let mut slices: Vec<io::IoSliceMut<'_>> =
        bufs.iter_mut().map(|b| io::IoSliceMut::new(b)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let n = rest.len().min(1024) as libc::c_int; // IOV_MAX
                                                     // SAFETY: IoSliceMut is ABI-compatible with `struct iovec` on Unix
                                                     // (documented by std); each one points into a `&mut [u8]` borrowed
                                                     // for this call, so the kernel writes only memory we own.
        let got = unsafe {
            libc::preadv(
                file.as_raw_fd(),
                rest.as_ptr() as *const libc::iovec,
                n,
                offset as libc::off_t,
            )
        };
        if got < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if got == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        offset += got as u64;
        io::IoSliceMut::advance_slices(&mut rest, got as usize);
    }
    Ok(())
}

fn device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    // Block devices report 0 in metadata; seeking to the end gives the size.
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::End(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_buffers_are_reused_within_bounds_and_filled_by_the_read() {
        let dir = tempfile::tempdir().unwrap();
        let vdev = Vdev::open_or_create(&dir.path().join("d0"), Some(8 << 20)).unwrap();
        let want: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        vdev.write_at(1 << 20, &want).unwrap();
        // A spare holding other bytes is taken for the read and overwritten.
        let mut stale = AlignedBuf::for_read(1 << 20);
        stale.as_mut_slice().fill(0xAB);
        drop(stale);
        let mut buf = AlignedBuf::for_read(1 << 20);
        assert_eq!(buf.len(), 1 << 20);
        vdev.read_direct_at(1 << 20, &mut buf).unwrap();
        assert!(buf.as_slice() == want.as_slice());
        drop(buf);
        // Dropping many never keeps more than the bounds.
        let many: Vec<AlignedBuf> = (0..100).map(|_| AlignedBuf::for_read(3 << 20)).collect();
        drop(many);
        let spares = SPARES.lock();
        assert!(spares.bufs.len() <= SPARE_MAX_COUNT && spares.bytes <= SPARE_MAX_BYTES);
        assert_eq!(
            spares.bytes,
            spares.bufs.iter().map(|(_, c)| c).sum::<usize>()
        );
    }

    #[test]
    fn io_beyond_end_is_refused_and_short_reads_fail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d0");
        let vdev = Vdev::open_or_create(&path, Some(1 << 20)).unwrap();
        assert_eq!(vdev.size(), 1 << 20);
        vdev.write_at(4096, b"hello").unwrap();
        let mut buf = [0u8; 5];
        vdev.read_at(4096, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
        assert!(matches!(
            vdev.read_at((1 << 20) - 2, &mut buf),
            Err(VdevError::OutOfRange { .. })
        ));
        assert!(matches!(
            vdev.write_at(u64::MAX - 1, b"xx"),
            Err(VdevError::OutOfRange { .. })
        ));
    }
}
