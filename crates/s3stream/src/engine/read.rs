//! The read path: log cache first, then committed objects through the catalog and block cache.
//!
//! Invariants:
//! - Only durable data is returned: the log cache holds only data whose WAL write returned,
//!   and objects are read only through committed slices.
//! - Results are contiguous from the batch containing `from_offset`; at least one batch is
//!   returned when any exists at or after it (a read below a trimmed start begins at the first
//!   committed batch).

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
            if slice.start_offset > cur && !out.is_empty() {
                break; // not contiguous with what we have
            }
            let data = fetch_slice(shared, &slice).await?;
            let batches = format::decode_frames(&data).map_err(|source| EngineError::Corrupt {
                key: slice.key.clone(),
                source,
            })?;
            for b in batches {
                if b.next_offset() <= cur {
                    continue;
                }
                if !out.is_empty() && (bytes >= max_bytes || b.base_offset != cur) {
                    break 'slices;
                }
                cur = b.next_offset();
                bytes += b.data.len();
                out.push(b);
            }
        }
        if cur == before {
            break;
        }
    }
    Ok(out)
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
