//! Sans-IO pieces of the Pico protocol as the client speaks it.

use crate::error::ClientError;
use crate::types::{BatchRecord, ListPage, ReadRecord};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use pico_common::StreamName;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

pub const BATCH_JSON_CONTENT_TYPE: &str = "application/vnd.picomq.batch+json";
pub const BATCH_BINARY_CONTENT_TYPE: &str = "application/vnd.picomq.batch";

pub const H_NEXT_SEQ: &str = "pico-next-seq";
pub const H_START_SEQ: &str = "pico-start-seq";
pub const H_UP_TO_DATE: &str = "pico-up-to-date";
pub const H_CLOSED: &str = "pico-closed";
pub const H_TTL: &str = "pico-ttl";
pub const H_TRIM_SEQ: &str = "pico-trim-seq";
pub const H_KEY: &str = "pico-key";
pub const H_MATCH_SEQ: &str = "pico-match-seq";
pub const H_PRODUCER_ID: &str = "pico-producer-id";
pub const H_PRODUCER_EPOCH: &str = "pico-producer-epoch";
pub const H_PRODUCER_SEQ: &str = "pico-producer-seq";

/// The URL path of a stream: one leading slash, no trailing one (`streams/a/` → `/streams/a`).
///
/// Only names the server accepts ([`StreamName::parse_new`], the server's own rule) become
/// paths, unescaped: the server reads the name from the raw path, so a `?` or `#` would cut the
/// name short and target another stream, and escaping them would name a third (`%` is a name
/// character: `a%3Fb` is a legal name of its own). The same rule refuses a segment the URL
/// parser resolves as `.` or `..` (`%2e`, `.%2E`, …), which would reach the wrong stream, and
/// the reserved names the server answers 400 for.
pub fn stream_path(name: &str) -> Result<String, ClientError> {
    let name = StreamName::parse_new(name).map_err(|e| ClientError::Invalid(e.to_string()))?;
    Ok(name.to_path())
}

/// Encodes a JSON batch body: `{"records":[{"body"|"body_b64", "key"?, "headers"?}]}`.
/// UTF-8 bodies go as `body`, anything else as `body_b64`.
pub fn encode_json_batch(records: &[BatchRecord]) -> Vec<u8> {
    let items: Vec<Value> = records
        .iter()
        .map(|r| {
            let mut obj = Map::new();
            let (field, value) = text_or_b64("body", &r.body);
            obj.insert(field, value);
            if let Some(key) = &r.key {
                let (field, value) = text_or_b64("key", key);
                obj.insert(field, value);
            }
            if !r.headers.is_empty() {
                let headers = r
                    .headers
                    .iter()
                    .map(|(k, v)| (k.clone(), Value::String(v.clone())))
                    .collect();
                obj.insert("headers".into(), Value::Object(headers));
            }
            Value::Object(obj)
        })
        .collect();
    let mut root = Map::new();
    root.insert("records".into(), Value::Array(items));
    // Serializing a Value built from strings cannot fail.
    serde_json::to_vec(&Value::Object(root)).unwrap_or_default()
}

/// `field: "text"` for UTF-8 bytes, `field_b64: "…"` otherwise.
fn text_or_b64(field: &str, bytes: &[u8]) -> (String, Value) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (field.to_string(), Value::String(text.to_string())),
        Err(_) => (format!("{field}_b64"), Value::String(B64.encode(bytes))),
    }
}

/// Decodes a `format=json` read body: `[{seq, timestamp, key?, headers?, body | body_b64}]`.
pub fn decode_read_json(body: &[u8]) -> Result<Vec<ReadRecord>, ClientError> {
    if body.iter().all(|b| b.is_ascii_whitespace()) {
        return Ok(Vec::new());
    }
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ClientError::Decode(format!("read body: {e}")))?;
    let items = value
        .as_array()
        .ok_or_else(|| ClientError::Decode("read body is not a JSON array".into()))?;
    items.iter().map(decode_record).collect()
}

fn decode_record(v: &Value) -> Result<ReadRecord, ClientError> {
    let bad = |what: &str| ClientError::Decode(format!("read record: {what}: record={v}"));
    let obj = v.as_object().ok_or_else(|| bad("not an object"))?;
    let seq = obj
        .get("seq")
        .and_then(Value::as_u64)
        .ok_or_else(|| bad("missing seq"))?;
    let timestamp = obj.get("timestamp").and_then(Value::as_i64).unwrap_or(0);
    let key = bytes_field(obj, "key").map_err(|e| bad(&e))?;
    let headers = decode_headers(obj.get("headers")).ok_or_else(|| bad("bad headers"))?;
    let body = bytes_field(obj, "body")
        .map_err(|e| bad(&e))?
        .ok_or_else(|| bad("missing body"))?;
    Ok(ReadRecord {
        seq,
        timestamp,
        key,
        headers,
        body,
    })
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
fn decode_headers(v: Option<&Value>) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    match v {
        None | Some(Value::Null) => {}
        Some(Value::Object(map)) => {
            for (k, v) in map {
                out.insert(k.clone(), v.as_str()?.to_string());
            }
        }
        Some(Value::Array(pairs)) => {
            for pair in pairs {
                let pair = pair.as_array()?;
                if pair.len() != 2 {
                    return None;
                }
                out.insert(pair[0].as_str()?.to_string(), pair[1].as_str()?.to_string());
            }
        }
        Some(_) => return None,
    }
    Some(out)
}

/// Decodes `{"streams":[…],"has_more":bool}`; entries are names or objects with a `name`.
pub fn decode_list(body: &[u8]) -> Result<ListPage, ClientError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| ClientError::Decode(format!("list body: {e}")))?;
    let streams = value
        .get("streams")
        .and_then(Value::as_array)
        .ok_or_else(|| ClientError::Decode("list body has no `streams` array".into()))?;
    let names = streams
        .iter()
        .map(|s| match s {
            Value::String(name) => Some(name.clone()),
            Value::Object(o) => o.get("name").and_then(Value::as_str).map(str::to_string),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()
        .ok_or_else(|| ClientError::Decode("list entry without a name".into()))?;
    let has_more = value
        .get("has_more")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    Ok(ListPage {
        streams: names,
        has_more,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_paths_are_canonical() {
        assert_eq!(stream_path("/streams/orders").unwrap(), "/streams/orders");
        assert_eq!(stream_path("streams/orders/").unwrap(), "/streams/orders");
        // Legal name characters go as they are: the server does not decode the path.
        assert_eq!(stream_path("a%20b/c:d@e").unwrap(), "/a%20b/c:d@e");
    }

    /// Names the server would not accept, or that a URL would turn into another path, are
    /// refused: `orders?x` would otherwise be sent as `/orders` with a query.
    #[test]
    fn stream_paths_refuse_names_a_url_would_change() {
        for bad in [
            "orders?x",
            "orders#x",
            "a b",
            "a//b",
            "a/../b",
            "a/%2e/b",
            "a/%2E%2e",
            "a/.%2e/b",
            "a%zz",
            "_sys/x",
            "v1/stream/x",
        ] {
            let err = stream_path(bad).unwrap_err();
            assert!(matches!(err, ClientError::Invalid(_)), "{bad}: {err:?}");
        }
    }

    #[test]
    fn batch_encodes_text_and_binary_bodies() {
        let mut keyed = BatchRecord::new(&b"hello"[..]);
        keyed.key = Some(Bytes::from_static(b"k1"));
        keyed.headers.insert("h".into(), "v".into());
        let mut binary = BatchRecord::new(vec![0xff, 0x00, 0x80]);
        binary.key = Some(Bytes::from_static(&[0xfe]));
        let encoded = encode_json_batch(&[keyed, binary]);
        let v: Value = serde_json::from_slice(&encoded).unwrap();
        let recs = v["records"].as_array().unwrap();
        assert_eq!(recs[0]["body"], "hello");
        assert_eq!(recs[0]["key"], "k1");
        assert_eq!(recs[0]["headers"]["h"], "v");
        assert_eq!(recs[1]["body_b64"], B64.encode([0xff, 0x00, 0x80]));
        assert!(recs[1].get("body").is_none());
        assert_eq!(recs[1]["key_b64"], B64.encode([0xfe]));
    }

    #[test]
    fn read_json_round_trips_bodies_keys_and_headers() {
        let body = format!(
            r#"[{{"seq":7,"timestamp":123,"body":"a"}},
               {{"seq":8,"timestamp":124,"key":"k","headers":{{"x":"y"}},"body_b64":"{}"}},
               {{"seq":9,"timestamp":125,"headers":[["p","q"]],"body":"","key_b64":"{}"}}]"#,
            B64.encode([1u8, 2, 255]),
            B64.encode([0xffu8])
        );
        let recs = decode_read_json(body.as_bytes()).unwrap();
        assert_eq!(recs.len(), 3);
        assert_eq!(
            (recs[0].seq, recs[0].timestamp, &recs[0].body[..]),
            (7, 123, &b"a"[..])
        );
        assert_eq!(recs[1].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(recs[1].headers["x"], "y");
        assert_eq!(&recs[1].body[..], &[1, 2, 255]);
        assert_eq!(recs[2].headers["p"], "q");
        assert!(recs[2].body.is_empty());
        assert_eq!(recs[2].key.as_deref(), Some(&[0xff][..]));
        assert!(decode_read_json(b"").unwrap().is_empty());
    }

    #[test]
    fn read_json_rejects_malformed() {
        assert!(decode_read_json(b"{}").is_err());
        assert!(decode_read_json(br#"[{"timestamp":1,"body":"a"}]"#).is_err());
        assert!(decode_read_json(br#"[{"seq":1}]"#).is_err());
        assert!(decode_read_json(br#"[{"seq":1,"body_b64":"***"}]"#).is_err());
    }

    #[test]
    fn list_accepts_names_and_objects() {
        let page =
            decode_list(br#"{"streams":["a",{"name":"b","next_seq":3}],"has_more":true}"#).unwrap();
        assert_eq!(page.streams, vec!["a".to_string(), "b".to_string()]);
        assert!(page.has_more);
        assert!(decode_list(br#"{"streams":[1]}"#).is_err());
    }
}
