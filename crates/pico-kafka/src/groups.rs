//! The group coordinator (the classic, eager JoinGroup/SyncGroup protocol) and committed
//! offsets.
//!
//! Group membership lives in memory, as in Kafka (members rejoin after a restart); every
//! deadline (session timeouts, the rebalance timeout) is measured on the node's injected
//! clock and checked by [`Coordinator::tick`], which the listener calls on a short interval.
//! Committed offsets are durable: each commit is written to the metadata KV (the one the
//! Durable Streams subscriptions use) before it is acknowledged, under
//! `kafka/offsets/{group}/{topic}/{partition}` (`/` and `%` in the group id escaped).

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponsePartition, OffsetFetchResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_common::clock::SharedClock;
use pico_server::Node;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

const OFFSETS_PREFIX: &str = "kafka/offsets/";
/// Most partitions one OffsetCommit may carry.
const MAX_COMMIT: usize = 10_000;
/// Most groups the coordinator keeps; joins of new groups past it are refused.
const MAX_GROUPS: usize = 10_000;
/// Most members one group may have.
const MAX_MEMBERS: usize = 1_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Empty,
    Preparing,
    Completing,
    Stable,
}

impl State {
    fn name(self) -> &'static str {
        match self {
            State::Empty => "Empty",
            State::Preparing => "PreparingRebalance",
            State::Completing => "CompletingRebalance",
            State::Stable => "Stable",
        }
    }
}

struct Member {
    instance_id: Option<StrBytes>,
    client_id: String,
    session_timeout_ms: i64,
    rebalance_timeout_ms: i64,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    last_seen_ms: i64,
    join: Option<oneshot::Sender<JoinGroupResponse>>,
    sync: Option<oneshot::Sender<SyncGroupResponse>>,
}

struct Group {
    state: State,
    generation: i32,
    protocol_type: Option<String>,
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member>,
    rebalance_deadline_ms: i64,
}

impl Group {
    fn new() -> Group {
        Group {
            state: State::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            rebalance_deadline_ms: 0,
        }
    }

    /// Starts (or keeps) a rebalance: members must rejoin before the deadline.
    fn prepare(&mut self, now: i64) {
        if self.state != State::Preparing {
            let timeout = self
                .members
                .values()
                .map(|m| m.rebalance_timeout_ms)
                .max()
                .unwrap_or(0);
            self.rebalance_deadline_ms = now.saturating_add(timeout);
            self.state = State::Preparing;
        }
        // Members waiting for an assignment of the old generation must rejoin.
        for m in self.members.values_mut() {
            if let Some(tx) = m.sync.take() {
                let _ = tx.send(sync_error(ResponseError::RebalanceInProgress));
            }
        }
    }

    fn all_joined(&self) -> bool {
        self.members.values().all(|m| m.join.is_some())
    }

    /// Ends the join phase: members that did not rejoin leave, the generation moves on, and
    /// every waiting join is answered (the leader with every member's metadata).
    fn complete(&mut self, now: i64, group_id: &str) {
        self.members.retain(|_, m| m.join.is_some());
        if self.members.is_empty() {
            self.state = State::Empty;
            self.generation += 1;
            self.leader = None;
            self.protocol = None;
            self.protocol_type = None;
            return;
        }
        let leader = match &self.leader {
            Some(l) if self.members.contains_key(l) => l.clone(),
            _ => self.members.keys().next().cloned().unwrap_or_default(),
        };
        let protocol = self.members.get(&leader).and_then(|l| {
            l.protocols
                .iter()
                .map(|(n, _)| n)
                .find(|n| {
                    self.members
                        .values()
                        .all(|m| m.protocols.iter().any(|(p, _)| p == *n))
                })
                .cloned()
        });
        self.generation += 1;
        self.leader = Some(leader.clone());
        self.protocol = protocol.clone();
        self.state = State::Completing;
        tracing::debug!(
            group_id,
            generation = self.generation,
            members = self.members.len(),
            "kafka group rebalanced"
        );
        let all: Vec<JoinGroupResponseMember> = self
            .members
            .iter()
            .map(|(id, m)| {
                let mut jm = JoinGroupResponseMember::default();
                jm.member_id = StrBytes::from_string(id.clone());
                jm.group_instance_id = m.instance_id.clone();
                jm.metadata = m
                    .protocols
                    .iter()
                    .find(|(n, _)| Some(n) == protocol.as_ref())
                    .map(|(_, md)| md.clone())
                    .unwrap_or_default();
                jm
            })
            .collect();
        for (id, m) in self.members.iter_mut() {
            m.last_seen_ms = now;
            m.assignment = Bytes::new();
            let Some(tx) = m.join.take() else { continue };
            let mut resp = JoinGroupResponse::default();
            resp.generation_id = self.generation;
            resp.protocol_name = protocol.clone().map(StrBytes::from_string);
            resp.leader = StrBytes::from_string(leader.clone());
            resp.member_id = StrBytes::from_string(id.clone());
            if *id == leader {
                // The members' group_instance_id is v5+ only: the caller's version decides,
                // and the leader is told each member's as sent.
                resp.members = all.clone();
            }
            let _ = tx.send(resp);
        }
    }
}

#[derive(Serialize, Deserialize)]
struct Committed {
    offset: i64,
    metadata: Option<String>,
}

/// Every group of this node.
pub struct Coordinator {
    node: Node,
    clock: SharedClock,
    groups: std::sync::Mutex<HashMap<String, Group>>,
    next_member: std::sync::atomic::AtomicU64,
}

fn join_error(code: ResponseError, member_id: &str) -> JoinGroupResponse {
    let mut r = JoinGroupResponse::default();
    r.error_code = code.code();
    r.generation_id = -1;
    r.member_id = StrBytes::from_string(member_id.to_string());
    r
}

fn sync_error(code: ResponseError) -> SyncGroupResponse {
    let mut r = SyncGroupResponse::default();
    r.error_code = code.code();
    r
}

fn escape(group: &str) -> String {
    group.replace('%', "%25").replace('/', "%2F")
}

fn offset_key(group: &str, topic: &str, partition: i32) -> String {
    format!("{OFFSETS_PREFIX}{}/{topic}/{partition}", escape(group))
}

impl Coordinator {
    pub fn new(node: Node, clock: SharedClock) -> Coordinator {
        Coordinator {
            node,
            clock,
            groups: Default::default(),
            next_member: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Group>> {
        self.groups.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub async fn join(&self, r: JoinGroupRequest, v: i16, client_id: &str) -> JoinGroupResponse {
        let now = self.clock.now_ms();
        let group_id = r.group_id.0.to_string();
        let given = r.member_id.to_string();
        if group_id.is_empty() {
            return join_error(ResponseError::InvalidGroupId, &given);
        }
        if r.protocol_type.is_empty() || r.protocols.is_empty() {
            return join_error(ResponseError::InconsistentGroupProtocol, &given);
        }
        let rx = {
            let mut groups = self.lock();
            if !groups.contains_key(&group_id) && groups.len() >= MAX_GROUPS {
                return join_error(ResponseError::CoordinatorNotAvailable, &given);
            }
            let g = groups.entry(group_id.clone()).or_insert_with(Group::new);
            if g.protocol_type
                .as_ref()
                .is_some_and(|t| t != r.protocol_type.as_str())
                && !g.members.is_empty()
            {
                return join_error(ResponseError::InconsistentGroupProtocol, &given);
            }
            let member_id = if given.is_empty() {
                if g.members.len() >= MAX_MEMBERS {
                    return join_error(ResponseError::GroupMaxSizeReached, &given);
                }
                let n = self
                    .next_member
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let client = if client_id.is_empty() {
                    "member"
                } else {
                    client_id
                };
                format!("{client}-{now}-{n}")
            } else if !g.members.contains_key(&given) {
                return join_error(ResponseError::UnknownMemberId, &given);
            } else {
                given
            };
            let (tx, rx) = oneshot::channel();
            let rebalance = if v >= 1 {
                r.rebalance_timeout_ms
            } else {
                r.session_timeout_ms
            };
            let protocols: Vec<(String, Bytes)> = r
                .protocols
                .iter()
                .map(|p| (p.name.to_string(), p.metadata.clone()))
                .collect();
            let member = Member {
                instance_id: r.group_instance_id.clone(),
                client_id: client_id.to_string(),
                session_timeout_ms: i64::from(r.session_timeout_ms.max(1)),
                rebalance_timeout_ms: i64::from(rebalance.max(1)),
                protocols,
                assignment: Bytes::new(),
                last_seen_ms: now,
                join: Some(tx),
                sync: None,
            };
            g.protocol_type = Some(r.protocol_type.to_string());
            // Every join starts a rebalance, even a stable member's retry with unchanged
            // metadata: simpler than Kafka's shortcut, and members rejoin either way.
            g.members.insert(member_id.clone(), member);
            g.prepare(now);
            if g.all_joined() {
                g.complete(now, &group_id);
            }
            rx
        };
        match rx.await {
            Ok(resp) => resp,
            Err(_) => join_error(ResponseError::RebalanceInProgress, ""),
        }
    }

    pub async fn sync(&self, r: SyncGroupRequest) -> SyncGroupResponse {
        let now = self.clock.now_ms();
        let member_id = r.member_id.to_string();
        let rx = {
            let mut groups = self.lock();
            let Some(g) = groups.get_mut(r.group_id.0.as_str()) else {
                return sync_error(ResponseError::UnknownMemberId);
            };
            if !g.members.contains_key(&member_id) {
                return sync_error(ResponseError::UnknownMemberId);
            }
            if r.generation_id != g.generation {
                return sync_error(ResponseError::IllegalGeneration);
            }
            let ok = |assignment: Bytes| {
                let mut resp = SyncGroupResponse::default();
                resp.assignment = assignment;
                resp
            };
            match g.state {
                State::Preparing | State::Empty => {
                    return sync_error(ResponseError::RebalanceInProgress);
                }
                State::Stable => {
                    let m = g.members.get_mut(&member_id);
                    return ok(m
                        .map(|m| {
                            m.last_seen_ms = now;
                            m.assignment.clone()
                        })
                        .unwrap_or_default());
                }
                State::Completing => {}
            }
            if g.leader.as_deref() == Some(member_id.as_str()) {
                let given: HashMap<String, Bytes> = r
                    .assignments
                    .into_iter()
                    .map(|a| (a.member_id.to_string(), a.assignment))
                    .collect();
                for (id, m) in g.members.iter_mut() {
                    m.assignment = given.get(id).cloned().unwrap_or_default();
                    if let Some(tx) = m.sync.take() {
                        let _ = tx.send(ok(m.assignment.clone()));
                    }
                }
                g.state = State::Stable;
                let m = g.members.get_mut(&member_id);
                return ok(m
                    .map(|m| {
                        m.last_seen_ms = now;
                        m.assignment.clone()
                    })
                    .unwrap_or_default());
            }
            let (tx, rx) = oneshot::channel();
            if let Some(m) = g.members.get_mut(&member_id) {
                m.last_seen_ms = now;
                m.sync = Some(tx);
            }
            rx
        };
        rx.await
            .unwrap_or_else(|_| sync_error(ResponseError::RebalanceInProgress))
    }

    pub fn heartbeat(&self, r: HeartbeatRequest) -> HeartbeatResponse {
        let now = self.clock.now_ms();
        let mut resp = HeartbeatResponse::default();
        let mut groups = self.lock();
        let code = match groups.get_mut(r.group_id.0.as_str()) {
            None => Some(ResponseError::UnknownMemberId),
            Some(g) => {
                let state = g.state;
                let generation = g.generation;
                match g.members.get_mut(r.member_id.as_str()) {
                    None => Some(ResponseError::UnknownMemberId),
                    Some(m) => {
                        m.last_seen_ms = now;
                        if state == State::Preparing {
                            Some(ResponseError::RebalanceInProgress)
                        } else if r.generation_id != generation {
                            Some(ResponseError::IllegalGeneration)
                        } else {
                            None
                        }
                    }
                }
            }
        };
        resp.error_code = code.map_or(0, |c| c.code());
        resp
    }

    pub fn leave(&self, r: LeaveGroupRequest, v: i16) -> LeaveGroupResponse {
        let now = self.clock.now_ms();
        let group_id = r.group_id.0.to_string();
        let ids: Vec<(String, Option<StrBytes>)> = if v >= 3 {
            r.members
                .iter()
                .map(|m| (m.member_id.to_string(), m.group_instance_id.clone()))
                .collect()
        } else {
            vec![(r.member_id.to_string(), None)]
        };
        let mut resp = LeaveGroupResponse::default();
        let mut groups = self.lock();
        let Some(g) = groups.get_mut(&group_id) else {
            resp.error_code = ResponseError::UnknownMemberId.code();
            return resp;
        };
        let mut removed = false;
        for (id, instance) in ids {
            let mut out = MemberResponse::default();
            out.member_id = StrBytes::from_string(id.clone());
            out.group_instance_id = instance;
            match g.members.remove(&id) {
                Some(m) => {
                    removed = true;
                    if let Some(tx) = m.join {
                        let _ = tx.send(join_error(ResponseError::UnknownMemberId, &id));
                    }
                }
                None => out.error_code = ResponseError::UnknownMemberId.code(),
            }
            if v >= 3 {
                resp.members.push(out);
            } else if out.error_code != 0 {
                resp.error_code = out.error_code;
            }
        }
        if removed {
            self.rebalance_after_departure(g, now, &group_id);
        }
        resp
    }

    fn rebalance_after_departure(&self, g: &mut Group, now: i64, group_id: &str) {
        if g.members.is_empty() {
            g.state = State::Empty;
            g.generation += 1;
            g.leader = None;
            return;
        }
        g.prepare(now);
        if g.all_joined() {
            g.complete(now, group_id);
        }
    }

    /// Expires members whose session lapsed and ends join phases whose deadline passed.
    pub fn tick(&self) {
        let now = self.clock.now_ms();
        let mut groups = self.lock();
        for (id, g) in groups.iter_mut() {
            if g.state == State::Preparing {
                if g.all_joined() || now >= g.rebalance_deadline_ms {
                    g.complete(now, id);
                }
                continue;
            }
            let before = g.members.len();
            g.members.retain(|_, m| {
                m.join.is_some() || now < m.last_seen_ms.saturating_add(m.session_timeout_ms)
            });
            if g.members.len() < before {
                tracing::debug!(
                    group = id,
                    expired = before - g.members.len(),
                    "kafka group members expired"
                );
                self.rebalance_after_departure(g, now, id);
            }
        }
        groups.retain(|_, g| {
            !(g.state == State::Empty && g.members.is_empty() && g.generation > 1_000_000)
        });
    }

    /// The (state, generation, members) of a group, for tests and DescribeGroups.
    pub fn group_state(&self, group: &str) -> Option<(&'static str, i32, usize)> {
        self.lock()
            .get(group)
            .map(|g| (g.state.name(), g.generation, g.members.len()))
    }

    pub async fn commit(&self, r: OffsetCommitRequest, _v: i16) -> OffsetCommitResponse {
        let group_id = r.group_id.0.to_string();
        let check = {
            let groups = self.lock();
            match groups.get(&group_id) {
                _ if r.generation_id_or_member_epoch < 0 && r.member_id.is_empty() => None,
                None => Some(ResponseError::UnknownMemberId),
                Some(g) => {
                    // As in Kafka: a member may still commit for its generation while the
                    // group prepares a rebalance, not while the new one hands out assignments.
                    if !g.members.contains_key(r.member_id.as_str()) {
                        Some(ResponseError::UnknownMemberId)
                    } else if g.state == State::Completing {
                        Some(ResponseError::RebalanceInProgress)
                    } else if g.generation != r.generation_id_or_member_epoch {
                        Some(ResponseError::IllegalGeneration)
                    } else {
                        None
                    }
                }
            }
        };
        let total: usize = r.topics.iter().map(|t| t.partitions.len()).sum();
        let code = if group_id.is_empty() {
            Some(ResponseError::InvalidGroupId)
        } else if total > MAX_COMMIT {
            Some(ResponseError::InvalidRequest)
        } else {
            check
        };
        let mut pairs = Vec::new();
        if code.is_none() {
            for t in &r.topics {
                for p in &t.partitions {
                    let value = Committed {
                        offset: p.committed_offset,
                        metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
                    };
                    if let Ok(v) = serde_json::to_vec(&value) {
                        pairs.push((
                            offset_key(&group_id, t.name.0.as_str(), p.partition_index),
                            v,
                        ));
                    }
                }
            }
        }
        let code = match code {
            Some(c) => Some(c),
            None => match self.node.kv_put_many(pairs).await {
                Ok(()) => None,
                Err(e) => {
                    tracing::warn!(group = group_id, error = %e, "kafka offset commit failed");
                    Some(ResponseError::CoordinatorNotAvailable)
                }
            },
        };
        let mut resp = OffsetCommitResponse::default();
        for t in r.topics {
            let mut out = OffsetCommitResponseTopic::default();
            out.name = t.name;
            for p in t.partitions {
                let mut part = OffsetCommitResponsePartition::default();
                part.partition_index = p.partition_index;
                part.error_code = code.map_or(0, |c| c.code());
                out.partitions.push(part);
            }
            resp.topics.push(out);
        }
        resp
    }

    fn committed(&self, group: &str, topic: &str, partition: i32) -> Option<Committed> {
        self.node
            .kv_get(&offset_key(group, topic, partition))
            .and_then(|v| serde_json::from_slice(&v).ok())
    }

    pub fn fetch_offsets(&self, r: OffsetFetchRequest, _v: i16) -> OffsetFetchResponse {
        let group_id = r.group_id.0.to_string();
        let mut resp = OffsetFetchResponse::default();
        let partition = |index: i32, c: Option<Committed>| {
            let mut p = OffsetFetchResponsePartition::default();
            p.partition_index = index;
            p.committed_leader_epoch = -1;
            match c {
                Some(c) => {
                    p.committed_offset = c.offset;
                    p.metadata = c.metadata.map(StrBytes::from_string);
                }
                None => {
                    p.committed_offset = -1;
                    p.metadata = Some(StrBytes::default());
                }
            }
            p
        };
        match r.topics {
            Some(topics) => {
                for t in topics {
                    let mut out = OffsetFetchResponseTopic::default();
                    for &i in &t.partition_indexes {
                        out.partitions.push(partition(
                            i,
                            self.committed(&group_id, t.name.0.as_str(), i),
                        ));
                    }
                    out.name = t.name;
                    resp.topics.push(out);
                }
            }
            None => {
                let prefix = format!("{OFFSETS_PREFIX}{}/", escape(&group_id));
                let mut by_topic: BTreeMap<String, Vec<OffsetFetchResponsePartition>> =
                    BTreeMap::new();
                for (key, value) in self.node.kv_scan(&prefix, 100_000) {
                    let rest = &key[prefix.len()..];
                    let Some((topic, p)) = rest.split_once('/') else {
                        continue;
                    };
                    let (Ok(p), Ok(c)) = (p.parse::<i32>(), serde_json::from_slice(&value)) else {
                        continue;
                    };
                    by_topic
                        .entry(topic.to_string())
                        .or_default()
                        .push(partition(p, Some(c)));
                }
                for (topic, parts) in by_topic {
                    let mut out = OffsetFetchResponseTopic::default();
                    out.name = TopicName(StrBytes::from_string(topic));
                    out.partitions = parts;
                    resp.topics.push(out);
                }
            }
        }
        resp
    }

    pub fn list(&self) -> ListGroupsResponse {
        let mut resp = ListGroupsResponse::default();
        for (id, g) in self.lock().iter() {
            let mut lg = ListedGroup::default();
            lg.group_id = GroupId(StrBytes::from_string(id.clone()));
            lg.protocol_type = StrBytes::from_string(g.protocol_type.clone().unwrap_or_default());
            resp.groups.push(lg);
        }
        resp
    }

    pub fn describe(&self, r: DescribeGroupsRequest) -> DescribeGroupsResponse {
        let groups = self.lock();
        let mut resp = DescribeGroupsResponse::default();
        for id in r.groups {
            let mut out = DescribedGroup::default();
            match groups.get(id.0.as_str()) {
                None => out.group_state = StrBytes::from_static_str("Dead"),
                Some(g) => {
                    out.group_state = StrBytes::from_static_str(g.state.name());
                    out.protocol_type =
                        StrBytes::from_string(g.protocol_type.clone().unwrap_or_default());
                    out.protocol_data =
                        StrBytes::from_string(g.protocol.clone().unwrap_or_default());
                    for (mid, m) in &g.members {
                        let mut dm = DescribedGroupMember::default();
                        dm.member_id = StrBytes::from_string(mid.clone());
                        dm.client_id = StrBytes::from_string(m.client_id.clone());
                        dm.client_host = StrBytes::from_static_str("/127.0.0.1");
                        dm.member_metadata = m
                            .protocols
                            .iter()
                            .find(|(n, _)| Some(n) == g.protocol.as_ref())
                            .map(|(_, md)| md.clone())
                            .unwrap_or_default();
                        dm.member_assignment = m.assignment.clone();
                        out.members.push(dm);
                    }
                }
            }
            out.group_id = id;
            resp.groups.push(out);
        }
        resp
    }
}
