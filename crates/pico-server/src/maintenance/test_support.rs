//! Shared setup for the maintenance loops' tests: nodes whose loops are stopped, so only a
//! test's own passes run, and helpers that create, open and count streams.

pub(super) use crate::api::{AppendRequest, CreateConfig, CreateRequest, ReadFrom, ReadRequest};
pub(super) use crate::config::NodeConfig;
pub(super) use crate::node::Node;
pub(super) use crate::open::OpenStream;
pub(super) use crate::testing::start_test_node;
pub(super) use bytes::Bytes;
pub(super) use futures::StreamExt;
pub(super) use pico_common::StreamName;
pub(super) use pico_common::clock::now_ms;
pub(super) use pico_metadata::{Command, Initial, StreamConfig};
pub(super) use pico_protocol::Record;
pub(super) use pico_sql::{MetaLog, MetaLogOptions};
pub(super) use s3stream::testing::SlowStorage;
pub(super) use s3stream::{EngineConfig, MemoryStorage, ObjectStorage, ObjectWal};
pub(super) use std::sync::Arc;
pub(super) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
pub(super) use std::time::Duration;

/// A node on `data` with `engine`, its maintenance loops stopped: only the test's own
/// passes run.
pub(super) async fn node_on(data: Arc<dyn ObjectStorage>, engine: EngineConfig) -> Node {
    let config = NodeConfig {
        node_epoch: 1,
        ..NodeConfig::default()
    };
    node_with(config, data, engine).await
}

pub(super) async fn node_with(
    config: NodeConfig,
    data: Arc<dyn ObjectStorage>,
    engine: EngineConfig,
) -> Node {
    let opts = MetaLogOptions {
        clock: config.clock.clone(),
        ..MetaLogOptions::default()
    };
    let meta = MetaLog::open("sqlite::memory:", opts).await.unwrap();
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
pub(super) fn uploads_on_demand() -> EngineConfig {
    EngineConfig {
        upload_interval: Duration::from_secs(3600),
        ..EngineConfig::default()
    }
}

pub(super) fn name(n: &str) -> StreamName {
    StreamName::parse(n).unwrap()
}

pub(super) async fn append_one(node: &Node, n: &str) {
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
pub(super) async fn open_streams(node: &Node, prefix: &str, count: usize) -> Vec<u64> {
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
pub(super) async fn open_many(node: &Node, prefix: &str, count: usize) {
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

pub(super) fn opens(node: &Node, ids: &[u64]) -> Vec<Arc<OpenStream>> {
    ids.iter()
        .map(|id| node.inner.open.get(*id).expect("stream open"))
        .collect()
}

/// How many of `ids` the metadata still has an owner for.
pub(super) fn owned(node: &Node, ids: &[u64]) -> usize {
    let view = node.inner.meta.view();
    ids.iter()
        .filter(|id| view.streams.get(id).is_some_and(|m| m.owner.is_some()))
        .count()
}

/// Two nodes (ids 1 and 2, advertised at ports 4001 and 4002, epochs 11 and 12) on one
/// metadata log and one bucket, on `clock`, their loops stopped. Node 1 started first.
pub(crate) async fn two_nodes(clock: &Arc<pico_common::clock::ManualClock>) -> (Node, Node) {
    two_nodes_with(clock, |_| Parts::default()).await
}

/// [`two_nodes`], each started with `parts(id)`.
pub(crate) async fn two_nodes_with(
    clock: &Arc<pico_common::clock::ManualClock>,
    parts: impl Fn(u32) -> Parts,
) -> (Node, Node) {
    let meta = MetaLog::open(
        "sqlite::memory:",
        MetaLogOptions {
            clock: clock.clone(),
            ..MetaLogOptions::default()
        },
    )
    .await
    .unwrap();
    let data: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let mut nodes = Vec::new();
    for id in [1u32, 2] {
        let url = format!("http://127.0.0.1:{}", 4000 + id);
        let epoch = 10 + u64::from(id);
        nodes.push(process_with(&meta, &data, clock, (id, epoch, &url), parts(id)).await);
    }
    let b = nodes.pop().unwrap();
    let a = nodes.pop().unwrap();
    (a, b)
}

/// What a test process runs on besides the shared log and bucket.
#[derive(Default)]
pub(crate) struct Parts {
    /// Its WAL; `None`: one of its own, in memory.
    pub wal: Option<Arc<dyn s3stream::Wal>>,
    pub engine: EngineConfig,
    /// How it opens other nodes' WALs (failover).
    pub peer_wals: Option<Arc<dyn crate::config::PeerWals>>,
}

/// A process of node `id` at `epoch` on `meta` and `data` (a WAL of its own), on `clock`, its
/// loops stopped; a 10 s maintenance lease.
pub(crate) async fn process_on(
    meta: &MetaLog,
    data: &Arc<dyn ObjectStorage>,
    clock: &Arc<pico_common::clock::ManualClock>,
    id: u32,
    epoch: u64,
    url: &str,
) -> Node {
    process_with(meta, data, clock, (id, epoch, url), Parts::default()).await
}

/// [`process_on`] with its `parts`; `who` is `(id, epoch, advertised URL)`.
pub(crate) async fn process_with(
    meta: &MetaLog,
    data: &Arc<dyn ObjectStorage>,
    clock: &Arc<pico_common::clock::ManualClock>,
    (id, epoch, url): (u32, u64, &str),
    parts: Parts,
) -> Node {
    let config = NodeConfig {
        node_id: id,
        node_epoch: epoch,
        advertised_url: url.to_string(),
        clock: clock.clone(),
        lease_ttl: Duration::from_secs(10),
        peer_wals: parts.peer_wals,
        ..NodeConfig::default()
    };
    let wal = parts.wal.unwrap_or_else(|| {
        Arc::new(ObjectWal::new(
            Arc::new(MemoryStorage::new()),
            "wal".to_string(),
        ))
    });
    let node = Node::start(config, meta.clone(), data.clone(), wal, parts.engine)
        .await
        .unwrap();
    for task in node.inner.tasks.lock().unwrap().drain(..) {
        task.abort();
    }
    node
}
