//! Scrub and resilver: a background walk over every row of `BLOCKS` in key
//! order, verifying (scrub) or rebuilding one device (resilver) through the
//! pool's primitives, plus a pass over every metadata page on every device.
//!
//! - **Batches.** Rows are read `BATCH_ROWS` at a time in a short read
//!   transaction, verified (in parallel, sorted by disk offset), and the
//!   position advances to the batch's last key. NBD I/O never waits for
//!   more than one batch.
//! - **No reuse under the scan.** A block freed by a txg commit while a batch
//!   that names it is being verified could be reallocated and rewritten, and
//!   a "repair" would then write stale bytes over live ones. The txg's free
//!   step takes [`ScanSlot::free_gate`] for writing; a batch holds it for
//!   reading from before its read transaction until its last verify.
//! - **Resume.** The position (last key done), counters and state are
//!   persisted in `POOL_RECORDS` every `CHECKPOINT_SECS` in a transaction of
//!   their own under `meta_lock`; after a restart the scan continues after
//!   that key. At most one checkpoint interval is verified twice.
//! - **Rate.** `EngineConfig::scan_rate_bytes` bounds the bytes examined
//!   per second (0: unlimited); the thread sleeps between batches.
//! - **One scan at a time**, as ZFS: a resilver cancels a running scrub.
//!
//! Rows with an empty value are tombstones (snapshots): skipped. Older
//! versions of a block kept for snapshots are verified like live ones.

use crate::blockmap::{block_addr, block_of};
use crate::txg::ImportedPool;
use crate::{DataError, DatasetKind, Error, Result, ScanFunction, ScanState, ScanStatus};
use block::BlockPointer;
use meta::redb::{ReadableDatabase, ReadableTable};
use meta::schema::*;
use parking_lot::{Condvar, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use pool::Dva;
use std::ops::Bound;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Rows read per batch (one short read transaction each).
const BATCH_ROWS: usize = 1024;
/// Bytes of block data per batch, at most (keeps a batch short under a rate limit).
const BATCH_BYTES: u64 = 32 << 20;
/// Seconds between persisted checkpoints of the position.
const CHECKPOINT_SECS: f64 = 2.0;
/// Threads verifying one batch.
const VERIFY_THREADS: usize = 4;
/// Largest run of adjacent blocks verified with one pool call.
const RUN_BYTES: u64 = 2 << 20;
/// Unrepairable blocks listed (persisted and in status); more are only counted.
pub(crate) const MAX_LISTED_ERRORS: usize = 256;

/// A block version: (dataset, object, block, birth).
type Key = (u64, u64, u64, u64);

use crate::txg::meta_err;

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// What the running thread is asked to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
enum Request {
    #[default]
    Run,
    Pause,
    Cancel,
    /// The pool is being closed: stop without changing the persisted state.
    Stop,
}

/// The persisted scan (mirrors the `scan_*` records of `POOL_RECORDS`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ScanRecord {
    pub func: ScanFunction,
    pub state: ScanState,
    pub start: u64,
    pub end: u64,
    pub meta_done: bool,
    pub pos: Option<Key>,
    pub examined: u64,
    pub total: u64,
    pub repaired: u64,
    pub errors: u64,
    pub target_guid: u64,
    pub old_guid: u64,
}

impl ScanRecord {
    fn new(func: ScanFunction, total: u64, target_guid: u64, old_guid: u64) -> Self {
        ScanRecord {
            func,
            state: ScanState::Scanning,
            start: now_secs(),
            end: 0,
            meta_done: false,
            pos: None,
            examined: 0,
            total,
            repaired: 0,
            errors: 0,
            target_guid,
            old_guid,
        }
    }
}

/// Runtime state of the scan; one per imported pool (a field of
/// [`ImportedPool`]).
#[derive(Default)]
pub struct ScanSlot {
    gate: RwLock<()>,
    ctl: Mutex<Ctl>,
    changed: Condvar,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct Ctl {
    request: Request,
    /// The in-memory copy of the persisted record (None: never scanned).
    record: Option<ScanRecord>,
    loaded: bool,
    /// Unrepairable blocks found by the current or last scan.
    errors: Vec<Key>,
    /// Rate bookkeeping for this process: when the thread started, and the
    /// examined count then.
    since: Option<(Instant, u64)>,
    /// When the thread started, whether the scan started from nothing
    /// then, and how long it took once finished.
    timing: Option<(Instant, bool, Option<f64>)>,
    running: bool,
}

impl ScanSlot {
    /// Taken for writing by the txg before freed space goes back to the
    /// allocator (see the module documentation).
    pub fn free_gate(&self) -> RwLockWriteGuard<'_, ()> {
        self.gate.write()
    }

    fn hold(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
    }
}

// ------------------------------------------------------------ persistence

fn load_record(p: &ImportedPool) -> Result<(Option<ScanRecord>, Vec<Key>)> {
    let tx = p.db().begin_read().map_err(meta_err)?;
    let t = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
    let get =
        |k: &str| -> Result<Option<u64>> { Ok(t.get(k).map_err(meta_err)?.map(|v| v.value())) };
    let Some(func) = get(RECORD_SCAN_FUNC)? else {
        return Ok((None, Vec::new()));
    };
    let func = match func {
        2 => ScanFunction::Resilver,
        _ => ScanFunction::Scrub,
    };
    let state = match get(RECORD_SCAN_STATE)?.unwrap_or(3) {
        1 => ScanState::Scanning,
        2 => ScanState::Paused,
        4 => ScanState::Canceled,
        _ => ScanState::Finished,
    };
    let g = |k: &str| -> Result<u64> { Ok(get(k)?.unwrap_or(0)) };
    let pos = if g(RECORD_SCAN_POS_VALID)? == 1 {
        Some((
            g(RECORD_SCAN_POS_DATASET)?,
            g(RECORD_SCAN_POS_OBJECT)?,
            g(RECORD_SCAN_POS_BLOCK)?,
            g(RECORD_SCAN_POS_BIRTH)?,
        ))
    } else {
        None
    };
    let rec = ScanRecord {
        func,
        state,
        start: g(RECORD_SCAN_START)?,
        end: g(RECORD_SCAN_END)?,
        meta_done: g(RECORD_SCAN_META_DONE)? == 1,
        pos,
        examined: g(RECORD_SCAN_EXAMINED)?,
        total: g(RECORD_SCAN_TOTAL)?,
        repaired: g(RECORD_SCAN_REPAIRED)?,
        errors: g(RECORD_SCAN_ERRORS)?,
        target_guid: g(RECORD_SCAN_TARGET_GUID)?,
        old_guid: g(RECORD_SCAN_OLD_GUID)?,
    };
    let mut errors = Vec::new();
    for row in t
        .range::<&str>(RECORD_SCAN_ERROR_PREFIX..error_prefix_end())
        .map_err(meta_err)?
    {
        let (k, v) = row.map_err(meta_err)?;
        if let Some(key) = parse_error_key(k.value(), v.value()) {
            errors.push(key);
        }
        if errors.len() >= MAX_LISTED_ERRORS {
            break;
        }
    }
    Ok((Some(rec), errors))
}

/// The first string after every `scan_error/...` key.
fn error_prefix_end() -> &'static str {
    "scan_error0" // '0' follows '/'
}

fn error_key(ds: u64, obj: u64, blk: u64) -> String {
    format!("{RECORD_SCAN_ERROR_PREFIX}{ds}/{obj}/{blk}")
}

fn parse_error_key(k: &str, birth: u64) -> Option<Key> {
    let rest = k.strip_prefix(RECORD_SCAN_ERROR_PREFIX)?;
    let mut parts = rest.split('/').map(|x| x.parse::<u64>().ok());
    let (ds, obj, blk) = (parts.next()??, parts.next()??, parts.next()??);
    Some((ds, obj, blk, birth))
}

/// Writes the record (and, with `clear_errors`, drops the listed errors
/// first; `new_errors` are added). The caller holds `meta_lock`.
fn store_locked(
    p: &ImportedPool,
    rec: &ScanRecord,
    clear_errors: bool,
    new_errors: &[Key],
) -> Result<()> {
    let tx = p.db().begin_write().map_err(meta_err)?;
    {
        let mut t = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
        if clear_errors {
            let old: Vec<String> = t
                .range::<&str>(RECORD_SCAN_ERROR_PREFIX..error_prefix_end())
                .map_err(meta_err)?
                .map(|r| r.map(|(k, _)| k.value().to_string()))
                .collect::<std::result::Result<_, _>>()
                .map_err(meta_err)?;
            for k in old {
                t.remove(k.as_str()).map_err(meta_err)?;
            }
        }
        for &(ds, obj, blk, birth) in new_errors {
            t.insert(error_key(ds, obj, blk).as_str(), birth)
                .map_err(meta_err)?;
        }
        let func = match rec.func {
            ScanFunction::Scrub => 1,
            ScanFunction::Resilver => 2,
        };
        let state = match rec.state {
            ScanState::Scanning => 1,
            ScanState::Paused => 2,
            ScanState::Finished => 3,
            ScanState::Canceled => 4,
        };
        let (valid, pos) = match rec.pos {
            Some(k) => (1, k),
            None => (0, (0, 0, 0, 0)),
        };
        for (k, v) in [
            (RECORD_SCAN_FUNC, func),
            (RECORD_SCAN_STATE, state),
            (RECORD_SCAN_START, rec.start),
            (RECORD_SCAN_END, rec.end),
            (RECORD_SCAN_META_DONE, rec.meta_done as u64),
            (RECORD_SCAN_POS_VALID, valid),
            (RECORD_SCAN_POS_DATASET, pos.0),
            (RECORD_SCAN_POS_OBJECT, pos.1),
            (RECORD_SCAN_POS_BLOCK, pos.2),
            (RECORD_SCAN_POS_BIRTH, pos.3),
            (RECORD_SCAN_EXAMINED, rec.examined),
            (RECORD_SCAN_TOTAL, rec.total),
            (RECORD_SCAN_REPAIRED, rec.repaired),
            (RECORD_SCAN_ERRORS, rec.errors),
            (RECORD_SCAN_TARGET_GUID, rec.target_guid),
            (RECORD_SCAN_OLD_GUID, rec.old_guid),
        ] {
            t.insert(k, v).map_err(meta_err)?;
        }
    }
    tx.commit().map_err(meta_err)
}

fn store(p: &ImportedPool, rec: &ScanRecord, clear_errors: bool, new_errors: &[Key]) -> Result<()> {
    let _meta = p.meta_lock.lock();
    store_locked(p, rec, clear_errors, new_errors)
}

/// Loads the persisted record into the slot once.
fn ensure_loaded(p: &ImportedPool) -> Result<()> {
    if p.scan.ctl.lock().loaded {
        return Ok(());
    }
    let (rec, errors) = load_record(p)?;
    let mut c = p.scan.ctl.lock();
    if !c.loaded {
        c.record = rec;
        // Keep what reads noted before the first load.
        let mut all = errors;
        for k in std::mem::take(&mut c.errors) {
            if !all.contains(&k) && all.len() < MAX_LISTED_ERRORS {
                all.push(k);
            }
        }
        c.errors = all;
        c.loaded = true;
    }
    Ok(())
}

// ------------------------------------------------------------ control

/// Starts a scrub, or resumes a paused one.
pub(crate) fn start_scrub(p: &Arc<ImportedPool>) -> Result<()> {
    ensure_loaded(p)?;
    let resume = {
        let c = p.scan.ctl.lock();
        match &c.record {
            Some(r) if r.state == ScanState::Scanning && r.func == ScanFunction::Resilver => {
                return Err(Error::Busy(format!(
                    "pool '{}' is resilvering; scrub after it finishes",
                    p.pool.name
                )))
            }
            Some(r) if r.state == ScanState::Scanning && c.running => {
                return Err(Error::Busy(format!(
                    "a scrub of pool '{}' is already running (pause it with -p, cancel it with -s)",
                    p.pool.name
                )))
            }
            Some(r) if r.func == ScanFunction::Scrub && r.state == ScanState::Paused => {
                Some(r.clone())
            }
            _ => None,
        }
    };
    let rec = match resume {
        Some(mut r) => {
            r.state = ScanState::Scanning;
            store(p, &r, false, &[])?;
            r
        }
        None => {
            let r = ScanRecord::new(ScanFunction::Scrub, p.pool.allocated(), 0, 0);
            store(p, &r, true, &[])?;
            p.scan.ctl.lock().errors.clear();
            r
        }
    };
    tracing::info!(pool = %p.pool.name, resumed = rec.pos.is_some(), "scrub started");
    spawn(p, rec)
}

/// `scrub -p`: stops the running scrub where it is; `scrub` resumes it.
pub(crate) fn pause(p: &Arc<ImportedPool>) -> Result<()> {
    ensure_loaded(p)?;
    let mut c = p.scan.ctl.lock();
    let running = c.running;
    match &mut c.record {
        Some(r) if r.state == ScanState::Scanning && r.func == ScanFunction::Scrub => {
            if running {
                c.request = Request::Pause;
                p.scan.changed.notify_all();
                drop(c);
                join(p);
                Ok(())
            } else {
                r.state = ScanState::Paused;
                let r = r.clone();
                drop(c);
                store(p, &r, false, &[])
            }
        }
        Some(r) if r.state == ScanState::Scanning => Err(Error::Busy(format!(
            "pool '{}' is resilvering: a resilver cannot be paused",
            p.pool.name
        ))),
        _ => Err(Error::InvalidArgument(format!(
            "there is no active scrub on pool '{}'",
            p.pool.name
        ))),
    }
}

/// `scrub -s`: cancels a running or paused scrub.
pub(crate) fn cancel(p: &Arc<ImportedPool>) -> Result<()> {
    ensure_loaded(p)?;
    let mut c = p.scan.ctl.lock();
    let running = c.running;
    match &mut c.record {
        Some(r)
            if r.func == ScanFunction::Scrub
                && matches!(r.state, ScanState::Scanning | ScanState::Paused) =>
        {
            if running {
                c.request = Request::Cancel;
                p.scan.changed.notify_all();
                drop(c);
                join(p);
                Ok(())
            } else {
                r.state = ScanState::Canceled;
                r.end = now_secs();
                let r = r.clone();
                drop(c);
                store(p, &r, false, &[])
            }
        }
        Some(r) if r.state == ScanState::Scanning => Err(Error::Busy(format!(
            "pool '{}' is resilvering: a resilver cannot be canceled",
            p.pool.name
        ))),
        _ => Err(Error::InvalidArgument(format!(
            "there is no active scrub on pool '{}'",
            p.pool.name
        ))),
    }
}

/// Stops the thread without changing the persisted state (pool close);
/// the scan resumes at the next import.
pub(crate) fn stop(p: &ImportedPool) {
    {
        let mut c = p.scan.ctl.lock();
        if !c.running {
            return;
        }
        c.request = Request::Stop;
        p.scan.changed.notify_all();
    }
    join(p);
}

fn join(p: &ImportedPool) {
    let handle = p.scan.thread.lock().take();
    if let Some(h) = handle {
        if h.join().is_err() {
            tracing::error!(pool = %p.pool.name, "scan thread panicked");
        }
    }
}

/// Starts a resilver onto `target_guid` (which replaces `old_guid`, or is
/// the same device brought back online). The caller has attached the
/// device under `meta_lock` and passes the record to persist with it.
pub(crate) fn resilver_record(p: &ImportedPool, target_guid: u64, old_guid: u64) -> ScanRecord {
    ScanRecord::new(
        ScanFunction::Resilver,
        p.pool.allocated(),
        target_guid,
        old_guid,
    )
}

/// Persists a new resilver record (caller holds `meta_lock`).
pub(crate) fn store_new_locked(p: &ImportedPool, rec: &ScanRecord) -> Result<()> {
    store_locked(p, rec, true, &[])
}

/// Whether a scan thread is running.
pub(crate) fn is_running(p: &ImportedPool) -> bool {
    p.scan.ctl.lock().running
}

/// Stops any running scan so a resilver can take its place.
pub(crate) fn preempt(p: &Arc<ImportedPool>) -> Result<()> {
    ensure_loaded(p)?;
    let running = {
        let mut c = p.scan.ctl.lock();
        if c.running {
            c.request = Request::Stop;
            p.scan.changed.notify_all();
        }
        c.running
    };
    if running {
        join(p);
    }
    Ok(())
}

pub(crate) fn start_resilver(p: &Arc<ImportedPool>, rec: ScanRecord) -> Result<()> {
    {
        let mut c = p.scan.ctl.lock();
        c.errors.clear();
        c.loaded = true;
    }
    tracing::info!(pool = %p.pool.name, target = rec.target_guid, "resilver started");
    spawn(p, rec)
}

/// At import: continues a scan that was running when the pool was last
/// open (also after kill -9), or starts the resilver of a device whose
/// label says it is being rebuilt (a crash between the replace and the
/// first record of its resilver).
pub(crate) fn resume_at_import(p: &Arc<ImportedPool>) -> Result<()> {
    ensure_loaded(p)?;
    let (running, record) = {
        let c = p.scan.ctl.lock();
        (c.running, c.record.clone())
    };
    if running {
        return Ok(());
    }
    let rec = match record {
        Some(r)
            if r.state == ScanState::Scanning
                && r.func == ScanFunction::Resilver
                && !p.pool.is_resilvering(r.target_guid) =>
        {
            // Finished (the labels say so) but the last record was not written.
            let mut r = r;
            r.state = ScanState::Finished;
            r.end = now_secs();
            store(p, &r, false, &[])?;
            p.scan.ctl.lock().record = Some(r);
            None
        }
        Some(r) if r.state == ScanState::Scanning => Some(r),
        _ => None,
    };
    let rec = match (rec, next_resilver_target(p)) {
        (Some(r), _) => r,
        (None, Some(target)) => {
            let r = resilver_record(p, target, target);
            store(p, &r, true, &[])?;
            p.scan.ctl.lock().errors.clear();
            r
        }
        (None, None) => return Ok(()),
    };
    tracing::info!(pool = %p.pool.name, function = ?rec.func, position = ?rec.pos, "resuming scan");
    spawn(p, rec)
}

fn spawn(p: &Arc<ImportedPool>, rec: ScanRecord) -> Result<()> {
    {
        let mut c = p.scan.ctl.lock();
        if c.running {
            return Err(Error::Busy(format!(
                "a scan of pool '{}' is already running",
                p.pool.name
            )));
        }
        c.request = Request::Run;
        c.since = Some((Instant::now(), rec.examined));
        c.timing = Some((Instant::now(), rec.examined == 0 && !rec.meta_done, None));
        c.record = Some(rec.clone());
        c.running = true;
    }
    announce(p, &rec, true);
    // A finished thread's handle may still be here: reap it.
    join(p);
    let weak = Arc::downgrade(p);
    let handle = std::thread::Builder::new()
        .name(format!("scan-{}", p.pool.name))
        .spawn(move || run(weak))
        .map_err(|e| {
            p.scan.ctl.lock().running = false;
            Error::Io(format!("cannot start scan thread: {e}"))
        })?;
    *p.scan.thread.lock() = Some(handle);
    Ok(())
}

/// Posts the event (and the internal history record) of a scan starting
/// or ending.
fn announce(p: &ImportedPool, rec: &ScanRecord, started: bool) {
    use crate::events::class;
    let (name, class) = match (rec.func, started, rec.state) {
        (ScanFunction::Scrub, true, _) => ("scrub", class::SCRUB_START),
        (ScanFunction::Resilver, true, _) => ("resilver", class::RESILVER_START),
        (ScanFunction::Scrub, false, ScanState::Finished) => ("scrub", class::SCRUB_FINISH),
        (ScanFunction::Scrub, false, ScanState::Canceled) => ("scrub", class::SCRUB_ABORT),
        (ScanFunction::Scrub, false, ScanState::Paused) => ("scrub", class::SCRUB_PAUSED),
        (ScanFunction::Resilver, false, ScanState::Finished) => {
            ("resilver", class::RESILVER_FINISH)
        }
        _ => return,
    };
    let mut fields = vec![
        ("examined", rec.examined.to_string()),
        ("repaired", rec.repaired.to_string()),
        ("errors", rec.errors.to_string()),
    ];
    if rec.func == ScanFunction::Resilver {
        fields.push(("vdev_guid", rec.target_guid.to_string()));
    }
    crate::events::post_event(&p.pool, class, &fields);
    let what = if started {
        format!(
            "{name} setup{}",
            if rec.pos.is_some() { " (resumed)" } else { "" }
        )
    } else {
        format!(
            "{name} {} examined={} repaired={} errors={}",
            match rec.state {
                ScanState::Finished => "done",
                ScanState::Canceled => "canceled",
                _ => "paused",
            },
            rec.examined,
            rec.repaired,
            rec.errors
        )
    };
    crate::history::log_internal(p, &what);
}

// ------------------------------------------------------------ status

/// `scan:` of `pool status` and the unrepaired blocks.
pub(crate) fn status(p: &ImportedPool) -> (Option<ScanStatus>, Vec<DataError>) {
    if let Err(e) = ensure_loaded(p) {
        tracing::warn!(pool = %p.pool.name, error = %e, "cannot read scan state");
    }
    // Names come from the dataset map: looked up without the scan lock held.
    let keys = p.scan.ctl.lock().errors.clone();
    let errors = listed_errors(p, &keys);
    let c = p.scan.ctl.lock();
    let Some(r) = &c.record else {
        return (None, errors);
    };
    let rate = match (c.running, c.since) {
        (true, Some((t, base))) => {
            let secs = t.elapsed().as_secs_f64();
            if secs > 0.5 {
                (r.examined.saturating_sub(base) as f64 / secs) as u64
            } else {
                0
            }
        }
        _ => 0,
    };
    let eta_secs = (r.state == ScanState::Scanning && rate > 0)
        .then(|| r.total.saturating_sub(r.examined) / rate);
    let target = (r.func == ScanFunction::Resilver)
        .then(|| device_path(p, r.target_guid))
        .flatten();
    let scan = ScanStatus {
        function: r.func,
        state: r.state,
        start_time: r.start,
        end_time: r.end,
        examined: r.examined,
        total: r.total.max(r.examined),
        repaired: r.repaired,
        errors: r.errors,
        rate,
        eta_secs,
        elapsed_secs: match c.timing {
            Some((_, true, Some(done))) => done,
            Some((t, true, None)) if c.running => t.elapsed().as_secs_f64(),
            _ => {
                let end = if r.end > 0 { r.end } else { now_secs() };
                end.saturating_sub(r.start) as f64
            }
        },
        target,
    };
    (Some(scan), errors)
}

/// The listed blocks as dataset name and byte offset.
fn listed_errors(p: &ImportedPool, keys: &[Key]) -> Vec<DataError> {
    let datasets = p.datasets.read();
    keys.iter()
        .map(|&(ds, obj, blk, _)| {
            if ds == METADATA_ID {
                // A metadata page with no good copy: offset is the page number.
                return DataError {
                    dataset: "<metadata>".into(),
                    offset: blk,
                    length: 0,
                };
            }
            match datasets.values().find(|d| d.id == ds) {
                Some(d) if d.kind == DatasetKind::Volume => DataError {
                    dataset: d.name.clone(),
                    offset: blk * d.volblocksize as u64,
                    length: d.volblocksize as u64,
                },
                // An object's block: named by object and block index.
                Some(d) => DataError {
                    dataset: format!("{} object {obj}", d.name),
                    offset: blk,
                    length: 0,
                },
                _ => DataError {
                    dataset: format!("<dataset {ds}>"),
                    offset: blk,
                    length: 0,
                },
            }
        })
        .collect()
}

/// A read found no good copy of a block: listed by `pool status -v` (in
/// memory; a scan persists what it finds itself).
pub(crate) fn note_lost_block(p: &ImportedPool, key: Key) {
    let mut c = p.scan.ctl.lock();
    if c.errors.len() < MAX_LISTED_ERRORS && !c.errors.contains(&key) {
        c.errors.push(key);
    }
}

fn device_path(p: &ImportedPool, guid: u64) -> Option<std::path::PathBuf> {
    p.pool.device_by_guid(guid).map(|d| d.path().to_path_buf())
}

// ------------------------------------------------------------ the walk

/// One block row of the block map: its key and pointer (None: tombstone /
/// undecodable). Names are skipped; they and embedded blocks live in the
/// metadata, which the metadata pass verifies.
struct Row {
    key: Key,
    bp: Option<std::result::Result<BlockPointer, String>>,
}

/// Reads up to `BATCH_ROWS` rows after `pos`.
fn read_batch(p: &ImportedPool, pos: Option<Key>, max_bytes: u64) -> Result<Vec<Row>> {
    let tx = p.db().begin_read().map_err(meta_err)?;
    let t = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
    let pos_addr = pos.map(|(ds, obj, blk, birth)| (ds, block_addr(obj, blk), birth));
    let lower = match &pos_addr {
        Some((ds, a, birth)) => Bound::Excluded((*ds, &a[..], *birth)),
        None => Bound::Unbounded,
    };
    let mut out = Vec::new();
    let mut bytes = 0u64;
    for row in t
        .range::<(u64, &[u8], u64)>((lower, Bound::Unbounded))
        .map_err(meta_err)?
    {
        let (k, v) = row.map_err(meta_err)?;
        let (ds, addr, birth) = k.value();
        let v = v.value();
        if let Some((obj, blk)) = block_of(addr) {
            let bp = if v.is_empty() {
                None
            } else {
                Some(BlockPointer::decode(v).map_err(|e| e.to_string()))
            };
            if let Some(Ok(bp)) = &bp {
                bytes += bp.asize();
            }
            out.push(Row {
                key: (ds, obj, blk, birth),
                bp,
            });
        }
        if out.len() >= BATCH_ROWS || bytes >= max_bytes {
            break;
        }
    }
    Ok(out)
}

/// Result of verifying one row.
#[derive(Default)]
struct RowResult {
    examined: u64,
    repaired: u64,
    /// Every copy failed: the block is lost.
    lost: bool,
}

fn verify_row(
    p: &ImportedPool,
    rec: &ScanRecord,
    target_group: Option<u32>,
    bp: &BlockPointer,
) -> RowResult {
    let mut r = RowResult::default();
    let mut good = 0;
    let verify = |b: &[u8]| bp.checksum_algo.compute(b) == bp.checksum;
    for dva in &bp.dvas {
        r.examined += dva.asize as u64;
        match rec.func {
            ScanFunction::Scrub => match p.pool.scrub_block(*dva, bp.psize as usize, verify) {
                Ok(o) => {
                    if !o.bad_devices.is_empty() {
                        // Per block only at debug: the heals are logged per
                        // device and minute, the totals when the scan ends.
                        tracing::debug!(pool = %p.pool.name, ?dva, bad_devices = ?o.bad_devices, repaired = o.repaired_bytes, "scrub: repaired block");
                    }
                    r.repaired += o.repaired_bytes;
                    good += 1;
                }
                Err(e) => note_unrepaired(p, "scrub: block cannot be repaired", dva, &e),
            },
            ScanFunction::Resilver => {
                if Some(dva.group) != target_group {
                    good += 1;
                    continue;
                }
                match p
                    .pool
                    .resilver_block(*dva, bp.psize as usize, verify, rec.target_guid)
                {
                    Ok(n) => {
                        r.repaired += n;
                        good += 1;
                    }
                    Err(e) => note_unrepaired(p, "resilver: block cannot be rebuilt", dva, &e),
                }
            }
        }
    }
    r.lost = good == 0;
    r
}

/// One line per pool and minute for blocks a scan could not repair (their
/// count is in the scan's summary, the blocks in `pool status -v`).
fn note_unrepaired(p: &ImportedPool, what: &str, dva: &Dva, e: &pool::PoolError) {
    let subject = format!("unrepaired {}", p.pool.name);
    if let Some(more) = pool::ratelog::DEVICE_EVENTS.admit(&subject) {
        tracing::warn!(pool = %p.pool.name, ?dva, error = %e, more_not_logged = more, "{what}");
    }
}

/// The group holding device `guid`.
fn group_of(p: &ImportedPool, guid: u64) -> Option<u32> {
    p.pool
        .groups()
        .iter()
        .find(|g| g.children().iter().any(|c| c.guid == guid))
        .map(|g| g.index)
}

/// Blocks lying back to back on one group, verified with one pool call.
struct Run<'a> {
    dva: Dva,
    /// Bytes the run's data covers (up to the last block's psize).
    len: usize,
    /// Each block: key, pointer, offset of its bytes in the run.
    blocks: Vec<(Key, &'a BlockPointer, usize)>,
}

/// Groups sorted single-copy blocks into runs of adjacent allocations (at
/// most `RUN_BYTES`); blocks with several copies stand alone.
fn runs<'a>(work: &[(Key, &'a BlockPointer)]) -> Vec<Run<'a>> {
    let mut out: Vec<Run<'a>> = Vec::new();
    for &(key, bp) in work {
        let d = bp.dvas[0];
        if let Some(r) = out.last_mut() {
            let end = r.dva.offset + r.dva.asize as u64;
            if bp.dvas.len() == 1
                && r.blocks[0].1.dvas.len() == 1
                && r.dva.group == d.group
                && end == d.offset
                && r.dva.asize as u64 + d.asize as u64 <= RUN_BYTES
            {
                let at = r.dva.asize as usize;
                r.blocks.push((key, bp, at));
                r.len = at + bp.psize as usize;
                r.dva.asize += d.asize;
                continue;
            }
        }
        out.push(Run {
            dva: d,
            len: bp.psize as usize,
            blocks: vec![(key, bp, 0)],
        });
    }
    out
}

/// Verifies (or rebuilds) a run with one pool call; when it fails, block by
/// block, so a damaged block neither hides its neighbours nor is counted
/// for them.
fn verify_run(
    p: &ImportedPool,
    rec: &ScanRecord,
    target_group: Option<u32>,
    run: &Run<'_>,
) -> (u64, u64, Vec<Key>) {
    if run.blocks.len() > 1 {
        let verify = |b: &[u8]| {
            run.blocks.iter().all(|(_, bp, at)| {
                b.get(*at..*at + bp.psize as usize)
                    .is_some_and(|s| bp.checksum_algo.compute(s) == bp.checksum)
            })
        };
        let examined = run.dva.asize as u64;
        let whole = match rec.func {
            ScanFunction::Scrub => p
                .pool
                .scrub_block(run.dva, run.len, verify)
                .map(|o| o.repaired_bytes),
            ScanFunction::Resilver if Some(run.dva.group) != target_group => Ok(0),
            ScanFunction::Resilver => {
                p.pool
                    .resilver_block(run.dva, run.len, verify, rec.target_guid)
            }
        };
        if let Ok(repaired) = whole {
            return (examined, repaired, Vec::new());
        }
    }
    let (mut ex, mut rep, mut lost) = (0, 0, Vec::new());
    for (key, bp, _) in &run.blocks {
        let r = verify_row(p, rec, target_group, bp);
        ex += r.examined;
        rep += r.repaired;
        if r.lost {
            lost.push(*key);
        }
    }
    (ex, rep, lost)
}

/// Verifies a batch on up to `VERIFY_THREADS` threads, rows sorted by disk
/// position and grouped into runs of adjacent blocks, so each thread reads
/// forward in large I/Os. Returns (examined, repaired, lost keys).
fn verify_batch(p: &ImportedPool, rec: &ScanRecord, rows: &[Row]) -> (u64, u64, Vec<Key>) {
    let mut work: Vec<(Key, &BlockPointer)> = Vec::new();
    let mut lost = Vec::new();
    for row in rows {
        match &row.bp {
            None => {}
            Some(Ok(bp)) if bp.is_embedded() => {}
            Some(Ok(bp)) => work.push((row.key, bp)),
            Some(Err(e)) => {
                tracing::error!(pool = %p.pool.name, key = ?row.key, error = %e, "scan: undecodable block pointer");
                lost.push(row.key);
            }
        }
    }
    work.sort_unstable_by_key(|(_, bp)| (bp.dvas[0].group, bp.dvas[0].offset));
    let runs = runs(&work);
    let target_group = match rec.func {
        ScanFunction::Resilver => group_of(p, rec.target_guid),
        ScanFunction::Scrub => None,
    };
    let threads = VERIFY_THREADS.min(runs.len()).max(1);
    let chunk = runs.len().div_ceil(threads).max(1);
    let results: Vec<(u64, u64, Vec<Key>)> = std::thread::scope(|s| {
        let handles: Vec<_> = runs
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    let (mut ex, mut rep, mut lost) = (0, 0, Vec::new());
                    for run in part {
                        let (e, r, l) = verify_run(p, rec, target_group, run);
                        ex += e;
                        rep += r;
                        lost.extend(l);
                    }
                    (ex, rep, lost)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    tracing::error!("scan verify thread panicked");
                    (0, 0, Vec::new())
                })
            })
            .collect()
    });
    let (mut ex, mut rep) = (0, 0);
    for (e, r, l) in results {
        ex += e;
        rep += r;
        lost.extend(l);
    }
    lost.sort_unstable();
    (ex, rep, lost)
}

/// The scan thread.
fn run(weak: Weak<ImportedPool>) {
    let mut last_checkpoint = Instant::now();
    let mut pending_errors: Vec<Key> = Vec::new();
    loop {
        let Some(p) = weak.upgrade() else { return };
        let (request, mut rec) = {
            let c = p.scan.ctl.lock();
            match &c.record {
                Some(r) => (c.request, r.clone()),
                None => (Request::Stop, ScanRecord::new(ScanFunction::Scrub, 0, 0, 0)),
            }
        };
        if p.is_closed() || request != Request::Run {
            let end = match request {
                Request::Pause => Some(ScanState::Paused),
                Request::Cancel => Some(ScanState::Canceled),
                _ => None,
            };
            if let Some(state) = end.filter(|_| !p.is_closed()) {
                rec.state = state;
                if state == ScanState::Canceled {
                    rec.end = now_secs();
                }
                tracing::info!(pool = %p.pool.name, ?state, "scrub stopped");
            }
            finish(&p, rec, &pending_errors);
            return;
        }
        let meta_was_done = rec.meta_done;
        match step(&p, &mut rec, &mut pending_errors) {
            Ok(true) => {}
            Ok(false) => {
                // Done.
                if rec.func == ScanFunction::Resilver {
                    if let Err(e) = p.pool.finish_resilver(rec.target_guid) {
                        tracing::error!(pool = %p.pool.name, error = %e, "cannot finish resilver; it will run again");
                        rec.pos = None;
                        rec.meta_done = false;
                        set_record(&p, &rec);
                        if !wait(&p, Duration::from_secs(5)) {
                            finish(&p, rec, &pending_errors);
                            return;
                        }
                        continue;
                    }
                }
                rec.state = ScanState::Finished;
                rec.end = now_secs();
                rec.total = rec.examined;
                tracing::info!(pool = %p.pool.name, function = ?rec.func, examined = rec.examined, repaired = rec.repaired, errors = rec.errors, "scan finished");
                // Another device waiting to be rebuilt (several replaced at
                // once): its resilver starts from the beginning.
                if let Some(next) = next_resilver_target(&p) {
                    tracing::info!(pool = %p.pool.name, target = next, "resilvering the next device");
                    let next_rec =
                        ScanRecord::new(ScanFunction::Resilver, p.pool.allocated(), next, next);
                    if store(&p, &next_rec, false, &pending_errors).is_ok() {
                        pending_errors.clear();
                        let mut c = p.scan.ctl.lock();
                        c.record = Some(next_rec);
                        c.since = Some((Instant::now(), 0));
                        c.timing = Some((Instant::now(), true, None));
                        continue;
                    }
                }
                finish(&p, rec, &pending_errors);
                return;
            }
            Err(e) => {
                tracing::error!(pool = %p.pool.name, error = %e, "scan step failed; retrying");
                if !wait(&p, Duration::from_secs(5)) {
                    finish(&p, rec, &pending_errors);
                    return;
                }
                continue;
            }
        }
        set_record(&p, &rec);
        if last_checkpoint.elapsed().as_secs_f64() >= CHECKPOINT_SECS
            || meta_was_done != rec.meta_done
        {
            match store(&p, &rec, false, &pending_errors) {
                Ok(()) => pending_errors.clear(),
                Err(e) => {
                    tracing::warn!(pool = %p.pool.name, error = %e, "cannot persist scan position")
                }
            }
            last_checkpoint = Instant::now();
        }
        // Rate limit: sleep until the bytes examined fit the configured rate.
        let rate = p.config.scan_rate_bytes;
        if rate > 0 {
            let since = p.scan.ctl.lock().since;
            if let Some((t, base)) = since {
                let due = rec.examined.saturating_sub(base) as f64 / rate as f64;
                let ahead = due - t.elapsed().as_secs_f64();
                if ahead > 0.0 && !wait(&p, Duration::from_secs_f64(ahead.min(5.0))) {
                    continue; // woken by a request: handled at the top
                }
            }
        }
    }
}

/// Publishes the in-memory record (status reads it).
fn set_record(p: &ImportedPool, rec: &ScanRecord) {
    p.scan.ctl.lock().record = Some(rec.clone());
}

/// Waits up to `d` for a request; false if one came.
fn wait(p: &ImportedPool, d: Duration) -> bool {
    let mut c = p.scan.ctl.lock();
    if c.request == Request::Run {
        p.scan.changed.wait_for(&mut c, d);
    }
    c.request == Request::Run && !p.is_closed()
}

/// Persists the final record and marks the thread as not running.
fn finish(p: &ImportedPool, rec: ScanRecord, pending_errors: &[Key]) {
    if !p.is_closed() {
        if let Err(e) = store(p, &rec, false, pending_errors) {
            tracing::warn!(pool = %p.pool.name, error = %e, "cannot persist scan state");
        }
        announce(p, &rec, false);
    }
    let mut c = p.scan.ctl.lock();
    if rec.state == ScanState::Finished {
        if let Some((t, fresh, None)) = c.timing {
            c.timing = Some((t, fresh, Some(t.elapsed().as_secs_f64())));
        }
    }
    c.record = Some(rec);
    c.running = false;
    c.request = Request::Run;
    p.scan.changed.notify_all();
}

/// One batch: the metadata pass first, then rows after the position.
/// Ok(false) when the walk is complete.
fn step(p: &ImportedPool, rec: &mut ScanRecord, pending_errors: &mut Vec<Key>) -> Result<bool> {
    if rec.func == ScanFunction::Resilver && p.pool.device_by_guid(rec.target_guid).is_none() {
        return Err(Error::Io(format!(
            "device {} being resilvered is not present",
            rec.target_guid
        )));
    }
    if !rec.meta_done {
        let (examined, repaired, lost) = verify_metadata(p, rec)?;
        rec.examined += examined;
        rec.total += examined;
        rec.repaired += repaired;
        rec.errors += lost.len() as u64;
        rec.meta_done = true;
        let mut c = p.scan.ctl.lock();
        for page in lost {
            let k = (METADATA_ID, 0, page, 0);
            if c.errors.len() < MAX_LISTED_ERRORS && !c.errors.contains(&k) {
                c.errors.push(k);
                pending_errors.push(k);
            }
        }
        return Ok(true);
    }
    let (rows, examined, repaired, lost) = {
        let _hold = p.scan.hold();
        // Under a rate limit, batches of about 1/8 s of it: progress stays smooth.
        let max_bytes = match p.config.scan_rate_bytes {
            0 => BATCH_BYTES,
            rate => (rate / 8).clamp(128 << 10, BATCH_BYTES),
        };
        let rows = read_batch(p, rec.pos, max_bytes)?;
        let (ex, rep, lost) = verify_batch(p, rec, &rows);
        (rows, ex, rep, lost)
    };
    let Some(last) = rows.last() else {
        return Ok(false);
    };
    rec.pos = Some(last.key);
    rec.examined += examined;
    rec.repaired += repaired;
    rec.errors += lost.len() as u64;
    if !lost.is_empty() {
        let mut c = p.scan.ctl.lock();
        for k in lost {
            if c.errors.len() < MAX_LISTED_ERRORS && !c.errors.contains(&k) {
                c.errors.push(k);
                pending_errors.push(k);
            }
        }
    }
    Ok(true)
}

/// Dataset id under which unrecoverable metadata pages are listed.
pub(crate) const METADATA_ID: u64 = u64::MAX;

/// Resilver: the metadata and log regions are copied onto the target
/// first. Then (both) every metadata page on every device is verified and
/// bad copies are rewritten. Returns (bytes examined, bytes repaired, pages
/// lost).
fn verify_metadata(p: &ImportedPool, rec: &ScanRecord) -> Result<(u64, u64, Vec<u64>)> {
    let mut repaired = 0;
    if rec.func == ScanFunction::Resilver {
        repaired += p
            .pool
            .resilver_regions(rec.target_guid)
            .map_err(|e| Error::Io(format!("copying the metadata regions: {e}")))?;
    }
    // A device shorter than its label says, or gone, is taken out first
    // (FAULTED / REMOVED); then both labels of every device are checked and
    // rewritten where damaged or stale.
    p.check_devices();
    let (fixed, failed) = p.pool.check_labels();
    for path in &fixed {
        tracing::warn!(pool = %p.pool.name, device = %path.display(), "scan: damaged or stale label rewritten");
    }
    for (path, e) in &failed {
        tracing::error!(pool = %p.pool.name, device = %path.display(), error = %e, "scan: cannot rewrite a damaged label");
    }
    repaired += fixed.len() as u64 * 2 * pool::LABEL_SIZE;
    let report = meta::verify_all(&p.pool.meta_region()).map_err(meta_err)?;
    if !report.bad_devices.is_empty() {
        tracing::warn!(pool = %p.pool.name, bad_devices = ?report.bad_devices, repaired = report.repaired_bytes, "scan: metadata copies repaired");
    }
    Ok((
        report.examined_bytes,
        repaired + report.repaired_bytes,
        report.unrecoverable_pages,
    ))
}

/// A present device still marked as being rebuilt, if any.
fn next_resilver_target(p: &ImportedPool) -> Option<u64> {
    p.pool
        .groups()
        .iter()
        .flat_map(|g| g.children())
        .find(|c| {
            c.resilvering
                && c.device
                    .as_ref()
                    .is_some_and(|d| d.state() != pool::DeviceState::Offline)
        })
        .map(|c| c.guid)
}

#[cfg(test)]
mod tests {
    use crate::blockmap::{block_addr, block_of};
    use crate::*;
    use meta::redb::{ReadableDatabase, ReadableTable};
    use std::time::Duration;

    fn engine(dir: &Path) -> Arc<Engine> {
        let engine = Engine::open(&dir.join("state"), EngineConfig::default()).unwrap();
        engine
            .create_pool(PoolSpec {
                name: "tank".into(),
                groups: vec![GroupSpec {
                    kind: GroupKind::Mirror,
                    devices: vec![dir.join("d0"), dir.join("d1")],
                }],
                create_size: Some(128 << 20),
                force: false,
            })
            .unwrap();
        engine
            .create_volume("tank/v", 4 << 20, &[("compression".into(), "off".into())])
            .unwrap();
        engine
    }

    fn wait_done(engine: &Engine) -> ScanStatus {
        for _ in 0..600 {
            let scan = engine.pool_status("tank").unwrap().scan.unwrap();
            if scan.state != ScanState::Scanning {
                return scan;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("scrub did not finish");
    }

    #[test]
    fn scrub_skips_tombstones_and_heals_a_bad_copy() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let vol = engine.open_volume("tank/v").unwrap();
        let data: Vec<u8> = (0..4u32 << 20).map(|i| (i * 7 % 251) as u8).collect();
        vol.write(0, &data, false).unwrap();
        engine.sync_all().unwrap();
        let p = engine.inner.pools.read().get("tank").cloned().unwrap();
        // A tombstone row (snapshots): an empty value, to be skipped.
        {
            let _meta = p.meta_lock.lock();
            let tx = p.db().begin_write().unwrap();
            tx.open_table(meta::schema::BLOCK_MAP)
                .unwrap()
                .insert((1, &block_addr(1, 1 << 40)[..], 5), [].as_slice())
                .unwrap();
            tx.commit().unwrap();
        }
        // Damage the second copy of everything written.
        let dev = p.pool.devices()[1].clone();
        let at = p.pool.regions.data_offset;
        dev.write_at(at + 4096, &vec![0xAA; 1 << 20]).unwrap();
        engine.scrub_pool("tank", ScrubAction::Start).unwrap();
        let scan = wait_done(&engine);
        assert_eq!(scan.state, ScanState::Finished);
        assert_eq!(scan.errors, 0, "{scan:?}");
        assert!(scan.repaired >= 1 << 20, "{scan:?}");
        assert!(scan.examined >= 4 << 20, "{scan:?}");
        engine.scrub_pool("tank", ScrubAction::Start).unwrap();
        let scan = wait_done(&engine);
        assert_eq!((scan.repaired, scan.errors), (0, 0), "{scan:?}");
        // The persisted record says the same after a restart (without the
        // tombstone: import's space-map rebuild does not know them yet).
        {
            let _meta = p.meta_lock.lock();
            let tx = p.db().begin_write().unwrap();
            tx.open_table(meta::schema::BLOCK_MAP)
                .unwrap()
                .remove((1, &block_addr(1, 1 << 40)[..], 5))
                .unwrap();
            tx.commit().unwrap();
        }
        drop(vol);
        drop(p);
        engine.shutdown().unwrap();
        drop(engine);
        let engine = Engine::open(&dir.path().join("state"), EngineConfig::default()).unwrap();
        let scan = engine.pool_status("tank").unwrap().scan.unwrap();
        assert_eq!(scan.state, ScanState::Finished);
        assert_eq!((scan.repaired, scan.errors), (0, 0));
    }

    #[test]
    fn scan_resumes_after_its_persisted_position() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine(dir.path());
        let vol = engine.open_volume("tank/v").unwrap();
        vol.write(0, &vec![3u8; 4 << 20], false).unwrap();
        engine.sync_all().unwrap();
        let p = engine.inner.pools.read().get("tank").cloned().unwrap();
        // As if a scrub had been killed after verifying everything but the last block.
        let last = {
            let tx = p.db().begin_read().unwrap();
            let t = tx.open_table(meta::schema::BLOCK_MAP).unwrap();
            let mut it = t.iter().unwrap();
            let (k, _) = it.next_back().unwrap().unwrap();
            let (k2, _) = it.next_back().unwrap().unwrap();
            assert!(k2.value() < k.value());
            let (ds, addr, birth) = k2.value();
            let (obj, blk) = block_of(addr).unwrap();
            (ds, obj, blk, birth)
        };
        let mut rec = super::ScanRecord::new(ScanFunction::Scrub, 4 << 20, 0, 0);
        rec.meta_done = true;
        rec.pos = Some(last);
        rec.examined = 123;
        super::store(&p, &rec, true, &[]).unwrap();
        drop(vol);
        drop(p);
        engine.shutdown().unwrap();
        drop(engine);
        let engine = Engine::open(&dir.path().join("state"), EngineConfig::default()).unwrap();
        let scan = wait_done(&engine);
        assert_eq!(scan.state, ScanState::Finished);
        // One block (the default volblocksize) after the position, nothing before it.
        assert_eq!(
            scan.examined,
            123 + crate::props::DEFAULT_VOLBLOCKSIZE as u64,
            "{scan:?}"
        );
    }
}
