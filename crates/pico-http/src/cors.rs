//! Who may call a listener from a web page, and the browser-safety headers on every response
//! (errors included). Being the protocol listener's outermost layer, [`cors`] also counts each
//! request for `/metrics` (one layer per request, not two).
//!
//! CORS is an explicit choice (`--cors-origins`, [`CorsOrigins`]): by default no origin is
//! granted, so a page open in the user's browser cannot read a local node's answers. Reading is
//! not the only harm: a "simple" cross-origin request (a form POST, a `text/plain` fetch) is sent
//! without a preflight and would append all the same, so a request whose `Origin` is neither
//! granted nor the node's own is refused (403) before any handler runs. Clients that are not
//! browsers send no `Origin` and are not affected.

use std::sync::{Arc, LazyLock};

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use pico_protocol::headers::{ALL_DS_HEADERS, ALL_PICO_HEADERS, LAST_EVENT_ID};

use crate::HttpError;
use crate::telemetry::HttpMetrics;

const ALLOW_METHODS: &str = "GET, HEAD, POST, PUT, DELETE, OPTIONS";
const PREFLIGHT_MAX_AGE_SECS: &str = "86400";

/// The web origins granted CORS on the protocol listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CorsOrigins {
    /// None (the default): no `Access-Control-Allow-Origin`, and foreign origins refused.
    #[default]
    None,
    /// `*`: every origin, and never with credentials (no `Access-Control-Allow-Credentials`).
    Any,
    /// Exactly these origins (`scheme://host[:port]`, lowercase), each answered with itself.
    List(Arc<[String]>),
}

impl CorsOrigins {
    /// Parses `--cors-origins`: `*` alone, or exact origins (`https://app.example.com`,
    /// `http://localhost:5173`). Empty items are skipped, so an empty list is [`CorsOrigins::None`].
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<CorsOrigins, String> {
        let items: Vec<&str> = items
            .iter()
            .map(|s| s.as_ref().trim())
            .filter(|s| !s.is_empty())
            .collect();
        if items.contains(&"*") {
            if items.len() > 1 {
                return Err("--cors-origins: `*` allows every origin and must stand alone".into());
            }
            return Ok(CorsOrigins::Any);
        }
        let mut list = Vec::with_capacity(items.len());
        for item in items {
            list.push(parse_origin(item)?);
        }
        Ok(if list.is_empty() {
            CorsOrigins::None
        } else {
            CorsOrigins::List(list.into())
        })
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`, if granted.
    fn grant(&self, origin: &HeaderValue) -> Option<HeaderValue> {
        match self {
            CorsOrigins::None => None,
            CorsOrigins::Any => Some(HeaderValue::from_static("*")),
            CorsOrigins::List(list) => {
                let o = origin.as_bytes();
                list.iter()
                    .any(|a| a.as_bytes().eq_ignore_ascii_case(o))
                    .then(|| origin.clone())
            }
        }
    }
}

/// One configured origin, lowercased: a scheme, `://`, a host and an optional port, nothing
/// else (browsers send exactly that in `Origin`, so anything more could never match).
fn parse_origin(item: &str) -> Result<String, String> {
    let bad = |why: &str| {
        Err(format!(
            "--cors-origins: `{item}` {why}: give exact origins like https://app.example.com or \
             http://localhost:5173, or `*`"
        ))
    };
    let trimmed = item.strip_suffix('/').unwrap_or(item);
    let Some((scheme, authority)) = trimmed.split_once("://") else {
        return bad("has no scheme");
    };
    if scheme.is_empty()
        || !scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
    {
        return bad("has no valid scheme");
    }
    if authority.is_empty() || authority.contains(['/', '?', '#', '@', ' ']) {
        return bad("is not scheme://host[:port]");
    }
    let port = match authority.rfind(']') {
        Some(i) => authority[i + 1..].strip_prefix(':'),
        None => authority.rsplit_once(':').map(|(_, p)| p),
    };
    if authority.parse::<axum::http::uri::Authority>().is_err()
        || port.is_some_and(|p| p.parse::<u16>().is_err())
    {
        return bad("has no valid host and port");
    }
    // Browsers leave a scheme's default port out of `Origin`.
    let origin = trimmed.to_ascii_lowercase();
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => ":80",
        "https" => ":443",
        _ => "",
    };
    Ok(match origin.strip_suffix(default_port) {
        Some(bare) if !default_port.is_empty() => bare.to_string(),
        _ => origin,
    })
}

/// The host (and port) a request is for: the URI's authority (HTTP/2's `:authority`, or an
/// absolute-form HTTP/1.1 target), else the `Host` header.
pub fn request_authority<B>(req: &axum::http::Request<B>) -> Option<&str> {
    authority_of(req.uri(), || req.headers().get(header::HOST))
}

/// [`request_authority`] for a caller that may have the `Host` header at hand already: `host`
/// is asked only when the URI has no authority.
pub fn authority_of<'a>(
    uri: &'a axum::http::Uri,
    host: impl FnOnce() -> Option<&'a HeaderValue>,
) -> Option<&'a str> {
    match uri.authority() {
        Some(a) => Some(a.as_str()),
        None => host().and_then(|h| h.to_str().ok()),
    }
}

/// The page making the request is served by this very host and port (the admin dashboard):
/// `Origin` without its scheme is the request's authority.
fn same_origin<B>(origin: &HeaderValue, req: &axum::http::Request<B>) -> bool {
    let Some(authority) = request_authority(req) else {
        return false;
    };
    origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .is_some_and(|(_, host)| host.eq_ignore_ascii_case(authority))
}

fn list_header(names: &[&str]) -> HeaderValue {
    HeaderValue::from_str(&names.join(", ")).unwrap_or(HeaderValue::from_static("*"))
}

/// Built once: granted responses carry it, and building it costs several allocations and a
/// validation pass over ~600 bytes. Cloning a `HeaderValue` only bumps a reference count.
static EXPOSE_HEADERS: LazyLock<HeaderValue> = LazyLock::new(|| {
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
    list_header(&list)
});

/// The request headers the Pico and DS protocols define, plus the standard ones their clients
/// send. A fixed list rather than an echo of what the preflight asks for.
static ALLOW_HEADERS: LazyLock<HeaderValue> = LazyLock::new(|| {
    let mut list: Vec<&str> = ALL_PICO_HEADERS.to_vec();
    list.extend(ALL_DS_HEADERS);
    list.extend([
        "content-type",
        LAST_EVENT_ID,
        "if-none-match",
        "authorization",
    ]);
    list_header(&list)
});

fn add_common(headers: &mut HeaderMap) {
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // A constant: `from_static` at run time checks the name on every call.
    const CORP: HeaderName = HeaderName::from_static("cross-origin-resource-policy");
    headers.insert(CORP, HeaderValue::from_static("cross-origin"));
}

/// The protocol listener's layer state: its request counters (`None` counts nothing) and the
/// origins it grants.
#[derive(Debug, Default)]
pub struct Cors {
    pub metrics: Option<HttpMetrics>,
    pub origins: CorsOrigins,
}

/// The middleware: `axum::middleware::from_fn_with_state(Arc<Cors>, cors)`. The hot path
/// ([`crate::fast`]) makes the same calls without it.
pub async fn cors(State(state): State<Arc<Cors>>, req: Request, next: Next) -> Response {
    let flight = state.metrics.as_ref().map(|m| m.start(req.method()));
    let resp = answer(&state.origins, req, next).await;
    if let Some(f) = flight {
        f.finish(&resp);
    }
    resp
}

async fn answer(origins: &CorsOrigins, req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS {
        return preflight(origins, &req);
    }
    match admit(origins, &req) {
        Ok(admitted) => {
            let mut resp = next.run(req).await;
            admitted.finish(&mut resp);
            resp
        }
        Err(refused) => refused.into_response(),
    }
}

/// The answer to a preflight (`OPTIONS`). Methods and headers alone grant nothing: without
/// `Access-Control-Allow-Origin` the browser fails the preflight.
pub fn preflight<B>(origins: &CorsOrigins, req: &axum::http::Request<B>) -> Response {
    let grant = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|o| origins.grant(o));
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    add_common(h);
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static(ALLOW_METHODS),
    );
    h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, ALLOW_HEADERS.clone());
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static(PREFLIGHT_MAX_AGE_SECS),
    );
    finish(h, grant, vary(origins));
    resp
}

/// With a list the answer depends on `Origin`: caches must keep one per origin.
fn vary(origins: &CorsOrigins) -> bool {
    matches!(origins, CorsOrigins::List(_))
}

/// A request (not a preflight) let through: what its response must carry.
#[derive(Debug)]
pub struct Admitted {
    grant: Option<HeaderValue>,
    vary: bool,
}

/// A request refused for its `Origin`: answered 403 ([`Refused::into_response`]).
#[derive(Debug)]
pub struct Refused {
    origin: HeaderValue,
    vary: bool,
}

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        let mut resp = refuse_origin(&self.origin, "--cors-origins does not list it");
        finish(resp.headers_mut(), None, self.vary);
        resp
    }
}

/// Lets a request (not a preflight) through, or refuses it: an `Origin` that is neither
/// granted nor the node's own.
pub fn admit<B>(origins: &CorsOrigins, req: &axum::http::Request<B>) -> Result<Admitted, Refused> {
    let vary = vary(origins);
    let Some(origin) = req.headers().get(header::ORIGIN) else {
        return Ok(Admitted { grant: None, vary });
    };
    let grant = origins.grant(origin);
    if grant.is_none() && !same_origin(origin, req) {
        return Err(Refused {
            origin: origin.clone(),
            vary,
        });
    }
    Ok(Admitted { grant, vary })
}

impl Admitted {
    /// Adds the browser-safety headers and the grant to the response.
    pub fn finish(self, resp: &mut Response) {
        let h = resp.headers_mut();
        add_common(h);
        finish(h, self.grant, self.vary);
        // A 413 is answered before the body is read: close the connection, or a client that
        // reuses it races the server's close and sees a transport error on its next request.
        if resp.status() == StatusCode::PAYLOAD_TOO_LARGE {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
    }
}

/// The grant (and what a granted page may read), and `Vary: Origin` when the answer depends
/// on it.
fn finish(h: &mut HeaderMap, grant: Option<HeaderValue>, vary: bool) {
    if let Some(g) = grant {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, g);
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            EXPOSE_HEADERS.clone(),
        );
    }
    if vary {
        h.append(header::VARY, HeaderValue::from_static("origin"));
    }
}

/// 403 for a cross-origin request nobody allowed.
fn refuse_origin(origin: &HeaderValue, why: &str) -> Response {
    let origin = String::from_utf8_lossy(origin.as_bytes());
    tracing::debug!(%origin, "cross-origin request refused");
    let mut resp = HttpError::new(
        StatusCode::FORBIDDEN,
        "forbidden_origin",
        format!("cross-origin request from `{origin}` refused: {why} (see docs/browsers.md)"),
    )
    .into_response();
    add_common(resp.headers_mut());
    resp
}

/// The admin listener's layer: `nosniff`, and no CORS at all: only the node's own pages (the
/// dashboard, same origin) may call it from a browser, so a web page in an operator's browser
/// can neither read `/metrics` nor, later, call the admin API.
pub async fn same_origin_only(req: Request, next: Next) -> Response {
    if let Some(o) = req.headers().get(header::ORIGIN)
        && !same_origin(o, &req)
    {
        return refuse_origin(o, "the admin listener serves its own pages only");
    }
    let mut resp = next.run(req).await;
    resp.headers_mut().insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_parse() {
        assert_eq!(CorsOrigins::parse::<&str>(&[]), Ok(CorsOrigins::None));
        assert_eq!(CorsOrigins::parse(&["", " "]), Ok(CorsOrigins::None));
        assert_eq!(CorsOrigins::parse(&["*"]), Ok(CorsOrigins::Any));
        assert!(CorsOrigins::parse(&["*", "https://a.example"]).is_err());
        let CorsOrigins::List(l) =
            CorsOrigins::parse(&["HTTPS://App.Example.com/", "http://localhost:5173"]).unwrap()
        else {
            panic!("not a list");
        };
        assert_eq!(&l[..], ["https://app.example.com", "http://localhost:5173"]);
        let CorsOrigins::List(l) = CorsOrigins::parse(&[
            "https://a.example:443",
            "http://b.example:80",
            "http://c:443",
        ])
        .unwrap() else {
            panic!("not a list");
        };
        assert_eq!(
            &l[..],
            ["https://a.example", "http://b.example", "http://c:443"]
        );
        for bad in [
            "app.example.com",
            "https://",
            "https://a.example/path",
            "https://user@a.example",
            "://a.example",
            "https://a.example:port",
        ] {
            assert!(CorsOrigins::parse(&[bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn grants() {
        let o = HeaderValue::from_static("https://app.example.com");
        assert_eq!(CorsOrigins::None.grant(&o), None);
        assert_eq!(CorsOrigins::Any.grant(&o).unwrap(), "*");
        let list = CorsOrigins::parse(&["https://APP.example.com"]).unwrap();
        assert_eq!(list.grant(&o).unwrap(), "https://app.example.com");
        let other = HeaderValue::from_static("https://app.example.com.evil.test");
        assert_eq!(list.grant(&other), None);
        let http = HeaderValue::from_static("http://app.example.com");
        assert_eq!(list.grant(&http), None);
    }
}
