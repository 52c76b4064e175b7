//! `GET` catch-up (ETag/304, up to the tail as of the request, `offset=now`), `GET
//! ?live=long-poll` (one page, 204 with a cursor on timeout, immediate on closed streams) and
//! `HEAD` (metadata, does not slide the TTL).

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::OffsetSpec;
use pico_protocol::ds_json::render_array;
use pico_protocol::headers as h;
use pico_protocol::headers::is_json;
use pico_server::{LongPoll, ReadError, ReadFrom, ReadOutcome, ReadRecord, ReadRequest};

use super::error::DsError;
use super::headers::ReadQuery;
use super::{Ds, content_type_value, set, set_offset, set_true};
use crate::headers::{Live, format_rfc3339_ms, header_list};
use crate::pico::no_store;
use crate::pico::read::if_none_match;
use crate::telemetry::live_read;

/// Catch-up and long-poll data responses may be cached by CDNs (offsets are immutable).
pub const CACHE_READ: &str = "public, max-age=60, stale-while-revalidate=300";

/// One read from `from`; `Beginning` starts at the first readable record. Offsets past the tail
/// were never minted by this server: 400.
pub async fn read_from(
    ds: &Ds,
    name: &StreamName,
    from: OffsetSpec,
    touch: bool,
) -> Result<ReadOutcome, DsError> {
    let req = |from| ReadRequest {
        name: name.clone(),
        from,
        max_records: None,
        max_bytes: None,
        touch,
    };
    let out = match from {
        OffsetSpec::Now => ds.node.read(req(ReadFrom::Now)).await?,
        OffsetSpec::At(n) => ds.node.read(req(ReadFrom::Offset(n))).await?,
        OffsetSpec::Beginning => match ds.node.read(req(ReadFrom::Offset(0))).await {
            Err(ReadError::Trimmed { start_seq, .. }) => {
                ds.node.read(req(ReadFrom::Offset(start_seq))).await?
            }
            other => other?,
        },
    };
    if out.next_seq > out.tail {
        return Err(DsError::bad_request(format!(
            "offset beyond the stream's tail: offset={} tail={}",
            out.next_seq, out.tail
        )));
    }
    Ok(out)
}

/// The body of a read: concatenated record values, or a JSON array for JSON streams.
pub fn body_of(out: &ReadOutcome, json: bool) -> Bytes {
    values_body(&out.records, json)
}

/// [`body_of`] some records.
pub fn values_body(records: &[ReadRecord], json: bool) -> Bytes {
    if json {
        return Bytes::from(render_array(records.iter().map(|r| &r.record.value[..])));
    }
    crate::pieces::raw_values(records)
}

fn read_headers(hm: &mut HeaderMap, out: &ReadOutcome) {
    hm.insert(
        header::CONTENT_TYPE,
        content_type_value(&out.info.content_type),
    );
    set_offset(hm, out.next_seq);
    if out.up_to_date {
        set_true(hm, h::DS_STREAM_UP_TO_DATE);
    }
    if out.closed {
        set_true(hm, h::DS_STREAM_CLOSED);
    }
}

/// Same incarnation, same range, same flags → same response. The flags cover the headers that
/// change while the range does not: a 304 cannot remove a cached header, so a chunk cached as
/// up to date needs a new tag once the tail moves past it (`:u`), as one cached open does once
/// the stream closes (`:c`).
fn etag(out: &ReadOutcome, from: u64) -> String {
    let u = if out.up_to_date { ":u" } else { "" };
    let c = if out.closed { ":c" } else { "" };
    format!(
        "\"ds:{}:{from}:{}{u}{c}\"",
        out.info.stream_id, out.next_seq
    )
}

pub async fn get(
    ds: &Ds,
    name: StreamName,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Response, DsError> {
    let q = ReadQuery::parse(uri)?;
    match q.live {
        Live::CatchUp => catch_up(ds, &name, &q, headers).await,
        Live::LongPoll => long_poll(ds, &name, &q).await.map(live_read),
        Live::Sse => super::sse::sse(ds, name, &q).await.map(live_read),
    }
}

/// A catch-up read answers everything from the offset up to the tail as it was when the request
/// came in: the first page is read here (its errors are the response's status), the rest while
/// the body is sent ([`super::catch_up`]). DS clients end a non-live read after one response.
async fn catch_up(
    ds: &Ds,
    name: &StreamName,
    q: &ReadQuery,
    headers: &HeaderMap,
) -> Result<Response, DsError> {
    let out = read_from(ds, name, q.offset, true).await?;
    let json = is_json(&out.info.content_type);
    if q.offset == OffsetSpec::Now {
        // "Where is the tail now": never cached, no validator.
        let body = if json {
            Bytes::from_static(b"[]")
        } else {
            Bytes::new()
        };
        let mut resp = Response::new(Body::from(body));
        let hm = resp.headers_mut();
        read_headers(hm, &out);
        set_true(hm, h::DS_STREAM_UP_TO_DATE);
        no_store(hm);
        return Ok(resp);
    }
    let from = out.records.first().map_or(out.next_seq, |r| r.offset);
    // The response's range: the first page's, or up to the tail when that page stops short.
    let whole = whole_range(&out);
    let tag = etag(&whole, from);
    let tag_value = HeaderValue::from_str(&tag).ok();
    if let Some(inm) = header_list(headers, "if-none-match")?
        && if_none_match(&inm, &tag)
    {
        let mut resp = StatusCode::NOT_MODIFIED.into_response();
        let hm = resp.headers_mut();
        read_headers(hm, &whole);
        hm.remove(header::CONTENT_TYPE);
        if let Some(v) = tag_value {
            hm.insert(header::ETAG, v);
        }
        hm.insert(header::CACHE_CONTROL, HeaderValue::from_static(CACHE_READ));
        return Ok(resp);
    }
    let body = if out.up_to_date {
        Body::from(body_of(&out, json))
    } else {
        super::catch_up::body(ds.clone(), name.clone(), out, whole.next_seq, json)
    };
    let mut resp = Response::new(body);
    let hm = resp.headers_mut();
    read_headers(hm, &whole);
    if let Some(v) = tag_value {
        hm.insert(header::ETAG, v);
    }
    hm.insert(header::CACHE_CONTROL, HeaderValue::from_static(CACHE_READ));
    Ok(resp)
}

/// What a catch-up response covers, without its records: `out` when it reached the tail, else
/// the range up to `out`'s tail, which is then up to date and, on a closed stream (whose tail
/// is its final offset), closed.
fn whole_range(out: &ReadOutcome) -> ReadOutcome {
    let (next_seq, up_to_date, closed) = if out.up_to_date {
        (out.next_seq, out.up_to_date, out.closed)
    } else {
        (out.tail, true, out.info.closed)
    };
    ReadOutcome {
        records: Vec::new(),
        next_seq,
        tail: out.tail,
        up_to_date,
        closed,
        info: out.info.clone(),
    }
}

async fn long_poll(ds: &Ds, name: &StreamName, q: &ReadQuery) -> Result<Response, DsError> {
    let cursor = ds.node.live_cursor(q.cursor);
    let mut out = read_from(ds, name, q.offset, true).await?;
    if out.records.is_empty() && !out.closed {
        let req = ReadRequest {
            name: name.clone(),
            from: ReadFrom::Offset(out.next_seq),
            max_records: None,
            max_bytes: None,
            touch: false,
        };
        match ds
            .node
            .long_poll(req, ds.node.config().long_poll_timeout)
            .await?
        {
            LongPoll::Data(o) | LongPoll::Closed(o) => out = o,
            LongPoll::Timeout => {}
        }
    }
    let json = is_json(&out.info.content_type);
    let mut resp = if out.records.is_empty() {
        // Nothing new: the reader is at the tail (204 on timeout and on a closed stream).
        out.up_to_date = true;
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let hm = resp.headers_mut();
        read_headers(hm, &out);
        hm.remove(header::CONTENT_TYPE);
        no_store(hm);
        resp
    } else {
        let mut resp = Response::new(Body::from(body_of(&out, json)));
        let hm = resp.headers_mut();
        read_headers(hm, &out);
        hm.insert(header::CACHE_CONTROL, HeaderValue::from_static(CACHE_READ));
        resp
    };
    if !out.closed {
        set(
            resp.headers_mut(),
            h::DS_STREAM_CURSOR,
            HeaderValue::from(cursor),
        );
    }
    Ok(resp)
}

pub async fn head(ds: &Ds, name: StreamName) -> Result<Response, DsError> {
    let info = ds.node.head(&name).await?;
    let mut resp = StatusCode::OK.into_response();
    let hm = resp.headers_mut();
    hm.insert(header::CONTENT_TYPE, content_type_value(&info.content_type));
    set_offset(hm, info.next_seq);
    if let Some(ttl) = info.ttl_secs {
        set(hm, h::DS_STREAM_TTL, HeaderValue::from(ttl));
    }
    if let Some(at) = info.expires_at_ms
        && let Ok(v) = HeaderValue::from_str(&format_rfc3339_ms(at))
    {
        set(hm, h::DS_STREAM_EXPIRES_AT, v);
    }
    if info.closed {
        set_true(hm, h::DS_STREAM_CLOSED);
    }
    no_store(hm);
    Ok(resp)
}
