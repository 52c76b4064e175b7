//! A node whose object store fails (`FaultStorage`) or whose WAL was taken over (`FaultWal`
//! fenced), through the Pico protocol router: appends answer 503 with `Retry-After` while the
//! store is down, never a false 200; once it heals, appends succeed again without a restart,
//! and every acknowledged record reads back.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request};
use pico_http::{HttpOptions, protocol_router};
use pico_server::{Node, NodeConfig};
use pico_sql::{MetaLog, MetaLogOptions};
use s3stream::testing::{FaultStorage, FaultWal};
use s3stream::{EngineConfig, MemoryStorage, ObjectStorage, ObjectWal, Wal};
use serde_json::Value;
use tower::ServiceExt;

#[path = "common/app.rs"]
mod app;
use app::App;

struct Resp {
    status: u16,
    retry_after: Option<String>,
    body: Value,
}

async fn send(app: &impl App, method: Method, uri: &str, body: &'static str) -> Resp {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "text/plain")
        .body(Body::from(body))
        .unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(30), app.clone().oneshot(req))
        .await
        .expect("the node answered within 30 s")
        .unwrap();
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    Resp {
        status,
        retry_after,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    }
}

async fn node_on(
    data: Arc<dyn ObjectStorage>,
    wal: Arc<dyn Wal>,
) -> (pico_http::fast::Protocol, Node) {
    node_with(data, wal, EngineConfig::default()).await
}

async fn node_with(
    data: Arc<dyn ObjectStorage>,
    wal: Arc<dyn Wal>,
    engine: EngineConfig,
) -> (pico_http::fast::Protocol, Node) {
    let meta = MetaLog::open("sqlite::memory:", MetaLogOptions::default())
        .await
        .unwrap();
    let config = NodeConfig {
        node_epoch: 1,
        long_poll_timeout: Duration::from_millis(200),
        ..NodeConfig::default()
    };
    let node = Node::start(config, meta, data, wal, engine).await.unwrap();
    (protocol_router(node.clone(), HttpOptions::default()), node)
}

/// A node whose data and WAL are on one `FaultStorage`, with stream `s` holding "one".
async fn stream_with_one_record() -> (Arc<FaultStorage>, pico_http::fast::Protocol, Node) {
    let store = Arc::new(FaultStorage::new(Arc::new(MemoryStorage::new())));
    let wal = Arc::new(ObjectWal::new(store.clone(), "wal".into()));
    let (app, node) = node_on(store.clone(), wal).await;
    assert_eq!(send(&app, Method::PUT, "/s", "").await.status, 201);
    assert_eq!(send(&app, Method::POST, "/s", "one").await.status, 200);
    (store, app, node)
}

fn bodies(read: &Value) -> Vec<String> {
    read.as_array()
        .unwrap()
        .iter()
        .map(|r| r["body"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn a_down_store_answers_503_with_retry_after_and_the_node_recovers_by_itself() {
    let (store, app, node) = stream_with_one_record().await;

    store.set_down(true);
    for _ in 0..3 {
        let r = send(&app, Method::POST, "/s", "lost").await;
        assert_eq!(r.status, 503, "{:?}", r.body);
        assert_eq!(r.retry_after.as_deref(), Some("1"));
        assert_eq!(r.body["error"], "unavailable", "{:?}", r.body);
    }

    store.set_down(false);
    // The next append reopens the stream (flush, new epoch) and succeeds: no restart.
    let r = send(&app, Method::POST, "/s", "two").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let r = send(&app, Method::GET, "/s", "").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(bodies(&r.body), ["one", "two"]);
    assert!(store.injected_count() >= 3);
    node.shutdown().await;
}

#[tokio::test]
async fn reads_of_uploaded_data_answer_503_while_the_store_is_down() {
    let store = Arc::new(FaultStorage::new(Arc::new(MemoryStorage::new())));
    let wal = Arc::new(ObjectWal::new(store.clone(), "wal".into()));
    // No caches: once uploaded, a read must go to the store.
    let cfg = EngineConfig {
        log_cache_bytes: 0,
        block_cache_bytes: 0,
        ..EngineConfig::default()
    };
    let (app, node) = node_with(store.clone(), wal, cfg).await;
    send(&app, Method::PUT, "/s", "").await;
    assert_eq!(send(&app, Method::POST, "/s", "one").await.status, 200);
    node.engine().flush().await.unwrap();
    store.set_down(true);
    let r = send(&app, Method::GET, "/s", "").await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    store.set_down(false);
    let r = send(&app, Method::GET, "/s", "").await;
    assert_eq!(bodies(&r.body), ["one"]);
    node.shutdown().await;
}

/// A fenced WAL write (a newer incarnation of this node took the WAL over) is a 503 that says
/// the node lost ownership, not a 500 "durability unknown".
#[tokio::test]
async fn a_superseded_node_answers_503_saying_so() {
    let data: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let wal = Arc::new(FaultWal::new(Arc::new(ObjectWal::new(
        data.clone(),
        "wal".into(),
    ))));
    let (app, node) = node_on(data, wal.clone()).await;
    send(&app, Method::PUT, "/s", "").await;
    assert_eq!(send(&app, Method::POST, "/s", "one").await.status, 200);
    wal.fence(true);
    let r = send(&app, Method::POST, "/s", "two").await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.retry_after.as_deref(), Some("1"));
    let msg = r.body["message"].as_str().unwrap();
    assert!(msg.contains("lost ownership"), "{msg}");
    node.shutdown().await;
}

/// A store that stays down (the disk under the WAL and the objects is full): every append of
/// a crowd on one stream gets its 503 + `Retry-After` within `send`'s 30 s, though each reopen
/// of the broken stream waits out a flush of several backoffs. Before, the requests queued on
/// the stream's open tried it again one after another (48 × 1-3 s: the client gave up); now the
/// ones queued behind a failed open share its answer. Nothing acknowledged is lost, and
/// appends work again once the store heals, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_queued_behind_a_failing_reopen_get_their_503_promptly() {
    let (store, app, node) = stream_with_one_record().await;

    store.set_down(true);
    for wave in 0..2 {
        let crowd = (0..48).map(|_| {
            let app = app.clone();
            tokio::spawn(async move { send(&app, Method::POST, "/s", "lost").await })
        });
        for r in futures::future::join_all(crowd).await {
            let r = r.unwrap();
            assert_eq!(r.status, 503, "wave {wave}: {:?}", r.body);
            assert_eq!(r.retry_after.as_deref(), Some("1"));
            assert_eq!(r.body["error"], "unavailable", "{:?}", r.body);
        }
    }

    store.set_down(false);
    let mut ok = None;
    for _ in 0..10 {
        // "stream is being reopened" first, then the reopen succeeds.
        let r = send(&app, Method::POST, "/s", "two").await;
        if r.status == 200 {
            ok = Some(r);
            break;
        }
        assert_eq!(r.status, 503, "{:?}", r.body);
    }
    assert!(
        ok.is_some(),
        "appends did not recover once the store healed"
    );
    let r = send(&app, Method::GET, "/s", "").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(bodies(&r.body), ["one", "two"]);
    node.shutdown().await;
}

/// An append that waited for queue space while uploads kept failing is told nothing was
/// written (a 503 from `EngineError::NoRoom`) and its stream stays open: once the store heals,
/// the next append continues at the next offset under the same epoch, with no reopen (whose
/// flush would make it wait) and nothing acknowledged lost.
#[tokio::test]
async fn an_append_with_no_room_leaves_its_stream_open() {
    // Data objects fail; the WAL is on storage of its own and keeps working, so appends are
    // acknowledged until the queue of not-yet-uploaded bytes is full.
    let data = Arc::new(FaultStorage::new(Arc::new(MemoryStorage::new())));
    let wal = Arc::new(ObjectWal::new(Arc::new(MemoryStorage::new()), "wal".into()));
    let cfg = EngineConfig {
        max_unflushed_bytes: 8 * 1024,
        upload_threshold_bytes: 1 << 30,
        upload_interval: Duration::from_millis(10),
        ..EngineConfig::default()
    };
    let (app, node) = node_with(data.clone(), wal, cfg).await;
    let record: &'static str = Box::leak("r".repeat(500).into_boxed_str());
    assert_eq!(send(&app, Method::PUT, "/s", "").await.status, 201);
    assert_eq!(send(&app, Method::POST, "/s", record).await.status, 200);
    let id = node.meta().view().stream_by_name("s").unwrap().1.id;
    let epoch = node.engine().is_open(id);
    assert!(epoch.is_some(), "the first append opened the stream");

    data.set_down(true);
    let mut acked = 1usize;
    let refused = loop {
        let r = send(&app, Method::POST, "/s", record).await;
        if r.status != 200 {
            break r;
        }
        acked += 1;
        assert!(acked < 100, "the queue never filled");
    };
    assert_eq!(refused.status, 503, "{:?}", refused.body);
    assert_eq!(refused.retry_after.as_deref(), Some("1"));
    let msg = refused.body["message"].as_str().unwrap();
    assert!(msg.contains("nothing was written"), "{msg}");
    assert_eq!(node.engine().is_open(id), epoch, "the stream stayed open");
    assert_eq!(
        node.engine().next_offset(id),
        Some(acked as u64),
        "no offset taken"
    );

    data.set_down(false);
    let r = send(&app, Method::POST, "/s", "after").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(node.engine().is_open(id), epoch, "no reopen: same epoch");
    let r = send(&app, Method::GET, "/s", "").await;
    let read = bodies(&r.body);
    assert_eq!(read.len(), acked + 1);
    assert!(read[..acked].iter().all(|b| b == record));
    assert_eq!(read[acked], "after");
    node.shutdown().await;
}
