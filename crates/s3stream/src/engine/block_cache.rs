//! Block cache: object slices fetched from storage, LRU by bytes.
//!
//! A block is exactly one committed slice `(key, position, len)`; the uploader bounds slices to
//! about `SLICE_TARGET_BYTES`, so one block is one bounded range GET. Objects are immutable, so
//! a cached block never goes stale; it is only evicted.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

type BlockKey = (String, u64, u64);

#[derive(Debug)]
pub(crate) struct BlockCache {
    capacity: usize,
    bytes: usize,
    tick: u64,
    blocks: HashMap<BlockKey, (Bytes, u64)>,
    lru: BTreeMap<u64, BlockKey>,
    pub(crate) hits: u64,
    pub(crate) misses: u64,
}

impl BlockCache {
    pub(crate) fn new(capacity: usize) -> BlockCache {
        BlockCache {
            capacity,
            bytes: 0,
            tick: 0,
            blocks: HashMap::new(),
            lru: BTreeMap::new(),
            hits: 0,
            misses: 0,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    pub(crate) fn get(&mut self, key: &str, position: u64, len: u64) -> Option<Bytes> {
        let k = (key.to_string(), position, len);
        self.tick += 1;
        let tick = self.tick;
        match self.blocks.get_mut(&k) {
            Some((data, t)) => {
                self.lru.remove(t);
                *t = tick;
                self.lru.insert(tick, k);
                self.hits += 1;
                Some(data.clone())
            }
            None => {
                self.misses += 1;
                None
            }
        }
    }

    pub(crate) fn insert(&mut self, key: &str, position: u64, len: u64, data: Bytes) {
        // A block bigger than a quarter of the cache would flush everything else out.
        if data.len() > self.capacity / 4 {
            return;
        }
        let k = (key.to_string(), position, len);
        if self.blocks.contains_key(&k) {
            return;
        }
        self.tick += 1;
        self.bytes += data.len();
        self.lru.insert(self.tick, k.clone());
        self.blocks.insert(k, (data, self.tick));
        while self.bytes > self.capacity {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            if let Some((d, _)) = self.blocks.remove(&victim) {
                self.bytes -= d.len();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_eviction_by_bytes() {
        let mut c = BlockCache::new(400);
        c.insert("a", 0, 100, Bytes::from(vec![0; 100]));
        c.insert("b", 0, 100, Bytes::from(vec![0; 100]));
        c.insert("c", 0, 100, Bytes::from(vec![0; 100]));
        assert!(c.get("a", 0, 100).is_some()); // a is now most recent
        c.insert("d", 0, 100, Bytes::from(vec![0; 100]));
        c.insert("e", 0, 100, Bytes::from(vec![0; 100]));
        assert!(c.bytes() <= 400);
        assert!(c.get("b", 0, 100).is_none(), "least recently used evicted");
        assert!(c.get("a", 0, 100).is_some());
        assert!(c.get("e", 0, 100).is_some());
        assert_eq!(
            c.get("a", 1, 100),
            None,
            "different range is a different block"
        );
        c.insert("big", 0, 200, Bytes::from(vec![0; 200]));
        assert!(
            c.get("big", 0, 200).is_none(),
            "oversized blocks are not cached"
        );
        assert_eq!((c.hits, c.misses), (3, 3));
    }
}
