//! Appends: validate, decide (producers, match, closed), submit to the engine, finish.

use super::decide::{Verdict, decide};
use super::*;
use crate::api::*;
use crate::error::*;
use crate::open::{OpenStream, Writer};
use crate::producers::{self, Aux, Placed};
use crate::waiters::Signal;
use bytes::Bytes;
use pico_common::StreamName;
use pico_metadata::{ApplyError, Command, ProducerMark};
use pico_protocol::{ProducedBatch, Record, crc_parts, encode_batch, stamp_batch};
use s3stream::{TryAppendError, crc};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

impl Node {
    /// Append records (and/or close); returns once durable.
    pub async fn append(&self, req: AppendRequest) -> Result<AppendOutcome, AppendError> {
        self.append_with(req, AppendOptions::default()).await
    }

    /// [`Node::append`] with options (Durable Streams `Stream-Seq`).
    pub async fn append_with(
        &self,
        req: AppendRequest,
        opts: AppendOptions,
    ) -> Result<AppendOutcome, AppendError> {
        self.admit(req, opts, None, Lookup::default())
            .await?
            .wait()
            .await
    }

    /// [`Node::append_with`] for a request that looked at the view already (owner routing):
    /// the stream's entries come from `seen` while the view has not moved ([`Lookup`]).
    pub async fn append_seen(
        &self,
        req: AppendRequest,
        opts: AppendOptions,
        seen: Lookup,
    ) -> Result<AppendOutcome, AppendError> {
        self.admit(req, opts, None, seen).await?.wait().await
    }

    /// Appends a Kafka producer's RecordBatch v2 as it was sent, compressed or not. The batch
    /// was checked whole ([`pico_protocol::check_produced`]: CRC, record count, every record,
    /// the inflated size bounded; the facade maps its errors to its wire); it is stored with
    /// its base offset, the LogAppendTime bit and the append time set ([`stamp_batch`]). Same
    /// writer, offsets, checks and durability as [`Node::append`]; no producer claim (Kafka
    /// idempotence counts records: the facade keeps it).
    pub async fn append_batch(
        &self,
        name: &StreamName,
        checked: ProducedBatch,
    ) -> Result<AppendOutcome, AppendError> {
        self.admit_batch(name, checked).await?.wait().await
    }

    /// [`Node::append_batch`] in two steps, so a caller can pipeline a connection's batches:
    /// this returns once the batch is admitted (offsets assigned under the stream's writer
    /// lock, submitted to the engine: a later admission on the stream lies after it), and
    /// [`Admitted::wait`] once it is durable and may be acknowledged.
    pub async fn admit_batch(
        &self,
        name: &StreamName,
        checked: ProducedBatch,
    ) -> Result<Admitted, AppendError> {
        let (batch, records) = checked.into_parts();
        let req = AppendRequest {
            name: name.clone(),
            records,
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        };
        self.admit(
            req,
            AppendOptions::default(),
            Some(batch),
            Lookup::default(),
        )
        .await
    }

    /// The first half of an append of `req.records` (with `raw`, those are the records of
    /// that producer batch, which is stored in place of encoding them): checks, the verdict
    /// and the submission under the stream's writer lock. [`Admitted::wait`] is the second.
    async fn admit(
        &self,
        req: AppendRequest,
        opts: AppendOptions,
        raw: Option<Bytes>,
        seen: Lookup,
    ) -> Result<Admitted, AppendError> {
        let now = self.now_ms();
        let r = self.resolve_seen(&req.name, now, seen).ok_or_else(|| {
            if self.is_gone(&req.name) {
                AppendError::Gone(req.name.to_string())
            } else {
                AppendError::NotFound(req.name.to_string())
            }
        })?;
        if let Some(p) = &req.producer
            && (p.id.is_empty() || p.id.len() > producers::MAX_PRODUCER_ID_LEN)
        {
            return Err(AppendError::BadRequest(format!(
                "producer id must be 1..={} bytes",
                producers::MAX_PRODUCER_ID_LEN
            )));
        }
        if opts
            .stream_seq
            .as_ref()
            .is_some_and(|q| q.len() > producers::MAX_STREAM_SEQ_LEN)
        {
            return Err(AppendError::BadRequest(format!(
                "stream-seq longer than {} bytes",
                producers::MAX_STREAM_SEQ_LEN
            )));
        }
        if req.records.is_empty() && !req.close {
            return Err(AppendError::BadRequest("empty append".into()));
        }
        check_records(&req.records)?;
        // A protocol that names the request's content type has parsed the records as that type
        // (Durable Streams splits a JSON array into its values); any other append to a JSON
        // stream is checked here, or its values would break every JSON read of the stream.
        if req.content_type.is_none()
            && is_json(&r.entry.config.content_type)
            && let Err(e) = check_json_values(&req.records)
        {
            // Any append to a closed stream is refused as such, whatever its records.
            return Err(if r.entry.closed {
                AppendError::Closed {
                    name: r.name.to_string(),
                    next_seq: self.tail(&r.meta),
                }
            } else {
                e
            });
        }
        let stream_id = r.meta.id;
        self.touch(&r, now);
        let open = self.open_stream(&r).await?;
        open.touch(now);
        let engine = &self.inner.engine;

        // One deadline for the stream's turn and the engine's space: with storage stalled the
        // appends queued behind the lock would each wait their full timeout in turn, holding
        // their bodies, so the k-th would hear 503 only after k timeouts. Dated at the first
        // wait: most appends never wait, and need no clock read for it.
        let mut give_up = GiveUp::new(self.inner.config.submit_timeout);
        // Free nearly always: taken without a timeout; else queued behind (the lock is fair:
        // `try_lock` does not pass appends already waiting), bounded, in a boxed future so
        // that its timer is not part of every append's future.
        let mut w = match open.writer.try_lock() {
            Ok(w) => w,
            Err(_) => Box::pin(tokio::time::timeout_at(give_up.at(), open.writer.lock()))
                .await
                .map_err(|_| stream_busy())?,
        };
        if let Some(p) = &req.producer
            && !w.broken
            && !w.closed
            && producers::early(w.producers.get(&p.id).copied(), p)
        {
            // Boxed: rare, and its timers would otherwise be part of every append's future.
            w = Box::pin(self.wait_for_predecessors(&open, w, p, give_up.at())).await?;
        }
        // Read from the engine (its state lock) once per open; kept by the writer after that.
        let tail = w.next_offset.or_else(|| engine.next_offset(stream_id));
        w.next_offset = tail;
        let verdict = decide(&w, &req, &opts, &r.entry.config.content_type, tail);
        // `decide` refuses an append with no tail, so a verdict that goes on has one.
        let next = tail.unwrap_or_default();
        match verdict {
            Verdict::Write => {}
            Verdict::Refused(e) => return Err(e),
            Verdict::Broken => {
                drop(w);
                self.inner.open.remove_open(&open);
                return Err(AppendError::Unavailable(format!(
                    "stream is being reopened, retry: name=`{}`",
                    r.name
                )));
            }
            Verdict::RetryOfClose { start, end } => {
                let producer = req.producer.as_ref().map(|p| (p.epoch, p.seq));
                drop(w);
                // Acknowledge only what is true: the original's data is durable and the close
                // is committed (it may still be in flight, or have failed).
                let outcome = AppendOutcome {
                    start_seq: Some(start),
                    next_seq: end,
                    duplicate: true,
                    closed: true,
                    producer,
                    timestamp_ms: now,
                };
                let finish = Finish::Original {
                    open,
                    next,
                    sealed: true,
                };
                return Ok(self.admitted(r.name, stream_id, outcome, None, finish));
            }
            Verdict::DuplicateThenClose {
                epoch,
                last_seq,
                mark,
            } => {
                let (start, end) = (mark.start_offset, mark.end_offset);
                w.closed = true;
                w.closed_by = Some(mark.clone());
                drop(w);
                let finish = self.finish_detached(open, None, next, next, Some(Some(mark)), now);
                let outcome = AppendOutcome {
                    start_seq: Some(start),
                    next_seq: end,
                    duplicate: true,
                    closed: true,
                    producer: Some((epoch, last_seq)),
                    timestamp_ms: now,
                };
                let event = Some((next, true));
                return Ok(self.admitted(r.name, stream_id, outcome, event, finish));
            }
            Verdict::Duplicate {
                epoch,
                last_seq,
                original,
            } => {
                drop(w);
                // The original may still be in flight: acknowledge only once it is durable
                // in this same incarnation of the stream.
                let finish = Finish::Original {
                    open,
                    next,
                    sealed: false,
                };
                // An older seq's offsets are no longer kept: say so (no start) rather than
                // pass the tail off as where its records lie.
                let outcome = AppendOutcome {
                    start_seq: original.map(|at| at.start),
                    next_seq: original.map_or(next, |at| at.next),
                    duplicate: true,
                    closed: false,
                    producer: Some((epoch, last_seq)),
                    timestamp_ms: now,
                };
                return Ok(self.admitted(r.name, stream_id, outcome, None, finish));
            }
        }

        let mut pending = None;
        if !req.records.is_empty() {
            let record_count = req.records.len() as u32;
            let batch = match raw {
                Some(raw) => stamp_batch(&raw, next, now),
                None => {
                    let records: Vec<Record> = req
                        .records
                        .into_iter()
                        .map(|mut rec| {
                            rec.timestamp_ms = now;
                            rec
                        })
                        .collect();
                    encode_batch(next, &records)
                }
            };
            let aux = producers::encode_aux(&Aux {
                producer: req.producer.clone(),
                stream_seq: opts.stream_seq.clone(),
            });
            // The encoder has just checksummed the records: the engine's CRC of a large batch
            // combines that with the header's instead of reading the batch again (a small one
            // is cheaper to read, so its parts are not even asked for: that is a pass too).
            let batch_crc = (batch.len() >= crc::COMBINE_MIN)
                .then(|| crc_parts(&batch))
                .flatten()
                .map(|(head, rest, len)| crc::combine(head, rest, len));
            let submit = engine.try_append(s3stream::AppendRequest {
                stream: stream_id,
                epoch: open.epoch,
                record_count,
                batch,
                batch_crc,
                aux,
            });
            let submitted = match submit {
                Ok(p) => Ok(p),
                Err(TryAppendError::Failed(e)) => Err(e),
                // Queue space frees as the WAL and uploads make progress; when storage is down
                // it never does, so answer 503 rather than hang (offsets are assigned only on
                // success). Boxed: the wait and its timer are rare.
                Err(TryAppendError::Full(req)) => {
                    match Box::pin(tokio::time::timeout_at(give_up.at(), engine.append(req))).await
                    {
                        Ok(r) => r,
                        Err(_) => {
                            return Err(AppendError::Unavailable(
                                "storage is not keeping up: append queue full, retry later".into(),
                            ));
                        }
                    }
                }
            };
            match submitted {
                Ok(p) => {
                    w.next_offset = Some(p.next_offset);
                    pending = Some(p);
                }
                // Gave up waiting for queue space: nothing was written, so the writer's state
                // still holds and the stream stays open (a reopen would only cost a flush).
                Err(e @ EngineError::NoRoom(_)) => return Err(engine_append_error(e)),
                Err(e) => {
                    w.broken = true;
                    drop(w);
                    self.inner.open.remove_open(&open);
                    return Err(engine_append_error(e));
                }
            }
        }
        if pending.is_some()
            && let Some(seq) = &opts.stream_seq
        {
            w.stream_seq = Some(seq.clone());
        }
        // Where this append's records lie (`next` is their base: the writer lock serializes
        // offset assignment).
        let at = Placed {
            start: pending.as_ref().map_or(next, |p| p.base_offset),
            next: pending.as_ref().map_or(next, |p| p.next_offset),
        };
        let new_next = at.next;
        if let Some(p) = &req.producer {
            w.accept_producer(&p.id, p.epoch, p.seq, at, now);
            open.producers_moved.notify_waiters();
        }
        let mark = req.producer.as_ref().map(|p| ProducerMark {
            id: p.id.clone(),
            epoch: p.epoch,
            seq: p.seq,
            start_offset: at.start,
            end_offset: at.next,
        });
        if req.close {
            w.closed = true;
            w.closed_by = mark.clone();
        }
        drop(w);

        let finish = match (pending, req.close) {
            // The common case waits in the request itself: no task per append.
            (Some(p), false) => Finish::Durable(DurableWait::new(self, open, p)),
            // A close must be committed even if the client disconnects: its own task.
            (pending, close) => {
                let close = close.then_some(mark);
                self.finish_detached(open, pending, next, new_next, close, now)
            }
        };
        let outcome = AppendOutcome {
            start_seq: Some(at.start),
            next_seq: new_next,
            duplicate: false,
            closed: req.close,
            producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
            timestamp_ms: now,
        };
        let event = Some((new_next, req.close));
        Ok(self.admitted(r.name, stream_id, outcome, event, finish))
    }

    /// A producer append that arrived ahead of its predecessors: held (bounded by the node's
    /// `reorder_wait`) until they are accepted, or it is decided as it stands. Gives back the
    /// writer lock.
    async fn wait_for_predecessors<'a>(
        &self,
        open: &'a OpenStream,
        mut w: tokio::sync::MutexGuard<'a, Writer>,
        p: &ProducerClaim,
        give_up: tokio::time::Instant,
    ) -> Result<tokio::sync::MutexGuard<'a, Writer>, AppendError> {
        let deadline = tokio::time::Instant::now() + self.inner.config.reorder_wait;
        while !w.broken && !w.closed && producers::early(w.producers.get(&p.id).copied(), p) {
            // Created before the lock is released, so no move between the two is missed.
            let moved = open.producers_moved.notified();
            drop(w);
            let timed_out = tokio::time::timeout_at(deadline, moved).await.is_err();
            w = tokio::time::timeout_at(give_up, open.writer.lock())
                .await
                .map_err(|_| stream_busy())?;
            if timed_out {
                break; // decided below as it stands: most likely a real gap
            }
        }
        Ok(w)
    }

    fn admitted(
        &self,
        name: StreamName,
        stream_id: u64,
        outcome: AppendOutcome,
        event: Option<(u64, bool)>,
        finish: Finish,
    ) -> Admitted {
        Admitted {
            node: self.clone(),
            name,
            stream_id,
            outcome,
            event,
            finish,
        }
    }

    /// [`Node::finish_append`] in a task of its own, started now, for appends that close the
    /// stream: a client that disconnects must not leave a close decided in memory but never
    /// committed. Closes are rare; plain appends wait in the request ([`DurableWait`]).
    fn finish_detached(
        &self,
        open: Arc<OpenStream>,
        pending: Option<s3stream::PendingAppend>,
        next: u64,
        new_next: u64,
        close: Option<Option<ProducerMark>>,
        now: i64,
    ) -> Finish {
        let node = self.clone();
        Finish::Detached(tokio::spawn(async move {
            node.finish_append(open, pending, next, new_next, close, now)
                .await
        }))
    }

    /// Durable in the WAL, but acknowledged only if failover cannot have fenced this process
    /// before the write landed (docs/design/failover.md, "acknowledgement window").
    pub(crate) fn ack_allowed(&self) -> Result<(), AppendError> {
        if self.may_ack() {
            return Ok(());
        }
        Err(AppendError::Unavailable(
            "this node cannot confirm its liveness with the metadata log (cut off, or fenced): \
             the append is not acknowledged; retry"
                .into(),
        ))
    }

    /// Second half of an append: waits for durability (or, close-only, for everything before
    /// it), then commits the close. Any failure breaks the open stream so the next request
    /// reloads the committed state instead of trusting what this writer decided in memory.
    pub(crate) async fn finish_append(
        &self,
        open: Arc<OpenStream>,
        pending: Option<s3stream::PendingAppend>,
        next: u64,
        new_next: u64,
        close: Option<Option<ProducerMark>>,
        now: i64,
    ) -> Result<(), AppendError> {
        match pending {
            Some(p) => {
                if let Err(e) = p.durable().await {
                    self.break_open(&open).await;
                    return Err(durable_error(e));
                }
            }
            None => self.wait_durable(&open, next).await?,
        }
        self.ack_allowed()?;
        if let Some(mark) = close {
            let sealed = self
                .propose(Command::SealStream {
                    stream_id: open.stream_id,
                    closed_at: new_next,
                    producer: mark,
                    now_ms: now,
                })
                .await;
            match sealed {
                Ok(Ok(_)) => self.inner.waiters.notify_closed(open.stream_id),
                // Deleted meanwhile (a racing DELETE): the caller names the stream.
                Ok(Err(ApplyError::StreamNotFound { .. } | ApplyError::StreamDeleted { .. })) => {
                    self.break_open(&open).await;
                    return Err(AppendError::NotFound(String::new()));
                }
                Ok(Err(e)) => {
                    self.break_open(&open).await;
                    return Err(AppendError::Internal(format!("close rejected: {e}")));
                }
                Err(e) => {
                    self.break_open(&open).await;
                    return Err(AppendError::Unavailable(e));
                }
            }
        }
        Ok(())
    }

    /// Marks an open stream unusable and drops it from the table (if it is still there).
    pub(crate) async fn break_open(&self, open: &Arc<OpenStream>) {
        open.writer.lock().await.broken = true;
        self.inner.open.remove_open(open);
    }

    /// Waits until everything submitted below `target` is durable in this incarnation of the
    /// stream. A re-open or a failed write in between means it may never be: answer 503 so the
    /// client retries against the committed state.
    pub(crate) async fn wait_durable(
        &self,
        open: &Arc<OpenStream>,
        target: u64,
    ) -> Result<(), AppendError> {
        let engine = &self.inner.engine;
        let stream_id = open.stream_id;
        let mut rx = self.inner.waiters.subscribe(stream_id, Signal::default());
        let deadline = tokio::time::Instant::now() + DURABLE_WAIT;
        loop {
            if engine.is_open(stream_id) != Some(open.epoch)
                || open.writer.try_lock().is_ok_and(|w| w.broken)
            {
                return Err(AppendError::Unavailable(
                    "stream was reopened before earlier appends were confirmed: retry".into(),
                ));
            }
            if engine.durable_end(stream_id).is_some_and(|d| d >= target) {
                return Ok(());
            }
            // A failed write sets `broken` without moving the tail: poll as well as listen.
            let tick = tokio::time::sleep(Duration::from_millis(20));
            tokio::select! {
                _ = rx.changed() => {}
                _ = tick => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(AppendError::Durability(
                    "earlier appends did not become durable in time".into(),
                ));
            }
        }
    }

    /// Waits until the stream's close is committed (a retry of the closing request).
    pub(crate) async fn wait_sealed(
        &self,
        open: &Arc<OpenStream>,
        name: &StreamName,
    ) -> Result<(), AppendError> {
        let deadline = tokio::time::Instant::now() + DURABLE_WAIT;
        loop {
            let sealed = self
                .inner
                .meta
                .view()
                .registry
                .get(name.as_str())
                .is_some_and(|e| e.stream_id == open.stream_id && e.closed_at.is_some());
            if sealed {
                return Ok(());
            }
            if open.writer.try_lock().is_ok_and(|w| w.broken)
                || tokio::time::Instant::now() >= deadline
            {
                return Err(AppendError::Unavailable(
                    "the close of this stream was not committed: retry".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// An append admitted: its offsets are assigned under the stream's writer lock and it is
/// submitted to the engine (a duplicate: matched to its original), so any later admission on
/// the stream lies after it. [`Admitted::wait`] finishes it: durable, allowed to be
/// acknowledged, announced. Dropping it first is safe: a plain append's wait goes on in a task
/// ([`DurableWait`]: a failed write still breaks the open stream), and a close is committed by
/// a task of its own already.
#[must_use = "an admitted append is acknowledged only once `wait` says it is durable"]
pub struct Admitted {
    node: Node,
    name: StreamName,
    stream_id: u64,
    outcome: AppendOutcome,
    /// The `Appended` event (next seq, closed) to send once finished.
    event: Option<(u64, bool)>,
    finish: Finish,
}

/// What is left of an admitted append.
enum Finish {
    /// A plain append: its WAL write.
    Durable(DurableWait),
    /// An append that closes the stream: its task (durability, then the seal).
    Detached(tokio::task::JoinHandle<Result<(), AppendError>>),
    /// A duplicate: everything below `next` durable in this incarnation of the stream, and
    /// for the retry of a close, the close committed.
    Original {
        open: Arc<OpenStream>,
        next: u64,
        sealed: bool,
    },
}

impl Admitted {
    /// What [`Admitted::wait`] answers when it succeeds: the offsets are final already.
    pub fn outcome(&self) -> &AppendOutcome {
        &self.outcome
    }

    /// Waits until the append is durable and may be acknowledged (the node can still confirm
    /// its liveness), then announces it to readers.
    pub async fn wait(self) -> Result<AppendOutcome, AppendError> {
        let Admitted {
            node,
            name,
            stream_id,
            outcome,
            event,
            finish,
        } = self;
        match finish {
            Finish::Durable(wait) => {
                wait.wait().await?;
                node.ack_allowed()?;
            }
            Finish::Detached(task) => task
                .await
                .map_err(|e| AppendError::Internal(format!("append task failed: {e}")))?
                .map_err(|e| match e {
                    AppendError::NotFound(_) => AppendError::NotFound(name.to_string()),
                    e => e,
                })?,
            // Duplicates are rare: their waits (timers, a subscription) are boxed rather than
            // part of every append's future.
            Finish::Original { open, next, sealed } => {
                Box::pin(node.wait_durable(&open, next)).await?;
                if sealed {
                    Box::pin(node.wait_sealed(&open, &name)).await?;
                }
            }
        }
        if let Some((next_seq, closed)) = event {
            // Nobody listening is fine: the channel is a bounded, lossy broadcast.
            let _ = node.inner.events.send(StreamEvent::Appended {
                name,
                stream_id,
                next_seq,
                closed,
            });
        }
        Ok(outcome)
    }
}

/// An append's one deadline for its waits (the stream's turn, its predecessors, queue space),
/// `after` from the first of them.
struct GiveUp {
    after: Duration,
    at: Option<tokio::time::Instant>,
}

impl GiveUp {
    fn new(after: Duration) -> Self {
        GiveUp { after, at: None }
    }

    fn at(&mut self) -> tokio::time::Instant {
        *self
            .at
            .get_or_insert_with(|| tokio::time::Instant::now() + self.after)
    }
}

/// The writer lock was not free before the append's deadline.
fn stream_busy() -> AppendError {
    AppendError::Unavailable("storage is not keeping up: stream busy, retry later".into())
}

/// A failed durability wait, as the client hears it.
fn durable_error(e: s3stream::EngineError) -> AppendError {
    match e {
        s3stream::EngineError::WalFenced(m) => AppendError::Superseded(m),
        e => AppendError::Durability(e.to_string()),
    }
}

/// An append's wait for its WAL group commit, polled by the request itself: the engine's writer
/// answers on the append's oneshot, so a plain append costs no task of its own.
///
/// Cancel-safe: a request dropped before the wait ends (the client went away, a timeout) hands
/// what is left to a task, only then. A write that fails must still break the open stream,
/// or the next request would trust offsets and producer state this writer decided in memory.
struct DurableWait {
    node: Node,
    open: Arc<OpenStream>,
    state: Wait,
}

enum Wait {
    /// The engine has not answered yet.
    Ack(s3stream::PendingAppend),
    /// The write failed: the open stream is being broken.
    Breaking,
    Done,
}

impl DurableWait {
    fn new(node: &Node, open: Arc<OpenStream>, ack: s3stream::PendingAppend) -> Self {
        DurableWait {
            node: node.clone(),
            open,
            state: Wait::Ack(ack),
        }
    }

    async fn wait(mut self) -> Result<(), AppendError> {
        let answer = std::future::poll_fn(|cx| match &mut self.state {
            Wait::Ack(ack) => Pin::new(ack).poll(cx),
            _ => Poll::Ready(Err(s3stream::EngineError::ShuttingDown)),
        })
        .await;
        match answer {
            Ok(_) => {
                self.state = Wait::Done;
                Ok(())
            }
            Err(e) => {
                self.state = Wait::Breaking;
                // Boxed: rare, and its lock future would be part of every append's otherwise.
                Box::pin(self.node.break_open(&self.open)).await;
                self.state = Wait::Done;
                Err(durable_error(e))
            }
        }
    }
}

impl Drop for DurableWait {
    fn drop(&mut self) {
        let state = std::mem::replace(&mut self.state, Wait::Done);
        if matches!(state, Wait::Done) {
            return;
        }
        // Requests run on the runtime; without one (it is shutting down) nobody is left to
        // trust the stream's state.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (node, open) = (self.node.clone(), self.open.clone());
        rt.spawn(async move {
            let failed = match state {
                Wait::Ack(ack) => ack.durable().await.is_err(),
                _ => true,
            };
            if failed {
                node.break_open(&open).await;
            }
        });
    }
}
