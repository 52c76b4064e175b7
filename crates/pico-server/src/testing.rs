//! Helpers for tests in this and other crates: a real node on in-memory storage and SQLite.

use crate::config::NodeConfig;
use crate::node::Node;
use pico_sql::{MetaLog, MetaLogOptions};
use s3stream::{EngineConfig, MemoryStorage, ObjectStorage, ObjectWal, Wal};
use std::sync::Arc;
use std::time::Duration;

/// A node on in-memory object storage and an in-memory SQLite metadata log.
pub async fn start_test_node() -> Node {
    start_test_node_with(NodeConfig {
        long_poll_timeout: Duration::from_millis(500),
        ..NodeConfig::default()
    })
    .await
}

/// Same, with a given node config (node_epoch 0 is replaced by 1).
pub async fn start_test_node_with(config: NodeConfig) -> Node {
    let wal_store: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    start_test_node_with_wal(config, Arc::new(ObjectWal::new(wal_store, "wal".into()))).await
}

/// Same, on the given WAL (a test's [`s3stream::testing::FaultWal`], say).
pub async fn start_test_node_with_wal(config: NodeConfig, wal: Arc<dyn Wal>) -> Node {
    start_test_node_on(config, wal, EngineConfig::default()).await
}

/// Same, with the engine's settings too.
pub async fn start_test_node_on(
    mut config: NodeConfig,
    wal: Arc<dyn Wal>,
    engine: EngineConfig,
) -> Node {
    if config.node_epoch == 0 {
        config.node_epoch = 1;
    }
    let opts = MetaLogOptions {
        clock: config.clock.clone(),
        ..MetaLogOptions::default()
    };
    let meta = MetaLog::open("sqlite::memory:", opts)
        .await
        .expect("test metadata log");
    let data: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    Node::start(config, meta, data, wal, engine)
        .await
        .expect("test node")
}

/// Another node in the test: its id, epoch and advertised address.
pub const OTHER_NODE: (u32, u64, &str) = (2, 7, "http://10.0.0.2:4437");

/// Registers [`OTHER_NODE`] and opens the existing stream `name` on it, as that node's first
/// request would: `node` then sees the stream owned elsewhere. If `node` has it open, `node`
/// releases it first (as its idle pass would): only a released stream opens elsewhere. Returns
/// the stream's id and the epoch it was opened at (for a later `ReleaseStream`). Registers the
/// other node only once.
pub async fn open_on_other_node(node: &Node, name: &str) -> (u64, i64) {
    use pico_metadata::{Command, Outcome};
    let (node_id, node_epoch, address) = OTHER_NODE;
    let meta = node.meta();
    if meta.view().nodes.get(&node_id).map(|n| n.epoch) != Some(node_epoch) {
        meta.propose(Command::RegisterNode {
            node_id,
            node_epoch,
            address: address.into(),
            now_ms: 1,
        })
        .await
        .expect("metadata log")
        .expect("other node registered");
    }
    let stream_id = meta
        .view()
        .registry
        .get(name)
        .expect("the stream exists")
        .stream_id;
    let mine: Vec<_> = node
        .inner
        .open
        .all()
        .into_iter()
        .filter(|o| o.stream_id == stream_id)
        .collect();
    if !mine.is_empty() {
        assert!(
            crate::maintenance::release_now(node, mine).await,
            "`{name}` could not be released here"
        );
    }
    let opened = meta
        .propose(Command::OpenStream {
            stream_id,
            node_id,
            node_epoch,
        })
        .await
        .expect("metadata log");
    match opened {
        Ok(Outcome::Opened { epoch, .. }) => (stream_id, epoch),
        other => panic!("the other node could not open `{name}`: {other:?}"),
    }
}

/// [`OTHER_NODE`] releases the stream it opened with [`open_on_other_node`], as its idle
/// release would.
pub async fn release_on_other_node(node: &Node, stream_id: u64, epoch: i64) {
    let (node_id, node_epoch, _) = OTHER_NODE;
    node.meta()
        .propose(pico_metadata::Command::ReleaseStream {
            stream_id,
            epoch,
            node_id,
            node_epoch,
        })
        .await
        .expect("metadata log")
        .expect("other node released the stream");
}

/// The node currently owning stream `stream_id`, per the metadata view.
pub fn owner_of(node: &Node, stream_id: u64) -> Option<u32> {
    node.meta()
        .view()
        .streams
        .get(&stream_id)
        .and_then(|s| s.owner.map(|o| o.node_id))
}

/// Every record of `name` as read on `node` (one read from offset 0).
pub async fn read_records(node: &Node, name: &str) -> Vec<crate::ReadRecord> {
    node.read(crate::ReadRequest {
        name: pico_common::StreamName::parse(name).unwrap(),
        from: crate::ReadFrom::Offset(0),
        max_records: None,
        max_bytes: None,
        touch: false,
    })
    .await
    .unwrap()
    .records
}

/// [`read_records`] as `(offset, value)`.
pub async fn read_values(node: &Node, name: &str) -> Vec<(u64, bytes::Bytes)> {
    let records = read_records(node, name).await;
    records
        .into_iter()
        .map(|r| (r.offset, r.record.value))
        .collect()
}

/// [`read_values`], each value parsed as JSON.
pub async fn read_json(node: &Node, name: &str) -> Vec<serde_json::Value> {
    let values = read_values(node, name).await;
    values
        .iter()
        .map(|(_, v)| serde_json::from_slice(v).unwrap())
        .collect()
}
