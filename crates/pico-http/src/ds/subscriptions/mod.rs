//! Durable Streams subscriptions (PROTOCOL.md §6–§7), everything under `{root}/__ds`:
//!
//! - `PUT|GET|DELETE /subscriptions/{id}`: create (201) or re-confirm (200, same config hash;
//!   409 otherwise), read, tombstone.
//! - `POST /subscriptions/{id}/streams`, `DELETE /subscriptions/{id}/streams/{path}`: explicit
//!   stream membership.
//! - `POST /subscriptions/{id}/callback`: webhook acks (bearer callback token, fenced).
//! - `POST /subscriptions/{id}/claim|ack|release`: pull-wake leases (fenced).
//! - `GET /jwks.json`: the Ed25519 webhook signing key.
//!
//! Modules: [`manager`] (state machine, persistence, delivery), [`model`] (records, config
//! parsing and hash), [`routes`] (handlers), [`signing`] (Ed25519, JWKS, tokens), [`glob`]
//! (`*`/`**` patterns), [`webhook_url`] (SSRF guard), [`error`] (wire errors).

pub mod error;
pub mod glob;
pub mod manager;
pub mod model;
pub mod routes;
pub mod signing;
pub mod webhook_url;

use std::sync::{Arc, LazyLock, Mutex, Weak};

use axum::Router;
use axum::routing::{delete, get, post, put};
use pico_server::Node;

pub use error::SubError;
pub use manager::Manager;

/// Managers by node (the address of the node's metadata log, stable while the node lives), so
/// that a router built twice for one node (e.g. mounted at two roots) shares one state machine
/// and never delivers a wake twice.
static MANAGERS: LazyLock<Mutex<Vec<Registered>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// A node key and its manager.
type Registered = (usize, Weak<Manager>);

fn manager_for(node: Node) -> Arc<Manager> {
    let key = node.meta() as *const _ as usize;
    let mut all = MANAGERS.lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|(_, w)| w.strong_count() > 0);
    if let Some(m) = all
        .iter()
        .find(|(k, _)| *k == key)
        .and_then(|(_, w)| w.upgrade())
    {
        return m;
    }
    let m = Arc::new(Manager::new(node));
    all.push((key, Arc::downgrade(&m)));
    m
}

/// Routes for everything under the `__ds` control namespace, mounted by `ds::router` at
/// `{root}/__ds` where root is `/v1/stream` (and `/` with `--protocol ds`). Starts the
/// background delivery tasks when called inside a Tokio runtime (else on the first request).
pub fn router(node: Node) -> Router {
    let mgr = manager_for(node);
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
        .fallback(routes::route_not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .with_state(mgr)
}
