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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::*;
use pico_client::{BatchRecord, IdempotentProducer, ProducerConfig};
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

/// SIGTERM of a stream's owner while an idempotent producer writes to it through the other
/// node: the owner flushes the stream and releases it before it stops, so the other node
/// serves it as soon as it applies the release. From the SIGTERM on, a probe through node 1
/// sees only 307s to the owner (before the release) and then answers from node 1, never a
/// 503 (that would mean a lapsed or fenced owner: failover, not a release). Every
/// acknowledged record is there once; the stopped node released everything it owned and
/// exited cleanly. Prints the time from the SIGTERM to node 1 serving the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn graceful_shutdown_releases_streams_to_the_other_node() {
    let Some(cluster) = Cluster::pg().await else {
        return;
    };
    let n1 = cluster.start(1);
    let mut n2 = cluster.start(2);
    let (c1, c2) = (client(&n1), client(&n2));
    let (mut acked_a, mut acked_b) = (BTreeMap::new(), BTreeMap::new());
    for (name, acked) in [("leaving/a", &mut acked_a), ("leaving/b", &mut acked_b)] {
        c2.create(name, Some("text/plain"), None).await.unwrap();
        append_acked(&c2, name, "before", 30, acked).await;
    }
    let http = raw_http();
    for name in ["leaving/a", "leaving/b"] {
        eventually("node 1 redirects to node 2", async || {
            let r = http
                .get(n1.url(&format!("/{name}?seq=0")))
                .send()
                .await
                .unwrap();
            r.status() == StatusCode::TEMPORARY_REDIRECT
        })
        .await;
    }

    // An idempotent producer through node 1 (redirected to node 2) keeps writing "leaving/a".
    let producer_acked = Arc::new(Mutex::new(BTreeMap::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let mut config = ProducerConfig::new("leaver", 0, 1);
        config.retry.budget = Duration::from_secs(40);
        let producer = IdempotentProducer::new(client(&n1), "leaving/a", config).unwrap();
        let (acked, stop) = (producer_acked.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let body = format!("p-{i}");
                let ack = producer
                    .send(vec![BatchRecord::new(body.clone())])
                    .await
                    .unwrap()
                    .ack()
                    .await
                    .unwrap_or_else(|e| panic!("batch {i} failed: {e}"));
                acked.lock().unwrap().insert(ack.append.start_seq, body);
                i += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    eventually("the producer is under way", async || {
        producer_acked.lock().unwrap().len() >= 10
    })
    .await;

    let term = Instant::now();
    n2.signal("-TERM");
    let mut statuses = BTreeMap::new();
    eventually("node 1 serves the stream", async || {
        let status = match http
            .get(n1.url("/leaving/b?seq=0"))
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(r) => r.status(),
            Err(e) => panic!("node 1 did not answer: {e}"),
        };
        *statuses.entry(status.as_u16()).or_insert(0) += 1;
        assert!(
            status == StatusCode::TEMPORARY_REDIRECT || status.is_success(),
            "node 1 answered {status} during a graceful shutdown; node 2 log:\n{}",
            n2.log_tail()
        );
        status.is_success()
    })
    .await;
    let served = term.elapsed();
    let exit = n2.wait_exit();
    let stopped = term.elapsed();
    println!(
        "GRACEFUL SHUTDOWN: SIGTERM → node 1 serving the stream {:.3} s (answers {statuses:?}); \
         node 2 exited after {:.2} s",
        served.as_secs_f64(),
        stopped.as_secs_f64()
    );
    assert!(exit.success(), "node 2 exited with {exit}");
    let log = std::fs::read_to_string(&n2.log).unwrap();
    assert!(
        log.contains("streams released to the cluster") && log.contains("left=0"),
        "node 2 did not release everything; log:\n{}",
        n2.log_tail()
    );

    // Node 2 is gone; node 1 serves both streams, reads and appends, on the first try.
    let r = http
        .post(n1.url("/leaving/b"))
        .header("content-type", "text/plain")
        .body("after")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "append after: {}", r.status());
    eventually("the producer's appends land on node 1", async || {
        producer_acked.lock().unwrap().len() >= 20
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    acked_a.extend(producer_acked.lock().unwrap().clone());
    let records = read_all(&c1, "leaving/a").await;
    check_acked_once(&records, &acked_a);
    acked_b.insert(30, "after".to_string());
    let records = read_all(&c1, "leaving/b").await;
    check_acked_once(&records, &acked_b);
    assert_eq!(records.len(), acked_b.len());
}
