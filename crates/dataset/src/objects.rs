//! The object layer (ZFS's DMU): a dataset is a set of numbered objects,
//! each with its own blocks, block size and versioned attributes, and
//! directories of names that point at objects. Volumes, buckets and
//! filesystems all live here; front ends call [`ObjectSet`] and never touch
//! the block map.
//!
//! Every change is one [`ObjectOp`], applied to the open txg and appended to
//! the intent log under one lock, so a txg holds all of an op or none of it
//! and replay after a crash redoes exactly the acknowledged ops.
//! [`ObjectSet::commit`] makes every op applied before it durable.
//!
//! Versioning is the block map's: an object's attributes are its block
//! [`ATTR_BLOCK`] (an embedded block pointer: no data block, checksummed in
//! the metadata store), and names are rows of the `names` table keyed by
//! birth txg. Snapshots, clones, rollback, diff and space work the same for
//! every kind.

use crate::blockmap::{self, block_addr, name_addr, Chain};
use crate::namerow::{target_of, NameLayout};
use crate::space::Class;
use crate::txg::{Dirty, ImportedPool, OpenTxg};
use crate::volume::{self, Op};
use crate::{DatasetKind, Error, ReadSegment, Result};
use intent_log::RecordKind;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A volume's data is this object of its dataset.
pub const VOLUME_OBJECT: u64 = 1;
/// The root directory of a bucket (its keys) or a filesystem (`/`).
pub const ROOT_DIR: u64 = 2;
/// Objects no name points at (new, or unlinked); removed at import.
pub const UNLINKED_SET: u64 = 3;
/// Ids the layer above may give its own fixed objects (created with
/// [`ObjectSet::create_fixed`]): `FIRST_LAYER_OBJECT..FIRST_DYNAMIC_OBJECT`.
pub const FIRST_LAYER_OBJECT: u64 = 16;
/// [`ObjectSet::create`] hands out ids from here up.
pub const FIRST_DYNAMIC_OBJECT: u64 = 64;
/// The block index that holds an object's attributes.
pub const ATTR_BLOCK: u64 = u64::MAX;
/// Largest payload of an object's attributes.
pub const MAX_PAYLOAD: usize = 64 << 10;
/// Longest name in a directory, bytes.
pub const MAX_NAME: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ObjectKind {
    /// Bytes: a volume's data, an S3 object, a regular file.
    File,
    /// Names pointing at other objects.
    Dir,
    /// A symbolic link (target in the data), a device, a FIFO: the layer above says which.
    Special,
}

/// Versioned attributes of one object (ZFS: the dnode and its bonus buffer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectAttrs {
    pub kind: ObjectKind,
    /// Bytes; reads past it are short.
    pub size: u64,
    /// Bytes per block (the dataset's recordsize when created); the last
    /// block is stored only as long as its data.
    pub blksz: u32,
    /// The txg the object was created in: with the id, names one
    /// incarnation (NFS file handles, S3 version ids).
    pub generation: u64,
    /// Names pointing at it; 0: it is in the unlinked set.
    pub nlink: u32,
    /// Nanoseconds since the Unix epoch.
    pub mtime_ns: u64,
    pub ctime_ns: u64,
    pub crtime_ns: u64,
    /// The layer above's own data (S3: content headers, ETag, user metadata;
    /// POSIX: mode, owner, xattrs), at most [`MAX_PAYLOAD`] bytes.
    pub payload: Vec<u8>,
}

/// One change to a dataset's objects: what is logged and replayed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObjectOp {
    Create {
        obj: u64,
        kind: ObjectKind,
        blksz: u32,
        /// The txg it is created in (filled in when first applied).
        generation: u64,
        time_ns: u64,
        payload: Vec<u8>,
    },
    Write {
        obj: u64,
        offset: u64,
        data: Vec<u8>,
        time_ns: u64,
    },
    Truncate {
        obj: u64,
        size: u64,
        time_ns: u64,
    },
    SetPayload {
        obj: u64,
        payload: Vec<u8>,
        time_ns: u64,
    },
    SetTimes {
        obj: u64,
        mtime_ns: Option<u64>,
        crtime_ns: Option<u64>,
        time_ns: u64,
    },
    /// `dir/name` -> `obj`, replacing what it pointed at (whose nlink drops).
    Link {
        dir: u64,
        name: String,
        obj: u64,
        time_ns: u64,
    },
    Unlink {
        dir: u64,
        name: String,
        time_ns: u64,
    },
    /// Frees an object with no names (nlink 0) and all its blocks.
    Remove {
        obj: u64,
    },
    /// Several attribute and name changes that happen together or not at
    /// all (a POSIX rename, mkdir with its `..`): one log record, one txg.
    /// Only ops without data blocks: no Write, no Truncate, no Remove of an
    /// object with a size, no nested batch.
    Batch(Vec<ObjectOp>),
}

/// Default of `[engine] embed_max`: the largest stored (compressed) block
/// kept in its metadata row instead of a data block (decision 0017 has the
/// measurement).
pub const EMBED_MAX: usize = 2048;
/// Embedding never goes beyond this, whatever the config says.
pub const EMBED_LIMIT: usize = 16 << 10;

/// Length of `data` without its trailing zeros, rounded up to 512 bytes.
pub(crate) fn trimmed_len(data: &[u8]) -> usize {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    end.div_ceil(512).saturating_mul(512).min(data.len())
}

/// Nanoseconds since the Unix epoch: the clock of every op's `time_ns`.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// The name an object has in the unlinked set: sorts by id.
fn unlinked_name(obj: u64) -> String {
    format!("{obj:016x}")
}

// ------------------------------------------------------------ encodings

/// A little-endian writer for the attribute and op encodings.
struct Enc(Vec<u8>);

impl Enc {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
}

struct Dec<'a>(&'a [u8], &'static str);

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(Error::Corrupt(format!("{}: truncated", self.1)));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
    fn bytes(&mut self) -> Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn string(&mut self) -> Result<String> {
        String::from_utf8(self.bytes()?.to_vec())
            .map_err(|_| Error::Corrupt(format!("{}: name is not UTF-8", self.1)))
    }
}

const ATTRS_VERSION: u8 = 1;

impl ObjectKind {
    fn code(self) -> u8 {
        match self {
            ObjectKind::File => 1,
            ObjectKind::Dir => 2,
            ObjectKind::Special => 3,
        }
    }
    fn from_code(c: u8) -> Result<ObjectKind> {
        Ok(match c {
            1 => ObjectKind::File,
            2 => ObjectKind::Dir,
            3 => ObjectKind::Special,
            _ => return Err(Error::Corrupt(format!("object kind {c}"))),
        })
    }
}

impl ObjectAttrs {
    /// `u8 version (1) | u8 kind | u64 size | u32 blksz | u64 generation |
    /// u32 nlink | u64 mtime | u64 ctime | u64 crtime | u32 len | payload`, LE.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc(Vec::with_capacity(57 + self.payload.len()));
        e.u8(ATTRS_VERSION)
            .u8(self.kind.code())
            .u64(self.size)
            .u32(self.blksz)
            .u64(self.generation)
            .u32(self.nlink)
            .u64(self.mtime_ns)
            .u64(self.ctime_ns)
            .u64(self.crtime_ns)
            .bytes(&self.payload);
        e.0
    }

    pub(crate) fn decode(b: &[u8]) -> Result<ObjectAttrs> {
        let mut d = Dec(b, "object attributes");
        let v = d.u8()?;
        if v != ATTRS_VERSION {
            return Err(Error::Corrupt(format!(
                "object attributes version {v} is not understood by this build"
            )));
        }
        Ok(ObjectAttrs {
            kind: ObjectKind::from_code(d.u8()?)?,
            size: d.u64()?,
            blksz: d.u32()?,
            generation: d.u64()?,
            nlink: d.u32()?,
            mtime_ns: d.u64()?,
            ctime_ns: d.u64()?,
            crtime_ns: d.u64()?,
            payload: d.bytes()?.to_vec(),
        })
    }
}

impl ObjectOp {
    /// The log payload: `u8 op | fields` (LE; byte strings length-prefixed).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut e = Enc(Vec::new());
        match self {
            ObjectOp::Create {
                obj,
                kind,
                blksz,
                generation,
                time_ns,
                payload,
            } => e
                .u8(1)
                .u64(*obj)
                .u8(kind.code())
                .u32(*blksz)
                .u64(*generation)
                .u64(*time_ns)
                .bytes(payload),
            ObjectOp::Write {
                obj,
                offset,
                data,
                time_ns,
            } => e.u8(2).u64(*obj).u64(*offset).u64(*time_ns).bytes(data),
            ObjectOp::Truncate { obj, size, time_ns } => e.u8(3).u64(*obj).u64(*size).u64(*time_ns),
            ObjectOp::SetPayload {
                obj,
                payload,
                time_ns,
            } => e.u8(4).u64(*obj).u64(*time_ns).bytes(payload),
            ObjectOp::SetTimes {
                obj,
                mtime_ns,
                crtime_ns,
                time_ns,
            } => e
                .u8(5)
                .u64(*obj)
                .u64(mtime_ns.unwrap_or(u64::MAX))
                .u64(crtime_ns.unwrap_or(u64::MAX))
                .u64(*time_ns),
            ObjectOp::Link {
                dir,
                name,
                obj,
                time_ns,
            } => e
                .u8(6)
                .u64(*dir)
                .bytes(name.as_bytes())
                .u64(*obj)
                .u64(*time_ns),
            ObjectOp::Unlink { dir, name, time_ns } => {
                e.u8(7).u64(*dir).bytes(name.as_bytes()).u64(*time_ns)
            }
            ObjectOp::Remove { obj } => e.u8(8).u64(*obj),
            ObjectOp::Batch(ops) => {
                e.u8(9).u32(ops.len() as u32);
                for op in ops {
                    e.bytes(&op.encode());
                }
                &mut e
            }
        };
        e.0
    }

    pub(crate) fn decode(b: &[u8]) -> Result<ObjectOp> {
        let mut d = Dec(b, "object op log record");
        let opt = |v: u64| (v != u64::MAX).then_some(v);
        Ok(match d.u8()? {
            1 => ObjectOp::Create {
                obj: d.u64()?,
                kind: ObjectKind::from_code(d.u8()?)?,
                blksz: d.u32()?,
                generation: d.u64()?,
                time_ns: d.u64()?,
                payload: d.bytes()?.to_vec(),
            },
            2 => ObjectOp::Write {
                obj: d.u64()?,
                offset: d.u64()?,
                time_ns: d.u64()?,
                data: d.bytes()?.to_vec(),
            },
            3 => ObjectOp::Truncate {
                obj: d.u64()?,
                size: d.u64()?,
                time_ns: d.u64()?,
            },
            4 => ObjectOp::SetPayload {
                obj: d.u64()?,
                time_ns: d.u64()?,
                payload: d.bytes()?.to_vec(),
            },
            5 => ObjectOp::SetTimes {
                obj: d.u64()?,
                mtime_ns: opt(d.u64()?),
                crtime_ns: opt(d.u64()?),
                time_ns: d.u64()?,
            },
            6 => ObjectOp::Link {
                dir: d.u64()?,
                name: d.string()?,
                obj: d.u64()?,
                time_ns: d.u64()?,
            },
            7 => ObjectOp::Unlink {
                dir: d.u64()?,
                name: d.string()?,
                time_ns: d.u64()?,
            },
            8 => ObjectOp::Remove { obj: d.u64()? },
            9 => {
                let n = d.u32()? as usize;
                // Each member is at least 5 bytes: a bad count cannot allocate much.
                let mut ops = Vec::with_capacity(n.min(d.0.len() / 5));
                for _ in 0..n {
                    let op = ObjectOp::decode(d.bytes()?)?;
                    if matches!(op, ObjectOp::Batch(_)) {
                        return Err(Error::Corrupt("nested object op batch".into()));
                    }
                    ops.push(op);
                }
                ObjectOp::Batch(ops)
            }
            k => return Err(Error::Corrupt(format!("object op {k}"))),
        })
    }

    /// The objects whose attributes it changes and the names it looks at.
    fn touches(&self, objs: &mut Vec<u64>, names: &mut Vec<(u64, String)>) {
        match self {
            ObjectOp::Create { .. } => {}
            ObjectOp::Write { obj, .. }
            | ObjectOp::Truncate { obj, .. }
            | ObjectOp::SetPayload { obj, .. }
            | ObjectOp::SetTimes { obj, .. }
            | ObjectOp::Remove { obj } => objs.push(*obj),
            ObjectOp::Link { dir, name, obj, .. } => {
                objs.extend([*obj, *dir]);
                names.push((*dir, name.clone()));
            }
            ObjectOp::Unlink { dir, name, .. } => {
                objs.push(*dir);
                names.push((*dir, name.clone()));
            }
            ObjectOp::Batch(ops) => {
                for op in ops {
                    op.touches(objs, names);
                }
            }
        }
    }
}

// ------------------------------------------------------------ reading

/// What one request sees of a dataset.
struct State {
    chain: Chain,
    /// A snapshot's txg: reads stop there and skip uncommitted changes.
    snapshot: Option<u64>,
    readonly: bool,
    recordsize: u32,
    /// Txg and time the dataset was created (the fixed directories' attributes).
    created: (u64, u64),
}

impl State {
    fn ds(&self) -> u64 {
        self.chain.data_id()
    }
    fn head(&self) -> bool {
        self.snapshot.is_none()
    }
}

/// Attributes of a fixed directory that was never changed: it exists from
/// the dataset's creation.
fn implicit_dir(obj: u64, created: (u64, u64)) -> Option<ObjectAttrs> {
    (obj == ROOT_DIR || obj == UNLINKED_SET).then(|| ObjectAttrs {
        kind: ObjectKind::Dir,
        size: 0,
        blksz: 0,
        generation: created.0,
        nlink: 1,
        mtime_ns: created.1 * 1_000_000_000,
        ctime_ns: created.1 * 1_000_000_000,
        crtime_ns: created.1 * 1_000_000_000,
        payload: Vec::new(),
    })
}

/// An object's attributes outside the open txg: the syncing txg (heads), then committed.
fn attrs_outside_open(p: &ImportedPool, st: &State, obj: u64) -> Result<Option<ObjectAttrs>> {
    let view = p.view()?;
    if st.head() {
        if let Some(d) = view
            .syncing
            .as_ref()
            .and_then(|s| s.blocks.get(&(st.ds(), obj, ATTR_BLOCK)))
        {
            return decode_dirty_attrs(d);
        }
    }
    match blockmap::resolve(&view.blocks, &st.chain, &block_addr(obj, ATTR_BLOCK))? {
        None => Ok(implicit_dir(obj, st.created)),
        Some(v) => {
            let bp = block::BlockPointer::decode(&v)
                .map_err(|e| Error::Corrupt(format!("object {obj} attributes: {e}")))?;
            let key = p.key_of(st.ds())?;
            let unseal = block::Unseal {
                key: key.as_deref(),
                object: obj,
                block: ATTR_BLOCK,
            };
            let bytes = block::read_block_keyed(&p.pool, &bp, Some(unseal))
                .map_err(|e| Error::Corrupt(format!("object {obj} attributes: {e}")))?;
            ObjectAttrs::decode(&bytes).map(Some)
        }
    }
}

fn decode_dirty_attrs(d: &Dirty) -> Result<Option<ObjectAttrs>> {
    match d {
        Dirty::Data(b) => ObjectAttrs::decode(b).map(Some),
        // Received raw and not committed yet: only its own receive writes
        // there, and it never reads attributes back.
        Dirty::Raw(_) => Err(Error::Busy(
            "object attributes are being received (raw)".into(),
        )),
        _ => Ok(None),
    }
}

/// The attributes as the open txg has them, if it changed them.
fn open_attrs(open: &OpenTxg, ds: u64, obj: u64) -> Option<Result<Option<ObjectAttrs>>> {
    open.dirty
        .get(&(ds, obj, ATTR_BLOCK))
        .map(decode_dirty_attrs)
}

/// A name's target outside the open txg.
fn lookup_outside_open(p: &ImportedPool, st: &State, dir: u64, name: &str) -> Result<Option<u64>> {
    let view = p.view()?;
    if st.head() {
        if let Some(t) = view
            .syncing
            .as_ref()
            .and_then(|s| s.names.get(&(st.ds(), dir, name.to_string())))
        {
            return Ok(*t);
        }
    }
    let layout = NameLayout::of(p, st.ds())?;
    blockmap::resolve(&view.blocks, &st.chain, &layout.addr(dir, name))?
        .map(|v| layout.target(dir, name, &v))
        .transpose()
}

// ------------------------------------------------------------ applying

/// What an op needs to know before it takes the open txg's lock.
struct Prepared {
    /// (object, attributes outside the open txg) of the objects it changes.
    attrs: Vec<(u64, Option<ObjectAttrs>)>,
    /// Targets of the names it looks at, outside the open txg (link, unlink).
    targets: Vec<((u64, String), Option<u64>)>,
}

impl Prepared {
    /// What `dir/name` points at: the open txg's entry, else the prepared one.
    fn target(&self, open: &OpenTxg, ds: u64, dir: u64, name: &str) -> Option<u64> {
        match open.names.get(&(ds, dir, name.to_string())) {
            Some(t) => *t,
            None => self
                .targets
                .iter()
                .find(|((d, n), _)| *d == dir && n == name)
                .and_then(|(_, t)| *t),
        }
    }

    /// The attributes to change, newest first: the open txg's, else the prepared ones.
    fn current(&self, open: &OpenTxg, ds: u64, obj: u64) -> Result<Option<ObjectAttrs>> {
        if let Some(a) = open_attrs(open, ds, obj) {
            return a;
        }
        Ok(self
            .attrs
            .iter()
            .find(|(o, _)| *o == obj)
            .and_then(|(_, a)| a.clone()))
    }
}

fn put_attrs(open: &mut OpenTxg, ds: u64, obj: u64, a: &ObjectAttrs) {
    open.dirty
        .insert((ds, obj, ATTR_BLOCK), Dirty::Data(Arc::new(a.encode())));
}

/// nlink + `delta` on `obj`, moving it into or out of the unlinked set at 0.
fn relink(open: &mut OpenTxg, ds: u64, obj: u64, mut a: ObjectAttrs, delta: i32, t: u64) {
    let before = a.nlink;
    a.nlink = (a.nlink as i64 + delta as i64).max(0) as u32;
    a.ctime_ns = t;
    let key = (ds, UNLINKED_SET, unlinked_name(obj));
    if before == 0 && a.nlink > 0 {
        open.names.insert(key, None);
    } else if before > 0 && a.nlink == 0 {
        open.names.insert(key, Some(obj));
    }
    put_attrs(open, ds, obj, &a);
}

/// Applies `op` to dataset `ds` (a head): its block changes, attributes
/// and names under one hold of the open txg, then logs it (`log`) in the
/// same hold. Returns the log sequence number (0 unlogged). `class` admits
/// its new bytes against the space budget; `None` for replay.
fn apply_op(
    p: &ImportedPool,
    ds: u64,
    chain_st: &State,
    op: &ObjectOp,
    log: bool,
    class: Option<Class>,
) -> Result<u64> {
    let st = chain_st;
    // Objects whose attributes it changes, and the names it looks at.
    let (mut objs, mut names) = (Vec::new(), Vec::new());
    op.touches(&mut objs, &mut names);
    let mut targets = Vec::with_capacity(names.len());
    for (dir, n) in names {
        let open = p.open.lock().names.get(&(ds, dir, n.clone())).copied();
        let t = match open {
            Some(t) => t,
            None => lookup_outside_open(p, st, dir, &n)?,
        };
        targets.push(((dir, n), t));
    }
    let mut attrs: Vec<(u64, Option<ObjectAttrs>)> = Vec::new();
    for o in objs
        .iter()
        .copied()
        .chain(targets.iter().filter_map(|(_, t)| *t))
    {
        if attrs.iter().any(|(x, _)| *x == o) {
            continue;
        }
        let open = p.open.lock().dirty.get(&(ds, o, ATTR_BLOCK)).cloned();
        let a = match open {
            Some(d) => decode_dirty_attrs(&d)?,
            None => attrs_outside_open(p, st, o)?,
        };
        attrs.push((o, a));
    }
    let prep = Prepared { attrs, targets };
    let missing = |o: u64| Error::NotFound(format!("object {o}"));
    let get = |o: u64| {
        prep.attrs
            .iter()
            .find(|(x, _)| *x == o)
            .and_then(|(_, a)| a.clone())
    };
    // The block part of the op, checked against the prepared attributes.
    let (bs, offset, block_op) = match op {
        ObjectOp::Write {
            obj, offset, data, ..
        } => {
            let a = get(*obj).ok_or_else(|| missing(*obj))?;
            if a.kind != ObjectKind::File {
                return Err(Error::InvalidArgument(format!(
                    "object {obj} is not a file"
                )));
            }
            (a.blksz, *offset, Some(Op::Write(data)))
        }
        ObjectOp::Truncate { obj, size, .. } => {
            let a = get(*obj).ok_or_else(|| missing(*obj))?;
            let bsz = a.blksz.max(1) as u64;
            let end = a.size.div_ceil(bsz) * bsz;
            let zero = (*size < a.size).then(|| Op::Zero {
                len: end - size,
                allocate: false,
            });
            (a.blksz, *size, zero)
        }
        ObjectOp::Remove { obj } => {
            let a = get(*obj).ok_or_else(|| missing(*obj))?;
            if a.nlink > 0 {
                return Err(Error::Busy(format!(
                    "object {obj} still has {} name(s)",
                    a.nlink
                )));
            }
            let bsz = a.blksz.max(1) as u64;
            let len = a.size.div_ceil(bsz) * bsz;
            let zero = (len > 0).then_some(Op::Zero {
                len,
                allocate: false,
            });
            (a.blksz, 0, zero)
        }
        ObjectOp::Link { obj, dir, .. } => {
            get(*obj).ok_or_else(|| missing(*obj))?;
            match get(*dir) {
                Some(d) if d.kind == ObjectKind::Dir => {}
                Some(_) => {
                    return Err(Error::InvalidArgument(format!(
                        "object {dir} is not a directory"
                    )))
                }
                None => return Err(missing(*dir)),
            }
            (0, 0, None)
        }
        ObjectOp::SetPayload { obj, payload, .. } => {
            get(*obj).ok_or_else(|| missing(*obj))?;
            if payload.len() > MAX_PAYLOAD {
                return Err(Error::InvalidArgument(format!(
                    "object payload of {} bytes (at most {MAX_PAYLOAD})",
                    payload.len()
                )));
            }
            (0, 0, None)
        }
        ObjectOp::SetTimes { obj, .. } => {
            get(*obj).ok_or_else(|| missing(*obj))?;
            (0, 0, None)
        }
        ObjectOp::Create { .. } | ObjectOp::Unlink { .. } => (0, 0, None),
        ObjectOp::Batch(ops) => {
            for o in ops {
                match o {
                    ObjectOp::Write { .. } | ObjectOp::Truncate { .. } | ObjectOp::Batch(_) => {
                        return Err(Error::InvalidArgument(
                            "a batch of object ops holds no data changes".into(),
                        ))
                    }
                    ObjectOp::Remove { obj } if get(*obj).is_some_and(|a| a.size > 0) => {
                        return Err(Error::InvalidArgument(format!(
                            "object {obj} has data: remove it on its own, not in a batch"
                        )))
                    }
                    _ => {}
                }
            }
            (0, 0, None)
        }
    };
    let obj_of_blocks = objs.first().copied().unwrap_or(0);
    let block_op = block_op.unwrap_or(Op::Zero {
        len: 0,
        allocate: false,
    });
    let mut outcome: Result<()> = Ok(());
    // Looked up before `apply` takes the open txg's lock (see `log_key`).
    let key = if log { p.log_key(ds) } else { None };
    let seq = volume::apply(
        p,
        ds,
        obj_of_blocks,
        bs.max(1),
        offset,
        block_op,
        true,
        class,
        |open| match change_all(open, ds, &prep, op) {
            // Logged as applied: creates carry the generation they got, so replay gives them the same.
            Ok(applied) if log => {
                let plain = applied.encode();
                // Names and payloads of an encrypted dataset are sealed (decision 0026).
                let sealed = ImportedPool::seal_log(
                    key.as_deref(),
                    ds,
                    RecordKind::ObjectOp as u8,
                    0,
                    &plain,
                );
                p.log.append(
                    RecordKind::ObjectOp,
                    ds,
                    0,
                    0,
                    sealed.as_deref().unwrap_or(&plain),
                )
            }
            Ok(_) => 0,
            Err(e) => {
                outcome = Err(e);
                0
            }
        },
    )?;
    outcome.map(|()| seq)
}

/// [`change_metadata`] for one op or each op of a batch, all or nothing: a
/// batch member that fails puts back what the ones before it changed.
/// Returns the op as applied (creates with their generation).
fn change_all(open: &mut OpenTxg, ds: u64, prep: &Prepared, op: &ObjectOp) -> Result<ObjectOp> {
    let with_generation = |op: &ObjectOp, g: Option<u64>| {
        let mut c = op.clone();
        if let (ObjectOp::Create { generation, .. }, Some(g)) = (&mut c, g) {
            *generation = g;
        }
        c
    };
    let ObjectOp::Batch(ops) = op else {
        return change_metadata(open, ds, prep, op).map(|g| with_generation(op, g));
    };
    // What the batch may change: attributes and unlinked-set entries of the
    // objects it touches (and of names' targets), the names themselves.
    let (mut objs, mut names) = (Vec::new(), Vec::new());
    op.touches(&mut objs, &mut names);
    for o in ops {
        if let ObjectOp::Create { obj, .. } = o {
            objs.push(*obj);
        }
    }
    objs.extend(prep.targets.iter().filter_map(|(_, t)| *t));
    let mut name_keys: Vec<(u64, u64, String)> =
        names.into_iter().map(|(d, n)| (ds, d, n)).collect();
    name_keys.extend(objs.iter().map(|o| (ds, UNLINKED_SET, unlinked_name(*o))));
    let saved_attrs: Vec<_> = objs
        .iter()
        .map(|o| {
            (
                (ds, *o, ATTR_BLOCK),
                open.dirty.get(&(ds, *o, ATTR_BLOCK)).cloned(),
            )
        })
        .collect();
    let saved_names: Vec<_> = name_keys
        .into_iter()
        .map(|k| {
            let v = open.names.get(&k).copied();
            (k, v)
        })
        .collect();
    let saved_next = open.next_object.get(&ds).copied();
    let mut applied = Vec::with_capacity(ops.len());
    for o in ops {
        match change_metadata(open, ds, prep, o) {
            Ok(g) => applied.push(with_generation(o, g)),
            Err(e) => {
                for (k, v) in saved_attrs {
                    match v {
                        Some(v) => open.dirty.insert(k, v),
                        None => open.dirty.remove(&k),
                    };
                }
                for (k, v) in saved_names {
                    match v {
                        Some(v) => open.names.insert(k, v),
                        None => open.names.remove(&k),
                    };
                }
                match saved_next {
                    Some(n) => open.next_object.insert(ds, n),
                    None => open.next_object.remove(&ds),
                };
                return Err(e);
            }
        }
    }
    Ok(ObjectOp::Batch(applied))
}

/// The attribute and name part of `op`, under the open txg's lock. Returns
/// the generation a created object got.
fn change_metadata(
    open: &mut OpenTxg,
    ds: u64,
    prep: &Prepared,
    op: &ObjectOp,
) -> Result<Option<u64>> {
    let cur = |open: &OpenTxg, o: u64| -> Result<ObjectAttrs> {
        prep.current(open, ds, o)?
            .ok_or_else(|| Error::NotFound(format!("object {o}")))
    };
    // An attribute change: the object's attributes as of now, changed, ctime set.
    let update = |open: &mut OpenTxg, obj: u64, t: u64, f: &dyn Fn(&mut ObjectAttrs)| {
        let mut a = cur(open, obj)?;
        f(&mut a);
        a.ctime_ns = t;
        put_attrs(open, ds, obj, &a);
        Ok::<(), Error>(())
    };
    let txg = open.txg;
    match op {
        ObjectOp::Create {
            obj,
            kind,
            blksz,
            generation,
            time_ns,
            payload,
        } => {
            let generation = if *generation == 0 { txg } else { *generation };
            let a = ObjectAttrs {
                kind: *kind,
                size: 0,
                blksz: *blksz,
                generation,
                nlink: 0,
                mtime_ns: *time_ns,
                ctime_ns: *time_ns,
                crtime_ns: *time_ns,
                payload: payload.clone(),
            };
            put_attrs(open, ds, *obj, &a);
            if *obj >= FIRST_DYNAMIC_OBJECT {
                let next = open.next_object.entry(ds).or_insert(FIRST_DYNAMIC_OBJECT);
                *next = (*next).max(*obj + 1);
            }
            // New objects start in the unlinked set, except fixed ones (named by their id).
            if *obj >= FIRST_DYNAMIC_OBJECT {
                open.names
                    .insert((ds, UNLINKED_SET, unlinked_name(*obj)), Some(*obj));
            }
            return Ok(Some(generation));
        }
        ObjectOp::Write {
            obj,
            offset,
            data,
            time_ns,
        } => update(open, *obj, *time_ns, &|a| {
            a.size = a.size.max(*offset + data.len() as u64);
            a.mtime_ns = *time_ns;
        })?,
        ObjectOp::Truncate { obj, size, time_ns } => update(open, *obj, *time_ns, &|a| {
            a.size = *size;
            a.mtime_ns = *time_ns;
        })?,
        ObjectOp::SetPayload {
            obj,
            payload,
            time_ns,
        } => update(open, *obj, *time_ns, &|a| a.payload.clone_from(payload))?,
        ObjectOp::SetTimes {
            obj,
            mtime_ns,
            crtime_ns,
            time_ns,
        } => update(open, *obj, *time_ns, &|a| {
            a.mtime_ns = mtime_ns.unwrap_or(a.mtime_ns);
            a.crtime_ns = crtime_ns.unwrap_or(a.crtime_ns);
        })?,
        ObjectOp::Link {
            dir,
            name,
            obj,
            time_ns,
        } => {
            let key = (ds, *dir, name.clone());
            let before = prep.target(open, ds, *dir, name);
            if before == Some(*obj) {
                return Ok(None);
            }
            let a = cur(open, *obj)?;
            relink(open, ds, *obj, a, 1, *time_ns);
            if let Some(old) = before {
                if let Ok(a) = cur(open, old) {
                    relink(open, ds, old, a, -1, *time_ns);
                }
            }
            open.names.insert(key, Some(*obj));
            touch_dir(open, ds, prep, *dir, *time_ns);
        }
        ObjectOp::Unlink { dir, name, time_ns } => {
            let key = (ds, *dir, name.clone());
            let before = prep.target(open, ds, *dir, name);
            let Some(old) = before else {
                return Err(Error::NotFound(format!("name '{name}' in directory {dir}")));
            };
            if let Ok(a) = cur(open, old) {
                relink(open, ds, old, a, -1, *time_ns);
            }
            open.names.insert(key, None);
            touch_dir(open, ds, prep, *dir, *time_ns);
        }
        ObjectOp::Remove { obj } => {
            let a = cur(open, *obj)?;
            if a.nlink > 0 {
                return Err(Error::Busy(format!(
                    "object {obj} still has {} name(s)",
                    a.nlink
                )));
            }
            open.dirty.insert((ds, *obj, ATTR_BLOCK), Dirty::Hole);
            open.names
                .insert((ds, UNLINKED_SET, unlinked_name(*obj)), None);
        }
        // change_all takes batches apart.
        ObjectOp::Batch(_) => return Err(Error::InvalidArgument("nested object op batch".into())),
    }
    Ok(None)
}

/// A directory's mtime follows its entries (only when it is changed anyway
/// or was read: the fixed directories stay implicit until then).
fn touch_dir(open: &mut OpenTxg, ds: u64, prep: &Prepared, dir: u64, t: u64) {
    if let Ok(Some(mut a)) = prep.current(open, ds, dir) {
        a.mtime_ns = t;
        a.ctime_ns = t;
        put_attrs(open, ds, dir, &a);
    }
}

/// Redoes an op from the intent log after a crash (already admitted).
pub(crate) fn replay(p: &ImportedPool, ds: u64, payload: &[u8]) -> Result<()> {
    let op = ObjectOp::decode(payload)?;
    let st = {
        let datasets = p.datasets.read();
        let Some(rec) = datasets.values().find(|r| r.id == ds) else {
            tracing::warn!(
                dataset = ds,
                "log record for a dataset that no longer exists; skipped"
            );
            return Ok(());
        };
        state_of(&datasets, rec)
    };
    match apply_op(p, ds, &st, &op, false, None) {
        // An op that no longer applies (its object went in a later
        // committed txg) changes nothing; a real inconsistency is an error.
        Err(Error::NotFound(what)) => {
            tracing::debug!(dataset = ds, %what, "replayed object op found nothing to change");
            Ok(())
        }
        r => r.map(|_| ()),
    }
}

/// Removes the objects left in the unlinked set of every bucket and
/// filesystem (uploads interrupted by a crash, files unlinked while open),
/// as ZFS drains its unlinked set at mount. Runs at import, before anyone
/// opens the pool. Returns how many were removed.
pub(crate) fn drain_unlinked(p: &ImportedPool) -> Result<u64> {
    // Encrypted datasets without their key wait for load-key (crate::crypt).
    drain_unlinked_where(p, |datasets, id| crate::crypt::key_loaded(p, datasets, id))
}

/// [`drain_unlinked`] of the datasets `which` selects.
pub(crate) fn drain_unlinked_where(
    p: &ImportedPool,
    which: impl Fn(&BTreeMap<String, crate::props::DatasetRecord>, u64) -> bool,
) -> Result<u64> {
    let sets: Vec<(u64, State)> = {
        let datasets = p.datasets.read();
        datasets
            .values()
            .filter(|r| {
                matches!(r.kind, DatasetKind::Bucket | DatasetKind::Filesystem) && r.next_object > 0
            })
            .filter(|r| which(&datasets, r.id))
            .map(|r| (r.id, state_of(&datasets, r)))
            .collect()
    };
    let mut removed = 0;
    for (ds, st) in sets {
        loop {
            let batch = list_names(p, &st, UNLINKED_SET, "", None, 1024)?;
            if batch.is_empty() {
                break;
            }
            for (_, obj) in batch {
                match apply_op(p, ds, &st, &ObjectOp::Remove { obj }, false, None) {
                    Ok(_) => removed += 1,
                    Err(e) => {
                        // Unremovable (linked after all): leave the set, keep the object.
                        tracing::warn!(dataset = ds, obj, error = %e, "unlinked object not removed");
                        let mut open = p.open.lock();
                        open.names
                            .insert((ds, UNLINKED_SET, unlinked_name(obj)), None);
                    }
                }
            }
        }
    }
    Ok(removed)
}

fn state_of(
    datasets: &BTreeMap<String, crate::props::DatasetRecord>,
    rec: &crate::props::DatasetRecord,
) -> State {
    let lineage = crate::txg::lineage(datasets, rec);
    let head = if rec.is_snapshot() {
        datasets
            .values()
            .find(|r| r.id == rec.data_id())
            .unwrap_or(rec)
    } else {
        rec
    };
    State {
        chain: Chain::of(rec, datasets.values()),
        snapshot: rec.is_snapshot().then_some(rec.created_txg),
        readonly: rec.is_snapshot() || lineage.readonly(),
        recordsize: lineage.recordsize(),
        created: (head.created_txg, head.creation),
    }
}

/// Names of `dir` starting with `prefix`, after `after`, at most `limit`, in
/// byte order: the committed rows merged with the syncing and open txgs'.
fn list_names(
    p: &ImportedPool,
    st: &State,
    dir: u64,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, u64)>> {
    let ds = st.ds();
    // Start at the prefix, or just after `after` when that is further on.
    let start = match after {
        Some(a) if a >= prefix => format!("{a}\0"),
        _ => prefix.to_string(),
    };
    let in_range = |n: &str| n >= start.as_str() && n.starts_with(prefix);
    // Uncommitted names: the syncing txg's, then the open txg's over them.
    let mut overlay: BTreeMap<String, Option<u64>> = BTreeMap::new();
    let view = p.view()?;
    if st.head() {
        let lo = (ds, dir, start.clone());
        let hi = (ds, dir.saturating_add(1), String::new());
        if let Some(s) = view.syncing.as_ref() {
            for ((_, _, n), t) in s.names.range(lo.clone()..hi.clone()) {
                if !n.starts_with(prefix) {
                    break;
                }
                overlay.insert(n.clone(), *t);
            }
        }
        let open = p.open.lock();
        for ((_, _, n), t) in open.names.range(lo..hi) {
            if !n.starts_with(prefix) {
                break;
            }
            overlay.insert(n.clone(), *t);
        }
    }
    let layout = NameLayout::of(p, ds)?;
    if !layout.sorted() {
        // Sealed names: rows are in hash order (decision 0035).
        return crate::namerow::list_sealed(
            p, &st.chain, &layout, dir, &start, prefix, overlay, limit,
        );
    }
    let lo = name_addr(dir, &start);
    let hi = blockmap::prefix_end(name_addr(dir, prefix)).unwrap_or_else(|| vec![0xff]);
    let mut out = Vec::new();
    let mut over = overlay.into_iter().peekable();
    let emit = |out: &mut Vec<(String, u64)>, n: String, t: Option<u64>| {
        if let Some(t) = t {
            if in_range(&n) {
                out.push((n, t));
            }
        }
    };
    let mut committed = blockmap::NameScan::new(&view.blocks, &st.chain, &lo, &hi)?;
    while out.len() < limit {
        let next = committed.peek()?;
        match (next, over.peek()) {
            (None, None) => break,
            (Some((n, _)), Some((o, _))) if o.as_str() <= n.as_str() => {
                let same = o == n;
                let (o, t) = over.next().unwrap_or_default();
                if same {
                    committed.next()?;
                }
                emit(&mut out, o, t);
            }
            (Some(_), _) => {
                if let Some((n, v)) = committed.next()? {
                    emit(&mut out, n, Some(target_of(&v)?));
                }
            }
            (None, Some(_)) => {
                let (o, t) = over.next().unwrap_or_default();
                emit(&mut out, o, t);
            }
        }
    }
    Ok(out)
}

// ------------------------------------------------------------ the API

/// An open bucket or filesystem (or a snapshot of one, read-only): what the
/// S3 and POSIX layers use. Follows renames, as [`crate::Volume`] does.
pub struct ObjectSet {
    pool: Arc<ImportedPool>,
    id: u64,
    name: parking_lot::Mutex<String>,
}

impl ObjectSet {
    /// The dataset's name now (`pool/bucket`, `pool/bucket@snap`).
    pub fn name(&self) -> String {
        // Refreshed first: a renamed dataset answers with its new name.
        let _ = volume::record_by_id(&self.pool.datasets.read(), self.id, &self.name);
        self.name.lock().clone()
    }
}

impl ObjectSet {
    fn state(&self) -> Result<State> {
        if self.pool.is_closed() {
            return Err(Error::NotFound(self.name()));
        }
        let datasets = self.pool.datasets.read();
        let rec = volume::record_by_id(&datasets, self.id, &self.name)?;
        Ok(state_of(&datasets, rec))
    }

    /// Applies a change made through this handle (a head, writable).
    fn change(&self, op: ObjectOp, class: Class) -> Result<u64> {
        let st = self.state()?;
        if st.readonly {
            return Err(Error::ReadOnly(self.name()));
        }
        let ds = st.ds();
        self.pool.object_writes.note(ds);
        self.pool.admit_change(&self.name(), class, || {
            apply_op(&self.pool, ds, &st, &op, true, Some(class))
        })
    }

    /// The dataset's id in its pool: stable across restarts and renames
    /// (NFS file handles carry it).
    pub fn dataset_id(&self) -> u64 {
        self.id
    }

    /// The pool's guid: with [`ObjectSet::dataset_id`], names the dataset
    /// among every pool this daemon ever imports.
    pub fn pool_guid(&self) -> u64 {
        self.pool.pool.guid
    }

    /// Properties as they apply to this dataset now (inherited or local).
    pub fn property(&self, prop: &str) -> Result<String> {
        let datasets = self.pool.datasets.read();
        let rec = volume::record_by_id(&datasets, self.id, &self.name)?;
        Ok(crate::txg::lineage(&datasets, rec).resolve(prop).0)
    }

    /// (referenced, available) bytes: what `df` of a filesystem shows.
    pub fn space(&self) -> Result<(u64, u64)> {
        let datasets = self.pool.datasets.read();
        let rec = volume::record_by_id(&datasets, self.id, &self.name)?;
        let referenced = rec.physical_used + rec.inherited;
        let head = self
            .name()
            .split('@')
            .next()
            .unwrap_or_default()
            .to_string();
        Ok((referenced, self.pool.available_of(&datasets, &head)))
    }

    /// A snapshot, or `readonly=on`.
    pub fn is_readonly(&self) -> Result<bool> {
        Ok(self.state()?.readonly)
    }

    /// Block size new objects get (the `recordsize` property).
    pub fn recordsize(&self) -> Result<u32> {
        Ok(self.state()?.recordsize)
    }

    /// A new object (nlink 0, in the unlinked set until linked); its id.
    pub fn create(&self, kind: ObjectKind, payload: &[u8]) -> Result<u64> {
        let obj = self.allocate()?;
        self.create_at(obj, kind, self.state()?.recordsize, payload)?;
        Ok(obj)
    }

    /// Takes the next object id (for an [`ObjectOp::Create`] in a batch).
    /// Ids only grow: a rollback or a crash never hands one out twice.
    pub fn allocate(&self) -> Result<u64> {
        let st = self.state()?;
        if st.readonly {
            return Err(Error::ReadOnly(self.name()));
        }
        let ds = st.ds();
        // The id is taken under the open txg's lock: concurrent creates never share one.
        let obj = {
            let datasets = self.pool.datasets.read();
            let persisted = datasets
                .values()
                .find(|r| r.id == ds)
                .map_or(0, |r| r.next_object);
            let mut open = self.pool.open.lock();
            let next = open
                .next_object
                .entry(ds)
                .or_insert(persisted.max(FIRST_DYNAMIC_OBJECT));
            let id = *next;
            *next += 1;
            id
        };
        Ok(obj)
    }

    /// Applies several attribute and name changes atomically (one log
    /// record, one txg): see [`ObjectOp::Batch`]. Creates in it take ids
    /// from [`ObjectSet::allocate`] and the dataset's recordsize if their
    /// `blksz` is 0.
    pub fn apply_batch(&self, mut ops: Vec<ObjectOp>) -> Result<()> {
        let recordsize = self.state()?.recordsize;
        for op in &mut ops {
            if let ObjectOp::Create { blksz, payload, .. } = op {
                if *blksz == 0 {
                    *blksz = recordsize;
                }
                if payload.len() > MAX_PAYLOAD {
                    return Err(Error::InvalidArgument(format!(
                        "object payload of {} bytes (at most {MAX_PAYLOAD})",
                        payload.len()
                    )));
                }
            }
            if let ObjectOp::Link { name, .. } = op {
                Self::check_name(name)?;
            }
        }
        let class = if ops
            .iter()
            .any(|o| matches!(o, ObjectOp::Create { .. } | ObjectOp::Link { .. }))
        {
            Class::Write
        } else {
            Class::Free
        };
        self.change(ObjectOp::Batch(ops), class).map(|_| ())
    }

    fn create_at(&self, obj: u64, kind: ObjectKind, blksz: u32, payload: &[u8]) -> Result<()> {
        if payload.len() > MAX_PAYLOAD {
            return Err(Error::InvalidArgument(format!(
                "object payload of {} bytes (at most {MAX_PAYLOAD})",
                payload.len()
            )));
        }
        self.change(
            ObjectOp::Create {
                obj,
                kind,
                blksz,
                generation: 0,
                time_ns: now_ns(),
                payload: payload.to_vec(),
            },
            Class::Write,
        )
        .map(|_| ())
    }

    /// Creates a fixed object of the layer above (`FIRST_LAYER_OBJECT..`)
    /// if it does not exist yet; ROOT_DIR exists from the dataset's creation.
    pub fn create_fixed(&self, obj: u64, kind: ObjectKind) -> Result<()> {
        if !(FIRST_LAYER_OBJECT..FIRST_DYNAMIC_OBJECT).contains(&obj) {
            return Err(Error::InvalidArgument(format!(
                "object {obj} is not one of the fixed ids {FIRST_LAYER_OBJECT}..{FIRST_DYNAMIC_OBJECT}"
            )));
        }
        if self.attrs(obj)?.is_some() {
            return Ok(());
        }
        let blksz = self.state()?.recordsize;
        self.create_at(obj, kind, blksz, &[])?;
        // Fixed objects are their own name: they never join the unlinked set.
        let t = now_ns();
        let st = self.state()?;
        let mut open = self.pool.open.lock();
        if let Some(Ok(Some(mut a))) = open_attrs(&open, st.ds(), obj) {
            a.nlink = 1;
            a.ctime_ns = t;
            put_attrs(&mut open, st.ds(), obj, &a);
        }
        drop(open);
        // Logged as a payload change so replay keeps nlink 1 too.
        self.change(
            ObjectOp::SetTimes {
                obj,
                mtime_ns: None,
                crtime_ns: None,
                time_ns: t,
            },
            Class::Write,
        )
        .map(|_| ())
    }

    /// Attributes of an object, `None` if there is none by that id.
    pub fn attrs(&self, obj: u64) -> Result<Option<ObjectAttrs>> {
        let st = self.state()?;
        if st.head() {
            if let Some(a) = open_attrs(&self.pool.open.lock(), st.ds(), obj) {
                return a;
            }
        }
        attrs_outside_open(&self.pool, &st, obj)
    }

    /// Up to `len` bytes from `offset`; short at the end of the object.
    pub fn read(&self, obj: u64, offset: u64, len: u64) -> Result<Vec<u8>> {
        let st = self.state()?;
        let a = self
            .attrs(obj)?
            .ok_or_else(|| Error::NotFound(format!("object {obj}")))?;
        let len = len.min(a.size.saturating_sub(offset));
        let mut out = Vec::with_capacity(len as usize);
        for seg in volume::read_range(
            &self.pool,
            &st.chain,
            obj,
            a.blksz.max(1),
            !st.head(),
            offset,
            len,
        )? {
            match seg {
                ReadSegment::Data(d) => out.extend_from_slice(&d),
                ReadSegment::Hole(n) => out.resize(out.len() + n as usize, 0),
            }
        }
        Ok(out)
    }

    /// Writes (extending the size if it ends past it); sets mtime.
    pub fn write(&self, obj: u64, offset: u64, data: &[u8]) -> Result<()> {
        offset
            .checked_add(data.len() as u64)
            .filter(|end| *end <= MAX_OBJECT_SIZE)
            .ok_or_else(|| {
                Error::InvalidArgument(format!("write at {offset}: beyond the largest object"))
            })?;
        // Large writes go in pieces: each is one logged op, at most one record.
        for (i, chunk) in data.chunks(WRITE_PIECE).enumerate() {
            self.change(
                ObjectOp::Write {
                    obj,
                    offset: offset + (i * WRITE_PIECE) as u64,
                    data: chunk.to_vec(),
                    time_ns: now_ns(),
                },
                Class::Write,
            )?;
        }
        Ok(())
    }

    pub fn truncate(&self, obj: u64, size: u64) -> Result<()> {
        if size > MAX_OBJECT_SIZE {
            return Err(Error::InvalidArgument(format!(
                "size {size}: beyond the largest object"
            )));
        }
        self.change(
            ObjectOp::Truncate {
                obj,
                size,
                time_ns: now_ns(),
            },
            Class::Free,
        )
        .map(|_| ())
    }

    pub fn set_payload(&self, obj: u64, payload: &[u8]) -> Result<()> {
        self.change(
            ObjectOp::SetPayload {
                obj,
                payload: payload.to_vec(),
                time_ns: now_ns(),
            },
            Class::Write,
        )
        .map(|_| ())
    }

    pub fn set_times(&self, obj: u64, mtime_ns: Option<u64>, crtime_ns: Option<u64>) -> Result<()> {
        self.change(
            ObjectOp::SetTimes {
                obj,
                mtime_ns,
                crtime_ns,
                time_ns: now_ns(),
            },
            Class::Write,
        )
        .map(|_| ())
    }

    /// Frees an object no name points at, with its blocks.
    pub fn remove(&self, obj: u64) -> Result<()> {
        self.change(ObjectOp::Remove { obj }, Class::Free)
            .map(|_| ())
    }

    /// The object `dir/name` points at.
    pub fn lookup(&self, dir: u64, name: &str) -> Result<Option<u64>> {
        let st = self.state()?;
        if st.head() {
            let open = self
                .pool
                .open
                .lock()
                .names
                .get(&(st.ds(), dir, name.to_string()))
                .copied();
            if let Some(t) = open {
                return Ok(t);
            }
        }
        lookup_outside_open(&self.pool, &st, dir, name)
    }

    fn check_name(name: &str) -> Result<()> {
        if name.is_empty() || name.len() > MAX_NAME {
            return Err(Error::InvalidArgument(format!(
                "name of {} bytes (1 to {MAX_NAME})",
                name.len()
            )));
        }
        Ok(())
    }

    /// Points `dir/name` at `obj` (nlink + 1); returns what it pointed at
    /// before (its nlink - 1: at 0 it joins the unlinked set).
    pub fn link(&self, dir: u64, name: &str, obj: u64) -> Result<Option<u64>> {
        Self::check_name(name)?;
        let before = self.lookup(dir, name)?;
        self.change(
            ObjectOp::Link {
                dir,
                name: name.to_string(),
                obj,
                time_ns: now_ns(),
            },
            Class::Write,
        )?;
        Ok(before.filter(|b| *b != obj))
    }

    /// Removes `dir/name`; returns what it pointed at (nlink - 1).
    pub fn unlink(&self, dir: u64, name: &str) -> Result<Option<u64>> {
        let Some(before) = self.lookup(dir, name)? else {
            return Ok(None);
        };
        self.change(
            ObjectOp::Unlink {
                dir,
                name: name.to_string(),
                time_ns: now_ns(),
            },
            Class::Free,
        )?;
        Ok(Some(before))
    }

    /// Names of `dir` in byte order, those greater than `after` and starting
    /// with `prefix`, at most `limit`.
    pub fn list(
        &self,
        dir: u64,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, u64)>> {
        let st = self.state()?;
        list_names(&self.pool, &st, dir, prefix, after, limit)
    }

    /// Makes every op applied so far durable (intent log, group commit).
    pub fn commit(&self) -> Result<()> {
        self.state()?;
        self.pool.commit_log(self.pool.log.last_seq())
    }
}

/// The largest object: 2^40 blocks would do, but offsets must stay far from u64 overflow.
pub const MAX_OBJECT_SIZE: u64 = 1 << 50;
/// Writes are logged in pieces of at most this many bytes.
const WRITE_PIECE: usize = 1 << 20;

impl crate::Engine {
    /// Creates a bucket or a filesystem (`create -t bucket`, `create`).
    pub fn create_dataset(
        &self,
        name: &str,
        kind: DatasetKind,
        props_in: &[(String, String)],
    ) -> Result<crate::DatasetInfo> {
        self.create_dataset_keyed(name, kind, props_in, None)
    }

    /// [`crate::Engine::create_dataset`] with the key of a new encryption root.
    pub fn create_dataset_keyed(
        &self,
        name: &str,
        kind: DatasetKind,
        props_in: &[(String, String)],
        key: Option<&crate::KeyMaterial>,
    ) -> Result<crate::DatasetInfo> {
        self.create_dataset_as(name, kind, props_in, key, &|_| {})
    }

    /// [`crate::Engine::create_dataset_keyed`]; `finish` completes the
    /// record before its one store (decision 0051).
    pub(crate) fn create_dataset_as(
        &self,
        name: &str,
        kind: DatasetKind,
        props_in: &[(String, String)],
        key: Option<&crate::KeyMaterial>,
        finish: &dyn Fn(&mut crate::props::DatasetRecord),
    ) -> Result<crate::DatasetInfo> {
        if !matches!(kind, DatasetKind::Bucket | DatasetKind::Filesystem) {
            return Err(Error::InvalidArgument(format!(
                "'{name}': create_dataset makes buckets and filesystems; volumes take a size (-V)"
            )));
        }
        let (pool_name, Some(_)) = crate::names::split_dataset(name)? else {
            return Err(Error::InvalidArgument(format!(
                "'{name}': a dataset is named POOL/NAME"
            )));
        };
        let p = self.pool(pool_name)?;
        crate::engine::check_new_dataset(&p.datasets.read(), name)?;
        let (mut crypt, props_in) = crate::crypt::prepare_create(&p, name, props_in, key)?;
        let props_in = &props_in[..];
        let mut local = BTreeMap::new();
        for (k, v) in props_in {
            if matches!(k.as_str(), "volsize" | "volblocksize") {
                return Err(Error::InvalidArgument(format!(
                    "property '{k}' is for volumes only"
                )));
            }
            crate::props::check_kind(k, kind)?;
            local.insert(k.clone(), crate::props::normalize(k, v)?);
        }
        if kind == DatasetKind::Filesystem {
            let datasets = p.datasets.read();
            let parent = name.rsplit_once('/').and_then(|(p, _)| datasets.get(p));
            if let Some(parent) = parent {
                crate::props::pin_create_only(&crate::txg::lineage(&datasets, parent), &mut local);
            }
        }
        local.retain(|_, v| v != "none");
        p.check_new(&p.datasets.read(), name, &local)?;
        let id = p.next_dataset_id()?;
        let crypt_rec = crate::crypt::record_for(id, &mut crypt)?;
        let mut rec = crate::props::DatasetRecord {
            id,
            crypt: crypt_rec,
            name: name.to_string(),
            kind,
            local,
            created_txg: p.open.lock().txg,
            creation: crate::txg::now_secs(),
            next_object: FIRST_DYNAMIC_OBJECT,
            ..Default::default()
        };
        finish(&mut rec);
        p.store_dataset(&rec)?;
        crate::crypt::after_store(&p, id, crypt);
        tracing::info!(dataset = name, ?kind, "dataset created");
        self.dataset(name)
    }

    /// Opens a bucket or filesystem, or a snapshot of one (read-only).
    pub fn open_objects(&self, name: &str) -> Result<Arc<ObjectSet>> {
        let (pool_name, _) = crate::names::split_dataset(name)?;
        let p = self.pool(pool_name)?;
        let id = {
            let datasets = p.datasets.read();
            let rec = datasets
                .get(name)
                .ok_or_else(|| Error::NotFound(format!("dataset '{name}'")))?;
            let head = datasets.values().find(|r| r.id == rec.data_id());
            match head.map(|h| h.kind) {
                Some(DatasetKind::Bucket | DatasetKind::Filesystem) if rec.data_id() != 0 => rec.id,
                _ => {
                    return Err(Error::InvalidArgument(format!(
                        "'{name}' holds no objects (not a bucket or filesystem)"
                    )))
                }
            }
        };
        // Not served without its key (decision 0026).
        p.key_of(id)?;
        Ok(Arc::new(ObjectSet {
            pool: p,
            id,
            name: parking_lot::Mutex::new(name.to_string()),
        }))
    }
}

/// Objects of `ds` with a block or attribute version born in (`after`, `upto`].
fn objects_born_between<T>(
    t: &T,
    ds: u64,
    after: u64,
    upto: u64,
) -> Result<std::collections::BTreeSet<u64>>
where
    T: meta::redb::ReadableTable<blockmap::KeyType, &'static [u8]>,
{
    let mut changed = std::collections::BTreeSet::new();
    let (lo, hi) = (block_addr(0, 0), name_addr(0, ""));
    for row in t
        .range((ds, &lo[..], 0)..(ds, &hi[..], 0))
        .map_err(crate::txg::meta_err)?
    {
        let (k, _) = row.map_err(crate::txg::meta_err)?;
        let (_, addr, birth) = k.value();
        if birth > after && birth <= upto {
            if let Some((obj, _)) = blockmap::block_of(addr) {
                changed.insert(obj);
            }
        }
    }
    Ok(changed)
}

/// `cistern diff` of a bucket or filesystem: the names of the root
/// directory that appeared (`+`), went (`-`), or point at another object or
/// one whose data or attributes changed (`M`) between txg `after` (seen
/// through `from`) and `upto` (seen through `to`). Committed state only.
pub(crate) fn diff_names(
    p: &ImportedPool,
    ds: u64,
    from: &Chain,
    to: &Chain,
    after: u64,
    upto: u64,
) -> Result<Vec<crate::NameChange>> {
    let view = p.view()?;
    let t = &view.blocks;
    let born_between = |birth: u64| birth > after && birth <= upto;
    let changed_objects = objects_born_between(t, ds, after, upto)?;
    let layout = NameLayout::of(p, ds)?;
    // Rows of the root directory with a version born in between (by
    // address: a sealed tombstone has no name; the versions on each side say it).
    let (root, root_end) = crate::namerow::dir_range(ROOT_DIR);
    let mut touched = std::collections::BTreeSet::new();
    for row in t
        .range((ds, &root[..], 0)..(ds, &root_end[..], 0))
        .map_err(crate::txg::meta_err)?
    {
        let (k, _) = row.map_err(crate::txg::meta_err)?;
        let (_, addr, birth) = k.value();
        if born_between(birth) {
            touched.insert(addr.to_vec());
        }
    }
    let at = |chain: &Chain, addr: &[u8]| -> Result<Option<(String, u64)>> {
        blockmap::resolve(t, chain, addr)?
            .map(|v| layout.open_row(addr, &v).map(|(_, n, o)| (n, o)))
            .transpose()
    };
    let mut out = BTreeMap::new();
    for addr in touched {
        let (name, change) = match (at(from, &addr)?, at(to, &addr)?) {
            (None, Some((n, _))) => (n, '+'),
            (Some((n, _)), None) => (n, '-'),
            (Some((n, a)), Some((_, b))) if a != b || changed_objects.contains(&b) => (n, 'M'),
            _ => continue,
        };
        out.insert(name, change);
    }
    // Names unchanged whose object changed in place (a file written to).
    if !changed_objects.is_empty() {
        let mut scan = blockmap::NameScan::new(t, to, &root, &root_end)?;
        while let Some((addr, v)) = scan.next_row()? {
            let (_, name, obj) = layout.open_row(&addr, &v)?;
            if changed_objects.contains(&obj) {
                out.entry(name).or_insert('M');
            }
        }
    }
    Ok(out
        .into_iter()
        .map(|(name, change)| crate::NameChange {
            change,
            name,
            renamed_to: None,
        })
        .collect())
}

/// `cistern diff` of a filesystem, by path as zfs diff: `+ /new`, `- /old`,
/// `M /changed` (data, attributes, or a directory's entries), `R /a -> /b`
/// between txg `after` (seen through `from`) and `upto` (through `to`).
/// Objects are the same file on both sides when their ids are (ids are
/// never reused), so a rename is told from a delete and a create.
pub(crate) fn diff_paths(
    p: &ImportedPool,
    ds: u64,
    from: &Chain,
    to: &Chain,
    after: u64,
    upto: u64,
) -> Result<Vec<crate::NameChange>> {
    let view = p.view()?;
    let t = &view.blocks;
    let born_between = |birth: u64| birth > after && birth <= upto;
    // Objects with a version born in between, and (below) objects named by
    // a name with a version born in between (on either side).
    let mut changed = objects_born_between(t, ds, after, upto)?;
    let layout = NameLayout::of(p, ds)?;
    let names_lo = name_addr(0, "");
    let names_hi = vec![blockmap::NAME_TAG + 1];
    // Name rows with a version born in between, by address (a sealed
    // tombstone has no name: the versions on each side say it).
    let mut touched = std::collections::BTreeSet::new();
    for row in t
        .range((ds, &names_lo[..], 0)..(ds, &names_hi[..], 0))
        .map_err(crate::txg::meta_err)?
    {
        let (k, _) = row.map_err(crate::txg::meta_err)?;
        let (_, addr, birth) = k.value();
        if born_between(birth) && crate::namerow::dir_of(addr)? != UNLINKED_SET {
            touched.insert(addr.to_vec());
        }
    }
    if changed.is_empty() && touched.is_empty() {
        return Ok(Vec::new());
    }
    // Every object's (first) name on each side: obj -> (dir, name).
    let names_of = |chain: &Chain| -> Result<std::collections::HashMap<u64, (u64, String)>> {
        let mut out = std::collections::HashMap::new();
        let mut scan = blockmap::NameScan::new(t, chain, &names_lo, &names_hi)?;
        while let Some((addr, v)) = scan.next_row()? {
            if crate::namerow::dir_of(&addr)? == UNLINKED_SET {
                continue;
            }
            let (dir, name, obj) = layout.open_row(&addr, &v)?;
            if name == ".." {
                continue;
            }
            out.entry(obj).or_insert((dir, name));
        }
        Ok(out)
    };
    let (before, now) = (names_of(from)?, names_of(to)?);
    for addr in &touched {
        for chain in [from, to] {
            if let Some(v) = blockmap::resolve(t, chain, addr)? {
                let (_, name, obj) = layout.open_row(addr, &v)?;
                if name != ".." {
                    changed.insert(obj);
                }
            }
        }
    }
    // A path, built up through the parents; `None` if unreachable from the root.
    let path = |names: &std::collections::HashMap<u64, (u64, String)>, mut obj: u64| {
        let mut parts = Vec::new();
        for _ in 0..4096 {
            if obj == ROOT_DIR {
                parts.reverse();
                return Some(format!("/{}", parts.join("/")));
            }
            let (dir, name) = names.get(&obj)?;
            parts.push(name.clone());
            obj = *dir;
        }
        None
    };
    let mut out: Vec<crate::NameChange> = Vec::new();
    for obj in changed {
        if obj == UNLINKED_SET {
            continue;
        }
        let change = |c: char, name: String, renamed_to: Option<String>| crate::NameChange {
            change: c,
            name,
            renamed_to,
        };
        match (path(&before, obj), path(&now, obj)) {
            (None, Some(b)) => out.push(change('+', b, None)),
            (Some(a), None) => out.push(change('-', a, None)),
            (Some(a), Some(b)) if a != b => out.push(change('R', a, Some(b))),
            (Some(a), Some(_)) => {
                // Only what changed itself: a name that moved away is not a change of its file.
                let own = blockmap::resolve(t, from, &block_addr(obj, ATTR_BLOCK))?
                    != blockmap::resolve(t, to, &block_addr(obj, ATTR_BLOCK))?
                    || blockmap::resolve_range(
                        t,
                        to,
                        &block_addr(obj, 0),
                        &block_addr(obj, ATTR_BLOCK),
                    )? != blockmap::resolve_range(
                        t,
                        from,
                        &block_addr(obj, 0),
                        &block_addr(obj, ATTR_BLOCK),
                    )?;
                if own {
                    out.push(change('M', a, None));
                }
            }
            (None, None) => {}
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name).then(a.change.cmp(&b.change)));
    Ok(out)
}
