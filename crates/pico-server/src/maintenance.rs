//! Loops that run without a request: object GC, TTL sweeps and touch persistence, idle-stream
//! release, waiter cleanup. Single node: this node runs them all (the cluster issue moves GC and
//! TTL sweeps behind a SQL lease).

use crate::error::DeleteError;
use crate::node::Node;
use crate::open::OpenStream;
use crate::ttl::persist_after_ms;
use futures::StreamExt;
use pico_common::StreamName;
use pico_common::clock::now_ms;
use pico_metadata::Command;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ops::Bound;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
/// Batches of deletes run concurrently and each batch is forgotten in one metadata row; a pass
/// goes on while batches make progress, so GC keeps up with deletes of many objects (one key at
/// a time and a row per key, 256 keys per pass capped it at about 50 objects a second).
pub(crate) async fn gc_pass(node: Node) {
    // Deletes that failed in this pass: left for the next one, not retried batch after batch.
    let mut failed: HashSet<String> = HashSet::new();
    for _ in 0..GC_BATCHES_PER_PASS {
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
const GC_DELETES_IN_FLIGHT: usize = 32;

/// Deletes objects an earlier incarnation of this node uploaded but never committed (it crashed
/// between upload and commit). Safe because an incarnation's commits need its node epoch to be
/// current: once this node registered a newer epoch, an uncommitted object of an older epoch can
/// never become visible. Objects of the current epoch are left alone (an upload may be in flight).
///
/// An older epoch's objects no longer change, so each is cleaned once per process: the first
/// pass lists `data/{node}/` to find the older epochs, later ones list only `data/{node}/{epoch}/`
/// of an epoch whose cleaning failed (each pass used to list every object this node ever wrote).
pub(crate) async fn orphan_pass(node: Node, state: Arc<OrphanGc>) {
    let cfg = &node.inner.config;
    let root = format!("data/{}/", cfg.node_id);
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
                if let Some(epoch) = epoch_of(&key).filter(|e| *e < cfg.node_epoch) {
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
        let now = now_ms();
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

/// Drops waiter channels nobody listens on any more.
pub(crate) async fn waiter_pass(node: Node) {
    node.inner.waiters.sweep();
}

/// Releases streams idle for `idle_release`: flushes them into committed objects and drops their
/// engine state, so memory follows the active set, not the number of streams ever written.
/// Works in batches of up to `IDLE_BATCH` streams, one flush and one metadata row each, until no
/// idle stream is left: one batch per pass capped release at ~800 streams a second, below the
/// churn of a busy node. Stops at a failed flush or metadata write (the next pass retries).
pub(crate) async fn idle_pass(node: Node, pending: Arc<IdleRelease>) {
    let cutoff = now_ms() - node.inner.config.idle_release.as_millis() as i64;
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

/// Streams released per idle batch (bounds one batch's work and its metadata row).
const IDLE_BATCH: usize = 4096;

#[cfg(test)]
mod tests {
    use super::{
        IdleRelease, OrphanGc, expiry_pass, gc_pass, idle_pass, orphan_pass, release_streams,
        touch_pass,
    };
    use crate::api::{AppendRequest, CreateConfig, CreateRequest, ReadFrom, ReadRequest};
    use crate::config::NodeConfig;
    use crate::node::Node;
    use crate::open::OpenStream;
    use crate::testing::start_test_node;
    use bytes::Bytes;
    use futures::StreamExt;
    use pico_common::StreamName;
    use pico_common::clock::now_ms;
    use pico_metadata::{Command, Initial, StreamConfig};
    use pico_protocol::Record;
    use pico_sql::{MetaLog, MetaLogOptions};
    use s3stream::testing::SlowStorage;
    use s3stream::{EngineConfig, MemoryStorage, ObjectStorage, ObjectWal};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    /// A node on `data` with `engine`, its maintenance loops stopped: only the test's own
    /// passes run.
    async fn node_on(data: Arc<dyn ObjectStorage>, engine: EngineConfig) -> Node {
        let config = NodeConfig {
            node_epoch: 1,
            ..NodeConfig::default()
        };
        node_with(config, data, engine).await
    }

    async fn node_with(
        config: NodeConfig,
        data: Arc<dyn ObjectStorage>,
        engine: EngineConfig,
    ) -> Node {
        let meta = MetaLog::open("sqlite::memory:", MetaLogOptions::default())
            .await
            .unwrap();
        let wal = Arc::new(ObjectWal::new(
            Arc::new(MemoryStorage::new()),
            "wal".to_string(),
        ));
        let node = Node::start(config, meta, data, wal, engine).await.unwrap();
        for task in node.inner.tasks.lock().unwrap().drain(..) {
            task.abort();
        }
        node
    }

    /// Engine uploads only when asked (a flush): every object is one the test caused.
    fn uploads_on_demand() -> EngineConfig {
        EngineConfig {
            upload_interval: Duration::from_secs(3600),
            ..EngineConfig::default()
        }
    }

    fn name(n: &str) -> StreamName {
        StreamName::parse(n).unwrap()
    }

    async fn append_one(node: &Node, n: &str) {
        node.append(AppendRequest {
            name: name(n),
            records: vec![Record::from_value("x")],
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        })
        .await
        .unwrap();
    }

    /// Creates `count` streams and appends a record to each (which opens it); returns their ids.
    async fn open_streams(node: &Node, prefix: &str, count: usize) -> Vec<u64> {
        let mut ids = Vec::new();
        for i in 0..count {
            let n = format!("{prefix}{i}");
            let created = node
                .create(CreateRequest {
                    name: name(&n),
                    config: CreateConfig::default(),
                    initial: vec![],
                })
                .await
                .unwrap();
            append_one(node, &n).await;
            ids.push(created.info.stream_id);
        }
        ids
    }

    /// Same, many at once.
    async fn open_many(node: &Node, prefix: &str, count: usize) {
        futures::stream::iter(0..count)
            .for_each_concurrent(256, |i| async move {
                let n = format!("{prefix}{i}");
                let create = CreateRequest {
                    name: name(&n),
                    config: CreateConfig::default(),
                    initial: vec![],
                };
                node.create(create).await.unwrap();
                append_one(node, &n).await;
            })
            .await;
    }

    fn opens(node: &Node, ids: &[u64]) -> Vec<Arc<OpenStream>> {
        ids.iter()
            .map(|id| node.inner.open.get(*id).expect("stream open"))
            .collect()
    }

    /// How many of `ids` the metadata still has an owner for.
    fn owned(node: &Node, ids: &[u64]) -> usize {
        let view = node.inner.meta.view();
        ids.iter()
            .filter(|id| view.streams.get(id).is_some_and(|m| m.owner.is_some()))
            .count()
    }

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
                    now_ms: now_ms(),
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
                now_ms: now_ms(),
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
        orphan_pass(node.clone(), state.clone()).await;
        assert_eq!((listed(3), listed(4), listed(5)), (3, 2, 1));
        let left = stored();
        assert_eq!(
            left.len(),
            4,
            "committed, in flight, one failed delete: {left:?}"
        );

        orphan_pass(node.clone(), state.clone()).await;
        assert_eq!(listed(4), 2, "second pass listed keys of a cleaned epoch");
        assert_eq!(listed(5), 1, "second pass listed the current epoch");
        assert_eq!(listed(3), 3 + 2, "epoch 3 retried on its own");
        let left = stored();
        assert_eq!(
            left,
            [key("3/committed"), key("4/committed"), key("5/in-flight")]
        );

        orphan_pass(node.clone(), state).await;
        assert_eq!(
            (listed(3), listed(4), listed(5)),
            (5, 2, 1),
            "nothing left to list"
        );
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
        let now = now_ms();
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
