//! [`LogStore`] on SQLite: WAL journal and `synchronous=FULL`, so an acknowledged row survives
//! `kill -9` and power loss. Snapshots are stored in chunks (see [`SNAPSHOT_CHUNK_BYTES`] and
//! `write_snapshot`): one value is capped at 1,000,000,000 bytes, and one transaction per
//! snapshot would hold the single write lock for its whole size.

use crate::chunks::{self, ChunkWriter};
use crate::error::MetaError;
use crate::store::{LogRow, LogStore, SnapshotMeta};
use async_trait::async_trait;
use sqlx::Row;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use std::collections::HashSet;
use std::path::Path;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::Duration;

const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS meta_log (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        payload BLOB NOT NULL,
        count INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL)",
    // `payload` is a chunk manifest (see `Manifest`), or the whole snapshot in rows written
    // before snapshots were chunked.
    "CREATE TABLE IF NOT EXISTS meta_snapshot (
        applied_index INTEGER PRIMARY KEY,
        last_row_id INTEGER NOT NULL,
        payload BLOB NOT NULL,
        created_at_ms INTEGER NOT NULL)",
    // One row per snapshot write attempt. AUTOINCREMENT so an id is never reused: a writer
    // whose blob was deleted under it (see `collect_garbage`) can never commit someone
    // else's chunks filed under the same id.
    "CREATE TABLE IF NOT EXISTS meta_snapshot_blob (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        created_at_ms INTEGER NOT NULL)",
    "CREATE TABLE IF NOT EXISTS meta_snapshot_chunk (
        blob_id INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (blob_id, seq))",
    "CREATE TABLE IF NOT EXISTS meta_lease (
        name TEXT PRIMARY KEY,
        holder TEXT NOT NULL,
        expires_at_ms INTEGER NOT NULL)",
];

/// Bytes per snapshot chunk: far below SQLite's 1,000,000,000-byte value limit, and small
/// enough that inserting or deleting one holds the write lock only briefly.
pub const SNAPSHOT_CHUNK_BYTES: usize = 16 << 20;
/// Upper bound for [`SqliteStore::with_snapshot_chunk_bytes`] (well inside SQLite's limit).
const MAX_SNAPSHOT_CHUNK_BYTES: usize = 256 << 20;

/// `meta_snapshot.payload` of a chunked snapshot. The leading 0xff reads as codec version 255
/// to a node predating chunks, which then leaves the row alone (a snapshot of a newer codec)
/// instead of deleting it as damaged.
const MANIFEST_MAGIC: &[u8; 8] = b"\xffPICOCHK";
const MANIFEST_LEN: usize = 8 + 8 + 8 + 4;

/// Where a chunked snapshot's bytes are: chunks `0..chunks` of `blob_id`, `len` bytes in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Manifest {
    blob_id: i64,
    len: u64,
    chunks: u32,
}

impl chunks::ReadChunk for SqliteConnection {
    async fn chunk(&mut self, blob_id: i64, seq: u64) -> Result<Option<Vec<u8>>, MetaError> {
        read_chunk(self, blob_id, u32::try_from(seq).unwrap_or(u32::MAX)).await
    }
}

impl Manifest {
    fn blob(&self) -> chunks::Blob {
        let m = self;
        chunks::Blob {
            blob_id: m.blob_id,
            len: m.len,
            chunks: u64::from(m.chunks),
        }
    }
}

impl Manifest {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(MANIFEST_LEN);
        out.extend_from_slice(MANIFEST_MAGIC);
        out.extend_from_slice(&self.blob_id.to_le_bytes());
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.chunks.to_le_bytes());
        out
    }

    fn decode(bytes: &[u8]) -> Option<Manifest> {
        let rest = bytes.strip_prefix(MANIFEST_MAGIC)?;
        if bytes.len() != MANIFEST_LEN {
            return None;
        }
        let (blob_id, rest) = rest.split_first_chunk::<8>()?;
        let (len, rest) = rest.split_first_chunk::<8>()?;
        let (chunks, _) = rest.split_first_chunk::<4>()?;
        Some(Manifest {
            blob_id: i64::from_le_bytes(*blob_id),
            len: u64::from_le_bytes(*len),
            chunks: u32::from_le_bytes(*chunks),
        })
    }
}

/// Selects `meta_snapshot` rows whose payload may be a manifest; `typeof` and `length` of a
/// blob do not read it, so legacy single-blob rows are not loaded.
const SELECT_MANIFESTS: &str = "SELECT applied_index, payload FROM meta_snapshot
     WHERE typeof(payload) = 'blob' AND length(payload) = ?";

/// The chunked snapshots present: (applied_index, manifest).
async fn manifests(conn: &mut SqliteConnection) -> Result<Vec<(u64, Manifest)>, MetaError> {
    let rows = sqlx::query(SELECT_MANIFESTS)
        .bind(MANIFEST_LEN as i64)
        .fetch_all(&mut *conn)
        .await
        .map_err(MetaError::store("list snapshot manifests"))?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let index: i64 = r
            .try_get("applied_index")
            .map_err(MetaError::store("snapshot index"))?;
        let payload: Vec<u8> = r
            .try_get("payload")
            .map_err(MetaError::store("snapshot manifest"))?;
        if let Some(m) = Manifest::decode(&payload) {
            out.push((index as u64, m));
        }
    }
    Ok(out)
}

/// The manifest of the snapshot at `applied_index`: `None` if there is no row,
/// `Some(None)` if it is a single-blob (or damaged) row.
async fn manifest_at(
    conn: &mut SqliteConnection,
    applied_index: u64,
) -> Result<Option<Option<Manifest>>, MetaError> {
    let row = sqlx::query(
        "SELECT CASE WHEN typeof(payload) = 'blob' AND length(payload) = ? THEN payload END
           AS manifest
         FROM meta_snapshot WHERE applied_index = ?",
    )
    .bind(MANIFEST_LEN as i64)
    .bind(applied_index as i64)
    .fetch_optional(&mut *conn)
    .await
    .map_err(MetaError::store("read snapshot manifest"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let manifest: Option<Vec<u8>> = row
        .try_get("manifest")
        .map_err(MetaError::store("read snapshot manifest"))?;
    Ok(Some(manifest.as_deref().and_then(Manifest::decode)))
}

/// Chunk `seq` of `blob_id`, `None` if absent.
async fn read_chunk(
    conn: &mut SqliteConnection,
    blob_id: i64,
    seq: u32,
) -> Result<Option<Vec<u8>>, MetaError> {
    let row = sqlx::query(
        "SELECT CAST(data AS BLOB) AS data FROM meta_snapshot_chunk WHERE blob_id = ? AND seq = ?",
    )
    .bind(blob_id)
    .bind(i64::from(seq))
    .fetch_optional(&mut *conn)
    .await
    .map_err(MetaError::store("read snapshot chunk"))?;
    row.map(|r| r.try_get::<Vec<u8>, _>("data"))
        .transpose()
        .map_err(|e| MetaError::CorruptSnapshot(format!("blob_id={blob_id} seq={seq}: {e}")))
}

pub struct SqliteStore {
    pool: SqlitePool,
    chunk_bytes: usize,
    /// Blobs of this store's failed snapshot writes: their chunks go at the next attempt.
    failed_blobs: Mutex<Vec<i64>>,
}

/// Connect attempts that met a locked database (at most about 9 s in all).
const CONNECT_BUSY_RETRIES: u64 = 50;

/// SQLITE_BUSY, or one of its extended codes.
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|c| c.parse::<i32>().ok())
        .is_some_and(|c| c & 0xff == 5)
}

impl SqliteStore {
    /// Opens `sqlite:<path>` / `sqlite://<path>` (creating file and parent dirs) or
    /// `sqlite::memory:`, creates the tables, and deletes the chunks of snapshot writes that
    /// never committed.
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
            if let Some(parent) = Path::new(path).parent()
                && !parent.as_os_str().is_empty()
            {
                pico_common::fs::create_dir_durably(parent)
                    .map_err(|e| MetaError::Io(format!("create {}: {e}", parent.display())))?;
            }
            // SQLite syncs the database's own directory when it creates the WAL file there.
            opts = opts
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Full);
            SqlitePoolOptions::new().max_connections(4)
        }
        // A connection to a local file does not go stale the way a network one does; sqlx's
        // check on every acquire was a round trip to the connection's worker thread per query.
        .test_before_acquire(false);
        // Processes opening a fresh file at once race to switch it to WAL mode, and that switch
        // answers SQLITE_BUSY at once instead of waiting on the busy handler: retry, bounded.
        let mut attempt: u64 = 0;
        let pool = loop {
            match pool_opts.clone().connect_with(opts.clone()).await {
                Ok(pool) => break pool,
                Err(e) if attempt < CONNECT_BUSY_RETRIES && is_busy(&e) => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20 * attempt.min(10))).await;
                }
                Err(e) => return Err(MetaError::store("connect")(e)),
            }
        };
        for stmt in SCHEMA {
            sqlx::query(stmt)
                .execute(&pool)
                .await
                .map_err(MetaError::store("create tables"))?;
        }
        let store = SqliteStore {
            pool,
            chunk_bytes: SNAPSHOT_CHUNK_BYTES,
            failed_blobs: Mutex::new(Vec::new()),
        };
        // Garbage only costs space: a failure here must not keep the log from opening.
        if let Err(e) = store.collect_garbage(None).await {
            tracing::warn!(error = %e, "could not delete unreferenced metadata snapshot chunks");
        }
        Ok(store)
    }

    /// Sets the size of the chunks later snapshots are stored in (clamped to 1 B..=256 MiB;
    /// default [`SNAPSHOT_CHUNK_BYTES`]). Snapshots already stored keep their chunks.
    pub fn with_snapshot_chunk_bytes(mut self, bytes: usize) -> SqliteStore {
        self.chunk_bytes = bytes.clamp(1, MAX_SNAPSHOT_CHUNK_BYTES);
        self
    }

    /// The underlying pool (tests and tooling inspect tables through it).
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }
}

impl ChunkWriter for SqliteStore {
    fn failed_blobs(&self) -> std::sync::MutexGuard<'_, Vec<i64>> {
        self.failed_blobs
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn chunk_bytes(&self) -> usize {
        self.chunk_bytes
    }

    /// Deletes the blobs no snapshot row references (only those in `only`, if given) and then
    /// every chunk whose blob is gone. At open this also takes blobs another process is still
    /// writing; that write then fails its completeness check and is retried at its next due
    /// point, which is harmless.
    async fn collect_garbage(&self, only: Option<&[i64]>) -> Result<(), MetaError> {
        // IMMEDIATE: the write lock before the read, so no snapshot commits a reference to a
        // blob between this read and the delete.
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(MetaError::store("begin snapshot cleanup"))?;
        let referenced: HashSet<i64> = manifests(&mut tx)
            .await?
            .into_iter()
            .map(|(_, m)| m.blob_id)
            .collect();
        let candidates: Vec<i64> = match only {
            Some(ids) => ids.to_vec(),
            None => sqlx::query_scalar("SELECT id FROM meta_snapshot_blob")
                .fetch_all(&mut *tx)
                .await
                .map_err(MetaError::store("list snapshot blobs"))?,
        };
        for id in candidates.into_iter().filter(|id| !referenced.contains(id)) {
            sqlx::query("DELETE FROM meta_snapshot_blob WHERE id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(MetaError::store("delete snapshot blob"))?;
        }
        tx.commit()
            .await
            .map_err(MetaError::store("commit snapshot cleanup"))?;
        self.delete_orphan_chunks().await
    }

    /// Deletes the chunks whose blob is gone, one per transaction: freeing a chunk walks all of
    /// its pages, which must not hold the write lock for a whole snapshot's size. Blob ids are
    /// never reused, so an orphan stays one.
    async fn delete_orphan_chunks(&self) -> Result<(), MetaError> {
        let orphans: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT blob_id, seq FROM meta_snapshot_chunk
             WHERE blob_id NOT IN (SELECT id FROM meta_snapshot_blob)",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(MetaError::store("list orphan snapshot chunks"))?;
        for (blob_id, seq) in orphans {
            sqlx::query("DELETE FROM meta_snapshot_chunk WHERE blob_id = ? AND seq = ?")
                .bind(blob_id)
                .bind(seq)
                .execute(&self.pool)
                .await
                .map_err(MetaError::store("delete snapshot chunk"))?;
        }
        Ok(())
    }

    async fn register_blob(&self, now_ms: i64) -> Result<i64, MetaError> {
        Ok(
            sqlx::query("INSERT INTO meta_snapshot_blob (created_at_ms) VALUES (?)")
                .bind(now_ms)
                .execute(&self.pool)
                .await
                .map_err(MetaError::store("register snapshot blob"))?
                .last_insert_rowid(),
        )
    }

    /// Writes `payload` as chunks of a new blob, each in its own short transaction (nothing
    /// references them yet), then commits the snapshot row in one short transaction.
    async fn write_chunked(
        &self,
        blob_id: i64,
        meta: SnapshotMeta,
        payload: &[u8],
        keep: u32,
        now_ms: i64,
    ) -> Result<u64, MetaError> {
        let mut chunks: u32 = 0;
        for chunk in payload.chunks(self.chunk_bytes) {
            sqlx::query("INSERT INTO meta_snapshot_chunk (blob_id, seq, data) VALUES (?, ?, ?)")
                .bind(blob_id)
                .bind(i64::from(chunks))
                .bind(chunk)
                .execute(&self.pool)
                .await
                .map_err(MetaError::store("write snapshot chunk"))?;
            chunks = chunks.checked_add(1).ok_or_else(|| MetaError::Store {
                op: "write snapshot",
                message: format!("too many chunks: bytes={}", payload.len()),
            })?;
        }
        let manifest = Manifest {
            blob_id,
            len: payload.len() as u64,
            chunks,
        };

        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(MetaError::store("begin snapshot"))?;
        // The blob may have been collected under this write (another process's cleanup at
        // open): never commit a reference to incomplete chunks.
        let (registered, stored_chunks, stored_bytes): (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT COUNT(*) FROM meta_snapshot_blob WHERE id = ?1),
                    COUNT(*), COALESCE(SUM(LENGTH(data)), 0)
             FROM meta_snapshot_chunk WHERE blob_id = ?1",
        )
        .bind(blob_id)
        .fetch_one(&mut *tx)
        .await
        .map_err(MetaError::store("check snapshot chunks"))?;
        if registered != 1
            || stored_chunks != i64::from(chunks)
            || stored_bytes as u64 != manifest.len
        {
            return Err(MetaError::Store {
                op: "write snapshot",
                message: format!(
                    "chunks incomplete at commit (collected under the write?): blob_id={blob_id} \
                     registered={registered} chunks={stored_chunks}/{chunks} \
                     bytes={stored_bytes}/{}",
                    manifest.len
                ),
            });
        }
        let present = manifests(&mut tx).await?;
        // Blobs whose snapshot row this transaction replaces or prunes.
        let mut freed: Vec<i64> = present
            .iter()
            .filter(|(index, _)| *index == meta.applied_index)
            .map(|(_, m)| m.blob_id)
            .collect();
        sqlx::query(
            "INSERT INTO meta_snapshot (applied_index, last_row_id, payload, created_at_ms) VALUES (?, ?, ?, ?)
             ON CONFLICT (applied_index) DO UPDATE SET last_row_id = excluded.last_row_id,
               payload = excluded.payload, created_at_ms = excluded.created_at_ms",
        )
        .bind(meta.applied_index as i64)
        .bind(meta.last_row_id)
        .bind(manifest.encode())
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
            freed.extend(
                present
                    .iter()
                    .filter(|(index, _)| (*index as i64) < oldest_index)
                    .map(|(_, m)| m.blob_id),
            );
            // The new row may be the one pruned (a writer behind two newer snapshots).
            if (meta.applied_index as i64) < oldest_index {
                freed.push(blob_id);
            }
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
        // Only the blob rows here: their chunks are deleted after the commit, outside this
        // transaction (see `delete_orphan_chunks`).
        for id in freed {
            sqlx::query("DELETE FROM meta_snapshot_blob WHERE id = ?")
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(MetaError::store("free snapshot blob"))?;
        }
        tx.commit()
            .await
            .map_err(MetaError::store("commit snapshot"))?;
        Ok(deleted)
    }
}

impl SqliteStore {
    async fn load_chunked(
        conn: &mut SqliteConnection,
        applied_index: u64,
        m: Manifest,
    ) -> Result<Vec<u8>, MetaError> {
        chunks::assemble(applied_index, m.blob(), conn).await
    }

    /// Whether the chunks of `m` hold exactly `payload` (compared a chunk at a time).
    async fn chunks_equal(
        conn: &mut SqliteConnection,
        m: Manifest,
        payload: &[u8],
    ) -> Result<bool, MetaError> {
        Ok(chunks::equals(m.blob(), payload, conn).await)
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
        // One read transaction: the row and its chunks as of one moment (a concurrent prune
        // cannot delete chunks halfway through).
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(MetaError::store("begin load snapshot"))?;
        match manifest_at(&mut tx, applied_index).await? {
            None => Ok(None),
            Some(Some(m)) => SqliteStore::load_chunked(&mut tx, applied_index, m)
                .await
                .map(Some),
            Some(None) => {
                // A single-blob row: as a blob whatever its SQL type, so any damage is the
                // decoder's to find and the loader can discard the row by these bytes.
                let row = sqlx::query(
                    "SELECT CAST(payload AS BLOB) AS payload FROM meta_snapshot WHERE applied_index = ?",
                )
                .bind(applied_index as i64)
                .fetch_optional(&mut *tx)
                .await
                .map_err(MetaError::store("load snapshot"))?;
                row.map(|r| r.try_get::<Vec<u8>, _>("payload"))
                    .transpose()
                    .map_err(|e| {
                        MetaError::CorruptSnapshot(format!("applied_index={applied_index}: {e}"))
                    })
            }
        }
    }

    async fn discard_snapshot(
        &self,
        applied_index: u64,
        payload: &[u8],
    ) -> Result<bool, MetaError> {
        // Compared in a read transaction, deleted in a short write one: a blob's chunks never
        // change and its id is never reused, so a row still naming the same manifest still
        // holds the bytes compared.
        let manifest = {
            let mut tx = self
                .pool
                .begin()
                .await
                .map_err(MetaError::store("begin discard snapshot"))?;
            let m = match manifest_at(&mut tx, applied_index).await? {
                None => return Ok(false),
                Some(Some(m)) => m,
                Some(None) => {
                    drop(tx);
                    let r = sqlx::query(
                        "DELETE FROM meta_snapshot WHERE applied_index = ? AND CAST(payload AS BLOB) = ?",
                    )
                    .bind(applied_index as i64)
                    .bind(payload)
                    .execute(&self.pool)
                    .await
                    .map_err(MetaError::store("discard snapshot"))?;
                    return Ok(r.rows_affected() == 1);
                }
            };
            if !SqliteStore::chunks_equal(&mut tx, m, payload).await? {
                return Ok(false);
            }
            m
        };
        let mut tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(MetaError::store("begin discard snapshot"))?;
        let r = sqlx::query("DELETE FROM meta_snapshot WHERE applied_index = ? AND payload = ?")
            .bind(applied_index as i64)
            .bind(manifest.encode())
            .execute(&mut *tx)
            .await
            .map_err(MetaError::store("discard snapshot"))?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM meta_snapshot_blob WHERE id = ?")
            .bind(manifest.blob_id)
            .execute(&mut *tx)
            .await
            .map_err(MetaError::store("free snapshot blob"))?;
        tx.commit()
            .await
            .map_err(MetaError::store("commit discard snapshot"))?;
        // The row is gone; its chunks are garbage that the next cleanup also finds.
        if let Err(e) = self.delete_orphan_chunks().await {
            tracing::warn!(error = %e, "could not delete a discarded snapshot's chunks");
        }
        Ok(true)
    }

    async fn write_snapshot(
        &self,
        meta: SnapshotMeta,
        payload: &[u8],
        keep: u32,
        now_ms: i64,
    ) -> Result<u64, MetaError> {
        chunks::write_snapshot(self, meta, payload, keep, now_ms).await
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_round_trip_and_nothing_else_parses_as_one() {
        let m = Manifest {
            blob_id: 42,
            len: (3 << 30) + 5,
            chunks: 193,
        };
        let bytes = m.encode();
        assert_eq!(bytes.len(), MANIFEST_LEN);
        assert_eq!(Manifest::decode(&bytes), Some(m));
        assert_eq!(Manifest::decode(&bytes[..MANIFEST_LEN - 1]), None);
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(Manifest::decode(&longer), None);
        // A codec payload starts with its version byte, never 0xff.
        let mut state = bytes;
        state[0] = 3;
        assert_eq!(Manifest::decode(&state), None);
    }
}
