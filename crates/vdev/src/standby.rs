//! A warm standby for a bucket pool, and the owner's heartbeat object
//! (issue 18, decision 0048).
//!
//! `cistern serve --standby POOL LOCATION` tails the pool's log: a thread
//! reads each new log record as it appears and applies it to a bounded
//! local cache (decision 0063: the index of the device, inline bytes, and
//! the newest segment bytes fetched ahead up to half the bound), as a
//! bounded open would, but never writes to the bucket. `pool takeover POOL` on that daemon then
//! claims the log from the first record it has not applied
//! ([`objstore::Log::take_over_from`]), which fences the old owner, applies
//! only the records written since (to the index: no segment is fetched),
//! and hands the pool a device over that bounded cache: seconds instead of
//! a whole-log replay.
//!
//! Safety is the claim's create-if-absent, never a timer. The heartbeat
//! object an owner rewrites and `[bucket] takeover_after_secs` only decide
//! *when* a standby tries to take over on its own (liveness): a standby
//! that takes over a live but slow owner fences it, it does not corrupt it.

use crate::bucket::{self, block, CacheBound, Shipper};
use crate::cache::Cache;
use crate::{Vdev, VdevError};
use bytes::Bytes;
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, PutPayload};
use objstore::record::{Kind, Record};
use objstore::{Log, OwnerId, Tail};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The owner's heartbeat object, under the pool's prefix.
pub const HEARTBEAT_KEY: &str = "heartbeat";
/// How often an owner rewrites it when neither `[bucket] heartbeat_ms` nor
/// `takeover_after_secs` says (decision 0071): 1,440 PUTs a day. Without an
/// automatic takeover nothing waits on the heartbeat (a manual takeover
/// reads the log, and the claim fences); it only shows an owner's idle time.
pub const DEFAULT_HEARTBEAT_MS: u64 = 60_000;
/// The shortest interval, whatever is configured.
const HEARTBEAT_MIN: Duration = Duration::from_millis(50);
/// What the owner writes after its counter: its interval, so that a standby
/// whose `takeover_after_secs` is shorter than the owner's beat can wait
/// long enough instead of taking over an idle live owner (decision 0071).
const EVERY_TAG: &str = "every_ms=";

/// The owner's heartbeat interval: `[bucket] heartbeat_ms` if set; else a
/// quarter of `takeover_after_secs` (at least 200 ms, at most the default),
/// so an owner configured as its standbys beats often enough for them;
/// else [`DEFAULT_HEARTBEAT_MS`].
pub fn heartbeat_every(config: &bucket::BucketConfig) -> Duration {
    let every = match (
        config.heartbeat_ms,
        config.takeover_after_secs.filter(|s| *s > 0),
    ) {
        (Some(ms), _) => Duration::from_millis(ms),
        (None, Some(after)) => (Duration::from_secs(after) / 4)
            .clamp(POLL, Duration::from_millis(DEFAULT_HEARTBEAT_MS)),
        (None, None) => Duration::from_millis(DEFAULT_HEARTBEAT_MS),
    };
    every.max(HEARTBEAT_MIN)
}

/// The interval an owner's heartbeat body advertises (`None`: an owner from
/// before decision 0071, whose body is `<node> <epoch> <counter>`).
fn advertised_every(body: &[u8]) -> Option<Duration> {
    let text = std::str::from_utf8(body).ok()?;
    let ms = text.split_whitespace().last()?.strip_prefix(EVERY_TAG)?;
    ms.parse::<u64>().ok().map(Duration::from_millis)
}

/// How long the owner must be still before an automatic takeover: the
/// configured delay, but never less than two of the owner's beats plus one
/// idle look of this standby, so that an idle live owner whose interval is
/// long (configured apart from this standby) is not taken over.
fn takeover_delay(
    configured: Duration,
    owner_every: Option<Duration>,
    poll_max: Duration,
) -> Duration {
    match owner_every {
        Some(every) => configured.max(every * 2 + poll_max),
        None => configured,
    }
}
/// How often a standby looks for the next record while the owner writes.
const POLL: Duration = Duration::from_millis(200);
/// The longest wait between two looks of an idle caught-up standby unless
/// `[bucket] standby_poll_max_ms` says. Each look that finds no new record
/// doubles the wait (200 ms, 400 ms, … this); a new record or an error
/// starts again at `POLL`. A look is two GETs (the next record, the
/// owner's heartbeat): 34,560 a day once idle instead of 864,000. Only
/// latency hangs on it (safety is the claim's create-if-absent): an idle
/// owner's next write reaches the standby up to this much later, and an
/// automatic takeover fires up to this much after `takeover_after_secs`
/// (the wait is also kept under a quarter of that).
pub const DEFAULT_POLL_MAX_MS: u64 = 5_000;

/// The wait after a look (for a record, or a probe) that found nothing:
/// twice the last, kept within `min..=max`.
fn backoff(every: Duration, min: Duration, max: Duration) -> Duration {
    (every * 2).min(max).max(min)
}

/// The longest idle wait: `[bucket] standby_poll_max_ms` (default
/// [`DEFAULT_POLL_MAX_MS`]), at least `POLL`, and under a quarter of the
/// automatic takeover's delay so that it still fires on time.
fn poll_max(config_ms: Option<u64>, takeover_after: Option<Duration>) -> Duration {
    let max = Duration::from_millis(config_ms.unwrap_or(DEFAULT_POLL_MAX_MS));
    let max = match takeover_after {
        Some(after) => max.min(after / 4),
        None => max,
    };
    max.max(POLL)
}
/// Records read per round while catching up (bounds memory per round).
const RECORDS_PER_POLL: usize = 64;
/// Bounds the listing that finds the first record still stored.
const LIST_LIMIT: usize = 1 << 20;
/// How often a caught-up standby checks (one LIST) that the record it
/// waits for was not compacted away while it lagged (decision 0055).
const BEHIND_PROBE: Duration = Duration::from_secs(2);
/// Each probe that finds nothing doubles the wait for the next, up to this
/// (decision 0063): an idle caught-up standby makes 1,440 LISTs a day
/// instead of 43,200. Any error (a partition, a failed apply) starts again
/// from `BEHIND_PROBE`, and a standby stalled longer than the wait probes
/// at once when it resumes.
const BEHIND_PROBE_MAX: Duration = Duration::from_secs(60);

/// Claim attempts of one takeover that find the standby behind.
const TAKEOVER_ROUNDS: u32 = 3;

/// What `pool status`, the API and the metrics say about a standby.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StandbyStatus {
    pub pool: String,
    pub location: String,
    /// Every log record before this one is in the local cache.
    pub next_seq: u64,
    /// Log records applied since the standby started.
    pub records_applied: u64,
    /// The device size the log names (None: the log names none yet).
    pub size: Option<u64>,
    /// The owner of the last claim seen in the log.
    pub owner: Option<String>,
    /// Seconds since the log or the owner's heartbeat object last changed.
    pub idle_secs: f64,
    pub takeover_after_secs: Option<u64>,
    /// The last error reading or applying the log (it keeps retrying).
    pub error: Option<String>,
    /// Times the cache was rebuilt from the last checkpoint because the
    /// records it needed next had been compacted away (decision 0055).
    #[serde(default)]
    pub rebuilds: u64,
    /// A takeover claimed the log but its replay failed: the claim is held,
    /// and `pool takeover POOL` replays again without a new claim.
    #[serde(default)]
    pub claimed: bool,
    /// The interval the owner's heartbeat object advertises (decision 0071;
    /// `None` before its first beat is read, or from an older owner).
    #[serde(default)]
    pub owner_heartbeat_ms: Option<u64>,
}

struct Progress {
    next: u64,
    applied: u64,
    size: Option<u64>,
    owner: Option<String>,
    owner_node: Option<String>,
    last_change: Instant,
    heartbeat: Option<Bytes>,
    /// The interval the owner's heartbeat advertises.
    owner_every: Option<Duration>,
    error: Option<String>,
    auto_fired: bool,
    /// The cache no longer follows the log (records it needed were deleted,
    /// or a rebuild stopped half-way): rebuild it before anything else.
    rebuild: bool,
    rebuilds: u64,
    /// When the tail last checked whether it is behind the stored log.
    probed: Instant,
    /// How long after `probed` it checks again.
    probe_every: Duration,
    /// How long the tail waits before its next look for a record.
    poll_every: Duration,
}

struct Shared {
    pool: String,
    url: String,
    stop: AtomicBool,
    progress: Mutex<Progress>,
    takeover_after: Option<Duration>,
    /// The longest wait of an idle tail ([`poll_max`]).
    poll_max: Duration,
}

struct Standby {
    shared: Arc<Shared>,
    cache: PathBuf,
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    thread: Option<std::thread::JoinHandle<Local>>,
    /// After a claim whose replay failed: the claimed log and the cache,
    /// kept for the next `pool takeover` (no tail thread runs then).
    claimed: Option<(Log, Local)>,
}

/// A standby's local cache (decision 0063): the file and, once the log
/// names the device, the bounded index over it that a takeover hands to
/// the new owner as is. The tail writes inline bytes and fetches the lines
/// the owner's records point at segments, up to half the bound per round.
struct Local {
    file: File,
    path: PathBuf,
    bound: CacheBound,
    index: Option<Cache>,
}

/// Test hook: the next `n` replays of `pool`'s standby fail as a local
/// write would (a fault the tests cannot cause on a healthy disk).
static FAIL_REPLAYS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());

#[doc(hidden)]
pub fn fail_next_replays(pool: &str, n: u64) {
    FAIL_REPLAYS.lock().insert(pool.to_string(), n);
}

fn injected_failure(pool: &str) -> Result<(), String> {
    let mut f = FAIL_REPLAYS.lock();
    match f.get_mut(pool) {
        Some(n) if *n > 0 => {
            *n -= 1;
            Err("cache write: injected failure".into())
        }
        _ => Ok(()),
    }
}

static STANDBYS: Mutex<BTreeMap<String, Standby>> = Mutex::new(BTreeMap::new());

type AutoTakeover = Arc<dyn Fn(String, String) + Send + Sync>;
static AUTO: Mutex<Option<AutoTakeover>> = Mutex::new(None);

/// What runs an automatic takeover (the daemon: `takeover_pool(pool,
/// location)`); it is called on its own thread.
pub fn on_auto_takeover(f: impl Fn(String, String) + Send + Sync + 'static) {
    *AUTO.lock() = Some(Arc::new(f));
}

/// Starts tailing the log of `pool` at `url` into a fresh local cache, with
/// the daemon's settings ([`bucket::configure`]).
pub fn start(pool: &str, url: &str) -> Result<(), String> {
    let settings = bucket::settings().ok_or("a standby needs the daemon's [bucket] settings")?;
    if !bucket::is_location(Path::new(url)) {
        return Err(format!(
            "{url}: a standby follows a pool in a bucket (s3://BUCKET/PREFIX or file:///DIR)"
        ));
    }
    if STANDBYS.lock().contains_key(pool) {
        return Err(format!("pool '{pool}' already has a standby here"));
    }
    let (store, prefix) =
        objstore::location::open(url, &settings.config.s3()).map_err(|e| e.to_string())?;
    start_with_store(pool, url, store, prefix)
}

/// [`start`] over a store already opened (`url` names the cache; tests
/// pass a fault-injecting store here, as `BucketOpen::store` does).
pub fn start_with_store(
    pool: &str,
    url: &str,
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
) -> Result<(), String> {
    let settings = bucket::settings().ok_or("a standby needs the daemon's [bucket] settings")?;
    let bound = CacheBound::from_config(settings.config.cache_bytes);
    start_bounded(pool, url, store, prefix, bound)
}

/// [`start_with_store`] with the cache bounded as `bound` says instead of
/// by `[bucket] cache_bytes` (tests).
#[doc(hidden)]
pub fn start_bounded(
    pool: &str,
    url: &str,
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    bound: CacheBound,
) -> Result<(), String> {
    let settings = bucket::settings().ok_or("a standby needs the daemon's [bucket] settings")?;
    if STANDBYS.lock().contains_key(pool) {
        return Err(format!("pool '{pool}' already has a standby here"));
    }
    let cache = bucket::cache_path(&settings.state_dir, url);
    if let Some(dir) = cache.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    // The bucket is the pool: the cache starts empty and follows the log.
    let _ = std::fs::remove_file(&cache);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&cache)
        .map_err(|e| format!("{}: {e}", cache.display()))?;
    let local = Local {
        file,
        path: cache.clone(),
        bound,
        index: None,
    };
    let first = {
        let (store, prefix) = (store.clone(), prefix.clone());
        block(async move { first_seq(store.as_ref(), &prefix).await })??
    };
    let takeover_after = settings
        .config
        .takeover_after_secs
        .filter(|s| *s > 0)
        .map(Duration::from_secs);
    let shared = Arc::new(Shared {
        pool: pool.to_string(),
        url: url.to_string(),
        stop: AtomicBool::new(false),
        progress: Mutex::new(Progress {
            next: first,
            applied: 0,
            size: None,
            owner: None,
            owner_node: None,
            last_change: Instant::now(),
            heartbeat: None,
            owner_every: None,
            error: None,
            auto_fired: false,
            // The log was compacted: start from its last checkpoint.
            rebuild: first > 1,
            rebuilds: 0,
            probed: Instant::now(),
            probe_every: BEHIND_PROBE,
            poll_every: POLL,
        }),
        takeover_after,
        poll_max: poll_max(settings.config.standby_poll_max_ms, takeover_after),
    });
    tracing::info!(
        pool,
        location = url,
        first,
        "standby: tailing the pool's log"
    );
    spawn(
        Standby {
            shared,
            cache,
            store,
            prefix,
            thread: None,
            claimed: None,
        },
        local,
    );
    Ok(())
}

/// The first log record still stored (1 for an empty log).
async fn first_seq(store: &dyn ObjectStore, prefix: &ObjPath) -> Result<u64, String> {
    let mut first: Option<u64> = None;
    let mut listing = store.list(Some(&prefix.child("log")));
    let mut seen = 0usize;
    while let Some(meta) = listing.next().await {
        let meta = meta.map_err(|e| e.to_string())?;
        if let Some(seq) = meta.location.filename().and_then(|n| n.parse::<u64>().ok()) {
            first = Some(first.map_or(seq, |f| f.min(seq)));
        }
        seen += 1;
        if seen > LIST_LIMIT {
            break;
        }
    }
    Ok(first.unwrap_or(1))
}

/// Starts (or restarts, after a failed takeover) the tail thread and
/// registers the standby.
fn spawn(mut sb: Standby, local: Local) {
    sb.shared.stop.store(false, Ordering::Release);
    let (shared, store, prefix) = (sb.shared.clone(), sb.store.clone(), sb.prefix.clone());
    let thread = std::thread::Builder::new()
        .name("bucket-standby".into())
        .spawn(move || tail_loop(shared, store, prefix, local));
    match thread {
        Ok(t) => {
            sb.thread = Some(t);
            STANDBYS.lock().insert(sb.shared.pool.clone(), sb);
        }
        Err(e) => tracing::error!(pool = %sb.shared.pool, "standby: cannot start its thread: {e}"),
    }
}

/// Applies records that directly follow what the cache holds to its index
/// (no segment is fetched here). Checkpoint entries are skipped: they
/// restate what the records before them already wrote, and applying one
/// over a warm cache would keep bytes that records it superseded zeroed
/// (its image lists only non-zero extents). Until the log names the device
/// the index is built from these records as a cold open builds it. Returns
/// the device size and the lines the records pointed at segments.
fn apply_following(
    pool: &str,
    local: &mut Local,
    store: &Arc<dyn ObjectStore>,
    prefix: &ObjPath,
    records: &[Record],
) -> Result<(Option<u64>, Vec<usize>), String> {
    injected_failure(pool)?;
    let Some(cache) = &local.index else {
        return build_index(local, store, prefix, records).map(|size| (size, Vec::new()));
    };
    let mut size = None;
    let mut lines = Vec::new();
    for rec in records {
        for entry in crate::compact::batch_entries(rec) {
            let entry = entry?;
            size = Some(entry.size);
            lines.extend(cache.follow(&entry)?);
        }
    }
    Ok((size, lines))
}

/// The index of the device from `records` (the last checkpoint and the
/// records after it) over the emptied cache file; `None` until the log
/// names the device.
fn build_index(
    local: &mut Local,
    store: &Arc<dyn ObjectStore>,
    prefix: &ObjPath,
    records: &[Record],
) -> Result<Option<u64>, String> {
    local.index = None;
    local
        .file
        .set_len(0)
        .map_err(|e| format!("emptying the cache: {e}"))?;
    let (cache, size) = Cache::build(store.clone(), prefix.clone(), &local.file, records)?;
    if let Some(size) = size {
        local
            .file
            .set_len(size)
            .map_err(|e| format!("sizing the cache: {e}"))?;
        let bound = bucket::resolve_bound(local.bound, size, &local.path);
        local.index = Some(cache.bounded(bound));
    }
    Ok(size)
}

/// Fetches `lines` (the last ones first, they are the newest) until half
/// the bound is used or the standby stops: a takeover then serves the
/// owner's recent writes from local disk. A failed fetch only leaves the
/// line to be fetched on demand.
fn fetch_ahead(shared: &Shared, local: &Local, lines: &[usize]) {
    let Some(cache) = &local.index else { return };
    let budget = (cache.bound() / 2 / crate::cache::LINE).max(1) as usize;
    let mut seen = std::collections::BTreeSet::new();
    for &i in lines.iter().rev() {
        if seen.len() >= budget || shared.stop.load(Ordering::Acquire) {
            break;
        }
        if !seen.insert(i) {
            continue;
        }
        if let Err(e) = cache.prefetch(i) {
            tracing::debug!(pool = %shared.pool, line = i, "standby: fetching ahead: {e}");
        }
    }
}

/// The cache rebuilt from the stored log alone: the last checkpoint and the
/// records after it, over an emptied file (what a cold open does). For a
/// standby whose next record was compacted away, and for a takeover whose
/// warm replay failed. Returns the records read (the log's whole stored
/// tail) and the device size.
fn rebuild_cache(
    pool: &str,
    local: &mut Local,
    store: &Arc<dyn ObjectStore>,
    prefix: &ObjPath,
) -> Result<(Vec<Record>, Option<u64>), String> {
    injected_failure(pool)?;
    let records = {
        let (store, prefix) = (store.clone(), prefix.clone());
        block(async move { objstore::read_all(store.as_ref(), &prefix).await })?
            .map_err(|e| e.to_string())?
    };
    if let Some(first) = records.first().map(|r| r.seq).filter(|f| *f > 1) {
        // Records before `first` are gone: a checkpoint must cover them.
        let covered = crate::compact::last_checkpoint(&records)?
            .is_some_and(|(_, c)| c.replay_from + 1 >= first);
        if !covered {
            return Err(format!(
                "the stored log starts at record {first} and no checkpoint covers the records before it"
            ));
        }
    }
    let size = build_index(local, store, prefix, &records)?;
    Ok((records, size))
}

/// A standby's [`rebuild_cache`], with its progress kept in step: marked
/// first (a rebuild stopped half-way is done again), then the new position.
/// `warm`: fetch what the index names ahead (up to half the bound) before
/// the new position shows.
fn rebuild(
    shared: &Shared,
    store: &Arc<dyn ObjectStore>,
    prefix: &ObjPath,
    local: &mut Local,
    warm: bool,
) -> Result<(), String> {
    shared.progress.lock().rebuild = true;
    let (records, size) = rebuild_cache(&shared.pool, local, store, prefix)?;
    if warm {
        let lines = local.index.as_ref().map(Cache::segment_lines);
        fetch_ahead(shared, local, &lines.unwrap_or_default());
    }
    let mut p = shared.progress.lock();
    let from = p.next;
    p.next = records.last().map_or(1, |r| r.seq + 1);
    p.applied += records.len() as u64;
    p.size = size.or(p.size);
    if let Some(o) = objstore::last_owner(&records) {
        if p.owner_node.as_deref() != Some(o.node.as_str()) {
            p.auto_fired = false;
        }
        p.owner = Some(o.to_string());
        p.owner_node = Some(o.node.clone());
    }
    p.rebuild = false;
    p.rebuilds += 1;
    p.last_change = Instant::now();
    p.error = None;
    tracing::warn!(
        pool = %shared.pool,
        from,
        next = p.next,
        "standby: the records it needed were compacted away; rebuilt its cache from the last checkpoint"
    );
    Ok(())
}

/// Whether the record a caught-up standby waits for was deleted (a later
/// one exists and it is still absent): then it is behind for good.
fn is_behind(store: &Arc<dyn ObjectStore>, prefix: &ObjPath, next: u64) -> Result<bool, String> {
    let (store, prefix) = (store.clone(), prefix.clone());
    block(async move {
        if objstore::record_after(store.as_ref(), &prefix, next)
            .await?
            .is_none()
        {
            return Ok(false);
        }
        // Written between our read and the listing: not a gap.
        Ok(objstore::read_record(store.as_ref(), &prefix, next)
            .await?
            .is_none())
    })?
    .map_err(|e: objstore::LogError| e.to_string())
}

fn tail_loop(
    shared: Arc<Shared>,
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    mut local: Local,
) -> Local {
    let mut tail: Option<Tail> = None;
    let hb_key = prefix.child(HEARTBEAT_KEY);
    while !shared.stop.load(Ordering::Acquire) {
        if shared.progress.lock().rebuild {
            if let Err(e) = rebuild(&shared, &store, &prefix, &mut local, true) {
                tracing::warn!(pool = %shared.pool, "standby: rebuilding its cache: {e}");
                shared.progress.lock().error = Some(format!("rebuilding the cache: {e}"));
                pause(&shared, POLL);
                continue;
            }
            tail = None;
        }
        let mut t = tail.take().unwrap_or_else(|| {
            Tail::new(store.clone(), prefix.clone(), shared.progress.lock().next)
        });
        let polled = block(async move {
            let r = t.poll(RECORDS_PER_POLL).await;
            (t, r)
        });
        let (t, r) = match polled {
            Ok(x) => x,
            Err(e) => {
                shared.progress.lock().error = Some(e);
                break;
            }
        };
        tail = Some(t);
        match r {
            Ok(records) if !records.is_empty() => {
                let first = local.index.is_none();
                match apply_following(&shared.pool, &mut local, &store, &prefix, &records) {
                    Ok((size, lines)) => {
                        // A first index (the whole device): warm what it names.
                        let lines = match &local.index {
                            Some(c) if first => c.segment_lines(),
                            _ => lines,
                        };
                        fetch_ahead(&shared, &local, &lines);
                        let mut p = shared.progress.lock();
                        p.next = records.last().map(|r| r.seq + 1).unwrap_or(p.next);
                        p.applied += records.len() as u64;
                        p.size = size.or(p.size);
                        if let Some(c) = records.iter().rev().find(|r| r.kind == Kind::Claim) {
                            p.owner = Some(c.owner.to_string());
                            p.owner_node = Some(c.owner.node.clone());
                            // A new owner: stand by for it afresh.
                            p.auto_fired = false;
                        }
                        // The owner's liveness, as a moved heartbeat is: it
                        // skips its beats while it appends (decision 0071).
                        p.last_change = Instant::now();
                        p.error = None;
                        // The owner writes: look again at once, then often.
                        p.poll_every = POLL;
                    }
                    Err(e) => {
                        // Not applied: read the same records again next round
                        // (they are absolute writes, so applying twice is harmless).
                        tracing::warn!(pool = %shared.pool, "standby: {e}");
                        let mut p = shared.progress.lock();
                        p.error = Some(e);
                        // Gone meanwhile? The probe below finds out at once.
                        p.probed = Instant::now().checked_sub(BEHIND_PROBE).unwrap_or(p.probed);
                        p.probe_every = BEHIND_PROBE;
                        p.poll_every = POLL;
                        tail = None;
                        drop(p);
                        pause(&shared, POLL);
                    }
                }
                continue;
            }
            Ok(_) => {}
            Err(e) => {
                let mut p = shared.progress.lock();
                p.error = Some(e.to_string());
                p.probe_every = BEHIND_PROBE;
                p.poll_every = POLL;
                tail = None;
            }
        }
        // Caught up, or so it seems: the record waited for may have been
        // compacted away while this standby lagged (paused, partitioned,
        // failing to apply). Never wait on a hole: rebuild.
        let (next, probe) = {
            let p = shared.progress.lock();
            (p.next, p.probed.elapsed() >= p.probe_every)
        };
        if probe {
            shared.progress.lock().probed = Instant::now();
            match is_behind(&store, &prefix, next) {
                Ok(true) => {
                    let mut p = shared.progress.lock();
                    p.rebuild = true;
                    p.probe_every = BEHIND_PROBE;
                    continue;
                }
                Ok(false) => {
                    let mut p = shared.progress.lock();
                    p.probe_every = backoff(p.probe_every, BEHIND_PROBE, BEHIND_PROBE_MAX);
                }
                Err(e) => {
                    let mut p = shared.progress.lock();
                    p.error = Some(e);
                    p.probe_every = BEHIND_PROBE;
                }
            }
        }
        // Has the owner's heartbeat moved?
        let (s, k) = (store.clone(), hb_key.clone());
        if let Ok(Ok(body)) = block(async move {
            match s.get(&k).await {
                Ok(r) => r.bytes().await.map(Some),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(e),
            }
        }) {
            let mut p = shared.progress.lock();
            if body.is_some() && body != p.heartbeat {
                let every = body.as_deref().and_then(advertised_every);
                if every != p.owner_every {
                    let delay = shared
                        .takeover_after
                        .map(|a| takeover_delay(a, every, shared.poll_max));
                    if let (Some(after), Some(delay)) = (shared.takeover_after, delay) {
                        if delay > after {
                            tracing::warn!(
                                pool = %shared.pool,
                                owner_heartbeat_ms = every.map_or(0, |e| e.as_millis() as u64),
                                takeover_after_secs = after.as_secs(),
                                effective_secs = delay.as_secs_f64(),
                                "standby: the owner beats too seldom for takeover_after_secs; waiting longer before an automatic takeover (set the same [bucket] takeover_after_secs on the owner)"
                            );
                        }
                    }
                    p.owner_every = every;
                }
                p.heartbeat = body;
                p.last_change = Instant::now();
            }
        }
        maybe_take_over(&shared);
        let wait = {
            let mut p = shared.progress.lock();
            let wait = p.poll_every;
            p.poll_every = backoff(wait, POLL, shared.poll_max);
            wait
        };
        pause(&shared, wait);
    }
    local
}

/// Fires the automatic takeover once the owner has been still for
/// `takeover_after` (log and heartbeat both unchanged, by this standby's
/// own clock: no clocks are compared across machines).
fn maybe_take_over(shared: &Shared) {
    let Some(after) = shared.takeover_after else {
        return;
    };
    let mut p = shared.progress.lock();
    let after = takeover_delay(after, p.owner_every, shared.poll_max);
    if p.auto_fired || p.size.is_none() || p.last_change.elapsed() < after {
        return;
    }
    let Some(f) = AUTO.lock().clone() else {
        return;
    };
    p.auto_fired = true;
    let idle = p.last_change.elapsed().as_secs_f64();
    drop(p);
    tracing::warn!(pool = %shared.pool, idle_secs = idle, "standby: the owner's log and heartbeat are still; taking over");
    let (pool, url) = (shared.pool.clone(), shared.url.clone());
    let _ = std::thread::Builder::new()
        .name("bucket-takeover".into())
        .spawn(move || f(pool, url));
}

fn pause(shared: &Shared, d: Duration) {
    let end = Instant::now() + d;
    while !shared.stop.load(Ordering::Acquire) && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether this daemon is a standby for `pool`.
pub fn is_standby(pool: &str) -> bool {
    STANDBYS.lock().contains_key(pool)
}

pub fn status(pool: &str) -> Option<StandbyStatus> {
    STANDBYS.lock().get(pool).map(status_of)
}

pub fn list() -> Vec<StandbyStatus> {
    STANDBYS.lock().values().map(status_of).collect()
}

fn status_of(sb: &Standby) -> StandbyStatus {
    let s = &sb.shared;
    let p = s.progress.lock();
    StandbyStatus {
        pool: s.pool.clone(),
        location: s.url.clone(),
        next_seq: p.next,
        records_applied: p.applied,
        size: p.size,
        owner: p.owner.clone(),
        idle_secs: p.last_change.elapsed().as_secs_f64(),
        takeover_after_secs: s.takeover_after.map(|d| d.as_secs()),
        error: p.error.clone(),
        rebuilds: p.rebuilds,
        claimed: sb.claimed.is_some(),
        owner_heartbeat_ms: p.owner_every.map(|e| e.as_millis() as u64),
    }
}

/// `pool takeover POOL [LOCATION]` on a standby: stops tailing, claims the
/// log after the last applied record (fencing the owner), applies what the
/// owner wrote since and returns the device over the warm cache. `None`:
/// this daemon is no standby for `pool` (the cold path applies).
///
/// A standby found behind the stored log (its next record compacted away)
/// rebuilds its cache from the last checkpoint and claims from there. Once
/// claimed, a replay that fails is tried again from the stored log alone
/// (checkpoint and records after it, over an emptied cache); if that fails
/// too the claim is held and the next `pool takeover POOL` on this daemon
/// replays again without claiming again (decision 0055).
pub fn take_over(pool: &str, location: Option<&str>) -> Option<Result<Vdev, VdevError>> {
    let mut sb = STANDBYS.lock().remove(pool)?;
    let err = |url: &str, why: String| VdevError::Open {
        path: PathBuf::from(url),
        source: io::Error::other(why),
    };
    if let Some(loc) = location.filter(|l| *l != sb.shared.url) {
        let why = format!(
            "this daemon is a standby of pool '{pool}' at {}, not at {loc}",
            sb.shared.url
        );
        let url = sb.shared.url.clone();
        STANDBYS.lock().insert(pool.to_string(), sb);
        return Some(Err(err(&url, why)));
    }
    let url = sb.shared.url.clone();
    let Some(settings) = bucket::settings() else {
        STANDBYS.lock().insert(pool.to_string(), sb);
        return Some(Err(err(&url, "no [bucket] settings".into())));
    };
    let started = Instant::now();
    let (log, mut local, records) = match sb.claimed.take() {
        // A claim held from an earlier attempt: replay again, claim nothing.
        Some((log, local)) => (log, local, None),
        None => {
            sb.shared.stop.store(true, Ordering::Release);
            let mut local = match sb.thread.take().map(|t| t.join()) {
                Some(Ok(l)) => l,
                _ => return Some(Err(err(&url, "the standby's tail thread died".into()))),
            };
            match claim(&sb, &settings, &mut local) {
                Ok((log, records)) => (log, local, Some(records)),
                Err(why) => {
                    // Nothing was claimed: keep standing by from where it was.
                    tracing::error!(pool, "standby: takeover failed: {why}");
                    spawn(sb, local);
                    return Some(Err(err(&url, why)));
                }
            }
        }
    };
    // Claimed: the old owner is fenced from here on, whatever happens next.
    let replayed = records.as_ref().map_or(0, Vec::len);
    let warm = match &records {
        Some(r) => apply_following(pool, &mut local, &sb.store, &sb.prefix, r)
            .map(|(size, _)| size.or(sb.shared.progress.lock().size)),
        None => Err("a claim held from an earlier attempt".into()),
    };
    let size = match warm {
        Ok(size) => Ok(size),
        Err(why) => {
            if records.is_some() {
                tracing::warn!(pool, "standby: replay after the claim failed ({why}); replaying again from the last checkpoint");
            }
            replay_claimed(&sb, &mut local, log.owner())
        }
    };
    let size = match size.and_then(|s| s.ok_or_else(|| format!("{url}: the log names no device"))) {
        Ok(size) => size,
        Err(why) if why.starts_with(FENCED) => {
            // Another owner claimed after us: stand by for it.
            tracing::error!(pool, "standby: {why}");
            sb.shared.progress.lock().rebuild = true;
            spawn(sb, local);
            return Some(Err(err(&url, why)));
        }
        Err(why) => {
            let why = format!(
                "claimed the log, but replaying it failed: {why}; `cistern pool takeover {pool}` replays again"
            );
            tracing::error!(pool, "standby: {why}");
            sb.shared.progress.lock().error = Some(why.clone());
            sb.claimed = Some((log, local));
            STANDBYS.lock().insert(pool.to_string(), sb);
            return Some(Err(err(&url, why)));
        }
    };
    let opened = (|| {
        let Local { file, index, .. } = local;
        let index = index.ok_or_else(|| format!("{url}: the log names no device"))?;
        if file.metadata().map_err(|e| e.to_string())?.len() < size {
            file.set_len(size).map_err(|e| e.to_string())?;
        }
        drop(file);
        index.reset_stats();
        Shipper::adopt(
            &url,
            &sb.cache,
            sb.store.clone(),
            sb.prefix.clone(),
            log,
            size,
            settings
                .config
                .inline_max
                .unwrap_or(bucket::DEFAULT_INLINE_MAX),
        )
        .map(|mut shipper| {
            // The new owner reads through the standby's bounded cache.
            shipper.ondemand = Some(Arc::new(index));
            shipper
        })
    })();
    tracing::info!(
        pool,
        location = %url,
        replayed,
        ms = started.elapsed().as_millis() as u64,
        "standby: claimed the log and applied what it had not yet"
    );
    Some(match opened {
        Ok(shipper) => Vdev::from_bucket_cache(&url, &sb.cache, shipper)
            .inspect(|dev| dev.start_bucket_background(&settings.config)),
        Err(why) => Err(err(&url, why)),
    })
}

/// What a replay error starts with when another owner claimed after us.
const FENCED: &str = "fenced:";

/// Claims the log from the standby's position; a standby found behind the
/// stored log rebuilds its cache from the last checkpoint and claims from
/// there (bounded rounds). Returns the records to apply after the cache.
fn claim(
    sb: &Standby,
    settings: &bucket::Settings,
    local: &mut Local,
) -> Result<(Log, Vec<Record>), String> {
    let owner = OwnerId::new(&settings.node).map_err(|e| e.to_string())?;
    for _ in 0..TAKEOVER_ROUNDS {
        if sb.shared.progress.lock().rebuild {
            // Taking over: no fetch ahead, the new owner fetches on demand.
            rebuild(&sb.shared, &sb.store, &sb.prefix, local, false)?;
        }
        let (next, fencing) = {
            let p = sb.shared.progress.lock();
            (p.next, p.owner_node.clone())
        };
        let (store, prefix, owner) = (sb.store.clone(), sb.prefix.clone(), owner.clone());
        match block(async move {
            Log::take_over_from(store, prefix, owner, next, fencing.as_deref()).await
        })? {
            Ok(x) => return Ok(x),
            Err(objstore::LogError::Behind { next }) => {
                tracing::warn!(pool = %sb.shared.pool, next, "standby: behind the stored log at takeover");
                sb.shared.progress.lock().rebuild = true;
            }
            Err(e) => return Err(e.to_string()),
        }
    }
    Err(format!(
        "the log was compacted past this standby {TAKEOVER_ROUNDS} times while taking over"
    ))
}

/// The replay of a claimed log from the bucket alone (last checkpoint and
/// the records after it, over an emptied cache), checking that our claim
/// is still the last one.
fn replay_claimed(sb: &Standby, local: &mut Local, owner: &OwnerId) -> Result<Option<u64>, String> {
    let (records, size) = rebuild_cache(&sb.shared.pool, local, &sb.store, &sb.prefix)?;
    match records.iter().rev().find(|r| r.kind == Kind::Claim) {
        Some(c) if c.owner == *owner => Ok(size),
        Some(c) => Err(format!(
            "{FENCED} {} claimed the log after this takeover",
            c.owner
        )),
        None => Err("the claim of this takeover is not in the log".into()),
    }
}

/// When the owner last appended a log record (decision 0071): a record a
/// standby reads is liveness as a heartbeat is, so the heartbeat skips the
/// beats such records already gave.
#[derive(Debug)]
pub(crate) struct Appended {
    base: Instant,
    /// Milliseconds after `base` plus one of the last append; 0: none yet.
    at: AtomicU64,
}

impl Appended {
    pub(crate) fn new() -> Appended {
        Appended {
            base: Instant::now(),
            at: AtomicU64::new(0),
        }
    }

    /// A log record of this owner is durable in the bucket.
    pub(crate) fn note(&self) {
        let ms = self.base.elapsed().as_millis() as u64 + 1;
        self.at.fetch_max(ms, Ordering::AcqRel);
    }

    /// Whether a record was appended within the last `d`.
    fn within(&self, d: Duration) -> bool {
        match self.at.load(Ordering::Acquire) {
            0 => false,
            at => self.base.elapsed().as_millis() as u64 + 1 - at < d.as_millis() as u64,
        }
    }
}

/// The owner's heartbeat: rewrites `PREFIX/heartbeat` every interval so a
/// standby can tell an idle owner from a stopped one, unless a log record
/// was appended within the interval (the standby reads that as liveness:
/// a busy owner PUTs no heartbeats). Stops when dropped or when the device
/// fails (fenced).
#[derive(Debug)]
pub(crate) struct Heartbeat {
    stop: Arc<AtomicBool>,
}

impl Heartbeat {
    pub(crate) fn start(
        store: Arc<dyn ObjectStore>,
        prefix: ObjPath,
        owner: String,
        every: Duration,
        appended: Arc<Appended>,
    ) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let key = prefix.child(HEARTBEAT_KEY);
        let _ = std::thread::Builder::new()
            .name("bucket-heartbeat".into())
            .spawn(move || {
                let mut beat = 0u64;
                while !flag.load(Ordering::Acquire) {
                    if beat == 0 || !appended.within(every) {
                        beat += 1;
                        let body = Bytes::from(format!(
                            "{owner} {beat} {EVERY_TAG}{}\n",
                            every.as_millis()
                        ));
                        let (s, k) = (store.clone(), key.clone());
                        match block(async move { s.put(&k, PutPayload::from_bytes(body)).await }) {
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => tracing::debug!("heartbeat object: {e}"),
                            Err(e) => tracing::debug!("heartbeat object: {e}"),
                        }
                    }
                    let end = Instant::now() + every;
                    while !flag.load(Ordering::Acquire) && Instant::now() < end {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                }
            });
        Heartbeat { stop }
    }

    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idle_probes_back_off_to_one_a_minute() {
        let mut every = BEHIND_PROBE;
        let mut waits = Vec::new();
        for _ in 0..8 {
            every = backoff(every, BEHIND_PROBE, BEHIND_PROBE_MAX);
            waits.push(every.as_secs());
        }
        assert_eq!(waits, vec![4, 8, 16, 32, 60, 60, 60, 60]);
        // LISTs a day of an idle caught-up standby, once backed off.
        assert_eq!(86_400 / BEHIND_PROBE_MAX.as_secs(), 1_440);
    }

    #[test]
    fn idle_looks_back_off_to_the_configured_wait_and_stay_under_the_takeover_delay() {
        let max = poll_max(None, None);
        assert_eq!(max, Duration::from_millis(DEFAULT_POLL_MAX_MS));
        let mut every = POLL;
        let mut waits = Vec::new();
        for _ in 0..7 {
            every = backoff(every, POLL, max);
            waits.push(every.as_millis() as u64);
        }
        assert_eq!(waits, vec![400, 800, 1600, 3200, 5000, 5000, 5000]);
        // GETs a day of an idle caught-up standby (record + heartbeat per look).
        assert_eq!(2 * 86_400_000 / DEFAULT_POLL_MAX_MS, 34_560);
        assert_eq!(2 * 86_400_000 / POLL.as_millis() as u64, 864_000);
        // An automatic takeover after 8 s: looks at most 2 s apart.
        let after = Some(Duration::from_secs(8));
        assert_eq!(poll_max(None, after), Duration::from_secs(2));
        assert_eq!(poll_max(Some(60_000), after), Duration::from_secs(2));
        assert_eq!(poll_max(Some(1_000), after), Duration::from_secs(1));
        // Never under the busy rate, whatever is configured.
        assert_eq!(poll_max(Some(0), None), POLL);
        assert_eq!(poll_max(None, Some(Duration::from_millis(400))), POLL);
        assert_eq!(backoff(POLL, POLL, POLL), POLL);
    }

    #[test]
    fn the_heartbeat_interval_follows_the_takeover_delay_and_idles_at_a_minute() {
        let cfg = |hb: Option<u64>, after: Option<u64>| bucket::BucketConfig {
            heartbeat_ms: hb,
            takeover_after_secs: after,
            ..Default::default()
        };
        // No automatic takeover: one PUT a minute, 1,440 a day (was 86,400).
        assert_eq!(heartbeat_every(&cfg(None, None)), Duration::from_secs(60));
        assert_eq!(86_400 / heartbeat_every(&cfg(None, None)).as_secs(), 1_440);
        assert_eq!(
            heartbeat_every(&cfg(None, Some(0))),
            Duration::from_secs(60)
        );
        // A quarter of the takeover delay, within 200 ms..60 s.
        assert_eq!(
            heartbeat_every(&cfg(None, Some(30))),
            Duration::from_millis(7_500)
        );
        assert_eq!(
            heartbeat_every(&cfg(None, Some(3))),
            Duration::from_millis(750)
        );
        assert_eq!(
            heartbeat_every(&cfg(None, Some(1))),
            Duration::from_millis(250)
        );
        assert_eq!(
            heartbeat_every(&cfg(None, Some(3600))),
            Duration::from_secs(60)
        );
        // heartbeat_ms wins, and is never under 50 ms.
        assert_eq!(
            heartbeat_every(&cfg(Some(300), Some(30))),
            Duration::from_millis(300)
        );
        assert_eq!(
            heartbeat_every(&cfg(Some(1), None)),
            Duration::from_millis(50)
        );
    }

    #[test]
    fn a_standby_waits_at_least_two_beats_of_the_owner_and_reads_old_bodies() {
        // The body as the owner writes it, and an owner's from before 0071.
        assert_eq!(
            advertised_every(b"owner 00000000000000ab 7 every_ms=7500\n"),
            Some(Duration::from_millis(7_500))
        );
        assert_eq!(advertised_every(b"owner 00000000000000ab 7\n"), None);
        assert_eq!(advertised_every(b"\xff\xfe"), None);
        assert_eq!(advertised_every(b""), None);
        let (s, poll) = (Duration::from_secs(1), Duration::from_secs(1));
        // An owner beating as often as its standby needs: the delay stands.
        assert_eq!(takeover_delay(30 * s, Some(7_500 * s / 1000), poll), 30 * s);
        // An owner configured apart (a minute): two beats and a look.
        assert_eq!(takeover_delay(10 * s, Some(60 * s), poll), 121 * s);
        // An old owner says nothing: the configured delay.
        assert_eq!(takeover_delay(10 * s, None, poll), 10 * s);
    }

    #[test]
    fn a_busy_owner_skips_its_beats_and_an_idle_one_beats_again() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let prefix = ObjPath::from("p");
        let key = prefix.child(HEARTBEAT_KEY);
        let counter = || {
            let (s, k) = (store.clone(), key.clone());
            let body = block(async move { s.get(&k).await?.bytes().await })
                .unwrap()
                .unwrap();
            assert!(
                advertised_every(&body) == Some(Duration::from_millis(100)),
                "{body:?}"
            );
            let text = String::from_utf8(body.to_vec()).unwrap();
            text.split_whitespace()
                .nth(2)
                .unwrap()
                .parse::<u64>()
                .unwrap()
        };
        let appended = Arc::new(Appended::new());
        let every = Duration::from_millis(100);
        let hb = Heartbeat::start(
            store.clone(),
            prefix.clone(),
            "n 00000000000000ab".into(),
            every,
            appended.clone(),
        );
        let first = Instant::now();
        let wait = |what: &str, f: &dyn Fn() -> bool| {
            let end = Instant::now() + Duration::from_secs(20);
            while !f() {
                assert!(Instant::now() < end, "timed out waiting for {what}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        wait("the first beat", &|| {
            let (s, k) = (store.clone(), key.clone());
            block(async move { s.head(&k).await }).unwrap().is_ok()
        });
        // Appending every 20 ms for 1 s (ten intervals): no beat at all.
        let start = counter();
        let end = Instant::now() + Duration::from_secs(1);
        while Instant::now() < end {
            appended.note();
            std::thread::sleep(Duration::from_millis(20));
        }
        let busy = counter() - start;
        assert!(busy <= 1, "{busy} beats while appending");
        // Idle again: it beats every interval.
        wait("beats once idle", &|| counter() >= start + busy + 3);
        drop(hb);
        assert!(first.elapsed() < Duration::from_secs(20));
    }
}
