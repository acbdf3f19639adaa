//! The FUSE mount of filesystem datasets: a fuser [`fuser::Filesystem`]
//! over [`posix::Fs`] (`fs.rs`), and [`Mounts`], the daemon's table of
//! mounted filesystems (`cistern mount`, the `mountpoint` property).
//!
//! - Requests run on fuser's threads (`[fuse] threads` per mount, each with
//!   its own /dev/fuse fd); the kernel bounds what is queued
//!   (max_background).
//! - The kernel checks permissions (`default_permissions`: mode bits,
//!   sticky directories, POSIX ACLs when `acltype=posix`).
//! - Attributes and names are cached for `[fuse] attr_timeout_secs` (1 s),
//!   data with the kernel's writeback cache; a rollback of a mounted
//!   filesystem writes the dirty pages back first (syncfs) and invalidates
//!   every inode and name the kernel holds after, so nothing from before
//!   the rollback is served.
//! - A mount holds the dataset open ([`dataset::Engine::open_handle_following`]):
//!   destroy and export say "dataset is busy" unless forced (which unmounts it).
//! - If the daemon dies the kernel's connection dies with it: the mountpoint
//!   answers ENOTCONN ("Transport endpoint is not connected") until the
//!   daemon starts again and mounts it anew (the stale mount is detached
//!   first). Inode numbers are object ids, so they are the same after that.

mod fs;

use dataset::{DatasetKind, Engine, Error, OpenHandle, Result, RollbackPhase};
use fs::{CisternFs, Shared};
use fuser::{Config, MountOption, Notifier, SessionACL, SessionUnmounter};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

pub use fs::{SNAPSHOT_DIR, ZFS_DIR};

/// `[fuse]` in the daemon's config.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FuseConfig {
    /// Threads serving each mount.
    pub threads: usize,
    /// Let users other than the daemon's use the mounts (`allow_other`;
    /// for a daemon not run by root /etc/fuse.conf must say `user_allow_other`).
    /// Default: on for a daemon run by root (as a zfs mount is everyone's,
    /// permissions checked by the kernel; smbd serves each user as that user).
    pub allow_other: bool,
    /// The kernel's writeback cache (writes gathered in the page cache).
    pub writeback_cache: bool,
    /// How long the kernel trusts attributes and names of the head.
    pub attr_timeout_secs: f64,
}

impl Default for FuseConfig {
    fn default() -> Self {
        FuseConfig {
            threads: 4,
            // SAFETY: geteuid has no preconditions.
            allow_other: unsafe { libc::geteuid() } == 0,
            writeback_cache: true,
            attr_timeout_secs: 1.0,
        }
    }
}

/// One mounted filesystem, as `cistern mount` lists it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MountInfo {
    pub dataset: String,
    pub mountpoint: PathBuf,
}

struct Mounted {
    shared: Arc<Shared>,
    dir: PathBuf,
    /// The FUSE connection's number (/sys/fs/fuse/connections/N).
    conn: Option<u64>,
    session: Option<SessionThread>,
    _handle: OpenHandle,
}

impl Mounted {
    fn info(&self) -> MountInfo {
        MountInfo {
            dataset: self.shared.head.name(),
            mountpoint: self.dir.clone(),
        }
    }
}

/// A FUSE session served by its own thread. fuser's `BackgroundSession`
/// unmounts again when dropped, after we already did, and logs every clean
/// unmount as "Unmount failed: Invalid argument" (its is-it-still-mounted poll
/// takes the POLLERR of a gone connection for "mounted"). Holding fuser's
/// unmounter ourselves, our first unmount goes through it (which disarms its
/// unmount at drop) and later ones through `umount2`.
struct SessionThread {
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
    /// None once used: fuser's mount handle is spent, even if that unmount failed.
    unmounter: Option<SessionUnmounter>,
}

/// Unmounts `dir` (flags 0): through fuser's unmounter when there is one (the
/// first unmount of the session), with `umount2` otherwise.
fn unmount_dir(unmounter: Option<SessionUnmounter>, dir: &Path) -> std::io::Result<()> {
    let Some(mut u) = unmounter else {
        return umount2(dir, 0);
    };
    u.unmount()?;
    // fuser skips the unmount when it thinks nothing is mounted: check.
    if mounted_at(dir) {
        return umount2(dir, 0);
    }
    Ok(())
}

impl SessionThread {
    /// After the unmount: the session's threads end with the connection.
    fn join(mut self) {
        match self.thread.take().map(|t| t.join()) {
            None | Some(Ok(Ok(()))) => {}
            Some(Ok(Err(e))) => tracing::debug!(error = %e, "FUSE session ended with an error"),
            Some(Err(_)) => tracing::warn!("FUSE session thread panicked"),
        }
    }
}

impl Drop for SessionThread {
    /// Dropped before anyone unmounted it: fuser's unmount is the only one, so
    /// its failure is real. Not joined: a failed unmount leaves it serving.
    fn drop(&mut self) {
        if let Some(mut u) = self.unmounter.take() {
            if let Err(e) = u.unmount() {
                tracing::warn!(error = %e, "FUSE unmount failed");
            }
        }
    }
}

/// Told a dataset's name before it is rolled back while mounted.
pub type BeforeRollback = Arc<dyn Fn(&str) + Send + Sync>;

struct Inner {
    engine: Arc<Engine>,
    cfg: FuseConfig,
    mounts: Mutex<BTreeMap<u64, Mounted>>,
    next: Mutex<u64>,
    /// Serialises mount and unmount (a mount takes a while; two of one dataset must not race).
    admin: Mutex<()>,
    /// Told the dataset's name before a rollback of a mounted filesystem
    /// (the daemon: Samba disconnects the share's clients).
    before_rollback: Mutex<Option<BeforeRollback>>,
}

/// The daemon's mounted filesystems.
#[derive(Clone)]
pub struct Mounts {
    inner: Arc<Inner>,
}

fn io(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Io(format!("{what}: {e}"))
}

/// The mount table's entry for `dir`, if something is mounted there.
fn mounted_at(dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.as_os_str().as_bytes();
    text.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|p| unescape(p).as_slice() == want)
    })
}

/// Whether `dir` holds a FUSE mount of `dataset` made by a daemon before
/// this one (its connection died with it: ENOTCONN).
fn stale_mount_of(dir: &Path, dataset: &str) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = dir.as_os_str().as_bytes();
    let source = format!("cistern:{dataset}");
    text.lines().any(|l| {
        let here = l
            .split(' ')
            .nth(4)
            .is_some_and(|p| unescape(p).as_slice() == want);
        let mut tail = l.split(" - ").nth(1).unwrap_or("").split(' ');
        // The subtype shows only when fusermount made the mount.
        here && matches!(tail.next(), Some("fuse" | "fuse.cistern"))
            && tail
                .next()
                .is_some_and(|s| unescape(s) == source.as_bytes())
    })
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 4], 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    out
}

fn umount2(dir: &Path, flags: i32) -> std::io::Result<()> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: a valid NUL-terminated path.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Cuts a FUSE connection: every request in it fails, the session's threads end.
fn abort_connection(conn: u64) {
    let p = format!("/sys/fs/fuse/connections/{conn}/abort");
    if let Err(e) = std::fs::write(&p, b"1") {
        tracing::debug!(path = %p, error = %e, "cannot abort the FUSE connection");
    }
}

/// syncfs(2) of a mount: the kernel writes its dirty pages to us.
fn syncfs(dir: &Path) {
    match std::fs::File::open(dir) {
        Ok(f) => {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor.
            unsafe { libc::syncfs(f.as_raw_fd()) };
        }
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot write back before rollback")
        }
    }
}

/// A filesystem with files: not the pool's root dataset, which only holds
/// the tree and its inherited properties (its `mountpoint` is inherited by
/// the children with their names appended, as zfs does).
fn mountable(d: &dataset::DatasetInfo) -> bool {
    d.kind == DatasetKind::Filesystem && d.name.contains('/')
}

/// Whether the daemon may ask for `allow_other`.
fn allow_other_permitted() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    std::fs::read_to_string("/etc/fuse.conf").is_ok_and(|t| {
        t.lines()
            .any(|l| l.split('#').next().unwrap_or("").trim() == "user_allow_other")
    })
}

impl Mounts {
    pub fn new(engine: Arc<Engine>, cfg: FuseConfig) -> Mounts {
        Mounts {
            inner: Arc::new(Inner {
                engine,
                cfg,
                mounts: Mutex::new(BTreeMap::new()),
                next: Mutex::new(0),
                admin: Mutex::new(()),
                before_rollback: Mutex::new(None),
            }),
        }
    }

    /// Who else must let go of a mounted filesystem before it is rolled back.
    pub fn on_rollback(&self, f: BeforeRollback) {
        *self.inner.before_rollback.lock() = Some(f);
    }

    /// What is mounted, by mountpoint.
    pub fn list(&self) -> Vec<MountInfo> {
        let mut v: Vec<MountInfo> = self
            .inner
            .mounts
            .lock()
            .values()
            .map(Mounted::info)
            .collect();
        v.sort_by(|a, b| a.mountpoint.cmp(&b.mountpoint));
        v
    }

    /// The mountpoint property's path for a filesystem (None: `none`/`legacy`).
    fn mountpoint_of(&self, dataset: &str) -> Result<Option<PathBuf>> {
        let info = self.inner.engine.dataset(dataset)?;
        if info.kind != DatasetKind::Filesystem {
            return Err(Error::InvalidArgument(format!(
                "'{dataset}' is not a filesystem"
            )));
        }
        Ok(info
            .property("mountpoint")
            .map(|p| p.value.clone())
            .filter(|v| v.starts_with('/'))
            .map(PathBuf::from))
    }

    /// `cistern mount DATASET [DIR]`: at DIR, or where its `mountpoint` says.
    pub fn mount(&self, dataset: &str, dir: Option<&Path>) -> Result<MountInfo> {
        let _admin = self.inner.admin.lock();
        self.mount_locked(dataset, dir)
    }

    fn mount_locked(&self, dataset: &str, dir: Option<&Path>) -> Result<MountInfo> {
        let inner = &self.inner;
        let prop = self.mountpoint_of(dataset)?;
        let dir = match (dir, prop) {
            (Some(d), _) => d.to_path_buf(),
            (None, Some(p)) => p,
            (None, None) => {
                return Err(Error::InvalidArgument(format!(
                    "cannot mount '{dataset}': no mountpoint set (cistern set mountpoint=/DIR {dataset}, or give a directory)"
                )))
            }
        };
        if !dir.is_absolute() {
            return Err(Error::InvalidArgument(format!(
                "cannot mount '{dataset}' on '{}': the directory must be an absolute path",
                dir.display()
            )));
        }
        if let Some(m) = inner
            .mounts
            .lock()
            .values()
            .find(|m| m.shared.head.name() == dataset || m.dir == dir)
        {
            return Err(Error::Busy(format!(
                "cannot mount '{dataset}' on '{}': '{}' is already mounted on '{}'",
                dir.display(),
                m.shared.head.name(),
                m.dir.display()
            )));
        }
        // A mount left by a daemon that died answers ENOTCONN: detach it.
        if stale_mount_of(&dir, dataset) {
            tracing::info!(dir = %dir.display(), "detaching the mount of a daemon that is gone");
            umount2(&dir, libc::MNT_DETACH).map_err(|e| io(&dir.display().to_string(), e))?;
        }
        match std::fs::metadata(&dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(&dir).map_err(|e| io(&dir.display().to_string(), e))?;
            }
            Err(e) => return Err(io(&dir.display().to_string(), e)),
            Ok(m) if !m.is_dir() => {
                return Err(Error::InvalidArgument(format!(
                    "cannot mount '{dataset}': '{}' is not a directory",
                    dir.display()
                )))
            }
            Ok(_) => {}
        }
        if mounted_at(&dir) {
            return Err(Error::Busy(format!(
                "cannot mount '{dataset}': something is mounted on '{}' already",
                dir.display()
            )));
        }
        let non_empty = std::fs::read_dir(&dir)
            .map_err(|e| io(&dir.display().to_string(), e))?
            .next()
            .is_some();
        if non_empty {
            return Err(Error::InvalidArgument(format!(
                "cannot mount '{dataset}' on '{}': directory is not empty",
                dir.display()
            )));
        }

        let objs = inner.engine.open_objects(dataset)?;
        if objs.is_readonly()? && dataset.contains('@') {
            return Err(Error::InvalidArgument(format!(
                "'{dataset}' is a snapshot: it is browsable under .zfs/snapshot of its filesystem"
            )));
        }
        let readonly = objs.is_readonly()?;
        let head = posix::Fs::shared(objs).map_err(|e| Error::Io(e.to_string()))?;
        let ttl = Duration::from_secs_f64(inner.cfg.attr_timeout_secs.clamp(0.0, 3600.0));
        let shared = Arc::new(Shared::new(
            head,
            inner.engine.clone(),
            ttl,
            inner.cfg.writeback_cache,
        ));
        let id = {
            let mut n = inner.next.lock();
            *n += 1;
            *n
        };
        let weak: Weak<Inner> = Arc::downgrade(inner);
        let revoke: dataset::Revoke = Arc::new(move |reason: &str| {
            if let Some(inner) = weak.upgrade() {
                tracing::info!(id, reason, "unmounting by force");
                Mounts { inner }.force_unmount(id);
            }
        });
        let notifier: Arc<OnceLock<Notifier>> = Arc::new(OnceLock::new());
        let follow: dataset::FollowRollback = {
            let (shared, notifier, dir) = (shared.clone(), notifier.clone(), dir.clone());
            let before = inner.before_rollback.lock().clone();
            let ds = dataset.to_string();
            Arc::new(move |phase| match phase {
                RollbackPhase::Before => {
                    if let Some(b) = &before {
                        b(&ds);
                    }
                    syncfs(&dir)
                }
                RollbackPhase::After => invalidate(&shared, notifier.get()),
            })
        };
        let handle = inner.engine.open_handle_following(
            dataset,
            &format!("FUSE mount on {}", dir.display()),
            revoke,
            follow,
        )?;

        let opts = vec![
            MountOption::FSName(format!("cistern:{dataset}")),
            MountOption::Subtype("cistern".into()),
            MountOption::DefaultPermissions,
            if readonly {
                MountOption::RO
            } else {
                MountOption::RW
            },
        ];
        let mut config = Config::default();
        config.mount_options = opts;
        config.n_threads = Some(inner.cfg.threads.clamp(1, 64));
        config.clone_fd = true;
        if inner.cfg.allow_other {
            if allow_other_permitted() {
                config.acl = SessionACL::All;
            } else {
                tracing::warn!(
                    "[fuse] allow_other is set but /etc/fuse.conf lacks user_allow_other: \
                     only the daemon's user can use the mount"
                );
            }
        }
        let cannot = |e| {
            io(
                &format!("cannot mount '{dataset}' on '{}'", dir.display()),
                e,
            )
        };
        let mut session = fuser::Session::new(
            CisternFs {
                shared: shared.clone(),
            },
            &dir,
            &config,
        )
        .map_err(cannot)?;
        let _ = notifier.set(session.notifier());
        let unmounter = session.unmount_callable();
        // On a spawn failure the session is dropped, which unmounts.
        let thread = std::thread::Builder::new()
            .name("fuser-bg".into())
            .spawn(move || session.run())
            .map_err(cannot)?;
        let session = SessionThread {
            thread: Some(thread),
            unmounter: Some(unmounter),
        };
        // The connection's number is the minor of the mount's device.
        let conn = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&dir)
                .ok()
                .map(|m| u64::from(libc::minor(m.dev())))
        };
        tracing::info!(dataset, dir = %dir.display(), "mounted");
        let m = Mounted {
            shared,
            dir,
            conn,
            session: Some(session),
            _handle: handle,
        };
        let info = m.info();
        inner.mounts.lock().insert(id, m);
        Ok(info)
    }

    /// `cistern unmount DATASET|DIR`: refused while files are open there
    /// (EBUSY) unless `force` (then detached and its connection cut).
    pub fn unmount(&self, target: &str, force: bool) -> Result<MountInfo> {
        let _admin = self.inner.admin.lock();
        let id = {
            let mounts = self.inner.mounts.lock();
            let t = Path::new(target);
            mounts
                .iter()
                .find(|(_, m)| m.shared.head.name() == target || m.dir == t)
                .map(|(id, _)| *id)
                .ok_or_else(|| Error::NotFound(format!("'{target}' is not mounted")))?
        };
        self.unmount_id(id, force)
    }

    fn unmount_id(&self, id: u64, force: bool) -> Result<MountInfo> {
        let (dir, conn, info, unmounter) = {
            let mut mounts = self.inner.mounts.lock();
            let m = mounts
                .get_mut(&id)
                .ok_or_else(|| Error::NotFound("mount".into()))?;
            // Spent by this attempt whatever its outcome (fuser's mount handle is consumed).
            let u = m.session.as_mut().and_then(|s| s.unmounter.take());
            (m.dir.clone(), m.conn, m.info(), u)
        };
        // Not under the lock: unmounting flushes cached writes through this daemon.
        match unmount_dir(unmounter, &dir) {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && !force => {
                return Err(Error::Busy(format!(
                    "cannot unmount '{}': target is busy (files are open there); use -f",
                    dir.display()
                )))
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && !mounted_at(&dir) => {}
            Err(e) if force => {
                tracing::info!(dir = %dir.display(), error = %e, "detaching");
                let _ = umount2(&dir, libc::MNT_DETACH);
                if let Some(c) = conn {
                    abort_connection(c);
                }
            }
            Err(e) => return Err(io(&format!("cannot unmount '{}'", dir.display()), e)),
        }
        let m = self.inner.mounts.lock().remove(&id);
        if let Some(mut m) = m {
            if let Some(s) = m.session.take() {
                s.join();
            }
        }
        tracing::info!(dataset = %info.dataset, dir = %info.mountpoint.display(), "unmounted");
        Ok(info)
    }

    /// A destroy or export that was forced: gone now, whatever is open there.
    fn force_unmount(&self, id: u64) {
        // Not under `admin`: the revoke may come from an unmount's own caller.
        if let Err(e) = self.unmount_id(id, true) {
            tracing::warn!(error = %e, "forced unmount failed");
        }
    }

    /// `cistern mount -a` and the daemon's start: every filesystem with a
    /// mountpoint that is not mounted yet (in `pool`, or all). Failures are
    /// logged and returned; the others still mount.
    pub fn mount_all(&self, pool: Option<&str>) -> (Vec<MountInfo>, Vec<String>) {
        let _admin = self.inner.admin.lock();
        let mut done = Vec::new();
        let mut failed = Vec::new();
        let list = match self.inner.engine.list_datasets(pool) {
            Ok(l) => l,
            Err(e) => return (done, vec![e.to_string()]),
        };
        let mounted: Vec<String> = self.list().into_iter().map(|m| m.dataset).collect();
        // Parents before children: a child's mountpoint may be inside its parent's.
        let mut fss: Vec<_> = list
            .into_iter()
            .filter(|d| mountable(d) && !mounted.contains(&d.name))
            .filter(|d| {
                d.property("mountpoint")
                    .is_some_and(|p| p.value.starts_with('/'))
            })
            .collect();
        fss.sort_by_key(|d| {
            d.property("mountpoint")
                .map(|p| p.value.matches('/').count())
                .unwrap_or(0)
        });
        for d in fss {
            match self.mount_locked(&d.name, None) {
                Ok(i) => done.push(i),
                Err(e) => {
                    tracing::error!(dataset = %d.name, error = %e, "not mounted");
                    failed.push(format!("{}: {e}", d.name));
                }
            }
        }
        (done, failed)
    }

    /// Unmounts everything in `pool` (or all), children first; `force`
    /// detaches busy ones. The first refusal stops it (nothing else changes).
    pub fn unmount_all(&self, pool: Option<&str>, force: bool) -> Result<Vec<MountInfo>> {
        let _admin = self.inner.admin.lock();
        let mut ids: Vec<(u64, MountInfo)> = self
            .inner
            .mounts
            .lock()
            .iter()
            .map(|(id, m)| (*id, m.info()))
            .filter(|(_, i)| {
                pool.is_none_or(|p| i.dataset == p || i.dataset.starts_with(&format!("{p}/")))
            })
            .collect();
        ids.sort_by_key(|(_, i)| std::cmp::Reverse(i.mountpoint.components().count()));
        let mut out = Vec::new();
        for (id, _) in ids {
            out.push(self.unmount_id(id, force)?);
        }
        Ok(out)
    }

    /// After `mountpoint` changed on `dataset` (set or inherit): every
    /// filesystem at or below it moves to its new place, mounts, or unmounts.
    pub fn mountpoint_changed(&self, dataset: &str) -> Result<()> {
        let list = self.inner.engine.list_datasets(Some(dataset))?;
        let mut moves: Vec<(String, Option<PathBuf>, Option<PathBuf>)> = Vec::new();
        let mounted = self.list();
        for d in list
            .iter()
            .filter(|d| mountable(d) && !d.name.contains('@'))
        {
            let want = d
                .property("mountpoint")
                .map(|p| p.value.clone())
                .filter(|v| v.starts_with('/'))
                .map(PathBuf::from);
            let now = mounted
                .iter()
                .find(|m| m.dataset == d.name)
                .map(|m| m.mountpoint.clone());
            if want != now {
                moves.push((d.name.clone(), now, want));
            }
        }
        // Children's mounts go first (they sit inside their parents'), then
        // parents mount before children.
        let depth = |p: &Option<PathBuf>| p.as_ref().map_or(0, |p| p.components().count());
        moves.sort_by_key(|(_, now, _)| std::cmp::Reverse(depth(now)));
        for (name, now, _) in &moves {
            if now.is_some() {
                self.unmount(name, false)?;
            }
        }
        moves.sort_by_key(|(_, _, want)| depth(want));
        for (name, _, want) in &moves {
            if let Some(w) = want {
                self.mount(name, Some(w))?;
            }
        }
        Ok(())
    }
}

/// After a rollback: the kernel forgets every page, attribute and name of
/// the head it holds (they are re-read from the rolled-back dataset).
fn invalidate(shared: &Shared, notifier: Option<&Notifier>) {
    let Some(n) = notifier else {
        return;
    };
    let (inos, names) = shared.take_cached();
    for (parent, name) in &names {
        // ENOENT: the kernel had dropped it already.
        let _ = n.inval_entry(fuser::INodeNo(*parent), OsStr::from_bytes(name));
    }
    for ino in inos.iter().copied().chain([1]) {
        let _ = n.inval_inode(fuser::INodeNo(ino), 0, 0);
    }
    tracing::info!(
        dataset = %shared.head.name(),
        inodes = inos.len(),
        names = names.len(),
        "kernel caches invalidated after rollback"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(unescape("/a\\040b"), b"/a b".to_vec());
        assert_eq!(unescape("/plain"), b"/plain".to_vec());
    }

    #[test]
    fn config_defaults() {
        let c = FuseConfig::default();
        assert!(c.threads >= 1);
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            c.allow_other,
            unsafe { libc::geteuid() } == 0,
            "on for root only"
        );
    }
}
