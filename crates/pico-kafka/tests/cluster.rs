//! Two nodes on one fresh Postgres metadata log and one object store, each with its Kafka
//! facade: Metadata on either lists both brokers, a partition's leader is the node that owns
//! its stream, a produce to the other node is answered NOT_LEADER_OR_FOLLOWER, and both name
//! the same group coordinator.

mod common;
#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod pg;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_kafka::{Broker, KafkaOptions};
use pico_server::{Node, NodeConfig};
use pico_sql::{MetaLog, MetaLogOptions};
use s3stream::{EngineConfig, MemoryStorage, ObjectStorage, ObjectWal};

async fn start(db: &pg::TestDb, id: u32, data: Arc<dyn ObjectStorage>) -> Broker {
    let meta = MetaLog::open(
        &db.url,
        MetaLogOptions {
            poll_interval: Duration::from_millis(20),
            ..MetaLogOptions::default()
        },
    )
    .await
    .expect("metadata log on the test database");
    let wal = Arc::new(ObjectWal::new(data.clone(), format!("wal/{id}")));
    let config = NodeConfig {
        node_id: id,
        node_epoch: 1,
        ..NodeConfig::default()
    };
    let node = Node::start(config, meta, data, wal, EngineConfig::default())
        .await
        .expect("node starts");
    let b = Broker::new(
        node,
        KafkaOptions {
            broker_id: id as i32,
            advertised_host: "127.0.0.1".into(),
            advertised_port: 22000 + id as i32,
            ..KafkaOptions::default()
        },
    );
    b.advertise().await.expect("kafka address stored");
    b
}

async fn metadata(b: &Broker, name: &str) -> MetadataResponse {
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic(name))),
        ]))
        .with_allow_auto_topic_creation(false);
    call(b, ApiKey::Metadata, 8, &req).await
}

fn brokers(md: &MetadataResponse) -> Vec<(i32, i32)> {
    let mut out: Vec<(i32, i32)> = md.brokers.iter().map(|b| (b.node_id.0, b.port)).collect();
    out.sort();
    out
}

/// (error code, leader id) of the first partition; a topic this node's view does not have yet
/// comes back with its error and no partitions.
fn leader(md: &MetadataResponse) -> (i16, i32) {
    let Some(t) = md.topics.first() else {
        return (-1, -1);
    };
    match t.partitions.first() {
        Some(p) => (p.error_code, p.leader_id.0),
        None => (t.error_code, -1),
    }
}

async fn produce_one(b: &Broker, name: &str) -> (i16, i64) {
    let p = produce(b, name, 0, batch(&[rec("x")], None), 8).await;
    (p.error_code, p.base_offset)
}

/// Polls `cond` until it holds, for at most 20 s (the other node's view follows the log).
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_nodes_list_each_other_and_send_clients_to_the_owner() {
    let Some(db) = pg::TestDb::create().await else {
        return;
    };
    let data: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let one = start(&db, 1, data.clone()).await;
    let two = start(&db, 2, data).await;

    // Topic `t` is created and written through node 1: node 1 owns its stream.
    let mut t = CreatableTopic::default();
    t.name = topic("t");
    t.num_partitions = 1;
    t.replication_factor = 1;
    let req = CreateTopicsRequest::default().with_topics(vec![t]);
    let created: CreateTopicsResponse = call(&one, ApiKey::CreateTopics, 4, &req).await;
    assert_eq!(created.topics[0].error_code, 0);
    assert_eq!(produce_one(&one, "t").await, (0, 0));

    let both = vec![(1, 22001), (2, 22002)];
    for b in [&one, &two] {
        eventually("both brokers listed, node 1 leading `t`", async || {
            let md = metadata(b, "t").await;
            brokers(&md) == both && leader(&md) == (0, 1)
        })
        .await;
    }
    // Node 2 sends producers, consumers and offset lookups to node 1.
    assert_eq!(
        produce_one(&two, "t").await.0,
        ResponseError::NotLeaderOrFollower.code()
    );
    // A topic first written through node 2 is led by node 2.
    let req = CreateTopicsRequest::default().with_topics(vec![
        CreatableTopic::default()
            .with_name(topic("u"))
            .with_num_partitions(1)
            .with_replication_factor(1),
    ]);
    let _: CreateTopicsResponse = call(&two, ApiKey::CreateTopics, 4, &req).await;
    assert_eq!(produce_one(&two, "u").await, (0, 0));
    eventually("node 1 names node 2 leader of `u`", async || {
        leader(&metadata(&one, "u").await) == (0, 2)
    })
    .await;
    assert_eq!(
        produce_one(&one, "u").await.0,
        ResponseError::NotLeaderOrFollower.code()
    );
    // Both nodes send a group to the same coordinator.
    let coordinator = async |b: &Broker| {
        let req = FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("grp"));
        let r: FindCoordinatorResponse = call(b, ApiKey::FindCoordinator, 2, &req).await;
        (r.error_code, r.node_id.0, r.port)
    };
    let at = coordinator(&one).await;
    assert_eq!(at.0, 0);
    assert_eq!(coordinator(&two).await, at);
    // DescribeCluster on node 2 lists both.
    let dc: DescribeClusterResponse = call(
        &two,
        ApiKey::DescribeCluster,
        1,
        &DescribeClusterRequest::default(),
    )
    .await;
    let mut ids: Vec<i32> = dc.brokers.iter().map(|b| b.broker_id.0).collect();
    ids.sort();
    assert_eq!(ids, vec![1, 2]);
}
