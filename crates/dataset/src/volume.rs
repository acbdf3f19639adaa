//! Block I/O of one object: byte ranges mapped onto its blocks in the open
//! txg, the txg being committed, and the committed block map, in that
//! order. A volume is object `VOLUME_OBJECT` with volblocksize blocks; the
//! object layer (`objects.rs`) uses the same paths for every object.

use crate::blockmap::Chain;
use crate::cache::Claim;
use crate::objects::VOLUME_OBJECT;
use crate::space::Class;
use crate::txg::{BlockKey, Dirty, ImportedPool, OpenTxg, PartialBlock, View};
use crate::{Block, Error, Extent, ReadPiece, ReadSegment, Result, Volume};
use block::{BlockPointer, MasterKey};
use intent_log::RecordKind;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Largest payload of one intent-log record; bigger writes are split.
const MAX_LOG_RECORD: usize = 1 << 20;
/// Most blocks one `allocation` call looks at (the reply covers a prefix).
const MAX_STATUS_BLOCKS: u64 = 1 << 16;
/// Largest single read of adjacent blocks.
const MAX_READ_RUN: u64 = 8 << 20;
/// Longest a read waits for another reader's I/O of the same block before
/// it reads the block itself.
const LOAD_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone, Copy)]
pub(crate) enum Op<'a> {
    Write(&'a [u8]),
    Zero { len: u64, allocate: bool },
}

impl Op<'_> {
    fn len(&self) -> u64 {
        match self {
            Op::Write(d) => d.len() as u64,
            Op::Zero { len, .. } => *len,
        }
    }
}

/// Contents of blocks outside the open txg: the syncing txg (for a
/// dataset's head, not a snapshot), else the committed block map as `chain`
/// sees it (through the cache; adjacent blocks are read from disk in one
/// I/O and verified one by one). `None` is a hole.
pub(crate) fn read_outside_open(
    p: &ImportedPool,
    view: &View,
    chain: &Chain,
    obj: u64,
    head: bool,
    bs: u32,
    blocks: &[u64],
) -> Result<HashMap<u64, Option<Block>>> {
    let got = read_outside_open_as(p, view, chain, obj, head, bs, blocks, Fetch::Demand)?;
    Ok(got.map(|g| g.0).unwrap_or_default())
}

/// Contents of blocks by index (`None`: a hole).
type Blocks = HashMap<u64, Option<Block>>;

/// How [`read_committed`] gets blocks the ARC does not hold.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fetch {
    /// A demand read: from the L2ARC or the devices (verified), into the ARC.
    Demand,
    /// Read ahead (crate::prefetch): into the ARC only, counted apart.
    Prefetch,
    /// A demand read that must not wait for I/O: `None` unless every block
    /// is in the ARC (or needs no I/O), with nothing counted or touched.
    CachedOnly,
}

/// [`read_outside_open`]; `None` only for [`Fetch::CachedOnly`] when a block
/// would need I/O. With the blocks, whether they were all cached before and
/// none was read ahead (see [`read_committed`]).
#[allow(clippy::too_many_arguments)]
fn read_outside_open_as(
    p: &ImportedPool,
    view: &View,
    chain: &Chain,
    obj: u64,
    head: bool,
    bs: u32,
    blocks: &[u64],
    fetch: Fetch,
) -> Result<Option<(Blocks, bool)>> {
    let ds = chain.data_id();
    let mut out = HashMap::with_capacity(blocks.len());
    let mut committed = Vec::new();
    let syncing = view.syncing.as_ref().filter(|_| head);
    // Partial blocks of the syncing txg lie over the committed version.
    let mut partial: Vec<(u64, Arc<PartialBlock>)> = Vec::new();
    for &b in blocks {
        match syncing.and_then(|s| s.blocks.get(&(ds, obj, b))) {
            Some(Dirty::Partial(p)) => {
                partial.push((b, p.clone()));
                committed.push(b);
            }
            Some(d) => {
                out.insert(b, materialized(Some(p), (ds, obj, b), d, bs)?);
            }
            None => committed.push(b),
        }
    }
    let Some(warm) = read_committed(p, view, chain, obj, bs, &committed, &mut out, fetch)? else {
        return Ok(None);
    };
    for (b, part) in partial {
        let base = out.get(&b).cloned().flatten();
        out.insert(b, Some(Block::from(part.merged(base.as_deref()))));
    }
    Ok(Some((out, warm)))
}

/// Reads committed blocks into the ARC ahead of a sequential reader
/// (crate::prefetch); what is cached already is left alone.
pub(crate) fn prefetch_committed(
    p: &ImportedPool,
    view: &View,
    chain: &Chain,
    obj: u64,
    bs: u32,
    blocks: &[u64],
) -> Result<()> {
    let mut out = HashMap::new();
    read_committed(p, view, chain, obj, bs, blocks, &mut out, Fetch::Prefetch).map(|_| ())
}

/// Committed pointers of `blocks` as `chain` sees them (holes and tombstones
/// left out): one range scan when the blocks are dense (a read), point
/// lookups when they are far apart (the head and tail of a large write, the
/// partial blocks of a txg).
pub(crate) fn committed_pointers(
    view: &View,
    chain: &Chain,
    obj: u64,
    blocks: &[u64],
) -> Result<std::collections::BTreeMap<u64, BlockPointer>> {
    let (Some(&lo), Some(&hi)) = (blocks.iter().min(), blocks.iter().max()) else {
        return Ok(Default::default());
    };
    if hi - lo < 4 * blocks.len() as u64 {
        return view.pointers(chain, obj, lo, hi);
    }
    let mut m = std::collections::BTreeMap::new();
    for &b in blocks {
        m.extend(view.pointers(chain, obj, b, b)?);
    }
    Ok(m)
}

/// Committed contents of `committed` blocks as `chain` sees them, into `out`
/// (see [`Fetch`]). `None` only for [`Fetch::CachedOnly`] when a block would
/// need I/O (then `out` holds nothing of the ARC's); else whether the read
/// is "warm": a CachedOnly read of blocks that were all in the ARC and none
/// of them read ahead (so prefetch has nothing to do: crate::prefetch).
#[allow(clippy::too_many_arguments)]
fn read_committed(
    p: &ImportedPool,
    view: &View,
    chain: &Chain,
    obj: u64,
    bs: u32,
    committed: &[u64],
    out: &mut Blocks,
    how: Fetch,
) -> Result<Option<bool>> {
    let prefetch = how == Fetch::Prefetch;
    let ds = chain.data_id();
    if committed.is_empty() {
        return Ok(Some(true));
    }
    let pointers = committed_pointers(view, chain, obj, committed)?;
    // Encrypted datasets: blocks open with their root's key (decision 0026).
    let key = p.key_of(ds)?;
    if key.is_some() {
        p.cache.keep_in_memory(ds);
    }
    let unseal = |b: u64| {
        Some(block::Unseal {
            key: key.as_deref(),
            object: obj,
            block: b,
        })
    };
    let lost = |b: u64, bp: &BlockPointer, e: &dyn std::fmt::Display| {
        crate::scrub::note_lost_block(p, (ds, obj, b, bp.birth));
        Error::Corrupt(format!(
            "dataset {ds} object {obj} block {b} (byte offset {}): {e}",
            b * bs as u64
        ))
    };
    // Every copy tried, bad copies healed, errors counted: the slow path of
    // any block a quicker read could not give.
    let reread = |b: u64, bp: &BlockPointer| -> Result<Block> {
        let data = block::read_block_keyed(&p.pool, bp, unseal(b)).map_err(|e| lost(b, bp, &e))?;
        Ok(Block::from(full_block(data, bs, ds, obj, b)?))
    };
    // Blocks this call reads from the devices, each claimed so that a
    // concurrent reader of the same block (prefetch or another request)
    // waits for it instead of reading it again.
    let mut fetch: Vec<(u64, &BlockPointer)> = Vec::new();
    let mut claims: Vec<Option<crate::cache::LoadClaim<'_>>> = Vec::new();
    // Blocks another reader has in flight (demand reads wait for them).
    let mut waits: Vec<(u64, &BlockPointer, Arc<crate::cache::Loading>)> = Vec::new();
    // CachedOnly: the blocks looked up in the ARC all at once.
    let mut wanted: Vec<(u64, crate::cache::Key)> = Vec::new();
    for &b in committed {
        match pointers.get(&b) {
            None => {
                out.insert(b, None);
            }
            // In the metadata row: no I/O (nothing to prefetch).
            Some(bp) if bp.is_embedded() => {
                if prefetch {
                    continue;
                }
                out.insert(b, Some(reread(b, bp)?));
            }
            Some(bp) if prefetch => {
                let key = arc_key(ds, obj, b, bp);
                if p.cache.contains(&key) {
                    p.cache.prefetch_cached.fetch_add(1, Ordering::Relaxed);
                } else if let Some(d) = l2_block(p, &key, bs) {
                    p.cache.insert_prefetched(key, d);
                    p.cache.prefetch_cached.fetch_add(1, Ordering::Relaxed);
                } else {
                    match p.cache.claim(key) {
                        // Looked at again under the claim: it may have
                        // arrived since.
                        Claim::Mine(c) if !p.cache.contains(&key) => {
                            fetch.push((b, bp));
                            claims.push(Some(c));
                        }
                        _ => {
                            p.cache.prefetch_cached.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            Some(bp) if how == Fetch::CachedOnly => wanted.push((b, arc_key(ds, obj, b, bp))),
            Some(bp) => {
                let key = arc_key(ds, obj, b, bp);
                match p.cache.get(&key) {
                    Some(hit) => {
                        out.insert(b, Some(hit));
                    }
                    None => match l2_block(p, &key, bs) {
                        Some(d) => {
                            p.cache.insert(key, d.clone());
                            out.insert(b, Some(d));
                        }
                        None => match p.cache.claim(key) {
                            Claim::Mine(c) => match p.cache.get_uncounted(&key) {
                                Some(hit) => {
                                    out.insert(b, Some(hit));
                                }
                                None => {
                                    fetch.push((b, bp));
                                    claims.push(Some(c));
                                }
                            },
                            Claim::Theirs(l) => waits.push((b, bp, l)),
                        },
                    },
                }
            }
        }
    }
    if how == Fetch::CachedOnly {
        let keys: Vec<crate::cache::Key> = wanted.iter().map(|w| w.1).collect();
        let Some((found, ahead)) = p.cache.get_all(&keys) else {
            return Ok(None);
        };
        for ((b, _), data) in wanted.into_iter().zip(found) {
            out.insert(b, Some(data));
        }
        return Ok(Some(ahead == 0));
    }
    // Sorted by place on disk (claims follow their blocks).
    let mut order: Vec<usize> = (0..fetch.len()).collect();
    order.sort_unstable_by_key(|&i| (fetch[i].1.dvas[0].group, fetch[i].1.dvas[0].offset));
    let mut i = 0;
    while i < order.len() {
        // A run: blocks whose first copies lie back to back on one group.
        let first = fetch[order[i]].1.dvas[0];
        let mut end = first.offset + first.asize as u64;
        let mut j = i + 1;
        while j < order.len() {
            let d = fetch[order[j]].1.dvas[0];
            if d.group != first.group
                || d.offset != end
                || end - first.offset + d.asize as u64 > MAX_READ_RUN
            {
                break;
            }
            end += d.asize as u64;
            j += 1;
        }
        let mut got: Vec<(usize, Block)> = Vec::with_capacity(j - i);
        match direct_run(p, bs, first, &order[i..j], &fetch) {
            Some(read) => {
                for (&k, buf) in order[i..j].iter().zip(read) {
                    let (b, bp) = fetch[k];
                    let data = match buf {
                        // Verified where it landed: this buffer is the ARC's.
                        Some(buf) if block::is_stored(bp, &buf) => Block::from(buf),
                        // Slow path: try every copy, heal the bad ones, count
                        // the errors (the unverified buffer is dropped unused).
                        _ => reread(b, bp)?,
                    };
                    got.push((k, data));
                }
            }
            None => {
                let run = p
                    .pool
                    .read_run(first.group, first.offset, (end - first.offset) as usize)
                    .ok();
                for &k in &order[i..j] {
                    let (b, bp) = fetch[k];
                    let at = (bp.dvas[0].offset - first.offset) as usize;
                    let stored = run.as_ref().map(|r| &r[at..at + bp.psize as usize]);
                    // A whole block that needs no key: decoded straight into
                    // a slab buffer (populated in bulk, decision 0069).
                    let into = stored
                        .filter(|_| bp.crypt.is_none() && bp.lsize == bs)
                        .and_then(|s| Some((s, vdev::BlockBuf::new(bs as usize)?)));
                    if let Some((stored, mut buf)) = into {
                        if let Some(r) = block::decode_verified_into(bp, stored, &mut buf) {
                            r.map_err(|e| lost(b, bp, &e))?;
                            got.push((k, Block::from(buf)));
                            continue;
                        }
                    }
                    let quick = stored.and_then(|s| block::decode_verified_keyed(bp, s, unseal(b)));
                    let data = match quick {
                        Some(d) => Block::from(full_block(
                            d.map_err(|e| lost(b, bp, &e))?,
                            bs,
                            ds,
                            obj,
                            b,
                        )?),
                        None => reread(b, bp)?,
                    };
                    got.push((k, data));
                }
            }
        }
        for (k, data) in got {
            let (b, bp) = fetch[k];
            p.counters
                .read_bytes
                .fetch_add(bp.psize as u64, Ordering::Relaxed);
            let key = arc_key(ds, obj, b, bp);
            if prefetch {
                p.cache.insert_prefetched(key, data);
                p.cache.prefetch_reads.fetch_add(1, Ordering::Relaxed);
            } else {
                p.cache.insert(key, data.clone());
                out.insert(b, Some(data));
            }
            // In the ARC now: waiters find it.
            claims[k] = None;
        }
        i = j;
    }
    drop(claims);
    // Last on disk first: whoever holds the claims (a prefetch job, another
    // request) verifies its run in disk order, so once the last block is in,
    // the others are too — one sleep per run instead of one per block
    // (each block's wake-up was a context switch on both sides).
    waits.sort_unstable_by_key(|w| std::cmp::Reverse((w.1.dvas[0].group, w.1.dvas[0].offset)));
    for (b, bp, loading) in waits {
        loading.wait(LOAD_WAIT);
        let key = arc_key(ds, obj, b, bp);
        if let Some(hit) = p.cache.get_uncounted(&key) {
            out.insert(b, Some(hit));
            continue;
        }
        // The other read failed, or the block left the ARC already: read it here.
        let data = reread(b, bp)?;
        p.counters
            .read_bytes
            .fetch_add(bp.psize as u64, Ordering::Relaxed);
        p.cache.insert(key, data.clone());
        out.insert(b, Some(data));
    }
    Ok(Some(false))
}

/// A run of blocks kept exactly as stored ([`block::stored_as_is`], one
/// whole block per extent, whole pages), read with one scatter read straight
/// into a slab buffer per block (`vdev::BlockBuf`, decision 0069): no run
/// buffer, no copy out of it, and the buffers' pages are populated in bulk.
/// `None` when the run does not qualify or no buffers are available (the
/// caller reads it the usual way); a block `None` when the read failed.
/// Nothing here is verified: the caller checks every buffer before use.
fn direct_run(
    p: &ImportedPool,
    bs: u32,
    first: pool::Dva,
    run: &[usize],
    fetch: &[(u64, &BlockPointer)],
) -> Option<Vec<Option<vdev::BlockBuf>>> {
    let plain =
        |bp: &BlockPointer| block::stored_as_is(bp) && bp.psize == bs && bp.dvas[0].asize == bs;
    if !run.iter().all(|&k| plain(fetch[k].1)) {
        return None;
    }
    let mut bufs = run
        .iter()
        .map(|_| vdev::BlockBuf::new(bs as usize))
        .collect::<Option<Vec<_>>>()?;
    let mut slices: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let read = p
        .pool
        .read_run_into(first.group, first.offset, &mut slices)
        .is_ok();
    Some(bufs.into_iter().map(|b| read.then_some(b)).collect())
}

/// A block from the L2ARC, if a cache device holds it whole (ARC entries
/// are full blocks; anything else is a miss).
fn l2_block(p: &ImportedPool, key: &crate::cache::Key, bs: u32) -> Option<Block> {
    p.cache.l2_get(key).filter(|d| d.len() == bs as usize)
}

/// The ARC key of a block version (crate::cache).
pub(crate) fn arc_key(ds: u64, obj: u64, b: u64, bp: &BlockPointer) -> crate::cache::Key {
    (
        ds,
        obj,
        b,
        bp.birth,
        crate::cache::checksum_word(&bp.checksum),
    )
}

/// A stored block as a whole block: an object's last block is stored only
/// as long as its data (the rest reads as zeros); never longer than `bs`.
fn full_block(mut data: Vec<u8>, bs: u32, ds: u64, obj: u64, b: u64) -> Result<Vec<u8>> {
    if data.len() > bs as usize || (obj == VOLUME_OBJECT && data.len() != bs as usize) {
        return Err(Error::Corrupt(format!(
            "dataset {ds} object {obj} block {b}: {} bytes, block size is {bs}",
            data.len()
        )));
    }
    data.resize(bs as usize, 0);
    Ok(data)
}

/// Contents of a dirty block that needs nothing below it (not `Partial`).
/// A block received raw (`send -w`) is opened here, for the reader, with
/// `p`'s key of its dataset when `p` is given.
fn materialized(
    p: Option<&ImportedPool>,
    key: BlockKey,
    d: &Dirty,
    bs: u32,
) -> Result<Option<Block>> {
    Ok(match d {
        Dirty::Data(v) => Some(Block::from(v.clone())),
        Dirty::Zero => Some(Block::from(vec![0u8; bs as usize])),
        Dirty::Hole => None,
        Dirty::Partial(_) => unreachable!("partial blocks are merged by the caller"),
        Dirty::Raw(raw) => {
            let k = match p {
                Some(p) => p.key_of(key.0)?,
                None => None,
            };
            let data = Dirty::open_raw(raw, k.as_deref(), key.1, key.2)?;
            Some(Block::from(full_block(data, bs, key.0, key.1, key.2)?))
        }
    })
}

/// Applies a write or zeroing of object `obj` to the open txg. A front
/// end's change (`class` given) is admitted against the space budget of
/// that class; a replayed one (`None`) was admitted before the crash.
/// `then` runs under the same lock once the blocks are changed: it logs
/// the change (log order = apply order) and returns the log sequence number.
#[allow(clippy::too_many_arguments)]
pub(crate) fn apply(
    p: &ImportedPool,
    ds: u64,
    obj: u64,
    bs: u32,
    offset: u64,
    op: Op<'_>,
    zero_to_hole: bool,
    class: Option<Class>,
    mut then: impl FnMut(&mut OpenTxg) -> u64,
) -> Result<u64> {
    let len = op.len();
    // An encrypted dataset takes writes only while its key is loaded; checked
    // again under the open txg's lock, which unload-key takes (decision 0026).
    // Replay and the unlinked-set drain (no class) run while load-key holds
    // the key closed to writes.
    let root = match class {
        Some(_) => p.crypt_root(ds)?,
        None => None,
    };
    if len == 0 {
        let mut open = p.open.lock();
        p.check_writable(ds, root)?;
        return Ok(then(&mut open));
    }
    let bsz = bs as u64;
    let first = offset / bsz;
    let last = (offset + len - 1) / bsz;
    let is_partial = |b: u64| {
        let start = b * bsz;
        offset > start || offset + len < start + bsz
    };
    let deallocates = matches!(
        op,
        Op::Zero {
            allocate: false,
            ..
        }
    ) && (first..=last).any(|b| !is_partial(b));
    let chain = if deallocates {
        Some(
            p.chain_of(ds)
                .ok_or_else(|| Error::NotFound(format!("dataset {ds}")))?,
        )
    } else {
        None
    };
    for _attempt in 0..64 {
        let txg = p.open.lock().txg;
        // For deallocation: which whole blocks exist at all (no need to
        // record holes over holes). Read without holding the lock.
        let existing: HashSet<u64> = match &chain {
            Some(chain) => {
                let view = p.view()?;
                let mut set: HashSet<u64> = view
                    .pointers(chain, obj, first, last)?
                    .into_keys()
                    .collect();
                if let Some(s) = view.syncing.as_ref() {
                    set.extend(
                        s.blocks
                            .keys()
                            .filter(|k| k.0 == ds && k.1 == obj && (first..=last).contains(&k.2))
                            .map(|k| k.2),
                    );
                }
                set
            }
            None => HashSet::new(),
        };
        // Measured outside the open txg's lock (it reads the dataset tree).
        let budget = class.map(|c| p.budget(ds, c)).transpose()?;
        let (full, unit) = (p.charge_of(bs), p.charge_of(1));
        let mut open = p.open.lock();
        if open.txg != txg {
            continue; // a txg started meanwhile: `existing` may be stale
        }
        p.check_writable(ds, root)?;
        let weight = |d: Option<&Dirty>| match d {
            Some(Dirty::Data(_) | Dirty::Partial(_) | Dirty::Raw(_)) => full,
            Some(Dirty::Zero) => unit,
            _ => 0,
        };
        // Every block's new state is worked out before any is applied, so a
        // change refused for want of space leaves the txg as it was.
        // Deallocation visits only the blocks that exist (stored or dirty)
        // and the partial ends: freeing a sparse petabyte takes the time its
        // blocks take, not its size (and no vector of its size).
        let candidates: Option<std::collections::BTreeSet<u64>> = chain.as_ref().map(|_| {
            let mut c: std::collections::BTreeSet<u64> = existing.iter().copied().collect();
            c.insert(first);
            c.insert(last);
            c.extend(
                open.dirty
                    .keys()
                    .filter(|k| k.0 == ds && k.1 == obj && (first..=last).contains(&k.2))
                    .map(|k| k.2),
            );
            c
        });
        let blocks: Box<dyn Iterator<Item = u64>> = match &candidates {
            Some(c) => Box::new(c.iter().copied()),
            None => Box::new(first..=last),
        };
        let mut changes: Vec<(BlockKey, Dirty)> =
            Vec::with_capacity(((last - first + 1) as usize).min(1024));
        let (mut add, mut sub) = (0u64, 0u64);
        for b in blocks {
            let start = b * bsz;
            let lo = offset.max(start);
            let hi = (offset + len).min(start + bsz);
            let (in_lo, in_hi) = ((lo - start) as usize, (hi - start) as usize);
            let key: BlockKey = (ds, obj, b);
            let new = if !is_partial(b) {
                match op {
                    Op::Write(data) => {
                        let slice = &data[(lo - offset) as usize..(hi - offset) as usize];
                        if zero_to_hole && slice.iter().all(|&x| x == 0) {
                            Some(Dirty::Hole)
                        } else {
                            Some(Dirty::Data(Arc::new(slice.to_vec())))
                        }
                    }
                    Op::Zero { allocate: true, .. } => Some(Dirty::Zero),
                    Op::Zero {
                        allocate: false, ..
                    } => (open.dirty.contains_key(&key) || existing.contains(&b))
                        .then_some(Dirty::Hole),
                }
            } else {
                // Part of a block: merged into what the open txg has, or
                // kept as a partial block to merge later (no read here).
                let bytes = match op {
                    Op::Write(data) => Some(&data[(lo - offset) as usize..(hi - offset) as usize]),
                    Op::Zero { .. } => None,
                };
                let patch = |mut buf: Vec<u8>| {
                    match bytes {
                        Some(b) => buf[in_lo..in_hi].copy_from_slice(b),
                        None => buf[in_lo..in_hi].fill(0),
                    }
                    Dirty::Data(Arc::new(buf))
                };
                Some(match open.dirty.get(&key) {
                    Some(Dirty::Partial(part)) => {
                        let mut part = PartialBlock::clone(part);
                        part.put(in_lo, in_hi, bytes);
                        if part.is_complete() {
                            Dirty::Data(part.data)
                        } else {
                            Dirty::Partial(Arc::new(part))
                        }
                    }
                    Some(d) => patch(
                        materialized(None, key, d, bs)?
                            .map(|a| a.to_vec())
                            .unwrap_or_else(|| vec![0u8; bs as usize]),
                    ),
                    None => {
                        let mut part = PartialBlock::new(bs);
                        part.put(in_lo, in_hi, bytes);
                        Dirty::Partial(Arc::new(part))
                    }
                })
            };
            if let Some(new) = new {
                let (w_new, w_old) = (weight(Some(&new)), weight(open.dirty.get(&key)));
                add += w_new.saturating_sub(w_old);
                sub += w_old.saturating_sub(w_new);
                changes.push((key, new));
            }
        }
        if let Some(b) = &budget {
            let others = open.charged_ever - b.ever;
            if add > sub && add - sub > b.bytes.saturating_sub(others) {
                return Err(Error::NoSpace(b.why.clone()));
            }
        }
        let charged = open.charged.entry(ds).or_default();
        *charged = (*charged + add).saturating_sub(sub);
        open.charged_ever += add;
        for (key, new) in changes {
            let counts = matches!(new, Dirty::Data(_) | Dirty::Partial(_));
            if open.dirty.insert(key, new).is_none() && counts {
                open.dirty_bytes += bsz;
            }
        }
        return Ok(then(&mut open));
    }
    Err(Error::Busy(format!(
        "dataset {ds}: txgs turned over faster than a write could apply"
    )))
}

/// Appends a volume's change to the intent log (volume record kinds).
fn log_volume_change(
    p: &ImportedPool,
    key: Option<&MasterKey>,
    ds: u64,
    offset: u64,
    op: Op<'_>,
) -> u64 {
    match op {
        Op::Write(data) => {
            let mut seq = 0;
            for (i, chunk) in data.chunks(MAX_LOG_RECORD).enumerate() {
                let at = offset + (i * MAX_LOG_RECORD) as u64;
                // An encrypted volume's data is sealed in the log too (decision 0026).
                seq = p.log_write(key, ds, at, chunk);
            }
            seq
        }
        Op::Zero { len, allocate } => {
            let kind = if allocate {
                RecordKind::ZeroAllocated
            } else {
                RecordKind::Trim
            };
            p.log.append(kind, ds, offset, len, &[])
        }
    }
}

/// A volume change replayed from the intent log (admitted before the crash).
pub(crate) fn replay_volume(
    p: &ImportedPool,
    ds: u64,
    bs: u32,
    offset: u64,
    op: Op<'_>,
) -> Result<()> {
    apply(p, ds, VOLUME_OBJECT, bs, offset, op, false, None, |_| 0).map(|_| ())
}

/// The record with id `id`, last known as `name` (updated when it was renamed).
pub(crate) fn record_by_id<'a>(
    datasets: &'a std::collections::BTreeMap<String, crate::props::DatasetRecord>,
    id: u64,
    name: &parking_lot::Mutex<String>,
) -> Result<&'a crate::props::DatasetRecord> {
    let mut name = name.lock();
    match datasets.get(&*name).filter(|r| r.id == id) {
        Some(r) => Ok(r),
        None => {
            let r = datasets
                .values()
                .find(|r| r.id == id)
                .ok_or_else(|| Error::NotFound(name.clone()))?;
            name.clone_from(&r.name);
            Ok(r)
        }
    }
}

/// Bytes [offset, offset+len) of object `obj` (block size `bs`) as `chain`
/// sees them: the open txg and the syncing one first for a head
/// (`snapshot` false), then the committed block map.
pub(crate) fn read_range(
    p: &ImportedPool,
    chain: &Chain,
    obj: u64,
    bs: u32,
    snapshot: bool,
    offset: u64,
    len: u64,
) -> Result<Vec<ReadSegment>> {
    let pieces = read_pieces(p, chain, obj, bs, snapshot, offset, len)?;
    let mut out: Vec<ReadSegment> = Vec::new();
    for piece in pieces {
        match (piece, out.last_mut()) {
            (ReadPiece::Hole(n), Some(ReadSegment::Hole(m))) => *m += n,
            (ReadPiece::Hole(n), _) => out.push(ReadSegment::Hole(n)),
            (d @ ReadPiece::Data(..), Some(ReadSegment::Data(v))) => v.extend_from_slice(d.data()),
            (d @ ReadPiece::Data(..), _) => {
                let mut v = Vec::with_capacity(len as usize);
                v.extend_from_slice(d.data());
                out.push(ReadSegment::Data(v));
            }
        }
    }
    Ok(out)
}

/// [`read_range`] without copying: each block's part of the range as a
/// shared slice of its buffer (the ARC's own, or the open txg's), holes
/// merged. Front ends that write to a socket send these slices as they are.
pub(crate) fn read_pieces(
    p: &ImportedPool,
    chain: &Chain,
    obj: u64,
    bs: u32,
    snapshot: bool,
    offset: u64,
    len: u64,
) -> Result<Vec<ReadPiece>> {
    let pieces = read_pieces_as(p, chain, obj, bs, snapshot, offset, len, Fetch::Demand)?;
    Ok(pieces.unwrap_or_default())
}

/// [`read_pieces`]; with [`Fetch::CachedOnly`], `None` when a block would
/// need I/O (nothing counted, no prefetch started).
#[allow(clippy::too_many_arguments)]
fn read_pieces_as(
    p: &ImportedPool,
    chain: &Chain,
    obj: u64,
    bs: u32,
    snapshot: bool,
    offset: u64,
    len: u64,
    fetch: Fetch,
) -> Result<Option<Vec<ReadPiece>>> {
    if len == 0 {
        return Ok(Some(Vec::new()));
    }
    let bsz = bs as u64;
    let (first, last) = (offset / bsz, (offset + len - 1) / bsz);
    let in_open = open_changes(p, chain.data_id(), obj, snapshot, first, last);
    // Blocks not in the open txg, or only partly (they need what lies below).
    let outside: Vec<u64> = (first..=last)
        .filter(|b| {
            matches!(
                in_open[(b - first) as usize],
                None | Some(Dirty::Partial(_))
            )
        })
        .collect();
    let (mut fetched, warm) = if outside.is_empty() {
        (HashMap::new(), true)
    } else {
        let view = p.view()?;
        match read_outside_open_as(p, &view, chain, obj, !snapshot, bs, &outside, fetch)? {
            Some(f) => f,
            None => return Ok(None),
        }
    };
    p.prefetch
        .observe(&p.cache, chain, obj, bs, snapshot, first, last, warm);
    let mut out: Vec<ReadPiece> = Vec::with_capacity((last - first + 1) as usize);
    for (i, b) in (first..=last).enumerate() {
        let data = match &in_open[i] {
            Some(Dirty::Partial(part)) => {
                let base = fetched.remove(&b).flatten();
                Some(Block::from(part.merged(base.as_deref())))
            }
            Some(d) => materialized(Some(p), (chain.data_id(), obj, b), d, bs)?,
            None => fetched.remove(&b).flatten(),
        };
        let start = b * bsz;
        let lo = (offset.max(start) - start) as usize;
        let hi = ((offset + len).min(start + bsz) - start) as usize;
        match (data, out.last_mut()) {
            (None, Some(ReadPiece::Hole(n))) => *n += (hi - lo) as u64,
            (None, _) => out.push(ReadPiece::Hole((hi - lo) as u64)),
            (Some(d), _) => {
                if d.len() < hi {
                    return Err(Error::Corrupt(format!(
                        "block {b} of object {obj} holds {} bytes, {hi} needed",
                        d.len()
                    )));
                }
                out.push(ReadPiece::Data(d, lo..hi));
            }
        }
    }
    Ok(Some(out))
}

/// Uncommitted changes of blocks [first, last] of one object (none for a snapshot).
fn open_changes(
    p: &ImportedPool,
    ds: u64,
    obj: u64,
    snapshot: bool,
    first: u64,
    last: u64,
) -> Vec<Option<Dirty>> {
    if snapshot {
        return vec![None; (last - first + 1) as usize];
    }
    let open = p.open.lock();
    (first..=last)
        .map(|b| open.dirty.get(&(ds, obj, b)).cloned())
        .collect()
}

impl ImportedPool {
    /// Runs `apply` (a front end's change to the open txg) the way every
    /// change is admitted: refused on a pool another daemon took over,
    /// waiting while suspended, throttled past dirty_max, retried once
    /// after a commit when out of space (what is in flight may free some),
    /// ENOSPC logged once until writes succeed again. Returns its log sequence.
    pub(crate) fn admit_change(
        &self,
        what: &str,
        class: Class,
        apply: impl Fn() -> Result<u64>,
    ) -> Result<u64> {
        if self.pool.is_fenced() {
            return Err(Error::Io(format!(
                "pool '{}' is owned by another daemon now; writes refused",
                self.pool.name
            )));
        }
        self.wait_unsuspended()?;
        self.throttle();
        let mut applied = apply();
        if matches!(applied, Err(Error::NoSpace(_))) && !self.pending().by_ds.is_empty() {
            // What is in flight may free space (overwrites) or be charged
            // more than it will take (compression): commit it and look again.
            self.sync_now()?;
            applied = apply();
        }
        let seq = match applied {
            Err(Error::NoSpace(why)) => {
                // Once, not per request: a full guest retries a lot.
                if !self.nospace_logged.swap(true, Ordering::Relaxed) {
                    tracing::warn!(pool = %self.pool.name, dataset = what, "{why}: writes fail with ENOSPC until space is freed");
                }
                return Err(Error::NoSpace(why));
            }
            r => r?,
        };
        if class == Class::Write
            && self.nospace_logged.load(Ordering::Relaxed)
            && self.nospace_logged.swap(false, Ordering::Relaxed)
        {
            tracing::info!(pool = %self.pool.name, dataset = what, "writes succeed again");
        }
        Ok(seq)
    }

    /// Waits until the log record `seq` (and all before it) is durable. A
    /// failed log write suspends the pool; with failmode=wait the commit
    /// waits for `pool clear` and is retried, it is never acknowledged first.
    pub(crate) fn commit_log(&self, seq: u64) -> Result<()> {
        loop {
            self.wait_unsuspended()?;
            match self.log.commit(seq) {
                Ok(()) => return Ok(()),
                Err(e @ (intent_log::LogError::TooLarge(_) | intent_log::LogError::Closed)) => {
                    return Err(Error::Io(e.to_string()))
                }
                Err(e) if self.is_closed() || self.is_suspended() => {
                    if self.health.failmode() == crate::health::FailMode::Continue
                        || self.is_closed()
                        || self.pool.is_fenced()
                    {
                        return Err(Error::Io(e.to_string()));
                    }
                }
                Err(e) => self.suspend(&format!("intent log write failed: {e}")),
            }
        }
    }
}

/// What [`Volume::flush_deferred`] did.
pub enum FlushStart {
    /// Durable already: answer at once (the waiter is handed back uncalled).
    Done(intent_log::Waiter),
    /// A log write in flight answers it (calls the waiter).
    Queued,
    /// Queued; run this on a thread that may block: it writes the log and
    /// answers the queued FLUSHes it makes durable.
    Drive(Box<dyn FnOnce() + Send>),
    /// Use [`Volume::flush`].
    Refused(intent_log::Waiter),
}

/// A volume's (or snapshot's) settings as of one request.
struct State {
    size: u64,
    bs: u32,
    readonly: bool,
    compressing: bool,
    chain: Chain,
    /// A snapshot: reads stop at its txg and skip uncommitted changes.
    snapshot: Option<u64>,
}

impl Volume {
    pub(crate) fn new(pool: Arc<ImportedPool>, id: u64, name: String) -> Volume {
        Volume {
            pool,
            id,
            name: parking_lot::Mutex::new(name),
        }
    }

    fn current(&self) -> Result<State> {
        if self.pool.is_closed() {
            return Err(Error::NotFound(self.name()));
        }
        let datasets = self.pool.datasets.read();
        let rec = record_by_id(&datasets, self.id, &self.name)?;
        let lineage = crate::txg::lineage(&datasets, rec);
        Ok(State {
            size: rec.volsize,
            bs: rec.volblocksize,
            readonly: rec.is_snapshot() || lineage.readonly(),
            compressing: lineage.compression() != block::Compression::Off,
            chain: Chain::of(rec, datasets.values()),
            snapshot: rec.is_snapshot().then_some(rec.created_txg),
        })
    }

    fn check_range(&self, offset: u64, len: u64, size: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{}: range {offset}+{len} beyond volume size {size}",
                self.name()
            ))),
        }
    }

    pub fn name(&self) -> String {
        self.name.lock().clone()
    }

    pub fn size(&self) -> u64 {
        // The NBD server asks before every request: the record alone, not
        // the whole `current()` state (lineage, chain).
        if self.pool.is_closed() {
            return 0;
        }
        let datasets = self.pool.datasets.read();
        record_by_id(&datasets, self.id, &self.name).map_or(0, |r| r.volsize)
    }

    pub fn block_size(&self) -> u32 {
        self.current().map(|c| c.bs).unwrap_or(4096)
    }

    pub fn read_only(&self) -> bool {
        self.current().map(|c| c.readonly).unwrap_or(true)
    }

    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadSegment>> {
        let st = self.current()?;
        self.check_range(offset, len, st.size)?;
        read_range(
            &self.pool,
            &st.chain,
            VOLUME_OBJECT,
            st.bs,
            st.snapshot.is_some(),
            offset,
            len,
        )
    }

    /// [`Volume::read`] as shared slices of the block buffers (no copy).
    pub fn read_pieces(&self, offset: u64, len: u64) -> Result<Vec<ReadPiece>> {
        let st = self.current()?;
        self.check_range(offset, len, st.size)?;
        read_pieces(
            &self.pool,
            &st.chain,
            VOLUME_OBJECT,
            st.bs,
            st.snapshot.is_some(),
            offset,
            len,
        )
    }

    /// [`Volume::read_pieces`] only if it needs no I/O (decision 0062: the
    /// NBD reader serves it in place, without a thread hand-off): every
    /// block is in the open or syncing txg, the ARC, a hole or the block
    /// map's row. `None` otherwise, and for any error (the caller then uses
    /// `read_pieces`, which reads, verifies and reports as usual); nothing
    /// is counted or touched in the ARC then.
    pub fn try_read_pieces(&self, offset: u64, len: u64) -> Option<Vec<ReadPiece>> {
        let st = self.current().ok()?;
        self.check_range(offset, len, st.size).ok()?;
        read_pieces_as(
            &self.pool,
            &st.chain,
            VOLUME_OBJECT,
            st.bs,
            st.snapshot.is_some(),
            offset,
            len,
            Fetch::CachedOnly,
        )
        .ok()
        .flatten()
    }

    fn modify(&self, offset: u64, op: Op<'_>, fua: bool) -> Result<()> {
        let st = self.current()?;
        if st.readonly {
            return Err(Error::ReadOnly(self.name()));
        }
        self.check_range(offset, op.len(), st.size)?;
        let class = match op {
            Op::Write(_) => Class::Write,
            Op::Zero { allocate: true, .. } => Class::Reserved,
            Op::Zero {
                allocate: false, ..
            } => Class::Free,
        };
        let p = &self.pool;
        // Looked up before `apply` takes the open txg's lock (see `log_key`).
        let key = p.log_key(self.id);
        let seq = p.admit_change(&self.name(), class, || {
            apply(
                p,
                self.id,
                VOLUME_OBJECT,
                st.bs,
                offset,
                op,
                st.compressing,
                Some(class),
                |_| log_volume_change(p, key.as_deref(), self.id, offset, op),
            )
        })?;
        if fua {
            self.pool.commit_log(seq)?;
        }
        Ok(())
    }

    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.modify(offset, Op::Write(data), fua)
    }

    /// [`Volume::write`] without FUA, only if it cannot block (decision
    /// 0053: the NBD reader runs it in place, without a thread hand-off):
    /// `None` when the pool is fenced, closed or suspended, when writes
    /// would be throttled or a txg is asked for (dirty past half of
    /// dirty_max), or when space is short; the caller then uses `write`,
    /// which waits, commits and reports as usual. The change is applied and
    /// logged exactly as `write` does it (a FLUSH after it covers it).
    pub fn try_write(&self, offset: u64, data: &[u8]) -> Option<Result<()>> {
        let p = &self.pool;
        if p.pool.is_fenced()
            || p.is_closed()
            || p.is_suspended()
            || p.nospace_logged.load(Ordering::Relaxed)
            || p.open.lock().dirty_bytes > p.config.dirty_max_bytes / 2
        {
            return None;
        }
        let st = match self.current() {
            Ok(st) => st,
            Err(e) => return Some(Err(e)),
        };
        if st.readonly {
            return Some(Err(Error::ReadOnly(self.name())));
        }
        if let Err(e) = self.check_range(offset, data.len() as u64, st.size) {
            return Some(Err(e));
        }
        // Looked up before `apply` takes the open txg's lock (see `log_key`).
        let key = p.log_key(self.id);
        let op = Op::Write(data);
        match apply(
            p,
            self.id,
            VOLUME_OBJECT,
            st.bs,
            offset,
            op,
            st.compressing,
            Some(Class::Write),
            |_| log_volume_change(p, key.as_deref(), self.id, offset, op),
        ) {
            Ok(_) => Some(Ok(())),
            // Refused without a change: the blocking path commits and retries.
            Err(Error::NoSpace(_)) => None,
            Err(e) => Some(Err(e)),
        }
    }

    pub fn flush(&self) -> Result<()> {
        self.current()?;
        self.pool.commit_log(self.pool.log.last_seq())
    }

    /// A FLUSH that holds no thread while it waits (decision 0057): `done`
    /// is called with `true` once every write completed before this call is
    /// durable, by the thread whose log write (or txg) made it so (see
    /// [`intent_log::IntentLog::commit_deferred`]). With `false`, or when
    /// this returns [`FlushStart::Refused`], the caller runs
    /// [`Volume::flush`] instead, which waits out a suspended pool or a txg
    /// and reports failures. Never blocks.
    pub fn flush_deferred(&self, done: intent_log::Waiter) -> FlushStart {
        let p = &self.pool;
        if p.pool.is_fenced() || p.is_closed() || p.is_suspended() || self.current().is_err() {
            return FlushStart::Refused(done);
        }
        match p.log.commit_deferred(p.log.last_seq(), done) {
            intent_log::Deferred::Done(w) => FlushStart::Done(w),
            intent_log::Deferred::Queued => FlushStart::Queued,
            intent_log::Deferred::Refused(w) => FlushStart::Refused(w),
            intent_log::Deferred::Drive => {
                let log = p.log.clone();
                FlushStart::Drive(Box::new(move || log.drive()))
            }
        }
    }

    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<()> {
        self.modify(
            offset,
            Op::Zero {
                len,
                allocate: false,
            },
            fua,
        )
    }

    pub fn write_zeroes(&self, offset: u64, len: u64, allocate: bool, fua: bool) -> Result<()> {
        self.modify(offset, Op::Zero { len, allocate }, fua)
    }

    /// The blocks a status query covers (at most MAX_STATUS_BLOCKS from
    /// `offset`; the reply covers a prefix) and their uncommitted changes.
    fn status_window(&self, st: &State, offset: u64, len: u64) -> (u64, u64, Vec<Option<Dirty>>) {
        let bsz = st.bs as u64;
        let first = offset / bsz;
        let last = ((offset + len - 1) / bsz).min(first + MAX_STATUS_BLOCKS - 1);
        let in_open = open_changes(
            &self.pool,
            st.chain.data_id(),
            VOLUME_OBJECT,
            st.snapshot.is_some(),
            first,
            last,
        );
        (first, last, in_open)
    }

    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let st = self.current()?;
        self.check_range(offset, len, st.size)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let bsz = st.bs as u64;
        let ds = st.chain.data_id();
        // The open txg first, then the view (see ImportedPool::view for why).
        let (first, last, in_open) = self.status_window(&st, offset, len);
        let view = self.pool.view()?;
        let syncing = view.syncing.as_ref().filter(|_| st.snapshot.is_none());
        let committed = view.pointers(&st.chain, VOLUME_OBJECT, first, last)?;
        let mut out: Vec<Extent> = Vec::new();
        for (i, b) in (first..=last).enumerate() {
            let dirty = in_open[i]
                .as_ref()
                .or_else(|| syncing.and_then(|s| s.blocks.get(&(ds, VOLUME_OBJECT, b))));
            let (hole, zero) = match dirty {
                Some(Dirty::Data(_) | Dirty::Partial(_) | Dirty::Raw(_)) => (false, false),
                Some(Dirty::Zero) => (false, true),
                Some(Dirty::Hole) => (true, true),
                None if committed.contains_key(&b) => (false, false),
                None => (true, true),
            };
            let start = b * bsz;
            let n = (offset + len).min(start + bsz) - offset.max(start);
            match out.last_mut() {
                Some(e) if e.hole == hole && e.zero == zero => e.len += n,
                _ => out.push(Extent { len: n, hole, zero }),
            }
        }
        Ok(out)
    }

    /// Short names of the snapshots of this volume older than it (all of
    /// them for the volume itself), oldest first.
    pub fn older_snapshots(&self) -> Vec<String> {
        let Ok(st) = self.current() else {
            return Vec::new();
        };
        let ds = st.chain.data_id();
        let upto = st.snapshot.unwrap_or(u64::MAX);
        let datasets = self.pool.datasets.read();
        let mut snaps: Vec<(u64, String)> = datasets
            .values()
            .filter(|r| r.is_snapshot() && r.data_id() == ds && r.created_txg < upto)
            .filter_map(|r| Some((r.created_txg, r.name.split_once('@')?.1.to_string())))
            .collect();
        snaps.sort();
        snaps.into_iter().map(|(_, n)| n).collect()
    }

    /// Which parts of [offset, offset+len) changed since snapshot `since`
    /// of this volume (the `cistern:changed:SNAP` NBD meta context): runs
    /// of `(len, changed)`. Uncommitted writes count as changed.
    pub fn changed_since(&self, since: &str, offset: u64, len: u64) -> Result<Vec<(u64, bool)>> {
        let st = self.current()?;
        self.check_range(offset, len, st.size)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let ds = st.chain.data_id();
        let after = {
            let datasets = self.pool.datasets.read();
            let me = self.name();
            let name = format!("{}@{since}", me.split('@').next().unwrap_or(""));
            datasets
                .get(&name)
                .filter(|r| r.is_snapshot() && r.data_id() == ds)
                .map(|r| r.created_txg)
                .ok_or_else(|| Error::NotFound(format!("snapshot '{name}'")))?
        };
        let upto = st.snapshot.unwrap_or(u64::MAX);
        let bsz = st.bs as u64;
        let (first, last, in_open) = self.status_window(&st, offset, len);
        let view = self.pool.view()?;
        let syncing = view.syncing.as_ref().filter(|_| st.snapshot.is_none());
        let committed = view.changed(ds, VOLUME_OBJECT, first, last, after, upto)?;
        let mut out: Vec<(u64, bool)> = Vec::new();
        for (i, b) in (first..=last).enumerate() {
            let changed = in_open[i].is_some()
                || syncing.is_some_and(|s| s.blocks.contains_key(&(ds, VOLUME_OBJECT, b)))
                || committed.contains(&b);
            let start = b * bsz;
            let n = (offset + len).min(start + bsz) - offset.max(start);
            match out.last_mut() {
                Some(e) if e.1 == changed => e.0 += n,
                _ => out.push((n, changed)),
            }
        }
        Ok(out)
    }
}
