//! The WAL writer: one for the whole node. A task for an async WAL; a thread of its own for a
//! WAL that appends synchronously (`Wal::blocking`: the local file), so the thread that syncs a
//! group also acknowledges it and no task is woken in between.
//!
//! Invariants:
//! - Group commit: every append waiting in the queue (all streams) goes into one `Wal::append`,
//!   bounded by `batch_interval` and `max_bytes_in_batch`.
//! - Acks are sent in queue order, only after the WAL write returned; the log cache, durable
//!   ends and the upload queue are updated before the acks and then the durable hook run.
//! - A failed write (after retries) fails every append in it and every later append of the same
//!   open generation still queued, and marks those streams broken: nothing is ever acked after a
//!   hole.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::wal::{WalError, WalRecord};

use super::{Appended, DurableEntry, EngineError, QueuedRecord, Shared, WriteItem};

/// Attempts per WAL write before the appends in it fail.
const WAL_ATTEMPTS: u32 = 4;
const WAL_BACKOFF: Duration = Duration::from_millis(10);

fn item_bytes(item: &WriteItem) -> usize {
    item.rec.batch.len() + item.rec.aux.len()
}

/// Takes `first` and whatever else is queued (no waiting) into one group of at most
/// `max_bytes`; an item that would pass the bound is left in `carry` for the next group.
fn take_queued(
    first: WriteItem,
    rx: &mut mpsc::UnboundedReceiver<WriteItem>,
    max_bytes: usize,
    carry: &mut Option<WriteItem>,
) -> Vec<WriteItem> {
    let mut bytes = item_bytes(&first);
    let mut batch = vec![first];
    while bytes < max_bytes {
        let Ok(next) = rx.try_recv() else { break };
        let n = item_bytes(&next);
        if bytes + n > max_bytes {
            *carry = Some(next);
            break;
        }
        bytes += n;
        batch.push(next);
    }
    batch
}

/// The writer as a task, for WALs that append asynchronously (objects, Postgres).
pub(super) async fn run(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<WriteItem>) {
    let max_bytes = shared.cfg.max_bytes_in_batch;
    let interval = shared.cfg.batch_interval;
    let mut carry: Option<WriteItem> = None;
    loop {
        let first = match carry.take() {
            Some(item) => item,
            None => match rx.recv().await {
                Some(item) => item,
                None => return,
            },
        };
        let batch = if interval.is_zero() {
            take_queued(first, &mut rx, max_bytes, &mut carry)
        } else {
            let mut bytes = item_bytes(&first);
            let mut batch = vec![first];
            let deadline = Instant::now() + interval;
            while bytes < max_bytes {
                let Ok(Some(next)) = tokio::time::timeout_at(deadline, rx.recv()).await else {
                    break;
                };
                let n = item_bytes(&next);
                if bytes + n > max_bytes {
                    carry = Some(next);
                    break;
                }
                bytes += n;
                batch.push(next);
            }
            batch
        };
        let Some(group) = begin(&shared, batch) else {
            return;
        };
        let mut result = Err(EngineError::Durability(String::new()));
        if !group.items.is_empty() {
            for attempt in 0..WAL_ATTEMPTS {
                let started = std::time::Instant::now();
                let outcome = shared.wal.append(group.records.clone()).await;
                let Some(backoff) = attempted(&shared, outcome, started, attempt, &mut result)
                else {
                    break;
                };
                tokio::time::sleep(backoff).await;
            }
        }
        finish(&shared, group, result);
    }
}

/// The writer on a thread of its own, for a WAL that appends synchronously (the local file):
/// each group is written, synced and acknowledged here, so a group costs one wake of this
/// thread and the acks' wakes of the waiting requests, with no task in between. Ends when the
/// queue's sender is dropped or the engine stopped (abort, shutdown).
pub(super) fn run_on_thread(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<WriteItem>) {
    let max_bytes = shared.cfg.max_bytes_in_batch;
    let mut carry: Option<WriteItem> = None;
    loop {
        let first = match carry.take() {
            Some(item) => item,
            None => match rx.blocking_recv() {
                Some(item) => item,
                None => return,
            },
        };
        let batch = take_queued(first, &mut rx, max_bytes, &mut carry);
        let Some(group) = begin(&shared, batch) else {
            return;
        };
        let mut result = Err(EngineError::Durability(String::new()));
        if let Some(wal) = shared.wal.blocking()
            && !group.items.is_empty()
        {
            for attempt in 0..WAL_ATTEMPTS {
                let started = std::time::Instant::now();
                let outcome = wal.append_sync(&group.records);
                let Some(backoff) = attempted(&shared, outcome, started, attempt, &mut result)
                else {
                    break;
                };
                // This thread only writes: nothing else waits on it meanwhile.
                std::thread::sleep(backoff);
            }
        }
        finish(&shared, group, result);
    }
}

/// A group about to be written: `items` and their `records`, in queue order.
struct Group {
    max_seq: u64,
    items: Vec<WriteItem>,
    records: Vec<WalRecord>,
}

/// Fails the appends queued behind a failed write of their generation and returns the rest;
/// `None` once the engine stopped (abort, shutdown): nothing more is written, as after a crash.
fn begin(shared: &Shared, batch: Vec<WriteItem>) -> Option<Group> {
    let max_seq = batch.iter().map(|i| i.seq).max().unwrap_or(0);
    let (doomed, items): (Vec<_>, Vec<_>) = {
        let st = shared.state();
        if st.stopped {
            return None;
        }
        batch
            .into_iter()
            .partition(|i| st.failed_gens.contains(&i.gen_id))
    };
    if !doomed.is_empty() {
        fail_items(
            shared,
            doomed,
            &EngineError::Durability("an earlier write of this stream failed".into()),
        );
    }
    let records: Vec<_> = items.iter().map(|i| i.rec.clone()).collect();
    if !items.is_empty() {
        let t = &shared.timings;
        t.group_appends.record(items.len() as f64);
        t.group_bytes
            .record(items.iter().map(item_bytes).sum::<usize>() as f64);
    }
    Some(Group {
        max_seq,
        items,
        records,
    })
}

/// Accounts one WAL write attempt, puts its outcome in `result`, and returns the backoff
/// before the next attempt, or `None` when there is none to make.
fn attempted(
    shared: &Shared,
    outcome: Result<u64, WalError>,
    started: std::time::Instant,
    attempt: u32,
    result: &mut Result<u64, EngineError>,
) -> Option<Duration> {
    match outcome {
        Ok(pos) => {
            shared.timings.commit.record(started.elapsed());
            *result = Ok(pos);
            None
        }
        Err(e) => {
            shared
                .counters
                .wal_write_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(attempt, error = %e, "wal write failed");
            // A newer incarnation owns the WAL: no retry can succeed.
            if let WalError::Fenced(m) = e {
                *result = Err(EngineError::WalFenced(m));
                return None;
            }
            *result = Err(EngineError::Durability(e.to_string()));
            (attempt + 1 < WAL_ATTEMPTS).then(|| WAL_BACKOFF * 4u32.pow(attempt))
        }
    }
}

/// Acks (or fails) the group's appends after its write, then records the writer's progress.
fn finish(shared: &Shared, group: Group, result: Result<u64, EngineError>) {
    let Group { max_seq, items, .. } = group;
    if !items.is_empty() {
        match result {
            Ok(pos) => {
                shared.counters.wal_writes.fetch_add(1, Ordering::Relaxed);
                complete_items(shared, pos, items);
            }
            Err(e) => {
                tracing::error!(error = %e, appends = items.len(), "wal write failed, failing appends");
                fail_items(shared, items, &e);
            }
        }
    }
    {
        let mut st = shared.state();
        if st.enqueued_seq <= max_seq {
            // Queue drained: no appends of a failed generation can still be waiting.
            st.failed_gens.clear();
        }
    }
    shared.progress.send_modify(|p| {
        p.written_seq = p.written_seq.max(max_seq);
    });
}

fn complete_items(shared: &Shared, pos: u64, items: Vec<WriteItem>) {
    let mut hooks: Vec<(u64, u64)> = Vec::new();
    let mut hook_at: HashMap<u64, usize> = HashMap::new();
    let mut acks = Vec::with_capacity(items.len());
    let mut records = Vec::with_capacity(items.len());
    let over_threshold;
    {
        let mut st = shared.state();
        for item in items {
            let rec = item.rec;
            let next = rec.next_offset();
            // A stream broken meanwhile (a failed write, or the catalog rejected one of its
            // ranges) can never commit this range after the hole: no ack, and no reader sees it.
            let current = st
                .streams
                .get(&rec.stream)
                .is_some_and(|s| s.gen_id == item.gen_id && !s.broken);
            if current && let Some(s) = st.streams.get_mut(&rec.stream) {
                s.durable_end = next;
                st.cache.insert(
                    rec.stream,
                    item.gen_id,
                    rec.base_offset,
                    rec.record_count,
                    rec.batch.clone(),
                );
                // Indexed, not searched: a group can hold appends to thousands of streams, and
                // this runs under the state lock every append and read takes.
                match hook_at.get(&rec.stream).and_then(|&i| hooks.get_mut(i)) {
                    Some(h) => h.1 = next,
                    None => {
                        hook_at.insert(rec.stream, hooks.len());
                        hooks.push((rec.stream, next));
                    }
                }
            }
            st.unuploaded_bytes += rec.batch.len() + rec.aux.len();
            st.unplanned_bytes += rec.batch.len() + rec.aux.len();
            // The stream was re-opened, forgotten or broken while this write was in flight: its
            // data can no longer be committed under this generation's epoch, so no ack.
            acks.push((
                item.ack,
                if current {
                    Ok(Appended {
                        base_offset: rec.base_offset,
                        next_offset: next,
                    })
                } else {
                    Err(EngineError::Broken { stream: rec.stream })
                },
            ));
            records.push(QueuedRecord {
                gen_id: item.gen_id,
                cost: item.cost,
                rec,
            });
        }
        st.push_durable(DurableEntry { pos, records });
        st.durable_pos = Some(pos);
        over_threshold = st.unplanned_bytes >= shared.cfg.upload_threshold_bytes;
    }
    // Acks first: the durable hook may wake thousands of readers (SSE fan-out), and an ack
    // queued behind them would wait for the whole fan-out. Readers need no ordering with the
    // ack: the durable ends they read were updated above.
    for (ack, result) in acks {
        let _ = ack.send(result);
    }
    for (stream, end) in hooks {
        (shared.on_durable)(stream, end);
    }
    if over_threshold {
        shared.upload_check.notify_one();
    }
}

/// Fails `items` with `error` (a `Durability` or `WalFenced`).
fn fail_items(shared: &Shared, items: Vec<WriteItem>, error: &EngineError) {
    let mut cost = 0u64;
    {
        let mut st = shared.state();
        for item in &items {
            cost += u64::from(item.cost);
            st.failed_gens.insert(item.gen_id);
            if let Some(s) = st.streams.get_mut(&item.rec.stream)
                && s.gen_id == item.gen_id
            {
                s.broken = true;
            }
        }
    }
    shared.release_space(cost);
    for item in items {
        let e = match error {
            EngineError::WalFenced(m) => EngineError::WalFenced(m.clone()),
            EngineError::Durability(m) => EngineError::Durability(m.clone()),
            other => EngineError::Durability(other.to_string()),
        };
        let _ = item.ack.send(Err(e));
    }
}
