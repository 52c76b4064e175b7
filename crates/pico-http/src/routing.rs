//! Ownership routing: a request for a stream open on another node is answered with a 307 to the
//! owner's advertised URL (same path and query) so the client re-sends it there. The listing
//! (`/`), preflights and the `__ds` control namespace are served wherever they land, and so are
//! creates (PUT) of names nobody owns; `--routing local` turns redirects off. A stale view costs
//! a hop, never a split stream: the owner is fenced by epochs, not by this check.
//!
//! A stream whose owner stopped heartbeating (as seen here), or that failover fenced, is
//! answered 503 with `Retry-After: 1` until failover releases it (docs/design/failover.md).
//!
//! A PUT of a stream another node owns is redirected too (PICO-SURFACE.md says PUT never is): a
//! create or fork retried with records (a body, or a fork's partial prefix record) appends them
//! when the first attempt did not finish, and appending here would open the stream here, fencing
//! the owner and dropping the appends it acknowledged but has not committed yet.
//!
//! A live transfer (docs/design/transfer.md) is invisible here but for a pause: a write for a
//! stream this node is handing off waits at the door until the handoff ends, then gets the 307
//! to the target like any request for a stream owned elsewhere. Reads are served meanwhile
//! (every record is still here).

use crate::error::HttpError;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use pico_common::StreamName;
use pico_server::node::Lookup;
use pico_server::{Node, Route};

/// The part of a request path that names a stream for owner routing (Pico path, or DS under
/// `/v1/stream/`); `None` for paths served wherever they land. Must agree with the handlers: a
/// stream they serve that this misses is never redirected.
fn named_part(path: &str, ds_at_root: bool) -> Option<&str> {
    let rest = match path.strip_prefix("/v1/stream/") {
        Some(rest) => rest,
        // `v1/stream` is a reserved name under either mount.
        None if path == "/" || path == "/v1/stream" => return None,
        None => path,
    };
    // The DS control namespace is the first segment `__ds` exactly (`__dsq` is a stream).
    // Byte scans: a char pattern's searcher costs more than these few bytes (every request).
    let control = |p: &str| {
        let b = p.as_bytes();
        let seg = &b[b.iter().position(|&c| c != b'/').unwrap_or(b.len())..];
        seg.strip_prefix(b"__ds")
            .is_some_and(|after| after.first().is_none_or(|&c| c == b'/'))
    };
    if control(rest) || (ds_at_root && control(path)) {
        return None;
    }
    Some(rest)
}

/// The stream a request path names, if any.
fn stream_of(path: &str, ds_at_root: bool) -> Option<StreamName> {
    StreamName::from_path(named_part(path, ds_at_root)?).ok()
}

/// Whether owner routing looks at `path`, for a caller that has parsed the stream name itself
/// (the hot path: the name the handler gets is the one [`owner_answer_for`] routes, as both
/// parse with [`StreamName::from_path`], which ignores the slashes around the name).
pub fn routes(path: &str, ds_at_root: bool) -> bool {
    named_part(path, ds_at_root).is_some()
}

/// The middleware (state: the node and whether DS is served at the root).
pub async fn redirect_to_owner(
    State((node, ds_at_root)): State<(Node, bool)>,
    req: Request,
    next: Next,
) -> Response {
    if req.method() == Method::OPTIONS {
        return next.run(req).await;
    }
    match owner_answer(&node, req.method(), req.uri(), ds_at_root).await {
        Some(resp) => resp,
        None => next.run(req).await,
    }
}

/// The answer for a request that this node must not serve (a 307 to the stream's owner, or a
/// 503 while nobody may serve it); `None` to serve it here. Preflights are the caller's:
/// they are served wherever they land.
pub async fn owner_answer(
    node: &Node,
    method: &Method,
    uri: &Uri,
    ds_at_root: bool,
) -> Option<Response> {
    let name = stream_of(uri.path(), ds_at_root)?;
    owner_answer_for(node, method, uri, &name).await.err()
}

/// [`owner_answer`] for a request whose stream name the caller has parsed already (and whose
/// path [`routes`]). `Ok`: serve it here, with the look at the metadata view routing made,
/// which the handler's node calls reuse ([`Lookup`]).
pub async fn owner_answer_for(
    node: &Node,
    method: &Method,
    uri: &Uri,
    name: &StreamName,
) -> Result<Lookup, Response> {
    let writes = !matches!(*method, Method::GET | Method::HEAD);
    let (route, seen) = node.route_request(name, writes).await;
    let owner = match route {
        Route::Local => return Ok(seen),
        Route::Redirect(url) => url,
        // The owner lapsed or was fenced: a redirect would point at a dead address, and serving
        // here would fence its acknowledged appends before failover recovers them.
        Route::Unavailable(why) => {
            let mut e = HttpError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", why);
            e.retry_after = Some(std::time::Duration::from_secs(1));
            return Err(e.into_response());
        }
    };
    let path_and_query = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let location = format!("{}{}", owner.trim_end_matches('/'), path_and_query);
    // An owner address that is not a valid header: serve locally rather than fail.
    let Ok(loc) = HeaderValue::from_str(&location) else {
        return Ok(seen);
    };
    Err((
        StatusCode::TEMPORARY_REDIRECT,
        [
            (header::LOCATION, loc),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_paths() {
        assert_eq!(stream_of("/a/b", false).unwrap().as_str(), "a/b");
        assert_eq!(stream_of("/v1/stream/a/b", false).unwrap().as_str(), "a/b");
        assert!(stream_of("/", false).is_none());
        assert!(stream_of("/v1/stream", false).is_none());
        assert!(stream_of("/v1/stream/__ds/jwks.json", false).is_none());
        assert!(stream_of("/__ds/jwks.json", true).is_none());
        // Streams the handlers serve: names that merely start with `__ds`.
        assert_eq!(
            stream_of("/v1/stream/__dsq", false).unwrap().as_str(),
            "__dsq"
        );
        assert_eq!(stream_of("/__dsq", true).unwrap().as_str(), "__dsq");
        // The control namespace however many slashes lead to it.
        assert!(!routes("/v1/stream//__ds", false));
        assert!(!routes("/v1/stream///__ds/x", false));
        assert!(!routes("//__ds/x", true));
        assert!(!routes("//__ds/x", false));
        assert!(routes("/v1/stream//__d", false));
        assert!(routes("/v1/stream/x/__ds", false));
        // The handlers' rule: one stream however spelled, none for a name they refuse.
        assert_eq!(stream_of("/v1/stream/%61", false).unwrap().as_str(), "a");
        assert!(stream_of("/a%2Fb", false).is_none());
    }
}
