//! Idempotent producers (KIP-98 without transactions): producer ids, and per partition the
//! producer's epoch, its last sequence and where its last five batches went, so a retried
//! batch is answered with its original offset instead of being written twice.
//!
//! Kafka sequences count records (a batch of n records advances the next expected sequence by
//! n), which the node's own producer rule (one sequence per append) cannot express, so the
//! state lives here, in memory. After a restart a producer is unknown and its next batch is
//! accepted at whatever sequence it carries: a retry that straddles a restart can be written
//! twice (docs/kafka.md).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use kafka_protocol::ResponseError;
use pico_common::clock::SharedClock;

/// Batches remembered per producer and partition (Kafka's max.in.flight for idempotence).
const RECENT: usize = 5;
/// Producer states kept before idle ones are dropped.
const MAX_STATES: usize = 100_000;
/// A producer partition state unused this long may be dropped when the table is full.
const IDLE_MS: i64 = 15 * 60 * 1000;

/// One producer's state on one partition.
#[derive(Debug, Default)]
pub struct PartitionState {
    epoch: Option<i16>,
    last_seq: i32,
    /// (base sequence, last sequence, base offset) of the latest batches.
    recent: VecDeque<(i32, i32, u64)>,
    last_used_ms: i64,
}

/// What to do with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    Append,
    /// Already written at this base offset.
    Duplicate(u64),
    Refuse(ResponseError),
}

impl PartitionState {
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
        if let Some(&(_, _, offset)) = self
            .recent
            .iter()
            .find(|&&(b, l, _)| b == base_seq && l == last)
        {
            return Check::Duplicate(offset);
        }
        if base_seq == next_seq(self.last_seq) {
            Check::Append
        } else if self.recent.iter().any(|&(b, _, _)| b > base_seq) {
            // Older than the batches still remembered: written long ago.
            Check::Refuse(ResponseError::DuplicateSequenceNumber)
        } else {
            Check::Refuse(ResponseError::OutOfOrderSequenceNumber)
        }
    }

    pub fn accept(&mut self, epoch: i16, base_seq: i32, count: i32, base_offset: u64, now: i64) {
        if self.epoch != Some(epoch) {
            self.recent.clear();
        }
        self.epoch = Some(epoch);
        let last = last_seq(base_seq, count);
        self.last_seq = last;
        self.recent.push_back((base_seq, last, base_offset));
        while self.recent.len() > RECENT {
            self.recent.pop_front();
        }
        self.last_used_ms = now;
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
    next_id: AtomicI64,
    states: std::sync::Mutex<HashMap<Key, Arc<tokio::sync::Mutex<PartitionState>>>>,
}

impl Producers {
    pub fn new(clock: SharedClock) -> Producers {
        // Ids from the clock (1000 a millisecond): unique across restarts without storage.
        let start = clock.now_ms().max(1).saturating_mul(1000);
        Producers {
            clock,
            next_id: AtomicI64::new(start),
            states: Default::default(),
        }
    }

    /// A fresh producer id at epoch 0.
    pub fn allocate(&self) -> (i64, i16) {
        let floor = self.clock.now_ms().max(1).saturating_mul(1000);
        let id = self
            .next_id
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.max(floor) + 1)
            })
            .unwrap_or(floor);
        (id.max(floor), 0)
    }

    /// The state of `producer` on `stream`; hold its lock across check, append and accept.
    pub fn state(&self, producer: i64, stream: &str) -> Arc<tokio::sync::Mutex<PartitionState>> {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        if states.len() >= MAX_STATES {
            let now = self.clock.now_ms();
            states.retain(|_, s| {
                Arc::strong_count(s) > 1
                    || s.try_lock()
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn sequences_wrap() {
        assert_eq!(last_seq(i32::MAX, 1), i32::MAX);
        assert_eq!(last_seq(i32::MAX, 2), 0);
        assert_eq!(next_seq(i32::MAX), 0);
    }
}
