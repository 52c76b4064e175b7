//! Failover, run by the maintenance-lease holder (docs/design/failover.md): a node whose
//! heartbeat lapsed is fenced, the fenced incarnation's WAL is committed into objects on its
//! behalf, and only then are its streams released, so the next request anywhere opens each at
//! epoch + 1 with every acknowledged record in place.
//!
//! Each step is a command in the log, and each pass redoes whatever is left, so a holder that
//! dies half-way leaves the work to the next one:
//! 1. lapse: [`heartbeat::Liveness`](super::heartbeat::Liveness) on this node's clock;
//! 2. fence: `FenceNode`, a compare-and-set on the heartbeat value seen lapsing;
//! 3. recover: the fenced node's WAL, opened through [`PeerWals`] at the fence's epoch (a
//!    Postgres WAL refuses the zombie's appends from then on), replayed by the engine's own
//!    recovery with this node committing (the commit rule accepts it for a fenced owner);
//! 4. release: `ReleaseFenced`, after every commit of step 3 answered.
//!
//! With a WAL on local disk no other node can read it: failover is off, and a dead node's
//! streams wait for it to restart (logged once per lapse).

use super::heartbeat::Lapse;
use crate::catalog::MetaCatalog;
use crate::config::PeerWals;
use crate::node::Node;
use pico_metadata::{ApplyError, Command, Outcome, Owner};
use s3stream::{Engine, EngineConfig};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

/// The holder's memory between passes.
#[derive(Debug, Default)]
pub(crate) struct Failover {
    /// Lapses already logged (so a dead node is reported once, not every second).
    reported: Mutex<BTreeSet<(u32, u64)>>,
    /// Fenced incarnations whose streams were released: nothing can be owned by them again
    /// (a fenced process opens nothing), so later passes skip the scan.
    done: Mutex<BTreeSet<(u32, u64)>>,
}

/// One failover pass: fence what lapsed, then recover and release every fenced incarnation
/// that still owns streams.
pub(crate) async fn failover_pass(node: Node, state: Arc<Failover>) {
    let cfg = &node.inner.config;
    // Only on a view known to be recent: an accepted heartbeat says this node applied the log
    // up to it. (The fence's compare-and-set guards a stale view anyway.)
    if !node
        .inner
        .heartbeat
        .fresh(cfg.clock.now_ms(), cfg.liveness_timeout)
    {
        return;
    }
    let lapsed: Vec<Lapse> = node
        .inner
        .liveness
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .lapsed
        .clone();
    report_lapses(&node, &state, &lapsed);
    let Some(wals) = cfg.peer_wals.clone() else {
        return;
    };
    for lapse in lapsed {
        fence(node.clone(), lapse).await;
    }
    for (node_id, fenced_epoch, placeholder) in pending(&node, &state) {
        // Its commits are fenced by this node's epoch, but the WAL trim after them is not.
        if !super::confirm(&node).await {
            return;
        }
        match recover(
            node.clone(),
            wals.clone(),
            node_id,
            fenced_epoch,
            placeholder,
        )
        .await
        {
            Ok(()) => release(node.clone(), state.clone(), node_id, fenced_epoch).await,
            Err(e) => tracing::warn!(
                node_id,
                node_epoch = fenced_epoch,
                error = %e,
                "failover: recovering the fenced node's WAL failed; its streams stay closed, retrying"
            ),
        }
    }
}

fn report_lapses(node: &Node, state: &Failover, lapsed: &[Lapse]) {
    let cfg = &node.inner.config;
    let now: BTreeSet<(u32, u64)> = lapsed.iter().map(|l| (l.node_id, l.node_epoch)).collect();
    let mut reported = state.reported.lock().unwrap_or_else(|p| p.into_inner());
    let view = node.inner.meta.view();
    for (id, epoch) in now.difference(&reported) {
        let owned = view
            .streams
            .values()
            .filter(|m| {
                m.owner
                    == Some(Owner {
                        node_id: *id,
                        node_epoch: *epoch,
                    })
            })
            .count();
        if cfg.peer_wals.is_some() {
            tracing::warn!(
                node_id = id,
                node_epoch = epoch,
                owned_streams = owned,
                "node heartbeat lapsed: failing over (fence, recover its WAL, release its streams)"
            );
        } else {
            tracing::warn!(
                node_id = id,
                node_epoch = epoch,
                owned_streams = owned,
                "node heartbeat lapsed: its streams wait for it to restart (the WAL is on each \
                 node's local disk, which no other node reads: no automatic failover)"
            );
        }
    }
    *reported = now;
}

/// Step 2: fences `lapse` unless its heartbeat moved (or it restarted) meanwhile.
async fn fence(node: Node, lapse: Lapse) {
    let cfg = &node.inner.config;
    let cmd = Command::FenceNode {
        node_id: lapse.node_id,
        node_epoch: lapse.node_epoch,
        last_heartbeat_ms: lapse.last_heartbeat_ms,
        by_node_id: cfg.node_id,
        by_node_epoch: cfg.node_epoch,
    };
    match node.inner.meta.propose(cmd).await {
        Ok(Ok(_)) => tracing::warn!(
            node_id = lapse.node_id,
            node_epoch = lapse.node_epoch,
            "failover: node fenced; it can acknowledge and commit nothing more"
        ),
        Ok(Err(e)) => tracing::info!(
            node_id = lapse.node_id,
            error = %e,
            "failover: fence not applied (the node moved on, or another holder fenced it)"
        ),
        Err(e) => tracing::warn!(error = %e, "failover: fence not proposed (metadata log)"),
    }
}

/// Fenced incarnations that still own streams: (node id, fenced epoch, registered epoch).
fn pending(node: &Node, state: &Failover) -> Vec<(u32, u64, u64)> {
    let view = node.inner.meta.view();
    let mut done = state.done.lock().unwrap_or_else(|p| p.into_inner());
    let fenced: Vec<(u32, u64, u64)> = view
        .nodes
        .values()
        .filter_map(|n| Some((n.node_id, n.fenced_epoch?, n.epoch)))
        .collect();
    // Forget incarnations no longer fenced (the node registered again).
    done.retain(|(id, e)| fenced.iter().any(|f| (f.0, f.1) == (*id, *e)));
    let fenced: Vec<(u32, u64, u64)> = fenced
        .into_iter()
        .filter(|(id, e, _)| !done.contains(&(*id, *e)))
        .collect();
    if fenced.is_empty() {
        return fenced;
    }
    let mut owning = BTreeSet::new();
    for m in view.streams.values() {
        if let Some(o) = m.owner
            && fenced
                .iter()
                .any(|f| (f.0, f.1) == (o.node_id, o.node_epoch))
        {
            owning.insert((o.node_id, o.node_epoch));
        }
    }
    fenced
        .into_iter()
        .filter(|(id, e, _)| {
            let owns = owning.contains(&(*id, *e));
            if !owns {
                done.insert((*id, *e));
            }
            owns
        })
        .collect()
}

/// Step 3: commits every acknowledged record of the fenced incarnation's WAL, with this node
/// as the committer, into objects under a prefix of this process's own (the orphan sweep
/// leaves a live incarnation's objects alone, and no other writer uses it).
async fn recover(
    node: Node,
    wals: Arc<dyn PeerWals>,
    node_id: u32,
    fenced_epoch: u64,
    placeholder: u64,
) -> Result<(), String> {
    let cfg = &node.inner.config;
    let started = std::time::Instant::now();
    let wal = wals.open(node_id, placeholder).await?;
    let catalog = Arc::new(MetaCatalog {
        meta: node.inner.meta.clone(),
        node_id: cfg.node_id,
        node_epoch: cfg.node_epoch,
        clock: cfg.clock.clone(),
    });
    let engine = EngineConfig {
        node_id: cfg.node_id,
        node_epoch: cfg.node_epoch,
        ..EngineConfig::default()
    };
    let prefix = format!(
        "data/{}/{}/failover-{node_id}-{fenced_epoch}",
        cfg.node_id, cfg.node_epoch
    );
    // A task of its own: the engine's recovery future is `Send` (the engine's own tasks run
    // the same upload path) but not provably so when nested in this pass's future.
    let report = tokio::spawn(Engine::recover_wal(
        engine,
        prefix,
        node.inner.data.clone(),
        wal,
        catalog,
    ))
    .await
    .map_err(|e| format!("recovery task failed: {e}"))?
    .map_err(|e| e.to_string())?;
    tracing::info!(
        node_id,
        node_epoch = fenced_epoch,
        wal_entries = report.wal_entries,
        records = report.records_replayed,
        skipped = report.skipped,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "failover: fenced node's WAL committed"
    );
    Ok(())
}

/// Step 4: releases the fenced incarnation's streams.
async fn release(node: Node, state: Arc<Failover>, node_id: u32, fenced_epoch: u64) {
    let cfg = &node.inner.config;
    let cmd = Command::ReleaseFenced {
        node_id,
        node_epoch: fenced_epoch,
        by_node_id: cfg.node_id,
        by_node_epoch: cfg.node_epoch,
    };
    match node.inner.meta.propose(cmd).await {
        Ok(Ok(Outcome::ReleasedFenced { streams })) => {
            state
                .done
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert((node_id, fenced_epoch));
            tracing::warn!(
                node_id,
                node_epoch = fenced_epoch,
                streams,
                "failover: fenced node's streams released; they reopen on the next request"
            );
        }
        Ok(Ok(other)) => tracing::error!(?other, "failover: unexpected release outcome"),
        // The node registered again meanwhile: its new process recovers its own WAL.
        Ok(Err(e @ ApplyError::Invalid(_))) => {
            tracing::info!(node_id, error = %e, "failover: release not needed any more")
        }
        Ok(Err(e)) => tracing::warn!(node_id, error = %e, "failover: release rejected"),
        Err(e) => tracing::warn!(error = %e, "failover: release not proposed (metadata log)"),
    }
}

#[cfg(test)]
mod tests {
    use super::super::heartbeat::{heartbeat_pass, liveness_pass};
    use super::super::lease::{lease_pass, release_lease};
    use super::*;
    use crate::maintenance::test_support::*;
    use crate::node::Route;
    use pico_common::clock::ManualClock;
    use s3stream::{Wal, WalError, WalRecord};

    /// The shared WAL store, with a log of what the view said when failover touched it.
    struct Wals {
        storage: Arc<MemoryStorage>,
        meta: std::sync::OnceLock<MetaLog>,
        events: Arc<Mutex<Vec<String>>>,
    }

    impl Wals {
        /// `fenced` and `owned` of node 1's incarnation 11, as the view has them now.
        fn state(&self) -> String {
            let view = self.meta.get().unwrap().view();
            let fenced = view.nodes[&1].fenced_epoch == Some(11);
            let owned = view.streams.values().any(|m| {
                m.owner
                    == Some(pico_metadata::Owner {
                        node_id: 1,
                        node_epoch: 11,
                    })
            });
            format!("fenced={fenced} owned={owned}")
        }
    }

    impl std::fmt::Debug for Wals {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Wals")
        }
    }

    #[async_trait::async_trait]
    impl PeerWals for Wals {
        async fn open(&self, node_id: u32, fence_epoch: u64) -> Result<Arc<dyn Wal>, String> {
            self.events
                .lock()
                .unwrap()
                .push(format!("open {node_id}@{fence_epoch} {}", self.state()));
            Ok(Arc::new(Watched {
                inner: ObjectWal::new(self.storage.clone(), format!("wal/{node_id}")),
                wals: Arc::new(Wals {
                    storage: self.storage.clone(),
                    meta: self.meta.clone(),
                    events: self.events.clone(),
                }),
            }))
        }
    }

    /// A WAL that logs the view's state when it is read.
    struct Watched {
        inner: ObjectWal,
        wals: Arc<Wals>,
    }

    #[async_trait::async_trait]
    impl Wal for Watched {
        async fn append(&self, records: Vec<WalRecord>) -> Result<u64, WalError> {
            self.inner.append(records).await
        }
        async fn recover(&self) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError> {
            let got = self.inner.recover().await?;
            let n: usize = got.iter().map(|(_, r)| r.len()).sum();
            let state = self.wals.state();
            self.wals
                .events
                .lock()
                .unwrap()
                .push(format!("read {n} {state}"));
            Ok(got)
        }
        async fn trim(&self, upto: u64) -> Result<(), WalError> {
            self.inner.trim(upto).await
        }
    }

    /// Nodes 1 (epoch 11) and 2 (epoch 12) on one metadata log, bucket and WAL store, loops
    /// stopped, uploads only on demand (acknowledged appends stay in the WAL).
    /// Also the shared WAL store, and stream `s` created through node 1.
    async fn cluster(clock: &Arc<ManualClock>) -> (Node, Node, Arc<Wals>) {
        let wals = Arc::new(Wals {
            storage: Arc::new(MemoryStorage::new()),
            meta: std::sync::OnceLock::new(),
            events: Arc::default(),
        });
        let (a, b) = two_nodes_with(clock, |id| Parts {
            wal: Some(Arc::new(ObjectWal::new(
                wals.storage.clone(),
                format!("wal/{id}"),
            ))),
            engine: uploads_on_demand(),
            peer_wals: Some(wals.clone()),
        })
        .await;
        assert!(wals.meta.set(a.meta().clone()).is_ok());
        a.create(CreateRequest {
            name: name("s"),
            config: CreateConfig::default(),
            initial: vec![],
        })
        .await
        .unwrap();
        (a, b, wals)
    }

    async fn append(node: &Node, n: &str, value: &str) -> Result<(), crate::AppendError> {
        node.append(AppendRequest {
            name: name(n),
            records: vec![Record::from_value(value.to_string())],
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        })
        .await
        .map(|_| ())
    }

    async fn values(node: &Node, n: &str) -> Vec<(u64, String)> {
        let values = crate::testing::read_values(node, n).await;
        values
            .into_iter()
            .map(|(offset, v)| (offset, String::from_utf8(v.to_vec()).unwrap()))
            .collect()
    }

    /// One second of the survivor's loops: heartbeat, lease, liveness, failover.
    async fn tick(clock: &ManualClock, b: &Node, state: &Arc<Failover>) {
        clock.advance(Duration::from_secs(1));
        heartbeat_pass(b.clone()).await;
        lease_pass(b.clone()).await;
        liveness_pass(b.clone()).await;
        crate::maintenance::gated(b.clone(), {
            let state = state.clone();
            move |n| failover_pass(n, state)
        })
        .await;
    }

    /// Node 1 owns a stream with acknowledged appends only in its WAL and stops. It stops
    /// acknowledging within its window, before it could lapse; the holder (node 2) sees it
    /// lapse after a full timeout on its own clock, then fences it, reads its WAL while the
    /// stream is still owned by it, commits the records, and only then releases the stream,
    /// which node 2 reopens at the next epoch with every acknowledged record once. Node 1,
    /// coming back, learns it was fenced, and can neither acknowledge nor show anything new.
    #[tokio::test]
    async fn lapse_then_fence_then_recover_then_release() {
        let clock = ManualClock::new(1_000_000);
        let (a, b, wals) = cluster(&clock).await;
        release_lease(&a).await;
        lease_pass(b.clone()).await;
        assert!(b.holds_maintenance_lease());
        for v in ["r0", "r1", "r2"] {
            append(&a, "s", v).await.unwrap();
        }
        let id = a.meta().view().stream_by_name("s").unwrap().1.id;
        assert_eq!(
            a.meta().view().streams[&id].end_offset,
            0,
            "only in the WAL"
        );
        assert_eq!(
            b.route(&name("s")),
            Route::Redirect("http://127.0.0.1:4001".into())
        );

        let state = Arc::new(Failover::default());
        liveness_pass(b.clone()).await; // B's first look at A: the timeout starts here.
        for second in 1..=4 {
            tick(&clock, &b, &state).await;
            let view = b.meta().view();
            assert_eq!(
                view.nodes[&1].fenced_epoch, None,
                "fenced early, at {second} s"
            );
            assert!(view.streams[&id].owner.is_some());
            if second == 4 {
                // A's last accepted heartbeat (its registration) is 4 s old: past its window.
                let e = append(&a, "s", "late").await.unwrap_err();
                assert!(
                    matches!(e, crate::AppendError::Unavailable(_)),
                    "acknowledged outside the window: {e:?}"
                );
            }
        }
        assert!(
            wals.events.lock().unwrap().is_empty(),
            "no failover before the lapse"
        );
        // A lapsed as seen by B: clients get a 503, not a redirect to a dead node.
        tick(&clock, &b, &state).await;
        let view = b.meta().view();
        assert_eq!(view.nodes[&1].fenced_epoch, Some(11));
        assert_eq!(view.nodes[&1].epoch, 12);
        assert_eq!(view.streams[&id].owner, None, "released");
        assert_eq!(
            view.streams[&id].end_offset, 4,
            "recovered: r0 r1 r2 and the late one"
        );
        assert_eq!(
            *wals.events.lock().unwrap(),
            vec![
                "open 1@12 fenced=true owned=true".to_string(),
                "read 4 fenced=true owned=true".to_string(),
            ],
            "the WAL is read after the fence and before the release"
        );
        assert_eq!(b.route(&name("s")), Route::Local);

        // Writable through B at the next epoch; every record there once, at its offset.
        append(&b, "s", "b0").await.unwrap();
        assert_eq!(b.meta().view().streams[&id].epoch, 1);
        assert_eq!(
            values(&b, "s").await,
            vec![
                (0, "r0".to_string()),
                (1, "r1".to_string()),
                (2, "r2".to_string()),
                (3, "late".to_string()),
                (4, "b0".to_string()),
            ]
        );

        // The zombie resumes: its heartbeat is refused, it knows it was fenced by failover.
        heartbeat_pass(a.clone()).await;
        assert!(*a.inner.fenced_by_failover.borrow());
        assert!(!a.ready().ready);
        assert!(append(&a, "s", "zombie").await.is_err());
        a.inner.engine.flush().await.ok();
        b.inner.engine.flush().await.unwrap();
        let view = b.meta().view();
        assert_eq!(
            view.streams[&id].end_offset, 5,
            "nothing of the zombie's committed"
        );
        assert_eq!(values(&b, "s").await.len(), 5);
        // Nothing more to do: later passes leave the released streams alone.
        tick(&clock, &b, &state).await;
        assert_eq!(wals.events.lock().unwrap().len(), 2);
    }

    /// A process started with the id of one that still runs (paused or cut off, not dead) and
    /// owns streams reads the shared object WAL only once the running one's acknowledgement
    /// window is over, even when another registration came in between: an append the running
    /// one acknowledges meanwhile is recovered, not missed (and later trimmed).
    #[tokio::test]
    async fn a_replacement_reads_the_wal_only_after_the_running_process_window() {
        let clock = ManualClock::new(1_000_000);
        let (a, _b, wals) = cluster(&clock).await;
        append(&a, "s", "r0").await.unwrap();
        // A process that registered in between and never finished its own wait (killed while
        // waiting, or its start retried after a lost answer): A's streams are still owned at
        // A's epoch, so the next one waits just the same.
        a.meta()
            .propose(Command::RegisterNode {
                node_id: 1,
                node_epoch: 12,
                address: "http://127.0.0.1:4001".into(),
                now_ms: 1_000_000,
            })
            .await
            .unwrap()
            .unwrap();

        let idle_sleepers = clock.sleepers();
        let replacement = tokio::spawn({
            let (meta, data) = (a.meta().clone(), a.inner.data.clone());
            let (clock, wals) = (clock.clone(), wals.clone());
            async move {
                let parts = Parts {
                    wal: Some(Arc::new(ObjectWal::new(
                        wals.storage.clone(),
                        "wal/1".to_string(),
                    ))),
                    engine: uploads_on_demand(),
                    peer_wals: Some(wals),
                };
                process_with(
                    &meta,
                    &data,
                    &clock,
                    (1, 13, "http://127.0.0.1:4001"),
                    parts,
                )
                .await
            }
        });
        // Registered (A's heartbeats are refused from here on), and waiting, or started.
        let mut waiting = false;
        for _ in 0..100_000 {
            let registered = a.meta().view().nodes[&1].epoch == 13;
            waiting = registered && clock.sleepers() > idle_sleepers;
            if waiting || replacement.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        // A has not heard of it yet: its last accepted heartbeat is recent, so it acknowledges.
        append(&a, "s", "r1").await.unwrap();

        if waiting {
            clock.advance(Duration::from_secs(5) - Duration::from_millis(1));
            for _ in 0..1_000 {
                tokio::task::yield_now().await;
            }
            assert!(!replacement.is_finished(), "read the WAL inside A's window");
            clock.advance(Duration::from_millis(1));
        }
        let a2 = replacement.await.unwrap();
        assert_eq!(
            values(&a2, "s").await,
            vec![(0, "r0".to_string()), (1, "r1".to_string())],
            "every append A acknowledged, once"
        );
        assert!(waiting, "the replacement did not wait, yet lost nothing?");
        assert!(
            a2.ready().ready,
            "its heartbeat after the wait was recorded"
        );
        // A learns it was replaced and acknowledges nothing more.
        heartbeat_pass(a.clone()).await;
        assert!(append(&a, "s", "zombie").await.is_err());
    }
}
