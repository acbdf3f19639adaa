//! A bucket device with a bounded local cache filled on demand (decision
//! 0054): opening fetches no segment, reads fetch what they miss and verify
//! it, the cache file stays under its bound, a failed or wrong GET is an
//! I/O error and never data, compaction's deletions are followed, and
//! discarded ranges let the bucket shrink.

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use object_store::memory::InMemory;
use object_store::ObjectStore;
use objstore::faults::{Faults, FaultyStore};
use objstore::OpenMode;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use vdev::compact::Policy;
use vdev::Vdev;

const MIB: usize = 1 << 20;
const BOUND: u64 = 8 << 20;
/// Lines the bound may be exceeded by: the local MMP slot's line and the
/// lines of inline log bytes (labels, small syncs), which are never evicted.
const SLACK: u64 = 4 << 20;

fn open(
    store: &Arc<dyn ObjectStore>,
    cache: &Path,
    mode: OpenMode,
    bound: Option<u64>,
) -> Result<Vdev, vdev::VdevError> {
    common::open_with("mem://cache", store, cache, "owner", mode, bound)
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add((i >> 12) as u8) ^ seed)
        .collect()
}

/// Bytes the cache file holds on disk (st_blocks).
fn allocated(cache: &Path) -> u64 {
    std::fs::metadata(cache).unwrap().blocks() * 512
}

fn read(dev: &Vdev, offset: usize, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    dev.read_at(offset as u64, &mut b).unwrap();
    b
}

fn faulty() -> (Arc<dyn ObjectStore>, Arc<Faults>) {
    let f = FaultyStore::new(Arc::new(InMemory::new()));
    let faults = f.faults.clone();
    (Arc::new(f), faults)
}

/// 40 MiB written in 1 MiB writes with a sync every 4 MiB; a partial write
/// over an evicted line; returns what the first 40 MiB must read.
fn write_larger_than_the_cache(dev: &Vdev, cache: &Path) -> Vec<u8> {
    let mut model = vec![0u8; 40 * MIB];
    for i in 0..40 {
        let data = pattern(i as u8, MIB);
        dev.write_at((i * MIB) as u64, &data).unwrap();
        model[i * MIB..(i + 1) * MIB].copy_from_slice(&data);
        if i % 4 == 3 {
            dev.sync().unwrap();
            assert!(
                allocated(cache) <= BOUND + SLACK,
                "cache holds {} bytes after {} MiB",
                allocated(cache),
                i + 1
            );
        }
    }
    // Line 2 was evicted long ago: a partial write must fetch it first.
    let small = pattern(99, 8192);
    dev.write_at((2 * MIB + 4096) as u64, &small).unwrap();
    model[2 * MIB + 4096..2 * MIB + 4096 + 8192].copy_from_slice(&small);
    dev.sync().unwrap();
    model
}

#[test]
fn a_pool_larger_than_the_cache_reads_back_on_a_fresh_cache_under_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (store, faults) = faulty();
    let a_cache = dir.path().join("a");
    let a = open(&store, &a_cache, OpenMode::Create, Some(BOUND)).unwrap();
    let model = write_larger_than_the_cache(&a, &a_cache);
    let (stats, held) = a.bucket_cache().unwrap();
    assert!(stats.evicted_lines.load(Ordering::Relaxed) >= 30);
    assert!(held <= BOUND + SLACK, "{held}");
    // Reads of evicted data fetch it back (and verify it) in the owner too.
    assert_eq!(read(&a, 0, 4 * MIB), model[..4 * MIB]);
    drop(a);

    // A fresh state directory: the open fetches no segment.
    let b_cache = dir.path().join("b");
    let b = open(&store, &b_cache, OpenMode::Resume, Some(BOUND)).unwrap();
    let (stats, _) = b.bucket_cache().unwrap();
    assert_eq!(stats.fetched_bytes.load(Ordering::Relaxed), 0);
    assert!(allocated(&b_cache) <= SLACK, "{}", allocated(&b_cache));
    for i in 0..40 {
        assert_eq!(
            read(&b, i * MIB, MIB),
            model[i * MIB..(i + 1) * MIB],
            "MiB {i}"
        );
        assert!(
            allocated(&b_cache) <= BOUND + SLACK,
            "{}",
            allocated(&b_cache)
        );
    }
    assert_eq!(read(&b, 40 * MIB, MIB), vec![0u8; MIB]);
    // The figures `pool status` and the metrics report (decision 0054).
    let c = b.bucket_space().unwrap().cache.expect("no cache figures");
    assert_eq!(c.bound_bytes, BOUND);
    assert!(c.held_bytes <= BOUND + SLACK, "{c:?}");
    assert!(c.misses >= 40 && c.evicted_lines > 0, "{c:?}");
    assert_eq!(c.fetched_bytes, stats.fetched_bytes.load(Ordering::Relaxed));
    assert!(c.fetched_bytes >= 40 * MIB as u64, "{c:?}");
    let fetched = stats.fetched_bytes.load(Ordering::Relaxed);
    assert!(fetched >= 40 * MIB as u64, "{fetched}");

    // A failed GET, and one whose bytes are wrong, are I/O errors; a read
    // after them gets the right bytes (nothing wrong was kept).
    faults.fail_segment_gets(100);
    let mut buf = vec![0u8; 4096];
    let e = b.read_at(MIB as u64, &mut buf).unwrap_err();
    assert!(e.to_string().contains("GET failed"), "{e}");
    faults.fail_segment_gets(0);
    faults.corrupt_segment_gets(100);
    let e = b.read_at(MIB as u64, &mut buf).unwrap_err();
    assert!(e.to_string().contains("checksum"), "{e}");
    // One wrong answer is retried.
    faults.corrupt_segment_gets(1);
    assert_eq!(read(&b, MIB, MIB), model[MIB..2 * MIB]);
    assert_eq!(b.errors.read.load(Ordering::Relaxed), 2);
    drop(b);

    // Unbounded (the default) opens as before: the whole device rebuilt.
    let c_cache = dir.path().join("c");
    let c = open(&store, &c_cache, OpenMode::Resume, None).unwrap();
    assert!(c.bucket_cache().is_none());
    assert_eq!(read(&c, 0, 40 * MIB), model);
}

#[test]
fn reads_follow_segments_that_compaction_moved_and_discards_shrink_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _faults) = faulty();
    let cache = dir.path().join("a");
    let bound = 4 << 20;
    let a = open(&store, &cache, OpenMode::Create, Some(bound)).unwrap();
    let mut model = pattern(1, 16 * MIB);
    a.write_at(0, &model).unwrap();
    a.sync().unwrap();
    // Three quarters rewritten: the first segment ends 25% live.
    let over = pattern(2, 12 * MIB);
    a.write_at(0, &over).unwrap();
    model[..12 * MIB].copy_from_slice(&over);
    a.sync().unwrap();
    let policy = Policy {
        below_percent: 50,
        interval: Duration::from_secs(3600),
        grace: Duration::ZERO,
    };
    let report = a.bucket_compact(&policy, true).unwrap().unwrap();
    assert!(report.deleted_segments >= 1, "{report:?}");
    // [12, 16) MiB was evicted and its segment deleted: the read finds it
    // through the checkpoint.
    assert_eq!(read(&a, 12 * MIB, 4 * MIB), model[12 * MIB..]);
    assert_eq!(read(&a, 0, 16 * MIB), model);

    // The pool freed 12 MiB: shipped as zeros, compaction drops them.
    let before = a.bucket_refresh_space().unwrap().unwrap();
    a.discard(0, 12 * MIB as u64).unwrap();
    a.sync().unwrap();
    a.bucket_compact(&policy, true).unwrap().unwrap();
    let after = a.bucket_refresh_space().unwrap().unwrap();
    let (b, f) = (
        before.physical_bytes.unwrap(),
        after.physical_bytes.unwrap(),
    );
    assert!(b - f.min(b) >= 10 * MIB as u64, "{b} -> {f}");
    assert_eq!(read(&a, 0, 12 * MIB), vec![0u8; 12 * MIB]);
    assert_eq!(read(&a, 12 * MIB, 4 * MIB), model[12 * MIB..]);
    drop(a);
    let b = open(&store, &dir.path().join("b"), OpenMode::Resume, Some(bound)).unwrap();
    assert_eq!(read(&b, 0, 12 * MIB), vec![0u8; 12 * MIB]);
    assert_eq!(read(&b, 12 * MIB, 4 * MIB), model[12 * MIB..]);
}

/// A line whose extents alternate between two segments (small writes over
/// a large one) fetches each segment once, not at every switch.
#[test]
fn a_line_of_interleaved_segments_fetches_each_once() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = faulty();
    let a = open(&store, &dir.path().join("a"), OpenMode::Create, Some(BOUND)).unwrap();
    let line = 8 * MIB;
    let mut model = pattern(1, MIB);
    a.write_at(line as u64, &model).unwrap();
    a.sync().unwrap();
    // 8 pieces of 64 KiB every 128 KiB: one segment, 16 extents in the line.
    for i in 0..8 {
        let piece = pattern(2 + i as u8, 64 << 10);
        let at = i * (128 << 10);
        a.write_at((line + at) as u64, &piece).unwrap();
        model[at..at + piece.len()].copy_from_slice(&piece);
    }
    a.sync().unwrap();
    drop(a);
    let b = open(&store, &dir.path().join("b"), OpenMode::Resume, Some(BOUND)).unwrap();
    assert_eq!(read(&b, line, MIB), model);
    let fetched = b
        .bucket_cache()
        .unwrap()
        .0
        .fetched_bytes
        .load(Ordering::Relaxed);
    assert!(
        fetched <= (MIB + MIB / 2) as u64 + (64 << 10),
        "{fetched} bytes fetched for one line of two segments"
    );
}

/// Decision 0059: a segment's entry carries a sum per MiB, so a cold small
/// read fetches the one chunk it needs, verified; a wrong chunk is EIO and
/// nothing is kept; a sequential read fetches ahead.
#[test]
fn a_cold_small_read_fetches_one_verified_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let (store, faults) = faulty();
    let a = open(&store, &dir.path().join("a"), OpenMode::Create, Some(BOUND)).unwrap();
    let data = pattern(5, 16 * MIB);
    a.write_at(0, &data).unwrap();
    a.sync().unwrap();
    drop(a);
    let b = open(&store, &dir.path().join("b"), OpenMode::Resume, Some(BOUND)).unwrap();
    let fetched = || {
        b.bucket_cache()
            .unwrap()
            .0
            .fetched_bytes
            .load(Ordering::Relaxed)
    };
    let at = 5 * MIB + 4096;
    assert_eq!(read(&b, at, 4096), data[at..at + 4096]);
    assert_eq!(fetched(), MIB as u64, "one chunk of a 16 MiB segment");
    // Wrong bytes twice (the retry too): EIO, and the line stays absent.
    faults.corrupt_segment_gets(2);
    let mut buf = vec![0u8; 4096];
    assert!(b.read_at((9 * MIB) as u64, &mut buf).is_err());
    assert_eq!(fetched(), MIB as u64);
    assert_eq!(read(&b, 9 * MIB, 4096), data[9 * MIB..9 * MIB + 4096]);
    // Sequential: the rest in 8 MiB GETs (the kept lines are not fetched again).
    let before = fetched();
    for i in 10..16 {
        assert_eq!(read(&b, i * MIB, MIB), data[i * MIB..(i + 1) * MIB]);
    }
    assert!(
        fetched() - before <= (6 * MIB) as u64,
        "{}",
        fetched() - before
    );
}

/// Decision 0063: with `[bucket] cache_bytes` unset the cache is bounded by
/// default. A pool whose cache file is a full copy (written by a build
/// where unbounded was the default) opens under the default bound: the old
/// file is replaced, no segment is fetched at open, every byte reads back.
#[test]
fn a_pool_with_a_full_copy_cache_opens_bounded_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = faulty();
    let cache = dir.path().join("bucket").join("pool.cache");
    std::fs::create_dir_all(cache.parent().unwrap()).unwrap();
    let a = open(&store, &cache, OpenMode::Create, None).unwrap();
    assert!(a.bucket_cache().is_none(), "a full copy");
    let model = pattern(7, 24 * MIB);
    a.write_at(0, &model).unwrap();
    a.sync().unwrap();
    drop(a);
    assert!(allocated(&cache) >= 24 * MIB as u64, "the old full copy");

    let how = vdev::bucket::BucketOpen {
        url: "mem://cache",
        cache: &cache,
        size: Some(common::SIZE),
        mode: OpenMode::Resume,
        s3: Default::default(),
        node: "owner",
        inline_max: vdev::bucket::DEFAULT_INLINE_MAX,
        store: Some((store.clone(), object_store::path::Path::from("pool"))),
    };
    let b = Vdev::open_bucket_bounded(how, vdev::bucket::CacheBound::from_config(None)).unwrap();
    let c = b.bucket_space().unwrap().cache.expect("bounded by default");
    let free = vdev::bucket::free_bytes(cache.parent().unwrap()).unwrap();
    assert_eq!(
        c.bound_bytes,
        vdev::bucket::default_cache_bytes(common::SIZE, free).max(1 << 20)
    );
    assert_eq!(c.fetched_bytes, 0, "nothing fetched at open");
    assert!(allocated(&cache) <= SLACK, "{}", allocated(&cache));
    assert_eq!(read(&b, 0, 24 * MIB), model);
    assert_eq!(read(&b, 24 * MIB, MIB), vec![0u8; MIB]);
    // Writes and syncs go on as before; a fresh default open reads them.
    let more = pattern(8, 2 * MIB);
    b.write_at((30 * MIB) as u64, &more).unwrap();
    b.sync().unwrap();
    drop(b);
    let c = open(&store, &dir.path().join("c"), OpenMode::Resume, None).unwrap();
    assert_eq!(read(&c, 0, 24 * MIB), model);
    assert_eq!(read(&c, 30 * MIB, 2 * MIB), more);
}
