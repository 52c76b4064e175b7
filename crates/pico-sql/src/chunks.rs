//! Snapshots are stored in chunks on every backend; reassembling one (its bounds checked, so a
//! damaged manifest is a clear error, never a huge allocation) and comparing one with a payload
//! a chunk at a time are the same whatever reads the chunks.

use crate::error::MetaError;

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
