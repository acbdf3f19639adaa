//! The POSIX layer on a real engine and a file-backed pool.

use dataset::*;
use posix::{Cred, Fs, RenameFlags, SetAttr, XattrSet, ROOT};
use std::path::Path;
use std::sync::Arc;

fn config() -> EngineConfig {
    EngineConfig {
        // Commits only when asked: what survives a kill is what the log holds.
        txg_timeout_secs: 3600.0,
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    }
}

fn engine_with_fs(dir: &Path) -> Arc<Engine> {
    let engine = Engine::open(&dir.join("state"), config()).unwrap();
    engine
        .create_pool(PoolSpec {
            name: "tank".into(),
            groups: vec![GroupSpec {
                kind: GroupKind::Disk,
                devices: vec![dir.join("d0")],
            }],
            create_size: Some(1 << 30),
            force: false,
        })
        .unwrap();
    engine
        .create_dataset("tank/home", DatasetKind::Filesystem, &[])
        .unwrap();
    engine
}

fn fs(engine: &Engine, name: &str) -> Fs {
    Fs::new(engine.open_objects(name).unwrap()).unwrap()
}

fn names(fs: &Fs, dir: u64) -> Vec<String> {
    fs.readdir(dir, 0, 100_000)
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e.name).unwrap())
        .collect()
}

const ME: Cred = Cred {
    uid: 1000,
    gid: 1000,
    groups: Vec::new(),
};

#[test]
fn files_directories_links_and_renames_behave_as_posix() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_fs(dir.path());
    let fs = fs(&engine, "tank/home");
    let root = fs.getattr(ROOT).unwrap();
    assert_eq!(root.nlink, 2);
    assert_eq!(root.mode(), libc::S_IFDIR | 0o755);

    let docs = fs.mkdir(ROOT, b"docs", 0o750, &ME).unwrap();
    assert_eq!(
        (docs.uid, docs.gid, docs.perm, docs.nlink),
        (1000, 1000, 0o750, 2)
    );
    assert_eq!(
        fs.getattr(ROOT).unwrap().nlink,
        3,
        "a subdirectory's .. links the parent"
    );
    let f = fs.create(docs.ino, b"a.txt", 0o640, &ME).unwrap();
    assert_eq!(fs.write(f.ino, 0, b"hello world").unwrap(), 11);
    assert_eq!(fs.read(f.ino, 6, 100).unwrap(), b"world");
    // Sparse: a hole reads as zeros.
    fs.write(f.ino, 1 << 20, b"end").unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().size, (1 << 20) + 3);
    assert!(fs.read(f.ino, 4096, 4096).unwrap().iter().all(|b| *b == 0));
    fs.setattr(
        f.ino,
        &SetAttr {
            size: Some(5),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(fs.read(f.ino, 0, 100).unwrap(), b"hello");

    // Hard links share the inode; a name that exists is EEXIST.
    let l = fs.link(f.ino, ROOT, b"hard").unwrap();
    assert_eq!((l.ino, l.nlink), (f.ino, 2));
    assert_eq!(
        fs.link(f.ino, ROOT, b"hard").unwrap_err().errno,
        libc::EEXIST
    );
    assert_eq!(
        fs.link(docs.ino, ROOT, b"d2").unwrap_err().errno,
        libc::EPERM
    );

    // Symlinks, device nodes, FIFOs.
    let s = fs.symlink(ROOT, b"ln", b"docs/a.txt", &ME).unwrap();
    assert_eq!((s.kind, s.size), (posix::FileType::Symlink, 10));
    assert_eq!(fs.readlink(s.ino).unwrap(), b"docs/a.txt");
    let c = fs
        .mknod(ROOT, b"null", libc::S_IFCHR | 0o666, 0x0103, &Cred::root())
        .unwrap();
    assert_eq!((c.kind, c.rdev), (posix::FileType::CharDevice, 0x0103));
    let p = fs
        .mknod(ROOT, b"fifo", libc::S_IFIFO | 0o600, 0, &ME)
        .unwrap();
    assert_eq!(p.kind, posix::FileType::Fifo);

    // Rename across directories replacing a target: the target's inode goes.
    let b = fs.create(ROOT, b"b.txt", 0o644, &ME).unwrap();
    fs.write(b.ino, 0, b"bbb").unwrap();
    fs.rename(ROOT, b"b.txt", docs.ino, b"a.txt", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.lookup(docs.ino, b"a.txt").unwrap().ino, b.ino);
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 1, "still linked as /hard");
    assert_eq!(fs.lookup(ROOT, b"b.txt").unwrap_err().errno, libc::ENOENT);
    // NOREPLACE and EXCHANGE.
    let e = fs
        .rename(
            ROOT,
            b"hard",
            docs.ino,
            b"a.txt",
            RenameFlags {
                noreplace: true,
                exchange: false,
            },
        )
        .unwrap_err();
    assert_eq!(e.errno, libc::EEXIST);
    fs.rename(
        ROOT,
        b"hard",
        docs.ino,
        b"a.txt",
        RenameFlags {
            noreplace: false,
            exchange: true,
        },
    )
    .unwrap();
    assert_eq!(fs.lookup(ROOT, b"hard").unwrap().ino, b.ino);
    assert_eq!(fs.lookup(docs.ino, b"a.txt").unwrap().ino, f.ino);

    // Moving a directory moves its `..` and the parents' link counts.
    let sub = fs.mkdir(ROOT, b"sub", 0o755, &ME).unwrap();
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 4);
    fs.rename(ROOT, b"sub", docs.ino, b"sub", RenameFlags::default())
        .unwrap();
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
    assert_eq!(fs.getattr(docs.ino).unwrap().nlink, 3);
    assert_eq!(fs.lookup(sub.ino, b"..").unwrap().ino, docs.ino);
    // Into itself: EINVAL. Over a non-empty directory: ENOTEMPTY.
    let e = fs
        .rename(ROOT, b"docs", sub.ino, b"x", RenameFlags::default())
        .unwrap_err();
    assert_eq!(e.errno, libc::EINVAL);
    let other = fs.mkdir(ROOT, b"other", 0o755, &ME).unwrap();
    fs.create(other.ino, b"f", 0o644, &ME).unwrap();
    let e = fs
        .rename(docs.ino, b"sub", ROOT, b"other", RenameFlags::default())
        .unwrap_err();
    assert_eq!(e.errno, libc::ENOTEMPTY);
    assert_eq!(fs.rmdir(ROOT, b"other").unwrap_err().errno, libc::ENOTEMPTY);
    fs.unlink(other.ino, b"f").unwrap();
    fs.rmdir(ROOT, b"other").unwrap();
    assert_eq!(fs.getattr(other.ino).unwrap_err().errno, libc::ENOENT);

    assert_eq!(
        names(&fs, ROOT),
        [".", "..", "docs", "fifo", "hard", "ln", "null"]
    );
    assert_eq!(names(&fs, docs.ino), [".", "..", "a.txt", "sub"]);
    assert_eq!(fs.unlink(ROOT, b"docs").unwrap_err().errno, libc::EISDIR);
    assert_eq!(fs.rmdir(ROOT, b"hard").unwrap_err().errno, libc::ENOTDIR);
    assert_eq!(
        fs.create(ROOT, &[0xff, 0xfe], 0o644, &ME)
            .unwrap_err()
            .errno,
        libc::EILSEQ
    );
    assert_eq!(
        fs.create(ROOT, &[b'x'; 256], 0o644, &ME).unwrap_err().errno,
        libc::ENAMETOOLONG
    );

    // Extended attributes, up to 64 KiB a value.
    fs.setxattr(b.ino, b"user.k", b"v", XattrSet::Create)
        .unwrap();
    assert_eq!(
        fs.setxattr(b.ino, b"user.k", b"v", XattrSet::Create)
            .unwrap_err()
            .errno,
        libc::EEXIST
    );
    fs.setxattr(b.ino, b"user.big", &vec![7u8; 60 << 10], XattrSet::Any)
        .unwrap();
    assert_eq!(fs.getxattr(b.ino, b"user.big").unwrap().len(), 60 << 10);
    assert_eq!(fs.listxattr(b.ino).unwrap(), b"user.big\0user.k\0");
    fs.removexattr(b.ino, b"user.big").unwrap();
    assert_eq!(
        fs.getxattr(b.ino, b"user.big").unwrap_err().errno,
        libc::ENODATA
    );
    assert_eq!(
        fs.setxattr(b.ino, b"system.posix_acl_access", b"x", XattrSet::Any)
            .unwrap_err()
            .errno,
        libc::EOPNOTSUPP,
        "acltype=off"
    );
    engine.shutdown().unwrap();
}

#[test]
fn readdir_cookies_resume_across_changes_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_fs(dir.path());
    let fs1 = fs(&engine, "tank/home");
    let d = fs1.mkdir(ROOT, b"many", 0o755, &ME).unwrap();
    for i in 0..3000 {
        fs1.create(d.ino, format!("f{i:05}").as_bytes(), 0o644, &ME)
            .unwrap();
    }
    // Page through 100 at a time; delete an entry just returned midway.
    let mut seen = Vec::new();
    let mut cookie = 0;
    loop {
        let page = fs1.readdir(d.ino, cookie, 100).unwrap();
        let Some(last) = page.last() else { break };
        cookie = last.cookie;
        if seen.len() == 1000 {
            fs1.unlink(d.ino, &last.name).unwrap();
        }
        seen.extend(page.into_iter().map(|e| e.name));
    }
    assert_eq!(seen.len(), 3002, "every entry once, with . and ..");
    // A cookie still works after a restart (no cache).
    let mid = fs1.readdir(d.ino, 0, 1502).unwrap().last().unwrap().cookie;
    drop(fs1);
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    let fs2 = fs(&engine, "tank/home");
    let next = fs2.readdir(d.ino, mid, 1).unwrap();
    assert_eq!(next[0].name, b"f01501", "f01097 was deleted");
    engine.shutdown().unwrap();
}

#[test]
fn fsynced_files_and_renames_survive_a_crash_and_open_unlinked_files_are_reclaimed() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_fs(dir.path());
    let fs1 = fs(&engine, "tank/home");
    let a = fs1.create(ROOT, b"a", 0o644, &ME).unwrap();
    fs1.write(a.ino, 0, &vec![1u8; 300_000]).unwrap();
    let tmp = fs1.create(ROOT, b"a.tmp", 0o644, &ME).unwrap();
    fs1.write(tmp.ino, 0, b"new contents").unwrap();
    fs1.rename(ROOT, b"a.tmp", ROOT, b"a", RenameFlags::default())
        .unwrap();
    // Open, then unlinked: still readable until the last close.
    let open = fs1.create(ROOT, b"scratch", 0o600, &ME).unwrap();
    fs1.open(open.ino).unwrap();
    fs1.write(open.ino, 0, b"keep me while open").unwrap();
    fs1.unlink(ROOT, b"scratch").unwrap();
    assert_eq!(fs1.read(open.ino, 0, 4).unwrap(), b"keep");
    fs1.fsync(tmp.ino).unwrap();
    // Not fsynced: may or may not survive, but never half.
    let late = fs1.create(ROOT, b"late", 0o644, &ME).unwrap();
    fs1.write(late.ino, 0, b"x").unwrap();
    drop(fs1);
    Engine::forget_as_if_killed(engine);

    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    let fs2 = fs(&engine, "tank/home");
    let now = fs2.lookup(ROOT, b"a").unwrap();
    assert_eq!(now.ino, tmp.ino, "the rename is whole");
    assert_eq!(fs2.read(now.ino, 0, 100).unwrap(), b"new contents");
    assert_eq!(
        fs2.getattr(a.ino).unwrap_err().errno,
        libc::ENOENT,
        "replaced file freed"
    );
    assert_eq!(
        fs2.getattr(open.ino).unwrap_err().errno,
        libc::ENOENT,
        "the open-unlinked file is reclaimed at import"
    );
    assert!(fs2.lookup(ROOT, b"a.tmp").is_err());
    engine.shutdown().unwrap();
}

#[test]
fn inode_numbers_never_go_back_and_snapshots_keep_them() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_fs(dir.path());
    let fs1 = fs(&engine, "tank/home");
    let a = fs1.create(ROOT, b"a", 0o644, &ME).unwrap();
    fs1.write(a.ino, 0, b"version 1").unwrap();
    engine.snapshot(&["tank/home@s1".into()], false).unwrap();
    fs1.write(a.ino, 0, b"version 2").unwrap();
    let b = fs1.create(ROOT, b"b", 0o644, &ME).unwrap();
    let snap = fs(&engine, "tank/home@s1");
    assert_eq!(snap.lookup(ROOT, b"a").unwrap().ino, a.ino);
    assert_eq!(snap.read(a.ino, 0, 100).unwrap(), b"version 1");
    assert_eq!(
        snap.create(ROOT, b"c", 0o644, &ME).unwrap_err().errno,
        libc::EROFS
    );
    assert_eq!(snap.lookup(ROOT, b"b").unwrap_err().errno, libc::ENOENT);
    engine.rollback("tank/home@s1", false).unwrap();
    assert_eq!(fs1.read(a.ino, 0, 100).unwrap(), b"version 1");
    assert_eq!(fs1.getattr(b.ino).unwrap_err().errno, libc::ENOENT);
    let c = fs1.create(ROOT, b"c", 0o644, &ME).unwrap();
    assert!(
        c.ino > b.ino,
        "inode {} after rollback reuses nothing (b was {})",
        c.ino,
        b.ino
    );
    // A clone sees the same inode numbers.
    engine.snapshot(&["tank/home@s2".into()], false).unwrap();
    engine
        .clone_snapshot("tank/home@s2", "tank/copy", &[])
        .unwrap();
    let copy = fs(&engine, "tank/copy");
    assert_eq!(copy.lookup(ROOT, b"c").unwrap().ino, c.ino);
    engine.shutdown().unwrap();
}

#[test]
fn diff_by_path_names_changes_as_zfs_diff() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_fs(dir.path());
    let fs = fs(&engine, "tank/home");
    let docs = fs.mkdir(ROOT, b"docs", 0o755, &ME).unwrap();
    let x = fs.create(docs.ino, b"x", 0o644, &ME).unwrap();
    fs.write(x.ino, 0, b"1").unwrap();
    fs.create(ROOT, b"old", 0o644, &ME).unwrap();
    fs.create(ROOT, b"a", 0o644, &ME).unwrap();
    fs.create(ROOT, b"same", 0o644, &ME).unwrap();
    engine.snapshot(&["tank/home@a".into()], false).unwrap();
    fs.write(x.ino, 0, b"2").unwrap();
    fs.create(ROOT, b"new", 0o644, &ME).unwrap();
    fs.unlink(ROOT, b"old").unwrap();
    fs.rename(ROOT, b"a", docs.ino, b"b", RenameFlags::default())
        .unwrap();
    let report = engine.diff("tank/home@a", None).unwrap();
    let lines: Vec<String> = report
        .names
        .iter()
        .map(|n| match &n.renamed_to {
            Some(to) => format!("{} {} -> {}", n.change, n.name, to),
            None => format!("{} {}", n.change, n.name),
        })
        .collect();
    assert_eq!(
        lines,
        [
            "M /",
            "R /a -> /docs/b",
            "M /docs",
            "M /docs/x",
            "+ /new",
            "- /old"
        ],
        "{lines:?}"
    );
    engine.snapshot(&["tank/home@b".into()], false).unwrap();
    assert!(engine.diff("tank/home@b", None).unwrap().names.is_empty());
    engine.shutdown().unwrap();
}
