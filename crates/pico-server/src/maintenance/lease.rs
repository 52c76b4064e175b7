//! The maintenance lease: one SQL row (`meta_lease`, name [`LEASE`]) with an expiry on the
//! injected clock. Its holder runs the cluster-wide loops (GC of destroyed objects, orphan
//! cleanup, TTL sweeps); the others skip them. Nothing here is needed for safety (every one of
//! those passes is idempotent through the log): the lease keeps the work from being done N
//! times, and moves it when its holder stops renewing.
//!
//! The holder is `"{node_id}/{node_epoch}"`, so a restarted process never inherits a lease its
//! predecessor took; it takes the row over at once instead (`take_from_predecessor`). This
//! process counts the lease as held only until `ttl` after the start of its last successful
//! take or renewal, on its own clock, so it stops working before another node can take the row
//! over (as long as clocks agree to better than the TTL minus the renewal period). That clock
//! rule does not cover the takeover by a newer process of the same node id, which happens at
//! once: so every gated pass also [`confirm`]s, right before it acts, that the row still names
//! this incarnation and that its registration is the current one.

use crate::node::Node;
use pico_common::failure_log::FailureLog;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// The lease row's name.
pub(crate) const LEASE: &str = "maintenance";

/// While the lease store keeps failing, a warning at most this often (on the injected clock):
/// once overdue, the lease is tried before every gated pass, every ~100 ms.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(30);

/// This process's view of the lease.
#[derive(Debug)]
pub(crate) struct LeaseState {
    /// Held until this clock time (ms); `i64::MIN` when not held.
    held_until_ms: AtomicI64,
    /// The run of failed takes and renewals under way, for the log.
    failures: FailureLog,
}

impl Default for LeaseState {
    fn default() -> Self {
        LeaseState {
            held_until_ms: AtomicI64::new(i64::MIN),
            failures: FailureLog::new(FAILURE_LOG_EVERY),
        }
    }
}

impl LeaseState {
    pub(crate) fn held(&self, now_ms: i64) -> bool {
        now_ms < self.held_until_ms.load(Ordering::Relaxed)
    }

    /// This process held the lease at its last take or renewal, and that deadline has passed
    /// without a renewal (a slow pass, or the clock jumped ahead).
    pub(crate) fn overdue(&self, now_ms: i64) -> bool {
        let until = self.held_until_ms.load(Ordering::Relaxed);
        until != i64::MIN && now_ms >= until
    }

    /// Counts the lease as not held (a process that stops without giving the row back).
    pub(crate) fn clear(&self) {
        self.set(i64::MIN);
    }

    fn set(&self, until_ms: i64) {
        self.held_until_ms.store(until_ms, Ordering::Relaxed);
    }
}

pub(crate) fn holder_id(node: &Node) -> String {
    let cfg = &node.inner.config;
    format!("{}/{}", cfg.node_id, cfg.node_epoch)
}

/// Takes or renews the lease. Renewing fails once the row expired or another node holds it;
/// then this node tries to take it again like anyone else.
pub(crate) async fn lease_pass(node: Node) {
    let cfg = &node.inner.config;
    if !node.is_serving() || !registration_current(&node) {
        // A fenced, superseded or stopping process must not hold maintenance work.
        node.inner.lease.set(i64::MIN);
        return;
    }
    let ttl = cfg.lease_ttl;
    let holder = holder_id(&node);
    let now = cfg.clock.now_ms();
    let meta = &node.inner.meta;
    let was_held = node.inner.lease.held(now);
    let result = if was_held {
        match meta.renew_lease(LEASE, &holder, ttl).await {
            Ok(true) => Ok(true),
            // Lost (expired unseen, or taken): try to take it back at once.
            Ok(false) => meta.try_acquire_lease(LEASE, &holder, ttl).await,
            Err(e) => Err(e),
        }
    } else {
        match meta.try_acquire_lease(LEASE, &holder, ttl).await {
            Ok(false) => take_from_predecessor(&node, &holder).await,
            other => other,
        }
    };
    if result.is_ok()
        && let Some(failures) = node.inner.lease.failures.answered()
    {
        tracing::info!(holder, failures, "maintenance lease store answers again");
    }
    match result {
        Ok(true) => {
            if !was_held {
                tracing::info!(
                    holder,
                    "maintenance lease taken: this node runs maintenance"
                );
            }
            let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
            node.inner.lease.set(now.saturating_add(ttl_ms));
        }
        Ok(false) => {
            if was_held {
                tracing::warn!(holder, "maintenance lease lost to another node");
            }
            node.inner.lease.set(i64::MIN);
        }
        // Unknown: keep what we had until it runs out on our clock.
        Err(e) => {
            if let Some(failures) = node.inner.lease.failures.failed(now) {
                tracing::warn!(
                    error = %e,
                    holder,
                    failures,
                    "maintenance lease not renewed (while this lasts, logged every {} s)",
                    node.inner.lease.failures.every_secs()
                );
            }
        }
    }
}

/// Takes the row over from an earlier process of this node id (a kill -9 and a restart): a
/// newer registration supersedes it, so it commits nothing more, and waiting for its row to
/// expire would only stop maintenance (and subscription delivery, whose API answers 503
/// meanwhile) for a TTL after every restart. The release is a compare-and-delete on that exact
/// holder, so a node that took the row in between keeps it.
async fn take_from_predecessor(node: &Node, holder: &str) -> Result<bool, pico_sql::MetaError> {
    let meta = &node.inner.meta;
    let Some((current, _)) = meta.lease_holder(LEASE).await? else {
        return Ok(false);
    };
    let cfg = &node.inner.config;
    if !predecessor_of(&current, cfg.node_id, cfg.node_epoch) {
        return Ok(false);
    }
    tracing::info!(
        previous = current,
        holder,
        "maintenance lease held by this node's previous process: taking it over"
    );
    meta.release_lease(LEASE, &current).await?;
    meta.try_acquire_lease(LEASE, holder, cfg.lease_ttl).await
}

/// Whether this process's registration is the current one for its node id, as far as its view
/// and its own heartbeats know: not fenced, not superseded by a newer process of this id.
fn registration_current(node: &Node) -> bool {
    let cfg = &node.inner.config;
    !node.inner.heartbeat.fenced()
        && node
            .inner
            .meta
            .view()
            .nodes
            .get(&cfg.node_id)
            .is_some_and(|n| n.epoch == cfg.node_epoch && n.fenced_epoch.is_none())
}

/// Checks, right before a gated pass acts (an object delete, a fence, a TTL removal, a webhook,
/// a subscription write), that this process still holds the lease: on its clock, by its view
/// of its own registration, and by the lease row itself (one read of the database). The row is
/// what a newer process of this node id takes over at once (`take_from_predecessor`), while the
/// old one, paused or not dead yet, would still count itself holder on its clock for up to a
/// TTL. A lost row drops the lease here; a failed read answers no (the pass is skipped, the
/// next one retries). Object deletes cannot be fenced by the store, so this check is the fence:
/// what remains is the time between the check and the delete.
pub(crate) async fn confirm(node: &Node) -> bool {
    if !node.holds_maintenance_lease() {
        return false;
    }
    if !registration_current(node) {
        node.inner.lease.clear();
        return false;
    }
    let holder = holder_id(node);
    match node.inner.meta.lease_holder(LEASE).await {
        Ok(Some((current, _))) if current == holder => node.holds_maintenance_lease(),
        Ok(current) => {
            tracing::warn!(
                holder,
                current = current.map(|(h, _)| h),
                "maintenance lease row names another holder: this process stops its maintenance"
            );
            node.inner.lease.set(i64::MIN);
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, holder, "maintenance lease not confirmed: pass skipped");
            false
        }
    }
}

/// Whether `holder` names an earlier process (lower epoch) of node `node_id`.
fn predecessor_of(holder: &str, node_id: u32, node_epoch: u64) -> bool {
    holder
        .split_once('/')
        .and_then(|(id, epoch)| Some((id.parse::<u32>().ok()?, epoch.parse::<u64>().ok()?)))
        .is_some_and(|(id, epoch)| id == node_id && epoch < node_epoch)
}

/// The advertised URL of the process holding the lease, if it is another registered, unfenced
/// process (not this one, not an earlier process of this node id): where work gated on the
/// lease is served from.
pub(crate) async fn holder_url(node: &Node) -> Option<String> {
    let (holder, _) = node.inner.meta.lease_holder(LEASE).await.ok().flatten()?;
    let (id, epoch) = holder.split_once('/')?;
    let (id, epoch) = (id.parse::<u32>().ok()?, epoch.parse::<u64>().ok()?);
    if id == node.inner.config.node_id {
        return None;
    }
    let view = node.inner.meta.view();
    let info = view.nodes.get(&id)?;
    (info.epoch == epoch && info.fenced_epoch.is_none()).then(|| info.address.clone())
}

/// Whether this process holds the lease, renewing it first when its deadline passed before
/// the renewal loop came round (as [`crate::maintenance::gated`] does). No IO otherwise: a
/// cheap check for every event; what acts on it [`confirm`]s first.
pub(crate) async fn held_now(node: &Node) -> bool {
    if node.inner.lease.overdue(node.now_ms()) {
        lease_pass(node.clone()).await;
    }
    node.holds_maintenance_lease() && registration_current(node)
}

/// Gives the lease up at shutdown, so another node takes it at its next pass rather than after
/// the TTL.
pub(crate) async fn release_lease(node: &Node) {
    let now = node.now_ms();
    if !node.inner.lease.held(now) {
        return;
    }
    node.inner.lease.set(i64::MIN);
    if let Err(e) = node.inner.meta.release_lease(LEASE, &holder_id(node)).await {
        tracing::warn!(error = %e, "maintenance lease not released; it expires by itself");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::test_support::*;
    use pico_common::clock::{Clock, ManualClock};

    fn holders(a: &Node, b: &Node) -> (bool, bool) {
        (a.holds_maintenance_lease(), b.holds_maintenance_lease())
    }

    /// Exactly one of two nodes holds the lease while its holder renews; when it stops, the
    /// other takes it once the row expires (not a millisecond before), and the first, coming
    /// back, finds it taken and stops counting itself a holder.
    #[tokio::test]
    async fn one_holder_at_a_time_and_the_lease_moves_when_its_holder_stops() {
        let clock = ManualClock::new(1_000_000);
        let (a, b) = two_nodes(&clock).await;
        // Each node tries once at start: A, started first, took it.
        assert_eq!(holders(&a, &b), (true, false));
        lease_pass(b.clone()).await;
        lease_pass(a.clone()).await;
        assert_eq!(holders(&a, &b), (true, false));
        for _ in 0..5 {
            clock.advance(Duration::from_secs(3));
            lease_pass(b.clone()).await;
            lease_pass(a.clone()).await;
            assert_eq!(holders(&a, &b), (true, false), "renewed by its holder");
        }
        // A stops renewing (paused, cut off, dead). Its last renewal was at t0.
        let t0 = clock.now_ms();
        clock.advance(Duration::from_millis(9_999));
        lease_pass(b.clone()).await;
        assert_eq!(holders(&a, &b), (true, false), "not expired yet");
        clock.advance(Duration::from_millis(1));
        assert_eq!(clock.now_ms(), t0 + 10_000);
        assert!(
            !a.holds_maintenance_lease(),
            "A stops counting at its own expiry"
        );
        lease_pass(b.clone()).await;
        assert_eq!(holders(&a, &b), (false, true), "B takes the expired lease");
        // A comes back: the row is B's now.
        lease_pass(a.clone()).await;
        assert_eq!(holders(&a, &b), (false, true));
        // B shuts down and gives it up: A takes it at its next pass, without waiting.
        release_lease(&b).await;
        lease_pass(a.clone()).await;
        assert_eq!(holders(&a, &b), (true, false));
    }

    /// A process restarted with the same node id (a kill -9, then `pico serve` again) takes the
    /// lease over from its predecessor at once instead of a TTL later; a node of another id does
    /// not, and neither does an older process.
    #[tokio::test]
    async fn a_restarted_process_takes_its_predecessors_lease_at_once() {
        let clock = ManualClock::new(1_000_000);
        let (a, b) = two_nodes(&clock).await;
        assert_eq!(holders(&a, &b), (true, false));
        assert!(!predecessor_of("2/12", 1, 13), "another node id");
        assert!(!predecessor_of("1/13", 1, 13), "this very process");
        assert!(!predecessor_of("1/14", 1, 13), "a newer process");
        assert!(predecessor_of("1/11", 1, 13));
        // Node 1 restarts on the same log: the new process starts at a higher epoch.
        let a2 = restart(&a, &clock, 13).await;
        assert!(a2.holds_maintenance_lease(), "taken at its start");
        assert_eq!(
            holder_url(&b).await.as_deref(),
            Some("http://127.0.0.1:4011")
        );
        assert_eq!(holder_url(&a2).await, None, "this process holds it");
        // The old process (were it still running) cannot renew, nor take it back.
        clock.advance(Duration::from_secs(4));
        lease_pass(a.clone()).await;
        lease_pass(b.clone()).await;
        assert!(!a.holds_maintenance_lease() && !b.holds_maintenance_lease());
        assert!(a2.holds_maintenance_lease());
    }

    /// A process of node 1 at `epoch` on `a`'s metadata log and bucket, its loops stopped.
    async fn restart(a: &Node, clock: &Arc<ManualClock>, epoch: u64) -> Node {
        let url = "http://127.0.0.1:4011";
        process_on(&a.inner.meta, &a.inner.data, clock, 1, epoch, url).await
    }

    /// Stores an object and destroys it (committed with no ranges), as a deleted stream's
    /// objects end up: GC's work. Committed by `by` (a current process).
    async fn destroyed_object(by: &Node, key: &str) {
        by.inner
            .data
            .put(key, Bytes::from_static(b"x"))
            .await
            .unwrap();
        let cfg = by.config();
        by.inner
            .meta
            .propose(Command::CommitObject {
                node_id: cfg.node_id,
                node_epoch: cfg.node_epoch,
                key: key.to_string(),
                size: 1,
                ranges: vec![],
                now_ms: by.now_ms(),
            })
            .await
            .unwrap()
            .unwrap();
        assert!(by.inner.meta.view().destroyed.contains(key));
    }

    /// Two incarnations of node 1: the restarted one takes the lease row over at once while the
    /// old one (paused, or not dead yet) still counts itself holder on its own clock. The old
    /// one's gated passes must not act (here: delete a destroyed object), the new one's do.
    #[tokio::test]
    async fn a_superseded_incarnation_runs_no_gated_pass_after_the_takeover() {
        let clock = ManualClock::new(1_000_000);
        let (a, _b) = two_nodes(&clock).await;
        assert!(a.holds_maintenance_lease());
        let a2 = restart(&a, &clock, 13).await;
        assert!(a2.holds_maintenance_lease(), "taken over at its start");
        assert!(
            a.holds_maintenance_lease(),
            "the old process's clock still says held: what the gate must not trust alone"
        );
        let key = "data/9/1/destroyed";
        destroyed_object(&a2, key).await;
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        crate::maintenance::gated(a.clone(), move |n| async move {
            flag.store(true, Ordering::Relaxed);
            super::super::gc::gc_pass(n).await
        })
        .await;
        assert!(
            !ran.load(Ordering::Relaxed),
            "the old incarnation ran a gated pass"
        );
        assert!(a.inner.data.get(key).await.is_ok(), "and deleted an object");
        assert!(
            !a.holds_maintenance_lease(),
            "it stops counting itself holder"
        );
        // Its lease loop does not take the row back either, even once it is free.
        release_lease(&a2).await;
        lease_pass(a.clone()).await;
        assert!(!a.holds_maintenance_lease());
        lease_pass(a2.clone()).await;
        crate::maintenance::gated(a2.clone(), super::super::gc::gc_pass).await;
        assert!(
            a2.inner.data.get(key).await.is_err(),
            "the new holder's GC ran"
        );
    }

    /// The same takeover seen by an old process whose view has not applied the newer
    /// registration yet (it was paused): only the lease row tells, and the gate reads it
    /// right before the pass acts.
    #[tokio::test]
    async fn the_gate_reads_the_lease_row_before_a_pass_acts() {
        let clock = ManualClock::new(1_000_000);
        let (a, b) = two_nodes(&clock).await;
        assert_eq!(holders(&a, &b), (true, false));
        // What `take_from_predecessor` of a process at epoch 13 writes, without its
        // registration (which this shared view would show at once).
        let meta = &a.inner.meta;
        assert!(meta.release_lease(LEASE, "1/11").await.unwrap());
        assert!(
            meta.try_acquire_lease(LEASE, "1/13", Duration::from_secs(10))
                .await
                .unwrap()
        );
        assert!(a.holds_maintenance_lease(), "its clock still says held");
        let key = "data/9/1/destroyed";
        destroyed_object(&a, key).await;
        crate::maintenance::gated(a.clone(), super::super::gc::gc_pass).await;
        assert!(
            a.inner.data.get(key).await.is_ok(),
            "deleted by a lost holder"
        );
        assert!(!a.holds_maintenance_lease());
        assert!(!confirm(&a).await);
    }

    /// The gated passes run only on the holder: a destroyed object is deleted by the GC of the
    /// node holding the lease, and left alone by the other's.
    #[tokio::test]
    async fn gc_runs_only_on_the_lease_holder() {
        let clock = ManualClock::new(1_000_000);
        let (a, b) = two_nodes(&clock).await;
        // A (the holder since its start) gives the lease up, as its shutdown would; B takes it.
        release_lease(&a).await;
        lease_pass(b.clone()).await;
        assert_eq!(holders(&a, &b), (false, true));
        let key = "data/9/1/destroyed".to_string();
        a.inner
            .data
            .put(&key, Bytes::from_static(b"x"))
            .await
            .unwrap();
        a.inner
            .meta
            .propose(Command::CommitObject {
                node_id: 1,
                node_epoch: 11,
                key: key.clone(),
                size: 1,
                ranges: vec![],
                now_ms: clock.now_ms(),
            })
            .await
            .unwrap()
            .unwrap();
        assert!(a.inner.meta.view().destroyed.contains(&key));
        crate::maintenance::gated(a.clone(), super::super::gc::gc_pass).await;
        assert!(
            a.inner.data.get(&key).await.is_ok(),
            "A does not hold the lease"
        );
        crate::maintenance::gated(b.clone(), super::super::gc::gc_pass).await;
        assert!(a.inner.data.get(&key).await.is_err(), "B's GC deleted it");
        assert!(!a.inner.meta.view().destroyed.contains(&key));
    }
}
