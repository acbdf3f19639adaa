//! Checkpoints, compaction and physical space of a bucket device (issue 18,
//! decision 0049).
//!
//! The log grows with every sync and segments keep bytes that later writes
//! overwrote. A **checkpoint** is one log entry (entry version 2) that
//! states the whole device as of log record `replay_from`: every non-zero
//! extent as a range of a segment. Replay starts from the last checkpoint and
//! applies only the records after `replay_from`, so every record up to
//! `replay_from` and every segment nothing after it names can go.
//!
//! Compaction builds the checkpoint from the bucket alone (never from the
//! cache, which may hold writes not shipped yet): it replays the log since
//! the previous checkpoint into an extent map, keeps segments whose live
//! share is at least `compact_below_percent` in place, and copies the live
//! extents of the others, and every inline extent, into new segments. Only
//! once the checkpoint's record is durable, and after a grace period for
//! readers that started before it (a replaying takeover, a standby), does
//! it delete: log records up to `replay_from` (oldest first, so the stored
//! log stays contiguous) and segments that neither the checkpoint nor any
//! later record names and that are settled (see [`Run::deletable`]). Each
//! step leaves the bucket readable, so a crash anywhere loses nothing: before
//! the checkpoint lands the old log is whole (new segments are orphans a
//! later run deletes); after, the checkpoint is whole.
//!
//! Snapshots need nothing special: they live inside the device, and the
//! checkpoint states the whole device.

use crate::bucket::{block, seg_key, Entry, Op, SegmentRef, SEGMENT_MAX};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use object_store::path::Path as ObjPath;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use objstore::record::{Kind, Record};
use objstore::GroupCommit;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// First byte of a checkpoint entry (ordinary entries are version 1).
pub const CHECKPOINT_VERSION: u8 = 2;
/// Default: rewrite segments whose live share is under this percentage.
pub const DEFAULT_COMPACT_BELOW_PERCENT: u8 = 50;
/// Default seconds between background compaction checks.
pub const DEFAULT_COMPACT_INTERVAL_SECS: u64 = 60;
/// Default seconds between a checkpoint and deleting what it supersedes.
pub const DEFAULT_COMPACT_GRACE_SECS: u64 = 30;
/// A background run writes a checkpoint only when it frees something: this
/// many records since the last checkpoint, or a segment under the threshold.
const MIN_RECORDS: usize = 64;
/// Past owners' epochs a checkpoint remembers (their orphans can go).
const MAX_DEAD_EPOCHS: usize = 1024;
/// Records one run reads after its checkpoint (bounds the run).
const MAX_TAIL_RECORDS: usize = 1 << 20;

/// A checkpoint: the device as of log record `replay_from`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub replay_from: u64,
    /// Epochs of owners that can write nothing more: their segments no
    /// record names are garbage.
    pub dead_epochs: Vec<u64>,
    /// The image: only `Op::Seg` extents; everything else reads as zeros.
    pub image: Entry,
}

impl Checkpoint {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_u8(CHECKPOINT_VERSION);
        b.put_u64(self.replay_from);
        b.put_u16(self.dead_epochs.len() as u16);
        for e in &self.dead_epochs {
            b.put_u64(*e);
        }
        b.put_slice(&self.image.encode());
        b.freeze()
    }

    pub fn decode(data: &Bytes) -> Result<Checkpoint, String> {
        let short = || "checkpoint cut short".to_string();
        if data.first() != Some(&CHECKPOINT_VERSION) {
            return Err("not a checkpoint".into());
        }
        let u64_at = |at: usize| -> Result<u64, String> {
            let s = data.get(at..at + 8).ok_or_else(short)?;
            let mut a = [0u8; 8];
            a.copy_from_slice(s);
            Ok(u64::from_be_bytes(a))
        };
        let replay_from = u64_at(1)?;
        let n = data.get(9..11).ok_or_else(short)?;
        let n = u16::from_be_bytes([n[0], n[1]]) as usize;
        let mut dead_epochs = Vec::with_capacity(n);
        for i in 0..n {
            dead_epochs.push(u64_at(11 + 8 * i)?);
        }
        let rest = data.slice((11 + 8 * n).min(data.len())..);
        let image = Entry::decode(&rest).map_err(|e| format!("checkpoint image: {e}"))?;
        if image
            .ops
            .iter()
            .any(|op| !matches!(op, Op::Seg { .. }) || op_len(op) == 0)
        {
            return Err("checkpoint image with an extent that is not in a segment".into());
        }
        Ok(Checkpoint {
            replay_from,
            dead_epochs,
            image,
        })
    }
}

/// Whether a raw log entry is a checkpoint (ordinary entries start with 1).
pub fn is_checkpoint(raw: &Bytes) -> bool {
    raw.first() == Some(&CHECKPOINT_VERSION)
}

/// The ordinary entries of a batch record, decoded, in log order: what a
/// replay applies (checkpoints left out; none for other kinds of record).
pub(crate) fn batch_entries(rec: &Record) -> impl Iterator<Item = Result<Entry, String>> + '_ {
    rec.entries
        .iter()
        .filter(|raw| rec.kind == Kind::Batch && !is_checkpoint(raw))
        .map(|raw| Entry::decode(raw).map_err(|e| format!("log record {}: {e}", rec.seq)))
}

fn op_len(op: &Op) -> u64 {
    match op {
        Op::Data { data, .. } => data.len() as u64,
        Op::Zero { len, .. } | Op::Seg { len, .. } => *len,
    }
}

/// The last checkpoint in `records`, with the sequence of its record.
pub fn last_checkpoint(records: &[Record]) -> Result<Option<(u64, Checkpoint)>, String> {
    for rec in records.iter().rev().filter(|r| r.kind == Kind::Batch) {
        if let Some(raw) = rec.entries.iter().rev().find(|e| is_checkpoint(e)) {
            let ck = Checkpoint::decode(raw).map_err(|e| format!("log record {}: {e}", rec.seq))?;
            return Ok(Some((rec.seq, ck)));
        }
    }
    Ok(None)
}

/// Where the live bytes of one extent are.
#[derive(Debug, Clone)]
enum Loc {
    /// In segment number `seg` (of [`Extents::segs`]) at `off`.
    Seg { seg: u32, off: u64 },
    /// Inline in a log record.
    Inline(Bytes),
}

impl Loc {
    fn advance(&self, by: u64) -> Loc {
        match self {
            Loc::Seg { seg, off } => Loc::Seg {
                seg: *seg,
                off: off + by,
            },
            Loc::Inline(b) => Loc::Inline(b.slice(by as usize..)),
        }
    }
    fn truncate(&self, len: u64) -> Loc {
        match self {
            Loc::Seg { .. } => self.clone(),
            Loc::Inline(b) => Loc::Inline(b.slice(..len as usize)),
        }
    }
}

/// The device as the log describes it: start -> (end, where). Ranges not
/// in the map are zeros.
#[derive(Default)]
struct Extents {
    map: BTreeMap<u64, (u64, Loc)>,
    segs: Vec<SegmentRef>,
    seg_ids: HashMap<String, u32>,
}

impl Extents {
    fn seg_id(&mut self, s: &SegmentRef) -> u32 {
        if let Some(id) = self.seg_ids.get(&s.name) {
            return *id;
        }
        let id = self.segs.len() as u32;
        self.segs.push(s.clone());
        self.seg_ids.insert(s.name.clone(), id);
        id
    }

    /// Overwrites [start, end) with `loc` (None: zeros).
    fn put(&mut self, start: u64, end: u64, loc: Option<Loc>) {
        if start >= end {
            return;
        }
        let hit: Vec<u64> = self
            .map
            .range(..end)
            .rev()
            .take_while(|(_, (e, _))| *e > start)
            .map(|(s, _)| *s)
            .collect();
        for s in hit {
            let Some((e, l)) = self.map.remove(&s) else {
                continue;
            };
            if s < start {
                self.map.insert(s, (start, l.truncate(start - s)));
            }
            if e > end {
                self.map.insert(end, (e, l.advance(end - s)));
            }
        }
        if let Some(l) = loc {
            self.map.insert(start, (end, l));
        }
    }

    fn apply(&mut self, e: &Entry) {
        let ids: Vec<u32> = e.segments.iter().map(|s| self.seg_id(s)).collect();
        for op in &e.ops {
            match op {
                Op::Data { offset, data } => self.put(
                    *offset,
                    offset + data.len() as u64,
                    Some(Loc::Inline(data.clone())),
                ),
                Op::Zero { offset, len } => self.put(*offset, offset + len, None),
                Op::Seg {
                    offset,
                    len,
                    seg,
                    seg_offset,
                } => self.put(
                    *offset,
                    offset + len,
                    Some(Loc::Seg {
                        seg: ids[*seg as usize],
                        off: *seg_offset,
                    }),
                ),
            }
        }
    }

    /// Live bytes per segment id.
    fn live(&self) -> Vec<u64> {
        let mut live = vec![0u64; self.segs.len()];
        for (s, (e, l)) in &self.map {
            if let Loc::Seg { seg, .. } = l {
                live[*seg as usize] += e - s;
            }
        }
        live
    }
}

/// When and how compaction runs (`[bucket]` in the config).
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub below_percent: u8,
    pub interval: Duration,
    pub grace: Duration,
}

impl Default for Policy {
    fn default() -> Policy {
        Policy {
            below_percent: DEFAULT_COMPACT_BELOW_PERCENT,
            interval: Duration::from_secs(DEFAULT_COMPACT_INTERVAL_SECS),
            grace: Duration::from_secs(DEFAULT_COMPACT_GRACE_SECS),
        }
    }
}

/// The bucket's physical figures and compaction counters of one device.
#[derive(Debug, Default, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Space {
    /// Bytes of every log and segment object under the pool's prefix, as of
    /// the last listing (`None` before the first).
    pub physical_bytes: Option<u64>,
    pub log_objects: u64,
    pub log_bytes: u64,
    pub segment_objects: u64,
    pub segment_bytes: u64,
    /// Checkpoints written and objects deleted by compaction.
    pub checkpoints: u64,
    pub deleted_objects: u64,
    pub deleted_bytes: u64,
    /// Bytes the last checkpoint copied into new segments.
    pub last_copied_bytes: u64,
    /// The bounded local cache (`[bucket] cache_bytes`, decision 0054);
    /// `None` when the device keeps a full copy.
    #[serde(default)]
    pub cache: Option<CacheFigures>,
}

/// What a bucket device's bounded local cache holds and has done.
#[derive(Debug, Default, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct CacheFigures {
    /// Bytes resident in the cache file, and the configured bound.
    pub held_bytes: u64,
    pub bound_bytes: u64,
    /// Reads served from resident lines, and reads that had to fetch.
    pub hits: u64,
    pub misses: u64,
    /// Bytes of segment objects fetched, and 1 MiB lines evicted.
    pub fetched_bytes: u64,
    pub evicted_lines: u64,
}

impl CacheFigures {
    /// The figures of several devices of one pool, summed.
    pub fn add(&mut self, o: &CacheFigures) {
        self.held_bytes += o.held_bytes;
        self.bound_bytes += o.bound_bytes;
        self.hits += o.hits;
        self.misses += o.misses;
        self.fetched_bytes += o.fetched_bytes;
        self.evicted_lines += o.evicted_lines;
    }
}

/// What a compaction run did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// The checkpoint's record, if one was written.
    pub checkpoint: Option<u64>,
    pub copied_bytes: u64,
    pub rewritten_segments: usize,
    pub deleted_records: u64,
    pub deleted_segments: u64,
    pub deleted_bytes: u64,
}

/// What the compactor shares with the shipper.
pub(crate) struct Ctx {
    pub store: Arc<dyn ObjectStore>,
    pub prefix: ObjPath,
    pub group: GroupCommit,
    pub epoch: u64,
    pub size: u64,
    pub next_segment: Arc<AtomicU64>,
    pub order: Arc<Mutex<()>>,
    pub space: Arc<Mutex<Space>>,
    /// One run at a time (background thread and explicit calls).
    pub running: Mutex<()>,
    pub stop: AtomicBool,
}

/// Lists the pool's objects and stores the physical figures.
pub(crate) fn refresh_space(ctx: &Ctx) -> Result<Space, String> {
    let store = ctx.store.clone();
    let prefix = ctx.prefix.clone();
    let (logs, segs) = block(async move {
        let mut sums = [(0u64, 0u64); 2];
        for (i, dir) in ["log", "seg"].iter().enumerate() {
            let mut list = store.list(Some(&prefix.child(*dir)));
            while let Some(meta) = list.next().await {
                let meta = meta?;
                sums[i].0 += 1;
                sums[i].1 += meta.size;
            }
        }
        Ok::<_, object_store::Error>((sums[0], sums[1]))
    })?
    .map_err(|e| format!("listing the bucket: {e}"))?;
    let mut s = ctx.space.lock();
    s.log_objects = logs.0;
    s.log_bytes = logs.1;
    s.segment_objects = segs.0;
    s.segment_bytes = segs.1;
    s.physical_bytes = Some(logs.1 + segs.1);
    Ok(s.clone())
}

fn parse_seg_name(name: &str) -> Option<(u64, u64)> {
    let (e, n) = name.split_once('-')?;
    Some((u64::from_str_radix(e, 16).ok()?, n.parse().ok()?))
}

async fn read_all(store: Arc<dyn ObjectStore>, prefix: ObjPath) -> Result<Vec<Record>, String> {
    objstore::read_all(store.as_ref(), &prefix)
        .await
        .map_err(|e| e.to_string())
}

/// One compaction run. `force` writes a checkpoint even when little would
/// be freed (tests, `pool trim`-like explicit requests).
pub(crate) fn run(ctx: &Ctx, policy: &Policy, force: bool) -> Result<Report, String> {
    let _one = ctx.running.lock();
    let mut report = Report::default();
    let records = block(read_all(ctx.store.clone(), ctx.prefix.clone()))??;
    let Some(end) = records.last().map(|r| r.seq) else {
        return Ok(report);
    };
    match objstore::last_owner(&records).or(records.last().map(|r| &r.owner)) {
        Some(o) if o.epoch == ctx.epoch => {}
        _ => return Err("compaction: the log's last owner is not this daemon (fenced)".into()),
    }
    let base = last_checkpoint(&records)?;
    let from = base.as_ref().map_or(0, |(_, c)| c.replay_from);
    let mut ext = Extents::default();
    // Segments named by the history this checkpoint supersedes.
    let mut history: HashSet<String> = HashSet::new();
    let mut dead: Vec<u64> = Vec::new();
    if let Some((_, c)) = &base {
        ext.apply(&c.image);
        dead.extend(&c.dead_epochs);
    }
    let mut since = 0usize;
    for rec in &records {
        if rec.owner.epoch != ctx.epoch && !dead.contains(&rec.owner.epoch) {
            dead.push(rec.owner.epoch);
        }
        for raw in rec.entries.iter() {
            if is_checkpoint(raw) {
                let c = Checkpoint::decode(raw)?;
                history.extend(c.image.segments.iter().map(|s| s.name.clone()));
                continue;
            }
            let e = Entry::decode(raw).map_err(|e| format!("log record {}: {e}", rec.seq))?;
            history.extend(e.segments.iter().map(|s| s.name.clone()));
            if rec.seq > from {
                ext.apply(&e);
            }
        }
        if rec.seq > from {
            since += 1;
        }
    }
    if dead.len() > MAX_DEAD_EPOCHS {
        dead.drain(..dead.len() - MAX_DEAD_EPOCHS);
    }
    let live = ext.live();
    let low: HashSet<u32> = (0..ext.segs.len() as u32)
        .filter(|i| {
            let (l, len) = (live[*i as usize], ext.segs[*i as usize].len);
            l < len && (l as u128 * 100) < (len as u128 * policy.below_percent as u128)
        })
        .collect();
    if !force && low.is_empty() && since < MIN_RECORDS {
        refresh_space(ctx)?;
        return Ok(report);
    }

    // Copy inline extents and the live extents of low segments into new
    // segments, one source segment in memory at a time.
    let mut out = SegWriter::new(ctx);
    let inline: Vec<(u64, u64)> = ext
        .map
        .iter()
        .filter(|(_, (_, l))| matches!(l, Loc::Inline(_)))
        .map(|(s, (e, _))| (*s, *e))
        .collect();
    for (s, e) in inline {
        if ctx.stop.load(Ordering::Acquire) {
            return Ok(report);
        }
        let Some((_, Loc::Inline(data))) = ext.map.get(&s).cloned() else {
            continue;
        };
        let loc = out.push(&mut ext, &data)?;
        ext.map.insert(s, (e, loc));
    }
    let mut low_sorted: Vec<u32> = low.iter().copied().collect();
    low_sorted.sort_unstable();
    for id in low_sorted {
        if ctx.stop.load(Ordering::Acquire) {
            return Ok(report);
        }
        let seg = ext.segs[id as usize].clone();
        let body = crate::bucket::fetch_segment(&ctx.store, &ctx.prefix, &seg)?;
        let hits: Vec<(u64, u64, u64)> = ext
            .map
            .iter()
            .filter_map(|(s, (e, l))| match l {
                Loc::Seg { seg, off } if *seg == id => Some((*s, *e, *off)),
                _ => None,
            })
            .collect();
        for (s, e, off) in hits {
            let piece = body.slice(off as usize..(off + e - s) as usize);
            let loc = out.push(&mut ext, &piece)?;
            ext.map.insert(s, (e, loc));
        }
        report.rewritten_segments += 1;
    }
    out.finish(&mut ext)?;
    report.copied_bytes = out.copied;

    // The image: every extent, now all in segments.
    let mut used: BTreeMap<u32, u16> = BTreeMap::new();
    let mut image = Entry {
        size: ctx.size,
        segments: vec![],
        ops: vec![],
    };
    for (s, (e, l)) in &ext.map {
        let Loc::Seg { seg, off } = l else {
            return Err("compaction: an extent was left inline".into());
        };
        let n = used.len();
        let idx = *used.entry(*seg).or_insert_with(|| {
            image.segments.push(ext.segs[*seg as usize].clone());
            n as u16
        });
        if image.segments.len() > u16::MAX as usize {
            return Err("compaction: the image names too many segments".into());
        }
        image.ops.push(Op::Seg {
            offset: *s,
            len: e - s,
            seg: idx,
            seg_offset: *off,
        });
    }
    let ck = Checkpoint {
        replay_from: end,
        dead_epochs: dead.clone(),
        image,
    };
    let image_names: HashSet<String> = ck.image.segments.iter().map(|s| s.name.clone()).collect();
    let rc = append(ctx, ck.encode())?;
    report.checkpoint = Some(rc);
    {
        let mut sp = ctx.space.lock();
        sp.checkpoints += 1;
        sp.last_copied_bytes = report.copied_bytes;
    }
    tracing::info!(
        record = rc,
        replay_from = end,
        copied = report.copied_bytes,
        rewritten = report.rewritten_segments,
        "bucket checkpoint written"
    );

    // Readers that started before the checkpoint get `grace` to finish.
    let until = Instant::now() + policy.grace;
    while Instant::now() < until {
        if ctx.stop.load(Ordering::Acquire) {
            return Ok(report);
        }
        std::thread::sleep(Duration::from_millis(50).min(until - Instant::now()));
    }

    // Segments numbered below `floor` by this daemon are named by entries
    // queued before the marker; once the marker is durable, so are they.
    let floor = {
        let _o = ctx.order.lock();
        ctx.next_segment.load(Ordering::Acquire)
    };
    append(
        ctx,
        Entry {
            size: ctx.size,
            segments: vec![],
            ops: vec![],
        }
        .encode(),
    )?;
    let mut keep = image_names;
    let tail = {
        let (store, prefix) = (ctx.store.clone(), ctx.prefix.clone());
        block(async move {
            let mut out = Vec::new();
            let mut seq = end + 1;
            while out.len() < MAX_TAIL_RECORDS {
                match objstore::read_record(store.as_ref(), &prefix, seq).await {
                    Ok(Some(r)) => out.push(r),
                    Ok(None) => break,
                    Err(e) => return Err(e.to_string()),
                }
                seq += 1;
            }
            Ok(out)
        })??
    };
    for rec in &tail {
        if rec.owner.epoch != ctx.epoch {
            return Err("compaction: another owner wrote the log; nothing deleted".into());
        }
        for raw in rec.entries.iter().filter(|r| !is_checkpoint(r)) {
            let e = Entry::decode(raw).map_err(|e| format!("log record {}: {e}", rec.seq))?;
            keep.extend(e.segments.iter().map(|s| s.name.clone()));
        }
    }
    let deletable = |name: &str| -> bool {
        if keep.contains(name) {
            return false;
        }
        if history.contains(name) {
            return true;
        }
        match parse_seg_name(name) {
            Some((epoch, n)) if epoch == ctx.epoch => n < floor,
            Some((epoch, _)) => dead.contains(&epoch),
            None => false,
        }
    };

    // Oldest record first: what stays is always a contiguous log.
    let first = records.first().map_or(end + 1, |r| r.seq);
    for seq in first..=end {
        if ctx.stop.load(Ordering::Acquire) {
            return Ok(report);
        }
        let key = ctx.prefix.child("log").child(format!("{seq:020}"));
        let size = records.iter().find(|r| r.seq == seq).map_or(0, |r| {
            r.entries.iter().map(|e| 4 + e.len() as u64).sum::<u64>()
        });
        delete(ctx, key)?;
        report.deleted_records += 1;
        report.deleted_bytes += size;
    }
    let listed: Vec<(String, u64)> = {
        let store = ctx.store.clone();
        let dir = ctx.prefix.child("seg");
        block(async move {
            let mut out = Vec::new();
            let mut list = store.list(Some(&dir));
            while let Some(m) = list.next().await {
                let m = m?;
                if let Some(n) = m.location.filename() {
                    out.push((n.to_string(), m.size));
                }
            }
            Ok::<_, object_store::Error>(out)
        })?
        .map_err(|e| format!("listing segments: {e}"))?
    };
    for (name, size) in listed {
        if ctx.stop.load(Ordering::Acquire) {
            return Ok(report);
        }
        if deletable(&name) {
            delete(ctx, seg_key(&ctx.prefix, &name))?;
            report.deleted_segments += 1;
            report.deleted_bytes += size;
        }
    }
    {
        let mut sp = ctx.space.lock();
        sp.deleted_objects += report.deleted_records + report.deleted_segments;
        sp.deleted_bytes += report.deleted_bytes;
    }
    refresh_space(ctx)?;
    Ok(report)
}

/// Appends one entry through the device's group commit (log order) and
/// waits until its record is durable.
fn append(ctx: &Ctx, raw: Bytes) -> Result<u64, String> {
    let group = ctx.group.clone();
    match block(async move { group.append(raw).await })? {
        Ok(seq) => Ok(seq),
        Err(e) => Err(format!("compaction: {e}")),
    }
}

fn delete(ctx: &Ctx, key: ObjPath) -> Result<(), String> {
    let store = ctx.store.clone();
    let k = key.clone();
    match block(async move { store.delete(&k).await })? {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(format!("deleting {key}: {e}")),
    }
}

/// Fills new segments (≤ `SEGMENT_MAX`) and uploads each when full.
struct SegWriter<'a> {
    ctx: &'a Ctx,
    buf: Vec<u8>,
    /// Extent id of the segment being filled (registered at upload).
    name: Option<String>,
    copied: u64,
}

impl<'a> SegWriter<'a> {
    fn new(ctx: &'a Ctx) -> SegWriter<'a> {
        SegWriter {
            ctx,
            buf: Vec::new(),
            name: None,
            copied: 0,
        }
    }

    /// Adds `data` and says where it will be. The segment's id is
    /// registered now with a placeholder sum, fixed at upload.
    fn push(&mut self, ext: &mut Extents, data: &[u8]) -> Result<Loc, String> {
        if !self.buf.is_empty() && self.buf.len() + data.len() > SEGMENT_MAX {
            self.finish(ext)?;
        }
        let name = match &self.name {
            Some(n) => n.clone(),
            None => {
                let n = self.ctx.next_segment.fetch_add(1, Ordering::AcqRel);
                let name = format!("{:016x}-{n:010}", self.ctx.epoch);
                self.name = Some(name.clone());
                name
            }
        };
        let id = ext.seg_id(&SegmentRef {
            name,
            len: 0,
            sum: [0; 32],
            chunks: Vec::new(),
        });
        let off = self.buf.len() as u64;
        self.buf.extend_from_slice(data);
        self.copied += data.len() as u64;
        Ok(Loc::Seg { seg: id, off })
    }

    /// Uploads the segment being filled (create-if-absent).
    fn finish(&mut self, ext: &mut Extents) -> Result<(), String> {
        let Some(name) = self.name.take() else {
            return Ok(());
        };
        let body = Bytes::from(std::mem::take(&mut self.buf));
        let sum = *blake3::hash(&body).as_bytes();
        let chunks = if crate::bucket::legacy_entries() {
            Vec::new()
        } else {
            crate::bucket::chunk_sums(&body)
        };
        let len = body.len() as u64;
        let key = seg_key(&self.ctx.prefix, &name);
        let store = self.ctx.store.clone();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        block(async move { store.put_opts(&key, PutPayload::from(body), opts).await })?
            .map_err(|e| format!("segment {name}: {e}"))?;
        if let Some(id) = ext.seg_ids.get(&name) {
            ext.segs[*id as usize] = SegmentRef {
                name,
                len,
                sum,
                chunks,
            };
        }
        Ok(())
    }
}

/// A device's compaction state: runs on demand, and in a background
/// thread once started; the thread stops when the device is dropped.
pub(crate) struct Compactor {
    ctx: Arc<Ctx>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Compactor {
    pub(crate) fn new(ctx: Ctx) -> Compactor {
        Compactor {
            ctx: Arc::new(ctx),
            thread: Mutex::new(None),
        }
    }

    pub(crate) fn space(&self) -> Space {
        self.ctx.space.lock().clone()
    }

    pub(crate) fn refresh(&self) -> Result<Space, String> {
        refresh_space(&self.ctx)
    }

    pub(crate) fn run(&self, policy: &Policy, force: bool) -> Result<Report, String> {
        run(&self.ctx, policy, force)
    }

    pub(crate) fn start(&self, policy: Policy) {
        let mut t = self.thread.lock();
        if t.is_none() {
            match spawn(self.ctx.clone(), policy) {
                Ok(h) => *t = Some(h),
                Err(e) => tracing::warn!("cannot start bucket compaction: {e}"),
            }
        }
    }
}

impl Drop for Compactor {
    fn drop(&mut self) {
        self.ctx.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.lock().take() {
            let _ = t.join();
        }
    }
}

/// The background compactor of one device: checks every `interval`,
/// stops when the device is closed.
fn spawn(ctx: Arc<Ctx>, policy: Policy) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("bucket-compact".into())
        .spawn(move || {
            // Open already listed the bucket; the first check waits an interval.
            let mut next = Instant::now() + policy.interval;
            while !ctx.stop.load(Ordering::Acquire) {
                if Instant::now() >= next {
                    match run(&ctx, &policy, false) {
                        Ok(r) if r.checkpoint.is_some() => tracing::info!(?r, "bucket compaction"),
                        Ok(_) => {}
                        Err(e) => tracing::warn!("bucket compaction: {e}"),
                    }
                    next = Instant::now() + policy.interval;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_overwrite_split_and_count_live_bytes() {
        let mut x = Extents::default();
        let s = SegmentRef {
            name: "a".into(),
            len: 100,
            sum: [0; 32],
            chunks: Vec::new(),
        };
        x.apply(&Entry {
            size: 1000,
            segments: vec![s],
            ops: vec![Op::Seg {
                offset: 0,
                len: 100,
                seg: 0,
                seg_offset: 0,
            }],
        });
        x.put(10, 20, Some(Loc::Inline(Bytes::from(vec![1u8; 10]))));
        x.put(50, 60, None);
        assert_eq!(x.live(), vec![80]);
        let got: Vec<(u64, u64)> = x.map.iter().map(|(s, (e, _))| (*s, *e)).collect();
        assert_eq!(got, vec![(0, 10), (10, 20), (20, 50), (60, 100)]);
        match &x.map[&60].1 {
            Loc::Seg { off, .. } => assert_eq!(*off, 60),
            _ => panic!("inline"),
        }
        x.put(15, 70, Some(Loc::Inline(Bytes::from(vec![2u8; 55]))));
        match &x.map[&10].1 {
            Loc::Inline(b) => assert_eq!(b.len(), 5),
            _ => panic!("seg"),
        }
        assert_eq!(x.live(), vec![10 + 30]);
    }

    #[test]
    fn checkpoint_round_trip_and_refusals() {
        let ck = Checkpoint {
            replay_from: 42,
            dead_epochs: vec![7, 9],
            image: Entry {
                size: 4096,
                segments: vec![SegmentRef {
                    name: "x".into(),
                    len: 10,
                    sum: [3; 32],
                    chunks: Vec::new(),
                }],
                ops: vec![Op::Seg {
                    offset: 100,
                    len: 10,
                    seg: 0,
                    seg_offset: 0,
                }],
            },
        };
        let enc = ck.encode();
        assert!(is_checkpoint(&enc));
        assert_eq!(Checkpoint::decode(&enc).unwrap(), ck);
        for cut in 0..enc.len() {
            assert!(
                Checkpoint::decode(&enc.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        let inline = Checkpoint {
            image: Entry {
                size: 4096,
                segments: vec![],
                ops: vec![Op::Data {
                    offset: 0,
                    data: Bytes::from_static(b"x"),
                }],
            },
            ..ck
        };
        assert!(Checkpoint::decode(&inline.encode()).is_err());
    }
}
