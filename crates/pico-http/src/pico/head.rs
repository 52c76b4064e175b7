//! `HEAD /{name}`: stream metadata in headers, without sliding the TTL.

use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use pico_server::Node;

use super::{info_headers, no_store, stream_name, text_value};
use crate::error::HttpError;

pub async fn head(State(node): State<Node>, uri: Uri) -> Result<Response, HttpError> {
    let name = stream_name(&uri)?;
    let info = node.head(&name).await?;
    let mut resp = StatusCode::OK.into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, text_value(&info.content_type));
    info_headers(h, &info);
    no_store(h);
    Ok(resp)
}
