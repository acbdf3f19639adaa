//! Snapshot automation in the daemon: a scheduler thread that applies the
//! `policy` crate's plans (take one snapshot, destroy a batch of automatic
//! snapshots in one txg), pre/post hooks, the last-run record, a bounded
//! run history kept on the pool (table `policy_history`) and counters. The
//! decisions themselves live in `policy`.
//!
//! Event snapshots ("a backup finished"): the scheduler thread looks every
//! 100 ms at (a) volumes whose last NBD client closed after writing
//! (`holders.rs`), (b) buckets quiet for the policy's `s3_quiet` after
//! writes (a per-dataset last-write clock on the pool, [`WriteClock`]), and
//! (c) events the share layers report with [`Engine::backup_finished`].
//! `policy::event_due` decides, so at most one per `event_min_interval`.
//!
//! Crash safety: a snapshot and a pruning batch are each one txg commit
//! (all or nothing). The last-run record is written after the snapshot; if
//! the daemon dies in between, the snapshot itself marks the slot as done
//! (the planner takes the later of the record and the newest automatic
//! snapshot), and the next tick re-plans the pruning from the snapshot list.

use crate::engine::split_dataset;
use crate::props::{self, DatasetRecord};
use crate::txg::{lineage, meta_err, ImportedPool};
use crate::*;
use meta::redb::ReadableTable;
use meta::schema::{POLICY_HISTORY, POLICY_HISTORY_LEN, POOL_RECORDS, RECORD_POLICY_HISTORY_NEXT};
use parking_lot::{Mutex, RwLock};
use policy::{EventDue, EventKind, Input, Plan, Policies, Policy, SnapshotEntry};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The read-only property of a snapshot that says which policy made it (and
/// will prune it): the policy's name, `-` for a manual snapshot.
pub const AUTO_PROPERTY: &str = "cistern:auto";
/// Destroyed names kept in a stored history record (the count is kept whole).
const HISTORY_NAMES: usize = 100;
/// How often the scheduler thread looks for events.
const EVENT_POLL: Duration = Duration::from_millis(100);

/// Per dataset, when the object layer last wrote to it (S3 PUT, DELETE,
/// multipart...): what `s3-quiet` event snapshots wait on. On the pool,
/// noted by `ObjectSet` on every change.
#[derive(Default)]
pub struct WriteClock(Mutex<HashMap<u64, Instant>>);

impl WriteClock {
    pub(crate) fn note(&self, dataset: u64) {
        self.0.lock().insert(dataset, Instant::now());
    }

    fn entries(&self) -> Vec<(u64, Instant)> {
        self.0.lock().iter().map(|(k, v)| (*k, *v)).collect()
    }

    /// Forgets `dataset` unless it was written again after `seen`.
    fn forget(&self, dataset: u64, seen: Instant) {
        let mut m = self.0.lock();
        if m.get(&dataset).is_some_and(|t| *t <= seen) {
            m.remove(&dataset);
        }
    }
}

/// An event waiting to be applied (now, or at the end of the minimum interval).
#[derive(Debug, Clone, Copy)]
struct PendingEvent {
    kind: EventKind,
    not_before: i64,
}

pub(crate) struct AutoSnap {
    policies: RwLock<Policies>,
    /// Events by dataset name.
    pending: Mutex<BTreeMap<String, PendingEvent>>,
    /// One run at a time (scheduler, `policy run`, shutdown).
    run: Mutex<()>,
    stop: AtomicBool,
    /// Unknown policy names already reported, so a tick does not repeat them.
    warned: Mutex<HashSet<(String, String)>>,
    counters: [AtomicU64; 6],
    /// Called after every automatic snapshot (replication's after-snapshot jobs).
    observers: RwLock<Vec<SnapshotObserver>>,
}

/// `(dataset, snapshot)` after an automatic snapshot was taken.
pub type SnapshotObserver = Arc<dyn Fn(&str, &str) + Send + Sync>;

impl Default for AutoSnap {
    fn default() -> Self {
        Self {
            policies: RwLock::new(Policies::from_config(&BTreeMap::new()).unwrap_or_default()),
            pending: Mutex::new(BTreeMap::new()),
            run: Mutex::new(()),
            stop: AtomicBool::new(false),
            warned: Mutex::new(HashSet::new()),
            counters: Default::default(),
            observers: RwLock::new(Vec::new()),
        }
    }
}

const SNAPSHOTS: usize = 0;
const FAILURES: usize = 1;
const PRUNED: usize = 2;
const PRUNED_BYTES: usize = 3;
const EVENT_SNAPSHOTS: usize = 4;
const EVENTS_DEFERRED: usize = 5;

/// A policy as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyView {
    pub name: String,
    pub schedule: String,
    pub keep: String,
    pub prefix: String,
    pub capacity_percent: Option<f64>,
    pub pre_hook: Option<String>,
    pub post_hook: Option<String>,
    pub hook_timeout_secs: f64,
    /// `config`, `built-in` or `schedule property`.
    pub origin: String,
    /// Events that take a snapshot (`nbd-disconnect`, `s3-quiet`, `share-disconnect`).
    #[serde(default)]
    pub events: Vec<String>,
    #[serde(default)]
    pub event_min_interval_secs: i64,
    #[serde(default)]
    pub s3_quiet_secs: i64,
}

impl From<&Policy> for PolicyView {
    fn from(p: &Policy) -> Self {
        PolicyView {
            name: p.name.clone(),
            schedule: p.schedule.to_string(),
            keep: p.keep.to_string(),
            prefix: p.prefix.clone(),
            capacity_percent: p.capacity_percent,
            pre_hook: p.pre_hook.clone(),
            post_hook: p.post_hook.clone(),
            hook_timeout_secs: p.hook_timeout_secs,
            origin: p.origin.clone(),
            events: p.events.iter().map(|e| e.name().to_string()).collect(),
            event_min_interval_secs: p.event_min_interval_secs,
            s3_quiet_secs: p.s3_quiet_secs,
        }
    }
}

/// `cistern policy list`: a policy and the datasets it applies to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyInfo {
    pub policy: PolicyView,
    pub datasets: Vec<String>,
}

/// `cistern policy show DATASET`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyShow {
    pub dataset: String,
    pub policy: Option<PolicyView>,
    /// `snapshot:policy` or `snapshot:schedule` and its value.
    pub property: Option<String>,
    /// `local`, `inherited from tank`...
    pub source: Option<String>,
    /// Why no policy applies (an unknown name, a bad schedule).
    pub error: Option<String>,
    pub last_run: Option<i64>,
    /// What the next scheduled run would do now.
    pub plan: Option<Plan>,
}

/// One run: what it took, what it destroyed, what failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRun {
    pub time: i64,
    pub dataset: String,
    pub policy: String,
    /// `schedule`, `manual`, or the event: `nbd-disconnect`, `s3-quiet`, `share-disconnect`.
    pub trigger: String,
    pub dry_run: bool,
    pub created: Option<String>,
    /// The destroyed snapshots (a stored record keeps the first 100 names).
    pub destroyed: Vec<String>,
    /// How many were destroyed.
    #[serde(default)]
    pub destroyed_count: usize,
    /// Bytes freed by the destroyed snapshots (an estimate for a dry run).
    pub freed: u64,
    pub errors: Vec<String>,
    /// The plan it followed (for `policy run`; not kept in the history).
    #[serde(default)]
    pub plan: Option<Plan>,
}

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Schedule,
    Manual,
    Event(EventKind),
}

impl Trigger {
    fn name(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Manual => "manual",
            Trigger::Event(k) => k.name(),
        }
    }
}

/// Counters for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyCounters {
    pub snapshots: u64,
    pub failures: u64,
    pub pruned: u64,
    pub pruned_bytes: u64,
    #[serde(default)]
    pub event_snapshots: u64,
    #[serde(default)]
    pub events_deferred: u64,
}

/// The property that chooses a dataset's policy: of `snapshot:policy` and
/// `snapshot:schedule`, the one set nearest the dataset (a child's
/// `snapshot:schedule=daily` or `snapshot:policy=none` beats its parent's
/// `snapshot:policy=timemachine`); `snapshot:policy` on a tie.
#[derive(Debug, Clone, Default)]
pub(crate) struct PolicyProps {
    /// (property, value, source)
    pub chosen: Option<(&'static str, String, String)>,
}

/// The one reader of `snapshot:policy` / `snapshot:schedule` (inherited like
/// every property); point it at the user-property store once that exists.
pub(crate) fn policy_props(
    datasets: &BTreeMap<String, DatasetRecord>,
    rec: &DatasetRecord,
) -> PolicyProps {
    let l = lineage(datasets, rec);
    for r in &l.chain {
        for prop in [props::SNAPSHOT_POLICY, props::SNAPSHOT_SCHEDULE] {
            if let Some(v) = r.local.get(prop) {
                let source = if r.name == rec.name {
                    "local".to_string()
                } else {
                    format!("inherited from {}", r.name)
                };
                return PolicyProps {
                    chosen: Some((prop, v.clone(), source)),
                };
            }
        }
    }
    PolicyProps::default()
}

/// A dataset a policy may apply to, with what the planner needs.
struct Target {
    pool: Arc<ImportedPool>,
    name: String,
    id: u64,
    props: PolicyProps,
    snapshots: Vec<SnapshotEntry>,
}

fn now_secs() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Datasets that hold data (volumes; not the pool's root), with their
/// snapshots. A snapshot that is held or is the origin of a clone counts as
/// held: destroying it would fail the whole batch.
fn targets_of(p: &Arc<ImportedPool>, only: Option<&str>) -> Vec<Target> {
    let datasets = p.datasets.read();
    let origins: HashSet<u64> = datasets
        .values()
        .filter_map(|d| d.origin.as_ref().map(|o| o.snapshot))
        .collect();
    let mut out = Vec::new();
    for rec in datasets.values() {
        if rec.is_snapshot() || !rec.name.contains('/') || only.is_some_and(|o| o != rec.name) {
            continue;
        }
        let prefix = format!("{}@", rec.name);
        let snapshots = datasets
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(_, s)| SnapshotEntry {
                name: s.name[prefix.len()..].to_string(),
                created: s.creation as i64,
                held: !s.holds.is_empty() || origins.contains(&s.id),
            })
            .collect();
        out.push(Target {
            pool: p.clone(),
            name: rec.name.clone(),
            id: rec.id,
            props: policy_props(&datasets, rec),
            snapshots,
        });
    }
    out
}

/// Pool capacity after destroying some of one dataset's snapshots, from the
/// engine's own destroy estimate.
struct PoolCapacity<'a> {
    pool: &'a ImportedPool,
    dataset: &'a str,
}

/// Appends a run to the pool's history and drops the oldest past
/// `POLICY_HISTORY_LEN`, in one small transaction of its own.
fn store_run(p: &ImportedPool, run: PolicyRun) -> Result<()> {
    store_run_bounded(p, run, POLICY_HISTORY_LEN)
}

fn store_run_bounded(p: &ImportedPool, mut run: PolicyRun, len: u64) -> Result<()> {
    run.plan = None;
    run.destroyed_count = run.destroyed_count.max(run.destroyed.len());
    run.destroyed.truncate(HISTORY_NAMES);
    run.errors.truncate(20);
    for e in &mut run.errors {
        if e.len() > 1000 {
            let mut end = 1000;
            while !e.is_char_boundary(end) {
                end -= 1;
            }
            e.truncate(end);
        }
    }
    let bytes = serde_json::to_vec(&run).map_err(meta_err)?;
    let _meta = p.meta_lock.lock();
    let tx = p.db().begin_write().map_err(meta_err)?;
    {
        let mut r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
        let seq = r
            .get(RECORD_POLICY_HISTORY_NEXT)
            .map_err(meta_err)?
            .map_or(0, |v| v.value());
        let mut h = tx.open_table(POLICY_HISTORY).map_err(meta_err)?;
        h.insert(seq, bytes.as_slice()).map_err(meta_err)?;
        // One in, one out: the table never holds more than the bound.
        if let Some(old) = seq.checked_sub(len) {
            h.remove(old).map_err(meta_err)?;
        }
        r.insert(RECORD_POLICY_HISTORY_NEXT, seq + 1)
            .map_err(meta_err)?;
    }
    tx.commit().map_err(meta_err)
}

/// The pool's policy runs, oldest first (none in a pool made before 0021).
fn read_runs(p: &ImportedPool) -> Result<Vec<PolicyRun>> {
    crate::history::read_json_rows(p, POLICY_HISTORY, "policy history record")
}

impl policy::Capacity for PoolCapacity<'_> {
    fn percent_after(&self, destroyed: &[&str]) -> f64 {
        let size = self.pool.pool.size().max(1) as f64;
        let allocated = self.pool.pool.allocated();
        let datasets = self.pool.datasets.read();
        let ids: Vec<u64> = destroyed
            .iter()
            .filter_map(|s| datasets.get(&format!("{}@{s}", self.dataset)).map(|r| r.id))
            .collect();
        let freed = if ids.is_empty() {
            0
        } else {
            self.pool.destroy_estimate(&datasets, &ids).unwrap_or(0)
        };
        allocated.saturating_sub(freed) as f64 * 100.0 / size
    }
}

/// Runs `sh -c CMD` with the snapshot in its environment; kills it at the timeout.
fn run_hook(
    what: &str,
    cmd: &str,
    timeout_secs: f64,
    env: &[(&str, &str)],
) -> std::result::Result<(), String> {
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .envs(env.iter().copied())
        .env("CISTERN_HOOK", what)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("{what}-hook '{cmd}' could not start: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs_f64(timeout_secs);
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => return Err(format!("{what}-hook '{cmd}' failed ({status})")),
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{what}-hook '{cmd}' timed out after {timeout_secs}s and was killed"
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{what}-hook '{cmd}': {e}")),
        }
    }
}

impl Engine {
    fn autosnap(&self) -> &AutoSnap {
        &self.inner.autosnap
    }

    /// The named policies (`[policy.NAME]` tables plus the built-in ones).
    pub fn set_policies(&self, policies: Policies) {
        *self.autosnap().policies.write() = policies;
    }

    /// `f(dataset, snapshot)` runs after every automatic snapshot (it must
    /// not block: replication only notes that a run is due).
    pub fn on_auto_snapshot(&self, f: SnapshotObserver) {
        self.autosnap().observers.write().push(f);
    }

    /// Starts the scheduler thread: every `policy_tick_secs` (first after
    /// one interval), each dataset whose policy is due is snapshotted and
    /// pruned; every 100 ms, events are looked at.
    pub fn start_policy_scheduler(self: &Arc<Self>) {
        let tick = self.inner.config.policy_tick_secs;
        if tick <= 0.0 {
            tracing::info!("snapshot policy scheduler off (policy_tick_secs = 0)");
            return;
        }
        let weak = Arc::downgrade(self);
        let tick = Duration::from_secs_f64(tick);
        let spawned = std::thread::Builder::new()
            .name("autosnap".into())
            .spawn(move || loop {
                let start = Instant::now();
                while start.elapsed() < tick {
                    match weak.upgrade() {
                        Some(e) if !e.autosnap().stop.load(Ordering::Relaxed) => {
                            e.run_events(now_secs())
                        }
                        _ => return,
                    }
                    std::thread::sleep(tick.min(EVENT_POLL));
                }
                let Some(engine) = weak.upgrade() else { return };
                engine.run_due_policies(now_secs());
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the snapshot policy scheduler");
        }
    }

    /// Stops the scheduler and waits for a run in progress.
    pub(crate) fn stop_policy_scheduler(&self) {
        self.autosnap().stop.store(true, Ordering::Relaxed);
        drop(self.autosnap().run.lock());
    }

    fn resolve_policy(&self, t: &Target) -> std::result::Result<Option<Policy>, String> {
        self.resolve_props(&t.props)
    }

    fn resolve_props(&self, props: &PolicyProps) -> std::result::Result<Option<Policy>, String> {
        let policies = self.autosnap().policies.read();
        let (policy, schedule) = match &props.chosen {
            Some((p, v, _)) if *p == props::SNAPSHOT_POLICY => (Some(v.as_str()), None),
            Some((_, v, _)) => (None, Some(v.as_str())),
            None => (None, None),
        };
        policies
            .resolve(policy, schedule)
            .map_err(|e| e.to_string())
    }

    fn all_targets(&self, only: Option<&str>) -> Vec<Target> {
        let pools: Vec<_> = self.inner.pools.read().values().cloned().collect();
        pools.iter().flat_map(|p| targets_of(p, only)).collect()
    }

    /// One scheduler tick.
    fn run_due_policies(&self, now: i64) {
        let _run = self.autosnap().run.lock();
        if self.autosnap().stop.load(Ordering::Relaxed) {
            return;
        }
        for t in self.all_targets(None) {
            let policy = match self.resolve_policy(&t) {
                Ok(Some(p)) => p,
                Ok(None) => continue,
                Err(e) => {
                    if self
                        .autosnap()
                        .warned
                        .lock()
                        .insert((t.name.clone(), e.clone()))
                    {
                        tracing::warn!(dataset = %t.name, error = %e, "snapshot policy not applied");
                    }
                    continue;
                }
            };
            if t.pool.is_closed() {
                continue;
            }
            if let Some(run) = self.apply(&t, &policy, now, Trigger::Schedule, false) {
                self.record(&t.pool, run);
            }
        }
    }

    /// A backup of `dataset` finished (`why`): take an event snapshot if its
    /// policy asks for `why` (`events = [...]`), at most one per the
    /// policy's `event_min_interval`. Never blocks and never fails: the
    /// scheduler thread applies it within 100 ms. The share layers call this
    /// when a client that wrote disconnects (`EventKind::ShareDisconnect`).
    pub fn backup_finished(&self, dataset: &str, why: EventKind) {
        self.autosnap().pending.lock().insert(
            dataset.to_string(),
            PendingEvent {
                kind: why,
                not_before: now_secs(),
            },
        );
    }

    /// The policy that applies to a dataset record, without its snapshots.
    fn policy_of(
        &self,
        datasets: &BTreeMap<String, DatasetRecord>,
        rec: &DatasetRecord,
    ) -> Option<Policy> {
        let props = policy_props(datasets, rec);
        self.resolve_props(&props).ok().flatten()
    }

    /// Collects events (last NBD close after writes, quiet buckets, reported
    /// ones) and applies those that are due. Called every 100 ms.
    fn run_events(&self, now: i64) {
        let finished = self.inner.holders.take_finished();
        let mut quiet = Vec::new();
        let pools: Vec<_> = self.inner.pools.read().values().cloned().collect();
        for p in &pools {
            let writes = p.object_writes.entries();
            if writes.is_empty() {
                continue;
            }
            let datasets = p.datasets.read();
            for (id, at) in writes {
                let rec = datasets.values().find(|r| r.id == id);
                let policy = rec.and_then(|r| self.policy_of(&datasets, r));
                match (rec, policy) {
                    (Some(r), Some(pol)) if pol.events.contains(&EventKind::S3Quiet) => {
                        if at.elapsed() >= Duration::from_secs(pol.s3_quiet_secs.max(1) as u64) {
                            p.object_writes.forget(id, at);
                            quiet.push(r.name.clone());
                        }
                    }
                    // No policy wants it: nothing to wait for.
                    _ => p.object_writes.forget(id, at),
                }
            }
        }
        let due: Vec<(String, PendingEvent)> = {
            let mut pending = self.autosnap().pending.lock();
            let fresh = |kind| PendingEvent {
                kind,
                not_before: now,
            };
            for (ds, kind) in finished {
                pending.insert(ds, fresh(kind));
            }
            for ds in quiet {
                pending.insert(ds, fresh(EventKind::S3Quiet));
            }
            let due: Vec<String> = pending
                .iter()
                .filter(|(_, e)| e.not_before <= now)
                .map(|(d, _)| d.clone())
                .collect();
            due.into_iter()
                .filter_map(|d| pending.remove(&d).map(|e| (d, e)))
                .collect()
        };
        if due.is_empty() {
            return;
        }
        let _run = self.autosnap().run.lock();
        if self.autosnap().stop.load(Ordering::Relaxed) {
            return;
        }
        for (ds, ev) in due {
            let Ok(t) = self.target(&ds) else {
                continue; // destroyed or renamed meanwhile
            };
            let Ok(Some(policy)) = self.resolve_policy(&t) else {
                continue;
            };
            if t.pool.is_closed() {
                continue;
            }
            let (what, why) = policy::event_due(&policy, ev.kind, now, &t.snapshots);
            match what {
                EventDue::Off => tracing::debug!(dataset = %ds, "{why}"),
                EventDue::At(at) => {
                    tracing::info!(dataset = %ds, event = %ev.kind, "{why}");
                    self.autosnap().counters[EVENTS_DEFERRED].fetch_add(1, Ordering::Relaxed);
                    // A newer event for the dataset (arrived meanwhile) wins.
                    self.autosnap()
                        .pending
                        .lock()
                        .entry(ds)
                        .or_insert(PendingEvent {
                            kind: ev.kind,
                            not_before: at,
                        });
                }
                EventDue::Now => {
                    if let Some(mut run) =
                        self.apply(&t, &policy, now, Trigger::Event(ev.kind), false)
                    {
                        if let Some(plan) = run.plan.as_mut() {
                            plan.create_reason = why;
                        }
                        self.record(&t.pool, run);
                    }
                }
            }
        }
    }

    /// Keeps the run in the pool's history (its own small transaction; the
    /// run is logged either way).
    fn record(&self, pool: &ImportedPool, run: PolicyRun) {
        if let Err(e) = store_run(pool, run) {
            tracing::warn!(pool = %pool.pool.name, error = %e, "cannot record the policy run in the history");
        }
    }

    fn plan_for(&self, t: &Target, policy: &Policy, now: i64, force: bool, take: bool) -> Plan {
        let last_run = t.pool.policy_last_run(t.id).unwrap_or_else(|e| {
            tracing::warn!(dataset = %t.name, error = %e, "cannot read the policy's last run");
            None
        });
        let cap = PoolCapacity {
            pool: &t.pool,
            dataset: &t.name,
        };
        policy::plan(
            policy,
            Input {
                now,
                snapshots: &t.snapshots,
                last_run,
                force,
                take,
            },
            Some(&cap),
        )
    }

    /// Plans and applies one run; `None` when a scheduled run has nothing to do.
    fn apply(
        &self,
        t: &Target,
        policy: &Policy,
        now: i64,
        trigger: Trigger,
        dry_run: bool,
    ) -> Option<PolicyRun> {
        // Manual runs and events take a snapshot now, due or not.
        let force = trigger != Trigger::Schedule;
        let mut plan = self.plan_for(t, policy, now, force, true);
        let mut run = PolicyRun {
            time: now,
            dataset: t.name.clone(),
            policy: policy.name.clone(),
            trigger: trigger.name().into(),
            dry_run,
            created: None,
            destroyed: Vec::new(),
            destroyed_count: 0,
            freed: 0,
            errors: Vec::new(),
            plan: None,
        };
        if dry_run {
            run.created = plan.create.clone();
            run.destroyed = plan.destroy.iter().map(|d| d.name.clone()).collect();
            run.destroyed_count = run.destroyed.len();
            run.freed = self.estimate(t, &run.destroyed);
            run.plan = Some(plan);
            return Some(run);
        }
        if trigger != Trigger::Manual && plan.create.is_none() && plan.destroy.is_empty() {
            return None;
        }
        let c = &self.autosnap().counters;
        if let Some(short) = plan.create.clone() {
            let full = format!("{}@{short}", t.name);
            let env = [
                ("CISTERN_DATASET", t.name.as_str()),
                ("CISTERN_SNAPSHOT", full.as_str()),
                ("CISTERN_POLICY", policy.name.as_str()),
                ("CISTERN_TRIGGER", trigger.name()),
            ];
            let pre = match &policy.pre_hook {
                Some(cmd) => run_hook("pre", cmd, policy.hook_timeout_secs, &env),
                None => Ok(()),
            };
            let taken = pre.and_then(|()| {
                self.snapshot(std::slice::from_ref(&full), false)
                    .map_err(|e| format!("snapshot {full}: {e}"))
            });
            match taken {
                Ok(_) => {
                    c[SNAPSHOTS].fetch_add(1, Ordering::Relaxed);
                    if matches!(trigger, Trigger::Event(_)) {
                        c[EVENT_SNAPSHOTS].fetch_add(1, Ordering::Relaxed);
                    }
                    run.created = Some(short);
                    let observers = self.autosnap().observers.read().clone();
                    for f in observers {
                        f(&t.name, &full);
                    }
                    if let Some(cmd) = &policy.post_hook {
                        if let Err(e) = run_hook("post", cmd, policy.hook_timeout_secs, &env) {
                            run.errors.push(e);
                        }
                    }
                }
                Err(e) => {
                    run.errors.push(format!("snapshot skipped: {e}"));
                    // Prune by what exists, without the snapshot that was not taken.
                    plan = self.plan_for(t, policy, now, force, false);
                }
            }
            // The slot is done either way: a failed hook is retried at the next slot.
            if let Err(e) = t.pool.store_policy_last_run(t.id, now) {
                run.errors.push(format!("cannot record the last run: {e}"));
            }
        }
        if !plan.destroy.is_empty() {
            let names: Vec<String> = plan.destroy.iter().map(|d| d.name.clone()).collect();
            // One txg for the whole batch: a crash applies all of it or none.
            let spec = format!("{}@{}", t.name, names.join(","));
            match self.destroy(&spec, &DestroyOptions::default()) {
                Ok(report) => {
                    c[PRUNED].fetch_add(names.len() as u64, Ordering::Relaxed);
                    c[PRUNED_BYTES].fetch_add(report.freed, Ordering::Relaxed);
                    run.freed = report.freed;
                    run.destroyed_count = names.len();
                    run.destroyed = names;
                }
                Err(e) => run
                    .errors
                    .push(format!("pruning {} snapshots: {e}", names.len())),
            }
        }
        if !run.errors.is_empty() {
            c[FAILURES].fetch_add(1, Ordering::Relaxed);
            tracing::warn!(dataset = %t.name, policy = %policy.name, errors = ?run.errors, "snapshot policy run failed");
        }
        tracing::info!(
            dataset = %t.name,
            policy = %policy.name,
            trigger = %run.trigger,
            created = ?run.created,
            destroyed = run.destroyed.len(),
            freed = run.freed,
            "snapshot policy ran"
        );
        run.plan = Some(plan);
        Some(run)
    }

    fn estimate(&self, t: &Target, names: &[String]) -> u64 {
        if names.is_empty() {
            return 0;
        }
        let opts = DestroyOptions {
            dry_run: true,
            ..Default::default()
        };
        self.destroy(&format!("{}@{}", t.name, names.join(",")), &opts)
            .map(|r| r.freed)
            .unwrap_or(0)
    }

    fn target(&self, dataset: &str) -> Result<Target> {
        let (pool, _) = split_dataset(dataset)?;
        let p = self.pool(pool)?;
        let rec = p.datasets.read().get(dataset).cloned();
        match rec {
            Some(r) if r.is_snapshot() => Err(Error::InvalidArgument(format!(
                "'{dataset}' is a snapshot: policies apply to datasets"
            ))),
            Some(_) => targets_of(&p, Some(dataset)).pop().ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "'{dataset}' holds no data: policies apply to volumes"
                ))
            }),
            None => Err(Error::NotFound(format!("dataset '{dataset}'"))),
        }
    }

    /// `cistern policy list`.
    pub fn policies(&self) -> Vec<PolicyInfo> {
        let mut users: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut extra: BTreeMap<String, PolicyView> = BTreeMap::new();
        for t in self.all_targets(None) {
            if let Ok(Some(p)) = self.resolve_policy(&t) {
                if p.origin == "schedule property" {
                    extra.entry(p.name.clone()).or_insert_with(|| (&p).into());
                }
                users.entry(p.name).or_default().push(t.name);
            }
        }
        let policies = self.autosnap().policies.read();
        policies
            .by_name
            .values()
            .map(PolicyView::from)
            .chain(extra.into_values())
            .map(|v| PolicyInfo {
                datasets: users.remove(&v.name).unwrap_or_default(),
                policy: v,
            })
            .collect()
    }

    /// `cistern policy show DATASET`.
    pub fn policy_show(&self, dataset: &str) -> Result<PolicyShow> {
        let t = self.target(dataset)?;
        let (property, source) = match &t.props.chosen {
            Some((p, v, s)) => (Some(format!("{p}={v}")), Some(s.clone())),
            None => (None, None),
        };
        let mut show = PolicyShow {
            dataset: dataset.to_string(),
            policy: None,
            property,
            source,
            error: None,
            last_run: t.pool.policy_last_run(t.id)?,
            plan: None,
        };
        match self.resolve_policy(&t) {
            Ok(Some(p)) => {
                show.plan = Some(self.plan_for(&t, &p, now_secs(), false, true));
                show.policy = Some((&p).into());
            }
            Ok(None) => {}
            Err(e) => show.error = Some(e),
        }
        Ok(show)
    }

    /// `cistern policy run [-n] DATASET`: take a snapshot now and prune.
    pub fn policy_run(&self, dataset: &str, dry_run: bool) -> Result<PolicyRun> {
        let _run = self.autosnap().run.lock();
        let t = self.target(dataset)?;
        let policy = self
            .resolve_policy(&t)
            .map_err(Error::InvalidArgument)?
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "no snapshot policy applies to '{dataset}': set {} or {}",
                    props::SNAPSHOT_POLICY,
                    props::SNAPSHOT_SCHEDULE
                ))
            })?;
        let run = self
            .apply(&t, &policy, now_secs(), Trigger::Manual, dry_run)
            .ok_or_else(|| Error::Io("policy run did nothing".into()))?;
        if !dry_run {
            self.record(&t.pool, run.clone());
        }
        Ok(run)
    }

    /// `cistern policy history [DATASET]`: the latest runs of every
    /// imported pool (kept on each pool), oldest first.
    pub fn policy_history(&self, dataset: Option<&str>) -> Vec<PolicyRun> {
        let pools: Vec<_> = match dataset.map(split_dataset) {
            Some(Ok((pool, _))) => self.pool(pool).into_iter().collect(),
            Some(Err(_)) => Vec::new(),
            None => self.inner.pools.read().values().cloned().collect(),
        };
        let mut out: Vec<(i64, usize, PolicyRun)> = Vec::new();
        for p in pools {
            match read_runs(&p) {
                Ok(runs) => out.extend(
                    runs.into_iter()
                        .filter(|r| dataset.is_none_or(|d| d == r.dataset))
                        .enumerate()
                        .map(|(i, r)| (r.time, i, r)),
                ),
                Err(e) => {
                    tracing::warn!(pool = %p.pool.name, error = %e, "cannot read the policy history")
                }
            }
        }
        // By time; within a pool in the order recorded.
        out.sort_by_key(|(t, i, _)| (*t, *i));
        out.into_iter().map(|(_, _, r)| r).collect()
    }

    /// Gives a snapshot's properties `cistern:auto` (read-only): the name of
    /// the policy that made it and will prune it (its dataset's policy,
    /// whose prefix the name has), else `-` (manual: never pruned). `cache`
    /// keeps each dataset's policy for a listing of many snapshots.
    pub(crate) fn add_auto_property(
        &self,
        datasets: &BTreeMap<String, DatasetRecord>,
        info: &mut DatasetInfo,
        cache: &mut HashMap<String, Option<Policy>>,
    ) {
        let value = self.auto_mark(datasets, &info.name, cache);
        info.properties.retain(|p| p.name != AUTO_PROPERTY);
        info.properties.push(Property {
            name: AUTO_PROPERTY.into(),
            parsable: value.clone(),
            value,
            source: "-".into(),
        });
    }

    fn auto_mark(
        &self,
        datasets: &BTreeMap<String, DatasetRecord>,
        snapshot: &str,
        cache: &mut HashMap<String, Option<Policy>>,
    ) -> String {
        let Some((ds, short)) = snapshot.split_once('@') else {
            return "-".into();
        };
        let policy = cache.entry(ds.to_string()).or_insert_with(|| {
            datasets
                .get(ds)
                .and_then(|rec| self.policy_of(datasets, rec))
        });
        match policy {
            Some(p) if p.is_automatic(short) => p.name.clone(),
            _ => "-".into(),
        }
    }

    pub fn policy_counters(&self) -> PolicyCounters {
        let c = &self.autosnap().counters;
        PolicyCounters {
            snapshots: c[SNAPSHOTS].load(Ordering::Relaxed),
            failures: c[FAILURES].load(Ordering::Relaxed),
            pruned: c[PRUNED].load(Ordering::Relaxed),
            pruned_bytes: c[PRUNED_BYTES].load(Ordering::Relaxed),
            event_snapshots: c[EVENT_SNAPSHOTS].load(Ordering::Relaxed),
            events_deferred: c[EVENTS_DEFERRED].load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{EngineConfig, GroupKind, GroupSpec, PoolSpec};
    use meta::redb::ReadableDatabase;
    use policy::PolicyConfig;

    fn engine_with_volume(dir: &std::path::Path) -> Arc<Engine> {
        let engine = Engine::open(
            &dir.join("state"),
            EngineConfig {
                txg_timeout_secs: 3600.0,
                policy_tick_secs: 0.0,
                ..Default::default()
            },
        )
        .unwrap();
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
        engine.create_volume("tank/v", 8 << 20, &[]).unwrap();
        let tables = BTreeMap::from([(
            "share".to_string(),
            PolicyConfig {
                schedule: "none".into(),
                // The default grid would prune the first of two snapshots
                // 10 minutes apart in one 15-minute period.
                keep: Some("last=10".into()),
                events: Some(vec!["share-disconnect".into()]),
                event_min_interval: Some("10m".into()),
                ..Default::default()
            },
        )]);
        engine.set_policies(Policies::from_config(&tables).unwrap());
        engine
            .set_property("tank/v", props::SNAPSHOT_POLICY, "share")
            .unwrap();
        engine
    }

    fn run_at(time: i64) -> PolicyRun {
        PolicyRun {
            time,
            dataset: "tank/v".into(),
            policy: "share".into(),
            trigger: "manual".into(),
            dry_run: false,
            created: None,
            destroyed: (0..300).map(|i| format!("auto-{i}")).collect(),
            destroyed_count: 0,
            freed: 0,
            errors: vec!["x".repeat(5000)],
            plan: None,
        }
    }

    #[test]
    fn history_is_bounded_and_absent_in_older_pools() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine_with_volume(dir.path());
        let p = engine.pool("tank").unwrap();
        // A pool made before 0021: no table, no record.
        assert!(read_runs(&p).unwrap().is_empty());
        assert!(engine.policy_history(None).is_empty());
        {
            let tx = p.db().begin_read().unwrap();
            assert!(
                tx.open_table(POLICY_HISTORY).is_err(),
                "reading created the table"
            );
        }
        for t in 0..25 {
            store_run_bounded(&p, run_at(t), 10).unwrap();
        }
        let runs = read_runs(&p).unwrap();
        let times: Vec<i64> = runs.iter().map(|r| r.time).collect();
        assert_eq!(times, (15..25).collect::<Vec<_>>());
        assert_eq!(runs[0].destroyed.len(), HISTORY_NAMES);
        assert_eq!(runs[0].destroyed_count, 300);
        assert!(runs[0].errors[0].len() <= 1000);
        // Kept on the pool: export and import keep it.
        engine.export_pool("tank").unwrap();
        engine
            .import_pool("tank", &[dir.path().to_path_buf()], false)
            .unwrap();
        assert_eq!(engine.policy_history(Some("tank/v")).len(), 10);
        assert!(engine.policy_history(Some("tank/w")).is_empty());
    }

    #[test]
    fn a_reported_backup_takes_one_snapshot_per_interval() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine_with_volume(dir.path());
        let snaps = |e: &Engine| {
            e.list_datasets(Some("tank/v"))
                .unwrap()
                .into_iter()
                .filter(|d| d.name.contains('@'))
                .map(|d| d.property(AUTO_PROPERTY).unwrap().value.clone())
                .collect::<Vec<_>>()
        };
        let now = now_secs();
        // Not an event the policy takes: forgotten.
        engine.backup_finished("tank/v", EventKind::NbdDisconnect);
        engine.run_events(now);
        assert!(snaps(&engine).is_empty());
        assert!(engine.autosnap().pending.lock().is_empty());
        // The share layers' one line.
        engine.backup_finished("tank/v", EventKind::ShareDisconnect);
        engine.run_events(now);
        assert_eq!(snaps(&engine), ["share"]);
        // Again at once: deferred to the end of the interval, not taken.
        engine.backup_finished("tank/v", EventKind::ShareDisconnect);
        engine.run_events(now + 1);
        engine.run_events(now + 2);
        assert_eq!(snaps(&engine).len(), 1);
        let at = engine.autosnap().pending.lock()["tank/v"].not_before;
        assert!(at >= now + 600 && at <= now + 602, "{at} vs {now}");
        engine.run_events(at);
        assert_eq!(
            snaps(&engine),
            ["share", "share"],
            "{:?}",
            engine.policy_history(None)
        );
        let hist = engine.policy_history(None);
        assert_eq!(hist.len(), 2);
        assert!(hist.iter().all(|r| r.trigger == "share-disconnect"));
        // Unknown datasets are dropped quietly.
        engine.backup_finished("tank/gone", EventKind::ShareDisconnect);
        engine.run_events(at);
        assert!(engine.autosnap().pending.lock().is_empty());
    }
}
