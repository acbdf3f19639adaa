//! The metadata store: redb on the pool's mirrored metadata region.

mod backend;
pub mod schema;

pub use backend::{usage, verify_all, MetaScrubReport, RegionBackend, REGION_FORMAT};
pub use redb;

use pool::MirroredRegion;
use redb::{Database, ReadableDatabase};

/// Version of the metadata format: the table layout in `schema.rs` (stored
/// in POOL_RECORDS) and the region layout of `backend.rs` (stored in its
/// header slots). 2: per-page checksums (decision 0007). Format 1 is
/// refused by name ([`MetaError::Older`]).
pub const META_FORMAT_VERSION: u64 = 3;
/// The oldest format `open` accepts: older ones are converted by
/// `dataset` (`pool upgrade`, decision 0017) before anything else reads them.
pub const META_FORMAT_UPGRADABLE: u64 = 2;
/// Format 3 with encrypted datasets (decision 0026): recorded when a pool's
/// first encryption root is created (as a ZFS feature becomes active), so
/// builds before encryption refuse the pool by name instead of replaying
/// sealed intent-log records as data. New pools are still created as 3.
pub const META_FORMAT_ENCRYPTION: u64 = 4;
/// Format 4 with sealed directory names (decision 0035): recorded when a
/// pool's first encrypted dataset with sealed names is created, so builds
/// before it refuse the pool instead of reading hashed rows as names.
pub const META_FORMAT_SEALED_NAMES: u64 = 5;

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata store: {0}")]
    Store(String),
    #[error("metadata format version {found} is newer than this build understands ({META_FORMAT_SEALED_NAMES})")]
    Newer { found: u64 },
    #[error("metadata format version {found} ({what}) is older than this build reads ({META_FORMAT_UPGRADABLE} and later); import the pool with the build that created it and copy its data to a new pool")]
    Older { found: u64, what: &'static str },
    #[error("metadata region: {0}")]
    Region(String),
}

macro_rules! store_err {
    ($($t:ty),*) => {$(impl From<$t> for MetaError {
        fn from(e: $t) -> Self { MetaError::Store(e.to_string()) }
    })*};
}
store_err!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

/// Creates an empty store on a new pool's metadata region.
pub fn create(region: MirroredRegion, cache_bytes: usize) -> Result<Database, MetaError> {
    let backend = RegionBackend::format(region).map_err(|e| MetaError::Region(e.to_string()))?;
    let db = Database::builder()
        .set_cache_size(cache_bytes)
        .create_with_backend(backend)?;
    let tx = db.begin_write()?;
    {
        let mut t = tx.open_table(schema::POOL_RECORDS)?;
        t.insert(schema::RECORD_FORMAT, META_FORMAT_VERSION)?;
        t.insert(schema::RECORD_TXG, 0)?;
        t.insert(schema::RECORD_NEXT_DATASET, 1)?;
        tx.open_table(schema::DATASETS)?;
        tx.open_table(schema::BLOCK_MAP)?;
        tx.open_table(schema::DEAD_LIST)?;
    }
    tx.commit()?;
    Ok(db)
}

/// Opens an existing pool's store, refusing a newer format by name.
pub fn open(region: MirroredRegion, cache_bytes: usize) -> Result<Database, MetaError> {
    let backend = RegionBackend::open(region)?;
    let watch = backend.watch_repair();
    let db = Database::builder()
        .set_cache_size(cache_bytes)
        .set_repair_callback(watch.callback())
        .create_with_backend(backend)?;
    let cleared = watch
        .finish()
        .map_err(|e| MetaError::Region(e.to_string()))?;
    if cleared > 0 {
        tracing::info!(
            pages = cleared,
            "metadata pages left by an interrupted commit are free; their checksums dropped"
        );
    }
    let found = {
        let tx = db.begin_read()?;
        let t = tx.open_table(schema::POOL_RECORDS)?;
        let v = t.get(schema::RECORD_FORMAT)?.map(|v| v.value());
        v
    };
    match found {
        Some(v) if (META_FORMAT_UPGRADABLE..=META_FORMAT_SEALED_NAMES).contains(&v) => Ok(db),
        Some(v) if v < META_FORMAT_VERSION => Err(MetaError::Older {
            found: v,
            what: "older table layout",
        }),
        Some(v) => Err(MetaError::Newer { found: v }),
        None => Err(MetaError::Store(
            "no format record: not a Cistern metadata store".into(),
        )),
    }
}
