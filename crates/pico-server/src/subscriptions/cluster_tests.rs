//! Subscriptions in a cluster: two nodes on one metadata log, each with its own manager, a
//! manual clock for leases and retries, and the maintenance lease moved by hand (the nodes'
//! own loops are stopped). Only the lease holder delivers; the next holder resumes what the
//! previous one left.

use std::sync::Arc;
use std::time::Duration;

use pico_common::StreamName;
use pico_common::clock::ManualClock;
use pico_protocol::Record as DataRecord;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use super::*;
use crate::maintenance::{lease_pass, release_lease};
use crate::subscriptions::test_support::{Scripted, create_stream, eventually};
use crate::testing::read_json;

const ROOT: &str = "http://127.0.0.1:4001/v1/stream/__ds";

/// Two nodes (ids 1 and 2, advertised at ports 4001 and 4002) sharing a metadata log and a
/// bucket, their loops stopped. Node 1 started first and holds the lease.
async fn two_nodes(clock: &Arc<ManualClock>) -> (Node, Node) {
    let (a, b) = crate::maintenance::test_support::two_nodes(clock).await;
    assert!(a.holds_maintenance_lease() && !b.holds_maintenance_lease());
    (a, b)
}

/// A manager on `node` with its timer and event follower running, and what it sends.
fn manager(
    node: &Node,
    clock: &Arc<ManualClock>,
    answer: Delivered,
) -> (Arc<Manager>, UnboundedReceiver<Value>) {
    let (receiver, sent) = Scripted::new(vec![answer]);
    let mgr = Arc::new(Manager::with(node.clone(), clock.clone(), receiver));
    mgr.ensure_background();
    (mgr, sent)
}

fn webhook(pattern: &str) -> Config {
    Config::parse(
        &json!({"type": "webhook", "pattern": pattern, "lease_ttl_ms": 60_000,
            "webhook": {"url": "http://127.0.0.1:9/hook"}}),
        true,
    )
    .unwrap()
}

/// The clock with the sleepers that are not manager timers (the nodes' own), counted before
/// any manager started: a timer is asleep between passes when the count is this plus one per
/// running manager.
struct Timers {
    clock: Arc<ManualClock>,
    others: usize,
}

impl Timers {
    fn new(clock: &Arc<ManualClock>) -> Timers {
        Timers {
            clock: clock.clone(),
            others: clock.sleepers(),
        }
    }

    /// Waits until `n` manager timers sleep on the clock.
    async fn asleep(&self, n: usize) {
        eventually("the timers sleep on the clock", || {
            self.clock.sleepers() == self.others + n
        })
        .await;
    }

    /// `n` timer passes of every manager in `mgrs`, a tick apart.
    async fn passes(&self, mgrs: &[&Arc<Manager>], n: usize) {
        for _ in 0..n {
            self.asleep(mgrs.len()).await;
            let before: Vec<u64> = mgrs
                .iter()
                .map(|m| m.ticks.load(Ordering::Relaxed))
                .collect();
            self.clock.advance(TICK);
            eventually("a timer pass of each manager", || {
                mgrs.iter()
                    .zip(&before)
                    .all(|(m, b)| m.ticks.load(Ordering::Relaxed) > *b)
            })
            .await;
            self.asleep(mgrs.len()).await;
        }
    }

    /// Timer passes until `rx` gets a webhook (at most 30: three seconds of the clock).
    async fn next_sent(&self, mgrs: &[&Arc<Manager>], rx: &mut UnboundedReceiver<Value>) -> Value {
        for _ in 0..30 {
            self.passes(mgrs, 1).await;
            // The pass may have started a delivery on another task.
            for _ in 0..20 {
                if let Ok(body) = rx.try_recv() {
                    return body;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        panic!("nothing delivered within 30 timer passes");
    }
}

/// Waits until subscription `id`, as stored in the log, satisfies `ok`.
async fn stored_until(mgr: &Manager, id: &str, what: &str, ok: impl Fn(&Sub) -> bool) {
    eventually(what, || mgr.store.load_one(id).is_some_and(|s| ok(&s))).await;
}

/// Two nodes whose holder (A) failed its first webhook: subscription `id` on `pattern`,
/// woken by creating `stream` on A, with the failure and its retry time stored.
struct FailedOnA {
    clock: Arc<ManualClock>,
    a: Node,
    b: Node,
    timers: Timers,
    mgr_a: Arc<Manager>,
    sent_a: UnboundedReceiver<Value>,
    /// The webhook A sent.
    first: Value,
}

async fn failed_on_a(id: &str, pattern: &str, stream: &str) -> FailedOnA {
    let clock = ManualClock::new(1_000_000);
    let (a, b) = two_nodes(&clock).await;
    let timers = Timers::new(&clock);
    let (mgr_a, mut sent_a) = manager(&a, &clock, Delivered::Failed("down".into()));
    assert!(mgr_a.upsert(id, webhook(pattern), ROOT).await.is_ok());
    create_stream(&a, stream).await;
    let first = sent_a.recv().await.unwrap();
    assert_eq!(first["generation"], 1);
    // The failure and its retry time are stored, where any node reads them.
    stored_until(&mgr_a, id, "the failed attempt is stored", |s| {
        s.rec.status == crate::subscriptions::model::Status::Failed
            && s.rec.retry_count == 1
            && s.rec.next_attempt_at_ms.is_some()
    })
    .await;
    FailedOnA {
        clock,
        a,
        b,
        timers,
        mgr_a,
        sent_a,
        first,
    }
}

/// Only the holder delivers; a change on the other node is refused with the holder's URL; the
/// holder's death moves delivery to the other node, which resumes the wake its predecessor
/// left pending (the same wake id: at least once across a handover) and delivers new work.
#[tokio::test]
async fn only_the_holder_delivers_and_the_next_holder_resumes_its_pending_wake() {
    let FailedOnA {
        clock,
        a,
        b,
        timers,
        mgr_a,
        mut sent_a,
        first,
    } = failed_on_a("s", "c/*", "c/1").await;
    // B's manager starts with the subscription and its due retry in the log.
    let (mgr_b, mut sent_b) = manager(&b, &clock, Delivered::Accepted { done: true });
    let refused = mgr_b.upsert("t", webhook("c/*"), ROOT).await;
    assert_eq!(
        refused.err(),
        Some(SubError::NotHere {
            holder: Some("http://127.0.0.1:4001".into())
        }),
        "a change on the non-holder names the holder"
    );
    let stored = mgr_b.get("s", ROOT).await.unwrap();
    assert_eq!(stored["generation"], 1, "reads are served on any node");
    // Past the retry's backoff (1 s ± 20 %): A sends it again, B never does.
    let retry = timers.next_sent(&[&mgr_a, &mgr_b], &mut sent_a).await;
    assert_eq!(retry["wake_id"], first["wake_id"]);
    timers.passes(&[&mgr_a, &mgr_b], 5).await;
    assert!(sent_b.try_recv().is_err(), "the non-holder delivered");
    stored_until(&mgr_a, "s", "the second failure is stored", |s| {
        s.rec.retry_count == 2
    })
    .await;

    // A dies: its manager goes, its lease is not renewed. B takes the lease once it expires.
    drop(mgr_a);
    // Both timers asleep (A's ends at its next wake-up), so the move wakes each once.
    timers.asleep(2).await;
    clock.advance(Duration::from_secs(10));
    lease_pass(b.clone()).await;
    assert!(b.holds_maintenance_lease() && !a.holds_maintenance_lease());
    let resumed = timers.next_sent(&[&mgr_b], &mut sent_b).await;
    assert_eq!(
        resumed["wake_id"], first["wake_id"],
        "the pending wake resumed"
    );
    assert_eq!(resumed["generation"], 1);
    stored_until(&mgr_b, "s", "B's delivery finished the wake", |s| {
        s.rec.wake.is_none()
    })
    .await;

    // A comes back (a new manager, as after a restart of its facade): it does not deliver,
    // and its writes name B. New work on a stream A owns is found and sent by B.
    let (mgr_a2, mut sent_a2) = manager(&a, &clock, Delivered::Accepted { done: true });
    let refused = mgr_a2.delete("s").await;
    assert_eq!(
        refused.err(),
        Some(SubError::NotHere {
            holder: Some("http://127.0.0.1:4002".into())
        })
    );
    create_stream(&a, "c/2").await;
    // Committed: B's view shows its tail (what another node sees of A's appends).
    a.inner.engine.flush().await.unwrap();
    // B's periodic rescan (other nodes are registered) runs every ten ticks.
    let next = timers.next_sent(&[&mgr_a2, &mgr_b], &mut sent_b).await;
    assert_eq!(next["generation"], 2);
    assert!(
        next["streams"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["path"] == "c/2" && s["has_pending"] == true),
        "{next}"
    );
    assert!(sent_a2.try_recv().is_err(), "the old holder delivered");
    assert!(!mgr_a2.active.load(Ordering::Acquire));
}

/// A holder that shuts down gives the lease back: the other node takes it at its next pass
/// and, at its next timer pass, delivers the wake issued by the first.
#[tokio::test]
async fn a_released_lease_moves_delivery_at_once() {
    let FailedOnA {
        clock: _,
        a,
        b,
        timers,
        mgr_a,
        mut sent_a,
        first,
    } = failed_on_a("r", "d/*", "d/1").await;
    let (mgr_b, mut sent_b) = manager(&b, &timers.clock, Delivered::Accepted { done: false });
    release_lease(&a).await;
    lease_pass(b.clone()).await;
    assert!(b.holds_maintenance_lease() && !a.holds_maintenance_lease());
    // The retry is due about a second after the failure: B sends it once the clock gets there.
    let resumed = timers.next_sent(&[&mgr_a, &mgr_b], &mut sent_b).await;
    assert_eq!(resumed["wake_id"], first["wake_id"]);
    assert!(
        sent_a.try_recv().is_err(),
        "A sent after giving the lease up"
    );
}

fn pull_wake(pattern: &str, wake_stream: &str) -> Config {
    Config::parse(
        &json!({"type": "pull-wake", "pattern": pattern, "wake_stream": wake_stream}),
        true,
    )
    .unwrap()
}

fn routed_keys(node: &Node) -> usize {
    node.meta()
        .view()
        .kv
        .keys()
        .filter(|k| k.starts_with(crate::subscriptions::routed::ROUTED_PREFIX))
        .count()
}

/// A pull-wake subscription whose wake stream another node owns: the holder (A) may not
/// append there (opening it would fence B's tail), so the event goes through the log and B,
/// the owner, appends it at its next timer pass, without the stream changing hands.
#[tokio::test]
async fn a_wake_event_for_a_stream_another_node_owns_is_written_by_its_owner() {
    let clock = ManualClock::new(1_000_000);
    let (a, b) = two_nodes(&clock).await;
    let timers = Timers::new(&clock);
    // B owns the wake stream (created and written there).
    create_stream(&b, "w").await;
    let w_id = b
        .head_now(&StreamName::parse("w").unwrap())
        .unwrap()
        .stream_id;
    let (mgr_a, _) = manager(&a, &clock, Delivered::Accepted { done: true });
    let (mgr_b, _) = manager(&b, &clock, Delivered::Accepted { done: true });
    assert!(mgr_a.upsert("p", pull_wake("q/*", "w"), ROOT).await.is_ok());
    create_stream(&a, "q/1").await;
    stored_until(&mgr_a, "p", "the wake is issued", |s| s.rec.generation == 1).await;
    for _ in 0..30 {
        if read_json(&b, "w").await.len() == 2 {
            break;
        }
        timers.passes(&[&mgr_a, &mgr_b], 1).await;
    }
    let got = read_json(&b, "w").await;
    assert_eq!(got.len(), 2, "the event was not written: {got:?}");
    assert_eq!(got[1]["type"], "wake");
    assert_eq!(got[1]["subscription_id"], "p");
    assert_eq!(got[1]["generation"], 1);
    assert_eq!(got[1]["stream"], "q/1");
    eventually("the routed event is cleared", || routed_keys(&a) == 0).await;
    let view = a.meta().view();
    let owner = view.streams[&w_id].owner.as_ref().map(|o| o.node_id);
    assert_eq!(owner, Some(2), "the wake stream stayed with its owner");
}

/// A linked stream deleted and re-created on another node under the same name: the holder's
/// rescan tells the new stream from the old by its id, starts its cursor over, and wakes the
/// subscription for the new stream's records (a shorter stream than the old cursor included).
#[tokio::test]
async fn the_rescan_sees_a_stream_re_created_elsewhere_under_the_same_name() {
    let clock = ManualClock::new(1_000_000);
    let (a, b) = two_nodes(&clock).await;
    let timers = Timers::new(&clock);
    let (mgr_a, mut sent) = manager(&a, &clock, Delivered::Accepted { done: true });
    assert!(mgr_a.upsert("s", webhook("e/*"), ROOT).await.is_ok());
    let name = StreamName::parse("e/1").unwrap();
    let create = |n: usize| crate::CreateRequest {
        name: name.clone(),
        config: crate::CreateConfig::default(),
        initial: (0..n)
            .map(|i| DataRecord::from_value(format!("{i}").into_bytes()))
            .collect(),
    };
    b.create(create(3)).await.unwrap();
    b.inner.engine.flush().await.unwrap();
    let first = timers.next_sent(&[&mgr_a], &mut sent).await;
    assert_eq!(first["generation"], 1);
    stored_until(&mgr_a, "s", "the wake is done, acked at 3", |s| {
        s.rec.wake.is_none() && s.links.get("e/1").is_some_and(|l| l.acked == Some(3))
    })
    .await;
    // Deleted and re-created on B with fewer records than the cursor.
    b.delete(&name).await.unwrap();
    b.create(create(2)).await.unwrap();
    b.inner.engine.flush().await.unwrap();
    let next = timers.next_sent(&[&mgr_a], &mut sent).await;
    assert_eq!(next["generation"], 2);
    assert!(
        next["streams"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["path"] == "e/1" && s["has_pending"] == true),
        "{next}"
    );
}

/// A restarted process of the holder's node id takes the lease row over at once; the old
/// process (paused, its view not caught up) still counts itself holder on its clock, but sends
/// no webhook on it: the delivery reads the lease row first.
#[tokio::test]
async fn a_superseded_holder_sends_nothing_once_the_row_names_its_successor() {
    let FailedOnA {
        a,
        b: _b,
        timers,
        mgr_a,
        mut sent_a,
        ..
    } = failed_on_a("s", "f/*", "f/1").await;
    // What `take_from_predecessor` of a process of node 1 at epoch 13 writes.
    let meta = a.meta();
    assert!(meta.release_lease("maintenance", "1/11").await.unwrap());
    assert!(
        meta.try_acquire_lease("maintenance", "1/13", Duration::from_secs(10))
            .await
            .unwrap()
    );
    assert!(a.holds_maintenance_lease(), "its clock still says held");
    // Past the retry's backoff (1 s ± 20 %) and more, within the lease's TTL on A's clock.
    timers.passes(&[&mgr_a], 20).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        sent_a.try_recv().is_err(),
        "the superseded process sent a webhook"
    );
    assert!(!a.holds_maintenance_lease());
}
