//! `PUT` (create, create-closed, fork), `POST` (append, append-and-close, close-only) and
//! `DELETE`. A byte-stream POST body is one record; a JSON POST body is one record per message
//! (a top-level array flattened one level).

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::Record;
use pico_protocol::ds_json::{DsJsonError, split_messages};
use pico_protocol::headers as h;
use pico_server::node::{Lookup, MAX_RECORDS_PER_APPEND};
use pico_server::{
    AppendError, AppendOptions, AppendRequest, CreateConfig, CreateRequest, ForkError, ForkRequest,
    ReadError, StreamInfo,
};

use super::error::DsError;
use super::headers as dh;
use super::{Ds, content_type_value, set, set_offset, set_true, source_name};
use crate::pico::{no_store, read_body};

/// The records a body holds in a stream of content type `stream_ct`. `[]` yields none; an array
/// past the append limit is refused (413) while it is split, before its records are built.
fn records(stream_ct: &str, body: Bytes) -> Result<Vec<Record>, DsError> {
    if body.is_empty() {
        return Ok(Vec::new());
    }
    if h::is_json(stream_ct) {
        let msgs = split_messages(&body, MAX_RECORDS_PER_APPEND).map_err(|e| match e {
            DsJsonError::TooMany { .. } => DsError::too_large(e.to_string()),
            DsJsonError::Invalid(_) => DsError::bad_request(e.to_string()),
        })?;
        return Ok(msgs.into_iter().map(Record::from_value).collect());
    }
    Ok(vec![Record::from_value(body)])
}

/// Headers shared by create responses.
fn info_headers(hm: &mut HeaderMap, info: &StreamInfo) {
    hm.insert(header::CONTENT_TYPE, content_type_value(&info.content_type));
    set_offset(hm, info.next_seq);
    if info.closed {
        set_true(hm, h::DS_STREAM_CLOSED);
    }
    no_store(hm);
}

/// An absolute URL for `Location`, from the request's Host (HTTP/1.1) or its authority (HTTP/2
/// sends `:authority`, which hyper puts in the URI, and no Host header).
fn location(headers: &HeaderMap, uri: &Uri) -> Option<HeaderValue> {
    let host = match headers.get(header::HOST) {
        Some(h) => h.to_str().ok()?,
        None => uri.authority()?.as_str(),
    };
    HeaderValue::from_str(&format!("http://{host}{}", uri.path())).ok()
}

pub async fn put(
    ds: &Ds,
    name: StreamName,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, DsError> {
    let content_type = dh::content_type(headers)?;
    let (ttl_secs, expires_at_ms) = dh::ttl_and_expiry(headers)?;
    let closed = dh::closed(headers)?;
    let fork = dh::fork(headers)?;
    let body = read_body(headers, body, ds.node.config().max_request_size).await?;
    let config = CreateConfig {
        content_type,
        ttl_secs,
        expires_at_ms,
        closed,
    };
    let out = match fork {
        None => {
            let ct = h::normalize_content_type(config.content_type.as_deref());
            let initial = records(&ct, body)?;
            ds.node
                .create(CreateRequest {
                    name: name.clone(),
                    config,
                    initial,
                })
                .await?
        }
        Some(f) => {
            let source = source_name(ds.root, &f.source)?;
            // The body is framed by the fork's content type: the given one, else the source's.
            let ct = match &config.content_type {
                Some(ct) => ct.clone(),
                None if body.is_empty() => String::new(),
                None => match ds.node.head(&source).await {
                    Ok(info) => info.content_type,
                    // A soft-deleted source is a conflict for a fork (409), as the fork itself
                    // answers when there is no body to frame; not the source's own 410.
                    Err(ReadError::Gone(_)) => {
                        return Err(ForkError::Conflict {
                            name: name.to_string(),
                            reason: format!("fork source is deleted: source=`{source}`"),
                        }
                        .into());
                    }
                    Err(e) => return Err(e.into()),
                },
            };
            let initial = records(&ct, body)?;
            ds.node
                .fork(ForkRequest {
                    name: name.clone(),
                    source,
                    offset: f.offset,
                    sub_offset: f.sub_offset,
                    config,
                    initial,
                })
                .await?
        }
    };
    let mut resp = if out.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
    .into_response();
    let hm = resp.headers_mut();
    info_headers(hm, &out.info);
    if out.created
        && let Some(loc) = location(headers, uri)
    {
        hm.insert(header::LOCATION, loc);
    }
    Ok(resp)
}

pub async fn post(
    ds: &Ds,
    name: StreamName,
    headers: &HeaderMap,
    body: Body,
    mut seen: Lookup,
) -> Result<Response, DsError> {
    let dh::AppendHeaders {
        close,
        producer,
        stream_seq,
        content_type: request_ct,
    } = dh::AppendHeaders::parse(headers)?;
    let body = read_body(headers, body, ds.node.config().max_request_size).await?;
    if body.is_empty() && !close {
        return Err(DsError::bad_request(
            "empty append: send a body, or Stream-Closed: true to close",
        ));
    }
    let records = if body.is_empty() {
        Vec::new()
    } else {
        let Some(ct) = &request_ct else {
            return Err(DsError::bad_request(
                "an append with a body needs a Content-Type",
            ));
        };
        // Frame by the stream's type; a mismatching request type is left to the service (409).
        let framing = ds.node.framing_seen(&name, &mut seen)?;
        // Any append to a closed stream is a 409 with the closure headers, whatever its body:
        // its tail is asked only then (closed streams are rare).
        let closed_at = match framing.closed {
            // Boxed, as closed streams are rare: not part of every append's future.
            true => Some(Box::pin(ds.node.head(&name)).await?.next_seq),
            false => None,
        };
        let frame_ct = if h::content_type_matches(ct, &framing.content_type) {
            &framing.content_type[..]
        } else {
            h::CONTENT_TYPE_OCTET_STREAM
        };
        // Refused as closed only once the body is refused, so a valid body is parsed once.
        let refuse = |e: DsError| match closed_at {
            Some(next_seq) => DsError::from(AppendError::Closed {
                name: name.to_string(),
                next_seq,
            }),
            None => e,
        };
        let recs = records(frame_ct, body).map_err(refuse)?;
        if recs.is_empty() {
            return Err(refuse(DsError::bad_request(
                "empty JSON arrays are not allowed",
            )));
        }
        recs
    };
    let wrote = !records.is_empty();
    let has_producer = producer.is_some();
    let reclose = !wrote && close && producer.is_none();
    let result = ds
        .node
        .append_seen(
            AppendRequest {
                name,
                records,
                producer,
                match_seq: None,
                close,
                content_type: if wrote { request_ct } else { None },
            },
            AppendOptions { stream_seq },
            seen,
        )
        .await;
    let out = match result {
        // Closing a closed stream is idempotent on the DS wire (the Pico protocol answers 409).
        Err(AppendError::Closed { next_seq, .. }) if reclose => {
            let mut resp = StatusCode::NO_CONTENT.into_response();
            let hm = resp.headers_mut();
            set_offset(hm, next_seq);
            set_true(hm, h::DS_STREAM_CLOSED);
            no_store(hm);
            return Ok(resp);
        }
        other => other?,
    };
    // 200 only for new data from an idempotent producer; duplicates and plain appends are 204.
    let status = if has_producer && wrote && !out.duplicate {
        StatusCode::OK
    } else {
        StatusCode::NO_CONTENT
    };
    let mut resp = status.into_response();
    let hm = resp.headers_mut();
    set_offset(hm, out.next_seq);
    if out.closed {
        set_true(hm, h::DS_STREAM_CLOSED);
    }
    if let Some((epoch, seq)) = out.producer {
        set(hm, h::DS_PRODUCER_EPOCH, HeaderValue::from(epoch));
        set(hm, h::DS_PRODUCER_SEQ, HeaderValue::from(seq));
    }
    no_store(hm);
    Ok(resp)
}

pub async fn delete(ds: &Ds, name: StreamName) -> Result<Response, DsError> {
    ds.node.delete(&name).await?;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    no_store(resp.headers_mut());
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn location_from_host_or_the_http2_authority() {
        let mut h = HeaderMap::new();
        let path: Uri = "/v1/stream/a".parse().unwrap();
        assert!(location(&h, &path).is_none());
        let h2: Uri = "http://node1:4437/v1/stream/a".parse().unwrap();
        assert_eq!(location(&h, &h2).unwrap(), "http://node1:4437/v1/stream/a");
        h.insert(header::HOST, HeaderValue::from_static("n:1"));
        assert_eq!(location(&h, &path).unwrap(), "http://n:1/v1/stream/a");
    }

    #[test]
    fn body_framing() {
        let r = records("text/plain", Bytes::from_static(b"a\nb")).unwrap();
        assert_eq!(r.len(), 1);
        let r = records(
            "application/json",
            Bytes::from_static(b"[1,[2,3],{\"a\":4}]"),
        )
        .unwrap();
        let vals: Vec<&[u8]> = r.iter().map(|r| &r.value[..]).collect();
        assert_eq!(vals, vec![&b"1"[..], b"[2,3]", b"{\"a\":4}"]);
        assert!(
            records("application/json", Bytes::from_static(b"[]"))
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            records(
                "application/json; charset=utf-8",
                Bytes::from_static(b"{ bad")
            )
            .unwrap_err()
            .status,
            400
        );
        assert!(
            records("application/json", Bytes::new())
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn json_arrays_past_the_append_limit_are_413() {
        let max = MAX_RECORDS_PER_APPEND;
        let array = |n: usize| Bytes::from(format!("[{}]", vec!["1"; n].join(",")));
        assert_eq!(records("application/json", array(max)).unwrap().len(), max);
        let e = records("application/json", array(max + 1)).unwrap_err();
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(
            e.message,
            format!("too many messages in one append: max={max}")
        );
        // A byte stream's body is one record whatever it holds.
        assert_eq!(records("text/plain", array(max + 1)).unwrap().len(), 1);
    }
}
