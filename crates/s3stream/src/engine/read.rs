//! The read path: log cache first, then committed objects through the catalog and block cache.
//!
//! Invariants:
//! - Only durable data is returned: the log cache holds only data whose WAL write returned,
//!   and objects are read only through committed slices.
//! - Results are contiguous from the batch containing `from_offset`; at least one batch is
//!   returned when any exists at or after it (a read below a trimmed start begins at the first
//!   committed batch).

use std::sync::Arc;

use bytes::Bytes;

use super::{EngineError, ObjectSlice, Shared};
use crate::format::{self, StoredBatch};

/// Slices asked from the catalog per lookup.
const SLICES_PER_LOOKUP: usize = 8;

pub(super) async fn read(
    shared: &Shared,
    stream: u64,
    from_offset: u64,
    max_bytes: usize,
) -> Result<Vec<StoredBatch>, EngineError> {
    let mut out: Vec<StoredBatch> = Vec::new();
    let mut bytes = 0usize;
    let mut cur = from_offset;
    loop {
        if !out.is_empty() && bytes >= max_bytes {
            break;
        }
        {
            let st = shared.state();
            if let Some(s) = st.streams.get(&stream)
                && cur >= s.durable_end
            {
                break;
            }
            if let Some(next) = st.cache.read(stream, cur, max_bytes, &mut out, &mut bytes)
                && next > cur
            {
                cur = next;
                continue;
            }
        }
        let slices = shared.catalog.slices(stream, cur, SLICES_PER_LOOKUP);
        if slices.is_empty() {
            break;
        }
        let before = cur;
        'slices: for slice in slices {
            if slice.end_offset <= cur {
                continue;
            }
            if !out.is_empty() && (slice.start_offset > cur || bytes >= max_bytes) {
                break; // not contiguous with what we have, or the page is full: no fetch
            }
            let batches = slice_batches(shared, &slice).await?;
            for b in batches.iter() {
                if b.next_offset() <= cur {
                    continue;
                }
                if !out.is_empty() && (bytes >= max_bytes || b.base_offset != cur) {
                    break 'slices;
                }
                cur = b.next_offset();
                bytes += b.data.len();
                out.push(b.clone());
            }
        }
        if cur == before {
            break;
        }
    }
    Ok(out)
}

/// A slice's batches, decoded and checked. A large slice the block cache does not take (one
/// large append makes one batch, up to the request limit) is kept decoded in a slot of its own: a
/// reader paging through it in 64 KiB reads would otherwise fetch and check the whole slice
/// for every page. One slot, filled under its lock: at most one large slice held and one being
/// fetched, whatever the readers, so cold reads of large slices take turns.
async fn slice_batches(
    shared: &Shared,
    slice: &ObjectSlice,
) -> Result<Arc<Vec<StoredBatch>>, EngineError> {
    let decode = |data: &Bytes| {
        format::decode_frames(data)
            .map(Arc::new)
            .map_err(|source| EngineError::Corrupt {
                key: slice.key.clone(),
                source,
            })
    };
    if slice.len < LARGE_SLICE_BYTES || shared.blocks().admits(&slice.key, slice.len) {
        return decode(&fetch_slice(shared, slice).await?);
    }
    let mut held = shared.large_slice.lock().await;
    if let Some(l) = held.as_ref()
        && (l.key.as_str(), l.position, l.len) == (slice.key.as_str(), slice.position, slice.len)
    {
        return Ok(l.batches.clone());
    }
    *held = None;
    let data = shared
        .data
        .get_range(&slice.key, slice.position, slice.len)
        .await?;
    let batches = decode(&data)?;
    *held = Some(LargeSlice {
        key: slice.key.clone(),
        position: slice.position,
        len: slice.len,
        batches: batches.clone(),
    });
    Ok(batches)
}

/// Slices from this size up that the block cache does not take go through the one slot of
/// [`slice_batches`]: only single large appends make them (ordinary slices are about
/// `SLICE_TARGET_BYTES`), so a small block cache does not make every cold read take turns.
const LARGE_SLICE_BYTES: u64 = 4 * super::SLICE_TARGET_BYTES as u64;

/// The large slice last read (see [`slice_batches`]).
pub(super) struct LargeSlice {
    key: String,
    position: u64,
    len: u64,
    batches: Arc<Vec<StoredBatch>>,
}

async fn fetch_slice(shared: &Shared, slice: &ObjectSlice) -> Result<Bytes, EngineError> {
    if let Some(hit) = shared.blocks().get(&slice.key, slice.position, slice.len) {
        return Ok(hit);
    }
    let data = shared
        .data
        .get_range(&slice.key, slice.position, slice.len)
        .await?;
    shared
        .blocks()
        .insert(&slice.key, slice.position, slice.len, data.clone());
    Ok(data)
}
