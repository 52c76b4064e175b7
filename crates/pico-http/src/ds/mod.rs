//! The Durable Streams mount, `/v1/stream/{name}` on the protocol listener: reserved here and
//! answered with 501 until the DS facade lands (same namespace as the Pico paths).

pub mod subscriptions;

use axum::Router;
use axum::routing::any;

use crate::error::HttpError;

pub fn router() -> Router {
    Router::new()
        .route("/v1/stream", any(not_implemented))
        .route("/v1/stream/{*rest}", any(not_implemented))
}

pub fn not_implemented_error() -> HttpError {
    HttpError::not_implemented("the Durable Streams protocol is not implemented yet")
}

async fn not_implemented() -> HttpError {
    not_implemented_error()
}
