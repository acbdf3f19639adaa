//! Pool events, as `zpool events`: device errors, state changes, scans,
//! import/export. In memory only (as ZFS's zevents): a bounded ring per pool,
//! kept for the life of the process, so an exported pool's last events stay
//! listed and a re-import appends to the same ring (keyed by pool guid).
//!
//! Anything that sees something happen to a pool calls [`post_event`] with a
//! class from [`class`]; `cistern pool events` lists them and `-f` follows
//! them through [`wait_after`]. Device errors and state changes that the
//! lower layers only count are posted by the engine's watcher thread, which
//! compares counters and states a few times a second (see `engine.rs`).

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

/// Event classes: ZFS's names with `zfs` replaced by `cistern`.
pub mod class {
    /// A copy or column of a block did not match its checksum.
    pub const CHECKSUM: &str = "ereport.fs.cistern.checksum";
    /// A device failed a read or a write.
    pub const IO: &str = "ereport.fs.cistern.io";
    /// The pool cannot commit (suspended): posted by whoever suspends it.
    pub const IO_FAILURE: &str = "ereport.fs.cistern.io_failure";
    /// A block could not be repaired from redundancy.
    pub const DATA: &str = "ereport.fs.cistern.data";
    /// A device or group changed state (`vdev_state`, `vdev_laststate`).
    pub const STATECHANGE: &str = "resource.fs.cistern.statechange";
    pub const POOL_CREATE: &str = "sysevent.fs.cistern.pool_create";
    pub const POOL_IMPORT: &str = "sysevent.fs.cistern.pool_import";
    pub const POOL_EXPORT: &str = "sysevent.fs.cistern.pool_export";
    pub const POOL_DESTROY: &str = "sysevent.fs.cistern.pool_destroy";
    pub const SCRUB_START: &str = "sysevent.fs.cistern.scrub_start";
    pub const SCRUB_FINISH: &str = "sysevent.fs.cistern.scrub_finish";
    pub const SCRUB_ABORT: &str = "sysevent.fs.cistern.scrub_abort";
    pub const SCRUB_PAUSED: &str = "sysevent.fs.cistern.scrub_paused";
    pub const RESILVER_START: &str = "sysevent.fs.cistern.resilver_start";
    pub const RESILVER_FINISH: &str = "sysevent.fs.cistern.resilver_finish";
    pub const VDEV_ADD: &str = "sysevent.fs.cistern.vdev_add";
    pub const VDEV_ATTACH: &str = "sysevent.fs.cistern.vdev_attach";
    pub const VDEV_REMOVE: &str = "sysevent.fs.cistern.vdev_remove";
    pub const VDEV_ONLINE: &str = "sysevent.fs.cistern.vdev_online";
    pub const VDEV_OFFLINE: &str = "sysevent.fs.cistern.vdev_offline";
    pub const VDEV_CLEAR: &str = "sysevent.fs.cistern.vdev_clear";
    pub const CONFIG_SYNC: &str = "sysevent.fs.cistern.config_sync";
}

/// Events kept per pool (ZFS: zfs_zevent_len_max, 512 by default).
pub const RING_EVENTS: usize = 1000;
/// Pools whose rings are kept; the one with the oldest last event goes first.
const MAX_RINGS: usize = 64;

/// One event: a sequence number (increasing across pools), when, what, and
/// name/value pairs (`vdev_path`, `vdev_guid`, counts...) as `zpool events -v`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Event {
    pub seq: u64,
    /// Unix seconds and nanoseconds.
    pub time: u64,
    pub nanos: u32,
    pub class: String,
    pub pool: String,
    pub pool_guid: u64,
    pub fields: BTreeMap<String, String>,
}

struct Log {
    next_seq: u64,
    rings: HashMap<u64, VecDeque<Event>>,
}

static EVENTS: LazyLock<(Mutex<Log>, Condvar)> = LazyLock::new(|| {
    (
        Mutex::new(Log {
            next_seq: 1,
            rings: HashMap::new(),
        }),
        Condvar::new(),
    )
});

/// Records an event of `class` on `pool` and wakes followers. Cheap (one
/// short lock); callable from any thread, including with pool locks held.
pub fn post_event(pool: &pool::Pool, class: &str, fields: &[(&str, String)]) {
    post(&pool.name, pool.guid, class, fields);
}

/// [`post_event`] by name and guid (for a pool no longer open).
pub fn post(pool: &str, pool_guid: u64, class: &str, fields: &[(&str, String)]) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (lock, cv) = &*EVENTS;
    let mut log = lock.lock();
    let seq = log.next_seq;
    log.next_seq += 1;
    if !log.rings.contains_key(&pool_guid) && log.rings.len() >= MAX_RINGS {
        let oldest = log
            .rings
            .iter()
            .min_by_key(|(_, r)| r.back().map_or(0, |e| e.seq))
            .map(|(g, _)| *g);
        if let Some(g) = oldest {
            log.rings.remove(&g);
        }
    }
    let ring = log.rings.entry(pool_guid).or_default();
    if ring.len() >= RING_EVENTS {
        ring.pop_front();
    }
    tracing::debug!(pool, class, ?fields, "event");
    ring.push_back(Event {
        seq,
        time: now.as_secs(),
        nanos: now.subsec_nanos(),
        class: class.to_string(),
        pool: pool.to_string(),
        pool_guid,
        fields: fields
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    });
    cv.notify_all();
}

/// Events with `seq > after` of the named pools (all when `pools` is
/// empty), oldest first.
pub fn list(after: u64, pools: &[String]) -> Vec<Event> {
    let log = EVENTS.0.lock();
    collect(&log, after, pools)
}

fn collect(log: &Log, after: u64, pools: &[String]) -> Vec<Event> {
    let mut out: Vec<Event> = log
        .rings
        .values()
        .flat_map(|r| r.iter())
        .filter(|e| e.seq > after && (pools.is_empty() || pools.contains(&e.pool)))
        .cloned()
        .collect();
    out.sort_by_key(|e| e.seq);
    out
}

/// Like [`list`], but waits up to `timeout` for at least one event (what
/// `pool events -f` polls with).
pub fn wait_after(after: u64, pools: &[String], timeout: Duration) -> Vec<Event> {
    let deadline = Instant::now() + timeout;
    let (lock, cv) = &*EVENTS;
    let mut log = lock.lock();
    loop {
        let found = collect(&log, after, pools);
        if !found.is_empty() || cv.wait_until(&mut log, deadline).timed_out() {
            return if found.is_empty() {
                collect(&log, after, pools)
            } else {
                found
            };
        }
    }
}

/// The sequence number of the newest event (0 if none): `-f` without
/// history starts after it.
pub fn last_seq() -> u64 {
    EVENTS.0.lock().next_seq - 1
}

/// `pool events -c`: forgets the events of the named pools (all when
/// empty); returns how many were dropped.
pub fn clear(pools: &[String]) -> usize {
    let mut log = EVENTS.0.lock();
    let mut n = 0;
    for ring in log.rings.values_mut() {
        let before = ring.len();
        ring.retain(|e| !(pools.is_empty() || pools.contains(&e.pool)));
        n += before - ring.len();
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_is_bounded_and_ordered() {
        let guid = 0xfeed_0001;
        let name = "events-test-ring".to_string();
        for i in 0..RING_EVENTS + 10 {
            post(&name, guid, class::CHECKSUM, &[("n", i.to_string())]);
        }
        let got = list(0, std::slice::from_ref(&name));
        assert_eq!(got.len(), RING_EVENTS);
        assert_eq!(got[0].fields["n"], "10");
        assert!(got.windows(2).all(|w| w[0].seq < w[1].seq));
        assert_eq!(clear(std::slice::from_ref(&name)), RING_EVENTS);
        assert!(list(0, &[name]).is_empty());
    }

    #[test]
    fn wait_returns_a_new_event_at_once() {
        let name = "events-test-wait".to_string();
        let after = last_seq();
        let t = std::thread::spawn({
            let name = name.clone();
            move || {
                std::thread::sleep(Duration::from_millis(50));
                post(&name, 0xfeed_0002, class::SCRUB_START, &[]);
            }
        });
        let start = Instant::now();
        let got = wait_after(after, std::slice::from_ref(&name), Duration::from_secs(5));
        assert_eq!(got.len(), 1);
        assert!(start.elapsed() < Duration::from_secs(2));
        t.join().unwrap();
        // Nothing new: returns empty after the timeout.
        let last = got[0].seq;
        assert!(wait_after(last, &[name], Duration::from_millis(20)).is_empty());
    }
}
