//! Pool health (decision 0012): suspension of a pool whose commits fail,
//! with ZFS's `failmode`; the pool properties (`cistern pool get/set`); the
//! fault manager that takes failing, vanished and shrunken devices out of
//! service as zed does; and the `status:`/`action:` text of `pool status`.
//!
//! - **Suspension.** A txg commit or intent-log write that fails with an
//!   I/O error suspends the pool with its cause. The sync thread stops
//!   trying; `failmode=wait` (default): writes, FLUSH and FUA wait until
//!   `cistern pool clear` resumes the pool (nothing is acknowledged that is
//!   not on stable storage); `failmode=continue`: they fail with EIO at
//!   once. Reads go on either way. `pool clear` reopens the metadata store,
//!   rebuilds the space map from it and retries the commit.
//! - **Fault manager.** Once a second: a device whose path is gone or names
//!   another file is REMOVED, one shorter than its label says is FAULTED,
//!   and one with `IO_ERRORS_N` read/write errors within `IO_ERRORS_T` is
//!   FAULTED (zed's SERD defaults: 10 errors in 10 minutes) unless it holds
//!   the last good copy, when it is DEGRADED instead. Error counters that
//!   grew are logged once a minute per device, never per block.

use crate::props::format_size;
use crate::txg::{meta_err, ImportedPool};
use crate::{Error, Property, Result};
use meta::schema::POOL_PROPS;
use parking_lot::{Condvar, Mutex, RwLock};
use pool::{DeviceState, RateLog};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// I/O errors (read + write) within `IO_ERRORS_T` that fault a device.
pub const IO_ERRORS_N: u64 = 10;
pub const IO_ERRORS_T: Duration = Duration::from_secs(600);
/// How often the fault manager looks at the devices.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// A failing commit is logged once, then at most once per this interval.
const COMMIT_LOG_EVERY: Duration = Duration::from_secs(30);

/// What a suspended pool does with new writes and flushes (ZFS `failmode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailMode {
    /// Block until `pool clear` resumes the pool.
    #[default]
    Wait,
    /// Fail them with EIO; reads go on.
    Continue,
}

impl FailMode {
    fn as_str(self) -> &'static str {
        match self {
            FailMode::Wait => "wait",
            FailMode::Continue => "continue",
        }
    }
}

/// Pool properties kept in the metadata store (`POOL_PROPS`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolProps {
    pub failmode: FailMode,
    /// Stored and shown; spare handling does not exist yet.
    pub autoreplace: bool,
    pub comment: String,
    /// Names set locally (the others show source `default`).
    pub local: Vec<String>,
}

/// Properties `cistern pool set` accepts.
pub const POOL_SETTABLE: &[&str] = &["failmode", "autoreplace", "comment"];

impl PoolProps {
    fn set(&mut self, name: &str, value: &str) -> Result<String> {
        let v = match name {
            "failmode" => {
                self.failmode = match value {
                    "wait" => FailMode::Wait,
                    "continue" => FailMode::Continue,
                    "panic" => {
                        return Err(Error::InvalidArgument(
                            "failmode=panic is not supported (use wait or continue)".into(),
                        ))
                    }
                    _ => {
                        return Err(Error::InvalidArgument(format!(
                            "bad failmode '{value}': must be 'wait' or 'continue'"
                        )))
                    }
                };
                value.to_string()
            }
            "autoreplace" => {
                self.autoreplace = match value {
                    "on" => true,
                    "off" => false,
                    _ => {
                        return Err(Error::InvalidArgument(format!(
                            "bad autoreplace '{value}': must be 'on' or 'off'"
                        )))
                    }
                };
                value.to_string()
            }
            "comment" => {
                if value.len() > 32 || value.chars().any(|c| c.is_control()) {
                    return Err(Error::InvalidArgument(
                        "comment must be at most 32 printable characters".into(),
                    ));
                }
                self.comment = value.to_string();
                value.to_string()
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "property '{name}' is read-only or unknown (settable: {})",
                    POOL_SETTABLE.join(", ")
                )))
            }
        };
        if !self.local.iter().any(|l| l == name) {
            self.local.push(name.to_string());
        }
        Ok(v)
    }
}

/// Why a pool is suspended.
#[derive(Debug, Clone)]
pub struct Suspension {
    pub cause: String,
}

/// Per-device I/O error history of the fault manager.
#[derive(Default)]
struct Serd {
    /// Counter totals (read + write, checksum) seen last time.
    last: (u64, u64),
    /// (when, I/O errors added then), within IO_ERRORS_T.
    recent: VecDeque<(Instant, u64)>,
    /// Counter totals at the last log line (one line a minute).
    logged: (u64, u64, u64),
    logged_at: Option<Instant>,
}

/// One per imported pool (a field of [`ImportedPool`]).
pub struct Health {
    suspended: Mutex<Option<Suspension>>,
    pub(crate) resumed: Condvar,
    pub props: RwLock<PoolProps>,
    commit_log: RateLog,
    serd: Mutex<HashMap<u64, Serd>>,
    stop: Mutex<bool>,
    stop_cv: Condvar,
}

impl Health {
    pub(crate) fn new(props: PoolProps) -> Health {
        Health {
            suspended: Mutex::new(None),
            resumed: Condvar::new(),
            props: RwLock::new(props),
            commit_log: RateLog::new(COMMIT_LOG_EVERY),
            serd: Mutex::new(HashMap::new()),
            stop: Mutex::new(false),
            stop_cv: Condvar::new(),
        }
    }

    pub fn suspension(&self) -> Option<Suspension> {
        self.suspended.lock().clone()
    }

    pub fn failmode(&self) -> FailMode {
        self.props.read().failmode
    }
}

/// redb's own advice ("Please close and re-open the database") means
/// nothing to an operator: say what `pool clear` does instead.
pub(crate) fn plain_meta_error(e: impl std::fmt::Display) -> String {
    let s = e.to_string();
    if s.contains("Previous I/O error") {
        "an earlier metadata write failed (`cistern pool clear` retries it)".into()
    } else {
        s
    }
}

pub(crate) fn load_props(db: &meta::redb::Database) -> Result<PoolProps> {
    use meta::redb::{ReadableDatabase, ReadableTable};
    let tx = db.begin_read().map_err(meta_err)?;
    let mut props = PoolProps::default();
    let t = match tx.open_table(POOL_PROPS) {
        Ok(t) => t,
        Err(meta::redb::TableError::TableDoesNotExist(_)) => return Ok(props),
        Err(e) => return Err(meta_err(e)),
    };
    for row in t.iter().map_err(meta_err)? {
        let (k, v) = row.map_err(meta_err)?;
        // An unknown or bad stored value keeps the default (a newer build's).
        if let Err(e) = props.set(k.value(), v.value()) {
            tracing::warn!(property = k.value(), error = %e, "pool property ignored");
        }
    }
    Ok(props)
}

impl ImportedPool {
    /// Suspends the pool (commits and log writes failed with `cause`). The
    /// first suspension is logged at once, repeats at a bounded rate.
    pub(crate) fn suspend(&self, cause: &str) {
        // A bucket device fenced by its log: fail writers at once, never wait.
        self.pool.check_bucket_fence();
        let h = &self.health;
        let first = {
            let mut s = h.suspended.lock();
            let first = s.is_none();
            if first {
                *s = Some(Suspension {
                    cause: cause.to_string(),
                });
            }
            first
        };
        let mode = h.failmode();
        if mode == FailMode::Continue {
            self.log.set_failing(Some(format!(
                "pool '{}' is suspended: {cause}",
                self.pool.name
            )));
        }
        if first {
            h.commit_log.reset(&self.pool.name);
            crate::events::post_event(
                &self.pool,
                crate::events::class::IO_FAILURE,
                &[
                    ("cause", cause.to_string()),
                    ("failmode", mode.as_str().to_string()),
                ],
            );
        }
        if let Some(more) = h.commit_log.admit(&self.pool.name) {
            tracing::error!(
                pool = %self.pool.name,
                cause,
                failmode = mode.as_str(),
                failed_attempts_not_logged = more,
                "pool SUSPENDED: a transaction group cannot be written; {}; run `cistern pool clear {}` once the cause is gone",
                match mode {
                    FailMode::Wait => "writes and flushes wait (nothing is acknowledged that is not on stable storage)",
                    FailMode::Continue => "writes and flushes fail with EIO, reads go on",
                },
                self.pool.name
            );
        }
    }

    pub fn is_suspended(&self) -> bool {
        self.health.suspended.lock().is_some()
    }

    /// Writers and flushes call this first: with the pool suspended,
    /// failmode=wait blocks until it is resumed (or closed), continue fails.
    pub(crate) fn wait_unsuspended(&self) -> Result<()> {
        let h = &self.health;
        let mut s = h.suspended.lock();
        while let Some(susp) = s.as_ref() {
            // A pool another daemon took over never resumes here: fail at once.
            if self.is_closed() || h.failmode() == FailMode::Continue || self.pool.is_fenced() {
                return Err(Error::Io(format!(
                    "pool '{}' is suspended: {}",
                    self.pool.name, susp.cause
                )));
            }
            h.resumed.wait_for(&mut s, Duration::from_millis(200));
        }
        Ok(())
    }

    /// `cistern pool clear`: retries a suspended pool. The metadata store is
    /// reopened (redb refuses writes after a failed one) and the dataset
    /// records and space map are reloaded from it (a commit reported as
    /// failed may have landed), then the open txg is committed. The pool
    /// resumes if that works; else it stays suspended with the new cause.
    pub(crate) fn resume(&self) -> Result<()> {
        if !self.is_suspended() {
            return Ok(());
        }
        let result = (|| {
            let _meta = self.meta_lock.lock();
            self.reopen_meta_locked()?;
            self.log.resume();
            Ok(())
        })()
        .and_then(|()| self.commit_txg_resuming());
        match result {
            Ok(()) => {
                *self.health.suspended.lock() = None;
                self.log.set_failing(None);
                self.health.resumed.notify_all();
                self.request_sync();
                tracing::info!(pool = %self.pool.name, "pool resumed: transaction groups commit again");
                Ok(())
            }
            Err(e) => {
                let cause = e.to_string();
                if let Some(s) = self.health.suspended.lock().as_mut() {
                    s.cause = cause.clone();
                }
                Err(Error::Io(format!(
                    "pool '{}' is still suspended: {cause}",
                    self.pool.name
                )))
            }
        }
    }

    /// `cistern pool set PROP=VALUE POOL`.
    pub(crate) fn set_pool_property(&self, name: &str, value: &str) -> Result<()> {
        let mut next = self.health.props.read().clone();
        let stored = next.set(name, value)?;
        {
            let _meta = self.meta_lock.lock();
            let tx = self.db().begin_write().map_err(meta_err)?;
            tx.open_table(POOL_PROPS)
                .map_err(meta_err)?
                .insert(name, stored.as_str())
                .map_err(meta_err)?;
            tx.commit().map_err(meta_err)?;
        }
        let mode = next.failmode;
        *self.health.props.write() = next;
        // A suspended pool switched to continue releases its waiters now.
        if let Some(s) = self.health.suspension() {
            self.log.set_failing(match mode {
                FailMode::Continue => Some(format!(
                    "pool '{}' is suspended: {}",
                    self.pool.name, s.cause
                )),
                FailMode::Wait => None,
            });
            self.health.resumed.notify_all();
        }
        tracing::info!(pool = %self.pool.name, property = name, value, "pool property set");
        Ok(())
    }

    /// `cistern pool get all POOL`: statistics (source `-`) and the settable
    /// properties (source `default` or `local`), as zpool get.
    pub(crate) fn pool_properties(&self, health: &str) -> Vec<Property> {
        let (size, alloc) = (self.pool.size(), self.pool.allocated());
        let stat = |name: &str, value: String, parsable: String| Property {
            name: name.into(),
            value,
            parsable,
            source: "-".into(),
        };
        let cap = (alloc * 100).checked_div(size).unwrap_or(0);
        let props = self.health.props.read().clone();
        let src = |n: &str| {
            if props.local.iter().any(|l| l == n) {
                "local"
            } else {
                "default"
            }
        };
        let settable = |name: &str, value: String| Property {
            name: name.into(),
            parsable: value.clone(),
            value,
            source: src(name).into(),
        };
        vec![
            stat("size", format_size(size), size.to_string()),
            stat("capacity", format!("{cap}%"), cap.to_string()),
            stat("health", health.into(), health.into()),
            stat(
                "guid",
                self.pool.guid.to_string(),
                self.pool.guid.to_string(),
            ),
            stat(
                "free",
                format_size(size.saturating_sub(alloc)),
                size.saturating_sub(alloc).to_string(),
            ),
            stat("allocated", format_size(alloc), alloc.to_string()),
            settable(
                "autoreplace",
                if props.autoreplace { "on" } else { "off" }.into(),
            ),
            settable("failmode", props.failmode.as_str().into()),
            settable(
                "comment",
                if props.comment.is_empty() {
                    "-".into()
                } else {
                    props.comment.clone()
                },
            ),
        ]
    }

    /// Starts the fault manager thread of this pool.
    pub(crate) fn start_health_thread(self: &std::sync::Arc<Self>) -> Result<()> {
        let weak = std::sync::Arc::downgrade(self);
        let handle = std::thread::Builder::new()
            .name(format!("health-{}", self.pool.name))
            .spawn(move || loop {
                let Some(p) = weak.upgrade() else { return };
                {
                    let mut stop = p.health.stop.lock();
                    if !*stop {
                        p.health.stop_cv.wait_for(&mut stop, PROBE_EVERY);
                    }
                    if *stop {
                        return;
                    }
                }
                p.check_devices();
            })
            .map_err(|e| Error::Io(format!("cannot start the fault manager thread: {e}")))?;
        *self.health_thread.lock() = Some(handle);
        Ok(())
    }

    pub(crate) fn stop_health_thread(&self) {
        *self.health.stop.lock() = true;
        self.health.stop_cv.notify_all();
        if let Some(h) = self.health_thread.lock().take() {
            let _ = h.join();
        }
    }

    /// One round of the fault manager (see the module documentation).
    pub(crate) fn check_devices(&self) {
        let name = &self.pool.name;
        for (d, state, why) in self.pool.probe_devices() {
            tracing::error!(pool = %name, device = %d.path().display(), reason = %why, "device {}; I/O to it stops", state.as_str());
        }
        let now = Instant::now();
        let mut serd = self.health.serd.lock();
        for g in self.pool.groups() {
            let children = g.children();
            for c in &children {
                let Some(d) = &c.device else { continue };
                let e = &d.errors;
                let io = e.read.load(Ordering::Relaxed) + e.write.load(Ordering::Relaxed);
                let ck = e.checksum.load(Ordering::Relaxed);
                let s = serd.entry(c.guid).or_default();
                // Counters cleared (`pool clear`): start over.
                if io < s.last.0 || ck < s.last.1 {
                    *s = Serd::default();
                }
                let added = io - s.last.0;
                s.last = (io, ck);
                if added > 0 {
                    s.recent.push_back((now, added));
                }
                while s
                    .recent
                    .front()
                    .is_some_and(|(t, _)| now.duration_since(*t) > IO_ERRORS_T)
                {
                    s.recent.pop_front();
                }
                let window: u64 = s.recent.iter().map(|(_, n)| n).sum();
                // One line a minute per device whose counters grew.
                let (r, w) = (
                    e.read.load(Ordering::Relaxed),
                    e.write.load(Ordering::Relaxed),
                );
                if (r, w, ck) != s.logged
                    && s.logged_at
                        .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(60))
                {
                    tracing::warn!(pool = %name, device = %d.path().display(),
                        read = r - s.logged.0.min(r), write = w - s.logged.1.min(w), cksum = ck - s.logged.2.min(ck),
                        state = d.state().as_str(), "device errors since the last report");
                    s.logged = (r, w, ck);
                    s.logged_at = Some(now);
                }
                if window < IO_ERRORS_N
                    || !matches!(d.state(), DeviceState::Online)
                    || c.resilvering
                {
                    continue;
                }
                // zfs's vdev_fault: the last good copy is DEGRADED, not faulted.
                let others = children
                    .iter()
                    .filter(|o| o.guid != c.guid && !o.resilvering)
                    .filter(|o| o.device.as_ref().is_some_and(|x| pool::is_live(x)))
                    .count();
                let need = g.width() - g.kind.redundancy(g.width());
                let why = format!(
                    "{window} I/O errors in the last {} s",
                    IO_ERRORS_T.as_secs()
                );
                if others >= need {
                    self.pool.fault_device(d, why.clone());
                    tracing::error!(pool = %name, device = %d.path().display(), reason = %why, "device FAULTED; I/O to it stops");
                } else {
                    d.set_failed(DeviceState::Degraded, why.clone());
                    tracing::error!(pool = %name, device = %d.path().display(), reason = %why, "device DEGRADED: too many errors, but it holds the last good copy");
                }
            }
        }
    }

    /// The rate-limited log line of a failed commit attempt.
    pub(crate) fn log_commit_failure(&self, txg: u64, e: &Error) {
        if let Some(more) = self
            .health
            .commit_log
            .admit(&format!("{} commit", self.pool.name))
        {
            tracing::error!(pool = %self.pool.name, txg, error = %e, failed_attempts_not_logged = more, "txg commit failed");
        }
    }

    /// Text for `pool status` (`status:`, `action:`), as zpool words it, or
    /// None for a healthy pool.
    pub(crate) fn status_text(&self, data_errors: usize) -> Option<(String, String)> {
        let name = &self.pool.name;
        if let Some(s) = self.health.suspension() {
            let mode = self.health.failmode();
            return Some((
                format!(
                    "The pool is suspended: a transaction group could not be written\n\t({}).\n\tWith failmode={}, {}.",
                    s.cause,
                    mode.as_str(),
                    match mode {
                        FailMode::Wait => "writes and flushes wait; nothing is acknowledged that is\n\tnot on stable storage",
                        FailMode::Continue => "writes and flushes fail with EIO; reads go on",
                    }
                ),
                format!("Make sure the affected devices are connected and have room, then run\n\t'cistern pool clear {name}'."),
            ));
        }
        let groups = self.pool.groups();
        let mut states = Vec::new();
        for g in &groups {
            for c in g.children() {
                let st = match &c.device {
                    None => DeviceState::Unavail,
                    Some(d) => d.state(),
                };
                let counted = c.device.as_ref().is_some_and(|d| {
                    d.errors.read.load(Ordering::Relaxed)
                        + d.errors.write.load(Ordering::Relaxed)
                        + d.errors.checksum.load(Ordering::Relaxed)
                        > 0
                });
                states.push((st, c.resilvering, counted));
            }
        }
        let any = |s: DeviceState| states.iter().any(|x| x.0 == s);
        let unavail = groups.iter().any(|g| g.state() == DeviceState::Unavail);
        let replicas = if unavail {
            "There are insufficient replicas for the pool to continue functioning."
        } else {
            "Sufficient replicas exist for the pool to continue functioning in a\n\tdegraded state."
        };
        if any(DeviceState::Faulted) || any(DeviceState::Degraded) {
            return Some((
                format!("One or more devices are faulted in response to persistent errors.\n\t{replicas}"),
                format!("Replace the faulted device, or use 'cistern pool clear {name}' to mark the device\n\trepaired."),
            ));
        }
        if any(DeviceState::Removed) {
            return Some((
                format!("One or more devices has been removed.\n\t{replicas}"),
                "Online the device using 'cistern pool online' or replace the device with\n\t'cistern pool replace'.".into(),
            ));
        }
        if any(DeviceState::Unavail) {
            return Some((
                format!("One or more devices could not be opened.\n\t{replicas}"),
                "Attach the missing device and online it using 'cistern pool online', or\n\treplace it with 'cistern pool replace'.".into(),
            ));
        }
        if any(DeviceState::Offline) {
            return Some((
                format!("One or more devices has been taken offline by the administrator.\n\t{replicas}"),
                "Online the device using 'cistern pool online' or replace the device with\n\t'cistern pool replace'.".into(),
            ));
        }
        if states.iter().any(|x| x.1) {
            return Some((
                "One or more devices is currently being resilvered.  The pool will\n\tcontinue to function, possibly in a degraded state.".into(),
                "Wait for the resilver to complete.".into(),
            ));
        }
        if data_errors > 0 {
            return Some((
                "One or more devices has experienced an error resulting in data\n\tcorruption.  Applications may be affected.".into(),
                format!("Restore the file in question if possible.  Otherwise restore the\n\tentire pool from backup. 'cistern pool status -v {name}' lists the damage."),
            ));
        }
        if states.iter().any(|x| x.2) {
            return Some((
                "One or more devices has experienced an unrecoverable error.  An\n\tattempt was made to correct the error.  Applications are unaffected.".into(),
                format!("Determine if the device needs to be replaced, and clear the errors\n\tusing 'cistern pool clear {name}' or replace the device with 'cistern pool replace'."),
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::*;

    fn prop<'a>(props: &'a [Property], name: &str) -> &'a Property {
        props.iter().find(|p| p.name == name).unwrap()
    }

    /// A pool written before `pool_props` existed imports with every pool
    /// property at its default; set values persist across a reopen.
    #[test]
    fn pools_without_the_props_table_read_defaults_and_set_values_persist() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        let engine = Engine::open(&state, EngineConfig::default()).unwrap();
        engine
            .create_pool(PoolSpec {
                name: "tank".into(),
                groups: vec![GroupSpec {
                    kind: GroupKind::Disk,
                    devices: vec![dir.path().join("d0")],
                }],
                create_size: Some(128 << 20),
                force: false,
            })
            .unwrap();
        {
            // As an older build left it: no pool_props table.
            let p = engine.pool("tank").unwrap();
            let _meta = p.meta_lock.lock();
            let tx = p.db().begin_write().unwrap();
            assert!(tx.delete_table(meta::schema::POOL_PROPS).unwrap());
            tx.commit().unwrap();
        }
        engine.shutdown().unwrap();
        drop(engine);
        let engine = Engine::open(&state, EngineConfig::default()).unwrap();
        let props = engine.pool_properties("tank").unwrap();
        assert_eq!(prop(&props, "failmode").value, "wait");
        assert_eq!(prop(&props, "failmode").source, "default");
        engine
            .set_pool_property("tank", "failmode", "continue")
            .unwrap();
        let err = engine
            .set_pool_property("tank", "failmode", "panic")
            .unwrap_err();
        assert!(err.to_string().contains("not supported"), "{err}");
        engine.shutdown().unwrap();
        drop(engine);
        let engine = Engine::open(&state, EngineConfig::default()).unwrap();
        let props = engine.pool_properties("tank").unwrap();
        assert_eq!(prop(&props, "failmode").value, "continue");
        assert_eq!(prop(&props, "failmode").source, "local");
        engine.shutdown().unwrap();
    }
}
