//! The NFSv3 (RFC 1813), MOUNT v3 and portmap v2 procedures over `posix::Fs`.
//!
//! Fork of nfs3_server 0.11.1 `src/nfs_handlers.rs`, `src/mount_handlers.rs`
//! and `src/portmap_handlers.rs` (BSD-3-Clause, Copyright (c) 2023, XetData;
//! see LICENSE-nfs3_server). Changed: the procedures call `posix::Fs`
//! directly (no VFS trait); file handles are (pool guid, dataset id, inode,
//! generation) instead of a per-start prefix; the write verifier is the
//! server's own; LINK and MKNOD are implemented; permissions are checked
//! with the caller's AUTH_UNIX credential, squashed per `sharenfs`; MOUNT
//! serves every shared dataset and snapshot; READDIR(PLUS) use the posix
//! layer's stable cookies with a zero cookie verifier; no `unwrap`/`expect`.

use crate::exports::{Access, ShareOptions};
use crate::rpc::{self, Unix};
use crate::{Export, Server};
use dataset::DatasetKind;
use nfs3_types::mount::{
    dirpath, export_node, exports, fhandle3, mountbody, mountres3, mountres3_ok, mountstat3,
    name as group_name,
};
use nfs3_types::nfs3::*;
use nfs3_types::portmap;
use nfs3_types::rpc::accept_stat_data;
use nfs3_types::xdr_codec::{List, Opaque, Pack, Void};
use posix::{Attr, Cred, Errno, FileType, Fs, SetAttr, SetTime};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Largest READ/WRITE (what FSINFO announces).
const IO_MAX: u32 = 1 << 20;
const FH_LEN: usize = 36;
const FH_VERSION: u8 = 1;
/// How long a handle's unknown dataset is remembered as unknown.
const MISS_TTL: std::time::Duration = std::time::Duration::from_secs(5);

// ------------------------------------------------------------ handles

fn fh(e: &Export, ino: u64, generation: u64) -> nfs_fh3 {
    fh_of(e.guid, e.dataset_id(), ino, generation)
}

pub(crate) fn fh_of(pool_guid: u64, dataset: u64, ino: u64, generation: u64) -> nfs_fh3 {
    let mut b = Vec::with_capacity(FH_LEN);
    b.extend_from_slice(&[FH_VERSION, 0, 0, 0]);
    for v in [pool_guid, dataset, ino, generation] {
        b.extend_from_slice(&v.to_be_bytes());
    }
    nfs_fh3 {
        data: Opaque::owned(b),
    }
}

/// (pool guid, dataset id, inode, generation).
pub(crate) fn parse_fh(h: &[u8]) -> Result<[u64; 4], nfsstat3> {
    if h.len() != FH_LEN || h[0] != FH_VERSION {
        return Err(nfsstat3::NFS3ERR_BADHANDLE);
    }
    let mut out = [0u64; 4];
    for (i, v) in out.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[4 + i * 8..12 + i * 8]);
        *v = u64::from_be_bytes(b);
    }
    Ok(out)
}

// ------------------------------------------------------------ conversions

fn stat_of(e: &Errno) -> nfsstat3 {
    use nfsstat3::*;
    match e.errno {
        libc::EPERM => NFS3ERR_PERM,
        libc::ENOENT => NFS3ERR_NOENT,
        libc::ENXIO => NFS3ERR_NXIO,
        libc::EACCES => NFS3ERR_ACCES,
        libc::EEXIST => NFS3ERR_EXIST,
        libc::EXDEV => NFS3ERR_XDEV,
        libc::ENODEV => NFS3ERR_NODEV,
        libc::ENOTDIR => NFS3ERR_NOTDIR,
        libc::EISDIR => NFS3ERR_ISDIR,
        libc::EINVAL | libc::EILSEQ | libc::ELOOP => NFS3ERR_INVAL,
        libc::EFBIG => NFS3ERR_FBIG,
        libc::ENOSPC => NFS3ERR_NOSPC,
        libc::EROFS => NFS3ERR_ROFS,
        libc::EMLINK => NFS3ERR_MLINK,
        libc::ENAMETOOLONG => NFS3ERR_NAMETOOLONG,
        libc::ENOTEMPTY => NFS3ERR_NOTEMPTY,
        libc::EDQUOT => NFS3ERR_DQUOT,
        libc::ESTALE => NFS3ERR_STALE,
        libc::EOPNOTSUPP => NFS3ERR_NOTSUPP,
        _ => NFS3ERR_IO,
    }
}

fn time(ns: u64) -> nfstime3 {
    nfstime3 {
        seconds: u32::try_from(ns / 1_000_000_000).unwrap_or(u32::MAX),
        nseconds: (ns % 1_000_000_000) as u32,
    }
}

fn ns_of(t: &nfstime3) -> u64 {
    u64::from(t.seconds) * 1_000_000_000 + u64::from(t.nseconds.min(999_999_999))
}

fn fattr(e: &Export, a: &Attr) -> fattr3 {
    let type_ = match a.kind {
        FileType::Regular => ftype3::NF3REG,
        FileType::Directory => ftype3::NF3DIR,
        FileType::Symlink => ftype3::NF3LNK,
        FileType::CharDevice => ftype3::NF3CHR,
        FileType::BlockDevice => ftype3::NF3BLK,
        FileType::Fifo => ftype3::NF3FIFO,
        FileType::Socket => ftype3::NF3SOCK,
    };
    fattr3 {
        type_,
        mode: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        size: a.size,
        used: a.blocks.saturating_mul(512),
        rdev: specdata3 {
            specdata1: libc::major(a.rdev as libc::dev_t),
            specdata2: libc::minor(a.rdev as libc::dev_t),
        },
        fsid: e.fsid(),
        fileid: a.ino,
        atime: time(a.atime_ns),
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
    }
}

fn wcc_attr_of(a: &Attr) -> wcc_attr {
    wcc_attr {
        size: a.size,
        mtime: time(a.mtime_ns),
        ctime: time(a.ctime_ns),
    }
}

fn post(e: &Export, ino: u64) -> post_op_attr {
    match e.fs.getattr(ino) {
        Ok(a) => post_op_attr::Some(fattr(e, &a)),
        Err(_) => post_op_attr::None,
    }
}

fn wcc(e: &Export, before: &Attr) -> wcc_data {
    wcc_data {
        before: pre_op_attr::Some(wcc_attr_of(before)),
        after: post(e, before.ino),
    }
}

fn set_attr(s: &sattr3) -> SetAttr {
    let t = |how: Option<Option<&nfstime3>>| {
        how.map(|c| match c {
            None => SetTime::Now,
            Some(t) => SetTime::Ns(ns_of(t)),
        })
    };
    SetAttr {
        mode: match s.mode {
            set_mode3::Some(m) => Some(m),
            set_mode3::None => None,
        },
        uid: match s.uid {
            set_uid3::Some(u) => Some(u),
            set_uid3::None => None,
        },
        gid: match s.gid {
            set_gid3::Some(g) => Some(g),
            set_gid3::None => None,
        },
        size: match s.size {
            set_size3::Some(n) => Some(n),
            set_size3::None => None,
        },
        atime: t(match &s.atime {
            set_atime::DONT_CHANGE => None,
            set_atime::SET_TO_SERVER_TIME => Some(None),
            set_atime::SET_TO_CLIENT_TIME(t) => Some(Some(t)),
        }),
        mtime: t(match &s.mtime {
            set_mtime::DONT_CHANGE => None,
            set_mtime::SET_TO_SERVER_TIME => Some(None),
            set_mtime::SET_TO_CLIENT_TIME(t) => Some(Some(t)),
        }),
        crtime: None,
    }
}

fn is_empty(s: &SetAttr) -> bool {
    *s == SetAttr::default()
}

const R: u32 = 4;
const W: u32 = 2;
const X: u32 = 1;

/// What SETATTR may change for `cred` (as Linux's notify_change checks).
fn check_setattr(a: &Attr, cred: &Cred, set: &SetAttr) -> Result<(), nfsstat3> {
    let root = cred.uid == 0;
    let owner = root || cred.uid == a.uid;
    if set.mode.is_some() && !owner {
        return Err(nfsstat3::NFS3ERR_PERM);
    }
    if set.uid.is_some_and(|u| u != a.uid) && !root {
        return Err(nfsstat3::NFS3ERR_PERM);
    }
    if let Some(g) = set.gid {
        let member = cred.gid == g || cred.groups.contains(&g);
        if g != a.gid && !root && !(cred.uid == a.uid && member) {
            return Err(nfsstat3::NFS3ERR_PERM);
        }
    }
    // The owner may truncate without write permission (knfsd's owner
    // override: a file created 0444 is still written by its creator).
    if set.size.is_some() && !(owner || Fs::access(a, cred, W)) {
        return Err(nfsstat3::NFS3ERR_ACCES);
    }
    for t in [set.atime, set.mtime].into_iter().flatten() {
        match t {
            SetTime::Now if !(owner || Fs::access(a, cred, W)) => {
                return Err(nfsstat3::NFS3ERR_ACCES)
            }
            SetTime::Ns(_) if !owner => return Err(nfsstat3::NFS3ERR_PERM),
            _ => {}
        }
    }
    Ok(())
}

// ------------------------------------------------------------ exports

impl Server {
    fn pool_guid(&self, pool: &str) -> Option<u64> {
        self.engine
            .list_pools()
            .into_iter()
            .find(|p| p.name == pool)
            .map(|p| p.guid)
    }

    /// Opens (once) the filesystem or snapshot `name`.
    pub(crate) fn export_named(&self, name: &str) -> Result<Arc<Export>, String> {
        let head = name.split('@').next().unwrap_or(name);
        let info = self.engine.dataset(head).map_err(|e| e.to_string())?;
        if info.kind != DatasetKind::Filesystem {
            return Err(format!("'{head}' is not a filesystem"));
        }
        let objs = self.engine.open_objects(name).map_err(|e| e.to_string())?;
        let pool = head.split('/').next().unwrap_or(head);
        let guid = self
            .pool_guid(pool)
            .ok_or_else(|| format!("pool '{pool}' is not imported"))?;
        let key = (guid, objs.dataset_id());
        if let Some(e) = self.cached(key) {
            return Ok(e);
        }
        let fs = Fs::shared(objs).map_err(|e| e.to_string())?;
        let e = Arc::new(Export {
            fs,
            guid,
            snapshot: name.contains('@'),
        });
        // One Fs per dataset: its namespace lock must be shared by all clients.
        Ok(self.open.lock().entry(key).or_insert(e).clone())
    }

    /// An open dataset, if it is still there: one whose pool was exported
    /// (and perhaps imported again) or that was destroyed is dropped.
    fn cached(&self, key: (u64, u64)) -> Option<Arc<Export>> {
        let e = self.open.lock().get(&key).cloned()?;
        if e.fs.is_readonly().is_ok() {
            return Some(e);
        }
        self.open.lock().remove(&key);
        None
    }

    /// The dataset a handle names (after a restart: found by its id).
    fn export_by_id(&self, guid: u64, id: u64) -> Option<Arc<Export>> {
        if let Some(e) = self.cached((guid, id)) {
            return Some(e);
        }
        // A handle for a dataset that is not here costs a search of its
        // pool; the answer is remembered a few seconds (bounded).
        let now = std::time::Instant::now();
        {
            let mut missed = self.missed.lock();
            match missed.get(&(guid, id)) {
                Some(t) if now.duration_since(*t) < MISS_TTL => return None,
                _ => {}
            }
            if missed.len() >= 1024 {
                missed.retain(|_, t| now.duration_since(*t) < MISS_TTL);
                if missed.len() >= 1024 {
                    missed.clear();
                }
            }
        }
        let found = self.search(guid, id);
        if found.is_none() {
            self.missed.lock().insert((guid, id), now);
        }
        found
    }

    fn search(&self, guid: u64, id: u64) -> Option<Arc<Export>> {
        let pool = self
            .engine
            .list_pools()
            .into_iter()
            .find(|p| p.guid == guid)?;
        let infos = self.engine.list_datasets(Some(&pool.name)).ok()?;
        for info in infos {
            if !matches!(info.kind, DatasetKind::Filesystem | DatasetKind::Snapshot) {
                continue;
            }
            let Ok(objs) = self.engine.open_objects(&info.name) else {
                continue;
            };
            if objs.dataset_id() == id {
                return self.export_named(&info.name).ok();
            }
        }
        None
    }

    /// The dataset's `sharenfs`, parsed (`None`: not shared or unparsable).
    fn share_of(&self, e: &Export) -> Option<ShareOptions> {
        let value = e.fs.objects().property("sharenfs").ok()?;
        match ShareOptions::parse(&value) {
            Ok(o) => o,
            Err(why) => {
                if self.bad_shares.lock().insert(value.clone(), ()).is_none() {
                    tracing::warn!(dataset = %e.fs.name(), sharenfs = %value,
                        "not shared over NFS: {why}");
                }
                None
            }
        }
    }
}

// ------------------------------------------------------------ calls

struct Ctx<'a> {
    s: &'a Server,
    peer: SocketAddr,
    unix: Option<Unix>,
}

/// A request's view of one export: may it write, and as whom.
struct Who {
    rw: bool,
    cred: Cred,
}

type Res<T> = Result<T, nfsstat3>;

impl Ctx<'_> {
    fn who(&self, e: &Export) -> Res<Who> {
        let Some(share) = self.s.share_of(e) else {
            // Unshared since the handle was given: as knfsd, STALE.
            return Err(nfsstat3::NFS3ERR_STALE);
        };
        let Some(access) = share.access_for(self.peer.ip()) else {
            // Per request: debug (a mount refused for it is logged at info).
            tracing::debug!(peer = %self.peer, dataset = %e.fs.name(),
                "NFS request refused: host not in sharenfs");
            return Err(nfsstat3::NFS3ERR_ACCES);
        };
        let unix = self.unix.as_ref().map(|u| (u.uid, u.gid, &u.gids[..]));
        Ok(Who {
            rw: access == Access::ReadWrite && !e.snapshot,
            cred: share.cred(unix),
        })
    }

    /// The export and current attributes of a handle's file.
    fn file(&self, h: &nfs_fh3) -> Res<(Arc<Export>, Attr, Who)> {
        let [guid, id, ino, generation] = parse_fh(&h.data)?;
        let e = self
            .s
            .export_by_id(guid, id)
            .ok_or(nfsstat3::NFS3ERR_STALE)?;
        let who = self.who(&e)?;
        let a =
            e.fs.getattr_generation(ino, generation)
                .map_err(|err| match err.errno {
                    libc::ENOENT | libc::ESTALE => nfsstat3::NFS3ERR_STALE,
                    _ => stat_of(&err),
                })?;
        Ok((e, a, who))
    }

    /// A directory the caller will change (W and X), on a writable export.
    fn dir_to_change(&self, h: &nfs_fh3) -> Res<(Arc<Export>, Attr, Who)> {
        let (e, a, who) = self.file(h)?;
        if a.kind != FileType::Directory {
            return Err(nfsstat3::NFS3ERR_NOTDIR);
        }
        if !who.rw {
            return Err(nfsstat3::NFS3ERR_ROFS);
        }
        if !Fs::access(&a, &who.cred, W | X) {
            return Err(nfsstat3::NFS3ERR_ACCES);
        }
        Ok((e, a, who))
    }

    /// The sticky bit: only the owner of the entry or of the directory (or root) removes it.
    fn sticky_ok(&self, e: &Export, dir: &Attr, name: &[u8], cred: &Cred) -> Res<()> {
        if dir.perm & libc::S_ISVTX == 0 || cred.uid == 0 || cred.uid == dir.uid {
            return Ok(());
        }
        match e.fs.lookup(dir.ino, name) {
            Ok(t) if t.uid != cred.uid => Err(nfsstat3::NFS3ERR_ACCES),
            _ => Ok(()),
        }
    }
}

fn garbage(xid: u32, peer: SocketAddr, why: &str, count: &AtomicU32) -> Vec<u8> {
    if count.fetch_add(1, Ordering::Relaxed) < 10 {
        tracing::warn!(%peer, xid, "NFS client sent arguments that do not decode: {why}");
    }
    rpc::accept_error(xid, accept_stat_data::GARBAGE_ARGS)
}

/// Answers one call (an empty reply: none to send).
pub(crate) fn dispatch(
    s: &Server,
    peer: SocketAddr,
    mut call: rpc::Call,
    bad: &AtomicU32,
) -> Vec<u8> {
    let xid = call.xid;
    if call.rpcvers != 2 {
        return rpc::rpc_mismatch(xid);
    }
    let unix = match &call.unix {
        Ok(u) => u.clone(),
        // NULL procedures are answered whatever the credential.
        Err(_) if call.proc_ == 0 => None,
        Err(stat) => {
            tracing::warn!(%peer, xid, "NFS call refused: credential {stat}");
            return rpc::auth_error(xid, *stat);
        }
    };
    let ctx = Ctx { s, peer, unix };
    macro_rules! run {
        ($f:expr) => {
            match call.args() {
                Ok(args) => rpc::success(xid, &$f(&ctx, args)),
                Err(why) => garbage(xid, peer, &why, bad),
            }
        };
    }
    let (prog, vers, p) = (call.prog, call.vers, call.proc_);
    match prog {
        portmap::PROGRAM if vers == portmap::VERSION => match p {
            0 => run!(|_: &Ctx, _: Void| Void),
            3 => run!(|c: &Ctx, m: portmap::mapping| {
                let ours = (m.prog == PROGRAM && m.vers == VERSION)
                    || (m.prog == nfs3_types::mount::PROGRAM
                        && m.vers == nfs3_types::mount::VERSION);
                if ours && m.prot == portmap::IPPROTO_TCP {
                    c.s.port.load(Ordering::Relaxed) as u32
                } else {
                    0u32
                }
            }),
            _ => rpc::accept_error(xid, accept_stat_data::PROC_UNAVAIL),
        },
        nfs3_types::mount::PROGRAM if vers == nfs3_types::mount::VERSION => match p {
            0 => run!(|_: &Ctx, _: Void| Void),
            1 => run!(mount),
            2 => run!(|_: &Ctx, _: dirpath<'static>| Void),
            3 => run!(|_: &Ctx, _: Void| List::<mountbody<'static, 'static>>(Vec::new())),
            4 => run!(|_: &Ctx, _: Void| Void),
            5 => run!(export_list),
            _ => rpc::accept_error(xid, accept_stat_data::PROC_UNAVAIL),
        },
        PROGRAM if vers == VERSION => match p {
            0 => run!(|_: &Ctx, _: Void| Void),
            1 => run!(getattr),
            2 => run!(setattr),
            3 => run!(lookup),
            4 => run!(access),
            5 => run!(readlink),
            6 => run!(read),
            7 => run!(write),
            8 => run!(create),
            9 => run!(mkdir),
            10 => run!(symlink),
            11 => run!(mknod),
            12 => run!(remove),
            13 => run!(rmdir),
            14 => run!(rename),
            15 => run!(link),
            16 => run!(readdir),
            17 => run!(readdirplus),
            18 => run!(fsstat),
            19 => run!(fsinfo),
            20 => run!(pathconf),
            21 => run!(commit),
            _ => rpc::accept_error(xid, accept_stat_data::PROC_UNAVAIL),
        },
        portmap::PROGRAM => rpc::accept_error(
            xid,
            accept_stat_data::PROG_MISMATCH {
                low: portmap::VERSION,
                high: portmap::VERSION,
            },
        ),
        nfs3_types::mount::PROGRAM | PROGRAM => {
            rpc::accept_error(xid, accept_stat_data::PROG_MISMATCH { low: 3, high: 3 })
        }
        _ => rpc::accept_error(xid, accept_stat_data::PROG_UNAVAIL),
    }
}

// ------------------------------------------------------------ MOUNT

/// `/POOL/DS[/sub]`, `/POOL/DS/.zfs/snapshot/NAME[/sub]` or `/POOL/DS@NAME[/sub]`.
fn resolve_path(s: &Server, path: &str) -> Result<(Arc<Export>, Vec<String>), mountstat3> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if comps.is_empty() || comps.len() > 256 {
        return Err(mountstat3::MNT3ERR_NOENT);
    }
    let open = |name: &str, rest: &[&str]| {
        s.export_named(name)
            .map(|e| (e, rest.iter().map(|r| r.to_string()).collect()))
            .map_err(|why| {
                tracing::info!(path, "NFS mount refused: {why}");
                mountstat3::MNT3ERR_NOENT
            })
    };
    if let Some(i) = comps.windows(2).position(|w| w == [".zfs", "snapshot"]) {
        let snap = comps.get(i + 2).ok_or(mountstat3::MNT3ERR_NOENT)?;
        return open(&format!("{}@{snap}", comps[..i].join("/")), &comps[i + 3..]);
    }
    for n in (1..=comps.len()).rev() {
        let name = comps[..n].join("/");
        let head = name.split('@').next().unwrap_or(&name);
        if s.engine
            .dataset(head)
            .is_ok_and(|i| i.kind == DatasetKind::Filesystem)
            && s.engine.dataset(&name).is_ok()
        {
            return open(&name, &comps[n..]);
        }
    }
    Err(mountstat3::MNT3ERR_NOENT)
}

fn mount(c: &Ctx, path: dirpath<'static>) -> mountres3<'static> {
    let Ok(path) = std::str::from_utf8(&path.0) else {
        return mountres3::Err(mountstat3::MNT3ERR_INVAL);
    };
    let (e, rest) = match resolve_path(c.s, path) {
        Ok(x) => x,
        Err(stat) => return mountres3::Err(stat),
    };
    let who = match c.who(&e) {
        Ok(w) => w,
        Err(nfsstat3::NFS3ERR_STALE) => {
            tracing::info!(peer = %c.peer, path, "NFS mount refused: not shared (sharenfs=off)");
            return mountres3::Err(mountstat3::MNT3ERR_NOENT);
        }
        Err(_) => {
            tracing::info!(peer = %c.peer, path, "NFS mount refused: host not in sharenfs");
            return mountres3::Err(mountstat3::MNT3ERR_ACCES);
        }
    };
    let mut at = match e.fs.getattr(posix::ROOT) {
        Ok(a) => a,
        Err(_) => return mountres3::Err(mountstat3::MNT3ERR_IO),
    };
    for name in &rest {
        if !Fs::access(&at, &who.cred, X) {
            return mountres3::Err(mountstat3::MNT3ERR_ACCES);
        }
        at = match e.fs.lookup(at.ino, name.as_bytes()) {
            Ok(a) => a,
            Err(_) => return mountres3::Err(mountstat3::MNT3ERR_NOENT),
        };
    }
    if at.kind != FileType::Directory {
        return mountres3::Err(mountstat3::MNT3ERR_NOTDIR);
    }
    tracing::info!(peer = %c.peer, path, rw = who.rw, "NFS mount");
    mountres3::Ok(mountres3_ok {
        fhandle: fhandle3(fh(&e, at.ino, at.generation).data),
        auth_flavors: vec![1, 0],
    })
}

fn export_list(c: &Ctx, _: Void) -> exports<'static, 'static> {
    let mut out = Vec::new();
    for info in c.s.engine.list_datasets(None).unwrap_or_default() {
        if info.kind != DatasetKind::Filesystem {
            continue;
        }
        let value = info
            .property("sharenfs")
            .map(|p| p.value.clone())
            .unwrap_or_default();
        let Ok(Some(opts)) = ShareOptions::parse(&value) else {
            continue;
        };
        // Only datasets that hold files (a pool's root may not).
        if c.s.engine.open_objects(&info.name).is_err() {
            continue;
        }
        out.push(export_node {
            ex_dir: dirpath(Opaque::owned(format!("/{}", info.name).into_bytes())),
            ex_groups: List(
                opts.groups()
                    .into_iter()
                    .map(|g| group_name(Opaque::owned(g.into_bytes())))
                    .collect(),
            ),
        });
    }
    List(out)
}

// ------------------------------------------------------------ NFS

fn getattr(c: &Ctx, a: GETATTR3args) -> GETATTR3res {
    match c.file(&a.object) {
        Ok((e, at, _)) => GETATTR3res::Ok(GETATTR3resok {
            obj_attributes: fattr(&e, &at),
        }),
        Err(stat) => GETATTR3res::Err((stat, Void)),
    }
}

fn setattr(c: &Ctx, a: SETATTR3args) -> SETATTR3res {
    let (e, at, who) = match c.file(&a.object) {
        Ok(x) => x,
        Err(stat) => return SETATTR3res::Err((stat, SETATTR3resfail::default())),
    };
    let fail = |stat, e: &Export| {
        SETATTR3res::Err((
            stat,
            SETATTR3resfail {
                obj_wcc: wcc(e, &at),
            },
        ))
    };
    if let sattrguard3::Some(guard) = a.guard {
        if guard != time(at.ctime_ns) {
            return fail(nfsstat3::NFS3ERR_NOT_SYNC, &e);
        }
    }
    if !who.rw {
        return fail(nfsstat3::NFS3ERR_ROFS, &e);
    }
    let set = set_attr(&a.new_attributes);
    if let Err(stat) = check_setattr(&at, &who.cred, &set) {
        return fail(stat, &e);
    }
    match e.fs.setattr(at.ino, &set) {
        Ok(_) => SETATTR3res::Ok(SETATTR3resok {
            obj_wcc: wcc(&e, &at),
        }),
        Err(err) => fail(stat_of(&err), &e),
    }
}

fn lookup(c: &Ctx, a: LOOKUP3args<'_>) -> LOOKUP3res {
    let (e, dir, who) = match c.file(&a.what.dir) {
        Ok(x) => x,
        Err(stat) => return LOOKUP3res::Err((stat, LOOKUP3resfail::default())),
    };
    let dir_attributes = post_op_attr::Some(fattr(&e, &dir));
    let found = if dir.kind != FileType::Directory {
        Err(nfsstat3::NFS3ERR_NOTDIR)
    } else if !Fs::access(&dir, &who.cred, X) {
        Err(nfsstat3::NFS3ERR_ACCES)
    } else {
        e.fs.lookup(dir.ino, &a.what.name.0)
            .map_err(|e| stat_of(&e))
    };
    match found {
        Ok(t) => LOOKUP3res::Ok(LOOKUP3resok {
            object: fh(&e, t.ino, t.generation),
            obj_attributes: post_op_attr::Some(fattr(&e, &t)),
            dir_attributes,
        }),
        Err(stat) => LOOKUP3res::Err((stat, LOOKUP3resfail { dir_attributes })),
    }
}

fn access(c: &Ctx, a: ACCESS3args) -> ACCESS3res {
    let (e, at, who) = match c.file(&a.object) {
        Ok(x) => x,
        Err(stat) => return ACCESS3res::Err((stat, ACCESS3resfail::default())),
    };
    let may = |want| Fs::access(&at, &who.cred, want);
    let dir = at.kind == FileType::Directory;
    let mut granted = 0;
    if may(R) {
        granted |= ACCESS3_READ;
    }
    if may(X) {
        granted |= if dir { ACCESS3_LOOKUP } else { ACCESS3_EXECUTE };
    }
    if who.rw && may(W) {
        granted |= ACCESS3_MODIFY | ACCESS3_EXTEND;
        if dir {
            granted |= ACCESS3_DELETE;
        }
    }
    ACCESS3res::Ok(ACCESS3resok {
        obj_attributes: post_op_attr::Some(fattr(&e, &at)),
        access: a.access & granted,
    })
}

fn readlink(c: &Ctx, a: READLINK3args) -> READLINK3res<'static> {
    let (e, at, _) = match c.file(&a.symlink) {
        Ok(x) => x,
        Err(stat) => return READLINK3res::Err((stat, READLINK3resfail::default())),
    };
    let symlink_attributes = post_op_attr::Some(fattr(&e, &at));
    if at.kind != FileType::Symlink {
        return READLINK3res::Err((
            nfsstat3::NFS3ERR_INVAL,
            READLINK3resfail { symlink_attributes },
        ));
    }
    match e.fs.readlink(at.ino) {
        Ok(t) => READLINK3res::Ok(READLINK3resok {
            symlink_attributes,
            data: nfspath3(Opaque::owned(t)),
        }),
        Err(err) => READLINK3res::Err((stat_of(&err), READLINK3resfail { symlink_attributes })),
    }
}

fn read(c: &Ctx, a: READ3args) -> READ3res<'static> {
    let (e, at, who) = match c.file(&a.file) {
        Ok(x) => x,
        Err(stat) => return READ3res::Err((stat, READ3resfail::default())),
    };
    let fail = |stat| {
        READ3res::Err((
            stat,
            READ3resfail {
                file_attributes: post_op_attr::Some(fattr(&e, &at)),
            },
        ))
    };
    if at.kind == FileType::Directory {
        return fail(nfsstat3::NFS3ERR_ISDIR);
    }
    if at.kind != FileType::Regular {
        return fail(nfsstat3::NFS3ERR_INVAL);
    }
    // Owner override and read-if-executable, as knfsd (mmap, page-ins).
    if !(who.cred.uid == at.uid || Fs::access(&at, &who.cred, R) || Fs::access(&at, &who.cred, X)) {
        return fail(nfsstat3::NFS3ERR_ACCES);
    }
    match e.fs.read(at.ino, a.offset, a.count.min(IO_MAX)) {
        Ok(data) => {
            let eof = a.offset.saturating_add(data.len() as u64) >= at.size;
            READ3res::Ok(READ3resok {
                file_attributes: post(&e, at.ino),
                count: data.len() as u32,
                eof,
                data: Opaque::owned(data),
            })
        }
        Err(err) => fail(stat_of(&err)),
    }
}

fn write(c: &Ctx, a: WRITE3args<'_>) -> WRITE3res {
    let (e, at, who) = match c.file(&a.file) {
        Ok(x) => x,
        Err(stat) => return WRITE3res::Err((stat, WRITE3resfail::default())),
    };
    let fail = |stat| {
        WRITE3res::Err((
            stat,
            WRITE3resfail {
                file_wcc: wcc(&e, &at),
            },
        ))
    };
    if a.data.len() != a.count as usize || a.count > IO_MAX {
        return fail(nfsstat3::NFS3ERR_INVAL);
    }
    if !who.rw {
        return fail(nfsstat3::NFS3ERR_ROFS);
    }
    if at.kind != FileType::Regular {
        return fail(if at.kind == FileType::Directory {
            nfsstat3::NFS3ERR_ISDIR
        } else {
            nfsstat3::NFS3ERR_INVAL
        });
    }
    if !(who.cred.uid == at.uid || Fs::access(&at, &who.cred, W)) {
        return fail(nfsstat3::NFS3ERR_ACCES);
    }
    tracing::trace!(ino = at.ino, offset = a.offset, count = a.count, stable = %a.stable, "NFS write");
    if let Err(err) = e.fs.write(at.ino, a.offset, &a.data) {
        return fail(stat_of(&err));
    }
    let committed = if a.stable == stable_how::UNSTABLE {
        stable_how::UNSTABLE
    } else {
        if let Err(err) = e.fs.fsync(at.ino) {
            return fail(stat_of(&err));
        }
        stable_how::FILE_SYNC
    };
    WRITE3res::Ok(WRITE3resok {
        file_wcc: wcc(&e, &at),
        count: a.count,
        committed,
        verf: writeverf3(c.s.verifier),
    })
}

fn commit(c: &Ctx, a: COMMIT3args) -> COMMIT3res {
    let (e, at, _) = match c.file(&a.file) {
        Ok(x) => x,
        Err(stat) => {
            return COMMIT3res::Err((
                stat,
                COMMIT3resfail {
                    file_wcc: wcc_data::default(),
                },
            ))
        }
    };
    match e.fs.fsync(at.ino) {
        Ok(()) => COMMIT3res::Ok(COMMIT3resok {
            file_wcc: wcc(&e, &at),
            verf: writeverf3(c.s.verifier),
        }),
        Err(err) => COMMIT3res::Err((
            stat_of(&err),
            COMMIT3resfail {
                file_wcc: wcc(&e, &at),
            },
        )),
    }
}

/// Applies what a create's attributes ask beyond the mode (size, times, owner).
fn apply_rest(e: &Export, t: Attr, cred: &Cred, s: &sattr3) -> Res<Attr> {
    let mut set = set_attr(s);
    set.mode = None;
    if set.uid == Some(t.uid) {
        set.uid = None;
    }
    if set.gid == Some(t.gid) {
        set.gid = None;
    }
    if is_empty(&set) {
        return Ok(t);
    }
    check_setattr(&t, cred, &set)?;
    e.fs.setattr(t.ino, &set).map_err(|e| stat_of(&e))
}

fn mode_of(s: &sattr3, default: u32) -> u32 {
    match s.mode {
        set_mode3::Some(m) => m & 0o7777,
        set_mode3::None => default,
    }
}

/// An EXCLUSIVE create's verifier, kept in atime and mtime as knfsd does.
fn verf_ns(v: &createverf3) -> u64 {
    let s = u32::from_be_bytes([v.0[0], v.0[1], v.0[2], v.0[3]]);
    let n = u32::from_be_bytes([v.0[4], v.0[5], v.0[6], v.0[7]]) % 1_000_000_000;
    u64::from(s) * 1_000_000_000 + u64::from(n)
}

/// The result of the creating procedures: new object and the directory's wcc.
type Made = (Res<Attr>, Option<(Arc<Export>, Attr)>);

fn made<T>(
    m: Made,
    ok: impl FnOnce(post_op_fh3, post_op_attr, wcc_data) -> T,
    err: impl FnOnce(nfsstat3, wcc_data) -> T,
) -> T {
    let (res, dir) = m;
    let dir_wcc = match &dir {
        Some((e, d)) => wcc(e, d),
        None => wcc_data::default(),
    };
    match (res, dir) {
        (Ok(t), Some((e, _))) => ok(
            post_op_fh3::Some(fh(&e, t.ino, t.generation)),
            post_op_attr::Some(fattr(&e, &t)),
            dir_wcc,
        ),
        (Ok(_), None) => err(nfsstat3::NFS3ERR_SERVERFAULT, dir_wcc),
        (Err(stat), _) => err(stat, dir_wcc),
    }
}

fn make(c: &Ctx, dir: &nfs_fh3, f: impl FnOnce(&Export, &Attr, &Cred) -> Res<Attr>) -> Made {
    match c.dir_to_change(dir) {
        Ok((e, d, who)) => {
            let r = f(&e, &d, &who.cred);
            (r, Some((e, d)))
        }
        Err(stat) => (Err(stat), None),
    }
}

fn create(c: &Ctx, a: CREATE3args<'_>) -> CREATE3res {
    let name = a.where_.name.0.to_vec();
    let m = make(c, &a.where_.dir, |e, d, cred| {
        let existing = e.fs.lookup(d.ino, &name);
        match (&a.how, existing) {
            (createhow3::GUARDED(_), Ok(_)) => Err(nfsstat3::NFS3ERR_EXIST),
            (createhow3::UNCHECKED(s), Ok(t)) => {
                if t.kind != FileType::Regular {
                    return Err(nfsstat3::NFS3ERR_EXIST);
                }
                let mut s = s.clone();
                s.mode = set_mode3::None;
                apply_rest(e, t, cred, &s)
            }
            (createhow3::EXCLUSIVE(v), Ok(t)) => {
                // A retransmission of our own create succeeds again.
                let ns = verf_ns(v);
                if t.kind == FileType::Regular && t.atime_ns == ns && t.mtime_ns == ns {
                    Ok(t)
                } else {
                    Err(nfsstat3::NFS3ERR_EXIST)
                }
            }
            (how, Err(err)) if err.errno == libc::ENOENT => {
                let (mode, rest) = match how {
                    createhow3::UNCHECKED(s) | createhow3::GUARDED(s) => {
                        (mode_of(s, 0o644), Some(s))
                    }
                    createhow3::EXCLUSIVE(_) => (0o600, None),
                };
                let t =
                    e.fs.create(d.ino, &name, mode, cred)
                        .map_err(|e| stat_of(&e))?;
                match (how, rest) {
                    (createhow3::EXCLUSIVE(v), _) => {
                        let ns = verf_ns(v);
                        let set = SetAttr {
                            atime: Some(SetTime::Ns(ns)),
                            mtime: Some(SetTime::Ns(ns)),
                            ..SetAttr::default()
                        };
                        e.fs.setattr(t.ino, &set).map_err(|e| stat_of(&e))
                    }
                    (_, Some(s)) => apply_rest(e, t, cred, s),
                    (_, None) => Ok(t),
                }
            }
            (_, Err(err)) => Err(stat_of(&err)),
        }
    });
    made(
        m,
        |obj, obj_attributes, dir_wcc| {
            CREATE3res::Ok(CREATE3resok {
                obj,
                obj_attributes,
                dir_wcc,
            })
        },
        |stat, dir_wcc| CREATE3res::Err((stat, CREATE3resfail { dir_wcc })),
    )
}

fn mkdir(c: &Ctx, a: MKDIR3args<'_>) -> MKDIR3res {
    let m = make(c, &a.where_.dir, |e, d, cred| {
        let t =
            e.fs.mkdir(d.ino, &a.where_.name.0, mode_of(&a.attributes, 0o755), cred)
                .map_err(|e| stat_of(&e))?;
        apply_rest(e, t, cred, &a.attributes)
    });
    made(
        m,
        |obj, obj_attributes, dir_wcc| {
            MKDIR3res::Ok(MKDIR3resok {
                obj,
                obj_attributes,
                dir_wcc,
            })
        },
        |stat, dir_wcc| MKDIR3res::Err((stat, MKDIR3resfail { dir_wcc })),
    )
}

fn symlink(c: &Ctx, a: SYMLINK3args<'_>) -> SYMLINK3res {
    let m = make(c, &a.where_.dir, |e, d, cred| {
        e.fs.symlink(d.ino, &a.where_.name.0, &a.symlink.symlink_data.0, cred)
            .map_err(|e| stat_of(&e))
    });
    made(
        m,
        |obj, obj_attributes, dir_wcc| {
            SYMLINK3res::Ok(SYMLINK3resok {
                obj,
                obj_attributes,
                dir_wcc,
            })
        },
        |stat, dir_wcc| SYMLINK3res::Err((stat, SYMLINK3resfail { dir_wcc })),
    )
}

fn mknod(c: &Ctx, a: MKNOD3args<'_>) -> MKNOD3res {
    let m = make(c, &a.where_.dir, |e, d, cred| {
        let (kind, attrs, rdev) = match &a.what {
            mknoddata3::NF3CHR(dd) => (libc::S_IFCHR, &dd.dev_attributes, Some(&dd.spec)),
            mknoddata3::NF3BLK(dd) => (libc::S_IFBLK, &dd.dev_attributes, Some(&dd.spec)),
            mknoddata3::NF3SOCK(s) => (libc::S_IFSOCK, s, None),
            mknoddata3::NF3FIFO(s) => (libc::S_IFIFO, s, None),
            mknoddata3::default => return Err(nfsstat3::NFS3ERR_BADTYPE),
        };
        // Device nodes need CAP_MKNOD on Linux: root only.
        if rdev.is_some() && cred.uid != 0 {
            return Err(nfsstat3::NFS3ERR_PERM);
        }
        let rdev = rdev.map_or(0, |s| libc::makedev(s.specdata1, s.specdata2) as u64);
        let t =
            e.fs.mknod(
                d.ino,
                &a.where_.name.0,
                kind | mode_of(attrs, 0o644),
                rdev,
                cred,
            )
            .map_err(|e| stat_of(&e))?;
        apply_rest(e, t, cred, attrs)
    });
    made(
        m,
        |obj, obj_attributes, dir_wcc| {
            MKNOD3res::Ok(MKNOD3resok {
                obj,
                obj_attributes,
                dir_wcc,
            })
        },
        |stat, dir_wcc| MKNOD3res::Err((stat, MKNOD3resfail { dir_wcc })),
    )
}

fn unlink_or_rmdir(c: &Ctx, a: &diropargs3<'_>, dir_only: bool) -> (Res<()>, wcc_data) {
    let (e, d, who) = match c.dir_to_change(&a.dir) {
        Ok(x) => x,
        Err(stat) => return (Err(stat), wcc_data::default()),
    };
    let r = c.sticky_ok(&e, &d, &a.name.0, &who.cred).and_then(|()| {
        if dir_only {
            e.fs.rmdir(d.ino, &a.name.0)
        } else {
            e.fs.unlink(d.ino, &a.name.0)
        }
        .map_err(|e| stat_of(&e))
    });
    (r, wcc(&e, &d))
}

fn remove(c: &Ctx, a: REMOVE3args<'_>) -> REMOVE3res {
    match unlink_or_rmdir(c, &a.object, false) {
        (Ok(()), dir_wcc) => REMOVE3res::Ok(REMOVE3resok { dir_wcc }),
        (Err(stat), dir_wcc) => REMOVE3res::Err((stat, REMOVE3resfail { dir_wcc })),
    }
}

fn rmdir(c: &Ctx, a: RMDIR3args<'_>) -> RMDIR3res {
    match unlink_or_rmdir(c, &a.object, true) {
        (Ok(()), dir_wcc) => RMDIR3res::Ok(RMDIR3resok { dir_wcc }),
        (Err(stat), dir_wcc) => RMDIR3res::Err((stat, RMDIR3resfail { dir_wcc })),
    }
}

fn rename(c: &Ctx, a: RENAME3args<'_, '_>) -> RENAME3res {
    let from = c.dir_to_change(&a.from.dir);
    let to = c.dir_to_change(&a.to.dir);
    let (fe, fd, who, te, td) = match (from, to) {
        (Ok((fe, fd, who)), Ok((te, td, _))) => (fe, fd, who, te, td),
        (Err(stat), _) | (_, Err(stat)) => {
            return RENAME3res::Err((stat, RENAME3resfail::default()))
        }
    };
    let r = if !Arc::ptr_eq(&fe, &te) {
        Err(nfsstat3::NFS3ERR_XDEV)
    } else {
        c.sticky_ok(&fe, &fd, &a.from.name.0, &who.cred)
            .and_then(|()| c.sticky_ok(&te, &td, &a.to.name.0, &who.cred))
            .and_then(|()| {
                fe.fs
                    .rename(
                        fd.ino,
                        &a.from.name.0,
                        td.ino,
                        &a.to.name.0,
                        posix::RenameFlags::default(),
                    )
                    .map_err(|e| stat_of(&e))
            })
    };
    let (fromdir_wcc, todir_wcc) = (wcc(&fe, &fd), wcc(&te, &td));
    match r {
        Ok(()) => RENAME3res::Ok(RENAME3resok {
            fromdir_wcc,
            todir_wcc,
        }),
        Err(stat) => RENAME3res::Err((
            stat,
            RENAME3resfail {
                fromdir_wcc,
                todir_wcc,
            },
        )),
    }
}

fn link(c: &Ctx, a: LINK3args<'_>) -> LINK3res {
    let (fe, f, _) = match c.file(&a.file) {
        Ok(x) => x,
        Err(stat) => {
            return LINK3res::Err((
                stat,
                LINK3resfail {
                    file_attributes: post_op_attr::None,
                    linkdir_wcc: wcc_data::default(),
                },
            ))
        }
    };
    let (de, d, _) = match c.dir_to_change(&a.link.dir) {
        Ok(x) => x,
        Err(stat) => {
            return LINK3res::Err((
                stat,
                LINK3resfail {
                    file_attributes: post_op_attr::Some(fattr(&fe, &f)),
                    linkdir_wcc: wcc_data::default(),
                },
            ))
        }
    };
    let r = if !Arc::ptr_eq(&fe, &de) {
        Err(nfsstat3::NFS3ERR_XDEV)
    } else {
        fe.fs
            .link(f.ino, d.ino, &a.link.name.0)
            .map_err(|e| stat_of(&e))
    };
    let (file_attributes, linkdir_wcc) = (post(&fe, f.ino), wcc(&de, &d));
    match r {
        Ok(_) => LINK3res::Ok(LINK3resok {
            file_attributes,
            linkdir_wcc,
        }),
        Err(stat) => LINK3res::Err((
            stat,
            LINK3resfail {
                file_attributes,
                linkdir_wcc,
            },
        )),
    }
}

/// Entries after `cookie`, at most `limit` (posix cookies: name hashes,
/// valid for ever, so the cookie verifier is always zero).
fn entries(
    e: &Export,
    d: &Attr,
    cred: &Cred,
    cookie: u64,
    limit: usize,
) -> Res<Vec<posix::DirEntry>> {
    if d.kind != FileType::Directory {
        return Err(nfsstat3::NFS3ERR_NOTDIR);
    }
    if !Fs::access(d, cred, R) {
        return Err(nfsstat3::NFS3ERR_ACCES);
    }
    e.fs.readdir(d.ino, cookie, limit)
        .map_err(|err| match err.errno {
            libc::EINVAL => nfsstat3::NFS3ERR_BAD_COOKIE,
            _ => stat_of(&err),
        })
}

/// XDR size of a name (length word and padding).
fn name_size(n: &[u8]) -> usize {
    4 + n.len().div_ceil(4) * 4
}

fn readdir(c: &Ctx, a: READDIR3args) -> READDIR3res<'static> {
    let (e, d, who) = match c.file(&a.dir) {
        Ok(x) => x,
        Err(stat) => return READDIR3res::Err((stat, READDIR3resfail::default())),
    };
    let dir_attributes = post_op_attr::Some(fattr(&e, &d));
    // Header, status, attributes, verifier, list end and eof.
    let budget = (a.count.min(IO_MAX) as usize).saturating_sub(140);
    if budget < 64 {
        return READDIR3res::Err((
            nfsstat3::NFS3ERR_TOOSMALL,
            READDIR3resfail { dir_attributes },
        ));
    }
    let limit = (budget / 24).clamp(1, 4096);
    let list = match entries(&e, &d, &who.cred, a.cookie, limit) {
        Ok(l) => l,
        Err(stat) => return READDIR3res::Err((stat, READDIR3resfail { dir_attributes })),
    };
    let fetched = list.len();
    let (mut used, mut out) = (0, Vec::new());
    for ent in list {
        let size = 4 + 8 + name_size(&ent.name) + 8;
        if used + size > budget {
            break;
        }
        used += size;
        out.push(entry3 {
            fileid: ent.attr.ino,
            name: filename3(Opaque::owned(ent.name)),
            cookie: ent.cookie,
        });
    }
    if out.is_empty() && fetched > 0 {
        return READDIR3res::Err((
            nfsstat3::NFS3ERR_TOOSMALL,
            READDIR3resfail { dir_attributes },
        ));
    }
    let eof = out.len() == fetched && fetched < limit;
    READDIR3res::Ok(READDIR3resok {
        dir_attributes,
        cookieverf: cookieverf3([0; 8]),
        reply: dirlist3 {
            entries: List(out),
            eof,
        },
    })
}

fn readdirplus(c: &Ctx, a: READDIRPLUS3args) -> READDIRPLUS3res<'static> {
    let (e, d, who) = match c.file(&a.dir) {
        Ok(x) => x,
        Err(stat) => return READDIRPLUS3res::Err((stat, READDIRPLUS3resfail::default())),
    };
    let dir_attributes = post_op_attr::Some(fattr(&e, &d));
    let max = (a.maxcount.min(IO_MAX) as usize).saturating_sub(140);
    let dircount = a.dircount as usize;
    if max < 256 {
        return READDIRPLUS3res::Err((
            nfsstat3::NFS3ERR_TOOSMALL,
            READDIRPLUS3resfail { dir_attributes },
        ));
    }
    let limit = (max / 160).min(dircount.max(512) / 24).clamp(1, 4096);
    let list = match entries(&e, &d, &who.cred, a.cookie, limit) {
        Ok(l) => l,
        Err(stat) => return READDIRPLUS3res::Err((stat, READDIRPLUS3resfail { dir_attributes })),
    };
    let fetched = list.len();
    let (mut used, mut dirused, mut out) = (0, 0, Vec::new());
    for ent in list {
        let entry = entryplus3 {
            fileid: ent.attr.ino,
            cookie: ent.cookie,
            name_attributes: post_op_attr::Some(fattr(&e, &ent.attr)),
            name_handle: post_op_fh3::Some(fh(&e, ent.attr.ino, ent.attr.generation)),
            name: filename3(Opaque::owned(ent.name)),
        };
        let dsize = 8 + 4 + entry.name.0.packed_size() + 8;
        let size = 4 + entry.packed_size();
        // dircount 0 from some clients means "no preference".
        if used + size > max || (dircount > 0 && dirused + dsize > dircount) {
            break;
        }
        used += size;
        dirused += dsize;
        out.push(entry);
    }
    if out.is_empty() && fetched > 0 {
        return READDIRPLUS3res::Err((
            nfsstat3::NFS3ERR_TOOSMALL,
            READDIRPLUS3resfail { dir_attributes },
        ));
    }
    let eof = out.len() == fetched && fetched < limit;
    READDIRPLUS3res::Ok(READDIRPLUS3resok {
        dir_attributes,
        cookieverf: cookieverf3([0; 8]),
        reply: dirlistplus3 {
            entries: List(out),
            eof,
        },
    })
}

fn fsstat(c: &Ctx, a: FSSTAT3args) -> FSSTAT3res {
    let (e, at, _) = match c.file(&a.fsroot) {
        Ok(x) => x,
        Err(stat) => return FSSTAT3res::Err((stat, FSSTAT3resfail::default())),
    };
    let obj_attributes = post_op_attr::Some(fattr(&e, &at));
    match e.fs.statfs() {
        Ok(s) => {
            let bs = u64::from(s.block_size);
            FSSTAT3res::Ok(FSSTAT3resok {
                obj_attributes,
                tbytes: s.blocks.saturating_mul(bs),
                fbytes: s.blocks_free.saturating_mul(bs),
                abytes: s.blocks_free.saturating_mul(bs),
                tfiles: s.files,
                ffiles: s.files_free,
                afiles: s.files_free,
                invarsec: 0,
            })
        }
        Err(err) => FSSTAT3res::Err((stat_of(&err), FSSTAT3resfail { obj_attributes })),
    }
}

fn fsinfo(c: &Ctx, a: FSINFO3args) -> FSINFO3res {
    let (e, at, _) = match c.file(&a.fsroot) {
        Ok(x) => x,
        Err(stat) => return FSINFO3res::Err((stat, FSINFO3resfail::default())),
    };
    FSINFO3res::Ok(FSINFO3resok {
        obj_attributes: post_op_attr::Some(fattr(&e, &at)),
        rtmax: IO_MAX,
        rtpref: IO_MAX,
        rtmult: 4096,
        wtmax: IO_MAX,
        wtpref: IO_MAX,
        wtmult: 4096,
        dtpref: 64 << 10,
        maxfilesize: dataset::objects::MAX_OBJECT_SIZE,
        time_delta: nfstime3 {
            seconds: 0,
            nseconds: 1,
        },
        properties: FSF3_LINK | FSF3_SYMLINK | FSF3_HOMOGENEOUS | FSF3_CANSETTIME,
    })
}

fn pathconf(c: &Ctx, a: PATHCONF3args) -> PATHCONF3res {
    let (e, at, _) = match c.file(&a.object) {
        Ok(x) => x,
        Err(stat) => return PATHCONF3res::Err((stat, PATHCONF3resfail::default())),
    };
    let insensitive =
        e.fs.objects()
            .property("casesensitivity")
            .is_ok_and(|v| v != "sensitive");
    PATHCONF3res::Ok(PATHCONF3resok {
        obj_attributes: post_op_attr::Some(fattr(&e, &at)),
        linkmax: posix::LINK_MAX,
        name_max: posix::NAME_MAX as u32,
        no_trunc: true,
        chown_restricted: true,
        case_insensitive: insensitive,
        case_preserving: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_bad_ones_are_badhandle() {
        let mut b = vec![FH_VERSION, 0, 0, 0];
        for v in [7u64, 3, 42, 9] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(parse_fh(&b), Ok([7, 3, 42, 9]));
        assert_eq!(parse_fh(&b[..20]), Err(nfsstat3::NFS3ERR_BADHANDLE));
        b[0] = 9;
        assert_eq!(parse_fh(&b), Err(nfsstat3::NFS3ERR_BADHANDLE));
    }
}
