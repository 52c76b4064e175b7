//! [`LogStore`] on SQLite: WAL journal and `synchronous=FULL`, so an acknowledged row survives
//! `kill -9` and power loss.

use crate::error::MetaError;
use crate::store::{LogRow, LogStore, SnapshotMeta};
use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use std::str::FromStr;
use std::time::Duration;

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS meta_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        payload BLOB NOT NULL,
        count INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta_snapshot (
        applied_index INTEGER PRIMARY KEY,
        last_row_id INTEGER NOT NULL,
        payload BLOB NOT NULL,
        created_at_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta_lease (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL)",
];

pub struct SqliteStore {
    pool: SqlitePool,
}

impl SqliteStore {
    /// Opens `sqlite:<path>` / `sqlite://<path>` (creating file and parent dir) or
    /// `sqlite::memory:`, and creates the tables.
    pub async fn open(url: &str) -> Result<SqliteStore, MetaError> {
        let path = url
            .strip_prefix("sqlite://")
            .or_else(|| url.strip_prefix("sqlite:"))
            .ok_or_else(|| MetaError::BadUrl(format!("expected sqlite:…: url=`{url}`")))?;
        let path = path.split('?').next().unwrap_or("");
        let memory = path.is_empty() || path == ":memory:" || url.contains("mode=memory");
        let mut opts = SqliteConnectOptions::from_str(url)
            .map_err(|e| MetaError::BadUrl(format!("{e}: url=`{url}`")))?
            .busy_timeout(Duration::from_secs(10));
        let pool_opts = if memory {
            // Each connection to `:memory:` is its own database: keep exactly one, forever.
            SqlitePoolOptions::new()
                .max_connections(1)
                .min_connections(1)
                .idle_timeout(None)
                .max_lifetime(None)
        } else {
            if let Some(parent) = std::path::Path::new(path).parent()
                && !parent.as_os_str().is_empty()
            {
                std::fs::create_dir_all(parent)
                    .map_err(|e| MetaError::Io(format!("create {}: {e}", parent.display())))?;
            }
            opts = opts
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full);
            SqlitePoolOptions::new().max_connections(4)
        }
        // A connection to a local file does not go stale the way a network one does; sqlx's
        // check on every acquire was a round trip to the connection's worker thread per query.
        .test_before_acquire(false);
        let pool = pool_opts
            .connect_with(opts)
            .await
            .map_err(MetaError::store("connect"))?;
        for stmt in SCHEMA {
            sqlx::query(stmt)
                .execute(&pool)
                .await
                .map_err(MetaError::store("create tables"))?;
        }
        Ok(SqliteStore { pool })
    }

    /// The underlying pool (tests and tooling inspect tables through it).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

#[async_trait]
impl LogStore for SqliteStore {
    async fn append(&self, payload: &[u8], count: u32, now_ms: i64) -> Result<i64, MetaError> {
        let r =
            sqlx::query("INSERT INTO meta_log (payload, count, created_at_ms) VALUES (?, ?, ?)")
                .bind(payload)
                .bind(i64::from(count))
                .bind(now_ms)
                .execute(&self.pool)
                .await
                .map_err(MetaError::store("append"))?;
        Ok(r.last_insert_rowid())
    }

    async fn read_after(&self, after_id: i64, limit: u32) -> Result<Vec<LogRow>, MetaError> {
        let rows =
            sqlx::query("SELECT id, payload, count FROM meta_log WHERE id > ? ORDER BY id LIMIT ?")
                .bind(after_id)
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await
                .map_err(MetaError::store("read log"))?;
        rows.into_iter()
            .map(|r| {
                let id: i64 = r.try_get("id").map_err(MetaError::store("read log id"))?;
                // A payload of the wrong SQL type is corruption of that row, not a store failure.
                let payload: Vec<u8> = r.try_get("payload").map_err(|e| MetaError::BadRow {
                    row_id: id,
                    reason: format!("payload: {e}"),
                })?;
                let count: i64 = r.try_get("count").map_err(|e| MetaError::BadRow {
                    row_id: id,
                    reason: format!("count: {e}"),
                })?;
                Ok(LogRow { id, payload, count })
            })
            .collect()
    }

    async fn snapshots(&self) -> Result<Vec<SnapshotMeta>, MetaError> {
        let rows = sqlx::query(
            "SELECT applied_index, last_row_id FROM meta_snapshot ORDER BY applied_index DESC",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(MetaError::store("list snapshots"))?;
        rows.into_iter()
            .map(|r| {
                let applied_index: i64 = r
                    .try_get("applied_index")
                    .map_err(MetaError::store("snapshot index"))?;
                let last_row_id: i64 = r
                    .try_get("last_row_id")
                    .map_err(MetaError::store("snapshot row id"))?;
                Ok(SnapshotMeta {
                    applied_index: applied_index as u64,
                    last_row_id,
                })
            })
            .collect()
    }

    async fn load_snapshot(&self, applied_index: u64) -> Result<Option<Vec<u8>>, MetaError> {
        // As a blob whatever its SQL type, so any damage is the decoder's to find and the
        // loader can discard the row by these bytes.
        let row = sqlx::query(
            "SELECT CAST(payload AS BLOB) AS payload FROM meta_snapshot WHERE applied_index = ?",
        )
        .bind(applied_index as i64)
        .fetch_optional(&self.pool)
        .await
        .map_err(MetaError::store("load snapshot"))?;
        row.map(|r| r.try_get::<Vec<u8>, _>("payload"))
            .transpose()
            .map_err(|e| MetaError::CorruptSnapshot(format!("applied_index={applied_index}: {e}")))
    }

    async fn discard_snapshot(
        &self,
        applied_index: u64,
        payload: &[u8],
    ) -> Result<bool, MetaError> {
        let r = sqlx::query(
            "DELETE FROM meta_snapshot WHERE applied_index = ? AND CAST(payload AS BLOB) = ?",
        )
        .bind(applied_index as i64)
        .bind(payload)
        .execute(&self.pool)
        .await
        .map_err(MetaError::store("discard snapshot"))?;
        Ok(r.rows_affected() == 1)
    }

    async fn write_snapshot(
        &self,
        meta: SnapshotMeta,
        payload: &[u8],
        keep: u32,
        now_ms: i64,
    ) -> Result<u64, MetaError> {
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(MetaError::store("begin snapshot"))?;
        sqlx::query(
            "INSERT INTO meta_snapshot (applied_index, last_row_id, payload, created_at_ms) VALUES (?, ?, ?, ?)
             ON CONFLICT (applied_index) DO UPDATE SET last_row_id = excluded.last_row_id,
               payload = excluded.payload, created_at_ms = excluded.created_at_ms",
        )
        .bind(meta.applied_index as i64)
        .bind(meta.last_row_id)
        .bind(payload)
        .bind(now_ms)
        .execute(&mut *tx)
        .await
        .map_err(MetaError::store("write snapshot"))?;
        let kept = sqlx::query("SELECT applied_index, last_row_id FROM meta_snapshot ORDER BY applied_index DESC LIMIT ?")
            .bind(i64::from(keep.max(1)))
            .fetch_all(&mut *tx)
            .await
            .map_err(MetaError::store("list snapshots"))?;
        let mut deleted = 0;
        if kept.len() as u32 == keep.max(1)
            && let Some(oldest) = kept.last()
        {
            let oldest_index: i64 = oldest
                .try_get("applied_index")
                .map_err(MetaError::store("snapshot index"))?;
            let oldest_row: i64 = oldest
                .try_get("last_row_id")
                .map_err(MetaError::store("snapshot row id"))?;
            sqlx::query("DELETE FROM meta_snapshot WHERE applied_index < ?")
                .bind(oldest_index)
                .execute(&mut *tx)
                .await
                .map_err(MetaError::store("prune snapshots"))?;
            deleted = sqlx::query("DELETE FROM meta_log WHERE id <= ?")
                .bind(oldest_row)
                .execute(&mut *tx)
                .await
                .map_err(MetaError::store("truncate log"))?
                .rows_affected();
        }
        tx.commit()
            .await
            .map_err(MetaError::store("commit snapshot"))?;
        Ok(deleted)
    }

    async fn try_acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool, MetaError> {
        let r = sqlx::query(
            "INSERT INTO meta_lease (name, holder, expires_at_ms) VALUES (?, ?, ?)
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at_ms = excluded.expires_at_ms
             WHERE meta_lease.expires_at_ms <= ? OR meta_lease.holder = excluded.holder",
        )
        .bind(name)
        .bind(holder)
        .bind(now_ms.saturating_add(ttl_ms))
        .bind(now_ms)
        .execute(&self.pool)
        .await
        .map_err(MetaError::store("acquire lease"))?;
        Ok(r.rows_affected() == 1)
    }

    async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool, MetaError> {
        let r = sqlx::query("UPDATE meta_lease SET expires_at_ms = ? WHERE name = ? AND holder = ? AND expires_at_ms > ?")
            .bind(now_ms.saturating_add(ttl_ms))
            .bind(name)
            .bind(holder)
            .bind(now_ms)
            .execute(&self.pool)
            .await
            .map_err(MetaError::store("renew lease"))?;
        Ok(r.rows_affected() == 1)
    }

    async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, MetaError> {
        let r = sqlx::query("DELETE FROM meta_lease WHERE name = ? AND holder = ?")
            .bind(name)
            .bind(holder)
            .execute(&self.pool)
            .await
            .map_err(MetaError::store("release lease"))?;
        Ok(r.rows_affected() == 1)
    }

    async fn lease(&self, name: &str) -> Result<Option<(String, i64)>, MetaError> {
        let row = sqlx::query("SELECT holder, expires_at_ms FROM meta_lease WHERE name = ?")
            .bind(name)
            .fetch_optional(&self.pool)
            .await
            .map_err(MetaError::store("read lease"))?;
        row.map(|r| Ok((r.try_get("holder")?, r.try_get("expires_at_ms")?)))
            .transpose()
            .map_err(MetaError::store("read lease"))
    }

    async fn close(&self) {
        self.pool.close().await;
    }
}
