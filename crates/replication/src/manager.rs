//! The jobs in the daemon: declared in the config or added with the CLI
//! (those are kept in `STATE_DIR/replication.json`, written atomically, so
//! they survive restarts and kill -9, as the API token and the S3 users
//! are), a scheduler thread (intervals, after-snapshot triggers, retries
//! with backoff), one run at a time per job, status, pool events and
//! Prometheus metrics.

use crate::job::{self, Direction, Job, JobConfig, Schedule};
use crate::run::{self, Ctx};
use crate::side::{Local, RemoteSide, Side};
use crate::stream::Progress;
use crate::{now_secs, Error, Result};
use dataset::policy::Policies;
use dataset::Engine;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// The file in the state directory.
pub const STATE_FILE: &str = "replication.json";
const STATE_VERSION: u32 = 1;
/// Runs kept per job in its history.
pub const HISTORY_LEN: usize = 20;
/// Longest wait between retries.
const RETRY_MAX_SECS: f64 = 3600.0;
/// How often the scheduler looks.
const TICK: Duration = Duration::from_millis(200);

/// Event classes posted on the local dataset's pool (`cistern pool events`).
pub mod class {
    pub const START: &str = "sysevent.fs.cistern.replication_start";
    pub const FINISH: &str = "sysevent.fs.cistern.replication_finish";
    pub const FAIL: &str = "sysevent.fs.cistern.replication_fail";
}

/// One run, as `replication status` and the history show it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub start: i64,
    pub end: i64,
    /// `manual`, `schedule`, `after-snapshot`, `retry`.
    pub trigger: String,
    /// `ok`, `up-to-date` or `failed`.
    pub result: String,
    #[serde(default)]
    pub streams: Vec<String>,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub common: Option<String>,
    #[serde(default)]
    pub resumed: bool,
    #[serde(default)]
    pub pruned_source: Vec<String>,
    #[serde(default)]
    pub pruned_target: Vec<String>,
    #[serde(default)]
    pub error: Option<String>,
    /// `Diverged` when the target was refused.
    #[serde(default)]
    pub error_kind: Option<String>,
    #[serde(default)]
    pub notes: Vec<String>,
}

/// A transfer in progress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProgressView {
    pub stream: String,
    pub bytes: u64,
    /// Estimated size of what is being sent (0: unknown).
    pub total: u64,
    pub rate: f64,
    pub eta_secs: Option<u64>,
    pub started: i64,
}

/// `replication list|status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub name: String,
    pub direction: Direction,
    pub source: String,
    pub target: String,
    pub schedule: String,
    pub policy: Option<String>,
    pub source_policy: Option<String>,
    /// Bytes per second.
    pub bwlimit: Option<u64>,
    /// `config` or `cli`.
    pub origin: String,
    /// `running`, `paused`, `failing`, `ok`, `never run`.
    pub state: String,
    pub paused: bool,
    /// The snapshot both sides hold for this job.
    pub last_common: Option<String>,
    pub last_success: Option<i64>,
    pub last_attempt: Option<i64>,
    /// Failed runs in a row.
    pub failures: u32,
    pub last_error: Option<String>,
    pub next_run: Option<i64>,
    pub bytes_total: u64,
    pub progress: Option<ProgressView>,
    pub history: Vec<RunRecord>,
}

/// `POST /v1/replication/{job}/run`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunRequest {
    /// Roll back (or replace) a target changed since the last common snapshot.
    pub force: bool,
    /// Return at once; the run goes on in the background.
    pub no_wait: bool,
}

/// What is kept per job across restarts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
struct Stored {
    /// Added with the CLI (None: declared in the config file).
    config: Option<JobConfig>,
    paused: bool,
    last_common: Option<String>,
    last_success: Option<i64>,
    last_attempt: Option<i64>,
    failures: u32,
    last_error: Option<String>,
    bytes_total: u64,
    runs_ok: u64,
    runs_failed: u64,
    history: VecDeque<RunRecord>,
    /// A full stream into the target started and has not ended.
    partial_full: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct StoreFile {
    version: u32,
    jobs: BTreeMap<String, Stored>,
}

struct Entry {
    job: Job,
    stored: Stored,
    running: Option<Arc<Progress>>,
    /// A trigger waiting for the scheduler (after-snapshot, a `run --no-wait`).
    pending: Option<(String, bool)>,
    bytes: Arc<AtomicU64>,
}

impl Entry {
    fn next_run(&self) -> Option<i64> {
        if self.stored.paused {
            return None;
        }
        if self.pending.is_some() {
            return Some(now_secs());
        }
        if self.stored.failures > 0 {
            return Some(retry_at(&self.job, &self.stored));
        }
        match self.job.schedule {
            Schedule::Every(s) => Some(
                self.stored
                    .last_attempt
                    .map_or(now_secs(), |t| t + s as i64),
            ),
            _ => None,
        }
    }
}

fn retry_at(job: &Job, s: &Stored) -> i64 {
    let n = s.failures.saturating_sub(1).min(30);
    let wait = (job.retry_secs * 2f64.powi(n as i32)).min(RETRY_MAX_SECS);
    s.last_attempt.unwrap_or(0) + wait.ceil() as i64
}

pub struct Manager {
    engine: Arc<Engine>,
    path: PathBuf,
    policies: Policies,
    jobs: Mutex<BTreeMap<String, Entry>>,
    /// Serializes writes of the state file.
    save_lock: Mutex<()>,
    stop: AtomicBool,
    me: Weak<Manager>,
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Io(format!("{what} {}: {e}", path.display()))
}

impl Manager {
    /// Loads the CLI-added jobs from `state_dir` and checks the config's.
    /// A config job with a bad table stops the daemon (as a bad policy does).
    pub fn open(
        engine: Arc<Engine>,
        state_dir: &Path,
        declared: &BTreeMap<String, JobConfig>,
        policies: Policies,
    ) -> Result<Arc<Manager>> {
        let path = state_dir.join(STATE_FILE);
        let file: StoreFile = match std::fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map_err(|e| Error::Io(format!("{} is damaged: {e}", path.display())))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => StoreFile::default(),
            Err(e) => return Err(io_err("cannot read", &path, e)),
        };
        if file.version > STATE_VERSION {
            return Err(Error::Io(format!(
                "{} has version {}; this build knows {STATE_VERSION}",
                path.display(),
                file.version
            )));
        }
        let mut jobs = BTreeMap::new();
        for (name, c) in declared {
            let job = job::check(name, c, &policies, true)
                .map_err(|e| Error::Invalid(format!("[replication.{name}]: {e}")))?;
            let mut stored = file.jobs.get(name).cloned().unwrap_or_default();
            stored.config = None;
            jobs.insert(name.clone(), entry(job, stored));
        }
        for (name, stored) in &file.jobs {
            let Some(c) = &stored.config else { continue };
            if jobs.contains_key(name) {
                tracing::warn!(job = %name, "replication job added with the CLI is also in the config; the config wins");
                continue;
            }
            match job::check(name, c, &policies, false) {
                Ok(job) => {
                    jobs.insert(name.clone(), entry(job, stored.clone()));
                }
                Err(e) => tracing::error!(job = %name, error = %e, "replication job not loaded"),
            }
        }
        let m = Arc::new_cyclic(|me| Manager {
            engine,
            path,
            policies,
            jobs: Mutex::new(jobs),
            save_lock: Mutex::new(()),
            stop: AtomicBool::new(false),
            me: me.clone(),
        });
        Ok(m)
    }

    /// Starts the scheduler thread and the after-snapshot hook.
    pub fn start(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        self.engine
            .on_auto_snapshot(Arc::new(move |dataset: &str, _snapshot: &str| {
                if let Some(m) = weak.upgrade() {
                    m.snapshot_taken(dataset);
                }
            }));
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("replication".into())
            .spawn(move || loop {
                std::thread::sleep(TICK);
                let Some(m) = weak.upgrade() else { return };
                if m.stop.load(Ordering::Relaxed) {
                    return;
                }
                m.tick();
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the replication scheduler");
        }
    }

    /// Stops starting runs (runs in progress end on their own or at exit;
    /// an interrupted receive resumes at the next start).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    fn snapshot_taken(&self, dataset: &str) {
        let mut jobs = self.jobs.lock();
        for e in jobs.values_mut() {
            if e.job.schedule == Schedule::AfterSnapshot
                && e.job.direction == Direction::Push
                && e.job.local == dataset
                && !e.stored.paused
            {
                e.pending.get_or_insert(("after-snapshot".into(), false));
            }
        }
    }

    fn tick(&self) {
        let now = now_secs();
        let due: Vec<(String, String, bool)> = {
            let mut jobs = self.jobs.lock();
            let mut due = Vec::new();
            for (name, e) in jobs.iter_mut() {
                if e.running.is_some() || e.stored.paused {
                    continue;
                }
                if let Some((trigger, force)) = e.pending.take() {
                    due.push((name.clone(), trigger, force));
                } else if e.stored.failures > 0 {
                    if now >= retry_at(&e.job, &e.stored) {
                        due.push((name.clone(), "retry".into(), false));
                    }
                } else if let Schedule::Every(s) = e.job.schedule {
                    if e.stored.last_attempt.is_none_or(|t| now >= t + s as i64) {
                        due.push((name.clone(), "schedule".into(), false));
                    }
                }
            }
            due
        };
        for (name, trigger, force) in due {
            let Some(m) = self.me.upgrade() else { return };
            let spawned = std::thread::Builder::new()
                .name(format!("repl-{name}"))
                .spawn(move || {
                    if let Err(e) = m.execute(&name, &trigger, force) {
                        tracing::debug!(job = %name, error = %e, "replication run not started");
                    }
                });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "cannot start a replication run");
            }
        }
    }

    fn sides(&self, job: &Job) -> Result<(Box<dyn Side>, Box<dyn Side>)> {
        let local: Box<dyn Side> = Box::new(Local {
            engine: self.engine.clone(),
            dataset: job.local.clone(),
        });
        let remote: Box<dyn Side> = Box::new(RemoteSide::connect(
            &job.remote.base,
            &job.remote.dataset,
            job.config.ca.as_deref(),
            job.config.token_file.as_deref(),
        )?);
        Ok(match job.direction {
            Direction::Push => (local, remote),
            Direction::Pull => (remote, local),
        })
    }

    /// Runs `name` now on this thread; Busy if it is already running.
    pub fn execute(&self, name: &str, trigger: &str, force: bool) -> Result<RunRecord> {
        let (job, last_common, partial_full, progress, bytes) = {
            let mut jobs = self.jobs.lock();
            let e = jobs
                .get_mut(name)
                .ok_or_else(|| Error::NotFound(format!("no replication job '{name}'")))?;
            if let Some(p) = &e.running {
                return Err(Error::Busy(format!(
                    "job '{name}' is running ({} sent so far)",
                    dataset::props::format_size(p.bytes.load(Ordering::Relaxed))
                )));
            }
            let p = Progress::new();
            e.running = Some(p.clone());
            (
                e.job.clone(),
                e.stored.last_common.clone(),
                e.stored.partial_full,
                p,
                e.bytes.clone(),
            )
        };
        let start = now_secs();
        self.post(&job, class::START, &[("trigger", trigger.to_string())]);
        tracing::info!(job = %name, trigger, source = %job.source_name(), target = %job.target_name(), "replication run starts");
        let mark_full = |on: bool| {
            if let Some(e) = self.jobs.lock().get_mut(name) {
                e.stored.partial_full = on;
            }
            if let Err(e) = self.save() {
                tracing::warn!(job = %name, error = %e, "cannot save the replication state");
            }
        };
        let (out, err) = match self.sides(&job) {
            Ok((src, dst)) => {
                let ctx = Ctx {
                    job: &job,
                    src: src.as_ref(),
                    dst: dst.as_ref(),
                    policies: &self.policies,
                    progress,
                    total: bytes.clone(),
                    force,
                    last_common,
                    now: start,
                    partial_full,
                    mark_full: &mark_full,
                };
                run::run(&ctx)
            }
            Err(e) => (run::Outcome::default(), Some(e)),
        };
        let rec = RunRecord {
            start,
            end: now_secs(),
            trigger: trigger.to_string(),
            result: match (&err, out.up_to_date) {
                (Some(_), _) => "failed",
                (None, true) => "up-to-date",
                (None, false) => "ok",
            }
            .into(),
            streams: out.streams.clone(),
            bytes: out.bytes,
            common: out.common.clone(),
            resumed: out.resumed,
            pruned_source: out.pruned_source.clone(),
            pruned_target: out.pruned_target.clone(),
            error: err.as_ref().map(|e| e.to_string()),
            error_kind: err.as_ref().map(|e| kind_of(e).to_string()),
            notes: out.notes.clone(),
        };
        match &err {
            None => {
                tracing::info!(job = %name, streams = ?rec.streams, bytes = rec.bytes, common = ?rec.common, pruned_source = rec.pruned_source.len(), pruned_target = rec.pruned_target.len(), "replication run finished");
                let mut f = vec![("bytes", rec.bytes.to_string())];
                if let Some(c) = &rec.common {
                    f.push(("snapshot", c.clone()));
                }
                self.post(&job, class::FINISH, &f);
            }
            Some(e) => {
                tracing::warn!(job = %name, error = %e, "replication run failed");
                self.post(&job, class::FAIL, &[("error", e.to_string())]);
            }
        }
        {
            let mut jobs = self.jobs.lock();
            if let Some(e) = jobs.get_mut(name) {
                e.running = None;
                let s = &mut e.stored;
                s.last_attempt = Some(rec.end);
                s.bytes_total = e.bytes.load(Ordering::Relaxed);
                if let Some(c) = &out.common {
                    s.last_common = Some(c.clone());
                }
                if err.is_some() {
                    s.failures += 1;
                    s.runs_failed += 1;
                    s.last_error = rec.error.clone();
                } else {
                    s.failures = 0;
                    s.runs_ok += 1;
                    s.last_error = None;
                    s.last_success = Some(rec.end);
                }
                s.history.push_back(rec.clone());
                while s.history.len() > HISTORY_LEN {
                    s.history.pop_front();
                }
            }
        }
        if let Err(e) = self.save() {
            tracing::warn!(job = %name, error = %e, "cannot save the replication state");
        }
        // A run that happened and failed is still a record (its error says why).
        Ok(rec)
    }

    fn post(&self, job: &Job, class: &str, extra: &[(&str, String)]) {
        let pool = job.local.split('/').next().unwrap_or_default();
        let Some(guid) = self
            .engine
            .list_pools()
            .into_iter()
            .find(|p| p.name == pool)
            .map(|p| p.guid)
        else {
            return;
        };
        let mut fields = vec![
            ("job", job.name.clone()),
            ("source", job.source_name()),
            ("target", job.target_name()),
        ];
        fields.extend(extra.iter().cloned());
        dataset::events::post(pool, guid, class, &fields);
    }

    /// Writes the state file atomically (temp file, fsync, rename, fsync dir).
    fn save(&self) -> Result<()> {
        let _g = self.save_lock.lock();
        let file = {
            let jobs = self.jobs.lock();
            StoreFile {
                version: STATE_VERSION,
                jobs: jobs
                    .iter()
                    .map(|(n, e)| {
                        let mut s = e.stored.clone();
                        s.config = (!e.job.from_config).then(|| e.job.config.clone());
                        (n.clone(), s)
                    })
                    .collect(),
            }
        };
        let bytes = serde_json::to_vec_pretty(&file).map_err(|e| Error::Io(e.to_string()))?;
        let tmp = self.path.with_extension("json.tmp");
        {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)
                .map_err(|e| io_err("cannot write", &tmp, e))?;
            f.write_all(&bytes)
                .and_then(|()| f.sync_all())
                .map_err(|e| io_err("cannot write", &tmp, e))?;
        }
        std::fs::rename(&tmp, &self.path)
            .map_err(|e| io_err("cannot rename into", &self.path, e))?;
        if let Some(dir) = self.path.parent() {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
        }
        Ok(())
    }

    /// `replication add`.
    pub fn add(&self, name: &str, config: JobConfig) -> Result<JobStatus> {
        let job = job::check(name, &config, &self.policies, false)?;
        {
            let mut jobs = self.jobs.lock();
            if let Some(e) = jobs.get(name) {
                return Err(Error::Exists(format!(
                    "replication job '{name}' exists{}",
                    if e.job.from_config {
                        " (in the config file)"
                    } else {
                        ""
                    }
                )));
            }
            jobs.insert(name.to_string(), entry(job, Stored::default()));
        }
        if let Err(e) = self.save() {
            self.jobs.lock().remove(name);
            return Err(e);
        }
        tracing::info!(job = name, "replication job added");
        self.status(name)
    }

    /// `replication remove`: the job's holds are released where reachable.
    pub fn remove(&self, name: &str) -> Result<Vec<String>> {
        let (job, common) = {
            let jobs = self.jobs.lock();
            let e = jobs
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("no replication job '{name}'")))?;
            if e.job.from_config {
                return Err(Error::Invalid(format!(
                    "replication job '{name}' is declared in the config file: remove it there"
                )));
            }
            if e.running.is_some() {
                return Err(Error::Busy(format!(
                    "job '{name}' is running: pause it and wait, or try again when it is done"
                )));
            }
            (e.job.clone(), e.stored.last_common.clone())
        };
        let mut notes = Vec::new();
        if let Some(c) = common {
            match self.sides(&job) {
                Ok((a, b)) => {
                    for side in [a, b] {
                        if let Err(e) = side.release(&c, &job.hold_tag()) {
                            notes.push(format!(
                                "hold {} on {}@{c} not released: {e}",
                                job.hold_tag(),
                                side.describe()
                            ));
                        }
                    }
                }
                Err(e) => notes.push(format!("holds not released: {e}")),
            }
        }
        let removed = self.jobs.lock().remove(name);
        if let Err(e) = self.save() {
            if let Some(r) = removed {
                self.jobs.lock().insert(name.to_string(), r);
            }
            return Err(e);
        }
        tracing::info!(job = name, "replication job removed");
        Ok(notes)
    }

    pub fn set_paused(&self, name: &str, paused: bool) -> Result<JobStatus> {
        {
            let mut jobs = self.jobs.lock();
            let e = jobs
                .get_mut(name)
                .ok_or_else(|| Error::NotFound(format!("no replication job '{name}'")))?;
            e.stored.paused = paused;
            if paused {
                e.pending = None;
            }
        }
        self.save()?;
        self.status(name)
    }

    /// `replication run NAME` in the background (the scheduler starts it).
    pub fn request_run(&self, name: &str, force: bool) -> Result<()> {
        let mut jobs = self.jobs.lock();
        let e = jobs
            .get_mut(name)
            .ok_or_else(|| Error::NotFound(format!("no replication job '{name}'")))?;
        if e.running.is_some() {
            return Err(Error::Busy(format!("job '{name}' is running")));
        }
        e.pending = Some(("manual".into(), force));
        Ok(())
    }

    pub fn status(&self, name: &str) -> Result<JobStatus> {
        let jobs = self.jobs.lock();
        jobs.get(name)
            .map(view)
            .ok_or_else(|| Error::NotFound(format!("no replication job '{name}'")))
    }

    pub fn list(&self) -> Vec<JobStatus> {
        self.jobs.lock().values().map(view).collect()
    }

    /// Prometheus text: `cistern_replication_*`.
    pub fn render_metrics(&self) -> String {
        let jobs = self.list();
        let mut out = String::new();
        let mut family = |name: &str, kind: &str, help: &str, rows: Vec<(String, String)>| {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            for (labels, v) in rows {
                out.push_str(&format!("{name}{labels} {v}\n"));
            }
        };
        let label = |j: &JobStatus| format!("{{job=\"{}\"}}", j.name);
        family(
            "cistern_replication_jobs",
            "gauge",
            "Replication jobs in this daemon.",
            vec![(String::new(), jobs.len().to_string())],
        );
        family(
            "cistern_replication_sent_bytes_total",
            "counter",
            "Stream bytes moved by each job (both directions).",
            jobs.iter()
                .map(|j| (label(j), j.bytes_total.to_string()))
                .collect(),
        );
        family(
            "cistern_replication_running",
            "gauge",
            "1 while a job transfers.",
            jobs.iter()
                .map(|j| (label(j), u8::from(j.progress.is_some()).to_string()))
                .collect(),
        );
        family(
            "cistern_replication_rate_bytes_per_second",
            "gauge",
            "The running transfer's rate.",
            jobs.iter()
                .map(|j| {
                    (
                        label(j),
                        format!("{:.0}", j.progress.as_ref().map_or(0.0, |p| p.rate)),
                    )
                })
                .collect(),
        );
        family(
            "cistern_replication_progress_bytes",
            "gauge",
            "Bytes of the running transfer so far.",
            jobs.iter()
                .map(|j| {
                    (
                        label(j),
                        j.progress.as_ref().map_or(0, |p| p.bytes).to_string(),
                    )
                })
                .collect(),
        );
        family(
            "cistern_replication_consecutive_failures",
            "gauge",
            "Failed runs in a row (0 after a success).",
            jobs.iter()
                .map(|j| (label(j), j.failures.to_string()))
                .collect(),
        );
        family(
            "cistern_replication_last_success_timestamp_seconds",
            "gauge",
            "When the job last succeeded (0: never).",
            jobs.iter()
                .map(|j| (label(j), j.last_success.unwrap_or(0).to_string()))
                .collect(),
        );
        let counts = self.run_counts();
        family(
            "cistern_replication_runs_total",
            "counter",
            "Finished runs by result.",
            counts
                .iter()
                .flat_map(|(n, ok, failed)| {
                    [
                        (format!("{{job=\"{n}\",result=\"ok\"}}"), ok.to_string()),
                        (
                            format!("{{job=\"{n}\",result=\"failed\"}}"),
                            failed.to_string(),
                        ),
                    ]
                })
                .collect(),
        );
        out
    }

    fn run_counts(&self) -> Vec<(String, u64, u64)> {
        self.jobs
            .lock()
            .iter()
            .map(|(n, e)| (n.clone(), e.stored.runs_ok, e.stored.runs_failed))
            .collect()
    }
}

fn entry(job: Job, stored: Stored) -> Entry {
    let bytes = Arc::new(AtomicU64::new(stored.bytes_total));
    Entry {
        job,
        stored,
        running: None,
        pending: None,
        bytes,
    }
}

pub fn kind_of(e: &Error) -> &'static str {
    match e {
        Error::Invalid(_) => "InvalidArgument",
        Error::NotFound(_) => "NotFound",
        Error::Exists(_) => "AlreadyExists",
        Error::Busy(_) => "Busy",
        Error::Diverged(_) => "Diverged",
        Error::Unsupported(_) => "Unsupported",
        Error::Remote(_) => "Remote",
        Error::Engine(_) => "Engine",
        Error::Stream(_) => "Stream",
        Error::Io(_) => "Io",
    }
}

fn view(e: &Entry) -> JobStatus {
    let s = &e.stored;
    let progress = e.running.as_ref().map(|p| ProgressView {
        stream: p.what.lock().clone(),
        bytes: p.bytes.load(Ordering::Relaxed),
        total: p.total.load(Ordering::Relaxed),
        rate: p.rate(),
        eta_secs: p.eta(),
        started: p.started_unix,
    });
    let state = if e.running.is_some() {
        "running"
    } else if s.paused {
        "paused"
    } else if s.failures > 0 {
        "failing"
    } else if s.last_success.is_some() {
        "ok"
    } else {
        "never run"
    };
    JobStatus {
        name: e.job.name.clone(),
        direction: e.job.direction,
        source: e.job.source_name(),
        target: e.job.target_name(),
        schedule: e.job.schedule.to_string(),
        policy: e.job.policy.clone(),
        source_policy: e.job.source_policy.clone(),
        bwlimit: e.job.bwlimit,
        origin: if e.job.from_config { "config" } else { "cli" }.into(),
        state: state.into(),
        paused: s.paused,
        last_common: s.last_common.clone(),
        last_success: s.last_success,
        last_attempt: s.last_attempt,
        failures: s.failures,
        last_error: s.last_error.clone(),
        next_run: e.next_run(),
        bytes_total: e.bytes.load(Ordering::Relaxed),
        progress,
        history: s.history.iter().cloned().collect(),
    }
}
