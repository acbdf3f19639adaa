//! `send -w` (raw, decision 0044) between two engines: blocks travel as
//! stored (compressed as on disk, sealed with the source's key), so an
//! encrypted dataset — sealed names too — is sent without its key, and
//! the target opens with the source's key once `load-key` runs.

use dataset::*;
use rand::{Rng, SeedableRng};

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::{fill_random, resume, single_disk_engine as engine, small_txgs, Stall};

const BS: u64 = 16384;
const VOLSIZE: u64 = BS * 256;
const HEX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

fn material() -> KeyMaterial {
    KeyMaterial::from_bytes(HEX.as_bytes())
}

fn props(p: &[(&str, &str)]) -> Vec<(String, String)> {
    p.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn crypt_props() -> Vec<(String, String)> {
    props(&[
        ("encryption", "on"),
        ("keyformat", "hex"),
        ("keylocation", "prompt"),
        ("compression", "lz4"),
        ("volblocksize", "16384"),
    ])
}

fn read_vol(e: &Engine, name: &str) -> Result<Vec<u8>> {
    let v = e.open_volume(name)?;
    let mut out = Vec::new();
    for seg in v.read(0, v.size())? {
        match seg {
            ReadSegment::Data(d) => out.extend_from_slice(&d),
            ReadSegment::Hole(n) => out.resize(out.len() + n as usize, 0),
        }
    }
    Ok(out)
}

fn send_raw(e: &Engine, snap: &str, from: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    let opts = SendOptions {
        snapshot: snap.into(),
        from: from.map(str::to_string),
        intermediates: from.is_some(),
        raw: true,
        ..Default::default()
    };
    let sum = e.send(&opts, &mut out).unwrap();
    assert_eq!(sum.bytes, out.len() as u64);
    // Version 3 (decision 0050) with the RAW flag (bit 1).
    assert_eq!(&out[8..12], &3u32.to_le_bytes());
    assert_eq!(&out[12..16], &2u32.to_le_bytes());
    out
}

fn receive(e: &Engine, target: &str, stream: &[u8]) -> Result<ReceiveSummary> {
    let mut inp = stream;
    e.receive(
        &ReceiveOptions {
            target: target.into(),
            ..Default::default()
        },
        &mut inp,
    )
}

fn prop_of(e: &Engine, ds: &str, name: &str) -> String {
    e.dataset(ds)
        .unwrap()
        .property(name)
        .map(|p| p.value.clone())
        .unwrap_or_default()
}

/// Half compressible text, half random: lz4 shrinks some blocks only.
fn scribble(v: &Volume, rng: &mut rand::rngs::StdRng, blocks: usize) {
    for _ in 0..blocks {
        let b = rng.random_range(0..VOLSIZE / BS);
        let mut data = vec![0u8; BS as usize];
        if b % 2 == 0 {
            rng.fill(&mut data[..]);
        } else {
            let word = format!("block {b} {} ", rng.random::<u32>());
            for (i, c) in data.iter_mut().enumerate() {
                *c = word.as_bytes()[i % word.len()];
            }
        }
        v.write(b * BS, &data, false).unwrap();
    }
}

#[test]
fn raw_compressed_volume_full_and_incremental() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(44);
    let p = props(&[("compression", "lz4"), ("volblocksize", "16384")]);
    src.create_volume("tank/vm", VOLSIZE, &p).unwrap();
    let v = src.open_volume("tank/vm").unwrap();
    scribble(&v, &mut rng, 200);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    let full = send_raw(&src, "tank/vm@a", None);
    let mut plain = Vec::new();
    let opts = SendOptions {
        snapshot: "tank/vm@a".into(),
        ..Default::default()
    };
    src.send(&opts, &mut plain).unwrap();
    // Plain streams are version 3 without flags; raw ones carry blocks as
    // compressed on disk.
    assert_eq!(&plain[8..16], &[3, 0, 0, 0, 0, 0, 0, 0]);
    assert!(
        full.len() < plain.len() * 9 / 10,
        "raw {} plain {}",
        full.len(),
        plain.len()
    );
    receive(&dst, "backup/vm", &full).unwrap();
    assert_eq!(
        read_vol(&dst, "backup/vm@a").unwrap(),
        read_vol(&src, "tank/vm@a").unwrap()
    );

    scribble(&v, &mut rng, 20);
    v.trim(0, 8 * BS, false).unwrap();
    src.snapshot(&["tank/vm@b".into()], false).unwrap();
    scribble(&v, &mut rng, 5);
    src.snapshot(&["tank/vm@c".into()], false).unwrap();
    let incr = send_raw(&src, "tank/vm@c", Some("@a"));
    let got = receive(&dst, "backup/vm", &incr).unwrap();
    assert_eq!(
        got.snapshots,
        vec!["backup/vm@b".to_string(), "backup/vm@c".to_string()]
    );
    for s in ["b", "c"] {
        assert_eq!(
            read_vol(&dst, &format!("backup/vm@{s}")).unwrap(),
            read_vol(&src, &format!("tank/vm@{s}")).unwrap()
        );
    }
}

#[test]
fn raw_encrypted_volume_needs_no_key_to_send_and_opens_with_the_source_key() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    src.create_volume_keyed("tank/sec", VOLSIZE, &crypt_props(), Some(&material()))
        .unwrap();
    let v = src.open_volume("tank/sec").unwrap();
    scribble(&v, &mut rng, 150);
    drop(v);
    src.snapshot(&["tank/sec@a".into()], false).unwrap();
    let want_a = read_vol(&src, "tank/sec@a").unwrap();
    src.unload_key("tank/sec").unwrap();
    assert!(read_vol(&src, "tank/sec@a").is_err());
    // A plain send needs the key; a raw one does not.
    let mut out = Vec::new();
    let plain = SendOptions {
        snapshot: "tank/sec@a".into(),
        ..Default::default()
    };
    assert!(src.send(&plain, &mut out).is_err());
    let full = send_raw(&src, "tank/sec@a", None);
    // The key never travels: its bytes are nowhere in the stream.
    let key = hex_bytes(HEX);
    assert!(!full.windows(key.len()).any(|w| w == key.as_slice()));

    receive(&dst, "backup/sec", &full).unwrap();
    assert_eq!(prop_of(&dst, "backup/sec", "keystatus"), "unavailable");
    assert_eq!(prop_of(&dst, "backup/sec", "encryptionroot"), "backup/sec");
    assert!(read_vol(&dst, "backup/sec@a").is_err());
    dst.load_key("backup/sec", None, Some(&material()), false)
        .unwrap();
    assert_eq!(read_vol(&dst, "backup/sec@a").unwrap(), want_a);
    dst.unload_key("backup/sec").unwrap();

    // Incremental, sender and receiver both without the key.
    src.load_key("tank/sec", None, Some(&material()), false)
        .unwrap();
    let v = src.open_volume("tank/sec").unwrap();
    scribble(&v, &mut rng, 30);
    drop(v);
    src.snapshot(&["tank/sec@b".into()], false).unwrap();
    let want_b = read_vol(&src, "tank/sec@b").unwrap();
    src.unload_key("tank/sec").unwrap();
    let incr = send_raw(&src, "tank/sec@b", Some("@a"));
    receive(&dst, "backup/sec", &incr).unwrap();
    dst.load_key("backup/sec", None, Some(&material()), false)
        .unwrap();
    assert_eq!(read_vol(&dst, "backup/sec@b").unwrap(), want_b);
    assert_eq!(read_vol(&dst, "backup/sec@a").unwrap(), want_a);
    // A wrong key is still refused on the target.
    dst.unload_key("backup/sec").unwrap();
    let wrong = KeyMaterial::from_bytes("11".repeat(32).as_bytes());
    assert!(dst
        .load_key("backup/sec", None, Some(&wrong), false)
        .is_err());

    // Into an unencrypted dataset: refused, clearly, nothing changed.
    let p = props(&[("volblocksize", "16384")]);
    dst.create_volume("backup/clear", VOLSIZE, &p).unwrap();
    dst.snapshot(&["backup/clear@a".into()], false).unwrap();
    let e = receive(&dst, "backup/clear", &incr)
        .unwrap_err()
        .to_string();
    assert!(e.contains("not encrypted"), "{e}");
    // An unencrypted raw stream under an encrypted dataset: refused too.
    src.create_volume("tank/open", VOLSIZE, &p).unwrap();
    src.snapshot(&["tank/open@a".into()], false).unwrap();
    let open = send_raw(&src, "tank/open@a", None);
    let e = receive(&dst, "backup/sec/x", &open)
        .unwrap_err()
        .to_string();
    assert!(e.contains("encrypted"), "{e}");
    assert!(dst.dataset("backup/sec/x").is_err());
}

fn hex_bytes(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

fn bucket_image(e: &Engine, name: &str) -> Vec<(String, Vec<u8>)> {
    let os = e.open_objects(name).unwrap();
    let mut out = Vec::new();
    for (key, obj) in os.list(objects::ROOT_DIR, "", None, 100_000).unwrap() {
        let a = os.attrs(obj).unwrap().unwrap();
        out.push((key, os.read(obj, 0, a.size).unwrap()));
    }
    out
}

#[test]
fn raw_sealed_names_bucket_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut cp = crypt_props();
    cp.retain(|(k, _)| k != "volblocksize");
    src.create_dataset_keyed("tank/b", DatasetKind::Bucket, &cp, Some(&material()))
        .unwrap();
    let os = src.open_objects("tank/b").unwrap();
    let put = |key: &str, data: &[u8]| {
        let obj = os.create(ObjectKind::File, key.as_bytes()).unwrap();
        os.write(obj, 0, data).unwrap();
        if let Some(old) = os.link(objects::ROOT_DIR, key, obj).unwrap() {
            os.remove(old).unwrap();
        }
    };
    for i in 0..30 {
        put(&format!("k{i}"), &vec![i as u8; [10, 3000, 70_000][i % 3]]);
    }
    src.snapshot(&["tank/b@1".into()], false).unwrap();
    let want1 = bucket_image(&src, "tank/b@1");
    // Sealed names: a plain send is refused, a raw one needs no key.
    let mut out = Vec::new();
    let plain = SendOptions {
        snapshot: "tank/b@1".into(),
        ..Default::default()
    };
    assert!(src.send(&plain, &mut out).is_err());
    for i in 0..3 {
        put(&format!("k{i}"), b"changed");
    }
    let obj = os.unlink(objects::ROOT_DIR, "k9").unwrap().unwrap();
    os.remove(obj).unwrap();
    put("new", b"new object");
    drop(os);
    src.snapshot(&["tank/b@2".into()], false).unwrap();
    let want2 = bucket_image(&src, "tank/b@2");
    src.unload_key("tank/b").unwrap();
    let full = send_raw(&src, "tank/b@1", None);
    let incr = send_raw(&src, "tank/b@2", Some("@1"));
    // Names are sealed in the stream too.
    assert!(!full.windows(3).any(|w| w == b"k17"));
    receive(&dst, "backup/b", &full).unwrap();
    receive(&dst, "backup/b", &incr).unwrap();
    assert_eq!(prop_of(&dst, "backup/b", "keystatus"), "unavailable");
    dst.load_key("backup/b", None, Some(&material()), false)
        .unwrap();
    assert_eq!(bucket_image(&dst, "backup/b@1"), want1);
    assert_eq!(bucket_image(&dst, "backup/b@2"), want2);
    assert_eq!(bucket_image(&dst, "backup/b"), want2);
}

#[test]
fn damaged_raw_streams_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let p = props(&[("compression", "lz4"), ("volblocksize", "16384")]);
    src.create_volume("tank/vm", VOLSIZE, &p).unwrap();
    scribble(&src.open_volume("tank/vm").unwrap(), &mut rng, 60);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    let full = send_raw(&src, "tank/vm@a", None);
    for at in [40, full.len() / 3, full.len() / 2, full.len() - 20] {
        let mut bad = full.clone();
        bad[at] ^= 0x01;
        let e = receive(&dst, "backup/vm", &bad).unwrap_err().to_string();
        assert!(e.contains("invalid send stream"), "byte {at}: {e}");
        assert!(
            dst.dataset("backup/vm").is_err(),
            "byte {at} left a dataset"
        );
    }
    let e = receive(&dst, "backup/vm", &full[..full.len() / 2])
        .unwrap_err()
        .to_string();
    assert!(e.contains("truncated"), "{e}");
    assert!(dst.dataset("backup/vm").is_err());
    receive(&dst, "backup/vm", &full).unwrap();
}

/// `stream` rewritten record by record as an earlier build wrote it
/// (version 1 without flags, 2 with them): every byte in the checkpoints.
fn as_version(stream: &[u8], version: u32) -> Vec<u8> {
    use dataset::send::stream::{Kind, Reader, Writer};
    let mut inp = stream;
    let mut r = Reader::new(&mut inp).unwrap();
    let mut out = Vec::new();
    let mut w = Writer::with_version(&mut out, r.flags, version).unwrap();
    while let Some(rec) = r.read_record().unwrap() {
        match rec.kind {
            Kind::SnapEnd | Kind::End => w.checkpoint(rec.kind).unwrap(),
            k => w.record(k, &[&rec.payload]).unwrap(),
        }
    }
    w.flush().unwrap();
    drop(w);
    assert_eq!(&out[8..12], &version.to_le_bytes());
    out
}

/// Streams of earlier builds (version 2 raw, version 1 plain, decision
/// 0050) still receive, and a damaged one is still refused.
#[test]
fn version_1_and_2_streams_still_receive() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (engine(dir.path(), "tank"), engine(dir.path(), "backup"));
    let mut rng = rand::rngs::StdRng::seed_from_u64(50);
    let p = props(&[("compression", "lz4"), ("volblocksize", "16384")]);
    src.create_volume("tank/vm", VOLSIZE, &p).unwrap();
    scribble(&src.open_volume("tank/vm").unwrap(), &mut rng, 40);
    src.snapshot(&["tank/vm@a".into()], false).unwrap();
    let want = read_vol(&src, "tank/vm@a").unwrap();
    let raw2 = as_version(&send_raw(&src, "tank/vm@a", None), 2);
    let mut bad = raw2.clone();
    let at = bad.len() / 2;
    bad[at] ^= 0x01;
    let e = receive(&dst, "backup/raw", &bad).unwrap_err().to_string();
    assert!(e.contains("invalid send stream"), "{e}");
    assert!(dst.dataset("backup/raw").is_err());
    receive(&dst, "backup/raw", &raw2).unwrap();
    assert_eq!(read_vol(&dst, "backup/raw@a").unwrap(), want);
    let mut plain = Vec::new();
    let opts = SendOptions {
        snapshot: "tank/vm@a".into(),
        ..Default::default()
    };
    src.send(&opts, &mut plain).unwrap();
    receive(&dst, "backup/plain", &as_version(&plain, 1)).unwrap();
    assert_eq!(read_vol(&dst, "backup/plain@a").unwrap(), want);
}

/// An engine with pool `pool` on one file and small txgs, state in the path returned.
fn open_target(dir: &std::path::Path, pool: &str) -> (std::path::PathBuf, std::sync::Arc<Engine>) {
    let e = common::single_disk_engine_with(dir, pool, small_txgs());
    (dir.join(format!("state-{pool}")), e)
}

/// Receives `limit` bytes of `stream` into `target` with -s, kills the
/// engine (as kill -9) and opens it again.
fn receive_killed(
    e: std::sync::Arc<Engine>,
    state: &std::path::Path,
    target: &str,
    stream: &[u8],
    limit: usize,
) -> std::sync::Arc<Engine> {
    e.sync_all().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut r = Stall {
        data: stream.to_vec(),
        at: 0,
        limit,
        reached: Some(tx),
    };
    let (e2, t2) = (e.clone(), target.to_string());
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
    Engine::open(state, small_txgs()).unwrap()
}

fn token_of(e: &Engine, ds: &str) -> Option<String> {
    e.dataset(ds)
        .unwrap()
        .property("receive_resume_token")
        .map(|p| p.value.clone())
}

/// Kill -9 of the receiving engine during a raw (`-w`) receive of an
/// encrypted volume, full then incremental: after the restart the target
/// is its old self plus a resume token (never a half-received snapshot),
/// `send -t` of the token is raw again (no key needed on either side),
/// and the resumed transfer ends equal to the source.
#[test]
fn raw_receive_killed_mid_stream_resumes_raw_to_equal() {
    let dir = tempfile::tempdir().unwrap();
    let src = engine(dir.path(), "tank");
    let mut rng = rand::rngs::StdRng::seed_from_u64(51);
    let size = 4u64 << 20;
    src.create_volume_keyed("tank/sec", size, &crypt_props(), Some(&material()))
        .unwrap();
    let v = src.open_volume("tank/sec").unwrap();
    fill_random(&v, &mut rng, size);
    src.snapshot(&["tank/sec@a".into()], false).unwrap();
    fill_random(&v, &mut rng, size * 3 / 4);
    drop(v);
    src.snapshot(&["tank/sec@b".into()], false).unwrap();
    let (want_a, want_b) = (
        read_vol(&src, "tank/sec@a").unwrap(),
        read_vol(&src, "tank/sec@b").unwrap(),
    );
    src.unload_key("tank/sec").unwrap();
    let full = send_raw(&src, "tank/sec@a", None);
    let incr = send_raw(&src, "tank/sec@b", Some("@a"));

    let (state, e) = open_target(dir.path(), "kraw");
    let t = "kraw/sec";
    let e = receive_killed(e, &state, t, &full, full.len() * 3 / 5);
    assert!(e.dataset("kraw/sec@a").is_err(), "half a snapshot");
    let token = token_of(&e, t).expect("no receive_resume_token after a killed -s receive");
    let (rest, _) = resume(&src, &e, token, t);
    // Raw again (flag RAW; stream version 3, decision 0050), and only what was missing.
    assert_eq!(&rest[8..16], &[3, 0, 0, 0, 2, 0, 0, 0]);
    assert!(
        rest.len() < full.len() * 3 / 4,
        "{} of {}",
        rest.len(),
        full.len()
    );
    assert_eq!(token_of(&e, t), None);
    assert_eq!(prop_of(&e, t, "encryptionroot"), t);

    let e = receive_killed(e, &state, t, &incr, incr.len() * 3 / 5);
    assert!(e.dataset("kraw/sec@b").is_err(), "half a snapshot");
    let token = token_of(&e, t).expect("no receive_resume_token after a killed -s receive");
    e.load_key(t, None, Some(&material()), false).unwrap();
    assert_eq!(read_vol(&e, "kraw/sec@a").unwrap(), want_a, "old self");
    e.unload_key(t).unwrap();
    resume(&src, &e, token, t);
    e.load_key(t, None, Some(&material()), false).unwrap();
    assert_eq!(read_vol(&e, "kraw/sec@a").unwrap(), want_a);
    assert_eq!(read_vol(&e, "kraw/sec@b").unwrap(), want_b);
}

/// `send -R -w` killed while a child is received (decision 0051): the
/// parts before it are complete, the child has a token and no half
/// snapshot, the datasets after it nothing. `send -t` of the child's
/// token sends the child's rest and then the rest of the tree, received
/// into the top; incremental `-R -I` the same way. Ends equal.
#[test]
fn recursive_raw_receive_killed_in_a_child_resumes_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    let src = engine(dir.path(), "tank");
    let mut rng = rand::rngs::StdRng::seed_from_u64(52);
    let p = props(&[("compression", "lz4"), ("volblocksize", "16384")]);
    src.create_dataset("tank/top", DatasetKind::Filesystem, &[])
        .unwrap();
    for (ds, size) in [
        ("tank/top/c0", 1u64 << 20),
        ("tank/top/c1", 4 << 20),
        ("tank/top/c2", 1 << 20),
    ] {
        src.create_volume(ds, size, &p).unwrap();
        fill_random(&src.open_volume(ds).unwrap(), &mut rng, size);
    }
    src.snapshot(&["tank/top@a".into()], true).unwrap();
    let send_r = |snap: &str, from: Option<&str>| {
        let mut out = Vec::new();
        let opts = SendOptions {
            snapshot: snap.into(),
            from: from.map(str::to_string),
            intermediates: from.is_some(),
            recursive: true,
            raw: true,
            ..Default::default()
        };
        src.send(&opts, &mut out).unwrap();
        out
    };
    let full = send_r("tank/top@a", None);
    let (state, e) = open_target(dir.path(), "kwr");
    // The top's part is the first MiB of six: kill in the middle of c1's.
    let e = receive_killed(e, &state, "kwr/top", &full, full.len() / 2);
    assert!(e.dataset("kwr/top@a").is_ok());
    assert_eq!(
        read_vol(&e, "kwr/top/c0@a").unwrap(),
        read_vol(&src, "tank/top/c0@a").unwrap()
    );
    assert!(e.dataset("kwr/top/c1@a").is_err(), "half a snapshot");
    assert!(e.dataset("kwr/top/c2").is_err());
    assert_eq!(token_of(&e, "kwr/top"), None);
    let token = token_of(&e, "kwr/top/c1").expect("no token on the interrupted child");
    // Received into the child itself it is refused, with a hint.
    let mut rest = Vec::new();
    src.send(
        &SendOptions {
            resume_token: Some(token.clone()),
            ..Default::default()
        },
        &mut rest,
    )
    .unwrap();
    let err = receive(&e, "kwr/top/c1", &rest).unwrap_err().to_string();
    assert!(err.contains("resumes into its top"), "{err}");
    let (rest, got) = resume(&src, &e, token, "kwr/top");
    assert_eq!(&rest[12..16], &3u32.to_le_bytes(), "flags RECURSIVE|RAW");
    assert_eq!(got.snapshots, vec!["kwr/top/c1@a", "kwr/top/c2@a"]);
    for ds in ["top/c0", "top/c1", "top/c2"] {
        assert_eq!(
            read_vol(&e, &format!("kwr/{ds}@a")).unwrap(),
            read_vol(&src, &format!("tank/{ds}@a")).unwrap(),
            "{ds}"
        );
        assert_eq!(token_of(&e, &format!("kwr/{ds}")), None);
    }

    // Incremental -R -I over two snapshots, killed in c1's first one.
    for (ds, size) in [("tank/top/c1", 4u64 << 20), ("tank/top/c2", 1 << 20)] {
        fill_random(&src.open_volume(ds).unwrap(), &mut rng, size);
    }
    src.snapshot(&["tank/top@b".into()], true).unwrap();
    scribble(&src.open_volume("tank/top/c1").unwrap(), &mut rng, 10);
    src.snapshot(&["tank/top@c".into()], true).unwrap();
    let incr = send_r("tank/top@c", Some("@a"));
    let e = receive_killed(e, &state, "kwr/top", &incr, incr.len() / 2);
    assert!(e.dataset("kwr/top/c1@b").is_err(), "half a snapshot");
    assert_eq!(
        read_vol(&e, "kwr/top/c1@a").unwrap(),
        read_vol(&src, "tank/top/c1@a").unwrap()
    );
    let token = token_of(&e, "kwr/top/c1").expect("no token on the interrupted child");
    let (_, got) = resume(&src, &e, token, "kwr/top");
    assert_eq!(
        got.snapshots,
        vec![
            "kwr/top/c1@b",
            "kwr/top/c1@c",
            "kwr/top/c2@b",
            "kwr/top/c2@c"
        ]
    );
    for ds in ["top/c0", "top/c1", "top/c2"] {
        for s in ["b", "c"] {
            assert_eq!(
                read_vol(&e, &format!("kwr/{ds}@{s}")).unwrap(),
                read_vol(&src, &format!("tank/{ds}@{s}")).unwrap(),
                "{ds}@{s}"
            );
        }
    }
}
