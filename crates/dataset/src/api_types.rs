//! Plain data types the engine hands to the front ends (management API, CLI, NBD adapter).
//! They are serde-serializable so the HTTP API can return them as JSON unchanged.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// How the devices of one top-level group are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GroupKind {
    /// A single device (several single-device groups make a stripe).
    Disk,
    /// An n-way mirror: every device holds every block.
    Mirror,
    /// Reed-Solomon parity over the devices, surviving the loss of 1, 2 or
    /// 3 of them (`raidz1`..`raidz3`, as zpool names them).
    Raidz1,
    Raidz2,
    Raidz3,
    /// A separate intent-log device (SLOG, `log DEV`): holds only the log.
    Log,
    /// A mirrored SLOG (`log mirror A B`).
    #[serde(rename = "log_mirror")]
    LogMirror,
}

impl GroupKind {
    /// A log group (SLOG), not a data group.
    pub fn is_log(self) -> bool {
        matches!(self, GroupKind::Log | GroupKind::LogMirror)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupSpec {
    pub kind: GroupKind,
    pub devices: Vec<PathBuf>,
}

/// What `cistern pool add POOL <groups>` asks for: groups appended to an
/// imported pool (`POST /v1/pools/{pool}/add`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolAddSpec {
    pub groups: Vec<GroupSpec>,
    /// `-s SIZE`: create missing device files sparse at this size.
    #[serde(default)]
    pub create_size: Option<u64>,
    /// `-f`: use devices that carry the label of a pool not imported here.
    #[serde(default)]
    pub force: bool,
}

/// What `cistern pool create` asks for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolSpec {
    pub name: String,
    pub groups: Vec<GroupSpec>,
    /// `-s SIZE`: create missing device files sparse at this size.
    #[serde(default)]
    pub create_size: Option<u64>,
    /// `-f`: use devices that carry the label of a pool that is not imported
    /// here (exported, destroyed elsewhere, or left by an interrupted create).
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolSummary {
    pub name: String,
    pub guid: u64,
    /// Usable bytes for data across all groups.
    pub size: u64,
    pub allocated: u64,
    pub free: u64,
    /// ONLINE, DEGRADED, FAULTED...
    pub health: String,
    /// Last committed transaction group.
    pub txg: u64,
    /// As `zpool list` SIZE/ALLOC: raw bytes (raidz parity included; a
    /// mirror counted once), where `size`/`allocated` are usable data bytes.
    #[serde(default)]
    pub raw_size: u64,
    #[serde(default)]
    pub raw_allocated: u64,
    /// Free-space fragmentation, percent (None: nothing free).
    #[serde(default)]
    pub fragmentation: Option<u32>,
    /// A pool in a bucket: the bucket's physical bytes and compaction
    /// counters (decision 0049); the figures above stay logical.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bucket: Option<vdev::compact::Space>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeviceStatus {
    pub path: PathBuf,
    pub guid: u64,
    pub state: String,
    pub read_errors: u64,
    pub write_errors: u64,
    pub checksum_errors: u64,
    /// Being rebuilt by a resilver (`replace`, or `online` after `offline`).
    #[serde(default)]
    pub resilvering: bool,
    /// Why the device is FAULTED, REMOVED or UNAVAIL.
    #[serde(default)]
    pub reason: Option<String>,
    /// A missing device: the path it had when last present (`was /path`).
    #[serde(default)]
    pub was: Option<PathBuf>,
}

/// `pool upgrade`: the format versions of a pool and of this build.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolVersions {
    pub pool: String,
    /// Metadata format of the pool / the newest this build writes.
    pub meta_format: u64,
    pub meta_format_supported: u64,
    /// Label version of the pool's devices / the newest this build writes.
    pub label_version: u32,
    pub label_version_supported: u32,
    /// What `upgrade` did (empty: nothing to do).
    #[serde(default)]
    pub upgraded: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupStatus {
    /// "mirror-0", or the device path for a single-device group.
    pub name: String,
    pub kind: GroupKind,
    pub state: String,
    pub devices: Vec<DeviceStatus>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PoolStatus {
    pub summary: PoolSummary,
    pub groups: Vec<GroupStatus>,
    /// Separate intent-log groups (zpool status's "logs").
    #[serde(default)]
    pub logs: Vec<GroupStatus>,
    /// Human-readable notes ("errors: No known data errors").
    pub errors: Vec<String>,
    /// The scrub or resilver running, or the last one that ran.
    #[serde(default)]
    pub scan: Option<ScanStatus>,
    /// Blocks that could not be read or repaired (`pool status -v`).
    #[serde(default)]
    pub data_errors: Vec<DataError>,
    /// What is wrong (zpool's `status:`), none for a healthy pool.
    #[serde(default)]
    pub status: Option<String>,
    /// What to do about it (zpool's `action:`).
    #[serde(default)]
    pub action: Option<String>,
    /// Why the pool is SUSPENDED, if it is.
    #[serde(default)]
    pub suspended: Option<String>,
    /// The memory the pool's caches and buffers hold and their bounds.
    #[serde(default)]
    pub memory: Option<MemoryUse>,
    /// L2ARC cache devices (`pool add POOL cache DEV`), open or UNAVAIL.
    #[serde(default)]
    pub cache: Vec<crate::l2arc::L2Stats>,
}

/// What `cistern pool add POOL cache DEV...` asks for (`POST /v1/pools/{pool}/cache`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CacheAddSpec {
    pub devices: Vec<PathBuf>,
    /// `-f`: overwrite a device that carries another pool's label.
    #[serde(default)]
    pub force: bool,
}

/// Bounds and current use of a pool's memory (decision 0029): what
/// `pool status --json` reports and RSS is measured against.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemoryUse {
    /// The ARC: counters, size, target, min and max.
    pub arc: crate::cache::ArcStats,
    pub prefetch_in_flight: u64,
    pub prefetch_max: u64,
    /// redb's page cache bound.
    pub meta_cache_max: u64,
    /// Intent-log records held for a FLUSH: now and bound.
    pub log_buffer_max: u64,
    /// Changed data waiting for a txg: now and bound (up to two txgs' worth
    /// are in memory while one commits).
    pub dirty: u64,
    pub dirty_max: u64,
    /// The sum of the bounds (2 x dirty_max for the open and the syncing txg).
    pub bounds_total: u64,
}

/// What a scan does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanFunction {
    /// Verify every live block and metadata page; repair from redundancy.
    Scrub,
    /// Rebuild one device's copies/columns from the others.
    Resilver,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScanState {
    Scanning,
    Paused,
    Finished,
    Canceled,
}

/// Progress or result of a scan, as `zpool status` shows it under `scan:`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScanStatus {
    pub function: ScanFunction,
    pub state: ScanState,
    /// Unix seconds.
    pub start_time: u64,
    /// Unix seconds; 0 while the scan has not ended.
    pub end_time: u64,
    /// Bytes verified (every copy / column counted).
    pub examined: u64,
    /// Bytes to verify (allocated bytes when the scan started).
    pub total: u64,
    /// Bytes rewritten from redundancy.
    pub repaired: u64,
    /// Blocks that could not be repaired.
    pub errors: u64,
    /// Bytes per second since the scan (re)started in this process.
    pub rate: u64,
    /// Seconds left at `rate`, if known.
    pub eta_secs: Option<u64>,
    /// Seconds the scan has run (measured precisely when it ran in this
    /// process from its start; else from the start and end times).
    #[serde(default)]
    pub elapsed_secs: f64,
    /// Resilver: the device being rebuilt.
    #[serde(default)]
    pub target: Option<PathBuf>,
}

/// `cistern pool scrub [-p|-s]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScrubAction {
    /// Start a scrub, or resume a paused one.
    Start,
    /// `-p`: pause where it is.
    Pause,
    /// `-s`: cancel.
    Stop,
}

/// A block whose every copy failed: where it hit, for `pool status -v`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataError {
    /// The dataset's name, or `<dataset N>` if it no longer exists.
    pub dataset: String,
    /// Byte offset in the dataset (block index x volblocksize).
    pub offset: u64,
    /// Bytes of the dataset the block covers.
    pub length: u64,
}

/// A pool found on devices that is not imported (`cistern pool import -d DIR`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ImportablePool {
    pub name: String,
    pub guid: u64,
    pub devices: Vec<PathBuf>,
    /// Whether all devices the label names were found.
    pub complete: bool,
    /// Another daemon that may hold the pool ("host H, pid P"): importing
    /// it needs `-f` (decision 0010). None: exported, or its holder is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use_by: Option<String>,
    /// The labels say ACTIVE (not exported), whether or not its holder lives.
    #[serde(default)]
    pub active: bool,
}

/// One property of a dataset as `cistern get` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Property {
    pub name: String,
    /// Human-readable ("10G", "1.52x", "lz4").
    pub value: String,
    /// Exact, for scripts (`-p`): bytes as integers, ratios as "1.52".
    pub parsable: String,
    /// "-" (read-only statistic), "default", "local", or "inherited from X".
    pub source: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DatasetKind {
    /// The root dataset of a pool (`tank`); holds children.
    #[default]
    Filesystem,
    /// A fixed-size block device (`tank/vol0`).
    Volume,
    /// A read-only point in time of a dataset (`tank/vol0@monday`).
    Snapshot,
    /// Objects named by keys, served over S3 (`tank/photos`).
    Bucket,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DatasetInfo {
    pub name: String,
    pub kind: DatasetKind,
    /// All properties, in a stable order (the order `get all` prints).
    pub properties: Vec<Property>,
}

impl DatasetInfo {
    pub fn property(&self, name: &str) -> Option<&Property> {
        self.properties.iter().find(|p| p.name == name)
    }
}

/// Counters for the Prometheus endpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PoolStats {
    pub pool: String,
    pub txg: u64,
    pub txg_commits: u64,
    pub txg_commit_seconds_total: f64,
    pub log_commits: u64,
    pub log_records: u64,
    pub log_bytes: u64,
    /// Durable (O_DSYNC) log writes: what a FLUSH costs the device.
    #[serde(default)]
    pub log_syncs: u64,
    /// Commit requests (FLUSH, FUA, fsync...) answered durable.
    #[serde(default)]
    pub log_flushes: u64,
    /// Log writes issued while another was in flight (decision 0041).
    #[serde(default)]
    pub log_overlapped: u64,
    /// Commit requests answered without a thread of their own (decision 0057).
    #[serde(default)]
    pub log_deferred: u64,
    /// Log batches submitted through io_uring, no thread waiting (decision 0068).
    #[serde(default)]
    pub log_ring: u64,
    /// Log batches written O_DIRECT by the log writer thread (decision 0079).
    #[serde(default)]
    pub log_thread: u64,
    /// Seconds the commit requests in `log_flushes` waited for the intent log.
    #[serde(default)]
    pub log_wait_seconds_total: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub dirty_bytes: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// The ARC: counters, current size and bounds (decision 0029).
    #[serde(default)]
    pub arc: crate::cache::ArcStats,
    /// Read-ahead bytes in flight and their bound.
    #[serde(default)]
    pub prefetch_in_flight: u64,
    #[serde(default)]
    pub prefetch_max: u64,
    pub checksum_errors: u64,
    pub allocated: u64,
    pub size: u64,
    /// 1 while the pool is SUSPENDED.
    #[serde(default)]
    pub suspended: u64,
    /// Bytes of the metadata store, and the most its region holds
    /// (embedded blocks live there: decision 0017).
    #[serde(default)]
    pub metadata_used: u64,
    #[serde(default)]
    pub metadata_size: u64,
    /// Bytes of the bucket's log and segment objects (pools in a bucket).
    #[serde(default)]
    pub bucket_physical_bytes: u64,
    /// The bounded local cache of a bucket pool (decision 0054; 0 without one).
    #[serde(default)]
    pub bucket_cache_held_bytes: u64,
    #[serde(default)]
    pub bucket_cache_hits: u64,
    #[serde(default)]
    pub bucket_cache_misses: u64,
    #[serde(default)]
    pub bucket_cache_fetched_bytes: u64,
}

/// `cistern destroy` flags.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DestroyOptions {
    /// Children and snapshots too (`-r`); for snapshots, the same snapshot of every child.
    #[serde(default)]
    pub recursive: bool,
    /// Say what would be destroyed and freed, change nothing (`-n`).
    #[serde(default)]
    pub dry_run: bool,
    /// Disconnect front-end clients of what is destroyed instead of
    /// refusing (`-f`).
    #[serde(default)]
    pub force: bool,
    /// Dependents too (`-R`): clones of the snapshots destroyed, and theirs.
    #[serde(default)]
    pub dependents: bool,
}

/// What `destroy` removed (or would remove, for a dry run).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DestroyReport {
    pub destroyed: Vec<String>,
    /// Allocated bytes freed (exact: blocks no one else references).
    pub freed: u64,
    pub dry_run: bool,
}

/// `POST /v1/rollback` with `dry_run`: what a rollback (-r) would do.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RollbackPreview {
    pub snapshot: String,
    /// Newer snapshots destroyed with it (oldest first); `-r` is needed if any.
    pub destroys: Vec<String>,
    /// Bytes only those snapshots hold, freed with them.
    pub frees_snapshot_bytes: u64,
    /// Bytes of the dataset changed since the snapshot, discarded.
    pub discards_changed_bytes: u64,
}

/// One run of changed bytes in a `diff`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct ChangedRange {
    pub offset: u64,
    pub length: u64,
}

/// `cistern diff FROM [TO]`: byte ranges whose blocks changed.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiffReport {
    pub from: String,
    pub to: String,
    pub changed_bytes: u64,
    pub ranges: Vec<ChangedRange>,
    /// Buckets: names of the root directory that changed; filesystems:
    /// paths (`/docs/x`) that appeared, went, changed or were renamed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<NameChange>,
}

/// A name in a `diff` of a bucket or filesystem, as zfs diff says it:
/// `+` appeared, `-` went, `M` points at another or a changed object.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NameChange {
    pub change: char,
    pub name: String,
    /// `R` (a filesystem's rename): the new path; `name` is the old one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renamed_to: Option<String>,
}

/// Cumulative I/O counters of one device (`GET /v1/pools/{pool}/iostat`):
/// `pool iostat` and the web UI take differences between two readings.
/// Wait times are the time spent in the device's system call (disk wait);
/// histograms count I/Os per power-of-two nanosecond bucket (bucket `i`:
/// [2^i, 2^(i+1)) ns), as `zpool iostat -w`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DeviceIostat {
    pub name: String,
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub read_wait_ns: u64,
    pub write_wait_ns: u64,
    pub read_hist: Vec<u64>,
    pub write_hist: Vec<u64>,
}

/// One group (data or log) and its devices.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GroupIostat {
    /// As `pool status` names it (`mirror-0`, or the device of a single-device group).
    pub name: String,
    pub devices: Vec<DeviceIostat>,
}

/// A pool's I/O counters at one instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PoolIostat {
    pub pool: String,
    /// Milliseconds since the Unix epoch when read.
    pub timestamp_ms: u64,
    /// Milliseconds since the pool was imported (the counters' start).
    pub uptime_ms: u64,
    pub allocated: u64,
    pub free: u64,
    pub groups: Vec<GroupIostat>,
    /// Separate log devices (SLOG).
    #[serde(default)]
    pub logs: Vec<GroupIostat>,
    /// Intent log: durable writes, records, group commits and flushes served.
    pub log_syncs: u64,
    pub log_records: u64,
    pub log_commits: u64,
    pub log_flushes: u64,
    /// Log writes issued while another was in flight (decision 0041).
    #[serde(default)]
    pub log_overlapped: u64,
    /// Commit requests answered without a thread of their own (decision 0057).
    #[serde(default)]
    pub log_deferred: u64,
    /// Log batches submitted through io_uring, no thread waiting (decision 0068).
    #[serde(default)]
    pub log_ring: u64,
    /// Log batches written O_DIRECT by the log writer thread (decision 0079).
    #[serde(default)]
    pub log_thread: u64,
    /// Nanoseconds the commit requests in `log_flushes` waited for the
    /// intent log, summed (`pool iostat -l` sync_wait).
    #[serde(default)]
    pub log_wait_ns: u64,
    /// Those waits per power-of-two latency bucket (`pool iostat -w`).
    #[serde(default)]
    pub log_wait_hist: Vec<u64>,
}
