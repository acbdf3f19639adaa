//! A bounded local cache of a bucket device, filled on demand (decision 0054).
//!
//! Bounded by `[bucket] cache_bytes` or, unset, by a default from the free
//! local disk (decision 0063), opening a bucket device no longer
//! rebuilds the whole device locally: it builds an index of the device from
//! the log (device range -> segment range, inline bytes or zeros), writes
//! only the inline bytes, and leaves every other range a hole. The cache
//! file is divided into lines of [`LINE`] bytes. A read or partial write of a
//! line not resident fetches the segment objects the index names for it
//! (whole, checked against their blake3: a wrong or short answer is an
//! error, never data) and writes the line. Lines are evicted least recently
//! used first (a hole is punched) once more than the bound are resident,
//! but never a line in use, one written and not yet shipped, or one whose
//! bytes live only inline in the log (those stay until the next open; a
//! checkpoint moves them into segments).

use crate::bucket::{block, seg_key, Entry, Op, SegmentRef, CHUNK_SHIFT};
use bytes::Bytes;
use object_store::path::Path as ObjPath;
use object_store::ObjectStore;
use objstore::record::{Kind, Record};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Granularity of residency and eviction.
pub const LINE: u64 = 1 << 20;
/// log2 of a segment chunk with its own sum (decision 0059).
const CHUNK: u32 = CHUNK_SHIFT as u32;
/// Attempts at fetching one segment before a read fails.
const FETCH_ATTEMPTS: usize = 2;
/// Longest wait for another write to land a line (a local pwrite).
const LANDING_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Where the bytes of an extent are.
#[derive(Debug, Clone)]
enum Src {
    Seg {
        seg: Arc<SegmentRef>,
        off: u64,
    },
    /// Only in a log record (kept in the cache file, never evicted).
    Inline,
}

impl Src {
    fn advance(&self, by: u64) -> Src {
        match self {
            Src::Seg { seg, off } => Src::Seg {
                seg: seg.clone(),
                off: off + by,
            },
            Src::Inline => Src::Inline,
        }
    }
}

/// start -> (end, where); ranges not in the map are zeros.
#[derive(Debug, Default)]
struct Map(BTreeMap<u64, (u64, Src)>);

impl Map {
    fn put(&mut self, start: u64, end: u64, src: Option<Src>) {
        if start >= end {
            return;
        }
        let hit: Vec<u64> = self
            .0
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(s, _)| *s)
            .collect();
        for s in hit {
            let Some((e, l)) = self.0.remove(&s) else {
                continue;
            };
            if s < start {
                self.0.insert(s, (start, l.clone()));
            }
            if e > end {
                self.0.insert(end, (e, l.advance(end - s)));
            }
        }
        if let Some(l) = src {
            self.0.insert(start, (end, l));
        }
    }

    /// The extents overlapping [start, end), clipped to it.
    fn within(&self, start: u64, end: u64) -> Vec<(u64, u64, Src)> {
        let mut out = Vec::new();
        let first = self
            .0
            .range(..=start)
            .next_back()
            .map_or(start, |(s, _)| *s);
        for (s, (e, l)) in self.0.range(first..end) {
            if *e <= start {
                continue;
            }
            let cs = (*s).max(start);
            out.push((cs, (*e).min(end), l.advance(cs - s)));
        }
        out
    }

    /// Applies one entry; returns the ranges it put inline.
    fn apply(&mut self, e: &Entry) -> Vec<(u64, u64)> {
        let segs: Vec<Arc<SegmentRef>> = e.segments.iter().cloned().map(Arc::new).collect();
        let mut inline = Vec::new();
        for op in &e.ops {
            match op {
                Op::Data { offset, data } => {
                    let end = offset + data.len() as u64;
                    self.put(*offset, end, Some(Src::Inline));
                    inline.push((*offset, end));
                }
                Op::Zero { offset, len } => self.put(*offset, offset + len, None),
                Op::Seg {
                    offset,
                    len,
                    seg,
                    seg_offset,
                } => self.put(
                    *offset,
                    offset + len,
                    Some(Src::Seg {
                        seg: segs[*seg as usize].clone(),
                        off: *seg_offset,
                    }),
                ),
            }
        }
        inline
    }
}

#[derive(Debug, Default, Clone)]
struct Line {
    resident: bool,
    /// Holds bytes that live only inline in the log (or the local MMP slot).
    keep: bool,
    pins: u32,
    /// Writes that cover the whole (absent) line and have not landed yet:
    /// the line becomes resident only once their bytes are in the file, and
    /// every other I/O of the line waits for them (decision 0054's race).
    writing: u32,
    /// Written and not known shipped: the write generation, 0 when clean.
    dirty: u64,
    tick: u64,
    /// A failed write left this line without bytes that live only in the
    /// log and they could not be put back: I/O of it fails until a write
    /// covers it whole (or the next open rebuilds it).
    lost: bool,
}

#[derive(Debug, Default)]
struct Index {
    map: Map,
    lines: Vec<Line>,
    /// tick -> line, resident lines only.
    lru: BTreeMap<u64, usize>,
    tick: u64,
    /// Lines holding bytes (resident or keep).
    occupied: u64,
    generation: u64,
    dirty: BTreeSet<usize>,
}

impl Index {
    fn touch(&mut self, i: usize) {
        let old = self.lines[i].tick;
        self.lru.remove(&old);
        self.tick += 1;
        self.lines[i].tick = self.tick;
        self.lru.insert(self.tick, i);
    }
    fn occupy(&mut self, i: usize, resident: bool, keep: bool) {
        let l = &mut self.lines[i];
        let before = l.resident || l.keep;
        l.resident |= resident;
        l.keep |= keep;
        if !before {
            self.occupied += 1;
        }
        if resident {
            self.touch(i);
        }
    }
}

/// Segment bytes fetched and verified: `body` is `name` from offset `base`.
struct Piece {
    name: String,
    base: u64,
    body: Bytes,
}

impl Piece {
    /// The bytes [off, end) of the segment, if this piece holds them.
    fn get(&self, name: &str, off: u64, end: u64) -> Option<&[u8]> {
        if self.name != name || off < self.base {
            return None;
        }
        self.body
            .get((off - self.base) as usize..(end - self.base) as usize)
    }
}

/// Chunks read past what a line needs when a fill continues the previous
/// one in the same segment (a sequential read): one GET per 8 MiB.
const READ_AHEAD_CHUNKS: u64 = 7;

/// Counters (the bench and `pool status`).
#[derive(Debug, Default)]
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub fetched_bytes: AtomicU64,
    pub evicted_lines: AtomicU64,
}

pub(crate) struct Cache {
    file: File,
    store: Arc<dyn ObjectStore>,
    prefix: ObjPath,
    size: u64,
    bound: u64,
    index: Mutex<Index>,
    /// Signalled (with `index`) when a whole-line write lands or gives up.
    landed: Condvar,
    /// Held while lines become resident; holds the last segment fetched.
    fill: Mutex<Option<Piece>>,
    pub(crate) stats: CacheStats,
}

/// Lines pinned by one I/O; unpinned on drop.
pub(crate) struct Pins<'a> {
    cache: &'a Cache,
    first: usize,
    last: usize,
    /// Absent lines this write covers whole: resident once it has landed.
    landing: Vec<usize>,
    /// What those lines held that a failed write must put back: bytes that
    /// live only in the log (inline) and the local MMP slot.
    saved: Vec<(u64, Vec<u8>)>,
}

impl Pins<'_> {
    /// The pinned lines were written: not evictable until shipped. Lines
    /// the write covered whole become resident now that their bytes are in
    /// the file, not before.
    pub(crate) fn written(mut self) {
        self.saved.clear();
        let mut ix = self.cache.index.lock();
        for i in std::mem::take(&mut self.landing) {
            ix.lines[i].writing -= 1;
            ix.lines[i].lost = false;
            ix.occupy(i, true, false);
        }
        ix.generation += 1;
        let g = ix.generation;
        for i in self.first..=self.last {
            ix.lines[i].dirty = g;
            ix.dirty.insert(i);
        }
        drop(ix);
        self.cache.landed.notify_all();
    }
}

impl Drop for Pins<'_> {
    fn drop(&mut self) {
        let mut ix = self.cache.index.lock();
        for i in self.first..=self.last {
            ix.lines[i].pins -= 1;
        }
        // A write that failed: what it left of a line it covered whole is
        // neither the old bytes nor the new ones, so the line stays absent:
        // a hole, filled again by the next read, with the bytes that live
        // only in the log put back first (they are not in any segment).
        for i in std::mem::take(&mut self.landing) {
            ix.lines[i].writing -= 1;
            if punch(&self.cache.file, i as u64 * LINE, LINE).is_err() {
                ix.lines[i].lost = true;
            }
        }
        for (at, bytes) in std::mem::take(&mut self.saved) {
            let put_back = if crate::hooks::put_back_fails(at / LINE * LINE) {
                Err(std::io::Error::from_raw_os_error(libc::EIO))
            } else {
                self.cache.file.write_all_at(&bytes, at)
            };
            if let Err(e) = put_back {
                tracing::error!(
                    "bucket cache: putting back {} log bytes at {at}: {e}",
                    bytes.len()
                );
                for i in lines_of(at, bytes.len() as u64) {
                    ix.lines[i].lost = true;
                }
            }
        }
        drop(ix);
        self.cache.landed.notify_all();
        self.cache.evict();
    }
}

impl Cache {
    /// An index of the device from the log (`records`, from the last
    /// checkpoint on); writes the inline bytes into `file` (empty, sized
    /// later) and returns the device size the log names.
    pub(crate) fn build(
        store: Arc<dyn ObjectStore>,
        prefix: ObjPath,
        file: &File,
        records: &[Record],
    ) -> Result<(Cache, Option<u64>), String> {
        let mut map = Map::default();
        let mut size = None;
        let mut inline: BTreeMap<u64, (u64, Bytes)> = BTreeMap::new();
        let mut put_inline = |map: &mut Map, e: &Entry| {
            map.apply(e);
            for op in &e.ops {
                match op {
                    Op::Data { offset, data } => {
                        overwrite(&mut inline, *offset, offset + data.len() as u64);
                        inline.insert(*offset, (offset + data.len() as u64, data.clone()));
                    }
                    Op::Zero { offset, len } | Op::Seg { offset, len, .. } => {
                        overwrite(&mut inline, *offset, offset + len)
                    }
                }
            }
        };
        let base = crate::compact::last_checkpoint(records)?;
        let from = base.as_ref().map_or(0, |(_, c)| c.replay_from);
        if let Some((_, ck)) = base {
            size = Some(ck.image.size);
            put_inline(&mut map, &ck.image);
        }
        for rec in records.iter().filter(|r| r.seq > from) {
            for entry in crate::compact::batch_entries(rec) {
                let entry = entry?;
                size = Some(entry.size);
                put_inline(&mut map, &entry);
            }
        }
        let dev_size = size.unwrap_or(0);
        // Bounded by the caller once the device size is known ([`Cache::bounded`]).
        let cache = Cache::new(store, prefix, file, dev_size, u64::MAX)?;
        {
            let mut ix = cache.index.lock();
            ix.map = map;
            for (s, (e, data)) in inline {
                file.write_all_at(&data, s)
                    .map_err(|e| format!("cache write: {e}"))?;
                for i in lines_of(s, e - s) {
                    ix.occupy(i, false, true);
                }
            }
        }
        Ok((cache, size))
    }

    /// An empty index over a device of `size` (a new pool).
    pub(crate) fn new(
        store: Arc<dyn ObjectStore>,
        prefix: ObjPath,
        file: &File,
        size: u64,
        bound: u64,
    ) -> Result<Cache, String> {
        let file = file.try_clone().map_err(|e| e.to_string())?;
        let n = size.div_ceil(LINE) as usize;
        let mut index = Index {
            lines: vec![Line::default(); n],
            ..Default::default()
        };
        // The MMP slot is written locally only: never evicted.
        for i in lines_of(crate::MMP_SLOT_OFFSET, crate::MMP_SLOT_SIZE) {
            if i < n {
                index.occupy(i, false, true);
            }
        }
        Ok(Cache {
            file,
            store,
            prefix,
            size,
            bound: bound.max(LINE),
            index: Mutex::new(index),
            landed: Condvar::new(),
            fill: Mutex::new(None),
            stats: CacheStats::default(),
        })
    }

    /// The same cache bounded to `bound` bytes.
    pub(crate) fn bounded(mut self, bound: u64) -> Cache {
        self.bound = bound.max(LINE);
        self
    }

    /// Bytes the cache holds (resident or kept lines).
    pub(crate) fn occupied_bytes(&self) -> u64 {
        self.index.lock().occupied * LINE
    }

    pub(crate) fn figures(&self) -> crate::compact::CacheFigures {
        let s = &self.stats;
        crate::compact::CacheFigures {
            held_bytes: self.occupied_bytes(),
            bound_bytes: self.bound,
            hits: s.hits.load(Ordering::Relaxed),
            misses: s.misses.load(Ordering::Relaxed),
            fetched_bytes: s.fetched_bytes.load(Ordering::Relaxed),
            evicted_lines: s.evicted_lines.load(Ordering::Relaxed),
        }
    }

    /// Makes the lines of [offset, offset+len) resident and pins them.
    /// `write`: lines the I/O covers whole need no fetch.
    pub(crate) fn pin(&self, offset: u64, len: u64, write: bool) -> Result<Pins<'_>, String> {
        let n = self.size.div_ceil(LINE) as usize;
        if n == 0 || offset >= self.size {
            return Err(format!("cache: offset {offset} beyond the device end"));
        }
        let len = len.clamp(1, self.size - offset);
        let (first, last) = (
            (offset / LINE) as usize,
            ((offset + len - 1) / LINE) as usize,
        );
        {
            let mut ix = self.index.lock();
            if (first..=last).all(|i| ix.lines[i].resident) {
                for i in first..=last {
                    ix.lines[i].pins += 1;
                    ix.touch(i);
                }
                self.stats.hits.fetch_add(1, Ordering::Relaxed);
                return Ok(Pins {
                    cache: self,
                    first,
                    last,
                    landing: Vec::new(),
                    saved: Vec::new(),
                });
            }
        }
        self.stats.misses.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        'retry: loop {
            let mut memo = self.fill.lock();
            let mut landing = Vec::new();
            let mut keep_ranges = Vec::new();
            for i in first..=last {
                let (start, end) = (i as u64 * LINE, ((i as u64 + 1) * LINE).min(self.size));
                let whole = write && offset <= start && offset + len >= end;
                {
                    let mut ix = self.index.lock();
                    let Some(l) = ix.lines.get(i) else { continue };
                    if l.resident {
                        continue;
                    }
                    if l.writing > 0 {
                        // Another write is landing this line: its bytes are
                        // not all in the file yet. Give back what we hold
                        // (and the fill lock, which that writer may need for
                        // its other lines), wait, and start again.
                        for j in landing.drain(..) {
                            let l: &mut Line = &mut ix.lines[j];
                            l.writing -= 1;
                        }
                        drop(memo);
                        crate::hooks::at(crate::hooks::Point::WaitLanding { line: i as u64 });
                        while ix.lines[i].writing > 0 {
                            let left = LANDING_WAIT.saturating_sub(started.elapsed());
                            if left.is_zero() {
                                return Err(format!("cache line {i}: a write never landed"));
                            }
                            self.landed.wait_for(&mut ix, left);
                        }
                        drop(ix);
                        self.landed.notify_all();
                        continue 'retry;
                    }
                    if whole {
                        // No fetch: the write replaces every byte. The line
                        // turns resident in `Pins::written`, after the bytes.
                        ix.lines[i].writing += 1;
                        landing.push(i);
                        if ix.lines[i].keep {
                            keep_ranges.extend(ix.map.within(start, end).into_iter().filter_map(
                                |(s, e, src)| matches!(src, Src::Inline).then_some((s, e)),
                            ));
                            let (ms, me) = (
                                crate::MMP_SLOT_OFFSET,
                                crate::MMP_SLOT_OFFSET + crate::MMP_SLOT_SIZE,
                            );
                            if ms < end && me > start {
                                keep_ranges.push((ms.max(start), me.min(end)));
                            }
                        }
                        continue;
                    }
                    if l.lost {
                        let why = format!(
                            "cache line {i} lost bytes that live only in the log to a failed write"
                        );
                        for j in landing.drain(..) {
                            ix.lines[j].writing -= 1;
                        }
                        drop(ix);
                        self.landed.notify_all();
                        return Err(why);
                    }
                }
                if let Err(e) = self.fill_line(&mut memo, start, end) {
                    let mut ix = self.index.lock();
                    for j in landing.drain(..) {
                        ix.lines[j].writing -= 1;
                    }
                    drop(ix);
                    self.landed.notify_all();
                    return Err(e);
                }
                self.index.lock().occupy(i, true, false);
            }
            // Lines landed whole that hold log-only bytes: keep a copy, for
            // a failed write to put back.
            let mut saved = Vec::with_capacity(keep_ranges.len());
            for (s, e) in keep_ranges {
                let mut b = vec![0u8; (e - s) as usize];
                if let Err(err) = self.file.read_exact_at(&mut b, s) {
                    let mut ix = self.index.lock();
                    for j in landing.drain(..) {
                        ix.lines[j].writing -= 1;
                    }
                    drop(ix);
                    self.landed.notify_all();
                    return Err(format!("cache read at {s}: {err}"));
                }
                saved.push((s, b));
            }
            let mut ix = self.index.lock();
            for i in first..=last {
                ix.lines[i].pins += 1;
                if ix.lines[i].resident {
                    ix.touch(i);
                }
            }
            return Ok(Pins {
                cache: self,
                first,
                last,
                landing,
                saved,
            });
        }
    }

    /// Writes the segment bytes of one absent line (its zeros are holes
    /// already, its inline bytes were written at open). Fill lock held.
    fn fill_line(&self, memo: &mut Option<Piece>, start: u64, end: u64) -> Result<(), String> {
        let mut redirected = 0;
        'again: loop {
            let mut exts = self.index.lock().map.within(start, end);
            // One GET per segment per line: a line whose extents alternate
            // between segments (small writes over a large one) would
            // otherwise fetch each segment again at every switch. The
            // segment kept from the last fill goes first.
            let kept = memo.as_ref().map(|p| p.name.clone());
            exts.sort_by(|a, b| {
                let key = |src: &Src| match src {
                    Src::Seg { seg, .. } => (Some(&seg.name) != kept.as_ref(), seg.name.clone()),
                    Src::Inline => (false, String::new()),
                };
                key(&a.2).cmp(&key(&b.2))
            });
            // What this line needs of each segment: one range per segment.
            let mut span: BTreeMap<String, (u64, u64)> = BTreeMap::new();
            for (s, e, src) in &exts {
                if let Src::Seg { seg, off } = src {
                    let r = span
                        .entry(seg.name.clone())
                        .or_insert((*off, off + (e - s)));
                    r.0 = r.0.min(*off);
                    r.1 = r.1.max(off + (e - s));
                }
            }
            for (s, e, src) in exts {
                let Src::Seg { seg, off } = src else { continue };
                let want = (off, off + (e - s));
                if memo
                    .as_ref()
                    .and_then(|p| p.get(&seg.name, want.0, want.1))
                    .is_none()
                {
                    let (lo, hi) = span.get(&seg.name).copied().unwrap_or(want);
                    // A fill that starts where the kept piece of the same
                    // segment ends continues a sequential read.
                    let sequential = memo.as_ref().is_some_and(|p| {
                        p.name == seg.name && p.base + p.body.len() as u64 == lo >> CHUNK << CHUNK
                    });
                    match self.fetch(&seg, lo, hi, sequential) {
                        Ok(p) => *memo = Some(p),
                        Err(Fetch::Gone) if redirected < 3 => {
                            // Compaction moved it: the last checkpoint says where.
                            redirected += 1;
                            self.redirect(&seg.name)?;
                            continue 'again;
                        }
                        Err(Fetch::Gone) => return Err(format!("segment {} is gone", seg.name)),
                        Err(Fetch::Failed(why)) => return Err(why),
                    }
                }
                let Some(bytes) = memo.as_ref().and_then(|p| p.get(&seg.name, want.0, want.1))
                else {
                    return Err(format!("segment {} is shorter than its index", seg.name));
                };
                self.file
                    .write_all_at(bytes, s)
                    .map_err(|e| format!("cache write at {s}: {e}"))?;
            }
            return Ok(());
        }
    }

    /// Fetches and verifies at least [lo, hi) of a segment: the chunks
    /// covering it (plus a read-ahead when `sequential`) when the entry
    /// gave a chunk table (decision 0059), else the whole object.
    fn fetch(&self, seg: &SegmentRef, lo: u64, hi: u64, sequential: bool) -> Result<Piece, Fetch> {
        let n = seg.chunks.len() as u64;
        let (first, last) = if n == 0 {
            (0, 0)
        } else {
            let ahead = if sequential { READ_AHEAD_CHUNKS } else { 0 };
            (lo >> CHUNK, (hi.div_ceil(1 << CHUNK) + ahead).min(n))
        };
        let (base, until) = if n == 0 {
            (0, seg.len)
        } else {
            (first << CHUNK, (last << CHUNK).min(seg.len))
        };
        let mut failure = String::new();
        for _ in 0..FETCH_ATTEMPTS {
            let key = seg_key(&self.prefix, &seg.name);
            let store = self.store.clone();
            let whole = n == 0;
            let got = block(async move {
                let opts = object_store::GetOptions {
                    range: (!whole).then_some(object_store::GetRange::Bounded(base..until)),
                    ..Default::default()
                };
                match store.get_opts(&key, opts).await {
                    Ok(r) => r.bytes().await,
                    Err(e) => Err(e),
                }
            })
            .map_err(Fetch::Failed)?;
            match got {
                Ok(body) if body.len() as u64 == until - base && self.verify(seg, first, &body) => {
                    self.stats
                        .fetched_bytes
                        .fetch_add(until - base, Ordering::Relaxed);
                    return Ok(Piece {
                        name: seg.name.clone(),
                        base,
                        body,
                    });
                }
                Ok(body) => {
                    failure = format!(
                        "segment {} (bytes {base}..{until}) does not match its checksum ({} bytes)",
                        seg.name,
                        body.len()
                    )
                }
                Err(object_store::Error::NotFound { .. }) => return Err(Fetch::Gone),
                Err(e) => failure = format!("segment {}: {e}", seg.name),
            }
            tracing::warn!("bucket cache: {failure}");
        }
        Err(Fetch::Failed(failure))
    }

    /// The whole object against `sum`, or chunks from `first` on against
    /// the table.
    fn verify(&self, seg: &SegmentRef, first: u64, body: &[u8]) -> bool {
        if seg.chunks.is_empty() {
            return blake3::hash(body).as_bytes() == &seg.sum;
        }
        body.chunks(1 << CHUNK)
            .zip(seg.chunks.iter().skip(first as usize))
            .all(|(c, sum)| blake3::hash(c).as_bytes() == sum)
            && body.len().div_ceil(1 << CHUNK) <= seg.chunks.len() - first as usize
    }

    /// Points every extent naming segment `gone` at where the last
    /// checkpoint says those device bytes are. Only extents from records
    /// before the checkpoint can name a deleted segment, and for those the
    /// checkpoint holds the same bytes.
    fn redirect(&self, gone: &str) -> Result<(), String> {
        let (store, prefix) = (self.store.clone(), self.prefix.clone());
        let records = block(async move { objstore::read_all(store.as_ref(), &prefix).await })?
            .map_err(|e| e.to_string())?;
        let Some((seq, ck)) = crate::compact::last_checkpoint(&records)? else {
            return Err(format!("segment {gone} is gone and no checkpoint names it"));
        };
        let named_later = records
            .iter()
            .filter(|r| r.kind == Kind::Batch && r.seq > seq)
            .flat_map(|r| r.entries.iter())
            .filter(|e| !crate::compact::is_checkpoint(e))
            .filter_map(|raw| Entry::decode(raw).ok())
            .any(|e| e.segments.iter().any(|s| s.name == gone));
        if named_later || ck.image.segments.iter().any(|s| s.name == gone) {
            return Err(format!("segment {gone} is named by the log but gone"));
        }
        let mut image = Map::default();
        image.apply(&ck.image);
        let mut ix = self.index.lock();
        let stale: Vec<(u64, u64)> = ix
            .map
            .0
            .iter()
            .filter(|(_, (_, l))| matches!(l, Src::Seg { seg, .. } if seg.name == gone))
            .map(|(s, (e, _))| (*s, *e))
            .collect();
        for (s, e) in stale {
            ix.map.put(s, e, None);
            for (cs, ce, l) in image.within(s, e) {
                ix.map.put(cs, ce, Some(l));
            }
        }
        Ok(())
    }

    /// Evicts least recently used lines while over the bound.
    fn evict(&self) {
        let mut ix = self.index.lock();
        if ix.occupied * LINE <= self.bound {
            return;
        }
        let order: Vec<(u64, usize)> = ix.lru.iter().map(|(t, i)| (*t, *i)).collect();
        for (t, i) in order {
            if ix.occupied * LINE <= self.bound {
                break;
            }
            let l = &ix.lines[i];
            if l.pins > 0 || l.dirty != 0 || l.keep {
                continue;
            }
            if punch(&self.file, i as u64 * LINE, LINE).is_err() {
                continue;
            }
            ix.lines[i].resident = false;
            ix.lru.remove(&t);
            ix.occupied -= 1;
            self.stats.evicted_lines.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The current write generation (read before taking the changed ranges).
    pub(crate) fn generation(&self) -> u64 {
        self.index.lock().generation
    }

    /// Everything written up to generation `g` is in the bucket.
    pub(crate) fn shipped(&self, g: u64) {
        let mut ix = self.index.lock();
        let done: Vec<usize> = ix
            .dirty
            .iter()
            .copied()
            .filter(|i| ix.lines[*i].dirty <= g)
            .collect();
        for i in done {
            ix.lines[i].dirty = 0;
            ix.dirty.remove(&i);
        }
        drop(ix);
        self.evict();
    }

    /// An entry was queued (in log order): the index follows it.
    pub(crate) fn queued(&self, e: &Entry) {
        let mut ix = self.index.lock();
        for (s, end) in ix.map.apply(e) {
            for i in lines_of(s, end - s) {
                if i < ix.lines.len() {
                    ix.occupy(i, false, true);
                }
            }
        }
    }

    /// A standby's cache takes one more entry of the log (decision 0063):
    /// the index follows it, its inline bytes are written and its zeros
    /// punched, and a resident line whose segment bytes it changes is
    /// resident no more (its old bytes would be stale). Returns the lines
    /// it points at segments, for the standby to fetch ahead.
    pub(crate) fn follow(&self, e: &Entry) -> Result<Vec<usize>, String> {
        if e.size != self.size {
            return Err(format!(
                "the log names a device of {} bytes, the cache holds {}",
                e.size, self.size
            ));
        }
        let _fill = self.fill.lock();
        let mut ix = self.index.lock();
        ix.map.apply(e);
        let mut stale = Vec::new();
        for op in &e.ops {
            match op {
                Op::Data { offset, data } => {
                    self.file
                        .write_all_at(data, *offset)
                        .map_err(|e| format!("cache write at {offset}: {e}"))?;
                    for i in lines_of(*offset, data.len() as u64) {
                        ix.occupy(i, false, true);
                    }
                }
                Op::Zero { offset, len } => {
                    punch(&self.file, *offset, *len).map_err(|e| format!("cache punch: {e}"))?
                }
                Op::Seg { offset, len, .. } => {
                    stale.extend(lines_of(*offset, *len).filter(|i| *i < ix.lines.len()))
                }
            }
        }
        stale.dedup();
        for &i in &stale {
            let l = ix.lines[i].clone();
            if !l.resident {
                continue;
            }
            // Kept lines hold inline bytes: only their segment extents are
            // stale, and the next fill rewrites every one of those.
            if !l.keep {
                punch(&self.file, i as u64 * LINE, LINE)
                    .map_err(|e| format!("cache punch: {e}"))?;
                ix.occupied -= 1;
            }
            ix.lines[i].resident = false;
            ix.lru.remove(&l.tick);
        }
        Ok(stale)
    }

    /// Lines the index points at segment bytes, in device order.
    pub(crate) fn segment_lines(&self) -> Vec<usize> {
        let ix = self.index.lock();
        let mut out: Vec<usize> = Vec::new();
        for (s, (e, src)) in &ix.map.0 {
            if let Src::Seg { .. } = src {
                for i in lines_of(*s, e - s) {
                    if out.last() != Some(&i) {
                        out.push(i);
                    }
                }
            }
        }
        out
    }

    /// Makes line `i` resident if it is not (a standby fetching ahead).
    pub(crate) fn prefetch(&self, i: usize) -> Result<(), String> {
        let start = i as u64 * LINE;
        if start >= self.size {
            return Ok(());
        }
        self.pin(start, LINE.min(self.size - start), false)
            .map(drop)
    }

    pub(crate) fn bound(&self) -> u64 {
        self.bound
    }

    /// Counters from zero (a standby's fetches ahead are not the owner's misses).
    pub(crate) fn reset_stats(&self) {
        let s = &self.stats;
        for c in [&s.hits, &s.misses, &s.fetched_bytes, &s.evicted_lines] {
            c.store(0, Ordering::Relaxed);
        }
    }

    /// The pool freed [offset, offset+len): zeros from now on, locally and
    /// (once shipped) in the bucket, where compaction can then drop it.
    pub(crate) fn discard(&self, offset: u64, len: u64) -> Result<(), String> {
        let _fill = self.fill.lock();
        let mut ix = self.index.lock();
        ix.map.put(offset, offset + len, None);
        punch(&self.file, offset, len).map_err(|e| format!("cache discard: {e}"))?;
        ix.generation += 1;
        let g = ix.generation;
        for i in lines_of(offset, len) {
            if i < ix.lines.len() {
                ix.lines[i].dirty = g;
                ix.dirty.insert(i);
            }
        }
        Ok(())
    }
}

enum Fetch {
    Gone,
    Failed(String),
}

/// Lines overlapping [offset, offset+len).
fn lines_of(offset: u64, len: u64) -> std::ops::Range<usize> {
    if len == 0 {
        return 0..0;
    }
    (offset / LINE) as usize..((offset + len - 1) / LINE + 1) as usize
}

/// Removes [start, end) from a map of inline byte ranges (start -> (end, bytes
/// ending at end)).
fn overwrite(m: &mut BTreeMap<u64, (u64, Bytes)>, start: u64, end: u64) {
    let hit: Vec<u64> = m
        .range(..end)
        .rev()
        .take_while(|(_, (e, _))| *e > start)
        .map(|(s, _)| *s)
        .collect();
    for s in hit {
        let Some((e, data)) = m.remove(&s) else {
            continue;
        };
        // data covers [e - data.len(), e); keep the parts outside [start, end).
        let base = e - data.len() as u64;
        if s < start {
            m.insert(
                s,
                (
                    start,
                    data.slice((s - base) as usize..(start - base) as usize),
                ),
            );
        }
        if e > end {
            m.insert(end, (e, data.slice((end - base) as usize..)));
        }
    }
}

/// A hole over a range of the cache (zeros where punching is refused).
pub(crate) fn punch(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    crate::bucket::punch_zeros(file, offset, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_overwrites_keep_only_the_bytes_still_live() {
        let mut m = BTreeMap::new();
        m.insert(0, (100, Bytes::from(vec![1u8; 100])));
        overwrite(&mut m, 10, 20);
        overwrite(&mut m, 90, 200);
        let got: Vec<(u64, u64, usize)> = m.iter().map(|(s, (e, d))| (*s, *e, d.len())).collect();
        assert_eq!(got, vec![(0, 10, 10), (20, 90, 70)]);
    }

    #[test]
    fn map_within_clips_and_advances_segment_offsets() {
        let seg = Arc::new(SegmentRef {
            name: "s".into(),
            len: 1000,
            sum: [0; 32],
            chunks: Vec::new(),
        });
        let mut m = Map::default();
        m.put(
            100,
            600,
            Some(Src::Seg {
                seg: seg.clone(),
                off: 0,
            }),
        );
        m.put(300, 400, None);
        let got: Vec<(u64, u64, u64)> = m
            .within(150, 500)
            .into_iter()
            .map(|(s, e, l)| match l {
                Src::Seg { off, .. } => (s, e, off),
                Src::Inline => (s, e, u64::MAX),
            })
            .collect();
        assert_eq!(got, vec![(150, 300, 50), (400, 500, 300)]);
    }
}
