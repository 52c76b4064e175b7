//! The group coordinator: joins, syncs, rebalances and session expiry on a manual clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_common::clock::ManualClock;
use pico_kafka::{Broker, KafkaOptions};
use pico_server::NodeConfig;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn join_req(member: &str) -> JoinGroupRequest {
    let mut p = JoinGroupRequestProtocol::default();
    p.name = s("range");
    p.metadata = Bytes::from_static(b"meta");
    JoinGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(s(member))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![p])
}

async fn join(b: &Arc<Broker>, member: &str) -> tokio::task::JoinHandle<JoinGroupResponse> {
    let b = b.clone();
    let req = join_req(member);
    tokio::spawn(async move { call(&b, ApiKey::JoinGroup, 5, &req).await })
}

async fn sync(
    b: &Broker,
    member: &str,
    generation: i32,
    assign: Vec<(&str, &'static [u8])>,
) -> SyncGroupResponse {
    let assignments = assign
        .into_iter()
        .map(|(m, a)| {
            let mut x = SyncGroupRequestAssignment::default();
            x.member_id = s(m);
            x.assignment = Bytes::from_static(a);
            x
        })
        .collect();
    let req = SyncGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_generation_id(generation)
        .with_member_id(s(member))
        .with_assignments(assignments);
    call(b, ApiKey::SyncGroup, 3, &req).await
}

async fn heartbeat(b: &Broker, member: &str, generation: i32) -> i16 {
    let req = HeartbeatRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_generation_id(generation)
        .with_member_id(s(member));
    let r: HeartbeatResponse = call(b, ApiKey::Heartbeat, 3, &req).await;
    r.error_code
}

async fn setup() -> (Arc<Broker>, Arc<ManualClock>) {
    let clock = ManualClock::new(1_000_000);
    let node = pico_server::testing::start_test_node_with(NodeConfig {
        clock: clock.clone(),
        ..NodeConfig::default()
    })
    .await;
    (Arc::new(Broker::new(node, KafkaOptions::default())), clock)
}

#[tokio::test]
async fn two_members_rebalance_when_one_joins_and_when_one_leaves() {
    let (b, _clock) = setup().await;
    let a = join(&b, "").await.await.unwrap();
    assert_eq!(a.error_code, 0);
    let a_id = a.member_id.to_string();
    assert_eq!((a.generation_id, a.leader.as_str()), (1, a_id.as_str()));
    assert_eq!(a.members.len(), 1);
    let sa = sync(&b, &a_id, 1, vec![(&a_id, b"all")]).await;
    assert_eq!(&sa.assignment[..], b"all");
    assert_eq!(heartbeat(&b, &a_id, 1).await, 0);

    // B joins: A hears of the rebalance on its heartbeat and rejoins.
    let b_join = join(&b, "").await;
    tokio::task::yield_now().await;
    assert_eq!(
        heartbeat(&b, &a_id, 1).await,
        ResponseError::RebalanceInProgress.code()
    );
    let a2 = join(&b, &a_id).await.await.unwrap();
    let b2 = b_join.await.unwrap();
    assert_eq!((a2.generation_id, b2.generation_id), (2, 2));
    assert_eq!(a2.leader, a2.member_id, "the leader stays");
    assert_eq!(a2.members.len(), 2);
    assert!(b2.members.is_empty());
    let b_id = b2.member_id.to_string();
    // B's sync waits for the leader's assignments.
    let waiting = {
        let b = b.clone();
        let b_id = b_id.clone();
        tokio::spawn(async move { sync(&b, &b_id, 2, vec![]).await })
    };
    tokio::task::yield_now().await;
    let sa = sync(&b, &a_id, 2, vec![(&a_id, b"p0,p1"), (&b_id, b"p2,p3")]).await;
    assert_eq!(&sa.assignment[..], b"p0,p1");
    let sb = waiting.await.unwrap();
    assert_eq!(&sb.assignment[..], b"p2,p3");
    assert_eq!(b.coordinator().group_state("g"), Some(("Stable", 2, 2)));
    // An old generation is refused.
    assert_eq!(
        heartbeat(&b, &a_id, 1).await,
        ResponseError::IllegalGeneration.code()
    );

    // B leaves: A rejoins alone in generation 3.
    let leave = LeaveGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_member_id(s(&b_id));
    let r: LeaveGroupResponse = call(&b, ApiKey::LeaveGroup, 1, &leave).await;
    assert_eq!(r.error_code, 0);
    assert_eq!(
        heartbeat(&b, &a_id, 2).await,
        ResponseError::RebalanceInProgress.code()
    );
    let a3 = join(&b, &a_id).await.await.unwrap();
    assert_eq!((a3.generation_id, a3.members.len()), (3, 1));
}

#[tokio::test]
async fn a_silent_member_expires_after_its_session_timeout() {
    let (b, clock) = setup().await;
    let a = join(&b, "").await.await.unwrap();
    let a_id = a.member_id.to_string();
    sync(&b, &a_id, 1, vec![]).await;
    clock.advance(Duration::from_millis(9_000));
    b.coordinator().tick();
    assert_eq!(b.coordinator().group_state("g"), Some(("Stable", 1, 1)));
    assert_eq!(heartbeat(&b, &a_id, 1).await, 0);
    clock.advance(Duration::from_millis(10_001));
    b.coordinator().tick();
    assert_eq!(b.coordinator().group_state("g").map(|g| g.2), Some(0));
    assert_eq!(
        heartbeat(&b, &a_id, 1).await,
        ResponseError::UnknownMemberId.code()
    );
}

#[tokio::test]
async fn a_member_that_does_not_rejoin_is_dropped_at_the_rebalance_deadline() {
    let (b, clock) = setup().await;
    let a = join(&b, "").await.await.unwrap();
    let a_id = a.member_id.to_string();
    sync(&b, &a_id, 1, vec![]).await;
    let b_join = join(&b, "").await;
    tokio::task::yield_now().await;
    // A never rejoins: after the rebalance timeout B completes alone.
    clock.advance(Duration::from_millis(29_000));
    b.coordinator().tick();
    assert_eq!(
        b.coordinator().group_state("g").map(|g| g.0),
        Some("PreparingRebalance")
    );
    clock.advance(Duration::from_millis(2_000));
    b.coordinator().tick();
    let b2 = tokio::time::timeout(Duration::from_secs(5), b_join)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((b2.generation_id, b2.members.len()), (2, 1));
    assert_eq!(b2.leader, b2.member_id);
}

async fn commit(b: &Broker, member: &str, generation: i32) -> i16 {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    let mut p = OffsetCommitRequestPartition::default();
    p.committed_offset = 5;
    let mut t = OffsetCommitRequestTopic::default();
    t.name = TopicName(s("t"));
    t.partitions = vec![p];
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_topics(vec![t]);
    let r: OffsetCommitResponse = call(b, ApiKey::OffsetCommit, 7, &req).await;
    r.topics[0].partitions[0].error_code
}

#[tokio::test]
async fn members_commit_for_their_generation_until_the_next_one_is_assigned() {
    let (b, _clock) = setup().await;
    let a = join(&b, "").await.await.unwrap();
    let a_id = a.member_id.to_string();
    assert!(
        a_id.starts_with("test-"),
        "member ids start with the client id: {a_id}"
    );
    // Joined, not yet assigned: the commit waits for the assignment.
    assert_eq!(
        commit(&b, &a_id, 1).await,
        ResponseError::RebalanceInProgress.code()
    );
    sync(&b, &a_id, 1, vec![]).await;
    assert_eq!(commit(&b, &a_id, 1).await, 0);
    assert_eq!(
        commit(&b, "stranger", 1).await,
        ResponseError::UnknownMemberId.code()
    );
    // B joins: while the group prepares, A may still commit for generation 1.
    let b_join = join(&b, "").await;
    tokio::task::yield_now().await;
    assert_eq!(commit(&b, &a_id, 1).await, 0);
    let _ = join(&b, &a_id).await.await.unwrap();
    let _ = b_join.await.unwrap();
    // Generation 2 is being assigned: old and new generation commits wait for it.
    assert_eq!(
        commit(&b, &a_id, 1).await,
        ResponseError::RebalanceInProgress.code()
    );
    assert_eq!(
        commit(&b, &a_id, 2).await,
        ResponseError::RebalanceInProgress.code()
    );
    sync(&b, &a_id, 2, vec![]).await;
    assert_eq!(commit(&b, &a_id, 2).await, 0);
    assert_eq!(
        commit(&b, &a_id, 1).await,
        ResponseError::IllegalGeneration.code()
    );
}
