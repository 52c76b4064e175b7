//! The admin listener: liveness and readiness probes, `/metrics` (Prometheus text), and the
//! admin API: `POST /admin/transfer` (docs/design/transfer.md) and `GET /admin/streams/{name}`
//! (where a stream lives, from the view: never opens it).

use crate::error::HttpError;
use axum::Json;
use axum::Router;
use axum::extract::Path;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header;
use axum::response::IntoResponse;
use axum::response::Response;
use axum::routing::{get, post};
use metrics_exporter_prometheus::PrometheusHandle;
use pico_common::StreamName;
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
        .route("/admin/transfer", post(transfer))
        .route("/admin/streams/{*name}", get(stream_placement))
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

/// `POST /admin/transfer {"stream": name, "toNode": id}`: 202 once the request is in the log;
/// the handoff runs on the owner and the target (poll `GET /admin/streams/{name}` for it).
async fn transfer(State(a): State<Admin>, body: axum::body::Bytes) -> Response {
    let parsed = parse_transfer(&body);
    let (name, to_node) = match parsed {
        Ok(p) => p,
        Err(m) => {
            return HttpError::bad_request(format!("bad transfer request: {m}")).into_response();
        }
    };
    match a.node.request_transfer(&name, to_node).await {
        Ok(t) => (
            StatusCode::ACCEPTED,
            Json(json!({
                "stream": name.as_str(),
                "streamId": t.stream_id,
                "fromNode": t.from_node,
                "toNode": t.to_node,
                "epoch": t.epoch,
            })),
        )
            .into_response(),
        Err(e) => HttpError::from(e).into_response(),
    }
}

/// The transfer request's body: `{"stream": name, "toNode": id}`.
fn parse_transfer(body: &[u8]) -> Result<(StreamName, u32), String> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let stream = v["stream"]
        .as_str()
        .ok_or("`stream` (a stream name) is required")?;
    let name = StreamName::from_path(stream).map_err(|e| e.to_string())?;
    let to_node = v["toNode"]
        .as_u64()
        .and_then(|n| u32::try_from(n).ok())
        .ok_or("`toNode` (a node id) is required")?;
    Ok((name, to_node))
}

/// `GET /admin/streams/{name}`: owner, epoch, committed end, and a transfer under way.
async fn stream_placement(State(a): State<Admin>, Path(name): Path<String>) -> Response {
    let name = match StreamName::from_path(&name) {
        Ok(n) => n,
        Err(e) => return HttpError::bad_request(e.to_string()).into_response(),
    };
    let Some(p) = a.node.placement(&name) else {
        return HttpError::not_found(format!("stream not found: name=`{}`", name.as_str()))
            .into_response();
    };
    let transfer = p.transfer.map(|t| {
        json!({
            "toNode": t.to_node,
            "fromNode": t.from.map(|o| o.node_id),
            "epoch": t.epoch,
            "released": t.released_ms.is_some(),
        })
    });
    Json(json!({
        "stream": name.as_str(),
        "streamId": p.stream_id,
        "epoch": p.epoch,
        "owner": p.owner.map(|o| json!({"nodeId": o.node_id, "nodeEpoch": o.node_epoch})),
        "committedEnd": p.committed_end,
        "closed": p.closed,
        "transfer": transfer,
    }))
    .into_response()
}
