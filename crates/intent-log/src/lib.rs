//! The intent log: a circular, checksummed record stream in the pool's
//! mirrored log region, with group commit.
//!
//! Record (little endian): `"CZIL" | u8 kind | 3 pad | u64 seq | u64 dataset |
//! u64 offset | u64 length | u32 payload length | 4 pad | [u8;32] blake3 of
//! (pool guid, header bytes 0..48, payload) | payload`. A JUMP record says the
//! next record is at position `offset` with sequence number `length` (used
//! where the region wraps, and where records went to a txg unwritten).
//! Sequence numbers only grow, so a stale record from an earlier lap never
//! has the number replay expects.

use parking_lot::{Condvar, Mutex};
use pool::{MirroredRegion, PoolError};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"CZIL";
pub const HEADER: usize = 80;
/// Log batches end on this boundary (decision 0061).
pub const PAGE: u64 = 4096;

fn page_up(pos: u64) -> u64 {
    pos.div_ceil(PAGE) * PAGE
}

/// Log bytes a jump from `pos` to `target` uses up: to `target`, or to the
/// region's end when it wraps to 0.
fn jump_span(pos: u64, target: u64, size: u64) -> u64 {
    if target == 0 {
        size - pos
    } else {
        target - pos
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("intent log: {0}")]
    Pool(#[from] PoolError),
    #[error("intent log record of {0} bytes does not fit the log region")]
    TooLarge(usize),
    #[error("intent log is closed")]
    Closed,
    #[error("intent log failed earlier: {0}")]
    Failed(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RecordKind {
    /// `payload` written at `offset`.
    Write = 1,
    /// `length` bytes at `offset` deallocated (read as zeros).
    Trim = 2,
    /// `length` bytes at `offset` zeroed but kept allocated.
    ZeroAllocated = 3,
    Jump = 4,
    /// One change to a dataset's objects (`dataset::objects::ObjectOp`,
    /// encoded by that crate in `payload`; `offset` and `length` unused).
    ObjectOp = 5,
}

impl RecordKind {
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            1 => RecordKind::Write,
            2 => RecordKind::Trim,
            3 => RecordKind::ZeroAllocated,
            4 => RecordKind::Jump,
            5 => RecordKind::ObjectOp,
            _ => return None,
        })
    }
}

/// One logged operation on a dataset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub seq: u64,
    pub kind: RecordKind,
    pub dataset: u64,
    pub offset: u64,
    pub length: u64,
    pub payload: Vec<u8>,
}

/// Records up to this payload size are checksummed from one gathered copy.
const GATHER_MAX: usize = 64 << 10;

/// blake3 of the pool guid, the 48 header bytes and the payload.
///
/// blake3 hashes 1 KiB chunks side by side (SIMD) only when they reach it
/// as one slice from the stream's start; fed as guid, header and payload,
/// the 56-byte prefix makes it hash a small record's chunks one at a time
/// (4.1 µs instead of 1.6 µs for a 4 KiB record, once per NBD WRITE). So a
/// small record is gathered into a per-thread buffer (a copy costs a tenth
/// of the hash); the bytes hashed, hence the checksum, are the same. A
/// large payload's chunks go side by side anyway after the first few.
fn checksum(guid: u64, header: &[u8], payload: &[u8]) -> [u8; 32] {
    thread_local! {
        static STREAM: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    if payload.len() > GATHER_MAX {
        let mut h = blake3::Hasher::new();
        h.update(&guid.to_le_bytes());
        h.update(&header[..48]);
        h.update(payload);
        return *h.finalize().as_bytes();
    }
    STREAM.with(|s| {
        let mut s = s.borrow_mut();
        s.clear();
        s.extend_from_slice(&guid.to_le_bytes());
        s.extend_from_slice(&header[..48]);
        s.extend_from_slice(payload);
        *blake3::hash(&s).as_bytes()
    })
}

#[allow(clippy::too_many_arguments)]
fn encode(
    guid: u64,
    kind: RecordKind,
    seq: u64,
    dataset: u64,
    offset: u64,
    length: u64,
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    let start = out.len();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[kind as u8, 0, 0, 0]);
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&dataset.to_le_bytes());
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&length.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    let sum = checksum(guid, &out[start..start + 48], payload);
    out.extend_from_slice(&sum);
    out.extend_from_slice(payload);
}

/// Parses a header; `None` unless magic, kind and sequence are as expected.
fn parse_header(b: &[u8], expect_seq: u64) -> Option<(RecordKind, u64, u64, u64, usize)> {
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or([0; 8]));
    if &b[..4] != MAGIC || u64_at(8) != expect_seq {
        return None;
    }
    let kind = RecordKind::from_u8(b[4])?;
    let payload_len = u32::from_le_bytes(b[40..44].try_into().ok()?) as usize;
    Some((kind, u64_at(16), u64_at(24), u64_at(32), payload_len))
}

/// What replay found: the records, and where the next record goes.
struct Replay {
    records: Vec<LogRecord>,
    pos: u64,
    seq: u64,
}

/// Walks the records of a region of `size` bytes from `cp` (see
/// [`IntentLog::open`]). `read(pos, buf, verify)` fills `buf` from `pos`
/// with a copy that `verify` accepts and says whether it found one.
/// Every position and sequence number comes from the region, so the
/// arithmetic on them is checked: a record that would overflow ends replay.
fn replay(
    size: u64,
    pool_guid: u64,
    cp: Checkpoint,
    mut read: impl FnMut(u64, &mut [u8], &dyn Fn(&[u8]) -> bool) -> bool,
) -> Replay {
    let mut records = Vec::new();
    let mut seq = cp.expect_seq;
    let mut pos = cp.replay_pos;
    let mut scanned = 0u64;
    let fits = |pos: u64, len: u64| pos.checked_add(len).is_some_and(|end| end <= size);
    // Bounded: a lap of the region plus one jump per record at most.
    while scanned <= size.saturating_mul(2) && fits(pos, HEADER as u64) {
        let mut header = [0u8; HEADER];
        let verify_header = |b: &[u8]| parse_header(b, seq).is_some();
        if !read(pos, &mut header, &verify_header) {
            break;
        }
        let Some((kind, dataset, offset, length, payload_len)) = parse_header(&header, seq) else {
            break;
        };
        let total = HEADER + payload_len;
        if !fits(pos, total as u64) {
            break;
        }
        let mut rec = vec![0u8; total];
        let verify = |b: &[u8]| {
            parse_header(b, seq).is_some()
                && checksum(pool_guid, &b[..48], &b[HEADER..]) == b[48..80]
        };
        if !read(pos, &mut rec, &verify) {
            break;
        }
        scanned += total as u64;
        if kind == RecordKind::Jump {
            if !fits(offset, HEADER as u64) || length < seq {
                break;
            }
            pos = offset;
            seq = length;
            continue;
        }
        if seq >= cp.applied_seq {
            records.push(LogRecord {
                seq,
                kind,
                dataset,
                offset,
                length,
                payload: rec.split_off(HEADER),
            });
        }
        // The last sequence number cannot be followed by another record.
        let Some(next) = seq.checked_add(1) else {
            pos += total as u64;
            break;
        };
        seq = next;
        pos += total as u64;
    }
    Replay { records, pos, seq }
}

struct Pending {
    seq: u64,
    bytes: Vec<u8>,
}

/// Log writes issued at once (decision 0041): the devices serve several
/// O_DSYNC writes in flight far better than one after another.
const MAX_IN_FLIGHT: usize = 8;

/// How long a blocking commit waits for a write in flight before it takes
/// the ring's completions itself (see [`IntentLog::wait_in_flight`]).
const RING_STALL: Duration = Duration::from_millis(50);

/// A batch placed in the region and being written.
struct InFlight {
    id: u64,
    /// Sequence number after the batch's last record.
    end_seq: u64,
    /// Where the batch starts, in the region with tag `tag`: log space from
    /// here on stays live until the write is done.
    start_pos: u64,
    tag: u64,
    done: bool,
    failed: bool,
}

struct State {
    next_seq: u64,
    /// Records appended but not yet written, in sequence order.
    pending: VecDeque<Pending>,
    pending_bytes: usize,
    /// Every record with seq < durable_seq is written and synced, or in a committed txg.
    durable_seq: u64,
    /// Records with seq < applied_seq are in a committed txg.
    applied_seq: u64,
    /// Batches being written, in placement (= sequence) order. A batch's
    /// records count as durable once it and every batch before it are done.
    in_flight: VecDeque<InFlight>,
    next_batch: u64,
    /// Records below this may have been dropped unwritten (see `append`):
    /// they are durable only once a txg holds them.
    dropped_below: u64,
    /// Where the next record goes, and the sequence number replay expects there.
    write_pos: u64,
    next_disk_seq: u64,
    /// Where replay of the last committed txg starts: nothing from here to
    /// `write_pos` may be overwritten.
    replay_start: u64,
    closed: bool,
    failed: Option<String>,
    /// Where records are written: the main devices' region or a SLOG.
    region: MirroredRegion,
    /// Set by [`IntentLog::switch_region`]: the next checkpoint moves the log there.
    switch_to: Option<MirroredRegion>,
    /// Set while the pool is suspended with failmode=continue: a commit
    /// that would wait for a txg fails with this instead.
    failing: Option<String>,
    /// Deferred commits (decision 0057): record sequence number and what to
    /// call once it is durable, in sequence order. Answered by the thread
    /// whose log write (or txg) makes them durable; none holds a thread.
    waiters: VecDeque<(u64, Waiter)>,
    /// Threads running [`IntentLog::drive`].
    drivers: usize,
}

/// Called once with `true` when a deferred commit's record (and every one
/// before it) is durable, or with `false` when it must go the blocking way
/// ([`IntentLog::commit`], which handles failures and suspension). Runs on
/// whatever thread finished the work, without the log's lock: it must not
/// block.
pub type Waiter = Box<dyn FnOnce(bool) + Send>;

/// What [`IntentLog::commit_deferred`] did with a waiter.
pub enum Deferred {
    /// Durable already: the caller answers at once (the waiter is not called).
    Done(Waiter),
    /// Queued: a log write in flight (or a running driver) answers it.
    Queued,
    /// Queued, and nothing in flight covers it: the caller runs
    /// [`IntentLog::drive`] on a thread that may block.
    Drive,
    /// Not taken (a txg must be waited for, or the log failed or is
    /// closed): the caller uses [`IntentLog::commit`].
    Refused(Waiter),
}

/// Where replay must start if the pool crashes after the txg that takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Records with seq < applied_seq are contained in the txg.
    pub applied_seq: u64,
    pub replay_pos: u64,
    /// The sequence number replay expects at `replay_pos`.
    pub expect_seq: u64,
    /// Which region `replay_pos` is in: 0 for the main devices' log region,
    /// else the tag of a log group (SLOG, [`pool::Pool::log_tag`]).
    pub tag: u64,
}

/// How long commit requests waited for the intent log, from the request
/// to its durable answer (`pool iostat -l`'s sync_wait, `-w`'s histogram).
pub struct WaitStats {
    pub nanos: AtomicU64,
    /// Requests per power-of-two latency bucket ([`vdev::latency_bucket`]).
    pub hist: [AtomicU64; vdev::LATENCY_BUCKETS],
}

impl Default for WaitStats {
    fn default() -> Self {
        WaitStats {
            nanos: AtomicU64::new(0),
            hist: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl WaitStats {
    fn record(&self, started: Instant) {
        let nanos = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.nanos.fetch_add(nanos, Ordering::Relaxed);
        self.hist[vdev::latency_bucket(nanos)].fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Default)]
pub struct Stats {
    /// Batches written (group commits).
    pub commits: AtomicU64,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    /// Durable (O_DSYNC) writes issued, each counted once per region write
    /// (a mirror's copies go out in parallel and count once).
    pub syncs: AtomicU64,
    /// Commit requests (FLUSH, FUA, fsync, S3 PUT...) answered durable.
    pub flushes: AtomicU64,
    /// Log writes issued while another was still in flight.
    pub overlapped: AtomicU64,
    /// Deferred commits answered durable (decision 0057), also in `flushes`.
    pub deferred: AtomicU64,
    /// Batches submitted through io_uring (decision 0068), also in `commits`.
    pub ring: AtomicU64,
    /// Batches written O_DIRECT by the log writer thread (decision 0079),
    /// also in `commits`.
    pub thread: AtomicU64,
    /// Waits of the commit requests counted in `flushes`.
    pub wait: WaitStats,
}

pub struct IntentLog {
    pool_guid: u64,
    state: Mutex<State>,
    changed: Condvar,
    /// Asks the txg machinery for a commit (the log is full).
    request_txg: Box<dyn Fn() + Send + Sync>,
    /// Bound of the records held in memory awaiting a commit.
    max_pending: usize,
    stats: Stats,
    /// Where deferred commits' batches are submitted without blocking
    /// (decision 0068); `None`: they are written on a driver thread.
    ring: Option<Arc<ring::Ring>>,
    /// The log writer thread that writes deferred commits' batches
    /// (decision 0079); when set, `ring` is `None`.
    writer: Option<Arc<writer::Writer>>,
    /// This log, for a thread that finishes a batch the ring could not.
    me: std::sync::Weak<IntentLog>,
    /// Batches in the ring at once (at most [`MAX_IN_FLIGHT`]); a deferred
    /// commit that finds this many waits for the next completion, which
    /// submits one batch for every waiter queued meanwhile.
    ring_depth: usize,
}

/// `CISTERN_LOG_RING_DEPTH` (1..=8, for measuring): batches in the ring at once.
fn ring_depth() -> usize {
    std::env::var("CISTERN_LOG_RING_DEPTH")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map_or(MAX_IN_FLIGHT, |d| d.clamp(1, MAX_IN_FLIGHT))
}

impl Drop for IntentLog {
    fn drop(&mut self) {
        if let Some(r) = &self.ring {
            r.stop();
        }
        if let Some(w) = &self.writer {
            w.stop();
        }
    }
}

/// What [`IntentLog::ring_start`] did.
enum RingStart {
    /// A batch with every pending record is submitted.
    Submitted,
    /// Not now: a write in flight finishes first and tries again.
    Busy,
    /// Not through the ring: the blocking way.
    No,
}

impl IntentLog {
    /// Opens the log and returns every record at or after `cp.applied_seq`,
    /// in order. The caller applies them and commits a txg.
    pub fn open(
        region: MirroredRegion,
        pool_guid: u64,
        cp: Checkpoint,
        max_pending: usize,
        request_txg: Box<dyn Fn() + Send + Sync>,
    ) -> (Arc<IntentLog>, Vec<LogRecord>) {
        Self::open_with(
            region,
            pool_guid,
            cp,
            max_pending,
            request_txg,
            ring::Mode::from_env(),
        )
    }

    /// [`IntentLog::open`] with the ring in `ring` mode, or none.
    fn open_with(
        region: MirroredRegion,
        pool_guid: u64,
        cp: Checkpoint,
        max_pending: usize,
        request_txg: Box<dyn Fn() + Send + Sync>,
        ring: Option<ring::Mode>,
    ) -> (Arc<IntentLog>, Vec<LogRecord>) {
        let size = region.size();
        let Replay { records, pos, seq } = replay(size, pool_guid, cp, |pos, buf, verify| {
            region.read_verified(pos, buf, verify).is_ok()
        });
        tracing::info!(
            records = records.len(),
            from_seq = cp.applied_seq,
            "intent log replayed"
        );
        // Log writes overlap, so a crash can leave valid records past the
        // first one that is missing (replay stops there). New records go
        // where replay stopped; their sequence numbers start past any a
        // record of the dead run could have (those placed after the hole are
        // contiguous and fit in the region, one per HEADER bytes at most), so
        // a stale record is never taken for a new one.
        let next_seq = seq
            .max(cp.applied_seq)
            .saturating_add(size / HEADER as u64 + 1);
        let log = |weak: &std::sync::Weak<IntentLog>| IntentLog {
            pool_guid,
            state: Mutex::new(State {
                next_seq,
                pending: VecDeque::new(),
                pending_bytes: 0,
                durable_seq: next_seq,
                applied_seq: cp.applied_seq,
                in_flight: VecDeque::new(),
                next_batch: 0,
                dropped_below: 0,
                write_pos: pos,
                next_disk_seq: seq,
                replay_start: cp.replay_pos,
                closed: false,
                failed: None,
                region,
                switch_to: None,
                failing: None,
                waiters: VecDeque::new(),
                drivers: 0,
            }),
            changed: Condvar::new(),
            request_txg,
            max_pending,
            stats: Stats::default(),
            ring: ring
                .filter(|m| *m != ring::Mode::Thread)
                .and_then(|mode| ring::Ring::start(mode, weak.clone())),
            writer: (ring == Some(ring::Mode::Thread))
                .then(|| writer::Writer::start(weak.clone()))
                .flatten(),
            me: weak.clone(),
            ring_depth: ring_depth(),
        };
        (Arc::new_cyclic(log), records)
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Adds a record in memory and returns its sequence number. Callers hold
    /// their own lock so that log order matches the order they apply changes.
    pub fn append(
        &self,
        kind: RecordKind,
        dataset: u64,
        offset: u64,
        length: u64,
        payload: &[u8],
    ) -> u64 {
        self.append_with(kind, dataset, offset, length, payload.len(), |f| f(payload))
    }

    /// As [`IntentLog::append`] with a payload of `payload_len` bytes that
    /// `make` produces (it calls its argument with the bytes) only if the
    /// record is kept: an encrypted dataset's payload is sealed only then,
    /// not for bulk writes the txg carries (decision 0037). `make` runs
    /// under the log's lock and must give exactly `payload_len` bytes.
    pub fn append_with(
        &self,
        kind: RecordKind,
        dataset: u64,
        offset: u64,
        length: u64,
        payload_len: usize,
        make: impl FnOnce(&mut dyn FnMut(&[u8])),
    ) -> u64 {
        assert!(kind != RecordKind::Jump);
        let mut st = self.state.lock();
        let seq = st.next_seq;
        st.next_seq += 1;
        if st.pending_bytes + HEADER + payload_len > self.max_pending {
            // More unflushed data than we hold twice in memory: let the txg
            // carry all of it (bulk writes then cost no log copy); a commit
            // of any of these records waits for that txg, as ZFS does.
            st.pending.clear();
            st.pending_bytes = 0;
            st.dropped_below = st.next_seq;
            return seq;
        }
        let mut bytes = Vec::with_capacity(HEADER + payload_len);
        make(&mut |payload| {
            debug_assert_eq!(payload.len(), payload_len);
            encode(
                self.pool_guid,
                kind,
                seq,
                dataset,
                offset,
                length,
                payload,
                &mut bytes,
            )
        });
        st.pending_bytes += bytes.len();
        st.pending.push_back(Pending { seq, bytes });
        seq
    }

    /// Sequence number of the newest record appended (0 if none ever was).
    pub fn last_seq(&self) -> u64 {
        self.state.lock().next_seq - 1
    }

    /// Bytes of records held in memory, not yet written.
    pub fn pending_bytes(&self) -> usize {
        self.state.lock().pending_bytes
    }

    /// Taken by a txg at the moment it stops accepting changes (under the
    /// caller's append lock): every record appended before is in that txg.
    pub fn checkpoint(&self) -> Checkpoint {
        let mut st = self.state.lock();
        if let Some(region) = st.switch_to.take() {
            // The log moves: this txg holds every record so far, so none is
            // written to the old region any more (a commit of one waits for
            // the txg), and later records wait for it too before they go to
            // the new region, whose start replay reads once the txg commits.
            tracing::info!(from = ?st.region, to = ?region, seq = st.next_seq, "intent log moves");
            st.region = region;
            st.pending.clear();
            st.pending_bytes = 0;
            st.dropped_below = st.next_seq;
            st.write_pos = 0;
            st.replay_start = 0;
            st.next_disk_seq = st.next_seq;
        }
        Checkpoint {
            applied_seq: st.next_seq,
            replay_pos: st.write_pos,
            expect_seq: st.next_disk_seq,
            tag: st.region.log_tag(),
        }
    }

    /// Moves the log to `region` (a SLOG being added, or the main devices'
    /// region when one is removed) at the next txg's checkpoint. The caller
    /// then commits a txg and checks [`IntentLog::region_tag`].
    pub fn switch_region(&self, region: MirroredRegion) {
        self.state.lock().switch_to = Some(region);
    }

    /// Tag of the region records go to now (0: the main devices).
    pub fn region_tag(&self) -> u64 {
        self.state.lock().region.log_tag()
    }

    /// A move asked for and not yet taken by a txg.
    pub fn switch_pending(&self) -> bool {
        self.state.lock().switch_to.is_some()
    }

    /// The txg that took `cp` is committed: records before it are dropped
    /// from memory unwritten, and the log space before `cp.replay_pos` is free.
    pub fn applied(&self, cp: Checkpoint) {
        let mut st = self.state.lock();
        st.applied_seq = st.applied_seq.max(cp.applied_seq);
        // A checkpoint in the region the log left frees nothing in this one.
        if cp.tag == st.region.log_tag() {
            st.replay_start = cp.replay_pos;
        }
        while st.pending.front().is_some_and(|p| p.seq < cp.applied_seq) {
            if let Some(p) = st.pending.pop_front() {
                st.pending_bytes -= p.bytes.len();
            }
        }
        if st.pending.is_empty() && st.in_flight.is_empty() {
            st.durable_seq = st.durable_seq.max(cp.applied_seq);
        }
        let ready = self.take_ready(&mut st);
        self.changed.notify_all();
        drop(st);
        answer(ready, true);
    }

    /// Returns once the record `seq` and every one before it is durable.
    /// Concurrent callers share writes (group commit), and up to
    /// [`MAX_IN_FLIGHT`] batches are written at once at successive places;
    /// a batch counts once every batch placed before it is written too, so
    /// replay, which stops at the first missing record, finds every record
    /// acknowledged here.
    pub fn commit(&self, seq: u64) -> Result<(), LogError> {
        let started = Instant::now();
        self.commit_with(seq, false)?;
        self.stats.flushes.fetch_add(1, Ordering::Relaxed);
        self.stats.wait.record(started);
        Ok(())
    }

    /// [`IntentLog::commit`] without counting a commit request answered;
    /// with `direct`, the batches this thread places are written by the log
    /// writer's O_DIRECT way (decision 0079).
    fn commit_with(&self, seq: u64, direct: bool) -> Result<(), LogError> {
        let mut st = self.state.lock();
        loop {
            if let Some(f) = &st.failed {
                return Err(LogError::Failed(f.clone()));
            }
            // Durable means every record up to `seq`: dropped ones count only
            // once a committed txg holds them all.
            let dropped_done = st.applied_seq >= st.dropped_below;
            if st.applied_seq > seq || (dropped_done && st.durable_seq > seq) {
                return Ok(());
            }
            if st.closed {
                return Err(LogError::Closed);
            }
            if let (false, Some(f)) = (dropped_done, &st.failing) {
                return Err(LogError::Failed(f.clone()));
            }
            if !dropped_done {
                drop(st);
                (self.request_txg)();
                st = self.state.lock();
                self.changed.wait_for(&mut st, Duration::from_millis(50));
                continue;
            }
            // Already being written: wait for that batch and those before it.
            if st.in_flight.back().is_some_and(|b| b.end_seq > seq) {
                self.wait_in_flight(&mut st);
                continue;
            }
            let Some(first) = st.pending.front().map(|p| p.seq) else {
                // Not pending and not durable: it went to a txg that is committing.
                self.changed.wait_for(&mut st, Duration::from_millis(50));
                continue;
            };
            // A jump over records left to a txg waits for the writes before
            // it: only contiguous records are ever placed past a write in
            // flight, which bounds the sequence numbers a crash can leave
            // past a hole (see `open`).
            if st.in_flight.len() >= MAX_IN_FLIGHT
                || (first != st.next_disk_seq && !st.in_flight.is_empty())
            {
                self.wait_in_flight(&mut st);
                continue;
            }
            let last = st.pending.back().map_or(first, |p| p.seq);
            let start_pos = st.write_pos;
            let batch: Vec<Pending> = st.pending.drain(..).collect();
            match self.place(&mut st, &batch) {
                Ok(writes) => {
                    let id = self.begin_batch(&mut st, last, start_pos);
                    let region = st.region.clone();
                    drop(st);
                    let result = match self.writer.as_ref().filter(|_| direct) {
                        Some(w) if w.write(&region, &writes) => {
                            self.stats.thread.fetch_add(1, Ordering::Relaxed);
                            let bytes = writes.iter().map(|(_, b)| b.len()).sum();
                            self.count_synced(writes.len(), bytes);
                            Ok(())
                        }
                        // Not O_DIRECT, or a write failed: the blocking way
                        // (again), which reports device failures.
                        _ => self.write_all(&region, &writes),
                    };
                    self.batch_finished(id, batch.len(), result);
                    st = self.state.lock();
                }
                Err(full) => {
                    for p in batch.into_iter().rev() {
                        st.pending.push_front(p);
                    }
                    if !full {
                        return Err(LogError::TooLarge(
                            st.pending.front().map_or(0, |p| p.bytes.len()),
                        ));
                    }
                    if let Some(f) = &st.failing {
                        return Err(LogError::Failed(f.clone()));
                    }
                    // Wait for a txg (or a write in flight) to free log space.
                    drop(st);
                    (self.request_txg)();
                    st = self.state.lock();
                    self.changed.wait_for(&mut st, Duration::from_millis(100));
                }
            }
        }
    }

    /// Waits for a write in flight to end. The ring's completions are taken
    /// by its reaper, a runtime task (decision 0075); when the wait lasts,
    /// this thread takes any posted completions itself, so a runtime whose
    /// threads are all blocked here cannot leave them untaken.
    fn wait_in_flight(&self, st: &mut parking_lot::MutexGuard<'_, State>) {
        if self.changed.wait_for(st, RING_STALL).timed_out() {
            if let Some(ring) = &self.ring {
                parking_lot::MutexGuard::unlocked(st, || ring.reap_ready(&self.me));
            }
        }
    }

    /// A commit that holds no thread while it waits (decision 0057): ZFS's
    /// zil_commit without a thread per waiter. `waiter` is called once the
    /// record `seq` and every one before it is durable, by the thread whose
    /// log write (or txg) made it so. If no log write in flight covers
    /// `seq`, the caller is asked to run [`IntentLog::drive`] on a thread
    /// that may block ([`Deferred::Drive`]), up to [`MAX_IN_FLIGHT`] at once;
    /// past that the running drivers take it.
    pub fn commit_deferred(&self, seq: u64, waiter: Waiter) -> Deferred {
        let started = Instant::now();
        let mut st = self.state.lock();
        if st.closed || st.failed.is_some() || st.failing.is_some() {
            return Deferred::Refused(waiter);
        }
        if Self::durable(&st, seq) {
            self.stats.flushes.fetch_add(1, Ordering::Relaxed);
            self.stats.deferred.fetch_add(1, Ordering::Relaxed);
            self.stats.wait.record(started);
            return Deferred::Done(waiter);
        }
        if st.applied_seq < st.dropped_below {
            return Deferred::Refused(waiter);
        }
        // Its wait counts once it is answered durable (as `take_ready`
        // counts it); answered not durable, it goes the blocking way, which
        // counts there.
        let me = self.me.clone();
        let waiter: Waiter = Box::new(move |durable| {
            if let (true, Some(log)) = (durable, me.upgrade()) {
                log.stats.wait.record(started);
            }
            waiter(durable)
        });
        // Kept in sequence order: callers read `seq` before the lock.
        let at = st.waiters.partition_point(|(s, _)| *s <= seq);
        st.waiters.insert(at, (seq, waiter));
        if Self::covered(&st, seq) || st.drivers >= MAX_IN_FLIGHT {
            return Deferred::Queued;
        }
        // The log writer thread takes it with its next batch (decision 0079).
        if let (Some(w), 0) = (&self.writer, st.drivers) {
            drop(st);
            w.kick();
            return Deferred::Queued;
        }
        // Submitted without blocking where the ring takes it (decision
        // 0068); a running driver covers the waiter itself.
        if let (Some(ring), 0) = (&self.ring, st.drivers) {
            drop(st);
            match self.ring_start(ring) {
                RingStart::Submitted | RingStart::Busy => return Deferred::Queued,
                RingStart::No => {}
            }
            st = self.state.lock();
            if Self::durable(&st, seq) || Self::covered(&st, seq) || st.drivers >= MAX_IN_FLIGHT {
                // Answered by the write that covers it (or already was).
                return Deferred::Queued;
            }
        }
        st.drivers += 1;
        Deferred::Drive
    }

    /// Places every pending record as one batch and submits its writes to
    /// the ring, as [`IntentLog::commit`] would write them (decision 0068).
    fn ring_start(&self, ring: &ring::Ring) -> RingStart {
        // What stops a batch now, under the lock: `Some(Busy)` when a write
        // in flight will call `ring_more`, `Some(No)` when none can go.
        let blocked = |st: &State| {
            if st.failed.is_some() || st.closed || st.applied_seq < st.dropped_below {
                return Some(RingStart::No);
            }
            let first = st.pending.front()?.seq;
            if st.in_flight.len() >= self.ring_depth
                || (first != st.next_disk_seq && !st.in_flight.is_empty())
            {
                return Some(RingStart::Busy);
            }
            None
        };
        let region = {
            let st = self.state.lock();
            if st.pending.is_empty() {
                return RingStart::No;
            }
            if let Some(b) = blocked(&st) {
                return b;
            }
            st.region.clone()
        };
        // The region's devices and its shared lock, taken without the log's lock.
        let write = match region.start_durable(0, region.size() as usize) {
            Ok(Some(w)) => w,
            _ => return RingStart::No,
        };
        let mut st = self.state.lock();
        if st.pending.is_empty()
            || st.region.log_tag() != region.log_tag()
            || !ring.accepts(&write, st.write_pos)
        {
            return RingStart::No;
        }
        if let Some(b) = blocked(&st) {
            return b;
        }
        let (first, last) = match (st.pending.front(), st.pending.back()) {
            (Some(f), Some(l)) => (f.seq, l.seq),
            _ => return RingStart::No,
        };
        debug_assert!(first <= last);
        let start_pos = st.write_pos;
        let batch: Vec<Pending> = st.pending.drain(..).collect();
        let writes = match self.place(&mut st, &batch) {
            Ok(w) => w,
            Err(_) => {
                for p in batch.into_iter().rev() {
                    st.pending.push_front(p);
                }
                // Log space comes back when a write in flight or a txg ends.
                return if st.in_flight.is_empty() {
                    RingStart::No
                } else {
                    RingStart::Busy
                };
            }
        };
        let id = self.begin_batch(&mut st, last, start_pos);
        drop(st);
        self.stats.ring.fetch_add(1, Ordering::Relaxed);
        if let Err(failed) = ring.submit(id, batch.len(), writes, write, region) {
            let (e, b) = *failed;
            tracing::warn!(error = %e, "io_uring log write not submitted; writing it here");
            self.ring_done(b);
        }
        RingStart::Submitted
    }

    /// A batch's writes through the ring are done (called by the reaper).
    /// A failed or short write is written again the blocking way, which
    /// reports the failure and applies the mirror's rules as before.
    pub(crate) fn ring_done(&self, batch: ring::RingBatch) {
        let (id, records) = (batch.id, batch.records);
        let result = if batch.all_ok() {
            let bytes = batch.pieces().map(|(_, b)| b.len()).sum();
            let pieces = batch.pieces().count();
            let r = batch.finish();
            if r.is_ok() {
                self.count_synced(pieces, bytes);
            }
            r
        } else {
            if batch.direct_refused() {
                if let Some(r) = &self.ring {
                    r.refuse_direct();
                }
            }
            let region = batch.region().clone();
            let writes: Vec<(u64, Vec<u8>)> =
                batch.pieces().map(|(p, b)| (p, b.to_vec())).collect();
            // Releases the region's lock, which the blocking write takes
            // again; that write counts and reports any device failure. It
            // runs on a thread of its own: the ring thread must not wait
            // for the region's lock, which a resilver may be waiting to
            // take until the ring thread releases another batch's share.
            drop(batch);
            let me = self.me.clone();
            let job = Arc::new(Mutex::new(Some((region, writes))));
            let theirs = job.clone();
            let rewrite = move || {
                let (Some(log), Some((region, writes))) = (me.upgrade(), theirs.lock().take())
                else {
                    return;
                };
                let result = log.write_all(&region, &writes);
                log.batch_finished(id, records, result);
            };
            let spawned = std::thread::Builder::new()
                .name("log-rewrite".into())
                .spawn(rewrite);
            // A thread that could not be started never ran the job: it is
            // still here to do.
            if let Err(e) = spawned {
                if let Some((region, writes)) = job.lock().take() {
                    tracing::warn!(error = %e, "no thread to write a log batch again: writing it here");
                    let result = self.write_all(&region, &writes);
                    self.batch_finished(id, records, result);
                }
            }
            return;
        };
        self.batch_finished(id, records, result);
    }

    /// Deferred commits that no write in flight covers, once a write is
    /// done: the next batch goes to the ring; if none can go and nothing is
    /// in flight, they take the blocking way (nothing else would answer them).
    fn ring_more(&self) {
        let Some(ring) = &self.ring else {
            return;
        };
        let uncovered = |st: &State| {
            st.drivers == 0
                && st
                    .waiters
                    .back()
                    .is_some_and(|(s, _)| !Self::covered(st, *s))
        };
        if !uncovered(&self.state.lock()) {
            return;
        }
        if let RingStart::No = self.ring_start(ring) {
            let left = {
                let mut st = self.state.lock();
                if uncovered(&st) && st.in_flight.is_empty() {
                    std::mem::take(&mut st.waiters)
                } else {
                    VecDeque::new()
                }
            };
            answer(left, false);
        }
    }

    /// A batch's write ended: on success its records count once every
    /// batch before it is done, and the deferred commits that made durable
    /// are answered from this thread, right away (decision 0057); on
    /// failure every waiter goes the blocking way.
    fn batch_finished(&self, id: u64, records: usize, result: Result<(), PoolError>) {
        let mut st = self.state.lock();
        let (ready, durable) = match result {
            Ok(()) => {
                if let Some(b) = st.in_flight.iter_mut().find(|b| b.id == id) {
                    b.done = true;
                }
                Self::settle(&mut st);
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .records
                    .fetch_add(records as u64, Ordering::Relaxed);
                (self.take_ready(&mut st), true)
            }
            Err(e) => {
                // The batch stays in `in_flight`, not done: no later batch
                // counts as durable until `resume`.
                if let Some(b) = st.in_flight.iter_mut().find(|b| b.id == id) {
                    b.failed = true;
                }
                tracing::error!(error = %e, "intent log write failed");
                st.failed = Some(e.to_string());
                // Every waiter goes the blocking way, which reports or
                // waits out the failure.
                (std::mem::take(&mut st.waiters), false)
            }
        };
        // Waiters whose records were left to a txg since they were queued:
        // ask for it (`applied` answers them).
        let need_txg = !st.waiters.is_empty() && st.applied_seq < st.dropped_below;
        self.changed.notify_all();
        drop(st);
        answer(ready, durable);
        if need_txg {
            (self.request_txg)();
        }
        self.ring_more();
    }

    /// Writes the log for the queued deferred commits no write in flight
    /// covers, and answers those it makes durable; returns once every
    /// queued one is answered or covered by a write in flight (whose thread
    /// answers it). On a failure every queued waiter is answered `false`.
    pub fn drive(&self) {
        self.write_queued(false)
    }

    /// The log writer thread's round (decision 0079): [`IntentLog::drive`]
    /// with each batch written the writer's O_DIRECT way; the writer is not
    /// counted in `drivers`.
    pub(crate) fn write_waiters(&self) {
        self.write_queued(true)
    }

    fn write_queued(&self, writer: bool) {
        // A driver leaves `drivers` when it returns; the writer never joined.
        let leave = |st: &mut State| {
            if !writer {
                st.drivers -= 1;
            }
        };
        loop {
            let (ready, target) = {
                let mut st = self.state.lock();
                let ready = self.take_ready(&mut st);
                // The newest waiter: covering it covers every one before.
                let target = st
                    .waiters
                    .back()
                    .map(|(s, _)| *s)
                    .filter(|&s| !Self::covered(&st, s));
                if target.is_none() {
                    leave(&mut st);
                }
                (ready, target)
            };
            answer(ready, true);
            let Some(target) = target else {
                return;
            };
            if self.commit_with(target, writer).is_err() {
                let failed = {
                    let mut st = self.state.lock();
                    leave(&mut st);
                    std::mem::take(&mut st.waiters)
                };
                answer(failed, false);
                return;
            }
        }
    }

    /// Whether record `seq` and every one before it is durable.
    fn durable(st: &State, seq: u64) -> bool {
        st.failed.is_none()
            && (st.applied_seq > seq
                || (st.applied_seq >= st.dropped_below && st.durable_seq > seq))
    }

    /// A log write in flight holds record `seq` (its thread, or the one of
    /// a batch before it, answers the waiter).
    fn covered(st: &State, seq: u64) -> bool {
        st.in_flight
            .back()
            .is_some_and(|b| b.end_seq > seq && !b.failed)
    }

    /// Takes the waiters that are durable now (counted as answered).
    fn take_ready(&self, st: &mut State) -> VecDeque<(u64, Waiter)> {
        let n = st
            .waiters
            .iter()
            .take_while(|(s, _)| Self::durable(st, *s))
            .count();
        if n > 0 {
            self.stats.flushes.fetch_add(n as u64, Ordering::Relaxed);
            self.stats.deferred.fetch_add(n as u64, Ordering::Relaxed);
        }
        let rest = st.waiters.split_off(n);
        std::mem::replace(&mut st.waiters, rest)
    }

    /// Lays out `batch` from `write_pos` on, with a JUMP record where the
    /// region wraps or where records were dropped because a txg holds them.
    /// Every jump goes to a page boundary and the batch ends with one to the
    /// next page (decision 0061), the bytes up to it zero: a batch that
    /// starts on a page is written as whole pages, so the device never
    /// reads a partial page before writing it, and no two batches in flight
    /// share a page. A jump takes no sequence number (its target record has
    /// the one it carries), so the bound of 0041 on sequence numbers past a
    /// hole holds as before.
    /// Err(true): not enough free log space now; Err(false): a record can never fit.
    /// Registers a placed batch (records up to `last`, written from
    /// `start_pos`) as in flight; its id.
    fn begin_batch(&self, st: &mut State, last: u64, start_pos: u64) -> u64 {
        st.pending_bytes = 0;
        let id = st.next_batch;
        st.next_batch += 1;
        let tag = st.region.log_tag();
        st.in_flight.push_back(InFlight {
            id,
            end_seq: last + 1,
            start_pos,
            tag,
            done: false,
            failed: false,
        });
        if st.in_flight.len() > 1 {
            self.stats.overlapped.fetch_add(1, Ordering::Relaxed);
        }
        id
    }

    fn place(&self, st: &mut State, batch: &[Pending]) -> Result<Vec<(u64, Vec<u8>)>, bool> {
        let size = st.region.size();
        let header = HEADER as u64;
        let used = Self::used(st);
        // Slack so that the writer never catches up with replay_start exactly.
        let mut free = (size - used).saturating_sub(header);
        let mut pos = st.write_pos;
        let mut disk_seq = st.next_disk_seq;
        let mut writes: Vec<(u64, Vec<u8>)> = Vec::new();
        // Records plus a jump and the zeros to the page's end: no regrowth.
        let bytes: usize = batch.iter().map(|p| p.bytes.len()).sum();
        let mut cur: Vec<u8> = Vec::with_capacity(bytes + HEADER + PAGE as usize);
        let mut cur_start = pos;
        // Every record leaves room for a jump header after it, so `pos +
        // header <= size` holds wherever a jump is written.
        for p in batch {
            let len = p.bytes.len() as u64;
            if len + 2 * header > size / 4 {
                return Err(false);
            }
            let wrap = pos + len + header > size;
            if wrap || p.seq != disk_seq {
                let mut target = if wrap { 0 } else { page_up(pos + header) };
                if target + len + header > size {
                    target = 0;
                }
                let consumed = jump_span(pos, target, size);
                if consumed > free {
                    return Err(true);
                }
                free -= consumed;
                Self::jump(
                    self.pool_guid,
                    &mut cur,
                    cur_start,
                    pos,
                    disk_seq,
                    target,
                    p.seq,
                    size,
                );
                if target == 0 {
                    writes.push((cur_start, std::mem::take(&mut cur)));
                    cur_start = 0;
                }
                pos = target;
                disk_seq = p.seq;
            }
            if len > free {
                return Err(true);
            }
            free -= len;
            cur.extend_from_slice(&p.bytes);
            pos += len;
            disk_seq += 1;
        }
        // The jump to the next page ends the batch there. Left out when the
        // space is short: the next batch then starts mid-page, which replay
        // reads all the same (logs of earlier builds are laid out so).
        if !cur.is_empty() && pos % PAGE != 0 {
            let target = match page_up(pos + header) {
                t if t + header > size => 0,
                t => t,
            };
            let consumed = jump_span(pos, target, size);
            if consumed <= free {
                Self::jump(
                    self.pool_guid,
                    &mut cur,
                    cur_start,
                    pos,
                    disk_seq,
                    target,
                    disk_seq,
                    size,
                );
                pos = target;
            }
        }
        if !cur.is_empty() {
            writes.push((cur_start, cur));
        }
        st.write_pos = pos;
        st.next_disk_seq = disk_seq;
        Ok(writes)
    }

    /// Appends to `cur` (the write that starts at `cur_start` and has
    /// reached `pos`) a JUMP record saying the record `to_seq` is at
    /// `target`, then zeros up to the next page boundary (or the region's end).
    #[allow(clippy::too_many_arguments)]
    fn jump(
        guid: u64,
        cur: &mut Vec<u8>,
        cur_start: u64,
        pos: u64,
        seq: u64,
        target: u64,
        to_seq: u64,
        size: u64,
    ) {
        encode(guid, RecordKind::Jump, seq, 0, target, to_seq, &[], cur);
        let end = page_up(pos + HEADER as u64).min(size);
        cur.resize((end - cur_start) as usize, 0);
    }

    /// Batches done at the head of the in-flight list make their records
    /// durable (everything before the first batch was written earlier or is
    /// in a committed txg).
    fn settle(st: &mut State) {
        while st.in_flight.front().is_some_and(|b| b.done) {
            if let Some(b) = st.in_flight.pop_front() {
                st.durable_seq = st.durable_seq.max(b.end_seq);
            }
        }
    }

    /// Log bytes from the oldest live position (replay start, or the start
    /// of a write still in flight) up to `write_pos`.
    fn used(st: &State) -> u64 {
        let size = st.region.size();
        let tag = st.region.log_tag();
        let back = |from: u64| (st.write_pos + size - from) % size;
        st.in_flight
            .iter()
            .filter(|b| b.tag == tag && !b.done && !b.failed)
            .map(|b| match back(b.start_pos) {
                // A batch starting at write_pos spans the whole region.
                0 => size,
                d => d,
            })
            .fold(back(st.replay_start), u64::max)
    }

    fn write_all(
        &self,
        region: &MirroredRegion,
        writes: &[(u64, Vec<u8>)],
    ) -> Result<(), PoolError> {
        // Durable writes (O_DSYNC) sync only these bytes, not txg data in flight.
        for (pos, bytes) in writes {
            region.write_durable(*pos, bytes)?;
            self.count_synced(1, bytes.len());
        }
        Ok(())
    }

    /// Counts durable region writes done: `pieces` of `bytes` in all (a
    /// mirror's copies count once).
    fn count_synced(&self, pieces: usize, bytes: usize) {
        self.stats.syncs.fetch_add(pieces as u64, Ordering::Relaxed);
        self.stats.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Fraction of the region that replay may still need, plus records in memory.
    pub fn fill(&self) -> f64 {
        let st = self.state.lock();
        let size = st.region.size();
        (Self::used(&st) + st.pending_bytes as u64) as f64 / size as f64
    }

    /// While `Some`, a commit that needs a txg (the log is full, or its
    /// records were left to the txg) fails at once with this reason instead
    /// of waiting (a suspended pool with failmode=continue).
    pub fn set_failing(&self, reason: Option<String>) {
        let mut st = self.state.lock();
        st.failing = reason;
        // Waiters that need a txg would wait for it: the blocking way fails them.
        let refused = if st.failing.is_some() && st.applied_seq < st.dropped_below {
            std::mem::take(&mut st.waiters)
        } else {
            VecDeque::new()
        };
        self.changed.notify_all();
        drop(st);
        answer(refused, false);
    }

    /// After a failed log write, once the pool is resumed: commits work
    /// again. The failed batch may be missing from the region, so replay
    /// could not reach records written after it: every record so far is
    /// treated as left to the txg (a commit waits for a txg holding it).
    pub fn resume(&self) {
        let mut st = self.state.lock();
        st.failing = None;
        if st.failed.take().is_some() {
            st.dropped_below = st.next_seq;
            // Failed batches end nothing any more: every record before
            // dropped_below waits for a txg, and later ones go past them.
            st.in_flight.retain(|b| !b.failed);
            Self::settle(&mut st);
        }
        self.changed.notify_all();
    }

    /// Fails every later commit; waiters wake up.
    pub fn close(&self) {
        let mut st = self.state.lock();
        st.closed = true;
        let waiters = std::mem::take(&mut st.waiters);
        self.changed.notify_all();
        drop(st);
        answer(waiters, false);
    }
}

/// Calls each waiter (never under the log's lock: a waiter may send a reply
/// or queue the request for a blocking retry).
fn answer(waiters: VecDeque<(u64, Waiter)>, durable: bool) {
    for (_, w) in waiters {
        w(durable);
    }
}

mod ring;
mod writer;

#[cfg(test)]
mod tests;

/// Entry points for the fuzz targets (`fuzz/`, decision 0027); not part of the API.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// Appends one record as [`IntentLog::append`] writes it.
    #[allow(clippy::too_many_arguments)]
    pub fn encode_record(
        pool_guid: u64,
        kind: RecordKind,
        seq: u64,
        dataset: u64,
        offset: u64,
        length: u64,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) {
        encode(pool_guid, kind, seq, dataset, offset, length, payload, out)
    }

    /// The record kind of a kind byte.
    pub fn record_kind(v: u8) -> Option<RecordKind> {
        RecordKind::from_u8(v)
    }

    /// Replays a log region held in memory as [`IntentLog::open`] does:
    /// the records, the position of the next record and its sequence number.
    pub fn replay(region: &[u8], pool_guid: u64, cp: Checkpoint) -> (Vec<LogRecord>, u64, u64) {
        let r = super::replay(region.len() as u64, pool_guid, cp, |pos, buf, verify| {
            let Some(src) = usize::try_from(pos)
                .ok()
                .and_then(|p| region.get(p..p.checked_add(buf.len())?))
            else {
                return false;
            };
            buf.copy_from_slice(src);
            verify(buf)
        });
        (r.records, r.pos, r.seq)
    }
}
