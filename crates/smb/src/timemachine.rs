//! A Time Machine backup ends with a rename onto `SnapshotHistory.plist`
//! (`com.apple.TimeMachine.SnapshotHistory.plist` in the sparsebundle). The
//! POSIX layer reports renames here; a quiet period after the last one (a
//! backup renames it a few times) turns them into one event snapshot of the
//! dataset, if it has `timemachine=on`.

use dataset::Engine;
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The file whose rename marks a finished backup.
pub const MARKER: &str = "SnapshotHistory.plist";
/// However busy the renames, an event is taken this many debounce periods
/// after the first one.
const MAX_DELAY_PERIODS: u32 = 10;

/// True for `SnapshotHistory.plist` and Apple's prefixed names of it.
pub fn is_marker(name: &OsStr) -> bool {
    name.as_encoded_bytes().ends_with(MARKER.as_bytes())
}

/// Takes the event snapshot of `dataset`: through its snapshot policy when
/// one applies that takes `share-disconnect` events (the policy names it,
/// keeps the minimum interval and prunes it), else directly as
/// `DATASET@tm-YYYYMMDD-HHMMSS` (kept until destroyed). Returns the name, or
/// `None` when the policy takes it (within 100 ms, asynchronously).
pub fn take_event_snapshot(engine: &Engine, dataset: &str) -> dataset::Result<Option<String>> {
    let by_policy = engine.policy_show(dataset).is_ok_and(|show| {
        show.policy
            .is_some_and(|p| p.events.iter().any(|e| e == "share-disconnect"))
    });
    if by_policy {
        engine.backup_finished(dataset, dataset::EventKind::ShareDisconnect);
        return Ok(None);
    }
    direct_snapshot(engine, dataset).map(Some)
}

fn direct_snapshot(engine: &Engine, dataset: &str) -> dataset::Result<String> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let base = format!("{dataset}@tm-{}", stamp(secs));
    // Two backups within a second get -1, -2...
    for n in 0..10 {
        let name = match n {
            0 => base.clone(),
            n => format!("{base}-{n}"),
        };
        match engine.snapshot(std::slice::from_ref(&name), false) {
            Err(dataset::Error::AlreadyExists(_)) => continue,
            other => return other.map(|_| name),
        }
    }
    Err(dataset::Error::AlreadyExists(base))
}

/// `20261125-163757` (UTC).
fn stamp(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let (y, m, d) = dataset::policy::time::civil_from_days(days);
    let s = secs % 86400;
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        s / 3600,
        (s / 60) % 60,
        s % 60
    )
}

/// Told the name of each event snapshot taken.
pub type OnEvent = Box<dyn Fn(&str) + Send>;

/// The debouncer: a thread fed by [`Watcher::renamed`].
pub struct Watcher {
    tx: Mutex<Option<Sender<String>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

struct Pending {
    first: Instant,
    last: Instant,
}

impl Watcher {
    /// `quiet`: how long after the last marker rename the event is taken.
    /// `on_event` is told each snapshot taken (tests, logs).
    pub fn start(engine: Arc<Engine>, quiet: Duration, on_event: Option<OnEvent>) -> Arc<Watcher> {
        let (tx, rx) = channel::<String>();
        let thread = std::thread::Builder::new()
            .name("smb-timemachine".into())
            .spawn(move || {
                let mut pending: BTreeMap<String, Pending> = BTreeMap::new();
                loop {
                    let now = Instant::now();
                    let due =
                        |p: &Pending| (p.last + quiet).min(p.first + quiet * MAX_DELAY_PERIODS);
                    let wait = pending
                        .values()
                        .map(|p| due(p).saturating_duration_since(now))
                        .min()
                        .unwrap_or(Duration::from_secs(3600));
                    match rx.recv_timeout(wait) {
                        Ok(ds) => {
                            let now = Instant::now();
                            pending
                                .entry(ds)
                                .and_modify(|p| p.last = now)
                                .or_insert(Pending {
                                    first: now,
                                    last: now,
                                });
                        }
                        Err(RecvTimeoutError::Timeout) => {}
                        Err(RecvTimeoutError::Disconnected) => break,
                    }
                    let now = Instant::now();
                    let fire: Vec<String> = pending
                        .iter()
                        .filter(|(_, p)| due(p) <= now)
                        .map(|(d, _)| d.clone())
                        .collect();
                    for ds in fire {
                        pending.remove(&ds);
                        if let Some(name) = backup_finished(&engine, &ds) {
                            if let Some(f) = &on_event {
                                f(&name);
                            }
                        }
                    }
                }
                if !pending.is_empty() {
                    tracing::info!(
                        datasets = ?pending.keys().collect::<Vec<_>>(),
                        "stopping: Time Machine events not yet due are dropped"
                    );
                }
            })
            .ok();
        if thread.is_none() {
            tracing::error!("cannot start the Time Machine event thread: no event snapshots");
        }
        Arc::new(Watcher {
            tx: Mutex::new(thread.is_some().then_some(tx)),
            thread: Mutex::new(thread),
        })
    }

    /// Called by the POSIX layer for a rename in `dataset` whose new name is
    /// `target`; cheap unless the name is the marker.
    pub fn renamed(&self, dataset: &str, target: &OsStr) {
        if !is_marker(target) {
            return;
        }
        if let Ok(tx) = self.tx.lock() {
            if let Some(tx) = tx.as_ref() {
                let _ = tx.send(dataset.to_string());
            }
        }
    }

    /// Ends the thread (pending events are dropped).
    pub fn stop(&self) {
        if let Ok(mut tx) = self.tx.lock() {
            tx.take();
        }
        let handle = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// The quiet period has passed: snapshot if the dataset still is a Time
/// Machine destination.
fn backup_finished(engine: &Engine, dataset: &str) -> Option<String> {
    let on = engine
        .dataset(dataset)
        .ok()
        .and_then(|d| d.property("timemachine").map(|p| p.parsable == "on"))
        .unwrap_or(false);
    if !on {
        tracing::debug!(
            dataset,
            "SnapshotHistory.plist renamed outside a timemachine dataset"
        );
        return None;
    }
    match take_event_snapshot(engine, dataset) {
        Ok(Some(name)) => {
            tracing::info!(snapshot = %name, "Time Machine backup finished: event snapshot");
            Some(name)
        }
        Ok(None) => {
            tracing::info!(
                dataset,
                "Time Machine backup finished: event passed to the snapshot policy"
            );
            None
        }
        Err(e) => {
            tracing::warn!(dataset, error = %e, "Time Machine backup finished but the event snapshot failed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_and_stamps() {
        assert!(is_marker(OsStr::new("SnapshotHistory.plist")));
        assert!(is_marker(OsStr::new(
            "com.apple.TimeMachine.SnapshotHistory.plist"
        )));
        assert!(!is_marker(OsStr::new("SnapshotHistory.plist.tmp")));
        assert!(!is_marker(OsStr::new("Info.plist")));
        assert_eq!(stamp(1_795_624_677), "20261125-163757");
    }
}
