//! The pipelined idempotent producer: several batches in flight per producer, acknowledged in
//! order, never a sequence-gap error surfaced to the caller.
//!
//! Every batch gets the next `(id, epoch, seq)` when it is handed to [`IdempotentProducer::send`]
//! and keeps it across retries, so the server dedupes a retry of a batch it already applied.
//! Batches travel on independent requests and may overtake each other on the way; a PicoMQ
//! server holds one that arrived early until its predecessors are accepted (up to 20 ms), other
//! servers answer `409 sequence_gap` at once. [`drive`] turns a gap into "wait until every
//! earlier batch has finished, then resend": a gap is ordering noise, not an error. The
//! sequencing core ([`SeqWindow`], [`drive`]) knows no protocol, so other frontends (the Durable
//! Streams load generator in `pico bench`) reuse it with their own headers.

use crate::client::{Client, Failure};
use crate::error::ClientError;
use crate::types::{AppendAck, BatchRecord};
use crate::wire;
use bytes::Bytes;
use pico_protocol::Record;
use pico_protocol::headers::{
    CONTENT_TYPE_BINARY_BATCH, CONTENT_TYPE_JSON_BATCH, PICO_NEXT_SEQ, PICO_PRODUCER_EPOCH,
    PICO_PRODUCER_ID, PICO_PRODUCER_SEQ, PICO_START_SEQ,
};
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue, RETRY_AFTER};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, watch};
// Tokio's clock, so tests of the retry budget can run it paused.
use tokio::time::Instant;

/// First pause before resending a batch that overtook a predecessor; doubles per resend, up
/// to 128 ms.
const GAP_PAUSE: Duration = Duration::from_micros(500);
const GAP_PAUSE_MAX_SHIFT: u32 = 8;
/// Resends after a gap (~1 s of pauses) before a batch stops resending and waits for every
/// predecessor to finish: a predecessor without an answer (request timeouts, for up to the
/// retry budget) must not turn its successors into a stream of refused requests.
const GAP_RESENDS_BEFORE_WAITING: u32 = 16;

/// Called with each transient failure before the batch is resent.
pub type RetryHook = Arc<dyn Fn(&ClientError) + Send + Sync>;

/// How a producer retries transient failures (transport errors, timeouts, 500/502/503).
#[derive(Clone)]
pub struct RetryPolicy {
    /// How long a batch keeps being resent, counted from its first transient failure: an
    /// attempt that used up the whole request timeout still gets resent. Long enough to ride
    /// out a server restart; resending is safe, as the batch keeps its seq.
    pub budget: Duration,
    /// First pause before a resend; doubles per resend up to `max_backoff`. A server's
    /// `Retry-After` (seconds) lengthens it, within what is left of the budget.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// Called before each resend after a transient failure (not after ordering gaps), so a
    /// caller can count what the retries hide: a batch acknowledged in the end looks clean.
    pub on_retry: Option<RetryHook>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            budget: Duration::from_secs(30),
            backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(1),
            on_retry: None,
        }
    }
}

impl RetryPolicy {
    /// The pause before resend number `resend` (1 for the first).
    fn backoff_for(&self, resend: u32) -> Duration {
        let shift = resend.saturating_sub(1).min(16);
        self.backoff
            .saturating_mul(1u32 << shift)
            .min(self.max_backoff)
    }
}

impl std::fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("budget", &self.budget)
            .field("backoff", &self.backoff)
            .field("max_backoff", &self.max_backoff)
            .field("on_retry", &self.on_retry.is_some())
            .finish()
    }
}

/// Completion state of a producer's sequence numbers.
#[derive(Debug, Clone, Default)]
struct WindowState {
    /// Every seq below this has finished successfully.
    frontier: u64,
    /// Finished successfully above the frontier (out-of-order completions).
    done_above: BTreeSet<u64>,
    /// The lowest seq that failed for good: nothing after it can ever be accepted.
    failed: Option<u64>,
}

/// Tracks which sequence numbers of one producer have finished, so a batch that overtook its
/// predecessors can wait for them. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SeqWindow {
    state: Arc<watch::Sender<WindowState>>,
    /// The first seq of this producer epoch.
    first: u64,
}

impl SeqWindow {
    /// A window whose first sequence number is `first`.
    pub fn new(first: u64) -> SeqWindow {
        let (tx, _) = watch::channel(WindowState {
            frontier: first,
            ..Default::default()
        });
        SeqWindow {
            state: Arc::new(tx),
            first,
        }
    }

    /// Records the final outcome of `seq`.
    pub fn complete(&self, seq: u64, ok: bool) {
        self.state.send_modify(|s| {
            if !ok {
                s.failed = Some(s.failed.map_or(seq, |f| f.min(seq)));
                return;
            }
            if seq == s.frontier {
                s.frontier += 1;
                while s.done_above.remove(&s.frontier) {
                    s.frontier += 1;
                }
            } else if seq > s.frontier {
                s.done_above.insert(seq);
            }
        });
    }

    /// The lowest failed seq, if any.
    pub fn failed(&self) -> Option<u64> {
        self.state.borrow().failed
    }

    /// Waits until every seq below `seq` finished. Err(failed seq) if one of them failed.
    pub async fn wait_predecessors(&self, seq: u64) -> Result<(), u64> {
        let mut rx = self.state.subscribe();
        loop {
            {
                let s = rx.borrow_and_update();
                if let Some(f) = s.failed.filter(|f| *f < seq) {
                    return Err(f);
                }
                if s.frontier >= seq {
                    return Ok(());
                }
            }
            // The sender lives in `self`, so this cannot close while we wait.
            if rx.changed().await.is_err() {
                return Err(seq);
            }
        }
    }
}

/// What one attempt of sending a sequenced batch came to.
#[derive(Debug)]
pub enum Attempt<T> {
    /// Accepted, or acknowledged as a duplicate of an earlier delivery.
    Done(T),
    /// The server expects an earlier seq: a predecessor has not arrived yet.
    Gap { expected: u64 },
    /// Transient: retry the same (id, epoch, seq) after a backoff. The attempt may have been
    /// applied (no answer, or a 5xx one).
    Retry(ClientError),
    /// [`Attempt::Retry`], with the server's `Retry-After`: wait at least this long.
    RetryAfter(ClientError, Duration),
    /// Transient, and the request certainly reached no server (no connection could be made):
    /// retry, and the attempt does not count as maybe applied.
    RetryUnsent(ClientError),
    /// Permanent: the batch and everything after it fail.
    Fatal(ClientError),
}

/// Sends sequenced batch `seq` with `attempt` until it is accepted, handling reordering (gap →
/// wait for predecessors → resend) and transient failures (backoff → resend, within the
/// policy's budget). Records the outcome in `window`, on every way out: a `drive` dropped
/// before it finished records a failure, so the batches after it do not wait forever. A batch
/// that fails after an attempt that may have been applied fails with
/// [`ClientError::OutcomeUnknown`], never with an error that reads "not written".
pub async fn drive<T, F, Fut>(
    window: &SeqWindow,
    seq: u64,
    policy: &RetryPolicy,
    mut attempt: F,
) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    let mut outcome = Outcome {
        window,
        seq,
        recorded: false,
        maybe_applied: false,
    };
    // The first batch of an epoch goes alone: a server that still holds an older epoch answers
    // a later seq of the new epoch with "must start at seq 0" (400), which is not a reordering
    // gap the pipeline could wait out. Pipelining starts once the epoch is established.
    if seq > window.first
        && let Err(f) = window.wait_predecessors(window.first + 1).await
    {
        return Err(outcome.predecessor_failed(f));
    }
    let mut transient = 0u32;
    // Set at the first transient failure: resending stops there.
    let mut deadline: Option<Instant> = None;
    let mut gap_resends = 0u32;
    // A gap seen after all predecessors finished means the server lost or never had them.
    let mut gap_after_predecessors = false;
    loop {
        if let Some(f) = window.failed().filter(|f| *f < seq) {
            return Err(outcome.predecessor_failed(f));
        }
        let (e, retry_after) = match attempt().await {
            Attempt::Done(v) => {
                outcome.record(true);
                return Ok(v);
            }
            Attempt::Gap { expected } => {
                if expected >= seq || gap_after_predecessors {
                    return Err(outcome.fail(ClientError::Http {
                        status: 409,
                        code: "sequence_gap".into(),
                        message: format!(
                            "producer sequence gap the pipeline cannot repair: expected={expected} received={seq}"
                        ),
                    }));
                }
                // The predecessor is usually just behind on another connection: resend after a
                // short pause, or as soon as every predecessor finished, whichever comes first.
                // Waiting for the predecessors' acks alone would serialize the pipeline: each
                // batch would wait a whole durable round trip behind the one before. Past the
                // bound, a predecessor is stuck: only its outcome can help.
                let done = if gap_resends >= GAP_RESENDS_BEFORE_WAITING {
                    Some(window.wait_predecessors(seq).await)
                } else {
                    let pause = GAP_PAUSE * (1u32 << gap_resends.min(GAP_PAUSE_MAX_SHIFT));
                    tokio::select! {
                        done = window.wait_predecessors(seq) => Some(done),
                        _ = tokio::time::sleep(pause) => None,
                    }
                };
                gap_resends += 1;
                match done {
                    Some(Err(f)) => return Err(outcome.predecessor_failed(f)),
                    Some(Ok(())) => gap_after_predecessors = true,
                    None => {}
                }
                continue;
            }
            Attempt::Retry(e) => {
                // Unanswered or answered 5xx: the server may have applied it all the same.
                outcome.maybe_applied = true;
                (e, None)
            }
            Attempt::RetryAfter(e, after) => {
                outcome.maybe_applied = true;
                (e, Some(after))
            }
            Attempt::RetryUnsent(e) => (e, None),
            Attempt::Fatal(e) => return Err(outcome.fail(e)),
        };
        let now = Instant::now();
        let left = deadline
            .get_or_insert(now + policy.budget)
            .saturating_duration_since(now);
        if left.is_zero() {
            return Err(outcome.fail(e));
        }
        transient += 1;
        tracing::debug!(seq, attempt = transient, error = %e, "producer batch retry");
        if let Some(hook) = &policy.on_retry {
            hook(&e);
        }
        // The server knows best when it is back (a restart, a failover).
        let pause = policy
            .backoff_for(transient)
            .max(retry_after.unwrap_or_default())
            .min(left);
        tokio::time::sleep(pause).await;
    }
}

/// The outcome of one [`drive`]: recorded in the window once, and as a failure if the drive
/// is dropped before it recorded anything.
struct Outcome<'a> {
    window: &'a SeqWindow,
    seq: u64,
    recorded: bool,
    /// An attempt went unanswered or failed in a way that does not prove it was not applied.
    maybe_applied: bool,
}

impl Outcome<'_> {
    fn record(&mut self, ok: bool) {
        if !self.recorded {
            self.recorded = true;
            self.window.complete(self.seq, ok);
        }
    }

    /// Fails the batch itself with `e`, or with [`ClientError::OutcomeUnknown`] if an earlier
    /// attempt may have been applied: `e` answers the last attempt only, and a caller taking
    /// a plain error for "not written" would write the batch twice.
    fn fail(&mut self, e: ClientError) -> ClientError {
        self.record(false);
        if self.maybe_applied {
            ClientError::OutcomeUnknown {
                seq: self.seq,
                failed_seq: self.seq,
                cause: Some(Box::new(e)),
            }
        } else {
            e
        }
    }

    /// Gives the batch up after predecessor `failed` failed: [`ClientError::Abandoned`] only
    /// if it was certainly not written (never sent, or only refused as out of order).
    fn predecessor_failed(&mut self, failed: u64) -> ClientError {
        self.record(false);
        if self.maybe_applied {
            ClientError::OutcomeUnknown {
                seq: self.seq,
                failed_seq: failed,
                cause: None,
            }
        } else {
            predecessor_failed(self.seq, failed)
        }
    }
}

impl Drop for Outcome<'_> {
    fn drop(&mut self) {
        self.record(false);
    }
}

/// The error for a batch never sent because batch `failed` failed.
fn predecessor_failed(seq: u64, failed: u64) -> ClientError {
    ClientError::Abandoned {
        seq,
        failed_seq: failed,
    }
}

/// Is this error worth retrying with the same sequence number?
pub fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Transport(_) | ClientError::Timeout(_) => true,
        ClientError::Http { status, .. } => *status == 503 || *status == 502 || *status == 500,
        ClientError::Decode(_)
        | ClientError::Invalid(_)
        | ClientError::Abandoned { .. }
        | ClientError::OutcomeUnknown { .. } => false,
    }
}

/// Settings of an [`IdempotentProducer`].
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    /// Producer id, unique per writer of the stream.
    pub id: String,
    /// Epoch: a new writer incarnation uses a higher one (and fences the older).
    pub epoch: u64,
    /// First sequence number: 0 for a new (id, epoch).
    pub first_seq: u64,
    /// Batches sent but not yet acknowledged, at most.
    pub max_in_flight: usize,
    pub retry: RetryPolicy,
}

impl ProducerConfig {
    pub fn new(id: impl Into<String>, epoch: u64, max_in_flight: usize) -> ProducerConfig {
        ProducerConfig {
            id: id.into(),
            epoch,
            first_seq: 0,
            max_in_flight: max_in_flight.max(1),
            retry: RetryPolicy::default(),
        }
    }
}

/// Acknowledgement of one producer batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerAck {
    /// The batch's producer sequence number.
    pub seq: u64,
    /// Offsets of the append; for a duplicate (a retry the server had already applied) the
    /// original append's, or, when the server no longer knows them (an older seq than the
    /// producer's last), both the stream's tail at that time.
    pub append: AppendAck,
    /// The server answered `Pico-Duplicate: true`.
    pub duplicate: bool,
}

/// A batch handed to the producer; resolves when it is acknowledged.
#[derive(Debug)]
pub struct InFlight {
    seq: u64,
    handle: tokio::task::JoinHandle<Result<ProducerAck, ClientError>>,
}

impl InFlight {
    pub fn seq(&self) -> u64 {
        self.seq
    }

    pub async fn ack(self) -> Result<ProducerAck, ClientError> {
        self.handle
            .await
            .unwrap_or_else(|e| Err(ClientError::Transport(format!("producer task failed: {e}"))))
    }
}

/// An idempotent producer on one stream with up to `max_in_flight` batches in flight.
/// Cheap to clone; clones share the sequence.
#[derive(Debug, Clone)]
pub struct IdempotentProducer {
    inner: Arc<ProducerInner>,
}

#[derive(Debug)]
struct ProducerInner {
    client: Client,
    stream: String,
    config: ProducerConfig,
    /// `config.id` as a header, checked once when the producer is built.
    id_header: HeaderValue,
    window: SeqWindow,
    /// Shared with the producers of later epochs made by [`IdempotentProducer::next_epoch`].
    permits: Arc<Semaphore>,
    /// Held while taking a permit and a seq, so seqs follow the order of `send` calls.
    next_seq: Mutex<u64>,
}

impl IdempotentProducer {
    /// Fails if the id cannot be sent as a header or the server would not accept the stream
    /// name: no batch could ever be delivered.
    pub fn new(
        client: Client,
        stream: &str,
        config: ProducerConfig,
    ) -> Result<IdempotentProducer, ClientError> {
        wire::stream_path(stream)?;
        let id_header = id_header(&config.id)?;
        let permits = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
        Ok(Self::build(
            client,
            stream.to_string(),
            config,
            id_header,
            permits,
        ))
    }

    fn build(
        client: Client,
        stream: String,
        config: ProducerConfig,
        id_header: HeaderValue,
        permits: Arc<Semaphore>,
    ) -> IdempotentProducer {
        let first = config.first_seq;
        IdempotentProducer {
            inner: Arc::new(ProducerInner {
                client,
                stream,
                window: SeqWindow::new(first),
                permits,
                next_seq: Mutex::new(first),
                id_header,
                config,
            }),
        }
    }

    /// The same producer id and stream at the next epoch, from seq 0: what to continue with
    /// after a failure (it fences this one). It shares this producer's in-flight slots, so
    /// the batches of this epoch still retrying count against `max_in_flight` too.
    pub fn next_epoch(&self) -> IdempotentProducer {
        let mut config = self.inner.config.clone();
        config.epoch = config.epoch.saturating_add(1);
        config.first_seq = 0;
        Self::build(
            self.inner.client.clone(),
            self.inner.stream.clone(),
            config,
            self.inner.id_header.clone(),
            self.inner.permits.clone(),
        )
    }

    /// The epoch this producer writes with.
    pub fn epoch(&self) -> u64 {
        self.inner.config.epoch
    }

    /// Waits for an in-flight slot, assigns the next sequence number and starts sending.
    /// Fails at once if an earlier batch failed for good (open a new producer, with a higher
    /// epoch, to continue). An empty batch is refused before it gets a seq: the server refuses
    /// it, and as a failed seq it would fail every later batch.
    pub async fn send(&self, records: Vec<BatchRecord>) -> Result<InFlight, ClientError> {
        if records.is_empty() {
            return Err(ClientError::Invalid(
                "empty batch: a producer batch needs at least one record".into(),
            ));
        }
        let body = encode_records(&records)?;
        let (seq, permit) = {
            let mut next = self.inner.next_seq.lock().await;
            let permit = self
                .inner
                .permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| ClientError::Transport("producer closed".into()))?;
            let seq = *next;
            *next += 1;
            (seq, permit)
        };
        if let Some(f) = self.inner.window.failed() {
            self.inner.window.complete(seq, false);
            return Err(predecessor_failed(seq, f));
        }
        let inner = self.inner.clone();
        let handle = tokio::spawn(async move { inner.deliver(seq, body, permit).await });
        Ok(InFlight { seq, handle })
    }

    /// Waits until an in-flight slot is free, so that a `send` from the same task right after
    /// starts at once (a caller timing its batches stamps them after this, not before the
    /// wait for the window).
    pub async fn ready(&self) {
        // The permit is released at once: only completions add slots, so it is still free
        // when this task calls `send`.
        let _ = self.inner.permits.acquire().await;
    }

    /// Waits until every batch sent so far finished; Err if any failed.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let next = *self.inner.next_seq.lock().await;
        self.inner
            .window
            .wait_predecessors(next)
            .await
            .map_err(|f| predecessor_failed(next, f))
    }

    pub fn stream(&self) -> &str {
        &self.inner.stream
    }
}

/// Longest producer id the server accepts, in bytes.
const MAX_PRODUCER_ID_LEN: usize = 256;

/// The id as a header, if the server takes it as it is: 1–256 bytes of visible ASCII (it
/// refuses anything else) without surrounding spaces (it trims them: `p ` would be `p`).
fn id_header(id: &str) -> Result<HeaderValue, ClientError> {
    let visible = id.bytes().all(|b| b.is_ascii_graphic() || b == b' ');
    let ok = !id.is_empty() && id.len() <= MAX_PRODUCER_ID_LEN && visible && id.trim() == id;
    let header = HeaderValue::from_str(id).ok().filter(|_| ok);
    header.ok_or_else(|| {
        ClientError::Invalid(format!(
            "producer id must be 1-{MAX_PRODUCER_ID_LEN} bytes of visible ASCII without surrounding spaces: id=`{id}`"
        ))
    })
}

impl ProducerInner {
    async fn deliver(
        &self,
        seq: u64,
        body: (Bytes, &'static str),
        _permit: OwnedSemaphorePermit,
    ) -> Result<ProducerAck, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(body.1));
        headers.insert(PICO_PRODUCER_ID, self.id_header.clone());
        headers.insert(PICO_PRODUCER_EPOCH, HeaderValue::from(self.config.epoch));
        headers.insert(PICO_PRODUCER_SEQ, HeaderValue::from(seq));
        drive(&self.window, seq, &self.config.retry, || {
            let headers = headers.clone();
            let body = body.0.clone();
            async move {
                let res = self
                    .client
                    .raw_request(Method::POST, &self.stream, headers, Some(body))
                    .await;
                classify(seq, res)
            }
        })
        .await
    }
}

/// Turns a response (or transport failure) into an [`Attempt`].
fn classify(seq: u64, res: Result<(u16, HeaderMap, Bytes), Failure>) -> Attempt<ProducerAck> {
    let (status, headers, body) = match res {
        Ok(r) => r,
        Err(Failure { error, unsent }) if is_transient(&error) => {
            return if unsent {
                Attempt::RetryUnsent(error)
            } else {
                Attempt::Retry(error)
            };
        }
        Err(f) => return Attempt::Fatal(f.error),
    };
    if (200..300).contains(&status) {
        let next = header_num(&headers, PICO_NEXT_SEQ);
        let start = header_num(&headers, PICO_START_SEQ);
        return match next {
            Some(next_seq) => Attempt::Done(ProducerAck {
                seq,
                append: AppendAck {
                    start_seq: start.unwrap_or(next_seq),
                    next_seq,
                },
                duplicate: headers
                    .get("pico-duplicate")
                    .is_some_and(|v| v.as_bytes() == b"true"),
            }),
            None => Attempt::Fatal(ClientError::Decode(
                "append response without Pico-Next-Seq".into(),
            )),
        };
    }
    let err = ClientError::from_response(status, &body);
    match &err {
        ClientError::Http { code, .. } if status == 409 && code == "sequence_gap" => {
            match header_num(&headers, "pico-expected-seq") {
                Some(expected) => Attempt::Gap { expected },
                // Without the header, assume a predecessor is missing: `drive` bounds this.
                None => Attempt::Gap {
                    expected: seq.saturating_sub(1),
                },
            }
        }
        e if is_transient(e) => match header_num(&headers, RETRY_AFTER.as_str()) {
            // Only the seconds form: PicoMQ sends no other.
            Some(secs) => Attempt::RetryAfter(err, Duration::from_secs(secs)),
            None => Attempt::Retry(err),
        },
        _ => Attempt::Fatal(err),
    }
}

fn header_num(h: &HeaderMap, name: &str) -> Option<u64> {
    h.get(name)?.to_str().ok()?.trim().parse().ok()
}

/// Binary batch framing when no record has a key (the binary framing carries none), JSON
/// otherwise.
fn encode_records(records: &[BatchRecord]) -> Result<(Bytes, &'static str), ClientError> {
    if records.iter().any(|r| r.key.is_some()) {
        return Ok((
            Bytes::from(wire::encode_json_batch(records)),
            CONTENT_TYPE_JSON_BATCH,
        ));
    }
    let recs: Vec<Record> = records
        .iter()
        .map(|r| Record {
            timestamp_ms: 0,
            key: None,
            value: r.body.clone(),
            headers: r
                .headers
                .iter()
                .map(|(k, v)| (k.clone(), Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
        })
        .collect();
    let body = pico_protocol::encode_binary(recs.iter().map(|r| (0, r)))
        .map_err(|e| ClientError::Transport(format!("cannot encode batch: {e}")))?;
    Ok((body, CONTENT_TYPE_BINARY_BATCH))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::tests::silent_server;
    use futures::FutureExt;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    fn quick_retries() -> RetryPolicy {
        RetryPolicy {
            backoff: Duration::from_millis(1),
            ..RetryPolicy::default()
        }
    }

    /// An id no request can carry (`p\n1`, not a header value) would fail the first batch
    /// and leave every later one waiting on it; one the server refuses (non-ASCII) or alters
    /// (spaces) would fail or merge producers. All are refused when the producer is built.
    #[test]
    fn producers_refuse_ids_and_names_no_request_can_carry() {
        let client = Client::new("http://127.0.0.1:9", crate::ClientOptions::default()).unwrap();
        let long = "p".repeat(MAX_PRODUCER_ID_LEN + 1);
        for id in ["p\n1", "producteur-é", "", " p", long.as_str()] {
            let config = ProducerConfig::new(id, 0, 4);
            let err = IdempotentProducer::new(client.clone(), "s", config).unwrap_err();
            assert!(
                matches!(err, ClientError::Invalid(ref m) if m.contains("producer id")),
                "{id:?}: {err:?}"
            );
        }
        let ok = "p".repeat(MAX_PRODUCER_ID_LEN);
        for id in ["bench-1 p0", ok.as_str()] {
            IdempotentProducer::new(client.clone(), "s", ProducerConfig::new(id, 0, 4)).unwrap();
        }
        let err = IdempotentProducer::new(client, "orders?x", ProducerConfig::new("p", 0, 4))
            .unwrap_err();
        assert!(matches!(err, ClientError::Invalid(_)), "{err:?}");
    }

    /// A batch whose sending stopped half-way (its task cancelled) still finishes its seq, so
    /// its successors fail instead of waiting for it forever.
    #[tokio::test]
    async fn a_dropped_drive_finishes_its_seq() {
        let w = SeqWindow::new(0);
        let policy = RetryPolicy::default();
        {
            let unanswered = drive(&w, 0, &policy, std::future::pending::<Attempt<()>>);
            let mut unanswered = std::pin::pin!(unanswered);
            assert!(futures::poll!(unanswered.as_mut()).is_pending());
        }
        assert_eq!(w.wait_predecessors(1).now_or_never(), Some(Err(0)));
    }

    /// A batch sent (and unanswered) before an earlier one failed may have been applied: it is
    /// not reported as "not written", or a caller resending abandoned batches would write it twice.
    /// One only ever refused as out of order is.
    #[tokio::test]
    async fn only_batches_certainly_not_written_are_abandoned() {
        let w = SeqWindow::new(0);
        w.complete(0, true);
        let err = drive(&w, 2, &quick_retries(), || {
            // Seq 1 fails for good while seq 2's attempt goes unanswered.
            w.complete(1, false);
            async { Attempt::<()>::Retry(ClientError::Timeout(Duration::from_secs(30))) }
        })
        .await
        .unwrap_err();
        assert!(
            matches!(
                err,
                ClientError::OutcomeUnknown {
                    seq: 2,
                    failed_seq: 1,
                    cause: None
                }
            ),
            "{err:?}"
        );
        assert!(err.is_outcome_unknown() && !err.is_abandoned() && !is_transient(&err));

        let w = SeqWindow::new(0);
        w.complete(0, true);
        let err = drive(&w, 2, &quick_retries(), || {
            w.complete(1, false);
            async { Attempt::<()>::Gap { expected: 1 } }
        })
        .await
        .unwrap_err();
        assert!(
            matches!(
                err,
                ClientError::Abandoned {
                    seq: 2,
                    failed_seq: 1
                }
            ),
            "{err:?}"
        );
    }

    /// A predecessor that gets no answer (until its request times out, maybe several times)
    /// must not turn its successor into a stream of refused resends: after a bounded number,
    /// the successor waits for it. Paused time: an hour of the clock passes at once.
    #[tokio::test(start_paused = true)]
    async fn gap_resends_are_bounded_while_a_predecessor_is_unanswered() {
        let w = SeqWindow::new(0);
        w.complete(0, true);
        let calls = Arc::new(AtomicU32::new(0));
        let arrived = Arc::new(AtomicBool::new(false));
        let successor = {
            let (w, calls, arrived) = (w.clone(), calls.clone(), arrived.clone());
            tokio::spawn(async move {
                drive(&w, 2, &RetryPolicy::default(), || {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let arrived = arrived.load(Ordering::SeqCst);
                    async move {
                        if arrived {
                            Attempt::Done(())
                        } else {
                            Attempt::Gap { expected: 1 }
                        }
                    }
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_secs(3600)).await;
        let sent = calls.load(Ordering::SeqCst);
        assert!(sent <= GAP_RESENDS_BEFORE_WAITING + 1, "{sent} sends");
        assert!(!successor.is_finished());
        // The predecessor is accepted at last: one more send, and the successor is done.
        arrived.store(true, Ordering::SeqCst);
        w.complete(1, true);
        successor.await.unwrap().unwrap();
        assert_eq!(calls.load(Ordering::SeqCst), sent + 1);
    }

    /// A fenced producer's batches still retrying keep their in-flight slots: its successor
    /// epoch shares them, so the two never have more than `max_in_flight` batches out.
    #[tokio::test]
    async fn the_next_epoch_shares_the_in_flight_slots() {
        let client = Client::new(&silent_server().await, crate::ClientOptions::default()).unwrap();
        let old = IdempotentProducer::new(client, "s", ProducerConfig::new("p", 4, 2)).unwrap();
        let _a = old.send(vec![BatchRecord::new("a")]).await.unwrap();
        let _b = old.send(vec![BatchRecord::new("b")]).await.unwrap();
        let new = old.next_epoch();
        assert_eq!(new.epoch(), 5);
        assert!(
            new.ready().now_or_never().is_none(),
            "the new epoch got a slot while 2 batches of the old one are unanswered"
        );
    }

    /// An attempt the server never answers times out and is resent with the same seq; the
    /// batches behind it go through once it is acknowledged.
    #[tokio::test]
    async fn an_unanswered_attempt_times_out_and_is_resent() {
        use axum::http::{HeaderMap as AxHeaders, StatusCode as AxStatus};
        let seen: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
        let handler = {
            let seen = seen.clone();
            move |h: AxHeaders| {
                let seen = seen.clone();
                async move {
                    let seq = producer_seq(&h);
                    let first = {
                        let mut seen = seen.lock().unwrap();
                        seen.push(seq);
                        seen.len() == 1
                    };
                    if first {
                        std::future::pending::<()>().await;
                    }
                    let next = (seq + 1).to_string();
                    (
                        AxStatus::OK,
                        [
                            ("pico-next-seq", next.clone()),
                            ("pico-start-seq", seq.to_string()),
                        ],
                    )
                }
            }
        };
        let base = serve(handler).await;
        // Long enough that only the request that never gets an answer times out, even on a
        // loaded machine.
        let options = crate::ClientOptions {
            request_timeout: Duration::from_secs(2),
            ..Default::default()
        };
        let client = Client::new(&base, options).unwrap();
        let mut config = ProducerConfig::new("p", 0, 3);
        let timeouts = Arc::new(AtomicU32::new(0));
        let counted = timeouts.clone();
        config.retry = RetryPolicy {
            on_retry: Some(Arc::new(move |e: &ClientError| {
                if matches!(e, ClientError::Timeout(_)) {
                    counted.fetch_add(1, Ordering::SeqCst);
                }
            })),
            ..quick_retries()
        };
        let producer = IdempotentProducer::new(client, "s", config).unwrap();
        let mut pending = Vec::new();
        for body in ["a", "b", "c"] {
            pending.push(producer.send(vec![BatchRecord::new(body)]).await.unwrap());
        }
        // A guard that turns a hang into a failure, not a measurement.
        tokio::time::timeout(Duration::from_secs(60), producer.flush())
            .await
            .expect("flush never returned")
            .unwrap();
        for (i, p) in pending.into_iter().enumerate() {
            assert_eq!(p.ack().await.unwrap().seq, i as u64);
        }
        assert!(timeouts.load(Ordering::SeqCst) >= 1);
        let seen = seen.lock().unwrap().clone();
        assert!(seen.iter().filter(|s| **s == 0).count() >= 2, "{seen:?}");
        let mut distinct = seen.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct, [0, 1, 2]);
    }

    #[tokio::test]
    async fn window_frontier_follows_out_of_order_completions() {
        let w = SeqWindow::new(0);
        w.complete(2, true);
        w.complete(1, true);
        let waiter = {
            let w = w.clone();
            tokio::spawn(async move { w.wait_predecessors(3).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "seq 0 is still in flight");
        w.complete(0, true);
        assert_eq!(waiter.await.unwrap(), Ok(()));
        w.complete(4, false);
        w.complete(3, true);
        assert_eq!(w.wait_predecessors(4).await, Ok(()));
        assert_eq!(w.wait_predecessors(9).await, Err(4));
    }

    #[tokio::test]
    async fn first_batch_of_an_epoch_goes_alone() {
        let w = SeqWindow::new(0);
        let first_done = std::sync::atomic::AtomicBool::new(false);
        let later = async {
            drive(&w, 1, &RetryPolicy::default(), || async {
                // A server still on the old epoch refuses a non-zero seq of the new one.
                if first_done.load(Ordering::SeqCst) {
                    Attempt::Done(1u64)
                } else {
                    Attempt::Fatal(ClientError::Decode("must start at seq 0".into()))
                }
            })
            .await
        };
        let first = async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let r = drive(&w, 0, &RetryPolicy::default(), || async {
                Attempt::Done(0u64)
            })
            .await;
            first_done.store(true, Ordering::SeqCst);
            r
        };
        let (a, b) = tokio::join!(later, first);
        assert_eq!((a.unwrap(), b.unwrap()), (1, 0));
    }

    #[tokio::test]
    async fn drive_resends_after_a_gap_until_the_predecessor_arrived() {
        let w = SeqWindow::new(0);
        // The epoch is established (its first batch went alone); pipelining applies from here.
        w.complete(0, true);
        let zero_arrived = std::sync::atomic::AtomicBool::new(false);
        let calls = AtomicU32::new(0);
        let early = async {
            drive(&w, 2, &RetryPolicy::default(), || async {
                calls.fetch_add(1, Ordering::SeqCst);
                // The server rejects seq 2 until seq 1 has arrived (not necessarily acked).
                if zero_arrived.load(Ordering::SeqCst) {
                    Attempt::Done(2u64)
                } else {
                    Attempt::Gap { expected: 1 }
                }
            })
            .await
        };
        let first = async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            zero_arrived.store(true, Ordering::SeqCst);
            // Seq 1's ack takes long: seq 2 must not wait for it.
            tokio::time::sleep(Duration::from_millis(300)).await;
            drive(&w, 1, &RetryPolicy::default(), || async {
                Attempt::Done(1u64)
            })
            .await
        };
        let started = std::time::Instant::now();
        let early_done = async {
            let r = early.await;
            (r, started.elapsed())
        };
        let ((a, a_time), b) = tokio::join!(early_done, first);
        assert_eq!((a.unwrap(), b.unwrap()), (2, 1));
        assert!(calls.load(Ordering::SeqCst) >= 2);
        assert!(
            a_time < Duration::from_millis(200),
            "seq 1 waited for seq 0's ack: {a_time:?}"
        );
    }

    #[tokio::test]
    async fn drive_gives_up_on_a_gap_that_persists_and_on_failed_predecessors() {
        let w = SeqWindow::new(0);
        w.complete(0, true);
        let err = drive(&w, 1, &RetryPolicy::default(), || async {
            Attempt::<()>::Gap { expected: 0 }
        })
        .await
        .unwrap_err();
        assert_eq!(err.status(), Some(409));
        let err = drive(&w, 2, &RetryPolicy::default(), || async {
            Attempt::Done(())
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("failed_seq=1"), "{err}");
        // Abandoned, not failed on its own: a caller counting failures counts seq 1 only, and
        // nothing retries it (it was never sent).
        assert!(
            matches!(
                err,
                ClientError::Abandoned {
                    seq: 2,
                    failed_seq: 1
                }
            ),
            "{err:?}"
        );
        assert!(!is_transient(&err));
    }

    /// Transient failures are resent with the same seq until the budget, counted from the
    /// first failure, is spent; the batch then fails as possibly written, the last error its
    /// cause. Paused time: the clock is exact.
    #[tokio::test(start_paused = true)]
    async fn drive_retries_transient_errors_with_the_same_seq() {
        let w = SeqWindow::new(0);
        let calls = AtomicU32::new(0);
        let resends = Arc::new(AtomicU32::new(0));
        let counted = resends.clone();
        let policy = RetryPolicy {
            budget: Duration::from_secs(5),
            backoff: Duration::from_millis(1),
            on_retry: Some(Arc::new(move |_: &ClientError| {
                counted.fetch_add(1, Ordering::SeqCst);
            })),
            ..RetryPolicy::default()
        };
        let v = drive(&w, 0, &policy, || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Attempt::Retry(ClientError::Transport("reset".into()))
            } else {
                Attempt::Done(7)
            }
        })
        .await
        .unwrap();
        assert_eq!(v, 7);
        assert_eq!(
            resends.load(Ordering::SeqCst),
            2,
            "two resends before the ack"
        );
        let started = Instant::now();
        let err = drive(&w, 1, &policy, || async {
            Attempt::<()>::Retry(ClientError::Transport("down".into()))
        })
        .await
        .unwrap_err();
        assert_eq!(started.elapsed(), policy.budget);
        assert!(
            matches!(
                &err,
                ClientError::OutcomeUnknown { seq: 1, failed_seq: 1, cause: Some(c) }
                    if matches!(&**c, ClientError::Transport(m) if m == "down")
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("down"), "{err}");
    }

    /// Each attempt's answer in turn.
    type Script = Vec<fn() -> Attempt<()>>;

    /// Each attempt's answer in turn, the last one repeated.
    fn scripted(script: Script) -> impl FnMut() -> std::future::Ready<Attempt<()>> {
        let mut i = 0;
        move || {
            let next = script[i.min(script.len() - 1)]();
            i += 1;
            std::future::ready(next)
        }
    }

    fn fenced() -> ClientError {
        ClientError::from_response(
            403,
            br#"{"error":"fenced","message":"stale producer epoch"}"#,
        )
    }

    /// A batch one of whose attempts may have been applied (unanswered, timed out, 5xx) ends
    /// with OutcomeUnknown whatever ends it: a refusal of a later attempt (fenced after
    /// next_epoch, a closed stream), or the budget. Only a batch no server can have applied
    /// ends with its own plain error. Before, the last raw error read "never written".
    #[tokio::test(start_paused = true)]
    async fn a_batch_that_may_be_written_fails_as_outcome_unknown() {
        let policy = RetryPolicy {
            budget: Duration::from_secs(3),
            ..RetryPolicy::default()
        };
        let maybe_written: Vec<Script> = vec![
            vec![
                || Attempt::Retry(ClientError::Timeout(Duration::from_secs(30))),
                || Attempt::Fatal(fenced()),
            ],
            vec![
                || Attempt::Retry(ClientError::Transport("connection reset".into())),
                || Attempt::RetryUnsent(ClientError::Transport("connection refused".into())),
                || Attempt::Fatal(ClientError::from_response(409, br#"{"error":"closed"}"#)),
            ],
            vec![
                || {
                    Attempt::RetryAfter(
                        ClientError::from_response(503, b""),
                        Duration::from_secs(1),
                    )
                },
                || Attempt::Fatal(fenced()),
            ],
            vec![|| Attempt::Retry(ClientError::from_response(503, b""))],
        ];
        for (i, script) in maybe_written.into_iter().enumerate() {
            let w = SeqWindow::new(4);
            let attempt = scripted(script);
            let err = drive(&w, 4, &policy, attempt).await.unwrap_err();
            let ClientError::OutcomeUnknown {
                seq: 4,
                failed_seq: 4,
                cause: Some(cause),
            } = &err
            else {
                panic!("script {i}: {err:?}");
            };
            assert!(
                err.to_string().contains(&cause.to_string()),
                "script {i}: the last error is kept: {err}"
            );
            assert!(!is_transient(&err) && err.is_outcome_unknown());
            assert_eq!(w.failed(), Some(4), "script {i}");
        }

        // Refused at once, or never reached a server: certainly not written.
        let not_written: Vec<Script> = vec![
            vec![|| Attempt::Fatal(fenced())],
            vec![
                || Attempt::RetryUnsent(ClientError::Transport("connection refused".into())),
                || Attempt::Fatal(fenced()),
            ],
        ];
        for script in not_written {
            let attempt = scripted(script);
            let err = drive(&SeqWindow::new(0), 0, &policy, attempt)
                .await
                .unwrap_err();
            assert_eq!(err.status(), Some(403), "{err:?}");
        }
        let attempt = scripted(vec![|| {
            Attempt::<()>::RetryUnsent(ClientError::Transport("connection refused".into()))
        }]);
        let err = drive(&SeqWindow::new(0), 0, &policy, attempt)
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Transport(_)), "{err:?}");
    }

    /// A stand-in server answering `POST /s` with `handler`; returns its base URL.
    async fn serve<H, T>(handler: H) -> String
    where
        H: axum::handler::Handler<T, ()>,
        T: 'static,
    {
        let app = axum::Router::new().route("/s", axum::routing::post(handler));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    fn producer_seq(h: &axum::http::HeaderMap) -> u64 {
        h["pico-producer-seq"].to_str().unwrap().parse().unwrap()
    }

    /// The same through the client: seq 0 is written but its answer is lost (a 503, as from a
    /// server that wrote it and failed before answering), then the resend is refused as
    /// fenced. And a batch sent to a port nobody listens on was never written.
    #[tokio::test]
    async fn a_lost_ack_then_a_refusal_reads_as_outcome_unknown() {
        use axum::http::{HeaderMap as AxHeaders, StatusCode as AxStatus};
        let written: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
        let handler = {
            let written = written.clone();
            move |h: AxHeaders| {
                let written = written.clone();
                async move {
                    let mut written = written.lock().unwrap();
                    if written.is_empty() {
                        written.push(producer_seq(&h));
                        return (AxStatus::SERVICE_UNAVAILABLE, String::new());
                    }
                    (
                        AxStatus::FORBIDDEN,
                        r#"{"error":"fenced","message":"stale producer epoch"}"#.to_string(),
                    )
                }
            }
        };
        let base = serve(handler).await;
        let client = Client::new(&base, crate::ClientOptions::default()).unwrap();
        let mut config = ProducerConfig::new("p", 0, 2);
        config.retry = quick_retries();
        let producer = IdempotentProducer::new(client, "s", config).unwrap();
        let err = producer
            .send(vec![BatchRecord::new("a")])
            .await
            .unwrap()
            .ack()
            .await
            .unwrap_err();
        assert!(
            matches!(
                &err,
                ClientError::OutcomeUnknown { seq: 0, failed_seq: 0, cause: Some(c) }
                    if c.status() == Some(403)
            ),
            "{err:?}"
        );
        assert_eq!(*written.lock().unwrap(), [0]);

        // Connection refused on every attempt: nothing can have been written.
        let closed = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap()
        };
        let client =
            Client::new(&format!("http://{closed}"), crate::ClientOptions::default()).unwrap();
        let mut config = ProducerConfig::new("p", 0, 2);
        config.retry = RetryPolicy {
            budget: Duration::from_millis(200),
            ..quick_retries()
        };
        let producer = IdempotentProducer::new(client, "s", config).unwrap();
        let err = producer
            .send(vec![BatchRecord::new("a")])
            .await
            .unwrap()
            .ack()
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Transport(_)), "{err:?}");
    }

    /// The budget outlasts a server restart: a batch refused for 20 s of clock goes through,
    /// resent at most `max_backoff` apart (8 attempts within ~2.5 s used to give up first).
    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_resent_through_a_server_restart() {
        let started = Instant::now();
        let down = Duration::from_secs(20);
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let policy = RetryPolicy::default();
        let v = drive(&SeqWindow::new(0), 0, &policy, || {
            let now = Instant::now();
            sent.lock().unwrap().push(now);
            std::future::ready(if now - started < down {
                Attempt::RetryUnsent(ClientError::Transport("connection refused".into()))
            } else {
                Attempt::Done(1)
            })
        })
        .await
        .unwrap();
        assert_eq!(v, 1);
        let sent = sent.lock().unwrap();
        let gaps: Vec<Duration> = sent.windows(2).map(|p| p[1] - p[0]).collect();
        assert!(gaps.iter().all(|g| *g <= policy.max_backoff), "{gaps:?}");
        assert!(sent.len() < 40, "{} attempts", sent.len());
    }

    /// A 503's Retry-After sets the pause before the resend, within what is left of the
    /// budget. Paused time.
    #[tokio::test(start_paused = true)]
    async fn retry_after_sets_the_pause_within_the_budget() {
        let sent = Arc::new(std::sync::Mutex::new(Vec::new()));
        let calls = AtomicU32::new(0);
        let policy = RetryPolicy {
            budget: Duration::from_secs(10),
            ..RetryPolicy::default()
        };
        drive(&SeqWindow::new(0), 0, &policy, || {
            sent.lock().unwrap().push(Instant::now());
            std::future::ready(if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Attempt::RetryAfter(ClientError::from_response(503, b""), Duration::from_secs(3))
            } else {
                Attempt::Done(())
            })
        })
        .await
        .unwrap();
        let gaps: Vec<Duration> = {
            let sent = sent.lock().unwrap();
            sent.windows(2).map(|p| p[1] - p[0]).collect()
        };
        assert_eq!(gaps, [Duration::from_secs(3); 2]);

        // Asked to come back after the budget: one resend, at its end.
        sent.lock().unwrap().clear();
        let started = Instant::now();
        let err = drive(&SeqWindow::new(0), 0, &policy, || {
            sent.lock().unwrap().push(Instant::now());
            std::future::ready(Attempt::<()>::RetryAfter(
                ClientError::from_response(503, b""),
                Duration::from_secs(60),
            ))
        })
        .await
        .unwrap_err();
        assert!(err.is_outcome_unknown(), "{err:?}");
        assert_eq!(*sent.lock().unwrap(), [started, started + policy.budget]);
    }

    /// A server answering 503 with `Retry-After: 1` for 3 s (a restart): the producer
    /// resends about once a second, not on its own faster schedule, and the batch goes
    /// through (8 attempts used to be spent in ~2.5 s).
    #[tokio::test]
    async fn the_producer_honours_retry_after_through_a_restart() {
        use axum::http::StatusCode as AxStatus;
        let first: Arc<std::sync::Mutex<Option<std::time::Instant>>> = Arc::default();
        let requests = Arc::new(AtomicU32::new(0));
        let handler = {
            let (first, requests) = (first.clone(), requests.clone());
            move || {
                let (first, requests) = (first.clone(), requests.clone());
                async move {
                    requests.fetch_add(1, Ordering::SeqCst);
                    let first = *first
                        .lock()
                        .unwrap()
                        .get_or_insert_with(std::time::Instant::now);
                    if first.elapsed() < Duration::from_secs(3) {
                        return (AxStatus::SERVICE_UNAVAILABLE, [("retry-after", "1")]);
                    }
                    (AxStatus::OK, [("pico-next-seq", "1")])
                }
            }
        };
        let client = Client::new(&serve(handler).await, crate::ClientOptions::default()).unwrap();
        let producer =
            IdempotentProducer::new(client, "s", ProducerConfig::new("p", 0, 1)).unwrap();
        let ack = producer
            .send(vec![BatchRecord::new("a")])
            .await
            .unwrap()
            .ack()
            .await
            .unwrap();
        assert_eq!(ack.seq, 0);
        // At least 1 s apart, 3 s refused: at most 4 refused attempts and the accepted one.
        let n = requests.load(Ordering::SeqCst);
        assert!((2..=5).contains(&n), "{n} requests");
    }

    /// 503 answers carry the server's Retry-After (seconds) into the attempt.
    #[test]
    fn a_503_carries_its_retry_after() {
        let answer = |retry_after: Option<&'static str>| {
            let mut h = HeaderMap::new();
            if let Some(v) = retry_after {
                h.insert(RETRY_AFTER, HeaderValue::from_static(v));
            }
            classify(0, Ok((503, h, Bytes::new())))
        };
        assert!(
            matches!(answer(Some("2")), Attempt::RetryAfter(_, d) if d == Duration::from_secs(2))
        );
        assert!(matches!(answer(None), Attempt::Retry(_)));
        // The date form is not used by PicoMQ: the own backoff applies.
        assert!(matches!(
            answer(Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            Attempt::Retry(_)
        ));
    }

    /// An empty batch is refused before it takes a seq: the server would refuse it (400), and
    /// that failure would have failed every later batch until `next_epoch`.
    #[tokio::test]
    async fn an_empty_batch_is_refused_and_the_producer_stays_usable() {
        use axum::http::{HeaderMap as AxHeaders, StatusCode as AxStatus};
        let handler = |h: AxHeaders, body: axum::body::Bytes| async move {
            let seq = producer_seq(&h);
            if pico_protocol::decode_binary(&body).unwrap().is_empty() {
                return (
                    AxStatus::BAD_REQUEST,
                    [("pico-next-seq", String::new())],
                    r#"{"error":"bad_request","message":"empty append"}"#,
                );
            }
            (AxStatus::OK, [("pico-next-seq", (seq + 1).to_string())], "")
        };
        let client = Client::new(&serve(handler).await, crate::ClientOptions::default()).unwrap();
        let producer =
            IdempotentProducer::new(client, "s", ProducerConfig::new("p", 0, 2)).unwrap();
        let err = producer.send(vec![]).await.unwrap_err();
        assert!(
            matches!(&err, ClientError::Invalid(m) if m.contains("empty batch")),
            "{err:?}"
        );
        let ack = producer
            .send(vec![BatchRecord::new("a")])
            .await
            .unwrap()
            .ack()
            .await
            .unwrap();
        assert_eq!(ack.seq, 0, "the empty batch took no seq");
        producer.flush().await.unwrap();
    }

    /// A stand-in server with the producer rules of the surface. Requests sleep a
    /// seq-dependent time before being decided, so later batches often overtake earlier ones;
    /// seq 7 is applied but answered 503 once (a lost ack), so its retry must be deduplicated.
    async fn reordering_server() -> (String, Arc<std::sync::Mutex<Vec<u64>>>) {
        use axum::http::{HeaderMap as AxHeaders, StatusCode as AxStatus};
        let applied: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
        let last: Arc<std::sync::Mutex<Option<u64>>> = Arc::default();
        let lost_ack_sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let handler = {
            let applied = applied.clone();
            move |h: AxHeaders, body: axum::body::Bytes| {
                let applied = applied.clone();
                let last = last.clone();
                let lost_ack_sent = lost_ack_sent.clone();
                async move {
                    let seq = producer_seq(&h);
                    assert_eq!(h["pico-producer-epoch"], "3");
                    assert_eq!(h["content-type"], CONTENT_TYPE_BINARY_BATCH);
                    assert_eq!(pico_protocol::decode_binary(&body).unwrap().len(), 2);
                    tokio::time::sleep(Duration::from_millis((seq * 7) % 5)).await;
                    let mut last = last.lock().unwrap();
                    let expected = last.map_or(0, |l| l + 1);
                    let n = applied.lock().unwrap().len();
                    // A duplicate, answered as one whose place is unknown: the tail, no start.
                    if seq < expected {
                        return (
                            AxStatus::OK,
                            [
                                ("pico-next-seq", (n * 2).to_string()),
                                ("pico-duplicate", "true".to_string()),
                            ],
                            String::new(),
                        );
                    }
                    if seq > expected {
                        return (
                            AxStatus::CONFLICT,
                            [
                                ("pico-expected-seq", expected.to_string()),
                                ("pico-received-seq", seq.to_string()),
                            ],
                            r#"{"error":"sequence_gap","message":"gap"}"#.to_string(),
                        );
                    }
                    *last = Some(seq);
                    applied.lock().unwrap().push(seq);
                    drop(last);
                    if seq == 7 && !lost_ack_sent.swap(true, Ordering::SeqCst) {
                        return (
                            AxStatus::SERVICE_UNAVAILABLE,
                            [("x-a", String::new()), ("x-b", String::new())],
                            String::new(),
                        );
                    }
                    let n = n + 1;
                    let (next, start) = ((n * 2).to_string(), (n * 2 - 2).to_string());
                    (
                        AxStatus::OK,
                        [("pico-next-seq", next), ("pico-start-seq", start)],
                        String::new(),
                    )
                }
            }
        };
        (serve(handler).await, applied)
    }

    #[tokio::test]
    async fn pipelined_producer_survives_reordering_and_lost_acks() {
        let (base, applied) = reordering_server().await;
        let client = Client::new(&base, crate::ClientOptions::default()).unwrap();
        let mut config = ProducerConfig::new("p1", 3, 5);
        config.retry.backoff = Duration::from_millis(1);
        let retries = Arc::new(AtomicU32::new(0));
        let counted = retries.clone();
        config.retry.on_retry = Some(Arc::new(move |_: &ClientError| {
            counted.fetch_add(1, Ordering::SeqCst);
        }));
        let producer = IdempotentProducer::new(client, "s", config).unwrap();
        let mut pending = Vec::new();
        for _ in 0..40 {
            let batch = vec![BatchRecord::new("a"), BatchRecord::new("b")];
            pending.push(producer.send(batch).await.unwrap());
        }
        producer.flush().await.unwrap();
        for (i, p) in pending.into_iter().enumerate() {
            let ack = p.ack().await.unwrap();
            assert_eq!(ack.seq, i as u64);
            // Its lost ack made seq 7's retry a duplicate, which the server says in a header.
            assert_eq!(ack.duplicate, i == 7, "seq {i}");
        }
        // The 503 is one retry; resends after an ordering gap are none.
        assert_eq!(retries.load(Ordering::SeqCst), 1);
        // Every batch exactly once, in producer order, despite gaps and the retried seq 7.
        assert_eq!(*applied.lock().unwrap(), (0..40).collect::<Vec<u64>>());
    }
}
