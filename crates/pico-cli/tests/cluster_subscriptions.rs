//! Durable Streams webhook subscriptions across real `pico serve` processes on one fresh
//! Postgres database (docs/design/subscriptions.md, "Cluster"): only the maintenance-lease
//! holder changes and delivers subscriptions; a change sent to another node is redirected
//! there; after `kill -9` of the holder, another node takes the lease and the receiver still
//! gets the next event, from it.
//!
//! The webhook receiver is a tiny HTTP server in the test that answers `{"done": true}`.
//! Without a Postgres server the test prints `SKIPPED (...)` and passes, or fails under
//! `PICO_TEST_REQUIRE_ALL=1`.

#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod pg;

mod cluster_support;

use std::time::Instant;

use cluster_support::*;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// Accepts webhook requests on 127.0.0.1 and reports each JSON body; answers `{"done": true}`,
/// so each wake is acked by the delivery itself (no callback needed).
async fn receiver() -> (String, mpsc::UnboundedReceiver<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then Content-Length bytes of body.
                let (head_end, length) = loop {
                    let Ok(n) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .and_then(|v| v.trim().parse::<usize>().ok())
                            .unwrap_or(0);
                        break (end + 4, length);
                    }
                };
                while buf.len() < head_end + length {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let body = &buf[head_end..head_end + length];
                let _ = tx.send(serde_json::from_slice(body).unwrap_or(Value::Null));
                let answer = br#"{"done":true}"#;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    answer.len()
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(answer).await;
                let _ = conn.shutdown().await;
            });
        }
    });
    (url, rx)
}

/// The next webhook whose snapshot shows `stream` with pending work.
async fn webhook_for(rx: &mut mpsc::UnboundedReceiver<Value>, stream: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let body = tokio::time::timeout(left, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("no webhook for {stream} within {PATIENCE:?}"))
            .expect("receiver running");
        let pending = body["streams"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["path"] == stream && s["has_pending"] == true)
        });
        if pending {
            return body;
        }
    }
}

fn sub_url(node: &Node, id: &str) -> String {
    node.url(&format!("/v1/stream/__ds/subscriptions/{id}"))
}

/// Node 1 holds the lease and delivers; a subscription PUT sent to node 2 gets a 307 to node 1,
/// reads work on both. `kill -9` of node 1: node 2 takes the lease when it expires, and an
/// event appended through node 2 reaches the receiver.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn webhook_delivery_survives_kill9_of_the_lease_holder() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut n1 = Node::start(1, &db, dir.path());
    let n2 = Node::start(2, &db, dir.path());
    eventually("node 1 holds the lease, node 2 does not", async || {
        n1.ready_field("maintenanceLease") == Value::Bool(true)
            && n2.ready_field("maintenanceLease") == Value::Bool(false)
    })
    .await;
    let (hook, mut hooks) = receiver().await;
    let config = json!({"type": "webhook", "pattern": "ev/*", "webhook": {"url": hook}});
    let http = raw_http();

    // A change sent to the non-holder is redirected to the holder, path kept.
    let r = http
        .put(sub_url(&n2, "hooks"))
        .json(&config)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(location(&r), sub_url(&n1, "hooks"));
    let r = http
        .put(sub_url(&n1, "hooks"))
        .json(&config)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "{:?}", r.text().await);
    // Reads are served by any node, from its view of the log (which may lag the holder's
    // write by a poll or a notification).
    eventually("node 2 serves the subscription", async || {
        let r = http.get(sub_url(&n2, "hooks")).send().await.unwrap();
        r.status() == StatusCode::OK
    })
    .await;

    let c1 = client(&n1);
    c1.create("ev/one", Some("text/plain"), None).await.unwrap();
    c1.append("ev/one", "first").await.unwrap();
    let first = webhook_for(&mut hooks, "ev/one").await;
    assert_eq!(first["subscription_id"], "hooks");

    let killed = Instant::now();
    n1.kill9();
    // The next event goes through node 2 (node 1 is gone): node 2 delivers it once it holds
    // the lease (at the latest when node 1's row expires), whether it saw the append before.
    let c2 = client(&n2);
    c2.create("ev/two", Some("text/plain"), None).await.unwrap();
    c2.append("ev/two", "second").await.unwrap();
    let next = webhook_for(&mut hooks, "ev/two").await;
    println!(
        "SUBSCRIPTION HANDOVER (kill -9 of the holder → next webhook from another node): {:.2} s",
        killed.elapsed().as_secs_f64()
    );
    assert_eq!(next["subscription_id"], "hooks");
    assert_eq!(n2.ready_field("maintenanceLease"), Value::Bool(true));
    // And the subscription is changed on node 2 now.
    let r = http
        .put(sub_url(&n2, "hooks"))
        .json(&config)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "re-confirmed on the new holder");
}
