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

use crate::{Error, Result};
use serde::{Deserialize, Serialize};

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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
    #[serde(with = "serde_bytes_compat")]
    pub payload: Vec<u8>,
}

/// One change to a dataset's objects: what is logged and replayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ObjectOp {
    Create {
        obj: u64,
        kind: ObjectKind,
        blksz: u32,
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
    Remove { obj: u64 },
}

mod serde_bytes_compat {
    use serde::{Deserialize, Deserializer, Serializer};
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        Vec::<u8>::deserialize(d)
    }
}

/// An open bucket or filesystem (or a snapshot of one, read-only): what the
/// S3 and POSIX layers use. Follows renames, as [`crate::Volume`] does.
#[allow(dead_code)] // the skeleton: filled in by the object layer commit
pub struct ObjectSet {
    pub(crate) pool: std::sync::Arc<crate::txg::ImportedPool>,
    pub(crate) id: u64,
    pub(crate) name: parking_lot::Mutex<String>,
}

impl ObjectSet {
    /// The dataset's name now (`pool/bucket`, `pool/bucket@snap`).
    pub fn name(&self) -> String {
        self.name.lock().clone()
    }

    /// A snapshot, or `readonly=on`.
    pub fn is_readonly(&self) -> Result<bool> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Block size new objects get (the `recordsize` property).
    pub fn recordsize(&self) -> Result<u32> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// A new object (nlink 0, in the unlinked set until linked); its id.
    pub fn create(&self, _kind: ObjectKind, _payload: &[u8]) -> Result<u64> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Creates a fixed object of the layer above (`FIRST_LAYER_OBJECT..`)
    /// if it does not exist yet; ROOT_DIR exists from the dataset's creation.
    pub fn create_fixed(&self, _obj: u64, _kind: ObjectKind) -> Result<()> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Attributes of an object, `None` if there is none by that id.
    pub fn attrs(&self, _obj: u64) -> Result<Option<ObjectAttrs>> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Up to `len` bytes from `offset`; short at the end of the object.
    pub fn read(&self, _obj: u64, _offset: u64, _len: u64) -> Result<Vec<u8>> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Writes (extending the size if it ends past it); sets mtime.
    pub fn write(&self, _obj: u64, _offset: u64, _data: &[u8]) -> Result<()> {
        Err(Error::Io("object layer: not yet".into()))
    }

    pub fn truncate(&self, _obj: u64, _size: u64) -> Result<()> {
        Err(Error::Io("object layer: not yet".into()))
    }

    pub fn set_payload(&self, _obj: u64, _payload: &[u8]) -> Result<()> {
        Err(Error::Io("object layer: not yet".into()))
    }

    pub fn set_times(&self, _obj: u64, _mtime_ns: Option<u64>, _crtime_ns: Option<u64>) -> Result<()> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Frees an object no name points at, with its blocks.
    pub fn remove(&self, _obj: u64) -> Result<()> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// The object `dir/name` points at.
    pub fn lookup(&self, _dir: u64, _name: &str) -> Result<Option<u64>> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Points `dir/name` at `obj` (nlink + 1); returns what it pointed at
    /// before (its nlink - 1: at 0 it joins the unlinked set).
    pub fn link(&self, _dir: u64, _name: &str, _obj: u64) -> Result<Option<u64>> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Removes `dir/name`; returns what it pointed at (nlink - 1).
    pub fn unlink(&self, _dir: u64, _name: &str) -> Result<Option<u64>> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Names of `dir` in byte order, those greater than `after` and starting
    /// with `prefix`, at most `limit`.
    pub fn list(
        &self,
        _dir: u64,
        _prefix: &str,
        _after: Option<&str>,
        _limit: usize,
    ) -> Result<Vec<(String, u64)>> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Makes every op applied so far durable (intent log, group commit).
    pub fn commit(&self) -> Result<()> {
        Err(Error::Io("object layer: not yet".into()))
    }
}

impl crate::Engine {
    /// Creates a bucket or a filesystem (`create -t bucket`, `create`).
    pub fn create_dataset(
        &self,
        _name: &str,
        _kind: crate::DatasetKind,
        _props: &[(String, String)],
    ) -> Result<crate::DatasetInfo> {
        Err(Error::Io("object layer: not yet".into()))
    }

    /// Opens a bucket or filesystem, or a snapshot of one (read-only).
    pub fn open_objects(&self, _name: &str) -> Result<std::sync::Arc<ObjectSet>> {
        Err(Error::Io("object layer: not yet".into()))
    }
}

/// Largest stored (compressed) block kept in its metadata row instead of a
/// data block.
pub const EMBED_MAX: usize = 2048;

/// Length of `data` without its trailing zeros, rounded up to 512 bytes.
pub(crate) fn trimmed_len(data: &[u8]) -> usize {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    end.div_ceil(512).saturating_mul(512).min(data.len())
}

pub(crate) fn replay(_p: &crate::txg::ImportedPool, _ds: u64, _payload: &[u8]) -> Result<()> {
    Err(Error::Io("object layer: not yet".into()))
}
