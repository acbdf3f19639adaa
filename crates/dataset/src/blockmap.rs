//! The block map: versions of every block of every dataset, and how a
//! dataset, a snapshot or a clone resolves a block to one of them.
//!
//! BLOCKS holds `(dataset, block, birth) -> pointer`; an empty value is a
//! tombstone (a hole that hides older versions). A reader at txg bound `T`
//! takes the newest version born at or before `T`. A clone's lookups that
//! find no version of their own fall through to the origin at the origin
//! snapshot's txg: a [`Chain`] lists those levels.

use crate::props::DatasetRecord;
use crate::{Error, Result};
use block::BlockPointer;
use meta::redb::ReadableTable;
use std::collections::{BTreeMap, BTreeSet};

/// Clones of clones are bounded: deeper chains are refused at clone time.
pub const MAX_CHAIN: usize = 64;

/// Where a reader looks for blocks: (dataset id, highest birth txg seen), nearest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chain(pub Vec<(u64, u64)>);

impl Chain {
    /// The chain of a dataset or snapshot record; `datasets` is every record of the pool.
    pub fn of<'a>(
        rec: &'a DatasetRecord,
        datasets: impl Iterator<Item = &'a DatasetRecord> + Clone,
    ) -> Chain {
        let bound = if rec.is_snapshot() {
            rec.created_txg
        } else {
            u64::MAX
        };
        let mut levels = vec![(rec.data_id(), bound)];
        let by_id = |id: u64| datasets.clone().find(|r| r.id == id);
        // Only clones (and their snapshots) look further: the common case costs one lookup at most.
        let mut head = if rec.is_snapshot() {
            by_id(rec.data_id())
        } else {
            Some(rec)
        };
        while let Some(origin) = head.and_then(|h| h.origin.as_ref()) {
            if levels.len() >= MAX_CHAIN {
                break;
            }
            levels.push((origin.dataset, origin.txg));
            head = by_id(origin.dataset);
        }
        Chain(levels)
    }

    pub fn data_id(&self) -> u64 {
        self.0[0].0
    }

    /// The origin levels only (what a clone sees below its own blocks).
    pub fn below(&self) -> Chain {
        Chain(self.0[1..].to_vec())
    }
}

pub(crate) type Key = (u64, u64, u64);

use crate::txg::meta_err;

pub(crate) fn decode(blk: u64, bytes: &[u8]) -> Result<Option<BlockPointer>> {
    if bytes.is_empty() {
        return Ok(None);
    }
    BlockPointer::decode(bytes)
        .map(Some)
        .map_err(|e| Error::Corrupt(format!("block {blk}: {e}")))
}

/// The newest version of one block born at or before `bound`: its birth and
/// pointer (`None` for a tombstone).
pub(crate) fn newest<T>(
    t: &T,
    ds: u64,
    blk: u64,
    bound: u64,
) -> Result<Option<(u64, Option<BlockPointer>)>>
where
    T: ReadableTable<Key, &'static [u8]>,
{
    let row = t
        .range((ds, blk, 0)..=(ds, blk, bound))
        .map_err(meta_err)?
        .next_back()
        .transpose()
        .map_err(meta_err)?;
    match row {
        None => Ok(None),
        Some((k, v)) => Ok(Some((k.value().2, decode(blk, v.value())?))),
    }
}

/// One block as `chain` sees it: the data pointer, or `None` for a hole.
pub(crate) fn resolve<T>(t: &T, chain: &Chain, blk: u64) -> Result<Option<BlockPointer>>
where
    T: ReadableTable<Key, &'static [u8]>,
{
    for &(ds, bound) in &chain.0 {
        if let Some((_, bp)) = newest(t, ds, blk, bound)? {
            return Ok(bp);
        }
    }
    Ok(None)
}

/// Blocks [first, last] as `chain` sees them: data pointers of the blocks
/// that are not holes, one range scan per level.
pub(crate) fn resolve_range<T>(
    t: &T,
    chain: &Chain,
    first: u64,
    last: u64,
) -> Result<BTreeMap<u64, BlockPointer>>
where
    T: ReadableTable<Key, &'static [u8]>,
{
    let mut out = BTreeMap::new();
    // Blocks a nearer level decided (data or tombstone): deeper levels skip them.
    let mut decided: BTreeSet<u64> = BTreeSet::new();
    for &(ds, bound) in &chain.0 {
        // Versions of one block come oldest first: the last one at or below the bound wins.
        let mut level: Vec<(u64, Vec<u8>)> = Vec::new();
        for row in t
            .range((ds, first, 0)..=(ds, last, u64::MAX))
            .map_err(meta_err)?
        {
            let (k, v) = row.map_err(meta_err)?;
            let (_, blk, birth) = k.value();
            if birth > bound || decided.contains(&blk) {
                continue;
            }
            match level.last_mut() {
                Some((b, bytes)) if *b == blk => *bytes = v.value().to_vec(),
                _ => level.push((blk, v.value().to_vec())),
            }
        }
        let deeper = chain.0.len() > 1;
        for (blk, bytes) in level {
            if deeper {
                decided.insert(blk);
            }
            if let Some(bp) = decode(blk, &bytes)? {
                out.insert(blk, bp);
            }
        }
    }
    Ok(out)
}

/// Blocks in [first, last] of dataset `ds` with a version born in (after, upto]:
/// what changed between two points of one dataset's history.
pub(crate) fn changed_blocks<T>(
    t: &T,
    ds: u64,
    first: u64,
    last: u64,
    after: u64,
    upto: u64,
) -> Result<BTreeSet<u64>>
where
    T: ReadableTable<Key, &'static [u8]>,
{
    let mut out = BTreeSet::new();
    for row in t
        .range((ds, first, 0)..=(ds, last, u64::MAX))
        .map_err(meta_err)?
    {
        let (k, _) = row.map_err(meta_err)?;
        let (_, blk, birth) = k.value();
        if birth > after && birth <= upto {
            out.insert(blk);
        }
    }
    Ok(out)
}
