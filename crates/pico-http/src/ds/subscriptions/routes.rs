//! HTTP handlers for the `__ds` control namespace. They parse and answer; the state machine is
//! `pico_server::subscriptions::Manager`.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{OriginalUri, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use pico_server::subscriptions::model::{Config, check_id, normalize_path, parse_stream_list};
use pico_server::subscriptions::{Manager, SubError, WakeRequest};

use super::error::ApiError;

pub type Shared = Arc<Manager>;

/// The URL of the `__ds` root this request came through (`http://host/v1/stream/__ds`): the
/// original path minus the part this nested router saw. Honors `X-Forwarded-Proto`/`-Host` from
/// a fronting proxy; falls back to the node's advertised URL without a Host.
pub fn ds_root(mgr: &Manager, headers: &HeaderMap, original: &Uri, nested: &Uri) -> String {
    let orig = original.path();
    let prefix = orig
        .strip_suffix(nested.path())
        .unwrap_or(orig)
        .trim_end_matches('/');
    let header_str = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(',').next())
            .map(str::trim)
            .filter(|v| !v.is_empty())
    };
    let host = header_str("x-forwarded-host")
        .or_else(|| header_str(header::HOST.as_str()))
        .map(str::to_string)
        .or_else(|| original.authority().map(|a| a.to_string()));
    match host {
        Some(host) => {
            let scheme = header_str("x-forwarded-proto")
                .filter(|p| *p == "https" || *p == "http")
                .or(original.scheme_str())
                .unwrap_or("http");
            format!("{scheme}://{host}{prefix}")
        }
        None => format!("{}{prefix}", mgr.advertised_url().trim_end_matches('/')),
    }
}

fn json_body(body: &Bytes) -> Result<Value, SubError> {
    if body.is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_slice(body).map_err(|e| SubError::invalid(format!("invalid JSON body: {e}")))
}

fn wake_request(body: &Bytes) -> Result<WakeRequest, SubError> {
    if body.is_empty() {
        return Ok(WakeRequest::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| SubError::invalid(format!("invalid request body: {e}")))
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

fn found(id: &str) -> Result<(), SubError> {
    // A malformed id can name no subscription.
    check_id(id).map_err(|_| SubError::NotFound)
}

pub async fn jwks(State(mgr): State<Shared>) -> Result<Response, ApiError> {
    mgr.ensure_background();
    let keys = mgr.keys().await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/jwk-set+json"),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        keys.jwks().to_string(),
    )
        .into_response())
}

pub async fn put_sub(
    State(mgr): State<Shared>,
    Path(id): Path<String>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    mgr.ensure_background();
    check_id(&id)?;
    let config = Config::parse(&json_body(&body)?, mgr.allow_local_webhooks())?;
    let root = ds_root(&mgr, &headers, &original, &uri);
    let out = mgr.upsert(&id, config, &root).await?;
    let status = if out.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(out.body)).into_response())
}

pub async fn get_sub(
    State(mgr): State<Shared>,
    Path(id): Path<String>,
    OriginalUri(original): OriginalUri,
    uri: Uri,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    mgr.ensure_background();
    found(&id)?;
    let root = ds_root(&mgr, &headers, &original, &uri);
    Ok(Json(mgr.get(&id, &root).await?).into_response())
}

pub async fn delete_sub(
    State(mgr): State<Shared>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    mgr.ensure_background();
    if check_id(&id).is_ok() {
        mgr.delete(&id).await?;
    }
    Ok(StatusCode::NO_CONTENT)
}

pub async fn add_streams(
    State(mgr): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    mgr.ensure_background();
    found(&id)?;
    let v = json_body(&body)?;
    let streams = v
        .get("streams")
        .ok_or_else(|| SubError::invalid("streams must be a non-empty array"))
        .and_then(parse_stream_list)?;
    if streams.is_empty() {
        return Err(SubError::invalid("streams must be a non-empty array").into());
    }
    mgr.add_streams(&id, streams).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn remove_stream(
    State(mgr): State<Shared>,
    Path((id, path)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    mgr.ensure_background();
    found(&id)?;
    mgr.remove_stream(&id, &normalize_path(&path)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The common part of callback, ack and release: a known subscription, the bearer token
/// and the wake request body.
fn wake_call<'h>(
    mgr: &Shared,
    id: &str,
    headers: &'h HeaderMap,
    body: &Bytes,
) -> Result<(&'h str, WakeRequest), SubError> {
    mgr.ensure_background();
    found(id)?;
    let token = bearer(headers).ok_or(SubError::TokenInvalid)?;
    Ok((token, wake_request(body)?))
}

pub async fn callback(
    State(mgr): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (token, req) = wake_call(&mgr, &id, &headers, &body)?;
    Ok(Json(mgr.callback(&id, Some(token), req).await?).into_response())
}

pub async fn claim(
    State(mgr): State<Shared>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    mgr.ensure_background();
    found(&id)?;
    let v = json_body(&body)?;
    let worker = v
        .get("worker")
        .and_then(Value::as_str)
        .filter(|w| !w.is_empty() && w.len() <= 256)
        .ok_or_else(|| SubError::invalid("worker must be a non-empty string"))?;
    Ok(Json(mgr.claim(&id, worker).await?).into_response())
}

pub async fn ack(
    State(mgr): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let (token, req) = wake_call(&mgr, &id, &headers, &body)?;
    Ok(Json(mgr.ack(&id, Some(token), req).await?).into_response())
}

pub async fn release(
    State(mgr): State<Shared>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<StatusCode, ApiError> {
    let (token, req) = wake_call(&mgr, &id, &headers, &body)?;
    mgr.release(&id, Some(token), req).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sends a request that changes a subscription (anything but `GET`/`HEAD`/`OPTIONS`) to the
/// node that delivers subscriptions: `307` to its advertised URL with the path and query kept,
/// `503 Retry-After: 1` while the lease moves. Reads and the JWKS are answered on any node.
pub async fn to_the_holder(State(mgr): State<Shared>, req: Request, next: Next) -> Response {
    if matches!(
        req.method(),
        &Method::GET | &Method::HEAD | &Method::OPTIONS
    ) {
        return next.run(req).await;
    }
    match mgr.home().await {
        Ok(()) => next.run(req).await,
        Err(Some(holder)) => {
            let uri = req
                .extensions()
                .get::<OriginalUri>()
                .map_or(req.uri(), |o| &o.0);
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            let location = format!("{}{path}", holder.trim_end_matches('/'));
            match HeaderValue::from_str(&location) {
                Ok(v) => (
                    StatusCode::TEMPORARY_REDIRECT,
                    [
                        (header::LOCATION, v),
                        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
                    ],
                )
                    .into_response(),
                Err(_) => ApiError(SubError::NotHere { holder: None }).into_response(),
            }
        }
        Err(None) => ApiError(SubError::NotHere { holder: None }).into_response(),
    }
}

pub async fn route_not_found() -> ApiError {
    ApiError(SubError::RouteNotFound)
}

pub async fn method_not_allowed() -> ApiError {
    ApiError(SubError::MethodNotAllowed)
}
