//! The stored record format: Kafka RecordBatch v2 (magic 2). The node encodes its own batches
//! uncompressed; a Kafka producer's batch is stored as it was sent, compressed or not (only
//! its base offset, timestamp type and max timestamp are set on append: [`stamp_batch`]), and
//! readers inflate it through [`crate::compression`], bounded.
//!
//! Layout (big-endian): baseOffset i64, batchLength i32, partitionLeaderEpoch i32, magic i8,
//! crc u32 (CRC-32C over attributes..end), attributes i16, lastOffsetDelta i32,
//! baseTimestamp i64, maxTimestamp i64, producerId i64, producerEpoch i16, baseSequence i32,
//! records count i32, then records with zigzag varint fields.
//!
//! Decoding never trusts a declared length or count: every one is checked against the bytes
//! that remain before anything is allocated.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

use crate::compression::{Codec, MAX_DECOMPRESSED, decompress};
use crate::reader::ByteReader;
use crate::record::Record;

/// Bytes before the first record.
pub const HEADER_LEN: usize = 61;
/// Offset of batchLength; the length counts everything after it.
const LENGTH_OFFSET: usize = 8;
const LOG_OVERHEAD: usize = 12;
const MAGIC_OFFSET: usize = 16;
const CRC_OFFSET: usize = 17;
const ATTRIBUTES_OFFSET: usize = 21;
const LAST_OFFSET_DELTA_OFFSET: usize = 23;
const MAX_TIMESTAMP_OFFSET: usize = 35;
/// Attributes bit: the batch's records carry the log append time (its max timestamp).
const LOG_APPEND_TIME: i16 = 0x08;
const RECORDS_COUNT_OFFSET: usize = 57;
/// The smallest possible encoded record: length, attrs, ts delta, offset delta,
/// key len, value len, headers count, one byte each (minus the length prefix).
const MIN_RECORD_LEN: usize = 6;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BatchError {
    #[error("batch truncated: need={need} have={have}")]
    Truncated { need: usize, have: usize },
    #[error("batch length field invalid: declared={declared} available={available}")]
    BadLength { declared: i64, available: usize },
    #[error("unsupported batch magic: magic={0}")]
    BadMagic(i8),
    #[error("batch CRC mismatch: stored={stored:#010x} computed={computed:#010x}")]
    Crc { stored: u32, computed: u32 },
    #[error("unsupported batch feature: {0}")]
    Unsupported(&'static str),
    #[error("malformed record: index={index} reason={reason}")]
    BadRecord { index: usize, reason: &'static str },
    #[error("batch does not decompress: codec={codec} reason={reason}")]
    Decompress { codec: &'static str, reason: String },
    #[error("batch inflates past the cap: codec={codec} cap={cap}")]
    Inflated { codec: &'static str, cap: usize },
    #[error("records do not match the batch header: {0}")]
    Mismatch(String),
}

/// A decoded batch: the base offset and its records in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedBatch {
    pub base_offset: u64,
    pub records: Vec<Record>,
}

/// Encodes `records` as one uncompressed v2 batch starting at `base_offset`
/// (producerId -1, no sequence). Timestamps are stored as deltas from the first record.
pub fn encode_batch(base_offset: u64, records: &[Record]) -> Bytes {
    let base_ts = records.first().map(|r| r.timestamp_ms).unwrap_or(0);
    let max_ts = records
        .iter()
        .map(|r| r.timestamp_ms)
        .max()
        .unwrap_or(base_ts);
    let mut buf =
        BytesMut::with_capacity(HEADER_LEN + records.iter().map(approx_len).sum::<usize>());
    buf.put_i64(base_offset as i64);
    buf.put_i32(0); // batchLength, patched below
    buf.put_i32(-1); // partitionLeaderEpoch
    buf.put_i8(2); // magic
    buf.put_u32(0); // crc, patched below
    buf.put_i16(0); // attributes: no compression, CreateTime, not transactional
    buf.put_i32(records.len().saturating_sub(1) as i32);
    buf.put_i64(base_ts);
    buf.put_i64(max_ts);
    buf.put_i64(-1); // producerId
    buf.put_i16(-1); // producerEpoch
    buf.put_i32(-1); // baseSequence
    buf.put_i32(records.len() as i32);
    // Each record goes straight into `buf`: its length prefix is computed first, so a large
    // value (one 64 KiB Durable Streams message) is copied once, not grown into a scratch Vec.
    for (i, r) in records.iter().enumerate() {
        let ts_delta = r.timestamp_ms.wrapping_sub(base_ts);
        let key_len = r.key.as_ref().map_or(-1, |k| k.len() as i64);
        let mut body_len = 1
            + varlong_len(ts_delta)
            + varlong_len(i as i64)
            + varlong_len(key_len)
            + r.key.as_ref().map_or(0, |k| k.len())
            + varlong_len(r.value.len() as i64)
            + r.value.len()
            + varlong_len(r.headers.len() as i64);
        for (k, v) in &r.headers {
            body_len +=
                varlong_len(k.len() as i64) + k.len() + varlong_len(v.len() as i64) + v.len();
        }
        put_varlong(&mut buf, body_len as i64);
        buf.put_u8(0); // record attributes
        put_varlong(&mut buf, ts_delta);
        put_varlong(&mut buf, i as i64);
        put_varlong(&mut buf, key_len);
        if let Some(k) = &r.key {
            buf.put_slice(k);
        }
        put_varlong(&mut buf, r.value.len() as i64);
        buf.put_slice(&r.value);
        put_varlong(&mut buf, r.headers.len() as i64);
        for (k, v) in &r.headers {
            put_varlong(&mut buf, k.len() as i64);
            buf.put_slice(k.as_bytes());
            put_varlong(&mut buf, v.len() as i64);
            buf.put_slice(v);
        }
    }
    let batch_len = (buf.len() - LOG_OVERHEAD) as i32;
    buf[LENGTH_OFFSET..LENGTH_OFFSET + 4].copy_from_slice(&batch_len.to_be_bytes());
    let crc = crc32c::crc32c(&buf[ATTRIBUTES_OFFSET..]);
    buf[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    buf.freeze()
}

/// A batch's CRC-32C in two parts, for a caller that checksums whole batches and can combine
/// CRCs: `(crc32c(head), crc32c(rest), rest.len())`, `rest` being what the header's stored
/// CRC covers. Trusts that stored CRC (no pass over the records), so only for a batch this
/// process encoded or has verified.
pub fn crc_parts(batch: &[u8]) -> Option<(u32, u32, usize)> {
    let head = batch.get(..ATTRIBUTES_OFFSET)?;
    let stored = u32::from_be_bytes(be4(batch, CRC_OFFSET));
    Some((
        crc32c::crc32c(head),
        stored,
        batch.len() - ATTRIBUTES_OFFSET,
    ))
}

fn approx_len(r: &Record) -> usize {
    16 + r.key.as_ref().map_or(0, |k| k.len())
        + r.value.len()
        + r.headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + 4)
            .sum::<usize>()
}

/// Validates the fixed header and CRC; returns the batch's total length on the wire.
fn check_header(data: &[u8]) -> Result<usize, BatchError> {
    let total = check_layout(data)?;
    let stored = u32::from_be_bytes(be4(data, CRC_OFFSET));
    let computed = crc32c::crc32c(&data[ATTRIBUTES_OFFSET..total]);
    if stored != computed {
        return Err(BatchError::Crc { stored, computed });
    }
    Ok(total)
}

/// Validates the fixed header (not the CRC); returns the batch's total length on the wire.
fn check_layout(data: &[u8]) -> Result<usize, BatchError> {
    if data.len() < HEADER_LEN {
        return Err(BatchError::Truncated {
            need: HEADER_LEN,
            have: data.len(),
        });
    }
    let declared = i32::from_be_bytes(be4(data, LENGTH_OFFSET));
    let total = declared as i64 + LOG_OVERHEAD as i64;
    if declared < (HEADER_LEN - LOG_OVERHEAD) as i32 || total > data.len() as i64 {
        return Err(BatchError::BadLength {
            declared: declared as i64,
            available: data.len(),
        });
    }
    let total = total as usize;
    let magic = data[MAGIC_OFFSET] as i8;
    if magic != 2 {
        return Err(BatchError::BadMagic(magic));
    }
    Ok(total)
}

fn be4(data: &[u8], at: usize) -> [u8; 4] {
    [data[at], data[at + 1], data[at + 2], data[at + 3]]
}

fn be8(data: &[u8], at: usize) -> [u8; 8] {
    let mut out = [0u8; 8];
    out.copy_from_slice(&data[at..at + 8]);
    out
}

/// Decodes and verifies one batch at the start of `data` (trailing bytes are ignored). Every
/// value is copied out of `data`; [`batch_records`] decodes lazily without copies.
pub fn decode_batch(data: &[u8]) -> Result<DecodedBatch, BatchError> {
    let layout = verify(data, true)?;
    let inflated;
    let body = match layout.codec {
        Codec::None => &data[HEADER_LEN..layout.total],
        codec => {
            inflated = decompress(codec, &data[HEADER_LEN..layout.total], MAX_DECOMPRESSED)?;
            check_count(layout.count, inflated.len())?;
            &inflated[..]
        }
    };
    let mut cur = ByteReader::new(body);
    let mut records = Vec::with_capacity(layout.count);
    for index in 0..layout.count {
        records.push(decode_record(&mut cur, index, layout.time, Bytes::copy_from_slice)?.0);
    }
    if cur.remaining() != 0 {
        return Err(BatchError::BadLength {
            declared: layout.total as i64,
            available: cur.position(),
        });
    }
    Ok(DecodedBatch {
        base_offset: layout.base_offset,
        records,
    })
}

/// Verifies the batch at the start of `data` (header, CRC, record count) and returns its
/// records for decoding one at a time: values, keys and header values are slices of `data`
/// (no copies), and [`BatchRecords::skip_records`] passes records by their length alone. A read that
/// wants a few records of a large batch pays for those, not for the whole batch.
pub fn batch_records(data: &Bytes) -> Result<BatchRecords, BatchError> {
    batch_records_checked(data, true)
}

/// [`batch_records`] without the CRC pass, for bytes already verified under a checksum of
/// their own (the engine's object frames and WAL frames cover every stored batch): a read of
/// a few records of a large batch then costs those records, not a pass over the batch. Every
/// length is still checked, so damaged bytes give errors, never panics.
pub fn batch_records_verified(data: &Bytes) -> Result<BatchRecords, BatchError> {
    batch_records_checked(data, false)
}

fn batch_records_checked(data: &Bytes, crc: bool) -> Result<BatchRecords, BatchError> {
    let layout = verify(data, crc)?;
    Ok(BatchRecords {
        data: records_of(data, &layout)?,
        pos: 0,
        index: 0,
        count: layout.count,
        base_offset: layout.base_offset,
        time: layout.time,
    })
}

/// The records' bytes of a verified batch: a slice of it, or inflated (bounded).
fn records_of(data: &Bytes, layout: &Layout) -> Result<Bytes, BatchError> {
    match layout.codec {
        Codec::None => Ok(data.slice(HEADER_LEN..layout.total)),
        codec => {
            let inflated = decompress(codec, &data[HEADER_LEN..layout.total], MAX_DECOMPRESSED)?;
            check_count(layout.count, inflated.len())?;
            Ok(Bytes::from(inflated))
        }
    }
}

/// The records of one verified batch, decoded on demand (see [`batch_records`]).
#[derive(Debug, Clone)]
pub struct BatchRecords {
    /// The records' bytes (after the header, up to the batch's declared end).
    data: Bytes,
    pos: usize,
    index: usize,
    count: usize,
    base_offset: u64,
    time: TimeBase,
}

impl BatchRecords {
    pub fn base_offset(&self) -> u64 {
        self.base_offset
    }

    /// Records not yet decoded or skipped.
    pub fn remaining(&self) -> usize {
        self.count - self.index
    }

    /// Passes over up to `n` records without decoding their fields.
    pub fn skip_records(&mut self, n: usize) -> Result<(), BatchError> {
        let mut cur = ByteReader::new(&self.data[self.pos..]);
        for _ in 0..n.min(self.remaining()) {
            let index = self.index;
            let bad = |reason| BatchError::BadRecord { index, reason };
            let len = cur.varlong().ok_or(bad("length"))?;
            let len = usize::try_from(len).map_err(|_| bad("length"))?;
            cur.take(len).ok_or(bad("length exceeds batch"))?;
            self.index += 1;
        }
        self.pos += cur.position();
        Ok(())
    }
}

impl Iterator for BatchRecords {
    type Item = Result<Record, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.index >= self.count {
            return None;
        }
        let data = &self.data;
        let mut cur = ByteReader::new(&data[self.pos..]);
        let record = decode_record(&mut cur, self.index, self.time, |s| data.slice_ref(s));
        match record {
            Ok((r, _)) => {
                self.pos += cur.position();
                self.index += 1;
                Some(Ok(r))
            }
            Err(e) => {
                // A malformed record ends the batch: nothing after it can be located.
                self.index = self.count;
                Some(Err(e))
            }
        }
    }
}

/// What [`verify`] learns from a batch's header.
struct Layout {
    total: usize,
    count: usize,
    base_offset: u64,
    time: TimeBase,
    codec: Codec,
}

/// Where a batch's record timestamps come from: the base timestamp plus each record's delta
/// (CreateTime), or the batch's max timestamp for every record (LogAppendTime).
#[derive(Debug, Clone, Copy)]
struct TimeBase {
    base: i64,
    log_append: Option<i64>,
}

/// Every record takes at least `MIN_RECORD_LEN + 1` bytes: a count the bytes cannot hold is
/// refused before anything is allocated for it.
fn check_count(count: usize, available: usize) -> Result<(), BatchError> {
    if count.saturating_mul(MIN_RECORD_LEN + 1) > available {
        return Err(BatchError::BadLength {
            declared: count as i64,
            available,
        });
    }
    Ok(())
}

fn verify(data: &[u8], crc: bool) -> Result<Layout, BatchError> {
    let total = if crc {
        check_header(data)?
    } else {
        check_layout(data)?
    };
    let attributes = i16::from_be_bytes([data[ATTRIBUTES_OFFSET], data[ATTRIBUTES_OFFSET + 1]]);
    let codec =
        Codec::from_attributes(attributes).ok_or(BatchError::Unsupported("compression codec"))?;
    if attributes & 0x20 != 0 {
        return Err(BatchError::Unsupported("control batch"));
    }
    let base_offset = i64::from_be_bytes(be8(data, 0)) as u64;
    let base_ts = i64::from_be_bytes(be8(data, 27));
    let max_ts = i64::from_be_bytes(be8(data, MAX_TIMESTAMP_OFFSET));
    let count = i32::from_be_bytes(be4(data, RECORDS_COUNT_OFFSET));
    if count < 0 {
        return Err(BatchError::BadLength {
            declared: count as i64,
            available: total - HEADER_LEN,
        });
    }
    // Compressed records are counted against their inflated size once inflated.
    if codec == Codec::None {
        check_count(count as usize, total - HEADER_LEN)?;
    }
    Ok(Layout {
        total,
        count: count as usize,
        base_offset,
        time: TimeBase {
            base: base_ts,
            log_append: (attributes & LOG_APPEND_TIME != 0).then_some(max_ts),
        },
        codec,
    })
}

/// Decodes the record at `cur`; `bytes` turns a field's slice into [`Bytes`] (a copy, or a
/// slice of the batch's own buffer).
/// Returns the record and its offset delta.
fn decode_record<'a>(
    cur: &mut ByteReader<'a>,
    index: usize,
    time: TimeBase,
    bytes: impl Fn(&'a [u8]) -> Bytes,
) -> Result<(Record, i64), BatchError> {
    let bad = |reason| BatchError::BadRecord { index, reason };
    let len = cur.varlong().ok_or(bad("length"))?;
    if len < 0 || len as usize > cur.remaining() {
        return Err(bad("length exceeds batch"));
    }
    let mut rec = ByteReader::new(cur.take(len as usize).ok_or(bad("length"))?);
    rec.take(1).ok_or(bad("attributes"))?;
    let ts_delta = rec.varlong().ok_or(bad("timestamp delta"))?;
    let offset_delta = rec.varlong().ok_or(bad("offset delta"))?;
    let key = rec.nullable_bytes().ok_or(bad("key"))?.map(&bytes);
    let value = rec
        .nullable_bytes()
        .ok_or(bad("value"))?
        .map_or_else(Bytes::new, &bytes);
    let n_headers = rec.varlong().ok_or(bad("header count"))?;
    // Each header needs at least two bytes (two length varints).
    if n_headers < 0 || (n_headers as usize).saturating_mul(2) > rec.remaining() {
        return Err(bad("header count exceeds record"));
    }
    let mut headers = Vec::with_capacity(n_headers as usize);
    for _ in 0..n_headers {
        let k = rec
            .nullable_bytes()
            .ok_or(bad("header key"))?
            .ok_or(bad("null header key"))?;
        let k = std::str::from_utf8(k)
            .map_err(|_| bad("header key not UTF-8"))?
            .to_string();
        let v = rec.nullable_bytes().ok_or(bad("header value"))?;
        headers.push((k, v.map_or_else(Bytes::new, &bytes)));
    }
    if rec.remaining() != 0 {
        return Err(bad("trailing bytes in record"));
    }
    let record = Record {
        timestamp_ms: time
            .log_append
            .unwrap_or_else(|| time.base.wrapping_add(ts_delta)),
        key,
        value,
        headers,
    };
    Ok((record, offset_delta))
}

/// A producer's batch, checked whole by [`check_produced`] (only it makes one, so holding one
/// is the proof).
#[derive(Debug, Clone)]
pub struct ProducedBatch {
    batch: Bytes,
    records: Vec<Record>,
    codec: Codec,
}

impl ProducedBatch {
    /// Its records (slices of the batch, or of its inflated records).
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    pub fn codec(&self) -> Codec {
        self.codec
    }

    /// The batch as sent, and its records.
    pub fn into_parts(self) -> (Bytes, Vec<Record>) {
        (self.batch, self.records)
    }
}

/// Checks a batch a producer sent before it is stored as sent: header, magic, CRC, not a
/// control batch, at least one record, the records (inflated, bounded by
/// [`MAX_DECOMPRESSED`]) exactly as many as the header says, each well formed with offset
/// delta = its index and nothing after the last. Every reader can then decode it.
pub fn check_produced(data: &Bytes) -> Result<ProducedBatch, BatchError> {
    let layout = verify(data, true)?;
    if layout.total != data.len() {
        return Err(BatchError::BadLength {
            declared: layout.total as i64,
            available: data.len(),
        });
    }
    let mismatch = |why: String| Err(BatchError::Mismatch(why));
    if layout.count == 0 {
        return mismatch("no records".into());
    }
    let last_delta = i32::from_be_bytes(be4(data, LAST_OFFSET_DELTA_OFFSET));
    if i64::from(last_delta) != layout.count as i64 - 1 {
        return mismatch(format!(
            "last offset delta={last_delta} records={}",
            layout.count
        ));
    }
    let body = records_of(data, &layout)?;
    let mut cur = ByteReader::new(&body);
    let mut records = Vec::with_capacity(layout.count);
    for index in 0..layout.count {
        let (r, delta) = decode_record(&mut cur, index, layout.time, |s| body.slice_ref(s))?;
        if delta != index as i64 {
            return mismatch(format!("record {index} has offset delta {delta}"));
        }
        records.push(r);
    }
    if cur.remaining() != 0 {
        return mismatch(format!("{} bytes after the last record", cur.remaining()));
    }
    Ok(ProducedBatch {
        batch: data.clone(),
        records,
        codec: layout.codec,
    })
}

/// A producer's checked batch as stored: base offset `base`, and (as a Kafka broker with
/// `message.timestamp.type=LogAppendTime` does) the LogAppendTime bit and `append_ms` as max
/// timestamp, so every reader sees the append time. The records stay as sent (compressed or
/// not); the CRC is recomputed over the changed header.
pub fn stamp_batch(data: &[u8], base: u64, append_ms: i64) -> Bytes {
    let mut out = BytesMut::from(data);
    if out.len() < HEADER_LEN {
        return out.freeze();
    }
    set_base_offset(&mut out, base);
    let attributes = i16::from_be_bytes([out[ATTRIBUTES_OFFSET], out[ATTRIBUTES_OFFSET + 1]]);
    out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2]
        .copy_from_slice(&(attributes | LOG_APPEND_TIME).to_be_bytes());
    out[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8].copy_from_slice(&append_ms.to_be_bytes());
    let crc = crc32c::crc32c(&out[ATTRIBUTES_OFFSET..]);
    out[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    out.freeze()
}

/// The record count of a verified batch, without decoding the records.
pub fn record_count(data: &[u8]) -> Result<u32, BatchError> {
    check_header(data)?;
    let count = i32::from_be_bytes(be4(data, RECORDS_COUNT_OFFSET));
    u32::try_from(count).map_err(|_| BatchError::BadLength {
        declared: count as i64,
        available: data.len(),
    })
}

/// The number of offsets a batch spans (lastOffsetDelta + 1), read without CRC verification.
pub fn offset_span(data: &[u8]) -> Result<u32, BatchError> {
    if data.len() < HEADER_LEN {
        return Err(BatchError::Truncated {
            need: HEADER_LEN,
            have: data.len(),
        });
    }
    let delta = i32::from_be_bytes(be4(data, LAST_OFFSET_DELTA_OFFSET));
    u32::try_from(delta as i64 + 1).map_err(|_| BatchError::BadLength {
        declared: delta as i64,
        available: data.len(),
    })
}

/// Rewrites the base offset in place. The CRC does not cover it, so the batch stays valid.
/// Does nothing on a buffer shorter than 8 bytes.
pub fn set_base_offset(data: &mut [u8], base: u64) {
    if let Some(head) = data.get_mut(0..8) {
        head.copy_from_slice(&base.to_be_bytes());
    }
}

/// The base offset of a batch (no verification).
pub fn base_offset(data: &[u8]) -> Result<u64, BatchError> {
    match data.get(0..8) {
        Some(_) => Ok(u64::from_be_bytes(be8(data, 0))),
        None => Err(BatchError::Truncated {
            need: 8,
            have: data.len(),
        }),
    }
}

/// The total on-wire length of the batch at the start of `data` (from batchLength; unverified).
pub fn batch_len(data: &[u8]) -> Result<usize, BatchError> {
    if data.len() < LOG_OVERHEAD {
        return Err(BatchError::Truncated {
            need: LOG_OVERHEAD,
            have: data.len(),
        });
    }
    let declared = i32::from_be_bytes(be4(data, LENGTH_OFFSET));
    if declared < (HEADER_LEN - LOG_OVERHEAD) as i32 {
        return Err(BatchError::BadLength {
            declared: declared as i64,
            available: data.len(),
        });
    }
    Ok(declared as usize + LOG_OVERHEAD)
}

fn put_varlong(out: &mut impl BufMut, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.put_u8((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.put_u8(z as u8);
}

/// Bytes `put_varlong` writes for `v`.
fn varlong_len(v: i64) -> usize {
    let z = ((v << 1) ^ (v >> 63)) as u64;
    (64 - z.leading_zeros() as usize).max(1).div_ceil(7)
}

/// Kafka's varint fields, on top of the shared byte reader.
impl<'a> ByteReader<'a> {
    /// Zigzag varint, at most 10 bytes.
    fn varlong(&mut self) -> Option<i64> {
        let mut z: u64 = 0;
        for i in 0..10 {
            let b = self.u8()?;
            z |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Some(((z >> 1) as i64) ^ -((z & 1) as i64));
            }
        }
        None
    }

    /// Length-prefixed bytes; -1 means null.
    fn nullable_bytes(&mut self) -> Option<Option<&'a [u8]>> {
        let len = self.varlong()?;
        if len == -1 {
            return Some(None);
        }
        if len < 0 {
            return None;
        }
        Some(Some(self.take(usize::try_from(len).ok()?)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn crc_parts_combine_to_the_whole_batch_crc() {
        for size in [0usize, 1, 100, 70_000] {
            let recs = vec![Record::from_value(vec![7u8; size]), Record::from_value("x")];
            let batch = encode_batch(42, &recs);
            let (head, rest, rest_len) = crc_parts(&batch).unwrap();
            assert_eq!(
                crc32c::crc32c_combine(head, rest, rest_len),
                crc32c::crc32c(&batch),
                "size {size}"
            );
        }
        assert_eq!(crc_parts(b"short"), None);
    }

    fn rec(ts: i64, key: Option<&str>, value: &str, headers: &[(&str, &str)]) -> Record {
        Record {
            timestamp_ms: ts,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: Bytes::copy_from_slice(value.as_bytes()),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), Bytes::copy_from_slice(v.as_bytes())))
                .collect(),
        }
    }

    #[test]
    fn round_trip_and_header_fields() {
        let records = vec![
            rec(1_700_000_000_000, Some("k"), "hello", &[("a", "1")]),
            rec(1_700_000_000_005, None, "", &[]),
            rec(1_699_999_999_000, None, "world", &[("x", ""), ("y", "z")]),
        ];
        let b = encode_batch(42, &records);
        assert_eq!(b[MAGIC_OFFSET], 2);
        assert_eq!(batch_len(&b).unwrap(), b.len());
        assert_eq!(record_count(&b).unwrap(), 3);
        assert_eq!(offset_span(&b).unwrap(), 3);
        assert_eq!(base_offset(&b).unwrap(), 42);
        let d = decode_batch(&b).unwrap();
        assert_eq!(d.base_offset, 42);
        assert_eq!(d.records, records);
        // maxTimestamp is the max, not the last.
        assert_eq!(i64::from_be_bytes(be8(&b, 35)), 1_700_000_000_005);
        // producerId -1.
        assert_eq!(i64::from_be_bytes(be8(&b, 43)), -1);
    }

    #[test]
    fn empty_batch_round_trips() {
        let b = encode_batch(0, &[]);
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(decode_batch(&b).unwrap().records, vec![]);
    }

    #[test]
    fn set_base_offset_keeps_crc_valid() {
        let mut b = encode_batch(0, &[rec(1, None, "v", &[])]).to_vec();
        set_base_offset(&mut b, 1234);
        let d = decode_batch(&b).unwrap();
        assert_eq!(d.base_offset, 1234);
    }

    #[test]
    fn varlong_len_is_what_put_varlong_writes() {
        let mut values = vec![0i64, 1, -1, 63, -64, 64, -65, i64::MAX, i64::MIN];
        for shift in 0..63 {
            values.extend([1i64 << shift, (1i64 << shift) - 1, -(1i64 << shift)]);
        }
        for v in values {
            let mut out = Vec::new();
            put_varlong(&mut out, v);
            assert_eq!(varlong_len(v), out.len(), "v={v}");
        }
    }

    #[test]
    fn large_values_keys_and_headers_round_trip() {
        let big = "x".repeat(70_000);
        let hv = "h".repeat(200);
        let recs = vec![
            rec(1, Some("k"), &big, &[("a", &hv)]),
            rec(2, None, "", &[]),
            rec(3, Some(&big[..300]), "v", &[("b", ""), ("c", "d")]),
        ];
        let b = encode_batch(7, &recs);
        assert_eq!(decode_batch(&b).unwrap().records, recs);
    }

    #[test]
    fn known_kafka_varint_encoding() {
        let mut v = Vec::new();
        put_varlong(&mut v, -1);
        assert_eq!(v, [1]);
        v.clear();
        put_varlong(&mut v, 300);
        assert_eq!(v, [0xd8, 0x04]);
    }

    #[test]
    fn rejects_compressed_and_bad_magic() {
        let mut b = encode_batch(0, &[rec(1, None, "v", &[])]).to_vec();
        b[ATTRIBUTES_OFFSET + 1] |= 1; // gzip, over bytes that are not gzip
        let crc = crc32c::crc32c(&b[ATTRIBUTES_OFFSET..]);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            decode_batch(&b),
            Err(BatchError::Decompress { codec: "gzip", .. })
        ));
        b[ATTRIBUTES_OFFSET + 1] |= 7; // no such codec
        let crc = crc32c::crc32c(&b[ATTRIBUTES_OFFSET..]);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(decode_batch(&b), Err(BatchError::Unsupported(_))));
        let mut b = encode_batch(0, &[]).to_vec();
        b[MAGIC_OFFSET] = 1;
        assert_eq!(decode_batch(&b), Err(BatchError::BadMagic(1)));
    }

    /// `batch` (uncompressed) with its records compressed by `codec` (1 gzip, 4 zstd).
    fn compressed(batch: &[u8], codec: i16) -> Bytes {
        use std::io::Write;
        let records = &batch[HEADER_LEN..];
        let packed = match codec {
            1 => {
                let mut e =
                    flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
                e.write_all(records).unwrap();
                e.finish().unwrap()
            }
            4 => zstd::encode_all(records, 3).unwrap(),
            _ => unreachable!(),
        };
        let mut b = batch[..HEADER_LEN].to_vec();
        b.extend_from_slice(&packed);
        let len = (b.len() - LOG_OVERHEAD) as i32;
        b[LENGTH_OFFSET..LENGTH_OFFSET + 4].copy_from_slice(&len.to_be_bytes());
        b[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&codec.to_be_bytes());
        let crc = crc32c::crc32c(&b[ATTRIBUTES_OFFSET..]);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        Bytes::from(b)
    }

    /// A producer's compressed batch is checked, stamped and then read back by every reader
    /// with its records, at the append time.
    #[test]
    fn compressed_batches_are_checked_stamped_and_read() {
        let recs = vec![
            rec(5, Some("k"), "one", &[("h", "v")]),
            rec(9, None, "two", &[]),
        ];
        for codec in [1, 4] {
            let b = compressed(&encode_batch(0, &recs), codec);
            let checked = check_produced(&b).unwrap();
            assert_eq!(checked.records(), recs);
            let stored = stamp_batch(&b, 42, 1_000);
            assert_eq!(stored.len(), b.len());
            assert_eq!(
                stored[HEADER_LEN..],
                b[HEADER_LEN..],
                "records kept as sent"
            );
            let read: Vec<Record> = batch_records(&stored)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            let at_append: Vec<Record> = recs
                .iter()
                .map(|r| Record {
                    timestamp_ms: 1_000,
                    ..r.clone()
                })
                .collect();
            assert_eq!(read, at_append);
            assert_eq!(decode_batch(&stored).unwrap().base_offset, 42);
            assert_eq!(decode_batch(&stored).unwrap().records, at_append);
            let mut skipping = batch_records_verified(&stored).unwrap();
            skipping.skip_records(1).unwrap();
            assert_eq!(skipping.next().unwrap().unwrap(), at_append[1]);
        }
    }

    #[test]
    fn produced_batches_must_match_their_header() {
        let recs = vec![rec(1, None, "a", &[]), rec(2, None, "b", &[])];
        let good = encode_batch(0, &recs);
        assert!(check_produced(&good).is_ok());
        // Header says one record more than the records hold.
        let mut b = good.to_vec();
        b[RECORDS_COUNT_OFFSET..RECORDS_COUNT_OFFSET + 4].copy_from_slice(&3i32.to_be_bytes());
        b[LAST_OFFSET_DELTA_OFFSET..LAST_OFFSET_DELTA_OFFSET + 4]
            .copy_from_slice(&2i32.to_be_bytes());
        let crc = crc32c::crc32c(&b[ATTRIBUTES_OFFSET..]);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        assert!(check_produced(&Bytes::from(b)).is_err());
        // Last offset delta disagrees with the count.
        let mut b = good.to_vec();
        b[LAST_OFFSET_DELTA_OFFSET..LAST_OFFSET_DELTA_OFFSET + 4]
            .copy_from_slice(&5i32.to_be_bytes());
        let crc = crc32c::crc32c(&b[ATTRIBUTES_OFFSET..]);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            check_produced(&Bytes::from(b)),
            Err(BatchError::Mismatch(_))
        ));
        // A flipped bit fails the CRC; no records at all is refused.
        let mut b = good.to_vec();
        *b.last_mut().unwrap() ^= 1;
        assert!(matches!(
            check_produced(&Bytes::from(b)),
            Err(BatchError::Crc { .. })
        ));
        assert!(check_produced(&encode_batch(0, &[])).is_err());
    }

    #[test]
    fn huge_declared_count_is_rejected_without_allocating() {
        let mut b = encode_batch(0, &[]).to_vec();
        b[RECORDS_COUNT_OFFSET..RECORDS_COUNT_OFFSET + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&b[ATTRIBUTES_OFFSET..]);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        assert!(matches!(
            decode_batch(&b),
            Err(BatchError::BadLength { .. })
        ));
    }

    fn arb_record() -> impl Strategy<Value = Record> {
        (
            any::<i64>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(
                ("[a-z]{0,8}", proptest::collection::vec(any::<u8>(), 0..8)),
                0..4,
            ),
        )
            .prop_map(|(ts, key, value, headers)| Record {
                timestamp_ms: ts,
                key: key.map(Bytes::from),
                value: Bytes::from(value),
                headers: headers
                    .into_iter()
                    .map(|(k, v)| (k, Bytes::from(v)))
                    .collect(),
            })
    }

    proptest! {
        #[test]
        fn prop_round_trip(base in any::<u64>(), records in proptest::collection::vec(arb_record(), 0..8)) {
            let b = encode_batch(base, &records);
            let d = decode_batch(&b).unwrap();
            prop_assert_eq!(d.base_offset, base);
            prop_assert_eq!(&d.records, &records);
            prop_assert_eq!(record_count(&b).unwrap() as usize, records.len());
        }

        /// The lazy reader yields what `decode_batch` does, from any record on, and its values
        /// are slices of the batch's own buffer.
        #[test]
        fn prop_lazy_reader_matches_decode_from_any_record(
            records in proptest::collection::vec(arb_record(), 0..8),
            skip in 0usize..10,
        ) {
            let b = encode_batch(9, &records);
            let mut lazy = batch_records(&b).unwrap();
            prop_assert_eq!(lazy.base_offset(), 9);
            lazy.skip_records(skip).unwrap();
            prop_assert_eq!(lazy.remaining(), records.len().saturating_sub(skip));
            let rest: Vec<Record> = lazy.map(|r| r.unwrap()).collect();
            prop_assert_eq!(&rest[..], &records[skip.min(records.len())..]);
            let range = b.as_ptr() as usize..b.as_ptr() as usize + b.len();
            for r in rest.iter().filter(|r| !r.value.is_empty()) {
                prop_assert!(range.contains(&(r.value.as_ptr() as usize)));
            }
        }

        #[test]
        fn prop_garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_batch(&data);
            let _ = record_count(&data);
            let _ = offset_span(&data);
            let _ = batch_len(&data);
        }

        #[test]
        fn prop_garbage_with_valid_crc_never_panics(
            records in proptest::collection::vec(arb_record(), 0..4),
            idx in any::<prop::sample::Index>(),
            byte in any::<u8>(),
        ) {
            // Corrupt the record area but fix the CRC so the record parser itself is exercised.
            let mut b = encode_batch(0, &records).to_vec();
            let i = ATTRIBUTES_OFFSET + idx.index(b.len() - ATTRIBUTES_OFFSET);
            b[i] = byte;
            let crc = crc32c::crc32c(&b[ATTRIBUTES_OFFSET..]);
            b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
            let _ = decode_batch(&b);
            let b = Bytes::from(b);
            if let Ok(mut lazy) = batch_records(&b) {
                let _ = lazy.clone().skip_records(idx.index(5));
                while let Some(Ok(_)) = lazy.next() {}
            }
        }

        /// Without the CRC pass, damaged bytes still give errors, never panics.
        #[test]
        fn prop_unverified_reader_never_panics(
            records in proptest::collection::vec(arb_record(), 0..4),
            idx in any::<prop::sample::Index>(),
            byte in any::<u8>(),
            skip in 0usize..5,
        ) {
            let mut b = encode_batch(0, &records).to_vec();
            let i = idx.index(b.len());
            b[i] = byte;
            let b = Bytes::from(b);
            if let Ok(mut lazy) = batch_records_verified(&b) {
                let _ = lazy.clone().skip_records(skip);
                while let Some(Ok(_)) = lazy.next() {}
            }
        }

        #[test]
        fn prop_flipped_byte_fails(
            records in proptest::collection::vec(arb_record(), 1..4),
            idx in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let mut b = encode_batch(0, &records).to_vec();
            // Bytes covered by the CRC, or the CRC itself.
            let i = CRC_OFFSET + idx.index(b.len() - CRC_OFFSET);
            b[i] ^= 1 << bit;
            prop_assert!(decode_batch(&b).is_err());
        }
    }
}
