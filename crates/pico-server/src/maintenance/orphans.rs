//! Orphan GC: objects an earlier incarnation of a node uploaded but never committed. Run by
//! the maintenance lease holder for every registered node (a node that never comes back still
//! gets its orphans cleaned).

use super::gc::GC_DELETES_IN_FLIGHT;
use crate::node::Node;
use futures::StreamExt;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// Orphan passes over every node registered in the view.
pub(crate) async fn orphan_sweep(node: Node, state: Arc<OrphanGcs>) {
    let nodes: Vec<(u32, u64)> = node
        .inner
        .meta
        .view()
        .nodes
        .values()
        .map(|n| (n.node_id, n.epoch))
        .collect();
    for (node_id, epoch) in nodes {
        let gc = state.of(node_id, epoch);
        orphan_pass(&node, node_id, epoch, gc).await;
    }
}

/// Per node id: the epoch it was registered at when its older epochs were listed, and the pass's
/// memory of them. A newer registration starts afresh (its predecessor's epoch is now older).
#[derive(Default)]
pub(crate) struct OrphanGcs(std::sync::Mutex<BTreeMap<u32, (u64, Arc<OrphanGc>)>>);

impl OrphanGcs {
    fn of(&self, node_id: u32, epoch: u64) -> Arc<OrphanGc> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let e = map
            .entry(node_id)
            .or_insert_with(|| (epoch, Arc::default()));
        if e.0 != epoch {
            *e = (epoch, Arc::default());
        }
        e.1.clone()
    }
}

/// Deletes objects an earlier incarnation of node `node_id` uploaded but never committed (it
/// crashed between upload and commit). Safe because an incarnation's commits need its node epoch
/// to be current: once the node registered `current_epoch`, an uncommitted object of an older
/// epoch can never become visible (and the view, applied in log order, already holds every
/// commit made at an older epoch). Objects of the current epoch are left alone (an upload may be
/// in flight).
///
/// An older epoch's objects no longer change, so each is cleaned once per process: the first
/// pass lists `data/{node}/` to find the older epochs, later ones list only `data/{node}/{epoch}/`
/// of an epoch whose cleaning failed (each pass used to list every object this node ever wrote).
pub(crate) async fn orphan_pass(
    node: &Node,
    node_id: u32,
    current_epoch: u64,
    state: Arc<OrphanGc>,
) {
    let root = format!("data/{node_id}/");
    let epoch_of = |key: &str| {
        key.strip_prefix(&root)
            .and_then(|rest| rest.split('/').next())
            .and_then(|e| e.parse::<u64>().ok())
    };
    let mut by_epoch: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    match state.left() {
        None => {
            let keys = match node.inner.data.list(&root).await {
                Ok(keys) => keys,
                Err(e) => {
                    tracing::warn!(error = %e, "orphan gc: listing failed");
                    return;
                }
            };
            for key in keys {
                if let Some(epoch) = epoch_of(&key).filter(|e| *e < current_epoch) {
                    by_epoch.entry(epoch).or_default().push(key);
                }
            }
            state.found(by_epoch.keys().copied());
        }
        Some(epochs) => {
            for epoch in epochs {
                match node.inner.data.list(&format!("{root}{epoch}/")).await {
                    Ok(keys) => {
                        by_epoch.insert(epoch, keys);
                    }
                    Err(e) => tracing::warn!(error = %e, epoch, "orphan gc: listing failed"),
                }
            }
        }
    }
    let mut deleted = 0usize;
    for (epoch, keys) in by_epoch {
        // Listing may have taken long: deletes are not fenced, so confirm the lease first.
        if !super::confirm(node).await {
            break;
        }
        let view = node.inner.meta.view();
        let orphans: Vec<String> = keys
            .into_iter()
            .filter(|k| !view.objects.contains_key(k))
            .collect();
        drop(view);
        let data = &node.inner.data;
        let (ok, failed) = futures::stream::iter(orphans)
            .map(|key| async move {
                let result = data.delete(&key).await;
                if let Err(e) = &result {
                    tracing::warn!(error = %e, key, "orphan gc: delete failed");
                }
                result.is_err()
            })
            .buffer_unordered(GC_DELETES_IN_FLIGHT)
            .fold((0usize, 0usize), |(ok, failed), f| async move {
                if f {
                    (ok, failed + 1)
                } else {
                    (ok + 1, failed)
                }
            })
            .await;
        deleted += ok;
        // A failed delete leaves the epoch to the next pass, which lists only its directory.
        if failed == 0 {
            state.cleaned(epoch);
        }
    }
    if deleted > 0 {
        tracing::info!(
            deleted,
            node_id,
            "orphan gc: removed uncommitted objects of earlier incarnations"
        );
    }
}

/// The orphan pass's memory of older node epochs.
#[derive(Default)]
pub(crate) struct OrphanGc(std::sync::Mutex<Option<BTreeSet<u64>>>);

impl OrphanGc {
    /// Older epochs not cleaned yet; `None` until a listing of the node's prefix found them.
    fn left(&self) -> Option<BTreeSet<u64>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn found(&self, epochs: impl IntoIterator<Item = u64>) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(epochs.into_iter().collect());
    }

    fn cleaned(&self, epoch: u64) {
        if let Some(left) = self.0.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            left.remove(&epoch);
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::test_support::*;

    /// Orphans of older node epochs are deleted once: a later pass lists no key of a cleaned
    /// epoch (committed objects stay there for good), only the directory of an epoch whose
    /// cleaning failed. Each pass used to list everything this node ever wrote.
    #[tokio::test]
    async fn older_epochs_are_cleaned_of_orphans_once() {
        let data = Arc::new(MemoryStorage::new());
        let config = NodeConfig {
            node_epoch: 5,
            ..NodeConfig::default()
        };
        let node = node_with(config, data.clone(), uploads_on_demand()).await;
        let root = format!("data/{}", node.inner.config.node_id);
        let key = |k: &str| format!("{root}/{k}");
        for k in [
            "3/committed",
            "3/orphan-a",
            "3/orphan-b",
            "4/committed",
            "4/orphan",
        ] {
            data.put(&key(k), Bytes::from_static(b"x")).await.unwrap();
        }
        data.put(&key("5/in-flight"), Bytes::from_static(b"x"))
            .await
            .unwrap();
        // Committed objects are the GC's (destroyed, as they have no ranges), not orphans.
        for k in ["3/committed", "4/committed"] {
            let commit = Command::CommitObject {
                node_id: node.inner.config.node_id,
                node_epoch: 5,
                key: key(k),
                size: 1,
                ranges: vec![],
                now_ms: now_ms(),
            };
            node.inner.meta.propose(commit).await.unwrap().unwrap();
        }
        // Keys of each epoch listed by the passes (the test's own listings are not counted).
        let listed = |epoch: u64| {
            let dir = format!("{root}/{epoch}/");
            data.listed_keys()
                .iter()
                .filter(|k| k.starts_with(&dir))
                .count()
        };
        let stored = || data.keys();
        // The first delete (an orphan of epoch 3) fails.
        data.fail_deletes(1);
        let state = Arc::new(OrphanGc::default());
        orphan_pass(&node, 1, 5, state.clone()).await;
        assert_eq!((listed(3), listed(4), listed(5)), (3, 2, 1));
        let left = stored();
        assert_eq!(
            left.len(),
            4,
            "committed, in flight, one failed delete: {left:?}"
        );

        orphan_pass(&node, 1, 5, state.clone()).await;
        assert_eq!(listed(4), 2, "second pass listed keys of a cleaned epoch");
        assert_eq!(listed(5), 1, "second pass listed the current epoch");
        assert_eq!(listed(3), 3 + 2, "epoch 3 retried on its own");
        let left = stored();
        assert_eq!(
            left,
            [key("3/committed"), key("4/committed"), key("5/in-flight")]
        );

        orphan_pass(&node, 1, 5, state).await;
        assert_eq!(
            (listed(3), listed(4), listed(5)),
            (5, 2, 1),
            "nothing left to list"
        );
    }
}
