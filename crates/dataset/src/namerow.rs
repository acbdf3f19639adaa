//! Where a name of a directory is stored in the block map (decision 0035):
//! the one function pair [`NameLayout::addr`] / [`NameLayout::open_row`]
//! that maps a logical `(dir, name)` to its row and back. Every reader and
//! writer of name rows (lookups, listings, the txg commit, diff) goes
//! through it; the layers above the object layer never see it.
//!
//! - [`NameLayout::Plain`]: the row address is `0x01 | dir | name bytes`
//!   and the value the target id, so a directory's rows sort by name
//!   (decision 0017). Plain datasets, and encrypted datasets made before
//!   decision 0035 (their record says `names: 0`).
//! - [`NameLayout::Sealed`]: encrypted datasets made since. The address is
//!   `0x01 | dir | first 16 bytes of the keyed hash of (dir, name)` and the
//!   value `seal(target | name)` bound to that address, so the devices show
//!   neither names nor their order. Lookups hash; listings decrypt a
//!   directory's rows and keep the smallest names above the cursor (see
//!   [`list_sealed`]).

use crate::blockmap::{self, Chain, NAME_TAG};
use crate::txg::ImportedPool;
use crate::{Error, Result};
use block::crypt::MasterKey;
use std::collections::BTreeMap;
use std::sync::Arc;

/// `CryptRecord::names` of datasets whose name rows are sealed.
pub const NAMES_SEALED: u8 = 1;
/// Bytes of the keyed hash kept in a sealed row's address: a collision
/// needs ~2^64 names in one directory; [`NameLayout::open_row`] checks the
/// sealed name anyway, so a collision is an error, never a wrong object.
const HASH_LEN: usize = 16;

/// How one dataset stores its names.
#[derive(Clone)]
pub(crate) enum NameLayout {
    Plain,
    Sealed(Arc<MasterKey>),
}

impl NameLayout {
    /// The layout of dataset (or snapshot) `id`; an encrypted dataset with
    /// sealed names needs its key loaded.
    pub(crate) fn of(p: &ImportedPool, id: u64) -> Result<NameLayout> {
        let sealed = {
            let datasets = p.datasets.read();
            crate::crypt::crypt_of(&datasets, id).is_some_and(|c| c.names >= NAMES_SEALED)
        };
        if !sealed {
            return Ok(NameLayout::Plain);
        }
        match p.key_of(id)? {
            Some(k) => Ok(NameLayout::Sealed(k)),
            None => Err(Error::Corrupt(format!(
                "dataset {id}: sealed names without an encryption record"
            ))),
        }
    }

    /// Names come out of a range scan in byte order (plain rows).
    pub(crate) fn sorted(&self) -> bool {
        matches!(self, NameLayout::Plain)
    }

    /// The row address of `dir/name`.
    pub(crate) fn addr(&self, dir: u64, name: &str) -> Vec<u8> {
        match self {
            NameLayout::Plain => blockmap::name_addr(dir, name),
            NameLayout::Sealed(k) => {
                let h = k.name_hash(&dir.to_be_bytes(), name.as_bytes());
                let mut a = Vec::with_capacity(9 + HASH_LEN);
                a.push(NAME_TAG);
                a.extend_from_slice(&dir.to_be_bytes());
                a.extend_from_slice(&h[..HASH_LEN]);
                a
            }
        }
    }

    /// The value of `dir/name`'s row pointing at `target` (`None`: a tombstone).
    pub(crate) fn value(&self, dir: u64, name: &str, target: Option<u64>) -> Option<Vec<u8>> {
        let t = target?;
        Some(match self {
            NameLayout::Plain => t.to_le_bytes().to_vec(),
            NameLayout::Sealed(k) => {
                let mut plain = Vec::with_capacity(8 + name.len());
                plain.extend_from_slice(&t.to_le_bytes());
                plain.extend_from_slice(name.as_bytes());
                k.seal(&aad(&self.addr(dir, name)), &plain)
            }
        })
    }

    /// Back from a (non-tombstone) row: its directory, name and target.
    pub(crate) fn open_row(&self, addr: &[u8], value: &[u8]) -> Result<(u64, String, u64)> {
        let dir = dir_of(addr)?;
        match self {
            NameLayout::Plain => match blockmap::Addr::parse(addr)? {
                blockmap::Addr::Name { name, .. } => Ok((dir, name, target_of(value)?)),
                blockmap::Addr::Block { .. } => Err(bad(addr)),
            },
            NameLayout::Sealed(k) => {
                let plain = k.open(&aad(addr), value).map_err(|_| {
                    Error::Corrupt(format!("sealed name row {addr:02x?} fails authentication"))
                })?;
                if plain.len() < 8 {
                    return Err(bad(addr));
                }
                let name = String::from_utf8(plain[8..].to_vec()).map_err(|_| bad(addr))?;
                Ok((dir, name, target_of(&plain[..8])?))
            }
        }
    }

    /// What `dir/name` points at, from its row's value (checks a sealed
    /// row holds this very name: a hash collision is an error).
    pub(crate) fn target(&self, dir: u64, name: &str, value: &[u8]) -> Result<u64> {
        match self {
            NameLayout::Plain => target_of(value),
            NameLayout::Sealed(_) => {
                let addr = self.addr(dir, name);
                let (_, stored, t) = self.open_row(&addr, value)?;
                if stored != name {
                    return Err(Error::Corrupt(format!(
                        "name hash collision in directory {dir}"
                    )));
                }
                Ok(t)
            }
        }
    }
}

fn aad(addr: &[u8]) -> Vec<u8> {
    let mut a = Vec::with_capacity(4 + addr.len());
    a.extend_from_slice(b"cnm1");
    a.extend_from_slice(addr);
    a
}

fn bad(addr: &[u8]) -> Error {
    Error::Corrupt(format!("name row {addr:02x?}"))
}

pub(crate) fn target_of(v: &[u8]) -> Result<u64> {
    v.try_into()
        .map(u64::from_le_bytes)
        .map_err(|_| Error::Corrupt(format!("name row value {v:02x?}")))
}

/// The directory of a name row's address (the same in both layouts).
pub(crate) fn dir_of(addr: &[u8]) -> Result<u64> {
    match addr {
        [NAME_TAG, rest @ ..] if rest.len() >= 8 => {
            let mut b = [0u8; 8];
            b.copy_from_slice(&rest[..8]);
            Ok(u64::from_be_bytes(b))
        }
        _ => Err(bad(addr)),
    }
}

/// Every row address of directory `dir`, in both layouts: [lo, hi).
pub(crate) fn dir_range(dir: u64) -> (Vec<u8>, Vec<u8>) {
    let lo = blockmap::name_addr(dir, "");
    let hi = blockmap::prefix_end(lo.clone()).unwrap_or_else(|| vec![NAME_TAG + 1]);
    (lo, hi)
}

/// The rows a txg commit writes for its name changes: (dataset, address,
/// value or `None` for a tombstone). Sealed datasets need their key (writes
/// are refused before a key goes, so a missing one is an error, never a
/// plaintext row).
#[allow(clippy::type_complexity)]
pub(crate) fn commit_rows(
    p: &ImportedPool,
    names: &BTreeMap<crate::txg::NameKey, Option<u64>>,
) -> Result<Vec<(u64, Vec<u8>, Option<Vec<u8>>)>> {
    let mut layouts: std::collections::HashMap<u64, NameLayout> = Default::default();
    let mut out = Vec::with_capacity(names.len());
    for ((ds, dir, name), target) in names {
        let layout = match layouts.get(ds) {
            Some(l) => l.clone(),
            None => {
                let gone = !p.datasets.read().values().any(|r| r.id == *ds);
                let l = if gone {
                    // Destroyed since: the commit skips its rows.
                    NameLayout::Plain
                } else {
                    NameLayout::of(p, *ds)?
                };
                layouts.insert(*ds, l.clone());
                l
            }
        };
        out.push((
            *ds,
            layout.addr(*dir, name),
            layout.value(*dir, name, *target),
        ));
    }
    Ok(out)
}

/// Directories of at most this many names are kept opened and sorted in
/// memory ([`SortedDirs`]) between pages; larger ones are selected from
/// page by page. Bounds the cache too: it holds at most this many names.
pub(crate) const SORTED_DIR_MAX: usize = 1 << 17;

/// Opened, sorted names of recently listed sealed directories, each as of
/// one committed txg of one chain: a listing walks pages (S3 continuation
/// tokens, readdir cookies, a delimiter walk) without opening every row
/// again for each page. At most [`SORTED_DIR_MAX`] names in all; plaintext
/// names, so `unload-key` drops a root's entries ([`forget`]).
struct SortedDir {
    pool: u64,
    chain: Vec<(u64, u64)>,
    dir: u64,
    txg: u64,
    names: Arc<Vec<(String, u64)>>,
}

static SORTED_DIRS: parking_lot::Mutex<Vec<SortedDir>> = parking_lot::Mutex::new(Vec::new());

/// Drops the cached names of datasets `ids` of pool `pool` (their key goes).
pub(crate) fn forget(pool: u64, ids: &[u64]) {
    SORTED_DIRS
        .lock()
        .retain(|e| e.pool != pool || !e.chain.iter().any(|(d, _)| ids.contains(d)));
}

/// Drops every cached name of pool `pool` (exported).
pub(crate) fn forget_pool(pool: u64) {
    SORTED_DIRS.lock().retain(|e| e.pool != pool);
}

fn cached(pool: u64, chain: &Chain, dir: u64, txg: u64) -> Option<Arc<Vec<(String, u64)>>> {
    let mut c = SORTED_DIRS.lock();
    let i = c
        .iter()
        .position(|e| e.pool == pool && e.chain == chain.0 && e.dir == dir && e.txg == txg)?;
    // Most recently used last.
    let e = c.remove(i);
    let names = e.names.clone();
    c.push(e);
    Some(names)
}

fn remember(pool: u64, chain: &Chain, dir: u64, txg: u64, names: Arc<Vec<(String, u64)>>) {
    let mut c = SORTED_DIRS.lock();
    // Older versions of the same directory are of no use any more.
    c.retain(|e| !(e.pool == pool && e.chain == chain.0 && e.dir == dir));
    let mut total: usize = c.iter().map(|e| e.names.len()).sum::<usize>() + names.len();
    while total > SORTED_DIR_MAX && !c.is_empty() {
        total -= c.remove(0).names.len();
    }
    c.push(SortedDir {
        pool,
        chain: chain.0.clone(),
        dir,
        txg,
        names,
    });
}

/// The names of `dir` a page of a listing shows, for a sealed layout: those
/// at or after `start` starting with `prefix`, at most `limit`, merged with
/// `overlay` (the uncommitted changes, which decide the names they hold).
///
/// The committed rows of the directory come from one read transaction,
/// with the txg it holds. A directory of at most [`SORTED_DIR_MAX`] names
/// is opened and sorted once per committed txg and kept; a page is then a
/// binary search and `limit` steps. A larger one is never sorted: every
/// row is opened and only the `limit` smallest qualifying names are kept (a
/// bounded ordered map), so a page costs one pass over the directory and
/// memory for one page, whatever the directory's size.
#[allow(clippy::too_many_arguments)]
pub(crate) fn list_sealed(
    p: &ImportedPool,
    chain: &Chain,
    layout: &NameLayout,
    dir: u64,
    start: &str,
    prefix: &str,
    overlay: BTreeMap<String, Option<u64>>,
    limit: usize,
) -> Result<Vec<(String, u64)>> {
    use crate::txg::meta_err;
    use meta::redb::ReadableDatabase;
    let in_range = |n: &str| n >= start && n.starts_with(prefix);
    let mut best: BTreeMap<String, u64> = BTreeMap::new();
    let keep = |best: &mut BTreeMap<String, u64>, n: String, t: u64| {
        if best.len() >= limit {
            match best.last_key_value() {
                Some((last, _)) if n < *last => {
                    best.pop_last();
                }
                _ => return,
            }
        }
        best.insert(n, t);
    };
    if limit == 0 {
        return Ok(Vec::new());
    }
    let tx = p.db().begin_read().map_err(meta_err)?;
    let txg = tx
        .open_table(meta::schema::POOL_RECORDS)
        .map_err(meta_err)?
        .get(meta::schema::RECORD_TXG)
        .map_err(meta_err)?
        .map_or(0, |v| v.value());
    let t = tx.open_table(meta::schema::BLOCK_MAP).map_err(meta_err)?;
    let guid = p.pool.guid;
    let sorted = match cached(guid, chain, dir, txg) {
        Some(names) => Some(names),
        None => {
            let (lo, hi) = dir_range(dir);
            let mut scan = blockmap::NameScan::new(&t, chain, &lo, &hi)?;
            let mut all: Vec<(String, u64)> = Vec::new();
            let mut too_big = false;
            while let Some((addr, v)) = scan.next_row()? {
                let (_, name, target) = layout.open_row(&addr, &v)?;
                if !too_big && all.len() < SORTED_DIR_MAX {
                    all.push((name.clone(), target));
                } else if !too_big {
                    // Too big to keep: from here on, select only (what was read is kept).
                    too_big = true;
                    for (n, t) in std::mem::take(&mut all) {
                        if in_range(&n) && !overlay.contains_key(&n) {
                            keep(&mut best, n, t);
                        }
                    }
                }
                if too_big && in_range(&name) && !overlay.contains_key(&name) {
                    keep(&mut best, name, target);
                }
            }
            if too_big {
                None
            } else {
                all.sort_unstable();
                let all = Arc::new(all);
                remember(guid, chain, dir, txg, all.clone());
                Some(all)
            }
        }
    };
    if let Some(names) = sorted {
        // Sorted: the first `limit` qualifying names are the smallest.
        let from = names.partition_point(|(n, _)| n.as_str() < start);
        let mut taken = 0;
        for (n, t) in &names[from..] {
            if !n.starts_with(prefix) || taken >= limit {
                break;
            }
            if !overlay.contains_key(n) {
                keep(&mut best, n.clone(), *t);
                taken += 1;
            }
        }
    }
    for (n, t) in overlay {
        if let Some(t) = t.filter(|_| in_range(&n)) {
            keep(&mut best, n, t);
        }
    }
    Ok(best.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_map_names_to_rows_and_back() {
        let key = Arc::new(MasterKey::from_bytes(&[7u8; 32]));
        for layout in [NameLayout::Plain, NameLayout::Sealed(key.clone())] {
            for (dir, name) in [(2u64, "photos/2024/a.jpg"), (64, "é ∂"), (3, "")] {
                let a = layout.addr(dir, name);
                let v = layout.value(dir, name, Some(99)).unwrap();
                assert_eq!(
                    layout.open_row(&a, &v).unwrap(),
                    (dir, name.to_string(), 99)
                );
                assert_eq!(layout.target(dir, name, &v).unwrap(), 99);
                let (lo, hi) = dir_range(dir);
                assert!(a >= lo && a < hi);
                assert!(layout.value(dir, name, None).is_none());
            }
        }
        let sealed = NameLayout::Sealed(key.clone());
        let a = sealed.addr(2, "secret-name");
        let v = sealed.value(2, "secret-name", Some(5)).unwrap();
        // Neither the address nor the value shows the name.
        for b in [&a, &v] {
            assert!(!b.windows(6).any(|w| w == b"secret"));
        }
        // A row moved to another address (or directory) does not open.
        let other = sealed.addr(2, "other");
        assert!(sealed.open_row(&other, &v).is_err());
        assert!(sealed.target(2, "other", &v).is_err());
        // Another key hashes elsewhere and cannot open it.
        let k2 = NameLayout::Sealed(Arc::new(MasterKey::from_bytes(&[8u8; 32])));
        assert_ne!(k2.addr(2, "secret-name"), a);
        assert!(k2.open_row(&a, &v).is_err());
    }
}
