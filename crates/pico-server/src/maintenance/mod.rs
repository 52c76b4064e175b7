//! Loops that run without a request, one file per loop:
//! - `gc`: deletes destroyed objects, then forgets them.
//! - `orphans`: deletes objects an earlier incarnation uploaded but never committed.
//! - `ttl`: persists TTL touches and removes expired streams.
//! - `idle`: releases streams nobody wrote for a while.
//! - `heartbeat`: this node's liveness through the metadata log; lapse of other nodes.
//! - `lease`: the maintenance lease (one SQL row with a TTL).
//! - `failover`: the holder fences lapsed nodes, commits their WAL, releases their streams.
//!
//! Every node runs heartbeats, liveness observation, the lease loop, touches, idle release and
//! waiter sweeps. GC, orphan cleanup, TTL sweeps and failover run only on the lease holder
//! ([`gated`]); with one node, that node takes the lease at its first pass.

mod failover;
mod gc;
mod heartbeat;
mod idle;
mod lease;
mod orphans;
#[cfg(test)]
pub(crate) mod test_support;
mod ttl;

pub(crate) use heartbeat::{LivenessWatch, OwnHeartbeat};
pub(crate) use lease::{LeaseState, confirm, held_now, holder_url, lease_pass, release_lease};

use crate::node::Node;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use failover::{Failover, failover_pass};
use gc::gc_pass;
use heartbeat::heartbeat_pass;
pub(crate) use heartbeat::liveness_pass;
#[cfg(any(test, feature = "testing"))]
pub(crate) use idle::release_now;
use idle::{IdleRelease, idle_pass};
use orphans::{OrphanGcs, orphan_sweep};
pub(crate) use ttl::flush_touches;
use ttl::{expiry_pass, touch_pass};

pub(crate) fn spawn_all(node: &Node) {
    let mut tasks = node.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
    let cfg = &node.inner.config;
    tasks.push(spawn_loop(
        node.clone(),
        cfg.heartbeat_every,
        heartbeat_pass,
    ));
    // Renewed three times per TTL, so one slow round trip does not lose it.
    tasks.push(spawn_loop(node.clone(), cfg.lease_ttl / 3, lease_pass));
    // Observation on every node (routing answers 503 for a lapsed owner); failover, after it
    // in the same loop, only on the holder.
    let failover = Arc::new(Failover::default());
    tasks.push(spawn_loop(node.clone(), cfg.heartbeat_every, move |n| {
        let failover = failover.clone();
        async move {
            liveness_pass(n.clone()).await;
            gated(n, move |n| boxed_failover_pass(n, failover)).await;
        }
    }));
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(5), |n| {
        gated(n, gc_pass)
    }));
    let touch_passes = Arc::new(AtomicU64::new(1));
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(1), move |n| {
        touch_pass(n, touch_passes.clone())
    }));
    // Expiry is checked on every access; the sweep only reclaims streams nobody touches, so it
    // can afford to run rarely (it scans the registry).
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(10), |n| {
        gated(n, expiry_pass)
    }));
    let idle = Arc::new(IdleRelease::default());
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(5), move |n| {
        idle_pass(n, idle.clone())
    }));
    // Its own loop: an idle pass can wait minutes on a flush while the store is down, and
    // abandoned waiter channels must not pile up meanwhile.
    tasks.push(spawn_loop(
        node.clone(),
        Duration::from_secs(5),
        waiter_pass,
    ));
    // The holder lists each node's objects once per registration of it; later passes only
    // retry older epochs whose cleaning failed, so a frequent pass costs little.
    let orphans = Arc::new(OrphanGcs::default());
    tasks.push(spawn_loop(
        node.clone(),
        Duration::from_secs(60),
        move |n| {
            gated(n, {
                let orphans = orphans.clone();
                move |n| orphan_sweep(n, orphans)
            })
        },
    ));
}

/// [`failover_pass`] boxed: its future is checked `Send` here, in a non-generic context (in
/// the loop's generic one the compiler cannot prove it for every lifetime).
fn boxed_failover_pass(
    node: Node,
    state: Arc<Failover>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(failover_pass(node, state))
}

/// Runs `pass` only while this node holds the maintenance lease, confirmed against the lease
/// row and its own registration ([`confirm`]); passes that act in several steps confirm again
/// before each.
pub(crate) async fn gated<F, Fut>(node: Node, pass: F)
where
    F: FnOnce(Node) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // A holder whose deadline passed before its renewal came round (the clock jumped past
    // it) renews here rather than skip the pass; a node that did not hold it asks nothing.
    if node.inner.lease.overdue(node.now_ms()) {
        lease_pass(node.clone()).await;
    }
    if confirm(&node).await {
        pass(node).await;
    }
}

/// Runs `pass` at once, then `every` after each pass ends, on the node's clock (a test moving a
/// manual clock drives the loops; new loops use this or `Clock::sleep` too).
fn spawn_loop<F, Fut>(node: Node, every: Duration, pass: F) -> tokio::task::JoinHandle<()>
where
    F: Fn(Node) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let clock = node.inner.config.clock.clone();
    tokio::spawn(async move {
        loop {
            pass(node.clone()).await;
            clock.sleep(every).await;
        }
    })
}

/// Drops waiter channels nobody listens on any more.
pub(crate) async fn waiter_pass(node: Node) {
    node.inner.waiters.sweep();
}
