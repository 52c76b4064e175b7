//! Request framing for handler tests: requests encoded as a client would, answers decoded.
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use pico_kafka::broker::Reply;
use pico_kafka::{Broker, KafkaOptions};
use pico_protocol::Record;

pub fn frame<T: Encodable>(key: ApiKey, v: i16, body: &T) -> Bytes {
    frame_with(key, v, 7, body)
}

/// A request frame (without its length prefix) with correlation id `correlation`.
pub fn frame_with<T: Encodable>(key: ApiKey, v: i16, correlation: i32, body: &T) -> Bytes {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(v)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str("test")))
        .encode(&mut buf, key.request_header_version(v))
        .unwrap();
    body.encode(&mut buf, v).unwrap();
    buf.freeze()
}

pub fn decode_reply<R: Decodable>(key: ApiKey, v: i16, reply: Reply) -> R {
    match reply {
        Reply::Send(mut bytes) => {
            let h = ResponseHeader::decode(&mut bytes, key.response_header_version(v)).unwrap();
            assert_eq!(h.correlation_id, 7);
            R::decode(&mut bytes, v).unwrap()
        }
        other => panic!("no answer: {other:?}"),
    }
}

pub async fn call<T: Encodable, R: Decodable>(b: &Broker, key: ApiKey, v: i16, req: &T) -> R {
    decode_reply(key, v, b.handle(frame(key, v, req)).await)
}

pub async fn broker() -> Broker {
    let node = pico_server::testing::start_test_node().await;
    Broker::new(node, KafkaOptions::default())
}

pub fn rec(value: &str) -> Record {
    Record {
        timestamp_ms: 0,
        key: Some(Bytes::from(format!("k-{value}"))),
        value: Bytes::from(value.to_string()),
        headers: vec![("h".to_string(), Bytes::from_static(b"v"))],
    }
}

/// An uncompressed batch of `records`, optionally as idempotent producer (id, epoch, seq).
pub fn batch(records: &[Record], producer: Option<(i64, i16, i32)>) -> Bytes {
    let b = pico_protocol::encode_batch(0, records);
    let Some((id, epoch, seq)) = producer else {
        return b;
    };
    let mut b = BytesMut::from(&b[..]);
    b[43..51].copy_from_slice(&id.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&seq.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b.freeze()
}
