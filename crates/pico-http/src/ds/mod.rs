//! The Durable Streams protocol on the protocol listener: `/v1/stream/{name}` (and `/{name}`
//! with `--protocol ds`), over the same streams as the Pico paths. Offsets are the 20-digit text
//! form of record offsets, so both protocols address the same positions.
//!
//! - [`write`]: `PUT` (create, create-closed, fork), `POST` (append, close), `DELETE`.
//! - [`read`]: `GET` catch-up and long-poll, `HEAD`; [`catch_up`] streams a catch-up body that
//!   spans many pages.
//! - [`sse`]: `GET ?live=sse`; [`sse_render`] renders a large read's frame piece by piece.
//! - [`headers`]: strict header and query parsing.
//! - [`error`]: DS status codes and error headers.
//! - `subscriptions`: the reserved `__ds` namespace (routed before stream paths).

pub mod catch_up;
pub mod error;
pub mod headers;
pub mod read;
pub mod sse;
#[cfg(test)]
mod sse_hub_tests;
pub mod sse_render;
pub mod subscriptions;
pub mod write;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use pico_common::StreamName;
use pico_protocol::headers as h;
use pico_protocol::push_offset;
use pico_server::Node;
use pico_server::node::Lookup;

use error::DsError;

/// The conventional DS mount.
pub const DS_ROOT: &str = "/v1/stream";
/// The reserved control namespace under a DS root.
pub const RESERVED_SEGMENT: &str = "__ds";

/// Handler state: the node and the root the stream paths hang off (`""` = the server root).
#[derive(Clone)]
pub struct Ds {
    pub node: Node,
    pub root: &'static str,
}

/// DS under `/v1/stream`, plus at `/` when `at_root`. The `__ds` namespace of each root goes to
/// the subscriptions router first.
pub fn router(node: Node, at_root: bool) -> Router {
    // One subscription manager for both roots: each wake is delivered once.
    let subs = Arc::new(subscriptions::Manager::new(node.clone()));
    let mut r = mount_with(node.clone(), DS_ROOT, subs.clone());
    if at_root {
        r = r.merge(mount_with(node, "", subs));
    }
    r
}

/// One root with a subscription manager of its own (tests).
#[cfg(test)]
fn mount(node: Node, root: &'static str) -> Router {
    let subs = Arc::new(subscriptions::Manager::new(node.clone()));
    mount_with(node, root, subs)
}

fn mount_with(node: Node, root: &'static str, subs: Arc<subscriptions::Manager>) -> Router {
    let state = Ds {
        node: node.clone(),
        root,
    };
    let streams = Router::new()
        .route(&format!("{root}/{{*path}}"), any(dispatch))
        .with_state(state);
    Router::new()
        .nest(
            &format!("{root}/{RESERVED_SEGMENT}"),
            subscriptions::router(subs),
        )
        .merge(streams)
}

async fn dispatch(
    State(ds): State<Ds>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    serve(&ds, &method, &uri, &headers, body).await
}

/// One request for a stream path under `ds.root`, whatever its method: the router's handler,
/// and what the hot path ([`crate::fast`]) calls directly.
pub async fn serve(
    ds: &Ds,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let seen = Lookup::default();
    serve_named(
        ds,
        stream_name(ds.root, uri),
        method,
        uri,
        headers,
        body,
        seen,
    )
    .await
}

/// [`serve`] for a request whose stream name (by [`stream_name`]) the caller has parsed, with
/// the look at the metadata view owner routing made for it ([`Lookup`]: an append takes the
/// stream's entries from it).
pub async fn serve_named(
    ds: &Ds,
    name: Result<StreamName, DsError>,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    body: Body,
    seen: Lookup,
) -> Response {
    // Each handler's future is boxed: inline, every request's future would be as large as
    // the largest of them (a create's), and the listener moves it into a box of its own.
    let result = match name {
        Err(e) => Err(e),
        Ok(name) => match *method {
            Method::GET => Box::pin(read::get(ds, name, uri, headers)).await,
            Method::HEAD => Box::pin(read::head(ds, name)).await,
            Method::PUT => match new_stream_name(&name) {
                Ok(()) => Box::pin(write::put(ds, name, uri, headers, body)).await,
                Err(e) => Err(e),
            },
            Method::POST => Box::pin(write::post(ds, name, headers, body, seen)).await,
            Method::DELETE => Box::pin(write::delete(ds, name)).await,
            _ => Err(DsError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method not allowed: use GET, HEAD, PUT, POST, DELETE or OPTIONS",
            )),
        },
    };
    result.unwrap_or_else(IntoResponse::into_response)
}

/// The stream a DS path names: the path below `root`, by the rule the Pico path `/{name}` uses
/// too ([`StreamName::from_path`]), so both name the same stream.
pub fn stream_name(root: &str, uri: &Uri) -> Result<StreamName, DsError> {
    let rest = uri
        .path()
        .strip_prefix(root)
        .filter(|r| r.starts_with('/'))
        .ok_or_else(|| DsError::new(StatusCode::NOT_FOUND, "not a stream path"))?;
    stream_name_from(rest)
}

/// A stream's name from a path, with the Pico facade's message.
fn stream_name_from(path: &str) -> Result<StreamName, DsError> {
    StreamName::from_path(path).map_err(|e| DsError::bad_request(format!("bad stream name: {e}")))
}

/// A create's name must also not be reserved ([`StreamName::parse_new`]), with the Pico
/// facade's message: both name the same streams, so a name one of them reserves (`__ds`,
/// `_sys`, `_groups`, `v1/stream`) is refused by the other too.
fn new_stream_name(name: &StreamName) -> Result<(), DsError> {
    StreamName::parse_new(name.as_str())
        .map(|_| ())
        .map_err(|e| DsError::bad_request(format!("bad stream name: {e}")))
}

/// The stream a `Stream-Forked-From` value names: a path under this root (or under `/v1/stream`),
/// or a full URL on this server.
pub fn source_name(root: &str, value: &str) -> Result<StreamName, DsError> {
    let path = match value.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("", |i| &rest[i..]),
        None => value,
    };
    let path = path.split(['?', '#']).next().unwrap_or_default();
    let rest = [root, DS_ROOT]
        .iter()
        .filter(|r| !r.is_empty())
        .find_map(|r| path.strip_prefix(r).filter(|p| p.starts_with('/')))
        .unwrap_or(path);
    stream_name_from(rest)
}

pub(crate) fn set(headers: &mut HeaderMap, name: &'static str, value: HeaderValue) {
    headers.insert(HeaderName::from_static(name), value);
}

/// Built at compile time: `from_static` at run time checks the name on every call.
const STREAM_NEXT_OFFSET: HeaderName = HeaderName::from_static(h::DS_STREAM_NEXT_OFFSET);

pub(crate) fn set_offset(headers: &mut HeaderMap, offset: u64) {
    // The digits' buffer becomes the value as it is (one allocation, not a string and a copy):
    // every append's answer carries one.
    let mut digits = Vec::with_capacity(20);
    push_offset(&mut digits, offset);
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(digits)) {
        headers.insert(STREAM_NEXT_OFFSET, v);
    }
}

pub(crate) fn set_true(headers: &mut HeaderMap, name: &'static str) {
    set(headers, name, HeaderValue::from_static("true"));
}

/// Content type header value from a stored (validated) content type.
pub(crate) fn content_type_value(ct: &str) -> HeaderValue {
    HeaderValue::from_str(ct).unwrap_or(HeaderValue::from_static(h::CONTENT_TYPE_OCTET_STREAM))
}

/// Whether SSE carries this content type as UTF-8 text (else base64).
pub fn sse_is_text(ct: &str) -> bool {
    let media = h::media_type(ct);
    media.starts_with("text/") || media == "application/json"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(root: &str, path: &str) -> Result<String, StatusCode> {
        stream_name(root, &path.parse::<Uri>().unwrap())
            .map(|n| n.into_string())
            .map_err(|e| e.status)
    }

    /// The name a PUT may create there.
    fn new_name(root: &str, path: &str) -> Result<String, StatusCode> {
        let n = stream_name(root, &path.parse::<Uri>().unwrap()).map_err(|e| e.status)?;
        new_stream_name(&n).map_err(|e| e.status)?;
        Ok(n.into_string())
    }

    #[test]
    fn names_from_paths() {
        assert_eq!(name(DS_ROOT, "/v1/stream/orders/42").unwrap(), "orders/42");
        assert_eq!(name(DS_ROOT, "/v1/stream/a%20b?offset=1").unwrap(), "a%20b");
        assert_eq!(name(DS_ROOT, "/v1/streamx").unwrap_err(), 404);
        assert_eq!(new_name(DS_ROOT, "/v1/stream/__ds").unwrap_err(), 400);
        assert_eq!(name("", "/orders").unwrap(), "orders");
        assert_eq!(name(DS_ROOT, "/v1/stream/a/../b").unwrap_err(), 400);
        assert_eq!(name(DS_ROOT, "/v1/stream/%61%2e").unwrap(), "a.");
        // The Pico facade's reserved names: addressable, not creatable.
        for bad in ["_sys/x", "_groups", "v1/stream", "v1/stream/x", "%5F%5Fds"] {
            assert_eq!(
                new_name(DS_ROOT, &format!("/v1/stream/{bad}")).unwrap_err(),
                400
            );
            assert_eq!(new_name("", &format!("/{bad}")).unwrap_err(), 400);
            assert!(name("", &format!("/{bad}")).is_ok(), "{bad}");
        }
        // Names with two meanings, or a URL parser would not send as spelled: refused always.
        for bad in ["a/%2E%2e", "a%2", "a%2fb", "%ff%fe"] {
            assert_eq!(
                name(DS_ROOT, &format!("/v1/stream/{bad}")).unwrap_err(),
                400
            );
            assert_eq!(name("", &format!("/{bad}")).unwrap_err(), 400);
        }
    }

    #[test]
    fn fork_sources() {
        let s = |v: &str| source_name(DS_ROOT, v).unwrap().into_string();
        assert_eq!(s("/v1/stream/src"), "src");
        assert_eq!(s("http://127.0.0.1:4437/v1/stream/a/b"), "a/b");
        assert_eq!(s("plain"), "plain");
        assert_eq!(source_name("", "/v1/stream/x").unwrap().as_str(), "x");
        assert_eq!(source_name("", "/x").unwrap().as_str(), "x");
    }

    #[test]
    fn sse_text_types() {
        assert!(sse_is_text("text/plain; charset=utf-8"));
        assert!(sse_is_text("Application/JSON"));
        assert!(!sse_is_text("application/octet-stream"));
        assert!(!sse_is_text("image/png"));
    }
}
