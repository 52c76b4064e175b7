//! Kafka batch compression (attributes bits 0–2: gzip, snappy, lz4, zstd), decompression only.
//!
//! Compressed batches are stored as their producer sent them; whoever reads their records
//! (every HTTP and Durable Streams read, the produce-time check) inflates them here. Every
//! codec is bounded by a cap on the decompressed size, checked as the output grows or against
//! the size the format declares before anything is allocated, so a small hostile batch cannot
//! make the node allocate gigabytes.

use std::io::Read;

use crate::batch::BatchError;

/// The most a batch's records may inflate to. Kafka clients batch at most `batch.size`
/// (16 KiB–1 MiB typically) before compressing; 64 MiB leaves room for any sane producer.
pub const MAX_DECOMPRESSED: usize = 64 << 20;

/// zstd window the decoder may allocate (2^25 = 32 MiB): producers compress one batch at a
/// time, so their frames' windows fit their content, far below this.
const ZSTD_WINDOW_LOG_MAX: u32 = 25;

/// The xerial snappy framing Java clients use: magic, version, compatible version, then
/// blocks each prefixed by its compressed length (i32).
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
const XERIAL_HEADER_LEN: usize = 16;

/// A batch's compression codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Codec {
    /// The codec named by a batch's attributes; `None` for the undefined values 5–7.
    pub fn from_attributes(attributes: i16) -> Option<Codec> {
        Some(match attributes & 0x07 {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Gzip => "gzip",
            Codec::Snappy => "snappy",
            Codec::Lz4 => "lz4",
            Codec::Zstd => "zstd",
        }
    }
}

/// Inflates `data` compressed with `codec`, refusing output beyond `cap` bytes.
pub fn decompress(codec: Codec, data: &[u8], cap: usize) -> Result<Vec<u8>, BatchError> {
    let name = codec.name();
    let failed = |e: std::io::Error| BatchError::Decompress {
        codec: name,
        reason: e.to_string(),
    };
    match codec {
        Codec::None => {
            if data.len() > cap {
                return Err(BatchError::Inflated { codec: name, cap });
            }
            Ok(data.to_vec())
        }
        Codec::Gzip => read_bounded(
            flate2::read::MultiGzDecoder::new(data),
            name,
            cap,
            data.len(),
        ),
        Codec::Lz4 => read_bounded(
            lz4_flex::frame::FrameDecoder::new(data),
            name,
            cap,
            data.len(),
        ),
        Codec::Zstd => {
            let mut d = zstd::stream::read::Decoder::with_buffer(data).map_err(failed)?;
            d.window_log_max(ZSTD_WINDOW_LOG_MAX).map_err(failed)?;
            read_bounded(d, name, cap, data.len())
        }
        Codec::Snappy => snappy(data, cap),
    }
}

/// Reads `r` to its end, at most `cap` bytes: one byte more is the proof it inflates past it.
fn read_bounded(
    r: impl Read,
    codec: &'static str,
    cap: usize,
    hint: usize,
) -> Result<Vec<u8>, BatchError> {
    let mut out = Vec::with_capacity(hint.saturating_mul(4).min(cap));
    r.take(cap as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| BatchError::Decompress {
            codec,
            reason: e.to_string(),
        })?;
    if out.len() > cap {
        return Err(BatchError::Inflated { codec, cap });
    }
    Ok(out)
}

/// Snappy, framed the xerial way (Java clients) or raw (librdkafka): Kafka brokers accept both.
fn snappy(data: &[u8], cap: usize) -> Result<Vec<u8>, BatchError> {
    let bad = |reason: String| BatchError::Decompress {
        codec: "snappy",
        reason,
    };
    if !data.starts_with(&XERIAL_MAGIC) {
        return snappy_block(data, cap, Vec::new());
    }
    let mut rest = data.get(XERIAL_HEADER_LEN..).ok_or_else(|| {
        bad(format!(
            "xerial header truncated: len={} need={XERIAL_HEADER_LEN}",
            data.len()
        ))
    })?;
    let mut out = Vec::new();
    while !rest.is_empty() {
        let (len, tail) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| bad("xerial block length truncated".into()))?;
        let len = u32::from_be_bytes(*len) as usize;
        let block = tail.get(..len).ok_or_else(|| {
            bad(format!(
                "xerial block truncated: declared={len} have={}",
                tail.len()
            ))
        })?;
        out = snappy_block(block, cap, out)?;
        rest = &tail[len..];
    }
    Ok(out)
}

/// Appends one raw snappy block to `out`; its declared length is checked against the cap
/// before any room is made for it.
fn snappy_block(block: &[u8], cap: usize, mut out: Vec<u8>) -> Result<Vec<u8>, BatchError> {
    let bad = |e: snap::Error| BatchError::Decompress {
        codec: "snappy",
        reason: e.to_string(),
    };
    let len = snap::raw::decompress_len(block).map_err(bad)?;
    if out.len().saturating_add(len) > cap {
        return Err(BatchError::Inflated {
            codec: "snappy",
            cap,
        });
    }
    let at = out.len();
    out.resize(at + len, 0);
    let n = snap::raw::Decoder::new()
        .decompress(block, &mut out[at..])
        .map_err(bad)?;
    out.truncate(at + n);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const TEXT: &[u8] = b"the same words again and again, the same words again and again";

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn lz4(data: &[u8]) -> Vec<u8> {
        let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn xerial(data: &[u8]) -> Vec<u8> {
        let mut out = XERIAL_MAGIC.to_vec();
        out.extend_from_slice(&1i32.to_be_bytes());
        out.extend_from_slice(&1i32.to_be_bytes());
        for chunk in data.chunks(16) {
            let c = snap::raw::Encoder::new().compress_vec(chunk).unwrap();
            out.extend_from_slice(&(c.len() as u32).to_be_bytes());
            out.extend_from_slice(&c);
        }
        out
    }

    #[test]
    fn every_codec_round_trips() {
        let cases = [
            (Codec::Gzip, gzip(TEXT)),
            (Codec::Lz4, lz4(TEXT)),
            (Codec::Zstd, zstd::encode_all(TEXT, 3).unwrap()),
            (
                Codec::Snappy,
                snap::raw::Encoder::new().compress_vec(TEXT).unwrap(),
            ),
            (Codec::Snappy, xerial(TEXT)),
        ];
        for (codec, data) in cases {
            assert_eq!(
                decompress(codec, &data, 1 << 20).unwrap(),
                TEXT,
                "{codec:?}"
            );
        }
    }

    /// A bomb (little that inflates to 16 MiB) is refused at the cap, whatever the codec.
    #[test]
    fn inflation_past_the_cap_is_refused() {
        let big = vec![0u8; 16 << 20];
        let cap = 1 << 20;
        let cases = [
            (Codec::Gzip, gzip(&big)),
            (Codec::Lz4, lz4(&big)),
            (Codec::Zstd, zstd::encode_all(&big[..], 3).unwrap()),
            (Codec::Snappy, xerial(&big[..2 << 20])),
            (
                Codec::Snappy,
                snap::raw::Encoder::new()
                    .compress_vec(&big[..2 << 20])
                    .unwrap(),
            ),
        ];
        for (codec, data) in cases {
            assert!(
                data.len() < 8 << 20,
                "{codec:?} compressed to {}",
                data.len()
            );
            assert_eq!(
                decompress(codec, &data, cap),
                Err(BatchError::Inflated {
                    codec: codec.name(),
                    cap
                }),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for codec in [Codec::Gzip, Codec::Snappy, Codec::Lz4, Codec::Zstd] {
            for data in [&b""[..], b"\x00\x01\x02", &XERIAL_MAGIC, &[0xff; 64]] {
                let _ = decompress(codec, data, 1 << 20);
            }
        }
        // A raw snappy block declaring 4 GiB is refused before allocating.
        assert!(matches!(
            decompress(Codec::Snappy, &[0xff, 0xff, 0xff, 0xff, 0x0f], 1 << 20),
            Err(BatchError::Inflated { .. })
        ));
    }
}
