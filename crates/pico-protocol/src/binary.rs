//! The `application/vnd.picomq.batch` framing, big-endian:
//! `u8 version (1) | u32 count | count × (u64 seq | i64 timestamp | u16 header count |
//! header count × (u16 key len | key | u32 value len | value) | u32 body len | body)`.
//! Reads send seqs; POST bodies may send anything there (it is ignored). Keys are not carried.

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;

use crate::reader::ByteReader;
use crate::record::Record;

pub const VERSION: u8 = 1;
/// Most headers one record may carry: the framing counts them in a u16.
pub const MAX_HEADERS: usize = u16::MAX as usize;
/// Most headers one append may carry in all. A decoded header costs ~10 times its smallest
/// encoding (a `String` and a `Bytes`, 56 bytes, for 6 bytes on the wire), so without this a
/// 32 MiB body of empty headers would take ~300 MB to parse; 100,000 is 10 per record at the
/// 10,000-record limit.
pub const MAX_HEADERS_PER_APPEND: usize = 100_000;
/// Longest header key: the framing prefixes it with a u16 length.
pub const MAX_HEADER_KEY_LEN: usize = u16::MAX as usize;
/// seq + timestamp + header count + body len.
const MIN_RECORD_LEN: usize = 8 + 8 + 2 + 4;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BinaryError {
    #[error("unsupported binary batch version: version={0}")]
    Version(u8),
    #[error("binary batch truncated: field={field} index={index}")]
    Truncated { field: &'static str, index: usize },
    #[error("binary batch count exceeds body: count={count} bytes={bytes}")]
    Count { count: u32, bytes: usize },
    #[error("binary batch has trailing bytes: extra={0}")]
    Trailing(usize),
    #[error("header key is not UTF-8: index={0}")]
    HeaderKey(usize),
    #[error("header value is not UTF-8: key=`{0}`")]
    HeaderValue(String),
    #[error("header key repeated: key=`{0}`")]
    DuplicateHeader(String),
    #[error("field too long for the framing: field={field} len={len}")]
    TooLong { field: &'static str, len: usize },
    #[error("too many records in one batch: count={count} max={max}")]
    TooMany { count: u32, max: usize },
    #[error("too many headers in one batch: max={max}")]
    TooManyHeaders { max: usize },
}

/// Checks that `r` can be framed by [`encode_binary`] and rendered as JSON without loss (the
/// JSON form's headers are an object of strings: unique keys, UTF-8 values). Appends check it so
/// that every stored record stays readable, whole, in every format.
pub fn check_storable(r: &Record) -> Result<(), BinaryError> {
    let too_long = |field, len| BinaryError::TooLong { field, len };
    if r.headers.len() > MAX_HEADERS {
        return Err(too_long("header count", r.headers.len()));
    }
    for (k, v) in &r.headers {
        if k.len() > MAX_HEADER_KEY_LEN {
            return Err(too_long("header key", k.len()));
        }
        if u32::try_from(v.len()).is_err() {
            return Err(too_long("header value", v.len()));
        }
        if std::str::from_utf8(v).is_err() {
            return Err(BinaryError::HeaderValue(k.clone()));
        }
    }
    if r.headers.len() > 1 {
        let mut seen = std::collections::HashSet::with_capacity(r.headers.len());
        if let Some((k, _)) = r.headers.iter().find(|(k, _)| !seen.insert(k.as_str())) {
            return Err(BinaryError::DuplicateHeader(k.clone()));
        }
    }
    if u32::try_from(r.value.len()).is_err() {
        return Err(too_long("body", r.value.len()));
    }
    Ok(())
}

/// Encodes `(seq, record)` pairs.
pub fn encode_binary<'a>(
    records: impl IntoIterator<Item = (u64, &'a Record)>,
) -> Result<Bytes, BinaryError> {
    let mut buf = BytesMut::new();
    buf.put_u8(VERSION);
    buf.put_u32(0); // count, patched below
    let mut count: u32 = 0;
    for (seq, r) in records {
        buf.put_u64(seq);
        buf.put_i64(r.timestamp_ms);
        let n = u16::try_from(r.headers.len()).map_err(|_| BinaryError::TooLong {
            field: "header count",
            len: r.headers.len(),
        })?;
        buf.put_u16(n);
        for (k, v) in &r.headers {
            let kl = u16::try_from(k.len()).map_err(|_| BinaryError::TooLong {
                field: "header key",
                len: k.len(),
            })?;
            buf.put_u16(kl);
            buf.put_slice(k.as_bytes());
            put_u32_len(&mut buf, "header value", v.len())?;
            buf.put_slice(v);
        }
        put_u32_len(&mut buf, "body", r.value.len())?;
        buf.put_slice(&r.value);
        count = count.checked_add(1).ok_or(BinaryError::TooLong {
            field: "count",
            len: usize::MAX,
        })?;
    }
    buf[1..5].copy_from_slice(&count.to_be_bytes());
    Ok(buf.freeze())
}

fn put_u32_len(buf: &mut BytesMut, field: &'static str, len: usize) -> Result<(), BinaryError> {
    let l = u32::try_from(len).map_err(|_| BinaryError::TooLong { field, len })?;
    buf.put_u32(l);
    Ok(())
}

/// Decodes a binary batch into `(seq, record)` pairs.
pub fn decode_binary(data: &[u8]) -> Result<Vec<(u64, Record)>, BinaryError> {
    decode(data, usize::MAX, usize::MAX)
}

/// Decodes a batch of at most `max_records` records; a larger count is refused before any
/// record is decoded.
fn decode(
    data: &[u8],
    max_records: usize,
    max_headers: usize,
) -> Result<Vec<(u64, Record)>, BinaryError> {
    let mut c = ByteReader::new(data);
    let version = c.u8().ok_or(BinaryError::Truncated {
        field: "version",
        index: 0,
    })?;
    if version != VERSION {
        return Err(BinaryError::Version(version));
    }
    let count = c.u32().ok_or(BinaryError::Truncated {
        field: "count",
        index: 0,
    })?;
    if count as usize > max_records {
        return Err(BinaryError::TooMany {
            count,
            max: max_records,
        });
    }
    if (count as usize).saturating_mul(MIN_RECORD_LEN) > c.remaining() {
        return Err(BinaryError::Count {
            count,
            bytes: c.remaining(),
        });
    }
    let mut out = Vec::with_capacity(count as usize);
    let mut headers_left = max_headers;
    for index in 0..count as usize {
        let t = |field| BinaryError::Truncated { field, index };
        let seq = c.u64().ok_or(t("seq"))?;
        let ts = c.u64().ok_or(t("timestamp"))? as i64;
        let n = c.u16().ok_or(t("header count"))? as usize;
        // Each header is at least 6 bytes (two length prefixes).
        if n.saturating_mul(6) > c.remaining() {
            return Err(t("headers"));
        }
        headers_left = headers_left
            .checked_sub(n)
            .ok_or(BinaryError::TooManyHeaders { max: max_headers })?;
        let mut headers = Vec::with_capacity(n);
        for _ in 0..n {
            let kl = c.u16().ok_or(t("header key len"))? as usize;
            let k = c.take(kl).ok_or(t("header key"))?;
            let k = String::from_utf8(k.to_vec()).map_err(|_| BinaryError::HeaderKey(index))?;
            let vl = c.u32().ok_or(t("header value len"))? as usize;
            let v = c.take(vl).ok_or(t("header value"))?;
            headers.push((k, Bytes::copy_from_slice(v)));
        }
        let bl = c.u32().ok_or(t("body len"))? as usize;
        let body = c.take(bl).ok_or(t("body"))?;
        out.push((
            seq,
            Record {
                timestamp_ms: ts,
                key: None,
                value: Bytes::copy_from_slice(body),
                headers,
            },
        ));
    }
    if c.remaining() != 0 {
        return Err(BinaryError::Trailing(c.remaining()));
    }
    Ok(out)
}

/// Decodes a POST body: seqs are dropped, timestamps reset to 0 (the server assigns them).
pub fn decode_binary_records(data: &[u8]) -> Result<Vec<Record>, BinaryError> {
    decode_binary_append(data, usize::MAX)
}

/// [`decode_binary_records`] for a body of at most `max_records` records (an append's limit):
/// a larger count is refused from the batch header, before anything is allocated for it.
pub fn decode_binary_append(data: &[u8], max_records: usize) -> Result<Vec<Record>, BinaryError> {
    Ok(decode(data, max_records, MAX_HEADERS_PER_APPEND)?
        .into_iter()
        .map(|(_, mut r)| {
            r.timestamp_ms = 0;
            r
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An append's headers are bounded in all, not only per record: decoded, each costs ~10
    /// times its smallest encoding. Reading stored batches is not limited.
    #[test]
    fn an_appends_headers_are_bounded_in_all() {
        let record = |n: usize| Record {
            timestamp_ms: 0,
            key: None,
            value: Bytes::new(),
            headers: (0..n).map(|i| (format!("{i}"), Bytes::new())).collect(),
        };
        let per = MAX_HEADERS_PER_APPEND / 4;
        let fits: Vec<Record> = (0..4).map(|_| record(per)).collect();
        let b = encode_binary(fits.iter().map(|r| (0, r))).unwrap();
        assert_eq!(decode_binary_append(&b, 10).unwrap().len(), 4);
        let over: Vec<Record> = (0..5).map(|_| record(per)).collect();
        let b = encode_binary(over.iter().map(|r| (0, r))).unwrap();
        assert_eq!(
            decode_binary_append(&b, 10),
            Err(BinaryError::TooManyHeaders {
                max: MAX_HEADERS_PER_APPEND
            })
        );
        assert_eq!(decode_binary(&b).unwrap().len(), 5);
    }

    #[test]
    fn known_layout() {
        let r = Record {
            timestamp_ms: 2,
            key: None,
            value: Bytes::from_static(b"ab"),
            headers: vec![("k".into(), Bytes::from_static(b"v"))],
        };
        let b = encode_binary([(1, &r)]).unwrap();
        let want: Vec<u8> = [
            &[1u8][..],
            &1u32.to_be_bytes(),
            &1u64.to_be_bytes(),
            &2i64.to_be_bytes(),
            &1u16.to_be_bytes(),
            &1u16.to_be_bytes(),
            b"k",
            &1u32.to_be_bytes(),
            b"v",
            &2u32.to_be_bytes(),
            b"ab",
        ]
        .concat();
        assert_eq!(&b[..], &want[..]);
        assert_eq!(decode_binary(&b).unwrap(), vec![(1, r)]);
    }

    #[test]
    fn strict_validation() {
        assert_eq!(
            decode_binary(&[]),
            Err(BinaryError::Truncated {
                field: "version",
                index: 0
            })
        );
        assert_eq!(
            decode_binary(&[2, 0, 0, 0, 0]),
            Err(BinaryError::Version(2))
        );
        assert!(matches!(
            decode_binary(&[1, 255, 255, 255, 255]),
            Err(BinaryError::Count { .. })
        ));
        let mut b = encode_binary([(0, &Record::from_value("x"))])
            .unwrap()
            .to_vec();
        b.push(0);
        assert_eq!(decode_binary(&b), Err(BinaryError::Trailing(1)));
        b.truncate(b.len() - 2);
        assert!(matches!(
            decode_binary(&b),
            Err(BinaryError::Truncated { field: "body", .. })
        ));
        assert_eq!(decode_binary(&[1, 0, 0, 0, 0]).unwrap(), vec![]);
    }

    #[test]
    fn append_limit_is_checked_from_the_header() {
        let rec = Record::from_value("x");
        let three = encode_binary([(0, &rec), (1, &rec), (2, &rec)]).unwrap();
        assert_eq!(decode_binary_append(&three, 3).unwrap().len(), 3);
        assert_eq!(
            decode_binary_append(&three, 2),
            Err(BinaryError::TooMany { count: 3, max: 2 })
        );
        // Refused from the count alone: the records themselves are never looked at.
        assert_eq!(
            decode_binary_append(&[1, 0, 0, 0, 3], 2),
            Err(BinaryError::TooMany { count: 3, max: 2 })
        );
        let e = decode_binary_append(&three, 2).unwrap_err().to_string();
        assert!(e.contains("max=2"), "{e}");
    }

    #[test]
    fn framable_records_fit_the_u16_fields() {
        let mut r = Record::from_value("x");
        r.headers = vec![("k".repeat(MAX_HEADER_KEY_LEN), Bytes::new())];
        assert_eq!(check_storable(&r), Ok(()));
        assert!(encode_binary([(0, &r)]).is_ok());
        r.headers = vec![("k".repeat(MAX_HEADER_KEY_LEN + 1), Bytes::new())];
        assert_eq!(
            check_storable(&r),
            Err(BinaryError::TooLong {
                field: "header key",
                len: MAX_HEADER_KEY_LEN + 1
            })
        );
        assert!(encode_binary([(0, &r)]).is_err());
        r.headers = vec![(String::new(), Bytes::new()); MAX_HEADERS + 1];
        assert!(matches!(
            check_storable(&r),
            Err(BinaryError::TooLong {
                field: "header count",
                ..
            })
        ));
        assert!(encode_binary([(0, &r)]).is_err());
    }

    #[test]
    fn framable_records_render_as_json_whole() {
        let mut r = Record::from_value("x");
        r.headers = vec![
            ("a".into(), Bytes::from_static(b"1")),
            ("b".into(), Bytes::new()),
        ];
        assert_eq!(check_storable(&r), Ok(()));
        // The JSON form's headers are an object of strings: a repeated key or bytes that are
        // not UTF-8 would be lost there.
        r.headers.push(("a".into(), Bytes::from_static(b"2")));
        assert_eq!(
            check_storable(&r),
            Err(BinaryError::DuplicateHeader("a".into()))
        );
        r.headers = vec![("v".into(), Bytes::from_static(&[0xff]))];
        assert_eq!(
            check_storable(&r),
            Err(BinaryError::HeaderValue("v".into()))
        );
    }

    fn arb_record() -> impl Strategy<Value = Record> {
        (
            any::<i64>(),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::vec(
                ("\\PC{0,8}", proptest::collection::vec(any::<u8>(), 0..8)),
                0..4,
            ),
        )
            .prop_map(|(ts, value, headers)| Record {
                timestamp_ms: ts,
                key: None,
                value: Bytes::from(value),
                headers: headers
                    .into_iter()
                    .map(|(k, v)| (k, Bytes::from(v)))
                    .collect(),
            })
    }

    proptest! {
        #[test]
        fn prop_round_trip(recs in proptest::collection::vec((any::<u64>(), arb_record()), 0..8)) {
            let b = encode_binary(recs.iter().map(|(s, r)| (*s, r))).unwrap();
            prop_assert_eq!(decode_binary(&b).unwrap(), recs.clone());
            let plain = decode_binary_records(&b).unwrap();
            prop_assert_eq!(plain.len(), recs.len());
            prop_assert!(plain.iter().all(|r| r.timestamp_ms == 0));
        }

        #[test]
        fn prop_garbage_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_binary(&data);
        }

        #[test]
        fn prop_truncation_fails(recs in proptest::collection::vec((any::<u64>(), arb_record()), 1..4), cut in any::<prop::sample::Index>()) {
            let b = encode_binary(recs.iter().map(|(s, r)| (*s, r))).unwrap();
            let n = cut.index(b.len());
            prop_assert!(decode_binary(&b[..n]).is_err());
        }
    }
}
