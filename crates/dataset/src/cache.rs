//! A bounded cache of decompressed, verified blocks, keyed by
//! (dataset, object, block, birth txg): a block version never changes, so an entry
//! can never be stale. Eviction is first-in first-out.

use parking_lot::Mutex;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub type Key = (u64, u64, u64, u64);

pub struct BlockCache {
    limit: usize,
    inner: Mutex<Inner>,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
}

struct Inner {
    map: HashMap<Key, Arc<Vec<u8>>>,
    order: VecDeque<Key>,
    bytes: usize,
}

impl BlockCache {
    pub fn new(limit: usize) -> Self {
        BlockCache {
            limit,
            inner: Mutex::new(Inner {
                map: HashMap::new(),
                order: VecDeque::new(),
                bytes: 0,
            }),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    pub fn get(&self, key: &Key) -> Option<Arc<Vec<u8>>> {
        let got = self.inner.lock().map.get(key).cloned();
        let counter = if got.is_some() {
            &self.hits
        } else {
            &self.misses
        };
        counter.fetch_add(1, Ordering::Relaxed);
        got
    }

    pub fn insert(&self, key: Key, data: Arc<Vec<u8>>) {
        if data.len() > self.limit {
            return;
        }
        let mut inner = self.inner.lock();
        if inner.map.contains_key(&key) {
            return;
        }
        inner.bytes += data.len();
        inner.map.insert(key, data);
        inner.order.push_back(key);
        while inner.bytes > self.limit {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some(d) = inner.map.remove(&old) {
                inner.bytes -= d.len();
            }
        }
    }

    /// Drops every entry of a dataset (it was destroyed).
    pub fn forget_dataset(&self, dataset: u64) {
        let mut inner = self.inner.lock();
        inner.map.retain(|k, _| k.0 != dataset);
        let Inner { map, order, bytes } = &mut *inner;
        order.retain(|k| map.contains_key(k));
        *bytes = map.values().map(|d| d.len()).sum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stays_within_its_bound() {
        let c = BlockCache::new(10_000);
        for i in 0..100 {
            c.insert((1, 1, i, 1), Arc::new(vec![0; 4096]));
        }
        assert!(c.inner.lock().bytes <= 10_000);
        assert!(c.get(&(1, 1, 99, 1)).is_some());
        assert!(c.get(&(1, 1, 0, 1)).is_none());
    }
}
