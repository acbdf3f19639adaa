//! Volume I/O: byte ranges mapped onto volblocksize blocks in the open txg,
//! the txg being committed, and the committed block map, in that order.

use crate::txg::{Dirty, ImportedPool, View};
use crate::{Error, Extent, ReadSegment, Result, Volume};
use block::BlockPointer;
use intent_log::RecordKind;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Largest payload of one intent-log record; bigger writes are split.
const MAX_LOG_RECORD: usize = 1 << 20;
/// Most blocks one `allocation` call looks at (the reply covers a prefix).
const MAX_STATUS_BLOCKS: u64 = 1 << 16;
/// Reads that fetch more blocks than this from disk do not fill the cache.
const SCAN_BLOCKS: usize = 8;
/// Largest single read of adjacent blocks.
const MAX_READ_RUN: u64 = 8 << 20;

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

/// Contents of blocks outside the open txg: the syncing txg, else the
/// committed block map (through the cache; adjacent blocks are read from
/// disk in one I/O and verified one by one). `None` is a hole.
pub(crate) fn read_outside_open(
    p: &ImportedPool,
    view: &View,
    ds: u64,
    bs: u32,
    blocks: &[u64],
) -> Result<HashMap<u64, Option<Arc<Vec<u8>>>>> {
    let mut out = HashMap::with_capacity(blocks.len());
    let mut committed = Vec::new();
    for &b in blocks {
        match view.syncing.as_ref().and_then(|s| s.get(&(ds, b))) {
            Some(d) => {
                out.insert(b, materialized(d, bs));
            }
            None => committed.push(b),
        }
    }
    let (Some(&lo), Some(&hi)) = (committed.iter().min(), committed.iter().max()) else {
        return Ok(out);
    };
    // One range scan when the blocks are dense (a read), point lookups when
    // they are far apart (the head and tail of a large write).
    let pointers = if hi - lo < 4 * committed.len() as u64 {
        view.pointers(ds, lo, hi, usize::MAX)?
    } else {
        let mut m = std::collections::BTreeMap::new();
        for &b in &committed {
            m.extend(view.pointers(ds, b, b, 1)?);
        }
        m
    };
    let mut fetch: Vec<(u64, &BlockPointer)> = Vec::new();
    for b in committed {
        match pointers.get(&b) {
            None => {
                out.insert(b, None);
            }
            Some(bp) => match p.cache.get(&(ds, b, bp.birth)) {
                Some(hit) => {
                    out.insert(b, Some(hit));
                }
                None => fetch.push((b, bp)),
            },
        }
    }
    fetch.sort_unstable_by_key(|(_, bp)| (bp.dvas[0].group, bp.dvas[0].offset));
    // Scan resistance: a large read (a backup, a copy) would push every hot
    // block out of the FIFO cache for data read once; only small reads and
    // read-modify-write bases are kept.
    let keep_in_cache = fetch.len() <= SCAN_BLOCKS;
    let mut i = 0;
    while i < fetch.len() {
        // A run: blocks whose first copies lie back to back on one group.
        let first = fetch[i].1.dvas[0];
        let mut end = first.offset + first.asize as u64;
        let mut j = i + 1;
        while j < fetch.len() {
            let d = fetch[j].1.dvas[0];
            if d.group != first.group
                || d.offset != end
                || end - first.offset + d.asize as u64 > MAX_READ_RUN
            {
                break;
            }
            end += d.asize as u64;
            j += 1;
        }
        let run = p
            .pool
            .read_run(first.group, first.offset, (end - first.offset) as usize)
            .ok();
        for &(b, bp) in &fetch[i..j] {
            let at = (bp.dvas[0].offset - first.offset) as usize;
            let quick = run
                .as_ref()
                .and_then(|r| block::decode_verified(bp, &r[at..at + bp.psize as usize]));
            let data = match quick {
                Some(d) => d,
                // Slow path: try every copy, heal the bad ones, count the errors.
                None => block::read_block(&p.pool, bp).map_err(|e| {
                    crate::scrub::note_lost_block(p, (ds, b, bp.birth));
                    Error::Corrupt(format!(
                        "dataset {ds} block {b} (byte offset {}): {e}",
                        b * bs as u64
                    ))
                })?,
            };
            if data.len() != bs as usize {
                return Err(Error::Corrupt(format!(
                    "dataset {ds} block {b}: {} bytes, volblocksize is {bs}",
                    data.len()
                )));
            }
            p.counters
                .read_bytes
                .fetch_add(bp.psize as u64, Ordering::Relaxed);
            let data = Arc::new(data);
            if keep_in_cache {
                p.cache.insert((ds, b, bp.birth), data.clone());
            }
            out.insert(b, Some(data));
        }
        i = j;
    }
    Ok(out)
}

fn materialized(d: &Dirty, bs: u32) -> Option<Arc<Vec<u8>>> {
    match d {
        Dirty::Data(v) => Some(v.clone()),
        Dirty::Zero => Some(Arc::new(vec![0u8; bs as usize])),
        Dirty::Hole => None,
    }
}

/// Applies a write or zeroing to the open txg and, with `log`, appends it
/// to the intent log under the same lock (log order = apply order).
/// Returns the sequence number of the last log record.
pub(crate) fn apply(
    p: &ImportedPool,
    ds: u64,
    bs: u32,
    offset: u64,
    op: Op<'_>,
    log: bool,
    zero_to_hole: bool,
) -> Result<u64> {
    let len = op.len();
    if len == 0 {
        return Ok(0);
    }
    let bsz = bs as u64;
    let first = offset / bsz;
    let last = (offset + len - 1) / bsz;
    let is_partial = |b: u64| {
        let start = b * bsz;
        offset > start || offset + len < start + bsz
    };
    let partials: Vec<u64> = [first, last]
        .into_iter()
        .filter(|&b| is_partial(b))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    for _attempt in 0..64 {
        let (txg, need): (u64, Vec<u64>) = {
            let open = p.open.lock();
            (
                open.txg,
                partials
                    .iter()
                    .copied()
                    .filter(|b| !open.dirty.contains_key(&(ds, *b)))
                    .collect(),
            )
        };
        // Old contents of partially written blocks, read without holding the lock.
        let view = p.view()?;
        let bases = read_outside_open(p, &view, ds, bs, &need)?;
        // For deallocation: which whole blocks exist at all (no need to record holes over holes).
        let existing: HashSet<u64> = match op {
            Op::Zero {
                allocate: false, ..
            } if (first..=last).any(|b| !is_partial(b)) => {
                let mut set: HashSet<u64> = view
                    .pointers(ds, first, last, usize::MAX)?
                    .into_keys()
                    .collect();
                if let Some(s) = view.syncing.as_ref() {
                    set.extend(
                        s.keys()
                            .filter(|k| k.0 == ds && (first..=last).contains(&k.1))
                            .map(|k| k.1),
                    );
                }
                set
            }
            _ => HashSet::new(),
        };
        let mut open = p.open.lock();
        if open.txg != txg {
            continue; // a txg started meanwhile: the bases may be stale
        }
        for b in first..=last {
            let start = b * bsz;
            let lo = offset.max(start);
            let hi = (offset + len).min(start + bsz);
            let (in_lo, in_hi) = ((lo - start) as usize, (hi - start) as usize);
            let key = (ds, b);
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
                let mut buf: Vec<u8> = match open.dirty.get(&key) {
                    Some(d) => materialized(d, bs).map(|a| a.to_vec()),
                    None => bases.get(&b).cloned().flatten().map(|a| a.to_vec()),
                }
                .unwrap_or_else(|| vec![0u8; bs as usize]);
                match op {
                    Op::Write(data) => buf[in_lo..in_hi]
                        .copy_from_slice(&data[(lo - offset) as usize..(hi - offset) as usize]),
                    Op::Zero { .. } => buf[in_lo..in_hi].fill(0),
                }
                Some(Dirty::Data(Arc::new(buf)))
            };
            if let Some(new) = new {
                let weight = if matches!(new, Dirty::Data(_)) {
                    bsz
                } else {
                    0
                };
                if open.dirty.insert(key, new).is_none() {
                    open.dirty_bytes += weight;
                }
            }
        }
        let mut seq = 0;
        if log {
            match op {
                Op::Write(data) => {
                    for (i, chunk) in data.chunks(MAX_LOG_RECORD).enumerate() {
                        let at = offset + (i * MAX_LOG_RECORD) as u64;
                        seq = p
                            .log
                            .append(RecordKind::Write, ds, at, chunk.len() as u64, chunk);
                    }
                }
                Op::Zero { len, allocate } => {
                    let kind = if allocate {
                        RecordKind::ZeroAllocated
                    } else {
                        RecordKind::Trim
                    };
                    seq = p.log.append(kind, ds, offset, len, &[]);
                }
            }
        }
        return Ok(seq);
    }
    Err(Error::Busy(format!(
        "dataset {ds}: txgs turned over faster than a write could apply"
    )))
}

impl Volume {
    pub(crate) fn new(pool: Arc<ImportedPool>, id: u64, name: String) -> Volume {
        Volume { pool, id, name }
    }

    /// (volsize, volblocksize, readonly, compression is on) as of now.
    fn current(&self) -> Result<(u64, u32, bool, bool)> {
        if self.pool.is_closed() {
            return Err(Error::NotFound(self.name.clone()));
        }
        let datasets = self.pool.datasets.read();
        let rec = datasets
            .get(&self.name)
            .filter(|r| r.id == self.id)
            .ok_or_else(|| Error::NotFound(self.name.clone()))?;
        let lineage = crate::txg::lineage(&datasets, rec);
        Ok((
            rec.volsize,
            rec.volblocksize,
            lineage.readonly(),
            lineage.compression() != block::Compression::Off,
        ))
    }

    fn check_range(&self, offset: u64, len: u64, size: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::InvalidArgument(format!(
                "{}: range {offset}+{len} beyond volume size {size}",
                self.name
            ))),
        }
    }

    pub fn name(&self) -> String {
        self.name.clone()
    }

    pub fn size(&self) -> u64 {
        self.current().map(|c| c.0).unwrap_or(0)
    }

    pub fn block_size(&self) -> u32 {
        self.current().map(|c| c.1).unwrap_or(4096)
    }

    pub fn read_only(&self) -> bool {
        self.current().map(|c| c.2).unwrap_or(true)
    }

    pub fn read(&self, offset: u64, len: u64) -> Result<Vec<ReadSegment>> {
        let (size, bs, _, _) = self.current()?;
        self.check_range(offset, len, size)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let bsz = bs as u64;
        let (first, last) = (offset / bsz, (offset + len - 1) / bsz);
        let in_open: Vec<Option<Dirty>> = {
            let open = self.pool.open.lock();
            (first..=last)
                .map(|b| open.dirty.get(&(self.id, b)).cloned())
                .collect()
        };
        let outside: Vec<u64> = (first..=last)
            .filter(|b| in_open[(b - first) as usize].is_none())
            .collect();
        let mut fetched = if outside.is_empty() {
            HashMap::new()
        } else {
            read_outside_open(&self.pool, &self.pool.view()?, self.id, bs, &outside)?
        };
        let mut out: Vec<ReadSegment> = Vec::new();
        for (i, b) in (first..=last).enumerate() {
            let data = match &in_open[i] {
                Some(d) => materialized(d, bs),
                None => fetched.remove(&b).flatten(),
            };
            let start = b * bsz;
            let lo = (offset.max(start) - start) as usize;
            let hi = ((offset + len).min(start + bsz) - start) as usize;
            match (data, out.last_mut()) {
                (None, Some(ReadSegment::Hole(n))) => *n += (hi - lo) as u64,
                (None, _) => out.push(ReadSegment::Hole((hi - lo) as u64)),
                (Some(d), Some(ReadSegment::Data(v))) => v.extend_from_slice(&d[lo..hi]),
                (Some(d), _) => {
                    let mut v = Vec::with_capacity(len as usize);
                    v.extend_from_slice(&d[lo..hi]);
                    out.push(ReadSegment::Data(v));
                }
            }
        }
        Ok(out)
    }

    fn modify(&self, offset: u64, op: Op<'_>, fua: bool) -> Result<()> {
        let (size, bs, readonly, compressing) = self.current()?;
        if readonly {
            return Err(Error::ReadOnly(self.name.clone()));
        }
        self.check_range(offset, op.len(), size)?;
        self.ensure_space(op.len())?;
        self.pool.throttle();
        let seq = apply(&self.pool, self.id, bs, offset, op, true, compressing)?;
        if fua {
            self.pool
                .log
                .commit(seq)
                .map_err(|e| Error::Io(e.to_string()))?;
        }
        Ok(())
    }

    /// Refuses a write that could not be placed even after the next txg.
    fn ensure_space(&self, len: u64) -> Result<()> {
        let pool = &self.pool;
        let free = pool.pool.allocator().free_bytes();
        let pending = pool.open.lock().dirty_bytes;
        let reserve = pool.pool.size() / 32;
        if free.saturating_sub(pending) < len.saturating_add(reserve) {
            pool.sync_now()?;
            let free = pool.pool.allocator().free_bytes();
            if free < len.saturating_add(reserve) {
                return Err(Error::NoSpace(pool.pool.name.clone()));
            }
        }
        Ok(())
    }

    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.modify(offset, Op::Write(data), fua)
    }

    pub fn flush(&self) -> Result<()> {
        self.current()?;
        self.pool
            .log
            .commit(self.pool.log.last_seq())
            .map_err(|e| Error::Io(e.to_string()))
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

    pub fn allocation(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let (size, bs, _, _) = self.current()?;
        self.check_range(offset, len, size)?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let bsz = bs as u64;
        let first = offset / bsz;
        let last = ((offset + len - 1) / bsz).min(first + MAX_STATUS_BLOCKS - 1);
        // The open txg first, then the view (see ImportedPool::view for why).
        let in_open: Vec<Option<Dirty>> = {
            let open = self.pool.open.lock();
            (first..=last)
                .map(|b| open.dirty.get(&(self.id, b)).cloned())
                .collect()
        };
        let view = self.pool.view()?;
        let committed = view.pointers(self.id, first, last, usize::MAX)?;
        let mut out: Vec<Extent> = Vec::new();
        for (i, b) in (first..=last).enumerate() {
            let key = (self.id, b);
            let dirty = in_open[i]
                .as_ref()
                .or_else(|| view.syncing.as_ref().and_then(|s| s.get(&key)));
            let (hole, zero) = match dirty {
                Some(Dirty::Data(_)) => (false, false),
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
}
