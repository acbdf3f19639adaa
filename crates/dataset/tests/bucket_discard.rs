//! A pool in a bucket (file:// store) gives the bucket back what it frees
//! (decision 0054): destroying a volume discards its blocks at the device,
//! the discard ships as zeros, and background compaction then shrinks the
//! bucket's physical bytes as `pool list` reports them.

use dataset::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[allow(dead_code)]
mod common;

fn physical(engine: &Engine) -> Option<u64> {
    engine
        .list_pools()
        .into_iter()
        .find(|p| p.name == "tank")
        .and_then(|p| p.bucket)
        .and_then(|b| b.physical_bytes)
}

/// Waits (at most 30 s) until `ok` holds for the physical figure.
fn wait_physical(engine: &Engine, ok: impl Fn(u64) -> bool) -> u64 {
    let started = Instant::now();
    loop {
        let p = physical(engine).unwrap_or(0);
        if ok(p) || started.elapsed() > Duration::from_secs(30) {
            return p;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn destroying_a_volume_lets_compaction_shrink_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let bucket = dir.path().join("bucket");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::create_dir_all(&bucket).unwrap();
    vdev::bucket::configure(
        &state,
        vdev::bucket::BucketConfig {
            compact_interval_secs: Some(1),
            compact_grace_secs: Some(0),
            cache_bytes: Some(16 << 20),
            ..Default::default()
        },
    );
    let engine = Engine::open(&state, common::config()).unwrap();
    engine
        .create_pool(PoolSpec {
            name: "tank".into(),
            groups: vec![GroupSpec {
                kind: GroupKind::Disk,
                devices: vec![PathBuf::from(format!("file://{}", bucket.display()))],
            }],
            create_size: Some(256 << 20),
            force: false,
        })
        .unwrap();
    engine
        .create_volume("tank/v", 64 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    let vol = engine.open_volume("tank/v").unwrap();
    // 24 MiB that do not compress.
    let mut seed = *blake3::hash(b"bucket discard").as_bytes();
    for i in 0..24u64 {
        let mut data = Vec::with_capacity(1 << 20);
        while data.len() < 1 << 20 {
            seed = *blake3::hash(&seed).as_bytes();
            data.extend_from_slice(&seed);
        }
        vol.write(i << 20, &data, false).unwrap();
    }
    drop(vol);
    engine.sync_all().unwrap();
    let full = wait_physical(&engine, |p| p >= 24 << 20);
    assert!(full >= 24 << 20, "{full}");

    engine
        .destroy("tank/v", &DestroyOptions::default())
        .unwrap();
    engine.sync_all().unwrap();
    let after = wait_physical(&engine, |p| p + (16 << 20) <= full);
    assert!(after + (16 << 20) <= full, "{full} -> {after}");
    engine.shutdown().unwrap();
}
