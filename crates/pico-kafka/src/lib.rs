//! PicoMQ Kafka facade: the Kafka wire protocol over the node's streams. It only translates;
//! streams, offsets, durability and long-poll waits live in `pico-server`. The codec is the
//! `kafka-protocol` crate, guarded by [`validate`] so no request can make it allocate more than
//! the request's own bytes back.
//!
//! - [`conn`]: the listener and one task per connection: frames, limits, pipelined Produce,
//!   in-order replies.
//! - [`validate`]: the structural pass every request passes before it is decoded.
//! - [`versions`]: the APIs and versions this listener serves (ApiVersions).
//! - [`broker`]: decoding, dispatch and response encoding.
//! - [`cluster`]: brokers (the live nodes' Kafka addresses), partition leaders (stream
//!   owners), DescribeCluster.
//! - [`topics`]: topic ↔ stream naming, Metadata and topic administration.
//! - [`produce`]: Produce, with idempotent producers ([`producers`]).
//! - [`fetch`]: Fetch (long-poll through the node's wait primitive) and ListOffsets.
//! - [`groups`]: the group coordinator (classic protocol) and committed offsets in the
//!   metadata KV.

pub mod broker;
pub mod cluster;
pub mod conn;
pub mod fetch;
pub mod groups;
pub mod produce;
pub mod producers;
pub mod topics;
pub mod validate;
pub mod versions;

pub use broker::Broker;
pub use conn::serve;

/// Listener settings.
#[derive(Debug, Clone)]
pub struct KafkaOptions {
    /// This node's broker id in Metadata and FindCoordinator answers.
    pub broker_id: i32,
    /// Host clients connect to (Metadata's broker address).
    pub advertised_host: String,
    pub advertised_port: i32,
    /// Largest request frame accepted (bytes); larger closes the connection.
    pub max_frame: usize,
    /// Largest frame of any request but Produce.
    pub max_small_frame: usize,
    /// Most connections served at once; more wait in the accept queue.
    pub max_connections: usize,
    /// Most requests of one connection read and not yet answered: Produce requests are
    /// pipelined (the next is read while earlier ones wait for their writes).
    pub max_in_flight: usize,
    /// Most request bytes of one connection read and not yet answered (a larger request
    /// takes the whole budget).
    pub max_in_flight_bytes: usize,
    /// Cluster id reported in Metadata.
    pub cluster_id: String,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        KafkaOptions {
            broker_id: 0,
            advertised_host: "127.0.0.1".into(),
            advertised_port: 9092,
            max_frame: 100 << 20,
            max_small_frame: 1 << 20,
            max_connections: 10_000,
            max_in_flight: 8,
            max_in_flight_bytes: 16 << 20,
            cluster_id: "picomq".into(),
        }
    }
}
