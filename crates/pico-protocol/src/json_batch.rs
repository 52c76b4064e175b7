//! The JSON batch POST body and the `json` read format.
//!
//! POST (`application/vnd.picomq.batch+json`):
//! `{"records":[{"body":"text","headers":{"k":"v"},"key":"k"}, {"body_b64":"AAE="}]}`.
//! Read: `[{"seq":0,"timestamp":1700000000000,"key":"k","headers":{"k":"v"},"body":"text"}]`,
//! with `body_b64` (and `key_b64`) when the bytes are not valid UTF-8.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::error::Category;
use serde_json::{Map, Value};
use thiserror::Error;

use crate::binary::{MAX_HEADER_KEY_LEN, MAX_HEADERS, MAX_HEADERS_PER_APPEND};
use crate::record::Record;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JsonBatchError {
    #[error("batch body is not valid JSON: {0}")]
    Syntax(String),
    #[error("batch body must be an object with a `records` array")]
    Shape,
    #[error("bad record: index={index} reason={reason}")]
    Record { index: usize, reason: String },
    #[error("too many records in one batch: max={max}")]
    TooMany { max: usize },
    #[error("too many headers in one batch: max={max}")]
    TooManyHeaders { max: usize },
}

/// Parses a JSON batch body of at most `max_records` records (timestamp 0: the server assigns
/// it). Records are built as the body streams by, with no intermediate JSON tree, and parsing
/// stops at the first record past the limit.
pub fn parse_json_batch(body: &[u8], max_records: usize) -> Result<Vec<Record>, JsonBatchError> {
    let blame = Blame::new(Some(JsonBatchError::Shape));
    let mut de = serde_json::Deserializer::from_slice(body);
    let headers_left = Cell::new(MAX_HEADERS_PER_APPEND);
    let doc = Doc {
        max_records,
        blame: &blame,
        headers_left: &headers_left,
    };
    doc.deserialize(&mut de)
        .and_then(|records| de.end().map(|()| records))
        .map_err(|e| match e.classify() {
            // Shape and record errors: serde only carries text, the typed cause is in `blame`.
            Category::Data => blame
                .take()
                .unwrap_or_else(|| JsonBatchError::Syntax(e.to_string())),
            _ => JsonBatchError::Syntax(e.to_string()),
        })
}

/// What a data error at the current step means; set before every step that can fail.
type Blame = RefCell<Option<JsonBatchError>>;

fn blame_as<E: de::Error>(blame: &Blame, err: JsonBatchError) -> E {
    let msg = err.to_string();
    *blame.borrow_mut() = Some(err);
    E::custom(msg)
}

/// The top-level object; fields other than `records` are ignored.
#[derive(Clone, Copy)]
struct Doc<'a> {
    max_records: usize,
    blame: &'a Blame,
    /// Headers the rest of the batch may still carry (see [`MAX_HEADERS_PER_APPEND`]).
    headers_left: &'a Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for Doc<'_> {
    type Value = Vec<Record>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Record>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Doc<'_> {
    type Value = Vec<Record>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object with a `records` array")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Vec<Record>, A::Error> {
        let mut records = None;
        while let Some(field) = map.next_key::<String>()? {
            if field == "records" {
                *self.blame.borrow_mut() = Some(JsonBatchError::Shape);
                records = Some(map.next_value_seed(Records(self))?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        records.ok_or_else(|| blame_as(self.blame, JsonBatchError::Shape))
    }
}

/// The `records` array.
struct Records<'a>(Doc<'a>);

impl<'de> DeserializeSeed<'de> for Records<'_> {
    type Value = Vec<Record>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Vec<Record>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Records<'_> {
    type Value = Vec<Record>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of records")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<Record>, A::Error> {
        let Doc {
            max_records,
            blame,
            headers_left,
        } = self.0;
        let mut out = Vec::new();
        loop {
            let index = out.len();
            if index == max_records {
                // Whether one more follows, without parsing it.
                *blame.borrow_mut() = Some(JsonBatchError::TooMany { max: max_records });
                return match seq.next_element_seed(Refuse)? {
                    None => Ok(out),
                    Some(never) => match never {},
                };
            }
            let rec = RecordSeed {
                index,
                blame,
                headers_left,
            };
            rec.blame("record must be a JSON object");
            match seq.next_element_seed(rec)? {
                Some(r) => out.push(r),
                None => return Ok(out),
            }
        }
    }
}

/// Fails on any element: marks the first record past the limit.
struct Refuse;

impl<'de> DeserializeSeed<'de> for Refuse {
    type Value = Infallible;
    fn deserialize<D: Deserializer<'de>>(self, _: D) -> Result<Infallible, D::Error> {
        Err(de::Error::custom("too many records"))
    }
}

#[derive(Clone, Copy)]
struct RecordSeed<'a> {
    index: usize,
    blame: &'a Blame,
    headers_left: &'a Cell<usize>,
}

impl RecordSeed<'_> {
    fn blame(&self, reason: impl Into<String>) {
        *self.blame.borrow_mut() = Some(JsonBatchError::Record {
            index: self.index,
            reason: reason.into(),
        });
    }

    fn fail<E: de::Error>(&self, reason: impl Into<String>) -> E {
        self.blame(reason);
        E::custom("bad record")
    }

    /// The next value as a string; anything else blames `field`.
    fn text<'de, A: MapAccess<'de>>(&self, map: &mut A, field: &str) -> Result<String, A::Error> {
        self.blame(format!("`{field}` must be a string"));
        map.next_value()
    }

    fn b64<'de, A: MapAccess<'de>>(&self, map: &mut A, field: &str) -> Result<Bytes, A::Error> {
        let s = self.text(map, field)?;
        B64.decode(s.as_bytes())
            .map(Bytes::from)
            .map_err(|e| self.fail(format!("`{field}` is not valid base64: {e}")))
    }
}

impl<'de> DeserializeSeed<'de> for RecordSeed<'_> {
    type Value = Record;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Record, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for RecordSeed<'_> {
    type Value = Record;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a record object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Record, A::Error> {
        // (bytes, the field they came from): a repeated field keeps its last value, as a JSON
        // object reads; only the text and base64 forms together are refused.
        let mut value: Option<(Bytes, &str)> = None;
        let mut key: Option<(Bytes, &str)> = None;
        let mut headers = Vec::new();
        while let Some(field) = map.next_key::<String>()? {
            match field.as_str() {
                f @ ("body" | "body_b64") if value.as_ref().is_some_and(|(_, was)| *was != f) => {
                    return Err(self.fail("record has both `body` and `body_b64`"));
                }
                "body" => {
                    value = Some((
                        Bytes::from(self.text(&mut map, &field)?.into_bytes()),
                        "body",
                    ));
                }
                "body_b64" => value = Some((self.b64(&mut map, &field)?, "body_b64")),
                f @ ("key" | "key_b64") if key.as_ref().is_some_and(|(_, was)| *was != f) => {
                    return Err(self.fail("record has both `key` and `key_b64`"));
                }
                "key" => {
                    key = Some((
                        Bytes::from(self.text(&mut map, &field)?.into_bytes()),
                        "key",
                    ));
                }
                "key_b64" => key = Some((self.b64(&mut map, &field)?, "key_b64")),
                "headers" => {
                    self.blame("`headers` must be an object of strings");
                    headers = map.next_value_seed(Headers(self))?;
                }
                other => return Err(self.fail(format!("unknown field `{other}`"))),
            }
        }
        let Some((value, _)) = value else {
            return Err(self.fail("record has neither `body` nor `body_b64`"));
        };
        Ok(Record {
            timestamp_ms: 0,
            key: key.map(|(k, _)| k),
            value,
            headers,
        })
    }
}

/// A record's `headers` object. Bounded by the binary read format (u16 count and key length),
/// so every accepted record can be read back in any format.
struct Headers<'a>(RecordSeed<'a>);

impl<'de> DeserializeSeed<'de> for Headers<'_> {
    type Value = Vec<(String, Bytes)>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Headers<'_> {
    type Value = Vec<(String, Bytes)>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of strings")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let rec = self.0;
        // Sorted by key, a repeated key keeps its last value (as a JSON object reads).
        let mut out = BTreeMap::new();
        while let Some(k) = map.next_key::<String>()? {
            if k.len() > MAX_HEADER_KEY_LEN {
                return Err(rec.fail(format!(
                    "header key too long: len={} max={MAX_HEADER_KEY_LEN}",
                    k.len()
                )));
            }
            rec.blame(format!("header `{k}` must be a string"));
            let v: String = map.next_value()?;
            if out.insert(k, Bytes::from(v.into_bytes())).is_none() {
                let Some(left) = rec.headers_left.get().checked_sub(1) else {
                    let max = MAX_HEADERS_PER_APPEND;
                    return Err(blame_as(rec.blame, JsonBatchError::TooManyHeaders { max }));
                };
                rec.headers_left.set(left);
            }
            if out.len() > MAX_HEADERS {
                return Err(rec.fail(format!("too many headers: max={MAX_HEADERS}")));
            }
        }
        Ok(out.into_iter().collect())
    }
}

/// One record of the `json` read format as a JSON value.
pub fn record_to_json(seq: u64, record: &Record) -> Value {
    let mut obj = Map::new();
    obj.insert("seq".into(), Value::from(seq));
    obj.insert("timestamp".into(), Value::from(record.timestamp_ms));
    if let Some(k) = &record.key {
        let (field, v) = text_or_b64("key", k);
        obj.insert(field, v);
    }
    if !record.headers.is_empty() {
        obj.insert("headers".into(), headers_to_json(&record.headers));
    }
    let (field, v) = text_or_b64("body", &record.value);
    obj.insert(field, v);
    Value::Object(obj)
}

/// Header values are shown as text; non-UTF-8 bytes are replaced (U+FFFD) since the object
/// form has no room for a per-value encoding.
fn headers_to_json(headers: &[(String, Bytes)]) -> Value {
    let map: Map<String, Value> = headers
        .iter()
        .map(|(k, v)| {
            (
                k.clone(),
                Value::String(String::from_utf8_lossy(v).into_owned()),
            )
        })
        .collect();
    Value::Object(map)
}

fn text_or_b64(field: &str, bytes: &[u8]) -> (String, Value) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (field.to_string(), Value::String(s.to_string())),
        Err(_) => (format!("{field}_b64"), Value::String(B64.encode(bytes))),
    }
}

/// Renders records as the `json` read format (a JSON array).
pub fn render_json<'a>(records: impl IntoIterator<Item = (u64, &'a Record)>) -> String {
    let arr: Vec<Value> = records
        .into_iter()
        .map(|(seq, r)| record_to_json(seq, r))
        .collect();
    Value::Array(arr).to_string()
}

/// Encodes records as a batch POST body, the inverse of [`parse_json_batch`]: UTF-8 bodies and
/// keys go as `body` / `key`, other bytes as `body_b64` / `key_b64`. Header values go as text
/// (non-UTF-8 bytes replaced), as the object form has no per-value encoding.
pub fn encode_json_batch(records: &[Record]) -> Vec<u8> {
    let items: Vec<Value> = records
        .iter()
        .map(|r| {
            let mut obj = Map::new();
            let (field, v) = text_or_b64("body", &r.value);
            obj.insert(field, v);
            if let Some(k) = &r.key {
                let (field, v) = text_or_b64("key", k);
                obj.insert(field, v);
            }
            if !r.headers.is_empty() {
                obj.insert("headers".into(), headers_to_json(&r.headers));
            }
            Value::Object(obj)
        })
        .collect();
    let mut root = Map::new();
    root.insert("records".into(), Value::Array(items));
    // A tree of strings, numbers and arrays always serializes.
    serde_json::to_vec(&Value::Object(root)).unwrap_or_default()
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("bad json read body: {0}")]
pub struct JsonReadError(String);

/// Parses a `json` read body (what [`render_json`] renders) into `(seq, record)` pairs; an
/// empty or all-whitespace body is no records. Headers may also come as `[["k","v"]]` pairs.
pub fn parse_read_json(body: &[u8]) -> Result<Vec<(u64, Record)>, JsonReadError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Vec::new());
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| JsonReadError(format!("not JSON: {e}")))?;
    let items = value
        .as_array()
        .ok_or_else(|| JsonReadError("not a JSON array".into()))?;
    items.iter().map(read_record).collect()
}

fn read_record(v: &Value) -> Result<(u64, Record), JsonReadError> {
    let bad = |what: &str| JsonReadError(format!("{what}: record={v}"));
    let obj = v.as_object().ok_or_else(|| bad("not an object"))?;
    let seq = obj
        .get("seq")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("missing seq"))?;
    let timestamp_ms = obj.get("timestamp").and_then(Value::as_i64).unwrap_or(0);
    let key = bytes_field(obj, "key").map_err(|e| bad(&e))?;
    let headers = read_headers(obj.get("headers")).ok_or_else(|| bad("bad headers"))?;
    let value = bytes_field(obj, "body")
        .map_err(|e| bad(&e))?
        .ok_or_else(|| bad("missing body"))?;
    let record = Record {
        timestamp_ms,
        key,
        value,
        headers,
    };
    Ok((seq, record))
}

/// `field` as text or `field_b64` as base64; `None` when neither is present.
fn bytes_field(obj: &Map<String, Value>, field: &str) -> Result<Option<Bytes>, String> {
    let b64 = format!("{field}_b64");
    match (obj.get(field), obj.get(&b64)) {
        (Some(Value::String(s)), _) => Ok(Some(Bytes::from(s.clone().into_bytes()))),
        (_, Some(Value::String(s))) => B64
            .decode(s)
            .map(|b| Some(Bytes::from(b)))
            .map_err(|_| format!("{b64} is not base64")),
        (None | Some(Value::Null), None | Some(Value::Null)) => Ok(None),
        _ => Err(format!("{field} is not a string")),
    }
}

/// Headers as an object (`{"k":"v"}`) or as pairs (`[["k","v"]]`).
fn read_headers(v: Option<&Value>) -> Option<Vec<(String, Bytes)>> {
    let text = |v: &Value| v.as_str().map(|s| Bytes::from(s.to_string().into_bytes()));
    match v {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| Some((k.clone(), text(v)?)))
            .collect(),
        Some(Value::Array(pairs)) => pairs
            .iter()
            .map(|pair| match pair.as_array()?.as_slice() {
                [k, v] => Some((k.as_str()?.to_string(), text(v)?)),
                _ => None,
            })
            .collect(),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_text_and_b64_records() {
        let body = br#"{"records":[
            {"body":"hello","headers":{"a":"1"},"key":"k1"},
            {"body_b64":"AAH/"},
            {"body":""}
        ]}"#;
        let recs = parse_json_batch(body, 3).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(recs[0].value, Bytes::from_static(b"hello"));
        assert_eq!(recs[0].key, Some(Bytes::from_static(b"k1")));
        assert_eq!(
            recs[0].headers,
            vec![("a".to_string(), Bytes::from_static(b"1"))]
        );
        assert_eq!(recs[1].value, Bytes::from_static(&[0, 1, 255]));
        assert_eq!(recs[1].key, None);
        assert_eq!(recs[2].value, Bytes::new());
        assert!(recs.iter().all(|r| r.timestamp_ms == 0));
    }

    /// A repeated field keeps its last value, as any JSON object reader does (a `Value` tree
    /// parsed these before the streaming parser); only both forms of one field are refused.
    #[test]
    fn a_repeated_field_keeps_its_last_value() {
        let recs = parse_json_batch(
            br#"{"records":[{"body":"a","key":"k","body":"b","key":"l"}]}"#,
            10,
        )
        .unwrap();
        assert_eq!(recs[0].value, Bytes::from_static(b"b"));
        assert_eq!(recs[0].key, Some(Bytes::from_static(b"l")));
        let err = parse_json_batch(
            br#"{"records":[{"key":"k","key_b64":"AA==","body":""}]}"#,
            10,
        )
        .unwrap_err();
        assert!(err.to_string().contains("both"), "{err}");
    }

    #[test]
    fn errors_name_the_index() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"records":[{"body":"a"},{"body":1}]}"#, "index=1"),
            (br#"{"records":[{"body_b64":"!!"}]}"#, "index=0"),
            (
                br#"{"records":[{"body":"a","body_b64":"AA=="}]}"#,
                "index=0",
            ),
            (br#"{"records":[{"body":"a"},{}]}"#, "index=1"),
            (
                br#"{"records":[{"body":"a","headers":{"x":1}}]}"#,
                "index=0",
            ),
            (br#"{"records":[{"body":"a","extra":1}]}"#, "index=0"),
            (br#"{"records":[5]}"#, "index=0"),
        ];
        for (body, want) in cases {
            let err = parse_json_batch(body, 10).unwrap_err();
            assert!(
                err.to_string().contains(want),
                "{err} should contain {want}"
            );
        }
        for bad in [&b"{"[..], br#"{"records":[{"body":"a"}]} x"#, b""] {
            assert!(
                matches!(parse_json_batch(bad, 10), Err(JsonBatchError::Syntax(_))),
                "{bad:?}"
            );
        }
        for bad in [&b"[]"[..], br#"{"records":{}}"#, br#"{"other":[]}"#, b"5"] {
            assert_eq!(
                parse_json_batch(bad, 10),
                Err(JsonBatchError::Shape),
                "{bad:?}"
            );
        }
        // Other top-level fields are ignored.
        let r = parse_json_batch(br#"{"v":[1,{}],"records":[{"body":"a"}]}"#, 10).unwrap();
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn record_count_is_bounded_while_parsing() {
        let body = br#"{"records":[{"body":"a"},{"body":"b"}]}"#;
        assert_eq!(parse_json_batch(body, 2).unwrap().len(), 2);
        let e = parse_json_batch(body, 1).unwrap_err();
        assert_eq!(e, JsonBatchError::TooMany { max: 1 });
        assert!(e.to_string().contains("max=1"), "{e}");
        // Parsing stops at the first record past the limit: what follows is never read, so
        // neither a bad record nor broken JSON after it changes the answer.
        for tail in [
            &br#"5]}"#[..],
            br#"{"body":1}]}"#,
            br#"{"body": !!! not json"#,
        ] {
            let body = [&br#"{"records":[{"body":"a"},{"body":"b"},"#[..], tail].concat();
            assert_eq!(
                parse_json_batch(&body, 2),
                Err(JsonBatchError::TooMany { max: 2 }),
                "{}",
                String::from_utf8_lossy(&body)
            );
        }
    }

    /// An append's headers are bounded in all (repeated keys of one record count once).
    #[test]
    fn a_batchs_headers_are_bounded_in_all() {
        let record = |n: usize| {
            let headers: Vec<String> = (0..n).map(|i| format!("\"{i}\":\"\"")).collect();
            format!("{{\"body\":\"\",\"headers\":{{{}}}}}", headers.join(","))
        };
        let batch = |records: usize, per: usize| {
            let r: Vec<String> = (0..records).map(|_| record(per)).collect();
            format!("{{\"records\":[{}]}}", r.join(","))
        };
        let per = MAX_HEADERS_PER_APPEND / 4;
        assert_eq!(
            parse_json_batch(batch(4, per).as_bytes(), 10)
                .unwrap()
                .len(),
            4
        );
        assert_eq!(
            parse_json_batch(batch(5, per).as_bytes(), 10),
            Err(JsonBatchError::TooManyHeaders {
                max: MAX_HEADERS_PER_APPEND
            })
        );
        let repeated = format!(
            "{{\"records\":[{{\"body\":\"\",\"headers\":{{{}}}}}]}}",
            vec!["\"k\":\"v\""; MAX_HEADERS_PER_APPEND + 1].join(",")
        );
        assert_eq!(parse_json_batch(repeated.as_bytes(), 1).unwrap().len(), 1);
    }

    #[test]
    fn headers_must_fit_the_binary_format() {
        let body = |key: &str, n: usize| {
            let hs: Vec<String> = (0..n).map(|i| format!("\"{key}{i}\":\"v\"")).collect();
            format!(
                r#"{{"records":[{{"body":"a"}},{{"body":"b","headers":{{{}}}}}]}}"#,
                hs.join(",")
            )
        };
        let ok = parse_json_batch(body("k", 3).as_bytes(), 10).unwrap();
        assert_eq!(ok[1].headers.len(), 3);
        let long = "k".repeat(MAX_HEADER_KEY_LEN);
        let e = parse_json_batch(body(&long, 1).as_bytes(), 10).unwrap_err();
        assert!(
            matches!(&e, JsonBatchError::Record { index: 1, reason } if reason.contains("header key too long")),
            "{e}"
        );
        let e = parse_json_batch(body("", MAX_HEADERS + 1).as_bytes(), 10).unwrap_err();
        assert!(
            matches!(&e, JsonBatchError::Record { index: 1, reason } if reason.contains("too many headers")),
            "{e}"
        );
        assert_eq!(
            parse_json_batch(body("", MAX_HEADERS).as_bytes(), 10).unwrap()[1]
                .headers
                .len(),
            MAX_HEADERS
        );
        // A repeated key keeps its last value, as before.
        let r = parse_json_batch(
            br#"{"records":[{"body":"a","headers":{"b":"1","a":"2","b":"3"}}]}"#,
            10,
        )
        .unwrap();
        assert_eq!(
            r[0].headers,
            vec![
                ("a".to_string(), Bytes::from_static(b"2")),
                ("b".to_string(), Bytes::from_static(b"3"))
            ]
        );
    }

    #[test]
    fn renders_text_and_binary_bodies() {
        let a = Record {
            timestamp_ms: 7,
            key: Some(Bytes::from_static(b"k")),
            value: Bytes::from_static(b"hi"),
            headers: vec![("h".into(), Bytes::from_static(b"v"))],
        };
        let b = Record::from_value(Bytes::from_static(&[0xff, 0x00]));
        let out: Value = serde_json::from_str(&render_json([(3, &a), (4, &b)])).unwrap();
        assert_eq!(
            out,
            serde_json::json!([
                {"seq":3,"timestamp":7,"key":"k","headers":{"h":"v"},"body":"hi"},
                {"seq":4,"timestamp":0,"body_b64":"/wA="}
            ])
        );
        assert_eq!(render_json([]), "[]");
    }

    /// Records with sorted, unique, UTF-8 header keys and values (the JSON forms hold header
    /// values as text and headers as an object, so only those round-trip exactly).
    fn arb_record() -> impl proptest::strategy::Strategy<Value = Record> {
        use proptest::prelude::*;
        (
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
            proptest::collection::vec(any::<u8>(), 0..64),
            proptest::collection::btree_map("[a-z]{1,8}", ".{0,8}", 0..4),
        )
            .prop_map(|(key, value, headers)| Record {
                timestamp_ms: 0,
                key: key.map(Bytes::from),
                value: Bytes::from(value),
                headers: headers
                    .into_iter()
                    .map(|(k, v)| (k, Bytes::from(v.into_bytes())))
                    .collect(),
            })
    }

    proptest::proptest! {
        /// What a client encodes is what the server parses.
        #[test]
        fn prop_batch_encoding_round_trips(records in proptest::collection::vec(arb_record(), 0..8)) {
            let body = encode_json_batch(&records);
            proptest::prop_assert_eq!(parse_json_batch(&body, 8).unwrap(), records);
        }

        /// What the server renders is what a client parses.
        #[test]
        fn prop_read_rendering_round_trips(
            records in proptest::collection::vec((proptest::arbitrary::any::<u64>(), proptest::arbitrary::any::<i64>(), arb_record()), 0..8)
        ) {
            let records: Vec<(u64, Record)> = records
                .into_iter()
                .map(|(seq, ts, mut r)| {
                    r.timestamp_ms = ts;
                    (seq, r)
                })
                .collect();
            let body = render_json(records.iter().map(|(s, r)| (*s, r)));
            proptest::prop_assert_eq!(parse_read_json(body.as_bytes()).unwrap(), records);
        }
    }

    #[test]
    fn read_json_takes_header_pairs_and_empty_bodies() {
        let body = br#"[{"seq":9,"timestamp":1,"headers":[["p","q"]],"body":"","key_b64":"/w=="}]"#;
        let recs = parse_read_json(body).unwrap();
        assert_eq!(recs.len(), 1);
        let (seq, r) = &recs[0];
        assert_eq!(*seq, 9);
        assert_eq!(r.headers, vec![("p".to_string(), Bytes::from_static(b"q"))]);
        assert!(r.value.is_empty());
        assert_eq!(r.key.as_deref(), Some(&[0xff][..]));
        assert!(parse_read_json(b"").unwrap().is_empty());
        assert!(parse_read_json(b" \n").unwrap().is_empty());
    }

    #[test]
    fn read_json_rejects_malformed() {
        for bad in [
            &b"{}"[..],
            br#"[{"timestamp":1,"body":"a"}]"#,
            br#"[{"seq":1}]"#,
            br#"[{"seq":1,"body_b64":"***"}]"#,
            br#"[{"seq":1,"body":1}]"#,
            br#"[{"seq":1,"body":"a","headers":[["k"]]}]"#,
            br#"[{"seq":1,"body":"a","headers":{"k":1}}]"#,
            b"[",
        ] {
            assert!(
                parse_read_json(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
