//! Loops that run without a request: object GC, TTL sweeps and touch persistence, idle-stream
//! release, waiter cleanup. Single node: this node runs them all (the cluster issue moves GC and
//! TTL sweeps behind a SQL lease).

use crate::node::{MAX_TTL_SECS, Node};
use pico_common::StreamName;
use pico_common::clock::now_ms;
use pico_metadata::Command;
use std::time::Duration;

pub(crate) fn spawn_all(node: &Node) {
    let mut tasks = node.inner.tasks.lock().unwrap_or_else(|p| p.into_inner());
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(5), gc_pass));
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(1), touch_pass));
    // Expiry is checked on every access; the sweep only reclaims streams nobody touches, so it
    // can afford to run rarely (it scans the registry).
    tasks.push(spawn_loop(
        node.clone(),
        Duration::from_secs(10),
        expiry_pass,
    ));
    tasks.push(spawn_loop(node.clone(), Duration::from_secs(5), idle_pass));
    // Lists every object this node ever wrote: rare, and once right after start.
    tasks.push(spawn_loop(
        node.clone(),
        Duration::from_secs(600),
        orphan_pass,
    ));
}

fn spawn_loop<F, Fut>(node: Node, every: Duration, pass: F) -> tokio::task::JoinHandle<()>
where
    F: Fn(Node) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            pass(node.clone()).await;
        }
    })
}

/// Deletes destroyed objects (no live stream references them) from storage, then forgets them.
/// Deleting before forgetting means a crash in between only repeats an idempotent delete.
pub(crate) async fn gc_pass(node: Node) {
    let view = node.inner.meta.view();
    let keys: Vec<String> = view.destroyed.iter().take(256).cloned().collect();
    for key in keys {
        if let Err(e) = node.inner.data.delete(&key).await {
            tracing::warn!(error = %e, key, "gc: delete failed, will retry");
            continue;
        }
        if let Err(e) = node
            .inner
            .meta
            .propose(Command::ForgetObject { key: key.clone() })
            .await
        {
            tracing::warn!(error = %e, key, "gc: forget failed, will retry");
        }
    }
}

/// Deletes objects an earlier incarnation of this node uploaded but never committed (it crashed
/// between upload and commit). Safe because an incarnation's commits need its node epoch to be
/// current: once this node registered a newer epoch, an uncommitted object of an older epoch can
/// never become visible. Objects of the current epoch are left alone (an upload may be in flight).
pub(crate) async fn orphan_pass(node: Node) {
    let cfg = &node.inner.config;
    let prefix = format!("data/{}/", cfg.node_id);
    let keys = match node.inner.data.list(&prefix).await {
        Ok(keys) => keys,
        Err(e) => {
            tracing::warn!(error = %e, "orphan gc: listing failed");
            return;
        }
    };
    let view = node.inner.meta.view();
    let mut deleted = 0usize;
    for key in keys {
        let epoch = key
            .strip_prefix(&prefix)
            .and_then(|rest| rest.split('/').next())
            .and_then(|e| e.parse::<u64>().ok());
        let Some(epoch) = epoch else { continue };
        if epoch >= cfg.node_epoch || view.objects.contains_key(&key) {
            continue;
        }
        match node.inner.data.delete(&key).await {
            Ok(()) => deleted += 1,
            Err(e) => tracing::warn!(error = %e, key, "orphan gc: delete failed"),
        }
    }
    if deleted > 0 {
        tracing::info!(
            deleted,
            "orphan gc: removed uncommitted objects of earlier incarnations"
        );
    }
}

/// Persists pending TTL touches, and drops those of streams that are gone (a read or append that
/// resolved the stream before its delete can touch it after the delete's cleanup).
pub(crate) async fn touch_pass(node: Node) {
    let pending = node.inner.touches.pending();
    if pending.is_empty() {
        return;
    }
    let view = node.inner.meta.view();
    let mut due = Vec::new();
    for (id, at) in pending {
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
            // Persist only touches that moved the persisted time by a quarter of the TTL or more.
            Some((last, ttl))
                if at.saturating_sub(last)
                    >= ((ttl.min(MAX_TTL_SECS) as i64) * 1000 / 4).max(1) =>
            {
                due.push((id, at))
            }
            Some(_) => {}
        }
    }
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
        Err(e) => tracing::warn!(error = %e, "ttl: persisting touches failed"),
    }
}

/// Removes streams whose TTL or expiry passed.
pub(crate) async fn expiry_pass(node: Node) {
    let now = now_ms();
    let view = node.inner.meta.view();
    let expired: Vec<(std::sync::Arc<str>, u64)> = view
        .registry
        .iter()
        .filter(|(_, e)| e.config.ttl_secs.is_some() || e.config.expires_at_ms.is_some())
        .filter(|(_, e)| node.expired(e, e.stream_id, now))
        .take(1024)
        .map(|(n, e)| (n.clone(), e.stream_id))
        .collect();
    for (name, id) in expired {
        let Ok(name) = StreamName::parse(&name) else {
            continue;
        };
        if let Err(e) = node.remove_expired(&name, id).await {
            tracing::warn!(error = %e, stream = %name, "ttl: remove failed");
        }
    }
}

/// Releases streams idle for `idle_release`: flushes them into committed objects and drops their
/// engine state, so memory follows the active set, not the number of streams ever written.
/// One flush and one metadata row serve every stream released in a pass.
pub(crate) async fn idle_pass(node: Node) {
    node.inner.waiters.sweep();
    let cutoff = now_ms() - node.inner.config.idle_release.as_millis() as i64;
    let mut released = Vec::new();
    for open in node.inner.open.idle(cutoff).into_iter().take(IDLE_BATCH) {
        // A writer busy right now is not idle: skip it rather than wait.
        let Ok(mut w) = open.writer.try_lock() else {
            continue;
        };
        w.broken = true;
        drop(w);
        node.inner.open.remove_open(&open);
        released.push(open);
    }
    if released.is_empty() {
        return;
    }
    if let Err(e) = node.inner.engine.flush().await {
        // The data stays in the WAL and the cache; the next open flushes before re-opening.
        tracing::warn!(error = %e, streams = released.len(), "idle release: flush failed");
        return;
    }
    let cfg = &node.inner.config;
    let mut cmds = Vec::with_capacity(released.len());
    for open in &released {
        // Re-opened meanwhile by a new request: that incarnation is not ours to close.
        if node.inner.engine.is_open(open.stream_id) != Some(open.epoch) {
            continue;
        }
        if let Err(e) = node.inner.engine.close(open.stream_id).await {
            tracing::warn!(error = %e, stream = open.stream_id, "idle release: close failed");
            continue;
        }
        cmds.push(Command::ReleaseStream {
            stream_id: open.stream_id,
            epoch: open.epoch,
            node_id: cfg.node_id,
            node_epoch: cfg.node_epoch,
        });
    }
    // Rejections (a newer open of the stream already happened) are expected and harmless.
    if let Err(e) = node.inner.meta.propose_many(cmds).await {
        tracing::warn!(error = %e, "idle release: releasing ownership failed");
    }
}

/// Streams released per idle pass (bounds one pass's work and its metadata row).
const IDLE_BATCH: usize = 4096;

#[cfg(test)]
mod tests {
    use super::touch_pass;
    use crate::api::{CreateConfig, CreateRequest};
    use crate::testing::start_test_node;
    use pico_common::StreamName;
    use pico_common::clock::now_ms;

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
        let now = now_ms();
        node.inner.touches.touch(gone, now);
        node.inner.touches.touch(live, now);
        touch_pass(node.clone()).await;
        assert_eq!(
            node.inner.touches.get(gone),
            None,
            "touch of a deleted stream kept"
        );
        assert_eq!(node.inner.touches.get(live), Some(now));
    }
}
