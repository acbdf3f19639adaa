//! The stream between the two sides: a bounded pipe (a few chunks in
//! memory, never the whole stream), a token bucket for `--bwlimit`, and the
//! progress counters `replication status` and the metrics read.

use parking_lot::Mutex;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Size of one chunk in the pipe.
pub const CHUNK: usize = 256 << 10;
/// Chunks in flight: at most `CHUNKS * CHUNK` bytes of a stream in memory.
pub const CHUNKS: usize = 8;

/// A token bucket: `rate` bytes per second, bursts of at most `burst` bytes.
#[derive(Debug)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    pub fn new(rate: u64, now: Instant) -> Self {
        let rate = rate.max(1) as f64;
        // A tenth of a second of traffic (at least one 16 KiB write), so the
        // stream is smooth rather than a second's worth at once.
        let burst = (rate / 10.0).max(16384.0);
        TokenBucket {
            rate,
            burst,
            tokens: burst,
            last: now,
        }
    }

    /// Takes `n` bytes at `now`; returns how long to wait before they may go.
    pub fn take(&mut self, n: usize, now: Instant) -> Duration {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.tokens -= n as f64;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate)
        }
    }

    /// The largest write that fits one burst.
    pub fn max_write(&self) -> usize {
        self.burst as usize
    }
}

/// What a running transfer has done so far.
#[derive(Debug)]
pub struct Progress {
    pub bytes: AtomicU64,
    /// Estimated stream size (0: unknown).
    pub total: AtomicU64,
    pub started: Instant,
    pub started_unix: i64,
    /// `tank/vm@a -> @b`
    pub what: Mutex<String>,
}

impl Progress {
    pub fn new() -> Arc<Self> {
        Arc::new(Progress {
            bytes: AtomicU64::new(0),
            total: AtomicU64::new(0),
            started: Instant::now(),
            started_unix: crate::now_secs(),
            what: Mutex::new(String::new()),
        })
    }

    /// Bytes per second since the start.
    pub fn rate(&self) -> f64 {
        let secs = self.started.elapsed().as_secs_f64();
        if secs <= 0.0 {
            return 0.0;
        }
        self.bytes.load(Ordering::Relaxed) as f64 / secs
    }

    /// Seconds to go at the current rate, if the size is known.
    pub fn eta(&self) -> Option<u64> {
        let total = self.total.load(Ordering::Relaxed);
        let done = self.bytes.load(Ordering::Relaxed);
        let rate = self.rate();
        (total > 0 && rate > 0.0).then(|| (total.saturating_sub(done) as f64 / rate).ceil() as u64)
    }
}

enum Item {
    Data(Vec<u8>),
    /// The sender failed: the reader must see an error, never a clean end.
    Failed(String),
}

/// The writing end: what the sending side's `send` writes into.
pub struct PipeWriter {
    tx: Option<SyncSender<Item>>,
    buf: Vec<u8>,
    limit: Option<TokenBucket>,
    progress: Arc<Progress>,
    /// Counted for the metrics (bytes sent over every run).
    total: Arc<AtomicU64>,
}

/// The reading end: what the receiving side's `receive` reads from.
pub struct PipeReader {
    rx: Receiver<Item>,
    cur: Vec<u8>,
    pos: usize,
}

/// A bounded pipe with an optional rate limit on the writing end.
pub fn pipe(
    bwlimit: Option<u64>,
    progress: Arc<Progress>,
    total: Arc<AtomicU64>,
) -> (PipeWriter, PipeReader) {
    let (tx, rx) = sync_channel(CHUNKS);
    (
        PipeWriter {
            tx: Some(tx),
            buf: Vec::with_capacity(CHUNK),
            limit: bwlimit.map(|r| TokenBucket::new(r, Instant::now())),
            progress,
            total,
        },
        PipeReader {
            rx,
            cur: Vec::new(),
            pos: 0,
        },
    )
}

impl PipeWriter {
    fn push(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        let n = chunk.len() as u64;
        let tx = self
            .tx
            .as_ref()
            .ok_or_else(|| io::Error::new(io::ErrorKind::BrokenPipe, "stream closed"))?;
        tx.send(Item::Data(chunk)).map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the receiving side stopped reading",
            )
        })?;
        self.progress.bytes.fetch_add(n, Ordering::Relaxed);
        self.total.fetch_add(n, Ordering::Relaxed);
        Ok(())
    }

    /// Ends the stream with an error the reader will return.
    pub fn fail(mut self, why: String) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Item::Failed(why));
        }
    }

    /// Ends the stream cleanly (what is buffered goes first).
    pub fn finish(mut self) -> io::Result<()> {
        self.push()?;
        self.tx.take();
        Ok(())
    }
}

impl Write for PipeWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut n = data.len().min(CHUNK - self.buf.len());
        if let Some(l) = &mut self.limit {
            n = n.min(l.max_write());
            let wait = l.take(n, Instant::now());
            if !wait.is_zero() {
                std::thread::sleep(wait);
            }
        }
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK || self.limit.is_some() {
            // Rate-limited streams go out as they are paced.
            self.push()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push()
    }
}

impl Read for PipeReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.pos >= self.cur.len() {
            match self.rx.recv() {
                Ok(Item::Data(d)) => {
                    self.cur = d;
                    self.pos = 0;
                }
                Ok(Item::Failed(why)) => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        format!("the sending side failed: {why}"),
                    ))
                }
                // Writer dropped without finish(): a cut, not an end.
                Err(_) if self.cur.is_empty() && self.pos == 0 => return Ok(0),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Drop for PipeWriter {
    fn drop(&mut self) {
        // Dropped without finish() or fail(): the sender panicked or bailed out.
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(Item::Failed("the stream was cut".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_paces_to_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(1 << 20, t0);
        // The first burst (a tenth of a second) goes at once.
        assert_eq!(b.take(b.max_write(), t0), Duration::ZERO);
        // A second's worth more must wait about a second.
        let w = b.take(1 << 20, t0);
        assert!((w.as_secs_f64() - 1.0).abs() < 0.01, "{w:?}");
        // Time refills it, up to one burst.
        let later = t0 + Duration::from_secs(100);
        let w = b.take(0, later);
        assert_eq!(w, Duration::ZERO);
        assert!(b.tokens <= b.burst);
        // Sending 10 MiB at 1 MiB/s, chunk by chunk, waits ~10 s in all.
        let mut b = TokenBucket::new(1 << 20, t0);
        let mut now = t0;
        let mut sent = 0usize;
        while sent < 10 << 20 {
            let n = b.max_write();
            now += b.take(n, now);
            sent += n;
        }
        let secs = now.duration_since(t0).as_secs_f64();
        assert!((9.8..10.2).contains(&secs), "{secs}");
    }

    #[test]
    fn pipe_carries_bytes_and_reports_a_failed_sender() {
        let p = Progress::new();
        let total = Arc::new(AtomicU64::new(0));
        let (mut w, mut r) = pipe(None, p.clone(), total.clone());
        let data: Vec<u8> = (0..3 * CHUNK + 17).map(|i| (i * 7) as u8).collect();
        let d = data.clone();
        let h = std::thread::spawn(move || {
            w.write_all(&d).unwrap();
            w.finish().unwrap();
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        h.join().unwrap();
        assert_eq!(got, data);
        assert_eq!(p.bytes.load(Ordering::Relaxed), data.len() as u64);
        assert_eq!(total.load(Ordering::Relaxed), data.len() as u64);

        let (mut w, mut r) = pipe(None, Progress::new(), Arc::new(AtomicU64::new(0)));
        let h = std::thread::spawn(move || {
            w.write_all(&[1; 1000]).unwrap();
            w.flush().unwrap();
            w.fail("disk on fire".into());
        });
        let mut got = Vec::new();
        let e = r.read_to_end(&mut got).unwrap_err();
        h.join().unwrap();
        assert!(e.to_string().contains("disk on fire"), "{e}");

        // Dropped mid-way (a panic, an early return): an error too.
        let (mut w, mut r) = pipe(None, Progress::new(), Arc::new(AtomicU64::new(0)));
        w.write_all(&[1; 10]).unwrap();
        drop(w);
        let e = r.read_to_end(&mut Vec::new()).unwrap_err();
        assert!(e.to_string().contains("cut"), "{e}");

        // The reader going away stops the writer (bounded, no hang).
        let (mut w, r) = pipe(None, Progress::new(), Arc::new(AtomicU64::new(0)));
        drop(r);
        let e = w.write_all(&vec![0; 2 * CHUNK]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn a_limited_pipe_takes_its_time() {
        let (mut w, mut r) = pipe(Some(2 << 20), Progress::new(), Arc::new(AtomicU64::new(0)));
        let t = Instant::now();
        let h = std::thread::spawn(move || {
            w.write_all(&vec![5; 1 << 20]).unwrap();
            w.finish().unwrap();
        });
        let mut got = Vec::new();
        r.read_to_end(&mut got).unwrap();
        h.join().unwrap();
        assert_eq!(got.len(), 1 << 20);
        // 1 MiB at 2 MiB/s, less the first burst: at least 0.4 s.
        assert!(
            t.elapsed() >= Duration::from_millis(400),
            "{:?}",
            t.elapsed()
        );
    }
}
