//! A device whose durable copy lives in an object store (issue 18, decision 0039).
//!
//! The pool writes a local cache file exactly as it writes any device; the
//! device remembers which ranges changed. `sync()` (txg commits) and
//! `write_durable_at()` (the intent log, FLUSH/FUA) ship those ranges to the
//! pool's log in the bucket (`objstore::Log`, create-if-absent) and return
//! only once the log record exists there. Small changes ride inline in the
//! record; larger ones go first to immutable checksummed segment objects
//! `PREFIX/seg/<epoch>-<n>` that the record names. Concurrent syncs share
//! one PUT (`objstore::GroupCommit`). Opening the device replays the log into
//! the cache, so the bucket alone is the pool.
//!
//! One writer: a takeover creates the next log record, and this device's next
//! append then finds it and is fenced; from then on every write and sync
//! fails (EIO) and nothing more is acknowledged. Any other failed ship also
//! fails the device for good (FAULTED): a later sync must never be
//! acknowledged while writes an earlier one carried are not in the bucket.

use crate::{VdevError, MMP_SLOT_OFFSET, MMP_SLOT_SIZE};
use bytes::{BufMut, Bytes, BytesMut};
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use objstore::location::S3Settings;
use objstore::record::Record;
use objstore::{GroupCommit, Log, LogError, OpenMode, OwnerId};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// Changes up to this many bytes go inline in the log record (one PUT).
pub const DEFAULT_INLINE_MAX: usize = 256 << 10;
/// Bytes per segment object.
pub const SEGMENT_MAX: usize = 32 << 20;
/// Segment PUTs of one sync in flight at once (bounds memory to 4 x 32 MiB).
const UPLOADS_IN_FLIGHT: usize = 4;
/// Granularity of the all-zero check (zeros are shipped as a length only).
const CHUNK: usize = 64 << 10;
/// Default size of the local cache (the device size) of a new bucket pool.
pub const DEFAULT_CACHE_SIZE: u64 = 8 << 30;
/// The default bound of the local cache (`[bucket] cache_bytes` unset,
/// decision 0063): a quarter of the local disk's free space at open, at
/// least [`CACHE_FLOOR`], at most [`CACHE_CAP`], never more than the device.
pub const CACHE_FLOOR: u64 = 1 << 30;
pub const CACHE_CAP: u64 = 64 << 30;

/// How much of a bucket device the local cache may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheBound {
    /// The whole device, rebuilt at open (tests, and builds before 0063's default).
    Full,
    /// At most this many bytes, filled on demand (decision 0054).
    Bytes(u64),
    /// [`default_cache_bytes`] of the device and the cache's free disk.
    Default,
}

impl CacheBound {
    /// `[bucket] cache_bytes` as a bound: unset is the default bound.
    pub fn from_config(cache_bytes: Option<u64>) -> CacheBound {
        cache_bytes.map_or(CacheBound::Default, CacheBound::Bytes)
    }
}

/// The bound of the cache of a `device`-byte device when `free` bytes are
/// free on the disk that holds it (decision 0063).
pub fn default_cache_bytes(device: u64, free: u64) -> u64 {
    (free / 4).clamp(CACHE_FLOOR, CACHE_CAP).min(device)
}

/// Bytes free (for an unprivileged user) on the filesystem holding `dir`.
pub fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::other("a path with a NUL byte"))?;
    // SAFETY: statvfs fills the zeroed struct; `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Version of the entries this module writes into log records when no
/// segment it names has a chunk table (inline changes, zeros).
pub const ENTRY_VERSION: u8 = 1;
/// Version of entries whose segments carry a chunk table (decision 0059).
pub const ENTRY_VERSION_CHUNKED: u8 = 3;
/// log2 of the bytes each chunk sum covers: 1 MiB, the cache line.
pub const CHUNK_SHIFT: u8 = 20;

/// The blake3 of each `1 << CHUNK_SHIFT` piece of a segment body.
pub fn chunk_sums(body: &[u8]) -> Vec<[u8; 32]> {
    body.chunks(1 << CHUNK_SHIFT)
        .map(|c| *blake3::hash(c).as_bytes())
        .collect()
}

/// `[bucket]` in the config: how bucket pools reach their store. Unset keys
/// fall back to the AWS_* environment variables.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct BucketConfig {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub access_key_id: Option<String>,
    pub secret_access_key: Option<String>,
    /// Size of a new bucket pool's device (its sparse local cache), bytes
    /// or a size such as "64G".
    #[serde(deserialize_with = "crate::size::de_opt_size")]
    pub cache_size: Option<u64>,
    /// Largest change shipped inline in a log record, bytes.
    pub inline_max: Option<usize>,
    /// Bound of the local cache, bytes (decision 0054): opening fetches no
    /// segment, reads fetch what they miss, least recently used data is
    /// evicted. Unset: [`default_cache_bytes`] (decision 0063).
    /// Bytes or a size such as "64M", as the `[engine]` sizes.
    #[serde(deserialize_with = "crate::size::de_opt_size")]
    pub cache_bytes: Option<u64>,
    /// A standby (`serve --standby`) takes the pool over by itself once the
    /// owner's log and heartbeat object have not changed for this long.
    /// Off by default; safety never depends on it (decision 0048).
    pub takeover_after_secs: Option<u64>,
    /// How often an owner rewrites its heartbeat object, milliseconds
    /// (skipped while it appends log records). Unset: a quarter of
    /// `takeover_after_secs`, else a minute ([`crate::standby::heartbeat_every`],
    /// decision 0071).
    pub heartbeat_ms: Option<u64>,
    /// The longest wait, milliseconds, between two looks of an idle
    /// standby for the owner's next record and heartbeat (two GETs; default
    /// 5000, 200 while the owner writes). Latency only: safety never
    /// waits on it (`standby::DEFAULT_POLL_MAX_MS`).
    pub standby_poll_max_ms: Option<u64>,
    /// Segments whose live share falls under this percentage are rewritten
    /// by compaction (decision 0049; default 50, 0 keeps every segment).
    pub compact_below_percent: Option<u8>,
    /// Seconds between background compaction checks (default 60; 0: off).
    pub compact_interval_secs: Option<u64>,
    /// Seconds a checkpoint waits before deleting what it supersedes, for
    /// readers that started before it (default 30).
    pub compact_grace_secs: Option<u64>,
}

impl BucketConfig {
    /// The compaction policy, or `None` when background compaction is off.
    pub fn compact_policy(&self) -> Option<crate::compact::Policy> {
        let d = crate::compact::Policy::default();
        let interval = self
            .compact_interval_secs
            .map_or(d.interval, std::time::Duration::from_secs);
        if interval.is_zero() {
            return None;
        }
        Some(crate::compact::Policy {
            below_percent: self
                .compact_below_percent
                .unwrap_or(d.below_percent)
                .min(100),
            interval,
            grace: self
                .compact_grace_secs
                .map_or(d.grace, std::time::Duration::from_secs),
        })
    }

    pub fn s3(&self) -> S3Settings {
        S3Settings {
            endpoint: self.endpoint.clone(),
            region: self.region.clone(),
            access_key_id: self.access_key_id.clone(),
            secret_access_key: self.secret_access_key.clone(),
        }
    }
}

/// What the daemon set at start: where caches live and who this node is.
#[derive(Debug, Clone)]
pub struct Settings {
    pub state_dir: PathBuf,
    pub node: String,
    pub config: BucketConfig,
}

static SETTINGS: Mutex<Option<Settings>> = Mutex::new(None);

/// Called once by the daemon before it imports pools. The node name is the
/// host name and the state directory's identity: a restarted daemon resumes
/// its own pools, another state directory (a standby) must take over.
pub fn configure(state_dir: &Path, config: BucketConfig) {
    let canonical = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let id = blake3::hash(canonical.as_os_str().as_encoded_bytes());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    let node = format!("{host}-{}", &id.to_hex()[..16]);
    *SETTINGS.lock() = Some(Settings {
        state_dir: state_dir.to_path_buf(),
        node,
        config,
    });
}

pub fn settings() -> Option<Settings> {
    SETTINGS.lock().clone()
}

/// Whether a device name is a bucket location rather than a path.
pub fn is_location(path: &Path) -> bool {
    let s = path.to_string_lossy();
    s.starts_with("s3://") || s.starts_with("file://")
}

/// The cache file of `url` under a state directory.
pub fn cache_path(state_dir: &Path, url: &str) -> PathBuf {
    let h = blake3::hash(url.as_bytes());
    state_dir
        .join("bucket")
        .join(format!("{}.cache", &h.to_hex()[..16]))
}

pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bucket-io")
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => panic!("cannot start the bucket I/O runtime: {e}"),
        }
    })
}

/// Runs `f` on the bucket runtime and waits for it from synchronous code
/// (also from a thread of another runtime: the wait is a plain channel).
pub(crate) fn block<T: Send + 'static>(
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, String> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv()
        .map_err(|_| "the bucket I/O task ended without an answer".to_string())
}

static LEGACY_ENTRIES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Tests only: write segments without chunk tables (version 1 entries, as
/// builds before decision 0059 did), to check that such pools still read.
#[doc(hidden)]
pub fn set_legacy_entries(on: bool) {
    LEGACY_ENTRIES.store(on, Ordering::SeqCst);
}

pub(crate) fn legacy_entries() -> bool {
    LEGACY_ENTRIES.load(Ordering::Relaxed)
}

/// One change of a log entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Data {
        offset: u64,
        data: Bytes,
    },
    Zero {
        offset: u64,
        len: u64,
    },
    /// `len` bytes at `offset` are at `seg_offset` in segment `seg`.
    Seg {
        offset: u64,
        len: u64,
        seg: u16,
        seg_offset: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentRef {
    pub name: String,
    pub len: u64,
    /// blake3 of the whole object.
    pub sum: [u8; 32],
    /// blake3 of each 1 MiB of it, so a range can be verified (decision
    /// 0059); empty for segments named by version 1 entries.
    pub chunks: Vec<[u8; 32]>,
}

/// One entry: the device size (so the log alone describes the device), the
/// segments it names and the changes in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub size: u64,
    pub segments: Vec<SegmentRef>,
    pub ops: Vec<Op>,
}

#[derive(Debug, thiserror::Error)]
#[error("bucket log entry: {0}")]
pub struct EntryError(String);

impl Entry {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        // Version 1, byte for byte as before, unless a segment has a table.
        let chunked = self.segments.iter().any(|s| !s.chunks.is_empty());
        b.put_u8(if chunked {
            ENTRY_VERSION_CHUNKED
        } else {
            ENTRY_VERSION
        });
        b.put_u64(self.size);
        b.put_u16(self.segments.len() as u16);
        for s in &self.segments {
            b.put_u16(s.name.len() as u16);
            b.put_slice(s.name.as_bytes());
            b.put_u64(s.len);
            b.put_slice(&s.sum);
            if chunked {
                b.put_u8(CHUNK_SHIFT);
                b.put_u32(s.chunks.len() as u32);
                for c in &s.chunks {
                    b.put_slice(c);
                }
            }
        }
        b.put_u32(self.ops.len() as u32);
        for op in &self.ops {
            match op {
                Op::Data { offset, data } => {
                    b.put_u8(1);
                    b.put_u64(*offset);
                    b.put_u64(data.len() as u64);
                    b.put_slice(data);
                }
                Op::Zero { offset, len } => {
                    b.put_u8(2);
                    b.put_u64(*offset);
                    b.put_u64(*len);
                }
                Op::Seg {
                    offset,
                    len,
                    seg,
                    seg_offset,
                } => {
                    b.put_u8(3);
                    b.put_u64(*offset);
                    b.put_u64(*len);
                    b.put_u16(*seg);
                    b.put_u64(*seg_offset);
                }
            }
        }
        b.freeze()
    }

    pub fn decode(data: &Bytes) -> Result<Entry, EntryError> {
        let mut c = Cursor { data, at: 0 };
        let version = c.u8()?;
        if version != ENTRY_VERSION && version != ENTRY_VERSION_CHUNKED {
            return Err(EntryError(format!(
                "version {version}, this build reads {ENTRY_VERSION} and {ENTRY_VERSION_CHUNKED}"
            )));
        }
        let size = c.u64()?;
        let nseg = c.u16()? as usize;
        let mut segments = Vec::with_capacity(nseg.min(1024));
        for _ in 0..nseg {
            let n = c.u16()? as usize;
            let name = String::from_utf8(c.take(n)?.to_vec())
                .map_err(|_| EntryError("segment name is not UTF-8".into()))?;
            let len = c.u64()?;
            let mut sum = [0u8; 32];
            sum.copy_from_slice(&c.take(32)?);
            let mut chunks = Vec::new();
            if version == ENTRY_VERSION_CHUNKED {
                let shift = c.u8()?;
                let n = c.u32()? as u64;
                if shift != CHUNK_SHIFT {
                    return Err(EntryError(format!("chunk size 2^{shift}")));
                }
                if n != 0 && n != len.div_ceil(1 << CHUNK_SHIFT) {
                    return Err(EntryError(format!(
                        "{n} chunk sums for a segment of {len} bytes"
                    )));
                }
                for _ in 0..n {
                    let mut one = [0u8; 32];
                    one.copy_from_slice(&c.take(32)?);
                    chunks.push(one);
                }
            }
            segments.push(SegmentRef {
                name,
                len,
                sum,
                chunks,
            });
        }
        let nops = c.u32()? as usize;
        let mut ops = Vec::with_capacity(nops.min(1 << 16));
        for _ in 0..nops {
            let kind = c.u8()?;
            let offset = c.u64()?;
            let len = c.u64()?;
            let end = offset.checked_add(len).filter(|e| *e <= size);
            if end.is_none() {
                return Err(EntryError(format!(
                    "change of {len} bytes at {offset} beyond the device end {size}"
                )));
            }
            ops.push(match kind {
                1 => Op::Data {
                    offset,
                    data: c.take(usize::try_from(len).map_err(|_| EntryError("length".into()))?)?,
                },
                2 => Op::Zero { offset, len },
                3 => {
                    let seg = c.u16()?;
                    let seg_offset = c.u64()?;
                    let ok = segments
                        .get(seg as usize)
                        .is_some_and(|s| seg_offset.checked_add(len).is_some_and(|e| e <= s.len));
                    if !ok {
                        return Err(EntryError("change outside its segment".into()));
                    }
                    Op::Seg {
                        offset,
                        len,
                        seg,
                        seg_offset,
                    }
                }
                k => return Err(EntryError(format!("unknown change kind {k}"))),
            });
        }
        if c.at != data.len() {
            return Err(EntryError("trailing bytes".into()));
        }
        Ok(Entry {
            size,
            segments,
            ops,
        })
    }
}

struct Cursor<'a> {
    data: &'a Bytes,
    at: usize,
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Result<Bytes, EntryError> {
        if self.data.len() - self.at < n {
            return Err(EntryError("cut short".into()));
        }
        let b = self.data.slice(self.at..self.at + n);
        self.at += n;
        Ok(b)
    }
    fn u8(&mut self) -> Result<u8, EntryError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, EntryError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, EntryError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, EntryError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(&b);
        Ok(u64::from_be_bytes(a))
    }
}

/// Where a bucket device's store is and how it is opened.
pub struct BucketOpen<'a> {
    pub url: &'a str,
    pub cache: &'a Path,
    /// The device size for `Create`; otherwise read from the log.
    pub size: Option<u64>,
    pub mode: OpenMode,
    pub s3: S3Settings,
    pub node: &'a str,
    pub inline_max: usize,
    /// A store to use instead of opening `url` (tests: fault injection).
    pub store: Option<(Arc<dyn ObjectStore>, ObjPath)>,
}

pub(crate) fn seg_key(prefix: &ObjPath, name: &str) -> ObjPath {
    prefix.child("seg").child(name)
}

/// Applies the entries of `records` to the cache file, in order, fetching
/// and checking the segments they name. Returns the device size last named.
pub(crate) fn apply_records(
    store: &Arc<dyn ObjectStore>,
    prefix: &ObjPath,
    file: &File,
    records: &[Record],
) -> Result<Option<u64>, String> {
    let mut size = None;
    // Replay starts at the last checkpoint (decision 0049).
    let base = crate::compact::last_checkpoint(records)?;
    let from = base.as_ref().map_or(0, |(_, c)| c.replay_from);
    if let Some((_, ck)) = base {
        size = Some(ck.image.size);
        apply_entry(store, prefix, file, &ck.image).map_err(|e| format!("checkpoint: {e}"))?;
    }
    for rec in records.iter().filter(|r| r.seq > from) {
        for entry in crate::compact::batch_entries(rec) {
            let entry = entry?;
            size = Some(entry.size);
            apply_entry(store, prefix, file, &entry)?;
        }
    }
    Ok(size)
}

/// Applies one entry to the cache file, fetching the segments it names.
fn apply_entry(
    store: &Arc<dyn ObjectStore>,
    prefix: &ObjPath,
    file: &File,
    entry: &Entry,
) -> Result<(), String> {
    {
        {
            let cur = file.metadata().map_err(|e| e.to_string())?.len();
            if cur < entry.size {
                file.set_len(entry.size).map_err(|e| e.to_string())?;
            }
            let mut segs: Vec<Option<Bytes>> = vec![None; entry.segments.len()];
            for op in &entry.ops {
                match op {
                    Op::Data { offset, data } => file.write_all_at(data, *offset),
                    Op::Zero { offset, len } => punch_zeros(file, *offset, *len),
                    Op::Seg {
                        offset,
                        len,
                        seg,
                        seg_offset,
                    } => {
                        let i = *seg as usize;
                        if segs[i].is_none() {
                            segs[i] = Some(fetch_segment(store, prefix, &entry.segments[i])?);
                        }
                        let body = segs[i].clone().unwrap_or_default();
                        let s = *seg_offset as usize;
                        file.write_all_at(&body[s..s + *len as usize], *offset)
                    }
                }
                .map_err(|e| format!("cache write: {e}"))?;
            }
        }
    }
    Ok(())
}

pub(crate) fn fetch_segment(
    store: &Arc<dyn ObjectStore>,
    prefix: &ObjPath,
    seg: &SegmentRef,
) -> Result<Bytes, String> {
    let key = seg_key(prefix, &seg.name);
    let store = store.clone();
    let body = block(async move {
        match store.get(&key).await {
            Ok(r) => r.bytes().await,
            Err(e) => Err(e),
        }
    })?
    .map_err(|e| format!("segment {}: {e}", seg.name))?;
    if body.len() as u64 != seg.len || blake3::hash(&body).as_bytes() != &seg.sum {
        return Err(format!(
            "segment {} does not match its checksum ({} bytes)",
            seg.name,
            body.len()
        ));
    }
    Ok(body)
}

/// Zeros a range of the cache: a hole where the filesystem allows it.
pub(crate) fn punch_zeros(file: &File, offset: u64, len: u64) -> io::Result<()> {
    use std::os::unix::io::AsRawFd;
    // SAFETY: plain syscall on an open descriptor.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let zeros = vec![0u8; CHUNK];
    let mut at = offset;
    while at < offset + len {
        let n = (CHUNK as u64).min(offset + len - at) as usize;
        file.write_all_at(&zeros[..n], at)?;
        at += n as u64;
    }
    Ok(())
}

/// Counters for `pool iostat`-like reporting and the bench.
#[derive(Debug, Default)]
pub struct ShipStats {
    pub syncs: AtomicU64,
    pub inline_bytes: AtomicU64,
    pub segments: AtomicU64,
    pub segment_bytes: AtomicU64,
}

/// The shipping side of a bucket device.
pub(crate) struct Shipper {
    pub(crate) url: String,
    pub(crate) cache: PathBuf,
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    group: GroupCommit,
    epoch: u64,
    size: u64,
    next_segment: Arc<AtomicU64>,
    /// Changed ranges not shipped yet: start -> end, merged.
    dirty: Mutex<BTreeMap<u64, u64>>,
    /// Held from taking the dirty ranges until their entry is queued, so
    /// queue order (= log order) is the order in which the cache changed.
    order: Arc<Mutex<()>>,
    failed: Mutex<Option<String>>,
    is_failed: AtomicBool,
    inline_max: usize,
    /// Entries queued, and entries whose record is known durable: a sync
    /// with nothing changed and nothing in flight costs no PUT.
    queued: AtomicU64,
    acked: AtomicU64,
    pub(crate) stats: ShipStats,
    /// Checkpoints, compaction and physical space (decision 0049).
    pub(crate) compactor: crate::compact::Compactor,
    /// The bounded, on-demand cache index (decision 0054); `None`: the
    /// cache file holds the whole device.
    pub(crate) ondemand: Option<Arc<crate::cache::Cache>>,
    /// When this owner's last record landed: the heartbeat skips a beat
    /// such a record already gave (decision 0071).
    pub(crate) appended: Arc<crate::standby::Appended>,
}

impl std::fmt::Debug for Shipper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Shipper({})", self.url)
    }
}

fn in_mmp_slot(offset: u64, len: u64) -> bool {
    offset >= MMP_SLOT_OFFSET && offset + len <= MMP_SLOT_OFFSET + MMP_SLOT_SIZE
}

impl Shipper {
    /// Opens the log as `how.mode` says, rebuilds the cache file from it and
    /// starts the group committer. Returns the shipper and the cache file.
    pub(crate) fn open(how: BucketOpen<'_>, bound: CacheBound) -> Result<(Shipper, u64), String> {
        let (store, prefix) = match how.store {
            Some(s) => s,
            None => objstore::location::open(how.url, &how.s3).map_err(|e| e.to_string())?,
        };
        let owner = OwnerId::new(how.node).map_err(|e| e.to_string())?;
        let epoch = owner.epoch;
        if how.mode == OpenMode::Create && how.size.is_none() {
            return Err("a new bucket device needs a size".into());
        }
        let (log, records) = {
            let (store, prefix) = (store.clone(), prefix.clone());
            block(async move { Log::open(store, prefix, owner, how.mode).await })?
                .map_err(|e| e.to_string())?
        };
        if let Some(dir) = how.cache.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        // The bucket is the pool: the cache starts empty and is rebuilt.
        let _ = std::fs::remove_file(how.cache);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(how.cache)
            .map_err(|e| format!("{}: {e}", how.cache.display()))?;
        let create = how.size.filter(|_| how.mode == OpenMode::Create);
        let mut ondemand = None;
        let size = match (create, bound) {
            (Some(s), CacheBound::Full) => s,
            (None, CacheBound::Full) => apply_records(&store, &prefix, &file, &records)?
                .ok_or_else(|| format!("{}: the log names no device", how.url))?,
            (Some(s), bound) => {
                let bound = resolve_bound(bound, s, how.cache);
                let c = crate::cache::Cache::new(store.clone(), prefix.clone(), &file, s, bound)?;
                ondemand = Some(Arc::new(c));
                s
            }
            // Only the index and the inline bytes now; segments on demand.
            (None, bound) => {
                let (c, size) =
                    crate::cache::Cache::build(store.clone(), prefix.clone(), &file, &records)?;
                let size = size.ok_or_else(|| format!("{}: the log names no device", how.url))?;
                ondemand = Some(Arc::new(c.bounded(resolve_bound(bound, size, how.cache))));
                size
            }
        };
        file.set_len(size).map_err(|e| e.to_string())?;
        let group = block(async move { GroupCommit::start_with(log, 4096, true).0 })?;
        let mut shipper = Shipper::assemble(
            how.url,
            how.cache,
            (store, prefix),
            group,
            epoch,
            size,
            how.inline_max,
        );
        shipper.ondemand = ondemand;
        if how.mode == OpenMode::Create {
            // The first entry names the device size: the log alone describes it.
            let _order = shipper.order.lock();
            shipper.queue_and_wait(Entry {
                size,
                segments: vec![],
                ops: vec![],
            })?;
        }
        Ok((shipper, size))
    }

    /// The shipper of an open log and its group committer, with its
    /// compactor (decision 0049); `open` and `adopt` both end here.
    fn assemble(
        url: &str,
        cache: &Path,
        (store, prefix): (Arc<dyn ObjectStore>, ObjPath),
        group: GroupCommit,
        epoch: u64,
        size: u64,
        inline_max: usize,
    ) -> Shipper {
        let next_segment = Arc::new(AtomicU64::new(0));
        let order = Arc::new(Mutex::new(()));
        let compactor = crate::compact::Compactor::new(crate::compact::Ctx {
            store: store.clone(),
            prefix: prefix.clone(),
            group: group.clone(),
            epoch,
            size,
            next_segment: next_segment.clone(),
            order: order.clone(),
            space: Default::default(),
            running: Mutex::new(()),
            stop: AtomicBool::new(false),
        });
        Shipper {
            url: url.to_string(),
            cache: cache.to_path_buf(),
            store,
            prefix,
            group,
            epoch,
            size,
            next_segment,
            dirty: Mutex::new(BTreeMap::new()),
            order,
            failed: Mutex::new(None),
            is_failed: AtomicBool::new(false),
            inline_max,
            queued: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            stats: ShipStats::default(),
            compactor,
            ondemand: None,
            appended: Arc::new(crate::standby::Appended::new()),
        }
    }

    /// A shipper for a log already claimed (a warm standby's takeover,
    /// decision 0048): `cache` already holds every record before the claim.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn adopt(
        url: &str,
        cache: &Path,
        store: Arc<dyn ObjectStore>,
        prefix: ObjPath,
        log: Log,
        size: u64,
        inline_max: usize,
    ) -> Result<Shipper, String> {
        let epoch = log.owner().epoch;
        let group = block(async move { GroupCommit::start_with(log, 4096, true).0 })?;
        Ok(Shipper::assemble(
            url,
            cache,
            (store, prefix),
            group,
            epoch,
            size,
            inline_max,
        ))
    }

    /// The store, the pool's prefix in it and this owner's epoch (the
    /// heartbeat object, decision 0048).
    pub(crate) fn location(&self) -> (Arc<dyn ObjectStore>, ObjPath, u64) {
        (self.store.clone(), self.prefix.clone(), self.epoch)
    }

    pub(crate) fn failure(&self) -> Option<String> {
        if self.is_failed.load(Ordering::Acquire) {
            self.failed.lock().clone()
        } else {
            None
        }
    }

    fn fail(&self, why: String) -> String {
        let mut f = self.failed.lock();
        if f.is_none() {
            tracing::error!(device = %self.url, "{why}; the device acknowledges nothing more");
            *f = Some(why.clone());
        }
        self.is_failed.store(true, Ordering::Release);
        f.clone().unwrap_or(why)
    }

    /// Remembers a changed range (after the cache write).
    pub(crate) fn mark(&self, offset: u64, len: u64) {
        if len == 0 || in_mmp_slot(offset, len) {
            return;
        }
        let (mut start, mut end) = (offset, offset + len);
        let mut d = self.dirty.lock();
        // Merge with every range touching [start, end).
        let touching: Vec<(u64, u64)> = d
            .range(..=end)
            .rev()
            .take_while(|(_, e)| **e >= start)
            .map(|(s, e)| (*s, *e))
            .collect();
        for (s, e) in touching {
            d.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        d.insert(start, end);
    }

    /// Ships every changed range; returns once its log record is in the bucket.
    pub(crate) fn sync(&self, file: &File) -> Result<(), String> {
        if let Some(f) = self.failure() {
            return Err(f);
        }
        let generation;
        let wait = {
            let _order = self.order.lock();
            if let Some(f) = self.failure() {
                return Err(f);
            }
            // Read before taking the ranges: every write of a generation up
            // to `g` marked its range before (decision 0054).
            generation = self.ondemand.as_ref().map(|c| c.generation());
            let ranges: Vec<(u64, u64)> = std::mem::take(&mut *self.dirty.lock())
                .into_iter()
                .collect();
            if ranges.is_empty()
                && self.acked.load(Ordering::Acquire) == self.queued.load(Ordering::Acquire)
            {
                if let (Some(c), Some(g)) = (&self.ondemand, generation) {
                    c.shipped(g);
                }
                return Ok(());
            }
            let entry = match self.build_entry(file, &ranges) {
                Ok(e) => e,
                Err(e) => return Err(self.fail(e)),
            };
            self.queue(entry)?
        };
        self.wait(wait)?;
        if let (Some(c), Some(g)) = (&self.ondemand, generation) {
            c.shipped(g);
        }
        Ok(())
    }

    /// Writes `data` to the cache and ships exactly it (the intent log).
    pub(crate) fn write_durable(
        &self,
        file: &File,
        offset: u64,
        data: &[u8],
    ) -> Result<(), String> {
        if in_mmp_slot(offset, data.len() as u64) {
            // Heartbeats stay local: the log's fencing replaces MMP here.
            return file.write_all_at(data, offset).map_err(|e| e.to_string());
        }
        if data.len() > self.inline_max {
            file.write_all_at(data, offset).map_err(|e| e.to_string())?;
            self.mark(offset, data.len() as u64);
            return self.sync(file);
        }
        if let Some(f) = self.failure() {
            return Err(f);
        }
        let wait = {
            let _order = self.order.lock();
            if let Some(f) = self.failure() {
                return Err(f);
            }
            file.write_all_at(data, offset).map_err(|e| e.to_string())?;
            self.stats
                .inline_bytes
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            self.queue(Entry {
                size: self.size,
                segments: vec![],
                ops: vec![Op::Data {
                    offset,
                    data: Bytes::copy_from_slice(data),
                }],
            })?
        };
        self.wait(wait)
    }

    fn queue_and_wait(&self, entry: Entry) -> Result<(), String> {
        let w = self.queue(entry)?;
        self.wait(w)
    }

    /// Queues an entry; called with `order` held.
    fn queue(
        &self,
        entry: Entry,
    ) -> Result<tokio::sync::oneshot::Receiver<Result<u64, LogError>>, String> {
        let group = self.group.clone();
        if let Some(c) = &self.ondemand {
            c.queued(&entry);
        }
        let raw = entry.encode();
        self.queued.fetch_add(1, Ordering::AcqRel);
        match block(async move { group.enqueue(raw).await }) {
            Ok(Ok(w)) => Ok(w),
            Ok(Err(e)) => Err(self.fail(e.to_string())),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn wait(&self, w: tokio::sync::oneshot::Receiver<Result<u64, LogError>>) -> Result<(), String> {
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        match block(w) {
            Ok(Ok(Ok(_seq))) => {
                self.acked.fetch_add(1, Ordering::AcqRel);
                self.appended.note();
                Ok(())
            }
            Ok(Ok(Err(e))) => Err(self.fail(e.to_string())),
            Ok(Err(_)) => Err(self.fail("the log writer has stopped".into())),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Reads the changed ranges from the cache and makes one entry of them:
    /// inline when small, else in segment objects uploaded here.
    fn build_entry(&self, file: &File, ranges: &[(u64, u64)]) -> Result<Entry, String> {
        let total: u64 = ranges.iter().map(|(s, e)| e - s).sum();
        let mut entry = Entry {
            size: self.size,
            segments: vec![],
            ops: vec![],
        };
        let inline = total as usize <= self.inline_max;
        let mut seg_buf: Vec<u8> = Vec::new();
        let mut uploads = Uploads::default();
        let mut chunk = vec![0u8; CHUNK];
        for &(start, end) in ranges {
            let mut at = start;
            while at < end {
                let n = (CHUNK as u64).min(end - at) as usize;
                file.read_exact_at(&mut chunk[..n], at)
                    .map_err(|e| format!("cache read at {at}: {e}"))?;
                let piece = &chunk[..n];
                if piece.iter().all(|b| *b == 0) {
                    match entry.ops.last_mut() {
                        Some(Op::Zero { offset, len }) if *offset + *len == at => *len += n as u64,
                        _ => entry.ops.push(Op::Zero {
                            offset: at,
                            len: n as u64,
                        }),
                    }
                } else if inline {
                    self.stats
                        .inline_bytes
                        .fetch_add(n as u64, Ordering::Relaxed);
                    entry.ops.push(Op::Data {
                        offset: at,
                        data: Bytes::copy_from_slice(piece),
                    });
                } else {
                    if seg_buf.len() + n > SEGMENT_MAX {
                        self.put_segment(&mut entry, &mut uploads, std::mem::take(&mut seg_buf))?;
                    }
                    let seg = entry.segments.len() as u16;
                    let seg_offset = seg_buf.len() as u64;
                    match entry.ops.last_mut() {
                        Some(Op::Seg {
                            offset,
                            len,
                            seg: s,
                            seg_offset: so,
                        }) if *s == seg && *offset + *len == at && *so + *len == seg_offset => {
                            *len += n as u64
                        }
                        _ => entry.ops.push(Op::Seg {
                            offset: at,
                            len: n as u64,
                            seg,
                            seg_offset,
                        }),
                    }
                    seg_buf.extend_from_slice(piece);
                }
                at += n as u64;
            }
        }
        if !seg_buf.is_empty() {
            self.put_segment(&mut entry, &mut uploads, seg_buf)?;
        }
        // The entry may name a segment only once it is in the store.
        while uploads.wait_oldest()? {}
        Ok(entry)
    }

    /// Starts uploading one segment (create-if-absent: a name is never
    /// reused); at most `UPLOADS_IN_FLIGHT` go at once.
    fn put_segment(
        &self,
        entry: &mut Entry,
        uploads: &mut Uploads,
        body: Vec<u8>,
    ) -> Result<(), String> {
        if uploads.0.len() >= UPLOADS_IN_FLIGHT {
            uploads.wait_oldest()?;
        }
        let n = self.next_segment.fetch_add(1, Ordering::Relaxed);
        let name = format!("{:016x}-{n:010}", self.epoch);
        let sum = *blake3::hash(&body).as_bytes();
        let chunks = if legacy_entries() {
            Vec::new()
        } else {
            chunk_sums(&body)
        };
        let len = body.len() as u64;
        let key = seg_key(&self.prefix, &name);
        let store = self.store.clone();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        runtime().spawn(async move {
            let r = store
                .put_opts(&key, PutPayload::from(Bytes::from(body)), opts)
                .await;
            let _ = tx.send(r.map(|_| ()).map_err(|e| e.to_string()));
        });
        uploads.0.push_back((name.clone(), rx));
        self.stats.segments.fetch_add(1, Ordering::Relaxed);
        self.stats.segment_bytes.fetch_add(len, Ordering::Relaxed);
        entry.segments.push(SegmentRef {
            name,
            len,
            sum,
            chunks,
        });
        Ok(())
    }
}

/// Segment uploads of one entry still in flight, oldest first.
#[derive(Default)]
struct Uploads(std::collections::VecDeque<(String, std::sync::mpsc::Receiver<Result<(), String>>)>);

impl Uploads {
    /// Waits for the oldest upload; `Ok(false)` when none is left.
    fn wait_oldest(&mut self) -> Result<bool, String> {
        let Some((name, rx)) = self.0.pop_front() else {
            return Ok(false);
        };
        match rx.recv() {
            Ok(Ok(())) => Ok(true),
            Ok(Err(e)) => Err(format!("segment {name}: {e}")),
            Err(_) => Err(format!(
                "segment {name}: the upload ended without an answer"
            )),
        }
    }
}

/// The bytes a bounded cache of a `size`-byte device at `cache` may hold.
pub(crate) fn resolve_bound(bound: CacheBound, size: u64, cache: &Path) -> u64 {
    match bound {
        CacheBound::Bytes(b) => b,
        CacheBound::Full => size,
        CacheBound::Default => {
            let dir = cache.parent().unwrap_or(Path::new("/"));
            // Unknown free space: the floor, which fits any disk a pool runs on.
            let free = free_bytes(dir).unwrap_or_else(|e| {
                tracing::warn!(dir = %dir.display(), "free space of the cache's disk: {e}");
                0
            });
            let b = default_cache_bytes(size, free);
            tracing::info!(
                cache = %cache.display(),
                device = size,
                free,
                bound = b,
                "bucket cache bounded by default (set [bucket] cache_bytes to choose)"
            );
            b
        }
    }
}

/// What a failed ship turns into at the device's interface.
pub(crate) fn ship_error(path: &Path, why: String) -> VdevError {
    VdevError::Io {
        path: path.to_path_buf(),
        op: "ship",
        offset: 0,
        source: io::Error::other(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version 1 entry as builds before decision 0059 wrote it, byte by byte.
    fn v1_bytes() -> Bytes {
        let mut b = BytesMut::new();
        b.put_u8(1);
        b.put_u64(64 << 20);
        b.put_u16(1);
        b.put_u16(3);
        b.put_slice(b"s-1");
        b.put_u64(3 << 20);
        b.put_slice(&[9; 32]);
        b.put_u32(1);
        b.put_u8(3);
        b.put_u64(4096);
        b.put_u64(8192);
        b.put_u16(0);
        b.put_u64(100);
        b.freeze()
    }

    #[test]
    fn the_default_cache_bound_is_a_quarter_of_the_free_disk_within_floor_cap_and_device() {
        const G: u64 = 1 << 30;
        assert_eq!(default_cache_bytes(1024 * G, 100 * G), 25 * G);
        assert_eq!(default_cache_bytes(1024 * G, G), CACHE_FLOOR, "floor");
        assert_eq!(
            default_cache_bytes(1024 * G, 0),
            CACHE_FLOOR,
            "unknown free"
        );
        assert_eq!(default_cache_bytes(1024 * G, 1 << 50), CACHE_CAP, "cap");
        assert_eq!(default_cache_bytes(8 * G, 54 * G), 8 * G, "the device");
        assert_eq!(default_cache_bytes(64 << 20, G), 64 << 20);
        assert_eq!(CacheBound::from_config(None), CacheBound::Default);
        assert_eq!(CacheBound::from_config(Some(5)), CacheBound::Bytes(5));
        assert!(free_bytes(Path::new("/")).is_ok());
    }

    #[test]
    fn version_1_entries_still_decode_and_encode_byte_for_byte() {
        let e = Entry::decode(&v1_bytes()).unwrap();
        assert_eq!(e.segments[0].name, "s-1");
        assert!(e.segments[0].chunks.is_empty());
        assert_eq!(e.encode(), v1_bytes(), "no table: still version 1");
    }

    #[test]
    fn chunk_tables_round_trip_and_a_wrong_count_is_refused() {
        let mut e = Entry::decode(&v1_bytes()).unwrap();
        e.segments[0].chunks = vec![[1; 32], [2; 32], [3; 32]];
        let raw = e.encode();
        assert_eq!(raw[0], ENTRY_VERSION_CHUNKED);
        assert_eq!(Entry::decode(&raw).unwrap(), e);
        e.segments[0].chunks.pop();
        assert!(Entry::decode(&e.encode()).is_err(), "2 sums for 3 MiB");
        assert_eq!(chunk_sums(&vec![0u8; (2 << 20) + 1]).len(), 3);
    }
}
