//! The Pico protocol: the stream name is the request path.
//!
//! - [`create`]: `PUT /{name}`; [`append`]: `POST /{name}` (records, close, trim);
//!   [`read`]: `GET /{name}` (catch-up, long-poll, SSE); [`head`]: `HEAD /{name}`;
//!   [`delete`]: `DELETE /{name}`; [`list`]: `GET /`.

pub mod append;
pub mod create;
pub mod delete;
pub mod head;
pub mod list;
pub mod read;

use std::collections::HashSet;
use std::pin::Pin;

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Uri, header};
use axum::routing::get;
use bytes::{Bytes, BytesMut};
use pico_common::StreamName;
use pico_protocol::headers as h;
use pico_server::{Node, StreamInfo};

use crate::error::{BodyTimeout, HttpError};
use crate::headers::format_rfc3339_ms;

pub fn router(node: Node) -> Router {
    let stream = get(read::read)
        .put(create::create)
        .post(append::append)
        .head(head::head)
        .delete(delete::delete)
        .fallback(method_not_allowed);
    Router::new()
        .route("/", get(list::list).fallback(method_not_allowed))
        .route("/{*path}", stream)
        .with_state(node)
}

async fn method_not_allowed() -> HttpError {
    HttpError::method_not_allowed("method not allowed: use GET, HEAD, PUT, POST, DELETE or OPTIONS")
}

/// The stream the request path names, by the one rule both protocols use
/// ([`StreamName::from_path`]): the decoded path, so `/%61` is `/a`; an encoded `/`, bytes that
/// are not UTF-8 once decoded, and `.`/`..` segments however spelled are 400.
pub fn stream_name(uri: &Uri) -> Result<StreamName, HttpError> {
    StreamName::from_path(uri.path())
        .map_err(|e| HttpError::bad_request(format!("bad stream name: {e}")))
}

/// The name a create asks for ([`StreamName::parse_new`]): [`stream_name`]'s rule, and reserved
/// names (`_sys`, `_groups`, `__ds`, the DS mount `v1/stream`) are refused as in the DS facade,
/// with the same message.
pub fn new_stream_name(uri: &Uri) -> Result<StreamName, HttpError> {
    StreamName::parse_new(uri.path())
        .map_err(|e| HttpError::bad_request(format!("bad stream name: {e}")))
}

/// Reads the whole request body, refusing more than `limit` bytes (413) before buffering it.
/// A client that stops sending, or sends too slowly, is answered 408 once one of the listener's
/// body timers runs out (the body then fails with [`BodyTimeout`]); this loop has no timer of
/// its own.
/// A body that arrives as one chunk is returned as is; otherwise the buffer is sized from
/// `Content-Length` up front (see [`initial_capacity`]), so a large body is copied few times.
pub async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, HttpError> {
    let too_large = || HttpError::too_large(format!("request body too large: max={limit}"));
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(too_large());
    }
    let mut body = body;
    let mut first: Option<Bytes> = None;
    let mut buf = BytesMut::new();
    let mut total = 0usize;
    while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await {
        let frame = frame.map_err(|e| match BodyTimeout::find(&e) {
            // The listener's idle timer: the client stopped sending.
            Some(t) => HttpError::request_timeout(t.to_string()),
            None => HttpError::bad_request(format!("failed to read request body: {e}")),
        })?;
        // Trailers carry no body bytes.
        let Ok(chunk) = frame.into_data() else {
            continue;
        };
        total = total.saturating_add(chunk.len());
        if total > limit {
            return Err(too_large());
        }
        if first.is_none() && buf.is_empty() {
            first = Some(chunk);
        } else {
            if let Some(f) = first.take() {
                buf.reserve(initial_capacity(declared, total));
                buf.extend_from_slice(&f);
            }
            buf.extend_from_slice(&chunk);
        }
        // A body of a declared length ends with its last byte: no poll just to hear that.
        if body.is_end_stream() {
            break;
        }
    }
    Ok(match first {
        Some(f) => f,
        None => buf.freeze(),
    })
}

/// Most a body buffer is sized to from `Content-Length` alone.
const MAX_UP_FRONT: usize = 1 << 20;

/// Capacity of a chunked body's buffer once `arrived` bytes are in: the declared length, but at
/// most 1 MiB or twice what arrived. A declared length is only a claim: trusted whole, a client
/// declaring 32 MiB then sending two bytes would pin 32 MiB per connection. Past the cap the
/// buffer grows by doubling as data arrives; an understated length still fits what arrived.
fn initial_capacity(declared: Option<u64>, arrived: usize) -> usize {
    let declared = declared.map_or(0, |l| usize::try_from(l).unwrap_or(usize::MAX));
    declared
        .min(MAX_UP_FRONT.max(arrived.saturating_mul(2)))
        .max(arrived)
}

pub fn set(headers: &mut HeaderMap, name: &'static str, value: impl Into<HeaderValue>) {
    headers.insert(HeaderName::from_static(name), value.into());
}

pub fn set_true(headers: &mut HeaderMap, name: &'static str) {
    set(headers, name, HeaderValue::from_static("true"));
}

pub fn no_store(headers: &mut HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
}

/// A header value from text that might not be header-safe (content types come from clients,
/// but were validated on create; fall back rather than fail a response).
pub fn text_value(s: &str) -> HeaderValue {
    HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(h::CONTENT_TYPE_OCTET_STREAM))
}

/// The stream metadata headers shared by HEAD, PUT and trim responses.
pub fn info_headers(headers: &mut HeaderMap, info: &StreamInfo) {
    set(headers, h::PICO_NEXT_SEQ, info.next_seq);
    set(headers, h::PICO_START_SEQ, info.start_seq);
    if let Some(ttl) = info.ttl_secs {
        set(headers, h::PICO_TTL, ttl);
    }
    if let Some(at) = info.expires_at_ms {
        set(
            headers,
            h::PICO_EXPIRES_AT,
            text_value(&format_rfc3339_ms(at)),
        );
    }
    if info.closed {
        set_true(headers, h::PICO_CLOSED);
    }
}

/// Query parameters, each at most once. Unknown names are ignored (cache busters).
#[derive(Debug)]
pub struct Params(Vec<(String, String)>);

impl Params {
    pub fn parse(uri: &Uri) -> Result<Params, HttpError> {
        let axum::extract::Query(pairs) =
            axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
                .map_err(|e| HttpError::bad_request(format!("bad query string: {e}")))?;
        // A set, not pairwise comparison: a long URI can hold thousands of names.
        let mut seen = HashSet::with_capacity(pairs.len());
        for (k, _) in &pairs {
            if !seen.insert(k.as_str()) {
                return Err(HttpError::bad_request(format!(
                    "query parameter repeated: name={k}"
                )));
            }
        }
        Ok(Params(pairs))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// A strict decimal parameter.
    pub fn u64(&self, name: &str) -> Result<Option<u64>, HttpError> {
        self.get(name)
            .map(|v| {
                pico_protocol::parse_strict_u64(v).map_err(|e| {
                    HttpError::bad_request(format!("bad query parameter: name={name} {e}"))
                })
            })
            .transpose()
    }

    /// A strict decimal parameter that must be at least 1, as a usize.
    pub fn positive(&self, name: &str) -> Result<Option<usize>, HttpError> {
        match self.u64(name)? {
            None => Ok(None),
            Some(0) => Err(HttpError::bad_request(format!(
                "query parameter must be at least 1: name={name}"
            ))),
            Some(n) => Ok(Some(usize::try_from(n).unwrap_or(usize::MAX))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Bytes;
    use hyper::body::Frame;
    use std::collections::VecDeque;
    use std::task::{Context, Poll};

    /// Chunks, then a trailer frame (if any); with `declared`, its end shows in
    /// `is_end_stream` and a poll past it fails (as a length-declared body needs no such poll).
    struct Chunks {
        frames: VecDeque<Frame<Bytes>>,
        declared: bool,
    }

    impl HttpBody for Chunks {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            match self.frames.pop_front() {
                Some(f) => Poll::Ready(Some(Ok(f))),
                None if self.declared => {
                    Poll::Ready(Some(Err(std::io::Error::other("polled past its end"))))
                }
                None => Poll::Ready(None),
            }
        }

        fn is_end_stream(&self) -> bool {
            self.declared && self.frames.is_empty()
        }
    }

    fn body(chunks: &[&'static str], trailers: bool, declared: bool) -> Body {
        let mut frames: VecDeque<_> = chunks
            .iter()
            .map(|c| Frame::data(Bytes::from_static(c.as_bytes())))
            .collect();
        if trailers {
            frames.push_back(Frame::trailers(HeaderMap::new()));
        }
        Body::new(Chunks { frames, declared })
    }

    #[tokio::test]
    async fn bodies_are_read_whole_and_declared_ones_no_further_than_their_end() {
        let h = HeaderMap::new();
        for declared in [false, true] {
            for (chunks, trailers) in [
                (&["one"][..], false),
                (&["a", "b", "c"][..], false),
                (&["a", "b"][..], true),
            ] {
                // A declared body with trailers is not one whose length was declared.
                let declared = declared && !trailers;
                let got = read_body(&h, body(chunks, trailers, declared), 100)
                    .await
                    .unwrap();
                assert_eq!(got, chunks.concat(), "{chunks:?} declared={declared}");
            }
        }
        let e = read_body(&h, body(&["abc", "def"], false, true), 5)
            .await
            .unwrap_err();
        assert_eq!(e.status, 413);
        assert_eq!(read_body(&h, body(&[], false, false), 5).await.unwrap(), "");
    }

    fn name(path: &str) -> Result<StreamName, HttpError> {
        stream_name(&path.parse::<Uri>().unwrap())
    }

    fn new_name(path: &str) -> Result<StreamName, HttpError> {
        new_stream_name(&path.parse::<Uri>().unwrap())
    }

    #[test]
    fn names_from_paths() {
        assert_eq!(name("/orders/42").unwrap().as_str(), "orders/42");
        assert_eq!(name("/a%20b").unwrap().as_str(), "a%20b");
        assert_eq!(name("/%61/b%3a").unwrap().as_str(), "a/b:");
        // Reserved: addressable (the server's own streams), not creatable.
        for reserved in [
            "/_sys/x",
            "/_groups",
            "/v1/stream/x",
            "/v1/stream",
            "/__ds/x",
        ] {
            assert_eq!(new_name(reserved).unwrap_err().status, 400, "{reserved}");
            assert!(name(reserved).is_ok(), "{reserved}");
        }
        assert_eq!(new_name("/%5Fsys/x").unwrap_err().status, 400);
        // Two meanings: refused for every request.
        for bad in ["/a/%2e%2E/b", "/a%zz", "/a%2Fb", "/%ff%fe", "/a%00"] {
            assert_eq!(name(bad).unwrap_err().status, 400, "{bad}");
            assert_eq!(new_name(bad).unwrap_err().status, 400, "{bad}");
        }
        assert_eq!(new_name("/v1/streams").unwrap().as_str(), "v1/streams");
        assert_eq!(name("/a/../b").unwrap_err().status, 400);
        assert_eq!(name("/a/./b").unwrap_err().status, 400);
    }

    fn params(query: &str) -> Result<Params, HttpError> {
        Params::parse(&format!("/s?{query}").parse::<Uri>().unwrap())
    }

    #[test]
    fn query_parameters_appear_at_most_once() {
        let p = params("a=1&b=2&x=").unwrap();
        assert_eq!(
            (p.get("a"), p.get("b"), p.get("x")),
            (Some("1"), Some("2"), Some(""))
        );
        assert_eq!(p.get("c"), None);
        for dup in ["a=1&a=1", "a=1&b=2&a=3", "b=&c=1&b="] {
            let e = params(dup).unwrap_err();
            assert_eq!(e.status, 400, "{dup}");
            assert!(e.message.contains("query parameter repeated"), "{dup}");
        }
        // As many distinct names as a ~60 KiB URI holds are accepted; a repeat after all of
        // them is still found.
        let many: Vec<String> = (0..12_000).map(|i| format!("{i:x}")).collect();
        let q = many.join("&");
        let p = params(&q).unwrap();
        assert_eq!(p.get("2edf"), Some(""));
        let e = params(&format!("{q}&7")).unwrap_err();
        assert!(e.message.ends_with("name=7"), "{}", e.message);
    }

    #[tokio::test]
    async fn body_limit_is_enforced() {
        let h = HeaderMap::new();
        let ok = read_body(&h, Body::from("12345"), 5).await.unwrap();
        assert_eq!(&ok[..], b"12345");
        let e = read_body(&h, Body::from("123456"), 5).await.unwrap_err();
        assert_eq!(e.status, 413);
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("1000"));
        let e = read_body(&h, Body::from("1"), 5).await.unwrap_err();
        assert_eq!(e.status, 413);
    }

    /// A client that stopped mid-body: the listener's timer fails the body with
    /// [`BodyTimeout`], which must come out as 408 (not the 400 of a broken body).
    #[tokio::test]
    async fn a_body_that_times_out_is_answered_408() {
        let idle = std::time::Duration::from_secs(30);
        let parts: Vec<Result<Bytes, BodyTimeout>> =
            vec![Ok(Bytes::from_static(b"ab")), Err(BodyTimeout::Idle(idle))];
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("10"));
        let body = Body::from_stream(futures::stream::iter(parts));
        let e = read_body(&h, body, 100).await.unwrap_err();
        assert_eq!(e.status, 408, "{}", e.message);
        assert!(
            e.message.contains("no data arrived for 30s"),
            "{}",
            e.message
        );
        // Other body failures stay 400.
        let parts: Vec<Result<Bytes, std::io::Error>> =
            vec![Err(std::io::ErrorKind::ConnectionReset.into())];
        let body = Body::from_stream(futures::stream::iter(parts));
        assert_eq!(read_body(&h, body, 100).await.unwrap_err().status, 400);
    }

    fn chunked(chunks: &[&'static str]) -> Body {
        let parts: Vec<Result<Bytes, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(Bytes::from_static(c.as_bytes())))
            .collect();
        Body::from_stream(futures::stream::iter(parts))
    }

    #[tokio::test]
    async fn a_body_in_chunks_is_joined_in_order_and_limited() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("9"));
        let b = read_body(&h, chunked(&["abc", "", "def", "ghi"]), 9)
            .await
            .unwrap();
        assert_eq!(&b[..], b"abcdefghi");
        // Content-Length understated: the limit still counts what arrived.
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("2"));
        let e = read_body(&h, chunked(&["abc", "def", "ghij"]), 9)
            .await
            .unwrap_err();
        assert_eq!(e.status, 413);
        let b = read_body(&HeaderMap::new(), chunked(&["", "x", "yz"]), 9)
            .await
            .unwrap();
        assert_eq!(&b[..], b"xyz");
        let b = read_body(&HeaderMap::new(), chunked(&[]), 9).await.unwrap();
        assert!(b.is_empty());
    }

    #[test]
    fn up_front_capacity_trusts_content_length_only_so_far() {
        const MIB: usize = 1 << 20;
        // 32 MiB declared, two bytes in: 1 MiB, not 32.
        assert_eq!(initial_capacity(Some(32 << 20), 2), MIB);
        // Large chunks arriving: twice what arrived, up to the declared length.
        assert_eq!(initial_capacity(Some(32 << 20), 3 * MIB), 6 * MIB);
        assert_eq!(initial_capacity(Some(5 << 20), 3 * MIB), 5 * MIB);
        // Small bodies are sized exactly; an understated or missing length fits what arrived.
        assert_eq!(initial_capacity(Some(9), 6), 9);
        assert_eq!(initial_capacity(Some(2), 6), 6);
        assert_eq!(initial_capacity(None, 6), 6);
        assert_eq!(initial_capacity(Some(u64::MAX), usize::MAX), usize::MAX);
    }
}
