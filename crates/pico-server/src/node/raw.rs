//! Raw reads: the stored batches themselves (Kafka RecordBatch v2), for the Kafka facade's
//! Fetch, which serves them as they are stored rather than re-encoding their records.

use super::*;
use crate::error::*;
use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::{BatchError, batch_records_verified, encode_batch, set_base_offset};

/// Header bytes of a RecordBatch v2 (before the first record).
const HEADER_LEN: usize = 61;
/// Offset of the magic byte.
const MAGIC_AT: usize = 16;

/// What [`Node::read_raw`] returns.
#[derive(Debug, Clone)]
pub struct RawRead {
    /// Whole RecordBatch v2 batches in offset order, each's base offset its stream offset.
    /// The first holds the requested offset and may start before it (as Kafka's log does:
    /// clients skip the records below their fetch offset).
    pub batches: Vec<Bytes>,
    /// The offset after the last batch's last record.
    pub next_seq: u64,
    /// The stream's tail when the read was served.
    pub tail: u64,
    /// The stream's first readable offset.
    pub start_seq: u64,
}

impl RawRead {
    pub fn bytes(&self) -> usize {
        self.batches.iter().map(Bytes::len).sum()
    }
}

impl Node {
    /// Catch-up read of whole stored batches from the one holding `from`, at most `max_bytes`
    /// of them but always at least one (so a reader progresses past a large batch). Never
    /// waits. The bytes are those stored, unchanged, except where the store cannot hold what
    /// this stream's reader must see:
    /// - a stored base offset that differs from the stream offset is rewritten (the CRC does
    ///   not cover it, so the batch stays valid);
    /// - a fork's inherited batch that runs past the fork point is cut there (re-encoded,
    ///   timestamps kept): the records after it belong to the source only.
    pub async fn read_raw(
        &self,
        name: &StreamName,
        from: u64,
        max_bytes: usize,
    ) -> Result<RawRead, ReadError> {
        let now = self.now_ms();
        let r = self
            .resolve(name, now)
            .ok_or_else(|| self.read_missing(name))?;
        self.touch(&r, now);
        let stream_id = r.meta.id;
        let tail = self.tail(&r.meta);
        let start = r.meta.start_offset;
        if from < start {
            return Err(ReadError::Trimmed {
                offset: from,
                start_seq: start,
            });
        }
        if from > tail && self.tail_withheld(&r.meta) {
            return Err(ReadError::Unavailable(
                "this node cannot confirm its liveness with the metadata log: retry".into(),
            ));
        }
        if from > tail {
            return Err(ReadError::BeyondTail {
                offset: from,
                next_seq: tail,
            });
        }
        let max_bytes = max_bytes.max(1);
        let mut out: Vec<Bytes> = Vec::new();
        let mut bytes = 0usize;
        let mut next = from;
        'outer: while next < tail && (out.is_empty() || bytes < max_bytes) {
            let limit = self.read_limit(&r, next, tail);
            let batches = self
                .inner
                .engine
                .read(stream_id, next, max_bytes.saturating_sub(bytes).max(1))
                .await
                .map_err(|e| self.read_failed(name, stream_id, next, e))?;
            let mut progressed = false;
            for b in batches {
                let end = b.next_offset();
                if end <= next {
                    continue;
                }
                // Offsets are consecutive: data starting past `next` means a range was fenced
                // away (the stream is being re-opened). Never skip over it.
                if b.base_offset > next {
                    break;
                }
                if !out.is_empty() && bytes + b.data.len() > max_bytes {
                    break 'outer;
                }
                let corrupt = |reason: String| {
                    ReadError::Internal(format!(
                        "corrupt stored batch: stream={stream_id} offset={} {reason}",
                        b.base_offset
                    ))
                };
                check_stored(&b.data).map_err(corrupt)?;
                let data = if end > limit {
                    cut_batch(&b.data, b.base_offset, limit).map_err(|e| corrupt(e.to_string()))?
                } else if stored_base(&b.data) != b.base_offset {
                    let mut copy = b.data.to_vec();
                    set_base_offset(&mut copy, b.base_offset);
                    Bytes::from(copy)
                } else {
                    b.data
                };
                bytes += data.len();
                out.push(data);
                next = end.min(limit);
                progressed = true;
                if next >= limit {
                    // The next slice (or the tail) decides how far the next read may go.
                    break;
                }
            }
            if !progressed {
                break;
            }
        }
        if out.is_empty() && next < tail {
            return Err(ReadError::Unavailable(format!(
                "stream data is being recovered, retry: offset={next}"
            )));
        }
        Ok(RawRead {
            batches: out,
            next_seq: next,
            tail,
            start_seq: start,
        })
    }
}

/// The header checks a reader relies on before handing bytes out whole: long enough, magic 2,
/// and a batch length that covers exactly the stored bytes. (The engine verified the bytes
/// themselves under its object or WAL checksums.)
fn check_stored(data: &[u8]) -> Result<(), String> {
    if data.len() < HEADER_LEN {
        return Err(format!("short header: len={}", data.len()));
    }
    if data[MAGIC_AT] != 2 {
        return Err(format!("magic={}", data[MAGIC_AT] as i8));
    }
    match pico_protocol::batch::batch_len(data) {
        Ok(n) if n == data.len() => Ok(()),
        Ok(n) => Err(format!("batch length={n} stored={}", data.len())),
        Err(e) => Err(e.to_string()),
    }
}

fn stored_base(data: &[u8]) -> u64 {
    pico_protocol::batch::base_offset(data).unwrap_or(u64::MAX)
}

/// The records of the batch at `base` below `limit`, as one batch of their own.
fn cut_batch(data: &Bytes, base: u64, limit: u64) -> Result<Bytes, BatchError> {
    let keep = usize::try_from(limit.saturating_sub(base)).unwrap_or(usize::MAX);
    let records = batch_records_verified(data)?
        .take(keep)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(encode_batch(base, &records))
}
