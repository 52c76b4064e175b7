//! Cluster end-to-end: several real `pico serve` processes on 127.0.0.1, sharing one fresh
//! Postgres database (metadata log and WAL) and one `file://` data directory.
//!
//! Postgres comes from `PICO_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); each test creates its own database and drops
//! it. Without a server the tests print `SKIPPED (...)` and pass, or fail under
//! `PICO_TEST_REQUIRE_ALL=1`.

#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod pg;

mod cluster_support;

use std::time::Duration;

use cluster_support::*;
use reqwest::StatusCode;
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// A stream opened on A is answered by B with a 307 to A's advertised URL, path and query
/// kept, for Pico and Durable Streams routes, catch-up and long-poll reads and appends alike;
/// the client library follows it (re-sending the body). A stream nobody owns is served and
/// opened by whichever node gets it, and then A redirects to that node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_redirects_to_the_owner_and_clients_follow() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(1, &db, dir.path());
    let b = Node::start(2, &db, dir.path());
    let (ca, cb) = (client(&a), client(&b));
    ca.create("orders/1", Some("text/plain"), None)
        .await
        .unwrap();
    ca.append("orders/1", "first").await.unwrap();
    let http = raw_http();

    // B's view catches up with A's open through the log.
    eventually("B redirects to A", async || {
        let r = http
            .get(b.url("/orders/1?seq=0&format=json"))
            .send()
            .await
            .unwrap();
        r.status() == StatusCode::TEMPORARY_REDIRECT
    })
    .await;
    for path in [
        "/orders/1?seq=0&format=json",
        "/orders/1?seq=1&format=json&live=long-poll",
        "/v1/stream/orders/1?offset=-1",
        "/v1/stream/orders/1?offset=-1&live=sse",
    ] {
        let r = http.get(b.url(path)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT, "GET {path}");
        assert_eq!(location(&r), a.url(path), "GET {path}");
    }
    let r = http
        .post(b.url("/orders/1"))
        .header("content-type", "text/plain")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(location(&r), a.url("/orders/1"));

    // The client follows: its append lands on A, once.
    let ack = cb.append("orders/1", "second").await.unwrap();
    assert_eq!(ack.start_seq, 1);
    let chunk = cb.read("orders/1", 0, None).await.unwrap();
    let bodies: Vec<_> = chunk.records.iter().map(|r| r.body.clone()).collect();
    assert_eq!(bodies, vec!["first", "second"]);
    let polled = cb.long_poll("orders/1", 1).await.unwrap();
    assert_eq!(polled.records[0].body, "second");

    // Unowned: created and first written through B, so B owns it and A redirects there.
    cb.create("orders/2", Some("text/plain"), None)
        .await
        .unwrap();
    let r = http
        .post(b.url("/orders/2"))
        .header("content-type", "text/plain")
        .body("on b")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "served by B: {}", r.status());
    eventually("A redirects to B", async || {
        let r = http.get(a.url("/orders/2?seq=0")).send().await.unwrap();
        r.status() == StatusCode::TEMPORARY_REDIRECT && location(&r) == b.url("/orders/2?seq=0")
    })
    .await;
    let chunk = ca.read("orders/2", 0, None).await.unwrap();
    assert_eq!(chunk.records[0].body, "on b");
}

/// `kill -9` of a node, then a restart with the same id: it registers a higher epoch (on other
/// ports, so at another advertised URL), the other node redirects to its new address, and
/// every append acknowledged before the kill reads back through the other node.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_node_killed_and_restarted_rejoins_with_a_higher_epoch() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut a = Node::start(1, &db, dir.path());
    let b = Node::start(2, &db, dir.path());
    let first_epoch = a.ready_field("nodeEpoch").as_u64().expect("nodeEpoch");
    let ca = client(&a);
    ca.create("s", Some("text/plain"), None).await.unwrap();
    let mut acked = Vec::new();
    for i in 0..50 {
        let body = format!("r{i}");
        let ack = ca.append("s", body.clone()).await.unwrap();
        assert_eq!(ack.start_seq, i);
        acked.push(body);
    }
    a.kill9();

    let a2 = Node::start(1, &db, dir.path());
    let second_epoch = a2.ready_field("nodeEpoch").as_u64().expect("nodeEpoch");
    assert!(
        second_epoch > first_epoch,
        "epoch went {first_epoch} → {second_epoch}"
    );
    let cb = client(&b);
    let http = raw_http();
    // B learns the new registration through the log and sends clients to the new address.
    eventually("B redirects to the restarted A", async || {
        let r = http.get(b.url("/s?seq=0")).send().await.unwrap();
        r.status() == StatusCode::TEMPORARY_REDIRECT && location(&r) == a2.url("/s?seq=0")
    })
    .await;
    let mut got = Vec::new();
    let mut seq = 0;
    while got.len() < acked.len() {
        let chunk = cb.read("s", seq, None).await.unwrap();
        assert!(!chunk.records.is_empty(), "stream ends at {seq}");
        seq = chunk.next_seq;
        got.extend(
            chunk
                .records
                .iter()
                .map(|r| String::from_utf8_lossy(&r.body).to_string()),
        );
    }
    assert_eq!(got, acked);
    let ack = cb.append("s", "after").await.unwrap();
    assert_eq!(ack.start_seq, 50);
}

/// One node of three holds the maintenance lease; killing it moves the lease to another.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_maintenance_lease_has_one_holder_and_moves_when_it_dies() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> = (1..=3).map(|id| Node::start(id, &db, dir.path())).collect();
    let holders = |nodes: &[Node]| -> Vec<u32> {
        nodes
            .iter()
            .filter(|n| n.ready_field("maintenanceLease") == Value::Bool(true))
            .map(|n| n.id)
            .collect()
    };
    eventually("one holder", async || holders(&nodes).len() == 1).await;
    let first = holders(&nodes)[0];
    // Never two at once while we watch.
    for _ in 0..20 {
        assert!(holders(&nodes).len() <= 1, "{:?}", holders(&nodes));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let i = nodes.iter().position(|n| n.id == first).unwrap();
    nodes[i].kill9();
    nodes.remove(i);
    eventually("the lease moved", async || holders(&nodes).len() == 1).await;
    assert_ne!(holders(&nodes)[0], first);
}
