//! Heartbeats: this node's liveness through the metadata log, and what other nodes' heartbeats
//! say about them.
//!
//! Every node proposes `Heartbeat` at its node epoch every `NodeConfig::heartbeat_every`. A
//! proposal is read-your-writes, so an accepted heartbeat also proves the node applied the log
//! up to it: readiness requires one started less than `liveness_timeout` ago (a node cut off
//! from the database stops being ready). A rejected one (a newer process registered this id, or
//! the node was fenced) marks the node unregistered for good: this process can commit nothing.
//!
//! Liveness of others is judged on the observer's own clock, never by comparing clocks: a node
//! is live while its heartbeat value (or epoch) changed less than `liveness_timeout` ago as seen
//! here. An observer that just started (or just took the lease) has seen nothing change yet, so
//! it gives every node a full timeout from its first look.

use crate::node::Node;
use pico_metadata::{ApplyError, Command, State};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// This node's own heartbeat state, read by `Node::ready`.
#[derive(Debug)]
pub(crate) struct OwnHeartbeat {
    /// Clock time at the start of the latest accepted heartbeat (or registration).
    last_ok_ms: AtomicI64,
    /// A heartbeat was rejected: a newer process of this node exists, or it was fenced.
    fenced: AtomicBool,
}

impl OwnHeartbeat {
    pub(crate) fn new(registered_at_ms: i64) -> OwnHeartbeat {
        OwnHeartbeat {
            last_ok_ms: AtomicI64::new(registered_at_ms),
            fenced: AtomicBool::new(false),
        }
    }

    /// Whether the log accepted a heartbeat of this process recently enough at `now_ms`.
    pub(crate) fn fresh(&self, now_ms: i64, timeout: Duration) -> bool {
        let last = self.last_ok_ms.load(Ordering::Relaxed);
        !self.fenced() && now_ms.saturating_sub(last) < millis(timeout)
    }

    pub(crate) fn fenced(&self) -> bool {
        self.fenced.load(Ordering::Relaxed)
    }

    fn ok(&self, at_ms: i64) {
        self.last_ok_ms.fetch_max(at_ms, Ordering::Relaxed);
    }
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Proposes one heartbeat at the node's epoch and records the answer.
pub(crate) async fn heartbeat_pass(node: Node) {
    let cfg = &node.inner.config;
    // Taken before the proposal: a slow round trip counts against the node, not for it.
    let now = cfg.clock.now_ms();
    let beat = Command::Heartbeat {
        node_id: cfg.node_id,
        node_epoch: cfg.node_epoch,
        now_ms: now,
    };
    match node.inner.meta.propose(beat).await {
        Ok(Ok(_)) => node.inner.heartbeat.ok(now),
        Ok(Err(e @ (ApplyError::StaleNodeEpoch { .. } | ApplyError::UnknownNode { .. }))) => {
            if !node.inner.heartbeat.fenced.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    error = %e,
                    "this node process was fenced (a newer one registered, or failover took its \
                     streams): it can commit nothing more; restart it to rejoin"
                );
            }
            node.inner.registered.store(false, Ordering::Relaxed);
        }
        Ok(Err(e)) => tracing::warn!(error = %e, "heartbeat rejected"),
        Err(e) => tracing::warn!(error = %e, "heartbeat not recorded (metadata log unavailable)"),
    }
}

/// The lease holder's watch over other nodes: logs each node incarnation whose heartbeat
/// lapsed, once. Failover (fence, recover its WAL, release its streams) starts here when it is
/// built (docs/design/cluster.md); until then its streams wait for it to restart.
pub(crate) async fn liveness_pass(node: Node, watch: Arc<Mutex<LivenessWatch>>) {
    let cfg = &node.inner.config;
    let view = node.inner.meta.view();
    let now = cfg.clock.now_ms();
    let mut w = watch.lock().unwrap_or_else(|p| p.into_inner());
    let lapsed: BTreeSet<(u32, u64)> = w
        .liveness
        .lapsed(&view, now, cfg.liveness_timeout)
        .into_iter()
        .filter(|(id, _)| *id != cfg.node_id)
        .collect();
    for (id, epoch) in lapsed.difference(&w.reported) {
        let owned = view
            .streams
            .values()
            .filter(|m| m.owner.is_some_and(|o| o.node_id == *id))
            .count();
        tracing::warn!(
            node_id = id,
            node_epoch = epoch,
            owned_streams = owned,
            "node heartbeat lapsed: its streams wait for it to restart (no automatic failover yet)"
        );
    }
    w.reported = lapsed;
}

/// [`liveness_pass`]'s memory: what it saw, and which lapses it already reported.
#[derive(Debug, Default)]
pub(crate) struct LivenessWatch {
    liveness: Liveness,
    reported: BTreeSet<(u32, u64)>,
}

/// What an observer has seen of each node's heartbeats, to tell which lapsed.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// node id → (epoch, heartbeat value, observer's clock when that pair was first seen).
    seen: BTreeMap<u32, (u64, i64, i64)>,
}

impl Liveness {
    /// Updates from the view at the observer's `now_ms`; returns the nodes (id, epoch) whose
    /// heartbeat has not changed for `timeout` as seen here, in id order.
    pub(crate) fn lapsed(
        &mut self,
        view: &State,
        now_ms: i64,
        timeout: Duration,
    ) -> Vec<(u32, u64)> {
        self.seen.retain(|id, _| view.nodes.contains_key(id));
        let mut out = Vec::new();
        for (id, n) in view.nodes.iter() {
            let entry = self
                .seen
                .entry(*id)
                .or_insert((n.epoch, n.last_heartbeat_ms, now_ms));
            if (entry.0, entry.1) != (n.epoch, n.last_heartbeat_ms) {
                *entry = (n.epoch, n.last_heartbeat_ms, now_ms);
            }
            if now_ms.saturating_sub(entry.2) >= millis(timeout) {
                out.push((*id, n.epoch));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::NodeConfig;
    use crate::maintenance::test_support::node_with;
    use pico_common::clock::{Clock, ManualClock};
    use s3stream::{EngineConfig, MemoryStorage};

    fn config(clock: &Arc<ManualClock>) -> NodeConfig {
        NodeConfig {
            node_epoch: 3,
            clock: clock.clone(),
            liveness_timeout: Duration::from_secs(5),
            ..NodeConfig::default()
        }
    }

    /// Readiness follows accepted heartbeats on the node's clock: it holds up to the timeout
    /// after the last one and is gone at it; the next accepted heartbeat restores it.
    #[tokio::test]
    async fn readiness_lapses_without_accepted_heartbeats_and_returns_with_one() {
        let clock = ManualClock::new(1_000_000);
        let node = node_with(
            config(&clock),
            Arc::new(MemoryStorage::new()),
            EngineConfig::default(),
        )
        .await;
        assert!(node.ready().ready, "ready once registered");
        clock.advance(Duration::from_millis(4_999));
        assert!(node.ready().ready, "still inside the timeout");
        clock.advance(Duration::from_millis(1));
        let r = node.ready();
        assert!(!r.ready && r.registered, "lapsed at the timeout: {r:?}");
        heartbeat_pass(node.clone()).await;
        assert!(
            node.ready().ready,
            "an accepted heartbeat restores readiness"
        );
        let view = node.meta().view();
        assert_eq!(view.nodes[&1].last_heartbeat_ms, 1_005_000);
    }

    /// A heartbeat rejected because a newer process registered the same id leaves this one
    /// unregistered and not ready for good, whatever its clock says.
    #[tokio::test]
    async fn a_replaced_process_learns_it_from_its_heartbeat() {
        let clock = ManualClock::new(1_000_000);
        let node = node_with(
            config(&clock),
            Arc::new(MemoryStorage::new()),
            EngineConfig::default(),
        )
        .await;
        node.meta()
            .propose(Command::RegisterNode {
                node_id: 1,
                node_epoch: 4,
                address: "http://elsewhere".into(),
                now_ms: clock.now_ms(),
            })
            .await
            .unwrap()
            .unwrap();
        heartbeat_pass(node.clone()).await;
        let r = node.ready();
        assert!(!r.ready && !r.registered, "{r:?}");
        heartbeat_pass(node.clone()).await;
        assert!(!node.ready().ready, "stays fenced");
    }

    fn register(s: &mut State, id: u32, epoch: u64, at: i64) {
        s.apply(&Command::RegisterNode {
            node_id: id,
            node_epoch: epoch,
            address: format!("http://n{id}"),
            now_ms: at,
        })
        .unwrap();
    }

    fn beat(s: &mut State, id: u32, epoch: u64, at: i64) {
        s.apply(&Command::Heartbeat {
            node_id: id,
            node_epoch: epoch,
            now_ms: at,
        })
        .unwrap();
    }

    /// Lapse is measured on the observer's clock from the last change it saw, so a node whose
    /// clock is far off still counts as live while its heartbeats move; a first look gives
    /// every node a full timeout; a restart (new epoch) counts as a change.
    #[test]
    fn nodes_lapse_when_their_heartbeat_stops_changing_on_the_observers_clock() {
        let t = Duration::from_secs(5);
        let mut s = State::new();
        register(&mut s, 1, 10, 0);
        // Node 2's clock is a day behind: irrelevant.
        register(&mut s, 2, 20, -86_400_000);
        let mut l = Liveness::default();
        assert!(l.lapsed(&s, 1_000, t).is_empty(), "first look");
        beat(&mut s, 1, 10, 1);
        beat(&mut s, 2, 20, -86_399_000);
        assert!(l.lapsed(&s, 5_999, t).is_empty());
        // Node 1 beats again at 6 s, node 2 stops after its beat seen at 5.999 s.
        beat(&mut s, 1, 10, 2);
        assert!(l.lapsed(&s, 6_000, t).is_empty());
        assert!(l.lapsed(&s, 10_998, t).is_empty());
        assert_eq!(l.lapsed(&s, 10_999, t), vec![(2, 20)]);
        assert_eq!(l.lapsed(&s, 11_000, t), vec![(1, 10), (2, 20)]);
        // Node 2 restarts: a new epoch is a sign of life even before its first heartbeat.
        register(&mut s, 2, 21, -86_390_000);
        assert_eq!(l.lapsed(&s, 12_000, t), vec![(1, 10)]);
        assert_eq!(l.lapsed(&s, 17_000, t), vec![(1, 10), (2, 21)]);
    }
}
