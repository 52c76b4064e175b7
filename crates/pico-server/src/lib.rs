//! The PicoMQ node: everything behind the wire facades.
//!
//! - [`api`]: request/response types of the stream service.
//! - [`error`]: one error enum per operation, each mapped to an `ErrorKind`.
//! - [`config`]: node settings.
//! - [`node`]: [`Node`], the stream service (create, fork, append, read, wait, head, delete with
//!   soft delete of forked streams, trim, list).
//! - [`open`]: streams open on this node and their writer state (lazy open, epochs).
//! - [`producers`]: idempotent producer rules and the aux codec that stores claims with the data.
//! - [`waiters`]: long-poll/SSE wake-ups, one channel per awaited stream.
//! - [`live`]: live reads for every protocol: long-poll, the live cursor, the SSE fan-out hub.
//! - [`ttl`]: sliding-TTL touches kept in memory and persisted in batches.
//! - [`stats`]: [`NodeStats`], what the admin listener shows.
//! - [`subscriptions`]: Durable Streams subscriptions (webhooks, pull-wake leases) over the
//!   metadata KV.
//! - [`catalog`]: the engine's object index and commit path over the metadata log.
//! - `maintenance/`: loops that run without a request, one file each (GC, orphans, TTL, idle release).
//! - [`testing`]: a real node on in-memory storage, for tests.

pub mod api;
pub mod catalog;
pub mod config;
pub mod error;
pub mod live;
mod maintenance;
pub mod node;
pub mod open;
pub mod producers;
pub mod stats;
pub mod subscriptions;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod ttl;
pub mod waiters;

pub use api::*;
pub use config::{NodeConfig, PeerWals};
pub use error::*;
pub use live::LongPoll;
pub use node::RawRead;
pub use node::{Admitted, ClusterNode, KvError, Node, Route, StartError, StreamEvent};
pub use node::{StreamPlacement, TransferAccepted, TransferError};
pub use stats::{EngineStats, NodeStats};
