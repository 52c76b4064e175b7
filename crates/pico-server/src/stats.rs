//! What the admin listener shows about a node, gathered in one call so that a facade needs
//! neither the metadata log nor the engine.

use crate::node::Node;
pub use s3stream::EngineStats;

/// A snapshot of a node's gauges and counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStats {
    /// Streams in the metadata view (the whole cluster's).
    pub streams: usize,
    /// Streams open on this node.
    pub open_streams: usize,
    /// Position of the last applied metadata command.
    pub applied_index: u64,
    /// The engine's caches, WAL and upload counters.
    pub engine: EngineStats,
}

impl Node {
    pub fn stats(&self) -> NodeStats {
        NodeStats {
            streams: self.inner.meta.view().streams.len(),
            open_streams: self.open_streams(),
            applied_index: self.ready().applied_index,
            engine: self.inner.engine.stats(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{CreateConfig, CreateRequest};
    use pico_common::StreamName;
    use pico_protocol::Record;

    #[tokio::test]
    async fn stats_count_streams_and_appends() {
        let node = crate::testing::start_test_node().await;
        let before = node.stats();
        node.create(CreateRequest {
            name: StreamName::parse("s/1").unwrap(),
            config: CreateConfig::default(),
            initial: vec![Record::from_value(b"x".to_vec())],
        })
        .await
        .unwrap();
        let after = node.stats();
        assert_eq!(after.streams, before.streams + 1);
        assert!(after.applied_index > before.applied_index);
        assert!(after.engine.appends > before.engine.appends);
    }
}
