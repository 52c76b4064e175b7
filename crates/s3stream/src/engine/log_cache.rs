//! Log cache: recent durable batches of open streams, served to readers without storage IO.
//!
//! Invariants:
//! - Only durable data enters (the WAL writer inserts after the WAL write returned).
//! - Not-yet-uploaded batches are never evicted: until committed they exist nowhere readable.
//! - Uploaded batches are evicted oldest-uploaded first once their total exceeds the budget;
//!   per stream they always form a prefix of its deque because uploads go in offset order.
//! - Each batch is charged its payload plus a fixed bookkeeping overhead (`CachedBatch::cost`),
//!   on insert and on every removal, so the budget bounds real memory for tiny batches too.
//! - A stream's log belongs to one open generation; re-open replaces it, so batches of an old
//!   epoch never mix with the new epoch's offsets.

use std::collections::VecDeque;

use bytes::Bytes;

use super::IdMap;
use crate::format::StoredBatch;

#[derive(Debug)]
struct CachedBatch {
    base_offset: u64,
    record_count: u32,
    data: Bytes,
    uploaded: bool,
}

impl CachedBatch {
    /// Bytes charged for this batch in `total_bytes` and `uploaded_bytes`.
    fn cost(&self) -> usize {
        self.data.len() + BATCH_OVERHEAD_BYTES
    }

    fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }
}

#[derive(Debug, Default)]
struct StreamLog {
    gen_id: u64,
    batches: VecDeque<CachedBatch>,
}

/// Eviction order entry: (stream, generation, base_offset).
type FifoEntry = (u64, u64, u64);

/// Fixed bookkeeping of one cached batch: its slot in the stream's deque and three FIFO slots
/// (`compact_fifo` lets the FIFO reach twice the uploaded batches plus 64 before compacting).
const BATCH_OVERHEAD_BYTES: usize = size_of::<CachedBatch>() + 3 * size_of::<FifoEntry>();

#[derive(Debug)]
pub(crate) struct LogCache {
    logs: IdMap<StreamLog>,
    fifo: VecDeque<FifoEntry>,
    uploaded_budget: usize,
    total_bytes: usize,
    uploaded_bytes: usize,
    uploaded_batches: usize,
}

impl LogCache {
    pub(crate) fn new(uploaded_budget: usize) -> LogCache {
        LogCache {
            logs: IdMap::default(),
            fifo: VecDeque::new(),
            uploaded_budget,
            total_bytes: 0,
            uploaded_bytes: 0,
            uploaded_batches: 0,
        }
    }

    pub(crate) fn total_bytes(&self) -> usize {
        self.total_bytes
    }

    pub(crate) fn uploaded_bytes(&self) -> usize {
        self.uploaded_bytes
    }

    /// Starts an empty log for a new open generation, dropping the previous one.
    pub(crate) fn reset(&mut self, stream: u64, gen_id: u64) {
        self.remove(stream);
        self.logs.insert(
            stream,
            StreamLog {
                gen_id,
                batches: VecDeque::new(),
            },
        );
    }

    pub(crate) fn remove(&mut self, stream: u64) {
        if let Some(log) = self.logs.remove(&stream) {
            for b in &log.batches {
                self.total_bytes -= b.cost();
                if b.uploaded {
                    self.uploaded_bytes -= b.cost();
                    self.uploaded_batches -= 1;
                }
            }
        }
        self.compact_fifo();
    }

    /// Appends a durable batch; ignored unless `gen_id` is the stream's current generation.
    pub(crate) fn insert(
        &mut self,
        stream: u64,
        gen_id: u64,
        base_offset: u64,
        record_count: u32,
        data: Bytes,
    ) {
        let Some(log) = self.logs.get_mut(&stream) else {
            return;
        };
        if log.gen_id != gen_id {
            return;
        }
        let batch = CachedBatch {
            base_offset,
            record_count,
            data,
            uploaded: false,
        };
        self.total_bytes += batch.cost();
        log.batches.push_back(batch);
    }

    /// Marks batches in [start, end) of generation `gen_id` as uploaded (evictable).
    pub(crate) fn mark_uploaded(&mut self, stream: u64, gen_id: u64, start: u64, end: u64) {
        let Some(log) = self.logs.get_mut(&stream) else {
            return;
        };
        if log.gen_id != gen_id {
            return;
        }
        // Batches are in offset order: start at `start` instead of walking the uploaded prefix
        // still cached (up to the whole cache for a stream of small appends, on every call).
        let from = log.batches.partition_point(|b| b.base_offset < start);
        for b in log.batches.range_mut(from..) {
            if b.base_offset >= end {
                break;
            }
            if !b.uploaded {
                b.uploaded = true;
                self.uploaded_bytes += b.cost();
                self.uploaded_batches += 1;
                self.fifo.push_back((stream, gen_id, b.base_offset));
            }
        }
        self.evict();
    }

    /// Drops batches in [start, end) of generation `gen_id` (their commit was rejected).
    pub(crate) fn drop_range(&mut self, stream: u64, gen_id: u64, start: u64, end: u64) {
        let Some(log) = self.logs.get_mut(&stream) else {
            return;
        };
        if log.gen_id != gen_id {
            return;
        }
        let (mut total, mut up, mut up_n) = (0, 0, 0);
        log.batches.retain(|b| {
            let inside = b.base_offset >= start && b.base_offset < end;
            if inside {
                total += b.cost();
                if b.uploaded {
                    up += b.cost();
                    up_n += 1;
                }
            }
            !inside
        });
        self.total_bytes -= total;
        self.uploaded_bytes -= up;
        self.uploaded_batches -= up_n;
    }

    fn evict(&mut self) {
        while self.uploaded_bytes > self.uploaded_budget {
            let Some((stream, gen_id, base)) = self.fifo.pop_front() else {
                break;
            };
            let Some(log) = self.logs.get_mut(&stream) else {
                continue;
            };
            if log.gen_id != gen_id {
                continue;
            }
            if let Some(front) = log.batches.front()
                && front.uploaded
                && front.base_offset == base
            {
                let len = front.cost();
                log.batches.pop_front();
                self.total_bytes -= len;
                self.uploaded_bytes -= len;
                self.uploaded_batches -= 1;
            }
        }
        self.compact_fifo();
    }

    /// Stale FIFO entries (removed streams) are dropped once they dominate, bounding the FIFO
    /// by the number of cached uploaded batches.
    fn compact_fifo(&mut self) {
        if self.fifo.len() > 2 * self.uploaded_batches + 64 {
            let logs = &self.logs;
            // A binary search per entry: a linear one made this quadratic in a stream's cached
            // batches (hundreds of thousands for small appends) under the state lock.
            self.fifo.retain(|(s, g, base)| {
                logs.get(s).is_some_and(|l| {
                    // An empty batch (a close) may share its base offset with the next one.
                    let i = l.batches.partition_point(|b| b.base_offset < *base);
                    l.gen_id == *g
                        && l.batches
                            .range(i..)
                            .take_while(|b| b.base_offset == *base)
                            .any(|b| b.uploaded)
                })
            });
        }
    }

    /// Copies batches from the one containing `from` on, until `max_bytes` (at least one).
    /// Returns the offset after the last batch added, or None if the cache does not reach
    /// back to `from` for this stream.
    pub(crate) fn read(
        &self,
        stream: u64,
        from: u64,
        max_bytes: usize,
        out: &mut Vec<StoredBatch>,
        bytes: &mut usize,
    ) -> Option<u64> {
        let log = self.logs.get(&stream)?;
        let first = log.batches.front()?;
        if first.base_offset > from {
            return None;
        }
        let idx = log.batches.partition_point(|b| b.next_offset() <= from);
        let mut cur = from;
        for b in log.batches.range(idx..) {
            if !out.is_empty() && *bytes >= max_bytes {
                break;
            }
            if b.base_offset > cur {
                // A hole (a dropped range): only contiguous data, and nothing for a read that
                // starts inside it (the batches after it will be dropped too).
                break;
            }
            out.push(StoredBatch {
                base_offset: b.base_offset,
                record_count: b.record_count,
                data: b.data.clone(),
            });
            *bytes += b.data.len();
            cur = b.next_offset();
        }
        Some(cur)
    }

    #[cfg(test)]
    fn batch_count(&self, stream: u64) -> usize {
        self.logs.get(&stream).map_or(0, |l| l.batches.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Bytes {
        Bytes::from(vec![1u8; n])
    }

    /// Bytes charged for a batch of `n` payload bytes.
    fn cost(n: usize) -> usize {
        n + BATCH_OVERHEAD_BYTES
    }

    #[test]
    fn unuploaded_data_is_never_evicted_and_uploaded_is_bounded() {
        let mut c = LogCache::new(2 * cost(100) + cost(100) / 2);
        c.reset(1, 1);
        for i in 0..10 {
            c.insert(1, 1, i * 2, 2, data(100));
        }
        c.mark_uploaded(1, 0, 0, 100); // wrong generation: ignored
        assert_eq!(c.uploaded_bytes(), 0);
        assert_eq!(c.total_bytes(), 10 * cost(100));
        c.mark_uploaded(1, 1, 0, 10); // batches 0..5 uploaded
        assert_eq!(c.uploaded_bytes(), 2 * cost(100));
        assert_eq!(c.batch_count(1), 7, "3 oldest uploaded batches evicted");
        // Reads before the cached range miss; reads inside hit from the containing batch.
        let (mut out, mut bytes) = (Vec::new(), 0);
        assert_eq!(c.read(1, 0, 1000, &mut out, &mut bytes), None);
        assert_eq!(c.read(1, 7, 250, &mut out, &mut bytes), Some(12));
        assert_eq!(
            out.iter().map(|b| b.base_offset).collect::<Vec<_>>(),
            vec![6, 8, 10]
        );
    }

    /// A dropped range leaves a hole: reads stop before it, and a read starting inside it gets
    /// nothing (the batches after it are doomed too), never the batch after the hole.
    #[test]
    fn reads_never_cross_a_dropped_range() {
        let mut c = LogCache::new(usize::MAX);
        c.reset(1, 1);
        for i in 0..3 {
            c.insert(1, 1, i * 5, 5, data(10));
        }
        c.drop_range(1, 1, 5, 10);
        let (mut out, mut bytes) = (Vec::new(), 0);
        assert_eq!(c.read(1, 3, 1000, &mut out, &mut bytes), Some(5));
        assert_eq!(out.len(), 1);
        let (mut out, mut bytes) = (Vec::new(), 0);
        assert_eq!(c.read(1, 7, 1000, &mut out, &mut bytes), Some(7));
        assert!(
            out.is_empty(),
            "{:?}",
            out.iter().map(|b| b.base_offset).collect::<Vec<_>>()
        );
    }

    #[test]
    fn uploads_mark_only_their_range_and_compaction_keeps_live_entries() {
        let n = 20_000u64;
        let mut c = LogCache::new(usize::MAX);
        c.reset(1, 1);
        for i in 0..n {
            c.insert(1, 1, i, 1, data(10));
        }
        // An empty batch (a close) shares its base offset with the next batch.
        c.insert(1, 1, n, 0, data(3));
        c.insert(1, 1, n, 1, data(10));
        // Uploads go in offset order; each marks only [start, end), and once.
        c.mark_uploaded(1, 1, 0, 100);
        c.mark_uploaded(1, 1, 100, 200);
        c.mark_uploaded(1, 1, 150, 300);
        assert_eq!(c.uploaded_bytes(), 300 * cost(10));
        c.mark_uploaded(1, 1, 300, n + 1);
        assert_eq!(c.uploaded_bytes(), (n as usize + 1) * cost(10) + cost(3));
        // Many closed streams leave stale FIFO entries; compaction must drop those and keep
        // every entry of the live stream, so eviction still reaches its batches.
        for s in 2..200u64 {
            c.reset(s, 1);
            for i in 0..200 {
                c.insert(s, 1, i, 1, data(1));
            }
            c.mark_uploaded(s, 1, 0, 200);
        }
        for s in 2..200u64 {
            c.remove(s);
        }
        assert!(c.fifo.len() <= 2 * c.uploaded_batches + 64);
        assert_eq!(c.uploaded_batches, n as usize + 2);
        c.uploaded_budget = 0;
        c.evict();
        assert_eq!(
            c.batch_count(1),
            0,
            "every uploaded batch of the live stream evictable"
        );
        assert_eq!((c.total_bytes(), c.uploaded_bytes()), (0, 0));
    }

    #[test]
    fn reset_and_drop_range_keep_accounting_exact() {
        let mut c = LogCache::new(10_000);
        c.reset(1, 1);
        c.reset(2, 5);
        c.insert(1, 1, 0, 1, data(10));
        c.insert(1, 1, 1, 1, data(10));
        c.insert(2, 5, 0, 1, data(7));
        c.insert(2, 4, 1, 1, data(7)); // stale generation: ignored
        c.mark_uploaded(1, 1, 0, 1);
        assert_eq!(
            (c.total_bytes(), c.uploaded_bytes()),
            (2 * cost(10) + cost(7), cost(10))
        );
        c.drop_range(1, 1, 1, 2);
        assert_eq!(c.total_bytes(), cost(10) + cost(7));
        c.reset(1, 2);
        assert_eq!((c.total_bytes(), c.uploaded_bytes()), (cost(7), 0));
        c.remove(2);
        assert_eq!(c.total_bytes(), 0);
    }

    /// Tiny batches: the budget bounds payload and bookkeeping together, not payload alone
    /// (which let 10 B batches take several times the configured memory).
    #[test]
    fn tiny_batches_are_charged_their_bookkeeping() {
        let budget = 1 << 20;
        let mut c = LogCache::new(budget);
        let n = 100_000u64;
        for s in 1..=2 {
            c.reset(s, 1);
        }
        for i in 0..n {
            let s = 1 + i % 2;
            c.insert(s, 1, i / 2, 1, data(10));
            c.mark_uploaded(s, 1, i / 2, i / 2 + 1);
        }
        c.remove(2);
        assert!(c.uploaded_bytes() <= budget);
        let held: Vec<&CachedBatch> = c.logs.values().flat_map(|l| &l.batches).collect();
        let charged: usize = held.iter().map(|b| b.cost()).sum();
        assert_eq!((c.total_bytes(), c.uploaded_bytes()), (charged, charged));
        assert_eq!(c.uploaded_batches, held.len());
        // At least the payload, the deque slot and one FIFO slot are real memory.
        let floor = 10 + size_of::<CachedBatch>() + size_of::<FifoEntry>();
        assert!(
            held.len() <= budget / floor,
            "{} batches of at least {floor} B in a {budget} B budget",
            held.len()
        );
        assert!(c.fifo.len() <= 2 * c.uploaded_batches + 64);
    }
}
