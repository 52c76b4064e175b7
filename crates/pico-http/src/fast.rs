//! The protocol listener's hot path: one service that serves the stream routes itself and hands
//! everything else to the axum router (docs/design/http-hot-path.md).
//!
//! A stream request (Pico `POST`/`GET`/`HEAD /{name}`, Durable Streams `POST`/`GET`/`HEAD` under
//! a DS root; live reads included) is matched by its method and path prefix, and the edge work
//! the router's layers would do is a sequence of plain calls: telemetry ([`HttpMetrics`]), the
//! CORS check ([`cors::admit`]), owner routing ([`routing::owner_answer`]), the handler, the CORS
//! headers, then [`seal`] (what axum's router does to every answer). No `from_fn` layer, boxed
//! service, extractor or router lookup runs on the way.
//!
//! Invariants:
//! - A request is taken here only if the router would send it to the same handler: the match
//!   ([`target`]) is narrower than the router's routes, never wider. Anything else
//!   (preflights, `PUT`, `DELETE`, the listing, the `__ds` namespace, `/v1/stream` itself, odd
//!   paths) goes to the router, whose own layers count and guard it exactly once.
//! - An answer from here has the same status, headers (in the same order) and body as the
//!   router's answer to the same request, so clients cannot tell the two apart.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::http::request::Parts;
use axum::http::{HeaderValue, Method, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use pico_common::StreamName;
use pico_server::Node;
use pico_server::node::Lookup;
use tower::ServiceExt;

use crate::cors::{self, Cors};
use crate::ds::{self, DS_ROOT, Ds, RESERVED_SEGMENT};
use crate::pico;
use crate::routing;

/// The protocol listener's service. Cheap to clone.
#[derive(Clone)]
pub struct Protocol(Arc<Inner>);

struct Inner {
    node: Node,
    /// DS under `/v1/stream`, and at the root with `--protocol ds`.
    ds_v1: Ds,
    ds_root: Option<Ds>,
    /// Owner routing is on (not `--routing local`).
    routing: bool,
    /// Shared with the router's CORS layer: one set of counters for the listener.
    cors: Arc<Cors>,
    /// Everything not matched here.
    router: Router,
    /// Requests handed to `router` (see [`Protocol::routed`]).
    routed: AtomicU64,
}

/// A request this service answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    PicoAppend,
    PicoRead,
    PicoHead,
    /// Any of `GET`, `HEAD`, `POST` on a DS stream path; `true` = the root mount.
    Ds {
        at_root: bool,
    },
}

impl Protocol {
    /// `router` serves what is not matched here, with the edge layers of its own (built by
    /// [`crate::protocol_router`] around the same `cors`).
    pub(crate) fn new(
        node: Node,
        ds_at_root: bool,
        routing: bool,
        cors: Arc<Cors>,
        router: Router,
    ) -> Protocol {
        let ds = |root| Ds {
            node: node.clone(),
            root,
        };
        Protocol(Arc::new(Inner {
            ds_v1: ds(DS_ROOT),
            ds_root: ds_at_root.then(|| ds("")),
            node,
            routing,
            cors,
            router,
            routed: AtomicU64::new(0),
        }))
    }

    /// How many requests went to the axum router so far: the hot path's own answers never
    /// count here (tests use it to show that an append does not enter the router).
    pub fn routed(&self) -> u64 {
        self.0.routed.load(Ordering::Relaxed)
    }

    /// Answers one request. The future owns what it needs, so a hyper service can return it.
    /// The answer is not [sealed](seal): the listener seals every answer it sends (the guard's
    /// too), so sealing here as well would only repeat the header lookup; the tower service
    /// below seals for callers without a listener.
    ///
    /// Boxed: hyper moves the service's future into its connection state, and this one holds
    /// every handler's state inline (KiBs; the copy showed in profiles), where a box moves as a
    /// pointer for one small allocation.
    pub fn call(&self, req: Request) -> impl Future<Output = Response> + Send + use<> {
        Box::pin(self.clone().serve(req))
    }

    async fn serve(self, req: Request) -> Response {
        let Some(target) = target(req.method(), req.uri().path(), self.0.ds_root.is_some()) else {
            self.0.routed.fetch_add(1, Ordering::Relaxed);
            return match self.0.router.clone().oneshot(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            };
        };
        let flight = self.0.cors.metrics.as_ref().map(|m| m.start(req.method()));
        let resp = match cors::admit(&self.0.cors.origins, &req) {
            Err(refused) => refused.into_response(),
            Ok(admitted) => {
                let mut resp = self.handle(target, req).await;
                admitted.finish(&mut resp);
                resp
            }
        };
        if let Some(f) = flight {
            f.finish(&resp);
        }
        resp
    }

    /// A 307 or 503 when the stream is not this node's to serve ([`routing`]), else the look at
    /// the metadata view routing made (not taken when routing is off: the handler's node calls
    /// look themselves). `name` is the handler's parse of the path, which owner routing would
    /// make the same way.
    async fn owner(&self, parts: &Parts, name: Option<&StreamName>) -> Result<Lookup, Response> {
        let Some(name) = name else {
            return Ok(Lookup::default());
        };
        if !self.0.routing || !routing::routes(parts.uri.path(), self.0.ds_root.is_some()) {
            return Ok(Lookup::default());
        }
        routing::owner_answer_for(&self.0.node, &parts.method, &parts.uri, name).await
    }

    /// Owner routing, then the handler; the stream name is parsed once for both.
    async fn handle(&self, target: Target, req: Request) -> Response {
        let (parts, body) = req.into_parts();
        let node = || self.0.node.clone();
        if let Target::Ds { at_root } = target {
            let ds = match (&self.0.ds_root, at_root) {
                (Some(root), true) => root,
                _ => &self.0.ds_v1,
            };
            let name = ds::stream_name(ds.root, &parts.uri);
            let seen = match self.owner(&parts, name.as_ref().ok()).await {
                Ok(seen) => seen,
                Err(elsewhere) => return elsewhere,
            };
            let (method, uri, headers) = (&parts.method, &parts.uri, &parts.headers);
            return ds::serve_named(ds, name, method, uri, headers, body, seen).await;
        }
        let name = match pico::stream_name(&parts.uri) {
            Ok(name) => name,
            Err(e) => return e.into_response(),
        };
        let seen = match self.owner(&parts, Some(&name)).await {
            Ok(seen) => seen,
            Err(elsewhere) => return elsewhere,
        };
        // Boxed, as `ds::serve_named` boxes its handlers: this future stays small.
        match target {
            Target::PicoAppend => Box::pin(pico::append::append_named(
                node(),
                name,
                parts.headers,
                body,
                seen,
            ))
            .await
            .into_response(),
            Target::PicoHead => Box::pin(pico::head::head_named(&self.0.node, name))
                .await
                .into_response(),
            _ => Box::pin(pico::read::read_named(
                node(),
                name,
                &parts.uri,
                parts.headers,
            ))
            .await
            .into_response(),
        }
    }
}

/// The stream route `path` names for `method`, if [`Protocol`] serves it; `None` sends the
/// request to the router. Narrower than the router's routes (see the module docs): `/` (the
/// listing), `/v1/stream` and anything under it but a stream path, and the `__ds` control
/// namespace of each DS root are the router's.
fn target(method: &Method, path: &str, ds_at_root: bool) -> Option<Target> {
    if !matches!(*method, Method::GET | Method::HEAD | Method::POST) {
        return None;
    }
    let control = |rest: &str| rest.split('/').next() == Some(RESERVED_SEGMENT);
    if let Some(rest) = path.strip_prefix(DS_ROOT).and_then(|r| r.strip_prefix('/')) {
        return (!rest.is_empty() && !control(rest)).then_some(Target::Ds { at_root: false });
    }
    let rest = path.strip_prefix('/')?;
    if rest.is_empty() || path.starts_with(DS_ROOT) {
        return None;
    }
    if ds_at_root {
        return (!control(rest)).then_some(Target::Ds { at_root: true });
    }
    Some(match *method {
        Method::POST => Target::PicoAppend,
        Method::HEAD => Target::PicoHead,
        _ => Target::PicoRead,
    })
}

/// What axum's router does to every answer it hands out, done here for the answers that do
/// not come from it: `Content-Length` from the body's exact size when none is set (its place
/// among the headers is part of the wire form), and no body for `HEAD`. A successful `CONNECT`
/// is left alone (the router treats it apart, and only the router serves one). Idempotent:
/// sealing a router's answer again changes nothing.
pub fn seal(resp: &mut Response, method: &Method) {
    if *method == Method::CONNECT && resp.status().is_success() {
        return;
    }
    if !resp.headers().contains_key(header::CONTENT_LENGTH)
        && let Some(len) = resp.body().size_hint().exact()
    {
        // Most answers on this path have no body: their value is a constant.
        let value = match len {
            0 => HeaderValue::from_static("0"),
            n => HeaderValue::from(n),
        };
        resp.headers_mut().insert(header::CONTENT_LENGTH, value);
    }
    if *method == Method::HEAD {
        *resp.body_mut() = Body::empty();
    }
}

/// As a tower service (tests drive it with `oneshot`, as they would the router).
impl<B> tower::Service<axum::http::Request<B>> for Protocol
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let method = req.method().clone();
        let fut = Protocol::call(self, req.map(Body::new));
        Box::pin(async move {
            let mut resp = fut.await;
            seal(&mut resp, &method);
            Ok(resp)
        })
    }
}

impl std::fmt::Debug for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Protocol")
            .field("ds_at_root", &self.0.ds_root.is_some())
            .field("routing", &self.0.routing)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HttpOptions;
    use crate::cors::CorsOrigins;
    use futures::StreamExt;
    use pico_server::testing::start_test_node;

    #[test]
    fn the_match_is_never_wider_than_the_routers_routes() {
        let (get, post, head, put) = (Method::GET, Method::POST, Method::HEAD, Method::PUT);
        let pico = |m: &Method, p: &str| target(m, p, false);
        assert_eq!(pico(&post, "/a/b"), Some(Target::PicoAppend));
        assert_eq!(pico(&get, "/a?x"), Some(Target::PicoRead));
        assert_eq!(pico(&head, "/%61"), Some(Target::PicoHead));
        // Pico serves `__ds` names when DS is not at the root, as the router does.
        assert_eq!(pico(&get, "/__ds/x"), Some(Target::PicoRead));
        let ds = Some(Target::Ds { at_root: false });
        assert_eq!(pico(&post, "/v1/stream/a"), ds);
        assert_eq!(pico(&get, "/v1/stream/__dsq"), ds);
        assert_eq!(pico(&get, "/v1/stream//a"), ds);
        // The router's: other methods, the listing, the DS mount itself, its control namespace.
        for (m, p) in [
            (&put, "/a"),
            (&Method::DELETE, "/a"),
            (&Method::OPTIONS, "/a"),
            (&Method::PATCH, "/v1/stream/a"),
            (&get, "/"),
            (&get, "*"),
            (&get, "/v1/stream"),
            (&get, "/v1/stream/"),
            (&get, "/v1/streamx"),
            (&get, "/v1/stream/__ds"),
            (&get, "/v1/stream/__ds/"),
            (&post, "/v1/stream/__ds/subscriptions/x"),
        ] {
            assert_eq!(pico(m, p), None, "{m} {p}");
        }
        let root = |m: &Method, p: &str| target(m, p, true);
        assert_eq!(root(&post, "/a"), Some(Target::Ds { at_root: true }));
        assert_eq!(root(&get, "/__dsq"), Some(Target::Ds { at_root: true }));
        assert_eq!(root(&get, "/v1/stream/a"), ds);
        for p in ["/", "/__ds", "/__ds/x", "/v1/stream", "/v1/streamx"] {
            assert_eq!(root(&get, p), None, "{p}");
        }
    }

    /// Status, headers in order, body.
    type Answer = (u16, Vec<(String, String)>, Bytes);

    /// Method, URI, headers, body.
    type Case = (
        Method,
        String,
        Vec<(&'static str, &'static str)>,
        &'static str,
    );

    async fn answer<S>(svc: &S, req: Request) -> Answer
    where
        S: tower::Service<Request, Response = Response, Error = Infallible> + Clone,
    {
        let resp = svc
            .clone()
            .oneshot(req)
            .await
            .unwrap_or_else(|e| match e {});
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect();
        // Live reads stay open: their first bytes are enough.
        let body = match resp.into_body().into_data_stream().next().await {
            Some(Ok(b)) => b,
            _ => Bytes::new(),
        };
        (status, headers, body)
    }

    fn req(method: &Method, uri: &str, headers: &[(&str, &str)], body: &'static str) -> Request {
        let mut b = axum::http::Request::builder()
            .method(method)
            .uri(uri)
            .header("host", "test.local");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::from(body)).unwrap()
    }

    /// The same request answered by the hot path and by the router alone: same status, same
    /// headers in the same order, same body. Appends move the stream, so for them only the
    /// header names are compared (the offsets differ by one append).
    #[tokio::test]
    async fn the_hot_path_answers_as_the_router_does() {
        for (ds_at_root, origins) in [
            (false, CorsOrigins::None),
            (false, CorsOrigins::parse(&["http://app.example"]).unwrap()),
            (true, CorsOrigins::Any),
        ] {
            let node = start_test_node().await;
            let opts = HttpOptions {
                routing_local: false,
                ds_at_root,
                cors: origins,
            };
            let fast = crate::protocol_router(node.clone(), opts);
            let router = fast.0.router.clone();
            let (pico, ds) = if ds_at_root {
                ("/v1/stream/p", "/d")
            } else {
                ("/p", "/v1/stream/d")
            };
            let (get, post, head, put) = (Method::GET, Method::POST, Method::HEAD, Method::PUT);
            let text = [("content-type", "text/plain")];
            for (uri, hs) in [(pico, &[][..]), (ds, &text[..])] {
                let created = answer(&router, req(&put, uri, hs, "")).await;
                assert!(created.0 == 201, "{uri}: {created:?}");
            }
            let page = [("origin", "http://app.example")];
            let own = [("origin", "http://test.local")];
            let appends: Vec<Case> = vec![
                (post.clone(), pico.into(), vec![], "one"),
                (post.clone(), pico.into(), page.to_vec(), "two"),
                (post.clone(), pico.into(), own.to_vec(), "three"),
                (post.clone(), ds.into(), text.to_vec(), "x"),
                (post.clone(), ds.into(), [text[0], page[0]].to_vec(), "y"),
            ];
            for (m, uri, hs, body) in &appends {
                let a = answer(&fast, req(m, uri, hs, body)).await;
                let b = answer(&router, req(m, uri, hs, body)).await;
                let names = |a: &Answer| a.1.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
                assert_eq!((a.0, names(&a)), (b.0, names(&b)), "{m} {uri} {hs:?}");
            }
            let big = [("content-length", "999999999")];
            let etag = [("if-none-match", "*")];
            let same: Vec<Case> = vec![
                (get.clone(), pico.into(), vec![], ""),
                (get.clone(), format!("{pico}?format=raw"), page.to_vec(), ""),
                (
                    get.clone(),
                    format!("{pico}?seq=1&format=binary"),
                    vec![],
                    "",
                ),
                (
                    get.clone(),
                    format!("{pico}?seq=0&live=long-poll"),
                    vec![],
                    "",
                ),
                (get.clone(), format!("{pico}?seq=0&live=sse"), vec![], ""),
                (get.clone(), pico.into(), etag.to_vec(), ""),
                (get.clone(), format!("{pico}?format=nope"), vec![], ""),
                (get.clone(), format!("{pico}?a=1&a=2"), vec![], ""),
                (head.clone(), pico.into(), own.to_vec(), ""),
                (head.clone(), "/missing".into(), vec![], ""),
                (get.clone(), "/missing".into(), vec![], ""),
                (post.clone(), "/missing".into(), vec![], "x"),
                (post.clone(), pico.into(), vec![], ""),
                (post.clone(), pico.into(), big.to_vec(), ""),
                (post.clone(), "/a%2Fb".into(), vec![], "x"),
                // Names the handler refuses, parsed once for owner routing and the handler.
                (get.clone(), format!("{pico}/%2E%2e"), vec![], ""),
                (post.clone(), format!("{ds}%2Fz"), text.to_vec(), "x"),
                (get.clone(), format!("{ds}?offset=-1"), vec![], ""),
                (get.clone(), format!("{ds}?offset=-1"), page.to_vec(), ""),
                (get.clone(), format!("{ds}?offset=now"), vec![], ""),
                (
                    get.clone(),
                    format!("{ds}?offset=-1&live=long-poll"),
                    vec![],
                    "",
                ),
                (get.clone(), format!("{ds}?offset=-1&live=sse"), vec![], ""),
                (get.clone(), format!("{ds}?offset=junk"), vec![], ""),
                (get.clone(), format!("{ds}?offset=-1"), etag.to_vec(), ""),
                (head.clone(), ds.into(), vec![], ""),
                (head.clone(), format!("{ds}-missing"), vec![], ""),
                (post.clone(), ds.into(), vec![], "no type"),
                (post.clone(), format!("{ds}-missing"), text.to_vec(), "x"),
                (post.clone(), ds.into(), big.to_vec(), ""),
            ];
            for (m, uri, hs, body) in &same {
                let a = answer(&fast, req(m, uri, hs, body)).await;
                let b = answer(&router, req(m, uri, hs, body)).await;
                assert_eq!(a, b, "{m} {uri} {hs:?}");
            }
            assert_eq!(fast.routed(), 0, "a stream request went to the router");
        }
    }

    /// Appends, reads and HEADs on both protocols never enter the axum router; what the hot
    /// path does not serve does.
    #[tokio::test]
    async fn stream_requests_do_not_enter_the_router() {
        let node = start_test_node().await;
        let fast = crate::protocol_router(node, HttpOptions::default());
        let text = [("content-type", "text/plain")];
        let put = answer(&fast, req(&Method::PUT, "/v1/stream/s", &text, "")).await;
        assert_eq!(put.0, 201);
        assert_eq!(fast.routed(), 1);
        for (m, uri) in [
            (Method::POST, "/v1/stream/s"),
            (Method::POST, "/s"),
            (Method::GET, "/s?seq=0"),
            (Method::GET, "/v1/stream/s?offset=-1"),
            (Method::GET, "/v1/stream/s?offset=-1&live=long-poll"),
            (Method::HEAD, "/s"),
            (Method::HEAD, "/v1/stream/s"),
        ] {
            let a = answer(&fast, req(&m, uri, &text, "r")).await;
            assert!(a.0 < 300, "{m} {uri}: {a:?}");
        }
        assert_eq!(fast.routed(), 1, "an append or read entered the router");
        for (m, uri) in [(Method::OPTIONS, "/s"), (Method::GET, "/")] {
            answer(&fast, req(&m, uri, &[], "")).await;
        }
        assert_eq!(fast.routed(), 3);
    }
}
