//! The admin listener: liveness and readiness probes.

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use pico_server::Node;
use serde_json::json;

pub fn router(node: Node) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .with_state(node)
}

async fn health() -> &'static str {
    "ok"
}

async fn ready(State(node): State<Node>) -> impl IntoResponse {
    let r = node.ready();
    let status = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        status,
        Json(json!({
            "ready": r.ready,
            "serving": r.serving,
            "registered": r.registered,
            "appliedIndex": r.applied_index,
            "nodeId": r.node_id,
        })),
    )
}
