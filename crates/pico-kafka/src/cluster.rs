//! The cluster as Kafka clients see it: every live node with a Kafka listener is a broker
//! (its broker id is its node id), and a partition's leader is its stream's owner; a node
//! that does not own a partition answers NOT_LEADER_OR_FOLLOWER, so clients refresh Metadata
//! and go to the owner.
//!
//! Each node's Kafka address is in the metadata log's KV under `kafka/brokers/{node_id}`,
//! written when its listener starts, with the node epoch it was written at: an address is
//! handed out only while that node runs at that epoch (a restart writes its new one), and
//! only while its heartbeat moves as seen from here (the nodes' own liveness rule:
//! docs/design/cluster.md).

use std::collections::HashMap;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_common::StreamName;
use pico_server::KvError;
use serde::{Deserialize, Serialize};

use crate::broker::Broker;

/// The KV prefix of the nodes' Kafka addresses.
pub const BROKERS_PREFIX: &str = "kafka/brokers/";
/// Most nodes listed.
const MAX_BROKERS: usize = 10_000;

/// One node's Kafka address, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Advert {
    pub node_epoch: u64,
    pub host: String,
    pub port: i32,
}

/// A broker in Metadata / DescribeCluster answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    pub id: i32,
    pub host: String,
    pub port: i32,
}

/// Where a partition is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leader {
    /// This node (it owns the stream, or nobody does and the first append here opens it).
    Here,
    /// Another live node with a Kafka listener.
    Node(i32),
    /// Another node owns it, but it is not reachable over Kafka now (its heartbeat lapsed, or
    /// it has no Kafka listener): clients wait and ask again.
    Unavailable,
}

/// What this node has seen of each node's heartbeats: (epoch, heartbeat, first seen here).
#[derive(Debug, Default)]
pub struct Liveness {
    seen: std::sync::Mutex<HashMap<u32, (u64, i64, i64)>>,
}

impl Broker {
    /// Stores this node's Kafka address (at its current epoch) for the other nodes' Metadata.
    pub async fn advertise(&self) -> Result<(), KvError> {
        let cfg = self.node.config();
        let advert = Advert {
            node_epoch: cfg.node_epoch,
            host: self.opts.advertised_host.clone(),
            port: self.opts.advertised_port,
        };
        let value = serde_json::to_vec(&advert).unwrap_or_default();
        let key = format!("{BROKERS_PREFIX}{}", cfg.node_id);
        if self.node.kv_get(&key).as_deref() == Some(&value[..]) {
            return Ok(());
        }
        self.node.kv_put_many(vec![(key, value)]).await
    }

    /// This node, and every other node running at the epoch of its stored address whose
    /// heartbeat is live as seen here; in id order.
    pub(crate) fn brokers(&self) -> Vec<BrokerAddr> {
        let me = self.node.config().node_id;
        let mut out = vec![self.this_broker()];
        for (node_id, advert) in self.adverts() {
            if node_id != me && self.is_live(node_id, advert.node_epoch) {
                out.push(BrokerAddr {
                    id: i32::try_from(node_id).unwrap_or(i32::MAX),
                    host: advert.host,
                    port: advert.port,
                });
            }
        }
        out.sort_by_key(|b| b.id);
        out
    }

    /// The broker coordinating `group`: one of the listed brokers picked by a hash of the
    /// group id (FNV-1a), so nodes that list the same brokers name the same one.
    pub(crate) fn coordinator_for(&self, group: &str) -> BrokerAddr {
        let mut brokers = self.brokers();
        let hash = group.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        let at = (hash % brokers.len().max(1) as u64) as usize;
        if at < brokers.len() {
            brokers.swap_remove(at)
        } else {
            self.this_broker()
        }
    }

    /// Whether this node coordinates `group`.
    pub(crate) fn coordinates(&self, group: &str) -> bool {
        self.coordinator_for(group).id == self.opts.broker_id
    }

    fn this_broker(&self) -> BrokerAddr {
        BrokerAddr {
            id: self.opts.broker_id,
            host: self.opts.advertised_host.clone(),
            port: self.opts.advertised_port,
        }
    }

    fn adverts(&self) -> Vec<(u32, Advert)> {
        self.node
            .kv_scan(BROKERS_PREFIX, MAX_BROKERS)
            .into_iter()
            .filter_map(|(k, v)| {
                let id = k.strip_prefix(BROKERS_PREFIX)?.parse().ok()?;
                Some((id, serde_json::from_slice(&v).ok()?))
            })
            .collect()
    }

    /// Whether node `node_id` runs at `epoch` and its heartbeat moved within the liveness
    /// timeout, on this node's clock.
    fn is_live(&self, node_id: u32, epoch: u64) -> bool {
        let nodes = self.node.cluster_nodes();
        let Some(n) = nodes.iter().find(|n| n.node_id == node_id) else {
            return false;
        };
        if n.epoch != epoch {
            return false;
        }
        let now = self.node.now_ms();
        let timeout =
            i64::try_from(self.node.config().liveness_timeout.as_millis()).unwrap_or(i64::MAX);
        let mut seen = self.liveness.seen.lock().unwrap_or_else(|p| p.into_inner());
        let entry = seen
            .entry(node_id)
            .or_insert((n.epoch, n.last_heartbeat_ms, now));
        if (entry.0, entry.1) != (n.epoch, n.last_heartbeat_ms) {
            *entry = (n.epoch, n.last_heartbeat_ms, now);
        }
        now.saturating_sub(entry.2) < timeout
    }

    /// The leader of the partition stored in `name`.
    pub(crate) fn leader_of(&self, name: &StreamName) -> Leader {
        let Some(owner) = self.node.owner_node(name) else {
            return Leader::Here;
        };
        let listed = self
            .node
            .kv_get(&format!("{BROKERS_PREFIX}{owner}"))
            .and_then(|v| serde_json::from_slice::<Advert>(&v).ok())
            .is_some_and(|a| self.is_live(owner, a.node_epoch));
        match i32::try_from(owner) {
            Ok(id) if listed => Leader::Node(id),
            _ => Leader::Unavailable,
        }
    }

    /// `Err(NOT_LEADER_OR_FOLLOWER)` when another node serves the partition in `name`.
    pub(crate) fn check_leader(&self, name: &StreamName) -> Result<(), ResponseError> {
        match self.leader_of(name) {
            Leader::Here => Ok(()),
            Leader::Node(_) | Leader::Unavailable => Err(ResponseError::NotLeaderOrFollower),
        }
    }

    pub(crate) fn describe_cluster(
        &self,
        r: DescribeClusterRequest,
        v: i16,
    ) -> DescribeClusterResponse {
        let mut resp = DescribeClusterResponse::default();
        resp.cluster_id = StrBytes::from_string(self.opts.cluster_id.clone());
        resp.controller_id = BrokerId(self.opts.broker_id);
        if v >= 1 {
            resp.endpoint_type = r.endpoint_type;
            // 1 = brokers; 2 = controllers, which this cluster has none of apart from them.
            if r.endpoint_type != 1 {
                resp.error_code = ResponseError::UnsupportedEndpointType.code();
                resp.error_message = Some("only broker endpoints are served".into());
                return resp;
            }
        }
        resp.brokers = self
            .brokers()
            .into_iter()
            .map(|b| {
                DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(b.id))
                    .with_host(StrBytes::from_string(b.host))
                    .with_port(b.port)
            })
            .collect();
        resp
    }
}
