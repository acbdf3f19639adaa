//! Pools written before decision 0059 (version 1 log entries: segments
//! without chunk sums) still read through the bounded cache, by whole
//! segment fetches, next to new segments read by the chunk, also once a
//! checkpoint image names both kinds.
//! `bucket::set_legacy_entries` is process-wide, hence this file.

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use object_store::memory::InMemory;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use objstore::OpenMode;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use vdev::compact::Policy;
use vdev::Vdev;

const MIB: usize = 1 << 20;

fn open(store: &Arc<dyn ObjectStore>, cache: &Path, mode: OpenMode) -> Vdev {
    common::open_with("mem://v1", store, cache, "owner", mode, Some(8 << 20)).unwrap()
}

fn fetched(dev: &Vdev) -> u64 {
    dev.bucket_cache()
        .unwrap()
        .0
        .fetched_bytes
        .load(Ordering::Relaxed)
}

#[test]
fn a_pool_of_version_1_entries_reads_whole_segments_next_to_chunked_ones() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data: Vec<u8> = (0..16 * MIB).map(|i| (i / 4096) as u8 ^ i as u8).collect();
    vdev::bucket::set_legacy_entries(true);
    let a = open(&store, &dir.path().join("a"), OpenMode::Create);
    a.write_at(0, &data).unwrap();
    a.sync().unwrap();
    drop(a);
    vdev::bucket::set_legacy_entries(false);
    // Every record of the log is a version 1 entry.
    let records = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(objstore::read_all(store.as_ref(), &ObjPath::from("pool")))
        .unwrap();
    let raws: Vec<_> = records.iter().flat_map(|r| r.entries.iter()).collect();
    assert!(!raws.is_empty());
    assert!(
        raws.iter().all(|e| e.first() == Some(&1)),
        "version 1 entries"
    );

    let b = open(&store, &dir.path().join("b"), OpenMode::Resume);
    let mut buf = vec![0u8; 4096];
    b.read_at((5 * MIB) as u64, &mut buf).unwrap();
    assert_eq!(buf, data[5 * MIB..5 * MIB + 4096]);
    assert_eq!(
        fetched(&b),
        (16 * MIB) as u64,
        "no table: the whole segment"
    );
    // New writes carry tables; a checkpoint image then names both kinds.
    let late: Vec<u8> = (0..4 * MIB).map(|i| (i / 512) as u8).collect();
    b.write_at((20 * MIB) as u64, &late).unwrap();
    b.sync().unwrap();
    let policy = Policy {
        below_percent: 50,
        interval: Duration::from_secs(3600),
        grace: Duration::ZERO,
    };
    b.bucket_compact(&policy, true).unwrap().unwrap();
    drop(b);
    let c = open(&store, &dir.path().join("c"), OpenMode::Resume);
    c.read_at((21 * MIB) as u64, &mut buf).unwrap();
    assert_eq!(buf, late[MIB..MIB + 4096]);
    assert_eq!(fetched(&c), MIB as u64, "a chunk of the new segment");
    c.read_at((2 * MIB) as u64, &mut buf).unwrap();
    assert_eq!(buf, data[2 * MIB..2 * MIB + 4096]);
    assert_eq!(fetched(&c), (17 * MIB) as u64, "the old one whole");
    let mut all = vec![0u8; 16 * MIB];
    c.read_at(0, &mut all).unwrap();
    assert!(all == data, "the old segment reads back");
}
