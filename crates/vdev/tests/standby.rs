//! A warm standby (decision 0048) against a local-file store: it follows
//! the owner's log into its cache without writing to the store, and its
//! takeover fences the owner and applies only what it had not yet. A
//! standby that lags behind compaction rebuilds from the last checkpoint,
//! and a replay that fails after the claim can be run again (decision 0055).

use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use objstore::faults::{Faults, FaultyStore};
use objstore::OpenMode;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use vdev::bucket::{self, BucketConfig};
use vdev::compact::Policy;
use vdev::{DeviceState, Vdev};

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::wait_for;

/// The daemon's settings are global: every test of this file shares one
/// state directory (standbys differ by pool name and location).
fn state() -> &'static Path {
    static STATE: OnceLock<PathBuf> = OnceLock::new();
    STATE.get_or_init(|| {
        // Under cargo's scratch directory for integration tests, emptied at
        // each run (in /tmp, each run left its 51 MB behind).
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cistern-standby-test");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // One heartbeat at open, then none for the test's length: a crash
        // point counted in PUTs must not move with the clock.
        let config = BucketConfig {
            heartbeat_ms: Some(3_600_000),
            // Idle looks back off to 400 ms, not the default 5 s: the tests
            // wait for a standby after idle moments.
            standby_poll_max_ms: Some(400),
            ..Default::default()
        };
        bucket::configure(&dir, config);
        dir
    })
}

const SIZE: u64 = 64 << 20;

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

fn read(dev: &Vdev, offset: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    dev.read_at(offset, &mut b).expect("read");
    b
}

fn cache_has(cache: &Path, offset: u64, want: &[u8]) -> bool {
    let Ok(f) = std::fs::File::open(cache) else {
        return false;
    };
    let mut b = vec![0u8; want.len()];
    f.read_exact_at(&mut b, offset).is_ok() && b == want
}

#[test]
fn a_standby_tails_writes_nothing_and_takes_over_from_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let state = state();
    let url = format!("file://{}/store", dir.path().display());
    let owner = common::open_url(
        &url,
        &dir.path().join("owner.cache"),
        Some(SIZE),
        "owner",
        OpenMode::Create,
    );
    owner.write_at(0, &pattern(1, 8192)).unwrap();
    owner.write_at(1 << 20, &pattern(2, 3 << 20)).unwrap();
    owner.sync().unwrap();

    // A location that is not a bucket is refused with a clear error.
    let err = vdev::standby::start("tank", "/not/a/bucket").unwrap_err();
    assert!(err.contains("bucket"), "{err}");
    vdev::standby::start("tank", &url).unwrap();
    assert!(
        vdev::standby::start("tank", &url).is_err(),
        "two standbys of one pool"
    );
    let cache = bucket::cache_path(state, &url);
    // Catches up with what was there, then follows new records.
    wait_for("the standby to catch up", || {
        cache_has(&cache, 1 << 20, &pattern(2, 3 << 20))
    });
    owner.write_durable_at(40 << 20, &pattern(3, 512)).unwrap();
    wait_for("the standby to tail a new record", || {
        cache_has(&cache, 40 << 20, &pattern(3, 512))
    });
    let st = vdev::standby::status("tank").unwrap();
    assert_eq!(st.location, url);
    assert_eq!(st.size, Some(SIZE));
    assert!(st.owner.unwrap_or_default().starts_with("owner"));
    let applied = st.next_seq;
    // Written after the standby's last poll, maybe: applied at takeover.
    owner.write_at(8192, &pattern(4, 4096)).unwrap();
    owner.sync().unwrap();

    // The standby wrote nothing: every record is the owner's.
    let (store, prefix) = objstore::location::open(&url, &Default::default()).unwrap();
    let records = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(objstore::read_all(store.as_ref(), &prefix))
        .unwrap();
    assert!(records.iter().all(|r| r.owner.node == "owner"));
    assert!(applied > 1);

    // A takeover naming another location is refused; the standby stays.
    let other = format!("file://{}/elsewhere", dir.path().display());
    assert!(vdev::standby::take_over("tank", Some(&other))
        .unwrap()
        .is_err());
    assert!(vdev::standby::is_standby("tank"));
    assert!(vdev::standby::take_over("nope", None).is_none());

    let dev = vdev::standby::take_over("tank", None).unwrap().unwrap();
    assert!(!vdev::standby::is_standby("tank"));
    assert!(dev.is_bucket());
    assert_eq!(read(&dev, 0, 8192), pattern(1, 8192));
    assert_eq!(read(&dev, 1 << 20, 3 << 20), pattern(2, 3 << 20));
    assert_eq!(read(&dev, 40 << 20, 512), pattern(3, 512));
    assert_eq!(read(&dev, 8192, 4096), pattern(4, 4096));

    // The old owner is fenced: its next ship fails, nothing more is acknowledged.
    owner.write_at(0, &pattern(9, 8192)).unwrap();
    let err = owner.sync().unwrap_err().to_string();
    assert!(err.contains("fenced"), "{err}");
    assert_eq!(owner.state(), DeviceState::Faulted);
    assert!(owner.write_durable_at(0, b"late").is_err());

    // The new owner ships; a cold open of the log sees its writes.
    dev.write_durable_at(12 << 20, &pattern(5, 100)).unwrap();
    drop(dev);
    let again = common::open_url(
        &url,
        &dir.path().join("third.cache"),
        None,
        "third",
        OpenMode::Takeover,
    );
    assert_eq!(read(&again, 0, 8192), pattern(1, 8192));
    assert_eq!(read(&again, 12 << 20, 100), pattern(5, 100));
    assert_eq!(read(&again, 8192, 4096), pattern(4, 4096));
}

const MIB: usize = 1 << 20;
/// The part of the device the lag tests write and compare.
const SPAN: usize = 16 * MIB;

/// An owner on `inner` and a standby of pool `pool` reading through a
/// fault injector (to partition it), caught up with the owner's first write.
struct Lag {
    inner: Arc<dyn ObjectStore>,
    faults: Arc<Faults>,
    owner: Vdev,
    model: Vec<u8>,
    pool: &'static str,
    url: String,
    _dir: tempfile::TempDir,
}

impl Lag {
    fn new(pool: &'static str) -> Lag {
        state();
        let dir = tempfile::tempdir().unwrap();
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let faulty = Arc::new(FaultyStore::new(inner.clone()));
        let faults = faulty.faults.clone();
        let url = format!("mem://{pool}");
        let owner = common::open(
            &url,
            &inner,
            &dir.path().join("owner"),
            "owner",
            OpenMode::Create,
        )
        .unwrap();
        let mut lag = Lag {
            inner,
            faults,
            owner,
            model: vec![0u8; SPAN],
            pool,
            url,
            _dir: dir,
        };
        lag.write(0, pattern(1, 8 * MIB));
        lag.owner.sync().unwrap();
        vdev::standby::start_with_store(pool, &lag.url, faulty, ObjPath::from("pool")).unwrap();
        lag.wait_caught_up();
        lag
    }

    fn write(&mut self, offset: usize, data: Vec<u8>) {
        self.owner.write_at(offset as u64, &data).unwrap();
        self.model[offset..offset + data.len()].copy_from_slice(&data);
    }

    fn durable(&mut self, offset: usize, data: Vec<u8>) {
        self.owner.write_durable_at(offset as u64, &data).unwrap();
        self.model[offset..offset + data.len()].copy_from_slice(&data);
    }

    /// The sequence number after the owner's last record.
    fn log_end(&self) -> u64 {
        let records = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(objstore::read_all(
                self.inner.as_ref(),
                &ObjPath::from("pool"),
            ))
            .unwrap();
        records.last().map_or(1, |r| r.seq + 1)
    }

    fn record_exists(&self, seq: u64) -> bool {
        tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(objstore::read_record(
                self.inner.as_ref(),
                &ObjPath::from("pool"),
                seq,
            ))
            .unwrap()
            .is_some()
    }

    fn status(&self) -> vdev::standby::StandbyStatus {
        vdev::standby::status(self.pool).unwrap()
    }

    fn wait_caught_up(&self) {
        let end = self.log_end();
        wait_for("the standby to catch up", || {
            let s = self.status();
            s.next_seq == end && s.error.is_none()
        });
    }

    /// The owner's writes the standby misses while partitioned: a zeroed
    /// range it holds data for, an overwrite, an intent-log write; then a
    /// checkpoint that deletes every record it had not read.
    fn write_and_compact_behind(&mut self) -> u64 {
        // Partitioned: the standby reads nothing more.
        self.faults.fail_gets("", u64::MAX);
        let stalled = self.status().next_seq;
        self.write(2 * MIB, vec![0u8; MIB]);
        self.owner.sync().unwrap();
        self.write(5 * MIB, pattern(2, 2 * MIB));
        self.owner.sync().unwrap();
        self.durable(12 * MIB, pattern(3, 4096));
        let policy = Policy {
            below_percent: 50,
            interval: Duration::from_secs(3600),
            grace: Duration::ZERO,
        };
        let report = self.owner.bucket_compact(&policy, true).unwrap().unwrap();
        assert!(report.deleted_records > 0, "{report:?}");
        assert!(
            !self.record_exists(stalled),
            "the record the standby needs next was compacted away"
        );
        self.durable(13 * MIB, b"after the checkpoint".to_vec());
        stalled
    }

    fn cache_span(&self) -> Vec<u8> {
        let f = std::fs::File::open(bucket::cache_path(state(), &self.url)).unwrap();
        let mut b = vec![0u8; SPAN];
        f.read_exact_at(&mut b, 0).unwrap();
        b
    }

    fn check_taken_over(&self, dev: &Vdev) {
        assert_same(&read(dev, 0, SPAN), &self.model, "the new owner");
        assert!(!vdev::standby::is_standby(self.pool));
        let err = self
            .owner
            .write_durable_at(0, b"late")
            .unwrap_err()
            .to_string();
        assert!(err.contains("fenced"), "{err}");
    }
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        panic!("{what}: differs first at byte {at}");
    }
}

#[test]
fn a_lagging_standby_rebuilds_from_the_last_checkpoint_and_takes_over_with_every_write() {
    let mut lag = Lag::new("lagging");
    let stalled = lag.write_and_compact_behind();
    // While partitioned it errs and stays where it was: never past a hole.
    assert_eq!(lag.status().next_seq, stalled);
    lag.faults.heal_gets();
    let end = lag.log_end();
    wait_for("the standby to rebuild and catch up", || {
        let s = lag.status();
        s.rebuilds >= 1 && s.next_seq == end && s.error.is_none()
    });
    // The rebuilt cache is the owner's device, zeroed range included.
    assert_same(&lag.cache_span(), &lag.model, "the rebuilt standby cache");
    // And it tails on from there.
    lag.durable(14 * MIB, pattern(5, 4096));
    lag.wait_caught_up();
    assert_same(
        &lag.cache_span(),
        &lag.model,
        "the standby cache, tailing on",
    );
    let dev = vdev::standby::take_over(lag.pool, None).unwrap().unwrap();
    lag.check_taken_over(&dev);
}

#[test]
fn a_takeover_by_a_standby_behind_the_stored_log_rebuilds_before_it_claims() {
    let mut lag = Lag::new("behind");
    lag.write_and_compact_behind();
    // Taken over at once: the takeover itself finds the hole (the tail is
    // stopped before it probes), rebuilds from the checkpoint and claims.
    lag.faults.heal_gets();
    let dev = vdev::standby::take_over(lag.pool, None).unwrap().unwrap();
    lag.check_taken_over(&dev);
}

#[test]
fn a_standby_catching_up_across_a_checkpoint_keeps_what_it_superseded_zeroed() {
    // The checkpoint lands but nothing is deleted yet (the owner is
    // partitioned from the store right after it: every later PUT/DELETE
    // fails): the standby reads the zeroing record and the checkpoint in
    // one batch and must not let the checkpoint's image skip the zeroing.
    state();
    let dir = tempfile::tempdir().unwrap();
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let owner_store = Arc::new(FaultyStore::new(inner.clone()));
    let crash = owner_store.faults.clone();
    let owner_store: Arc<dyn ObjectStore> = owner_store;
    let sb_store = Arc::new(FaultyStore::new(inner.clone()));
    let sb_faults = sb_store.faults.clone();
    let url = "mem://across";
    let owner = common::open(
        url,
        &owner_store,
        &dir.path().join("o"),
        "owner",
        OpenMode::Create,
    )
    .unwrap();
    let mut model = vec![0u8; SPAN];
    owner.write_at(0, &pattern(1, 8 * MIB)).unwrap();
    model[..8 * MIB].copy_from_slice(&pattern(1, 8 * MIB));
    owner.sync().unwrap();
    vdev::standby::start_with_store("across", url, sb_store, ObjPath::from("pool")).unwrap();
    let cache = bucket::cache_path(state(), url);
    wait_for("the standby to catch up", || {
        cache_has(&cache, 0, &pattern(1, 8 * MIB))
    });
    sb_faults.fail_gets("", u64::MAX);
    owner.write_at(2 * MIB as u64, &vec![0u8; MIB]).unwrap();
    model[2 * MIB..3 * MIB].fill(0);
    owner.sync().unwrap();
    // The copy of the one low segment and the checkpoint land, then the
    // owner is gone (no marker, no DELETE).
    crash.crash_after(2);
    let policy = Policy {
        below_percent: 100,
        interval: Duration::from_secs(3600),
        grace: Duration::ZERO,
    };
    let r = owner.bucket_compact(&policy, true).unwrap();
    assert!(crash.crashed() && r.is_err(), "{r:?}");
    drop(owner);
    let records = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(objstore::read_all(inner.as_ref(), &ObjPath::from("pool")))
        .unwrap();
    assert_eq!(records.first().map(|r| r.seq), Some(1), "nothing deleted");
    assert!(vdev::compact::last_checkpoint(&records).unwrap().is_some());
    let end = records.last().unwrap().seq + 1;
    sb_faults.heal_gets();
    wait_for("the standby to read the checkpoint", || {
        vdev::standby::status("across").unwrap().next_seq == end
    });
    assert!(
        cache_has(&cache, 0, &model[..8 * MIB]),
        "zeroed range kept zero"
    );
    let dev = vdev::standby::take_over("across", None).unwrap().unwrap();
    assert_same(&read(&dev, 0, SPAN), &model, "the new owner");
}

#[test]
fn a_replay_that_fails_after_the_claim_is_retried_and_can_be_run_again() {
    let mut lag = Lag::new("replay");
    // Missed while partitioned: a record naming a new segment.
    lag.faults.fail_gets("", u64::MAX);
    lag.write(9 * MIB, pattern(6, 3 * MIB));
    lag.owner.sync().unwrap();
    // The replay after the claim fetches no segment (decision 0063): the
    // takeover succeeds with every segment GET failing, the reads wait.
    lag.faults.fail_gets("pool/seg", u64::MAX);
    // One replay fails (a local write): replayed again from the stored
    // log, the takeover succeeds.
    vdev::standby::fail_next_replays(lag.pool, 1);
    let dev = vdev::standby::take_over(lag.pool, None).unwrap().unwrap();
    let mut buf = vec![0u8; 4096];
    assert!(dev.read_at(9 * MIB as u64, &mut buf).is_err());
    lag.faults.heal_gets();
    lag.check_taken_over(&dev);
    drop(dev);

    let mut lag = Lag::new("replay-held");
    lag.faults.fail_gets("", u64::MAX);
    lag.write(9 * MIB, pattern(7, 3 * MIB));
    lag.owner.sync().unwrap();
    // Both replays fail: claimed (the owner is fenced) but not replayed.
    // The claim is held; the pool stays a standby here and says so.
    lag.faults.heal_gets();
    vdev::standby::fail_next_replays(lag.pool, 2);
    let err = vdev::standby::take_over(lag.pool, None)
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(err.contains("replays again"), "{err}");
    let st = lag.status();
    assert!(st.claimed && st.error.is_some(), "{st:?}");
    let late = lag
        .owner
        .write_durable_at(0, b"late")
        .unwrap_err()
        .to_string();
    assert!(late.contains("fenced"), "{late}");
    let claims_before = claims(&lag);
    // The next takeover replays without claiming again.
    let dev = vdev::standby::take_over(lag.pool, None).unwrap().unwrap();
    assert_eq!(claims(&lag), claims_before, "no second claim");
    assert_same(&read(&dev, 0, SPAN), &lag.model, "the new owner");
    assert!(!vdev::standby::is_standby(lag.pool));
}

fn claims(lag: &Lag) -> usize {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(objstore::read_all(
            lag.inner.as_ref(),
            &ObjPath::from("pool"),
        ))
        .unwrap()
        .iter()
        .filter(|r| r.kind == objstore::record::Kind::Claim)
        .count()
}

/// Bytes the cache file holds on disk (st_blocks).
fn allocated(cache: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(cache).unwrap().blocks() * 512
}

/// Decision 0063: a standby's cache is bounded too. It holds the owner's
/// newest writes (fetched ahead, up to half the bound) and stays under the
/// bound however much the owner writes; a takeover hands that bounded
/// cache to the new owner, which serves the newest writes without a fetch
/// and everything else on demand, still under the bound.
#[test]
fn a_bounded_standby_keeps_the_newest_writes_and_hands_its_cache_over() {
    const BOUND: u64 = 8 << 20;
    // The local MMP slot's line and lines of inline bytes are never evicted.
    const SLACK: u64 = 4 << 20;
    state();
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let url = "mem://bounded";
    let owner = common::open(
        url,
        &store,
        &dir.path().join("o"),
        "owner",
        OpenMode::Create,
    )
    .unwrap();
    let mut model = vec![0u8; 48 * MIB];
    for i in 0..40 {
        let data = pattern(i as u8, MIB);
        owner.write_at((i * MIB) as u64, &data).unwrap();
        model[i * MIB..(i + 1) * MIB].copy_from_slice(&data);
        if i % 4 == 3 {
            owner.sync().unwrap();
        }
    }
    vdev::standby::start_bounded(
        "bounded",
        url,
        store.clone(),
        ObjPath::from("pool"),
        bucket::CacheBound::Bytes(BOUND),
    )
    .unwrap();
    let cache = bucket::cache_path(state(), url);
    let caught_up = |end: u64| {
        wait_for("the standby to catch up", || {
            let s = vdev::standby::status("bounded").unwrap();
            s.next_seq == end && s.error.is_none()
        })
    };
    let log_end = || {
        let records = tokio::runtime::Runtime::new()
            .unwrap()
            .block_on(objstore::read_all(store.as_ref(), &ObjPath::from("pool")))
            .unwrap();
        records.last().map_or(1, |r| r.seq + 1)
    };
    caught_up(log_end());
    assert!(allocated(&cache) <= BOUND + SLACK, "{}", allocated(&cache));
    // New writes: the standby fetches them ahead and evicts older lines.
    for i in 40..44 {
        let data = pattern(i as u8, MIB);
        owner.write_at((i * MIB) as u64, &data).unwrap();
        model[i * MIB..(i + 1) * MIB].copy_from_slice(&data);
    }
    owner.sync().unwrap();
    owner
        .write_durable_at((46 * MIB) as u64, b"intent")
        .unwrap();
    model[46 * MIB..46 * MIB + 6].copy_from_slice(b"intent");
    caught_up(log_end());
    assert!(cache_has(
        &cache,
        (40 * MIB) as u64,
        &model[40 * MIB..44 * MIB]
    ));
    assert!(cache_has(&cache, (46 * MIB) as u64, b"intent"));
    assert!(allocated(&cache) <= BOUND + SLACK, "{}", allocated(&cache));

    let dev = vdev::standby::take_over("bounded", None).unwrap().unwrap();
    let c = dev.bucket_space().unwrap().cache.expect("a bounded cache");
    assert_eq!(c.bound_bytes, BOUND);
    assert_eq!(c.fetched_bytes, 0, "the takeover fetched nothing");
    // The newest writes are local: read without a fetch.
    assert_same(
        &read(&dev, (40 * MIB) as u64, 4 * MIB),
        &model[40 * MIB..44 * MIB],
        "newest",
    );
    let (stats, _) = dev.bucket_cache().unwrap();
    assert_eq!(
        stats
            .fetched_bytes
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Everything else on demand, under the bound.
    assert_same(&read(&dev, 0, 48 * MIB), &model, "the new owner");
    assert!(allocated(&cache) <= BOUND + SLACK, "{}", allocated(&cache));
    let err = owner.write_durable_at(0, b"late").unwrap_err().to_string();
    assert!(err.contains("fenced"), "{err}");
    // The new owner writes and ships through the adopted cache.
    dev.write_at((50 * MIB) as u64, &pattern(77, 2 * MIB))
        .unwrap();
    dev.sync().unwrap();
    drop(dev);
    let again = common::open(
        url,
        &store,
        &dir.path().join("again"),
        "third",
        OpenMode::Takeover,
    )
    .unwrap();
    assert_same(&read(&again, 0, 48 * MIB), &model, "a cold open after");
    assert_same(
        &read(&again, (50 * MIB) as u64, 2 * MIB),
        &pattern(77, 2 * MIB),
        "its write",
    );
}
