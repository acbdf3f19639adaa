//! The Time Machine event on a real engine: several `SnapshotHistory.plist`
//! renames in a row make one event snapshot, only in a timemachine dataset.

use dataset::*;
use std::ffi::OsStr;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

fn engine(dir: &std::path::Path) -> Arc<Engine> {
    let cfg = EngineConfig {
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    };
    let e = Engine::open(&dir.join("state"), cfg).unwrap();
    e.create_pool(PoolSpec {
        name: "tank".into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![dir.join("d0")],
        }],
        create_size: Some(256 << 20),
        force: false,
    })
    .unwrap();
    let fs = |name: &str, props: &[(&str, &str)]| {
        let props: Vec<(String, String)> = props
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        e.create_dataset(name, DatasetKind::Filesystem, &props)
            .unwrap();
    };
    fs("tank/tm", &[("timemachine", "on")]);
    fs("tank/plain", &[]);
    e
}

fn snapshots(e: &Engine, of: &str) -> Vec<String> {
    e.list_datasets(Some(of))
        .unwrap()
        .into_iter()
        .filter(|d| d.kind == DatasetKind::Snapshot)
        .map(|d| d.name)
        .collect()
}

#[test]
fn a_burst_of_marker_renames_is_one_event_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let e = engine(dir.path());
    let (tx, rx) = mpsc::channel();
    let quiet = Duration::from_millis(400);
    let w = smb::timemachine::Watcher::start(
        e.clone(),
        quiet,
        Some(Box::new(move |name: &str| {
            let _ = tx.send(name.to_string());
        })),
    );
    let started = Instant::now();
    for _ in 0..5 {
        w.renamed(
            "tank/tm",
            OsStr::new("com.apple.TimeMachine.SnapshotHistory.plist"),
        );
        w.renamed("tank/tm", OsStr::new("Info.plist"));
        w.renamed("tank/plain", OsStr::new("SnapshotHistory.plist"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let name = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    // Not before the quiet period after the last rename.
    assert!(started.elapsed() >= Duration::from_millis(400) + quiet);
    assert!(name.starts_with("tank/tm@tm-"), "{name}");
    // No second event for the same burst, none for the plain dataset.
    assert!(rx.recv_timeout(quiet * 3).is_err());
    assert_eq!(snapshots(&e, "tank/tm"), vec![name.clone()]);
    assert!(snapshots(&e, "tank/plain").is_empty());
    // The next backup is the next event, even within the same second.
    w.renamed("tank/tm", OsStr::new("SnapshotHistory.plist"));
    let second = rx.recv_timeout(Duration::from_secs(10)).unwrap();
    assert_ne!(second, name);
    assert_eq!(snapshots(&e, "tank/tm").len(), 2);
    w.stop();
    e.shutdown().unwrap();
}
