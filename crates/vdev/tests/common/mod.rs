//! Helpers shared by the bucket device tests.

use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use objstore::OpenMode;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use vdev::bucket::{BucketOpen, DEFAULT_INLINE_MAX};
use vdev::Vdev;

/// Size of every test device.
pub const SIZE: u64 = 64 << 20;

/// A bucket device of `SIZE` at prefix `pool` of `store`, cache file `cache`,
/// opened by `node` as `mode` says (`url` only names it).
pub fn open(
    url: &str,
    store: &Arc<dyn ObjectStore>,
    cache: &Path,
    node: &str,
    mode: OpenMode,
) -> Result<Vdev, vdev::VdevError> {
    open_with(url, store, cache, node, mode, None)
}

/// [`open`] with the cache bounded to `bound` bytes, filled on demand
/// (decision 0054); `None` keeps a full copy.
pub fn open_with(
    url: &str,
    store: &Arc<dyn ObjectStore>,
    cache: &Path,
    node: &str,
    mode: OpenMode,
    bound: Option<u64>,
) -> Result<Vdev, vdev::VdevError> {
    Vdev::open_bucket_with(
        BucketOpen {
            url,
            cache,
            size: Some(SIZE),
            mode,
            s3: Default::default(),
            node,
            inline_max: DEFAULT_INLINE_MAX,
            store: Some((store.clone(), ObjPath::from("pool"))),
        },
        bound,
    )
}

/// A bucket device at `url` itself (no store handed in), cache file
/// `cache`, opened by `node` as `mode` says; `size` only when creating.
pub fn open_url(url: &str, cache: &Path, size: Option<u64>, node: &str, mode: OpenMode) -> Vdev {
    Vdev::open_bucket(BucketOpen {
        url,
        cache,
        size,
        mode,
        s3: Default::default(),
        node,
        inline_max: DEFAULT_INLINE_MAX,
        store: None,
    })
    .unwrap()
}

/// Waits up to 20 s for `f`, polling every 20 ms.
pub fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + Duration::from_secs(20);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
