//! A warm standby (decision 0048) against a local-file store: it follows
//! the owner's log into its cache without writing to the store, and its
//! takeover fences the owner and applies only what it had not yet.

use objstore::OpenMode;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};
use vdev::bucket::{self, BucketConfig, BucketOpen, DEFAULT_INLINE_MAX};
use vdev::{DeviceState, Vdev};

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

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_standby_tails_writes_nothing_and_takes_over_from_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("standby-state");
    std::fs::create_dir_all(&state).unwrap();
    bucket::configure(&state, BucketConfig::default());
    let url = format!("file://{}/store", dir.path().display());
    let owner = Vdev::open_bucket(BucketOpen {
        url: &url,
        cache: &dir.path().join("owner.cache"),
        size: Some(SIZE),
        mode: OpenMode::Create,
        s3: Default::default(),
        node: "owner",
        inline_max: DEFAULT_INLINE_MAX,
        store: None,
    })
    .unwrap();
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
    let cache = bucket::cache_path(&state, &url);
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
    let again = Vdev::open_bucket(BucketOpen {
        url: &url,
        cache: &dir.path().join("third.cache"),
        size: None,
        mode: OpenMode::Takeover,
        s3: Default::default(),
        node: "third",
        inline_max: DEFAULT_INLINE_MAX,
        store: None,
    })
    .unwrap();
    assert_eq!(read(&again, 0, 8192), pattern(1, 8192));
    assert_eq!(read(&again, 12 << 20, 100), pattern(5, 100));
    assert_eq!(read(&again, 8192, 4096), pattern(4, 4096));
}
