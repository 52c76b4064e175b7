//! `GET /?prefix=&start_after=&limit=`: list streams.

use axum::Json;
use axum::extract::State;
use axum::http::Uri;
use axum::response::{IntoResponse, Response};
use pico_server::{ListRequest, Node, StreamInfo};
use serde_json::{Value, json};

use super::{Params, no_store};
use crate::error::HttpError;
use crate::headers::format_rfc3339_ms;

pub const DEFAULT_LIMIT: usize = 100;
/// Larger limits are clamped: one listing must stay a bounded response.
pub const MAX_LIMIT: usize = 1000;

pub async fn list(State(node): State<Node>, uri: Uri) -> Result<Response, HttpError> {
    let p = Params::parse(&uri)?;
    // Names are canonical without a leading slash; accept the path spelling too.
    let strip = |s: &str| s.trim_start_matches('/').to_string();
    let req = ListRequest {
        prefix: p.get("prefix").map(strip).filter(|s| !s.is_empty()),
        start_after: p.get("start_after").map(strip).filter(|s| !s.is_empty()),
        limit: p.positive("limit")?.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT),
    };
    let out = node.list(req);
    let streams: Vec<Value> = out.streams.iter().map(stream_json).collect();
    let mut resp = Json(json!({ "streams": streams, "has_more": out.has_more })).into_response();
    no_store(resp.headers_mut());
    Ok(resp)
}

pub fn stream_json(info: &StreamInfo) -> Value {
    let mut v = json!({
        "name": info.name.as_str(),
        "content_type": info.content_type,
        "start_seq": info.start_seq,
        "next_seq": info.next_seq,
        "closed": info.closed,
        "created_at": format_rfc3339_ms(info.created_at_ms),
    });
    if let Some(ttl) = info.ttl_secs {
        v["ttl"] = json!(ttl);
    }
    if let Some(at) = info.expires_at_ms {
        v["expires_at"] = json!(format_rfc3339_ms(at));
    }
    v
}
