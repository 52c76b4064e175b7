//! Idle release: streams nobody wrote for a while are flushed and their engine state dropped.

use crate::node::Node;
use crate::open::OpenStream;
use pico_metadata::Command;
use std::collections::HashSet;
use std::sync::Arc;

/// Releases streams idle for `idle_release`: flushes them into committed objects and drops their
/// engine state, so memory follows the active set, not the number of streams ever written.
/// Works in batches of up to `IDLE_BATCH` streams, one flush and one metadata row each, until no
/// idle stream is left: one batch per pass capped release at ~800 streams a second, below the
/// churn of a busy node. Stops at a failed flush or metadata write (the next pass retries).
pub(crate) async fn idle_pass(node: Node, pending: Arc<IdleRelease>) {
    let cutoff = node.now_ms() - node.inner.config.idle_release.as_millis() as i64;
    // Writers found busy: skipped for this pass, or each batch would pick them again.
    let mut busy = HashSet::new();
    loop {
        let room = IDLE_BATCH.saturating_sub(pending.streams());
        let idle = node.inner.open.idle(cutoff, room, &busy);
        // Fewer than asked for: this batch takes the last idle streams.
        let last = idle.len() < room || room == 0;
        let batch = release_streams(&node, idle, &pending).await;
        busy.extend(batch.busy);
        if last || !batch.ok {
            return;
        }
        tokio::task::yield_now().await;
    }
}

/// Idle releases a pass could not finish, retried by the next pass. Without it a stream taken
/// out of the open table before a failed flush (a storage outage) kept its engine state and its
/// ownership until a request opened it again.
#[derive(Default)]
pub(crate) struct IdleRelease(std::sync::Mutex<Pending>);

#[derive(Default)]
struct Pending {
    /// Out of the open table, engine state not released yet (the flush failed).
    streams: Vec<Arc<OpenStream>>,
    /// Engine state released, `ReleaseStream` not committed yet (the metadata log failed).
    cmds: Vec<Command>,
}

impl IdleRelease {
    fn streams(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .streams
            .len()
    }

    fn take(&self) -> Pending {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn keep(&self, pending: Pending) {
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = pending;
    }
}

/// What one batch of idle releases did.
struct Batch {
    /// The flush and the metadata write went through (or were not needed).
    ok: bool,
    /// Idle streams skipped because their writer was busy.
    busy: Vec<u64>,
}

/// Releases `idle` streams, and the ones an earlier batch left pending.
async fn release_streams(node: &Node, idle: Vec<Arc<OpenStream>>, pending: &IdleRelease) -> Batch {
    let engine = &node.inner.engine;
    let mut batch = Batch {
        ok: true,
        busy: Vec::new(),
    };
    let Pending {
        mut streams,
        mut cmds,
    } = pending.take();
    // Re-opened meanwhile by a new request (which flushed this incarnation first), or deleted:
    // that engine state is not ours to release.
    streams.retain(|o| engine.is_open(o.stream_id) == Some(o.epoch));
    for open in idle {
        // A writer busy right now is not idle: skip it rather than wait.
        let Ok(mut w) = open.writer.try_lock() else {
            batch.busy.push(open.stream_id);
            continue;
        };
        w.broken = true;
        drop(w);
        node.inner.open.remove_open(&open);
        streams.push(open);
    }
    if !streams.is_empty() {
        // One flush for all: `Engine::close` per stream would upload once per stream.
        match engine.flush().await {
            // The data stays in the WAL and the cache; the next pass retries.
            Err(e) => {
                tracing::warn!(error = %e, streams = streams.len(), "idle release: flush failed");
                batch.ok = false;
            }
            Ok(()) => {
                let ids: Vec<(u64, i64)> = streams.iter().map(|o| (o.stream_id, o.epoch)).collect();
                let released = engine.release(&ids);
                let cfg = &node.inner.config;
                let mut unfinished = Vec::new();
                for (open, done) in streams.into_iter().zip(released) {
                    if done {
                        cmds.push(Command::ReleaseStream {
                            stream_id: open.stream_id,
                            epoch: open.epoch,
                            node_id: cfg.node_id,
                            node_epoch: cfg.node_epoch,
                        });
                    } else if engine.is_open(open.stream_id) == Some(open.epoch) {
                        // Appends still on their way to an object: the next pass retries.
                        unfinished.push(open);
                    }
                }
                streams = unfinished;
            }
        }
    }
    if !cmds.is_empty() {
        // Rejections (a newer open of the stream already happened) are expected and harmless,
        // which also makes a retry of the same commands safe.
        match node.inner.meta.propose_many(cmds.clone()).await {
            Ok(_) => cmds.clear(),
            Err(e) => {
                tracing::warn!(error = %e, "idle release: releasing ownership failed");
                batch.ok = false;
            }
        }
    }
    pending.keep(Pending { streams, cmds });
    batch
}

/// Releases these open streams now, as an idle pass would (tests move a stream to another
/// node this way: only a released stream may be opened elsewhere). True if all went through.
#[cfg(any(test, feature = "testing"))]
pub(crate) async fn release_now(node: &Node, opens: Vec<Arc<OpenStream>>) -> bool {
    let pending = IdleRelease::default();
    let ok = release_streams(node, opens, &pending).await.ok;
    let left = pending.take();
    ok && left.cmds.is_empty() && left.streams.is_empty()
}

/// Streams released per idle batch (bounds one batch's work and its metadata row).
const IDLE_BATCH: usize = 4096;
#[cfg(test)]
mod tests {
    use super::*;
    use crate::maintenance::test_support::*;

    /// One idle pass releases any number of streams for one upload while another stream keeps
    /// appending. Closing each stream flushed once per stream, and every flush uploaded and
    /// committed whatever the busy stream had appended since: an object per released stream.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_pass_uploads_once_however_many_streams_it_releases() {
        let node = node_on(Arc::new(MemoryStorage::new()), uploads_on_demand()).await;
        let ids = open_streams(&node, "idle", 100).await;
        open_streams(&node, "busy", 1).await;
        let stop = Arc::new(AtomicBool::new(false));
        let appends = Arc::new(AtomicU64::new(0));
        let appender = {
            let (node, stop, appends) = (node.clone(), stop.clone(), appends.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    append_one(&node, "busy0").await;
                    appends.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        // The appender is under way before the pass starts.
        while appends.load(Ordering::Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        let before = node.engine().stats().uploads;
        release_streams(&node, opens(&node, &ids), &IdleRelease::default()).await;
        let objects = node.engine().stats().uploads - before;
        stop.store(true, Ordering::Relaxed);
        appender.await.unwrap();
        let appends = appends.load(Ordering::Relaxed);
        // One flush: usually one object, more when appends land while it plans.
        assert!(
            objects <= 5,
            "one pass committed {objects} objects releasing 100 streams ({appends} appends)"
        );
        assert_eq!(node.engine().stats().open_streams, 1, "only the busy one");
        assert_eq!(node.open_streams(), 1);
        assert_eq!(owned(&node, &ids), 0, "ownership released");
        for i in [0, 99] {
            let info = node.head(&name(&format!("idle{i}"))).await.unwrap();
            assert_eq!(info.next_seq, 1, "committed before release");
        }
    }

    /// One idle pass releases every idle stream, not one batch of 4096 (~800 a second, less
    /// than a busy node's churn).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn one_idle_pass_releases_more_than_a_batch() {
        let config = NodeConfig {
            node_epoch: 1,
            idle_release: Duration::ZERO,
            ..NodeConfig::default()
        };
        let node = node_with(config, Arc::new(MemoryStorage::new()), uploads_on_demand()).await;
        open_many(&node, "s", super::IDLE_BATCH + 1).await;
        assert_eq!(node.open_streams(), super::IDLE_BATCH + 1);
        // Used before the pass's cutoff, not in its very millisecond.
        tokio::time::sleep(Duration::from_millis(5)).await;
        idle_pass(node.clone(), Arc::new(IdleRelease::default())).await;
        assert_eq!(node.open_streams(), 0, "idle streams left open");
        assert_eq!(node.engine().stats().open_streams, 0, "engine state left");
    }

    /// `Engine::release` keeps a stream whose appends are not committed yet (dropping its state
    /// then would drop data no object holds), and one open at another epoch.
    #[tokio::test]
    async fn engine_release_waits_for_the_stream_to_be_committed() {
        let node = node_on(Arc::new(MemoryStorage::new()), uploads_on_demand()).await;
        let id = open_streams(&node, "s", 1).await[0];
        let epoch = node.inner.open.get(id).unwrap().epoch;
        let engine = node.engine();
        assert_eq!(engine.release(&[(id, epoch + 1)]), [false], "other epoch");
        assert_eq!(engine.release(&[(id, epoch)]), [false], "not uploaded");
        assert_eq!(engine.is_open(id), Some(epoch));
        engine.flush().await.unwrap();
        assert_eq!(
            engine.release(&[(id, epoch), (id + 1000, 0)]),
            [true, false]
        );
        assert_eq!(engine.is_open(id), None);
        let read = node
            .read(ReadRequest {
                name: name("s0"),
                from: ReadFrom::Offset(0),
                max_records: None,
                max_bytes: None,
                touch: false,
            })
            .await
            .unwrap();
        assert_eq!(read.records.len(), 1, "read back from the object");
    }

    /// A storage outage fails the pass's flush; the streams it took out of the open table stay
    /// pending and the next pass releases them (they used to keep their engine state and
    /// ownership until a request opened them again).
    #[tokio::test]
    async fn streams_a_failed_pass_took_are_released_by_the_next_one() {
        let data = Arc::new(SlowStorage::new(
            Arc::new(MemoryStorage::new()),
            "data/",
            Box::new(|_, _| Duration::ZERO),
        ));
        // Failed uploads back off at most an upload interval, so the flush gives up soon.
        let engine = EngineConfig {
            upload_interval: Duration::from_millis(20),
            ..EngineConfig::default()
        };
        let node = node_on(data.clone(), engine).await;
        data.fail_puts(usize::MAX);
        let ids = open_streams(&node, "s", 20).await;
        let pending = IdleRelease::default();
        release_streams(&node, opens(&node, &ids), &pending).await;
        assert_eq!(node.open_streams(), 0, "taken out of the open table");
        assert_eq!(node.engine().stats().open_streams, 20, "flush failed");
        assert_eq!(owned(&node, &ids), 20);

        data.fail_puts(0);
        // Nothing newly idle: only what the failed pass left.
        release_streams(&node, Vec::new(), &pending).await;
        assert_eq!(node.engine().stats().open_streams, 0, "engine state kept");
        assert_eq!(owned(&node, &ids), 0, "ownership kept");
        let info = node.head(&name("s7")).await.unwrap();
        assert_eq!(info.next_seq, 1, "committed before release");
    }
}
