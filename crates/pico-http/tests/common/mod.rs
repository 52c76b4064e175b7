//! Shared helpers for the Durable Streams router tests: a real node (in-memory storage, SQLite
//! metadata log) behind the protocol router, and a small request/response wrapper.

#![allow(dead_code)]

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use bytes::Bytes;
use pico_http::fast::Protocol;
use pico_http::{HttpOptions, protocol_router};
use pico_server::Node;
use pico_server::testing::start_test_node;
use tower::ServiceExt;

mod app;
pub use app::App;

pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Resp {
    pub fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    pub fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
    pub fn offset(&self) -> String {
        self.h("stream-next-offset")
            .expect("response has Stream-Next-Offset")
            .to_string()
    }
    pub fn code(&self) -> u16 {
        self.status.as_u16()
    }
}

pub async fn app() -> (Protocol, Node) {
    app_with(HttpOptions::default()).await
}

pub async fn app_with(opts: HttpOptions) -> (Protocol, Node) {
    let node = start_test_node().await;
    (protocol_router(node.clone(), opts), node)
}

pub async fn send(
    app: &impl App,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Resp {
    let mut b = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "test.local");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = app
        .clone()
        .oneshot(b.body(body.into()).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    Resp {
        status,
        headers,
        body,
    }
}

pub async fn put(
    app: &impl App,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Resp {
    send(app, Method::PUT, uri, headers, body).await
}

pub async fn post(
    app: &impl App,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Resp {
    send(app, Method::POST, uri, headers, body).await
}

pub async fn get(app: &impl App, uri: &str) -> Resp {
    send(app, Method::GET, uri, &[], Body::empty()).await
}

pub async fn get_with(app: &impl App, uri: &str, headers: &[(&str, &str)]) -> Resp {
    send(app, Method::GET, uri, headers, Body::empty()).await
}

pub async fn head(app: &impl App, uri: &str) -> Resp {
    send(app, Method::HEAD, uri, &[], Body::empty()).await
}

pub async fn delete(app: &impl App, uri: &str) -> Resp {
    send(app, Method::DELETE, uri, &[], Body::empty()).await
}

/// `(event, payload)` pairs of an SSE body (payload lines joined with `\n`).
pub fn sse_events(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut event = String::new();
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = e.to_string();
                } else if let Some(d) = line.strip_prefix("data:") {
                    // As the SSE spec: one leading space after the colon is not part of the value.
                    data.push(d.strip_prefix(' ').unwrap_or(d));
                }
            }
            (event, data.join("\n"))
        })
        .collect()
}
