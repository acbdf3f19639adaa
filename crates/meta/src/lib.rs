//! The metadata store: redb on the pool's mirrored metadata region.

mod backend;
pub mod schema;

pub use backend::RegionBackend;
pub use redb;

use pool::MirroredRegion;
use redb::{Database, ReadableDatabase};

/// Version of the table layout in `schema.rs`; stored in POOL_RECORDS.
pub const META_FORMAT_VERSION: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum MetaError {
    #[error("metadata store: {0}")]
    Store(String),
    #[error("metadata format version {found} is newer than this build understands ({META_FORMAT_VERSION})")]
    Newer { found: u64 },
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
        tx.open_table(schema::BLOCKS)?;
    }
    tx.commit()?;
    Ok(db)
}

/// Opens an existing pool's store, refusing a newer format by name.
pub fn open(region: MirroredRegion, cache_bytes: usize) -> Result<Database, MetaError> {
    let backend = RegionBackend::open(region).map_err(|e| MetaError::Region(e.to_string()))?;
    let db = Database::builder()
        .set_cache_size(cache_bytes)
        .create_with_backend(backend)?;
    let found = {
        let tx = db.begin_read()?;
        let t = tx.open_table(schema::POOL_RECORDS)?;
        let v = t.get(schema::RECORD_FORMAT)?.map(|v| v.value());
        v
    };
    match found {
        Some(v) if v <= META_FORMAT_VERSION => Ok(db),
        Some(v) => Err(MetaError::Newer { found: v }),
        None => Err(MetaError::Store(
            "no format record: not a Cistern metadata store".into(),
        )),
    }
}
