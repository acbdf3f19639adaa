//! The POSIX layer (ZFS's ZPL): inodes, directories, hard and symbolic
//! links, device nodes, permissions, timestamps and extended attributes on
//! top of the object layer ([`dataset::ObjectSet`]). The FUSE mount and the
//! NFS server call [`Fs`]; neither touches objects directly.
//!
//! - An inode is an object; its number is the object id, handed out by a
//!   per-dataset counter that never goes back (not on rollback, not after a
//!   crash), the same in the head, its snapshots and clones. With the
//!   object's generation (the txg it was created in) it names one file for
//!   ever: NFS handles and Samba file ids are built from the pair.
//! - A directory's entries are the object layer's names. Every directory
//!   but the root also holds `..`, a real link to its parent: a parent's
//!   link count is then 2 + its subdirectories, as POSIX wants, and a
//!   rename that moves a directory changes `..` in the same batch.
//! - Every namespace change (create, mkdir, link, unlink, rename, rmdir) is
//!   one [`ObjectOp::Batch`]: after a crash it happened whole or not at all.
//! - Open files that lose their last name stay until the last close
//!   ([`Fs::release`]); after a crash the object layer's unlinked set frees
//!   them at import.
//! - `fsync` is [`ObjectSet::commit`]: the intent log, group-committed.

mod inode;

pub use inode::Inode;

use dataset::objects::ROOT_DIR;
use dataset::{now_ns, ObjectAttrs, ObjectKind, ObjectOp, ObjectSet};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use unicode_normalization::UnicodeNormalization;

/// The root directory's inode number.
pub const ROOT: u64 = ROOT_DIR;
/// Longest file name, bytes (as most Linux filesystems).
pub const NAME_MAX: usize = 255;
/// Longest symbolic link target, bytes.
pub const PATH_MAX: usize = 4096;
/// Largest value of one extended attribute (Linux's XATTR_SIZE_MAX).
pub const XATTR_SIZE_MAX: usize = 64 << 10;
/// Most names one inode may have.
pub const LINK_MAX: u32 = 65_000;
/// readdir cookies of `.` and `..`; names get hashes above them.
pub const COOKIE_DOT: u64 = 1;
pub const COOKIE_DOTDOT: u64 = 2;
/// The name cache of readdir cookies holds at most this many.
const COOKIE_CACHE_MAX: usize = 200_000;

/// A POSIX error number (`libc::ENOENT`...) with what it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {why}", std::io::Error::from_raw_os_error(*.errno))]
pub struct Errno {
    pub errno: i32,
    pub why: String,
}

impl Errno {
    pub fn new(errno: i32, why: impl Into<String>) -> Errno {
        Errno {
            errno,
            why: why.into(),
        }
    }
    fn corrupt() -> Errno {
        Errno::new(libc::EIO, "inode attributes are damaged")
    }
}

impl From<dataset::Error> for Errno {
    fn from(e: dataset::Error) -> Errno {
        use dataset::Error as E;
        let errno = match &e {
            E::NotFound(_) => libc::ENOENT,
            E::AlreadyExists(_) => libc::EEXIST,
            E::InvalidArgument(_) => libc::EINVAL,
            E::Busy(_) => libc::EBUSY,
            E::NoSpace(w) if w.contains("quota") => libc::EDQUOT,
            E::NoSpace(_) => libc::ENOSPC,
            E::ReadOnly(_) => libc::EROFS,
            E::Corrupt(_) | E::Io(_) | E::NeedsUpgrade(_) => libc::EIO,
            // As ZFS: an encrypted dataset without its key.
            E::KeyUnavailable(_) => libc::EACCES,
        };
        if errno == libc::EIO {
            tracing::warn!(error = %e, "filesystem request failed");
        }
        Errno::new(errno, e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Errno>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    Regular,
    Directory,
    Symlink,
    CharDevice,
    BlockDevice,
    Fifo,
    Socket,
}

impl FileType {
    pub fn of_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => FileType::Regular,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::Regular => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::Fifo => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
        }
    }
}

/// What `stat` shows of an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attr {
    pub ino: u64,
    /// With `ino`, names this file for ever (NFS handles).
    pub generation: u64,
    pub kind: FileType,
    /// Permission bits (07777).
    pub perm: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    /// Bytes the data takes, in 512-byte units (an estimate: sparse files count their extent).
    pub blocks: u64,
    /// Preferred I/O size: the file's block size.
    pub blksize: u32,
    pub atime_ns: u64,
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    pub crtime_ns: u64,
}

impl Attr {
    /// `st_mode`: type and permission bits.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | self.perm
    }
}

/// Who is asking: the owner of what they create, and for [`Fs::access`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Cred {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (NFS AUTH_UNIX sends them).
    pub groups: Vec<u32>,
}

impl Cred {
    pub fn root() -> Cred {
        Cred::default()
    }
    fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// A time a `setattr` sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTime {
    Now,
    Ns(u64),
}

impl SetTime {
    fn ns(self, now: u64) -> u64 {
        match self {
            SetTime::Now => now,
            SetTime::Ns(t) => t,
        }
    }
}

/// The fields of a `setattr`; `None` leaves one as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// Permission bits (the type bits are ignored).
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub crtime: Option<u64>,
}

/// One directory entry from [`Fs::readdir`].
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: Vec<u8>,
    pub attr: Attr,
    /// Pass it back to continue after this entry.
    pub cookie: u64,
}

/// `rename` flags (renameat2).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RenameFlags {
    pub noreplace: bool,
    pub exchange: bool,
}

/// `setxattr` flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XattrSet {
    Any,
    /// XATTR_CREATE: fail if it exists.
    Create,
    /// XATTR_REPLACE: fail if it does not.
    Replace,
}

/// What `statfs` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatFs {
    pub block_size: u32,
    pub blocks: u64,
    pub blocks_free: u64,
    pub files: u64,
    pub files_free: u64,
    pub name_max: u32,
}

/// Options fixed when the dataset was created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Normalization {
    None,
    C,
    D,
    KC,
    KD,
}

/// Called after every rename with the dataset's name and the new name
/// (Samba's Time Machine completion watches `SnapshotHistory.plist`).
pub type RenameObserver = Arc<dyn Fn(&str, &[u8]) + Send + Sync>;

/// Every open [`Fs`] of the process, by (pool guid, dataset id): the FUSE
/// mount, the NFS server and Samba (through the mount) of one dataset must
/// share its namespace lock and its open counts, or an NFS REMOVE would
/// free a file a FUSE client still has open.
type FsTable = HashMap<(u64, u64), std::sync::Weak<Fs>>;
static SHARED: Mutex<Option<FsTable>> = Mutex::new(None);
static RENAME_OBSERVER: Mutex<Option<RenameObserver>> = Mutex::new(None);

/// Sets the process's rename observer (the daemon: Samba's Time Machine watch).
pub fn observe_renames(f: RenameObserver) {
    *RENAME_OBSERVER.lock() = Some(f);
}

/// Data I/O (read, write, truncate) needs a regular file: EISDIR for a
/// directory, EINVAL for a device, fifo or socket node.
fn regular_file(ino: u64, kind: ObjectKind) -> Result<()> {
    match kind {
        ObjectKind::File => Ok(()),
        ObjectKind::Dir => Err(Errno::new(libc::EISDIR, format!("inode {ino}"))),
        ObjectKind::Special => Err(Errno::new(
            libc::EINVAL,
            format!("inode {ino} is not a file"),
        )),
    }
}

/// An open filesystem dataset (or a snapshot of one, read-only).
pub struct Fs {
    objs: Arc<ObjectSet>,
    /// Serialises namespace changes: the POSIX checks (exists, empty,
    /// loops) and the batch that acts on them see the same directory.
    ns: Mutex<()>,
    /// Open counts per inode: a file unlinked while open stays until the last close.
    open: Mutex<HashMap<u64, u32>>,
    /// readdir cookie -> name, per directory (bounded; a miss rescans the directory).
    cookies: Mutex<HashMap<(u64, u64), String>>,
    normalization: Normalization,
    case_insensitive: bool,
}

impl Fs {
    /// Serves `objs`, a filesystem dataset or one of its snapshots.
    pub fn new(objs: Arc<ObjectSet>) -> Result<Fs> {
        let normalization = match objs.property("normalization")?.as_str() {
            "formC" => Normalization::C,
            "formD" => Normalization::D,
            "formKC" => Normalization::KC,
            "formKD" => Normalization::KD,
            _ => Normalization::None,
        };
        let case_insensitive = objs.property("casesensitivity")? != "sensitive";
        Ok(Fs {
            objs,
            ns: Mutex::new(()),
            open: Mutex::new(HashMap::new()),
            cookies: Mutex::new(HashMap::new()),
            normalization,
            case_insensitive,
        })
    }

    /// The one `Fs` of this dataset in the process (see [`SHARED`]); made on first use.
    pub fn shared(objs: Arc<ObjectSet>) -> Result<Arc<Fs>> {
        let key = (objs.pool_guid(), objs.dataset_id());
        let mut table = SHARED.lock();
        let table = table.get_or_insert_with(HashMap::new);
        if let Some(fs) = table.get(&key).and_then(std::sync::Weak::upgrade) {
            return Ok(fs);
        }
        table.retain(|_, w| w.strong_count() > 0);
        let fs = Arc::new(Fs::new(objs)?);
        table.insert(key, Arc::downgrade(&fs));
        Ok(fs)
    }

    /// The objects underneath (for the servers' own bookkeeping).
    pub fn objects(&self) -> &Arc<ObjectSet> {
        &self.objs
    }

    /// The dataset's name (`tank/home`, `tank/home@snap`).
    pub fn name(&self) -> String {
        self.objs.name()
    }

    pub fn is_readonly(&self) -> Result<bool> {
        Ok(self.objs.is_readonly()?)
    }

    fn writable(&self) -> Result<()> {
        if self.objs.is_readonly()? {
            return Err(Errno::new(
                libc::EROFS,
                format!("{} is read-only", self.name()),
            ));
        }
        Ok(())
    }

    fn prop_on(&self, prop: &str) -> bool {
        self.objs.property(prop).is_ok_and(|v| v == "on")
    }

    // ------------------------------------------------------------ inodes

    fn load(&self, ino: u64) -> Result<(ObjectAttrs, Inode)> {
        let a = self
            .objs
            .attrs(ino)?
            .ok_or_else(|| Errno::new(libc::ENOENT, format!("inode {ino}")))?;
        let i = Inode::decode(&a.payload, a.kind == ObjectKind::Dir)?;
        Ok((a, i))
    }

    fn attr_of(&self, ino: u64, a: &ObjectAttrs, i: &Inode) -> Attr {
        let kind = match a.kind {
            ObjectKind::Dir => FileType::Directory,
            ObjectKind::File => FileType::Regular,
            ObjectKind::Special => FileType::of_mode(i.mode).unwrap_or(FileType::Regular),
        };
        let size = match kind {
            FileType::Symlink => i.target.len() as u64,
            _ => a.size,
        };
        let nlink = match kind {
            // `.` counts too; subdirectories' `..` are links already.
            FileType::Directory => a.nlink + 1,
            _ => a.nlink,
        };
        Attr {
            ino,
            generation: a.generation,
            kind,
            perm: i.mode & 0o7777,
            nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            size,
            blocks: size.div_ceil(512),
            blksize: a.blksz.max(4096),
            atime_ns: if i.atime_ns == 0 {
                a.mtime_ns
            } else {
                i.atime_ns
            },
            mtime_ns: a.mtime_ns,
            ctime_ns: a.ctime_ns,
            crtime_ns: a.crtime_ns,
        }
    }

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let (a, i) = self.load(ino)?;
        Ok(self.attr_of(ino, &a, &i))
    }

    /// Checks that `ino` still is the file a handle named (NFS: STALE otherwise).
    pub fn getattr_generation(&self, ino: u64, generation: u64) -> Result<Attr> {
        let attr = self.getattr(ino)?;
        if attr.generation != generation {
            return Err(Errno::new(
                libc::ESTALE,
                format!("inode {ino} was replaced"),
            ));
        }
        Ok(attr)
    }

    /// Whether `cred` may `want` (R_OK 4 | W_OK 2 | X_OK 1) on the inode,
    /// by its mode bits (root may do all but execute a file nobody may).
    pub fn access(attr: &Attr, cred: &Cred, want: u32) -> bool {
        if cred.uid == 0 {
            return want & 1 == 0 || attr.kind == FileType::Directory || attr.perm & 0o111 != 0;
        }
        let bits = if cred.uid == attr.uid {
            attr.perm >> 6
        } else if cred.in_group(attr.gid) {
            attr.perm >> 3
        } else {
            attr.perm
        } & 7;
        bits & want == want
    }

    // ------------------------------------------------------------ names

    /// A name as stored: UTF-8, normalized as the dataset says, no `/` or NUL.
    fn entry_name(&self, raw: &[u8]) -> Result<String> {
        if raw.is_empty() {
            return Err(Errno::new(libc::ENOENT, "empty name"));
        }
        if raw.len() > NAME_MAX {
            return Err(Errno::new(
                libc::ENAMETOOLONG,
                format!("name of {} bytes", raw.len()),
            ));
        }
        if raw.contains(&b'/') || raw.contains(&0) {
            return Err(Errno::new(libc::EINVAL, "name with '/' or NUL"));
        }
        let s = std::str::from_utf8(raw)
            .map_err(|_| Errno::new(libc::EILSEQ, "file names are UTF-8 here"))?;
        Ok(match self.normalization {
            Normalization::None => s.to_string(),
            Normalization::C => s.nfc().collect(),
            Normalization::D => s.nfd().collect(),
            Normalization::KC => s.nfkc().collect(),
            Normalization::KD => s.nfkd().collect(),
        })
    }

    /// The object `dir/name` points at, with case folded if the dataset
    /// is case-insensitive (the stored spelling is kept: case-preserving).
    fn find(&self, dir: u64, name: &str) -> Result<Option<(String, u64)>> {
        if let Some(t) = self.objs.lookup(dir, name)? {
            return Ok(Some((name.to_string(), t)));
        }
        if !self.case_insensitive {
            return Ok(None);
        }
        let folded = name.to_lowercase();
        let mut after: Option<String> = None;
        loop {
            let batch = self.objs.list(dir, "", after.as_deref(), 1024)?;
            let Some((last, _)) = batch.last() else {
                return Ok(None);
            };
            let next = last.clone();
            if let Some(hit) = batch
                .into_iter()
                .find(|(n, _)| n != ".." && n.to_lowercase() == folded)
            {
                return Ok(Some(hit));
            }
            after = Some(next);
        }
    }

    fn dir_attrs(&self, dir: u64) -> Result<ObjectAttrs> {
        let (a, _) = self.load(dir)?;
        if a.kind != ObjectKind::Dir {
            return Err(Errno::new(libc::ENOTDIR, format!("inode {dir}")));
        }
        Ok(a)
    }

    /// The parent of a directory (the root is its own).
    pub fn parent(&self, dir: u64) -> Result<u64> {
        if dir == ROOT {
            return Ok(ROOT);
        }
        self.dir_attrs(dir)?;
        self.objs
            .lookup(dir, "..")?
            .ok_or_else(|| Errno::new(libc::ENOENT, format!("directory {dir} has no parent")))
    }

    pub fn lookup(&self, dir: u64, name: &[u8]) -> Result<Attr> {
        self.dir_attrs(dir)?;
        match name {
            b"." => return self.getattr(dir),
            b".." => return self.getattr(self.parent(dir)?),
            _ => {}
        }
        let name = self.entry_name(name)?;
        let (_, ino) = self
            .find(dir, &name)?
            .ok_or_else(|| Errno::new(libc::ENOENT, name.clone()))?;
        self.getattr(ino)
    }

    /// Refuses a name that exists (also as another case, if insensitive).
    fn check_free(&self, dir: u64, name: &str) -> Result<()> {
        if self.find(dir, name)?.is_some() {
            return Err(Errno::new(libc::EEXIST, name.to_string()));
        }
        Ok(())
    }

    /// A new inode named `dir/name`, made in one batch with its name (and a
    /// directory's `..`).
    fn make(&self, dir: u64, raw: &[u8], inode: Inode, kind: ObjectKind) -> Result<Attr> {
        self.writable()?;
        if matches!(raw, b"." | b"..") {
            return Err(Errno::new(libc::EEXIST, "'.' and '..' exist"));
        }
        let name = self.entry_name(raw)?;
        let _ns = self.ns.lock();
        self.dir_attrs(dir)?;
        self.check_free(dir, &name)?;
        let ino = self.objs.allocate()?;
        let t = now_ns();
        let mut ops = vec![
            ObjectOp::Create {
                obj: ino,
                kind,
                blksz: 0,
                generation: 0,
                time_ns: t,
                payload: inode.encode(),
            },
            ObjectOp::Link {
                dir,
                name,
                obj: ino,
                time_ns: t,
            },
        ];
        if kind == ObjectKind::Dir {
            ops.push(ObjectOp::Link {
                dir: ino,
                name: "..".into(),
                obj: dir,
                time_ns: t,
            });
        }
        self.objs.apply_batch(ops)?;
        self.getattr(ino)
    }

    /// The group of a new inode: the caller's, or the directory's if it is setgid (BSD rule).
    fn new_owner(&self, dir: u64, cred: &Cred) -> Result<(u32, u32, bool)> {
        let (_, d) = self.load(dir)?;
        let setgid = d.mode & libc::S_ISGID != 0;
        Ok((cred.uid, if setgid { d.gid } else { cred.gid }, setgid))
    }

    /// `mknod`/`create`: a regular file, FIFO, socket or device node.
    pub fn mknod(&self, dir: u64, name: &[u8], mode: u32, rdev: u64, cred: &Cred) -> Result<Attr> {
        let kind = FileType::of_mode(mode)
            .ok_or_else(|| Errno::new(libc::EINVAL, format!("mode {mode:o}")))?;
        let obj_kind = match kind {
            FileType::Regular => ObjectKind::File,
            FileType::Directory => return self.mkdir(dir, name, mode, cred),
            FileType::Symlink => return Err(Errno::new(libc::EINVAL, "mknod of a symlink")),
            _ => ObjectKind::Special,
        };
        let (uid, gid, _) = self.new_owner(dir, cred)?;
        let inode = Inode {
            mode: kind.mode_bits() | (mode & 0o7777),
            uid,
            gid,
            rdev: if matches!(kind, FileType::CharDevice | FileType::BlockDevice) {
                rdev
            } else {
                0
            },
            ..Default::default()
        };
        self.make(dir, name, inode, obj_kind)
    }

    pub fn create(&self, dir: u64, name: &[u8], mode: u32, cred: &Cred) -> Result<Attr> {
        self.mknod(dir, name, libc::S_IFREG | (mode & 0o7777), 0, cred)
    }

    pub fn mkdir(&self, dir: u64, name: &[u8], mode: u32, cred: &Cred) -> Result<Attr> {
        let (uid, gid, setgid) = self.new_owner(dir, cred)?;
        // A setgid directory's subdirectories are setgid too.
        let perm = (mode & 0o7777) | if setgid { libc::S_ISGID } else { 0 };
        let inode = Inode {
            mode: libc::S_IFDIR | perm,
            uid,
            gid,
            ..Default::default()
        };
        self.make(dir, name, inode, ObjectKind::Dir)
    }

    pub fn symlink(&self, dir: u64, name: &[u8], target: &[u8], cred: &Cred) -> Result<Attr> {
        if target.is_empty() {
            return Err(Errno::new(libc::ENOENT, "empty symlink target"));
        }
        if target.len() >= PATH_MAX {
            return Err(Errno::new(libc::ENAMETOOLONG, "symlink target"));
        }
        let (uid, gid, _) = self.new_owner(dir, cred)?;
        let inode = Inode {
            mode: libc::S_IFLNK | 0o777,
            uid,
            gid,
            target: target.to_vec(),
            ..Default::default()
        };
        self.make(dir, name, inode, ObjectKind::Special)
    }

    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let (a, i) = self.load(ino)?;
        if self.attr_of(ino, &a, &i).kind != FileType::Symlink {
            return Err(Errno::new(
                libc::EINVAL,
                format!("inode {ino} is not a symlink"),
            ));
        }
        Ok(i.target)
    }

    /// A hard link `dir/name` to `ino`.
    pub fn link(&self, ino: u64, dir: u64, raw: &[u8]) -> Result<Attr> {
        self.writable()?;
        let name = self.entry_name(raw)?;
        let _ns = self.ns.lock();
        self.dir_attrs(dir)?;
        let (a, _) = self.load(ino)?;
        if a.kind == ObjectKind::Dir {
            return Err(Errno::new(libc::EPERM, "hard links to directories"));
        }
        if a.nlink == 0 {
            return Err(Errno::new(
                libc::ENOENT,
                format!("inode {ino} was unlinked"),
            ));
        }
        if a.nlink >= LINK_MAX {
            return Err(Errno::new(
                libc::EMLINK,
                format!("inode {ino} has {} links", a.nlink),
            ));
        }
        self.check_free(dir, &name)?;
        self.objs.apply_batch(vec![ObjectOp::Link {
            dir,
            name,
            obj: ino,
            time_ns: now_ns(),
        }])?;
        self.getattr(ino)
    }

    /// Frees an inode nobody names and nobody has open (errors are left
    /// to the unlinked set: import frees what is left there).
    fn reap(&self, ino: u64) {
        if self.open.lock().contains_key(&ino) {
            return;
        }
        if let Ok(Some(a)) = self.objs.attrs(ino) {
            if a.nlink == 0 {
                if let Err(e) = self.objs.remove(ino) {
                    tracing::warn!(dataset = %self.name(), ino, error = %e, "unlinked inode kept until import");
                }
            }
        }
    }

    pub fn unlink(&self, dir: u64, raw: &[u8]) -> Result<()> {
        self.writable()?;
        let name = self.entry_name(raw)?;
        let ino = {
            let _ns = self.ns.lock();
            self.dir_attrs(dir)?;
            let (name, ino) = self
                .find(dir, &name)?
                .ok_or_else(|| Errno::new(libc::ENOENT, name.clone()))?;
            let (a, _) = self.load(ino)?;
            if a.kind == ObjectKind::Dir {
                return Err(Errno::new(libc::EISDIR, name));
            }
            self.objs.apply_batch(vec![ObjectOp::Unlink {
                dir,
                name,
                time_ns: now_ns(),
            }])?;
            ino
        };
        self.reap(ino);
        Ok(())
    }

    fn is_empty_dir(&self, dir: u64) -> Result<bool> {
        Ok(self
            .objs
            .list(dir, "", None, 2)?
            .iter()
            .all(|(n, _)| n == ".."))
    }

    /// The ops that take an empty directory `d` away (after its name went).
    fn drop_dir(d: u64, t: u64) -> [ObjectOp; 2] {
        [
            ObjectOp::Unlink {
                dir: d,
                name: "..".into(),
                time_ns: t,
            },
            ObjectOp::Remove { obj: d },
        ]
    }

    pub fn rmdir(&self, dir: u64, raw: &[u8]) -> Result<()> {
        self.writable()?;
        match raw {
            b"." => return Err(Errno::new(libc::EINVAL, "rmdir of '.'")),
            b".." => return Err(Errno::new(libc::ENOTEMPTY, "rmdir of '..'")),
            _ => {}
        }
        let name = self.entry_name(raw)?;
        let _ns = self.ns.lock();
        self.dir_attrs(dir)?;
        let (name, d) = self
            .find(dir, &name)?
            .ok_or_else(|| Errno::new(libc::ENOENT, name.clone()))?;
        let (a, _) = self.load(d)?;
        if a.kind != ObjectKind::Dir {
            return Err(Errno::new(libc::ENOTDIR, name));
        }
        if !self.is_empty_dir(d)? {
            return Err(Errno::new(libc::ENOTEMPTY, name));
        }
        let t = now_ns();
        let mut ops = vec![ObjectOp::Unlink {
            dir,
            name,
            time_ns: t,
        }];
        ops.extend(Self::drop_dir(d, t));
        self.objs.apply_batch(ops)?;
        Ok(())
    }

    /// Whether `dir` is `ancestor` or below it (a directory cannot move into itself).
    fn is_within(&self, mut dir: u64, ancestor: u64) -> Result<bool> {
        // Bounded: a directory tree deeper than this is refused, not walked for ever.
        for _ in 0..100_000 {
            if dir == ancestor {
                return Ok(true);
            }
            if dir == ROOT {
                return Ok(false);
            }
            dir = self.parent(dir)?;
        }
        Err(Errno::new(libc::ELOOP, "directory tree too deep"))
    }

    /// Atomic rename, also across directories and replacing a target (and
    /// renameat2's NOREPLACE and EXCHANGE).
    pub fn rename(
        &self,
        sdir: u64,
        sraw: &[u8],
        ddir: u64,
        draw: &[u8],
        flags: RenameFlags,
    ) -> Result<()> {
        self.writable()?;
        for raw in [sraw, draw] {
            if matches!(raw, b"." | b"..") {
                return Err(Errno::new(libc::EINVAL, "rename of '.' or '..'"));
            }
        }
        let (sname, dname) = (self.entry_name(sraw)?, self.entry_name(draw)?);
        let reap = {
            let _ns = self.ns.lock();
            self.dir_attrs(sdir)?;
            self.dir_attrs(ddir)?;
            let (sname, src) = self
                .find(sdir, &sname)?
                .ok_or_else(|| Errno::new(libc::ENOENT, sname.clone()))?;
            let (sa, _) = self.load(src)?;
            let src_dir = sa.kind == ObjectKind::Dir;
            let dst = self.find(ddir, &dname)?;
            // Case-insensitive: renaming `a` to `A` in place changes the spelling.
            let dst =
                dst.filter(|(n, o)| !(sdir == ddir && *o == src && *n == sname && *n != dname));
            if src_dir && self.is_within(ddir, src)? {
                return Err(Errno::new(
                    libc::EINVAL,
                    "a directory cannot move into itself",
                ));
            }
            let t = now_ns();
            let mut ops = Vec::new();
            let mut reap = None;
            match (&dst, flags.exchange) {
                (None, true) => return Err(Errno::new(libc::ENOENT, dname)),
                (Some(_), _) if flags.noreplace => return Err(Errno::new(libc::EEXIST, dname)),
                (Some((_, d)), false) if *d == src => return Ok(()), // two names of one file
                (Some((dn, d)), true) => {
                    let (da, _) = self.load(*d)?;
                    if da.kind == ObjectKind::Dir && self.is_within(sdir, *d)? {
                        return Err(Errno::new(
                            libc::EINVAL,
                            "a directory cannot move into itself",
                        ));
                    }
                    ops.push(ObjectOp::Link {
                        dir: ddir,
                        name: dn.clone(),
                        obj: src,
                        time_ns: t,
                    });
                    ops.push(ObjectOp::Link {
                        dir: sdir,
                        name: sname.clone(),
                        obj: *d,
                        time_ns: t,
                    });
                    if sdir != ddir {
                        if src_dir {
                            ops.push(ObjectOp::Link {
                                dir: src,
                                name: "..".into(),
                                obj: ddir,
                                time_ns: t,
                            });
                        }
                        if da.kind == ObjectKind::Dir {
                            ops.push(ObjectOp::Link {
                                dir: *d,
                                name: "..".into(),
                                obj: sdir,
                                time_ns: t,
                            });
                        }
                    }
                    ops.push(ObjectOp::SetTimes {
                        obj: *d,
                        mtime_ns: None,
                        crtime_ns: None,
                        time_ns: t,
                    });
                }
                (dst, false) => {
                    if let Some((dn, d)) = dst {
                        let (da, _) = self.load(*d)?;
                        match (src_dir, da.kind == ObjectKind::Dir) {
                            (true, false) => return Err(Errno::new(libc::ENOTDIR, dn.clone())),
                            (false, true) => return Err(Errno::new(libc::EISDIR, dn.clone())),
                            (true, true) if !self.is_empty_dir(*d)? => {
                                return Err(Errno::new(libc::ENOTEMPTY, dn.clone()))
                            }
                            _ => {}
                        }
                    }
                    // Case-insensitive replace of another spelling: the new spelling wins.
                    if let Some((dn, _)) = dst.as_ref().filter(|(n, _)| *n != dname) {
                        ops.push(ObjectOp::Unlink {
                            dir: ddir,
                            name: dn.clone(),
                            time_ns: t,
                        });
                    }
                    ops.push(ObjectOp::Link {
                        dir: ddir,
                        name: dname.clone(),
                        obj: src,
                        time_ns: t,
                    });
                    ops.push(ObjectOp::Unlink {
                        dir: sdir,
                        name: sname.clone(),
                        time_ns: t,
                    });
                    if src_dir && sdir != ddir {
                        ops.push(ObjectOp::Link {
                            dir: src,
                            name: "..".into(),
                            obj: ddir,
                            time_ns: t,
                        });
                    }
                    if let Some((_, d)) = dst {
                        let (da, _) = self.load(*d)?;
                        if da.kind == ObjectKind::Dir {
                            ops.extend(Self::drop_dir(*d, t));
                        } else {
                            reap = Some(*d);
                        }
                    }
                }
            }
            // Linux updates the moved inode's ctime.
            ops.push(ObjectOp::SetTimes {
                obj: src,
                mtime_ns: None,
                crtime_ns: None,
                time_ns: t,
            });
            self.objs.apply_batch(ops)?;
            reap
        };
        if let Some(d) = reap {
            self.reap(d);
        }
        let observer = RENAME_OBSERVER.lock().clone();
        if let Some(o) = observer {
            o(&self.name(), draw);
        }
        Ok(())
    }

    // ------------------------------------------------------------ data

    /// Counts an open of `ino` (FUSE open/create; NFS has no opens).
    pub fn open(&self, ino: u64) -> Result<Attr> {
        let attr = self.getattr(ino)?;
        *self.open.lock().entry(ino).or_insert(0) += 1;
        Ok(attr)
    }

    /// The last close of an unlinked file frees it.
    pub fn release(&self, ino: u64) {
        let last = {
            let mut open = self.open.lock();
            match open.get_mut(&ino) {
                Some(n) if *n > 1 => {
                    *n -= 1;
                    false
                }
                Some(_) => {
                    open.remove(&ino);
                    true
                }
                None => false,
            }
        };
        if last && !self.objs.is_readonly().unwrap_or(true) {
            self.reap(ino);
        }
    }

    pub fn read(&self, ino: u64, offset: u64, len: u32) -> Result<Vec<u8>> {
        let (a, i) = self.load(ino)?;
        regular_file(ino, a.kind)?;
        let data = self.objs.read(ino, offset, len as u64)?;
        self.touch_atime(ino, &a, i);
        Ok(data)
    }

    /// relatime, as Linux mounts by default: atime moves when it is older
    /// than the last change or a day old, so reads rarely write.
    fn touch_atime(&self, ino: u64, a: &ObjectAttrs, mut i: Inode) {
        let now = now_ns();
        let stale = i.atime_ns <= a.mtime_ns.max(a.ctime_ns)
            || now.saturating_sub(i.atime_ns) > 86_400 * 1_000_000_000;
        if !stale || self.objs.is_readonly().unwrap_or(true) || !self.prop_on("atime") {
            return;
        }
        i.atime_ns = now;
        if let Err(e) = self.objs.set_payload(ino, &i.encode()) {
            tracing::debug!(ino, error = %e, "atime not updated");
        }
    }

    /// Writes `data` at `offset`; returns the bytes written.
    pub fn write(&self, ino: u64, offset: u64, data: &[u8]) -> Result<u32> {
        self.writable()?;
        let (a, _) = self.load(ino)?;
        regular_file(ino, a.kind)?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > dataset::objects::MAX_OBJECT_SIZE)
        {
            return Err(Errno::new(libc::EFBIG, "beyond the largest file"));
        }
        self.objs.write(ino, offset, data)?;
        Ok(data.len() as u32)
    }

    /// Makes everything written so far durable (the intent log).
    pub fn fsync(&self, _ino: u64) -> Result<()> {
        if self.objs.is_readonly()? {
            return Ok(());
        }
        Ok(self.objs.commit()?)
    }

    /// `fallocate`: mode 0 (extend the size; copy-on-write cannot reserve
    /// blocks ahead, as ZFS), KEEP_SIZE (nothing to do) and PUNCH_HOLE
    /// (zeros; all-zero blocks take no space). Others: EOPNOTSUPP.
    pub fn fallocate(&self, ino: u64, offset: u64, len: u64, mode: i32) -> Result<()> {
        self.writable()?;
        let end = offset
            .checked_add(len)
            .filter(|e| *e <= dataset::objects::MAX_OBJECT_SIZE)
            .ok_or_else(|| Errno::new(libc::EFBIG, "beyond the largest file"))?;
        let (a, _) = self.load(ino)?;
        if a.kind != ObjectKind::File {
            return Err(Errno::new(
                libc::ENODEV,
                format!("inode {ino} is not a regular file"),
            ));
        }
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        if mode & !(libc::FALLOC_FL_KEEP_SIZE | libc::FALLOC_FL_PUNCH_HOLE) != 0 || (punch && !keep)
        {
            return Err(Errno::new(
                libc::EOPNOTSUPP,
                format!("fallocate mode {mode:#x}"),
            ));
        }
        if punch {
            let stop = end.min(a.size);
            let mut at = offset;
            const PIECE: u64 = 1 << 20;
            while at < stop {
                let n = (stop - at).min(PIECE);
                self.objs.write(ino, at, &vec![0u8; n as usize])?;
                at += n;
            }
        } else if !keep && end > a.size {
            self.objs.truncate(ino, end)?;
        }
        Ok(())
    }

    pub fn setattr(&self, ino: u64, set: &SetAttr) -> Result<Attr> {
        self.writable()?;
        let (a, mut i) = self.load(ino)?;
        if let Some(size) = set.size {
            regular_file(ino, a.kind)?;
            if size > dataset::objects::MAX_OBJECT_SIZE {
                return Err(Errno::new(libc::EFBIG, "beyond the largest file"));
            }
            if size != a.size {
                self.objs.truncate(ino, size)?;
            } else {
                // POSIX: a truncate that changes nothing still updates mtime/ctime.
                self.objs.set_times(ino, Some(now_ns()), None)?;
            }
        }
        let now = now_ns();
        let before = i.clone();
        if let Some(m) = set.mode {
            i.mode = (i.mode & libc::S_IFMT) | (m & 0o7777);
        }
        if let Some(u) = set.uid {
            i.uid = u;
        }
        if let Some(g) = set.gid {
            i.gid = g;
        }
        if let Some(t) = set.atime {
            i.atime_ns = t.ns(now);
        }
        let mut ops = Vec::new();
        let owner_change = set.uid.is_some() || set.gid.is_some() || set.mode.is_some();
        if i != before || owner_change {
            ops.push(ObjectOp::SetPayload {
                obj: ino,
                payload: i.encode(),
                time_ns: now,
            });
        }
        if set.mtime.is_some() || set.crtime.is_some() || (set.atime.is_some() && ops.is_empty()) {
            ops.push(ObjectOp::SetTimes {
                obj: ino,
                mtime_ns: set.mtime.map(|t| t.ns(now)),
                crtime_ns: set.crtime,
                time_ns: now,
            });
        }
        if !ops.is_empty() {
            self.objs.apply_batch(ops)?;
        }
        self.getattr(ino)
    }

    // ------------------------------------------------------------ directories

    fn cookie_of(name: &str) -> u64 {
        let h = blake3::hash(name.as_bytes());
        let mut b = [0u8; 8];
        b.copy_from_slice(&h.as_bytes()[..8]);
        (u64::from_le_bytes(b) >> 1).max(COOKIE_DOTDOT + 1)
    }

    /// The name a cookie stands for: the cache, else a scan of the directory.
    fn name_of_cookie(&self, dir: u64, cookie: u64) -> Result<String> {
        if let Some(n) = self.cookies.lock().get(&(dir, cookie)) {
            return Ok(n.clone());
        }
        let mut after: Option<String> = None;
        loop {
            let batch = self.objs.list(dir, "", after.as_deref(), 4096)?;
            let Some((last, _)) = batch.last() else {
                return Err(Errno::new(
                    libc::EINVAL,
                    format!("readdir cookie {cookie:#x} is gone"),
                ));
            };
            after = Some(last.clone());
            if let Some((n, _)) = batch
                .into_iter()
                .find(|(n, _)| Self::cookie_of(n) == cookie)
            {
                return Ok(n);
            }
        }
    }

    /// Entries of `dir` after `cookie` (0: from the start, with `.` and
    /// `..`), at most `limit`. Cookies are hashes of names, stable while the
    /// entry exists and across restarts; a deleted entry's cookie still
    /// resumes at its place (names are listed in order).
    pub fn readdir(&self, dir: u64, cookie: u64, limit: usize) -> Result<Vec<DirEntry>> {
        let da = self.dir_attrs(dir)?;
        let mut out = Vec::new();
        if cookie == 0 && limit > out.len() {
            let (_, i) = self.load(dir)?;
            out.push(DirEntry {
                name: b".".to_vec(),
                attr: self.attr_of(dir, &da, &i),
                cookie: COOKIE_DOT,
            });
        }
        if cookie <= COOKIE_DOT && limit > out.len() {
            out.push(DirEntry {
                name: b"..".to_vec(),
                attr: self.getattr(self.parent(dir)?)?,
                cookie: COOKIE_DOTDOT,
            });
        }
        let after = if cookie > COOKIE_DOTDOT {
            Some(self.name_of_cookie(dir, cookie)?)
        } else {
            None
        };
        let want = limit.saturating_sub(out.len());
        if want == 0 {
            return Ok(out);
        }
        let names = self.objs.list(dir, "", after.as_deref(), want + 1)?;
        let mut cache = self.cookies.lock();
        if cache.len() > COOKIE_CACHE_MAX {
            cache.clear();
        }
        drop(cache);
        for (name, ino) in names.into_iter().filter(|(n, _)| n != "..").take(want) {
            let attr = match self.getattr(ino) {
                Ok(a) => a,
                // Removed between the listing and now: skip it.
                Err(e) if e.errno == libc::ENOENT => continue,
                Err(e) => return Err(e),
            };
            let c = Self::cookie_of(&name);
            self.cookies.lock().insert((dir, c), name.clone());
            out.push(DirEntry {
                name: name.into_bytes(),
                attr,
                cookie: c,
            });
        }
        Ok(out)
    }

    // ------------------------------------------------------------ xattrs

    fn xattr_allowed(&self, name: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > 255 {
            return Err(Errno::new(libc::ERANGE, "xattr name length"));
        }
        if !self.prop_on("xattr") {
            return Err(Errno::new(libc::EOPNOTSUPP, "xattr=off"));
        }
        if name.starts_with(b"system.posix_acl_")
            && self.objs.property("acltype").is_ok_and(|v| v != "posix")
        {
            return Err(Errno::new(libc::EOPNOTSUPP, "acltype=off"));
        }
        let ns_ok = [
            &b"user."[..],
            b"trusted.",
            b"security.",
            b"system.posix_acl_",
        ]
        .iter()
        .any(|p| name.starts_with(p));
        if !ns_ok {
            return Err(Errno::new(libc::EOPNOTSUPP, "unknown xattr namespace"));
        }
        Ok(())
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.xattr_allowed(name)?;
        let (_, i) = self.load(ino)?;
        i.xattrs
            .get(name)
            .cloned()
            .ok_or_else(|| Errno::new(libc::ENODATA, String::from_utf8_lossy(name)))
    }

    /// Names, each NUL-terminated, as listxattr returns them.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let (_, i) = self.load(ino)?;
        let mut out = Vec::new();
        for k in i.xattrs.keys() {
            out.extend_from_slice(k);
            out.push(0);
        }
        Ok(out)
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], how: XattrSet) -> Result<()> {
        self.writable()?;
        self.xattr_allowed(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Errno::new(libc::E2BIG, "xattr value over 64 KiB"));
        }
        let _ns = self.ns.lock();
        let (_, mut i) = self.load(ino)?;
        match (how, i.xattrs.contains_key(name)) {
            (XattrSet::Create, true) => {
                return Err(Errno::new(libc::EEXIST, String::from_utf8_lossy(name)))
            }
            (XattrSet::Replace, false) => {
                return Err(Errno::new(libc::ENODATA, String::from_utf8_lossy(name)))
            }
            _ => {}
        }
        i.xattrs.insert(name.to_vec(), value.to_vec());
        let payload = i.encode();
        if payload.len() > dataset::objects::MAX_PAYLOAD {
            return Err(Errno::new(
                libc::ENOSPC,
                "the inode's extended attributes are full (64 KiB)",
            ));
        }
        self.objs.set_payload(ino, &payload)?;
        Ok(())
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.writable()?;
        self.xattr_allowed(name)?;
        let _ns = self.ns.lock();
        let (_, mut i) = self.load(ino)?;
        if i.xattrs.remove(name).is_none() {
            return Err(Errno::new(libc::ENODATA, String::from_utf8_lossy(name)));
        }
        self.objs.set_payload(ino, &i.encode())?;
        Ok(())
    }

    // ------------------------------------------------------------ space

    pub fn statfs(&self) -> Result<StatFs> {
        let (used, avail) = self.objs.space()?;
        const BS: u64 = 4096;
        let blocks_free = avail / BS;
        Ok(StatFs {
            block_size: BS as u32,
            blocks: used.div_ceil(BS) + blocks_free,
            blocks_free,
            // Inodes are not preallocated: as many as space allows (as ZFS shows).
            files: u64::from(u32::MAX),
            files_free: u64::from(u32::MAX) / 2,
            name_max: NAME_MAX as u32,
        })
    }
}
