//! Durable Streams subscriptions (PROTOCOL.md §6–§7) on the wire, everything under `{root}/__ds`:
//!
//! - `PUT|GET|DELETE /subscriptions/{id}`: create (201) or re-confirm (200, same config hash;
//!   409 otherwise), read, tombstone.
//! - `POST /subscriptions/{id}/streams`, `DELETE /subscriptions/{id}/streams/{path}`: explicit
//!   stream membership.
//! - `POST /subscriptions/{id}/callback`: webhook acks (bearer callback token, fenced).
//! - `POST /subscriptions/{id}/claim|ack|release`: pull-wake leases (fenced).
//! - `GET /jwks.json`: the Ed25519 webhook signing key.
//!
//! In a cluster only the maintenance-lease holder changes and delivers subscriptions: a request
//! changing one on another node gets `307` to the holder's advertised URL (path and query
//! kept), or `503` with `Retry-After: 1` while the lease moves; reads are served anywhere.
//!
//! Only the translation lives here: [`routes`] (handlers) and [`error`] (the wire form of
//! errors). The behaviour is `pico_server::subscriptions`.

pub mod error;
pub mod routes;

use std::sync::Arc;

use axum::Router;
use axum::routing::{delete, get, post, put};
pub use pico_server::subscriptions::Manager;

pub use error::ApiError;

/// Routes for everything under the `__ds` control namespace, mounted by `ds::router` at
/// `{root}/__ds` where root is `/v1/stream` (and `/` with `--protocol ds`). Every root of one
/// node must share one manager, or a wake would be delivered once per root. Starts the
/// background delivery tasks when called inside a Tokio runtime (else on the first request).
pub fn router(mgr: Arc<Manager>) -> Router {
    mgr.ensure_background();
    Router::new()
        .route("/jwks.json", get(routes::jwks))
        .route(
            "/subscriptions/{id}",
            put(routes::put_sub)
                .get(routes::get_sub)
                .delete(routes::delete_sub),
        )
        .route("/subscriptions/{id}/streams", post(routes::add_streams))
        .route(
            "/subscriptions/{id}/streams/{*path}",
            delete(routes::remove_stream),
        )
        .route("/subscriptions/{id}/callback", post(routes::callback))
        .route("/subscriptions/{id}/claim", post(routes::claim))
        .route("/subscriptions/{id}/ack", post(routes::ack))
        .route("/subscriptions/{id}/release", post(routes::release))
        .route_layer(axum::middleware::from_fn_with_state(
            mgr.clone(),
            routes::to_the_holder,
        ))
        .fallback(routes::route_not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .with_state(mgr)
}
