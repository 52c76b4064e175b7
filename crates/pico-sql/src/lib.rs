//! PicoMQ metadata log on SQL. It stores and orders commands; it never interprets them beyond
//! encode/decode (that is `pico-metadata`'s `apply`).
//!
//! - [`log`]: [`MetaLog`]: group commit, the single applier task, tailing, published views,
//!   background snapshots, leases.
//! - [`store`]: the [`LogStore`] seam (log rows, snapshots, leases) a database implements.
//! - [`sqlite`]: [`SqliteStore`], the SQLite implementation (WAL, `synchronous=FULL`).
//! - [`postgres`]: [`PgStore`], the Postgres implementation (shared by every node).
//! - [`backoff`]: capped, jittered retry delays while a store is unreachable.
//! - `chunks`: reassembling and comparing chunked snapshots, the same on both backends.
//! - [`error`]: [`MetaError`], failures of the log itself.

pub mod backoff;
mod chunks;
pub mod error;
pub mod log;
pub mod postgres;
pub mod sqlite;
pub mod store;

pub use error::MetaError;
pub use log::{MetaLog, MetaLogOptions, Reachability, SnapshotStats};
pub use postgres::PgStore;
pub use sqlite::SqliteStore;
pub use store::{LogRow, LogStore, SnapshotMeta, open_store};
