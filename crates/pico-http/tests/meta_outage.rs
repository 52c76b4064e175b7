//! A node whose Postgres metadata store goes away (a TCP proxy in front of the real server is
//! cut, then resumed): `/ready` answers 503 naming why, metadata writes answer 503 with
//! `Retry-After`, and both recover by themselves when Postgres is back: no restart.

#[path = "../../pico-sql/tests/common/mod.rs"]
mod common;
#[path = "../../pico-sql/tests/common/proxy.rs"]
mod proxy;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request};
use pico_http::{HttpOptions, admin_router, protocol_router};
use pico_server::{Node, NodeConfig};
use pico_sql::{MetaLog, MetaLogOptions};
use s3stream::{EngineConfig, MemoryStorage, ObjectWal};
use serde_json::Value;
use tower::ServiceExt;

#[path = "common/app.rs"]
mod app;
use app::App;

async fn send(app: &impl App, method: Method, uri: &str) -> (u16, Option<String>, Value) {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "text/plain")
        .body(Body::empty())
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), app.clone().oneshot(req))
        .await
        .expect("answered within 30 s")
        .unwrap();
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    (
        status,
        retry,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// Polls (bounded) until `uri` answers `status`; returns the last body.
async fn wait_status(app: &impl App, method: Method, uri: &str, status: u16) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (s, _, body) = send(app, method.clone(), uri).await;
        if s == status {
            return body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{method} {uri} never answered {status}: last {s} {body}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_turns_503_while_postgres_is_away_and_200_when_it_is_back() {
    let Some(db) = common::Db::postgres().await else {
        return;
    };
    let proxy = proxy::PgProxy::start(&db.url).await;
    let opts = MetaLogOptions {
        poll_interval: Duration::from_millis(50),
        retry_min: Duration::from_millis(10),
        retry_max: Duration::from_millis(100),
        probe_timeout: Duration::from_millis(300),
        ..MetaLogOptions::default()
    };
    let meta = MetaLog::open(&proxy.url(&db.url), opts).await.unwrap();
    let wal_store = Arc::new(MemoryStorage::new());
    let node = Node::start(
        NodeConfig {
            node_epoch: 1,
            ..NodeConfig::default()
        },
        meta,
        Arc::new(MemoryStorage::new()),
        Arc::new(ObjectWal::new(wal_store, "wal".into())),
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let admin = admin_router(node.clone(), None);
    let app = protocol_router(node.clone(), HttpOptions::default());
    wait_status(&admin, Method::GET, "/ready", 200).await;
    assert_eq!(send(&app, Method::PUT, "/before").await.0, 201);

    proxy.cut();
    let body = wait_status(&admin, Method::GET, "/ready", 503).await;
    assert_eq!(body["ready"], false);
    assert!(body["metadataUnreachable"].is_string(), "{body}");
    // A metadata write: 503 with Retry-After, never a success.
    let (status, retry, body) = send(&app, Method::PUT, "/during").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert_eq!(body["error"], "unavailable");

    proxy.resume();
    wait_status(&admin, Method::GET, "/ready", 200).await;
    wait_status(&app, Method::PUT, "/after", 201).await;
    assert_eq!(send(&app, Method::GET, "/before").await.0, 200);
    node.shutdown().await;
}
