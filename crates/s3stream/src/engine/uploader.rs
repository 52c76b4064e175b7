//! The uploader: moves durable WAL data into objects and makes them visible.
//!
//! A cycle takes the oldest unplanned durable entries (WAL positions up to its P), packs them
//! into one stream-set object (plus one stream object per stream with >=
//! `stream_object_min_bytes`). Up to `upload_parallelism` cycles are planned ahead and their
//! objects PUT concurrently (at most `upload_parallelism` PUTs in flight), because a PUT's
//! latency, not its size, bounds one PUT at a time (tens of ms on S3, one disk sync on files).
//! Commits stay strictly ordered: the oldest cycle's objects are committed in order once their
//! PUTs finish, then the WAL is trimmed to its P, and only then is the next cycle committed.
//!
//! Invariants:
//! - The WAL is trimmed to P only after every record at positions <= P is committed or
//!   rejected for its stream; trims ascend. A committer fenced as a whole
//!   ([`CatalogError::Fenced`]) stops the uploader: this process trims and drops nothing more,
//!   as its WAL belongs to its recoverer from then on.
//! - Commits follow WAL order, whatever order the PUTs finish in: a stream's ranges reach the
//!   catalog in offset order.
//! - A commit error keeps the cycle (same keys, same bytes) and retries it: the data stays in
//!   the log cache and in the WAL meanwhile. A failed put is retried under the same key.
//! - A rejected range is dropped (never retried) and its stream marked broken if still open in
//!   the same generation: later data of it cannot be contiguous any more.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures::{StreamExt, stream};
use tokio::task::{self, JoinSet};
use tokio::time::Instant;

use super::{
    CatalogError, CommitRange, EngineError, ObjectCommit, RangeAux, SLICE_TARGET_BYTES, Shared,
};
use crate::format::{self, DATA_HEADER_LEN};
use crate::parts::{Parts, PartsWriter};
use crate::storage::StorageError;
use crate::wal::WalRecord;

/// One range of one stream within a planned object, with the generation it was appended in.
#[derive(Clone, Debug)]
pub(super) struct PlannedRange {
    pub(super) gen_id: u64,
    pub(super) range: CommitRange,
}

/// Where an object's PUT stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PutState {
    Waiting,
    /// A PUT task is writing it (the pipeline only).
    InFlight,
    /// Its last PUT failed; started again after the backoff (the pipeline only).
    Failed,
    Done,
}

#[derive(Debug)]
pub(super) struct PlannedObject {
    pub(super) key: String,
    pub(super) data: Parts,
    pub(super) ranges: Vec<PlannedRange>,
    pub(super) put: PutState,
    pub(super) outcome: Option<Vec<bool>>,
}

impl PlannedObject {
    pub(super) fn commit(&self) -> ObjectCommit {
        ObjectCommit {
            key: self.key.clone(),
            size: self.data.len() as u64,
            ranges: self.ranges.iter().map(|r| r.range.clone()).collect(),
        }
    }
}

/// Packs records (in WAL order) into objects. Pure apart from `next_key`.
pub(super) fn plan_objects(
    records: &[(u64, &WalRecord)],
    stream_object_min_bytes: usize,
    mut next_key: impl FnMut() -> String,
) -> Result<Vec<PlannedObject>, EngineError> {
    // Group per stream, streams in order of first appearance.
    let mut order: Vec<u64> = Vec::new();
    let mut per_stream: super::IdMap<Vec<(u64, &WalRecord)>> = super::IdMap::default();
    for (gen_id, rec) in records {
        per_stream
            .entry(rec.stream)
            .or_insert_with(|| {
                order.push(rec.stream);
                Vec::new()
            })
            .push((*gen_id, rec));
    }
    let mut groups: Vec<Vec<u64>> = Vec::new();
    let mut set: Vec<u64> = Vec::new();
    for s in order {
        let bytes: usize = per_stream[&s].iter().map(|(_, r)| r.batch.len()).sum();
        if bytes >= stream_object_min_bytes {
            groups.push(vec![s]);
        } else {
            set.push(s);
        }
    }
    if !set.is_empty() {
        groups.insert(0, set);
    }

    let mut objects = Vec::with_capacity(groups.len());
    for streams in groups {
        // Large batches are referenced, not copied (the object is written vectored); what is
        // copied is sized up front, so the buffer never grows by reallocating.
        let small = DATA_HEADER_LEN
            + streams
                .iter()
                .flat_map(|s| &per_stream[s])
                .map(|(_, r)| format::FRAME_HEADER_LEN + PartsWriter::copied(r.batch.len()))
                .sum::<usize>();
        let mut buf = PartsWriter::with_capacity(small);
        format::put_data_header(&mut buf);
        let mut ranges: Vec<PlannedRange> = Vec::new();
        for s in streams {
            let mut open: Option<PlannedRange> = None;
            for (gen_id, rec) in &per_stream[&s] {
                // A new range on epoch/generation change, offset gap, or when the slice is full.
                let continues = open.as_ref().is_some_and(|r| {
                    r.gen_id == *gen_id
                        && r.range.epoch == rec.epoch
                        && r.range.end_offset == rec.base_offset
                        && (r.range.len as usize) < SLICE_TARGET_BYTES
                });
                if !continues {
                    ranges.extend(open.take());
                    open = Some(PlannedRange {
                        gen_id: *gen_id,
                        range: CommitRange {
                            stream: s,
                            epoch: rec.epoch,
                            start_offset: rec.base_offset,
                            end_offset: rec.base_offset,
                            position: buf.len() as u64,
                            len: 0,
                            aux: Vec::new(),
                        },
                    });
                }
                let written = format::put_frame(
                    &mut buf,
                    rec.base_offset,
                    rec.record_count,
                    &rec.batch,
                    rec.batch_crc,
                )
                .map_err(|source| EngineError::Corrupt {
                    key: String::new(),
                    source,
                })?;
                if let Some(r) = open.as_mut() {
                    r.range.end_offset = rec.next_offset();
                    r.range.len += written as u64;
                    if !rec.aux.is_empty() {
                        r.range.aux.push(RangeAux {
                            base_offset: rec.base_offset,
                            next_offset: rec.next_offset(),
                            aux: rec.aux.clone(),
                        });
                    }
                }
            }
            ranges.extend(open.take());
        }
        debug_assert!(buf.len() > DATA_HEADER_LEN);
        objects.push(PlannedObject {
            key: next_key(),
            data: buf.finish(),
            ranges,
            put: PutState::Waiting,
            outcome: None,
        });
    }
    Ok(objects)
}

/// Slowest transfer a PUT is given time for on top of `upload_timeout`: a big object on a slow
/// but working store must finish rather than restart from byte 0 every `upload_timeout`.
const PUT_MIN_BYTES_PER_SEC: u64 = 1 << 20;

/// How long a PUT of `bytes` may take before it is given up and retried.
fn put_timeout(base: Duration, bytes: usize) -> Duration {
    base.saturating_add(Duration::from_secs(bytes as u64 / PUT_MIN_BYTES_PER_SEC))
}

/// One object's put, its time and (when it succeeds) its size reported to the metrics.
async fn timed_put(shared: &Shared, key: &str, data: Parts) -> Result<(), StorageError> {
    let bytes = data.len();
    let started = Instant::now();
    let limit = put_timeout(shared.cfg.upload_timeout, bytes);
    let r = match tokio::time::timeout(limit, shared.data.put_parts(key, data)).await {
        Ok(r) => r,
        Err(_) => Err(StorageError::Other(format!(
            "put not answered within {limit:?}: key=`{key}`"
        ))),
    };
    shared.timings.put_seconds.record(started.elapsed());
    if r.is_ok() {
        shared.timings.put_bytes.record(bytes as f64);
    }
    r
}

/// PUTs every object not yet written (at most `upload_parallelism` at once), then commits them
/// in order: recovery, before the pipeline starts. On Err the caller retries later with the
/// same objects; completed steps are remembered in the objects.
pub(super) async fn put_and_commit(
    shared: &Shared,
    objects: &mut [PlannedObject],
) -> Result<(), EngineError> {
    // The futures are collected first: an iterator adapter over `&PlannedObject` held across
    // the await would make this future's `Send` unprovable where it is nested in another
    // (failover's recovery runs it inside a maintenance pass).
    let todo: Vec<_> = objects
        .iter()
        .enumerate()
        .filter(|(_, o)| o.put != PutState::Done && o.outcome.is_none())
        .map(|(i, o)| (i, o.key.clone(), o.data.clone()))
        .collect();
    let mut futures = Vec::with_capacity(todo.len());
    for (i, key, data) in todo {
        futures.push(async move { (i, timed_put(shared, &key, data).await) });
    }
    let puts: Vec<(usize, Result<(), StorageError>)> = stream::iter(futures)
        .buffer_unordered(shared.cfg.upload_parallelism.max(1))
        .collect()
        .await;
    let mut failed = None;
    for (i, result) in puts {
        match result {
            Ok(()) => objects[i].put = PutState::Done,
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    if let Some(e) = failed {
        return Err(e.into());
    }
    for obj in objects.iter_mut() {
        if obj.outcome.is_none() {
            commit_object(shared, obj).await?;
        }
    }
    Ok(())
}

/// Commits one object whose PUT is done and applies the catalog's answer.
async fn commit_object(shared: &Shared, obj: &mut PlannedObject) -> Result<(), EngineError> {
    let limit = shared.cfg.upload_timeout;
    // Dropping a commit that may still land is safe: the retry of a landed commit finds its
    // key committed and answers what the catalog holds (`Catalog::commit`).
    let outcome = tokio::time::timeout(limit, shared.catalog.commit(obj.commit()))
        .await
        .map_err(|_| {
            EngineError::Upload(format!(
                "catalog commit not answered within {limit:?}: key=`{}`",
                obj.key
            ))
        })??;
    if outcome.len() != obj.ranges.len() {
        return Err(EngineError::Upload(format!(
            "catalog answered {} outcomes for {} ranges: key=`{}`",
            outcome.len(),
            obj.ranges.len(),
            obj.key
        )));
    }
    shared.counters.uploads.fetch_add(1, Ordering::Relaxed);
    apply_outcome(shared, obj, &outcome);
    obj.outcome = Some(outcome);
    Ok(())
}

/// Accepted ranges become evictable in the log cache; rejected ones are dropped.
fn apply_outcome(shared: &Shared, obj: &PlannedObject, outcome: &[bool]) {
    let mut st = shared.state();
    for (planned, accepted) in obj.ranges.iter().zip(outcome) {
        let r = &planned.range;
        if *accepted {
            st.cache
                .mark_uploaded(r.stream, planned.gen_id, r.start_offset, r.end_offset);
        } else {
            shared
                .counters
                .rejected_ranges
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                stream = r.stream,
                epoch = r.epoch,
                start = r.start_offset,
                end = r.end_offset,
                key = %obj.key,
                "catalog rejected range, dropping its data"
            );
            st.cache
                .drop_range(r.stream, planned.gen_id, r.start_offset, r.end_offset);
            if let Some(s) = st.streams.get_mut(&r.stream)
                && s.gen_id == planned.gen_id
            {
                s.broken = true;
            }
        }
    }
}

/// A planned cycle: the WAL entries after the previous cycle's `upto` up to its own, and their
/// objects.
struct Cycle {
    id: u64,
    upto: u64,
    objects: Vec<PlannedObject>,
    trimmed: bool,
}

/// What a PUT task reports back.
type PutResult = Result<(), StorageError>;

/// The uploader's own state: planned cycles in WAL order and the PUTs in flight.
struct Pipeline {
    shared: Arc<Shared>,
    cycles: VecDeque<Cycle>,
    next_cycle: u64,
    puts: JoinSet<PutResult>,
    /// Which object each PUT task writes: (cycle id, object index).
    put_tasks: HashMap<task::Id, (u64, usize)>,
    /// Failed PUTs start again at this time; the commits of objects already written go on.
    put_retry_at: Option<Instant>,
    /// Rounds of failed PUTs since one succeeded (sets the backoff).
    put_failures: u32,
}

pub(super) async fn run(shared: Arc<Shared>) {
    let interval = shared.cfg.upload_interval;
    let mut p = Pipeline {
        shared: shared.clone(),
        cycles: VecDeque::new(),
        next_cycle: 0,
        puts: JoinSet::new(),
        put_tasks: HashMap::new(),
        put_retry_at: None,
        put_failures: 0,
    };
    // `due`: the interval passed or someone asked (flush, close, backpressure), so plan
    // whatever is waiting, however small.
    let mut due = false;
    let mut tick = Instant::now() + interval;
    // Backoff of a failed commit or trim: nothing behind it can commit meanwhile.
    let mut failures: u32 = 0;
    let mut retry_at: Option<Instant> = None;
    loop {
        if retry_at.is_none_or(|t| t <= Instant::now()) {
            retry_at = None;
            match p.step(&mut due).await {
                Ok(progressed) => {
                    if progressed {
                        failures = 0;
                    }
                }
                Err(EngineError::Catalog(CatalogError::Fenced(why))) => {
                    // Nothing of the WAL may be trimmed or dropped by this process now, and
                    // retrying would only append refused commits to the metadata log.
                    tracing::error!(
                        error = %why,
                        "this node was fenced: uploads stop, the WAL is left for its recoverer"
                    );
                    shared.progress.send_modify(|p| p.fenced = true);
                    return;
                }
                Err(e) => {
                    failures = failures.saturating_add(1);
                    retry_at = Some(Instant::now() + backoff(&shared, failures));
                    record_failure(&shared, &e, failures);
                }
            }
        }
        let now = Instant::now();
        let put_retry = p.put_retry_at.filter(|t| *t > now);
        tokio::select! {
            Some(done) = p.puts.join_next_with_id(), if !p.puts.is_empty() => p.finish_put(done),
            _ = shared.upload_kick.notified() => due = true,
            _ = shared.upload_check.notified() => {}
            _ = tokio::time::sleep_until(tick) => {
                due = true;
                tick = Instant::now() + interval;
            }
            _ = tokio::time::sleep_until(retry_at.unwrap_or(now)), if retry_at.is_some() => {}
            _ = tokio::time::sleep_until(put_retry.unwrap_or(now)), if put_retry.is_some() => {}
        }
    }
}

fn backoff(shared: &Shared, failures: u32) -> Duration {
    Duration::from_millis(20 * 2u64.pow(failures.min(6)))
        .min(shared.cfg.upload_interval.max(Duration::from_millis(20)))
}

/// One failed attempt, as `flush` counts them: a failed commit or trim, or a round of failed
/// PUTs (those failing together while a retry is pending count once).
fn record_failure(shared: &Shared, e: &EngineError, failures: u32) {
    shared
        .counters
        .upload_failures
        .fetch_add(1, Ordering::Relaxed);
    tracing::warn!(error = %e, failures, "upload failed, will retry");
    shared.progress.send_modify(|p| {
        p.upload_failures += 1;
        p.upload_streak += 1;
    });
}

impl Pipeline {
    /// Does all the work possible now: plans cycles, starts PUTs, commits finished objects in
    /// order and trims. Returns whether any cycle was committed and trimmed.
    async fn step(&mut self, due: &mut bool) -> Result<bool, EngineError> {
        let mut progressed = false;
        loop {
            self.plan(due)?;
            self.start_puts();
            if !self.commit_front().await? {
                return Ok(progressed);
            }
            progressed = true;
        }
    }

    /// Plans cycles from the unplanned entries while fewer than `upload_parallelism` cycles
    /// are waiting: when due, whatever is there; otherwise only a backlog of at least
    /// `upload_threshold_bytes` (a steady trickle makes one object per interval), and behind a
    /// cycle still in flight only a full one: on a node keeping up, objects stay as large as
    /// when one cycle ran at a time, and more PUTs overlap only once a backlog builds.
    fn plan(&mut self, due: &mut bool) -> Result<(), EngineError> {
        let shared = &*self.shared;
        let threshold = shared.cfg.upload_threshold_bytes;
        let max_bytes = threshold.saturating_mul(2).max(1);
        while self.cycles.len() < shared.cfg.upload_parallelism.max(1) {
            let (upto, taken) = {
                let mut st = shared.state();
                let first = st
                    .planned_upto
                    .map_or(0, |p| st.queue.partition_point(|e| e.pos <= p));
                if first == st.queue.len() {
                    debug_assert_eq!(st.unplanned_bytes, 0, "bytes counted as unplanned");
                    if st.queue.is_empty() {
                        let durable = st.durable_pos;
                        drop(st);
                        shared.progress.send_modify(|p| {
                            p.uploaded_upto = p.uploaded_upto.max(durable);
                            p.upload_streak = 0;
                        });
                    }
                    *due = false;
                    return Ok(());
                }
                let needed = if self.cycles.is_empty() {
                    threshold
                } else {
                    max_bytes
                };
                if !*due && st.unplanned_bytes < needed {
                    return Ok(());
                }
                let mut bytes = 0usize;
                let mut upto = 0;
                let mut taken: Vec<(u64, WalRecord)> = Vec::new();
                for entry in st.queue.range(first..) {
                    if bytes >= max_bytes {
                        break;
                    }
                    upto = entry.pos;
                    for r in &entry.records {
                        bytes += r.rec.batch.len() + r.rec.aux.len();
                        taken.push((r.gen_id, r.rec.clone()));
                    }
                }
                st.unplanned_bytes -= bytes;
                st.planned_upto = Some(upto);
                (upto, taken)
            };
            // Entries emptied by `forget` plan no object: the cycle only trims.
            let refs: Vec<(u64, &WalRecord)> = taken.iter().map(|(g, r)| (*g, r)).collect();
            let objects = if refs.is_empty() {
                Vec::new()
            } else {
                plan_objects(&refs, shared.cfg.stream_object_min_bytes, || {
                    shared.next_object_key()
                })?
            };
            self.cycles.push_back(Cycle {
                id: self.next_cycle,
                upto,
                objects,
                trimmed: false,
            });
            self.next_cycle += 1;
        }
        Ok(())
    }

    /// Starts PUTs in WAL order while fewer than `upload_parallelism` are in flight, so the
    /// objects the next commit waits for go first. Failed ones wait for `put_retry_at`.
    fn start_puts(&mut self) {
        let limit = self.shared.cfg.upload_parallelism.max(1);
        let retry = self.put_retry_at.is_none_or(|t| t <= Instant::now());
        if retry {
            self.put_retry_at = None;
        }
        for c in &mut self.cycles {
            for (i, obj) in c.objects.iter_mut().enumerate() {
                if self.puts.len() >= limit {
                    return;
                }
                match obj.put {
                    PutState::Waiting => {}
                    PutState::Failed if retry => {}
                    PutState::Failed | PutState::InFlight | PutState::Done => continue,
                }
                let shared = self.shared.clone();
                let key = obj.key.clone();
                let data = obj.data.clone();
                let handle = self
                    .puts
                    .spawn(async move { timed_put(&shared, &key, data).await });
                self.put_tasks.insert(handle.id(), (c.id, i));
                obj.put = PutState::InFlight;
            }
        }
    }

    /// Records a finished PUT. A failed one is started again (same key, same bytes) after the
    /// backoff; PUTs that fail while a retry is pending belong to the same round.
    fn finish_put(&mut self, done: Result<(task::Id, PutResult), task::JoinError>) {
        let (id, result) = match done {
            Ok((id, r)) => (id, r.map_err(EngineError::from)),
            Err(e) => (
                e.id(),
                Err(EngineError::Upload(format!("object put task failed: {e}"))),
            ),
        };
        // A cycle leaves the pipeline only once all its objects are committed, so it is here.
        if let Some((cycle, index)) = self.put_tasks.remove(&id)
            && let Some(obj) = self
                .cycles
                .iter_mut()
                .find(|c| c.id == cycle)
                .and_then(|c| c.objects.get_mut(index))
        {
            obj.put = if result.is_ok() {
                PutState::Done
            } else {
                PutState::Failed
            };
        }
        match result {
            Ok(()) => {
                let failing = self
                    .cycles
                    .iter()
                    .any(|c| c.objects.iter().any(|o| o.put == PutState::Failed));
                if !failing {
                    self.put_failures = 0;
                }
                // The store took a PUT: whatever failed before was no lasting outage.
                self.shared.progress.send_if_modified(|p| {
                    let was = p.upload_streak;
                    p.upload_streak = 0;
                    was != 0
                });
            }
            Err(e) if self.put_retry_at.is_none() => {
                self.put_failures = self.put_failures.saturating_add(1);
                self.put_retry_at = Some(Instant::now() + backoff(&self.shared, self.put_failures));
                record_failure(&self.shared, &e, self.put_failures);
            }
            Err(e) => tracing::debug!(error = %e, "object put failed in a round already retrying"),
        }
    }

    /// Commits the oldest cycle's objects in order as their PUTs finish; once all are
    /// committed (or rejected), trims the WAL to its end and frees its queue entries and
    /// space. Returns whether a cycle was completed.
    async fn commit_front(&mut self) -> Result<bool, EngineError> {
        let shared = &*self.shared;
        let Some(c) = self.cycles.front_mut() else {
            return Ok(false);
        };
        for obj in c.objects.iter_mut() {
            if obj.outcome.is_some() {
                continue;
            }
            if obj.put != PutState::Done {
                return Ok(false);
            }
            commit_object(shared, obj).await?;
        }
        if !c.trimmed {
            shared.wal.trim(c.upto).await?;
            c.trimmed = true;
        }
        let upto = c.upto;
        self.cycles.pop_front();

        let freed_cost = {
            let mut st = shared.state();
            let mut cost = 0u64;
            let mut bytes = 0usize;
            while st.queue.front().is_some_and(|e| e.pos <= upto) {
                if let Some(e) = st.pop_durable() {
                    for r in e.records {
                        cost += u64::from(r.cost);
                        bytes += r.rec.batch.len() + r.rec.aux.len();
                    }
                }
            }
            st.unuploaded_bytes -= bytes;
            cost
        };
        shared.release_space(freed_cost);
        shared.progress.send_modify(|p| {
            p.uploaded_upto = p.uploaded_upto.max(Some(upto));
            p.upload_streak = 0;
        });
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn a_put_gets_a_second_per_mib_on_top_of_the_timeout() {
        let base = Duration::from_secs(60);
        assert_eq!(put_timeout(base, 1000), base);
        assert_eq!(put_timeout(base, 32 << 20), Duration::from_secs(92));
    }

    fn rec(stream: u64, epoch: i64, base: u64, n: u32, size: usize, aux: &str) -> WalRecord {
        WalRecord::new(
            stream,
            epoch,
            base,
            n,
            Bytes::from(vec![stream as u8; size]),
            Bytes::from(aux.to_string()),
        )
    }

    #[test]
    fn plan_groups_small_streams_and_splits_big_ones() {
        let recs = [
            rec(1, 1, 0, 2, 10, "a"),
            rec(2, 1, 0, 1, 100, ""),
            rec(1, 1, 2, 1, 10, ""),
            rec(2, 1, 1, 1, 100, "b"),
            rec(3, 1, 5, 1, 5, ""),
            rec(3, 2, 5, 1, 5, ""), // re-opened at a higher epoch: a new range
        ];
        let refs: Vec<_> = recs.iter().map(|r| (1u64, r)).collect();
        let mut n = 0;
        let objects = plan_objects(&refs, 150, || {
            n += 1;
            format!("k{n}")
        })
        .unwrap();
        assert_eq!(
            objects.len(),
            2,
            "one stream-set object + one stream object"
        );
        let set = &objects[0];
        let ranges: Vec<_> = set
            .ranges
            .iter()
            .map(|r| {
                (
                    r.range.stream,
                    r.range.epoch,
                    r.range.start_offset,
                    r.range.end_offset,
                )
            })
            .collect();
        assert_eq!(ranges, vec![(1, 1, 0, 3), (3, 1, 5, 6), (3, 2, 5, 6)]);
        // Each aux blob keeps the offsets of its own append.
        let aux = |base_offset, next_offset, aux: &'static str| RangeAux {
            base_offset,
            next_offset,
            aux: Bytes::from(aux),
        };
        assert_eq!(set.ranges[0].range.aux, vec![aux(0, 2, "a")]);
        let big = &objects[1];
        assert_eq!(big.ranges.len(), 1);
        assert_eq!(big.ranges[0].range.stream, 2);
        assert_eq!(big.ranges[0].range.aux, vec![aux(1, 2, "b")]);
        // Every range decodes on its own to exactly its batches.
        for obj in &objects {
            let data = obj.data.concat();
            format::check_data_header(&data).unwrap();
            for r in &obj.ranges {
                let slice = data
                    .slice(r.range.position as usize..(r.range.position + r.range.len) as usize);
                let batches = format::decode_frames(&slice).unwrap();
                assert_eq!(batches[0].base_offset, r.range.start_offset);
                assert_eq!(batches.last().unwrap().next_offset(), r.range.end_offset);
            }
        }
    }

    #[test]
    fn plan_bounds_slices() {
        let recs: Vec<_> = (0..5)
            .map(|i| rec(1, 1, i, 1, SLICE_TARGET_BYTES / 2, ""))
            .collect();
        let refs: Vec<_> = recs.iter().map(|r| (1u64, r)).collect();
        let objects = plan_objects(&refs, usize::MAX, || "k".into()).unwrap();
        let ranges: Vec<_> = objects[0]
            .ranges
            .iter()
            .map(|r| (r.range.start_offset, r.range.end_offset))
            .collect();
        assert_eq!(ranges, vec![(0, 2), (2, 4), (4, 5)]);
    }
}
