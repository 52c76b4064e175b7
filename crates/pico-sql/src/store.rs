//! The storage seam: what the log needs from a SQL database: SQLite
//! ([`crate::sqlite::SqliteStore`], one node) and Postgres ([`crate::postgres::PgStore`],
//! shared by several nodes).

use crate::error::MetaError;
use crate::postgres::PgStore;
use crate::sqlite::SqliteStore;
use async_trait::async_trait;
use std::sync::Arc;

/// Opens the store a metadata URL names: `sqlite:…` or `postgres://…` / `postgresql://…`.
pub async fn open_store(url: &str) -> Result<Arc<dyn LogStore>, MetaError> {
    if url.starts_with("sqlite:") {
        Ok(Arc::new(SqliteStore::open(url).await?))
    } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(Arc::new(PgStore::open(url).await?))
    } else {
        Err(MetaError::BadUrl(format!(
            "expected sqlite:… or postgres://…: url=`{url}`"
        )))
    }
}

/// One row of `meta_log`: a batch of encoded commands.
#[derive(Debug, Clone)]
pub struct LogRow {
    pub id: i64,
    pub payload: Vec<u8>,
    pub count: i64,
}

/// Where a snapshot sits in the log (without its payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotMeta {
    pub applied_index: u64,
    /// The last log row the snapshot includes.
    pub last_row_id: i64,
}

#[async_trait]
pub trait LogStore: Send + Sync + 'static {
    /// Appends one row durably; returns its id (ids only grow, never reused). `Store`: nothing
    /// was written; `OutcomeUnknown`: the row may have been (its commit went unanswered).
    async fn append(&self, payload: &[u8], count: u32, now_ms: i64) -> Result<i64, MetaError>;
    /// Rows with id > `after_id`, ascending, at most `limit`.
    async fn read_after(&self, after_id: i64, limit: u32) -> Result<Vec<LogRow>, MetaError>;
    /// Snapshots present, newest first.
    async fn snapshots(&self) -> Result<Vec<SnapshotMeta>, MetaError>;
    /// The snapshot's whole payload, `None` if there is no row. Stored in parts, it is
    /// checked complete (all parts, the recorded length): a gap is `CorruptSnapshot`.
    async fn load_snapshot(&self, applied_index: u64) -> Result<Option<Vec<u8>>, MetaError>;
    /// Deletes the snapshot at `applied_index` if it still holds `payload` (the unreadable bytes
    /// the caller loaded; a row another writer has rewritten since is kept). Returns whether a
    /// row was deleted.
    async fn discard_snapshot(&self, applied_index: u64, payload: &[u8])
    -> Result<bool, MetaError>;
    /// Writes a snapshot (replacing a row at the same index: states at one index are equal, and
    /// the row there may be a damaged copy), keeps the newest `keep`, and deletes the log rows
    /// the oldest kept one already covers (so every kept snapshot stays replayable). Returns
    /// rows deleted.
    ///
    /// A snapshot grows with the state (past a few million streams beyond SQLite's and
    /// Postgres' 1 GB value limits), and appends wait while it holds the write lock. So an
    /// implementation writes the payload in parts first, each in its own short transaction
    /// and referenced by nothing yet, then commits the row naming them (with the prune and
    /// truncation) in one short transaction; parts of a failed attempt are deleted later.
    async fn write_snapshot(
        &self,
        meta: SnapshotMeta,
        payload: &[u8],
        keep: u32,
        now_ms: i64,
    ) -> Result<u64, MetaError>;
    /// Takes `name` if free, expired, or already held by `holder`.
    async fn try_acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool, MetaError>;
    /// Extends a lease still held (and unexpired) by `holder`.
    async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool, MetaError>;
    async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, MetaError>;
    /// Current (holder, expires_at_ms) of a lease, expired or not.
    async fn lease(&self, name: &str) -> Result<Option<(String, i64)>, MetaError>;
    /// Signalled when some node may have appended a row (Postgres: LISTEN/NOTIFY), so the
    /// tailer reads at once instead of at its next poll. `None`: poll only.
    fn appended(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }
    /// One cheap round-trip, for the reachability probe. A local store is always there.
    async fn ping(&self) -> Result<(), MetaError> {
        Ok(())
    }
    async fn close(&self);
}
