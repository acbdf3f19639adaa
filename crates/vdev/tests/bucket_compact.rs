//! Checkpoints and compaction of a bucket device (decision 0049): physical
//! bytes shrink, and a crash (simulated kill -9: every PUT and DELETE after
//! the Nth fails) at any point of a compaction loses nothing, whether a warm
//! standby that tailed the log through the compaction (caught up, or lagging
//! behind its deletions) or a cold takeover comes next (decision 0055).

use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use objstore::faults::{Faults, FaultyStore};
use objstore::OpenMode;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use vdev::bucket::{self, BucketConfig};
use vdev::compact::Policy;
use vdev::Vdev;

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;

const MIB: usize = 1 << 20;
/// The part of the device the tests write and compare.
const SPAN: usize = 32 * MIB;

fn open(
    store: &Arc<dyn ObjectStore>,
    cache: &Path,
    node: &str,
    mode: OpenMode,
) -> Result<Vdev, vdev::VdevError> {
    common::open("mem://compact", store, cache, node, mode)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add((i >> 12) as u8) ^ seed)
        .collect()
}

fn policy() -> Policy {
    Policy {
        below_percent: 50,
        interval: Duration::from_secs(3600),
        grace: Duration::ZERO,
    }
}

/// Writes a history with overwritten segments, inline records and zeros;
/// returns the device and what its first `SPAN` bytes must read.
fn build(store: &Arc<dyn ObjectStore>, cache: &Path) -> (Vdev, Vec<u8>) {
    build_with(store, cache, || {})
}

/// [`build`], calling `after_first` once the first segment is shipped.
fn build_with(
    store: &Arc<dyn ObjectStore>,
    cache: &Path,
    after_first: impl FnOnce(),
) -> (Vdev, Vec<u8>) {
    let mut model = vec![0u8; SPAN];
    let dev = open(store, cache, "owner", OpenMode::Create).unwrap();
    let mut w = |dev: &Vdev, off: usize, data: Vec<u8>| {
        dev.write_at(off as u64, &data).unwrap();
        model[off..off + data.len()].copy_from_slice(&data);
    };
    // Segment A (8 MiB), three quarters of it overwritten by segment B,
    // an eighth zeroed: A ends 12.5% live and is rewritten.
    w(&dev, 0, pattern(1, 8 * MIB));
    dev.sync().unwrap();
    after_first();
    w(&dev, MIB, pattern(2, 6 * MIB));
    dev.sync().unwrap();
    w(&dev, 7 * MIB, vec![0u8; MIB]);
    dev.sync().unwrap();
    // Inline records: txg-like small syncs and intent-log writes.
    for i in 0..6usize {
        w(&dev, 20 * MIB + i * 16384, pattern(10 + i as u8, 12288));
        dev.sync().unwrap();
    }
    for i in 0..4usize {
        let data = pattern(40 + i as u8, 4096);
        dev.write_durable_at((24 * MIB + i * 8192) as u64, &data)
            .unwrap();
        model[24 * MIB + i * 8192..24 * MIB + i * 8192 + 4096].copy_from_slice(&data);
    }
    (dev, model)
}

fn read_span(dev: &Vdev) -> Vec<u8> {
    let mut b = vec![0u8; SPAN];
    dev.read_at(0, &mut b).unwrap();
    b
}

fn assert_same(got: &[u8], want: &[u8], what: &str) {
    if got != want {
        let at = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        panic!("{what}: differs first at byte {at}");
    }
}

#[test]
fn compaction_shrinks_the_bucket_and_a_reopened_pool_reads_the_same() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let (dev, model) = build(&store, &dir.path().join("a"));
    let before = dev.bucket_refresh_space().unwrap().unwrap();
    let phys_before = before.physical_bytes.unwrap();
    assert!(before.segment_bytes >= (14 * MIB) as u64, "{before:?}");
    let report = dev.bucket_compact(&policy(), true).unwrap().unwrap();
    assert!(report.checkpoint.is_some());
    assert_eq!(report.rewritten_segments, 1, "{report:?}");
    assert!(report.deleted_records > 10, "{report:?}");
    let after = dev.bucket_space().unwrap();
    let phys_after = after.physical_bytes.unwrap();
    assert!(
        phys_after + (6 * MIB) as u64 <= phys_before,
        "physical bytes {phys_before} -> {phys_after}"
    );
    // Writes after the checkpoint replay on top of it.
    let late = pattern(77, 3 * MIB);
    dev.write_at(MIB as u64 / 2, &late).unwrap();
    dev.sync().unwrap();
    dev.write_durable_at(25 * MIB as u64, b"after the checkpoint")
        .unwrap();
    let mut model = model;
    model[MIB / 2..MIB / 2 + late.len()].copy_from_slice(&late);
    model[25 * MIB..25 * MIB + 20].copy_from_slice(b"after the checkpoint");
    assert_same(&read_span(&dev), &model, "the live device");
    drop(dev);
    // The same node resumes (its claim was compacted away), another takes over.
    let b = open(&store, &dir.path().join("b"), "owner", OpenMode::Resume).unwrap();
    assert_same(&read_span(&b), &model, "resumed after compaction");
    drop(b);
    assert!(open(&store, &dir.path().join("x"), "other", OpenMode::Resume).is_err());
    let c = open(&store, &dir.path().join("c"), "other", OpenMode::Takeover).unwrap();
    assert_same(&read_span(&c), &model, "taken over after compaction");
    // A second compaction on the new owner reads the first checkpoint.
    c.bucket_compact(&policy(), true).unwrap().unwrap();
    drop(c);
    let d = open(&store, &dir.path().join("d"), "other", OpenMode::Resume).unwrap();
    assert_same(&read_span(&d), &model, "after two checkpoints");
}

/// Waits until the standby of `pool` applied every record of the log.
fn wait_caught_up(store: &Arc<dyn ObjectStore>, pool: &str) {
    let end = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(objstore::read_all(store.as_ref(), &ObjPath::from("pool")))
        .unwrap()
        .last()
        .map_or(1, |r| r.seq + 1);
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while vdev::standby::status(pool).is_none_or(|s| s.next_seq != end) {
        assert!(
            std::time::Instant::now() < until,
            "standby {pool} never caught up"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_crash_at_any_point_of_a_compaction_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut completed = false;
    // The warm standby needs the daemon's settings (one heartbeat PUT at
    // open, before the crash point is set, then none).
    let state = dir.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    bucket::configure(
        &state,
        BucketConfig {
            heartbeat_ms: Some(3_600_000),
            // Idle looks back off to 400 ms, not the default 5 s: the tests
            // wait for a standby after idle moments.
            standby_poll_max_ms: Some(400),
            ..Default::default()
        },
    );
    for n in 0..400u64 {
        let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let faulty = Arc::new(FaultyStore::new(inner.clone()));
        let faults: Arc<Faults> = faulty.faults.clone();
        let store: Arc<dyn ObjectStore> = faulty;
        let cache = dir.path().join(format!("a{n}"));
        // The next owner, by turns: a cold takeover; a warm standby of
        // another machine (its own view of the store) that tailed the log
        // through the compaction; one cut off from the store after the
        // first record, that lags behind the compaction's deletions.
        let (warm, lagging) = (n % 3 != 0, n % 3 == 2);
        let (pool, url) = (format!("crash{n}"), format!("mem://crash{n}"));
        let sb_store = Arc::new(FaultyStore::new(inner.clone()));
        let sb_faults = sb_store.faults.clone();
        let (dev, model) = build_with(&store, &cache, || {
            if warm {
                vdev::standby::start_with_store(&pool, &url, sb_store, ObjPath::from("pool"))
                    .unwrap();
                wait_caught_up(&inner, &pool);
            }
            if lagging {
                sb_faults.fail_gets("", u64::MAX);
            }
        });
        if warm && !lagging {
            wait_caught_up(&inner, &pool);
        }
        faults.crash_after(n);
        let result = dev.bucket_compact(&policy(), true).unwrap();
        let crashed = faults.crashed();
        // The crashed daemon is gone; its cache with it.
        drop(dev);
        let _ = std::fs::remove_file(&cache);
        if !crashed {
            result.unwrap();
        }
        let what = format!("crash after {n} writes (warm {warm}, lagging {lagging})");
        let (b, b_cache, node) = match warm {
            true => {
                sb_faults.heal_gets();
                let b = vdev::standby::take_over(&pool, None)
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{what}: warm takeover: {e}"));
                let node = bucket::settings().unwrap().node;
                (b, bucket::cache_path(&state, &url), node)
            }
            false => {
                let b_cache = dir.path().join(format!("b{n}"));
                let b = open(&inner, &b_cache, "standby", OpenMode::Takeover)
                    .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
                (b, b_cache, "standby".to_string())
            }
        };
        assert_same(&read_span(&b), &model, &what);
        // The next owner compacts: the crashed run's leftovers go too.
        b.bucket_compact(&policy(), true).unwrap().unwrap();
        let space = b.bucket_space().unwrap();
        assert!(
            space.segment_bytes < (8 * MIB) as u64,
            "crash after {n}: {space:?}"
        );
        drop(b);
        let _ = std::fs::remove_file(&b_cache);
        let c_cache = dir.path().join(format!("c{n}"));
        let c = open(&inner, &c_cache, &node, OpenMode::Resume).unwrap();
        assert_same(
            &read_span(&c),
            &model,
            &format!("crash after {n}, recompacted"),
        );
        drop(c);
        let _ = std::fs::remove_file(&c_cache);
        if !crashed {
            // Copy, checkpoint, marker, then one DELETE per superseded
            // record and segment: every one of them was a crash point.
            assert!(n > 15, "only {n} crash points");
            completed = true;
            break;
        }
    }
    assert!(completed, "the compaction never ran to its end");
}

/// Decision 0055 argued it; this checks it: the owner is paused (its
/// process stopped) at a PUT/DELETE of a compaction, another node takes the
/// pool over (bounded cache: it fetches from the bucket what it reads,
/// after the old owner resumed) and writes, then the old owner resumes. It
/// is fenced, its compaction deletes nothing the new owner needs, and every
/// acknowledged write of both reads back on the new owner, after the new
/// owner's own compaction and on a fresh cache. The pause points: the first
/// and last call of each kind (segment PUT, checkpoint and marker PUTs,
/// record DELETEs, segment DELETEs), from a dry run of the same history.
#[test]
fn an_owner_paused_in_its_compaction_and_resumed_after_a_takeover_is_fenced_and_harmless() {
    let dir = tempfile::tempdir().unwrap();
    let fresh = |name: &str| {
        let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
        let faults: Arc<Faults> = faulty.faults.clone();
        let store: Arc<dyn ObjectStore> = faulty;
        let (a, model) = build(&store, &dir.path().join(name));
        (store, faults, Arc::new(a), model)
    };
    // Dry run: the calls one compaction of this history makes.
    let (_, faults, a, _) = fresh("dry");
    let before = faults.calls().len();
    a.bucket_compact(&policy(), true).unwrap().unwrap();
    // (The heartbeat, written by its own thread, is not a pause point.)
    let beats = |c: &String| !c.ends_with("heartbeat");
    let calls: Vec<String> = faults
        .calls()
        .split_off(before)
        .into_iter()
        .filter(beats)
        .collect();
    drop(a);
    let kind = |c: &str| {
        let what = c.split(' ').next().unwrap_or("");
        let place = ["/log/", "/seg/"]
            .into_iter()
            .find(|p| c.contains(p))
            .unwrap_or("other");
        format!("{what} {place}")
    };
    let mut points: Vec<usize> = Vec::new();
    for (i, c) in calls.iter().enumerate() {
        let k = kind(c);
        let first = i == 0 || kind(&calls[i - 1]) != k;
        let last = i + 1 == calls.len() || kind(&calls[i + 1]) != k;
        if first || last {
            points.push(i);
        }
    }
    let kinds: std::collections::BTreeSet<String> = calls.iter().map(|c| kind(c)).collect();
    assert!(
        kinds.len() >= 4 && calls.len() >= 8,
        "a compaction made only {calls:?}"
    );

    for n in points {
        let what = &calls[n];
        let (store, faults, a, mut model) = fresh(&format!("a{n}"));
        faults.pause_after(n as u64);
        let compaction = {
            let a = a.clone();
            std::thread::spawn(move || a.bucket_compact(&policy(), true))
        };
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !faults.paused() {
            assert!(std::time::Instant::now() < until, "{what}: never paused");
            assert!(!compaction.is_finished(), "{what}: finished unpaused");
            std::thread::sleep(Duration::from_millis(1));
        }
        let held = faults.calls().into_iter().rfind(beats).unwrap_or_default();
        assert_eq!(kind(&held), kind(what), "the same history");
        let b = Vdev::open_bucket_with(
            vdev::bucket::BucketOpen {
                url: "mem://paused",
                cache: &dir.path().join(format!("b{n}")),
                size: Some(common::SIZE),
                mode: OpenMode::Takeover,
                s3: Default::default(),
                node: "other",
                inline_max: vdev::bucket::DEFAULT_INLINE_MAX,
                store: Some((store.clone(), ObjPath::from("pool"))),
            },
            Some(4 << 20),
        )
        .unwrap();
        let late = pattern(90, 2 * MIB);
        b.write_at((27 * MIB) as u64, &late).unwrap();
        b.sync().unwrap();
        let note = b"acknowledged by the new owner";
        b.write_durable_at((26 * MIB) as u64, note).unwrap();
        model[27 * MIB..29 * MIB].copy_from_slice(&late);
        model[26 * MIB..26 * MIB + note.len()].copy_from_slice(note);

        faults.resume();
        let resumed = compaction.join().unwrap();
        // The old owner acknowledges nothing more.
        let w = a.write_at((30 * MIB) as u64, &pattern(91, 4096));
        assert!(
            w.is_err() || a.sync().is_err(),
            "{what}: the old owner is not fenced"
        );
        drop(a);
        let at = format!("paused at {what} ({resumed:?})");
        assert_same(&read_span(&b), &model, &at);
        b.bucket_compact(&policy(), true).unwrap().unwrap();
        assert_same(&read_span(&b), &model, &format!("{at}, compacted"));
        drop(b);
        let c = open(
            &store,
            &dir.path().join(format!("c{n}")),
            "other",
            OpenMode::Resume,
        )
        .unwrap();
        assert_same(&read_span(&c), &model, &format!("{at}, fresh cache"));
    }
}
