//! Writers: plain append loops (one request at a time each) and pipelined idempotent producers.

use super::append_conn::Appender;
use super::payload::{self, now_us};
use super::stats::{self, histogram};
use super::target::chain;
use super::{Ctx, Pacer};
use crate::cli::Protocol;
use bytes::Bytes;
use hdrhistogram::Histogram;
use pico_client::client::DEFAULT_REQUEST_TIMEOUT;
use pico_client::{
    BatchRecord, ClientError, IdempotentProducer, ProducerConfig, RetryPolicy, SeqWindow, drive,
};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// Pause after a failed request, so a dead server does not turn into a busy loop.
pub(super) const ERROR_PAUSE: Duration = Duration::from_millis(50);

impl Pacer {
    /// Waits for the slot of the next `bytes`; returns the time latency is measured from.
    ///
    /// A writer that is behind its schedule (the server is slow) measures from the intended
    /// send time, so a server that falls behind is not hidden by the pacing. A writer that is
    /// early sleeps, and measures from when it woke: tokio's timer fires up to a millisecond or
    /// two after the deadline, and that lateness is the client's, not the server's.
    pub async fn wait(&self, bytes: u64) -> u64 {
        let before = self
            .reserved
            .fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        let at = self.start_us.load(std::sync::atomic::Ordering::Relaxed)
            + (before as f64 / self.bytes_per_us) as u64;
        let now = now_us();
        if at > now {
            tokio::time::sleep(Duration::from_micros(at - now)).await;
            return now_us();
        }
        at
    }
}

pub(super) async fn send_time(ctx: &Ctx) -> u64 {
    match &ctx.pacer {
        Some(p) => p.wait((ctx.batch * ctx.record_size) as u64).await,
        None => now_us(),
    }
}

/// How a plain loop sends its appends.
pub enum Transport {
    /// A connection of its own over HTTP/1.1 ([`Appender`]): the leanest path.
    H1(Appender),
    /// reqwest, for HTTP/2 (loops multiplexed on shared connections) and `https://`.
    Reqwest(reqwest::Client),
}

impl Transport {
    async fn append(
        &mut self,
        ctx: &Ctx,
        stream: &str,
        body: Bytes,
        ct: &'static str,
    ) -> Result<(), String> {
        match self {
            Transport::H1(a) => a.append(&ctx.target.url(stream), body, ct).await,
            Transport::Reqwest(http) => ctx.target.append(http, stream, body, ct).await,
        }
    }
}

/// One request at a time; request `i` of loop `k` goes to stream `(k + i·loops) mod streams`.
pub async fn plain_loop(ctx: Arc<Ctx>, mut transport: Transport, k: usize, loops: usize) {
    let mut h = histogram();
    let n = ctx.streams.len();
    let mut i = 0usize;
    let mut stop = ctx.stop.clone();
    loop {
        if ctx.stopped() {
            break;
        }
        let stream = &ctx.streams[(k + i * loops) % n];
        i += 1;
        let t0 = tokio::select! {
            t = send_time(&ctx) => t,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (body, ct) = ctx.target.body(ctx.batch, ctx.record_size, t0);
        let res = tokio::select! {
            r = transport.append(&ctx, stream, body, ct) => r,
            _ = stop.wait_for(|s| *s) => {
                unfinished(&ctx, t0);
                break;
            }
        };
        if !batch_done(&ctx, &mut h, t0, Outcome::of_plain(res)) {
            tokio::time::sleep(ERROR_PAUSE).await;
        }
    }
    ctx.lat.merge_ack(&h);
}

/// What became of one request or producer batch.
pub(super) enum Outcome {
    Acked,
    Failed(String),
    /// A producer batch given up unsent because an earlier one of its producer failed.
    Abandoned,
    /// A producer batch given up after an earlier one failed, but sent first: maybe written.
    Unknown,
}

impl Outcome {
    fn of_plain(res: Result<(), String>) -> Outcome {
        match res {
            Ok(()) => Outcome::Acked,
            Err(e) => Outcome::Failed(e),
        }
    }

    /// A producer batch's outcome; `what` prefixes its error.
    fn of_producer(res: Result<(), ClientError>, what: &str) -> Outcome {
        match res {
            Ok(()) => Outcome::Acked,
            Err(e) if e.is_abandoned() => Outcome::Abandoned,
            Err(e) if e.is_outcome_unknown() => Outcome::Unknown,
            Err(e) => Outcome::Failed(format!("{what}: {e}")),
        }
    }
}

/// Counts a request or batch sent at `t0` once its ack or failure is in (its latency into
/// `hist` if in the window); true if it was acknowledged. A failed producer batch is one
/// error, and each successor abandoned after it is counted apart, so one failure does not
/// read as `in_flight` of them.
pub(super) fn batch_done(ctx: &Ctx, hist: &mut Histogram<u64>, t0: u64, res: Outcome) -> bool {
    let t1 = now_us();
    let in_window = ctx.in_window(t1);
    match res {
        Outcome::Acked => {
            if in_window {
                stats::record(hist, t1.saturating_sub(t0));
            }
            ctx.counters.add_write(
                ctx.batch as u64,
                (ctx.batch * ctx.record_size) as u64,
                in_window,
            );
            true
        }
        Outcome::Failed(e) => {
            ctx.counters.error(true, in_window, || e);
            false
        }
        Outcome::Abandoned => {
            ctx.counters.abandoned(in_window);
            false
        }
        Outcome::Unknown => {
            ctx.counters.outcome_unknown(in_window);
            false
        }
    }
}

/// Counts a request or batch sent at `t0` and still unanswered when the run stops: its age is
/// a latency sample (a server that stalls at the end must not show a clean tail), and the
/// report gives how many there were and the oldest age. One sent after the window closed is
/// not part of the measurement.
pub(super) fn unfinished(ctx: &Ctx, t0: u64) {
    if t0 >= ctx.measure_end.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let age = now_us().saturating_sub(t0);
    ctx.counters.unfinished(age);
    ctx.lat.record_ack(age);
}

/// The producers' retry policy: pico-client's default, with every resend after a transient
/// failure counted (a batch acknowledged in the end would otherwise look clean).
fn counted_retries(ctx: &Arc<Ctx>) -> RetryPolicy {
    let ctx = ctx.clone();
    RetryPolicy {
        on_retry: Some(Arc::new(move |_: &ClientError| {
            ctx.counters.retried(ctx.in_window(now_us()));
        })),
        ..RetryPolicy::default()
    }
}

/// [`batch_done`] for a producer's histogram shared with its ack tasks.
fn shared_batch_done(ctx: &Ctx, hist: &Mutex<Histogram<u64>>, t0: u64, res: Outcome) {
    let mut h = hist.lock().unwrap_or_else(|p| p.into_inner());
    batch_done(ctx, &mut h, t0, res);
}

/// A Pico idempotent producer ([`IdempotentProducer`]) with `in_flight` batches in flight.
pub async fn pico_producer_loop(ctx: Arc<Ctx>, client: pico_client::Client, idx: usize) {
    let stream = ctx.streams[idx % ctx.streams.len()].clone();
    let hist = Arc::new(Mutex::new(histogram()));
    let mut cfg = ProducerConfig::new(format!("{}-p{idx}", ctx.run_id), 0, ctx.in_flight);
    cfg.retry = counted_retries(&ctx);
    let mut producer = match IdempotentProducer::new(client, &stream, cfg) {
        Ok(p) => p,
        Err(e) => {
            ctx.counters.error(true, false, || format!("producer: {e}"));
            return;
        }
    };
    // Each batch's wait for its ack, so the loop can hand in every outcome (unfinished ones
    // included) before it merges the histogram.
    let mut acks = JoinSet::new();
    let mut stop = ctx.stop.clone();
    while !ctx.stopped() {
        while acks.try_join_next().is_some() {}
        if ctx.pacer.is_none() {
            // `send` first waits for a window slot. With the window full that wait is the
            // previous batch's round trip (the client's own limit), not this batch's latency:
            // unpaced, the batch is stamped once the slot is free, as the DS loop takes its
            // permit before reading the clock; paced, it keeps its scheduled time.
            tokio::select! {
                () = producer.ready() => {}
                _ = stop.wait_for(|s| *s) => break,
            }
        }
        let t0 = tokio::select! {
            t = send_time(&ctx) => t,
            _ = stop.wait_for(|s| *s) => break,
        };
        let records: Vec<BatchRecord> = (0..ctx.batch)
            .map(|_| BatchRecord::new(payload::record(ctx.record_size, t0)))
            .collect();
        let sent = tokio::select! {
            s = producer.send(records) => s,
            _ = stop.wait_for(|s| *s) => break,
        };
        match sent {
            Ok(in_flight) => {
                let ctx = ctx.clone();
                let hist = hist.clone();
                acks.spawn(async move {
                    let mut stop = ctx.stop.clone();
                    tokio::select! {
                        // At the stop, whatever is still pending is unfinished.
                        biased;
                        _ = stop.wait_for(|s| *s) => unfinished(&ctx, t0),
                        res = in_flight.ack() => {
                            let outcome = Outcome::of_producer(res.map(drop), "producer");
                            shared_batch_done(&ctx, &hist, t0, outcome);
                        }
                    }
                });
            }
            Err(e) => {
                // The producer is poisoned by a failed batch: continue as a new incarnation,
                // which shares the in-flight slots with the old one's batches still retrying.
                // This batch was never sent; the failure that poisoned it is counted already.
                shared_batch_done(&ctx, &hist, t0, Outcome::of_producer(Err(e), "producer"));
                tokio::time::sleep(ERROR_PAUSE).await;
                producer = producer.next_epoch();
            }
        }
    }
    while acks.join_next().await.is_some() {}
    let h = hist.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ctx.lat.merge_ack(&h);
}

/// A Durable Streams idempotent producer: same pipelining core as the Pico one
/// ([`SeqWindow`] + [`drive`]), DS headers and status codes.
pub async fn ds_producer_loop(ctx: Arc<Ctx>, http: reqwest::Client, idx: usize) {
    let stream = ctx.streams[idx % ctx.streams.len()].clone();
    let url = ctx.target.url(&stream);
    let hist = Arc::new(Mutex::new(histogram()));
    let permits = Arc::new(Semaphore::new(ctx.in_flight.max(1)));
    let [h_id, h_epoch, h_seq, _] = ctx.target.producer_headers();
    let id = format!("{}-p{idx}", ctx.run_id);
    let mut epoch = 0u64;
    let mut window = SeqWindow::new(0);
    let mut seq = 0u64;
    let policy = counted_retries(&ctx);
    let mut acks = JoinSet::new();
    let mut stop = ctx.stop.clone();
    while !ctx.stopped() {
        while acks.try_join_next().is_some() {}
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = stop.wait_for(|s| *s) => break,
        };
        if window.failed().is_some() {
            // Start over as a new incarnation: a higher epoch restarts at seq 0.
            tokio::time::sleep(ERROR_PAUSE).await;
            epoch += 1;
            window = SeqWindow::new(0);
            seq = 0;
        }
        let t0 = tokio::select! {
            t = send_time(&ctx) => t,
            _ = stop.wait_for(|s| *s) => break,
        };
        let (body, ct) = ctx.target.body(ctx.batch, ctx.record_size, t0);
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(ct));
        if let Ok(v) = HeaderValue::from_str(&id) {
            headers.insert(h_id, v);
        }
        headers.insert(h_epoch, HeaderValue::from(epoch));
        headers.insert(h_seq, HeaderValue::from(seq));
        let this_seq = seq;
        seq += 1;
        let (ctx2, http, url, window2, hist, policy) = (
            ctx.clone(),
            http.clone(),
            url.clone(),
            window.clone(),
            hist.clone(),
            policy.clone(),
        );
        acks.spawn(async move {
            let _permit = permit;
            let mut stop = ctx2.stop.clone();
            let delivered = drive(&window2, this_seq, &policy, || {
                ds_attempt(&ctx2, &http, &url, headers.clone(), body.clone(), this_seq)
            });
            tokio::select! {
                // Stop first: a batch dropped here gives its successors up, and they must
                // count as unfinished, not abandoned.
                biased;
                _ = stop.wait_for(|s| *s) => unfinished(&ctx2, t0),
                res = delivered => {
                    shared_batch_done(&ctx2, &hist, t0, Outcome::of_producer(res, "ds producer"));
                }
            }
        });
    }
    while acks.join_next().await.is_some() {}
    let h: Histogram<u64> = hist.lock().unwrap_or_else(|p| p.into_inner()).clone();
    ctx.lat.merge_ack(&h);
}

async fn ds_attempt(
    ctx: &Ctx,
    http: &reqwest::Client,
    url: &str,
    headers: HeaderMap,
    body: Bytes,
    seq: u64,
) -> pico_client::Attempt<()> {
    let res = async {
        let resp =
            super::redirect::send(http, reqwest::Method::POST, url, headers, Some(body)).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await?;
        Ok((status, headers, body))
    };
    // As pico-client does for Pico producers: an attempt without an answer is resent, so
    // one lost request does not stall its producer for the rest of the run.
    match tokio::time::timeout(DEFAULT_REQUEST_TIMEOUT, res).await {
        Ok(res) => ctx.target.classify(seq, res),
        Err(_) => pico_client::Attempt::Retry(ClientError::Timeout(DEFAULT_REQUEST_TIMEOUT)),
    }
}

/// The Pico client a producer uses (one per connection, so producers get their own sockets).
pub fn pico_client(ctx: &Ctx) -> anyhow::Result<pico_client::Client> {
    debug_assert_eq!(ctx.target.protocol, Protocol::Pico);
    pico_client::Client::new(
        &ctx.target.base,
        pico_client::ClientOptions {
            http2_prior_knowledge: ctx.http2,
            token: ctx.token.clone(),
            ..Default::default()
        },
    )
    .map_err(|e| anyhow::anyhow!("{}", chain(&e)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn pacer(start_us: u64, bytes_per_us: f64) -> Pacer {
        Pacer {
            start_us: AtomicU64::new(start_us),
            bytes_per_us,
            reserved: AtomicU64::new(0),
        }
    }

    /// A writer behind its schedule measures from the slot's time (a slow server is not
    /// hidden); an early one sleeps and measures from when it woke, never before its slot.
    #[tokio::test]
    async fn pacer_measures_from_the_slot_when_late_and_from_the_wake_up_when_early() {
        // Started 100 ms ago at 1 byte/µs: the first slot (0 bytes reserved before it) was
        // 100 ms ago, the second (50 ms of bytes later) 50 ms ago: both late.
        let start = now_us();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let p = pacer(start, 1.0);
        assert_eq!(p.wait(50_000).await, start);
        assert_eq!(p.wait(50_000).await, start + 50_000);
        // A fresh pacer's first slot is now; the next one 20 ms later, so that writer sleeps
        // and gets the clock read after its wake-up: later than the slot (a sleep never ends
        // early, and tokio rounds it up to its next millisecond tick), not the slot itself.
        let s0 = now_us();
        let p = pacer(s0, 1.0);
        assert_eq!(p.wait(20_000).await, s0);
        let t = p.wait(1).await;
        assert!(
            t > s0 + 20_000,
            "measured from the slot, not the wake-up: {t}"
        );
        assert!(t <= now_us());
    }
}
