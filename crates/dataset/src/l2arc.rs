//! The L2ARC: a second-level read cache on a fast device (`cistern pool
//! add POOL cache DEV`), filled from blocks leaving the ARC, kept across
//! restarts (decision 0029; format in docs/on-disk-format.md).
//!
//! The device is a ring of records after a 4 KiB header (magic, version,
//! pool guid, device guid: a device of another pool is refused). A record
//! is a 128-byte header (its ARC key, length, sequence, a BLAKE3 of the data
//! and one of the header) followed by the block's decompressed bytes, padded
//! to 4 KiB. The headers are the persistent index: at open they are scanned
//! and the newest record of every span kept. A read verifies the data hash;
//! a mismatch (a lying or worn device) is a miss, counted, never data. Keys
//! carry the birth txg and the checksum word of the block pointer, so a
//! record can never be served for another version of a block.

use crate::cache::Key;
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const L2_MAGIC: &[u8; 8] = b"CISTL2AR";
pub const L2_VERSION: u32 = 1;
pub const L2_HEADER: u64 = 4096;
const REC_MAGIC: &[u8; 4] = b"L2R1";
const REC_HEADER: usize = 128;
const ALIGN: u64 = 4096;
/// Blocks and bytes waiting to be written; more are dropped (the feed is
/// best effort, and these are evicted blocks kept alive only for it).
const FEED_QUEUE: usize = 256;
pub const FEED_MAX_BYTES: u64 = 16 << 20;
/// Smallest usable cache device.
pub const MIN_DEVICE: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum L2Error {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: not a cache device of this pool ({1})")]
    Foreign(String, String),
    #[error("{0}: too small for a cache device ({1} bytes, at least {MIN_DEVICE})")]
    TooSmall(String, u64),
}

/// Counters of one cache device.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct L2Stats {
    pub path: PathBuf,
    pub guid: u64,
    /// "ONLINE", or "UNAVAIL" (recorded in the pool, not opened).
    pub state: String,
    pub hits: u64,
    pub misses: u64,
    /// Records whose data did not match their hash: served as misses.
    pub checksum_errors: u64,
    pub writes: u64,
    pub write_bytes: u64,
    /// Blocks the feed dropped (queue full or rate bound).
    pub feed_dropped: u64,
    /// Bytes of records indexed now, and the device's record area.
    pub size: u64,
    pub capacity: u64,
    pub entries: u64,
}

struct Index {
    by_key: HashMap<Key, (u64, u32)>,
    /// Record offset -> (key, record bytes): what a write over a span drops.
    by_pos: BTreeMap<u64, (Key, u64)>,
    /// Where the next record goes, and its sequence number.
    head: u64,
    seq: u64,
    bytes: u64,
}

/// A block offered to the feed.
type Offered = (Key, crate::cache::Block);

pub struct L2Device {
    pub path: PathBuf,
    pub guid: u64,
    file: File,
    capacity: u64,
    index: Mutex<Index>,
    feed: Mutex<Option<SyncSender<Offered>>>,
    closed: AtomicBool,
    hits: AtomicU64,
    misses: AtomicU64,
    checksum_errors: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    feed_dropped: AtomicU64,
    queued: AtomicU64,
}

fn header_bytes(pool_guid: u64, guid: u64, capacity: u64) -> Vec<u8> {
    let mut h = vec![0u8; L2_HEADER as usize];
    h[0..8].copy_from_slice(L2_MAGIC);
    h[8..12].copy_from_slice(&L2_VERSION.to_le_bytes());
    h[16..24].copy_from_slice(&pool_guid.to_le_bytes());
    h[24..32].copy_from_slice(&guid.to_le_bytes());
    h[32..40].copy_from_slice(&capacity.to_le_bytes());
    let sum = blake3::hash(&h[..64]);
    h[64..96].copy_from_slice(sum.as_bytes());
    h
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

fn record_header(key: &Key, len: u32, seq: u64, data: &[u8]) -> [u8; REC_HEADER] {
    let mut h = [0u8; REC_HEADER];
    h[0..4].copy_from_slice(REC_MAGIC);
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..16].copy_from_slice(&seq.to_le_bytes());
    for (i, v) in [key.0, key.1, key.2, key.3, key.4].iter().enumerate() {
        h[16 + 8 * i..24 + 8 * i].copy_from_slice(&v.to_le_bytes());
    }
    h[56..88].copy_from_slice(blake3::hash(data).as_bytes());
    let sum = blake3::hash(&h[..88]);
    h[88..120].copy_from_slice(sum.as_bytes());
    h
}

/// A record header that checks: (key, data length, sequence, data hash).
fn parse_record(h: &[u8]) -> Option<(Key, u32, u64, [u8; 32])> {
    if h.len() < REC_HEADER || &h[0..4] != REC_MAGIC {
        return None;
    }
    if blake3::hash(&h[..88]).as_bytes() != &h[88..120] {
        return None;
    }
    let mut len = [0u8; 4];
    len.copy_from_slice(&h[4..8]);
    let key = (
        u64_at(h, 16),
        u64_at(h, 24),
        u64_at(h, 32),
        u64_at(h, 40),
        u64_at(h, 48),
    );
    let mut sum = [0u8; 32];
    sum.copy_from_slice(&h[56..88]);
    Some((key, u32::from_le_bytes(len), u64_at(h, 8), sum))
}

fn record_span(len: u32) -> u64 {
    (REC_HEADER as u64 + len as u64).div_ceil(ALIGN) * ALIGN
}

impl L2Device {
    /// Makes `path` a cache device of pool `pool_guid` (overwrites its header).
    pub fn create(path: &Path, pool_guid: u64, guid: u64) -> Result<u64, L2Error> {
        let name = path.display().to_string();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| L2Error::Io(name.clone(), e))?;
        let len = device_len(&file).map_err(|e| L2Error::Io(name.clone(), e))?;
        if len < MIN_DEVICE {
            return Err(L2Error::TooSmall(name, len));
        }
        let capacity = (len - L2_HEADER) / ALIGN * ALIGN;
        file.write_all_at(&header_bytes(pool_guid, guid, capacity), 0)
            .map_err(|e| L2Error::Io(name.clone(), e))?;
        // The old contents of the first record slot must not look like a record.
        file.write_all_at(&[0u8; REC_HEADER], L2_HEADER)
            .map_err(|e| L2Error::Io(name.clone(), e))?;
        file.sync_all().map_err(|e| L2Error::Io(name, e))?;
        Ok(capacity)
    }

    /// Opens a cache device of pool `pool_guid` with device guid `guid` and
    /// rebuilds its index from the record headers.
    pub fn open(path: &Path, pool_guid: u64, guid: u64) -> Result<Arc<L2Device>, L2Error> {
        let name = path.display().to_string();
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| L2Error::Io(name.clone(), e))?;
        let mut h = vec![0u8; L2_HEADER as usize];
        file.read_exact_at(&mut h, 0)
            .map_err(|e| L2Error::Io(name.clone(), e))?;
        let foreign = |why: String| L2Error::Foreign(name.clone(), why);
        if &h[0..8] != L2_MAGIC || blake3::hash(&h[..64]).as_bytes() != &h[64..96] {
            return Err(foreign("no cache device header".into()));
        }
        let version = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
        if version != L2_VERSION {
            return Err(foreign(format!("header version {version}")));
        }
        if u64_at(&h, 16) != pool_guid || u64_at(&h, 24) != guid {
            return Err(foreign(format!(
                "it names pool {} device {}",
                u64_at(&h, 16),
                u64_at(&h, 24)
            )));
        }
        let capacity = u64_at(&h, 32);
        let len = device_len(&file).map_err(|e| L2Error::Io(name.clone(), e))?;
        if capacity > len.saturating_sub(L2_HEADER) {
            return Err(foreign("shorter than its header says".into()));
        }
        let dev = L2Device {
            path: path.to_path_buf(),
            guid,
            file,
            capacity,
            index: Mutex::new(Index {
                by_key: HashMap::new(),
                by_pos: BTreeMap::new(),
                head: 0,
                seq: 1,
                bytes: 0,
            }),
            feed: Mutex::new(None),
            closed: AtomicBool::new(false),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            checksum_errors: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            feed_dropped: AtomicU64::new(0),
            queued: AtomicU64::new(0),
        };
        dev.rebuild().map_err(|e| L2Error::Io(name, e))?;
        Ok(Arc::new(dev))
    }

    /// Scans the record headers: the newest record of every span wins.
    fn rebuild(&self) -> std::io::Result<()> {
        let mut found: Vec<(u64, u64, Key, u32)> = Vec::new(); // (seq, pos, key, len)
        let chunk = 8u64 << 20;
        let mut buf = vec![0u8; chunk as usize];
        let mut pos = 0u64;
        while pos < self.capacity {
            let n = chunk.min(self.capacity - pos) as usize;
            self.file.read_exact_at(&mut buf[..n], L2_HEADER + pos)?;
            let mut at = 0usize;
            while at < n {
                if let Some((key, len, seq, _)) = parse_record(&buf[at..n]) {
                    let span = record_span(len);
                    if pos + at as u64 + span <= self.capacity {
                        found.push((seq, pos + at as u64, key, len));
                    }
                }
                at += ALIGN as usize;
            }
            pos += n as u64;
        }
        found.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        let mut idx = self.index.lock();
        let mut taken: BTreeMap<u64, u64> = BTreeMap::new(); // start -> end
        let overlaps = |taken: &BTreeMap<u64, u64>, s: u64, e: u64| {
            taken
                .range(..e)
                .next_back()
                .is_some_and(|(_, &end)| end > s)
        };
        for (i, &(seq, pos, key, len)) in found.iter().enumerate() {
            let end = pos + record_span(len);
            if overlaps(&taken, pos, end) || idx.by_key.contains_key(&key) {
                continue;
            }
            taken.insert(pos, end);
            if i == 0 {
                idx.head = end % self.capacity;
                idx.seq = seq + 1;
            }
            idx.by_key.insert(key, (pos, len));
            idx.by_pos.insert(pos, (key, end - pos));
            idx.bytes += end - pos;
        }
        Ok(())
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.index.lock().by_key.contains_key(key)
    }

    /// The block under `key`, verified against its record's hash.
    pub fn get(&self, key: &Key) -> Option<Vec<u8>> {
        let Some((pos, len)) = self.index.lock().by_key.get(key).copied() else {
            self.misses.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        let mut buf = vec![0u8; REC_HEADER + len as usize];
        let ok = self.file.read_exact_at(&mut buf, L2_HEADER + pos).is_ok()
            && parse_record(&buf).is_some_and(|(k, l, _, sum)| {
                k == *key && l == len && blake3::hash(&buf[REC_HEADER..]).as_bytes() == &sum
            });
        if !ok {
            // A lying device: forget the record, read from the pool.
            self.checksum_errors.fetch_add(1, Ordering::Relaxed);
            self.misses.fetch_add(1, Ordering::Relaxed);
            let mut idx = self.index.lock();
            if idx.by_key.get(key) == Some(&(pos, len)) {
                idx.by_key.remove(key);
                if let Some((_, span)) = idx.by_pos.remove(&pos) {
                    idx.bytes -= span;
                }
            }
            return None;
        }
        self.hits.fetch_add(1, Ordering::Relaxed);
        buf.drain(..REC_HEADER);
        Some(buf)
    }

    /// Writes one record at the head of the ring (dropping what it covers).
    fn write(&self, key: Key, data: &[u8]) -> std::io::Result<()> {
        let Ok(len) = u32::try_from(data.len()) else {
            return Ok(());
        };
        let span = record_span(len);
        if span > self.capacity {
            return Ok(());
        }
        let (pos, seq) = {
            let mut idx = self.index.lock();
            if idx.by_key.contains_key(&key) {
                return Ok(());
            }
            if idx.head + span > self.capacity {
                idx.head = 0;
            }
            let (pos, seq) = (idx.head, idx.seq);
            // Drop the records this one overwrites (before it is written:
            // a reader never looks at a span being rewritten).
            let covered: Vec<u64> = idx
                .by_pos
                .range(..pos + span)
                .rev()
                .take_while(|(&p, &(_, s))| p + s > pos)
                .map(|(&p, _)| p)
                .collect();
            for p in covered {
                if let Some((k, s)) = idx.by_pos.remove(&p) {
                    idx.by_key.remove(&k);
                    idx.bytes -= s;
                }
            }
            idx.head = pos + span;
            idx.seq += 1;
            (pos, seq)
        };
        let mut rec = Vec::with_capacity(span as usize);
        rec.extend_from_slice(&record_header(&key, len, seq, data));
        rec.extend_from_slice(data);
        rec.resize(span as usize, 0);
        self.file.write_all_at(&rec, L2_HEADER + pos)?;
        let mut idx = self.index.lock();
        idx.by_key.insert(key, (pos, len));
        idx.by_pos.insert(pos, (key, span));
        idx.bytes += span;
        self.writes.fetch_add(1, Ordering::Relaxed);
        self.write_bytes.fetch_add(span, Ordering::Relaxed);
        Ok(())
    }

    /// Starts the feed thread: blocks offered with [`L2Device::offer`] are
    /// written at most `rate` bytes per second.
    pub fn start_feed(self: &Arc<Self>, rate: u64) {
        let (tx, rx) = sync_channel(FEED_QUEUE);
        *self.feed.lock() = Some(tx);
        let dev = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("l2arc-feed".into())
            .spawn(move || feed_loop(dev, rx, rate.max(1 << 20)));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the L2ARC feed thread");
        }
    }

    /// A block leaving the ARC: queued for the device, or dropped when the queue is full.
    pub fn offer(&self, key: Key, data: impl Into<crate::cache::Block>) {
        let data = data.into();
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let len = data.len() as u64;
        if self.queued.fetch_add(len, Ordering::Relaxed) + len > FEED_MAX_BYTES {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            self.feed_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let feed = self.feed.lock();
        let sent = match feed.as_ref() {
            Some(tx) => match tx.try_send((key, data)) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !sent {
            self.queued.fetch_sub(len, Ordering::Relaxed);
            self.feed_dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Stops the feed (the device is removed or the pool exported).
    pub fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        self.feed.lock().take();
    }

    pub fn stats(&self) -> L2Stats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let idx = self.index.lock();
        L2Stats {
            path: self.path.clone(),
            guid: self.guid,
            state: "ONLINE".into(),
            hits: l(&self.hits),
            misses: l(&self.misses),
            checksum_errors: l(&self.checksum_errors),
            writes: l(&self.writes),
            write_bytes: l(&self.write_bytes),
            feed_dropped: l(&self.feed_dropped),
            size: idx.bytes,
            capacity: self.capacity,
            entries: idx.by_key.len() as u64,
        }
    }
}

fn feed_loop(dev: std::sync::Weak<L2Device>, rx: Receiver<Offered>, rate: u64) {
    let mut window = Instant::now();
    let mut written = 0u64;
    while let Ok((key, data)) = rx.recv() {
        let Some(d) = dev.upgrade() else { return };
        if d.closed.load(Ordering::Relaxed) {
            return;
        }
        // The rate bound, per second.
        if written >= rate {
            let left = Duration::from_secs(1).saturating_sub(window.elapsed());
            std::thread::sleep(left);
        }
        if window.elapsed() >= Duration::from_secs(1) {
            window = Instant::now();
            written = 0;
        }
        written += data.len() as u64;
        if let Err(e) = d.write(key, &data) {
            tracing::warn!(device = %d.path.display(), error = %e, "L2ARC write failed");
        }
        d.queued.fetch_sub(data.len() as u64, Ordering::Relaxed);
    }
}

fn device_len(f: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = f;
    f.seek(SeekFrom::End(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(dir: &Path, size: u64) -> PathBuf {
        let p = dir.join("l2");
        let f = File::create(&p).unwrap();
        f.set_len(size).unwrap();
        p
    }

    fn wait_written(d: &L2Device, n: u64) {
        for _ in 0..500 {
            if d.stats().writes >= n {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("feed wrote {} of {n}", d.stats().writes);
    }

    #[test]
    fn records_survive_reopen_and_a_wrong_pool_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = device(dir.path(), 32 << 20);
        L2Device::create(&p, 7, 9).unwrap();
        let d = L2Device::open(&p, 7, 9).unwrap();
        d.start_feed(1 << 30);
        for i in 0..10u64 {
            d.offer((1, 1, i, 5, i), Arc::new(vec![i as u8; 16384]));
        }
        wait_written(&d, 10);
        assert_eq!(d.get(&(1, 1, 3, 5, 3)).unwrap(), vec![3u8; 16384]);
        assert!(d.get(&(1, 1, 3, 5, 4)).is_none(), "another checksum word");
        d.close();
        drop(d);
        let d = L2Device::open(&p, 7, 9).unwrap();
        assert_eq!(d.stats().entries, 10);
        assert_eq!(d.get(&(1, 1, 9, 5, 9)).unwrap(), vec![9u8; 16384]);
        assert!(matches!(
            L2Device::open(&p, 8, 9),
            Err(L2Error::Foreign(..))
        ));
        assert!(matches!(
            L2Device::open(&p, 7, 10),
            Err(L2Error::Foreign(..))
        ));
    }

    #[test]
    fn a_corrupted_record_is_a_counted_miss() {
        let dir = tempfile::tempdir().unwrap();
        let p = device(dir.path(), 32 << 20);
        L2Device::create(&p, 1, 2).unwrap();
        let d = L2Device::open(&p, 1, 2).unwrap();
        d.start_feed(1 << 30);
        d.offer((1, 1, 0, 5, 0), Arc::new(vec![0xab; 16384]));
        wait_written(&d, 1);
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[0x00; 8], L2_HEADER + REC_HEADER as u64 + 100)
            .unwrap();
        assert!(d.get(&(1, 1, 0, 5, 0)).is_none());
        assert_eq!(d.stats().checksum_errors, 1);
        assert_eq!(d.stats().entries, 0, "the bad record is forgotten");
    }

    #[test]
    fn the_ring_wraps_and_keeps_the_newest() {
        let dir = tempfile::tempdir().unwrap();
        let p = device(dir.path(), MIN_DEVICE + L2_HEADER);
        L2Device::create(&p, 1, 2).unwrap();
        let d = L2Device::open(&p, 1, 2).unwrap();
        d.start_feed(1 << 30);
        // 3x the device in 64 KiB records.
        let n = 3 * MIN_DEVICE / 65536;
        for i in 0..n {
            d.offer(
                (1, 1, i, 5, 0),
                Arc::new(vec![(i % 251) as u8; 65536 - 256]),
            );
            if i % 64 == 63 {
                wait_written(&d, i + 1 - d.stats().feed_dropped);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let st = d.stats();
        assert!(st.size <= st.capacity, "{st:?}");
        let newest = (0..n).rev().find(|i| d.get(&(1, 1, *i, 5, 0)).is_some());
        assert!(newest.is_some_and(|i| i >= n - 64), "{newest:?}");
        assert!(
            d.get(&(1, 1, 0, 5, 0)).is_none(),
            "the oldest was overwritten"
        );
        d.close();
        drop(d);
        let d = L2Device::open(&p, 1, 2).unwrap();
        let again = d.stats();
        assert_eq!(
            again.entries, st.entries,
            "the index rebuilt the same records"
        );
        assert_eq!(d.stats().checksum_errors, 0);
        let i = newest.unwrap();
        assert_eq!(d.get(&(1, 1, i, 5, 0)).unwrap()[0], (i % 251) as u8);
    }
}
