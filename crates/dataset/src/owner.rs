//! Who this daemon is, for the one-owner-per-pool rule (decision 0010): the
//! exclusive lock on its state directory and the identity it writes into
//! labels and MMP stamps.

use crate::*;
use std::io::{Read, Seek, Write};
use std::os::unix::io::AsRawFd;

const LOCK_FILE: &str = "lock";
const HOSTID_FILE: &str = "hostid";

/// The state directory's lock, held for the daemon's life (flock: the
/// kernel drops it when the process dies, kill -9 included).
pub(crate) struct StateLock {
    _file: std::fs::File,
}

/// Takes the exclusive lock on `dir/lock` and writes our pid into it; a
/// second daemon on the same directory is refused naming the holder's pid.
pub(crate) fn lock_state_dir(dir: &Path) -> Result<StateLock> {
    let path = dir.join(LOCK_FILE);
    let err = |e: std::io::Error| Error::Io(format!("{}: {e}", path.display()));
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(err)?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err(e));
        }
        let mut pid = String::new();
        let _ = file.read_to_string(&mut pid);
        let pid = pid.trim();
        return Err(Error::Busy(format!(
            "state directory {} is in use by another cistern daemon (pid {})",
            dir.display(),
            if pid.is_empty() { "unknown" } else { pid }
        )));
    }
    file.set_len(0).map_err(err)?;
    file.rewind().map_err(err)?;
    writeln!(file, "{}", std::process::id()).map_err(err)?;
    file.sync_all().map_err(err)?;
    Ok(StateLock { _file: file })
}

/// The first 64 bits of /etc/machine-id, else a random id kept in the state
/// directory's `hostid` file (created once). `CISTERN_HOSTID` (16 hex
/// digits) overrides both: the tests play two hosts on one machine with it.
fn host_id(dir: &Path) -> Result<u64> {
    let parse = |s: &str| u64::from_str_radix(s.trim().get(..16)?, 16).ok();
    if let Ok(v) = std::env::var("CISTERN_HOSTID") {
        return parse(&v).ok_or_else(|| {
            Error::InvalidArgument(format!("CISTERN_HOSTID={v}: 16 hex digits expected"))
        });
    }
    for p in ["/etc/machine-id", "/var/lib/dbus/machine-id"] {
        if let Some(id) = std::fs::read_to_string(p).ok().as_deref().and_then(parse) {
            return Ok(id);
        }
    }
    let path = dir.join(HOSTID_FILE);
    if let Some(id) = std::fs::read_to_string(&path)
        .ok()
        .as_deref()
        .and_then(parse)
    {
        return Ok(id);
    }
    let id = rand::random::<u64>() | 1;
    std::fs::write(&path, format!("{id:016x}\n"))
        .map_err(|e| Error::Io(format!("{}: {e}", path.display())))?;
    Ok(id)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// This daemon as labels and MMP stamps name it.
pub(crate) fn local_owner(state_dir: &Path) -> Result<pool::Owner> {
    let canonical = std::fs::canonicalize(state_dir).unwrap_or_else(|_| state_dir.to_path_buf());
    let digest = blake3::hash(canonical.as_os_str().as_encoded_bytes());
    let mut id = [0u8; 8];
    id.copy_from_slice(&digest.as_bytes()[..8]);
    Ok(pool::Owner {
        hostname: hostname(),
        hostid: host_id(state_dir)?,
        pid: std::process::id(),
        instance: rand::random::<u64>() | 1,
        state_dir: u64::from_le_bytes(id),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_on_a_state_dir_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock_state_dir(dir.path()).unwrap();
        let Err(Error::Busy(msg)) = lock_state_dir(dir.path()) else {
            panic!("second lock taken")
        };
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
        assert!(
            msg.contains(&format!("pid {}", std::process::id())),
            "{msg}"
        );
        drop(held);
        lock_state_dir(dir.path()).unwrap();
        let a = local_owner(dir.path()).unwrap();
        let b = local_owner(dir.path()).unwrap();
        assert_eq!((a.hostid, a.state_dir), (b.hostid, b.state_dir));
        assert_ne!(a.instance, b.instance);
    }
}
