//! Request framing for handler tests: requests encoded as a client would, answers decoded;
//! the requests most tests send (create a topic, produce, fetch).
#![allow(dead_code)]

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use pico_common::StreamName;
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

pub fn topic(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// CreateTopics of `name` with `partitions`: its error code.
pub async fn create(b: &Broker, name: &str, partitions: i32) -> i16 {
    let mut t = CreatableTopic::default();
    t.name = topic(name);
    t.num_partitions = partitions;
    t.replication_factor = 1;
    let req = CreateTopicsRequest::default().with_topics(vec![t]);
    let resp: CreateTopicsResponse = call(b, ApiKey::CreateTopics, 4, &req).await;
    resp.topics[0].error_code
}

/// A Produce of `records` to one partition.
pub fn produce_request(name: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    let mut p = PartitionProduceData::default();
    p.index = partition;
    p.records = Some(records);
    let mut t = TopicProduceData::default();
    t.name = topic(name);
    t.partition_data = vec![p];
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(5000)
        .with_topic_data(vec![t])
}

/// Produces `records` (acks=all, at version `v`): the partition's answer.
pub async fn produce(
    b: &Broker,
    name: &str,
    partition: i32,
    records: Bytes,
    v: i16,
) -> PartitionProduceResponse {
    let req = produce_request(name, partition, records, -1);
    let resp: ProduceResponse = call(b, ApiKey::Produce, v, &req).await;
    resp.responses[0].partition_responses[0].clone()
}

pub fn fetch_req(name: &str, partition: i32, offset: i64, wait_ms: i32) -> FetchRequest {
    let mut p = FetchPartition::default();
    p.partition = partition;
    p.fetch_offset = offset;
    p.partition_max_bytes = 1 << 20;
    let mut t = FetchTopic::default();
    t.topic = topic(name);
    t.partitions = vec![p];
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_session_epoch(-1)
        .with_topics(vec![t])
}

/// Fetches one partition from `offset` without waiting (v11).
pub async fn fetch(b: &Broker, name: &str, partition: i32, offset: i64) -> PartitionData {
    let resp: FetchResponse =
        call(b, ApiKey::Fetch, 11, &fetch_req(name, partition, offset, 0)).await;
    resp.responses[0].partitions[0].clone()
}

/// A new idempotent producer's id (InitProducerId v1, no transaction).
pub async fn init_producer(b: &Broker) -> i64 {
    let init: InitProducerIdResponse = call(
        b,
        ApiKey::InitProducerId,
        1,
        &InitProducerIdRequest::default().with_transaction_timeout_ms(60_000),
    )
    .await;
    assert_eq!(init.error_code, 0);
    init.producer_id.0
}

/// Every record of stream `name` from offset 0, through the node's own read (HTTP's path).
pub async fn read_all(b: &Broker, name: &str) -> Vec<pico_server::ReadRecord> {
    pico_server::testing::read_records(b.node(), name).await
}

/// The next offset of stream `name`.
pub async fn tail(b: &Broker, name: &str) -> u64 {
    b.node()
        .head(&StreamName::parse(name).unwrap())
        .await
        .unwrap()
        .next_seq
}
