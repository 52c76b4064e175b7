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

use crate::client::Client;
use crate::error::ClientError;
use crate::types::{AppendAck, BatchRecord};
use crate::wire::{self, *};
use bytes::Bytes;
use pico_protocol::Record;
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Mutex, OwnedSemaphorePermit, Semaphore, watch};

/// First pause before resending a batch that overtook a predecessor; doubles per resend.
const GAP_PAUSE: Duration = Duration::from_micros(500);
const GAP_PAUSE_MAX_SHIFT: u32 = 5;

/// Called with each transient failure before the batch is resent.
pub type RetryHook = Arc<dyn Fn(&ClientError) + Send + Sync>;

/// How a producer retries.
#[derive(Clone)]
pub struct RetryPolicy {
    /// Attempts per batch for transient failures (transport errors, 503, 5xx).
    pub max_attempts: u32,
    /// First backoff; doubles per attempt.
    pub backoff: Duration,
    /// Called before each resend after a transient failure (not after ordering gaps), so a
    /// caller can count what the retries hide: a batch acknowledged in the end looks clean.
    pub on_retry: Option<RetryHook>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 8,
            backoff: Duration::from_millis(20),
            on_retry: None,
        }
    }
}

impl std::fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_attempts", &self.max_attempts)
            .field("backoff", &self.backoff)
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
    /// Transient: retry the same (id, epoch, seq) after a backoff.
    Retry(ClientError),
    /// Permanent: the batch and everything after it fail.
    Fatal(ClientError),
}

/// Sends sequenced batch `seq` with `attempt` until it is accepted, handling reordering (gap →
/// wait for predecessors → resend) and transient failures (backoff → resend). Records the
/// outcome in `window`.
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
    // The first batch of an epoch goes alone: a server that still holds an older epoch answers
    // a later seq of the new epoch with "must start at seq 0" (400), which is not a reordering
    // gap the pipeline could wait out. Pipelining starts once the epoch is established.
    if seq > window.first
        && let Err(f) = window.wait_predecessors(window.first + 1).await
    {
        window.complete(seq, false);
        return Err(predecessor_failed(seq, f));
    }
    let mut transient = 0u32;
    let mut gap_resends = 0u32;
    // A gap seen after all predecessors finished means the server lost or never had them.
    let mut gap_after_predecessors = false;
    loop {
        if let Some(f) = window.failed().filter(|f| *f < seq) {
            window.complete(seq, false);
            return Err(predecessor_failed(seq, f));
        }
        match attempt().await {
            Attempt::Done(v) => {
                window.complete(seq, true);
                return Ok(v);
            }
            Attempt::Gap { expected } => {
                if expected >= seq || gap_after_predecessors {
                    window.complete(seq, false);
                    return Err(ClientError::Http {
                        status: 409,
                        code: "sequence_gap".into(),
                        message: format!(
                            "producer sequence gap the pipeline cannot repair: expected={expected} received={seq}"
                        ),
                    });
                }
                // The predecessor is usually just behind on another connection: resend after a
                // short pause, or as soon as every predecessor finished, whichever comes first.
                // Waiting for the predecessors' acks alone would serialize the pipeline: each
                // batch would wait a whole durable round trip behind the one before.
                let pause = GAP_PAUSE * (1u32 << gap_resends.min(GAP_PAUSE_MAX_SHIFT));
                gap_resends += 1;
                tokio::select! {
                    done = window.wait_predecessors(seq) => {
                        if let Err(f) = done {
                            window.complete(seq, false);
                            return Err(predecessor_failed(seq, f));
                        }
                        gap_after_predecessors = true;
                    }
                    _ = tokio::time::sleep(pause) => {}
                }
            }
            Attempt::Retry(e) => {
                transient += 1;
                if transient >= policy.max_attempts {
                    window.complete(seq, false);
                    return Err(e);
                }
                tracing::debug!(seq, attempt = transient, error = %e, "producer batch retry");
                if let Some(hook) = &policy.on_retry {
                    hook(&e);
                }
                let shift = transient.saturating_sub(1).min(6);
                tokio::time::sleep(policy.backoff * (1u32 << shift)).await;
            }
            Attempt::Fatal(e) => {
                window.complete(seq, false);
                return Err(e);
            }
        }
    }
}

fn predecessor_failed(seq: u64, failed: u64) -> ClientError {
    ClientError::Abandoned {
        seq,
        failed_seq: failed,
    }
}

/// Is this error worth retrying with the same sequence number?
pub fn is_transient(e: &ClientError) -> bool {
    match e {
        ClientError::Transport(_) => true,
        ClientError::Http { status, .. } => *status == 503 || *status == 502 || *status == 500,
        ClientError::Decode(_) | ClientError::Abandoned { .. } => false,
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
    /// Offsets of the append; for a duplicate (a retry the server had already applied) both
    /// are the stream's tail at that time.
    pub append: AppendAck,
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
    window: SeqWindow,
    permits: Arc<Semaphore>,
    /// Held while taking a permit and a seq, so seqs follow the order of `send` calls.
    next_seq: Mutex<u64>,
}

impl IdempotentProducer {
    pub fn new(client: Client, stream: &str, config: ProducerConfig) -> IdempotentProducer {
        let first = config.first_seq;
        let permits = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
        IdempotentProducer {
            inner: Arc::new(ProducerInner {
                client,
                stream: stream.to_string(),
                window: SeqWindow::new(first),
                permits,
                next_seq: Mutex::new(first),
                config,
            }),
        }
    }

    /// Waits for an in-flight slot, assigns the next sequence number and starts sending.
    /// Fails at once if an earlier batch failed for good (open a new producer, with a higher
    /// epoch, to continue).
    pub async fn send(&self, records: Vec<BatchRecord>) -> Result<InFlight, ClientError> {
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

impl ProducerInner {
    async fn deliver(
        &self,
        seq: u64,
        body: (Bytes, &'static str),
        _permit: OwnedSemaphorePermit,
    ) -> Result<ProducerAck, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(body.1));
        headers.insert(
            H_PRODUCER_ID,
            HeaderValue::from_str(&self.config.id).map_err(|_| {
                ClientError::Transport(format!(
                    "producer id not allowed in a header: id=`{}`",
                    self.config.id
                ))
            })?,
        );
        headers.insert(H_PRODUCER_EPOCH, HeaderValue::from(self.config.epoch));
        headers.insert(H_PRODUCER_SEQ, HeaderValue::from(seq));
        let path = wire::stream_path(&self.stream);
        drive(&self.window, seq, &self.config.retry, || {
            let headers = headers.clone();
            let body = body.0.clone();
            let path = path.as_str();
            async move {
                let res = self
                    .client
                    .raw_request(Method::POST, path, headers, Some(body))
                    .await;
                classify(seq, res)
            }
        })
        .await
    }
}

/// Turns a response (or transport failure) into an [`Attempt`].
fn classify(seq: u64, res: Result<(u16, HeaderMap, Bytes), ClientError>) -> Attempt<ProducerAck> {
    let (status, headers, body) = match res {
        Ok(r) => r,
        Err(e) if is_transient(&e) => return Attempt::Retry(e),
        Err(e) => return Attempt::Fatal(e),
    };
    if (200..300).contains(&status) {
        let next = header_num(&headers, H_NEXT_SEQ);
        let start = header_num(&headers, H_START_SEQ);
        return match next {
            Some(next_seq) => Attempt::Done(ProducerAck {
                seq,
                append: AppendAck {
                    start_seq: start.unwrap_or(next_seq),
                    next_seq,
                },
                duplicate: start == Some(next_seq),
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
        e if is_transient(e) => Attempt::Retry(err),
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
            BATCH_JSON_CONTENT_TYPE,
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
    Ok((body, BATCH_BINARY_CONTENT_TYPE))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

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

    #[tokio::test]
    async fn drive_retries_transient_errors_with_the_same_seq() {
        let w = SeqWindow::new(0);
        let calls = AtomicU32::new(0);
        let resends = Arc::new(AtomicU32::new(0));
        let counted = resends.clone();
        let policy = RetryPolicy {
            max_attempts: 3,
            backoff: Duration::from_millis(1),
            on_retry: Some(Arc::new(move |_: &ClientError| {
                counted.fetch_add(1, Ordering::SeqCst);
            })),
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
        let err = drive(&w, 1, &policy, || async {
            Attempt::<()>::Retry(ClientError::Transport("down".into()))
        })
        .await
        .unwrap_err();
        assert!(err.to_string().contains("down"));
        // The third failure is the error itself, not a resend.
        assert_eq!(resends.load(Ordering::SeqCst), 4);
    }

    /// A stand-in server with the producer rules of the surface. Requests sleep a
    /// seq-dependent time before being decided, so later batches often overtake earlier ones;
    /// seq 7 is applied but answered 503 once (a lost ack), so its retry must be deduplicated.
    async fn reordering_server() -> (String, Arc<std::sync::Mutex<Vec<u64>>>) {
        use axum::http::{HeaderMap as AxHeaders, StatusCode as AxStatus};
        let applied: Arc<std::sync::Mutex<Vec<u64>>> = Arc::default();
        let last: Arc<std::sync::Mutex<Option<u64>>> = Arc::default();
        let lost_ack_sent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let app = {
            let applied = applied.clone();
            axum::Router::new().route(
                "/s",
                axum::routing::post(move |h: AxHeaders, body: axum::body::Bytes| {
                    let applied = applied.clone();
                    let last = last.clone();
                    let lost_ack_sent = lost_ack_sent.clone();
                    async move {
                        let seq: u64 = h["pico-producer-seq"].to_str().unwrap().parse().unwrap();
                        assert_eq!(h["pico-producer-epoch"], "3");
                        assert_eq!(h["content-type"], BATCH_BINARY_CONTENT_TYPE);
                        assert_eq!(pico_protocol::decode_binary(&body).unwrap().len(), 2);
                        tokio::time::sleep(Duration::from_millis((seq * 7) % 5)).await;
                        let mut last = last.lock().unwrap();
                        let expected = last.map_or(0, |l| l + 1);
                        let n = applied.lock().unwrap().len();
                        let ok = |dup: bool| {
                            let next = (n * 2).to_string();
                            let start = if dup {
                                next.clone()
                            } else {
                                (n * 2 - 2).to_string()
                            };
                            (
                                AxStatus::OK,
                                [("pico-next-seq", next), ("pico-start-seq", start)],
                                String::new(),
                            )
                        };
                        if seq < expected {
                            return ok(true);
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
                }),
            )
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), applied)
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
        let producer = IdempotentProducer::new(client, "s", config);
        let mut pending = Vec::new();
        for _ in 0..40 {
            let batch = vec![BatchRecord::new("a"), BatchRecord::new("b")];
            pending.push(producer.send(batch).await.unwrap());
        }
        producer.flush().await.unwrap();
        for (i, p) in pending.into_iter().enumerate() {
            let ack = p.ack().await.unwrap();
            assert_eq!(ack.seq, i as u64);
        }
        // The 503 is one retry; resends after an ordering gap are none.
        assert_eq!(retries.load(Ordering::SeqCst), 1);
        // Every batch exactly once, in producer order, despite gaps and the retried seq 7.
        assert_eq!(*applied.lock().unwrap(), (0..40).collect::<Vec<u64>>());
    }
}
