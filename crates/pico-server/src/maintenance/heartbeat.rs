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
use pico_common::failure_log::FailureLog;
use pico_metadata::{ApplyError, Command, State};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;

/// This node's own heartbeat state, read by `Node::ready`.
#[derive(Debug)]
pub(crate) struct OwnHeartbeat {
    /// Clock time at the start of the latest accepted heartbeat (or registration).
    last_ok_ms: AtomicI64,
    /// A heartbeat was rejected: a newer process of this node exists, or it was fenced.
    fenced: AtomicBool,
    /// Heartbeats that failed since the last accepted one, for the log: one a second while
    /// the metadata store is down would be a warning a second.
    failures: FailureLog,
}

/// While heartbeats keep failing, a warning at most this often (on the injected clock).
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(30);

impl OwnHeartbeat {
    pub(crate) fn new(registered_at_ms: i64) -> OwnHeartbeat {
        OwnHeartbeat {
            last_ok_ms: AtomicI64::new(registered_at_ms),
            fenced: AtomicBool::new(false),
            failures: FailureLog::new(FAILURE_LOG_EVERY),
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

    /// Whether this process may acknowledge a write whose WAL append completed by `now_ms`
    /// (or serve records that exist only in its WAL): a heartbeat that started less than
    /// [`ack_window`] ago was accepted. Failover fences a node only after its heartbeat stayed
    /// unchanged for the whole `liveness_timeout` on the fencer's clock, counted from when the
    /// fencer saw that heartbeat, which is after it started; so every write acknowledged under
    /// this rule was durable in the WAL before the fence, and the fencer's WAL read finds it.
    /// A node cut off from the database, or paused, stops acknowledging within the window.
    pub(crate) fn ack_fresh(&self, now_ms: i64, timeout: Duration) -> bool {
        let last = self.last_ok_ms.load(Ordering::Relaxed);
        !self.fenced() && now_ms.saturating_sub(last) < millis(ack_window(timeout))
    }

    fn ok(&self, at_ms: i64) {
        self.last_ok_ms.fetch_max(at_ms, Ordering::Relaxed);
    }
}

/// How long after the start of its last accepted heartbeat a node still acknowledges writes:
/// four fifths of the liveness timeout (the rest is margin for clock rates and the fencer's
/// scheduling; a healthy node heartbeats every second).
pub(crate) fn ack_window(liveness_timeout: Duration) -> Duration {
    liveness_timeout * 4 / 5
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
        Ok(Ok(_)) => {
            node.inner.heartbeat.ok(now);
            if let Some(failures) = node.inner.heartbeat.failures.answered() {
                tracing::info!(failures, "heartbeat recorded again");
            }
        }
        Ok(Err(e @ (ApplyError::StaleNodeEpoch { .. } | ApplyError::UnknownNode { .. }))) => {
            // The rejection was applied in log order, so the view holds why.
            let by_failover = node
                .inner
                .meta
                .view()
                .nodes
                .get(&cfg.node_id)
                .is_some_and(|n| n.fenced_epoch == Some(cfg.node_epoch));
            if !node.inner.heartbeat.fenced.swap(true, Ordering::Relaxed) {
                if by_failover {
                    tracing::error!(
                        error = %e,
                        "this node process was fenced by failover (its heartbeat lapsed): it \
                         acknowledges and commits nothing more; its streams were taken over"
                    );
                } else {
                    tracing::error!(
                        error = %e,
                        "this node process was fenced (a newer one registered): it can commit \
                         nothing more"
                    );
                }
            }
            node.inner.registered.store(false, Ordering::Relaxed);
            if by_failover {
                node.inner.fenced_by_failover.send_replace(true);
            }
        }
        Ok(Err(e)) => {
            if let Some(failures) = node.inner.heartbeat.failures.failed(now) {
                tracing::warn!(error = %e, failures, "heartbeat rejected (while this lasts, logged every {} s)", node.inner.heartbeat.failures.every_secs());
            }
        }
        Err(e) => {
            if let Some(failures) = node.inner.heartbeat.failures.failed(now) {
                tracing::warn!(
                    error = %e,
                    failures,
                    "heartbeat not recorded: metadata log unavailable (while this lasts, logged \
                     every {} s)",
                    node.inner.heartbeat.failures.every_secs()
                );
            }
        }
    }
}

/// Every node's watch over the others' heartbeats, on its own clock: routing answers 503 for
/// a stream whose owner lapsed rather than redirect to it, and the lease holder's failover
/// fences the lapsed ones.
pub(crate) async fn liveness_pass(node: Node) {
    let cfg = &node.inner.config;
    let view = node.inner.meta.view();
    let now = cfg.clock.now_ms();
    let mut w = node
        .inner
        .liveness
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    // A gap in this loop (the process was paused, or starved) means nothing was observed
    // meanwhile: start every node's count afresh rather than read the gap as their silence.
    if w.last_pass_ms
        .is_some_and(|t| now.saturating_sub(t) > millis(cfg.liveness_timeout) / 2)
    {
        tracing::info!("liveness observation resumed after a gap: every node gets a full timeout");
        w.liveness = Liveness::default();
    }
    w.last_pass_ms = Some(now);
    let lapsed = w.liveness.lapsed(&view, now, cfg.liveness_timeout);
    w.lapsed = lapsed
        .into_iter()
        .filter(|l| l.node_id != cfg.node_id)
        .collect();
}

/// [`liveness_pass`]'s memory: what it saw, and which node incarnations lapsed.
#[derive(Debug, Default)]
pub(crate) struct LivenessWatch {
    liveness: Liveness,
    last_pass_ms: Option<i64>,
    /// Other nodes whose heartbeat lapsed as seen here, not fenced yet.
    pub(crate) lapsed: Vec<Lapse>,
}

impl LivenessWatch {
    /// Whether node `node_id` at `node_epoch` lapsed as seen here.
    pub(crate) fn is_lapsed(&self, node_id: u32, node_epoch: u64) -> bool {
        self.lapsed
            .iter()
            .any(|l| l.node_id == node_id && l.node_epoch == node_epoch)
    }
}

/// A node incarnation whose heartbeat stopped, and the heartbeat value it stopped at (failover
/// fences it only if that is still the value: a compare-and-set in `FenceNode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Lapse {
    pub(crate) node_id: u32,
    pub(crate) node_epoch: u64,
    pub(crate) last_heartbeat_ms: i64,
}

/// What an observer has seen of each node's heartbeats, to tell which lapsed.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    /// node id → (epoch, heartbeat value, observer's clock when that pair was first seen).
    seen: BTreeMap<u32, (u64, i64, i64)>,
}

impl Liveness {
    /// Updates from the view at the observer's `now_ms`; returns the nodes whose heartbeat has
    /// not changed for `timeout` as seen here, in id order. Fenced nodes are left out: no
    /// process holds their registered epoch, and failover already has them.
    pub(crate) fn lapsed(&mut self, view: &State, now_ms: i64, timeout: Duration) -> Vec<Lapse> {
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
            if n.fenced_epoch.is_none() && now_ms.saturating_sub(entry.2) >= millis(timeout) {
                out.push(Lapse {
                    node_id: *id,
                    node_epoch: n.epoch,
                    last_heartbeat_ms: n.last_heartbeat_ms,
                });
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
    use std::sync::Arc;

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
        let mut l_ids = |s: &State, now: i64| -> Vec<(u32, u64)> {
            l.lapsed(s, now, t)
                .into_iter()
                .map(|x| (x.node_id, x.node_epoch))
                .collect()
        };
        assert!(l_ids(&s, 1_000).is_empty(), "first look");
        beat(&mut s, 1, 10, 1);
        beat(&mut s, 2, 20, -86_399_000);
        assert!(l_ids(&s, 5_999).is_empty());
        // Node 1 beats again at 6 s, node 2 stops after its beat seen at 5.999 s.
        beat(&mut s, 1, 10, 2);
        assert!(l_ids(&s, 6_000).is_empty());
        assert!(l_ids(&s, 10_998).is_empty());
        assert_eq!(l_ids(&s, 10_999), vec![(2, 20)]);
        assert_eq!(l_ids(&s, 11_000), vec![(1, 10), (2, 20)]);
        // Node 2 restarts: a new epoch is a sign of life even before its first heartbeat.
        register(&mut s, 2, 21, -86_390_000);
        assert_eq!(l_ids(&s, 12_000), vec![(1, 10)]);
        assert_eq!(l_ids(&s, 17_000), vec![(1, 10), (2, 21)]);
    }
}
