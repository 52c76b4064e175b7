//! Permissive CORS and browser-safety headers on every response (errors included), and the
//! answer to every `OPTIONS` preflight (204) before routing. Being the outermost layer, it also
//! counts each request for `/metrics` (one layer per request, not two).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use pico_protocol::headers::{ALL_DS_HEADERS, ALL_PICO_HEADERS};

use crate::telemetry::HttpMetrics;

const ALLOW_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS";
const PREFLIGHT_MAX_AGE_SECS: &str = "86400";

/// Built once: every response carries it, and building it costs several allocations and a
/// validation pass over ~600 bytes. Cloning a `HeaderValue` only bumps a reference count.
static EXPOSE_HEADERS: std::sync::LazyLock<HeaderValue> = std::sync::LazyLock::new(expose_headers);

fn expose_headers() -> HeaderValue {
    let mut list: Vec<&str> = ALL_PICO_HEADERS.to_vec();
    list.extend(ALL_DS_HEADERS);
    list.extend([
        "etag",
        "location",
        "retry-after",
        "content-type",
        "content-encoding",
        "vary",
    ]);
    HeaderValue::from_str(&list.join(", ")).unwrap_or(HeaderValue::from_static("*"))
}

fn add_common(headers: &mut HeaderMap) {
    headers.insert(
        header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_static("*"),
    );
    headers.insert(
        header::ACCESS_CONTROL_EXPOSE_HEADERS,
        EXPOSE_HEADERS.clone(),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("cross-origin"),
    );
}

/// The middleware: `axum::middleware::from_fn_with_state(metrics, cors)`; `None` counts nothing
/// (the admin listener).
pub async fn cors(
    State(metrics): State<Option<Arc<HttpMetrics>>>,
    req: Request,
    next: Next,
) -> Response {
    let flight = metrics.as_deref().map(|m| m.start(req.method()));
    let resp = answer(req, next).await;
    if let Some(f) = flight {
        f.finish(&resp);
    }
    resp
}

async fn answer(req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS {
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        add_common(h);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static(ALLOW_METHODS),
        );
        // Echo what the browser asks for: every request header is acceptable to us.
        let allow = req
            .headers()
            .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
            .cloned()
            .unwrap_or(HeaderValue::from_static("*"));
        h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, allow);
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static(PREFLIGHT_MAX_AGE_SECS),
        );
        return resp;
    }
    let mut resp = next.run(req).await;
    add_common(resp.headers_mut());
    // A 413 is answered before the body is read: close the connection, or a client that reuses
    // it races the server's close and sees a transport error on its next request.
    if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// The admin listener's layer: `nosniff` only. No CORS there: a web page open in an operator's
/// browser must not read `/metrics` or, later, call the admin API.
pub async fn nosniff(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    resp.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}
