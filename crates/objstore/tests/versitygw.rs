//! The log protocol against a real S3 server: versitygw (it implements
//! conditional writes) on 127.0.0.1 with a posix backend in a temp dir.
//! `scripts/test.sh` installs it; outside CI the test says it skipped.

use bytes::Bytes;
use objstore::location::{self, S3Settings};
use objstore::{read_all, Log, LogError, OpenMode, OwnerId};
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Gateway {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn versitygw() -> Option<String> {
    if let Ok(p) = std::env::var("VERSITYGW") {
        return Some(p);
    }
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/work/cache/go-bin"])
    {
        let p = format!("{dir}/versitygw");
        if std::path::Path::new(&p).is_file() {
            return Some(p);
        }
    }
    None
}

fn start() -> Option<Gateway> {
    let Some(bin) = versitygw() else {
        assert!(
            std::env::var_os("CI").is_none(),
            "versitygw is not installed (scripts/test.sh installs it)"
        );
        eprintln!("SKIPPED: versitygw not found");
        return None;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("bkt")).expect("bucket dir");
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let child = Command::new(bin)
        .args([
            "--access",
            "testkey",
            "--secret",
            "testsecret",
            "--port",
            &format!("127.0.0.1:{port}"),
            "posix",
        ])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start versitygw");
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "versitygw did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(Gateway {
        child,
        port,
        _dir: dir,
    })
}

fn settings(gw: &Gateway) -> S3Settings {
    S3Settings {
        endpoint: Some(format!("http://127.0.0.1:{}", gw.port)),
        region: Some("us-east-1".into()),
        access_key_id: Some("testkey".into()),
        secret_access_key: Some("testsecret".into()),
    }
}

#[test]
fn create_race_takeover_and_fence_on_a_real_s3_server() {
    let Some(gw) = start() else { return };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (store, prefix) = location::open("s3://bkt/pools/tank", &settings(&gw)).expect("open");
        let a = Log::open(
            store.clone(),
            prefix.clone(),
            OwnerId::new("a").expect("id"),
            OpenMode::Create,
        );
        let b = Log::open(
            store.clone(),
            prefix.clone(),
            OwnerId::new("b").expect("id"),
            OpenMode::Create,
        );
        let (ra, rb) = tokio::join!(a, b);
        assert!(
            ra.is_ok() != rb.is_ok(),
            "exactly one of two creators wins on S3"
        );
        let (mut owner, _) = ra.or(rb).expect("winner");
        for i in 0..5 {
            owner
                .append(&[Bytes::from(format!("e{i}"))])
                .await
                .expect("append");
        }
        let (mut next, replay) = Log::open(
            store.clone(),
            prefix.clone(),
            OwnerId::new("c").expect("id"),
            OpenMode::Takeover,
        )
        .await
        .expect("takeover");
        assert_eq!(replay.iter().map(|r| r.entries.len()).sum::<usize>(), 5);
        let err = owner
            .append(&[Bytes::from_static(b"stale")])
            .await
            .expect_err("fenced");
        assert!(matches!(err, LogError::Fenced { .. }), "{err}");
        next.append(&[Bytes::from_static(b"new")])
            .await
            .expect("new owner appends");
        let all = read_all(store.as_ref(), &prefix).await.expect("read");
        let entries: Vec<Bytes> = all.iter().flat_map(|r| r.entries.clone()).collect();
        assert_eq!(entries.len(), 6);
        assert!(!entries.iter().any(|e| e.as_ref() == b"stale"));
    });
}
