//! The NFS server on a real engine and a file-backed pool, spoken to by a
//! real NFSv3 client (nfs3_client) over TCP.

use dataset::*;
use nfs3_client::nfs3_types::nfs3::*;
use nfs3_client::nfs3_types::rpc::{auth_unix, opaque_auth};
use nfs3_client::nfs3_types::xdr_codec::Opaque;
use nfs3_client::tokio::{TokioConnector, TokioIo};
use nfs3_client::{Nfs3Connection, Nfs3ConnectionBuilder};
use std::path::Path;
use std::sync::Arc;
use tokio::net::TcpStream;
use tokio::sync::watch;

type Conn = Nfs3Connection<TokioIo<TcpStream>>;

fn config() -> EngineConfig {
    EngineConfig {
        // Commits only when asked: what survives a kill is what the log holds.
        txg_timeout_secs: 3600.0,
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    }
}

fn engine_with_fs(dir: &Path, sharenfs: &str) -> Arc<Engine> {
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
        .create_dataset("tank/fs1", DatasetKind::Filesystem, &[])
        .unwrap();
    engine
        .set_property("tank/fs1", "sharenfs", sharenfs)
        .unwrap();
    engine
}

struct Daemon {
    engine: Arc<Engine>,
    server: Arc<nfs::Server>,
    port: u16,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

async fn start(engine: Arc<Engine>) -> Daemon {
    start_with(engine, nfs::NfsConfig::default()).await
}

async fn start_with(engine: Arc<Engine>, config: nfs::NfsConfig) -> Daemon {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = nfs::Server::new(engine.clone(), config);
    let (stop, rx) = watch::channel(false);
    let task = tokio::spawn(server.clone().serve(listener, rx));
    Daemon {
        engine,
        server,
        port,
        stop,
        task,
    }
}

impl Daemon {
    async fn stop(self) -> Arc<Engine> {
        self.stop.send(true).unwrap();
        self.task.await.unwrap().unwrap();
        self.engine
    }

    async fn mount_as(&self, path: &str, uid: u32, gid: u32) -> Result<Conn, String> {
        let cred = opaque_auth::auth_unix(&auth_unix {
            stamp: 1,
            machinename: Opaque::owned(b"test".to_vec()),
            uid,
            gid,
            gids: vec![],
        });
        Nfs3ConnectionBuilder::new(TokioConnector, "127.0.0.1", path)
            .connect_from_privileged_port(false)
            .mount_port(self.port)
            .nfs3_port(self.port)
            .credential(cred)
            .mount()
            .await
            .map_err(|e| format!("{e:?}"))
    }

    async fn mount(&self, path: &str) -> Conn {
        self.mount_as(path, 0, 0).await.unwrap()
    }
}

fn name(s: &str) -> filename3<'static> {
    filename3(Opaque::owned(s.as_bytes().to_vec()))
}

fn dirop(dir: &nfs_fh3, n: &str) -> diropargs3<'static> {
    diropargs3 {
        dir: dir.clone(),
        name: name(n),
    }
}

fn mode(m: u32) -> sattr3 {
    sattr3 {
        mode: set_mode3::Some(m),
        ..sattr3::default()
    }
}

async fn create(c: &mut Conn, dir: &nfs_fh3, n: &str) -> Result<nfs_fh3, nfsstat3> {
    match c
        .create(&CREATE3args {
            where_: dirop(dir, n),
            how: createhow3::GUARDED(mode(0o644)),
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => match ok.obj {
            post_op_fh3::Some(h) => Ok(h),
            post_op_fh3::None => panic!("CREATE without a handle"),
        },
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn lookup(c: &mut Conn, dir: &nfs_fh3, n: &str) -> Result<(nfs_fh3, fattr3), nfsstat3> {
    match c
        .lookup(&LOOKUP3args {
            what: dirop(dir, n),
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => Ok((ok.object, ok.obj_attributes.unwrap())),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn write(
    c: &mut Conn,
    fh: &nfs_fh3,
    offset: u64,
    data: &[u8],
    stable: stable_how,
) -> Result<WRITE3resok, nfsstat3> {
    match c
        .write(&WRITE3args {
            file: fh.clone(),
            offset,
            count: data.len() as u32,
            stable,
            data: Opaque::owned(data.to_vec()),
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => Ok(ok),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn read(c: &mut Conn, fh: &nfs_fh3, offset: u64, count: u32) -> Result<Vec<u8>, nfsstat3> {
    match c
        .read(&READ3args {
            file: fh.clone(),
            offset,
            count,
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => Ok(ok.data.to_vec()),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

async fn getattr(c: &mut Conn, fh: &nfs_fh3) -> Result<fattr3, nfsstat3> {
    match c
        .getattr(&GETATTR3args { object: fh.clone() })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => Ok(ok.obj_attributes),
        Nfs3Result::Err((stat, _)) => Err(stat),
    }
}

/// Lists a directory with READDIR pages of `count` bytes: (name, cookie) in order.
async fn readdir_all(c: &mut Conn, dir: &nfs_fh3, count: u32) -> (Vec<(String, u64)>, usize) {
    let (mut out, mut pages, mut cookie) = (Vec::new(), 0, 0);
    loop {
        pages += 1;
        assert!(pages < 100_000, "readdir does not end");
        let res = c
            .readdir(&READDIR3args {
                dir: dir.clone(),
                cookie,
                cookieverf: cookieverf3([0; 8]),
                count,
            })
            .await
            .unwrap()
            .unwrap();
        for e in res.reply.entries.0 {
            cookie = e.cookie;
            out.push((String::from_utf8(e.name.0.to_vec()).unwrap(), e.cookie));
        }
        if res.reply.eof {
            return (out, pages);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn files_links_devices_and_a_large_directory() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(engine_with_fs(dir.path(), "rw,no_root_squash")).await;
    let mut c = d.mount("/tank/fs1").await;
    let root = c.root_nfs_fh3();

    // Write and read back, at an offset too (holes read as zeros).
    let f = create(&mut c, &root, "a.txt").await.unwrap();
    let w = write(&mut c, &f, 0, b"hello nfs", stable_how::FILE_SYNC)
        .await
        .unwrap();
    assert_eq!((w.count, w.committed), (9, stable_how::FILE_SYNC));
    write(&mut c, &f, 1 << 20, b"end", stable_how::UNSTABLE)
        .await
        .unwrap();
    assert_eq!(read(&mut c, &f, 6, 3).await.unwrap(), b"nfs");
    assert_eq!(read(&mut c, &f, 4096, 8).await.unwrap(), vec![0u8; 8]);
    assert_eq!(getattr(&mut c, &f).await.unwrap().size, (1 << 20) + 3);
    assert_eq!(
        create(&mut c, &root, "a.txt").await.unwrap_err(),
        nfsstat3::NFS3ERR_EXIST
    );

    // LINK: a second name for the same inode.
    let l = c
        .link(&LINK3args {
            file: f.clone(),
            link: dirop(&root, "hard"),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(l.file_attributes.unwrap().nlink, 2);
    let (h, ha) = lookup(&mut c, &root, "hard").await.unwrap();
    assert_eq!(h.data, f.data, "same file, same handle");
    assert_eq!(ha.nlink, 2);

    // MKNOD: a FIFO and a character device.
    let fifo = c
        .mknod(&MKNOD3args {
            where_: dirop(&root, "fifo"),
            what: mknoddata3::NF3FIFO(mode(0o600)),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(fifo.obj_attributes.unwrap().type_, ftype3::NF3FIFO);
    let null = c
        .mknod(&MKNOD3args {
            where_: dirop(&root, "null"),
            what: mknoddata3::NF3CHR(devicedata3 {
                dev_attributes: mode(0o666),
                spec: specdata3 {
                    specdata1: 1,
                    specdata2: 3,
                },
            }),
        })
        .await
        .unwrap()
        .unwrap();
    let na = null.obj_attributes.unwrap();
    assert_eq!(
        (na.type_, na.rdev.specdata1, na.rdev.specdata2),
        (ftype3::NF3CHR, 1, 3)
    );

    // A symlink reads back.
    let s = c
        .symlink(&SYMLINK3args {
            where_: dirop(&root, "ln"),
            symlink: symlinkdata3 {
                symlink_attributes: sattr3::default(),
                symlink_data: nfspath3(Opaque::owned(b"a.txt".to_vec())),
            },
        })
        .await
        .unwrap()
        .unwrap();
    let target = c
        .readlink(&READLINK3args {
            symlink: s.obj.unwrap(),
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(target.data.0.as_ref(), b"a.txt");

    // 10,000 entries, listed in small pages; cookies resume exactly.
    let big = match c
        .mkdir(&MKDIR3args {
            where_: dirop(&root, "big"),
            attributes: mode(0o755),
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => ok.obj.unwrap(),
        Nfs3Result::Err((stat, _)) => panic!("mkdir: {stat}"),
    };
    for i in 0..10_000 {
        create(&mut c, &big, &format!("f{i:05}")).await.unwrap();
    }
    let (all, pages) = readdir_all(&mut c, &big, 4096).await;
    assert!(pages > 10, "paged ({pages} pages)");
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.len(), 10_002, "10,000 names plus . and ..");
    let mut sorted: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| n.starts_with('f'))
        .collect();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 10_000, "each name once");
    // Resuming from any cookie gives the rest of the same listing, and a
    // second listing hands out the same cookies.
    let (again, _) = readdir_all(&mut c, &big, 32 << 10).await;
    assert_eq!(again, all, "cookies are stable");
    let mid = &all[5_000];
    let rest = c
        .readdir(&READDIR3args {
            dir: big.clone(),
            cookie: mid.1,
            cookieverf: cookieverf3([0; 8]),
            count: 4096,
        })
        .await
        .unwrap()
        .unwrap();
    let first = &rest.reply.entries.0[0];
    assert_eq!(first.name.0.as_ref(), all[5_001].0.as_bytes());
    // READDIRPLUS returns handles that work.
    let plus = c
        .readdirplus(&READDIRPLUS3args {
            dir: big.clone(),
            cookie: 0,
            cookieverf: cookieverf3([0; 8]),
            dircount: 4096,
            maxcount: 32 << 10,
        })
        .await
        .unwrap()
        .unwrap();
    assert!(!plus.reply.eof);
    let e = plus
        .reply
        .entries
        .0
        .iter()
        .find(|e| e.name.0.starts_with(b"f"))
        .unwrap();
    let fh = match &e.name_handle {
        post_op_fh3::Some(h) => h.clone(),
        post_op_fh3::None => panic!("no handle"),
    };
    assert_eq!(getattr(&mut c, &fh).await.unwrap().fileid, e.fileid);

    let engine = d.stop().await;
    engine.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn handles_survive_restarts_and_go_stale_after_rollback() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(engine_with_fs(dir.path(), "rw,no_root_squash")).await;
    let verf1 = d.server.verifier();
    let mut c = d.mount("/tank/fs1").await;
    let root = c.root_nfs_fh3();
    let a = create(&mut c, &root, "a").await.unwrap();
    write(&mut c, &a, 0, b"version 1", stable_how::FILE_SYNC)
        .await
        .unwrap();
    d.engine.snapshot(&["tank/fs1@s1".into()], false).unwrap();
    let b = create(&mut c, &root, "b").await.unwrap();
    write(&mut c, &b, 0, b"gone after rollback", stable_how::FILE_SYNC)
        .await
        .unwrap();

    // Restart the daemon (engine and server): the handles still work.
    drop(c);
    let engine = d.stop().await;
    engine.shutdown().unwrap();
    drop(engine);
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    let d = start(engine).await;
    assert_ne!(d.server.verifier(), verf1, "a new verifier per start");
    let mut c = d.mount("/tank/fs1").await;
    assert_eq!(c.root_nfs_fh3().data, root.data, "the root handle too");
    assert_eq!(read(&mut c, &a, 0, 100).await.unwrap(), b"version 1");
    assert_eq!(read(&mut c, &b, 0, 4).await.unwrap(), b"gone");

    // A rollback that removes b makes its handle STALE; a's still works.
    d.engine.rollback("tank/fs1@s1", false).unwrap();
    assert_eq!(
        getattr(&mut c, &b).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
    assert_eq!(
        read(&mut c, &b, 0, 4).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
    assert_eq!(read(&mut c, &a, 0, 100).await.unwrap(), b"version 1");
    // A new file never takes b's handle (inode numbers never go back).
    let b2 = create(&mut c, &root, "b").await.unwrap();
    assert_ne!(b2.data, b.data);
    // A handle that is not ours is BADHANDLE, not a crash.
    assert_eq!(
        getattr(
            &mut c,
            &nfs_fh3 {
                data: Opaque::owned(vec![1, 2, 3])
            }
        )
        .await
        .unwrap_err(),
        nfsstat3::NFS3ERR_BADHANDLE
    );
    drop(c);
    let engine = d.stop().await;
    engine.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn committed_unstable_writes_survive_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(engine_with_fs(dir.path(), "rw,no_root_squash")).await;
    let mut c = d.mount("/tank/fs1").await;
    let root = c.root_nfs_fh3();
    let f = create(&mut c, &root, "data").await.unwrap();
    let block: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    let mut verf = None;
    for i in 0..4u64 {
        let w = write(&mut c, &f, i << 20, &block, stable_how::UNSTABLE)
            .await
            .unwrap();
        assert_eq!(w.committed, stable_how::UNSTABLE);
        verf = Some(w.verf);
    }
    let done = c
        .commit(&COMMIT3args {
            file: f.clone(),
            offset: 0,
            count: 0,
        })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(Some(done.verf), verf, "same verifier: nothing to resend");
    drop(c);
    let engine = d.stop().await;
    Engine::forget_as_if_killed(engine);

    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    let d = start(engine).await;
    let mut c = d.mount("/tank/fs1").await;
    assert_eq!(getattr(&mut c, &f).await.unwrap().size, 4 << 20);
    for i in 0..4u64 {
        assert_eq!(read(&mut c, &f, i << 20, 1 << 20).await.unwrap(), block);
    }
    // The verifier changed: a client holding uncommitted writes resends them.
    let w = write(&mut c, &f, 0, b"x", stable_how::UNSTABLE)
        .await
        .unwrap();
    assert_ne!(Some(w.verf), verf);
    drop(c);
    let engine = d.stop().await;
    engine.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn snapshots_are_exported_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(engine_with_fs(dir.path(), "rw,no_root_squash")).await;
    let mut c = d.mount("/tank/fs1").await;
    let root = c.root_nfs_fh3();
    let f = create(&mut c, &root, "kept").await.unwrap();
    write(&mut c, &f, 0, b"as it was", stable_how::FILE_SYNC)
        .await
        .unwrap();
    d.engine.snapshot(&["tank/fs1@s1".into()], false).unwrap();
    write(&mut c, &f, 0, b"AS IT IS!", stable_how::FILE_SYNC)
        .await
        .unwrap();

    for path in ["/tank/fs1/.zfs/snapshot/s1", "/tank/fs1@s1"] {
        let mut s = d.mount(path).await;
        let sroot = s.root_nfs_fh3();
        assert_ne!(sroot.data, root.data, "{path}: its own handles");
        let (sf, _) = lookup(&mut s, &sroot, "kept").await.unwrap();
        assert_eq!(read(&mut s, &sf, 0, 100).await.unwrap(), b"as it was");
        assert_eq!(
            write(&mut s, &sf, 0, b"no", stable_how::FILE_SYNC)
                .await
                .unwrap_err(),
            nfsstat3::NFS3ERR_ROFS,
            "{path}"
        );
        assert_eq!(
            create(&mut s, &sroot, "new").await.unwrap_err(),
            nfsstat3::NFS3ERR_ROFS
        );
        let acc = s
            .access(&ACCESS3args {
                object: sf,
                access: ACCESS3_READ | ACCESS3_MODIFY,
            })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(acc.access, ACCESS3_READ);
    }
    assert_eq!(read(&mut c, &f, 0, 100).await.unwrap(), b"AS IT IS!");
    drop(c);
    let engine = d.stop().await;
    engine.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shares_squash_and_permissions_follow_sharenfs() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(engine_with_fs(dir.path(), "on")).await;
    // `on`: root is squashed to nobody, who may not write the root (0755 root).
    let mut c = d.mount_as("/tank/fs1", 0, 0).await.unwrap();
    let root = c.root_nfs_fh3();
    assert_eq!(
        create(&mut c, &root, "x").await.unwrap_err(),
        nfsstat3::NFS3ERR_ACCES
    );
    // Changed while mounted: the next request sees it.
    d.engine
        .set_property("tank/fs1", "sharenfs", "rw,no_root_squash")
        .unwrap();
    let home = match c
        .mkdir(&MKDIR3args {
            where_: dirop(&root, "home"),
            attributes: mode(0o700),
        })
        .await
        .unwrap()
    {
        Nfs3Result::Ok(ok) => ok.obj.unwrap(),
        Nfs3Result::Err((stat, _)) => panic!("mkdir as root: {stat}"),
    };
    c.setattr(&SETATTR3args {
        object: home.clone(),
        new_attributes: sattr3 {
            uid: set_uid3::Some(1000),
            gid: set_gid3::Some(1000),
            ..sattr3::default()
        },
        guard: sattrguard3::None,
    })
    .await
    .unwrap()
    .unwrap();
    // uid 1000 writes in its directory; uid 1001 cannot look in.
    let mut u = d.mount_as("/tank/fs1", 1000, 1000).await.unwrap();
    let mine = create(&mut u, &home, "mine").await.unwrap();
    assert_eq!(getattr(&mut u, &mine).await.unwrap().uid, 1000);
    let mut o = d.mount_as("/tank/fs1", 1001, 1001).await.unwrap();
    assert_eq!(
        lookup(&mut o, &home, "mine").await.unwrap_err(),
        nfsstat3::NFS3ERR_ACCES
    );
    assert_eq!(
        o.setattr(&SETATTR3args {
            object: mine.clone(),
            new_attributes: mode(0o777),
            guard: sattrguard3::None,
        })
        .await
        .unwrap()
        .unwrap_err_stat(),
        nfsstat3::NFS3ERR_PERM
    );
    // Read-only for everyone: writes are ROFS.
    d.engine
        .set_property("tank/fs1", "sharenfs", "ro,no_root_squash")
        .unwrap();
    assert_eq!(
        write(&mut u, &mine, 0, b"x", stable_how::FILE_SYNC)
            .await
            .unwrap_err(),
        nfsstat3::NFS3ERR_ROFS
    );
    // Only other hosts: loopback is refused; off: not mountable, handles STALE.
    d.engine
        .set_property("tank/fs1", "sharenfs", "rw=192.0.2.0/24")
        .unwrap();
    assert_eq!(
        getattr(&mut u, &mine).await.unwrap_err(),
        nfsstat3::NFS3ERR_ACCES
    );
    d.engine
        .set_property("tank/fs1", "sharenfs", "off")
        .unwrap();
    assert_eq!(
        getattr(&mut u, &mine).await.unwrap_err(),
        nfsstat3::NFS3ERR_STALE
    );
    assert!(d.mount_as("/tank/fs1", 0, 0).await.is_err());
    // A typo: not shared (and logged), not shared wrongly.
    d.engine
        .set_property("tank/fs1", "sharenfs", "rw,no_root_sqash")
        .unwrap();
    assert!(d.mount_as("/tank/fs1", 0, 0).await.is_err());
    drop((c, u, o));
    let engine = d.stop().await;
    engine.shutdown().unwrap();
}

trait ErrStat {
    fn unwrap_err_stat(self) -> nfsstat3;
}

impl<T, E> ErrStat for Nfs3Result<T, E> {
    fn unwrap_err_stat(self) -> nfsstat3 {
        match self {
            Nfs3Result::Ok(_) => panic!("expected an error"),
            Nfs3Result::Err((stat, _)) => stat,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_xdr_gets_an_rpc_error_and_the_server_lives_on() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let d = start(engine_with_fs(dir.path(), "on")).await;
    let call = |prog: u32, vers: u32, proc_: u32, args: &[u8]| {
        let mut m = Vec::new();
        for v in [77u32, 0, 2, prog, vers, proc_, 0, 0, 0, 0] {
            m.extend_from_slice(&v.to_be_bytes());
        }
        m.extend_from_slice(args);
        let mut rec = ((m.len() as u32) | 0x8000_0000).to_be_bytes().to_vec();
        rec.extend_from_slice(&m);
        rec
    };
    let mut s = TcpStream::connect(("127.0.0.1", d.port)).await.unwrap();
    // GETATTR whose handle claims 4 GiB: GARBAGE_ARGS (accept_stat 4).
    s.write_all(&call(100_003, 3, 1, &u32::MAX.to_be_bytes()))
        .await
        .unwrap();
    let mut reply = [0u8; 28];
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply[4..8], &77u32.to_be_bytes(), "xid");
    assert_eq!(&reply[24..28], &4u32.to_be_bytes(), "GARBAGE_ARGS");
    // An unknown procedure: PROC_UNAVAIL (3).
    s.write_all(&call(100_003, 3, 99, &[])).await.unwrap();
    s.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply[24..28], &3u32.to_be_bytes(), "PROC_UNAVAIL");
    // A record over the limit closes the connection.
    s.write_all(&(0x8000_0000u32 | (64 << 20)).to_be_bytes())
        .await
        .unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "closed");
    // The portmapper answers GETPORT for NFS with our port.
    let mut p = TcpStream::connect(("127.0.0.1", d.port)).await.unwrap();
    let mut args = Vec::new();
    for v in [100_003u32, 3, 6, 0] {
        args.extend_from_slice(&v.to_be_bytes());
    }
    p.write_all(&call(100_000, 2, 3, &args)).await.unwrap();
    let mut reply = [0u8; 32];
    p.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply[28..32], &u32::from(d.port).to_be_bytes());
    // And NFS still works.
    let mut c = d.mount_as("/tank/fs1", 0, 0).await.unwrap();
    let root = c.root_nfs_fh3();
    getattr(&mut c, &root).await.unwrap();
    let exports = c.mount_client.export().await.unwrap();
    assert_eq!(exports.0.len(), 1);
    assert_eq!(exports.0[0].ex_dir.0.as_ref(), b"/tank/fs1");
    // A mount of something that is not there is NOENT.
    let Err(err) = d.mount_as("/tank/nope", 0, 0).await else {
        panic!("mounted a dataset that does not exist")
    };
    assert!(err.contains("NOENT"), "{err}");
    drop(c);
    let engine = d.stop().await;
    engine.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn connections_are_bounded_and_a_reimported_pool_is_served_again() {
    use tokio::io::AsyncReadExt;
    let dir = tempfile::tempdir().unwrap();
    let d = start_with(
        engine_with_fs(dir.path(), "rw,no_root_squash"),
        nfs::NfsConfig {
            max_connections: 2,
            ..nfs::NfsConfig::default()
        },
    )
    .await;
    // A mount holds two connections (MOUNT and NFS): a third is closed at once.
    let mut c = d.mount("/tank/fs1").await;
    let root = c.root_nfs_fh3();
    let f = create(&mut c, &root, "f").await.unwrap();
    write(&mut c, &f, 0, b"still here", stable_how::FILE_SYNC)
        .await
        .unwrap();
    let mut extra = TcpStream::connect(("127.0.0.1", d.port)).await.unwrap();
    let mut buf = [0u8; 4];
    let n = tokio::time::timeout(std::time::Duration::from_secs(10), extra.read(&mut buf))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0, "refused at max_connections");
    assert_eq!(read(&mut c, &f, 0, 100).await.unwrap(), b"still here");

    // Export and import the pool under the server: the handle works again.
    d.engine.export_pool("tank").unwrap();
    assert!(getattr(&mut c, &f).await.is_err());
    d.engine
        .import_pool("tank", &[dir.path().to_path_buf()], false)
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_secs(6)).await; // past the miss cache
    assert_eq!(read(&mut c, &f, 0, 100).await.unwrap(), b"still here");
    drop(c);
    let engine = d.stop().await;
    engine.shutdown().unwrap();
}
