//! `POST /{name}`: append one raw record, a JSON batch or a binary batch; close with
//! `Pico-Closed: true` (empty body = close only); trim with `Pico-Trim-Seq`.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::headers as h;
use pico_protocol::{BinaryError, JsonBatchError, Record, decode_binary_append, parse_json_batch};
use pico_server::node::{Lookup, MAX_RECORDS_PER_APPEND};
use pico_server::{AppendOptions, AppendRequest, Node};

use super::{info_headers, no_store, read_body, set, set_true, stream_name};
use crate::error::HttpError;
use crate::headers::{AppendHeaders, parse_append};

pub async fn append(
    State(node): State<Node>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    append_named(node, stream_name(&uri)?, headers, body, Lookup::default()).await
}

/// [`append`] to a stream whose name the caller has parsed, with the look at the metadata view
/// owner routing made for it ([`Lookup`]).
pub async fn append_named(
    node: Node,
    name: StreamName,
    headers: HeaderMap,
    body: Body,
    seen: Lookup,
) -> Result<Response, HttpError> {
    let ah = parse_append(&headers)?;
    let body = read_body(&headers, body, node.config().max_request_size).await?;
    if let Some(seq) = ah.trim_seq {
        return trim(&node, &name, &ah, &body, seq).await;
    }
    let mut records = body_records(&ah.media_type, body)?;
    if records.is_empty() && !ah.close {
        return Err(HttpError::bad_request(format!(
            "empty append: send at least one record, or {}: true to close",
            h::PICO_CLOSED
        )));
    }
    if let Some(key) = &ah.key {
        for r in records.iter_mut().filter(|r| r.key.is_none()) {
            r.key = Some(key.clone());
        }
    }
    let req = AppendRequest {
        name,
        records,
        producer: ah.producer,
        match_seq: ah.match_seq,
        close: ah.close,
        // The request's Content-Type selects the body framing; it is not checked against
        // the stream's type for Pico appends.
        content_type: None,
    };
    let out = node
        .append_seen(req, AppendOptions::default(), seen)
        .await?;
    let mut resp = StatusCode::OK.into_response();
    let hm = resp.headers_mut();
    set(hm, h::PICO_NEXT_SEQ, out.next_seq);
    // A duplicate carries the original append's offsets; without a start they are no longer
    // known, and the next seq is only the stream's tail.
    if let Some(start) = out.start_seq {
        set(hm, h::PICO_START_SEQ, start);
    }
    if out.duplicate {
        set_true(hm, h::PICO_DUPLICATE);
    }
    set(hm, h::PICO_TIMESTAMP, out.timestamp_ms);
    if let Some((epoch, seq)) = out.producer {
        set(hm, h::PICO_PRODUCER_EPOCH, epoch);
        set(hm, h::PICO_PRODUCER_SEQ, seq);
    }
    if out.closed {
        set_true(hm, h::PICO_CLOSED);
    }
    no_store(hm);
    Ok(resp)
}

/// The records a POST body holds, by its media type. A batch past the append limit is refused
/// (413) while it is parsed, before its records are built.
pub fn body_records(media_type: &str, body: Bytes) -> Result<Vec<Record>, HttpError> {
    // Empty whatever its type: a close-only request may carry the batch type its client
    // always sends (an empty append without the close is refused later).
    if body.is_empty() {
        return Ok(Vec::new());
    }
    match media_type {
        h::CONTENT_TYPE_JSON_BATCH => {
            parse_json_batch(&body, MAX_RECORDS_PER_APPEND).map_err(|e| match e {
                JsonBatchError::TooMany { .. } | JsonBatchError::TooManyHeaders { .. } => {
                    HttpError::too_large(e.to_string())
                }
                _ => HttpError::bad_request(format!("bad JSON batch: {e}")),
            })
        }
        h::CONTENT_TYPE_BINARY_BATCH => decode_binary_append(&body, MAX_RECORDS_PER_APPEND)
            .map_err(|e| match e {
                BinaryError::TooMany { .. } | BinaryError::TooManyHeaders { .. } => {
                    HttpError::too_large(e.to_string())
                }
                _ => HttpError::bad_request(format!("bad binary batch: {e}")),
            }),
        _ => Ok(vec![Record::from_value(body)]),
    }
}

async fn trim(
    node: &Node,
    name: &StreamName,
    ah: &AppendHeaders,
    body: &Bytes,
    seq: u64,
) -> Result<Response, HttpError> {
    if !body.is_empty() {
        return Err(HttpError::bad_request(format!(
            "{} takes no body: len={}",
            h::PICO_TRIM_SEQ,
            body.len()
        )));
    }
    if ah.producer.is_some() || ah.match_seq.is_some() || ah.close {
        return Err(HttpError::bad_request(format!(
            "{} cannot be combined with producer, match or close headers",
            h::PICO_TRIM_SEQ
        )));
    }
    let start = node.trim(name, seq).await?;
    let info = node.head(name).await?;
    let mut resp = StatusCode::OK.into_response();
    let hm = resp.headers_mut();
    info_headers(hm, &info);
    // The trim's own answer wins over a head that may race a later trim.
    set(hm, h::PICO_START_SEQ, start);
    no_store(hm);
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_framing_by_media_type() {
        let raw = body_records("text/plain", Bytes::from_static(b"x")).unwrap();
        assert_eq!(raw, vec![Record::from_value(Bytes::from_static(b"x"))]);
        assert!(body_records("", Bytes::new()).unwrap().is_empty());
        // A close-only request may carry its client's batch type.
        for t in [h::CONTENT_TYPE_JSON_BATCH, h::CONTENT_TYPE_BINARY_BATCH] {
            assert!(body_records(t, Bytes::new()).unwrap().is_empty(), "{t}");
        }
        let json = body_records(
            h::CONTENT_TYPE_JSON_BATCH,
            Bytes::from_static(br#"{"records":[{"body":"a"},{"body":"b"}]}"#),
        )
        .unwrap();
        assert_eq!(json.len(), 2);
        let e = body_records(h::CONTENT_TYPE_JSON_BATCH, Bytes::from_static(b"nope")).unwrap_err();
        assert_eq!(e.status, 400);
        let e =
            body_records(h::CONTENT_TYPE_BINARY_BATCH, Bytes::from_static(b"\x01")).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("binary"));
    }

    #[test]
    fn batches_past_the_append_limit_are_413() {
        let max = MAX_RECORDS_PER_APPEND;
        let json = |n: usize| {
            let recs = vec![r#"{"body":""}"#; n].join(",");
            Bytes::from(format!(r#"{{"records":[{recs}]}}"#))
        };
        assert_eq!(
            body_records(h::CONTENT_TYPE_JSON_BATCH, json(max))
                .unwrap()
                .len(),
            max
        );
        let e = body_records(h::CONTENT_TYPE_JSON_BATCH, json(max + 1)).unwrap_err();
        assert_eq!(e.status, 413);
        assert_eq!(
            e.message,
            format!("too many records in one batch: max={max}")
        );

        let rec = Record::from_value(Bytes::new());
        let binary = |n: usize| pico_protocol::encode_binary((0..n as u64).map(|i| (i, &rec)));
        assert_eq!(
            body_records(h::CONTENT_TYPE_BINARY_BATCH, binary(max).unwrap())
                .unwrap()
                .len(),
            max
        );
        let e = body_records(h::CONTENT_TYPE_BINARY_BATCH, binary(max + 1).unwrap()).unwrap_err();
        assert_eq!(e.status, 413);
        assert_eq!(
            e.message,
            format!("too many records in one batch: count={} max={max}", max + 1)
        );
    }
}
