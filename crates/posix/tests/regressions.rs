//! Bugs the model and crash tests found, each cut down to a few steps.

use dataset::*;
use posix::{Cred, Fs, ROOT};
use std::path::Path;
use std::sync::Arc;

fn engine(dir: &Path) -> Arc<Engine> {
    let engine = Engine::open(
        &dir.join("state"),
        EngineConfig {
            txg_timeout_secs: 3600.0,
            multihost_interval_ms: 50,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    engine
        .create_pool(PoolSpec {
            name: "tank".into(),
            groups: vec![GroupSpec {
                kind: GroupKind::Disk,
                devices: vec![dir.join("d0")],
            }],
            create_size: Some(256 << 20),
            force: false,
        })
        .unwrap();
    engine
}

fn fs(engine: &Engine, name: &str) -> Fs {
    Fs::new(engine.open_objects(name).unwrap()).unwrap()
}

fn shown(engine: &Engine, ds: &str, prop: &str) -> String {
    engine
        .dataset(ds)
        .unwrap()
        .property(prop)
        .unwrap()
        .value
        .clone()
}

/// casesensitivity, normalization and utf8only are fixed when a filesystem
/// is made: a clone keeps its origin's (its names were made under them),
/// and a child keeps what it inherited when it is moved under another
/// parent. (A clone of a case-insensitive filesystem looked names up
/// case-sensitively: `e.txt` could be created next to `E.txt`.)
#[test]
fn clones_and_moved_children_keep_the_name_rules_they_were_made_with() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    let rules = [
        ("casesensitivity".to_string(), "insensitive".to_string()),
        ("normalization".to_string(), "formD".to_string()),
        ("utf8only".to_string(), "on".to_string()),
    ];
    engine
        .create_dataset("tank/fs", DatasetKind::Filesystem, &rules)
        .unwrap();
    let me = Cred::default();
    fs(&engine, "tank/fs")
        .create(ROOT, b"E.txt", 0o644, &me)
        .unwrap();
    engine.snapshot(&["tank/fs@s".into()], false).unwrap();
    engine.clone_snapshot("tank/fs@s", "tank/c", &[]).unwrap();
    let r = engine.clone_snapshot(
        "tank/fs@s",
        "tank/c2",
        &[("casesensitivity".into(), "sensitive".into())],
    );
    assert!(
        matches!(r, Err(Error::InvalidArgument(_))),
        "a clone with other name rules than its origin's: {r:?}"
    );
    engine
        .create_dataset("tank/fs/child", DatasetKind::Filesystem, &[])
        .unwrap();
    engine.rename("tank/fs/child", "tank/moved", false).unwrap();
    for ds in ["tank/fs", "tank/c", "tank/moved"] {
        for (p, v) in &rules {
            assert_eq!(&shown(&engine, ds, p), v, "{ds} {p}");
        }
    }
    let clone = fs(&engine, "tank/c");
    assert_eq!(
        clone.create(ROOT, b"e.txt", 0o644, &me).unwrap_err().errno,
        libc::EEXIST,
        "the clone is case-insensitive"
    );
    assert_eq!(
        clone.lookup(ROOT, b"e.TXT").unwrap().ino,
        clone.lookup(ROOT, b"E.txt").unwrap().ino
    );
    let moved = fs(&engine, "tank/moved");
    moved.create(ROOT, b"A", 0o644, &me).unwrap();
    assert!(
        moved.lookup(ROOT, b"a").is_ok(),
        "the moved child is case-insensitive"
    );
    engine.shutdown().unwrap();
}

/// An inode number and generation name one file for ever (NFS handles,
/// Samba file ids), even across a kill -9 that loses a create nobody
/// fsynced: the next create may get its number again, never its
/// generation too. (After a crash the first txg reused the number of the
/// txg the lost create was made in.)
#[test]
fn a_create_lost_in_a_crash_never_comes_back_with_its_number_and_generation() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine(dir.path());
    engine
        .create_dataset("tank/fs", DatasetKind::Filesystem, &[])
        .unwrap();
    let me = Cred::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut engine = engine;
    for round in 0..4 {
        let fs1 = fs(&engine, "tank/fs");
        let mut made = Vec::new();
        if round % 2 == 1 {
            // Something to replay this time.
            made.push(
                fs1.create(ROOT, format!("kept{round}").as_bytes(), 0o644, &me)
                    .unwrap(),
            );
            fs1.fsync(ROOT).unwrap();
        }
        made.push(
            fs1.create(ROOT, format!("lost{round}").as_bytes(), 0o644, &me)
                .unwrap(),
        );
        for a in made {
            assert!(
                seen.insert((a.ino, a.generation)),
                "round {round}: inode {} generation {} was handed out before",
                a.ino,
                a.generation
            );
        }
        drop(fs1);
        Engine::forget_as_if_killed(engine);
        engine = Engine::open(
            &dir.path().join("state"),
            EngineConfig {
                txg_timeout_secs: 3600.0,
                multihost_interval_ms: 50,
                ..EngineConfig::default()
            },
        )
        .unwrap();
    }
    engine.shutdown().unwrap();
}
