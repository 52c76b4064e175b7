//! Durable Streams subscriptions (`/v1/stream/__ds/...`): reserved, answered with 501 until the
//! subscriptions facade lands.

use crate::error::HttpError;
use axum::Router;
use axum::routing::any;
use pico_server::Node;

/// Routes for everything under the `__ds` control namespace, mounted by `ds::router` at
/// `{root}/__ds` where root is `/v1/stream` (and `/` with `--protocol ds`).
pub fn router(node: Node) -> Router {
    let _ = node;
    Router::new().route("/{*rest}", any(not_implemented))
}

async fn not_implemented() -> HttpError {
    HttpError::not_implemented("durable streams subscriptions are not implemented yet")
}
