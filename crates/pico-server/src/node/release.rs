//! Release on shutdown: a node that stops on purpose hands every stream it owns back to the
//! cluster (docs/design/failover.md, "Graceful shutdown"), so other nodes serve them at once
//! instead of redirecting to an address about to close, or waiting for failover.

use super::*;
use pico_metadata::Owner;

/// Longest [`Node::shutdown`] spends releasing streams a host did not release before
/// (`pico serve` releases them first, bounded by its own drain time).
pub const SHUTDOWN_RELEASE: Duration = Duration::from_secs(10);

/// Commands per metadata write, as the idle release batches them.
const RELEASE_BATCH: usize = 4096;

/// What [`Node::release_streams`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReleaseReport {
    /// Streams whose `ReleaseStream` committed.
    pub released: usize,
    /// Streams still owned by this node when it gave up (left to its restart or to failover).
    pub left: usize,
}

impl Node {
    /// Stops taking new opens and gives up every stream this node owns: breaks each open
    /// writer (appends that already have it finish and are acknowledged; later ones are refused
    /// with a retryable 503 before anything is written), flushes everything into committed
    /// objects, and commits `ReleaseStream` for each stream whose data is all committed. Streams
    /// an earlier incarnation of this node id still owns are opened and released in one write
    /// (their WAL was committed by this incarnation's start). Bounded by `within`, and ends at
    /// the first failed flush or metadata write: what is not released stays owned here and
    /// waits for this node's restart, or for failover. Idempotent.
    pub async fn release_streams(&self, within: Duration) -> ReleaseReport {
        self.inner.serving.store(false, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + within;
        let mut report = ReleaseReport::default();
        loop {
            let pass = tokio::time::timeout_at(deadline, self.release_pass()).await;
            let (released, left, failed) = match pass {
                Ok(p) => p,
                Err(_) => (0, self.owned_here().len(), true),
            };
            report.released += released;
            report.left = left;
            if left == 0 || failed || tokio::time::Instant::now() >= deadline {
                break;
            }
            // Appends still on their way into an object, or an open that was under way.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        if report.released > 0 || report.left > 0 {
            tracing::info!(
                released = report.released,
                left = report.left,
                "shutdown: streams released to the cluster (those left wait for a restart or failover)"
            );
        }
        report
    }

    /// Streams this node id owns in the view, with their epoch and owner; not those of a
    /// fenced incarnation, which failover releases once it committed that one's WAL.
    fn owned_here(&self) -> Vec<(u64, i64, Owner)> {
        let view = self.inner.meta.view();
        let me = self.inner.config.node_id;
        let fenced = |o: &Owner| view.nodes.get(&me).is_some_and(|n| n.fenced(o));
        view.streams
            .values()
            .filter_map(|m| {
                let owner = m.owner?;
                (owner.node_id == me && !fenced(&owner)).then_some((m.id, m.epoch, owner))
            })
            .collect()
    }

    /// One round: break the open writers, flush, release what is committed. Returns
    /// (released, still owned, a flush or write failed).
    async fn release_pass(&self) -> (usize, usize, bool) {
        for open in self.inner.open.all() {
            let mut w = open.writer.lock().await;
            w.broken = true;
            drop(w);
            self.inner.open.remove_open(&open);
            open.producers_moved.notify_waiters();
        }
        let engine = &self.inner.engine;
        if let Err(e) = engine.flush().await {
            tracing::warn!(error = %e, "shutdown: flush failed; this node's streams stay owned here");
            return (0, self.owned_here().len(), true);
        }
        let cfg = &self.inner.config;
        let mut cmds = Vec::new();
        let mut ids = Vec::new();
        for (stream_id, epoch, owner) in self.owned_here() {
            // An open under way (it began before serving stopped): the next round takes it.
            if self.inner.open.opening(stream_id) {
                continue;
            }
            match engine.is_open(stream_id) {
                // Released only once every record submitted at this epoch is in an object.
                Some(e) if e == epoch && engine.release(&[(stream_id, epoch)]) == [true] => {}
                // Not committed yet (the next round retries), or state of another epoch: not
                // this stream's owner's to drop here.
                Some(_) => continue,
                None => {}
            }
            if owner.node_epoch == cfg.node_epoch {
                cmds.push(Command::ReleaseStream {
                    stream_id,
                    epoch,
                    node_id: cfg.node_id,
                    node_epoch: cfg.node_epoch,
                });
            } else if owner.node_epoch < cfg.node_epoch {
                // An earlier incarnation's: only the current one may release, so it opens it
                // (epoch + 1) and releases it in the same write.
                cmds.push(Command::OpenStream {
                    stream_id,
                    node_id: cfg.node_id,
                    node_epoch: cfg.node_epoch,
                });
                cmds.push(Command::ReleaseStream {
                    stream_id,
                    epoch: epoch + 1,
                    node_id: cfg.node_id,
                    node_epoch: cfg.node_epoch,
                });
            }
            ids.push(stream_id);
        }
        let mut released = 0;
        for chunk in cmds.chunks(RELEASE_BATCH) {
            match self.inner.meta.propose_many(chunk.to_vec()).await {
                // Rejections (opened again meanwhile, deleted) leave the stream to whoever won.
                Ok(outcomes) => {
                    released += outcomes
                        .iter()
                        .filter(|o| matches!(o, Ok(Outcome::Released)))
                        .count();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "shutdown: releasing streams failed; they stay owned here");
                    return (released, self.owned_here().len(), true);
                }
            }
        }
        // Long-polls parked here answer now (as on timeout) and come back to a serving node.
        for id in ids {
            self.inner.waiters.release(id);
        }
        (released, self.owned_here().len(), false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CreateRequest, ReadFrom, ReadRequest};
    use crate::testing::start_test_node;

    use crate::node::tests::append_req as append;

    /// Every stream the node owns is committed and released, its engine state dropped; new
    /// opens are refused, reads still answer from the committed objects; a second call finds
    /// nothing left.
    #[tokio::test]
    async fn release_commits_and_releases_every_owned_stream() {
        let node = start_test_node().await;
        let names: Vec<StreamName> = (0..3)
            .map(|i| StreamName::parse(&format!("s{i}")).unwrap())
            .collect();
        for name in &names {
            node.create(CreateRequest {
                name: name.clone(),
                config: Default::default(),
                initial: vec![],
            })
            .await
            .unwrap();
            node.append(append(name, "a")).await.unwrap();
            node.append(append(name, "b")).await.unwrap();
        }
        assert_eq!(node.owned_here().len(), 3);

        let report = node.release_streams(Duration::from_secs(10)).await;
        assert_eq!(
            report,
            ReleaseReport {
                released: 3,
                left: 0
            }
        );
        assert!(!node.is_serving());
        assert_eq!(node.open_streams(), 0);
        let view = node.meta().view();
        for name in &names {
            let (_, meta) = view.stream_by_name(name.as_str()).unwrap();
            assert_eq!(meta.owner, None, "{name} still owned");
            assert_eq!(
                meta.end_offset, 2,
                "{name} not committed before its release"
            );
            assert_eq!(node.engine().is_open(meta.id), None);
        }
        let read = node
            .read(ReadRequest {
                name: names[0].clone(),
                from: ReadFrom::Offset(0),
                max_records: None,
                max_bytes: None,
                touch: false,
            })
            .await
            .unwrap();
        assert_eq!(read.records.len(), 2);
        assert!(
            node.append(append(&names[0], "c")).await.is_err(),
            "opened while stopping"
        );
        let again = node.release_streams(Duration::from_secs(10)).await;
        assert_eq!(again, ReleaseReport::default());
        node.shutdown().await;
    }
}
