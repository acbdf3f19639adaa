//! Datasets on an imported pool: volumes, properties, the open transaction
//! group and its commit. This is the crate the front ends talk to.
//!
//! PUBLIC API CONTRACT (front ends code against exactly these signatures).

mod api_types;
mod error;

pub use api_types::*;
pub use error::{Error, Result};

use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Tunables from the `[engine]` section of the TOML config.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Seconds between txg commits (ZFS: zfs_txg_timeout).
    pub txg_timeout_secs: f64,
    /// Dirty data that forces an early txg commit, bytes.
    pub dirty_max_bytes: u64,
    /// Bound of the decompressed-block read cache, bytes.
    pub block_cache_bytes: u64,
    /// Bound of redb's page cache, bytes.
    pub meta_cache_bytes: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            txg_timeout_secs: 5.0,
            dirty_max_bytes: 256 << 20,
            block_cache_bytes: 128 << 20,
            meta_cache_bytes: 64 << 20,
        }
    }
}

/// One segment of a read: data, or a range that was never written (reads as zeros).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadSegment {
    Data(Vec<u8>),
    Hole(u64),
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
    _private: (),
}

/// An open volume; what the NBD server reads and writes. Cheap to clone via Arc.
pub struct Volume {
    _private: (),
}

impl Engine {
    /// Opens the state directory and imports every pool its cache file names.
    pub fn open(_state_dir: &Path, _config: EngineConfig) -> Result<Arc<Engine>> {
        todo!()
    }
    pub fn state_dir(&self) -> &Path {
        todo!()
    }
    pub fn create_pool(&self, _spec: PoolSpec) -> Result<PoolStatus> {
        todo!()
    }
    pub fn list_pools(&self) -> Vec<PoolSummary> {
        todo!()
    }
    pub fn pool_status(&self, _pool: &str) -> Result<PoolStatus> {
        todo!()
    }
    /// Destroys the pool: its labels are wiped, its data is gone.
    pub fn destroy_pool(&self, _pool: &str) -> Result<()> {
        todo!()
    }
    /// Commits everything, closes the devices and forgets the pool (it stays importable).
    pub fn export_pool(&self, _pool: &str) -> Result<()> {
        todo!()
    }
    /// Pools found in labels of devices in `dirs` (files and block devices) that are not imported.
    pub fn importable_pools(&self, _dirs: &[PathBuf]) -> Result<Vec<ImportablePool>> {
        todo!()
    }
    /// Imports `pool` (by name or numeric guid) found in `dirs`.
    pub fn import_pool(&self, _pool: &str, _dirs: &[PathBuf]) -> Result<PoolStatus> {
        todo!()
    }
    /// `cistern create -V SIZE -o k=v POOL/VOL`.
    pub fn create_volume(&self, _name: &str, _volsize: u64, _props: &[(String, String)]) -> Result<DatasetInfo> {
        todo!()
    }
    /// All datasets, or those at and below `root`, sorted by name.
    pub fn list_datasets(&self, _root: Option<&str>) -> Result<Vec<DatasetInfo>> {
        todo!()
    }
    pub fn dataset(&self, _name: &str) -> Result<DatasetInfo> {
        todo!()
    }
    /// `cistern set prop=value ds`. Read-only statistics refuse; volsize may only grow.
    pub fn set_property(&self, _name: &str, _prop: &str, _value: &str) -> Result<()> {
        todo!()
    }
    pub fn destroy_dataset(&self, _name: &str) -> Result<()> {
        todo!()
    }
    /// Opens a volume for I/O. `name` is `pool/vol`.
    pub fn open_volume(&self, _name: &str) -> Result<Arc<Volume>> {
        todo!()
    }
    /// Names of all volumes of all imported pools (the NBD export list).
    pub fn volume_names(&self) -> Vec<String> {
        todo!()
    }
    pub fn stats(&self) -> Vec<PoolStats> {
        todo!()
    }
    /// Commits every pool's open txg and closes them. Idempotent.
    pub fn shutdown(&self) -> Result<()> {
        todo!()
    }
}

impl Volume {
    pub fn name(&self) -> String {
        todo!()
    }
    pub fn size(&self) -> u64 {
        todo!()
    }
    pub fn block_size(&self) -> u32 {
        todo!()
    }
    pub fn read_only(&self) -> bool {
        todo!()
    }
    /// Reads `len` bytes at `offset`; never-written ranges come back as holes.
    /// Every byte returned was verified against its checksum.
    pub fn read(&self, _offset: u64, _len: u64) -> Result<Vec<ReadSegment>> {
        todo!()
    }
    /// Writes; with `fua` returns only once the data is durable.
    pub fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> Result<()> {
        todo!()
    }
    /// Makes every write completed before the call (on any connection) durable.
    pub fn flush(&self) -> Result<()> {
        todo!()
    }
    /// Deallocates; the range reads as zeros afterwards.
    pub fn trim(&self, _offset: u64, _len: u64, _fua: bool) -> Result<()> {
        todo!()
    }
    /// Zeroes the range. With `allocate` (NBD_CMD_FLAG_NO_HOLE) space stays allocated.
    pub fn write_zeroes(&self, _offset: u64, _len: u64, _allocate: bool, _fua: bool) -> Result<()> {
        todo!()
    }
    /// Allocation map of the range, in order, covering it exactly.
    pub fn allocation(&self, _offset: u64, _len: u64) -> Result<Vec<Extent>> {
        todo!()
    }
}

