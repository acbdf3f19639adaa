//! The fuser [`Filesystem`] over [`posix::Fs`]: the head of a dataset plus
//! its snapshots under `.zfs/snapshot/NAME/`.
//!
//! Inode numbers in the mount (unique across the head and every snapshot):
//!
//! | bits 63..40 | bits 39..0 | what |
//! |---|---|---|
//! | 0 | object id | the head; its root directory (object 2) is FUSE's 1 |
//! | snapshot's dataset id (1 .. 2^24-2) | object id | a file in that snapshot |
//! | 2^24-1 | 1, 2 | `.zfs`, `.zfs/snapshot` |
//!
//! Object ids come from a per-dataset counter that never goes back, so the
//! same file has the same number after a remount or a daemon restart, and
//! in a snapshot it has its head number with the snapshot's id on top (as
//! ZFS shows snapshot files with their own inode numbers on their own
//! device). Objects past 2^40 and snapshots with ids past 2^24-2 get EOVERFLOW.

use dataset::Engine;
use fuser::{
    AccessFlags, Errno as FErrno, FileAttr, FileHandle, FileType as FType, Filesystem, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, OpenFlags, RenameFlags,
    ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry,
    ReplyIoctl, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use parking_lot::Mutex;
use posix::{Attr, Cred, Errno, FileType, SetAttr, SetTime};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const OBJ_BITS: u32 = 40;
const OBJ_MASK: u64 = (1 << OBJ_BITS) - 1;
/// The slot of the `.zfs` directories.
const VIRTUAL: u64 = (1 << 24) - 1;
pub const ZFS_DIR: u64 = (VIRTUAL << OBJ_BITS) | 1;
pub const SNAPSHOT_DIR: u64 = (VIRTUAL << OBJ_BITS) | 2;
/// readdir cookie of `.zfs` in the root (posix cookies of names are above 2
/// and hashes: one being 3 is as likely as any other collision).
const ZFS_COOKIE: u64 = posix::COOKIE_DOTDOT + 1;
/// Entries asked of the POSIX layer per readdir reply.
const READDIR_BATCH: usize = 128;
/// Names remembered for invalidation after a rollback; older ones than the
/// entry timeout have expired in the kernel anyway and are pruned.
const NAMES_MAX: usize = 100_000;

/// What a mount's threads and the rollback hook share.
pub struct Shared {
    pub head: Arc<posix::Fs>,
    pub engine: Arc<Engine>,
    /// Opened snapshots by slot (their dataset id), lazily.
    snaps: Mutex<HashMap<u64, Arc<posix::Fs>>>,
    /// Inodes of the head the kernel holds (lookup counts): invalidated after a rollback.
    known: Mutex<HashMap<u64, u64>>,
    /// (parent, name) of head entries handed to the kernel, with when.
    names: Mutex<HashMap<(u64, Vec<u8>), Instant>>,
    pub ttl: Duration,
    pub snapshot_ttl: Duration,
    pub writeback_cache: bool,
    pub posix_acl: bool,
    /// A write that failed (ENOSPC, EDQUOT, EIO), by inode, until the next
    /// fsync or close reports it: with the writeback cache the kernel
    /// writes pages back after write(2) returned, and a failure there
    /// must not be lost (a full quota would otherwise drop data silently).
    write_errors: Mutex<HashMap<u64, i32>>,
}

impl Shared {
    pub fn new(
        head: Arc<posix::Fs>,
        engine: Arc<Engine>,
        ttl: Duration,
        writeback_cache: bool,
    ) -> Shared {
        let posix_acl = head
            .objects()
            .property("acltype")
            .is_ok_and(|v| v == "posix");
        Shared {
            write_errors: Mutex::new(HashMap::new()),
            head,
            engine,
            snaps: Mutex::new(HashMap::new()),
            known: Mutex::new(HashMap::new()),
            names: Mutex::new(HashMap::new()),
            ttl,
            snapshot_ttl: ttl.max(Duration::from_secs(10)),
            writeback_cache,
            posix_acl,
        }
    }

    /// The head's inodes and names the kernel may cache, emptied: what a
    /// rollback must invalidate.
    pub fn take_cached(&self) -> (Vec<u64>, Vec<(u64, Vec<u8>)>) {
        let inos: Vec<u64> = self.known.lock().keys().copied().collect();
        let names: Vec<(u64, Vec<u8>)> = self.names.lock().drain().map(|(k, _)| k).collect();
        (inos, names)
    }

    fn remember(&self, parent: u64, name: &[u8], ino: u64) {
        if ino >> OBJ_BITS != 0 {
            return; // snapshots never change under a name
        }
        *self.known.lock().entry(ino).or_insert(0) += 1;
        if parent >> OBJ_BITS != 0 {
            return;
        }
        let mut names = self.names.lock();
        if names.len() >= NAMES_MAX {
            let ttl = self.ttl;
            names.retain(|_, t| t.elapsed() <= ttl);
        }
        names.insert((parent, name.to_vec()), Instant::now());
    }

    fn forget(&self, ino: u64, n: u64) {
        let mut known = self.known.lock();
        if let Some(c) = known.get_mut(&ino) {
            *c = c.saturating_sub(n);
            if *c == 0 {
                known.remove(&ino);
            }
        }
    }

    fn snapdir_visible(&self) -> bool {
        self.head
            .objects()
            .property("snapdir")
            .is_ok_and(|v| v == "visible")
    }

    /// The head dataset's name now (follows renames).
    fn dataset(&self) -> String {
        self.head.name()
    }

    /// Opens `dataset@name` (or finds it open); its slot.
    fn open_snapshot(&self, name: &[u8]) -> Result<(u64, Arc<posix::Fs>), Errno> {
        let name = std::str::from_utf8(name)
            .map_err(|_| Errno::new(libc::ENOENT, "not a snapshot name"))?;
        if name.contains('@') || name.contains('/') {
            return Err(Errno::new(libc::ENOENT, name.to_string()));
        }
        let full = format!("{}@{name}", self.dataset());
        let objs = self.engine.open_objects(&full).map_err(Errno::from)?;
        let slot = objs.dataset_id();
        if slot == 0 || slot >= VIRTUAL {
            return Err(Errno::new(
                libc::EOVERFLOW,
                format!("snapshot id {slot} does not fit this mount's inode numbers"),
            ));
        }
        let mut snaps = self.snaps.lock();
        if let Some(fs) = snaps.get(&slot) {
            // Still that snapshot (a destroyed one's id is never reused).
            if fs.name() == full {
                return Ok((slot, fs.clone()));
            }
        }
        let fs = posix::Fs::shared(objs)?;
        snaps.insert(slot, fs.clone());
        Ok((slot, fs))
    }

    /// The snapshots of the dataset: (short name, slot), by creation.
    fn snapshots(&self) -> Result<Vec<(String, u64)>, Errno> {
        let ds = self.dataset();
        let list = self.engine.list_datasets(Some(&ds)).map_err(Errno::from)?;
        let prefix = format!("{ds}@");
        let mut out = Vec::new();
        for d in list {
            if let Some(short) = d.name.strip_prefix(&prefix) {
                // The slot is known once opened; until then a stable stand-in
                // is not needed: readdir's d_ino is advisory, lookup gives the real one.
                let slot = match self.open_snapshot(short.as_bytes()) {
                    Ok((s, _)) => s,
                    Err(_) => continue,
                };
                out.push((short.to_string(), slot));
            }
        }
        Ok(out)
    }
}

/// A directory entry as readdir sends it: name, FUSE ino, cookie, and the
/// attributes with the slot (None: a `.zfs` directory).
type Listed = (Vec<u8>, u64, u64, Option<(Attr, u64)>);

/// Where a FUSE inode number points.
enum Node {
    Fs(Arc<posix::Fs>, u64, u64), // fs, slot, object
    ZfsDir,
    SnapshotDir,
}

fn to_fuse(slot: u64, obj: u64) -> Result<u64, Errno> {
    if obj > OBJ_MASK {
        return Err(Errno::new(
            libc::EOVERFLOW,
            format!("inode {obj} does not fit this mount's inode numbers"),
        ));
    }
    if slot == 0 && obj == posix::ROOT {
        return Ok(1);
    }
    Ok((slot << OBJ_BITS) | obj)
}

fn ts(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn ns_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

fn ftype(k: FileType) -> FType {
    match k {
        FileType::Regular => FType::RegularFile,
        FileType::Directory => FType::Directory,
        FileType::Symlink => FType::Symlink,
        FileType::CharDevice => FType::CharDevice,
        FileType::BlockDevice => FType::BlockDevice,
        FileType::Fifo => FType::NamedPipe,
        FileType::Socket => FType::Socket,
    }
}

fn fattr(ino: u64, a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: a.size,
        blocks: a.blocks,
        atime: ts(a.atime_ns),
        mtime: ts(a.mtime_ns),
        ctime: ts(a.ctime_ns),
        crtime: ts(a.crtime_ns),
        kind: ftype(a.kind),
        perm: a.perm as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// The read-only directories `.zfs` and `.zfs/snapshot`.
fn virtual_attr(ino: u64, root: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(ino),
        size: 0,
        blocks: 0,
        atime: ts(root.crtime_ns),
        mtime: ts(root.crtime_ns),
        ctime: ts(root.crtime_ns),
        crtime: ts(root.crtime_ns),
        kind: FType::Directory,
        perm: 0o555,
        nlink: 2,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 4096,
        flags: 0,
    }
}

fn err(e: &Errno) -> FErrno {
    FErrno::from_i32(e.errno)
}

fn erofs() -> Errno {
    Errno::new(libc::EROFS, "snapshots are read-only")
}

fn cred(req: &Request) -> Cred {
    Cred {
        uid: req.uid(),
        gid: req.gid(),
        groups: Vec::new(),
    }
}

pub struct CisternFs {
    pub shared: Arc<Shared>,
}

impl CisternFs {
    /// The error of a failed write-back of `ino`, once (fsync, close).
    fn take_write_error(&self, ino: INodeNo) -> Option<i32> {
        let obj = self.head(ino).ok()?;
        self.shared.write_errors.lock().remove(&obj)
    }

    fn node(&self, ino: INodeNo) -> Result<Node, Errno> {
        let ino = ino.0;
        if ino == 1 {
            return Ok(Node::Fs(self.shared.head.clone(), 0, posix::ROOT));
        }
        match ino {
            ZFS_DIR => return Ok(Node::ZfsDir),
            SNAPSHOT_DIR => return Ok(Node::SnapshotDir),
            _ => {}
        }
        let (slot, obj) = (ino >> OBJ_BITS, ino & OBJ_MASK);
        if slot == 0 {
            if obj == posix::ROOT {
                return Err(Errno::new(libc::ENOENT, "inode 2 is 1 here"));
            }
            return Ok(Node::Fs(self.shared.head.clone(), 0, obj));
        }
        let fs = self
            .shared
            .snaps
            .lock()
            .get(&slot)
            .cloned()
            .ok_or_else(|| Errno::new(libc::ESTALE, format!("snapshot {slot} is not open")))?;
        Ok(Node::Fs(fs, slot, obj))
    }

    /// A head directory or file, for changes (snapshots are read-only).
    fn head(&self, ino: INodeNo) -> Result<u64, Errno> {
        match self.node(ino)? {
            Node::Fs(_, 0, obj) => Ok(obj),
            _ => Err(erofs()),
        }
    }

    fn ttl(&self, slot: u64) -> Duration {
        if slot == 0 {
            self.shared.ttl
        } else {
            self.shared.snapshot_ttl
        }
    }

    fn root_attr(&self) -> Result<Attr, Errno> {
        self.shared.head.getattr(posix::ROOT)
    }

    /// Attributes of any node, in FUSE numbers.
    fn attr_of(&self, ino: INodeNo) -> Result<(FileAttr, u64, Duration), Errno> {
        match self.node(ino)? {
            Node::Fs(fs, slot, obj) => {
                let a = fs.getattr(obj)?;
                Ok((fattr(to_fuse(slot, obj)?, &a), a.generation, self.ttl(slot)))
            }
            Node::ZfsDir | Node::SnapshotDir => {
                Ok((virtual_attr(ino.0, &self.root_attr()?), 0, self.shared.ttl))
            }
        }
    }

    fn entry(&self, parent: u64, name: &[u8], slot: u64, a: &Attr, reply: ReplyEntry) {
        match to_fuse(slot, a.ino) {
            Ok(ino) => {
                self.shared.remember(parent, name, ino);
                let ttl = self.ttl(slot);
                reply.entry(&ttl, &fattr(ino, a), Generation(a.generation));
            }
            Err(e) => reply.error(err(&e)),
        }
    }

    fn do_lookup(&self, parent: INodeNo, name: &[u8]) -> Result<(FileAttr, u64, u64), Errno> {
        match self.node(parent)? {
            Node::Fs(fs, slot, obj) => {
                if slot == 0 && obj == posix::ROOT && name == b".zfs" {
                    let a = virtual_attr(ZFS_DIR, &self.root_attr()?);
                    return Ok((a, 0, 0));
                }
                let a = fs.lookup(obj, name)?;
                let ino = to_fuse(slot, a.ino)?;
                Ok((fattr(ino, &a), a.generation, slot))
            }
            Node::ZfsDir => match name {
                b"snapshot" => Ok((virtual_attr(SNAPSHOT_DIR, &self.root_attr()?), 0, 0)),
                b"." => Ok((virtual_attr(ZFS_DIR, &self.root_attr()?), 0, 0)),
                _ => Err(Errno::new(libc::ENOENT, "only .zfs/snapshot is here")),
            },
            Node::SnapshotDir => {
                let (slot, fs) = self.shared.open_snapshot(name)?;
                let a = fs.getattr(posix::ROOT)?;
                Ok((fattr(to_fuse(slot, posix::ROOT)?, &a), a.generation, slot))
            }
        }
    }

    /// `.zfs` is not a name a user may create in the root.
    fn check_new_name(&self, parent: u64, name: &[u8]) -> Result<(), Errno> {
        if parent == posix::ROOT && name == b".zfs" {
            return Err(Errno::new(libc::EEXIST, ".zfs is the snapshot directory"));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr_inner(
        &self,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        crtime: Option<SystemTime>,
    ) -> Result<FileAttr, Errno> {
        let obj = self.head(ino)?;
        let t = |x: TimeOrNow| match x {
            TimeOrNow::Now => SetTime::Now,
            TimeOrNow::SpecificTime(s) => SetTime::Ns(ns_of(s)),
        };
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(t),
            mtime: mtime.map(t),
            crtime: crtime.map(ns_of),
        };
        let a = self.shared.head.setattr(obj, &set)?;
        Ok(fattr(to_fuse(0, obj)?, &a))
    }

    /// readdir and readdirplus: (name, FUSE ino, cookie, attributes).
    fn list(&self, ino: INodeNo, offset: u64) -> Result<Vec<Listed>, Errno> {
        let mut out = Vec::new();
        match self.node(ino)? {
            Node::Fs(fs, slot, obj) => {
                let root_of_head = slot == 0 && obj == posix::ROOT;
                let zfs = root_of_head && self.shared.snapdir_visible();
                let cookie = if root_of_head && offset == ZFS_COOKIE {
                    posix::COOKIE_DOTDOT
                } else {
                    offset
                };
                // A reply that filled up right after `..` left `.zfs` for this one.
                if zfs && offset == posix::COOKIE_DOTDOT {
                    out.push((b".zfs".to_vec(), ZFS_DIR, ZFS_COOKIE, None));
                }
                for e in fs.readdir(obj, cookie, READDIR_BATCH)? {
                    let fino = to_fuse(slot, e.attr.ino)?;
                    let c = e.cookie;
                    out.push((e.name, fino, c, Some((e.attr, slot))));
                    if zfs && c == posix::COOKIE_DOTDOT {
                        out.push((b".zfs".to_vec(), ZFS_DIR, ZFS_COOKIE, None));
                    }
                }
            }
            Node::ZfsDir => {
                let all = [
                    (b".".to_vec(), ZFS_DIR, 1),
                    (b"..".to_vec(), 1, 2),
                    (b"snapshot".to_vec(), SNAPSHOT_DIR, 3),
                ];
                out.extend(
                    all.into_iter()
                        .filter(|e| e.2 > offset)
                        .map(|(n, i, c)| (n, i, c, None)),
                );
            }
            Node::SnapshotDir => {
                if offset < 1 {
                    out.push((b".".to_vec(), SNAPSHOT_DIR, 1, None));
                }
                if offset < 2 {
                    out.push((b"..".to_vec(), ZFS_DIR, 2, None));
                }
                // Cookies: position + 3 in creation order (a snapshot list is short).
                for (i, (name, slot)) in self.shared.snapshots()?.into_iter().enumerate() {
                    let c = i as u64 + 3;
                    if c > offset {
                        out.push((name.into_bytes(), to_fuse(slot, posix::ROOT)?, c, None));
                    }
                }
            }
        }
        Ok(out)
    }
}

macro_rules! tri {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                let e: Errno = e;
                $reply.error(err(&e));
                return;
            }
        }
    };
}

impl Filesystem for CisternFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut want = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_CACHE_SYMLINKS;
        if self.shared.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        if self.shared.posix_acl {
            want |= InitFlags::FUSE_POSIX_ACL;
        }
        let have = config.capabilities();
        if let Err(missing) = config.add_capabilities(want & have) {
            tracing::debug!(?missing, "kernel lacks FUSE capabilities");
        }
        if want.contains(InitFlags::FUSE_WRITEBACK_CACHE)
            && !have.contains(InitFlags::FUSE_WRITEBACK_CACHE)
        {
            tracing::info!("the kernel has no FUSE writeback cache: writes go through");
        }
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let (a, generation, slot) = tri!(reply, self.do_lookup(parent, name.as_bytes()));
        self.shared.remember(parent.0, name.as_bytes(), a.ino.0);
        reply.entry(&self.ttl(slot), &a, Generation(generation));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.shared.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let (a, _, ttl) = tri!(reply, self.attr_of(ino));
        reply.attr(&ttl, &a);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let a = tri!(
            reply,
            self.setattr_inner(ino, mode, uid, gid, size, atime, mtime, crtime)
        );
        reply.attr(&self.shared.ttl, &a);
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match tri!(reply, self.node(ino)) {
            Node::Fs(fs, _, obj) => {
                let t = tri!(reply, fs.readlink(obj));
                reply.data(&t);
            }
            _ => reply.error(FErrno::EINVAL),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let dir = tri!(reply, self.head(parent));
        tri!(reply, self.check_new_name(dir, name.as_bytes()));
        let a = tri!(
            reply,
            self.shared
                .head
                .mknod(dir, name.as_bytes(), mode, u64::from(rdev), &cred(req))
        );
        self.entry(parent.0, name.as_bytes(), 0, &a, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let dir = tri!(reply, self.head(parent));
        tri!(reply, self.check_new_name(dir, name.as_bytes()));
        let a = tri!(
            reply,
            self.shared
                .head
                .mkdir(dir, name.as_bytes(), mode, &cred(req))
        );
        self.entry(parent.0, name.as_bytes(), 0, &a, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let dir = tri!(reply, self.head(parent));
        tri!(reply, self.shared.head.unlink(dir, name.as_bytes()));
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let dir = tri!(reply, self.head(parent));
        tri!(reply, self.shared.head.rmdir(dir, name.as_bytes()));
        reply.ok();
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let dir = tri!(reply, self.head(parent));
        tri!(reply, self.check_new_name(dir, link_name.as_bytes()));
        let a = tri!(
            reply,
            self.shared.head.symlink(
                dir,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                &cred(req)
            )
        );
        self.entry(parent.0, link_name.as_bytes(), 0, &a, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let sdir = tri!(reply, self.head(parent));
        let ddir = tri!(reply, self.head(newparent));
        if flags.contains(RenameFlags::RENAME_WHITEOUT) {
            reply.error(FErrno::EINVAL);
            return;
        }
        tri!(reply, self.check_new_name(ddir, newname.as_bytes()));
        let f = posix::RenameFlags {
            noreplace: flags.contains(RenameFlags::RENAME_NOREPLACE),
            exchange: flags.contains(RenameFlags::RENAME_EXCHANGE),
        };
        tri!(
            reply,
            self.shared
                .head
                .rename(sdir, name.as_bytes(), ddir, newname.as_bytes(), f)
        );
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let obj = match self.node(ino) {
            Ok(Node::Fs(_, 0, obj)) => obj,
            Ok(Node::Fs(..)) => {
                reply.error(FErrno::EXDEV);
                return;
            }
            Ok(_) => {
                reply.error(FErrno::EPERM);
                return;
            }
            Err(e) => {
                reply.error(err(&e));
                return;
            }
        };
        let dir = tri!(reply, self.head(newparent));
        tri!(reply, self.check_new_name(dir, newname.as_bytes()));
        let a = tri!(reply, self.shared.head.link(obj, dir, newname.as_bytes()));
        self.entry(newparent.0, newname.as_bytes(), 0, &a, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match tri!(reply, self.node(ino)) {
            Node::Fs(fs, slot, obj) => {
                let writes = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
                if slot != 0 && (writes || flags.0 & libc::O_TRUNC != 0) {
                    reply.error(FErrno::EROFS);
                    return;
                }
                tri!(reply, fs.open(obj));
                // Snapshots never change: their pages stay cached across opens.
                let f = if slot != 0 {
                    FopenFlags::FOPEN_KEEP_CACHE
                } else {
                    FopenFlags::empty()
                };
                reply.opened(FileHandle(0), f);
            }
            _ => reply.error(FErrno::EISDIR),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        match tri!(reply, self.node(ino)) {
            Node::Fs(fs, _, obj) => {
                let d = tri!(reply, fs.read(obj, offset, size));
                reply.data(&d);
            }
            _ => reply.error(FErrno::EISDIR),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let obj = tri!(reply, self.head(ino));
        match self.shared.head.write(obj, offset, data) {
            Ok(n) => reply.written(n),
            Err(e) => {
                self.shared.write_errors.lock().insert(obj, e.errno);
                reply.error(err(&e));
            }
        }
    }

    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Written data is in the open txg (the kernel wrote its dirty pages
        // before this); durability is fsync's. A failed write-back is told here.
        match self.take_write_error(ino) {
            Some(e) => reply.error(fuser::Errno::from_i32(e)),
            None => reply.ok(),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Ok(Node::Fs(fs, _, obj)) = self.node(ino) {
            fs.release(obj);
        }
        reply.ok();
    }

    fn fsync(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _ds: bool, reply: ReplyEmpty) {
        match tri!(reply, self.node(ino)) {
            Node::Fs(fs, _, obj) => {
                tri!(reply, fs.fsync(obj));
                match self.take_write_error(ino) {
                    Some(e) => reply.error(fuser::Errno::from_i32(e)),
                    None => reply.ok(),
                }
            }
            _ => reply.ok(),
        }
    }

    fn fsyncdir(
        &self,
        req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.fsync(req, ino, fh, datasync, reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match tri!(reply, self.node(ino)) {
            Node::Fs(fs, _, obj) => {
                let a = tri!(reply, fs.getattr(obj));
                if a.kind != FileType::Directory {
                    reply.error(FErrno::ENOTDIR);
                    return;
                }
                reply.opened(FileHandle(0), FopenFlags::empty());
            }
            _ => reply.opened(FileHandle(0), FopenFlags::empty()),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let list = tri!(reply, self.list(ino, offset));
        for (name, fino, cookie, attr) in list {
            let kind = attr.map_or(FType::Directory, |(a, _)| ftype(a.kind));
            if reply.add(INodeNo(fino), cookie, kind, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let list = tri!(reply, self.list(ino, offset));
        let root = tri!(reply, self.root_attr());
        for (name, fino, cookie, attr) in list {
            let (fa, generation, ttl) = match &attr {
                Some((a, slot)) => (fattr(fino, a), a.generation, self.ttl(*slot)),
                None => (virtual_attr(fino, &root), 0, self.shared.ttl),
            };
            if reply.add(
                INodeNo(fino),
                cookie,
                OsStr::from_bytes(&name),
                &ttl,
                &fa,
                Generation(generation),
            ) {
                break;
            }
            // The kernel counts a lookup for every entry but `.` and `..`.
            if name != b"." && name != b".." {
                self.shared.remember(ino.0, &name, fino);
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = tri!(reply, self.shared.head.statfs());
        reply.statfs(
            s.blocks,
            s.blocks_free,
            s.blocks_free,
            s.files,
            s.files_free,
            s.block_size,
            s.name_max,
            s.block_size,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let obj = tri!(reply, self.head(ino));
        let how = match flags {
            0 => posix::XattrSet::Any,
            libc::XATTR_CREATE => posix::XattrSet::Create,
            libc::XATTR_REPLACE => posix::XattrSet::Replace,
            _ => {
                reply.error(FErrno::EINVAL);
                return;
            }
        };
        tri!(
            reply,
            self.shared.head.setxattr(obj, name.as_bytes(), value, how)
        );
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match tri!(reply, self.node(ino)) {
            Node::Fs(fs, _, obj) => {
                let v = tri!(reply, fs.getxattr(obj, name.as_bytes()));
                xattr_reply(reply, &v, size);
            }
            _ => reply.error(FErrno::from_i32(libc::ENODATA)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match tri!(reply, self.node(ino)) {
            Node::Fs(fs, _, obj) => {
                let v = tri!(reply, fs.listxattr(obj));
                xattr_reply(reply, &v, size);
            }
            _ => xattr_reply(reply, &[], size),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let obj = tri!(reply, self.head(ino));
        tri!(reply, self.shared.head.removexattr(obj, name.as_bytes()));
        reply.ok();
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let want = mask.bits() as u32 & 7;
        match tri!(reply, self.node(ino)) {
            Node::Fs(fs, slot, obj) => {
                let a = tri!(reply, fs.getattr(obj));
                if slot != 0 && want & 2 != 0 {
                    reply.error(FErrno::EROFS);
                } else if posix::Fs::access(&a, &cred(req), want) {
                    reply.ok();
                } else {
                    reply.error(FErrno::EACCES);
                }
            }
            _ if want & 2 != 0 => reply.error(FErrno::EROFS),
            _ => reply.ok(),
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let dir = tri!(reply, self.head(parent));
        tri!(reply, self.check_new_name(dir, name.as_bytes()));
        let a = tri!(
            reply,
            self.shared
                .head
                .create(dir, name.as_bytes(), mode, &cred(req))
        );
        let ino = tri!(reply, to_fuse(0, a.ino));
        tri!(reply, self.shared.head.open(a.ino));
        self.shared.remember(parent.0, name.as_bytes(), ino);
        reply.created(
            &self.shared.ttl,
            &fattr(ino, &a),
            Generation(a.generation),
            FileHandle(0),
            FopenFlags::empty(),
        );
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let obj = tri!(reply, self.head(ino));
        tri!(reply, self.shared.head.fallocate(obj, offset, length, mode));
        reply.ok();
    }

    /// No ioctl is supported: ENOTTY, as a disk filesystem answers one it
    /// does not know. Python's `open` asks every file `isatty` (TCGETS), and
    /// fuser's default logged a WARN for each.
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: ReplyIoctl,
    ) {
        reply.error(FErrno::from_i32(libc::ENOTTY));
    }
}

/// The xattr size-probe protocol: size 0 asks for the length.
fn xattr_reply(reply: ReplyXattr, v: &[u8], size: u32) {
    if size == 0 {
        reply.size(v.len() as u32);
    } else if v.len() > size as usize {
        reply.error(FErrno::ERANGE);
    } else {
        reply.data(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_numbers_are_unique_across_head_and_snapshots() {
        assert_eq!(to_fuse(0, posix::ROOT).unwrap(), 1);
        assert_eq!(to_fuse(0, 64).unwrap(), 64);
        assert_eq!(to_fuse(5, 64).unwrap(), (5 << 40) | 64);
        assert_ne!(to_fuse(5, posix::ROOT).unwrap(), 1);
        assert!(to_fuse(0, 1 << 40).is_err());
        assert_ne!(ZFS_DIR, SNAPSHOT_DIR);
        assert_eq!(ZFS_DIR >> OBJ_BITS, VIRTUAL);
    }
}
