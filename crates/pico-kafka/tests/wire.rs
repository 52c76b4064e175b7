//! The listener over TCP: hostile and malformed frames close their connection and nothing
//! else; random structured frames through the decode path never take the node down.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use common::*;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_kafka::versions::SUPPORTED;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

async fn listen() -> (std::net::SocketAddr, tokio::sync::watch::Sender<bool>) {
    let b = Arc::new(broker().await);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(pico_kafka::serve(listener, b, rx));
    (addr, tx)
}

async fn send(s: &mut TcpStream, body: &[u8]) {
    let mut f = BytesMut::new();
    f.put_i32(body.len() as i32);
    f.put_slice(body);
    s.write_all(&f).await.unwrap();
}

async fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), s.read(&mut b)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

async fn api_versions_works(addr: std::net::SocketAddr) {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let req = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("t"))
        .with_client_software_version(StrBytes::from_static_str("1"));
    send(&mut s, &frame(ApiKey::ApiVersions, 3, &req)).await;
    let len = tokio::time::timeout(Duration::from_secs(10), s.read_i32())
        .await
        .unwrap()
        .unwrap();
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await.unwrap();
    let resp: ApiVersionsResponse = decode_reply(
        ApiKey::ApiVersions,
        3,
        pico_kafka::broker::Reply::Send(body.into()),
    );
    assert_eq!(resp.error_code, 0);
}

#[tokio::test]
async fn a_hostile_four_byte_metadata_body_leaves_the_node_serving() {
    let (addr, _stop) = listen().await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    // Header (key 3, v1, correlation 1, null client id) and a body of 4 bytes: i32::MAX topics.
    let mut body = BytesMut::new();
    body.put_i16(3);
    body.put_i16(1);
    body.put_i32(1);
    body.put_i16(-1);
    body.put_i32(i32::MAX);
    send(&mut s, &body).await;
    assert!(closed(&mut s).await);
    api_versions_works(addr).await;
}

#[tokio::test]
async fn bad_frame_lengths_close_the_connection() {
    let (addr, _stop) = listen().await;
    for len in [-1i32, 0, 3, i32::MAX] {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(&len.to_be_bytes()).await.unwrap();
        assert!(closed(&mut s).await, "length {len}");
    }
    // A frame larger than the small-request limit for anything but Produce.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(&(2i32 << 20).to_be_bytes()).await.unwrap();
    s.write_all(&3i16.to_be_bytes()).await.unwrap();
    assert!(closed(&mut s).await);
    api_versions_works(addr).await;
}

/// A valid request of `key` at `v` with one entry in each array, as a client would send it.
fn valid_frame(key: ApiKey, v: i16) -> Vec<u8> {
    let t = || TopicName(StrBytes::from_static_str("t"));
    let g = || GroupId(StrBytes::from_static_str("g"));
    let records = Some(batch(&[rec("x")], None));
    let f = match key {
        ApiKey::Produce => {
            let mut p = PartitionProduceData::default();
            p.records = records;
            let mut td = TopicProduceData::default();
            td.name = t();
            td.partition_data = vec![p];
            frame(
                key,
                v,
                &ProduceRequest::default()
                    .with_acks(1)
                    .with_topic_data(vec![td]),
            )
        }
        ApiKey::Fetch => {
            let mut tp = FetchTopic::default();
            tp.topic = t();
            tp.partitions = vec![FetchPartition::default()];
            frame(
                key,
                v,
                &FetchRequest::default()
                    .with_max_wait_ms(0)
                    .with_topics(vec![tp]),
            )
        }
        ApiKey::ListOffsets => {
            let mut tp = ListOffsetsTopic::default();
            tp.name = t();
            tp.partitions = vec![ListOffsetsPartition::default()];
            frame(key, v, &ListOffsetsRequest::default().with_topics(vec![tp]))
        }
        ApiKey::Metadata => {
            let mut mt = MetadataRequestTopic::default();
            mt.name = Some(t());
            frame(
                key,
                v,
                &MetadataRequest::default().with_topics(Some(vec![mt])),
            )
        }
        ApiKey::OffsetCommit => {
            let mut tp = OffsetCommitRequestTopic::default();
            tp.name = t();
            tp.partitions = vec![OffsetCommitRequestPartition::default()];
            frame(
                key,
                v,
                &OffsetCommitRequest::default()
                    .with_group_id(g())
                    .with_topics(vec![tp]),
            )
        }
        ApiKey::OffsetFetch => {
            let mut tp = OffsetFetchRequestTopic::default();
            tp.name = t();
            tp.partition_indexes = vec![0];
            frame(
                key,
                v,
                &OffsetFetchRequest::default()
                    .with_group_id(g())
                    .with_topics(Some(vec![tp])),
            )
        }
        ApiKey::FindCoordinator => frame(
            key,
            v,
            &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("g")),
        ),
        ApiKey::JoinGroup => {
            let mut p = JoinGroupRequestProtocol::default();
            p.name = StrBytes::from_static_str("range");
            frame(
                key,
                v,
                &JoinGroupRequest::default()
                    .with_group_id(g())
                    .with_member_id(StrBytes::from_static_str("m"))
                    .with_protocol_type(StrBytes::from_static_str("consumer"))
                    .with_protocols(vec![p]),
            )
        }
        ApiKey::Heartbeat => frame(key, v, &HeartbeatRequest::default().with_group_id(g())),
        ApiKey::LeaveGroup => {
            if v >= 3 {
                frame(
                    key,
                    v,
                    &LeaveGroupRequest::default()
                        .with_group_id(g())
                        .with_members(vec![MemberIdentity::default()]),
                )
            } else {
                frame(key, v, &LeaveGroupRequest::default().with_group_id(g()))
            }
        }
        ApiKey::SyncGroup => frame(
            key,
            v,
            &SyncGroupRequest::default()
                .with_group_id(g())
                .with_assignments(vec![SyncGroupRequestAssignment::default()]),
        ),
        ApiKey::DescribeGroups => frame(
            key,
            v,
            &DescribeGroupsRequest::default().with_groups(vec![g()]),
        ),
        ApiKey::ListGroups => frame(key, v, &ListGroupsRequest::default()),
        ApiKey::ApiVersions => frame(key, v, &ApiVersionsRequest::default()),
        ApiKey::CreateTopics => {
            let mut ct = CreatableTopic::default();
            ct.name = t();
            ct.num_partitions = 1;
            ct.replication_factor = 1;
            frame(
                key,
                v,
                &CreateTopicsRequest::default().with_topics(vec![ct]),
            )
        }
        ApiKey::DeleteTopics => frame(
            key,
            v,
            &DeleteTopicsRequest::default()
                .with_topic_names(vec![TopicName(StrBytes::from_static_str("zz"))]),
        ),
        ApiKey::InitProducerId => frame(key, v, &InitProducerIdRequest::default()),
        ApiKey::DescribeConfigs => {
            let mut r = DescribeConfigsResource::default();
            r.resource_type = 2;
            r.resource_name = StrBytes::from_static_str("t");
            frame(
                key,
                v,
                &DescribeConfigsRequest::default().with_resources(vec![r]),
            )
        }
        ApiKey::CreatePartitions => {
            let mut ct = CreatePartitionsTopic::default();
            ct.name = t();
            ct.count = 1;
            frame(
                key,
                v,
                &CreatePartitionsRequest::default().with_topics(vec![ct]),
            )
        }
        ApiKey::DescribeCluster => frame(key, v, &DescribeClusterRequest::default()),
        other => panic!("no request for {other:?}"),
    };
    f.to_vec()
}

/// A frame for a supported API and version: a valid request's bytes with random edits
/// (4-byte words overwritten with extreme counts and lengths, bytes flipped, cut short or
/// extended). Edits start after the header's api key and version, so every frame reaches
/// the structural pass and, when it passes, the decoder.
fn structured_frame() -> impl Strategy<Value = Vec<u8>> {
    (
        0..SUPPORTED.len(),
        any::<u8>(),
        prop::collection::vec(
            (
                any::<usize>(),
                prop_oneof![
                    Just(i32::MAX),
                    Just(-1),
                    Just(0x7fff_0000),
                    Just(0x0001_0000),
                    any::<i32>()
                ],
            ),
            0..4,
        ),
        prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        prop::collection::vec(any::<u8>(), 0..16),
        prop::option::of(any::<usize>()),
    )
        .prop_map(|(i, vsel, words, flips, tail, cut)| {
            let (key, min, max) = SUPPORTED[i];
            let v = min + (vsel as i16 % (max - min + 1));
            let mut f = valid_frame(key, v);
            f.extend_from_slice(&tail);
            for (at, val) in words {
                if f.len() >= 12 {
                    let at = 4 + at % (f.len() - 7);
                    f[at..at + 4].copy_from_slice(&val.to_be_bytes());
                }
            }
            for (at, val) in flips {
                let at = 4 + at % (f.len() - 4);
                f[at] ^= val;
            }
            if let Some(cut) = cut {
                let keep = 8 + cut % (f.len() - 7);
                f.truncate(keep);
            }
            f
        })
}

/// One node and runtime for every case (the node's tasks live on the runtime).
fn shared() -> &'static (tokio::runtime::Runtime, pico_kafka::Broker) {
    static SHARED: std::sync::OnceLock<(tokio::runtime::Runtime, pico_kafka::Broker)> =
        std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let b = rt.block_on(broker());
        (rt, b)
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]
    #[test]
    fn random_structured_frames_never_crash_the_decode_path(f in structured_frame()) {
        let (rt, b) = shared();
        // Any reply is fine; a panic or an abort is not. Waits are bounded.
        let _ = rt.block_on(async {
            tokio::time::timeout(Duration::from_millis(500), b.handle(f.into())).await
        });
    }
}

#[test]
fn every_valid_frame_is_answered() {
    let (rt, b) = shared();
    for &(key, min, max) in SUPPORTED {
        for v in min..=max {
            let f = valid_frame(key, v);
            let reply = rt.block_on(b.handle(f.into()));
            assert!(
                !matches!(reply, pico_kafka::broker::Reply::Close(_)),
                "{key:?} v{v}: {reply:?}"
            );
        }
    }
}
