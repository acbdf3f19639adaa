//! The ARC: a bounded, scan-resistant cache of verified, decompressed
//! blocks (quick_cache's S3-FIFO/CLOCK-Pro policy: a block read once waits in
//! a small cold queue, a block read twice moves to the hot one, so a one-pass
//! scan does not push out the working set; decision 0029).
//!
//! Keyed by (dataset, object, block, birth txg, first checksum word): a block
//! version never changes, and the checksum word makes a key that names other
//! bytes (a dataset id or txg reused after a rollback, a destroy or a crash)
//! a different key, so an entry is never stale.
//!
//! The bound moves between `cache_min_bytes` and `cache_max_bytes`: the
//! memory monitor (crate::memory) lowers the target under memory pressure
//! and raises it back when the pressure is gone.

use crate::l2arc::{L2Device, L2Stats};
use parking_lot::{Condvar, Mutex, RwLock};
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub type Key = (u64, u64, u64, u64, u64);

/// Bytes an entry costs beside its data (key, Arc, Vec header, slot).
const ENTRY_OVERHEAD: u64 = 96;

/// The first 8 bytes of a block checksum, as part of the cache key.
pub fn checksum_word(sum: &[u8; 32]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&sum[..8]);
    u64::from_le_bytes(w)
}

/// The smallest share of the ARC kept for blocks read once (quick_cache's
/// cold queue): prefetched blocks wait there until their demand read, so it
/// must hold more than the read-ahead in flight (`COLD_MIN_BYTES`).
const COLD_MIN_FRACTION: f64 = 0.1;
const COLD_MIN_BYTES: u64 = 96 << 20;
/// Shards of the in-flight table (claims of blocks being read).
const LOADING_SHARDS: usize = 16;

/// A block's bytes as the ARC, the txg, the L2ARC feed and read replies
/// share them: a heap vector (a written or decompressed block) or a page-
/// aligned slab buffer a device read landed in ([`vdev::BlockBuf`], decision
/// 0069). Cloning shares the bytes; they never change once shared.
#[derive(Clone)]
pub struct Block {
    data: Bytes,
    /// Bytes of memory it holds (a vector's capacity), for the ARC's bound.
    held: usize,
}

/// Where a [`Block`]'s bytes live. An enum, not a trait object, so the txg
/// can take back a heap vector nobody else holds (see [`Block::into_vec`]).
#[derive(Clone)]
enum Bytes {
    Heap(Arc<Vec<u8>>),
    Slab(Arc<vdev::BlockBuf>),
}

impl Block {
    /// The bytes as a front end shares them (the NBD reply's `ReadChunk::Shared`).
    pub fn shared(self) -> Arc<dyn AsRef<[u8]> + Send + Sync> {
        match self.data {
            Bytes::Heap(v) => v,
            Bytes::Slab(b) => b,
        }
    }

    /// Bytes of memory held (at least its length).
    pub fn held(&self) -> usize {
        self.held
    }

    /// The heap vector itself when this is its only holder (no ARC entry,
    /// no reader, no reply holds it: `Arc::try_unwrap` proves it), so the
    /// caller may change it; else the block back, unchanged.
    pub fn into_vec(self) -> std::result::Result<Vec<u8>, Block> {
        match self.data {
            Bytes::Heap(v) => Arc::try_unwrap(v).map_err(Block::from),
            Bytes::Slab(_) => Err(self),
        }
    }
}

impl std::ops::Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.data {
            Bytes::Heap(v) => v,
            Bytes::Slab(b) => b,
        }
    }
}

impl From<Vec<u8>> for Block {
    fn from(v: Vec<u8>) -> Block {
        Block::from(Arc::new(v))
    }
}

impl From<Arc<Vec<u8>>> for Block {
    fn from(v: Arc<Vec<u8>>) -> Block {
        let held = v.capacity();
        Block {
            data: Bytes::Heap(v),
            held,
        }
    }
}

impl From<vdev::BlockBuf> for Block {
    fn from(b: vdev::BlockBuf) -> Block {
        let held = b.len();
        Block {
            data: Bytes::Slab(Arc::new(b)),
            held,
        }
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Block({} bytes)", self.len())
    }
}

/// One ARC entry. `prefetched`: read ahead and not yet used by a demand
/// read; that first demand read is the block's first access, not its second
/// (as ZFS's ARC_FLAG_PREFETCH), so a prefetched one-pass scan stays in the
/// cold queue and cannot push the working set out.
pub struct Entry {
    data: Block,
    prefetched: AtomicBool,
}

type Val = Arc<Entry>;

#[derive(Clone)]
struct BlockWeighter;

impl Weighter<Key, Val> for BlockWeighter {
    fn weight(&self, _key: &Key, val: &Val) -> u64 {
        val.data.held() as u64 + ENTRY_OVERHEAD
    }
}

/// A block some thread is reading from the devices now.
pub struct Loading {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Loading {
    /// Waits until the reader is done (or `timeout`); true when it is.
    /// Whether the block then is in the ARC is for the caller to look.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut done = self.done.lock();
        while !*done {
            if self.cv.wait_until(&mut done, deadline).timed_out() {
                return *done;
            }
        }
        true
    }
}

/// The right to read a block from the devices: others that miss the same
/// block wait for it instead of reading it a second time. Dropped after the
/// block is in the ARC (or the read failed): waiters then look again.
pub struct LoadClaim<'a> {
    cache: &'a BlockCache,
    key: Key,
    loading: Arc<Loading>,
}

impl Drop for LoadClaim<'_> {
    fn drop(&mut self) {
        self.cache.loading_shard(&self.key).lock().remove(&self.key);
        *self.loading.done.lock() = true;
        self.loading.cv.notify_all();
    }
}

pub enum Claim<'a> {
    /// This caller reads the block.
    Mine(LoadClaim<'a>),
    /// Another reader has it in flight: wait on it, then look again.
    Theirs(Arc<Loading>),
}

type L2List = Arc<RwLock<Vec<Arc<L2Device>>>>;

/// Counts evictions and offers what leaves the ARC to the L2ARC feed.
#[derive(Clone, Default)]
struct Evictions {
    count: Arc<AtomicU64>,
    l2: L2List,
    /// Datasets whose blocks never leave memory: the ARC holds encrypted
    /// datasets' plaintext, which must not reach a cache device (decision 0026).
    private: Arc<RwLock<std::collections::HashSet<u64>>>,
}

impl Lifecycle<Key, Val> for Evictions {
    type RequestState = ();
    fn on_evict(&self, _state: &mut (), key: Key, val: Val) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if self.private.read().contains(&key.0) {
            return;
        }
        let l2 = self.l2.read();
        if !l2.is_empty() {
            let i = (key.2 ^ key.4) as usize % l2.len();
            l2[i].offer(key, val.data.clone());
        }
    }
}

/// Counters and bounds of the ARC, for `pool status --json` and metrics
/// (and for a `pool iostat` line).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ArcStats {
    /// Demand reads found in the cache.
    pub hits: u64,
    /// Demand reads that went to the devices.
    pub misses: u64,
    /// Blocks read ahead by prefetch (from the devices into the cache).
    pub prefetch_reads: u64,
    /// Blocks prefetch found already cached.
    pub prefetch_cached: u64,
    /// Prefetch requests dropped because the in-flight bound was reached.
    pub prefetch_dropped: u64,
    /// Sequential streams detected.
    pub prefetch_streams: u64,
    pub evictions: u64,
    /// Bytes cached now (data plus per-entry overhead).
    pub size: u64,
    /// The current bound (between min and max; lower under memory pressure).
    pub target: u64,
    pub min: u64,
    pub max: u64,
    /// Times the memory monitor lowered the target.
    pub shrinks: u64,
    pub entries: u64,
    /// L2ARC, over its cache devices: hits, misses, records that failed
    /// their hash (served as misses), bytes held and written.
    #[serde(default)]
    pub l2_hits: u64,
    #[serde(default)]
    pub l2_misses: u64,
    #[serde(default)]
    pub l2_checksum_errors: u64,
    #[serde(default)]
    pub l2_size: u64,
    #[serde(default)]
    pub l2_write_bytes: u64,
}

pub struct BlockCache {
    cache: Cache<Key, Val, BlockWeighter, DefaultHashBuilder, Evictions>,
    evictions: Evictions,
    loading: Vec<Mutex<HashMap<Key, Arc<Loading>>>>,
    min: u64,
    max: u64,
    target: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub prefetch_reads: AtomicU64,
    pub prefetch_cached: AtomicU64,
    pub prefetch_dropped: AtomicU64,
    pub prefetch_streams: AtomicU64,
    pub shrinks: AtomicU64,
    l2_misses: AtomicU64,
    /// Cache devices recorded in the pool but not open (UNAVAIL).
    l2_missing: Mutex<Vec<L2Stats>>,
}

impl BlockCache {
    /// A cache bounded by `max` bytes that the memory monitor may shrink to `min`.
    pub fn new(min: u64, max: u64) -> Self {
        let min = min.min(max);
        // Few shards for a small cache: an entry must fit one shard's share.
        let shards = (max / (16 << 20)).clamp(1, 16).next_power_of_two() as usize;
        let cold = (COLD_MIN_BYTES as f64 / max.max(1) as f64).clamp(COLD_MIN_FRACTION, 0.5);
        let options = quick_cache::OptionsBuilder::new()
            .shards(shards)
            .hot_allocation(1.0 - cold)
            .estimated_items_capacity(((max / 65536) as usize).clamp(64, 1 << 20))
            .weight_capacity(max.max(1))
            .build()
            .expect("cache options are valid");
        let evictions = Evictions::default();
        BlockCache {
            cache: Cache::with_options(
                options,
                BlockWeighter,
                DefaultHashBuilder::default(),
                evictions.clone(),
            ),
            evictions,
            loading: (0..LOADING_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            min,
            max,
            target: AtomicU64::new(max),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            prefetch_reads: AtomicU64::new(0),
            prefetch_cached: AtomicU64::new(0),
            prefetch_dropped: AtomicU64::new(0),
            prefetch_streams: AtomicU64::new(0),
            shrinks: AtomicU64::new(0),
            l2_misses: AtomicU64::new(0),
            l2_missing: Mutex::new(Vec::new()),
        }
    }

    /// A demand read: counted as a hit or a miss. The first demand read of
    /// a prefetched block leaves its recency as it is (one access).
    pub fn get(&self, key: &Key) -> Option<Block> {
        let got = self.get_uncounted(key);
        let counter = if got.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        got
    }

    /// [`BlockCache::get`] for a demand read already counted (a miss that
    /// waited for another reader's I/O).
    pub fn get_uncounted(&self, key: &Key) -> Option<Block> {
        match self.cache.peek(key) {
            Some(e) if e.prefetched.swap(false, Ordering::Relaxed) => Some(e),
            Some(_) => self.cache.get(key),
            None => None,
        }
        .map(|e| e.data.clone())
    }

    /// A demand read that must not wait for the devices (the NBD reader
    /// serves it in place, decision 0062): the data of every key if all are
    /// cached, counted and touched as [`BlockCache::get`] does; else `None`
    /// with nothing counted or touched (the caller reads the blocks the
    /// usual way, so a prefetched block's first demand read is still its
    /// first access). With the data, how many of the blocks were read ahead
    /// and not read since.
    pub fn get_all(&self, keys: &[Key]) -> Option<(Vec<Block>, usize)> {
        let mut found = Vec::with_capacity(keys.len());
        for key in keys {
            found.push(self.cache.peek(key)?);
        }
        let mut ahead = 0;
        for (key, e) in keys.iter().zip(&found) {
            if e.prefetched.swap(false, Ordering::Relaxed) {
                ahead += 1;
            } else {
                // Its recency (a block evicted since the peek is served anyway).
                let _ = self.cache.get(key);
            }
        }
        self.hits.fetch_add(keys.len() as u64, Ordering::Relaxed);
        Some((found.into_iter().map(|e| e.data.clone()).collect(), ahead))
    }

    /// Keeps dataset `ds`'s blocks out of the L2ARC (its plaintext stays in
    /// memory); called before any of its blocks is cached (the txg's insert
    /// of what it wrote, the read path's of what it read).
    pub fn keep_in_memory(&self, ds: u64) {
        if !self.evictions.private.read().contains(&ds) {
            self.evictions.private.write().insert(ds);
        }
    }

    /// Whether a block is cached, without counting or touching its recency (prefetch).
    pub fn contains(&self, key: &Key) -> bool {
        self.cache.contains_key(key)
    }

    pub fn insert(&self, key: Key, data: impl Into<Block>) {
        self.insert_entry(key, data.into(), false);
    }

    /// A block read ahead (crate::prefetch): see [`Entry`].
    pub fn insert_prefetched(&self, key: Key, data: impl Into<Block>) {
        self.insert_entry(key, data.into(), true);
    }

    fn insert_entry(&self, key: Key, data: Block, prefetched: bool) {
        let entry = Arc::new(Entry {
            data,
            prefetched: AtomicBool::new(prefetched),
        });
        // A block version never changes: one already cached keeps its
        // entry and recency (a second insert would count as an access).
        if self.cache.contains_key(&key) {
            return;
        }
        self.cache.insert(key, entry);
    }

    /// Takes a block version out of the ARC (the txg replaces it and no
    /// snapshot holds it: nobody will ask for it again). The bytes come
    /// back so the txg can merge the new ones into them: in the buffer
    /// itself when the ARC was its only holder ([`Block::into_vec`]), else
    /// by copying. Not an eviction: nothing is offered to the L2ARC.
    pub fn take(&self, key: &Key) -> Option<Block> {
        let (_, entry) = self.cache.remove(key)?;
        Some(match Arc::try_unwrap(entry) {
            Ok(e) => e.data,
            // A reader holds the entry: it keeps its bytes, the txg copies.
            Err(e) => e.data.clone(),
        })
    }

    fn loading_shard(&self, key: &Key) -> &Mutex<HashMap<Key, Arc<Loading>>> {
        let h = key.0 ^ key.1.rotate_left(17) ^ key.2.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.loading[(h >> 58) as usize % LOADING_SHARDS]
    }

    /// Claims the read of a missing block from the devices (see [`Claim`]).
    pub fn claim(&self, key: Key) -> Claim<'_> {
        let mut m = self.loading_shard(&key).lock();
        if let Some(l) = m.get(&key) {
            return Claim::Theirs(l.clone());
        }
        let loading = Arc::new(Loading {
            done: Mutex::new(false),
            cv: Condvar::new(),
        });
        m.insert(key, loading.clone());
        Claim::Mine(LoadClaim {
            cache: self,
            key,
            loading,
        })
    }

    /// Drops every entry of a dataset (it was destroyed).
    pub fn forget_dataset(&self, dataset: u64) {
        self.cache.retain(|k, _| k.0 != dataset);
    }

    /// Sets the bound (clamped to [min, max]); evicts down to it at once.
    pub fn set_target(&self, bytes: u64) {
        self.set_target_within(bytes, u64::MAX);
    }

    /// Sets the bound clamped to [min, max] and then to `ceiling` (a cgroup
    /// limit wins over `cache_min_bytes`: the floor is then a quarter of it).
    pub fn set_target_within(&self, bytes: u64, ceiling: u64) {
        let min = self.min.min(ceiling / 4);
        let t = bytes.clamp(min, self.max).min(ceiling);
        let old = self.target.swap(t, Ordering::Relaxed);
        if t < old {
            self.shrinks.fetch_add(1, Ordering::Relaxed);
        }
        if t != old {
            self.cache.set_capacity(t.max(1));
        }
    }

    pub fn target(&self) -> u64 {
        self.target.load(Ordering::Relaxed)
    }

    pub fn bounds(&self) -> (u64, u64) {
        (self.min, self.max)
    }

    /// Bytes held now.
    pub fn size(&self) -> u64 {
        self.cache.weight()
    }

    /// Starts feeding a cache device and reading from it.
    pub fn attach_l2(&self, dev: Arc<L2Device>) {
        self.l2_missing.lock().retain(|m| m.guid != dev.guid);
        let mut l2 = self.evictions.l2.write();
        l2.retain(|d| d.guid != dev.guid);
        l2.push(dev);
    }

    /// Takes a cache device out (`pool remove`); it is forgotten if missing.
    pub fn detach_l2(&self, guid: u64) -> Option<Arc<L2Device>> {
        self.l2_missing.lock().retain(|m| m.guid != guid);
        let mut l2 = self.evictions.l2.write();
        let i = l2.iter().position(|d| d.guid == guid)?;
        Some(l2.remove(i))
    }

    pub fn note_missing_l2(&self, st: L2Stats) {
        let mut m = self.l2_missing.lock();
        m.retain(|x| x.guid != st.guid);
        m.push(st);
    }

    /// A block from a cache device (verified against its record's hash).
    pub fn l2_get(&self, key: &Key) -> Option<Block> {
        let l2 = self.evictions.l2.read();
        if l2.is_empty() {
            return None;
        }
        let got = l2.iter().find(|d| d.contains(key)).and_then(|d| d.get(key));
        if got.is_none() {
            self.l2_misses.fetch_add(1, Ordering::Relaxed);
        }
        got.map(Block::from)
    }

    /// Every cache device, open ones first (`pool status`'s cache section).
    pub fn l2_status(&self) -> Vec<L2Stats> {
        let mut v: Vec<L2Stats> = self.evictions.l2.read().iter().map(|d| d.stats()).collect();
        v.extend(self.l2_missing.lock().iter().cloned());
        v
    }

    pub fn stats(&self) -> ArcStats {
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let l2 = self.l2_status();
        ArcStats {
            l2_hits: l2.iter().map(|d| d.hits).sum(),
            l2_misses: l(&self.l2_misses),
            l2_checksum_errors: l2.iter().map(|d| d.checksum_errors).sum(),
            l2_size: l2.iter().map(|d| d.size).sum(),
            l2_write_bytes: l2.iter().map(|d| d.write_bytes).sum(),
            hits: l(&self.hits),
            misses: l(&self.misses),
            prefetch_reads: l(&self.prefetch_reads),
            prefetch_cached: l(&self.prefetch_cached),
            prefetch_dropped: l(&self.prefetch_dropped),
            prefetch_streams: l(&self.prefetch_streams),
            evictions: l(&self.evictions.count),
            size: self.size(),
            target: self.target(),
            min: self.min,
            max: self.max,
            shrinks: l(&self.shrinks),
            entries: self.cache.len() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_block_is_handed_back_only_when_nobody_else_holds_it() {
        let c = BlockCache::new(0, 1 << 20);
        // A reader still holds the bytes: the txg gets them to copy, never to change.
        c.insert((1, 1, 0, 1, 0), Arc::new(vec![1u8; 16384]));
        let reader = c.get(&(1, 1, 0, 1, 0)).unwrap();
        let taken = c.take(&(1, 1, 0, 1, 0)).unwrap();
        assert!(!c.contains(&(1, 1, 0, 1, 0)), "taken out of the ARC");
        let back = taken.into_vec().expect_err("shared with a reader");
        assert!(back.iter().chain(reader.iter()).all(|&b| b == 1));
        drop(back);
        // Now the reader is the only holder: it may have it (it is no ARC entry).
        assert!(reader.into_vec().is_ok());
        // Nobody else: the buffer itself comes back.
        let v = Arc::new(vec![2u8; 16384]);
        let at = v.as_ptr();
        c.insert((1, 1, 1, 1, 0), v);
        let buf = c.take(&(1, 1, 1, 1, 0)).unwrap().into_vec().unwrap();
        assert_eq!(buf.as_ptr(), at, "the ARC's own buffer, not a copy");
        assert!(c.get(&(1, 1, 1, 1, 0)).is_none());
        assert_eq!(c.stats().entries, 0);
        assert!(c.take(&(1, 1, 1, 1, 0)).is_none());
        // A device read's slab buffer is never handed out.
        if let Some(mut b) = vdev::BlockBuf::new(16384) {
            b.fill(3);
            c.insert((1, 1, 2, 1, 0), b);
            assert!(c.take(&(1, 1, 2, 1, 0)).unwrap().into_vec().is_err());
        }
    }

    #[test]
    fn stays_within_its_bound() {
        let c = BlockCache::new(0, 100_000);
        for i in 0..100 {
            c.insert((1, 1, i, 1, 0), Arc::new(vec![0; 4096]));
        }
        assert!(c.size() <= 100_000, "{}", c.size());
        assert!(c.get(&(1, 1, 99, 1, 0)).is_some());
        // The first blocks enter the empty hot queue (quick_cache admits
        // there while it fills) and may stay: some later ones must be gone.
        let gone = (0..100).filter(|&i| !c.contains(&(1, 1, i, 1, 0))).count();
        assert!(gone >= 70, "{gone} of 100 blocks evicted");
        assert!(c.stats().evictions > 0);
    }

    #[test]
    fn a_scan_does_not_evict_the_working_set() {
        let c = BlockCache::new(0, 4 << 20);
        let block = || Arc::new(vec![1u8; 16384]);
        // Working set: 64 blocks (1 MiB), read several times.
        for _ in 0..3 {
            for i in 0..64 {
                if c.get(&(1, 1, i, 1, 0)).is_none() {
                    c.insert((1, 1, i, 1, 0), block());
                }
            }
        }
        // A one-pass scan of 16 MiB (4x the cache), interleaved with the working set.
        let hits_before = c.stats().hits;
        let mut ws_reads = 0u64;
        for s in 0..1024u64 {
            c.insert((1, 2, s, 1, 0), block());
            if s % 16 == 0 {
                for i in 0..64 {
                    ws_reads += 1;
                    if c.get(&(1, 1, i, 1, 0)).is_none() {
                        c.insert((1, 1, i, 1, 0), block());
                    }
                }
            }
        }
        let hits = c.stats().hits - hits_before;
        assert!(
            hits * 100 >= ws_reads * 90,
            "working-set hit rate {hits}/{ws_reads} during a scan"
        );
    }

    #[test]
    fn shrinks_to_the_target_and_grows_back() {
        let c = BlockCache::new(1 << 20, 8 << 20);
        for i in 0..512 {
            c.insert((1, 1, i, 1, 0), Arc::new(vec![0; 16384]));
        }
        assert!(c.size() > 4 << 20);
        c.set_target(0);
        assert_eq!(c.target(), 1 << 20, "not below min");
        assert!(c.size() <= 1 << 20, "{}", c.size());
        assert_eq!(c.stats().shrinks, 1);
        c.set_target(u64::MAX);
        assert_eq!(c.target(), 8 << 20, "not above max");
        for i in 0..512 {
            c.insert((1, 1, i, 1, 0), Arc::new(vec![0; 16384]));
        }
        assert!(c.size() > 4 << 20, "grew back");
    }

    #[test]
    fn a_different_checksum_is_a_different_block() {
        let c = BlockCache::new(0, 1 << 20);
        c.insert((1, 1, 0, 5, 111), Arc::new(vec![1; 16]));
        assert!(c.get(&(1, 1, 0, 5, 222)).is_none());
        assert_eq!(c.get(&(1, 1, 0, 5, 111)).unwrap()[0], 1);
    }

    #[test]
    fn a_prefetched_scan_does_not_evict_the_working_set() {
        let c = BlockCache::new(0, 8 << 20);
        let block = || Arc::new(vec![1u8; 16384]);
        let ws = 128u64; // 2 MiB, read three times: hot
        for _ in 0..3 {
            for i in 0..ws {
                if c.get(&(1, 1, i, 1, 0)).is_none() {
                    c.insert((1, 1, i, 1, 0), block());
                }
            }
        }
        // A one-pass scan of 64 MiB (8x the cache), each block read ahead
        // and then read once by its demand read, as prefetch does it.
        let hits_before = c.stats().hits;
        let mut ws_reads = 0u64;
        let ahead = 64u64;
        for s in 0..4096u64 + ahead {
            if s < 4096 {
                c.insert_prefetched((1, 2, s, 1, 0), block());
            }
            if s >= ahead {
                assert!(
                    c.get(&(1, 2, s - ahead, 1, 0)).is_some(),
                    "prefetched block {} was evicted before its read",
                    s - ahead
                );
            }
            if s % 32 == 0 {
                for i in 0..ws {
                    ws_reads += 1;
                    if c.get(&(1, 1, i, 1, 0)).is_none() {
                        c.insert((1, 1, i, 1, 0), block());
                    }
                }
            }
        }
        let hits = c.stats().hits - hits_before - 4096;
        assert!(
            hits * 100 >= ws_reads * 95,
            "working-set hit rate {hits}/{ws_reads} during a prefetched scan"
        );
    }

    #[test]
    fn a_block_in_flight_is_claimed_once() {
        let c = Arc::new(BlockCache::new(0, 1 << 20));
        let key = (1, 1, 7, 1, 0);
        let Claim::Mine(mine) = c.claim(key) else {
            panic!("the first claim is the caller's")
        };
        let Claim::Theirs(loading) = c.claim(key) else {
            panic!("a second claim waits for the first")
        };
        assert!(!loading.wait(Duration::from_millis(10)), "still loading");
        let waiter = {
            let c = c.clone();
            std::thread::spawn(move || {
                let done = loading.wait(Duration::from_secs(10));
                (done, c.get_uncounted(&key).map(|d| d[0]))
            })
        };
        c.insert(key, Arc::new(vec![9; 16]));
        drop(mine);
        assert_eq!(waiter.join().unwrap(), (true, Some(9)));
        // Released: the next miss claims it again (a failed read is retried).
        assert!(matches!(c.claim(key), Claim::Mine(_)));
    }

    #[test]
    fn a_second_insert_keeps_the_first_entry() {
        let c = BlockCache::new(0, 1 << 20);
        c.insert_prefetched((1, 1, 0, 5, 111), Arc::new(vec![1; 16]));
        c.insert((1, 1, 0, 5, 111), Arc::new(vec![1; 16]));
        assert_eq!(c.stats().entries, 1);
        assert_eq!(c.get(&(1, 1, 0, 5, 111)).unwrap()[0], 1);
    }
}
