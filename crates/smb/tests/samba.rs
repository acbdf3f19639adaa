//! The service with a real smbd (skipped without Samba or root): a share
//! appears when its property is set, `disconnect` (the rollback call) drops
//! a connected client, and `stop` leaves no process behind.

use dataset::*;
use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn samba_missing() -> Option<&'static str> {
    if smb::smbd::find_program(Path::new("smbd")).is_none() {
        return Some("smbd is not installed");
    }
    for tool in ["smbclient", "smbpasswd", "smbstatus"] {
        if smb::smbd::find_program(Path::new(tool)).is_none() {
            return Some("smbclient/smbpasswd/smbstatus are not installed");
        }
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("smbd serves files as their owners only as root");
    }
    None
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// smbstatus -S: is any client connected to `share`?
fn connected(conf: &Path, share: &str) -> bool {
    let out = Command::new(smb::smbd::find_program(Path::new("smbstatus")).unwrap())
        .arg("-s")
        .arg(conf)
        .arg("-S")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.starts_with(&format!("{share} ")))
}

fn ours(conf: &Path) -> Vec<String> {
    let want = conf.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|e| {
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let zombie = stat.rsplit(')').next()?.split_whitespace().next()? == "Z";
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            (cmd.contains(&want) && !zombie).then_some(cmd)
        })
        .collect()
}

#[test]
fn disconnect_drops_clients_and_stop_leaves_nothing() {
    if let Some(why) = samba_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(
        &dir.path().join("state"),
        EngineConfig {
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
                devices: vec![dir.path().join("d0")],
            }],
            create_size: Some(256 << 20),
            force: false,
        })
        .unwrap();
    let mnt = dir.path().join("mnt");
    std::fs::create_dir_all(mnt.join("home")).unwrap();
    engine
        .create_dataset(
            "tank/home",
            DatasetKind::Filesystem,
            &[("mountpoint".into(), mnt.join("home").display().to_string())],
        )
        .unwrap();
    let port = free_port();
    let settings = smb::Settings {
        listen: format!("127.0.0.1:{port}").parse().unwrap(),
        bonjour: false,
        ..smb::Settings::default()
    };
    let samba = smb::Samba::new(engine.clone(), settings, &dir.path().join("state"));
    samba.refresh().unwrap();
    assert!(samba.shares().is_empty());
    engine.set_property("tank/home", "sharesmb", "on").unwrap();
    samba.refresh().unwrap();
    assert_eq!(samba.shares()[0].name, "tank_home");
    let conf = samba.conf_path();
    let mut passwd = Command::new(smb::smbd::find_program(Path::new("smbpasswd")).unwrap())
        .arg("-c")
        .arg(&conf)
        .args(["-a", "-s", "root"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    passwd.stdin.take().unwrap().write_all(b"pw\npw\n").unwrap();
    assert!(passwd.wait().unwrap().success());

    // A client that stays connected (its stdin stays open).
    let mut client = Command::new("smbclient")
        .arg("//127.0.0.1/tank_home")
        .args(["-p", &port.to_string(), "-U", "root%pw"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !connected(&conf, "tank_home") {
        assert!(Instant::now() < deadline, "smbclient never connected");
        std::thread::sleep(Duration::from_millis(100));
    }
    samba.disconnect("tank/home").unwrap();
    assert!(!connected(&conf, "tank_home"));
    // Not shared, or another dataset: nothing to do.
    samba.disconnect("tank").unwrap();
    let _ = client.kill();
    let _ = client.wait();

    assert!(!ours(&conf).is_empty());
    samba.stop();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !ours(&conf).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(ours(&conf), Vec::<String>::new());
    let engine: Arc<Engine> = engine;
    engine.shutdown().unwrap();
}
