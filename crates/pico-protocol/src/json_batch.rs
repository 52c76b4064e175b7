//! The JSON batch POST body and the `json` read format.
//!
//! POST (`application/vnd.picomq.batch+json`):
//! `{"records":[{"body":"text","headers":{"k":"v"},"key":"k"}, {"body_b64":"AAE="}]}`.
//! Read: `[{"seq":0,"timestamp":1700000000000,"key":"k","headers":{"k":"v"},"body":"text"}]`,
//! with `body_b64` (and `key_b64`) when the bytes are not valid UTF-8.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use serde_json::{Map, Value};
use thiserror::Error;

use crate::record::Record;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum JsonBatchError {
    #[error("batch body is not valid JSON: {0}")]
    Syntax(String),
    #[error("batch body must be an object with a `records` array")]
    Shape,
    #[error("bad record: index={index} reason={reason}")]
    Record { index: usize, reason: String },
}

/// Parses a JSON batch body into records (timestamp 0: the server assigns it).
pub fn parse_json_batch(body: &[u8]) -> Result<Vec<Record>, JsonBatchError> {
    let doc: Value =
        serde_json::from_slice(body).map_err(|e| JsonBatchError::Syntax(e.to_string()))?;
    let Value::Object(mut doc) = doc else {
        return Err(JsonBatchError::Shape);
    };
    let Some(Value::Array(items)) = doc.remove("records") else {
        return Err(JsonBatchError::Shape);
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            parse_record(item).map_err(|reason| JsonBatchError::Record { index, reason })
        })
        .collect()
}

fn parse_record(item: Value) -> Result<Record, String> {
    let Value::Object(obj) = item else {
        return Err("record must be a JSON object".to_string());
    };
    let mut value = None;
    let mut key = None;
    let mut headers = Vec::new();
    for (field, v) in obj {
        match field.as_str() {
            "body" | "body_b64" if value.is_some() => {
                return Err("record has both `body` and `body_b64`".to_string());
            }
            "body" => value = Some(Bytes::from(string_field(&field, v)?.into_bytes())),
            "body_b64" => value = Some(b64_field(&field, v)?),
            "key" | "key_b64" if key.is_some() => {
                return Err("record has both `key` and `key_b64`".to_string());
            }
            "key" => key = Some(Bytes::from(string_field(&field, v)?.into_bytes())),
            "key_b64" => key = Some(b64_field(&field, v)?),
            "headers" => {
                let Value::Object(map) = v else {
                    return Err("`headers` must be an object of strings".to_string());
                };
                for (k, hv) in map {
                    let Value::String(s) = hv else {
                        return Err(format!("header `{k}` must be a string"));
                    };
                    headers.push((k, Bytes::from(s.into_bytes())));
                }
            }
            other => return Err(format!("unknown field `{other}`")),
        }
    }
    let value = value.ok_or_else(|| "record has neither `body` nor `body_b64`".to_string())?;
    Ok(Record {
        timestamp_ms: 0,
        key,
        value,
        headers,
    })
}

fn string_field(field: &str, v: Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s),
        _ => Err(format!("`{field}` must be a string")),
    }
}

fn b64_field(field: &str, v: Value) -> Result<Bytes, String> {
    let s = string_field(field, v)?;
    B64.decode(s.as_bytes())
        .map(Bytes::from)
        .map_err(|e| format!("`{field}` is not valid base64: {e}"))
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
        // Header values are shown as text; non-UTF-8 bytes are replaced (U+FFFD) since the
        // object form has no room for a per-value encoding.
        let map: Map<String, Value> = record
            .headers
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    Value::String(String::from_utf8_lossy(v).into_owned()),
                )
            })
            .collect();
        obj.insert("headers".into(), Value::Object(map));
    }
    let (field, v) = text_or_b64("body", &record.value);
    obj.insert(field, v);
    Value::Object(obj)
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
        let recs = parse_json_batch(body).unwrap();
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
            let err = parse_json_batch(body).unwrap_err();
            assert!(
                err.to_string().contains(want),
                "{err} should contain {want}"
            );
        }
        assert!(matches!(
            parse_json_batch(b"{"),
            Err(JsonBatchError::Syntax(_))
        ));
        assert_eq!(parse_json_batch(b"[]"), Err(JsonBatchError::Shape));
        assert_eq!(
            parse_json_batch(br#"{"records":{}}"#),
            Err(JsonBatchError::Shape)
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
}
