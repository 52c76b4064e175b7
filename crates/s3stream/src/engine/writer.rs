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

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::wal::{WalError, WalRecord};

use super::{Appended, DurableEntry, EngineError, IdMap, QueuedRecord, Shared, WriteItem};

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

/// The hand-off for an async WAL with no batch interval (Postgres): the writer's queue and
/// the right to write from it, which an append takes when nobody holds it.
///
/// An append whose writer is idle writes its group itself, in the appending request's task
/// ([`Lead`]), instead of waking the writer task and being woken back by it: no task hand-off
/// before the WAL statement is sent nor after its answer arrives. Everything else stays the
/// writer's: the group is every append queued (all streams), one write at a time, acks in
/// queue order. The writer task ([`run_led`]) writes what no leader takes: appends that find a
/// write under way, and whatever a leader leaves queued when its own append is done.
pub(super) struct Leader {
    /// The queue, behind the right to write: whoever holds it is the writer.
    core: Arc<tokio::sync::Mutex<Core>>,
    /// Wakes the writer task: an append is queued that its own task may not write.
    wake: tokio::sync::Notify,
}

struct Core {
    rx: mpsc::UnboundedReceiver<WriteItem>,
    carry: Option<WriteItem>,
}

impl Core {
    fn has_queued(&self) -> bool {
        self.carry.is_some() || !self.rx.is_empty()
    }
}

impl Leader {
    pub(super) fn new(rx: mpsc::UnboundedReceiver<WriteItem>) -> Arc<Leader> {
        Arc::new(Leader {
            core: Arc::new(tokio::sync::Mutex::new(Core { rx, carry: None })),
            wake: tokio::sync::Notify::new(),
        })
    }

    /// Has the writer task write whatever is queued.
    pub(super) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Gives the right to write back; the writer task takes over what is still queued.
    fn release(&self, core: tokio::sync::OwnedMutexGuard<Core>) {
        let more = core.has_queued();
        drop(core);
        if more {
            self.wake.notify_one();
        }
    }
}

/// Takes and writes one group (if anything is queued), then hands the right to write back.
/// `None` once the queue is closed or the engine stopped.
async fn write_group(
    shared: Arc<Shared>,
    mut core: tokio::sync::OwnedMutexGuard<Core>,
) -> Option<tokio::sync::OwnedMutexGuard<Core>> {
    let first = match core.carry.take() {
        Some(item) => item,
        None => match core.rx.try_recv() {
            Ok(item) => item,
            Err(mpsc::error::TryRecvError::Empty) => return Some(core),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
        },
    };
    let Core { rx, carry } = &mut *core;
    let batch = take_queued(first, rx, shared.cfg.max_bytes_in_batch, carry);
    let group = begin(&shared, batch)?;
    let mut result = Err(EngineError::Durability(String::new()));
    if !group.items.is_empty() {
        for attempt in 0..WAL_ATTEMPTS {
            let started = std::time::Instant::now();
            let outcome = shared.wal.append(group.records.clone()).await;
            let Some(backoff) = attempted(&shared, outcome, started, attempt, &mut result) else {
                break;
            };
            tokio::time::sleep(backoff).await;
        }
    }
    finish(&shared, group, result);
    Some(core)
}

type GroupWrite =
    std::pin::Pin<Box<dyn Future<Output = Option<tokio::sync::OwnedMutexGuard<Core>>> + Send>>;

/// The writer task beside the leaders: writes whatever is queued whenever woken, until the
/// queue is empty, then gives the right to write back.
pub(super) async fn run_led(shared: Arc<Shared>, leader: Arc<Leader>) {
    loop {
        leader.wake.notified().await;
        let mut core = leader.core.clone().lock_owned().await;
        while core.has_queued() {
            match write_group(shared.clone(), core).await {
                Some(c) => core = c,
                None => return,
            }
        }
        leader.release(core);
    }
}

/// An append's way to its ack under a [`Leader`]: first try to write its own group, else
/// wait for the writer task. Held by its [`super::PendingAppend`].
pub(super) struct Lead {
    shared: Arc<Shared>,
    leader: Arc<Leader>,
    /// The group write this append leads, under way.
    write: Option<GroupWrite>,
    /// Answered, or left to the writer task: nothing more to lead.
    done: bool,
}

impl Lead {
    pub(super) fn new(shared: Arc<Shared>, leader: Arc<Leader>) -> Lead {
        Lead {
            shared,
            leader,
            write: None,
            done: false,
        }
    }
}

impl std::fmt::Debug for Lead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lead")
            .field("writing", &self.write.is_some())
            .field("done", &self.done)
            .finish()
    }
}

impl Drop for Lead {
    /// A write under way finishes in a task of its own (a group dropped half-written would
    /// leave its appends neither acked nor failed and the WAL's position unsure); an append
    /// that never led leaves its item to the writer task.
    fn drop(&mut self) {
        match self.write.take() {
            Some(write) => {
                let leader = self.leader.clone();
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        if let Some(core) = write.await {
                            leader.release(core);
                        }
                    });
                }
            }
            None if !self.done => self.leader.wake.notify_one(),
            None => {}
        }
    }
}

type Answer = Result<Appended, EngineError>;

fn answered(r: Result<Answer, oneshot::error::TryRecvError>) -> Option<Answer> {
    match r {
        Ok(answer) => Some(answer),
        Err(oneshot::error::TryRecvError::Closed) => Some(Err(EngineError::ShuttingDown)),
        Err(oneshot::error::TryRecvError::Empty) => None,
    }
}

/// Polls an append's ack, leading its group's write when the writer is free. While this task
/// may still write the ack itself, the ack is only checked, with no waker registered: this
/// very task's ack would wake it, and it would be polled once more for nothing.
pub(super) fn poll_ack(
    ack: &mut oneshot::Receiver<Answer>,
    lead: &mut Option<Lead>,
    cx: &mut std::task::Context<'_>,
) -> std::task::Poll<Answer> {
    use std::task::Poll;
    if let Some(l) = lead.as_mut().filter(|l| !l.done) {
        loop {
            if let Some(write) = l.write.as_mut() {
                let Poll::Ready(core) = write.as_mut().poll(cx) else {
                    return Poll::Pending;
                };
                l.write = None;
                // `None`: the engine stopped, and this append's ack was dropped (below).
                if let Some(core) = core {
                    if let Some(answer) = answered(ack.try_recv()) {
                        l.done = true;
                        l.leader.release(core);
                        return Poll::Ready(answer);
                    }
                    // Not in that group (its bytes were bounded): the next one.
                    if core.has_queued() {
                        l.write = Some(Box::pin(write_group(l.shared.clone(), core)));
                        continue;
                    }
                    l.leader.release(core);
                }
                break;
            }
            if let Some(answer) = answered(ack.try_recv()) {
                l.done = true;
                return Poll::Ready(answer);
            }
            match l.leader.core.clone().try_lock_owned() {
                Ok(core) => l.write = Some(Box::pin(write_group(l.shared.clone(), core))),
                Err(_) => break,
            }
        }
        // A write is under way elsewhere: the writer task writes this append after it (the
        // holder may also take it, or give the queue back with it still in).
        l.done = true;
        l.leader.wake.notify_one();
    }
    std::pin::Pin::new(ack)
        .poll(cx)
        .map(|r| r.unwrap_or(Err(EngineError::ShuttingDown)))
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
    let mut hook_at: IdMap<usize> = IdMap::default();
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

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::sync::Arc;
    use std::task::Poll;
    use std::time::Duration;

    use bytes::Bytes;

    use super::super::{AppendRequest, Engine, PendingAppend};
    use crate::testing::FaultWal;

    async fn start() -> (Engine, Arc<FaultWal>) {
        let (engine, wal) = super::super::tests::start(Duration::ZERO).await;
        assert!(
            engine.shared().leader.get().is_some(),
            "a leader-style writer"
        );
        engine.open(1, 1, 0);
        (engine, wal)
    }

    async fn append(engine: &Engine) -> PendingAppend {
        super::super::tests::append(engine, 1).await
    }

    /// Polls once: `true` if it answered.
    async fn poll_once(p: &mut PendingAppend) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *p).poll(cx).is_ready()))
            .await
    }

    async fn durable(engine: &Engine, end: u64) {
        tokio::time::timeout(Duration::from_secs(10), async {
            while engine.durable_end(1) < Some(end) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("durable in time");
    }

    #[tokio::test]
    async fn the_first_append_leads_and_later_ones_follow_in_order() {
        let (engine, wal) = start().await;
        wal.hold_appends(true);
        let mut a = append(&engine).await;
        assert!(!poll_once(&mut a).await, "a leads its write, held");
        let mut b = append(&engine).await;
        let c = append(&engine).await;
        assert!(!poll_once(&mut b).await, "b finds a write under way");
        wal.hold_appends(false);
        let (a, b, c) = (a.await.unwrap(), b.await.unwrap(), c.await.unwrap());
        assert_eq!(
            [a.base_offset, b.base_offset, c.base_offset],
            [0, 1, 2],
            "acks in order"
        );
        assert_eq!(wal.append_count(), 2, "a alone, then b and c in one group");
    }

    #[tokio::test]
    async fn a_dropped_leader_still_finishes_its_write() {
        let (engine, wal) = start().await;
        wal.hold_appends(true);
        let mut a = append(&engine).await;
        assert!(!poll_once(&mut a).await);
        drop(a);
        wal.hold_appends(false);
        durable(&engine, 1).await;
        let b = append(&engine).await.await.unwrap();
        assert_eq!(b.base_offset, 1);
        assert_eq!(wal.record_count(), 2);
    }

    #[tokio::test]
    async fn appends_nobody_polls_are_written_by_the_writer_task() {
        let (engine, wal) = start().await;
        // Dropped unpolled: the writer task takes it.
        drop(append(&engine).await);
        durable(&engine, 1).await;
        // Held unpolled across a flush: the flush has it written.
        let held = append(&engine).await;
        tokio::time::timeout(Duration::from_secs(10), engine.flush())
            .await
            .expect("flush in time")
            .unwrap();
        assert_eq!(engine.durable_end(1), Some(2));
        assert_eq!(held.await.unwrap().base_offset, 1);
        assert_eq!(wal.record_count(), 2);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_appenders_all_get_their_acks() {
        let (engine, wal) = start().await;
        let mut tasks = Vec::new();
        for s in 2..10u64 {
            engine.open(s, 1, 0);
            let engine = engine.clone();
            tasks.push(tokio::spawn(async move {
                let mut last = None;
                for _ in 0..50 {
                    let req = AppendRequest {
                        stream: s,
                        epoch: 1,
                        record_count: 1,
                        batch: Bytes::from_static(b"record"),
                        batch_crc: None,
                        aux: Bytes::new(),
                    };
                    let ack = engine.append(req).await.unwrap().await.unwrap();
                    assert!(last.is_none_or(|l| ack.base_offset == l + 1));
                    last = Some(ack.base_offset);
                }
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(30), t)
                .await
                .expect("all acked in time")
                .unwrap();
        }
        assert_eq!(wal.record_count(), 8 * 50);
    }
}
