//! Helpers for tests in this and other crates: a real node on in-memory storage and SQLite.

use crate::config::NodeConfig;
use crate::node::Node;
use pico_sql::{MetaLog, MetaLogOptions};
use s3stream::{EngineConfig, MemoryStorage, ObjectStorage, ObjectWal};
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
pub async fn start_test_node_with(mut config: NodeConfig) -> Node {
    if config.node_epoch == 0 {
        config.node_epoch = 1;
    }
    let meta = MetaLog::open("sqlite::memory:", MetaLogOptions::default())
        .await
        .expect("test metadata log");
    let data: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let wal_store: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let wal = Arc::new(ObjectWal::new(wal_store, "wal".to_string()));
    Node::start(config, meta, data, wal, EngineConfig::default())
        .await
        .expect("test node")
}
