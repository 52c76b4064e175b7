//! Idempotent producers (KIP-98 without transactions): producer ids, and per partition the
//! producer's epoch, its last sequence and where its last five batches went, so a retried
//! batch is answered with its original offset instead of being written twice.
//!
//! Kafka sequences count records (a batch of n records advances the next expected sequence by
//! n), which the node's own producer rule (one sequence per append) cannot express, so the
//! state is kept here, in memory, and rebuilt from the stream itself: a producer's batches are
//! stored as sent, with its id, epoch and base sequence in their headers. A producer this
//! process did not hand out (one from before a restart, or from another node before the
//! partition moved here) is looked up in the partition's latest batches ([`restore`]; the
//! scan is in `produce.rs`) before its first batch here is judged, so a retry that straddles a
//! restart is answered with its original offset.
//!
//! A connection pipelines its Produce requests, so a batch is judged and accepted here when it
//! is admitted (offsets assigned), before it is durable: the next one is judged against it.
//! Until its write is confirmed it is in flight: a retry of it waits for the outcome rather
//! than being answered as a duplicate of a write that may yet fail. If one fails, the state is
//! marked lost: the stream alone knows what landed (a write may fail to be acknowledged and
//! still be durable), so once nothing of the producer is in flight on the partition it is
//! looked up again, as after a restart, and retries of the failed batches are appended anew.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use kafka_protocol::ResponseError;
use pico_common::clock::SharedClock;
use tokio::sync::{Mutex, Notify};

/// Batches remembered per producer and partition (Kafka's max.in.flight for idempotence).
const RECENT: usize = 5;
/// Producer states kept before idle ones are dropped.
const MAX_STATES: usize = 100_000;
/// A producer partition state unused this long may be dropped when the table is full.
const IDLE_MS: i64 = 15 * 60 * 1000;

/// Low bits of a producer id that name the node that handed it out, so nodes of a cluster
/// never hand out the same id.
const NODE_BITS: u32 = 6;

/// One producer's state on one partition.
#[derive(Debug, Default)]
pub struct PartitionState {
    epoch: Option<i16>,
    last_seq: i32,
    /// The latest batches.
    recent: VecDeque<Sent>,
    last_used_ms: i64,
    /// Looked up in the stream already (or known to be new): not again.
    settled: bool,
    /// Admitted batches whose write has not answered yet.
    in_flight: usize,
    /// An admitted batch failed: this state may claim batches the stream does not hold.
    lost: bool,
}

/// One of the latest batches.
#[derive(Debug, Clone, Copy)]
struct Sent {
    base_seq: i32,
    last_seq: i32,
    base_offset: u64,
    /// Its write is confirmed (a retry may be answered with its offset).
    durable: bool,
}

/// A producer's state on a partition, and its waiters.
#[derive(Debug, Default)]
pub struct Slot {
    /// Held from a batch's check to its admission (a retry on another connection waits and
    /// then sees the first attempt).
    pub state: Mutex<PartitionState>,
    /// Signalled when an in-flight batch's write answers.
    pub moved: Notify,
}

impl Slot {
    /// The write of the batch admitted at `base_offset` answered: `durable`, or not.
    pub async fn landed(&self, base_offset: u64, durable: bool) {
        self.state.lock().await.landed(base_offset, durable);
        self.moved.notify_waiters();
    }
}

/// One of a producer's batches found in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredBatch {
    pub epoch: i16,
    pub base_seq: i32,
    pub count: i32,
    pub base_offset: u64,
}

/// The state a producer's batches found in a partition (in offset order) leave: the epoch and
/// last sequence of the latest, and the latest [`RECENT`] of that epoch for retries.
pub fn restore(found: &[StoredBatch], now_ms: i64) -> PartitionState {
    let mut s = PartitionState {
        settled: true,
        ..PartitionState::default()
    };
    for b in found {
        if s.epoch.is_some_and(|e| b.epoch < e) {
            continue; // an older epoch's batch cannot follow a newer one's; ignore it
        }
        s.accept(b.epoch, b.base_seq, b.count, b.base_offset, now_ms);
    }
    s
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Append,
    /// Already written at this base offset.
    Duplicate(u64),
    /// A retry of a batch still in flight: its outcome decides.
    Wait,
    Refuse(ResponseError),
}

impl PartitionState {
    /// Whether the stream must be searched for this producer's batches before judging one.
    pub fn needs_lookup(&self) -> bool {
        (!self.settled && self.epoch.is_none()) || self.lost
    }

    /// A batch failed: the stream must be searched, even for a producer this process handed
    /// out, once nothing is in flight.
    pub fn lost(&self) -> bool {
        self.lost
    }

    /// Lost, with batches still in flight: wait before searching (they may still land).
    pub fn must_wait(&self) -> bool {
        self.lost && self.in_flight > 0
    }

    /// Nothing to search for (a producer this process handed out, or already searched).
    pub fn settle(&mut self) {
        self.settled = true;
    }

    pub fn check(&self, epoch: i16, base_seq: i32, count: i32) -> Check {
        let Some(stored) = self.epoch else {
            return Check::Append;
        };
        if epoch < stored {
            return Check::Refuse(ResponseError::InvalidProducerEpoch);
        }
        if epoch > stored {
            return if base_seq == 0 {
                Check::Append
            } else {
                Check::Refuse(ResponseError::OutOfOrderSequenceNumber)
            };
        }
        let last = last_seq(base_seq, count);
        if let Some(sent) = self
            .recent
            .iter()
            .find(|s| s.base_seq == base_seq && s.last_seq == last)
        {
            return if sent.durable {
                Check::Duplicate(sent.base_offset)
            } else {
                Check::Wait
            };
        }
        if base_seq == next_seq(self.last_seq) {
            Check::Append
        } else if self.recent.iter().any(|s| s.base_seq > base_seq) {
            // Older than the batches still remembered: written long ago.
            Check::Refuse(ResponseError::DuplicateSequenceNumber)
        } else {
            Check::Refuse(ResponseError::OutOfOrderSequenceNumber)
        }
    }

    /// A batch known to be stored.
    pub fn accept(&mut self, epoch: i16, base_seq: i32, count: i32, base_offset: u64, now: i64) {
        self.push(epoch, base_seq, count, base_offset, true, now);
    }

    /// A batch admitted at `base_offset`, its write in flight: [`PartitionState::landed`]
    /// must follow.
    pub fn admit(&mut self, epoch: i16, base_seq: i32, count: i32, base_offset: u64, now: i64) {
        self.push(epoch, base_seq, count, base_offset, false, now);
        self.in_flight += 1;
    }

    /// The write of the batch admitted at `base_offset` answered.
    pub fn landed(&mut self, base_offset: u64, durable: bool) {
        self.in_flight = self.in_flight.saturating_sub(1);
        if !durable {
            self.lost = true;
        } else if let Some(s) = self
            .recent
            .iter_mut()
            .find(|s| s.base_offset == base_offset)
        {
            s.durable = true;
        }
    }

    /// Replaced by what the stream holds (a lookup); batches in flight are still counted.
    pub fn restore_from(&mut self, found: PartitionState) {
        let in_flight = self.in_flight;
        *self = found;
        self.in_flight = in_flight;
    }

    fn push(
        &mut self,
        epoch: i16,
        base_seq: i32,
        count: i32,
        base_offset: u64,
        durable: bool,
        now: i64,
    ) {
        if self.epoch != Some(epoch) {
            self.recent.clear();
        }
        self.epoch = Some(epoch);
        let last = last_seq(base_seq, count);
        self.last_seq = last;
        self.recent.push_back(Sent {
            base_seq,
            last_seq: last,
            base_offset,
            durable,
        });
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        self.last_used_ms = now;
        self.settled = true;
    }
}

/// Sequences wrap from i32::MAX to 0.
fn last_seq(base: i32, count: i32) -> i32 {
    let last = i64::from(base) + i64::from(count.max(1)) - 1;
    (last % (i64::from(i32::MAX) + 1)) as i32
}

fn next_seq(last: i32) -> i32 {
    if last == i32::MAX { 0 } else { last + 1 }
}

type Key = (i64, String);

/// Every producer's partition states, and the producer id allocator.
pub struct Producers {
    clock: SharedClock,
    /// This node's tag in the low bits of the ids it hands out.
    node_tag: i64,
    /// The counter when this process started: ids above it (with this node's tag) are ours.
    first: i64,
    /// The last counter value handed out.
    next_id: AtomicI64,
    states: std::sync::Mutex<HashMap<Key, Arc<Slot>>>,
}

impl Producers {
    pub fn new(clock: SharedClock, node_id: i32) -> Producers {
        // Ids from the clock (1000 a millisecond) and the node: unique across restarts and
        // nodes without storage.
        let start = counter_floor(clock.now_ms());
        Producers {
            clock,
            node_tag: i64::from(node_id) & ((1 << NODE_BITS) - 1),
            first: start,
            next_id: AtomicI64::new(start),
            states: Default::default(),
        }
    }

    /// A fresh producer id at epoch 0.
    pub fn allocate(&self) -> (i64, i16) {
        let floor = counter_floor(self.clock.now_ms());
        let prev = self
            .next_id
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.max(floor) + 1)
            })
            .unwrap_or(floor);
        let n = prev.max(floor) + 1;
        ((n << NODE_BITS) | self.node_tag, 0)
    }

    /// When `id` was handed out (ms, on the clock of the node that did), from the id itself;
    /// ids from elsewhere give nonsense, which only shortens or lengthens a bounded search.
    pub fn handed_out_ms(id: i64) -> i64 {
        (id >> NODE_BITS) / 1000
    }

    /// Whether this process handed out `id` (then nothing of it can be stored yet but what
    /// this process wrote, and the stream need not be searched).
    pub fn allocated_here(&self, id: i64) -> bool {
        let n = id >> NODE_BITS;
        id & ((1 << NODE_BITS) - 1) == self.node_tag
            && n > self.first
            && n <= self.next_id.load(Ordering::Relaxed)
    }

    /// The state of `producer` on `stream`; hold its lock across check, admission and accept.
    pub fn state(&self, producer: i64, stream: &str) -> Arc<Slot> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        if states.len() >= MAX_STATES {
            let now = self.clock.now_ms();
            states.retain(|_, s| {
                Arc::strong_count(s) > 1
                    || s.state
                        .try_lock()
                        .map_or(true, |s| now - s.last_used_ms < IDLE_MS)
            });
        }
        states
            .entry((producer, stream.to_string()))
            .or_default()
            .clone()
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }
}

/// The id counter's value at `now_ms`: 1000 ids a millisecond.
fn counter_floor(now_ms: i64) -> i64 {
    now_ms.clamp(1, i64::MAX >> (NODE_BITS + 10)) * 1000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_node_and_this_process_knows_its_own() {
        let clock = pico_common::clock::ManualClock::new(1_000);
        let a = Producers::new(clock.clone(), 1);
        let b = Producers::new(clock.clone(), 2);
        let (x, _) = a.allocate();
        let (y, _) = b.allocate();
        assert_ne!(x, y, "two nodes in the same millisecond");
        assert!(a.allocated_here(x) && !a.allocated_here(y));
        assert_eq!(Producers::handed_out_ms(x), 1_000);
        assert_eq!(Producers::handed_out_ms(y), 1_000);
        // The same node restarted: the id is from before, so its batches may be stored.
        let restarted = Producers::new(clock, 1);
        assert!(!restarted.allocated_here(x));
        let (z, _) = restarted.allocate();
        assert!(restarted.allocated_here(z));
    }

    #[test]
    fn state_is_restored_from_stored_batches() {
        let found = [
            StoredBatch {
                epoch: 0,
                base_seq: 0,
                count: 3,
                base_offset: 10,
            },
            StoredBatch {
                epoch: 0,
                base_seq: 3,
                count: 2,
                base_offset: 20,
            },
        ];
        let s = restore(&found, 0);
        assert!(!s.needs_lookup());
        assert_eq!(s.check(0, 3, 2), Check::Duplicate(20));
        assert_eq!(s.check(0, 0, 3), Check::Duplicate(10));
        assert_eq!(s.check(0, 5, 1), Check::Append);
        assert_eq!(
            s.check(0, 9, 1),
            Check::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
        // Nothing found: the next batch is accepted as it comes, and not searched for again.
        let s = restore(&[], 0);
        assert!(!s.needs_lookup());
        assert_eq!(s.check(0, 7, 1), Check::Append);
    }

    #[test]
    fn sequences_advance_by_record_count_and_retries_get_their_offset() {
        let mut s = PartitionState::default();
        assert_eq!(s.check(0, 0, 3), Check::Append);
        s.accept(0, 0, 3, 100, 0);
        assert_eq!(s.check(0, 3, 2), Check::Append);
        s.accept(0, 3, 2, 103, 0);
        assert_eq!(s.check(0, 0, 3), Check::Duplicate(100));
        assert_eq!(s.check(0, 3, 2), Check::Duplicate(103));
        assert_eq!(
            s.check(0, 7, 1),
            Check::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
        assert_eq!(
            s.check(-1, 5, 1),
            Check::Refuse(ResponseError::InvalidProducerEpoch)
        );
        // A new epoch starts at 0.
        assert_eq!(
            s.check(1, 5, 1),
            Check::Refuse(ResponseError::OutOfOrderSequenceNumber)
        );
        assert_eq!(s.check(1, 0, 1), Check::Append);
    }

    #[test]
    fn old_batches_beyond_the_window_are_duplicates() {
        let mut s = PartitionState::default();
        for i in 0..10 {
            s.accept(0, i, 1, i as u64, 0);
        }
        assert_eq!(
            s.check(0, 1, 1),
            Check::Refuse(ResponseError::DuplicateSequenceNumber)
        );
    }

    #[test]
    fn batches_in_flight_are_judged_against_and_a_failed_one_forces_a_lookup() {
        let mut s = PartitionState::default();
        s.settle();
        s.admit(0, 0, 3, 100, 0);
        s.admit(0, 3, 2, 103, 0);
        assert_eq!(s.check(0, 5, 1), Check::Append, "after the admitted ones");
        // A retry of a batch whose write has not answered waits for it.
        assert_eq!(s.check(0, 0, 3), Check::Wait);
        s.landed(100, true);
        assert_eq!(s.check(0, 0, 3), Check::Duplicate(100));
        assert_eq!(s.check(0, 3, 2), Check::Wait);
        s.admit(0, 5, 1, 105, 0);
        s.landed(103, false);
        // Lost: searched again, but only once the batch still in flight has answered.
        assert!(s.lost() && s.needs_lookup() && s.must_wait());
        s.landed(105, false);
        assert!(s.needs_lookup() && !s.must_wait());
        let found = StoredBatch {
            epoch: 0,
            base_seq: 0,
            count: 3,
            base_offset: 100,
        };
        s.restore_from(restore(&[found], 0));
        assert!(!s.needs_lookup() && !s.lost());
        assert_eq!(s.check(0, 0, 3), Check::Duplicate(100));
        assert_eq!(
            s.check(0, 3, 2),
            Check::Append,
            "the failed batch's retry is written again"
        );
    }

    #[test]
    fn sequences_wrap() {
        assert_eq!(last_seq(i32::MAX, 1), i32::MAX);
        assert_eq!(last_seq(i32::MAX, 2), 0);
        assert_eq!(next_seq(i32::MAX), 0);
    }
}
