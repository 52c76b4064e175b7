//! Block cache: object slices fetched from storage, LRU by bytes.
//!
//! A block is exactly one committed slice `(key, position, len)`; the uploader bounds slices to
//! about `SLICE_TARGET_BYTES`, so one block is one bounded range GET. Objects are immutable, so
//! a cached block never goes stale; it is only evicted.
//!
//! Each block is charged its payload plus its bookkeeping (`block_cost`), so the capacity bounds
//! real memory even for tiny blocks, whose bookkeeping would otherwise be most of it.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;

type BlockKey = (String, u64, u64);

/// Fixed bookkeeping of one block: its slots in `blocks` and in `lru` (the key's `String` header
/// is in both), plus 32 B for hash-table and B-tree slack and the key copies' allocator headers.
const BLOCK_OVERHEAD_BYTES: usize =
    size_of::<(BlockKey, (Bytes, u64))>() + size_of::<(u64, BlockKey)>() + 32;

/// Bytes charged for a block: payload, the key string twice (map key and LRU entry), overhead.
fn block_cost(key: &str, data_len: usize) -> usize {
    data_len + 2 * key.len() + BLOCK_OVERHEAD_BYTES
}

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

    /// Bytes charged for the cached blocks, bookkeeping included.
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

    /// Whether a block of `len` bytes would be kept: one bigger than a quarter of the cache
    /// would flush everything else out.
    pub(crate) fn admits(&self, key: &str, len: u64) -> bool {
        usize::try_from(len).is_ok_and(|len| block_cost(key, len) <= self.capacity / 4)
    }

    pub(crate) fn insert(&mut self, key: &str, position: u64, len: u64, data: Bytes) {
        if !self.admits(key, data.len() as u64) {
            return;
        }
        let cost = block_cost(key, data.len());
        let k = (key.to_string(), position, len);
        if self.blocks.contains_key(&k) {
            return;
        }
        self.tick += 1;
        self.bytes += cost;
        self.lru.insert(self.tick, k.clone());
        self.blocks.insert(k, (data, self.tick));
        while self.bytes > self.capacity {
            let Some((_, victim)) = self.lru.pop_first() else {
                break;
            };
            if let Some((d, _)) = self.blocks.remove(&victim) {
                self.bytes -= block_cost(&victim.0, d.len());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_eviction_by_bytes() {
        let cap = 4 * block_cost("a", 100);
        let mut c = BlockCache::new(cap);
        c.insert("a", 0, 100, Bytes::from(vec![0; 100]));
        c.insert("b", 0, 100, Bytes::from(vec![0; 100]));
        c.insert("c", 0, 100, Bytes::from(vec![0; 100]));
        assert!(c.get("a", 0, 100).is_some()); // a is now most recent
        c.insert("d", 0, 100, Bytes::from(vec![0; 100]));
        c.insert("e", 0, 100, Bytes::from(vec![0; 100]));
        assert_eq!(c.bytes(), cap);
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

    /// Tiny blocks: the capacity bounds payload and bookkeeping together, not payload alone
    /// (which let 100 B blocks take 2-4x the configured memory).
    #[test]
    fn tiny_blocks_are_charged_their_bookkeeping() {
        let cap = 1 << 20;
        let mut c = BlockCache::new(cap);
        let data = Bytes::from(vec![0; 100]);
        for i in 0..100_000u64 {
            let key = format!("data/0/0/{i:032}");
            assert_eq!(key.len(), 41);
            c.insert(&key, 0, 100, data.clone());
        }
        assert!(c.bytes() <= cap);
        let charged: usize = c
            .blocks
            .iter()
            .map(|(k, (d, _))| block_cost(&k.0, d.len()))
            .sum();
        assert_eq!(c.bytes(), charged, "accounting matches the entries held");
        assert_eq!(c.lru.len(), c.blocks.len());
        // At least the payload, both key copies and the two map slots are real memory.
        let floor =
            100 + 2 * 41 + size_of::<(BlockKey, (Bytes, u64))>() + size_of::<(u64, BlockKey)>();
        assert!(
            c.blocks.len() <= cap / floor,
            "{} blocks of at least {floor} B in a {cap} B cache",
            c.blocks.len()
        );
        // Eviction still keeps the most recent blocks.
        assert!(c.get(&format!("data/0/0/{:032}", 99_999), 0, 100).is_some());
    }
}
