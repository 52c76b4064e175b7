//! `DELETE /{name}`: 204; the name is reusable at once.

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use pico_server::Node;

use super::{no_store, stream_name};
use crate::error::HttpError;

pub async fn delete(State(node): State<Node>, uri: Uri) -> Result<Response, HttpError> {
    let name = stream_name(&uri)?;
    node.delete(&name).await?;
    let mut resp = StatusCode::NO_CONTENT.into_response();
    no_store(resp.headers_mut());
    Ok(resp)
}
