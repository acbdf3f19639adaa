//! The s3:// target against a real S3 server: MinIO, when its binary is
//! there (`MINIO_BIN`, else /work/cache/minio/bin/minio; bench/s3.sh builds
//! it). Skipped without it; the project suite runs the same client against
//! Cistern's own S3 endpoint.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bench::iops::{self, IopsConfig, Rw};
use bench::latency::{self, LatencyConfig};
use bench::list::{self, ListConfig};
use bench::s3_client::{S3Client, S3Error, S3Options};
use bench::target::TargetSpec;

const USER: &str = "benchtest";
const SECRET: &str = "benchtest-secret";

struct Minio {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for Minio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn minio_bin() -> Option<PathBuf> {
    let p = std::env::var_os("MINIO_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/work/cache/minio/bin/minio"));
    p.is_file().then_some(p)
}

fn start_minio() -> Option<Minio> {
    let Some(bin) = minio_bin() else {
        eprintln!("skipped: no MinIO binary (set MINIO_BIN)");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let console = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(bin)
        .args(["server", "--quiet", "--address"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--console-address")
        .arg(format!("127.0.0.1:{console}"))
        .arg(dir.path().join("data"))
        .env("MINIO_ROOT_USER", USER)
        .env("MINIO_ROOT_PASSWORD", SECRET)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let m = Minio {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
        _dir: dir,
    };
    // Ready when a signed request gets an S3 answer (bounded: 60 s).
    let mut c = S3Client::new(Arc::new(opts(&m, SECRET).resolve().unwrap()));
    let start = Instant::now();
    loop {
        match c.head_bucket("probe") {
            Ok(_) => return Some(m),
            Err(_) if start.elapsed() < Duration::from_secs(60) => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => panic!("MinIO did not come up: {e}"),
        }
    }
}

fn opts(m: &Minio, secret: &str) -> S3Options {
    S3Options {
        endpoint: Some(m.endpoint.clone()),
        access_key: Some(USER.into()),
        secret_key: Some(secret.into()),
        region: None,
        sign_payload: false,
    }
}

fn spec(m: &Minio, url: &str) -> TargetSpec {
    TargetSpec::parse_with(url, &opts(m, SECRET)).unwrap()
}

fn cfg(rw: Rw) -> IopsConfig {
    IopsConfig {
        workers: 4,
        duration: Duration::from_secs(1),
        rw,
        read_percent: 50,
        block_size: 4096,
        region: Some(50 * 4096),
        force: false,
        direct: false,
        progress: false,
    }
}

#[test]
fn s3_target_against_minio() {
    let Some(m) = start_minio() else { return };
    let TargetSpec::S3(t) = spec(&m, "s3://bench/w") else {
        unreachable!()
    };
    let mut c = t.client();
    assert!(!c.head_bucket("bench").unwrap());
    // A run into a missing bucket says so.
    let s = spec(&m, "s3://bench/w");
    let e = s.prepare(Some(50 * 4096), true, false, false, 4096);
    assert!(format!("{:#}", e.unwrap_err()).contains("no such bucket"));
    c.create_bucket("bench").unwrap();
    c.create_bucket("bench").unwrap(); // ours already: fine

    // Writes: PUTs of new keys w/0000000000, w/0000000001, ... 4 KiB each.
    let prep = s
        .prepare(Some(50 * 4096), true, false, false, 4096)
        .unwrap();
    assert_eq!(prep.region, 50 * 4096);
    let r = iops::run(&s, &cfg(Rw::Randwrite), prep.region, "w").unwrap();
    assert!(r.total_ops > 0);
    assert_eq!(r.latency.count, r.total_ops);
    assert!((r.mb_per_s - r.total_ops as f64 * 4096.0 / 1e6).abs() < 1e-6);
    let have = t.list_all(&mut c).unwrap();
    // Every counted PUT made a new object (plus the last one of each worker,
    // finished after the end and not counted).
    let n = have.len() as u64;
    assert!(
        n >= r.total_ops && n <= r.total_ops + 4,
        "{n} {}",
        r.total_ops
    );
    for i in 0..n {
        assert_eq!(have.get(&t.key(i)), Some(&4096), "{}", t.key(i));
    }
    // A second write run into the same prefix needs --force.
    let e = s
        .prepare(Some(50 * 4096), true, false, false, 4096)
        .unwrap_err();
    assert!(e.to_string().contains("holds objects"), "{e}");
    s.prepare(Some(50 * 4096), true, false, true, 4096).unwrap();

    // Reads: the missing keys are put first, every GET returns 4 KiB.
    let prep = s
        .prepare(Some(50 * 4096), false, true, false, 4096)
        .unwrap();
    let have = t.list_all(&mut c).unwrap();
    assert!((0..50).all(|i| have.get(&t.key(i)) == Some(&4096)));
    let r = iops::run(&s, &cfg(Rw::Randrw), prep.region, "rw").unwrap();
    assert!(r.read_latency.unwrap().count > 0 && r.write_latency.unwrap().count > 0);
    // Objects of another size are not read as if they were blocks.
    let e = s
        .prepare(Some(50 * 8192), false, true, false, 8192)
        .unwrap_err();
    assert!(e.to_string().contains("not 8192"), "{e}");

    // HEAD round trips on a probe object, removed afterwards.
    let lat = latency::run(
        &spec(&m, "s3://bench/lat"),
        &LatencyConfig {
            requests: 50,
            warmup: 5,
            size: 512,
            direct: false,
        },
    )
    .unwrap();
    assert_eq!(lat.latency.count, 50);
    assert!(latency::summary_text(&lat).contains("HEAD"));
    assert_eq!(
        c.head_object("bench", "lat/cistern-bench-latency").unwrap(),
        None
    );

    // LIST of 300 objects in pages of 100, each listing checked whole.
    let TargetSpec::S3(lt) = spec(&m, "s3://bench/l") else {
        unreachable!()
    };
    let lc = ListConfig {
        objects: 300,
        object_size: 0,
        workers: 8,
        repeat: 2,
        page_size: 100,
    };
    let l = list::run(&lt, &lc).unwrap();
    assert_eq!((l.objects, l.populated, l.listings), (300, 300, 2));
    assert!(l.pages_per_listing >= 3, "{}", l.pages_per_listing);
    assert_eq!(l.page_latency.count, 2 * l.pages_per_listing);
    let l = list::run(&lt, &lc).unwrap();
    assert_eq!((l.objects, l.populated), (300, 0), "nothing to put again");

    // Keys that need URI encoding, and signed payloads.
    let mut signed = S3Client::new(Arc::new(
        S3Options {
            sign_payload: true,
            ..opts(&m, SECRET)
        }
        .resolve()
        .unwrap(),
    ));
    for key in ["odd key+plus/é=~*(x)", "a&b$c,d;e"] {
        signed.put_object("bench", key, b"hello").unwrap();
        let mut buf = [0u8; 16];
        assert_eq!(c.get_object("bench", key, &mut buf).unwrap(), 5);
        assert_eq!(&buf[..5], b"hello");
        assert_eq!(c.head_object("bench", key).unwrap(), Some(5));
        c.delete_object("bench", key).unwrap();
        assert_eq!(c.head_object("bench", key).unwrap(), None);
    }
    // A too small buffer is an error, not a short read.
    c.put_object("bench", "big", &[1u8; 100]).unwrap();
    assert!(c.get_object("bench", "big", &mut [0u8; 10]).is_err());

    // A wrong secret gets S3's error code.
    let mut bad = S3Client::new(Arc::new(opts(&m, "wrong-secret").resolve().unwrap()));
    match bad.put_object("bench", "x", b"x") {
        Err(S3Error::Status { status, code, .. }) => {
            assert_eq!((status, code.as_str()), (403, "SignatureDoesNotMatch"))
        }
        r => panic!("{r:?}"),
    }
    // Also when the first request is a HEAD (no error document of its own).
    match bad.head_bucket("bench") {
        Err(S3Error::Status { code, .. }) => assert_eq!(code, "SignatureDoesNotMatch"),
        r => panic!("{r:?}"),
    }
    match c.get_object("nosuchbucket", "x", &mut [0u8; 4]) {
        Err(S3Error::Status { code, .. }) => assert_eq!(code, "NoSuchBucket"),
        r => panic!("{r:?}"),
    }
}
