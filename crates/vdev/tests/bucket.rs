//! A device that lives in an object store (decision 0039), against the
//! object_store crate's in-memory and local-file stores, with injected PUT
//! faults: nothing is acknowledged unless its log record is in the store.

use object_store::memory::InMemory;
use object_store::ObjectStore;
use objstore::faults::{FaultyStore, PutFault};
use objstore::OpenMode;
use std::path::Path;
use std::sync::Arc;
use vdev::{DeviceState, Vdev};

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::SIZE;

fn open(
    store: &Arc<dyn ObjectStore>,
    cache: &Path,
    node: &str,
    mode: OpenMode,
) -> Result<Vdev, vdev::VdevError> {
    common::open("mem://test", store, cache, node, mode)
}

fn read(dev: &Vdev, offset: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    dev.read_at(offset, &mut b).expect("read");
    b
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn synced_writes_small_and_large_come_back_from_the_store_alone() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let a = open(&store, &dir.path().join("a"), "node-a", OpenMode::Create).unwrap();
    assert_eq!(a.size(), SIZE);
    // Small: inline in a log record. Large: a segment. Zeros: a length only.
    a.write_at(8192, &pattern(1, 4096)).unwrap();
    a.write_at(1 << 20, &pattern(2, 3 << 20)).unwrap();
    a.write_at(16 << 20, &vec![0u8; 1 << 20]).unwrap();
    a.sync().unwrap();
    a.write_durable_at(40 << 20, &pattern(3, 512)).unwrap();
    let stats = a.bucket_stats().unwrap();
    assert!(stats.segments.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    // Written after the last sync: never acknowledged, need not survive.
    a.write_at(50 << 20, &pattern(4, 4096)).unwrap();
    drop(a);

    // The same node resumes with an empty cache: everything comes from the store.
    let b = open(&store, &dir.path().join("b"), "node-a", OpenMode::Resume).unwrap();
    assert_eq!(b.size(), SIZE);
    assert_eq!(read(&b, 8192, 4096), pattern(1, 4096));
    assert_eq!(read(&b, 1 << 20, 3 << 20), pattern(2, 3 << 20));
    assert_eq!(read(&b, 16 << 20, 1 << 20), vec![0u8; 1 << 20]);
    assert_eq!(read(&b, 40 << 20, 512), pattern(3, 512));
    // Another node cannot resume: it has to take over.
    drop(b);
    assert!(open(&store, &dir.path().join("c"), "node-b", OpenMode::Resume).is_err());
}

#[test]
fn a_failed_put_is_never_acknowledged_and_fails_the_device() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let faults = faulty.faults.clone();
    let store: Arc<dyn ObjectStore> = faulty;
    let a = open(&store, &dir.path().join("a"), "n", OpenMode::Create).unwrap();
    a.write_at(0, &pattern(1, 4096)).unwrap();
    a.sync().unwrap();
    // Every attempt fails: the outcome stays unknown, the sync fails.
    for _ in 0..8 {
        faults.push(PutFault::Fail);
    }
    a.write_at(4096, &pattern(2, 4096)).unwrap();
    let err = a.sync().unwrap_err().to_string();
    assert!(err.contains("unknown") || err.contains("fault"), "{err}");
    assert_eq!(a.state(), DeviceState::Faulted);
    // Nothing more is acknowledged, even once the store works again.
    assert!(a.sync().is_err());
    assert!(a.write_durable_at(8192, b"x").is_err());
    assert!(a.write_at(8192, b"x").is_err());
    drop(a);
    let b = open(&store, &dir.path().join("b"), "n", OpenMode::Resume).unwrap();
    assert_eq!(read(&b, 0, 4096), pattern(1, 4096));
}

#[test]
fn a_lost_answer_is_resolved_by_reading_back_before_acknowledging() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let faults = faulty.faults.clone();
    let store: Arc<dyn ObjectStore> = faulty;
    let a = open(&store, &dir.path().join("a"), "n", OpenMode::Create).unwrap();
    faults.push(PutFault::LoseAnswer);
    a.write_durable_at(4096, &pattern(5, 4096)).unwrap();
    drop(a);
    let b = open(&store, &dir.path().join("b"), "n", OpenMode::Resume).unwrap();
    assert_eq!(read(&b, 4096, 4096), pattern(5, 4096));
}

#[test]
fn a_takeover_fences_the_old_owner_which_acknowledges_nothing_more() {
    let dir = tempfile::tempdir().unwrap();
    let local = dir.path().join("store");
    std::fs::create_dir_all(&local).unwrap();
    let store: Arc<dyn ObjectStore> =
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(&local).unwrap());
    let a = open(&store, &dir.path().join("a"), "owner", OpenMode::Create).unwrap();
    a.write_at(0, &pattern(1, 8192)).unwrap();
    a.sync().unwrap();
    let b = open(&store, &dir.path().join("b"), "standby", OpenMode::Takeover).unwrap();
    assert_eq!(read(&b, 0, 8192), pattern(1, 8192));
    // The old owner's next ship finds the standby's claim.
    a.write_at(0, &pattern(9, 8192)).unwrap();
    let err = a.sync().unwrap_err().to_string();
    assert!(err.contains("fenced"), "{err}");
    assert_eq!(a.state(), DeviceState::Faulted);
    assert!(a.reason().unwrap_or_default().contains("fenced"));
    assert!(a.write_durable_at(0, b"late").is_err());
    // The new owner writes on; what it reads is its own.
    b.write_durable_at(8192, &pattern(2, 100)).unwrap();
    drop(b);
    let c = open(&store, &dir.path().join("c"), "standby", OpenMode::Resume).unwrap();
    assert_eq!(read(&c, 0, 8192), pattern(1, 8192));
    assert_eq!(read(&c, 8192, 100), pattern(2, 100));
}

#[test]
fn of_two_creators_on_an_empty_store_exactly_one_owns_it() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let handles: Vec<_> = (0..2)
        .map(|i| {
            let store = store.clone();
            let cache = dir.path().join(format!("c{i}"));
            std::thread::spawn(move || {
                open(&store, &cache, &format!("n{i}"), OpenMode::Create).is_ok()
            })
        })
        .collect();
    let won: usize = handles
        .into_iter()
        .map(|h| h.join().unwrap() as usize)
        .sum();
    assert_eq!(won, 1);
}

#[test]
fn concurrent_flushes_share_puts() {
    let dir = tempfile::tempdir().unwrap();
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let faults = faulty.faults.clone();
    let store: Arc<dyn ObjectStore> = faulty;
    let a = Arc::new(open(&store, &dir.path().join("a"), "n", OpenMode::Create).unwrap());
    let before = faults.puts();
    faults.push(PutFault::Slow(std::time::Duration::from_millis(200)));
    let threads: Vec<_> = (0..32u64)
        .map(|i| {
            let a = a.clone();
            std::thread::spawn(move || a.write_durable_at(i * 4096, &pattern(i as u8, 4096)))
        })
        .collect();
    for t in threads {
        t.join().unwrap().unwrap();
    }
    let puts = faults.puts() - before;
    assert!(puts < 16, "32 flushes took {puts} PUTs");
    for i in 0..32u64 {
        assert_eq!(read(&a, i * 4096, 4096), pattern(i as u8, 4096));
    }
}
