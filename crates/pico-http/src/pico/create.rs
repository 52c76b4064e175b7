//! `PUT /{name}`: idempotent create. 201 + Location when new, 200 when the same config exists,
//! 409 when it differs. A non-empty body becomes the stream's first record.

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use pico_protocol::Record;
use pico_server::{CreateConfig, CreateRequest, Node};

use super::{info_headers, new_stream_name, no_store, read_body, text_value};
use crate::error::HttpError;
use crate::headers::parse_create;

pub async fn create(
    State(node): State<Node>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, HttpError> {
    let name = new_stream_name(&uri)?;
    let ch = parse_create(&headers)?;
    let body = read_body(&headers, body, node.config().max_request_size).await?;
    let initial = if body.is_empty() {
        Vec::new()
    } else {
        vec![Record::from_value(body)]
    };
    let out = node
        .create(CreateRequest {
            name: name.clone(),
            config: CreateConfig {
                content_type: ch.content_type,
                ttl_secs: ch.ttl_secs,
                expires_at_ms: ch.expires_at_ms,
                closed: ch.closed,
            },
            initial,
        })
        .await?;
    let mut resp = if out.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
    .into_response();
    let h = resp.headers_mut();
    if out.created {
        h.insert(header::LOCATION, text_value(&name.to_path()));
    }
    info_headers(h, &out.info);
    no_store(h);
    Ok(resp)
}
