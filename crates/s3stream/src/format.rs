//! Sans-IO codecs for the two on-storage formats: WAL entry objects and data objects.
//!
//! WAL entry (one object per `Wal::append`), all integers little-endian:
//! ```text
//! "PMQW" u32 version=1 u64 position u32 record_count
//! record_count x ( u64 stream i64 epoch u64 base_offset u32 record_count
//!                  u32 batch_len batch u32 aux_len aux )
//! u32 crc32c(everything above)
//! ```
//! Data object: `"PMQD" u32 version=1` then frames, each
//! `u64 base_offset u32 record_count u32 len u32 crc32c(header fields + data) data`.
//! A slice (position, len) always covers whole frames of one stream, so it decodes on its own.

use bytes::{Buf, Bytes};

use crate::crc;
use crate::parts::{Parts, PartsWriter};
use crate::wal::WalRecord;

pub const WAL_MAGIC: &[u8; 4] = b"PMQW";
pub const DATA_MAGIC: &[u8; 4] = b"PMQD";
pub const FORMAT_VERSION: u32 = 1;
/// Bytes before the first frame of a data object.
pub const DATA_HEADER_LEN: usize = 8;
/// Bytes of a frame header (before the batch bytes).
pub const FRAME_HEADER_LEN: usize = 20;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum FormatError {
    #[error("truncated: need {need} more bytes at {at}")]
    Truncated { at: usize, need: usize },
    #[error("bad magic")]
    BadMagic,
    #[error("unsupported format version: version={0}")]
    UnsupportedVersion(u32),
    #[error("checksum mismatch: stored={stored:#010x} computed={computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("invalid: {0}")]
    Invalid(&'static str),
}

/// A batch as stored in a data object frame.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredBatch {
    pub base_offset: u64,
    pub record_count: u32,
    pub data: Bytes,
}

impl StoredBatch {
    pub fn next_offset(&self) -> u64 {
        self.base_offset + u64::from(self.record_count)
    }
}

fn need(buf: &[u8], at: usize, n: usize) -> Result<(), FormatError> {
    if buf.len() < n {
        Err(FormatError::Truncated {
            at,
            need: n - buf.len(),
        })
    } else {
        Ok(())
    }
}

fn len_u32(n: usize) -> Result<u32, FormatError> {
    u32::try_from(n).map_err(|_| FormatError::Invalid("length exceeds u32"))
}

/// Encodes one WAL entry object.
pub fn encode_wal_entry(position: u64, records: &[WalRecord]) -> Result<Bytes, FormatError> {
    Ok(encode_wal_entry_parts(position, records)?.concat())
}

/// Encodes one WAL entry as pieces (large batches referenced, not copied), the CRC32C chained
/// over them in order: the same bytes as [`encode_wal_entry`].
pub fn encode_wal_entry_parts(position: u64, records: &[WalRecord]) -> Result<Parts, FormatError> {
    let small: usize = 20
        + records
            .iter()
            .map(|r| 36 + PartsWriter::copied(r.batch.len()) + PartsWriter::copied(r.aux.len()))
            .sum::<usize>()
        + 4;
    let mut w = PartsWriter::with_crc(small);
    let mut head = [0u8; 36];
    head[..4].copy_from_slice(WAL_MAGIC);
    head[4..8].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    head[8..16].copy_from_slice(&position.to_le_bytes());
    head[16..20].copy_from_slice(&len_u32(records.len())?.to_le_bytes());
    w.put_slice(&head[..20]);
    for r in records {
        head[..8].copy_from_slice(&r.stream.to_le_bytes());
        head[8..16].copy_from_slice(&r.epoch.to_le_bytes());
        head[16..24].copy_from_slice(&r.base_offset.to_le_bytes());
        head[24..28].copy_from_slice(&r.record_count.to_le_bytes());
        head[28..32].copy_from_slice(&len_u32(r.batch.len())?.to_le_bytes());
        w.put_slice(&head[..32]);
        w.put_bytes_crc(&r.batch, r.batch_crc);
        w.put_slice(&len_u32(r.aux.len())?.to_le_bytes());
        // The aux bytes (a producer's state) carry no CRC of their own.
        w.put_bytes(&r.aux);
    }
    // The writer keeps the CRC of everything above: it was made `with_crc`, so this is `Some`
    // (a writer without one would store 0, which recovery would refuse as corrupt).
    let crc = w.crc();
    debug_assert!(crc.is_some(), "the WAL entry's writer keeps a CRC");
    let crc = crc.unwrap_or_default();
    w.put_slice(&crc.to_le_bytes());
    Ok(w.finish())
}

/// Decodes and verifies one WAL entry object: returns its position and records.
pub fn decode_wal_entry(data: &Bytes) -> Result<(u64, Vec<WalRecord>), FormatError> {
    need(data, 0, 24)?;
    let body_len = data.len() - 4;
    let stored = u32::from_le_bytes([
        data[body_len],
        data[body_len + 1],
        data[body_len + 2],
        data[body_len + 3],
    ]);
    let computed = crc32c::crc32c(&data[..body_len]);
    if stored != computed {
        return Err(FormatError::Checksum { stored, computed });
    }
    let mut cur = data.slice(..body_len);
    if &cur[..4] != WAL_MAGIC {
        return Err(FormatError::BadMagic);
    }
    cur.advance(4);
    let version = cur.get_u32_le();
    if version != FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    let position = cur.get_u64_le();
    let count = cur.get_u32_le() as usize;
    let mut records = Vec::with_capacity(count.min(4096));
    for _ in 0..count {
        let at = body_len - cur.len();
        need(&cur, at, 32)?;
        let stream = cur.get_u64_le();
        let epoch = cur.get_i64_le();
        let base_offset = cur.get_u64_le();
        let record_count = cur.get_u32_le();
        let batch_len = cur.get_u32_le() as usize;
        need(&cur, at + 32, batch_len + 4)?;
        let batch = cur.split_to(batch_len);
        let aux_len = cur.get_u32_le() as usize;
        need(&cur, at + 36 + batch_len, aux_len)?;
        let aux = cur.split_to(aux_len);
        // `new` checksums the batch once more (the uploader's frames extend their CRCs with
        // it): a second pass over what recovery read, never on the append path.
        records.push(WalRecord::new(
            stream,
            epoch,
            base_offset,
            record_count,
            batch,
            aux,
        ));
    }
    if !cur.is_empty() {
        return Err(FormatError::Invalid("trailing bytes after wal records"));
    }
    Ok((position, records))
}

/// Appends the data object header.
pub fn put_data_header(w: &mut PartsWriter) {
    w.put_slice(DATA_MAGIC);
    w.put_slice(&FORMAT_VERSION.to_le_bytes());
}

/// Verifies the data object header.
pub fn check_data_header(data: &[u8]) -> Result<(), FormatError> {
    need(data, 0, DATA_HEADER_LEN)?;
    if &data[..4] != DATA_MAGIC {
        return Err(FormatError::BadMagic);
    }
    let version = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
    if version != FORMAT_VERSION {
        return Err(FormatError::UnsupportedVersion(version));
    }
    Ok(())
}

/// Appends one frame (a large `data` by reference, its checksum extended with
/// `data_crc = crc32c(data)`); returns the number of bytes written.
pub fn put_frame(
    w: &mut PartsWriter,
    base_offset: u64,
    record_count: u32,
    data: &Bytes,
    data_crc: u32,
) -> Result<usize, FormatError> {
    let len = len_u32(data.len())?;
    let mut header = [0u8; 16];
    header[..8].copy_from_slice(&base_offset.to_le_bytes());
    header[8..12].copy_from_slice(&record_count.to_le_bytes());
    header[12..16].copy_from_slice(&len.to_le_bytes());
    let crc = crc::chain(crc32c::crc32c(&header), data, data_crc);
    w.put_slice(&header);
    w.put_slice(&crc.to_le_bytes());
    w.put_bytes(data);
    Ok(FRAME_HEADER_LEN + data.len())
}

/// Decodes a run of whole frames (a slice), verifying every frame checksum.
pub fn decode_frames(slice: &Bytes) -> Result<Vec<StoredBatch>, FormatError> {
    let mut cur = slice.clone();
    let mut out = Vec::new();
    while !cur.is_empty() {
        let at = slice.len() - cur.len();
        need(&cur, at, FRAME_HEADER_LEN)?;
        let header: [u8; 16] = cur[..16]
            .try_into()
            .map_err(|_| FormatError::Invalid("frame header"))?;
        cur.advance(16);
        let base_offset = u64::from_le_bytes(header[..8].try_into().unwrap_or([0; 8]));
        let record_count = u32::from_le_bytes(header[8..12].try_into().unwrap_or([0; 4]));
        let len = u32::from_le_bytes(header[12..16].try_into().unwrap_or([0; 4])) as usize;
        let stored = cur.get_u32_le();
        need(&cur, at + FRAME_HEADER_LEN, len)?;
        let data = cur.split_to(len);
        let computed = crc32c::crc32c_append(crc32c::crc32c(&header), &data);
        if stored != computed {
            return Err(FormatError::Checksum { stored, computed });
        }
        out.push(StoredBatch {
            base_offset,
            record_count,
            data,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parts::COPY_BELOW;
    use bytes::{BufMut, BytesMut};
    use proptest::prelude::*;

    /// Small batches (copied into the encoder's buffer), large ones (referenced) and larger
    /// ones (checksummed by combining).
    fn batch_bytes() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            3 => proptest::collection::vec(any::<u8>(), 0..64),
            1 => proptest::collection::vec(any::<u8>(), COPY_BELOW - 2..COPY_BELOW + 64),
            // Checksums extended by combining the batch's own CRC.
            1 => proptest::collection::vec(any::<u8>(), crate::crc::COMBINE_MIN - 2..crate::crc::COMBINE_MIN + 64),
        ]
    }

    fn record() -> impl Strategy<Value = WalRecord> {
        (
            any::<u64>(),
            any::<i64>(),
            any::<u64>(),
            any::<u32>(),
            batch_bytes(),
            proptest::collection::vec(any::<u8>(), 0..16),
        )
            .prop_map(|(stream, epoch, base_offset, record_count, b, a)| {
                WalRecord::new(
                    stream,
                    epoch,
                    base_offset,
                    record_count,
                    Bytes::from(b),
                    Bytes::from(a),
                )
            })
    }

    proptest! {
        #[test]
        fn wal_entry_round_trips(pos in any::<u64>(), recs in proptest::collection::vec(record(), 0..8)) {
            let enc = encode_wal_entry(pos, &recs).unwrap();
            let (p, dec) = decode_wal_entry(&enc).unwrap();
            prop_assert_eq!(p, pos);
            prop_assert_eq!(dec, recs);
        }

        #[test]
        fn wal_entry_corruption_is_detected(
            pos in any::<u64>(),
            recs in proptest::collection::vec(record(), 0..8),
            idx in any::<prop::sample::Index>(),
            flip in 1u8..=255,
        ) {
            let enc = encode_wal_entry(pos, &recs).unwrap();
            let mut bad = enc.to_vec();
            let i = idx.index(bad.len());
            bad[i] ^= flip;
            prop_assert!(decode_wal_entry(&Bytes::from(bad)).is_err());
            // Truncation is detected too.
            let cut = idx.index(enc.len());
            prop_assert!(decode_wal_entry(&enc.slice(..cut)).is_err());
        }

        #[test]
        fn frames_round_trip(batches in proptest::collection::vec(
            (any::<u64>(), any::<u32>(), batch_bytes()), 0..8)) {
            let mut w = PartsWriter::with_capacity(0);
            put_data_header(&mut w);
            for (b, c, d) in &batches {
                put_frame(&mut w, *b, *c, &Bytes::from(d.clone()), crc32c::crc32c(d)).unwrap();
            }
            let obj = w.finish().concat();
            check_data_header(&obj).unwrap();
            let dec = decode_frames(&obj.slice(DATA_HEADER_LEN..)).unwrap();
            prop_assert_eq!(dec.len(), batches.len());
            for (d, (b, c, data)) in dec.iter().zip(&batches) {
                prop_assert_eq!(d.base_offset, *b);
                prop_assert_eq!(d.record_count, *c);
                prop_assert_eq!(&d.data[..], &data[..]);
            }
        }

        #[test]
        fn frame_corruption_is_detected(
            base in any::<u64>(), count in any::<u32>(),
            data in batch_bytes(),
            idx in any::<prop::sample::Index>(), flip in 1u8..=255,
        ) {
            let mut w = PartsWriter::with_capacity(0);
            let crc = crc32c::crc32c(&data);
            put_frame(&mut w, base, count, &Bytes::from(data), crc).unwrap();
            let mut bad = w.finish().concat().to_vec();
            let i = idx.index(bad.len());
            bad[i] ^= flip;
            prop_assert!(decode_frames(&Bytes::from(bad)).is_err());
        }
    }

    #[test]
    fn wrong_version_is_rejected() {
        let mut buf = BytesMut::new();
        buf.put_slice(DATA_MAGIC);
        buf.put_u32_le(99);
        assert_eq!(
            check_data_header(&buf),
            Err(FormatError::UnsupportedVersion(99))
        );
        assert_eq!(
            check_data_header(b"XXXX\x01\0\0\0"),
            Err(FormatError::BadMagic)
        );
    }
}
