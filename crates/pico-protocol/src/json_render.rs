//! The `json` read format rendered a piece at a time.
//!
//! A read returns at least one record whole, however large, and its JSON can be several times
//! its size (a control byte escapes to six, base64 is 4/3): rendering it at once for every
//! reader multiplies a large record by the number of readers. [`JsonRecordsWriter`] holds the
//! records (their bytes shared, not copied) and renders about [`CHUNK`] bytes per call, byte for
//! byte what [`render_json`](crate::json_batch::render_json) renders at once (a property test
//! pins it).
//!
//! That equality relies on how `serde_json` writes the object: keys sorted (no
//! `preserve_order`), so the body field (`body` or `body_b64`) comes first, and only it can be
//! large; the rest (headers, key, seq, timestamp) is rendered at once.

use std::collections::VecDeque;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;

use crate::json_batch::record_to_json;
use crate::record::Record;

/// Output per call, roughly.
pub const CHUNK: usize = 64 * 1024;

/// Body bytes consumed per step (escaped, at most 6× this).
const STEP: usize = 8 * 1024;

/// One record still to render.
struct Pending {
    body: Bytes,
    /// The body is valid UTF-8: a JSON string (`body`), else base64 (`body_b64`).
    text: bool,
    /// The object without its body, rendered: `{"headers":…,"seq":…,"timestamp":…}`.
    rest: String,
}

pub struct JsonRecordsWriter {
    records: VecDeque<Pending>,
    /// The body of the front record is being written (its opening is out).
    in_body: bool,
    /// Base64: up to 2 body bytes short of a 3-byte group.
    carry: Vec<u8>,
    started: bool,
    first: bool,
    finished: bool,
}

impl JsonRecordsWriter {
    pub fn new<'a>(records: impl IntoIterator<Item = (u64, &'a Record)>) -> JsonRecordsWriter {
        let records = records
            .into_iter()
            .map(|(seq, r)| {
                let mut head = r.clone();
                head.value = Bytes::new();
                let mut obj = record_to_json(seq, &head);
                if let Some(o) = obj.as_object_mut() {
                    o.remove("body");
                }
                Pending {
                    text: std::str::from_utf8(&r.value).is_ok(),
                    body: r.value.clone(),
                    rest: obj.to_string(),
                }
            })
            .collect();
        JsonRecordsWriter {
            records,
            in_body: false,
            carry: Vec::new(),
            started: false,
            first: true,
            finished: false,
        }
    }

    /// The next piece of the array; `None` once it is all out.
    pub fn next_chunk(&mut self) -> Option<Bytes> {
        if self.finished {
            return None;
        }
        let mut out = Vec::with_capacity(CHUNK + 1024);
        if !self.started {
            self.started = true;
            out.push(b'[');
        }
        while out.len() < CHUNK {
            let Some(rec) = self.records.front_mut() else {
                out.push(b']');
                self.finished = true;
                break;
            };
            if !self.in_body {
                if !std::mem::take(&mut self.first) {
                    out.push(b',');
                }
                out.extend_from_slice(if rec.text {
                    b"{\"body\":\""
                } else {
                    b"{\"body_b64\":\""
                });
                self.in_body = true;
            }
            if !rec.body.is_empty() {
                let piece = rec.body.split_to(rec.body.len().min(STEP));
                if rec.text {
                    escape_into(&piece, &mut out);
                } else {
                    self.carry.extend_from_slice(&piece);
                    let whole = self.carry.len() / 3 * 3;
                    out.extend_from_slice(B64.encode(&self.carry[..whole]).as_bytes());
                    self.carry.drain(..whole);
                }
                continue;
            }
            if !self.carry.is_empty() {
                out.extend_from_slice(B64.encode(&self.carry).as_bytes());
                self.carry.clear();
            }
            out.push(b'"');
            // `rest` is an object with at least `seq` and `timestamp`: join it after the body.
            out.push(b',');
            out.extend_from_slice(rec.rest.as_bytes().get(1..).unwrap_or_default());
            self.records.pop_front();
            self.in_body = false;
        }
        Some(Bytes::from(out))
    }
}

/// The inside of a JSON string for `text` (valid UTF-8), escaped as `serde_json` does: `"` and
/// `\`, the short forms `\b \f \n \r \t`, other control bytes as `\u00xx`; the rest as is (so
/// a piece may end inside a multi-byte character).
fn escape_into(text: &[u8], out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut start = 0;
    for (i, &b) in text.iter().enumerate() {
        let short: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            0x08 => b"\\b",
            0x0c => b"\\f",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&text[start..i]);
        if short.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[usize::from(b >> 4)]);
            out.push(HEX[usize::from(b & 0xf)]);
        } else {
            out.extend_from_slice(short);
        }
        start = i + 1;
    }
    out.extend_from_slice(&text[start..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json_batch::render_json;
    use proptest::prelude::*;

    fn lazily(records: &[(u64, Record)]) -> (Vec<u8>, usize) {
        let mut w = JsonRecordsWriter::new(records.iter().map(|(s, r)| (*s, r)));
        let (mut out, mut largest) = (Vec::new(), 0);
        while let Some(c) = w.next_chunk() {
            largest = largest.max(c.len());
            out.extend_from_slice(&c);
        }
        (out, largest)
    }

    fn at_once(records: &[(u64, Record)]) -> Vec<u8> {
        render_json(records.iter().map(|(s, r)| (*s, r))).into_bytes()
    }

    fn record(value: Vec<u8>, key: Option<Vec<u8>>, headers: Vec<(String, Vec<u8>)>) -> Record {
        Record {
            timestamp_ms: 1_700_000_000_123,
            key: key.map(Bytes::from),
            value: Bytes::from(value),
            headers: headers
                .into_iter()
                .map(|(k, v)| (k, Bytes::from(v)))
                .collect(),
        }
    }

    #[test]
    fn a_large_record_of_control_bytes_renders_in_bounded_pieces() {
        let records = vec![(7, record(vec![1u8; 1 << 20], None, vec![]))];
        let (out, largest) = lazily(&records);
        assert_eq!(out, at_once(&records));
        assert!(out.len() > 6 << 20);
        assert!(
            largest <= CHUNK + 6 * STEP + 64,
            "a piece of {largest} bytes"
        );
    }

    #[test]
    fn every_field_form_renders_as_at_once() {
        let records = vec![
            (0, record(b"plain".to_vec(), None, vec![])),
            (
                1,
                record(
                    "q\"u\\o\u{7f}é\r\n\t\x08\x0c\x00".as_bytes().to_vec(),
                    Some(b"k".to_vec()),
                    vec![("h".into(), b"v".to_vec()), ("bin".into(), vec![0xff])],
                ),
            ),
            (2, record(vec![0xff, 0, 1], Some(vec![0xfe]), vec![])),
            (3, record(vec![], None, vec![])),
        ];
        assert_eq!(lazily(&records).0, at_once(&records));
        assert_eq!(lazily(&[]).0, at_once(&[]));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        #[test]
        fn prop_matches_rendering_at_once(
            bodies in proptest::collection::vec(
                proptest::collection::vec(
                    prop_oneof![Just(b'"'), Just(b'\\'), Just(b'\n'), Just(0xc3u8), Just(0xa9u8),
                                Just(b'a'), any::<u8>()],
                    0..20_000,
                ),
                0..4,
            ),
            keyed in any::<bool>(),
            as_text in any::<bool>(),
        ) {
            let records: Vec<(u64, Record)> = bodies
                .into_iter()
                .map(|b| if as_text { String::from_utf8_lossy(&b).into_owned().into_bytes() } else { b })
                .enumerate()
                .map(|(i, b)| (i as u64, record(b, keyed.then(|| b"key".to_vec()), vec![])))
                .collect();
            prop_assert_eq!(lazily(&records).0, at_once(&records));
        }
    }
}
