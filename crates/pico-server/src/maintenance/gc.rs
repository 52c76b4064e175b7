//! Object GC: deletes destroyed objects from storage, then forgets them in the metadata log.

use crate::node::Node;
use futures::StreamExt;
use pico_metadata::Command;
use std::collections::HashSet;

/// Deletes destroyed objects (no live stream references them) from storage, then forgets them.
/// Deleting before forgetting means a crash in between only repeats an idempotent delete.
/// Batches of deletes run concurrently and each batch is forgotten in one metadata row; a pass
/// goes on while batches make progress, so GC keeps up with deletes of many objects (one key at
/// a time and a row per key, 256 keys per pass capped it at about 50 objects a second).
pub(crate) async fn gc_pass(node: Node) {
    // Deletes that failed in this pass: left for the next one, not retried batch after batch.
    let mut failed: HashSet<String> = HashSet::new();
    for batch in 0..GC_BATCHES_PER_PASS {
        // Deletes cannot be fenced by the store: each batch after the first (which `gated`
        // confirmed) checks the lease row again, so a superseded holder stops within a batch.
        if batch > 0 && !super::confirm(&node).await {
            return;
        }
        let view = node.inner.meta.view();
        let keys: Vec<String> = view
            .destroyed
            .iter()
            .filter(|k| !failed.contains(*k))
            .take(GC_BATCH)
            .cloned()
            .collect();
        drop(view);
        if keys.is_empty() {
            return;
        }
        let data = &node.inner.data;
        let results: Vec<(String, bool)> = futures::stream::iter(keys)
            .map(|key| async move {
                match data.delete(&key).await {
                    Ok(()) => (key, true),
                    Err(e) => {
                        tracing::warn!(error = %e, key, "gc: delete failed, will retry");
                        (key, false)
                    }
                }
            })
            .buffer_unordered(GC_DELETES_IN_FLIGHT)
            .collect()
            .await;
        let mut deleted = Vec::with_capacity(results.len());
        for (key, ok) in results {
            if ok {
                deleted.push(key);
            } else {
                failed.insert(key);
            }
        }
        if deleted.is_empty() {
            return; // storage is failing: try again next pass
        }
        let cmds = deleted
            .iter()
            .map(|key| Command::ForgetObject { key: key.clone() })
            .collect();
        match node.inner.meta.propose_many(cmds).await {
            Ok(outcomes) => {
                for (key, outcome) in deleted.iter().zip(outcomes) {
                    if let Err(e) = outcome {
                        tracing::warn!(error = %e, key, "gc: forget rejected");
                        failed.insert(key.clone());
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "gc: forget failed, will retry");
                return;
            }
        }
    }
}

/// Destroyed objects deleted, then forgotten in one metadata row, per GC batch.
const GC_BATCH: usize = 256;
/// Batches per GC pass at most (bounds one pass; the next starts 5 s later).
const GC_BATCHES_PER_PASS: usize = 64;
/// Object deletes in flight at once.
pub(super) const GC_DELETES_IN_FLIGHT: usize = 32;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::test_support::*;

    /// Destroyed objects go at more than 256 per pass (one delete and one metadata row at a
    /// time): one pass clears 2000.
    #[tokio::test]
    async fn one_gc_pass_clears_thousands_of_destroyed_objects() {
        let node = node_on(Arc::new(MemoryStorage::new()), EngineConfig::default()).await;
        let cfg = &node.inner.config;
        let keys: Vec<String> = (0..2000).map(|i| format!("gc-test/{i:05}")).collect();
        for key in &keys {
            node.inner
                .data
                .put(key, Bytes::from_static(b"x"))
                .await
                .unwrap();
        }
        // Committed without ranges: no live reference, destroyed at once.
        for chunk in keys.chunks(500) {
            let cmds = chunk
                .iter()
                .map(|key| Command::CommitObject {
                    node_id: cfg.node_id,
                    node_epoch: cfg.node_epoch,
                    key: key.clone(),
                    size: 1,
                    ranges: vec![],
                    now_ms: now_ms(),
                })
                .collect();
            for outcome in node.inner.meta.propose_many(cmds).await.unwrap() {
                outcome.unwrap();
            }
        }
        assert_eq!(node.inner.meta.view().destroyed.len(), 2000);
        gc_pass(node.clone()).await;
        let view = node.inner.meta.view();
        assert_eq!(view.destroyed.len(), 0, "destroyed objects left");
        assert!(keys.iter().all(|k| !view.objects.contains_key(k)));
        assert_eq!(
            node.inner.data.list("gc-test/").await.unwrap(),
            Vec::<String>::new()
        );
    }
}
