//! Loops that run without a request, one file per loop:
//! - `gc`: deletes destroyed objects, then forgets them.
//! - `orphans`: deletes objects an earlier incarnation uploaded but never committed.
//! - `ttl`: persists TTL touches and removes expired streams.
//! - `idle`: releases streams nobody wrote for a while.
//!
//! Single node: this node runs them all. The cluster moves GC, TTL sweeps and failover behind
//! a SQL lease, with heartbeat and lease loops of their own here.

mod gc;
mod idle;
mod orphans;
#[cfg(test)]
mod test_support;
mod ttl;

use crate::node::Node;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use gc::gc_pass;
use idle::{IdleRelease, idle_pass};
use orphans::{OrphanGc, orphan_pass};
pub(crate) use ttl::flush_touches;
use ttl::{expiry_pass, touch_pass};

pub(crate) fn spawn_all(node: &Node) {
    let mut tasks = node.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(5), gc_pass));
    let touch_passes = Arc::new(AtomicU64::new(1));
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(1), move |n| {
        touch_pass(n, touch_passes.clone())
    }));
    // Expiry is checked on every access; the sweep only reclaims streams nobody touches, so it
    // can afford to run rarely (it scans the registry).
    tasks.push(spawn_loop(
        node.clone(),
        Duration::from_secs(10),
        expiry_pass,
    ));
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
    // Right after start it lists what this node wrote; later passes only retry older epochs
    // whose cleaning failed.
    let orphans = Arc::new(OrphanGc::default());
    tasks.push(spawn_loop(
        node.clone(),
        Duration::from_secs(600),
        move |n| orphan_pass(n, orphans.clone()),
    ));
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
