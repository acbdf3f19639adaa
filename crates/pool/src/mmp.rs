//! One owner per pool (decision 0010): claiming a pool at import, the
//! multihost (MMP) heartbeat of its owner, and the fence that stops a daemon
//! whose pool was taken over.
//!
//! Every device has an MMP slot (`vdev::MMP_SLOT_OFFSET`). The protocol:
//! - **Holder.** At import the newest stamp that is not EXPORTED and not
//!   ours names the holder (the label's owner for pools stamped by nothing).
//!   A holder on this host that held our state directory (whose lock we now
//!   hold) or whose pid is dead is gone. Any other holder refuses the import
//!   unless forced; forced, the slots are watched for [`MmpConfig::import_wait`]
//!   and any change refuses it ("its MMP sequence advanced").
//! - **Claim.** The importer writes a CLAIM stamp on every device (the
//!   arbiter, the first present device of the layout, first), waits
//!   [`MmpConfig::claim_wait`] without writing, and owns the pool if the
//!   arbiter still shows its claim. Of several daemons claiming at once, the
//!   last to write the arbiter wins and every other sees that it lost. A
//!   claim is written at most `claim_wait / 2` after the slots were read, so
//!   a daemon that read before another's claim writes before that one checks.
//! - **Heartbeat.** The owner checks that the arbiter still shows its last
//!   stamp and writes the next sequence number to every device, every
//!   `interval` (a thread) and whenever its lease ran out.
//! - **Lease and fence.** Every write of data, metadata, log or labels first
//!   asks [`Pool::check_owner`]: it passes while the last heartbeat is less
//!   than [`MmpConfig::lease`] old, else it runs a heartbeat. A heartbeat
//!   that finds another daemon's stamp on the arbiter fences the pool: every
//!   later write fails, logged once. `lease < import_wait`, so an owner that
//!   stalled long enough for a forced import to take over stops writing
//!   before it resumes.

use crate::{Pool, PoolError};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use vdev::{MmpKind, MmpStamp, Owner, Vdev};

/// Default interval between two heartbeats (ZFS: `zfs_multihost_interval`).
pub const DEFAULT_MMP_INTERVAL: Duration = Duration::from_secs(1);
/// A forced import watches the slots this many intervals.
pub const IMPORT_INTERVALS: u32 = 5;
/// The owner writes at most this many intervals after its last heartbeat.
pub const LEASE_INTERVALS: u32 = 3;
/// Rounds of claiming before giving up (a claim read too late is retried).
const CLAIM_ATTEMPTS: usize = 3;

/// The multihost timings, all derived from one interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmpConfig {
    pub interval: Duration,
}

impl Default for MmpConfig {
    fn default() -> Self {
        MmpConfig {
            interval: DEFAULT_MMP_INTERVAL,
        }
    }
}

impl MmpConfig {
    /// How long a claimer waits before checking it still holds the arbiter.
    pub fn claim_wait(&self) -> Duration {
        self.interval
    }
    /// How long a forced import watches for a live owner's heartbeats.
    pub fn import_wait(&self) -> Duration {
        self.interval * IMPORT_INTERVALS
    }
    /// How long after a heartbeat the owner may still write without another.
    pub fn lease(&self) -> Duration {
        self.interval * LEASE_INTERVALS
    }
}

struct Held {
    owner: Owner,
    /// The last stamp we wrote.
    seq: u64,
    config: MmpConfig,
}

/// The ownership state of an imported pool.
pub(crate) struct Ownership {
    held: Mutex<Option<Held>>,
    /// The owner last written to the labels (kept after export: "last held by").
    last_owner: Mutex<Option<Owner>>,
    /// Nanoseconds after `epoch` until which writes pass without a heartbeat;
    /// u64::MAX while nobody holds the pool (a pool being created, unit tests).
    lease_until: AtomicU64,
    epoch: Instant,
    fenced: Mutex<Option<String>>,
    is_fenced: AtomicBool,
    /// Released (exported, or closed at shutdown): a late write from a
    /// reference still held somewhere must not touch devices another
    /// importer may own by now.
    released: AtomicBool,
    /// Ends the heartbeat thread (release, tests).
    stop_thread: AtomicBool,
}

impl Default for Ownership {
    fn default() -> Self {
        Ownership {
            held: Mutex::new(None),
            last_owner: Mutex::new(None),
            lease_until: AtomicU64::new(u64::MAX),
            epoch: Instant::now(),
            fenced: Mutex::new(None),
            is_fenced: AtomicBool::new(false),
            released: AtomicBool::new(false),
            stop_thread: AtomicBool::new(false),
        }
    }
}

impl Ownership {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }
    fn renew(&self, from: Instant, lease: Duration) {
        let until = from.saturating_duration_since(self.epoch) + lease;
        self.lease_until
            .store(until.as_nanos() as u64, Ordering::Release);
    }
}

/// Whether a process `pid` exists on this host (EPERM: it does, not ours).
fn pid_alive(pid: u32) -> bool {
    if pid == std::process::id() {
        return true;
    }
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks the process exists.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// A holder that cannot be writing any more: on this host, and either it
/// held the state directory whose lock `me` holds now, or its process is gone.
pub fn holder_is_gone(holder: &Owner, me: &Owner) -> bool {
    holder.hostid == me.hostid && (holder.state_dir == me.state_dir || !pid_alive(holder.pid))
}

/// The daemon that may still hold a pool: the owner of the newest stamp
/// unless it is EXPORTED, else (never stamped) `label_owner` (the owner an
/// ACTIVE label names); neither `me` nor a holder known to be gone.
pub fn live_holder<'a>(
    stamps: impl IntoIterator<Item = &'a MmpStamp>,
    label_owner: Option<&Owner>,
    me: &Owner,
) -> Option<Owner> {
    let holder = match stamps.into_iter().max_by_key(|s| s.seq) {
        Some(s) => (s.kind != MmpKind::Exported).then(|| s.owner.clone()),
        None => label_owner.cloned(),
    };
    holder.filter(|h| h.instance != me.instance && !holder_is_gone(h, me))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// What the slots of the pool's present devices say: (device, stamp).
type Slots = Vec<(Arc<Vdev>, Option<MmpStamp>)>;

impl Pool {
    fn read_slots(&self) -> Slots {
        self.devices()
            .into_iter()
            .filter(|d| crate::is_live(d))
            .map(|d| {
                let s = d
                    .read_mmp()
                    .ok()
                    .flatten()
                    .filter(|s| s.pool_guid == self.guid);
                (d, s)
            })
            .collect()
    }

    /// The device whose slot decides claims and fences: the first live one of the layout.
    fn arbiter(&self) -> Result<Arc<Vdev>, PoolError> {
        self.devices()
            .into_iter()
            .find(|d| crate::is_live(d))
            .ok_or_else(|| PoolError::GroupUnavailable {
                pool: self.name.clone(),
                group: 0,
            })
    }

    fn stamp(&self, owner: &Owner, seq: u64, kind: MmpKind) -> MmpStamp {
        MmpStamp {
            pool_guid: self.guid,
            seq,
            kind,
            time_ms: now_ms(),
            owner: owner.clone(),
        }
    }

    /// Writes `stamp` to every live device, the arbiter first; the number written.
    fn write_slots(&self, stamp: &MmpStamp) -> usize {
        let mut written = 0;
        for d in self.devices().iter().filter(|d| crate::is_live(d)) {
            match d.write_mmp(stamp) {
                Ok(()) => written += 1,
                Err(e) => {
                    tracing::warn!(pool = %self.name, device = %d.path().display(), error = %e, "MMP stamp not written")
                }
            }
        }
        written
    }

    /// Takes ownership of a pool this daemon just created (its devices carry
    /// no other daemon's stamp worth checking).
    pub fn own_new(&self, me: Owner, config: MmpConfig) -> Result<(), PoolError> {
        self.become_owner(me, 0, config)
    }

    fn become_owner(&self, me: Owner, seq: u64, config: MmpConfig) -> Result<(), PoolError> {
        let started = Instant::now();
        let stamp = self.stamp(&me, seq + 1, MmpKind::Active);
        if self.write_slots(&stamp) == 0 {
            return Err(PoolError::Ownership(format!(
                "cannot import '{}': no device took the MMP stamp",
                self.name
            )));
        }
        *self.own.last_owner.lock() = Some(me.clone());
        *self.own.held.lock() = Some(Held {
            owner: me,
            seq: seq + 1,
            config,
        });
        self.own.renew(started, config.lease());
        Ok(())
    }

    /// Imports' ownership step (see the module documentation): refuses a
    /// pool another live daemon holds (unless `force`), refuses even with
    /// `force` while its stamps move, then claims the pool. `label_owner`:
    /// who the labels say holds the pool, when they say it is ACTIVE.
    pub fn claim(
        &self,
        me: Owner,
        config: MmpConfig,
        force: bool,
        label_owner: Option<Owner>,
    ) -> Result<(), PoolError> {
        for _ in 0..CLAIM_ATTEMPTS {
            let mut slots = self.read_slots();
            let mut read_at = Instant::now();
            let stamps = slots.iter().filter_map(|(_, s)| s.as_ref());
            if let Some(h) = live_holder(stamps, label_owner.as_ref(), &me) {
                if !force {
                    return Err(PoolError::InUse {
                        pool: self.name.clone(),
                        host: h.hostname,
                        pid: h.pid,
                    });
                }
                tracing::info!(pool = %self.name, host = %h.hostname, pid = h.pid, wait_ms = config.import_wait().as_millis() as u64, "forced import: watching the MMP slots for a live owner");
                slots = self.watch(&slots, config, &h)?;
                read_at = Instant::now();
            }
            let seq = slots
                .iter()
                .filter_map(|(_, s)| s.as_ref().map(|s| s.seq))
                .max()
                .unwrap_or(0)
                + 1;
            let claim = self.stamp(&me, seq, MmpKind::Claim);
            let arbiter = self.arbiter()?;
            if read_at.elapsed() > config.claim_wait() / 2 {
                continue; // read too long ago to know nobody claimed since
            }
            arbiter.write_mmp(&claim)?;
            for (d, _) in &slots {
                if !Arc::ptr_eq(d, &arbiter) {
                    let _ = d.write_mmp(&claim);
                }
            }
            std::thread::sleep(config.claim_wait());
            return match arbiter.read_mmp()? {
                Some(s) if s.owner.instance == me.instance && s.seq == seq => {
                    self.become_owner(me, seq, config)
                }
                Some(s) => Err(PoolError::InUse {
                    pool: self.name.clone(),
                    host: s.owner.hostname,
                    pid: s.owner.pid,
                }),
                None => Err(PoolError::Ownership(format!(
                    "cannot import '{}': the MMP slot of {} did not keep the claim",
                    self.name,
                    arbiter.path().display()
                ))),
            };
        }
        Err(PoolError::Ownership(format!(
            "cannot import '{}': the MMP slots could not be read and claimed in time",
            self.name
        )))
    }

    /// Watches the slots for `import_wait`; any stamp that changes means a
    /// live owner. Returns the slots as last read.
    fn watch(&self, first: &Slots, config: MmpConfig, holder: &Owner) -> Result<Slots, PoolError> {
        let key = |s: &Option<MmpStamp>| s.as_ref().map(|s| (s.seq, s.owner.instance, s.kind));
        let deadline = Instant::now() + config.import_wait();
        let step = (config.interval / 4).max(Duration::from_millis(5));
        loop {
            std::thread::sleep(step);
            let now = self.read_slots();
            for ((d, before), (_, after)) in first.iter().zip(&now) {
                if key(before) != key(after) {
                    let owner = after.as_ref().map_or(holder, |s| &s.owner);
                    tracing::warn!(pool = %self.name, device = %d.path().display(), "import refused: the pool's MMP sequence advanced");
                    return Err(PoolError::ActiveElsewhere {
                        pool: self.name.clone(),
                        host: owner.hostname.clone(),
                        pid: owner.pid,
                        from: before.as_ref().map_or(0, |s| s.seq),
                        to: after.as_ref().map_or(0, |s| s.seq),
                    });
                }
            }
            if Instant::now() >= deadline {
                return Ok(now);
            }
        }
    }

    /// One heartbeat: the arbiter must still show our last stamp (else the
    /// pool is fenced), then the next sequence number goes to every device.
    pub fn heartbeat(&self) -> Result<(), PoolError> {
        self.beat(false)
    }

    /// `only_if_due`: skip when another writer renewed the lease meanwhile.
    fn beat(&self, only_if_due: bool) -> Result<(), PoolError> {
        let mut held = self.own.held.lock();
        let Some(h) = held.as_mut() else {
            return Ok(());
        };
        self.check_fence()?;
        if only_if_due && self.own.now() < self.own.lease_until.load(Ordering::Acquire) {
            return Ok(());
        }
        let started = Instant::now();
        let arbiter = self.arbiter()?;
        match arbiter.read_mmp() {
            Ok(Some(s)) if s.owner.instance != h.owner.instance => {
                let why = format!(
                    "pool '{}' was taken over by host {} (pid {}): its MMP stamp replaced ours on {}",
                    self.name,
                    s.owner.hostname,
                    s.owner.pid,
                    arbiter.path().display()
                );
                tracing::error!(pool = %self.name, host = %s.owner.hostname, pid = s.owner.pid, "{why}; this daemon stops writing the pool (suspended)");
                *self.own.fenced.lock() = Some(why);
                self.own.is_fenced.store(true, Ordering::Release);
                self.own.lease_until.store(0, Ordering::Release);
                return self.check_fence();
            }
            // Ours, or unreadable/blank on this device: the stamp below rewrites it.
            _ => {}
        }
        let stamp = self.stamp(&h.owner, h.seq + 1, MmpKind::Active);
        if self.write_slots(&stamp) == 0 {
            return Err(PoolError::Ownership(format!(
                "pool '{}': no device took the MMP heartbeat",
                self.name
            )));
        }
        h.seq += 1;
        self.own.renew(started, h.config.lease());
        Ok(())
    }

    fn check_fence(&self) -> Result<(), PoolError> {
        if self.own.is_fenced.load(Ordering::Acquire) {
            let why = self.own.fenced.lock().clone().unwrap_or_default();
            return Err(PoolError::Fenced(why));
        }
        if self.own.released.load(Ordering::Acquire) {
            return Err(PoolError::Fenced(format!(
                "pool '{}' was exported or closed by this daemon",
                self.name
            )));
        }
        Ok(())
    }

    /// Asked before every write: passes while the lease from the last
    /// heartbeat runs, else runs a heartbeat; fails once fenced.
    pub fn check_owner(&self) -> Result<(), PoolError> {
        self.check_fence()?;
        if self.own.now() < self.own.lease_until.load(Ordering::Acquire) {
            return Ok(());
        }
        self.beat(true)
    }

    /// A pool in a bucket is fenced by its log, not by MMP (decision 0039):
    /// once one of its devices found another owner's log record, the pool is
    /// fenced exactly as if MMP had seen a takeover. Returns whether it is.
    pub fn check_bucket_fence(&self) -> bool {
        if self.is_fenced() {
            return true;
        }
        for g in self.groups() {
            for c in g.children() {
                let why = c
                    .device
                    .as_ref()
                    .and_then(|d| d.bucket_failure())
                    .filter(|w| w.starts_with("fenced"));
                if let Some(why) = why {
                    tracing::error!(pool = %self.name, "{why}; this daemon stops writing the pool (fenced)");
                    *self.own.fenced.lock() = Some(format!("pool '{}' {why}", self.name));
                    self.own.is_fenced.store(true, Ordering::Release);
                    self.own.lease_until.store(0, Ordering::Release);
                    return true;
                }
            }
        }
        false
    }

    /// Whether another daemon took this pool over.
    pub fn is_fenced(&self) -> bool {
        self.own.is_fenced.load(Ordering::Acquire)
    }

    /// The daemon that holds the pool, or held it last.
    pub fn owner(&self) -> Option<Owner> {
        self.own.last_owner.lock().clone()
    }

    /// Starts the heartbeat thread; it ends with the pool or [`Pool::release`].
    pub fn start_mmp(self: &Arc<Self>) -> Result<(), PoolError> {
        let Some(interval) = self.own.held.lock().as_ref().map(|h| h.config.interval) else {
            return Ok(());
        };
        let weak: Weak<Pool> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name(format!("mmp-{}", self.name))
            .spawn(move || loop {
                std::thread::sleep(interval);
                let Some(pool) = weak.upgrade() else { return };
                if pool.own.held.lock().is_none()
                    || pool.is_fenced()
                    || pool.own.stop_thread.load(Ordering::Acquire)
                {
                    return;
                }
                if let Err(e) = pool.heartbeat() {
                    if !pool.is_fenced() {
                        tracing::warn!(pool = %pool.name, error = %e, "MMP heartbeat failed");
                    }
                }
            })
            .map(|_| ())
            .map_err(|e| PoolError::Ownership(format!("cannot start the MMP thread: {e}")))
    }

    /// Stops every write and heartbeat at once, stamping nothing, as if the
    /// process had died (tests that simulate kill -9 inside one process).
    pub fn halt(&self) {
        *self.own.held.lock() = None;
        *self.own.fenced.lock() = Some(format!("pool '{}' halted", self.name));
        self.own.is_fenced.store(true, Ordering::Release);
    }

    /// Stops the heartbeat thread but keeps the pool held, as a stopped
    /// (SIGSTOP) owner would look to others.
    #[cfg(test)]
    fn release_thread_for_test(&self) {
        self.own.stop_thread.store(true, Ordering::Release);
    }

    /// Gives the pool up (`pool export`): a last EXPORTED stamp, then no
    /// more heartbeats. Writes through this pool are no longer checked.
    pub fn release(&self) {
        let mut held = self.own.held.lock();
        if let Some(h) = held.take() {
            if !self.is_fenced() {
                self.write_slots(&self.stamp(&h.owner, h.seq + 1, MmpKind::Exported));
            }
            self.own.released.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LayoutKind, PoolState};
    use std::path::PathBuf;

    const FAST: MmpConfig = MmpConfig {
        interval: Duration::from_millis(40),
    };

    fn host(name: &str, hostid: u64) -> Owner {
        Owner {
            hostname: name.into(),
            hostid,
            pid: std::process::id(),
            instance: rand::random::<u64>() | 1,
            state_dir: hostid * 7,
        }
    }

    fn mirror(dir: &std::path::Path) -> Vec<PathBuf> {
        let paths: Vec<PathBuf> = (0..2).map(|i| dir.join(format!("d{i}"))).collect();
        let devs = paths
            .iter()
            .map(|p| Vdev::open_or_create(p, Some(64 << 20)).unwrap())
            .collect();
        Pool::create("tank", vec![(LayoutKind::Mirror, devs)]).unwrap();
        paths
    }

    fn open(paths: &[PathBuf]) -> Arc<Pool> {
        let devs = paths
            .iter()
            .map(|p| {
                let v = Vdev::open(p).unwrap();
                let l = v.read_label().unwrap();
                (v, l)
            })
            .collect();
        Arc::new(Pool::open(devs).unwrap())
    }

    #[test]
    fn default_timings_let_a_stalled_owner_stop_before_a_forced_import_takes_over() {
        let d = MmpConfig::default();
        assert_eq!(d.interval, Duration::from_secs(1));
        assert_eq!(d.claim_wait(), Duration::from_secs(1));
        assert_eq!(d.import_wait(), Duration::from_secs(5));
        assert_eq!(d.lease(), Duration::from_secs(3));
        // The owner's lease must end before an importer's watch can: a
        // stamp missed for import_wait means the owner stopped writing.
        assert!(d.lease() + d.interval < d.import_wait());
    }

    #[test]
    fn a_held_pool_is_refused_then_taken_with_force_only_once_its_stamps_stay_still() {
        let dir = tempfile::tempdir().unwrap();
        let paths = mirror(dir.path());
        let a = open(&paths);
        a.claim(host("a", 1), FAST, false, None).unwrap();
        a.set_exported(false).unwrap();
        a.start_mmp().unwrap();
        assert_eq!(
            a.devices()[0].read_label().unwrap().pool_state(),
            PoolState::Active
        );
        assert_eq!(
            a.devices()[0].read_label().unwrap().owner.unwrap().hostname,
            "a"
        );

        // Another host: refused without -f, naming the holder.
        let b = open(&paths);
        let err = b.claim(host("b", 2), FAST, false, None).unwrap_err();
        assert!(
            matches!(err, PoolError::InUse { ref host, .. } if host == "a"),
            "{err}"
        );
        assert!(err.to_string().contains("use -f"), "{err}");
        // With -f, while A heartbeats: its sequence advances, refused.
        let err = b.claim(host("b", 2), FAST, true, None).unwrap_err();
        assert!(matches!(err, PoolError::ActiveElsewhere { .. }), "{err}");
        assert!(!a.is_fenced());

        // A stalls (no heartbeats, as if stopped): -f takes the pool.
        a.release_thread_for_test();
        std::thread::sleep(FAST.lease());
        b.claim(host("b", 2), FAST, true, None).unwrap();
        // A wakes up: its next write finds B's stamp and is refused for good.
        let err = a.check_owner().unwrap_err();
        assert!(matches!(err, PoolError::Fenced(_)), "{err}");
        assert!(
            a.set_exported(false).is_err(),
            "a fenced pool rewrote its labels"
        );
        assert!(b.check_owner().is_ok());
        assert_eq!(
            a.devices()[0].read_mmp().unwrap().unwrap().owner.hostname,
            "b"
        );
    }

    #[test]
    fn of_daemons_claiming_at_once_exactly_one_wins() {
        let dir = tempfile::tempdir().unwrap();
        let paths = mirror(dir.path());
        for round in 0..5u64 {
            let pools: Vec<Arc<Pool>> = (0..3).map(|_| open(&paths)).collect();
            let won: Vec<bool> = std::thread::scope(|s| {
                let handles: Vec<_> = pools
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        s.spawn(move || {
                            // Same host, other state dirs, live pids: none is "gone".
                            p.claim(
                                host(&format!("d{i}"), 10 + round * 10 + i as u64),
                                FAST,
                                false,
                                None,
                            )
                            .is_ok()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(
                won.iter().filter(|w| **w).count(),
                1,
                "round {round}: {won:?}"
            );
            for (p, w) in pools.iter().zip(&won) {
                if *w {
                    p.release();
                }
            }
        }
    }

    #[test]
    fn pools_without_stamps_or_owner_in_their_labels_import_as_before() {
        let dir = tempfile::tempdir().unwrap();
        let paths = mirror(dir.path());
        // Labels as builds before decision 0010 wrote them: no state, no owner,
        // not exported; no MMP slot.
        for p in &paths {
            let v = Vdev::open(p).unwrap();
            let mut l = v.read_label().unwrap();
            (l.state, l.owner, l.exported) = (None, None, false);
            v.write_label(&l).unwrap();
            v.clear_mmp().unwrap();
            let json = serde_json::to_string(&v.read_label().unwrap()).unwrap();
            assert!(!json.contains("owner") && !json.contains("state"), "{json}");
        }
        let p = open(&paths);
        p.claim(host("new", 3), FAST, false, None).unwrap();
        p.set_exported(false).unwrap();
        let l = p.devices()[1].read_label().unwrap();
        assert_eq!(
            (l.pool_state(), l.owner.map(|o| o.hostname)),
            (PoolState::Active, Some("new".into()))
        );
    }

    #[test]
    fn a_holder_on_this_host_is_gone_when_it_held_our_state_dir_or_its_pid_died() {
        let me = host("h", 1);
        let mut other = host("h", 1);
        other.state_dir = 99;
        assert!(!holder_is_gone(&other, &me), "live pid, other state dir");
        let mut same_dir = other.clone();
        same_dir.state_dir = me.state_dir;
        assert!(
            holder_is_gone(&same_dir, &me),
            "we hold its state dir's lock now"
        );
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        other.pid = dead;
        assert!(holder_is_gone(&other, &me), "its pid is gone");
        let mut remote = other.clone();
        remote.hostid = 2;
        assert!(
            !holder_is_gone(&remote, &me),
            "another host is never assumed gone"
        );
    }
}
