//! Streams open on this node: the per-stream writer state that serializes the producer and
//! match-seq checks with offset assignment. Only streams with recent activity are here; idle ones
//! are released by the maintenance loop, so memory does not grow with the number of streams.

use crate::producers::{Placed, ProducerState};
use pico_metadata::ProducerMark;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio::sync::{Mutex, Notify, OnceCell};

/// One open stream.
pub struct OpenStream {
    pub stream_id: u64,
    pub epoch: i64,
    /// Held while checking and submitting an append (not while waiting for durability).
    pub writer: Mutex<Writer>,
    /// Last use (ms), for idle release.
    pub last_used_ms: AtomicI64,
    /// Signalled whenever a producer's state moves: appends that arrived ahead of their
    /// predecessors wait on it (bounded) instead of failing with a sequence gap.
    pub producers_moved: Notify,
}

/// Writer state: the in-flight view of producers and closure, ahead of the committed metadata.
#[derive(Default)]
pub struct Writer {
    pub producers: HashMap<String, ProducerState>,
    /// Closed by a client (appends rejected); `closed_by` is the producer claim that closed it,
    /// with the offsets of that request's records.
    pub closed: bool,
    pub closed_by: Option<ProducerMark>,
    /// Last accepted Durable Streams `Stream-Seq` (per stream, byte-wise lexicographic).
    pub stream_seq: Option<String>,
    /// An append failed to become durable: the stream must be reopened before more appends.
    pub broken: bool,
    /// The engine's next offset for this stream as this writer's last append left it (`None`:
    /// not read yet). Only appends under this writer move it (the engine refuses other epochs,
    /// and each open has its epoch), so an append decides on it without the engine's lock.
    pub next_offset: Option<u64>,
}

impl Writer {
    /// Records an accepted producer claim and where its append lies. The map is bounded like
    /// the committed one: producers silent for `PRODUCER_TTL_MS` are dropped whenever it grows
    /// past a power of two.
    pub fn accept_producer(&mut self, id: &str, epoch: u64, seq: u64, at: Placed, now_ms: i64) {
        use pico_metadata::state::{producer_live, producer_prune_due};
        let state = ProducerState {
            epoch,
            seq,
            at,
            last_ms: now_ms,
        };
        match self.producers.get_mut(id) {
            Some(p) => *p = state,
            None => {
                let before = self.producers.len();
                self.producers.insert(id.to_string(), state);
                if producer_prune_due(before, self.producers.len()) {
                    self.producers
                        .retain(|id, p| producer_live(id, p.last_ms, now_ms));
                }
            }
        }
    }
}

impl OpenStream {
    pub fn touch(&self, now_ms: i64) {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
    }
}

/// A slot's content: the open stream once opened, and how its last failed open ended.
#[derive(Default)]
pub struct OpenCell {
    cell: OnceCell<Arc<OpenStream>>,
    /// Failed opens of this cell (retryable ones) and the last one's answer: requests queued
    /// behind an open share its failure instead of each trying again in turn.
    failed: std::sync::Mutex<(u64, String)>,
}

/// A request's hold on a slot of the [`OpenTable`].
pub struct Slot<'a> {
    table: &'a OpenTable,
    stream_id: u64,
    cell: Arc<OpenCell>,
}

impl Slot<'_> {
    pub fn cell(&self) -> &OnceCell<Arc<OpenStream>> {
        &self.cell.cell
    }

    fn failed(&self) -> std::sync::MutexGuard<'_, (u64, String)> {
        self.cell.failed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Failed opens so far: taken before waiting for the cell, for [`Slot::failed_since`].
    pub fn failures(&self) -> u64 {
        self.failed().0
    }

    /// The answer of an open that failed after `seen` was taken (while this request waited
    /// for it to finish). During an outage (a full disk) an open can take seconds to fail,
    /// and requests queued on the cell trying again one after another each waited for all
    /// the failures before theirs: tens of seconds, a hang to the client.
    pub fn failed_since(&self, seen: u64) -> Option<String> {
        let f = self.failed();
        (f.0 > seen).then(|| f.1.clone())
    }

    pub fn record_failure(&self, message: &str) {
        let mut f = self.failed();
        f.0 += 1;
        f.1.clear();
        f.1.push_str(message);
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if !self.cell.cell.initialized() {
            self.table.remove_unused_cell(self.stream_id, &self.cell);
        }
    }
}

/// The table of open streams; a slot's `OnceCell` makes concurrent first requests share one open.
/// Keyed by stream id (assigned by the metadata log, never by a client), looked up on every
/// append: foldhash, not SipHash (≈ 0.25k instructions per lookup less).
#[derive(Default)]
pub struct OpenTable {
    slots: std::sync::Mutex<HashMap<u64, Arc<OpenCell>, foldhash::fast::RandomState>>,
}

impl OpenTable {
    /// The stream's slot, created empty if absent. Dropping the returned handle before the
    /// cell is filled (the open failed or its request was cancelled) removes the empty slot
    /// unless another request still waits on it.
    pub fn slot(&self, stream_id: u64) -> Slot<'_> {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        Slot {
            table: self,
            stream_id,
            cell: slots.entry(stream_id).or_default().clone(),
        }
    }

    pub fn get(&self, stream_id: u64) -> Option<Arc<OpenStream>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.get(&stream_id).and_then(|c| c.cell.get().cloned())
    }

    /// Removes the slot if it still holds exactly this open stream. Identity, not epoch: a slot
    /// whose open is still in progress belongs to someone else and must survive, or two opens
    /// of one stream could run at once.
    pub fn remove_open(&self, open: &Arc<OpenStream>) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots
            .get(&open.stream_id)
            .and_then(|c| c.cell.get())
            .is_some_and(|o| Arc::ptr_eq(o, open))
        {
            slots.remove(&open.stream_id);
        }
    }

    /// Removes the slot if it is still this cell, its open never completed, and nobody but the
    /// table and the caller holds it: an empty slot counts against `--slots`, and the idle pass
    /// only releases filled ones. A caller queued on the cell keeps it alive, so that caller
    /// retries on the same cell (never two opens at once).
    fn remove_unused_cell(&self, stream_id: u64, cell: &Arc<OpenCell>) {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        // New holders clone the cell only under this lock, so the count cannot grow meanwhile.
        if slots.get(&stream_id).is_some_and(|c| {
            Arc::ptr_eq(c, cell) && !c.cell.initialized() && Arc::strong_count(c) == 2
        }) {
            slots.remove(&stream_id);
        }
    }

    /// Drops the slot whatever it holds (the stream was deleted; a late open re-checks).
    pub fn remove_any(&self, stream_id: u64) {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&stream_id);
    }

    /// At most `max` open streams not used since `before_ms`, except those in `skip`. Bounded
    /// because the idle pass works in batches: cloning every idle stream under the lock held up
    /// every open meanwhile.
    pub fn idle(&self, before_ms: i64, max: usize, skip: &HashSet<u64>) -> Vec<Arc<OpenStream>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .values()
            .filter_map(|c| c.cell.get())
            .filter(|o| {
                o.last_used_ms.load(Ordering::Relaxed) < before_ms && !skip.contains(&o.stream_id)
            })
            .take(max)
            .cloned()
            .collect()
    }

    /// Whether an open of the stream is under way (its slot is not filled yet).
    pub fn opening(&self, stream_id: u64) -> bool {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots.get(&stream_id).is_some_and(|c| !c.cell.initialized())
    }

    pub fn all(&self) -> Vec<Arc<OpenStream>> {
        let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        slots
            .values()
            .filter_map(|c| c.cell.get())
            .cloned()
            .collect()
    }

    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::{OpenStream, OpenTable, Writer};
    use crate::producers::Placed;
    use pico_metadata::state::{PRODUCER_PRUNE_MIN, PRODUCER_TTL_MS};
    use std::collections::{HashMap, HashSet};
    use std::sync::Arc;
    use std::sync::atomic::AtomicI64;
    use std::time::Duration;
    use tokio::sync::Notify;

    #[test]
    fn an_unfilled_slot_goes_with_its_last_holder() {
        let table = OpenTable::default();
        let first = table.slot(7);
        let queued = table.slot(7);
        drop(first);
        assert_eq!(table.len(), 1, "a request still waits on the slot");
        drop(queued);
        assert_eq!(table.len(), 0, "a failed open left an empty slot");
    }

    #[tokio::test]
    async fn a_cancelled_open_leaves_no_slot_behind() {
        let table = OpenTable::default();
        let open = async {
            let slot = table.slot(7);
            slot.cell()
                .get_or_try_init(std::future::pending::<Result<Arc<OpenStream>, ()>>)
                .await
                .is_ok()
        };
        // Polled once (the open in flight), then dropped, as when its client goes away.
        assert!(tokio::time::timeout(Duration::ZERO, open).await.is_err());
        assert_eq!(table.len(), 0, "a cancelled open left an empty slot");
    }

    fn filled(table: &OpenTable, stream_id: u64, last_used_ms: i64) {
        let open = Arc::new(OpenStream {
            stream_id,
            epoch: 0,
            writer: tokio::sync::Mutex::new(Writer {
                producers: HashMap::new(),
                closed: false,
                closed_by: None,
                stream_seq: None,
                broken: false,
                next_offset: None,
            }),
            last_used_ms: AtomicI64::new(last_used_ms),
            producers_moved: Notify::new(),
        });
        assert!(table.slot(stream_id).cell().set(open).is_ok());
    }

    /// `idle` takes at most the batch it is asked for, passing over recent and skipped streams.
    #[test]
    fn idle_takes_a_bounded_batch() {
        let table = OpenTable::default();
        for id in 0..10 {
            filled(&table, id, 5);
        }
        filled(&table, 10, 50);
        assert_eq!(table.idle(10, 4, &HashSet::new()).len(), 4);
        let skip: HashSet<u64> = (0..8).collect();
        let mut left: Vec<u64> = table
            .idle(10, 100, &skip)
            .iter()
            .map(|o| o.stream_id)
            .collect();
        left.sort_unstable();
        assert_eq!(left, [8, 9], "recent and skipped streams taken");
    }

    const AT: Placed = Placed { start: 0, next: 1 };

    #[test]
    fn silent_producers_leave_the_writer_once_it_grows() {
        let mut w = Writer {
            producers: HashMap::new(),
            closed: false,
            closed_by: None,
            stream_seq: None,
            broken: false,
            next_offset: None,
        };
        for i in 0..PRODUCER_PRUNE_MIN - 3 {
            w.accept_producer(&format!("old{i}"), 0, 0, AT, 10);
        }
        // The server's own claim: as old, never forgotten.
        w.accept_producer("\u{0}initial", 0, 0, AT, 10);
        w.accept_producer("recent", 0, 0, AT, 10 + PRODUCER_TTL_MS - 1);
        w.accept_producer("recent", 0, 1, AT, 10 + PRODUCER_TTL_MS - 1);
        assert_eq!(w.producers.len(), PRODUCER_PRUNE_MIN - 1);
        w.accept_producer("new", 1, 0, AT, 10 + PRODUCER_TTL_MS);
        let mut left: Vec<&str> = w.producers.keys().map(String::as_str).collect();
        left.sort_unstable();
        assert_eq!(left, ["\u{0}initial", "new", "recent"]);
        assert_eq!(w.producers["recent"].seq, 1);
    }
}
