//! The S3 layer end to end: a real engine on a file-backed pool, the
//! service on a loopback port, and a real client (boto3, run by pytest from
//! `test_s3_boto.py` next to this file) driving it. Also a kill -9 check:
//! acknowledged PUTs and a completed multipart upload survive a crash.
//!
//! Python: `$CISTERN_PYTHON`, else the workspace `.venv`, else
//! /work/main/.venv; boto3 and pytest must import (scripts/test.sh installs them).

use dataset::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const KEY: &str = "AKTESTCISTERN";
const SECRET: &str = "secret-for-tests-only";

fn config() -> EngineConfig {
    EngineConfig {
        // Commits only when asked: what survives a kill is what the log holds.
        txg_timeout_secs: 3600.0,
        multihost_interval_ms: 50,
        ..EngineConfig::default()
    }
}

fn engine_with_pool(dir: &Path) -> Arc<Engine> {
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
}

struct Server {
    addr: std::net::SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(engine: Arc<Engine>, cfg: s3::S3Config) -> Self {
        let (atx, arx) = std::sync::mpsc::channel();
        let (stx, srx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                atx.send(l.local_addr().unwrap()).unwrap();
                let users = Arc::new(s3::access::Users::single(KEY, SECRET));
                s3::serve(l, engine, cfg, users, async {
                    let _ = srx.await;
                })
                .await
                .unwrap();
            });
        });
        let addr = arx.recv().unwrap();
        Server {
            addr,
            stop: Some(stx),
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn python() -> PathBuf {
    if let Ok(p) = std::env::var("CISTERN_PYTHON") {
        return p.into();
    }
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if ws.exists() {
        return ws;
    }
    "/work/main/.venv/bin/python".into()
}

fn cfg() -> s3::S3Config {
    s3::S3Config {
        parent: "tank".into(),
        domain: Some("s3.test".into()),
        ..Default::default()
    }
}

/// Runs the pytest suite (or the tests matching `filter`) against `addr`.
fn pytest(addr: std::net::SocketAddr, filter: Option<&str>, env: &[(&str, &str)]) {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    let mut cmd = Command::new(python());
    cmd.arg("-m")
        .arg("pytest")
        .arg("-q")
        .arg("-x")
        .arg("-p")
        .arg("no:cacheprovider")
        .arg(here.join("test_s3_boto.py"))
        .env("S3_ENDPOINT", format!("http://{addr}"))
        .env("S3_KEY", KEY)
        .env("S3_SECRET", SECRET);
    cmd.envs(env.iter().copied());
    if let Some(f) = filter {
        cmd.arg("-k").arg(f);
    }
    let out = cmd
        .output()
        .expect("python with pytest and boto3 (set CISTERN_PYTHON)");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "boto3 suite failed:\n{text}");
}

#[test]
fn boto3_suite() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_pool(dir.path());
    // A bucket with a small quota: PUTs past it answer QuotaExceeded.
    engine
        .create_dataset(
            "tank/quotab",
            DatasetKind::Bucket,
            &[("quota".into(), "3M".into())],
        )
        .unwrap();
    let server = Server::start(engine.clone(), cfg());
    let filter =
        std::env::var("S3_TEST_FILTER").unwrap_or_else(|_| "not crash_ and not snap_".into());
    pytest(server.addr, Some(&filter), &[("S3_QUOTA_BUCKET", "quotab")]);
    drop(server);
    engine.shutdown().unwrap();
}

/// Acknowledged writes survive kill -9; an upload in progress is not an object.
#[test]
fn acknowledged_objects_survive_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_pool(dir.path());
    let server = Server::start(engine.clone(), cfg());
    // The "crash_put" part of the suite writes, "crash_check" reads back.
    pytest(server.addr, Some("crash_put"), &[]);
    drop(server);
    Engine::forget_as_if_killed(engine);
    let engine = Engine::open(&dir.path().join("state"), config()).unwrap();
    let server = Server::start(engine.clone(), cfg());
    pytest(server.addr, Some("crash_check"), &[]);
    drop(server);
    engine.shutdown().unwrap();
}

/// A bucket snapshot reads through S3 as `bucket--snap--name`, exactly as it
/// was, and refuses writes.
#[test]
fn snapshot_buckets_are_read_only_points_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_pool(dir.path());
    let server = Server::start(engine.clone(), cfg());
    pytest(server.addr, Some("snap_prepare"), &[]);
    // Upper case and `_` map to the S3 name `snapb--snap--monday-1`.
    engine
        .snapshot(&["tank/snapb@Monday_1".to_string()], false)
        .unwrap();
    pytest(server.addr, Some("snap_check"), &[]);
    drop(server);
    engine.shutdown().unwrap();
}

/// Uploads older than `multipart_expiry` are aborted and their parts freed;
/// younger ones stay.
#[test]
fn abandoned_uploads_expire_and_free_their_parts() {
    use dataset::objects::ObjectKind;
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_pool(dir.path());
    let store = s3::store::Store::new(
        engine.clone(),
        s3::S3Config {
            multipart_expiry: 1,
            ..cfg()
        },
    );
    store.create_bucket("exp").unwrap();
    let b = store.open("exp").unwrap();
    let id = store.create_upload(&b, "k", Default::default()).unwrap();
    let part = b.os.create(ObjectKind::File, &[]).unwrap();
    b.os.write(part, 0, b"part data").unwrap();
    let rec = s3::record::ObjectRecord {
        etag: "e".into(),
        size: 9,
        ..Default::default()
    };
    store.add_part(&b, "k", &id, 1, part, &rec).unwrap();
    assert_eq!(store.expire_uploads().unwrap(), 0, "too young to expire");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    assert_eq!(store.expire_uploads().unwrap(), 1);
    assert_eq!(
        *store.upload(&b, "k", &id).err().unwrap().code(),
        s3s::S3ErrorCode::NoSuchUpload
    );
    assert!(b.os.attrs(part).unwrap().is_none(), "the part is freed");
    engine.shutdown().unwrap();
}

/// Not a test: a server for trying clients by hand (awscli, rclone, bench)
/// for `S3_SERVE_SECS` seconds (default 60); prints its address and keys.
/// `cargo test --release -p s3 --test boto serve_for_manual_use -- --ignored --nocapture`
#[test]
#[ignore]
fn serve_for_manual_use() {
    let dir = tempfile::tempdir().unwrap();
    let engine = engine_with_pool(dir.path());
    let server = Server::start(engine.clone(), cfg());
    let secs: u64 = std::env::var("S3_SERVE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    println!(
        "S3_ENDPOINT=http://{} S3_KEY={KEY} S3_SECRET={SECRET}",
        server.addr
    );
    std::thread::sleep(std::time::Duration::from_secs(secs));
    drop(server);
    engine.shutdown().unwrap();
}
