//! Snapshots are stored in chunks on every backend; reassembling one (its bounds checked, so a
//! damaged manifest is a clear error, never a huge allocation) and comparing one with a payload
//! a chunk at a time are the same whatever reads the chunks.

use crate::error::MetaError;
use crate::store::SnapshotMeta;
use std::time::Duration;

/// What a chunked blob's manifest records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Blob {
    pub blob_id: i64,
    pub len: u64,
    pub chunks: u64,
}

/// A connection that reads one chunk of a blob (`None`: no such chunk).
pub(crate) trait ReadChunk {
    async fn chunk(&mut self, blob_id: i64, seq: u64) -> Result<Option<Vec<u8>>, MetaError>;
}

/// The blob's bytes from its chunks `0..chunks`; missing chunks and lengths that disagree with
/// the manifest are `CorruptSnapshot`.
pub(crate) async fn assemble(
    applied_index: u64,
    b: Blob,
    conn: &mut impl ReadChunk,
) -> Result<Vec<u8>, MetaError> {
    let corrupt = |what: String| {
        MetaError::CorruptSnapshot(format!(
            "applied_index={applied_index} blob_id={}: {what}",
            b.blob_id
        ))
    };
    let len = usize::try_from(b.len).map_err(|_| corrupt(format!("len={}", b.len)))?;
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|e| corrupt(format!("len={len}: {e}")))?;
    for seq in 0..b.chunks {
        let chunk = conn
            .chunk(b.blob_id, seq)
            .await?
            .ok_or_else(|| corrupt(format!("chunk {seq} of {} missing", b.chunks)))?;
        if out.len() + chunk.len() > len {
            return Err(corrupt(format!("chunks exceed len={len}")));
        }
        out.extend_from_slice(&chunk);
    }
    if out.len() != len {
        return Err(corrupt(format!("chunks hold {} of len={len}", out.len())));
    }
    Ok(out)
}

/// Whether the blob's chunks hold exactly `payload`, compared a chunk at a time. A missing or
/// unreadable chunk cannot be what the caller loaded: not equal.
pub(crate) async fn equals(b: Blob, payload: &[u8], conn: &mut impl ReadChunk) -> bool {
    if b.len != payload.len() as u64 {
        return false;
    }
    let mut at = 0;
    for seq in 0..b.chunks {
        let Ok(Some(chunk)) = conn.chunk(b.blob_id, seq).await else {
            return false;
        };
        if payload.get(at..at + chunk.len()) != Some(&chunk[..]) {
            return false;
        }
        at += chunk.len();
    }
    at == payload.len()
}

/// A store's steps for writing a chunked snapshot; [`write_snapshot`] runs them in the same
/// order on every backend.
pub(crate) trait ChunkWriter {
    /// Blobs of this store's failed writes, collected before the next write.
    fn failed_blobs(&self) -> std::sync::MutexGuard<'_, Vec<i64>>;
    /// Bytes per chunk of a new snapshot.
    fn chunk_bytes(&self) -> usize;
    /// The bound [`write_snapshot`] puts on each step, in multiples (`None`: unbounded, for a
    /// store with no network between it and its data).
    fn step_timeout(&self) -> Option<Duration> {
        None
    }
    /// Deletes the blobs no snapshot row references (only those in `only`, if given), then
    /// every chunk whose blob is gone.
    async fn collect_garbage(&self, only: Option<&[i64]>) -> Result<(), MetaError>;
    /// Deletes the chunks whose blob is gone.
    async fn delete_orphan_chunks(&self) -> Result<(), MetaError>;
    /// A new blob id (never reused).
    async fn register_blob(&self, now_ms: i64) -> Result<i64, MetaError>;
    /// Writes the chunks of `blob_id`, then commits the snapshot row, the prune and the
    /// truncation; the number of log rows truncated.
    async fn write_chunked(
        &self,
        blob_id: i64,
        meta: SnapshotMeta,
        payload: &[u8],
        keep: u32,
        now_ms: i64,
    ) -> Result<u64, MetaError>;
}

/// `LogStore::write_snapshot` on a chunked store.
pub(crate) async fn write_snapshot(
    store: &impl ChunkWriter,
    meta: SnapshotMeta,
    payload: &[u8],
    keep: u32,
    now_ms: i64,
) -> Result<u64, MetaError> {
    // Chunks left by this store's failed attempts go first, so repeated failures do not pile
    // them up. Garbage only costs space: a failure here must not stop the write.
    //
    // With a step timeout, each step is bounded (a connection that stops answering fails the
    // write like any other error): a statement per chunk, so the bounds grow with them.
    let step = store.step_timeout();
    let chunks = payload.len().div_ceil(store.chunk_bytes().max(1));
    let chunks = u32::try_from(chunks).unwrap_or(u32::MAX);
    let garbage = step.map(|t| t.saturating_mul(8));
    let failed = store.failed_blobs().clone();
    if !failed.is_empty() {
        let collect = store.collect_garbage(Some(&failed));
        match within(garbage, "collect snapshot garbage", collect).await {
            Ok(()) => store.failed_blobs().retain(|id| !failed.contains(id)),
            Err(e) => tracing::warn!(error = %e, "could not delete a failed snapshot's chunks"),
        }
    }
    let blob_id = within(step, "register snapshot blob", store.register_blob(now_ms)).await?;
    let write = store.write_chunked(blob_id, meta, payload, keep, now_ms);
    let write_limit = step.map(|t| t.saturating_mul(chunks.saturating_add(4)));
    match within(write_limit, "write snapshot", write).await {
        Ok(deleted) => {
            // The replaced and pruned snapshots' chunks (their blobs went with the commit).
            let orphans = store.delete_orphan_chunks();
            if let Err(e) = within(garbage, "delete snapshot chunks", orphans).await {
                tracing::warn!(error = %e, "could not delete pruned snapshot chunks");
            }
            Ok(deleted)
        }
        Err(e) => {
            store.failed_blobs().push(blob_id);
            Err(e)
        }
    }
}

/// `work` within `limit` (none: unbounded), or a `Store` error naming `op`. The snapshot
/// writer's steps run on pooled connections, which are handed back if the work is dropped.
async fn within<T>(
    limit: Option<Duration>,
    op: &'static str,
    work: impl Future<Output = Result<T, MetaError>>,
) -> Result<T, MetaError> {
    let Some(limit) = limit else {
        return work.await;
    };
    tokio::time::timeout(limit, work).await.unwrap_or_else(|_| {
        Err(MetaError::Store {
            op,
            message: format!("no answer within {limit:?}"),
        })
    })
}
