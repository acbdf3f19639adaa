//! The daemon's own smbd: started in a process group of its own (so its
//! helpers - notifyd, cleanupd, one smbd per client - stop with it),
//! told to reload or to close a share with smbcontrol, stopped with the
//! daemon.

use crate::conf::Dirs;
use crate::Error;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long smbd gets to listen after it starts, and to exit when stopped.
const START_TIMEOUT: Duration = Duration::from_secs(15);
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// smbcontrol waits this long for an answer (`-t`).
const CONTROL_TIMEOUT_SECS: &str = "10";

pub struct Smbd {
    child: Child,
    conf: PathBuf,
    smbcontrol: PathBuf,
}

/// A program on PATH (or the path given, if it has a slash).
pub fn find_program(name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 {
        return name.is_file().then(|| name.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    // smbd lives in /usr/sbin, which a non-root PATH often lacks.
    dirs.extend(["/usr/sbin", "/sbin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// Samba's VFS modules ship apart from smbd on Debian (samba-vfs-modules);
/// without fruit every connection fails, so say so up front.
pub fn missing_vfs_modules(smbd: &Path) -> Option<String> {
    let out = Command::new(smbd).arg("-b").output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let dir = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("MODULESDIR:"))?
        .trim()
        .to_string();
    let missing: Vec<&str> = ["catia", "fruit", "streams_xattr"]
        .into_iter()
        .filter(|m| !Path::new(&dir).join("vfs").join(format!("{m}.so")).exists())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "Samba VFS modules {} are missing from {dir}/vfs (Debian: apt install samba-vfs-modules)",
            missing.join(", ")
        )
    })
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    pid > 0 && unsafe { libc::kill(pid, 0) } == 0
}

fn signal_group(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: a negative pid signals the process group smbd leads.
        unsafe { libc::kill(-pgid, sig) };
    }
}

/// samba-dcerpcd (started by smbd for share listings and other RPC) makes
/// a session of its own, so it leaves smbd's group: find the ones started
/// for this smb.conf (`--configfile=CONF`) and stop their groups.
fn stop_rpc_helpers(conf: &Path) {
    let want = format!("--configfile={}", conf.display());
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
        let is_dcerpcd = args.next().is_some_and(|a| a.ends_with("/samba-dcerpcd"));
        if is_dcerpcd && args.any(|a| a == want) {
            tracing::debug!(pid, "stopping samba-dcerpcd");
            signal_group(pid, libc::SIGTERM);
        }
    }
}

/// An smbd left by a daemon that was killed (-9) still holds the port and
/// the pid file: stop its group if the pid file names an smbd of this conf.
fn stop_stale(dirs: &Dirs, conf: &Path) {
    stop_rpc_helpers(conf);
    let Ok(text) = std::fs::read_to_string(dirs.pid_file()) else {
        return;
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return;
    };
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let ours = String::from_utf8_lossy(&cmdline).contains(&*conf.to_string_lossy());
    if !process_alive(pid) || !ours {
        return;
    }
    tracing::warn!(pid, "stopping an smbd left by an earlier daemon");
    signal_group(pid, libc::SIGTERM);
    let deadline = Instant::now() + STOP_TIMEOUT;
    while process_alive(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    signal_group(pid, libc::SIGKILL);
}

impl Smbd {
    /// Starts smbd on `conf` and waits until it accepts connections at `listen`.
    pub fn start(
        smbd: &Path,
        smbcontrol: &Path,
        dirs: &Dirs,
        listen: SocketAddr,
    ) -> Result<Smbd, Error> {
        let conf = dirs.conf();
        stop_stale(dirs, &conf);
        let log = dirs.sub("log").join("smbd.stdout");
        let out = std::fs::File::create(&log).map_err(|e| Error::io(&log, e))?;
        let err = out.try_clone().map_err(|e| Error::io(&log, e))?;
        let mut cmd = Command::new(smbd);
        cmd.arg("--foreground")
            .arg("--no-process-group")
            .arg("-s")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own group, led by smbd: one signal stops it and every helper.
            .process_group(0);
        let child = cmd
            .spawn()
            .map_err(|e| Error::Smbd(format!("cannot start {}: {e}", smbd.display())))?;
        let mut me = Smbd {
            child,
            conf,
            smbcontrol: smbcontrol.to_path_buf(),
        };
        let probe = if listen.ip().is_unspecified() {
            SocketAddr::from(([127, 0, 0, 1], listen.port()))
        } else {
            listen
        };
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = me.exited() {
                return Err(Error::Smbd(format!(
                    "smbd exited at start ({status}); see {}",
                    log.display()
                )));
            }
            if TcpStream::connect_timeout(&probe, Duration::from_millis(200)).is_ok() {
                tracing::info!(pid = me.child.id(), %listen, "smbd started");
                return Ok(me);
            }
            if Instant::now() > deadline {
                me.stop();
                return Err(Error::Smbd(format!(
                    "smbd did not listen on {listen} within {START_TIMEOUT:?}; see {}",
                    log.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `Some(status)` once smbd has exited (and is reaped).
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(s)) => Some(s.to_string()),
            Ok(None) => None,
            Err(e) => Some(format!("cannot wait for it: {e}")),
        }
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// `smbcontrol -s CONF smbd ARGS...`.
    fn control(&self, args: &[&str]) -> Result<(), Error> {
        let out = Command::new(&self.smbcontrol)
            .arg("-s")
            .arg(&self.conf)
            .args(["-t", CONTROL_TIMEOUT_SECS, "smbd"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::Smbd(format!("cannot run {}: {e}", self.smbcontrol.display())))?;
        if out.status.success() {
            return Ok(());
        }
        Err(Error::Smbd(format!(
            "smbcontrol smbd {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }

    /// Re-reads smb.conf (the parent tells every client's smbd).
    pub fn reload(&self) -> Result<(), Error> {
        self.control(&["reload-config"]).or_else(|e| {
            // Without smbcontrol, SIGHUP does the same.
            tracing::debug!("{e}; sending SIGHUP");
            // SAFETY: signals our own child.
            match unsafe { libc::kill(self.pid(), libc::SIGHUP) } {
                0 => Ok(()),
                _ => Err(e),
            }
        })
    }

    /// Disconnects every client of share `name`: their open files are
    /// closed and clients reconnect (a forced tree disconnect).
    pub fn close_share(&self, name: &str) -> Result<(), Error> {
        self.control(&["close-share", name])
    }

    /// Whether a client is connected to share `name` (`smbstatus -S`);
    /// None when smbstatus cannot tell.
    pub fn connected(&self, name: &str) -> Option<bool> {
        let bin = find_program(Path::new("smbstatus"))?;
        let out = Command::new(bin)
            .arg("-s")
            .arg(&self.conf)
            .arg("-S")
            .stdin(Stdio::null())
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let prefix = format!("{name} ");
        Some(
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.starts_with(&prefix)),
        )
    }

    /// SIGTERM to the group, SIGKILL after STOP_TIMEOUT; then the RPC helpers.
    pub fn stop(&mut self) {
        self.stop_group();
        stop_rpc_helpers(&self.conf);
    }

    fn stop_group(&mut self) {
        let pgid = self.pid();
        if self.exited().is_some() {
            // The group may still hold helpers.
            signal_group(pgid, libc::SIGTERM);
            return;
        }
        signal_group(pgid, libc::SIGTERM);
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if self.exited().is_some() {
                // Helpers (samba-dcerpcd) follow their parent; make sure.
                signal_group(pgid, libc::SIGTERM);
                tracing::info!("smbd stopped");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        tracing::warn!("smbd still running {STOP_TIMEOUT:?} after SIGTERM; SIGKILL");
        signal_group(pgid, libc::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Drop for Smbd {
    fn drop(&mut self) {
        if self.exited().is_none() {
            self.stop();
        }
    }
}
