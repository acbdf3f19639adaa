//! Prefetch (ZFS's zfetch): sequential readers of an object are detected as
//! streams; each read that continues a stream reads ahead of it, in a
//! window that doubles per hit up to `MAX_WINDOW`, on background threads,
//! into the ARC. Bounded: at most `MAX_STREAMS` streams per pool, at most
//! `prefetch_max_bytes` of read-ahead in flight (more is dropped, counted),
//! `WORKERS` threads. Prefetch only warms the cache: what it reads is
//! verified like any read, and a failure is left to the demand read.

use crate::blockmap::Chain;
use crate::txg::ImportedPool;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

const MAX_STREAMS: usize = 16;
/// A stream not continued for this long may be replaced.
const STREAM_IDLE: Duration = Duration::from_secs(2);
/// Largest read-ahead window, bytes.
const MAX_WINDOW: u64 = 16 << 20;
/// Largest single prefetch job, bytes (a window is split into jobs). One
/// job is one device read then the verification of its blocks on one
/// thread, and a demand read waiting for any of its blocks waits for the
/// job: 1 MiB jobs spread a window over all `WORKERS` (reads of some in
/// flight while others verify) where 4 MiB ones kept two busy (decision 0066).
const MAX_JOB: u64 = 1 << 20;
/// A stream reads ahead once this share of its window (1/N) is free, so
/// jobs start a few at a time rather than in bursts of half a window.
const REFILL_DIVISOR: u64 = 4;
/// Queued jobs (a full window of `MAX_JOB`s, with room to spare).
const QUEUE: usize = 32;
/// Threads reading ahead: enough to keep several device reads in flight
/// while others verify what arrived.
const WORKERS: usize = 4;

struct Stream {
    ds: u64,
    obj: u64,
    snapshot: bool,
    /// The block a continuing read starts at (or before, when it re-reads).
    next: u64,
    /// First block not yet prefetched.
    ahead: u64,
    window: u64,
    used: Instant,
}

struct Job {
    pool: Weak<ImportedPool>,
    chain: Chain,
    obj: u64,
    bs: u32,
    first: u64,
    last: u64,
    bytes: u64,
}

pub(crate) struct Prefetcher {
    max_bytes: u64,
    streams: Mutex<Vec<Stream>>,
    in_flight: Arc<AtomicU64>,
    tx: OnceLock<Option<SyncSender<Job>>>,
    /// The pool (set once it is built).
    pub(crate) pool: OnceLock<Weak<ImportedPool>>,
}

impl Prefetcher {
    pub(crate) fn new(max_bytes: u64) -> Self {
        Prefetcher {
            max_bytes,
            streams: Mutex::new(Vec::new()),
            in_flight: Arc::new(AtomicU64::new(0)),
            tx: OnceLock::new(),
            pool: OnceLock::new(),
        }
    }

    fn sender(&self) -> Option<&SyncSender<Job>> {
        self.tx
            .get_or_init(|| {
                let (tx, rx) = sync_channel::<Job>(QUEUE);
                let rx = Arc::new(std::sync::Mutex::new(rx));
                for i in 0..WORKERS {
                    let rx = rx.clone();
                    let in_flight = self.in_flight.clone();
                    let spawned = std::thread::Builder::new()
                        .name(format!("zfetch-{i}"))
                        .spawn(move || loop {
                            let job = match rx.lock() {
                                Ok(r) => r.recv(),
                                Err(_) => return,
                            };
                            let Ok(job) = job else { return };
                            run(&job);
                            in_flight.fetch_sub(job.bytes, Ordering::Relaxed);
                        });
                    if let Err(e) = spawned {
                        tracing::error!(error = %e, "cannot start a prefetch thread");
                        return None;
                    }
                }
                Some(tx)
            })
            .as_ref()
    }

    /// A read of blocks [first, last] of object `obj` was served: continue
    /// or start a stream, and read ahead of a continued one. `warm`: the
    /// read found every block cached long since (none read ahead): the
    /// stream moves on without reading ahead, since looking up blocks that
    /// are cached anyway cost a cached read a tenth of its CPU (decision
    /// 0062); the first read that is not warm reads ahead again from there.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn observe(
        &self,
        cache: &crate::cache::BlockCache,
        chain: &Chain,
        obj: u64,
        bs: u32,
        snapshot: bool,
        first: u64,
        last: u64,
        warm: bool,
    ) {
        if self.max_bytes == 0 || bs == 0 {
            return;
        }
        let ds = chain.data_id();
        let bsz = bs as u64;
        let now = Instant::now();
        let mut jobs: Vec<(u64, u64)> = Vec::new();
        {
            let mut streams = self.streams.lock();
            // Requests of one reader arrive out of order (iodepth > 1): a
            // read anywhere between a window behind the stream and its
            // read-ahead continues it.
            let slack = (MAX_WINDOW / bsz).max(1);
            let found = streams.iter_mut().find(|s| {
                s.ds == ds
                    && s.obj == obj
                    && s.snapshot == snapshot
                    && first <= s.ahead.max(s.next) + slack
                    && last + 1 + slack >= s.next
            });
            match found {
                Some(s) => {
                    let len = last + 1 - first;
                    let max_window = (MAX_WINDOW.min(self.max_bytes / 2) / bsz).max(1);
                    s.window = (s.window * 2).max(len * 2).min(max_window);
                    s.next = s.next.max(last + 1);
                    s.used = now;
                    let start = s.ahead.max(s.next);
                    let end = s.next - 1 + s.window; // inclusive
                                                     // Read ahead once a quarter of the window has been consumed.
                    if !warm && end >= start && end + 1 - start >= s.window / REFILL_DIVISOR {
                        let per_job = (MAX_JOB / bsz).max(1);
                        let mut b = start;
                        while b <= end {
                            let e = (b + per_job - 1).min(end);
                            jobs.push((b, e));
                            b = e + 1;
                        }
                        s.ahead = end + 1;
                    }
                }
                None => {
                    let stream = Stream {
                        ds,
                        obj,
                        snapshot,
                        next: last + 1,
                        ahead: last + 1,
                        window: 0,
                        used: now,
                    };
                    if streams.len() < MAX_STREAMS {
                        streams.push(stream);
                    } else if let Some(old) = streams
                        .iter_mut()
                        .filter(|s| now.duration_since(s.used) >= STREAM_IDLE)
                        .min_by_key(|s| s.used)
                    {
                        *old = stream;
                    } else {
                        return;
                    }
                    cache.prefetch_streams.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if jobs.is_empty() {
            return;
        }
        let (Some(pool), Some(tx)) = (self.pool.get(), self.sender()) else {
            return;
        };
        for (a, b) in jobs {
            let bytes = (b - a + 1) * bsz;
            if self.in_flight.fetch_add(bytes, Ordering::Relaxed) + bytes > self.max_bytes {
                self.in_flight.fetch_sub(bytes, Ordering::Relaxed);
                cache
                    .prefetch_dropped
                    .fetch_add(b - a + 1, Ordering::Relaxed);
                continue;
            }
            let job = Job {
                pool: pool.clone(),
                chain: chain.clone(),
                obj,
                bs,
                first: a,
                last: b,
                bytes,
            };
            match tx.try_send(job) {
                Ok(()) => {}
                Err(TrySendError::Full(j)) | Err(TrySendError::Disconnected(j)) => {
                    self.in_flight.fetch_sub(j.bytes, Ordering::Relaxed);
                    cache
                        .prefetch_dropped
                        .fetch_add(j.last - j.first + 1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Bytes of read-ahead in flight now.
    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}

fn run(job: &Job) {
    let Some(p) = job.pool.upgrade() else { return };
    if p.is_closed() {
        return;
    }
    let blocks: Vec<u64> = (job.first..=job.last).collect();
    let result = p.view().and_then(|view| {
        crate::volume::prefetch_committed(&p, &view, &job.chain, job.obj, job.bs, &blocks)
    });
    if let Err(e) = result {
        tracing::debug!(error = %e, obj = job.obj, "prefetch failed (left to the demand read)");
    }
}
