//! `--protocol kafka`: a producer load over the Kafka wire protocol (codec: `kafka-protocol`).
//!
//! `--endpoint` is the listener's `HOST:PORT` (`kafka://` may prefix it). Setup creates the
//! topics with CreateTopics (one partition each; one that exists already is fine). Each of
//! `--connections` sockets pipelines up to `--in-flight` Produce requests (v8, acks=all, as
//! `acks=all` producers do), each one RecordBatch of `-n` records of `-b` bytes; request `i` of
//! connection `c` goes to topic `(c + i·connections) mod topics`. Requests go to the bootstrap
//! address itself: the bench is for one node (a partition led elsewhere answers
//! NOT_LEADER_OR_FOLLOWER, counted as an error).
//!
//! A Kafka broker answers a connection's requests in order, so the answers are matched to a
//! FIFO of the requests sent and checked by correlation id. A broken connection fails every
//! request in flight on it (one error each); the next request opens a new one.

use super::Ctx;
use super::payload::now_us;
use super::stats::histogram;
use super::writer::{ERROR_PAUSE, Outcome, batch_done, send_time, unfinished};
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, ProduceRequest, ProduceResponse,
    RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// Produce v8: the newest non-flexible version, served by PicoMQ and by current brokers.
const PRODUCE_VERSION: i16 = 8;
/// CreateTopics v4 (non-flexible).
const CREATE_TOPICS_VERSION: i16 = 4;
/// How long the broker may take to replicate/persist a produce before it answers with a
/// timeout (the bench's own wait for an answer is the run's end).
const PRODUCE_TIMEOUT_MS: i32 = 30_000;
/// Longest answer frame accepted (a Produce answer is a few dozen bytes per partition).
const MAX_RESPONSE: usize = 16 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest wait for the topics' creation.
const SETUP_TIMEOUT: Duration = Duration::from_secs(30);
const CLIENT_ID: &str = "pico-bench";
/// Kafka's TOPIC_ALREADY_EXISTS.
const TOPIC_ALREADY_EXISTS: i16 = 36;

/// The listener's `HOST:PORT` from `--endpoint`; an HTTP URL is refused, naming the fix.
pub fn bootstrap(endpoint: &str) -> anyhow::Result<String> {
    let e = endpoint.trim().trim_end_matches('/');
    if e.starts_with("http://") || e.starts_with("https://") {
        anyhow::bail!(
            "--protocol kafka needs --endpoint HOST:PORT of the Kafka listener (e.g. 127.0.0.1:9092), not `{endpoint}`"
        );
    }
    let e = e.strip_prefix("kafka://").unwrap_or(e);
    if e.is_empty() || !e.contains(':') {
        anyhow::bail!("--endpoint for --protocol kafka is HOST:PORT, got `{endpoint}`");
    }
    Ok(e.to_string())
}

/// Resolves `host:port` to the first address that accepts a connection (used for the run).
pub async fn resolve(bootstrap: &str) -> anyhow::Result<SocketAddr> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(bootstrap)
        .await
        .map_err(|e| anyhow::anyhow!("resolving {bootstrap}: {e}"))?
        .collect();
    let mut last = None;
    for a in addrs {
        match connect(a).await {
            Ok(_) => return Ok(a),
            Err(e) => last = Some(e),
        }
    }
    Err(anyhow::anyhow!(
        "cannot connect to {bootstrap}: {}",
        last.unwrap_or_else(|| "no address".into())
    ))
}

async fn connect(addr: SocketAddr) -> Result<TcpStream, String> {
    let s = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
        .await
        .map_err(|_| format!("connect {addr}: no answer in {CONNECT_TIMEOUT:?}"))?
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// Topic names for the bench's stream names: Kafka allows `[a-zA-Z0-9._-]`, so `/` and
/// anything else becomes `-` (`bench/123/s0` → `bench-123-s0`).
pub fn topic_name(stream: &str) -> String {
    stream
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A request frame: length prefix, header (v1: with client id), body.
fn frame<T: Encodable>(
    key: ApiKey,
    version: i16,
    correlation: i32,
    body: &T,
) -> Result<Bytes, String> {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str(CLIENT_ID)))
        .encode(&mut buf, key.request_header_version(version))
        .map_err(|e| format!("encoding a {key:?} header: {e}"))?;
    body.encode(&mut buf, version)
        .map_err(|e| format!("encoding a {key:?} request: {e}"))?;
    let len = i32::try_from(buf.len() - 4).map_err(|_| "request too large".to_string())?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// Reads one answer frame and checks its correlation id; returns the body after the header.
async fn read_answer(
    r: &mut OwnedReadHalf,
    key: ApiKey,
    version: i16,
    correlation: i32,
) -> Result<Bytes, String> {
    let len = r
        .read_i32()
        .await
        .map_err(|e| format!("reading an answer: {e}"))?;
    if len < 4 || len as usize > MAX_RESPONSE {
        return Err(format!("answer frame length {len} out of range"));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)
        .await
        .map_err(|e| format!("reading an answer: {e}"))?;
    let mut body = Bytes::from(body);
    let h = ResponseHeader::decode(&mut body, key.response_header_version(version))
        .map_err(|e| format!("bad {key:?} answer header: {e}"))?;
    if h.correlation_id != correlation {
        return Err(format!(
            "answer for correlation id {} where {correlation} was next",
            h.correlation_id
        ));
    }
    Ok(body)
}

fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(e) => format!("{e:?} ({code})"),
        None => format!("error code {code}"),
    }
}

/// Creates `topics` (one partition each) in one CreateTopics request; existing ones are fine.
pub async fn create_topics(addr: SocketAddr, topics: &[String]) -> Result<(), String> {
    let run = async {
        let (mut r, mut w) = connect(addr).await?.into_split();
        let req = CreateTopicsRequest::default()
            .with_timeout_ms(SETUP_TIMEOUT.as_millis() as i32)
            .with_topics(
                topics
                    .iter()
                    .map(|t| {
                        CreatableTopic::default()
                            .with_name(TopicName(StrBytes::from_string(t.clone())))
                            .with_num_partitions(1)
                            .with_replication_factor(1)
                    })
                    .collect(),
            );
        let f = frame(ApiKey::CreateTopics, CREATE_TOPICS_VERSION, 1, &req)?;
        w.write_all(&f)
            .await
            .map_err(|e| format!("sending CreateTopics: {e}"))?;
        let mut body = read_answer(&mut r, ApiKey::CreateTopics, CREATE_TOPICS_VERSION, 1).await?;
        let resp = CreateTopicsResponse::decode(&mut body, CREATE_TOPICS_VERSION)
            .map_err(|e| format!("bad CreateTopics answer: {e}"))?;
        for t in &resp.topics {
            if t.error_code != 0 && t.error_code != TOPIC_ALREADY_EXISTS {
                return Err(format!(
                    "create topic {}: {}{}",
                    t.name.as_str(),
                    error_name(t.error_code),
                    t.error_message
                        .as_ref()
                        .map(|m| format!(": {}", m.as_str()))
                        .unwrap_or_default()
                ));
            }
        }
        if resp.topics.len() != topics.len() {
            return Err(format!(
                "CreateTopics answered for {} of {} topics",
                resp.topics.len(),
                topics.len()
            ));
        }
        Ok(())
    };
    tokio::time::timeout(SETUP_TIMEOUT, run)
        .await
        .unwrap_or_else(|_| Err(format!("CreateTopics: no answer in {SETUP_TIMEOUT:?}")))
}

/// A request sent and not yet answered.
struct Pending {
    correlation: i32,
    topic: usize,
    t0: u64,
    _slot: OwnedSemaphorePermit,
}

/// The requests in flight on one connection, oldest first, shared by its writer and reader.
#[derive(Default)]
struct InFlight {
    queue: Mutex<VecDeque<Pending>>,
    /// Signalled whenever a request is queued.
    queued: Notify,
}

impl InFlight {
    fn push(&self, p: Pending) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(p);
        self.queued.notify_one();
    }

    fn pop(&self) -> Option<Pending> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }

    /// Puts back the oldest request (its answer never came).
    fn requeue(&self, p: Pending) {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_front(p);
    }

    fn drain(&self) -> Vec<Pending> {
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect()
    }
}

/// Connection `c` of `conns`: opens a socket, pipelines Produce requests on it until the stop,
/// and opens a new one after a failure.
pub async fn producer_loop(ctx: Arc<Ctx>, addr: SocketAddr, c: usize, conns: usize) {
    let mut h = histogram();
    let mut next = 0usize;
    let mut correlation = 0i32;
    while !ctx.stopped() {
        let mut stop = ctx.stop.clone();
        let sock = tokio::select! {
            s = connect(addr) => s,
            _ = stop.wait_for(|s| *s) => break,
        };
        let sock = match sock {
            Ok(s) => s,
            Err(e) => {
                ctx.counters.error(true, ctx.in_window(now_us()), || e);
                tokio::time::sleep(ERROR_PAUSE).await;
                continue;
            }
        };
        let (r, w) = sock.into_split();
        let in_flight = Arc::new(InFlight::default());
        let slots = Arc::new(Semaphore::new(ctx.in_flight.max(1)));
        let sending = send_requests(
            &ctx,
            w,
            &in_flight,
            &slots,
            c,
            conns,
            &mut next,
            &mut correlation,
        );
        let reading = read_answers(&ctx, r, &in_flight, &mut h);
        // Either side ends the connection: a failure, or the stop (then the writer ends and
        // the reader is dropped with it: what is left in flight is unfinished).
        let failure = tokio::select! {
            e = sending => e,
            e = reading => e,
        };
        let left = in_flight.drain();
        match failure {
            None => {
                for p in left {
                    unfinished(&ctx, p.t0);
                }
                break;
            }
            Some(e) => {
                // Every request in flight on the broken connection failed with it; a
                // connection that broke with none in flight is one error.
                if left.is_empty() {
                    ctx.counters
                        .error(true, ctx.in_window(now_us()), || e.clone());
                }
                for p in left {
                    batch_done(&ctx, &mut h, p.t0, Outcome::Failed(e.clone()));
                }
                tokio::time::sleep(ERROR_PAUSE).await;
            }
        }
    }
    ctx.lat.merge_ack(&h);
}

/// Sends Produce requests while a slot is free, until the stop (None) or a write fails.
#[allow(clippy::too_many_arguments)]
async fn send_requests(
    ctx: &Ctx,
    mut w: tokio::net::tcp::OwnedWriteHalf,
    in_flight: &InFlight,
    slots: &Arc<Semaphore>,
    c: usize,
    conns: usize,
    next: &mut usize,
    correlation: &mut i32,
) -> Option<String> {
    let mut stop = ctx.stop.clone();
    let n = ctx.streams.len();
    loop {
        // Unpaced, a request is stamped once its slot is free (the window is the client's
        // own limit), as the HTTP producers do.
        let slot = tokio::select! {
            s = slots.clone().acquire_owned() => s.ok()?,
            _ = stop.wait_for(|s| *s) => return None,
        };
        let t0 = tokio::select! {
            t = send_time(ctx) => t,
            _ = stop.wait_for(|s| *s) => return None,
        };
        let topic = (c + *next * conns) % n;
        *next += 1;
        *correlation = correlation.wrapping_add(1);
        let (batch, _) = ctx.target.body(ctx.batch, ctx.record_size, t0);
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(PRODUCE_TIMEOUT_MS)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(ctx.streams[topic].clone())))
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(0)
                            .with_records(Some(batch)),
                    ]),
            ]);
        let f = match frame(ApiKey::Produce, PRODUCE_VERSION, *correlation, &req) {
            Ok(f) => f,
            Err(e) => return Some(e),
        };
        // Queued before it is sent, so its answer always finds it.
        in_flight.push(Pending {
            correlation: *correlation,
            topic,
            t0,
            _slot: slot,
        });
        tokio::select! {
            r = w.write_all(&f) => if let Err(e) = r {
                return Some(format!("sending a produce request: {e}"));
            },
            _ = stop.wait_for(|s| *s) => return None,
        }
    }
}

/// Reads answers in order and counts each request; returns the failure that ended it.
async fn read_answers(
    ctx: &Ctx,
    mut r: OwnedReadHalf,
    in_flight: &InFlight,
    h: &mut hdrhistogram::Histogram<u64>,
) -> Option<String> {
    loop {
        let p = loop {
            // Register for the signal before looking, so a push in between is not missed.
            let queued = in_flight.queued.notified();
            if let Some(p) = in_flight.pop() {
                break p;
            }
            queued.await;
        };
        let answer = read_answer(&mut r, ApiKey::Produce, PRODUCE_VERSION, p.correlation).await;
        let outcome = match answer.and_then(|mut body| {
            ProduceResponse::decode(&mut body, PRODUCE_VERSION)
                .map_err(|e| format!("bad produce answer: {e}"))
        }) {
            Ok(resp) => produce_outcome(&resp, &ctx.streams[p.topic]),
            Err(e) => {
                // The connection is unusable; this request fails with the others in flight.
                in_flight.requeue(p);
                return Some(e);
            }
        };
        batch_done(ctx, h, p.t0, outcome);
    }
}

/// Acked when the one partition written answered without an error.
fn produce_outcome(resp: &ProduceResponse, topic: &str) -> Outcome {
    let parts: Vec<_> = resp
        .responses
        .iter()
        .flat_map(|t| t.partition_responses.iter())
        .collect();
    match parts.as_slice() {
        [p] if p.error_code == 0 => Outcome::Acked,
        [p] => Outcome::Failed(format!(
            "produce {topic}: {}{}",
            error_name(p.error_code),
            p.error_message
                .as_ref()
                .map(|m| format!(": {}", m.as_str()))
                .unwrap_or_default()
        )),
        other => Outcome::Failed(format!(
            "produce {topic}: answer with {} partitions for 1",
            other.len()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };

    #[test]
    fn endpoints_are_host_port_and_http_urls_are_refused() {
        assert_eq!(bootstrap("127.0.0.1:9092").unwrap(), "127.0.0.1:9092");
        assert_eq!(bootstrap("kafka://h:1/").unwrap(), "h:1");
        let e = bootstrap("http://127.0.0.1:4437").unwrap_err().to_string();
        assert!(e.contains("HOST:PORT of the Kafka listener"), "{e}");
        assert!(bootstrap("localhost").is_err());
    }

    #[test]
    fn topic_names_keep_only_legal_characters() {
        assert_eq!(topic_name("bench/123-45/s0"), "bench-123-45-s0");
        assert_eq!(topic_name("a.b_c"), "a.b_c");
    }

    #[test]
    fn produce_answers_are_acks_only_without_an_error() {
        let answer = |code: i16| {
            ProduceResponse::default().with_responses(vec![
                TopicProduceResponse::default().with_partition_responses(vec![
                    PartitionProduceResponse::default().with_error_code(code),
                ]),
            ])
        };
        assert!(matches!(produce_outcome(&answer(0), "t"), Outcome::Acked));
        match produce_outcome(&answer(6), "t") {
            Outcome::Failed(e) => assert!(e.contains("NotLeaderOrFollower (6)"), "{e}"),
            _ => panic!("error 6 counted as an ack"),
        }
        assert!(matches!(
            produce_outcome(&ProduceResponse::default(), "t"),
            Outcome::Failed(_)
        ));
    }

    /// Frames carry their length and decode back as the broker would read them.
    #[test]
    fn produce_frames_decode_as_sent() {
        let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(5);
        let f = frame(ApiKey::Produce, PRODUCE_VERSION, 42, &req).unwrap();
        assert_eq!(
            i32::from_be_bytes(f[..4].try_into().unwrap()) as usize,
            f.len() - 4
        );
        let mut body = f.slice(4..);
        let h =
            RequestHeader::decode(&mut body, ApiKey::Produce.request_header_version(8)).unwrap();
        assert_eq!((h.request_api_key, h.correlation_id), (0, 42));
        let back = ProduceRequest::decode(&mut body, PRODUCE_VERSION).unwrap();
        assert_eq!((back.acks, back.timeout_ms), (-1, 5));
    }
}
