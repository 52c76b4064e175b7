//! `HEAD /{name}`: stream metadata in headers, without sliding the TTL.

use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use pico_common::StreamName;
use pico_server::Node;

use super::{info_headers, no_store, stream_name, text_value};
use crate::error::HttpError;

pub async fn head(State(node): State<Node>, uri: Uri) -> Result<Response, HttpError> {
    head_named(&node, stream_name(&uri)?).await
}

/// [`head`] of a stream whose name the caller has parsed.
pub async fn head_named(node: &Node, name: StreamName) -> Result<Response, HttpError> {
    let info = node.head(&name).await?;
    let mut resp = StatusCode::OK.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, text_value(&info.content_type));
    info_headers(h, &info);
    no_store(h);
    Ok(resp)
}
