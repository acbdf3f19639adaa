//! End to end: `cistern serve` on a temporary state directory with ports
//! chosen by the kernel, driven through the CLI as a user would.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_cistern");

struct Daemon {
    child: Option<Child>,
    api: String,

    nbd: String,
    stdout: Vec<String>,
    stderr_path: PathBuf,
}

impl Daemon {
    /// Starts `cistern <args>` and waits for it to print its endpoints.
    fn start(args: &[&str], log_dir: &Path) -> Daemon {
        let stderr_path = log_dir.join(format!(
            "daemon-{}.log",
            std::process::id() as u128 + now_nanos()
        ));
        let stderr = std::fs::File::create(&stderr_path).expect("log file");
        let mut child = Command::new(BIN)
            .args(args)
            .env("RUST_LOG", "info")
            .env_remove("CISTERN_API")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn cistern");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        // Drain stdout for the daemon's whole life so it never writes to a closed pipe.
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                // Keep draining even when nobody listens any more.
                let _ = tx.send(line);
            }
        });
        let mut d = Daemon {
            child: Some(child),
            api: String::new(),
            nbd: String::new(),
            stdout: Vec::new(),
            stderr_path,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while d.api.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(u) = line.strip_prefix("API: ") {
                        d.api = u.trim().to_string();
                    } else if let Some(u) = line.strip_prefix("NBD: ") {
                        d.nbd = u.trim().trim_end_matches("/<export>").to_string();
                    }
                    d.stdout.push(line);
                }
                Err(_) => {
                    let status = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
                    panic!(
                        "daemon did not print its endpoints (exit: {status:?}); stderr:\n{}",
                        d.log()
                    );
                }
            }
        }
        // Quickstart prints its volumes right after the endpoints.
        while let Ok(line) = rx.recv_timeout(Duration::from_millis(300)) {
            d.stdout.push(line);
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    fn cli(&self, args: &[&str]) -> Output {
        cli_at(&self.api, args, None)
    }

    fn cli_in(&self, dir: &Path, args: &[&str]) -> Output {
        cli_at(&self.api, args, Some(dir))
    }

    /// Runs a command that must succeed; returns its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert_success(&out, args, self);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command that must fail with exit code 1; returns its stderr.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?} should fail with 1; stdout: {} stderr: {stderr}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(stderr.starts_with("cistern: "), "{args:?}: {stderr}");
        stderr
    }

    /// SIGTERM, then wait for a clean exit.
    fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let pid = child.id().to_string();
        let killed = Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill");
        assert!(killed.success());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = child.try_wait().expect("wait") {
                return st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("daemon did not stop within 60 s; stderr:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            if std::thread::panicking() {
                eprintln!("--- daemon stderr ---\n{}", self.log());
            }
        }
    }
}

fn now_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn cli_at(api: &str, args: &[&str], dir: Option<&Path>) -> Output {
    let mut c = Command::new(BIN);
    c.arg("--api")
        .arg(api)
        .args(args)
        .env_remove("CISTERN_API")
        .env_remove("RUST_LOG");
    if let Some(d) = dir {
        c.current_dir(d);
    }
    c.output().expect("run cistern")
}

fn assert_success(out: &Output, args: &[&str], d: &Daemon) {
    assert!(
        out.status.success(),
        "{args:?} failed ({:?})\nstdout: {}\nstderr: {}\ndaemon stderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        d.log()
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Raw HTTP/1.1 request; returns (status, body).
/// One API request with the daemon's token.
fn http(d: &Daemon, method: &str, path: &str, body: &str) -> (u16, String) {
    let file = d
        .stdout
        .iter()
        .find_map(|l| l.strip_prefix("API token: "))
        .expect("the daemon printed where its token is");
    let token = std::fs::read_to_string(file.trim()).expect("token file");
    http_as(&d.api, Some(token.trim()), method, path, body)
}

fn http_as(api: &str, token: Option<&str>, method: &str, path: &str, body: &str) -> (u16, String) {
    let addr = api.trim_start_matches("http://");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let mut s = TcpStream::connect(addr).expect("connect API");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    if let Err(e) = s.read_to_string(&mut resp) {
        panic!("{method} {path}: no complete answer within 30 s ({e})");
    }
    let status: u16 = resp
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let body = resp
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().collect()
}

#[test]
fn usage_errors_need_no_daemon() {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let out = cli_at(&url, &["pool", "list"], None);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("cistern: cannot reach the daemon at {url}: is `cistern serve` running? (connection refused)\n")
    );
    // The environment variable is honoured too.
    let out = Command::new(BIN)
        .args(["list"])
        .env("CISTERN_API", &url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(&url));

    let out = cli_at(&url, &["create", "-V", "10X", "tank/v"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("'10X'"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli_at(&url, &["pool", "create", "-s", "1.5", "tank", "d0"], None);
    assert_eq!(out.status.code(), Some(2));
    let out = cli_at(&url, &["pool", "create", "tank", "mirror", "d0"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("at least 2 devices"));
    let out = cli_at(&url, &["set", "volsize", "tank/v"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PROPERTY=VALUE"));
    let out = cli_at(&url, &["frobnicate"], None);
    assert_eq!(out.status.code(), Some(2));

    // serve refuses a config it does not understand, before touching anything.
    let tmp = tempfile::tempdir().unwrap();
    let cfg = tmp.path().join("c.toml");
    std::fs::write(&cfg, "[server]\nnbd_port = 1\n").unwrap();
    let out = Command::new(BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nbd_port"));
}

#[test]
fn serve_and_drive_the_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let disks = tmp.path().join("disks");
    std::fs::create_dir_all(&disks).unwrap();
    let cfg = tmp.path().join("cistern.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nstate_dir = {:?}\nlog = \"info\"\nnbd = \"127.0.0.1:1\"\n\n[engine]\ntxg_timeout_secs = 1.0\n",
            state.display().to_string()
        ),
    )
    .unwrap();
    // Flags override the config's NBD address; the state dir comes from the config.
    let d = Daemon::start(
        &[
            "serve",
            "--config",
            cfg.to_str().unwrap(),
            "--nbd",
            "127.0.0.1:0",
            "--api",
            "127.0.0.1:0",
        ],
        tmp.path(),
    );
    assert!(d.api.starts_with("http://127.0.0.1:"), "{:?}", d.stdout);
    assert!(
        d.nbd.starts_with("nbd://127.0.0.1:") && !d.nbd.ends_with(":1"),
        "{:?}",
        d.stdout
    );

    // NBD answers with the newstyle greeting.
    let mut nbd = TcpStream::connect(d.nbd.trim_start_matches("nbd://")).unwrap();
    nbd.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 16];
    nbd.read_exact(&mut hello).unwrap();
    assert_eq!(&hello, b"NBDMAGICIHAVEOPT");
    drop(nbd);

    assert_eq!(d.ok(&["pool", "list"]), "no pools available\n");
    assert_eq!(d.ok(&["pool", "list", "-H"]), "");
    assert_eq!(d.ok(&["list"]), ""); // "no datasets available" goes to stderr, as zfs

    // Pool on relative paths, created sparse by -s.
    let out = d.cli_in(
        &disks,
        &["pool", "create", "-s", "1G", "tank", "mirror", "d0", "./d1"],
    );
    assert_success(&out, &["pool", "create"], &d);
    for f in ["d0", "d1"] {
        let m = std::fs::metadata(disks.join(f)).unwrap();
        assert_eq!(m.len(), 1 << 30, "{f} should be 1G");
    }
    let err = d.fails(&[
        "pool",
        "create",
        "-s",
        "1G",
        "tank",
        &disks.join("d2").display().to_string(),
    ]);
    assert!(err.contains("exists"), "{err}");

    let list = d.ok(&["pool", "list"]);
    let l = lines(&list);
    assert_eq!(
        l[0].split_whitespace().collect::<Vec<_>>(),
        [
            "NAME", "SIZE", "ALLOC", "FREE", "CKPOINT", "EXPANDSZ", "FRAG", "CAP", "DEDUP",
            "HEALTH", "ALTROOT"
        ]
    );
    assert!(
        l[1].starts_with("tank ") && l[1].contains(" ONLINE "),
        "{list}"
    );
    let scripted = d.ok(&["pool", "list", "-H", "-p", "-o", "name,size,health"]);
    let f: Vec<&str> = scripted.trim_end().split('\t').collect();
    assert_eq!(f[0], "tank");
    let size: u64 = f[1].parse().expect("exact size");
    assert!(size > 0 && size <= 1 << 30, "{size}");
    assert_eq!(f[2], "ONLINE");
    let pools: serde_json::Value =
        serde_json::from_str(&d.ok(&["pool", "list", "--json"])).unwrap();
    assert_eq!(pools[0]["name"], "tank");

    let status = d.ok(&["pool", "status", "tank"]);
    assert!(status.contains("pool: tank"), "{status}");
    assert!(status.contains("mirror-0"), "{status}");
    assert!(
        status.contains(&disks.join("d0").display().to_string()),
        "{status}"
    );
    assert!(status.contains("READ  WRITE  CKSUM"), "{status}");
    assert!(status.contains("errors: No known data errors"), "{status}");
    let st: serde_json::Value =
        serde_json::from_str(&d.ok(&["pool", "status", "--json", "tank"])).unwrap();
    assert_eq!(st["pools"]["tank"]["groups"][0]["kind"], "mirror");
    assert!(d.fails(&["pool", "status", "nope"]).contains("nope"));

    // Volumes and properties.
    d.ok(&[
        "create",
        "-V",
        "64M",
        "-o",
        "compression=lz4",
        "-o",
        "volblocksize=16K",
        "tank/vol0",
    ]);
    assert!(d
        .fails(&["create", "-V", "64M", "tank/vol0"])
        .contains("exists"));
    assert!(d
        .fails(&["create", "-V", "64M", "nope/vol0"])
        .contains("nope"));
    assert!(d
        .fails(&["create", "-V", "64M", "tank"])
        .contains("POOL/VOL"));
    d.fails(&[
        "create",
        "-V",
        "64M",
        "-o",
        "compression=bogus",
        "tank/vol1",
    ]);

    let list = d.ok(&["list"]);
    let l = lines(&list);
    assert_eq!(
        l[0].split_whitespace().collect::<Vec<_>>(),
        ["NAME", "USED", "AVAIL", "REFER"],
        "{list}"
    );
    assert!(l.iter().any(|r| r.starts_with("tank ")), "{list}");
    assert!(l.iter().any(|r| r.starts_with("tank/vol0 ")), "{list}");
    assert_eq!(
        d.ok(&["list", "-H", "-o", "name", "-t", "volume"]),
        "tank/vol0\n"
    );
    assert_eq!(
        d.ok(&["list", "-H", "-o", "name,type", "-t", "filesystem"]),
        "tank\tfilesystem\n"
    );
    assert_eq!(
        d.ok(&["list", "-H", "-o", "name", "-r", "tank"]),
        "tank\ntank/vol0\n"
    );
    assert_eq!(d.ok(&["list", "-H", "-o", "name", "tank"]), "tank\n");
    assert_eq!(
        d.ok(&["list", "-H", "-p", "-o", "volsize", "tank/vol0"]),
        format!("{}\n", 64 << 20)
    );
    assert!(d.fails(&["list", "tank/nope"]).contains("tank/nope"));
    assert!(d.fails(&["list", "-o", "name,bogus"]).contains("bogus"));
    let ds: serde_json::Value =
        serde_json::from_str(&d.ok(&["list", "--json", "tank/vol0"])).unwrap();
    assert_eq!(ds[0]["name"], "tank/vol0");
    assert_eq!(ds[0]["kind"], "volume");

    assert_eq!(
        d.ok(&["get", "-H", "-p", "-o", "value", "volsize", "tank/vol0"]),
        format!("{}\n", 64 << 20)
    );
    assert_eq!(
        d.ok(&[
            "get",
            "-H",
            "-p",
            "-o",
            "value",
            "volblocksize",
            "tank/vol0"
        ]),
        "16384\n"
    );
    assert_eq!(
        d.ok(&[
            "get",
            "-H",
            "-o",
            "property,value,source",
            "compression",
            "tank/vol0"
        ]),
        "compression\tlz4\tlocal\n"
    );
    let all = d.ok(&["get", "all", "tank/vol0"]);
    for p in [
        "volsize",
        "used",
        "logicalused",
        "referenced",
        "available",
        "compressratio",
        "compression",
        "checksum",
        "volblocksize",
    ] {
        assert!(
            all.lines().any(|l| l.split_whitespace().nth(1) == Some(p)),
            "get all lacks {p}:\n{all}"
        );
    }
    assert!(all.starts_with("NAME"), "{all}");
    let rows: serde_json::Value =
        serde_json::from_str(&d.ok(&["get", "--json", "compress", "tank/vol0"])).unwrap();
    assert_eq!(rows[0]["property"], "compression");
    assert_eq!(rows[0]["value"], "lz4");
    assert!(d.fails(&["get", "all", "tank/nope"]).contains("tank/nope"));
    assert!(d.fails(&["get", "bogus", "tank/vol0"]).contains("bogus"));

    d.ok(&["set", "compression=zstd", "tank/vol0"]);
    assert_eq!(
        d.ok(&["get", "-H", "-o", "value", "compression", "tank/vol0"]),
        "zstd\n"
    );
    d.ok(&["set", "volsize=128M", "tank/vol0"]);
    assert_eq!(
        d.ok(&["get", "-H", "-p", "-o", "value", "volsize", "tank/vol0"]),
        format!("{}\n", 128 << 20)
    );
    d.fails(&["set", "volsize=1M", "tank/vol0"]); // volsize only grows
    d.fails(&["set", "used=5", "tank/vol0"]); // read-only statistic
    d.fails(&["set", "compression=lz4", "tank/nope"]);
    d.fails(&["set", "volsize=12Q", "tank/vol0"]);

    // The API itself: JSON errors, a 400 for a bad body, metrics.
    let (code, body) = http(&d, "GET", "/v1/dataset?name=tank/nope", "");
    assert_eq!(code, 404, "{body}");
    let e: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(e["kind"], "NotFound");
    let (code, body) = http(&d, "POST", "/v1/datasets", "{not json");
    assert_eq!(code, 400, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["kind"],
        "BadRequest"
    );
    let (code, _) = http(&d, "POST", "/v1/datasets", r#"{"name":"tank/x"}"#);
    assert_eq!(code, 400);
    let (code, _) = http(&d, "GET", "/v1/dataset", "");
    assert_eq!(code, 400);
    let (code, body) = http(&d, "POST", "/v1/pools", r#"{"name":"tank","groups":[]}"#);
    assert_eq!(code, 400, "{body}");
    // Without the token, or with a wrong one: 401, and nothing happens.
    let (code, body) = http_as(&d.api, None, "DELETE", "/v1/pools/tank", "");
    assert_eq!(code, 401, "{body}");
    let (code, _) = http_as(&d.api, Some("0bad"), "GET", "/v1/pools", "");
    assert_eq!(code, 401);
    let (code, _) = http_as(&d.api, None, "GET", "/metrics", "");
    assert_eq!(code, 401, "/metrics is closed unless [api] metrics_open");
    let (code, body) = http(&d, "GET", "/v1/health", "");
    assert_eq!(code, 200);
    assert!(body.contains("\"ok\""));
    let (code, body) = http(&d, "GET", "/v1/nothing", "");
    assert_eq!(code, 404, "{body}");
    let importable = http(
        &d,
        "GET",
        &format!("/v1/import?dir={}", disks.display()),
        "",
    );
    assert_eq!(importable.0, 200, "{}", importable.1);

    // Export and import.
    d.ok(&["pool", "export", "tank"]);
    assert_eq!(d.ok(&["pool", "list", "-H"]), "");
    assert_eq!(d.ok(&["list", "-H"]), "");
    d.fails(&["pool", "export", "tank"]);
    let found = d.cli_in(&disks, &["pool", "import"]);
    assert_success(&found, &["pool", "import"], &d);
    let found = String::from_utf8_lossy(&found.stdout).into_owned();
    assert!(found.contains("pool: tank"), "{found}");
    // Devices of an exported pool are not taken without -f.
    let err = d.fails(&[
        "pool",
        "create",
        "other",
        &disks.join("d0").display().to_string(),
    ]);
    assert!(err.contains("tank"), "{err}");
    d.fails(&["pool", "import", "-d", disks.to_str().unwrap(), "nope"]);
    d.ok(&["pool", "import", "-d", disks.to_str().unwrap(), "tank"]);
    assert_eq!(
        d.ok(&["list", "-H", "-o", "name", "-t", "volume"]),
        "tank/vol0\n"
    );
    assert_eq!(
        d.ok(&["get", "-H", "-o", "value", "compression", "tank/vol0"]),
        "zstd\n"
    );

    // A restart imports the pool again.
    let st = d.stop();
    assert!(st.success(), "serve should exit 0 on SIGTERM: {st:?}");
    let d = Daemon::start(
        &[
            "serve",
            "--state-dir",
            state.to_str().unwrap(),
            "--nbd",
            "127.0.0.1:0",
            "--api",
            "127.0.0.1:0",
        ],
        tmp.path(),
    );
    assert_eq!(
        d.ok(&["list", "-H", "-p", "-o", "name,volsize", "-t", "volume"]),
        format!("tank/vol0\t{}\n", 128 << 20)
    );

    // Metrics (late: a scrape that hangs in the engine would wedge the pool).
    let (code, metrics) = http(&d, "GET", "/metrics", "");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("cistern_pool_txg_commits_total{pool=\"tank\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("cistern_nbd_connections_total"),
        "{metrics}"
    );

    // Destroy.
    d.fails(&["destroy", "tank/nope"]);
    d.ok(&["destroy", "tank/vol0"]);
    assert_eq!(d.ok(&["list", "-H", "-t", "volume"]), "");
    d.fails(&["pool", "destroy", "nope"]);
    d.ok(&["pool", "destroy", "tank"]);
    assert_eq!(d.ok(&["pool", "list"]), "no pools available\n");
    let st = d.stop();
    assert!(st.success(), "{st:?}");
}

#[test]
fn quickstart_creates_then_imports() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("qs");
    let args = [
        "quickstart",
        "--state-dir",
        state.to_str().unwrap(),
        "--nbd",
        "127.0.0.1:0",
        "--api",
        "127.0.0.1:0",
    ];
    let d = Daemon::start(&args, tmp.path());
    let vol_line = d
        .stdout
        .iter()
        .find(|l| l.starts_with("Volume tank/vol0: "))
        .cloned();
    assert_eq!(
        vol_line,
        Some(format!("Volume tank/vol0: {}/tank/vol0", d.nbd)),
        "{:?}",
        d.stdout
    );
    assert!(state.join("disks/d0").exists() && state.join("disks/d1").exists());
    assert_eq!(
        d.ok(&["get", "-H", "-o", "value", "compression", "tank/vol0"]),
        "lz4\n"
    );
    assert_eq!(
        d.ok(&["get", "-H", "-p", "-o", "value", "volsize", "tank/vol0"]),
        format!("{}\n", 4u64 << 30)
    );
    let status = d.ok(&["pool", "status", "tank"]);
    assert!(status.contains("mirror-0"), "{status}");
    d.ok(&["create", "-V", "16M", "tank/extra"]);
    assert!(d.stop().success());

    // Second start: same pool, nothing recreated.
    let d = Daemon::start(&args, tmp.path());
    assert!(
        d.stdout
            .iter()
            .any(|l| l.starts_with("Volume tank/extra: ")),
        "{:?}",
        d.stdout
    );
    // Exported, it is imported again on the next quickstart.
    d.ok(&["pool", "export", "tank"]);
    assert!(d.stop().success());
    let d = Daemon::start(&args, tmp.path());
    assert!(
        d.stdout
            .iter()
            .any(|l| l.starts_with("Volume tank/extra: ")),
        "{:?}",
        d.stdout
    );
    assert!(d.stop().success());
}
