//! The block map: versions of every row of every dataset — the blocks of
//! its objects and the names of its directories — and how a dataset, a
//! snapshot or a clone resolves a row to one of them.
//!
//! BLOCK_MAP holds `(dataset, address, birth) -> value`; an empty value is
//! a tombstone (a hole or a removed name that hides older versions). A
//! reader at txg bound `T` takes the newest version born at or before `T`.
//! A clone's lookups that find no version of their own fall through to the
//! origin at the origin snapshot's txg: a [`Chain`] lists those levels.
//! Blocks and names follow the same rules, so snapshots, clones, rollback,
//! dead lists and diff treat them alike (decision 0017).

use crate::props::DatasetRecord;
use crate::{Error, Result};
use block::BlockPointer;
use meta::redb::ReadableTable;
use std::collections::{BTreeMap, BTreeSet};

/// Clones of clones are bounded: deeper chains are refused at clone time.
pub const MAX_CHAIN: usize = 64;

/// Where a reader looks for rows: (dataset id, highest birth txg seen), nearest first.
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

    /// The origin levels only (what a clone sees below its own rows).
    pub fn below(&self) -> Chain {
        Chain(self.0[1..].to_vec())
    }
}

/// Key of a BLOCK_MAP row as stored: (dataset, address, birth).
pub(crate) type Key = (u64, Vec<u8>, u64);
/// The table type BLOCK_MAP opens as.
pub(crate) type KeyType = (u64, &'static [u8], u64);

const BLOCK_TAG: u8 = 0;
pub(crate) const NAME_TAG: u8 = 1;

/// A row's address inside its dataset.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Addr {
    /// Block `blk` of object `obj` (`objects::ATTR_BLOCK`: its attributes).
    Block { obj: u64, blk: u64 },
    /// A name in directory object `dir`.
    Name { dir: u64, name: String },
}

/// The address of a block: big endian, so an object's blocks sort by index.
pub fn block_addr(obj: u64, blk: u64) -> [u8; 17] {
    let mut a = [0u8; 17];
    a[0] = BLOCK_TAG;
    a[1..9].copy_from_slice(&obj.to_be_bytes());
    a[9..].copy_from_slice(&blk.to_be_bytes());
    a
}

/// The address of a name; names of one directory sort bytewise.
pub fn name_addr(dir: u64, name: &str) -> Vec<u8> {
    let mut a = Vec::with_capacity(9 + name.len());
    a.push(NAME_TAG);
    a.extend_from_slice(&dir.to_be_bytes());
    a.extend_from_slice(name.as_bytes());
    a
}

impl Addr {
    #[cfg(test)]
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Addr::Block { obj, blk } => block_addr(*obj, *blk).to_vec(),
            Addr::Name { dir, name } => name_addr(*dir, name),
        }
    }

    pub fn parse(a: &[u8]) -> Result<Addr> {
        let bad = || Error::Corrupt(format!("block map address {a:02x?}"));
        let id =
            |b: &[u8]| -> Result<u64> { Ok(u64::from_be_bytes(b.try_into().map_err(|_| bad())?)) };
        match a.first() {
            Some(&BLOCK_TAG) if a.len() == 17 => Ok(Addr::Block {
                obj: id(&a[1..9])?,
                blk: id(&a[9..17])?,
            }),
            Some(&NAME_TAG) if a.len() >= 9 => Ok(Addr::Name {
                dir: id(&a[1..9])?,
                name: String::from_utf8(a[9..].to_vec()).map_err(|_| bad())?,
            }),
            _ => Err(bad()),
        }
    }
}

/// (object, block) of a block address; `None` for a name.
pub(crate) fn block_of(a: &[u8]) -> Option<(u64, u64)> {
    (a.len() == 17 && a[0] == BLOCK_TAG).then(|| {
        (
            u64::from_be_bytes(a[1..9].try_into().unwrap_or_default()),
            u64::from_be_bytes(a[9..17].try_into().unwrap_or_default()),
        )
    })
}

use crate::txg::meta_err;

/// The block pointer of a row (`None`: a tombstone, or a name: no block).
pub(crate) fn decode(addr: &[u8], bytes: &[u8]) -> Result<Option<BlockPointer>> {
    if bytes.is_empty() || block_of(addr).is_none() {
        return Ok(None);
    }
    BlockPointer::decode(bytes).map(Some).map_err(|e| {
        Error::Corrupt(format!(
            "{:?}: {e}",
            Addr::parse(addr).unwrap_or(Addr::Block { obj: 0, blk: 0 })
        ))
    })
}

/// Allocated and logical bytes a row's value accounts for (0 for names and tombstones).
pub(crate) fn sizes(addr: &[u8], bytes: &[u8]) -> Result<(u64, u64)> {
    Ok(decode(addr, bytes)?.map_or((0, 0), |bp| (bp.asize(), bp.lsize as u64)))
}

/// The newest version of one row born at or before `bound`: its birth and
/// value (empty for a tombstone).
pub(crate) fn newest<T>(t: &T, ds: u64, addr: &[u8], bound: u64) -> Result<Option<(u64, Vec<u8>)>>
where
    T: ReadableTable<KeyType, &'static [u8]>,
{
    let row = t
        .range((ds, addr, 0)..=(ds, addr, bound))
        .map_err(meta_err)?
        .next_back()
        .transpose()
        .map_err(meta_err)?;
    Ok(row.map(|(k, v)| (k.value().2, v.value().to_vec())))
}

/// One row as `chain` sees it: its value, `None` for a hole or no name.
pub(crate) fn resolve<T>(t: &T, chain: &Chain, addr: &[u8]) -> Result<Option<Vec<u8>>>
where
    T: ReadableTable<KeyType, &'static [u8]>,
{
    for &(ds, bound) in &chain.0 {
        if let Some((_, v)) = newest(t, ds, addr, bound)? {
            return Ok((!v.is_empty()).then_some(v));
        }
    }
    Ok(None)
}

/// Rows with addresses in [lo, hi] as `chain` sees them (tombstones left
/// out), one range scan per level, in address order.
pub(crate) fn resolve_range<T>(
    t: &T,
    chain: &Chain,
    lo: &[u8],
    hi: &[u8],
) -> Result<BTreeMap<Vec<u8>, Vec<u8>>>
where
    T: ReadableTable<KeyType, &'static [u8]>,
{
    let mut out = BTreeMap::new();
    // Rows a nearer level decided (data or tombstone): deeper levels skip them.
    let mut decided: BTreeSet<Vec<u8>> = BTreeSet::new();
    for &(ds, bound) in &chain.0 {
        // Versions of one row come oldest first: the last one at or below the bound wins.
        let mut level: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        for row in t
            .range((ds, lo, 0)..=(ds, hi, u64::MAX))
            .map_err(meta_err)?
        {
            let (k, v) = row.map_err(meta_err)?;
            let (_, addr, birth) = k.value();
            if birth > bound || decided.contains(addr) {
                continue;
            }
            match level.last_mut() {
                Some((a, bytes)) if a.as_slice() == addr => *bytes = v.value().to_vec(),
                _ => level.push((addr.to_vec(), v.value().to_vec())),
            }
        }
        let deeper = chain.0.len() > 1;
        for (addr, bytes) in level {
            if deeper {
                decided.insert(addr.clone());
            }
            if !bytes.is_empty() {
                out.insert(addr, bytes);
            }
        }
    }
    Ok(out)
}

/// Blocks [first, last] of object `obj` as `chain` sees them: data pointers
/// of the blocks that are not holes.
pub(crate) fn resolve_blocks<T>(
    t: &T,
    chain: &Chain,
    obj: u64,
    first: u64,
    last: u64,
) -> Result<BTreeMap<u64, BlockPointer>>
where
    T: ReadableTable<KeyType, &'static [u8]>,
{
    let (lo, hi) = (block_addr(obj, first), block_addr(obj, last));
    let mut out = BTreeMap::new();
    if let [(ds, bound)] = chain.0[..] {
        // Not a clone (every read of a volume or object head): one scan,
        // decoded in place. Versions of a block come oldest first, so the
        // last one within the bound decides.
        for row in t
            .range((ds, &lo[..], 0)..=(ds, &hi[..], u64::MAX))
            .map_err(meta_err)?
        {
            let (k, v) = row.map_err(meta_err)?;
            let (_, addr, birth) = k.value();
            let Some((_, blk)) = block_of(addr).filter(|_| birth <= bound) else {
                continue;
            };
            match decode(addr, v.value())? {
                Some(bp) => out.insert(blk, bp),
                None => out.remove(&blk),
            };
        }
        return Ok(out);
    }
    for (addr, v) in resolve_range(t, chain, &lo, &hi)? {
        if let (Some((_, blk)), Some(bp)) = (block_of(&addr), decode(&addr, &v)?) {
            out.insert(blk, bp);
        }
    }
    Ok(out)
}

/// Blocks in [first, last] of object `obj` of dataset `ds` with a version
/// born in (after, upto]: what changed between two points of one dataset's history.
#[allow(clippy::too_many_arguments)]
pub(crate) fn changed_blocks<T>(
    t: &T,
    ds: u64,
    obj: u64,
    first: u64,
    last: u64,
    after: u64,
    upto: u64,
) -> Result<BTreeSet<u64>>
where
    T: ReadableTable<KeyType, &'static [u8]>,
{
    let mut out = BTreeSet::new();
    let (lo, hi) = (block_addr(obj, first), block_addr(obj, last));
    for row in t
        .range((ds, &lo[..], 0)..=(ds, &hi[..], u64::MAX))
        .map_err(meta_err)?
    {
        let (k, _) = row.map_err(meta_err)?;
        let (_, addr, birth) = k.value();
        if birth > after && birth <= upto {
            if let Some((_, blk)) = block_of(addr) {
                out.insert(blk);
            }
        }
    }
    Ok(out)
}

/// The first address after every name of `dir` that starts with `prefix`
/// (exclusive bound), or `None` when no such bound exists (all 0xff).
pub(crate) fn prefix_end(mut a: Vec<u8>) -> Option<Vec<u8>> {
    while let Some(last) = a.pop() {
        if last < 0xff {
            a.push(last + 1);
            return Some(a);
        }
    }
    None
}

/// Names in [lo, hi) (name addresses of one directory) as `chain` sees
/// them, in order, read lazily: a page of a large directory reads a page of
/// rows. Tombstones are skipped.
pub(crate) struct NameScan<'a> {
    rows: NameRows<'a>,
    peeked: Option<(String, Vec<u8>)>,
    hi: Vec<u8>,
}

enum NameRows<'a> {
    /// A dataset that is not a clone: one range, read as it goes.
    One {
        range: Box<meta::redb::Range<'a, KeyType, &'static [u8]>>,
        bound: u64,
        /// A row read ahead: the first version of the next address.
        ahead: Option<(Vec<u8>, u64, Vec<u8>)>,
    },
    /// A clone: levels merged up front (rare; bounded by the range).
    Merged(std::vec::IntoIter<(Vec<u8>, Vec<u8>)>),
}

impl<'a> NameScan<'a> {
    pub(crate) fn new<T>(t: &'a T, chain: &Chain, lo: &[u8], hi: &[u8]) -> Result<NameScan<'a>>
    where
        T: ReadableTable<KeyType, &'static [u8]>,
    {
        let rows = if chain.0.len() == 1 {
            let (ds, bound) = chain.0[0];
            NameRows::One {
                range: Box::new(t.range((ds, lo, 0)..(ds, hi, 0)).map_err(meta_err)?),
                bound,
                ahead: None,
            }
        } else {
            let all = resolve_range(t, chain, lo, hi)?;
            NameRows::Merged(
                all.into_iter()
                    .filter(|(a, _)| a.as_slice() < hi)
                    .collect::<Vec<_>>()
                    .into_iter(),
            )
        };
        Ok(NameScan {
            rows,
            peeked: None,
            hi: hi.to_vec(),
        })
    }

    fn read(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        match &mut self.rows {
            NameRows::Merged(it) => Ok(it.next()),
            NameRows::One {
                range,
                bound,
                ahead,
            } => loop {
                // The versions of one address, oldest first: keep the newest within the bound.
                let first = match ahead.take() {
                    Some(r) => r,
                    None => match range.next() {
                        None => return Ok(None),
                        Some(row) => {
                            let (k, v) = row.map_err(meta_err)?;
                            let (_, a, b) = k.value();
                            (a.to_vec(), b, v.value().to_vec())
                        }
                    },
                };
                let (addr, mut best) = (first.0.clone(), (first.1 <= *bound).then_some(first.2));
                for row in range.by_ref() {
                    let (k, v) = row.map_err(meta_err)?;
                    let (_, a, b) = k.value();
                    if a != addr.as_slice() {
                        *ahead = Some((a.to_vec(), b, v.value().to_vec()));
                        break;
                    }
                    if b <= *bound {
                        best = Some(v.value().to_vec());
                    }
                }
                match best {
                    Some(v) if !v.is_empty() && addr < self.hi => return Ok(Some((addr, v))),
                    _ => continue,
                }
            },
        }
    }

    /// The next row (address, value) as stored, whatever its layout
    /// (`crate::namerow` opens it); not to be mixed with `peek`/`next`.
    pub(crate) fn next_row(&mut self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        self.read()
    }

    /// The next name and its value, without consuming it.
    pub(crate) fn peek(&mut self) -> Result<Option<&(String, Vec<u8>)>> {
        if self.peeked.is_none() {
            self.peeked = match self.read()? {
                None => None,
                Some((addr, v)) => match Addr::parse(&addr)? {
                    Addr::Name { name, .. } => Some((name, v)),
                    Addr::Block { .. } => None,
                },
            };
        }
        Ok(self.peeked.as_ref())
    }

    pub(crate) fn next(&mut self) -> Result<Option<(String, Vec<u8>)>> {
        self.peek()?;
        Ok(self.peeked.take())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_sort() {
        let a = Addr::Block { obj: 7, blk: 300 };
        assert_eq!(Addr::parse(&a.encode()).unwrap(), a);
        let n = Addr::Name {
            dir: 2,
            name: "photos/2024/a.jpg".into(),
        };
        assert_eq!(Addr::parse(&n.encode()).unwrap(), n);
        // Blocks of one object sort numerically, before any name.
        assert!(block_addr(1, 9) < block_addr(1, 10));
        assert!(block_addr(1, u64::MAX) < block_addr(2, 0));
        assert!(block_addr(u64::MAX, u64::MAX).to_vec() < name_addr(0, ""));
        assert!(name_addr(2, "a") < name_addr(2, "a/b"));
        assert!(Addr::parse(&[9, 1]).is_err());
        assert_eq!(prefix_end(vec![1, 2, 0xff]), Some(vec![1, 3]));
        assert_eq!(prefix_end(vec![0xff]), None);
    }
}
