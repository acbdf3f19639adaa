//! Datasets on an imported pool: volumes, properties, the open transaction
//! group and its commit. This is the crate the front ends talk to.
//!
//! Front ends use [`Engine`] (pools, datasets, properties) and [`Volume`]
//! (block I/O). Inside: `txg.rs` commits transaction groups, `volume.rs`
//! maps byte ranges onto blocks, `engine.rs` imports pools and runs
//! administrative changes, `props.rs` holds properties and their inheritance.

mod api_types;
mod autosnap;
mod blockmap;
pub mod cache;
pub use cache::Block;
mod cache_devices;
pub mod crypt;
mod dataset_admin;
mod engine;
mod error;
pub mod events;
mod health;
pub mod history;
mod holders;
pub mod l2arc;
pub mod memory;
mod namerow;
pub mod names;
pub mod objects;
mod owner;
mod prefetch;
pub mod props;
mod scrub;
pub mod send;
mod snapshot;
mod snapshot_admin;
pub mod space;
mod standby_status;
mod txg;
mod upgrade;
mod volume;

pub use api_types::*;
pub use autosnap::{
    PolicyCounters, PolicyInfo, PolicyRun, PolicyShow, PolicyView, SnapshotObserver, AUTO_PROPERTY,
};
pub use crypt::KeyMaterial;
pub use error::{Error, Result};
pub use events::{post_event, Event};
pub use history::{Caller, HistoryRecord};
pub use holders::{FollowRollback, HolderInfo, OpenHandle, Revoke, RollbackPhase, WriteMark};
pub use objects::{now_ns, ObjectAttrs, ObjectKind, ObjectOp, ObjectSet};
pub use policy;
pub use policy::EventKind;
pub use send::bookmark::{Bookmark, BookmarkInfo};
pub use send::{ReceiveOptions, ReceiveSummary, SendOptions, SendSummary};
pub use volume::FlushStart;

/// Metadata format and device label version this build writes (`pool upgrade`).
pub const META_FORMAT: u64 = meta::META_FORMAT_VERSION;
pub const LABEL_VERSION: u32 = vdev::LABEL_VERSION;

use serde::Deserialize as _;
pub(crate) use std::path::{Path, PathBuf};
pub(crate) use std::sync::Arc;

/// Tunables from the `[engine]` section of the TOML config.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Seconds between txg commits (ZFS: zfs_txg_timeout).
    pub txg_timeout_secs: f64,
    /// Dirty data that forces an early txg commit, bytes.
    #[serde(deserialize_with = "props::de_size")]
    pub dirty_max_bytes: u64,
    /// Most bytes the ARC (verified, decompressed blocks) of a pool may
    /// hold; "auto" ([`CACHE_AUTO`], the default) sizes it from memory: 1/4
    /// of RAM or of the cgroup limit (decision 0029); 0 caches nothing.
    /// `block_cache_bytes` is its old name.
    #[serde(
        rename = "cache_max_bytes",
        alias = "block_cache_bytes",
        deserialize_with = "de_size_or_auto",
        serialize_with = "ser_size_or_auto"
    )]
    pub block_cache_bytes: u64,
    /// Least bytes memory pressure shrinks the ARC to; 0: 1/32 of RAM or of
    /// the cgroup limit (at least 16M).
    #[serde(deserialize_with = "props::de_size")]
    pub cache_min_bytes: u64,
    /// Bound of prefetch (read-ahead) reads in flight per pool, bytes; 0 turns prefetch off.
    #[serde(deserialize_with = "props::de_size")]
    pub prefetch_max_bytes: u64,
    /// Bytes per second written to each L2ARC cache device (ZFS: l2arc_write_max).
    #[serde(deserialize_with = "props::de_size")]
    pub l2arc_write_max_bytes: u64,
    /// Bound of redb's page cache, bytes.
    #[serde(deserialize_with = "props::de_size")]
    pub meta_cache_bytes: u64,
    /// Bound of intent-log records held in memory until a FLUSH/FUA; past
    /// it, unflushed writes are left to the txg and a later FLUSH waits for it.
    #[serde(deserialize_with = "props::de_size")]
    pub log_buffer_bytes: u64,
    /// Bound of the rate at which a scrub or resilver reads, bytes per
    /// second; 0 is unlimited (the default: a scan yields to I/O by
    /// reading in short batches).
    #[serde(deserialize_with = "props::de_size")]
    pub scan_rate_bytes: u64,
    /// Seconds between runs of the snapshot policy scheduler; 0 turns it off.
    pub policy_tick_secs: f64,
    /// Milliseconds between two MMP heartbeats of an owned pool (ZFS:
    /// zfs_multihost_interval). A claim waits one interval, a forced import
    /// watches five, an owner writes at most three past its last heartbeat
    /// (decision 0010).
    pub multihost_interval_ms: u64,
    /// Largest stored (compressed) object block kept in its metadata row
    /// instead of a data block, bytes; 0 embeds nothing. Embedding stops
    /// while the metadata region is more than half full (decision 0017).
    #[serde(deserialize_with = "props::de_size")]
    pub embed_max_bytes: u64,
    /// Keep the txg sync thread off the CPUs that take the pool's disk
    /// interrupts when the disk has one queue and other CPUs are allowed
    /// (decision 0083); false lets it run anywhere.
    pub txg_avoid_irq_cpus: bool,
}

/// `cache_max_bytes = "auto"`: sized from the machine's (or cgroup's) memory.
pub const CACHE_AUTO: u64 = u64::MAX;

fn de_size_or_auto<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum V {
        N(i64),
        S(String),
    }
    match V::deserialize(d)? {
        V::S(s) if s == "auto" => Ok(CACHE_AUTO),
        V::S(s) => props::parse_size(&s).map_err(serde::de::Error::custom),
        V::N(n) => u64::try_from(n)
            .map_err(|_| serde::de::Error::custom(format!("invalid size {n}: negative"))),
    }
}

fn ser_size_or_auto<S: serde::Serializer>(v: &u64, s: S) -> std::result::Result<S::Ok, S::Error> {
    if *v == CACHE_AUTO {
        s.serialize_str("auto")
    } else {
        s.serialize_u64(*v)
    }
}

impl EngineConfig {
    pub fn mmp(&self) -> pool::MmpConfig {
        pool::MmpConfig {
            interval: std::time::Duration::from_millis(self.multihost_interval_ms.max(10)),
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            txg_timeout_secs: 5.0,
            dirty_max_bytes: 128 << 20,
            block_cache_bytes: CACHE_AUTO,
            cache_min_bytes: 0,
            prefetch_max_bytes: 32 << 20,
            l2arc_write_max_bytes: 64 << 20,
            meta_cache_bytes: 64 << 20,
            log_buffer_bytes: 32 << 20,
            scan_rate_bytes: 0,
            policy_tick_secs: 10.0,
            multihost_interval_ms: pool::DEFAULT_MMP_INTERVAL.as_millis() as u64,
            embed_max_bytes: objects::EMBED_MAX as u64,
            txg_avoid_irq_cpus: true,
        }
    }
}

/// One segment of a read: data, or a range that was never written (reads as zeros).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadSegment {
    Data(Vec<u8>),
    Hole(u64),
}

/// One piece of a read without copies: a range of a shared block buffer,
/// or a run of bytes never written (zeros).
#[derive(Debug, Clone)]
pub enum ReadPiece {
    Data(crate::cache::Block, std::ops::Range<usize>),
    Hole(u64),
}

impl ReadPiece {
    /// The bytes of a data piece (empty for a hole).
    pub fn data(&self) -> &[u8] {
        match self {
            ReadPiece::Data(b, r) => &b[r.clone()],
            ReadPiece::Hole(_) => &[],
        }
    }
}

/// One run of `Volume::allocation`: `len` bytes that are all holes or all data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u64,
    /// Not allocated: reads as zeros and takes no space.
    pub hole: bool,
    /// Reads as zeros (true for every hole, and for allocated blocks known to be zero).
    pub zero: bool,
}

/// Everything the daemon owns: the imported pools.
pub struct Engine {
    inner: engine::EngineInner,
}

/// An open volume; what the NBD server reads and writes.
pub struct Volume {
    pool: Arc<txg::ImportedPool>,
    id: u64,
    /// Follows `rename`: refreshed from the record (found by id) when it moved.
    name: parking_lot::Mutex<String>,
}
