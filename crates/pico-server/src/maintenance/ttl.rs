//! TTL: persisting the touches that slide streams' idle TTL, and sweeping expired streams.

use crate::error::DeleteError;
use crate::node::Node;
use crate::ttl::persist_after_ms;
use futures::StreamExt;
use pico_common::StreamName;
use pico_metadata::Command;
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Persists the touches that became due (see `ttl.rs`). Every `TOUCH_SWEEP_EVERY`th pass also
/// looks at the touches that are not due, to drop those of streams deleted or without a TTL since
/// (a read that resolved a stream before its delete can touch it after the delete's cleanup).
pub(crate) async fn touch_pass(node: Node, pass: Arc<AtomicU64>) {
    let sweep = pass
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(TOUCH_SWEEP_EVERY);
    let touches = if sweep {
        node.inner.touches.pending()
    } else {
        node.inner.touches.take_due()
    };
    persist_touches(&node, touches, false).await;
}

/// Touch passes per sweep of the touches that are not due (one a minute at one pass a second).
const TOUCH_SWEEP_EVERY: u64 = 60;

/// Persists every pending touch, due or not (at shutdown: a restart would lose them).
pub(crate) async fn flush_touches(node: &Node) {
    persist_touches(node, node.inner.touches.pending(), true).await;
}

/// Persists `touches` that are due (all of them when `all`); drops those of streams that are
/// gone or have no TTL.
async fn persist_touches(node: &Node, touches: Vec<(u64, i64)>, all: bool) {
    if touches.is_empty() {
        return;
    }
    let view = node.inner.meta.view();
    let mut due = Vec::new();
    for (id, at) in touches {
        let persisted = view
            .streams
            .get(&id)
            .filter(|m| !m.deleted)
            .and_then(|m| view.registry.get(&m.name))
            .filter(|e| e.stream_id == id)
            .and_then(|e| e.config.ttl_secs.map(|ttl| (e.last_touch_ms, ttl)));
        match persisted {
            // Deleted (or without a TTL): the view only moves forward, so this never changes.
            None => node.inner.touches.remove(id),
            Some((last, ttl)) if all || at.saturating_sub(last) >= persist_after_ms(ttl) => {
                due.push((id, at))
            }
            Some(_) => {}
        }
    }
    drop(view);
    if due.is_empty() {
        return;
    }
    let cmds = due
        .iter()
        .map(|(id, at)| Command::Touch {
            stream_id: *id,
            now_ms: *at,
        })
        .collect();
    match node.inner.meta.propose_many(cmds).await {
        Ok(_) => {
            for (id, at) in due {
                node.inner.touches.persisted(id, at);
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "ttl: persisting touches failed");
            node.inner.touches.due(due.into_iter().map(|(id, _)| id));
        }
    }
}

/// Removes streams whose TTL or expiry passed. One walk of the registry per pass, in batches:
/// each batch collects up to `EXPIRY_BATCH` due names from where the last one stopped, drops the
/// view and removes them concurrently (a pass used to remove at most 1,024, one at a time).
/// When nothing is due a pass is one scan that allocates nothing.
pub(crate) async fn expiry_pass(node: Node) {
    let mut after: Option<Arc<str>> = None;
    loop {
        // Each batch after the first (`gated` confirmed that one) checks the lease row again.
        if after.is_some() && !super::confirm(&node).await {
            return;
        }
        let now = node.now_ms();
        let view = node.inner.meta.view();
        let from = after.as_deref().map_or(Bound::Unbounded, Bound::Excluded);
        let mut due: Vec<(Arc<str>, u64)> = Vec::new();
        let mut next = None;
        for (name, e) in view.registry.range::<_, str>((from, Bound::Unbounded)) {
            let may_expire = e.config.ttl_secs.is_some() || e.config.expires_at_ms.is_some();
            if may_expire && node.expired(e, e.stream_id, now) {
                due.push((name.clone(), e.stream_id));
                if due.len() == EXPIRY_BATCH {
                    next = Some(name.clone());
                    break;
                }
            }
        }
        // Awaiting with the view held would keep this snapshot of the whole state alive.
        drop(view);
        futures::stream::iter(due)
            .for_each_concurrent(EXPIRY_REMOVALS_IN_FLIGHT, |(name, id)| {
                let node = &node;
                async move {
                    let Ok(name) = StreamName::parse(&name) else {
                        return;
                    };
                    match node.remove_expired(&name, id).await {
                        // Removed meanwhile by a request that found it expired.
                        Ok(()) | Err(DeleteError::NotFound(_) | DeleteError::Gone(_)) => {}
                        Err(e) => tracing::warn!(error = %e, stream = %name, "ttl: remove failed"),
                    }
                }
            })
            .await;
        match next {
            Some(name) => after = Some(name),
            None => return,
        }
        tokio::task::yield_now().await;
    }
}

/// Expired streams collected per batch of an expiry pass.
const EXPIRY_BATCH: usize = 1024;
/// Removals of expired streams in flight at once (each is a metadata command).
const EXPIRY_REMOVALS_IN_FLIGHT: usize = 32;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::test_support::*;

    /// One expiry pass removes every expired stream, not 1,024 of them, and keeps the others.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_expiry_pass_removes_thousands_of_expired_streams() {
        let node = node_on(Arc::new(MemoryStorage::new()), EngineConfig::default()).await;
        let config = |expires_at_ms| StreamConfig {
            content_type: "application/octet-stream".into(),
            ttl_secs: None,
            expires_at_ms,
        };
        // Straight through the log: a request resolving them would start removals of its own.
        let names: Vec<String> = (0..2000).map(|i| format!("e{i:04}")).collect();
        for chunk in names.chunks(500) {
            let cmds = chunk
                .iter()
                .map(|n| Command::CreateStream {
                    name: n.clone(),
                    config: config(Some(1)),
                    closed: false,
                    initial: Initial::None,
                    now_ms: node.now_ms(),
                })
                .collect();
            for outcome in node.inner.meta.propose_many(cmds).await.unwrap() {
                outcome.unwrap();
            }
        }
        for n in ["keep", "e0500x"] {
            let cmd = Command::CreateStream {
                name: n.into(),
                config: config(Some(i64::MAX)),
                closed: false,
                initial: Initial::None,
                now_ms: node.now_ms(),
            };
            node.inner.meta.propose(cmd).await.unwrap().unwrap();
        }
        expiry_pass(node.clone()).await;
        let mut left: Vec<String> = node
            .inner
            .meta
            .view()
            .registry
            .keys()
            .map(|k| k.to_string())
            .collect();
        left.sort_unstable();
        assert_eq!(left.len(), 2, "{} expired streams left", left.len() - 2);
        assert_eq!(left, ["e0500x", "keep"]);
    }

    #[tokio::test]
    async fn touch_pass_drops_touches_of_deleted_streams() {
        let node = start_test_node().await;
        let create = |n: &str| CreateRequest {
            name: StreamName::parse(n).unwrap(),
            config: CreateConfig {
                ttl_secs: Some(3600),
                ..CreateConfig::default()
            },
            initial: vec![],
        };
        let gone = node.create(create("gone")).await.unwrap().info.stream_id;
        let live = node.create(create("live")).await.unwrap().info.stream_id;
        node.delete(&StreamName::parse("gone").unwrap())
            .await
            .unwrap();
        // A read that resolved `gone` before the delete touches it after the delete's cleanup;
        // `live` is touched too recently to be persisted yet.
        let now = node.now_ms();
        node.inner.touches.touch(gone, now, false);
        node.inner.touches.touch(live, now, false);
        // A pass that only takes due touches leaves both; the sweep drops the deleted one.
        touch_pass(node.clone(), Arc::new(AtomicU64::new(1))).await;
        assert_eq!(node.inner.touches.pending().len(), 2);
        touch_pass(node.clone(), Arc::new(AtomicU64::new(0))).await;
        assert_eq!(
            node.inner.touches.get(gone),
            None,
            "touch of a deleted stream kept"
        );
        assert_eq!(node.inner.touches.get(live), Some(now));
    }

    /// A touch that moves the persisted time by a quarter of the TTL is due when it happens and
    /// persisted by the next pass; the others wait, and a pass does not look at them.
    #[tokio::test]
    async fn touches_are_persisted_once_due() {
        let node = start_test_node().await;
        let name = StreamName::parse("t").unwrap();
        let create = CreateRequest {
            name: name.clone(),
            config: CreateConfig {
                ttl_secs: Some(4),
                ..CreateConfig::default()
            },
            initial: vec![],
        };
        let id = node.create(create).await.unwrap().info.stream_id;
        let created = node.inner.meta.view().registry["t"].last_touch_ms;
        let r = node.resolve(&name, created).unwrap();
        // Half the quarter: not due. A quarter past creation: due.
        node.touch(&r, created + 500);
        assert!(node.inner.touches.take_due().is_empty());
        node.touch(&r, created + 1000);
        touch_pass(node.clone(), Arc::new(AtomicU64::new(1))).await;
        assert_eq!(
            node.inner.meta.view().registry["t"].last_touch_ms,
            created + 1000
        );
        assert_eq!(node.inner.touches.get(id), None, "persisted touch kept");
    }
}
