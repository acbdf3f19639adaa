//! An imported pool: the open transaction group that collects changes, and
//! the sync thread that commits it. This is where a txg commits
//! (`ImportedPool::sync_txg`): encode blocks -> place them in few large
//! writes -> sync devices -> one redb transaction with the new block
//! pointers, space figures and the intent-log checkpoint -> free what the
//! txg replaced -> trim the log.

use crate::blockmap::{self, block_addr, Chain, KeyType};
use crate::cache::BlockCache;
use crate::props::{DatasetRecord, Lineage};
use crate::snapshot::{Action, ActionOutcome, SpaceDelta, VersionChange};
use crate::{EngineConfig, Error, PoolStats, Result};
use block::{BlockPointer, ChecksumAlgo, Compression, EncodedBlock};
use intent_log::{Checkpoint, IntentLog, LogRecord, RecordKind};
use meta::redb::{Database, ReadableDatabase, ReadableTable};
use meta::schema::*;
use parking_lot::{Condvar, Mutex, RwLock};
use pool::{Dva, Pool};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Most one vectored write of a txg carries (adjacent blocks).
const RUN_MAX: usize = 8 << 20;
/// The same while sync writers wait for the intent log on the same
/// devices ([`ImportedPool::run_max`], decision 0081): 64 pages, a quarter
/// of a small device queue.
const SYNC_RUN_MAX: usize = 256 << 10;

/// See [`ImportedPool::view`].
pub struct View {
    pub syncing: Option<Arc<TxgChanges>>,
    pub(crate) blocks: meta::redb::ReadOnlyTable<KeyType, &'static [u8]>,
}

impl View {
    /// Data pointers of the committed blocks [first, last] of object `obj`
    /// as `chain` sees them (holes and tombstones left out).
    pub fn pointers(
        &self,
        chain: &Chain,
        obj: u64,
        first: u64,
        last: u64,
    ) -> Result<BTreeMap<u64, BlockPointer>> {
        blockmap::resolve_blocks(&self.blocks, chain, obj, first, last)
    }

    /// Blocks of object `obj` of `ds` in [first, last] with a committed
    /// version born in (after, upto].
    pub fn changed(
        &self,
        ds: u64,
        obj: u64,
        first: u64,
        last: u64,
        after: u64,
        upto: u64,
    ) -> Result<std::collections::BTreeSet<u64>> {
        blockmap::changed_blocks(&self.blocks, ds, obj, first, last, after, upto)
    }
}

/// Key of one block: (dataset, object, block index).
pub type BlockKey = (u64, u64, u64);
/// Key of one name: (dataset, directory object, name).
pub type NameKey = (u64, u64, String);

/// The changes a txg collects: blocks, and names (`None`: removed).
#[derive(Debug, Default)]
pub struct TxgChanges {
    pub blocks: HashMap<BlockKey, Dirty>,
    pub names: BTreeMap<NameKey, Option<u64>>,
    pub raw_names: BTreeMap<(u64, Vec<u8>), Option<Vec<u8>>>,
}

/// A changed block, not yet committed.
#[derive(Debug, Clone)]
pub enum Dirty {
    Data(Arc<Vec<u8>>),
    /// Part of a block, written without reading the rest: the byte ranges
    /// of `data` listed in `ranges` are new, everything else comes from the
    /// version below. Merged when a reader needs the whole block or when the
    /// txg commits, so a small write never waits for a read.
    Partial(Arc<PartialBlock>),
    /// Zeros that stay allocated (WRITE_ZEROES with NO_HOLE).
    Zero,
    /// Deallocated.
    Hole,
    /// A block received raw (`send -w`, decision 0044): stored bytes as
    /// they came (compressed, maybe sealed) and their pointer (no DVA;
    /// `birth` is the txg the block was sealed in on the sender). The
    /// commit places it as it is: no compression, no key, no copy.
    Raw(Arc<RawBlock>),
}

/// See [`Dirty::Raw`].
#[derive(Debug)]
pub struct RawBlock {
    pub bp: BlockPointer,
    pub stored: Arc<Vec<u8>>,
}

impl Dirty {
    /// The block's logical bytes of a raw block (readers only: a receive
    /// never opens them); `key` opens a sealed one.
    pub(crate) fn open_raw(
        raw: &RawBlock,
        key: Option<&block::MasterKey>,
        obj: u64,
        blk: u64,
    ) -> Result<Vec<u8>> {
        let (bp, stored) = (&raw.bp, raw.stored.as_slice());
        let unseal = block::Unseal {
            key,
            object: obj,
            block: blk,
        };
        match block::decode_verified_keyed(bp, stored, Some(unseal)) {
            Some(Ok(d)) => Ok(d),
            Some(Err(block::BlockError::KeyUnavailable)) => Err(Error::KeyUnavailable(format!(
                "object {obj} block {blk}: received raw, its key is not loaded"
            ))),
            Some(Err(e)) => Err(Error::Corrupt(format!("object {obj} block {blk}: {e}"))),
            None => Err(Error::Corrupt(format!(
                "object {obj} block {blk}: received raw block fails its checksum"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PartialBlock {
    /// The whole block: the new bytes in `ranges`, zeros everywhere else
    /// (so over a hole this is the merged block as it is, see
    /// [`PartialBlock::over_hole`]). Shared until changed (copy on write).
    pub data: Arc<Vec<u8>>,
    /// Sorted, disjoint, non-adjacent [start, end) byte ranges.
    pub ranges: Vec<(u32, u32)>,
}

impl PartialBlock {
    pub fn new(bs: u32) -> PartialBlock {
        PartialBlock {
            data: Arc::new(vec![0; bs as usize]),
            ranges: Vec::new(),
        }
    }

    /// Copies `bytes` (or zeros) to [lo, hi) and records the range.
    pub fn put(&mut self, lo: usize, hi: usize, bytes: Option<&[u8]>) {
        let data = Arc::make_mut(&mut self.data);
        match bytes {
            Some(b) => data[lo..hi].copy_from_slice(b),
            None => data[lo..hi].fill(0),
        }
        let (mut lo, mut hi) = (lo as u32, hi as u32);
        let mut kept = Vec::with_capacity(self.ranges.len() + 1);
        for &(a, b) in &self.ranges {
            if b < lo || a > hi {
                kept.push((a, b));
            } else {
                lo = lo.min(a);
                hi = hi.max(b);
            }
        }
        kept.push((lo, hi));
        kept.sort_unstable();
        self.ranges = kept;
    }

    pub fn is_complete(&self) -> bool {
        self.ranges == [(0, self.data.len() as u32)]
    }

    /// The whole block: `base` (None: zeros) with the new ranges on top.
    pub fn over(&self, base: Option<&[u8]>) -> Vec<u8> {
        match base {
            Some(b) => self.over_into(b.to_vec()),
            None => self.data.to_vec(),
        }
    }

    /// The merged block over `base`, or over a hole (`None`) without a copy.
    pub fn merged(&self, base: Option<&[u8]>) -> Arc<Vec<u8>> {
        match base {
            Some(b) => Arc::new(self.over(Some(b))),
            None => self.over_hole(),
        }
    }

    /// [`PartialBlock::over`] a hole, without a copy: the block's own bytes
    /// (zeros outside the new ranges).
    pub fn over_hole(&self) -> Arc<Vec<u8>> {
        self.data.clone()
    }

    /// [`PartialBlock::over`] an owned base: the new ranges are copied into
    /// it, nothing else is (the txg merging into the ARC's old buffer).
    pub fn over_into(&self, mut base: Vec<u8>) -> Vec<u8> {
        for &(a, b) in &self.ranges {
            let (a, b) = (a as usize, b as usize);
            base[a..b].copy_from_slice(&self.data[a..b]);
        }
        base
    }
}

/// Puts back a change of a commit that failed, under what was changed
/// since: a partial block written meanwhile lies over it (merged with the
/// committed version instead, it would lose the change it covers).
fn restore(dirty: &mut HashMap<BlockKey, Dirty>, k: BlockKey, older: &Dirty) {
    let merged = match dirty.get(&k) {
        None => older.clone(),
        Some(Dirty::Partial(p)) => match older {
            Dirty::Partial(o) => {
                let mut m = PartialBlock::clone(o);
                for &(a, b) in &p.ranges {
                    let (a, b) = (a as usize, b as usize);
                    m.put(a, b, Some(&p.data[a..b]));
                }
                Dirty::Partial(Arc::new(m))
            }
            Dirty::Data(d) => Dirty::Data(Arc::new(p.over(Some(d)))),
            Dirty::Zero | Dirty::Hole => Dirty::Data(Arc::new(p.over(None))),
            // A write over a block received raw whose commit failed: the
            // newer partial block stays; its base is read at the next commit.
            Dirty::Raw(_) => return,
        },
        Some(_) => return,
    };
    dirty.insert(k, merged);
}

pub struct OpenTxg {
    pub txg: u64,
    pub dirty: HashMap<BlockKey, Dirty>,
    /// Names changed in this txg (`None`: removed).
    pub names: BTreeMap<NameKey, Option<u64>>,
    /// Name rows received raw (`send -w`): (dataset, address as stored)
    /// -> value as stored (`None`: removed); sealed names need no key.
    pub raw_names: BTreeMap<(u64, Vec<u8>), Option<Vec<u8>>>,
    /// Next object id of each dataset that created objects (persisted in its record at commit).
    pub next_object: HashMap<u64, u64>,
    pub dirty_bytes: u64,
    /// Space admitted for the changes of this txg, by dataset (crate::space).
    pub charged: HashMap<u64, u64>,
    /// Every byte ever charged (never decreases): lets a writer see what
    /// others admitted since it measured its budget.
    pub charged_ever: u64,
}

#[derive(Default)]
struct SyncCtl {
    requested: u64,
    done: u64,
    /// The request generation of the last failed commit, and why.
    failed: Option<(u64, String)>,
    shutdown: bool,
}

#[derive(Default)]
pub struct Counters {
    pub txg_commits: AtomicU64,
    pub txg_commit_micros: AtomicU64,
    pub read_bytes: AtomicU64,
    pub write_bytes: AtomicU64,
}

pub struct ImportedPool {
    /// When this daemon imported (or created) the pool: `pool iostat`'s
    /// first report averages over the time since.
    pub imported_at: Instant,
    pub pool: Arc<Pool>,
    /// The metadata store; replaced when a suspended pool resumes (redb
    /// refuses every write after a failed one until it is reopened).
    db: RwLock<Arc<Database>>,
    pub log: Arc<IntentLog>,
    pub open: Mutex<OpenTxg>,
    /// The txg being committed; readers look here after the open txg.
    pub syncing: RwLock<Option<Arc<TxgChanges>>>,
    /// `OpenTxg::charged` of the txg being committed, until its blocks are
    /// placed and its space figures published.
    pub syncing_charged: Mutex<crate::space::SyncingCharges>,
    /// An ENOSPC/EDQUOT was logged and no write has succeeded since.
    pub nospace_logged: AtomicBool,
    /// The intent log's batch count when the last txg wrote its data: a
    /// txg that sees it moved writes in [`SYNC_RUN_MAX`] requests.
    log_commits_seen: AtomicU64,
    /// Dataset records by name: the committed ones plus space figures of the last txg.
    pub datasets: RwLock<BTreeMap<String, DatasetRecord>>,
    /// Serializes write transactions of the metadata store (txg commit, admin changes).
    pub meta_lock: Mutex<()>,
    ctl: Mutex<SyncCtl>,
    ctl_changed: Condvar,
    /// The ARC (crate::cache), under the memory monitor (crate::memory).
    pub cache: Arc<BlockCache>,
    /// Read-ahead of sequential readers into the ARC.
    pub(crate) prefetch: crate::prefetch::Prefetcher,
    pub config: EngineConfig,
    pub counters: Counters,
    sync_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// While the txg sync thread keeps off some CPUs (decision 0083): all
    /// the CPUs it may use, where its encoder threads go back to.
    encoder_cpus: Mutex<Option<vdev::irq::CpuSet>>,
    closed: AtomicBool,
    /// Scrub / resilver state (crate::scrub).
    pub scan: crate::scrub::ScanSlot,
    /// Suspension, pool properties, the fault manager (crate::health).
    pub health: crate::health::Health,
    pub(crate) health_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// When the object layer last wrote each dataset (`s3-quiet` snapshots).
    pub(crate) object_writes: crate::autosnap::WriteClock,
    /// Loaded encryption keys (crate::crypt), in memory only.
    pub(crate) keys: crate::crypt::KeyStore,
}

pub(crate) fn meta_err(e: impl std::fmt::Display) -> Error {
    Error::Io(format!(
        "metadata store: {}",
        crate::health::plain_meta_error(e)
    ))
}

/// Test hook for the crash tests: `CISTERN_FAULT_TXG_CRASH=after_data|after_meta`
/// aborts the process at that point of a txg commit that changes something;
/// `action_before_meta|action_after_meta` only in a commit carrying an
/// administrative action (snapshot, destroy, rollback, clone).
fn fault_point(name: &str) {
    if std::env::var("CISTERN_FAULT_TXG_CRASH").is_ok_and(|v| v == name) {
        tracing::error!(point = name, "fault injection: aborting during txg commit");
        std::process::abort();
    }
}

pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl ImportedPool {
    /// A new pool: an empty metadata store holding only the root dataset.
    pub fn create(pool: Arc<Pool>, config: EngineConfig) -> Result<Arc<ImportedPool>> {
        let db =
            meta::create(pool.meta_region(), config.meta_cache_bytes as usize).map_err(meta_err)?;
        let root = DatasetRecord {
            id: 0,
            name: pool.name.clone(),
            kind: crate::DatasetKind::Filesystem,
            volsize: 0,
            volblocksize: 0,
            local: BTreeMap::new(),
            created_txg: 0,
            creation: now_secs(),
            ..Default::default()
        };
        let tx = db.begin_write().map_err(meta_err)?;
        {
            let mut t = tx.open_table(DATASETS).map_err(meta_err)?;
            let json = serde_json::to_vec(&root).map_err(meta_err)?;
            t.insert(0, json.as_slice()).map_err(meta_err)?;
            let mut r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
            r.insert(RECORD_LOG_APPLIED_SEQ, 1).map_err(meta_err)?;
            r.insert(RECORD_LOG_REPLAY_POS, 0).map_err(meta_err)?;
            r.insert(RECORD_LOG_EXPECT_SEQ, 1).map_err(meta_err)?;
        }
        tx.commit().map_err(meta_err)?;
        drop(db);
        Self::open(pool, config, None)
    }

    /// Imports: opens the metadata store, rebuilds the space map from the
    /// live block pointers, replays the intent log and commits it in a txg.
    /// A store in an older format is refused, or converted first when
    /// `upgrade` is given (the steps taken are pushed to it).
    pub fn open(
        pool: Arc<Pool>,
        config: EngineConfig,
        upgrade: Option<&mut Vec<String>>,
    ) -> Result<Arc<ImportedPool>> {
        let db =
            meta::open(pool.meta_region(), config.meta_cache_bytes as usize).map_err(meta_err)?;
        let found = crate::upgrade::format_of(&db)?;
        if found < meta::META_FORMAT_VERSION {
            let Some(done) = upgrade else {
                return Err(crate::upgrade::needs_upgrade(&pool.name, found));
            };
            let steps = crate::upgrade::upgrade(&db)?;
            for s in &steps {
                tracing::info!(pool = %pool.name, "upgraded: {s}");
            }
            done.extend(steps);
        }
        {
            // Tables added after format 1 (DEADLIST, HISTORY, VDEV_PATHS, POOL_PROPS)
            // exist from the first import on.
            let tx = db.begin_write().map_err(meta_err)?;
            tx.open_table(DEAD_LIST).map_err(meta_err)?;
            tx.open_table(HISTORY).map_err(meta_err)?;
            tx.open_table(VDEV_PATHS).map_err(meta_err)?;
            tx.open_table(POOL_PROPS).map_err(meta_err)?;
            tx.commit().map_err(meta_err)?;
        }
        let props = crate::health::load_props(&db)?;
        let (txg, cp, datasets) = load_committed(&db, &pool)?;

        // The log asks for a txg when it fills up; it reaches the pool through a slot set below.
        let slot: Arc<std::sync::OnceLock<std::sync::Weak<ImportedPool>>> = Arc::default();
        let request = {
            let slot = slot.clone();
            Box::new(move || {
                if let Some(p) = slot.get().and_then(|w| w.upgrade()) {
                    p.request_sync();
                }
            })
        };
        let (region, cp) = log_region_for(&pool, cp)?;
        let (log, records) = IntentLog::open(
            region,
            pool.guid,
            cp,
            config.log_buffer_bytes as usize,
            request,
        );
        let imported = Arc::new(ImportedPool {
            imported_at: Instant::now(),
            cache: {
                let (min, max) =
                    crate::memory::arc_bounds(config.cache_min_bytes, config.block_cache_bytes);
                let c = Arc::new(BlockCache::new(min, max));
                crate::memory::register(&c);
                c
            },
            prefetch: crate::prefetch::Prefetcher::new(config.prefetch_max_bytes),
            pool,
            db: RwLock::new(Arc::new(db)),
            log,
            open: Mutex::new(OpenTxg {
                // Not `txg + 1`: the run before may have had txg + 1 being
                // committed and txg + 2 open when it died, and objects
                // created in them got those numbers as their generation; a
                // crash lost them (and their ids come back), so their
                // numbers are never used again: (object id, generation)
                // names one file for ever (NFS handles, SMB file ids). The
                // import commits this txg even if empty, so the next run
                // starts past every number this one hands out.
                txg: txg + 3,
                dirty: HashMap::new(),
                names: BTreeMap::new(),
                raw_names: BTreeMap::new(),
                next_object: HashMap::new(),
                dirty_bytes: 0,
                charged: HashMap::new(),
                charged_ever: 0,
            }),
            syncing: RwLock::new(None),
            syncing_charged: Mutex::default(),
            nospace_logged: AtomicBool::new(false),
            log_commits_seen: AtomicU64::new(0),
            datasets: RwLock::new(datasets),
            meta_lock: Mutex::new(()),
            ctl: Mutex::new(SyncCtl::default()),
            ctl_changed: Condvar::new(),
            config,
            counters: Counters::default(),
            sync_thread: Mutex::new(None),
            encoder_cpus: Mutex::new(None),
            closed: AtomicBool::new(false),
            scan: Default::default(),
            health: crate::health::Health::new(props),
            health_thread: Mutex::new(None),
            object_writes: Default::default(),
            keys: Default::default(),
        });
        let _ = slot.set(Arc::downgrade(&imported));
        // Keys in files load first, so their datasets' log records replay.
        imported.load_file_keys();
        let _ = imported.prefetch.pool.set(Arc::downgrade(&imported));
        crate::cache_devices::open_recorded(&imported);
        let replayed = records.len();
        // Records of encrypted datasets whose key is not loaded cannot be
        // opened: they move, still sealed, to the metadata store and replay
        // at load-key (decision 0026).
        let mut stash = Vec::new();
        for rec in records {
            if imported.log_needs_key(rec.dataset) {
                stash.push(rec);
            } else {
                imported.replay(rec)?;
            }
        }
        crate::crypt::stash_records(&imported, &stash)?;
        let drained = crate::objects::drain_unlinked(&imported)?;
        // A receive killed mid-stream: back to the target's old self (decision 0033).
        crate::send::recover_receives(&imported);
        if drained > 0 {
            tracing::info!(pool = %imported.pool.name, objects = drained, "unlinked objects left by the last run removed");
        }
        imported.commit_txg_locked(None, true, &imported.meta_lock.lock())?;
        // Records kept at an earlier import for keys loaded from files now.
        crate::crypt::replay_loaded_stash(&imported)?;
        if replayed > 0 {
            tracing::info!(pool = %imported.pool.name, replayed, "intent log records committed");
        }
        let weak = Arc::downgrade(&imported);
        let handle = std::thread::Builder::new()
            .name(format!("txg-sync-{}", imported.pool.name))
            .spawn(move || sync_loop(weak))
            .map_err(|e| Error::Io(format!("cannot start txg sync thread: {e}")))?;
        *imported.sync_thread.lock() = Some(handle);
        imported.start_health_thread()?;
        Ok(imported)
    }

    /// The metadata store (a handle: it is replaced when a suspended pool resumes).
    pub fn db(&self) -> Arc<Database> {
        self.db.read().clone()
    }

    /// Reopens the metadata store from the devices and reloads the dataset
    /// records and the space map from it (a suspended pool being resumed).
    /// The caller holds `meta_lock`; no txg is being committed.
    pub(crate) fn reopen_meta_locked(&self) -> Result<()> {
        // A store that still commits failed nowhere: the txg failed before
        // its metadata transaction, and nothing needs reloading.
        let probe = self.db().begin_write().map_err(meta_err);
        if probe.and_then(|tx| tx.commit().map_err(meta_err)).is_ok() {
            return Ok(());
        }
        // The failed handle (redb refuses it every write now) is dropped
        // first; readers wait on the lock meanwhile.
        let mut slot = self.db.write();
        let old = std::mem::replace(
            &mut *slot,
            Arc::new(
                meta::redb::Builder::new()
                    .create_with_backend(meta::redb::backends::InMemoryBackend::new())
                    .map_err(meta_err)?,
            ),
        );
        drop(old);
        let db = meta::open(
            self.pool.meta_region(),
            self.config.meta_cache_bytes as usize,
        )
        .map_err(meta_err)?;
        let (_, _, datasets) = load_committed(&db, &self.pool)?;
        *slot = Arc::new(db);
        drop(slot);
        *self.datasets.write() = datasets;
        Ok(())
    }

    pub(crate) fn replay(&self, mut rec: LogRecord) -> Result<()> {
        if matches!(rec.kind, RecordKind::ObjectOp | RecordKind::Write)
            && self.datasets.read().values().any(|d| d.id == rec.dataset)
        {
            // Sealed when logged if the dataset is encrypted (decision 0026).
            if let Some(plain) =
                self.open_log(rec.dataset, rec.kind as u8, rec.offset, &rec.payload)?
            {
                rec.payload = plain;
            }
        }
        if rec.kind == RecordKind::ObjectOp {
            return crate::objects::replay(self, rec.dataset, &rec.payload);
        }
        let Some((id, bs)) = self
            .datasets
            .read()
            .values()
            .find(|d| d.id == rec.dataset)
            .map(|d| (d.id, d.volblocksize))
        else {
            tracing::warn!(
                dataset = rec.dataset,
                "log record for a dataset that no longer exists; skipped"
            );
            return Ok(());
        };
        let op = match rec.kind {
            RecordKind::Write => crate::volume::Op::Write(&rec.payload),
            RecordKind::Trim => crate::volume::Op::Zero {
                len: rec.length,
                allocate: false,
            },
            RecordKind::ZeroAllocated => crate::volume::Op::Zero {
                len: rec.length,
                allocate: true,
            },
            RecordKind::Jump | RecordKind::ObjectOp => return Ok(()),
        };
        crate::volume::replay_volume(self, id, bs, rec.offset, op)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Asks the sync thread for a txg commit without waiting.
    pub fn request_sync(&self) {
        let mut c = self.ctl.lock();
        c.requested += 1;
        self.ctl_changed.notify_all();
    }

    /// Commits the open txg (and waits for it).
    pub fn sync_now(&self) -> Result<()> {
        if self.sync_thread.lock().is_none() {
            return self.sync_txg();
        }
        let mut c = self.ctl.lock();
        c.requested += 1;
        let want = c.requested;
        self.ctl_changed.notify_all();
        while c.done < want && !c.shutdown {
            if let (Some(s), crate::health::FailMode::Continue) =
                (self.health.suspension(), self.health.failmode())
            {
                return Err(Error::Io(format!(
                    "pool '{}' is suspended: {}",
                    self.pool.name, s.cause
                )));
            }
            self.ctl_changed
                .wait_for(&mut c, Duration::from_millis(200));
        }
        match &c.failed {
            Some((generation, why)) if *generation >= want => {
                Err(Error::Io(format!("txg commit failed: {why}")))
            }
            _ => Ok(()),
        }
    }

    /// Writers call this first: past dirty_max they wait for a txg commit.
    pub fn throttle(&self) {
        for _ in 0..100 {
            let dirty = self.open.lock().dirty_bytes;
            if dirty < self.config.dirty_max_bytes {
                if dirty > self.config.dirty_max_bytes / 2 {
                    self.request_sync();
                }
                return;
            }
            let _ = self.sync_now();
        }
    }

    /// Compression and checksum in force for each dataset.
    fn pipeline_settings(&self) -> HashMap<u64, (Compression, ChecksumAlgo)> {
        let datasets = self.datasets.read();
        datasets
            .values()
            .map(|rec| {
                let lineage = lineage(&datasets, rec);
                (rec.id, (lineage.compression(), lineage.checksum()))
            })
            .collect()
    }

    /// Moves the intent log to `region` (a SLOG being added, or the main
    /// devices' region before a log device is removed) and commits a txg
    /// whose checkpoint names it: from then on replay reads only `region`,
    /// and nothing in the old one is needed (decision 0030).
    pub fn move_log(&self, region: pool::MirroredRegion) -> Result<()> {
        let tag = region.log_tag();
        let meta = self.meta_lock.lock();
        self.log.switch_region(region);
        self.commit_txg_locked(None, true, &meta)?;
        if self.log.switch_pending() || self.log.region_tag() != tag {
            return Err(Error::Io(
                "the intent log did not move: the txg that moves it was not committed".into(),
            ));
        }
        Ok(())
    }

    /// Commits the open txg. See the module documentation for the steps.
    pub fn sync_txg(&self) -> Result<()> {
        self.commit_txg(None).map(|_| ())
    }

    /// Commits the open txg with `action` in the same metadata transaction
    /// (a txg is committed even when nothing is dirty). Changes of the
    /// dataset the action discards (rollback) are dropped from the txg.
    pub(crate) fn commit_txg(&self, action: Option<Action>) -> Result<ActionOutcome> {
        if let Some(s) = self.health.suspension() {
            return Err(Error::Io(format!(
                "pool '{}' is suspended ({}): run `cistern pool clear {}` once the cause is gone",
                self.pool.name, s.cause, self.pool.name
            )));
        }
        self.commit_txg_locked(action, false, &self.meta_lock.lock())
    }

    /// The commit `pool clear` retries a suspended pool with.
    pub(crate) fn commit_txg_resuming(&self) -> Result<()> {
        self.commit_txg_locked(None, false, &self.meta_lock.lock())
            .map(|_| ())
    }

    /// `force`: commit even if nothing changed (the txg number moves on).
    fn commit_txg_locked(
        &self,
        action: Option<Action>,
        force: bool,
        _meta: &parking_lot::MutexGuard<'_, ()>,
    ) -> Result<ActionOutcome> {
        // Another daemon owns the pool now: nothing more is written (logged once at the fence).
        self.pool
            .check_owner()
            .map_err(|e| Error::Io(e.to_string()))?;
        let started = Instant::now();
        let (txg, dirty, cp, next_objects, discarded) = {
            let mut open = self.open.lock();
            if !force
                && open.dirty.is_empty()
                && open.names.is_empty()
                && open.raw_names.is_empty()
                && action.is_none()
            {
                return Ok(ActionOutcome::default());
            }
            // Kept aside, not dropped: the action can still be refused
            // inside the commit (a later snapshot with a clone or a hold),
            // and then these acknowledged changes go back like the rest.
            let discarded = action.as_ref().and_then(Action::discards).map(|ds| {
                let (blocks, kept): (HashMap<_, _>, HashMap<_, _>) =
                    std::mem::take(&mut open.dirty)
                        .into_iter()
                        .partition(|(k, _)| k.0 == ds);
                open.dirty = kept;
                let (names, kept): (BTreeMap<_, _>, BTreeMap<_, _>) =
                    std::mem::take(&mut open.names)
                        .into_iter()
                        .partition(|(k, _)| k.0 == ds);
                open.names = kept;
                (blocks, names, (ds, open.charged.remove(&ds).unwrap_or(0)))
            });
            let cp = self.log.checkpoint();
            let txg = open.txg;
            open.txg += 1;
            open.dirty_bytes = 0;
            let dirty = Arc::new(TxgChanges {
                blocks: std::mem::take(&mut open.dirty),
                names: std::mem::take(&mut open.names),
                raw_names: std::mem::take(&mut open.raw_names),
            });
            let next_objects = open.next_object.clone();
            *self.syncing_charged.lock() = crate::space::SyncingCharges {
                by_ds: std::mem::take(&mut open.charged),
                placed: false,
            };
            // Published before the open lock is released: a reader that misses a
            // block in the open txg must find it here, never fall through to
            // the older committed version.
            *self.syncing.write() = Some(dirty.clone());
            (txg, dirty, cp, next_objects, discarded)
        };
        match self.write_txg(txg, &dirty, cp, &next_objects, action) {
            Ok(outcome) => {
                *self.syncing.write() = None;
                self.log.applied(cp);
                self.counters.txg_commits.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .txg_commit_micros
                    .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                tracing::debug!(pool = %self.pool.name, txg, blocks = dirty.blocks.len(), names = dirty.names.len(), ms = started.elapsed().as_millis() as u64, "txg committed");
                Ok(outcome)
            }
            Err(e) => {
                // Keep the changes: put them back under newer ones and retry later.
                let mut open = self.open.lock();
                for (k, v) in dirty.blocks.iter() {
                    restore(&mut open.dirty, *k, v);
                }
                for (k, v) in dirty.names.iter() {
                    open.names.entry(k.clone()).or_insert(*v);
                }
                for (k, v) in dirty.raw_names.iter() {
                    open.raw_names.entry(k.clone()).or_insert(v.clone());
                }
                for (ds, n) in std::mem::take(&mut *self.syncing_charged.lock()).by_ds {
                    *open.charged.entry(ds).or_default() += n;
                }
                if let Some((blocks, names, (ds, charged))) = discarded {
                    for (k, v) in blocks {
                        restore(&mut open.dirty, k, &v);
                    }
                    for (k, v) in names {
                        open.names.entry(k).or_insert(v);
                    }
                    *open.charged.entry(ds).or_default() += charged;
                }
                *self.syncing.write() = None;
                drop(open);
                self.log_commit_failure(txg, &e);
                // An I/O error means the devices cannot take the txg:
                // suspend. Out of pool space is refused to writers up front,
                // and an action refused inside its commit (a held snapshot)
                // says nothing about the devices.
                if matches!(e, Error::Io(_)) {
                    self.suspend(&e.to_string());
                }
                Err(e)
            }
        }
    }

    /// `encode_one` of a block of an encrypted dataset: the same choices,
    /// sealed with `key` and bound to (object, block, birth).
    #[allow(clippy::too_many_arguments)]
    fn encode_sealed(
        &self,
        k: &BlockKey,
        txg: u64,
        key: &block::MasterKey,
        comp: Compression,
        sum: ChecksumAlgo,
        dirty: &Dirty,
        merged: Option<&Arc<Vec<u8>>>,
    ) -> Option<EncodedBlock> {
        let seal = block::Seal {
            key,
            object: k.1,
            block: k.2,
            birth: txg,
        };
        if k.2 == crate::objects::ATTR_BLOCK {
            return match dirty {
                Dirty::Data(d) => Some(block::encode_sealed(d, Compression::Off, sum, seal)),
                _ => None,
            };
        }
        let data = match dirty {
            Dirty::Data(d) => d.clone(),
            Dirty::Partial(_) => merged?.clone(),
            Dirty::Zero => {
                let bs = self.block_size_of(k.0)?;
                let zeros = vec![0u8; bs as usize];
                return Some(block::encode_sealed(&zeros, comp.max_lz4(), sum, seal));
            }
            Dirty::Hole | Dirty::Raw(_) => return None,
        };
        if k.1 == crate::objects::VOLUME_OBJECT {
            return Some(block::encode_sealed(&data, comp, sum, seal));
        }
        match crate::objects::trimmed_len(&data) {
            0 => None,
            n => Some(block::encode_sealed(&data[..n], comp, sum, seal)),
        }
    }

    fn write_txg(
        &self,
        txg: u64,
        changes: &TxgChanges,
        cp: Checkpoint,
        next_objects: &HashMap<u64, u64>,
        action: Option<Action>,
    ) -> Result<ActionOutcome> {
        let dirty = &changes.blocks;
        let settings = self.pipeline_settings();
        let mut keys: Vec<BlockKey> = dirty.keys().copied().collect();
        keys.sort_unstable();
        // Encrypted datasets' blocks are sealed with their root's key (decision 0026).
        let crypt_keys = crate::crypt::commit_keys(self);
        if let Some(k) = keys.iter().find(|k| {
            // Raw blocks and holes need no key (a raw receive writes both).
            matches!(crypt_keys.get(&k.0), Some(None))
                && !matches!(dirty[k], Dirty::Raw(_) | Dirty::Hole)
        }) {
            // Writes are refused before a key goes (unload_key commits first).
            tracing::error!(
                dataset = k.0,
                "dirty blocks of an encrypted dataset whose key is gone"
            );
            return Err(Error::KeyUnavailable(format!(
                "dataset {}: dirty blocks and no key to seal them",
                k.0
            )));
        }
        let merged = self.merge_partials(dirty)?;

        // Compress, (encrypt,) checksum, in parallel.
        let encode_one = |k: &BlockKey| -> Option<EncodedBlock> {
            if let Dirty::Raw(raw) = &dirty[k] {
                // As received: the bytes were verified against this checksum.
                let bp = &raw.bp;
                return Some(EncodedBlock {
                    payload: raw.stored.clone(),
                    lsize: bp.lsize,
                    compression: bp.compression,
                    checksum_algo: bp.checksum_algo,
                    checksum: bp.checksum,
                    crypt: bp.crypt,
                });
            }
            let (comp, sum) = settings
                .get(&k.0)
                .copied()
                .unwrap_or((Compression::Off, ChecksumAlgo::Blake3));
            if let Some(Some(key)) = crypt_keys.get(&k.0) {
                return self.encode_sealed(k, txg, key, comp, sum, &dirty[k], merged.get(k));
            }
            if k.2 == crate::objects::ATTR_BLOCK {
                // Attributes: always embedded, stored as they are.
                return match &dirty[k] {
                    Dirty::Data(d) => Some(block::encode_shared(d, Compression::Off, sum)),
                    _ => None,
                };
            }
            let data = match &dirty[k] {
                Dirty::Data(d) => d.clone(),
                Dirty::Partial(_) => merged.get(k)?.clone(),
                Dirty::Zero => {
                    let bs = self.block_size_of(k.0)?;
                    return Some(block::encode(&vec![0u8; bs as usize], comp.max_lz4(), sum));
                }
                // Raw blocks were taken as they are above.
                Dirty::Hole | Dirty::Raw(_) => return None,
            };
            if k.1 == crate::objects::VOLUME_OBJECT {
                return Some(block::encode_shared(&data, comp, sum));
            }
            // An object's block is stored only as long as its data: the
            // tail of a file or a small object takes what it holds, not recordsize.
            match crate::objects::trimmed_len(&data) {
                0 => None,
                n if n == data.len() => Some(block::encode_shared(&data, comp, sum)),
                n => Some(block::encode(&data[..n], comp, sum)),
            }
        };
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .clamp(1, 8);
        let chunk = keys.len().div_ceil(threads).max(1);
        // Encoders inherit the sync thread's CPUs; they spread over all of them.
        let spread = self.encoder_cpus.lock().clone();
        let spread = &spread;
        let encoded: Vec<Option<EncodedBlock>> = std::thread::scope(|s| {
            let handles: Vec<_> = keys
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        if let Some(cpus) = spread {
                            let _ = vdev::irq::set_thread_cpus(cpus);
                        }
                        part.iter().map(encode_one).collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap_or_default())
                .collect()
        });
        assert_eq!(encoded.len(), keys.len(), "an encoder thread panicked");

        // Place: allocate in key order so a volume's neighbours stay
        // neighbours. Attributes and tiny object blocks stay in their row
        // (tiny blocks only while the metadata region is under half full).
        let embed_max = match meta::usage(&self.pool.meta_region()) {
            Some((used, capacity)) if used < capacity / 2 => {
                (self.config.embed_max_bytes as usize).min(crate::objects::EMBED_LIMIT)
            }
            _ => 0,
        };
        let mut placed: Vec<Option<BlockPointer>> = Vec::with_capacity(keys.len());
        {
            let mut alloc = self.pool.allocator();
            for (k, e) in keys.iter().zip(&encoded) {
                let embed = |e: &EncodedBlock| {
                    k.2 == crate::objects::ATTR_BLOCK
                        || (k.1 != crate::objects::VOLUME_OBJECT && e.psize() as usize <= embed_max)
                };
                // A sealed block received raw keeps the txg its seal names.
                let birth = match &dirty[k] {
                    Dirty::Raw(raw) if raw.bp.crypt.is_some() => raw.bp.birth,
                    _ => txg,
                };
                placed.push(match e {
                    Some(e) if embed(e) => Some(e.embedded(birth)),
                    Some(e) => match alloc.allocate(e.psize() as u64) {
                        Some(dva) => Some(e.pointer(dva, birth)),
                        None => {
                            for d in placed.iter().flatten().flat_map(|bp| &bp.dvas) {
                                alloc.free(*d);
                            }
                            return Err(Error::NoSpace(format!(
                                "out of space in pool {}",
                                self.pool.name
                            )));
                        }
                    },
                    None => None,
                });
            }
        }
        // Allocated now: the space budget stops counting these charges as unplaced.
        self.syncing_charged.lock().placed = true;
        let new_dvas: Vec<Dva> = placed
            .iter()
            .flatten()
            .flat_map(|bp| bp.dvas.clone())
            .collect();
        let result = self.write_placed(
            txg,
            &keys,
            changes,
            &encoded,
            &placed,
            cp,
            next_objects,
            action,
        );
        if result.is_ok() {
            // Just-written blocks are the likeliest to be read (or partly
            // rewritten) next: keep them in the cache under their new version.
            for (i, k) in keys.iter().enumerate() {
                let data = match &dirty[k] {
                    Dirty::Data(d) => Some(d),
                    Dirty::Partial(_) => merged.get(k),
                    _ => None,
                };
                if let (Some(bp), Some(d)) = (&placed[i], data) {
                    if bp.crypt.is_some() {
                        // Plaintext of an encrypted dataset: never to a cache device.
                        self.cache.keep_in_memory(k.0);
                    }
                    if !bp.is_embedded() {
                        self.cache
                            .insert(crate::volume::arc_key(k.0, k.1, k.2, bp), d.clone());
                    }
                }
            }
        }
        if result.is_err() {
            let mut alloc = self.pool.allocator();
            for dva in new_dvas {
                alloc.free(dva);
            }
        }
        result
    }

    /// How much one vectored write of a txg may carry. Sync writers (FLUSH,
    /// fsync, S3 PUT) wait for the intent log, and a log write queues behind
    /// whatever the txg has queued on the same devices: one 8 MiB write is
    /// split into requests of up to 254 segments, and a virtio disk without
    /// indirect descriptors (256 slots) then has no room for the log's
    /// 4 KiB until they complete (decision 0081). So while the log is in use
    /// on the main devices, the txg writes [`SYNC_RUN_MAX`] at a time, as
    /// ZFS aggregates at most 128 KiB on SSDs; with a SLOG, or with no sync
    /// writer since the last txg, large writes cost nobody a wait.
    fn run_max(&self, cp: Checkpoint) -> usize {
        if self.log_wrote_since(&self.log_commits_seen) && cp.tag == 0 {
            SYNC_RUN_MAX
        } else {
            RUN_MAX
        }
    }

    /// Whether the intent log wrote a batch since `seen` was last updated here.
    fn log_wrote_since(&self, seen: &AtomicU64) -> bool {
        let commits = self.log.stats().commits.load(Ordering::Relaxed);
        seen.swap(commits, Ordering::Relaxed) != commits
    }

    #[allow(clippy::too_many_arguments)]
    fn write_placed(
        &self,
        txg: u64,
        keys: &[BlockKey],
        changes: &TxgChanges,
        encoded: &[Option<EncodedBlock>],
        placed: &[Option<BlockPointer>],
        cp: Checkpoint,
        next_objects: &HashMap<u64, u64>,
        action: Option<Action>,
    ) -> Result<ActionOutcome> {
        // The fault hooks skip empty commits (the one every import makes).
        let carries = !changes.blocks.is_empty() || !changes.names.is_empty() || action.is_some();
        // Write: blocks adjacent on disk go out together, up to `run_max`
        // per vectored write.
        static PAD: [u8; pool::SECTOR as usize] = [0; pool::SECTOR as usize];
        let run_max = self.run_max(cp);
        let mut order: Vec<usize> = (0..keys.len())
            .filter(|&i| placed[i].as_ref().is_some_and(|bp| !bp.is_embedded()))
            .collect();
        order.sort_unstable_by_key(|&i| {
            placed[i]
                .as_ref()
                .map(|bp| (bp.dvas[0].group, bp.dvas[0].offset))
        });
        let mut run: Option<Dva> = None;
        let mut parts: Vec<&[u8]> = Vec::new();
        let flush = |run: &mut Option<Dva>, parts: &mut Vec<&[u8]>| -> Result<()> {
            if let Some(dva) = run.take() {
                self.pool
                    .write_vectored(dva, parts)
                    .map_err(|e| Error::Io(e.to_string()))?;
                self.counters
                    .write_bytes
                    .fetch_add(dva.asize as u64, Ordering::Relaxed);
            }
            parts.clear();
            Ok(())
        };
        for &i in &order {
            let (Some(bp), Some(enc)) = (&placed[i], &encoded[i]) else {
                continue;
            };
            let dva = bp.dvas[0];
            let extends = run.is_some_and(|r| {
                r.group == dva.group
                    && r.offset + r.asize as u64 == dva.offset
                    && r.asize as usize + dva.asize as usize <= run_max
            });
            if !extends {
                flush(&mut run, &mut parts)?;
                run = Some(Dva { asize: 0, ..dva });
            }
            if let Some(r) = run.as_mut() {
                parts.push(&enc.payload);
                // A raidz allocation is whole rows: up to 31 sectors of padding.
                let mut pad = dva.asize as usize - enc.payload.len();
                while pad > 0 {
                    let n = pad.min(PAD.len());
                    parts.push(&PAD[..n]);
                    pad -= n;
                }
                r.asize += dva.asize;
            }
        }
        flush(&mut run, &mut parts)?;
        self.pool.sync_all().map_err(|e| Error::Io(e.to_string()))?;
        if carries {
            fault_point("after_data");
        }

        // Metadata: one transaction for every pointer, space figure, the
        // log checkpoint and the administrative action riding on this txg.
        // No admin change can interleave: those take meta_lock too, which
        // this commit holds.
        let mut recs: BTreeMap<u64, DatasetRecord> = self
            .datasets
            .read()
            .values()
            .map(|r| (r.id, r.clone()))
            .collect();
        let before = recs.clone();
        // Newest snapshot of each dataset: versions born after it are freed when replaced.
        let mut latest_snapshot: HashMap<u64, u64> = HashMap::new();
        for r in recs.values().filter(|r| r.is_snapshot()) {
            let e = latest_snapshot.entry(r.data_id()).or_default();
            *e = (*e).max(r.created_txg);
        }
        let latest_bookmark: HashMap<u64, u64> = recs
            .values()
            .filter_map(|r| Some((r.id, r.bookmarks.values().map(|b| b.txg).max()?)))
            .collect();
        let origins: HashMap<u64, Chain> = recs
            .values()
            .filter(|r| r.origin.is_some())
            .map(|r| (r.id, Chain::of(r, before.values()).below()))
            .collect();
        let mut freed: Vec<Dva> = Vec::new();
        let mut orphaned: Vec<Dva> = Vec::new();
        let mut space: HashMap<u64, SpaceDelta> = HashMap::new();
        let mut outcome = ActionOutcome::default();
        let mut has_action = false;
        // Name rows as stored: sealed for encrypted datasets (decision 0035).
        let mut name_rows = crate::namerow::commit_rows(self, &changes.names)?;
        name_rows.extend(
            changes
                .raw_names
                .iter()
                .map(|((ds, addr), v)| (*ds, addr.clone(), v.clone())),
        );
        let tx = self.db().begin_write().map_err(meta_err)?;
        {
            let mut blocks = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
            let mut dead = tx.open_table(DEAD_LIST).map_err(meta_err)?;
            let mut change = |ds: u64, addr: &[u8], new: Option<Vec<u8>>| -> Result<()> {
                VersionChange {
                    ds,
                    addr,
                    txg,
                    latest_snapshot: latest_snapshot.get(&ds).copied().unwrap_or(0),
                    latest_bookmark: latest_bookmark.get(&ds).copied().unwrap_or(0),
                    origin: origins.get(&ds),
                    new,
                }
                .apply(
                    &mut blocks,
                    &mut dead,
                    space.entry(ds).or_default(),
                    &mut freed,
                )
            };
            for (i, &(ds, obj, blk)) in keys.iter().enumerate() {
                if !recs.contains_key(&ds) {
                    orphaned.extend(placed[i].iter().flat_map(|bp| bp.dvas.clone()));
                    continue;
                }
                change(
                    ds,
                    &block_addr(obj, blk),
                    placed[i].as_ref().map(|bp| bp.encode()),
                )?;
            }
            for (ds, addr, value) in name_rows {
                if recs.contains_key(&ds) {
                    change(ds, &addr, value)?;
                }
            }
        }
        for (ds, next) in next_objects {
            if let Some(rec) = recs.get_mut(ds) {
                rec.next_object = rec.next_object.max(*next);
            }
        }
        {
            for (id, d) in &space {
                if let Some(rec) = recs.get_mut(id) {
                    d.apply_to(rec);
                }
            }
            if let Some(action) = action {
                outcome = self.run_action(action, txg, &tx, &mut recs, &mut freed)?;
                fault_point("action_before_meta");
                has_action = true;
            }
            let mut table = tx.open_table(DATASETS).map_err(meta_err)?;
            for (id, rec) in &recs {
                if before.get(id) != Some(rec) {
                    let json = serde_json::to_vec(rec).map_err(meta_err)?;
                    table.insert(*id, json.as_slice()).map_err(meta_err)?;
                }
            }
            for id in before.keys().filter(|id| !recs.contains_key(id)) {
                table.remove(*id).map_err(meta_err)?;
            }
            let mut r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
            r.insert(RECORD_TXG, txg).map_err(meta_err)?;
            r.insert(RECORD_LOG_APPLIED_SEQ, cp.applied_seq)
                .map_err(meta_err)?;
            r.insert(RECORD_LOG_REPLAY_POS, cp.replay_pos)
                .map_err(meta_err)?;
            r.insert(RECORD_LOG_EXPECT_SEQ, cp.expect_seq)
                .map_err(meta_err)?;
            // Written only once a SLOG was ever used: older stores stay as they were.
            if cp.tag != 0 || r.get(RECORD_LOG_TAG).map_err(meta_err)?.is_some() {
                r.insert(RECORD_LOG_TAG, cp.tag).map_err(meta_err)?;
            }
        }
        tx.commit().map_err(meta_err)?;
        if carries {
            fault_point("after_meta");
        }
        if has_action {
            fault_point("action_after_meta");
        }

        // Only now may replaced space be reused: a crash before the commit
        // brings back the previous txg, which still points there.
        {
            let _scan = self.scan.free_gate();
            // Still allocated, so nothing writes there meanwhile.
            self.pool.discard(freed.iter().chain(&orphaned));
            let mut alloc = self.pool.allocator();
            for dva in freed.iter().chain(&orphaned) {
                if !alloc.free(*dva) {
                    tracing::error!(?dva, "freed a block that was not allocated");
                }
            }
        }
        let mut datasets = self.datasets.write();
        // The space figures now hold what was charged (cleared under the
        // datasets lock, so no budget sees both or neither).
        *self.syncing_charged.lock() = Default::default();
        // Renamed records (promote) leave their old name behind.
        datasets.retain(|name, r| recs.get(&r.id).is_some_and(|n| n.name == *name));
        for rec in recs.into_values() {
            datasets.insert(rec.name.clone(), rec);
        }
        Ok(outcome)
    }

    /// The chain a dataset's head reads through (its own blocks, then its origins).
    pub fn chain_of(&self, id: u64) -> Option<Chain> {
        let datasets = self.datasets.read();
        let rec = datasets.values().find(|d| d.id == id)?;
        Some(Chain::of(rec, datasets.values()))
    }

    /// A volume's block size (the one object whose blocks have a fixed size).
    fn block_size_of(&self, id: u64) -> Option<u32> {
        self.datasets
            .read()
            .values()
            .find(|d| d.id == id)
            .map(|d| d.volblocksize)
    }

    /// The live pointer of a committed block.
    /// A consistent view of everything outside the open txg: the txg being
    /// committed, and the block map as of no earlier than that txg's start.
    /// The order matters: the syncing txg is taken first, so a txg that
    /// commits in between is seen in one place or the other, never missed.
    pub fn view(&self) -> Result<View> {
        let syncing = self.syncing.read().clone();
        let tx = self.db().begin_read().map_err(meta_err)?;
        let blocks = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
        Ok(View { syncing, blocks })
    }

    /// The committed block map alone, without the txg being committed (whose
    /// partial blocks are merged over it).
    fn committed_view(&self) -> Result<View> {
        let tx = self.db().begin_read().map_err(meta_err)?;
        let blocks = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
        Ok(View {
            syncing: None,
            blocks,
        })
    }

    /// Whole contents of the partial blocks of a committing txg: each read
    /// once from the committed map (in runs, like any read) and overlaid.
    /// Over a hole the partial block's own buffer is the result (no copy).
    /// A base version that this commit replaces for good (no snapshot or
    /// clone origin holds it) leaves the ARC here, and when the ARC was its
    /// only holder the new ranges are copied into its buffer, which becomes
    /// the new version: no allocation, no page faults, no copy of the rest
    /// of the block (decision 0073). A commit that fails later has only
    /// lost a cached copy: the old version is still on disk.
    fn merge_partials(
        &self,
        dirty: &HashMap<BlockKey, Dirty>,
    ) -> Result<HashMap<BlockKey, Arc<Vec<u8>>>> {
        // By object, with the object's block size (every partial block holds a whole one).
        let mut by_obj: BTreeMap<(u64, u64), (u32, Vec<u64>)> = BTreeMap::new();
        for (k, d) in dirty {
            if let Dirty::Partial(p) = d {
                let e = by_obj
                    .entry((k.0, k.1))
                    .or_insert_with(|| (p.data.len() as u32, Vec::new()));
                e.1.push(k.2);
            }
        }
        let mut out = HashMap::with_capacity(by_obj.values().map(|v| v.1.len()).sum());
        if by_obj.is_empty() {
            return Ok(out);
        }
        let view = self.committed_view()?;
        // Each dataset's chain and retained txg, found once: both scan every
        // dataset record, and a txg can hold partial blocks of many objects.
        let mut of_dataset: HashMap<u64, Option<(Chain, u64)>> = HashMap::new();
        for ((ds, obj), (bs, mut blocks)) in by_obj {
            let found = of_dataset.entry(ds).or_insert_with(|| {
                let chain = self.chain_of(ds)?;
                let retained = self.retained_upto(&chain);
                Some((chain, retained))
            });
            // A dataset destroyed meanwhile: its blocks are dropped at placement.
            let Some((chain, retained)) = found else {
                continue;
            };
            let retained = *retained;
            blocks.sort_unstable();
            let partial = |b: u64| match dirty.get(&(ds, obj, b)) {
                Some(Dirty::Partial(p)) => Some(p),
                _ => None,
            };
            let pointers = crate::volume::committed_pointers(&view, chain, obj, &blocks)?;
            // Blocks whose base is read the usual way (cache, L2ARC, disk).
            let mut rest = Vec::new();
            for &b in &blocks {
                let Some(p) = partial(b) else { continue };
                let base = match pointers.get(&b) {
                    None => {
                        out.insert((ds, obj, b), p.over_hole());
                        continue;
                    }
                    Some(bp) if bp.birth > retained && !bp.is_embedded() => self
                        .cache
                        .take(&crate::volume::arc_key(ds, obj, b, bp))
                        .filter(|d| d.len() == bs as usize),
                    Some(_) => None,
                };
                let merged = match base.map(crate::Block::into_vec) {
                    Some(Ok(buf)) => p.over_into(buf),
                    Some(Err(shared)) => p.over(Some(&shared)),
                    None => {
                        rest.push(b);
                        continue;
                    }
                };
                out.insert((ds, obj, b), Arc::new(merged));
            }
            if rest.is_empty() {
                continue;
            }
            let bases =
                crate::volume::read_outside_open(self, &view, chain, obj, false, bs, &rest)?;
            for b in rest {
                if let Some(p) = partial(b) {
                    let base = bases.get(&b).cloned().flatten();
                    out.insert((ds, obj, b), p.merged(base.as_deref()));
                }
            }
        }
        Ok(out)
    }

    /// The newest txg whose versions of `chain`'s head something other than
    /// the head holds: its newest snapshot, or the origin of a clone (all
    /// the head sees below it). A version born after it is the head's alone.
    fn retained_upto(&self, chain: &Chain) -> u64 {
        let ds = chain.data_id();
        let origin = chain.0.get(1).map_or(0, |l| l.1);
        self.datasets
            .read()
            .values()
            .filter(|r| r.is_snapshot() && r.data_id() == ds)
            .map(|r| r.created_txg)
            .fold(origin, u64::max)
    }

    /// Writes a dataset record (created or changed) in its own transaction.
    pub fn store_dataset(&self, rec: &DatasetRecord) -> Result<()> {
        let _meta = self.meta_lock.lock();
        let tx = self.db().begin_write().map_err(meta_err)?;
        {
            let mut t = tx.open_table(DATASETS).map_err(meta_err)?;
            // Space figures are owned by the txg commit: keep the latest ones.
            let mut rec = rec.clone();
            if let Some(cur) = self.datasets.read().get(&rec.name) {
                rec.logical_used = cur.logical_used;
                rec.physical_used = cur.physical_used;
                rec.inherited = cur.inherited;
                rec.inherited_logical = cur.inherited_logical;
                rec.snapshot_used = cur.snapshot_used;
                rec.written = cur.written;
            }
            let json = serde_json::to_vec(&rec).map_err(meta_err)?;
            t.insert(rec.id, json.as_slice()).map_err(meta_err)?;
            self.datasets.write().insert(rec.name.clone(), rec);
        }
        tx.commit().map_err(meta_err)
    }

    /// Records (or forgets) that device `guid` was taken offline, so it
    /// stays offline across restarts. The caller holds `meta_lock`.
    pub(crate) fn store_offline_locked(&self, guid: u64, offline: bool) -> Result<()> {
        let key = format!("{RECORD_OFFLINE_PREFIX}{guid}");
        let tx = self.db().begin_write().map_err(meta_err)?;
        {
            let mut r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
            if offline {
                r.insert(key.as_str(), 1).map_err(meta_err)?;
            } else {
                r.remove(key.as_str()).map_err(meta_err)?;
            }
        }
        tx.commit().map_err(meta_err)
    }

    /// Devices recorded as taken offline.
    pub(crate) fn offline_devices(&self) -> Result<Vec<u64>> {
        let tx = self.db().begin_read().map_err(meta_err)?;
        let r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
        let mut out = Vec::new();
        for row in r.iter().map_err(meta_err)? {
            let (k, _) = row.map_err(meta_err)?;
            if let Some(guid) = k.value().strip_prefix(RECORD_OFFLINE_PREFIX) {
                if let Ok(g) = guid.parse() {
                    out.push(g);
                }
            }
        }
        Ok(out)
    }

    /// When the snapshot policy last ran on dataset `id` (Unix seconds).
    pub(crate) fn policy_last_run(&self, id: u64) -> Result<Option<i64>> {
        let key = format!("{RECORD_POLICY_LAST_RUN_PREFIX}{id}");
        let tx = self.db().begin_read().map_err(meta_err)?;
        let r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
        let v = r.get(key.as_str()).map_err(meta_err)?;
        Ok(v.map(|v| v.value() as i64))
    }

    /// Persists the last-run record in its own small transaction.
    pub(crate) fn store_policy_last_run(&self, id: u64, secs: i64) -> Result<()> {
        let key = format!("{RECORD_POLICY_LAST_RUN_PREFIX}{id}");
        let _meta = self.meta_lock.lock();
        let tx = self.db().begin_write().map_err(meta_err)?;
        {
            let mut r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
            r.insert(key.as_str(), secs.max(0) as u64)
                .map_err(meta_err)?;
        }
        tx.commit().map_err(meta_err)
    }

    /// A new dataset id, persisted so ids are never reused.
    pub fn next_dataset_id(&self) -> Result<u64> {
        self.next_dataset_ids(1)
    }

    /// Reserves `n` dataset ids in one metadata commit; answers the first
    /// (`snapshot -r` of 100 datasets: one commit, not 100).
    pub fn next_dataset_ids(&self, n: u64) -> Result<u64> {
        let _meta = self.meta_lock.lock();
        let tx = self.db().begin_write().map_err(meta_err)?;
        let id = {
            let mut r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
            let id = r
                .get(RECORD_NEXT_DATASET)
                .map_err(meta_err)?
                .map(|v| v.value())
                .unwrap_or(1);
            r.insert(RECORD_NEXT_DATASET, id + n.max(1))
                .map_err(meta_err)?;
            id
        };
        tx.commit().map_err(meta_err)?;
        Ok(id)
    }

    /// Removes a dataset, its snapshots and frees all of its blocks.
    pub fn destroy_dataset(&self, name: &str) -> Result<()> {
        let id = self
            .datasets
            .read()
            .get(name)
            .map(|d| d.id)
            .ok_or_else(|| Error::NotFound(name.to_string()))?;
        self.commit_txg(Some(Action::DestroyDataset(id)))?;
        self.cache.forget_dataset(id);
        Ok(())
    }

    /// Bounds and use of this pool's caches and buffers (`pool status --json`).
    pub fn memory_use(&self) -> crate::MemoryUse {
        let arc = self.cache.stats();
        let c = &self.config;
        let dirty = self.open.lock().dirty_bytes;
        let prefetch_max = self.prefetch.max_bytes();
        crate::MemoryUse {
            arc,
            prefetch_in_flight: self.prefetch.in_flight(),
            prefetch_max,
            meta_cache_max: c.meta_cache_bytes,
            log_buffer_max: c.log_buffer_bytes,
            dirty,
            dirty_max: c.dirty_max_bytes,
            bounds_total: arc.max
                + prefetch_max
                + c.meta_cache_bytes
                + c.log_buffer_bytes
                + 2 * c.dirty_max_bytes,
        }
    }

    pub fn stats(&self) -> PoolStats {
        let alloc = self.pool.allocator();
        let (allocated, size) = (alloc.allocated(), self.pool.size());
        drop(alloc);
        let log = self.log.stats();
        let (metadata_used, metadata_size) =
            meta::usage(&self.pool.meta_region()).unwrap_or((0, 0));
        // One guard: a second lock of `open` in the same expression would deadlock.
        let (open_txg, dirty_bytes) = {
            let open = self.open.lock();
            (open.txg, open.dirty_bytes)
        };
        let bucket = crate::engine::bucket_space(self);
        let cache = bucket.as_ref().and_then(|b| b.cache).unwrap_or_default();
        PoolStats {
            pool: self.pool.name.clone(),
            txg: open_txg.saturating_sub(1),
            txg_commits: self.counters.txg_commits.load(Ordering::Relaxed),
            txg_commit_seconds_total: self.counters.txg_commit_micros.load(Ordering::Relaxed)
                as f64
                / 1e6,
            log_commits: log.commits.load(Ordering::Relaxed),
            log_records: log.records.load(Ordering::Relaxed),
            log_bytes: log.bytes.load(Ordering::Relaxed),
            log_syncs: log.syncs.load(Ordering::Relaxed),
            log_flushes: log.flushes.load(Ordering::Relaxed),
            log_overlapped: log.overlapped.load(Ordering::Relaxed),
            log_deferred: log.deferred.load(Ordering::Relaxed),
            log_ring: log.ring.load(Ordering::Relaxed),
            log_thread: log.thread.load(Ordering::Relaxed),
            log_wait_seconds_total: log.wait.nanos.load(Ordering::Relaxed) as f64 / 1e9,
            read_bytes: self.counters.read_bytes.load(Ordering::Relaxed),
            write_bytes: self.counters.write_bytes.load(Ordering::Relaxed),
            dirty_bytes,
            cache_hits: self.cache.hits.load(Ordering::Relaxed),
            cache_misses: self.cache.misses.load(Ordering::Relaxed),
            arc: self.cache.stats(),
            prefetch_in_flight: self.prefetch.in_flight(),
            prefetch_max: self.prefetch.max_bytes(),
            checksum_errors: self
                .pool
                .devices()
                .iter()
                .map(|d| d.errors.checksum.load(Ordering::Relaxed))
                .sum(),
            allocated,
            size,
            suspended: u64::from(self.is_suspended()),
            metadata_used,
            metadata_size,
            bucket_physical_bytes: bucket.as_ref().and_then(|b| b.physical_bytes).unwrap_or(0),
            bucket_cache_held_bytes: cache.held_bytes,
            bucket_cache_hits: cache.hits,
            bucket_cache_misses: cache.misses,
            bucket_cache_fetched_bytes: cache.fetched_bytes,
        }
    }

    /// Commits everything and stops the sync thread. Idempotent.
    pub fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.stop_health_thread();
        // Blocked writers (failmode=wait) see `closed` and give up.
        self.health.resumed.notify_all();
        let result = match self.health.suspension() {
            // Its new owner has the pool; what was not committed here was never acknowledged.
            _ if self.pool.is_fenced() => {
                tracing::warn!(pool = %self.pool.name, "closed without a final commit: the pool was taken over");
                Ok(())
            }
            None => self.sync_txg(),
            // One last try; if the cause is still there, what was never
            // acknowledged is dropped and said so. Acknowledged writes are
            // in the intent log, replayed at the next import.
            Some(s) => match self.resume() {
                Ok(()) => Ok(()),
                Err(_) => {
                    let dirty = self.open.lock().dirty_bytes;
                    tracing::warn!(
                        pool = %self.pool.name,
                        cause = %s.cause,
                        "pool closed while SUSPENDED: {} of writes never acknowledged (no FLUSH/FUA completed for them) are dropped; every acknowledged write is in the intent log and is replayed at the next import",
                        crate::props::format_size(dirty)
                    );
                    Ok(())
                }
            },
        };
        {
            let mut c = self.ctl.lock();
            c.shutdown = true;
            self.ctl_changed.notify_all();
        }
        if let Some(h) = self.sync_thread.lock().take() {
            let _ = h.join();
        }
        self.log.close();
        result
    }
}

/// The log region replay reads: the main devices' region, or the SLOG the
/// checkpoint names. A SLOG that is missing (or names no log group) may
/// hold acknowledged writes: the import is refused unless the pool was
/// exported cleanly (the last txg holds every record) or the caller
/// accepts the loss (`pool import -m`); the log then starts afresh on
/// the main devices.
fn log_region_for(pool: &Arc<Pool>, cp: Checkpoint) -> Result<(pool::MirroredRegion, Checkpoint)> {
    if cp.tag == 0 {
        return Ok((pool.log_region(), cp));
    }
    if let Some(r) = pool.slog_region(cp.tag).filter(|r| r.available()) {
        return Ok((r, cp));
    }
    let clean = pool.was_exported();
    if !clean && !pool.missing_log_accepted() {
        return Err(Error::Io(format!(
            "cannot import '{}': its log device is missing and may hold acknowledged sync writes not yet in the pool; bring the log device back, or import with -m to discard them",
            pool.name
        )));
    }
    if clean {
        tracing::info!(pool = %pool.name, "log device missing; the pool was exported cleanly, nothing to replay");
    } else {
        tracing::warn!(pool = %pool.name, "log device missing: its unreplayed records are discarded (-m)");
    }
    // Every sequence number on the main region is older than applied_seq
    // (later ones went to the SLOG), so none is mistaken for a record.
    let fresh = Checkpoint {
        applied_seq: cp.applied_seq,
        replay_pos: 0,
        expect_seq: cp.applied_seq,
        tag: 0,
    };
    Ok((pool.log_region(), fresh))
}

/// The committed state a pool starts from: last txg, log checkpoint and
/// dataset records; the space map is rebuilt from every block pointer (a
/// block claimed twice means the metadata is inconsistent).
fn load_committed(
    db: &Database,
    pool: &Pool,
) -> Result<(u64, Checkpoint, BTreeMap<String, DatasetRecord>)> {
    let tx = db.begin_read().map_err(meta_err)?;
    let r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
    let get = |k: &str| -> Result<u64> {
        r.get(k)
            .map_err(meta_err)?
            .map(|v| v.value())
            .ok_or_else(|| Error::Corrupt(format!("pool record {k} missing")))
    };
    let txg = get(RECORD_TXG)?;
    let cp = Checkpoint {
        applied_seq: get(RECORD_LOG_APPLIED_SEQ)?,
        replay_pos: get(RECORD_LOG_REPLAY_POS)?,
        expect_seq: get(RECORD_LOG_EXPECT_SEQ)?,
        tag: r
            .get(RECORD_LOG_TAG)
            .map_err(meta_err)?
            .map_or(0, |v| v.value()),
    };
    let mut datasets = BTreeMap::new();
    for row in tx
        .open_table(DATASETS)
        .map_err(meta_err)?
        .iter()
        .map_err(meta_err)?
    {
        let (_, v) = row.map_err(meta_err)?;
        let rec: DatasetRecord = serde_json::from_slice(v.value())
            .map_err(|e| Error::Corrupt(format!("dataset record: {e}")))?;
        datasets.insert(rec.name.clone(), rec);
    }
    let mut alloc = pool.empty_allocator();
    for row in tx
        .open_table(BLOCK_MAP)
        .map_err(meta_err)?
        .iter()
        .map_err(meta_err)?
    {
        let (k, v) = row.map_err(meta_err)?;
        let Some(bp) = blockmap::decode(k.value().1, v.value())? else {
            continue; // a tombstone
        };
        for dva in &bp.dvas {
            if !alloc.claim(*dva) {
                return Err(Error::Corrupt(format!(
                    "block {:?} overlaps another block at {dva:?}",
                    k.value()
                )));
            }
        }
    }
    pool.set_allocator(alloc);
    Ok((txg, cp, datasets))
}

/// Resolves the inheritance chain of `rec` (itself, then parents up to the pool root).
pub fn lineage<'a>(
    datasets: &'a BTreeMap<String, DatasetRecord>,
    rec: &'a DatasetRecord,
) -> Lineage<'a> {
    let mut chain = vec![rec];
    let mut name = rec.name.as_str();
    // A snapshot inherits from its dataset, then up the tree.
    if let Some((dataset, _)) = name.split_once('@') {
        if let Some(d) = datasets.get(dataset) {
            chain.push(d);
        }
        name = dataset;
    }
    while let Some((parent, _)) = name.rsplit_once('/') {
        if let Some(p) = datasets.get(parent) {
            chain.push(p);
        }
        name = parent;
    }
    Lineage { chain }
}

trait ZeroCompression {
    fn max_lz4(self) -> Compression;
}

impl ZeroCompression for Compression {
    /// Allocated zero blocks are stored compressed even where compression is off: one sector.
    fn max_lz4(self) -> Compression {
        match self {
            Compression::Off => Compression::Lz4,
            c => c,
        }
    }
}

/// How often the txg sync thread looks again at where the pool's disk
/// interrupts land (irqbalance moves them).
const PLACEMENT_RECHECK: Duration = Duration::from_secs(10);

/// Where the txg sync thread runs (decision 0083): while the intent log is
/// in use, off the CPUs that take the pool's disk completions when there
/// are others, so its CPU-bound work does not delay the kernel work a log
/// write waits for; otherwise (bulk writes) on every CPU it may use.
struct Placement {
    /// The CPUs the thread was started with.
    allowed: vdev::irq::CpuSet,
    /// `allowed` without the CPUs that take the pool's disk interrupts,
    /// when that leaves some (looked at every [`PLACEMENT_RECHECK`]).
    away: Option<vdev::irq::CpuSet>,
    checked: Option<Instant>,
    /// The CPUs it runs on now.
    current: vdev::irq::CpuSet,
    log_commits_seen: AtomicU64,
}

impl Placement {
    fn new() -> Option<Placement> {
        let allowed = vdev::irq::thread_cpus().ok()?;
        Some(Placement {
            current: allowed.clone(),
            allowed,
            away: None,
            checked: None,
            log_commits_seen: AtomicU64::new(0),
        })
    }

    /// Before a txg: away from the interrupts if the log wrote since the last one.
    fn place(&mut self, p: &ImportedPool) -> std::io::Result<()> {
        let due = self
            .checked
            .is_none_or(|t| t.elapsed() >= PLACEMENT_RECHECK);
        if p.config.txg_avoid_irq_cpus && due {
            self.checked = Some(Instant::now());
            let irq: vdev::irq::CpuSet = p
                .pool
                .device_paths()
                .iter()
                .filter_map(|d| vdev::irq::completion_cpus(d))
                .flatten()
                .collect();
            let away = vdev::irq::away_from(&self.allowed, &irq);
            if away != self.away {
                if let Some(cpus) = &away {
                    tracing::info!(
                        pool = %p.pool.name,
                        cpus = %vdev::irq::format_cpu_list(cpus),
                        interrupts_on = %vdev::irq::format_cpu_list(&irq),
                        "while sync writes go on, txg sync keeps off the CPUs that take the pool's disk interrupts"
                    );
                }
                self.away = away;
            }
        }
        let want = match &self.away {
            Some(away) if p.log_wrote_since(&self.log_commits_seen) => away,
            _ => &self.allowed,
        };
        if *want == self.current {
            return Ok(());
        }
        // A cpuset shrunk under us refuses: stay where we are from then on.
        vdev::irq::set_thread_cpus(want)?;
        self.current = want.clone();
        *p.encoder_cpus.lock() = (self.current != self.allowed).then(|| self.allowed.clone());
        Ok(())
    }
}

fn sync_loop(weak: std::sync::Weak<ImportedPool>) {
    let mut placement = Placement::new();
    loop {
        let Some(p) = weak.upgrade() else { return };
        let timeout = Duration::from_secs_f64(p.config.txg_timeout_secs.max(0.05));
        let target = {
            let mut c = p.ctl.lock();
            if c.shutdown {
                return;
            }
            if c.requested <= c.done {
                p.ctl_changed.wait_for(&mut c, timeout);
            }
            if c.shutdown {
                return;
            }
            c.requested
        };
        if p.is_suspended() {
            // No retries until `pool clear`: wait for it (or shutdown).
            let mut c = p.ctl.lock();
            if !c.shutdown {
                p.ctl_changed.wait_for(&mut c, timeout);
            }
            continue;
        }
        if p.log.fill() > 0.5 {
            p.request_sync();
        }
        if let Some(Err(e)) = placement.as_mut().map(|pl| pl.place(&p)) {
            tracing::warn!(pool = %p.pool.name, error = %e, "cannot set the txg sync thread's CPUs; it stays where it is");
            placement = None;
            *p.encoder_cpus.lock() = None;
        }
        let result = p.sync_txg();
        let mut c = p.ctl.lock();
        c.done = c.done.max(target);
        c.failed = result.err().map(|e| (target, e.to_string()));
        p.ctl_changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::PartialBlock;

    #[test]
    fn partial_blocks_merge_ranges_and_overlay_the_base() {
        let mut p = PartialBlock::new(16);
        p.put(4, 8, Some(&[1; 4]));
        p.put(10, 12, None);
        p.put(8, 10, Some(&[2; 2])); // joins both neighbours
        assert_eq!(p.ranges, vec![(4, 12)]);
        p.put(14, 16, Some(&[3; 2]));
        assert_eq!(p.ranges, vec![(4, 12), (14, 16)]);
        assert!(!p.is_complete());
        let base = [9u8; 16];
        assert_eq!(
            p.over(Some(&base)),
            vec![9, 9, 9, 9, 1, 1, 1, 1, 2, 2, 0, 0, 9, 9, 3, 3]
        );
        assert_eq!(p.over(None)[..4], [0, 0, 0, 0]);
        p.put(0, 16, Some(&[5; 16]));
        assert!(p.is_complete());
    }

    #[test]
    fn merging_without_copies_gives_the_same_block() {
        let mut p = PartialBlock::new(16);
        p.put(2, 6, Some(&[7; 4]));
        p.put(10, 12, None);
        let base: Vec<u8> = (100..116).collect();
        let want = p.over(Some(&base));
        assert_eq!(p.over_into(base.clone()), want);
        assert_eq!(*p.over_hole(), p.over(None));
        assert_eq!(
            p.over(None),
            [0, 0, 7, 7, 7, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        // Shared with a merged block: a later write copies, the merged block stays.
        let merged = p.over_hole();
        let mut q = p.clone();
        q.put(0, 2, Some(&[9; 2]));
        assert_eq!(merged[..2], [0, 0]);
        assert_eq!(q.over(None)[..2], [9, 9]);
    }
}
