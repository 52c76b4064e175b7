//! The two wire protocols the bench drives: request shapes for create and append, and how to
//! classify an idempotent producer's answer. Streams are `text/plain`: records are ASCII.
//!
//! - Pico: `PUT/POST /{name}`; one record = raw body, a batch = `application/vnd.picomq.batch`;
//!   producer headers `Pico-Producer-*`, gap = 409 `sequence_gap` + `Pico-Expected-Seq`.
//! - Durable Streams: `PUT/POST /v1/stream/{name}`; a batch is the records concatenated (DS is
//!   byte-addressed: one POST is one message); producer headers `Producer-*`, 200 accepted,
//!   204 duplicate, gap = 409 + `Producer-Expected-Seq`.
//! - Kafka: not HTTP; [`super::kafka`] sends the requests. A batch is one Kafka RecordBatch v2
//!   (uncompressed), the body of one partition's Produce data.

use super::payload;
use crate::cli::Protocol;
use bytes::{BufMut, Bytes, BytesMut};
use pico_client::{Attempt, ClientError};
use reqwest::Method;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderValue};

const TEXT: &str = "text/plain";
const BINARY_BATCH: &str = "application/vnd.picomq.batch";
/// Not sent anywhere: a Kafka batch travels inside a Produce request.
const KAFKA_BATCH: &str = "application/vnd.kafka.record-batch";

#[derive(Debug, Clone)]
pub struct Target {
    pub protocol: Protocol,
    /// Endpoint without a trailing slash.
    pub base: String,
}

impl Target {
    pub fn new(protocol: Protocol, endpoint: &str) -> Target {
        Target {
            protocol,
            base: endpoint.trim_end_matches('/').to_string(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self.protocol {
            Protocol::Pico => "pico",
            Protocol::Ds => "ds",
            Protocol::Kafka => "kafka",
        }
    }

    /// The URL of a stream (names have no leading slash); for Kafka `HOST:PORT/topic`, only
    /// ever shown in messages.
    pub fn url(&self, stream: &str) -> String {
        match self.protocol {
            Protocol::Pico | Protocol::Kafka => format!("{}/{stream}", self.base),
            Protocol::Ds => format!("{}/v1/stream/{stream}", self.base),
        }
    }

    /// Idempotent create as `text/plain`.
    pub async fn create(&self, http: &reqwest::Client, stream: &str) -> Result<(), String> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(TEXT));
        let resp = super::redirect::send(http, Method::PUT, &self.url(stream), headers, None)
            .await
            .map_err(|e| format!("create {stream}: {}", chain(&e)))?;
        let status = resp.status();
        if status.is_success() {
            Ok(())
        } else {
            let body = resp.text().await.unwrap_or_default();
            Err(format!("create {stream}: http {status}: {}", body.trim()))
        }
    }

    /// The body of one append of `count` records stamped `stamp_us`, and its content type.
    pub fn body(&self, count: usize, size: usize, stamp_us: u64) -> (Bytes, &'static str) {
        match self.protocol {
            Protocol::Pico if count == 1 => (Bytes::from(payload::record(size, stamp_us)), TEXT),
            Protocol::Pico => (binary_batch(count, size, stamp_us), BINARY_BATCH),
            Protocol::Ds => {
                let mut v = Vec::with_capacity(count * size);
                payload::write_records(&mut v, count, size, stamp_us);
                (Bytes::from(v), TEXT)
            }
            Protocol::Kafka => (kafka_batch(count, size, stamp_us), KAFKA_BATCH),
        }
    }

    /// One plain append; Ok once acknowledged (durable, for both servers under test).
    pub async fn append(
        &self,
        http: &reqwest::Client,
        stream: &str,
        body: Bytes,
        content_type: &'static str,
    ) -> Result<(), String> {
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        let resp =
            super::redirect::send(http, Method::POST, &self.url(stream), headers, Some(body))
                .await
                .map_err(|e| chain(&e))?;
        let status = resp.status();
        if status.is_success() {
            // Drain the (empty) body so the connection goes back to the pool.
            let _ = resp.bytes().await;
            Ok(())
        } else {
            let body = resp.bytes().await.unwrap_or_default();
            Err(refused(status, &body))
        }
    }

    /// Producer header names of this protocol: (id, epoch, seq, expected-seq).
    pub fn producer_headers(&self) -> [&'static str; 4] {
        match self.protocol {
            // Kafka runs have no HTTP producers (`--producer` is refused for them).
            Protocol::Pico | Protocol::Kafka => [
                "pico-producer-id",
                "pico-producer-epoch",
                "pico-producer-seq",
                "pico-expected-seq",
            ],
            Protocol::Ds => [
                "producer-id",
                "producer-epoch",
                "producer-seq",
                "producer-expected-seq",
            ],
        }
    }

    /// Classifies a producer append's answer for [`pico_client::drive`].
    pub fn classify(&self, seq: u64, res: reqwest::Result<(u16, HeaderMap, Bytes)>) -> Attempt<()> {
        let (status, headers, body) = match res {
            Ok(r) => r,
            Err(e) => return Attempt::Retry(ClientError::Transport(chain(&e))),
        };
        if (200..300).contains(&status) {
            return Attempt::Done(());
        }
        let expected = headers
            .get(self.producer_headers()[3])
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let err = ClientError::from_response(status, &body);
        match (status, expected) {
            (409, Some(expected)) => Attempt::Gap { expected },
            (409, None) if self.protocol == Protocol::Pico && body_has_gap(&body) => Attempt::Gap {
                expected: seq.saturating_sub(1),
            },
            (500 | 502 | 503, _) => Attempt::Retry(err),
            _ => Attempt::Fatal(err),
        }
    }
}

fn body_has_gap(body: &[u8]) -> bool {
    body.windows(12).any(|w| w == b"sequence_gap")
}

/// `application/vnd.picomq.batch` of `count` stamped records (seq, timestamp and headers 0).
fn binary_batch(count: usize, size: usize, stamp_us: u64) -> Bytes {
    let rec = payload::record(size, stamp_us);
    let mut b = BytesMut::with_capacity(5 + count * (22 + size));
    b.put_u8(1);
    b.put_u32(count as u32);
    for _ in 0..count {
        b.put_u64(0);
        b.put_i64(0);
        b.put_u16(0);
        b.put_u32(size as u32);
        b.put_slice(&rec);
    }
    b.freeze()
}

/// One uncompressed Kafka RecordBatch v2 of `count` stamped records, as a producer without
/// idempotence sends it (producer id -1), with the wall clock as every record's timestamp.
fn kafka_batch(count: usize, size: usize, stamp_us: u64) -> Bytes {
    let value = Bytes::from(payload::record(size, stamp_us));
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let records: Vec<pico_protocol::Record> = (0..count)
        .map(|_| pico_protocol::Record {
            timestamp_ms: now_ms,
            key: None,
            value: value.clone(),
            headers: Vec::new(),
        })
        .collect();
    pico_protocol::encode_batch(0, &records)
}

/// The error for an append the server answered with a non-2xx `status` and `body`.
pub fn refused(status: reqwest::StatusCode, body: &[u8]) -> String {
    format!(
        "append: http {status}: {}",
        String::from_utf8_lossy(body).trim()
    )
}

/// reqwest's Display hides the cause; keep the chain.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        src = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pico_binary_batches_decode_with_the_server_codec() {
        let t = Target::new(Protocol::Pico, "http://h:1/");
        let (body, ct) = t.body(3, 24, 0x1234);
        assert_eq!(ct, BINARY_BATCH);
        let recs = pico_protocol::decode_binary_records(&body).unwrap();
        assert_eq!(recs.len(), 3);
        assert!(
            recs.iter()
                .all(|r| r.value.len() == 24 && payload::stamp_of(&r.value) == Some(0x1234))
        );
        let (one, ct) = t.body(1, 24, 5);
        assert_eq!((one.len(), ct), (24, TEXT));
        assert_eq!(t.url("a/b"), "http://h:1/a/b");
    }

    #[test]
    fn ds_batches_concatenate_and_live_under_v1_stream() {
        let t = Target::new(Protocol::Ds, "http://h:1");
        let (body, ct) = t.body(4, 20, 9);
        assert_eq!((body.len(), ct), (80, TEXT));
        assert_eq!(t.url("x"), "http://h:1/v1/stream/x");
    }

    #[test]
    fn kafka_batches_are_record_batches_the_server_decodes() {
        let t = Target::new(Protocol::Kafka, "127.0.0.1:9092");
        let (body, _) = t.body(3, 40, 0x77);
        let batch = pico_protocol::decode_batch(&body).unwrap();
        assert_eq!(batch.records.len(), 3);
        assert!(
            batch
                .records
                .iter()
                .all(|r| r.value.len() == 40 && payload::stamp_of(&r.value) == Some(0x77))
        );
        assert_eq!(t.name(), "kafka");
    }

    #[test]
    fn producer_answers_are_classified_per_protocol() {
        let ds = Target::new(Protocol::Ds, "http://h:1");
        let mut h = HeaderMap::new();
        h.insert("producer-expected-seq", "4".parse().unwrap());
        assert!(matches!(
            ds.classify(6, Ok((409, h, Bytes::new()))),
            Attempt::Gap { expected: 4 }
        ));
        assert!(matches!(
            ds.classify(6, Ok((204, HeaderMap::new(), Bytes::new()))),
            Attempt::Done(())
        ));
        assert!(matches!(
            ds.classify(6, Ok((403, HeaderMap::new(), Bytes::new()))),
            Attempt::Fatal(_)
        ));
        let pico = Target::new(Protocol::Pico, "http://h:1");
        let body = Bytes::from_static(br#"{"error":"sequence_gap","message":"gap"}"#);
        assert!(matches!(
            pico.classify(6, Ok((409, HeaderMap::new(), body))),
            Attempt::Gap { expected: 5 }
        ));
        assert!(matches!(
            pico.classify(6, Ok((503, HeaderMap::new(), Bytes::new()))),
            Attempt::Retry(_)
        ));
    }
}
