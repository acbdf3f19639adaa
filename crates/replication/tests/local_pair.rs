//! A job's run between two engines (two daemons' pools) in one process,
//! both ends through `side::Local`: full then incremental streams, holds
//! moving to the new common snapshot, divergence refused then forced,
//! pruning each side with its own grid. The HTTP transport is covered by
//! tests/test_replication.py.

use dataset::policy::{Policies, PolicyConfig};
use dataset::*;
use replication::job::{self, JobConfig};
use replication::run::{self, Ctx};
use replication::side::{Local, Side};
use replication::stream::Progress;
use replication::Error;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

fn engine(dir: &Path, pool: &str) -> Arc<Engine> {
    let e = Engine::open(
        &dir.join(format!("state-{pool}")),
        EngineConfig {
            txg_timeout_secs: 3600.0,
            multihost_interval_ms: 50,
            policy_tick_secs: 0.0,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    e.create_pool(PoolSpec {
        name: pool.into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![dir.join(format!("{pool}-d0"))],
        }],
        create_size: Some(256 << 20),
        force: false,
    })
    .unwrap();
    e
}

fn read_vol(e: &Engine, name: &str) -> Vec<u8> {
    let v = e.open_volume(name).unwrap();
    let mut out = Vec::new();
    for seg in v.read(0, v.size()).unwrap() {
        match seg {
            ReadSegment::Data(d) => out.extend_from_slice(&d),
            ReadSegment::Hole(n) => out.resize(out.len() + n as usize, 0),
        }
    }
    out
}

fn write(e: &Engine, vol: &str, seed: u8, offset: u64) {
    let v = e.open_volume(vol).unwrap();
    let data: Vec<u8> = (0..65536u32).map(|i| (i as u8) ^ seed).collect();
    v.write(offset, &data, true).unwrap();
}

fn policies() -> Policies {
    let grid = |keep: &str| PolicyConfig {
        schedule: "none".into(),
        keep: Some(keep.into()),
        ..Default::default()
    };
    Policies::from_config(&BTreeMap::from([
        ("short".to_string(), grid("last=2")),
        ("long".to_string(), grid("last=4")),
    ]))
    .unwrap()
}

fn names(side: &dyn Side) -> Vec<String> {
    side.snapshots()
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect()
}

fn holds(e: &Engine, snap: &str) -> Vec<String> {
    e.holds(&[snap.to_string()])
        .unwrap()
        .into_iter()
        .map(|(_, t)| t)
        .collect()
}

#[test]
fn runs_between_two_engines() {
    let dir = tempfile::tempdir().unwrap();
    let a = engine(dir.path(), "tank");
    let b = engine(dir.path(), "tank2");
    a.create_volume("tank/vm", 1 << 20, &[]).unwrap();
    let snaps: Vec<String> = (0..6).map(|i| format!("auto-2026-11-2{i}T0000Z")).collect();
    for (i, s) in snaps.iter().enumerate() {
        write(&a, "tank/vm", i as u8, i as u64 * 65536);
        a.snapshot(&[format!("tank/vm@{s}")], false).unwrap();
    }
    let pol = policies();
    let cfg = JobConfig {
        source: "tank/vm".into(),
        target: "https://backup:1/tank2/vm".into(),
        policy: Some("long".into()),
        source_policy: Some("short".into()),
        ..Default::default()
    };
    let job = job::check("j", &cfg, &pol, false).unwrap();
    let src = Local {
        engine: a.clone(),
        dataset: "tank/vm".into(),
    };
    let dst = Local {
        engine: b.clone(),
        dataset: "tank2/vm".into(),
    };
    let total = Arc::new(AtomicU64::new(0));
    let go = |force: bool, last: Option<String>| {
        let ctx = Ctx {
            job: &job,
            src: &src,
            dst: &dst,
            policies: &pol,
            progress: Progress::new(),
            total: total.clone(),
            force,
            last_common: last,
            now: replication::now_secs(),
            partial_full: false,
            mark_full: &|_| {},
        };
        run::run(&ctx)
    };
    // Full stream of the oldest, then -I to the newest; each side pruned.
    let (out, err) = go(false, None);
    assert!(err.is_none(), "{err:?}");
    assert_eq!(out.streams.len(), 2, "{:?}", out.streams);
    assert_eq!(names(&src), snaps[4..]);
    assert_eq!(names(&dst), snaps[2..]);
    assert_eq!(out.pruned_target, snaps[..2]);
    assert_eq!(read_vol(&a, "tank/vm"), read_vol(&b, "tank2/vm"));
    for s in &snaps[4..] {
        assert_eq!(
            read_vol(&a, &format!("tank/vm@{s}")),
            read_vol(&b, &format!("tank2/vm@{s}")),
            "{s}"
        );
    }
    assert_eq!(b.property_value("tank2/vm", "readonly").unwrap(), "on");
    let common = snaps[5].clone();
    assert_eq!(out.common.as_deref(), Some(common.as_str()));
    assert_eq!(holds(&a, &format!("tank/vm@{common}")), ["replication:j"]);
    assert_eq!(holds(&b, &format!("tank2/vm@{common}")), ["replication:j"]);
    // Up to date: nothing sent.
    let (out, err) = go(false, Some(common.clone()));
    assert!(err.is_none() && out.up_to_date && out.streams.is_empty());

    // The target changes: refused, naming what changed; then forced.
    b.set_property("tank2/vm", "readonly", "off").unwrap();
    write(&b, "tank2/vm", 99, 0);
    b.snapshot(&["tank2/vm@local".to_string()], false).unwrap();
    write(&a, "tank/vm", 7, 3 * 65536);
    let next = "auto-2026-11-27T0000Z".to_string();
    a.snapshot(&[format!("tank/vm@{next}")], false).unwrap();
    let (_, err) = go(false, Some(common.clone()));
    match err {
        Some(Error::Diverged(m)) => {
            assert!(
                m.contains("@local") && m.contains(&format!("@{common}")),
                "{m}"
            )
        }
        other => panic!("expected Diverged, got {other:?}"),
    }
    assert!(names(&dst).contains(&"local".to_string()));
    let (out, err) = go(true, Some(common.clone()));
    assert!(err.is_none(), "{err:?}");
    assert!(!names(&dst).contains(&"local".to_string()));
    assert_eq!(read_vol(&a, "tank/vm"), read_vol(&b, "tank2/vm"));
    // The hold moved: the old common is free on both sides, the new one held.
    assert_eq!(out.common.as_deref(), Some(next.as_str()));
    assert!(holds(&a, &format!("tank/vm@{common}")).is_empty() || !names(&src).contains(&common));
    assert!(holds(&b, &format!("tank2/vm@{common}")).is_empty());
    assert_eq!(holds(&b, &format!("tank2/vm@{next}")), ["replication:j"]);
    // A held common snapshot cannot be destroyed by hand.
    assert!(b
        .destroy(&format!("tank2/vm@{next}"), &DestroyOptions::default())
        .is_err());
}
