//! Sans-IO pieces of the Pico protocol as the client speaks it.

use crate::error::ClientError;
use crate::types::{BatchRecord, ListPage, ReadRecord};
use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::Record;
use serde_json::Value;

/// The URL path of a stream: one leading slash, no trailing one (`streams/a/` → `/streams/a`).
///
/// A name is given as a path spelling, the server's rule ([`StreamName::parse_new`]): it is
/// percent-decoded once, so `a%3Fb` is the stream named `a?b`, and the path sent is its
/// canonical spelling. Names the server would refuse are refused here before anything is
/// sent: a raw `?` or `#` would cut the name short and target another stream, and an encoded
/// slash, a `.`/`..` segment however spelled, or a reserved name get 400 there.
pub fn stream_path(name: &str) -> Result<String, ClientError> {
    let name = StreamName::parse_new(name).map_err(|e| ClientError::Invalid(e.to_string()))?;
    Ok(name.to_path())
}

/// A batch POST body (`application/vnd.picomq.batch+json`), in the protocol's own codec.
pub fn encode_json_batch(records: &[BatchRecord]) -> Vec<u8> {
    let records: Vec<Record> = records.iter().map(to_record).collect();
    pico_protocol::encode_json_batch(&records)
}

fn to_record(r: &BatchRecord) -> Record {
    Record {
        timestamp_ms: 0,
        key: r.key.clone(),
        value: r.body.clone(),
        headers: r
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), Bytes::from(v.clone().into_bytes())))
            .collect(),
    }
}

/// Decodes a `format=json` read body, in the protocol's own codec.
pub fn decode_read_json(body: &[u8]) -> Result<Vec<ReadRecord>, ClientError> {
    let records =
        pico_protocol::parse_read_json(body).map_err(|e| ClientError::Decode(e.to_string()))?;
    Ok(records
        .into_iter()
        .map(|(seq, r)| ReadRecord {
            seq,
            timestamp: r.timestamp_ms,
            key: r.key,
            // The json format renders header values as text.
            headers: r
                .headers
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect(),
            body: r.value,
        })
        .collect())
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
        // Escapes are decoded once and the canonical spelling sent: `%41` is `A`.
        assert_eq!(stream_path("a%20b/c:d@e").unwrap(), "/a%20b/c:d@e");
        assert_eq!(stream_path("%41/b").unwrap(), "/A/b");
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

    /// The client's record types go through the protocol's codec both ways: a batch it
    /// encodes parses back on the server side, and a rendered read decodes into its records.
    #[test]
    fn records_convert_through_the_protocol_codec() {
        let mut keyed = BatchRecord::new(&b"hello"[..]);
        keyed.key = Some(Bytes::from_static(&[0xfe]));
        keyed.headers.insert("h".into(), "v".into());
        let binary = BatchRecord::new(vec![0xff, 0x00, 0x80]);
        let parsed =
            pico_protocol::parse_json_batch(&encode_json_batch(&[keyed, binary]), 2).unwrap();
        assert_eq!(&parsed[0].value[..], b"hello");
        assert_eq!(parsed[0].key.as_deref(), Some(&[0xfe][..]));
        assert_eq!(
            parsed[0].headers,
            vec![("h".into(), Bytes::from_static(b"v"))]
        );
        assert_eq!(&parsed[1].value[..], &[0xff, 0x00, 0x80]);

        let mut stored = parsed[0].clone();
        stored.timestamp_ms = 123;
        let body = pico_protocol::render_json([(7, &stored)]);
        let recs = decode_read_json(body.as_bytes()).unwrap();
        assert_eq!((recs[0].seq, recs[0].timestamp), (7, 123));
        assert_eq!(&recs[0].body[..], b"hello");
        assert_eq!(recs[0].key.as_deref(), Some(&[0xfe][..]));
        assert_eq!(recs[0].headers["h"], "v");
        assert!(matches!(
            decode_read_json(b"{}"),
            Err(ClientError::Decode(_))
        ));
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
