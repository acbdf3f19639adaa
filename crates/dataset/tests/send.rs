//! Send and receive between two engines (two daemons' pools): volumes and
//! buckets, full then incremental, every snapshot equal bit for bit; bad
//! streams refused with the target unchanged.

use dataset::send::crash_point;
use dataset::*;
use rand::{Rng, SeedableRng};

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::{config, fill_random, resume, single_disk_engine as engine, small_txgs, Stall};

const BS: u64 = 4096;
const VOLSIZE: u64 = BS * 256;

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

fn send(e: &Engine, snap: &str, from: Option<&str>, intermediates: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let opts = SendOptions {
        snapshot: snap.into(),
        from: from.map(str::to_string),
        intermediates,
        ..Default::default()
    };
    let sum = e.send(&opts, &mut out).unwrap();
    assert_eq!(sum.bytes, out.len() as u64);
    let est = e.send_estimate(&opts).unwrap();
    assert!(
        est * 10 >= out.len() as u64 * 9 && est <= out.len() as u64 * 11 / 10 + 4096,
        "estimate {est} for a stream of {}",
        out.len()
    );
    out
}

fn receive(e: &Engine, target: &str, stream: &[u8], force: bool) -> Result<ReceiveSummary> {
    let mut inp = stream;
    e.receive(
        &ReceiveOptions {
            target: target.into(),
            force,
            ..Default::default()
        },
        &mut inp,
    )
}

fn scribble(v: &Volume, rng: &mut rand::rngs::StdRng, blocks: usize) {
    for _ in 0..blocks {
        let b = rng.random_range(0..VOLSIZE / BS);
        let mut data = vec![0u8; BS as usize];
        rng.fill(&mut data[..]);
        v.write(b * BS, &data, false).unwrap();
    }
}

#[test]
fn volume_full_then_incremental_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    src.create_volume("tank/vm", VOLSIZE, &[]).unwrap();
    let v = src.open_volume("tank/vm").unwrap();
    scribble(&v, &mut rng, 200);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    let full = send(&src, "tank/vm@a", None, false);
    let got = receive(&dst, "backup/vm", &full, false).unwrap();
    assert_eq!(got.snapshots, vec!["backup/vm@a".to_string()]);
    assert_eq!(read_vol(&dst, "backup/vm@a"), read_vol(&src, "tank/vm@a"));
    assert_eq!(read_vol(&dst, "backup/vm"), read_vol(&src, "tank/vm@a"));

    // Two more snapshots: overwrites and a trim; -I sends both.
    scribble(&v, &mut rng, 10);
    v.trim(0, 16 * BS, false).unwrap();
    src.snapshot(&["tank/vm@b".into()], false).unwrap();
    scribble(&v, &mut rng, 5);
    src.snapshot(&["tank/vm@c".into()], false).unwrap();
    let incr = send(&src, "tank/vm@c", Some("@a"), true);
    assert!(
        incr.len() < full.len() / 4,
        "incremental {} vs full {}",
        incr.len(),
        full.len()
    );
    // Refused while the target differs from @a, accepted with -F.
    dst.open_volume("backup/vm")
        .unwrap()
        .write(0, &[1u8; 4096], false)
        .unwrap();
    let e = receive(&dst, "backup/vm", &incr, false).unwrap_err();
    assert!(e.to_string().contains("modified"), "{e}");
    let got = receive(&dst, "backup/vm", &incr, true).unwrap();
    assert_eq!(
        got.snapshots,
        vec!["backup/vm@b".to_string(), "backup/vm@c".to_string()]
    );
    for s in ["a", "b", "c"] {
        assert_eq!(
            read_vol(&dst, &format!("backup/vm@{s}")),
            read_vol(&src, &format!("tank/vm@{s}")),
            "@{s}"
        );
    }
    // Survives a restart of the receiving engine.
    dst.sync_all().unwrap();
    let before = read_vol(&dst, "backup/vm@c");
    assert_eq!(before, read_vol(&src, "tank/vm@c"));
    // A full stream onto an existing dataset is refused.
    let e = receive(&dst, "backup/vm", &full, false).unwrap_err();
    assert!(e.to_string().contains("exists"), "{e}");
}

#[test]
fn damaged_streams_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    src.create_volume("tank/vm", VOLSIZE, &[]).unwrap();
    let v = src.open_volume("tank/vm").unwrap();
    scribble(&v, &mut rng, 100);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    let full = send(&src, "tank/vm@a", None, false);
    // Full stream: a flipped byte or a cut leaves no dataset behind.
    for at in [40, full.len() / 2, full.len() - 5] {
        let mut bad = full.clone();
        bad[at] ^= 1;
        let e = receive(&dst, "backup/vm", &bad, false).unwrap_err();
        assert!(e.to_string().contains("invalid send stream"), "{e}");
        assert!(
            dst.dataset("backup/vm").is_err(),
            "byte {at}: target left behind"
        );
    }
    let e = receive(&dst, "backup/vm", &full[..full.len() - 60], false).unwrap_err();
    assert!(e.to_string().contains("truncated"), "{e}");
    assert!(dst.dataset("backup/vm").is_err());
    receive(&dst, "backup/vm", &full, false).unwrap();
    // Incremental: the target stays at @a, head and all.
    scribble(&v, &mut rng, 30);
    src.snapshot(&["tank/vm@b".into()], false).unwrap();
    let incr = send(&src, "tank/vm@b", Some("tank/vm@a"), false);
    let want = read_vol(&dst, "backup/vm");
    let mut bad = incr.clone();
    let n = bad.len();
    bad[n / 2] ^= 0x80;
    receive(&dst, "backup/vm", &bad, false).unwrap_err();
    receive(&dst, "backup/vm", &incr[..n - 1], false).unwrap_err();
    assert_eq!(read_vol(&dst, "backup/vm"), want);
    assert!(dst.dataset("backup/vm@b").is_err());
    receive(&dst, "backup/vm", &incr, false).unwrap();
    assert_eq!(read_vol(&dst, "backup/vm@b"), read_vol(&src, "tank/vm@b"));
}

/// Every key's bytes of a bucket snapshot, via the object layer.
fn bucket_image(e: &Engine, name: &str) -> Vec<(String, Vec<u8>, Vec<u8>)> {
    let os = e.open_objects(name).unwrap();
    let mut out = Vec::new();
    for (key, obj) in os.list(objects::ROOT_DIR, "", None, 100_000).unwrap() {
        let a = os.attrs(obj).unwrap().unwrap();
        out.push((key, os.read(obj, 0, a.size).unwrap(), a.payload));
    }
    out
}

#[test]
fn bucket_full_then_incremental_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    src.create_dataset("tank/b", DatasetKind::Bucket, &[])
        .unwrap();
    let os = src.open_objects("tank/b").unwrap();
    let mut put = |key: &str, len: usize| {
        let mut data = vec![0u8; len];
        rng.fill(&mut data[..]);
        let obj = os.create(ObjectKind::File, key.as_bytes()).unwrap();
        os.write(obj, 0, &data).unwrap();
        if let Some(old) = os.link(objects::ROOT_DIR, key, obj).unwrap() {
            os.remove(old).unwrap();
        }
    };
    for i in 0..40 {
        put(&format!("k{i}"), [10, 3000, 200_000][i % 3]);
    }
    src.snapshot(&["tank/b@1".into()], false).unwrap();
    let full = send(&src, "tank/b@1", None, false);
    receive(&dst, "backup/b", &full, false).unwrap();
    assert_eq!(
        bucket_image(&dst, "backup/b@1"),
        bucket_image(&src, "tank/b@1")
    );
    assert_eq!(bucket_image(&dst, "backup/b@1").len(), 40);
    // Overwrite some, delete some, add some.
    for i in 0..5 {
        put(&format!("k{i}"), 5000);
    }
    for i in 10..15 {
        let obj = os
            .unlink(objects::ROOT_DIR, &format!("k{i}"))
            .unwrap()
            .unwrap();
        os.remove(obj).unwrap();
    }
    put("new", 150_000);
    src.snapshot(&["tank/b@2".into()], false).unwrap();
    let incr = send(&src, "tank/b@2", Some("@1"), false);
    receive(&dst, "backup/b", &incr, false).unwrap();
    assert_eq!(
        bucket_image(&dst, "backup/b@2"),
        bucket_image(&src, "tank/b@2")
    );
    assert_eq!(
        bucket_image(&dst, "backup/b@1"),
        bucket_image(&src, "tank/b@1")
    );
    // New objects on the target get fresh ids (next_object followed).
    let t = dst.open_objects("backup/b").unwrap();
    let obj = t.create(ObjectKind::File, b"").unwrap();
    assert!(bucket_image(&dst, "backup/b").len() == 36 && obj > 64);
    let src_ids: Vec<u64> = os
        .list(objects::ROOT_DIR, "", None, 1000)
        .unwrap()
        .into_iter()
        .map(|x| x.1)
        .collect();
    assert!(!src_ids.contains(&obj), "object id {obj} handed out twice");
}

fn prop_of(e: &Engine, ds: &str, name: &str) -> Option<String> {
    e.dataset(ds)
        .unwrap()
        .property(name)
        .map(|p| p.value.clone())
}

/// Kill -9 of the receiving engine mid-stream: after the restart the
/// target is its old self (no new snapshot, head as at @a); with -s it
/// also has a resume token, and `send -t` finishes the transfer equal.
#[test]
fn receive_killed_mid_stream_is_undone_or_resumable() {
    let dir = tempfile::tempdir().unwrap();
    let src = engine(dir.path(), "tank");
    let size = 32u64 << 20;
    src.create_volume("tank/vm", size, &[]).unwrap();
    let v = src.open_volume("tank/vm").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    fill_random(&v, &mut rng, size);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    fill_random(&v, &mut rng, size * 3 / 4);
    src.snapshot(&["tank/vm@b".into()], false).unwrap();
    let full = send(&src, "tank/vm@a", None, false);
    let incr = send(&src, "tank/vm@b", Some("@a"), false);

    for resumable in [false, true] {
        let state = dir.path().join(format!("state-r{resumable}"));
        let e = Engine::open(&state, small_txgs()).unwrap();
        let pool = format!("backup{}", resumable as u8);
        e.create_pool(PoolSpec {
            name: pool.clone(),
            groups: vec![GroupSpec {
                kind: GroupKind::Disk,
                devices: vec![dir.path().join(format!("{pool}-d0"))],
            }],
            create_size: Some(256 << 20),
            force: false,
        })
        .unwrap();
        let target = format!("{pool}/vm");
        receive(&e, &target, &full, false).unwrap();
        let old = read_vol(&e, &target);
        e.sync_all().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let stall = Stall {
            data: incr.clone(),
            at: 0,
            limit: incr.len() * 3 / 5,
            reached: Some(tx),
        };
        let e2 = e.clone();
        let t2 = target.clone();
        std::thread::spawn(move || {
            let mut r = stall;
            let _ = e2.receive(
                &ReceiveOptions {
                    target: t2,
                    resumable,
                    ..Default::default()
                },
                &mut r,
            );
        });
        rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        Engine::forget_as_if_killed(e);
        let e = Engine::open(&state, small_txgs()).unwrap();
        assert!(
            e.dataset(&format!("{target}@b")).is_err(),
            "half a snapshot"
        );
        assert_eq!(read_vol(&e, &format!("{target}@a")), old);
        let token = prop_of(&e, &target, "receive_resume_token");
        if !resumable {
            assert_eq!(token, None);
            assert_eq!(read_vol(&e, &target), old, "head not back to @a");
            receive(&e, &target, &incr, false).unwrap();
        } else {
            let token = token.expect("no receive_resume_token after an interrupted -s receive");
            // A new stream is refused while partial state is there.
            let err = receive(&e, &target, &incr, false).unwrap_err();
            assert!(err.to_string().contains("partially-complete"), "{err}");
            resume(&src, &e, token, &target);
            assert_eq!(prop_of(&e, &target, "receive_resume_token"), None);
        }
        assert_eq!(
            read_vol(&e, &format!("{target}@b")),
            read_vol(&src, "tank/vm@b")
        );
        assert_eq!(
            read_vol(&e, &format!("{target}@a")),
            read_vol(&src, "tank/vm@a")
        );
    }
}

/// Regression (issue 14, seed 14 run 9 of tests/test_send_interrupt.py):
/// a `-s` receive interrupted before its first checkpoint keeps state
/// whose token has no address yet. `send -t` of that token must make a
/// resume stream (not a new one, which the target refuses as
/// "partially-complete state" forever). Full and incremental, after a
/// kill -9 of the receiving engine and after a cut stream.
#[test]
fn resume_before_the_first_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let src = engine(dir.path(), "tank");
    let size = 8u64 << 20;
    src.create_volume("tank/vm", size, &[]).unwrap();
    let v = src.open_volume("tank/vm").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(14);
    fill_random(&v, &mut rng, size);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    scribble(&v, &mut rng, 200);
    src.snapshot(&["tank/vm@b".into()], false).unwrap();
    let full = send(&src, "tank/vm@a", None, false);
    let incr = send(&src, "tank/vm@b", Some("@a"), false);
    let rs = |e: &Engine, target: &str, stream: &[u8]| {
        let mut inp = stream;
        e.receive(
            &ReceiveOptions {
                target: target.into(),
                resumable: true,
                ..Default::default()
            },
            &mut inp,
        )
    };
    for (i, (incremental, kill)) in [(true, true), (false, true), (true, false), (false, false)]
        .into_iter()
        .enumerate()
    {
        let state = dir.path().join(format!("state-{i}"));
        let mut e = Engine::open(&state, small_txgs()).unwrap();
        let pool = format!("backup{i}");
        e.create_pool(PoolSpec {
            name: pool.clone(),
            groups: vec![GroupSpec {
                kind: GroupKind::Disk,
                devices: vec![dir.path().join(format!("{pool}-d0"))],
            }],
            create_size: Some(256 << 20),
            force: false,
        })
        .unwrap();
        let target = format!("{pool}/vm");
        let (stream, snap) = if incremental {
            receive(&e, &target, &full, false).unwrap();
            (&incr, "b")
        } else {
            (&full, "a")
        };
        // Far below the first checkpoint (1 MiB of rows).
        let cut = 64 << 10;
        if kill {
            e.sync_all().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            let mut r = Stall {
                data: stream.clone(),
                at: 0,
                limit: cut,
                reached: Some(tx),
            };
            let (e2, t2) = (e.clone(), target.clone());
            std::thread::spawn(move || {
                let _ = e2.receive(
                    &ReceiveOptions {
                        target: t2,
                        resumable: true,
                        ..Default::default()
                    },
                    &mut r,
                );
            });
            rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(300));
            Engine::forget_as_if_killed(e);
            e = Engine::open(&state, small_txgs()).unwrap();
        } else {
            let err = rs(&e, &target, &stream[..cut]).unwrap_err().to_string();
            assert!(err.contains("send -t"), "{err}");
        }
        assert!(
            e.dataset(&format!("{target}@{snap}")).is_err(),
            "half a snapshot"
        );
        if incremental {
            assert_eq!(
                read_vol(&e, &format!("{target}@a")),
                read_vol(&src, "tank/vm@a")
            );
        }
        let token = prop_of(&e, &target, "receive_resume_token")
            .expect("no receive_resume_token after an interrupted -s receive");
        // A new stream is still refused while the partial state is there...
        let err = rs(&e, &target, stream).unwrap_err().to_string();
        assert!(err.contains("partially-complete"), "{err}");
        // ...but the token's stream (all of it: nothing was committed) resumes.
        let mut rest = Vec::new();
        src.send(
            &SendOptions {
                resume_token: Some(token),
                ..Default::default()
            },
            &mut rest,
        )
        .unwrap();
        rs(&e, &target, &rest).unwrap();
        assert_eq!(prop_of(&e, &target, "receive_resume_token"), None);
        assert_eq!(
            read_vol(&e, &format!("{target}@{snap}")),
            read_vol(&src, &format!("tank/vm@{snap}")),
            "case {i}"
        );
    }
}

#[test]
fn resumable_receive_of_a_cut_stream_resumes_and_aborts() {
    let dir = tempfile::tempdir().unwrap();
    let src = engine(dir.path(), "tank");
    let e = Engine::open(&dir.path().join("dst"), small_txgs()).unwrap();
    e.create_pool(PoolSpec {
        name: "backup".into(),
        groups: vec![GroupSpec {
            kind: GroupKind::Disk,
            devices: vec![dir.path().join("backup-d0")],
        }],
        create_size: Some(256 << 20),
        force: false,
    })
    .unwrap();
    let size = 16u64 << 20;
    src.create_volume("tank/vm", size, &[]).unwrap();
    let v = src.open_volume("tank/vm").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    fill_random(&v, &mut rng, size);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    let full = send(&src, "tank/vm@a", None, false);
    let rs = |stream: &[u8]| {
        let mut inp = stream;
        e.receive(
            &ReceiveOptions {
                target: "backup/vm".into(),
                resumable: true,
                ..Default::default()
            },
            &mut inp,
        )
    };
    let err = rs(&full[..full.len() * 2 / 3]).unwrap_err().to_string();
    assert!(err.contains("send -t"), "{err}");
    let token = prop_of(&e, "backup/vm", "receive_resume_token").unwrap();
    // -A discards it: the dataset a full stream made is gone.
    e.receive_abort("backup/vm").unwrap();
    assert!(e.dataset("backup/vm").is_err());
    assert!(e.receive_abort("backup/vm").is_err());
    // Cut again, then resumed with the token: equal.
    rs(&full[..full.len() / 2]).unwrap_err();
    let token2 = prop_of(&e, "backup/vm", "receive_resume_token").unwrap();
    assert_ne!(token, token2);
    let mut rest = Vec::new();
    src.send(
        &SendOptions {
            resume_token: Some(token2),
            ..Default::default()
        },
        &mut rest,
    )
    .unwrap();
    assert!(
        rest.len() < full.len() * 3 / 4,
        "resumed {} of {}",
        rest.len(),
        full.len()
    );
    rs(&rest).unwrap();
    assert_eq!(read_vol(&e, "backup/vm@a"), read_vol(&src, "tank/vm@a"));
    assert!(src
        .send(
            &SendOptions {
                resume_token: Some("1-zz".into()),
                ..Default::default()
            },
            &mut Vec::new()
        )
        .is_err());
}

/// A bookmark keeps its snapshot's point in time after the snapshot is
/// destroyed and serves as an incremental source: overwrites, new blocks
/// and blocks trimmed since (tombstones kept for the bookmark) arrive.
#[test]
fn bookmark_is_an_incremental_source_after_its_snapshot_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(40);
    src.create_volume("tank/vm", VOLSIZE, &[]).unwrap();
    let v = src.open_volume("tank/vm").unwrap();
    scribble(&v, &mut rng, 100);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    receive(
        &dst,
        "backup/vm",
        &send(&src, "tank/vm@a", None, false),
        false,
    )
    .unwrap();

    src.bookmark("tank/vm@a", "#a").unwrap();
    let err = src.bookmark("tank/vm@a", "tank/vm#a").unwrap_err();
    assert!(err.to_string().contains("already exists"), "{err}");
    assert!(src.bookmark("tank/vm@a", "tank/other#x").is_err());
    assert!(src.bookmark("tank/vm@nope", "#x").is_err());
    src.destroy("tank/vm@a", &DestroyOptions::default())
        .unwrap();
    let marks = src.bookmarks(Some("tank")).unwrap();
    assert_eq!(marks.len(), 1);
    assert_eq!(marks[0].name, "tank/vm#a");
    assert_eq!(marks[0].snapshot, "tank/vm@a");

    // Changes after the bookmark: writes and a trim of blocks @a had.
    scribble(&v, &mut rng, 10);
    v.trim(0, 64 * BS, false).unwrap();
    src.snapshot(&["tank/vm@b".into()], false).unwrap();
    let incr = send(&src, "tank/vm@b", Some("#a"), false);
    let got = receive(&dst, "backup/vm", &incr, false).unwrap();
    assert_eq!(got.snapshots, vec!["backup/vm@b".to_string()]);
    assert_eq!(read_vol(&dst, "backup/vm@b"), read_vol(&src, "tank/vm@b"));
    // The long form names the same point.
    let again = send(&src, "tank/vm@b", Some("tank/vm#a"), false);
    assert_eq!(again.len(), incr.len());

    // Bookmarks survive export/import (they live in the dataset's record).
    src.export_pool("tank").unwrap();
    src.import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    assert_eq!(src.bookmarks(None).unwrap().len(), 1);
    let r = src
        .destroy("tank/vm#a", &DestroyOptions::default())
        .unwrap();
    assert_eq!(r.destroyed, vec!["tank/vm#a".to_string()]);
    assert!(src.bookmarks(None).unwrap().is_empty());
    assert!(send_err(&src, "tank/vm@b", "#a").contains("tank/vm#a"));
}

fn send_err(e: &Engine, snap: &str, from: &str) -> String {
    let opts = SendOptions {
        snapshot: snap.into(),
        from: Some(from.into()),
        ..Default::default()
    };
    e.send(&opts, &mut Vec::new()).unwrap_err().to_string()
}

/// `send -R`: a filesystem with a volume and a filesystem below it, their
/// snapshots and local properties, received as the same tree; the
/// incremental -R sends a child created since in full.
#[test]
fn recursive_send_of_a_tree() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    let note = [("com.example:note".to_string(), "kept".to_string())];
    src.create_dataset("tank/top", DatasetKind::Filesystem, &note)
        .unwrap();
    src.create_volume(
        "tank/top/vol",
        VOLSIZE,
        &[("compression".into(), "lz4".into())],
    )
    .unwrap();
    src.create_dataset("tank/top/fs", DatasetKind::Filesystem, &[])
        .unwrap();
    scribble(&src.open_volume("tank/top/vol").unwrap(), &mut rng, 50);
    src.snapshot(&["tank/top@a".into()], true).unwrap();
    let full = send_opts(&src, "tank/top@a", None, true);
    let got = receive(&dst, "backup/top", &full, false).unwrap();
    assert_eq!(
        got.snapshots,
        vec!["backup/top@a", "backup/top/fs@a", "backup/top/vol@a"]
    );
    assert_eq!(
        read_vol(&dst, "backup/top/vol@a"),
        read_vol(&src, "tank/top/vol@a")
    );
    let prop = |e: &Engine, ds: &str, p: &str| {
        e.dataset(ds)
            .unwrap()
            .property(p)
            .map(|x| x.value.clone())
            .unwrap_or_default()
    };
    assert_eq!(prop(&dst, "backup/top", "com.example:note"), "kept");
    assert_eq!(prop(&dst, "backup/top/vol", "compression"), "lz4");

    // A child created between the snapshots arrives in full.
    src.create_volume("tank/top/new", VOLSIZE, &[]).unwrap();
    scribble(&src.open_volume("tank/top/new").unwrap(), &mut rng, 20);
    scribble(&src.open_volume("tank/top/vol").unwrap(), &mut rng, 5);
    src.snapshot(&["tank/top@b".into()], true).unwrap();
    let incr = send_opts(&src, "tank/top@b", Some("@a"), true);
    assert!(incr.len() < full.len(), "{} vs {}", incr.len(), full.len());
    let got = receive(&dst, "backup/top", &incr, false).unwrap();
    assert_eq!(
        got.snapshots,
        vec![
            "backup/top@b",
            "backup/top/fs@b",
            "backup/top/new@b",
            "backup/top/vol@b"
        ]
    );
    for v in ["vol", "new"] {
        assert_eq!(
            read_vol(&dst, &format!("backup/top/{v}@b")),
            read_vol(&src, &format!("tank/top/{v}@b")),
            "{v}"
        );
    }
    // A child destroyed on the source stays on the target, unless -F.
    src.destroy(
        "tank/top/fs",
        &DestroyOptions {
            recursive: true,
            ..Default::default()
        },
    )
    .unwrap();
    src.snapshot(&["tank/top@c".into()], true).unwrap();
    let got = receive(
        &dst,
        "backup/top",
        &send_opts(&src, "tank/top@c", Some("@b"), true),
        false,
    )
    .unwrap();
    assert!(got.destroyed.is_empty());
    assert!(dst.dataset("backup/top/fs").is_ok());
    src.snapshot(&["tank/top@d".into()], true).unwrap();
    let got = receive(
        &dst,
        "backup/top",
        &send_opts(&src, "tank/top@d", Some("@c"), true),
        true,
    )
    .unwrap();
    assert_eq!(got.destroyed, vec!["backup/top/fs".to_string()]);
    assert!(dst.dataset("backup/top/fs").is_err());
    assert_eq!(
        read_vol(&dst, "backup/top/vol@d"),
        read_vol(&src, "tank/top/vol@d")
    );
    // Version 3 (decision 0050): a plain (non -R) stream without flags.
    let plain = send(&src, "tank/top/vol@b", None, false);
    assert_eq!(&plain[8..16], &[3, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&full[8..12], &3u32.to_le_bytes());
}

fn send_opts(e: &Engine, snap: &str, from: Option<&str>, recursive: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let opts = SendOptions {
        snapshot: snap.into(),
        from: from.map(str::to_string),
        recursive,
        ..Default::default()
    };
    e.send(&opts, &mut out).unwrap();
    out
}

/// Regression (issue 14, decision 0051): a kill -9 right after a full
/// receive created its dataset. The dataset used to be created in one
/// metadata transaction and marked as being received in the next, so a
/// kill between them left an empty, unmarked dataset that the next full
/// receive refused ("exists, must specify -F") and no token resumed.
/// Now it is created marked: without -s the restart removes it and the
/// stream is received again; with -s it resumes with `send -t`.
#[test]
fn full_receive_killed_after_creating_its_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let src = engine(dir.path(), "tank");
    src.create_volume("tank/vm", VOLSIZE, &[]).unwrap();
    let v = src.open_volume("tank/vm").unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(51);
    scribble(&v, &mut rng, 64);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    let full = send(&src, "tank/vm@a", None, false);
    // Blocks the receives into these targets where they were prepared
    // (the engine is "killed" meanwhile); other tests' receives go on.
    // Once per target: the receives after the restart go through.
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let tx = std::sync::Mutex::new(tx);
    let fired = std::sync::Mutex::new(std::collections::BTreeSet::new());
    crash_point::set(Some(std::sync::Arc::new(
        move |point: &str, target: &str| {
            if point == "prepared"
                && target.starts_with("kwin")
                && fired.lock().unwrap().insert(target.to_string())
            {
                let _ = tx.lock().unwrap().send(target.to_string());
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        },
    )));
    for resumable in [false, true] {
        let pool = format!("kwin{}", resumable as u8);
        let state = dir.path().join(format!("state-{pool}"));
        let e = engine(dir.path(), &pool);
        let target = format!("{pool}/vm");
        let (e2, t2, stream) = (e.clone(), target.clone(), full.clone());
        std::thread::spawn(move || {
            let _ = e2.receive(
                &ReceiveOptions {
                    target: t2,
                    resumable,
                    ..Default::default()
                },
                &mut stream.as_slice(),
            );
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(60)).unwrap();
        assert_eq!(got, target);
        Engine::forget_as_if_killed(e);
        let e = Engine::open(&state, config()).unwrap();
        assert!(
            e.dataset(&format!("{target}@a")).is_err(),
            "half a snapshot"
        );
        if !resumable {
            // Removed at import: the same full stream is received again.
            assert!(e.dataset(&target).is_err(), "an empty dataset stayed");
            receive(&e, &target, &full, false).unwrap();
        } else {
            let token = prop_of(&e, &target, "receive_resume_token")
                .expect("no receive_resume_token after an interrupted -s receive");
            resume(&src, &e, token, &target);
            assert_eq!(prop_of(&e, &target, "receive_resume_token"), None);
        }
        assert_eq!(
            read_vol(&e, &format!("{target}@a")),
            read_vol(&src, "tank/vm@a")
        );
    }
    crash_point::set(None);
}

/// A stream that hands out `limit` bytes, says so, then fails when told to
/// (a connection cut while the receive runs).
struct CutLater {
    data: Vec<u8>,
    at: usize,
    limit: usize,
    reached: Option<std::sync::mpsc::Sender<()>>,
    cut: std::sync::mpsc::Receiver<()>,
}

impl std::io::Read for CutLater {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at >= self.limit {
            if let Some(tx) = self.reached.take() {
                let _ = tx.send(());
            }
            let _ = self.cut.recv_timeout(std::time::Duration::from_secs(60));
            return Err(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "connection lost: cut",
            ));
        }
        let n = out.len().min(self.limit - self.at);
        out[..n].copy_from_slice(&self.data[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// A retry reads the resume token only after the cut receive ended
/// (`receive_wait`): while it runs the wait is bounded and says why; after
/// it, the token is the one the ended receive saved.
#[test]
fn receive_wait_ends_with_the_running_receive() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let size = 4u64 << 20;
    src.create_volume("tank/vm", size, &[]).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(64);
    fill_random(&src.open_volume("tank/vm").unwrap(), &mut rng, size);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    let full = send(&src, "tank/vm@a", None, false);
    let short = std::time::Duration::from_millis(50);
    // Nothing running (and no dataset yet): no wait.
    dst.receive_wait("backup/vm", short).unwrap();
    assert!(dst.receive_wait("nopool/vm", short).is_err());
    let (reached_tx, reached) = std::sync::mpsc::channel();
    let (cut, cut_rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        let dst = &dst;
        let limit = full.len() / 2;
        let data = full.clone();
        let t = s.spawn(move || {
            let mut inp = CutLater {
                data,
                at: 0,
                limit,
                reached: Some(reached_tx),
                cut: cut_rx,
            };
            dst.receive(
                &ReceiveOptions {
                    target: "backup/vm".into(),
                    resumable: true,
                    ..Default::default()
                },
                &mut inp,
            )
        });
        reached
            .recv_timeout(std::time::Duration::from_secs(60))
            .unwrap();
        let err = dst.receive_wait("backup/vm", short).unwrap_err();
        assert!(matches!(err, Error::Busy(_)), "{err}");
        assert!(err.to_string().contains("still running"), "{err}");
        cut.send(()).unwrap();
        dst.receive_wait("backup/vm", std::time::Duration::from_secs(60))
            .unwrap();
        // Ended: the receive has returned (its claim is released last).
        assert!(t.join().unwrap().is_err());
    });
    let token = prop_of(&dst, "backup/vm", "receive_resume_token").unwrap();
    resume(&src, &dst, token, "backup/vm");
    assert_eq!(read_vol(&dst, "backup/vm@a"), read_vol(&src, "tank/vm@a"));
}
