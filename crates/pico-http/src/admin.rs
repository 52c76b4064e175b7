//! The admin listener: liveness and readiness probes, and `/metrics` (Prometheus text).

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use pico_server::Node;
use serde_json::json;

#[derive(Clone)]
struct Admin {
    node: Node,
    metrics: Option<PrometheusHandle>,
}

/// `metrics`: the process's installed recorder; without one `/metrics` answers 503.
pub fn router(node: Node, metrics: Option<PrometheusHandle>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(prometheus))
        .with_state(Admin { node, metrics })
}

/// The node's counters are read here, at scrape time, from the totals the engine and the
/// metadata view already keep; only the engine's latency distributions are recorded as they
/// happen (`s3stream::telemetry`).
async fn prometheus(State(a): State<Admin>) -> axum::response::Response {
    let Some(handle) = a.metrics else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "no metrics recorder installed in this process\n",
        )
            .into_response();
    };
    let stats = a.node.stats();
    let e = &stats.engine;
    let gauges: [(&'static str, f64); 7] = [
        ("pico_streams", stats.streams as f64),
        ("pico_streams_open", stats.open_streams as f64),
        ("pico_log_cache_bytes", e.log_cache_bytes as f64),
        (
            "pico_log_cache_uploaded_bytes",
            e.log_cache_uploaded_bytes as f64,
        ),
        ("pico_unuploaded_bytes", e.unuploaded_bytes as f64),
        ("pico_block_cache_bytes", e.block_cache_bytes as f64),
        ("pico_meta_applied_index", stats.applied_index as f64),
    ];
    for (name, v) in gauges {
        metrics::gauge!(name).set(v);
    }
    let counters: [(&'static str, u64); 8] = [
        ("pico_wal_commits_total", e.wal_writes),
        ("pico_wal_commit_failures_total", e.wal_write_failures),
        ("pico_appends_total", e.appends),
        ("pico_object_uploads_total", e.uploads),
        ("pico_object_upload_failures_total", e.upload_failures),
        ("pico_rejected_ranges_total", e.rejected_ranges),
        ("pico_block_cache_hits_total", e.block_cache_hits),
        ("pico_block_cache_misses_total", e.block_cache_misses),
    ];
    for (name, v) in counters {
        metrics::counter!(name).absolute(v);
    }
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response()
}

async fn health() -> &'static str {
    "ok"
}

async fn ready(State(a): State<Admin>) -> impl IntoResponse {
    let r = a.node.ready();
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
            "live": r.live,
            "appliedIndex": r.applied_index,
            "nodeId": r.node_id,
            "nodeEpoch": r.node_epoch,
            "maintenanceLease": r.maintenance_lease,
            "metadataStopped": r.metadata_stopped,
            "metadataUnreachable": r.metadata_unreachable,
        })),
    )
}
