//! Metadata format conversions (`cistern pool upgrade`, as zpool upgrade).
//!
//! A pool whose store is older than this build's format is not imported
//! until it is converted: the import is refused naming the command, and
//! `pool upgrade POOL` converts it in one metadata transaction (so a crash
//! leaves the old format whole) and imports it. One way: older builds
//! refuse the new format by name.
//!
//! 2 -> 3 (decision 0017): the block map gains objects. Format 2 keyed
//! blocks `(dataset, block, birth)` (volumes only); format 3 keys every row
//! `(dataset, address, birth)`, and a volume's blocks are object
//! `VOLUME_OBJECT`'s.

use crate::blockmap::block_addr;
use crate::objects::VOLUME_OBJECT;
use crate::txg::meta_err;
use crate::{Error, Result};
use meta::redb::{Database, ReadableDatabase, ReadableTable, TableHandle};
use meta::schema::*;

/// The format recorded in a store.
pub(crate) fn format_of(db: &Database) -> Result<u64> {
    let tx = db.begin_read().map_err(meta_err)?;
    let r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
    let v = r.get(RECORD_FORMAT).map_err(meta_err)?.map(|v| v.value());
    v.ok_or_else(|| Error::Corrupt("no metadata format record".into()))
}

/// Why a pool is not imported as it is.
pub(crate) fn needs_upgrade(pool: &str, found: u64) -> Error {
    Error::NeedsUpgrade(format!(
        "pool '{pool}' has metadata format {found}, from before the object layer (this build \
         uses {}): run `cistern pool upgrade {pool}` to convert it; older builds cannot import \
         it afterwards",
        meta::META_FORMAT_VERSION
    ))
}

/// Converts a store to this build's format; returns what it did, one line per step.
pub(crate) fn upgrade(db: &Database) -> Result<Vec<String>> {
    let mut done = Vec::new();
    if format_of(db)? == 2 {
        let rows = upgrade_2_to_3(db)?;
        done.push(format!(
            "metadata format 2 -> 3: {rows} block map rows moved under object {VOLUME_OBJECT}"
        ));
    }
    Ok(done)
}

fn upgrade_2_to_3(db: &Database) -> Result<u64> {
    let tx = db.begin_write().map_err(meta_err)?;
    let mut rows = 0u64;
    {
        let has = |name: &str| -> Result<bool> {
            Ok(tx
                .list_tables()
                .map_err(meta_err)?
                .any(|t| t.name() == name))
        };
        let mut map = tx.open_table(BLOCK_MAP).map_err(meta_err)?;
        let mut dead = tx.open_table(DEAD_LIST).map_err(meta_err)?;
        if has(BLOCKS_V2.name())? {
            let old = tx.open_table(BLOCKS_V2).map_err(meta_err)?;
            for row in old.iter().map_err(meta_err)? {
                let (k, v) = row.map_err(meta_err)?;
                let (ds, blk, birth) = k.value();
                map.insert((ds, &block_addr(VOLUME_OBJECT, blk)[..], birth), v.value())
                    .map_err(meta_err)?;
                rows += 1;
            }
            drop(old);
            tx.delete_table(BLOCKS_V2).map_err(meta_err)?;
        }
        if has(DEADLIST_V2.name())? {
            let old = tx.open_table(DEADLIST_V2).map_err(meta_err)?;
            for row in old.iter().map_err(meta_err)? {
                let (k, v) = row.map_err(meta_err)?;
                let (ds, death, blk, birth) = k.value();
                let addr = block_addr(VOLUME_OBJECT, blk);
                dead.insert((ds, death, &addr[..], birth), v.value())
                    .map_err(meta_err)?;
            }
            drop(old);
            tx.delete_table(DEADLIST_V2).map_err(meta_err)?;
        }
        let mut r = tx.open_table(POOL_RECORDS).map_err(meta_err)?;
        // A scan position and listed errors name volume blocks: object 1 now.
        r.insert(RECORD_SCAN_POS_OBJECT, VOLUME_OBJECT)
            .map_err(meta_err)?;
        let errors: Vec<(String, u64)> = r
            .range::<&str>(RECORD_SCAN_ERROR_PREFIX.."scan_error0")
            .map_err(meta_err)?
            .map(|row| row.map(|(k, v)| (k.value().to_string(), v.value())))
            .collect::<std::result::Result<_, _>>()
            .map_err(meta_err)?;
        for (k, birth) in errors {
            r.remove(k.as_str()).map_err(meta_err)?;
            let rest = &k[RECORD_SCAN_ERROR_PREFIX.len()..];
            if let Some((ds, blk)) = rest.split_once('/') {
                let new = format!("{RECORD_SCAN_ERROR_PREFIX}{ds}/{VOLUME_OBJECT}/{blk}");
                r.insert(new.as_str(), birth).map_err(meta_err)?;
            }
        }
        r.insert(RECORD_FORMAT, 3).map_err(meta_err)?;
    }
    tx.commit().map_err(meta_err)?;
    Ok(rows)
}
