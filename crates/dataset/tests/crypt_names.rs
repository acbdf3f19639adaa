//! Sealed names of encrypted datasets (decision 0035): the devices hold
//! neither bucket keys nor file names; lookups, listings (prefix, cursor,
//! limit), snapshots, rollback and clones answer as for a plain dataset;
//! without the key nothing is listed; and a pool made before sealed names
//! (`fixtures/crypt-names-v0.tar.gz`, names in the clear) still opens,
//! reads and takes writes in its old layout.

use dataset::objects::{ObjectKind, ObjectSet, ROOT_DIR};
use dataset::*;
use std::path::Path;
use std::sync::Arc;

#[allow(dead_code)] // each test binary uses a part of the shared helpers
mod common;
use common::{config, create_pool};

const HEX: &str = "5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a";

fn material() -> KeyMaterial {
    KeyMaterial::from_bytes(HEX.as_bytes())
}

fn crypt_props() -> Vec<(String, String)> {
    [
        ("encryption", "on"),
        ("keyformat", "hex"),
        ("keylocation", "prompt"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// A pool `tank` on fresh files with one encrypted dataset (key loaded).
/// The directory guard comes back first so it outlives the engine.
fn with_encrypted(name: &str, kind: DatasetKind) -> (tempfile::TempDir, Arc<Engine>) {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    engine
        .create_dataset_keyed(name, kind, &crypt_props(), Some(&material()))
        .unwrap();
    (dir, engine)
}

fn put(set: &ObjectSet, dir: u64, name: &str, data: &[u8]) -> u64 {
    let obj = set.create(ObjectKind::File, b"").unwrap();
    set.write(obj, 0, data).unwrap();
    if let Some(old) = set.link(dir, name, obj).unwrap() {
        set.remove(old).unwrap();
    }
    obj
}

fn get(set: &ObjectSet, dir: u64, name: &str) -> Option<Vec<u8>> {
    let obj = set.lookup(dir, name).unwrap()?;
    let a = set.attrs(obj).unwrap().unwrap();
    Some(set.read(obj, 0, a.size).unwrap())
}

fn names(set: &ObjectSet, dir: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    // Pages of 7: the cursor is the last name seen, as S3 and readdir use it.
    for _ in 0..10_000 {
        let page = set.list(dir, "", after.as_deref(), 7).unwrap();
        let Some(last) = page.last() else { break };
        after = Some(last.0.clone());
        out.extend(page.into_iter().map(|(n, _)| n));
    }
    out
}

fn devices_contain(dir: &Path, needle: &[u8]) -> bool {
    ["d0", "d1"].iter().any(|d| {
        let bytes = std::fs::read(dir.join(d)).unwrap();
        bytes.windows(needle.len()).any(|w| w == needle)
    })
}

#[test]
fn sealed_names_stay_off_the_devices_and_list_like_plain_ones() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    create_pool(&engine, dir.path());
    // The plain twin lives in another pool, on other files: the devices of
    // `tank` must hold no name at all.
    let other = tempfile::tempdir().unwrap();
    engine
        .create_pool(PoolSpec {
            name: "other".into(),
            groups: vec![GroupSpec {
                kind: GroupKind::Mirror,
                devices: vec![other.path().join("d0"), other.path().join("d1")],
            }],
            create_size: Some(128 << 20),
            force: false,
        })
        .unwrap();
    engine
        .create_dataset("other/plain", DatasetKind::Bucket, &[])
        .unwrap();
    engine
        .create_dataset_keyed(
            "tank/vault",
            DatasetKind::Bucket,
            &crypt_props(),
            Some(&material()),
        )
        .unwrap();
    let plain = engine.open_objects("other/plain").unwrap();
    let vault = engine.open_objects("tank/vault").unwrap();
    // Names whose byte order is not their hash order, some under prefixes.
    let keys: Vec<String> = (0..300)
        .map(|i| match i % 3 {
            0 => format!("zebra-needle/{i:04}"),
            1 => format!("apple-needle/{}", 300 - i),
            _ => format!("needle-{i}.txt"),
        })
        .collect();
    for (i, k) in keys.iter().enumerate() {
        for set in [&plain, &vault] {
            put(set, ROOT_DIR, k, format!("body {i}").as_bytes());
        }
        if i == 150 {
            engine.sync_all().unwrap(); // half committed, half in the open txg
        }
    }
    let check = |what: &str| {
        for (prefix, after, limit) in [
            ("", None, 1000),
            ("", None, 5),
            ("apple-needle/", None, 17),
            ("apple-needle/", Some("apple-needle/2"), 9),
            ("zebra", Some("a"), 1000),
            ("needle-1", Some("needle-15"), 4),
            ("nothing", None, 10),
            ("", Some("zzzz"), 10),
        ] {
            assert_eq!(
                vault.list(ROOT_DIR, prefix, after, limit).unwrap(),
                plain
                    .list(ROOT_DIR, prefix, after, limit)
                    .unwrap()
                    .into_iter()
                    .map(|(n, _)| (n.clone(), vault.lookup(ROOT_DIR, &n).unwrap().unwrap()))
                    .collect::<Vec<_>>(),
                "{what}: list {prefix:?} after {after:?} limit {limit}"
            );
        }
        assert_eq!(names(&vault, ROOT_DIR), names(&plain, ROOT_DIR), "{what}");
    };
    check("open txg");
    engine.sync_all().unwrap();
    check("committed");
    assert_eq!(
        get(&vault, ROOT_DIR, "needle-2.txt").as_deref(),
        Some(&b"body 2"[..])
    );
    assert_eq!(vault.lookup(ROOT_DIR, "needle-3.txt").unwrap(), None);

    // A snapshot, then renames (link the new name, unlink the old) and deletes.
    engine.snapshot(&["tank/vault@s1".into()], false).unwrap();
    for set in [&plain, &vault] {
        let obj = set.lookup(ROOT_DIR, "needle-2.txt").unwrap().unwrap();
        set.link(ROOT_DIR, "renamed-needle.txt", obj).unwrap();
        set.unlink(ROOT_DIR, "needle-2.txt").unwrap();
        let gone = set.unlink(ROOT_DIR, "needle-5.txt").unwrap().unwrap();
        set.remove(gone).unwrap();
    }
    check("after renames");
    engine.sync_all().unwrap();
    check("renames committed");
    assert_eq!(
        get(&vault, ROOT_DIR, "renamed-needle.txt").as_deref(),
        Some(&b"body 2"[..])
    );
    assert_eq!(get(&vault, ROOT_DIR, "needle-2.txt"), None);
    let snap = engine.open_objects("tank/vault@s1").unwrap();
    assert_eq!(
        get(&snap, ROOT_DIR, "needle-2.txt").as_deref(),
        Some(&b"body 2"[..])
    );
    assert_eq!(names(&snap, ROOT_DIR).len(), 300);
    // A clone reads its origin's sealed rows and adds its own.
    engine
        .clone_snapshot("tank/vault@s1", "tank/copy", &[])
        .unwrap();
    let copy = engine.open_objects("tank/copy").unwrap();
    put(&copy, ROOT_DIR, "clone-only-needle", b"c");
    engine.sync_all().unwrap();
    let mut want = names(&snap, ROOT_DIR);
    want.push("clone-only-needle".into());
    want.sort();
    assert_eq!(names(&copy, ROOT_DIR), want);
    // diff sees names through the sealed rows.
    let d = engine.diff("tank/vault@s1", None).unwrap();
    let changed: Vec<(char, String)> = d.names.iter().map(|c| (c.change, c.name.clone())).collect();
    assert!(
        changed.contains(&('+', "renamed-needle.txt".into())),
        "{changed:?}"
    );
    assert!(
        changed.contains(&('-', "needle-5.txt".into())),
        "{changed:?}"
    );
    // Rollback brings the names back.
    drop((snap, copy));
    engine
        .destroy("tank/copy", &DestroyOptions::default())
        .unwrap();
    engine.rollback("tank/vault@s1", false).unwrap();
    assert_eq!(
        get(&vault, ROOT_DIR, "needle-2.txt").as_deref(),
        Some(&b"body 2"[..])
    );
    assert_eq!(vault.lookup(ROOT_DIR, "renamed-needle.txt").unwrap(), None);
    assert_eq!(names(&vault, ROOT_DIR).len(), 300);

    // On the devices: the plain bucket's names, never the vault's.
    drop((plain, vault));
    engine.export_pool("other").unwrap();
    assert!(
        devices_contain(other.path(), b"apple-needle/"),
        "the plain names are there"
    );
    engine.export_pool("tank").unwrap();
    let engine = Engine::open(&dir.path().join("state2"), config()).unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    // Without the key: nothing is listed, nothing is opened.
    assert!(engine.open_objects("tank/vault").is_err());
    assert!(engine.open_objects("tank/vault@s1").is_err());
    engine.export_pool("tank").unwrap();
    for needle in [
        &b"needle-2"[..],
        b"zebra-needle",
        b"apple-needle",
        b"renamed-needle",
    ] {
        assert!(
            !devices_contain(dir.path(), needle),
            "{} is on the devices",
            String::from_utf8_lossy(needle)
        );
    }
    let engine = Engine::open(&dir.path().join("state3"), config()).unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    engine
        .load_key("tank/vault", None, Some(&material()), false)
        .unwrap();
    let vault = engine.open_objects("tank/vault").unwrap();
    assert_eq!(names(&vault, ROOT_DIR).len(), 300);
    assert_eq!(
        engine.upgrade_pool("tank", false).unwrap().meta_format,
        5,
        "sealed names are a format 5 feature"
    );
    drop(vault);
    engine.unload_key("tank/vault").unwrap();
    assert!(engine.open_objects("tank/vault").is_err());
}

fn unpack(dir: &Path) {
    let fixture =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/crypt-names-v0.tar.gz");
    let ok = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(&fixture)
        .arg("-C")
        .arg(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cannot unpack {}", fixture.display());
}

#[test]
fn a_pool_with_names_in_the_clear_still_opens_reads_and_writes() {
    let dir = tempfile::tempdir().unwrap();
    unpack(dir.path());
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    assert_eq!(engine.upgrade_pool("tank", false).unwrap().meta_format, 4);
    for ds in ["tank/vault", "tank/home"] {
        assert!(engine.open_objects(ds).is_err(), "{ds} without its key");
        engine.load_key(ds, None, Some(&material()), false).unwrap();
    }
    let vault = engine.open_objects("tank/vault").unwrap();
    let keys: Vec<String> = vault
        .list(ROOT_DIR, "", None, 100)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for k in [
        "delta.txt",
        "secret-names/alpha.txt",
        "secret-names/beta.txt",
    ] {
        assert!(keys.contains(&k.to_string()), "{k} in {keys:?}");
    }
    assert!(!keys.contains(&"gamma.bin".to_string()));
    assert_eq!(
        vault
            .list(
                ROOT_DIR,
                "secret-names/",
                Some("secret-names/alpha.txt"),
                10
            )
            .unwrap()
            .len(),
        1
    );
    let snap = engine.open_objects("tank/vault@before").unwrap();
    assert!(snap.lookup(ROOT_DIR, "gamma.bin").unwrap().is_some());
    let home = engine.open_objects("tank/home").unwrap();
    assert!(home.lookup(ROOT_DIR, "diary-2026.txt").unwrap().is_some());
    let letters = home.lookup(ROOT_DIR, "letters").unwrap().unwrap();
    assert_eq!(
        get(&home, letters, "to-bob.txt").as_deref(),
        Some(&b"dear bob"[..])
    );
    // The old datasets keep their layout for new names too.
    put(&vault, ROOT_DIR, "added-after-upgrade", b"new");
    engine.sync_all().unwrap();
    assert_eq!(
        get(&vault, ROOT_DIR, "added-after-upgrade").as_deref(),
        Some(&b"new"[..])
    );
    // A new encrypted dataset in this pool seals its names: format 5.
    engine
        .create_dataset("tank/home/child", DatasetKind::Filesystem, &[])
        .unwrap();
    let child = engine.open_objects("tank/home/child").unwrap();
    put(&child, ROOT_DIR, "child-needle-name", b"x");
    engine.sync_all().unwrap();
    assert_eq!(engine.upgrade_pool("tank", false).unwrap().meta_format, 5);
    drop((vault, snap, home, child));
    engine.export_pool("tank").unwrap();
    let found = |needle: &[u8]| {
        ["s3d0", "s3d1"].iter().any(|d| {
            let b = std::fs::read(dir.path().join(d)).unwrap();
            b.windows(needle.len()).any(|w| w == needle)
        })
    };
    assert!(
        found(b"added-after-upgrade"),
        "old layout: in the clear, as documented"
    );
    assert!(!found(b"child-needle-name"), "new dataset: sealed");
    // And everything reads again after a re-import.
    let engine = Engine::open(&dir.path().join("state2"), config()).unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    for ds in ["tank/vault", "tank/home"] {
        engine.load_key(ds, None, Some(&material()), false).unwrap();
    }
    let child = engine.open_objects("tank/home/child").unwrap();
    assert_eq!(
        get(&child, ROOT_DIR, "child-needle-name").as_deref(),
        Some(&b"x"[..])
    );
    let vault: Arc<ObjectSet> = engine.open_objects("tank/vault").unwrap();
    assert!(vault.lookup(ROOT_DIR, "delta.txt").unwrap().is_some());
}

fn encryption_root(engine: &Engine, ds: &str) -> String {
    engine
        .dataset(ds)
        .unwrap()
        .property("encryptionroot")
        .unwrap()
        .value
        .clone()
}

#[test]
fn promote_moves_the_encryption_root_and_destroy_keeps_keys_in_use() {
    let (dir, engine) = with_encrypted("tank/r", DatasetKind::Filesystem);
    let r = engine.open_objects("tank/r").unwrap();
    put(&r, ROOT_DIR, "before-clone", b"old");
    drop(r);
    engine.snapshot(&["tank/r@s".into()], false).unwrap();
    engine.clone_snapshot("tank/r@s", "tank/c", &[]).unwrap();
    assert_eq!(encryption_root(&engine, "tank/c"), "tank/r");
    // The origin is the root the clone inherits from: the root moves (as zfs).
    engine.promote("tank/c").unwrap();
    assert_eq!(encryption_root(&engine, "tank/c"), "tank/c");
    assert_eq!(encryption_root(&engine, "tank/r"), "tank/c");
    engine
        .destroy("tank/r", &DestroyOptions::default())
        .unwrap();
    let c = engine.open_objects("tank/c").unwrap();
    assert_eq!(
        get(&c, ROOT_DIR, "before-clone").as_deref(),
        Some(&b"old"[..])
    );
    drop(c);
    engine.export_pool("tank").unwrap();
    let engine = Engine::open(&dir.path().join("state2"), config()).unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    // The moved wrap opens with the same user key.
    let wrong = KeyMaterial::from_bytes("11".repeat(32).as_bytes());
    assert!(engine
        .load_key("tank/c", None, Some(&wrong), false)
        .is_err());
    engine
        .load_key("tank/c", None, Some(&material()), false)
        .unwrap();
    let c = engine.open_objects("tank/c@s").unwrap();
    assert_eq!(
        get(&c, ROOT_DIR, "before-clone").as_deref(),
        Some(&b"old"[..])
    );
    drop(c);

    // A clone of a child of a root keeps that root: the root cannot go while it is used.
    engine
        .create_dataset_keyed(
            "tank/r2",
            DatasetKind::Filesystem,
            &crypt_props(),
            Some(&material()),
        )
        .unwrap();
    engine
        .create_dataset("tank/r2/child", DatasetKind::Filesystem, &[])
        .unwrap();
    engine.snapshot(&["tank/r2/child@s".into()], false).unwrap();
    engine
        .clone_snapshot("tank/r2/child@s", "tank/c2", &[])
        .unwrap();
    engine.promote("tank/c2").unwrap();
    assert_eq!(encryption_root(&engine, "tank/c2"), "tank/r2");
    let opts = DestroyOptions {
        recursive: true,
        ..Default::default()
    };
    let e = engine.destroy("tank/r2", &opts).unwrap_err().to_string();
    assert!(e.contains("encryption root of 'tank/c2'"), "{e}");
    assert!(engine.open_objects("tank/c2").is_ok());
}

#[test]
fn change_key_i_makes_a_root_inherit_its_parents_key() {
    let (dir, engine) = with_encrypted("tank/p", DatasetKind::Filesystem);
    let other = KeyMaterial::from_bytes("66".repeat(32).as_bytes());
    engine
        .create_dataset_keyed(
            "tank/p/x",
            DatasetKind::Filesystem,
            &crypt_props(),
            Some(&other),
        )
        .unwrap();
    engine
        .create_dataset("tank/p/x/y", DatasetKind::Filesystem, &[])
        .unwrap();
    for ds in ["tank/p/x", "tank/p/x/y"] {
        let s = engine.open_objects(ds).unwrap();
        put(&s, ROOT_DIR, "kept-through-inherit", ds.as_bytes());
    }
    assert_eq!(encryption_root(&engine, "tank/p/x/y"), "tank/p/x");
    // A root without an encrypted parent cannot inherit.
    assert!(engine.change_key_inherit("tank/p").is_err());
    assert!(
        engine.change_key_inherit("tank/p/x/y").is_err(),
        "not a root"
    );
    engine.change_key_inherit("tank/p/x").unwrap();
    assert_eq!(encryption_root(&engine, "tank/p/x"), "tank/p");
    assert_eq!(encryption_root(&engine, "tank/p/x/y"), "tank/p");
    assert!(!engine.encryption_roots().contains(&"tank/p/x".to_string()));
    engine.sync_all().unwrap();
    engine.export_pool("tank").unwrap();
    let engine = Engine::open(&dir.path().join("state2"), config()).unwrap();
    engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    // Its old key is no key of anything now; the parent's root opens all.
    assert!(engine
        .load_key("tank/p/x", None, Some(&other), false)
        .is_err());
    assert!(engine.open_objects("tank/p/x").is_err());
    engine
        .load_key("tank/p", None, Some(&material()), false)
        .unwrap();
    for ds in ["tank/p/x", "tank/p/x/y"] {
        let s = engine.open_objects(ds).unwrap();
        assert_eq!(
            get(&s, ROOT_DIR, "kept-through-inherit").as_deref(),
            Some(ds.as_bytes()),
            "{ds}"
        );
        put(&s, ROOT_DIR, "written-after", b"new");
    }
    engine.sync_all().unwrap();
    // Unloading the root unloads what it wraps; the root cannot go while x uses it.
    engine.unload_key("tank/p").unwrap();
    assert!(engine.open_objects("tank/p/x/y").is_err());
    assert_eq!(
        engine
            .dataset("tank/p/x")
            .unwrap()
            .property("keystatus")
            .unwrap()
            .value,
        "unavailable"
    );
    engine
        .load_key("tank/p", None, Some(&material()), false)
        .unwrap();
    let y = engine.open_objects("tank/p/x/y").unwrap();
    assert_eq!(
        get(&y, ROOT_DIR, "written-after").as_deref(),
        Some(&b"new"[..])
    );
}

#[test]
fn a_bucket_with_sealed_names_is_not_sent_in_the_clear() {
    let (_dir, engine) = with_encrypted("tank/vault", DatasetKind::Bucket);
    let vault = engine.open_objects("tank/vault").unwrap();
    put(&vault, ROOT_DIR, "secret-name", b"body");
    engine.snapshot(&["tank/vault@s1".into()], false).unwrap();
    let opts = SendOptions {
        snapshot: "tank/vault@s1".into(),
        ..Default::default()
    };
    let mut out = Vec::new();
    let err = engine.send(&opts, &mut out).unwrap_err();
    assert!(err.to_string().contains("sealed"), "{err}");
    assert!(out.is_empty(), "nothing of the stream was written");
    assert!(engine.send_estimate(&opts).is_err());
}
