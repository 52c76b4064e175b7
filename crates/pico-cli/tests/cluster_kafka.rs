//! The Kafka frontend of a cluster of real `pico serve` processes (one fresh Postgres database,
//! one `file://` data directory), spoken to over TCP as a Kafka client does (requests encoded
//! with the `kafka-protocol` codec): Metadata on either node lists both as brokers at their
//! Kafka addresses and names the stream's owner as the partition leader; a produce to the other
//! node is answered NOT_LEADER_OR_FOLLOWER; the client re-routes to the leader Metadata names,
//! and its produce lands once. Real Kafka clients (librdkafka) re-routing across a transfer:
//! scripts/kafka-e2e.sh.
//!
//! Without a Postgres server the test prints `SKIPPED (...)` and passes, or fails under
//! `PICO_TEST_REQUIRE_ALL=1`.

#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod pg;

mod cluster_support;

use bytes::{BufMut, Bytes, BytesMut};
use cluster_support::*;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const METADATA_V: i16 = 8;
const PRODUCE_V: i16 = 8;
const CREATE_TOPICS_V: i16 = 4;
const NOT_LEADER_OR_FOLLOWER: i16 = 6;

/// One request on a fresh connection to `port`, its answer decoded.
async fn call<T: Encodable, R: Decodable>(port: u16, key: ApiKey, v: i16, req: &T) -> R {
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(v)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("cluster-test")))
        .encode(&mut buf, key.request_header_version(v))
        .unwrap();
    req.encode(&mut buf, v).unwrap();
    let len = (buf.len() - 4) as i32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(&buf).await.unwrap();
    let len = s.read_i32().await.unwrap();
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await.unwrap();
    let mut body = Bytes::from(body);
    let h = ResponseHeader::decode(&mut body, key.response_header_version(v)).unwrap();
    assert_eq!(h.correlation_id, 7);
    R::decode(&mut body, v).unwrap()
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

async fn metadata(port: u16, topic: &str) -> MetadataResponse {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic_name(topic))),
        ]))
        .with_allow_auto_topic_creation(false);
    call(port, ApiKey::Metadata, METADATA_V, &req).await
}

/// Brokers of a Metadata answer as (id, host:port), in id order.
fn brokers(m: &MetadataResponse) -> Vec<(i32, String)> {
    let mut b: Vec<(i32, String)> = m
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect();
    b.sort();
    b
}

/// Produces one record to partition 0 of `topic` through `port`; returns (error code, base
/// offset).
async fn produce(port: u16, topic: &str, value: &str) -> (i16, i64) {
    let record = pico_protocol::Record {
        timestamp_ms: 0,
        key: None,
        value: Bytes::from(value.to_string()),
        headers: vec![],
    };
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(topic_name(topic))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(pico_protocol::encode_batch(0, &[record]))),
                ]),
        ]);
    let resp: ProduceResponse = call(port, ApiKey::Produce, PRODUCE_V, &req).await;
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// Two nodes with Kafka listeners. Node 1 owns topic `routed` (created and first produced
/// through it). Both nodes' Metadata lists both brokers at their Kafka addresses and names
/// node 1 the leader; a produce to node 2 is answered NOT_LEADER_OR_FOLLOWER and stores
/// nothing; the client goes to the leader's address from node 2's Metadata, and its produce
/// lands there, once, at the next offset (read back over HTTP through either node).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kafka_metadata_lists_the_cluster_and_a_non_owner_sends_clients_to_the_leader() {
    let Some(cluster) = Cluster::pg().await else {
        return;
    };
    let (k1, k2) = (free_port(), free_port());
    let n1 = cluster.start_with(1, &["--kafka-listen", &format!("127.0.0.1:{k1}")]);
    let n2 = cluster.start_with(2, &["--kafka-listen", &format!("127.0.0.1:{k2}")]);
    let expected = vec![
        (1, format!("127.0.0.1:{k1}")),
        (2, format!("127.0.0.1:{k2}")),
    ];
    for port in [k1, k2] {
        // Each listener stores its address when it starts; the other node sees it once it
        // applied that write and saw the node's heartbeat.
        eventually("both brokers listed", async || {
            brokers(&metadata(port, "routed").await) == expected
        })
        .await;
    }

    let create = CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_topics(vec![
            CreatableTopic::default()
                .with_name(topic_name("routed"))
                .with_num_partitions(1)
                .with_replication_factor(1),
        ]);
    let created: CreateTopicsResponse =
        call(k1, ApiKey::CreateTopics, CREATE_TOPICS_V, &create).await;
    assert_eq!(created.topics[0].error_code, 0, "{created:?}");
    assert_eq!(produce(k1, "routed", "first").await, (0, 0));

    // Node 2 learns node 1 owns it through the log.
    eventually("node 2 names node 1 the leader", async || {
        let m = metadata(k2, "routed").await;
        m.topics
            .first()
            .and_then(|t| t.partitions.first())
            .is_some_and(|p| p.leader_id.0 == 1)
    })
    .await;
    let (code, _) = produce(k2, "routed", "refused").await;
    assert_eq!(code, NOT_LEADER_OR_FOLLOWER, "a produce to the non-owner");

    // The client re-routes as Kafka clients do: Metadata, then the leader's address.
    let m = metadata(k2, "routed").await;
    let leader = m.topics[0].partitions[0].leader_id;
    let addr = m
        .brokers
        .iter()
        .find(|b| b.node_id == leader)
        .map(|b| b.port)
        .expect("the leader is listed");
    assert_eq!(addr, i32::from(k1));
    assert_eq!(produce(addr as u16, "routed", "second").await, (0, 1));

    for n in [&n1, &n2] {
        let records = read_all(&client(n), "routed").await;
        let bodies: Vec<&str> = records.iter().map(|(_, b)| b.as_str()).collect();
        assert_eq!(bodies, ["first", "second"], "through node {}", n.id);
    }
}
