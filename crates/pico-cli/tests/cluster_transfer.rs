//! Cluster end-to-end, moving streams between real `pico serve` processes on one fresh Postgres
//! database (metadata log and WAL) and one `file://` data directory: a live transfer under
//! concurrent producers, two nodes racing to create one name, and a rolling restart of every
//! node under load. Each test checks that every acknowledged record is present once, in order.
//!
//! Postgres comes from `PICO_TEST_POSTGRES_URL`; without a server the tests print
//! `SKIPPED (...)` and pass, or fail under `PICO_TEST_REQUIRE_ALL=1`.

mod cluster_support;
#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod pg;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cluster_support::*;
use pico_client::{AdminClient, AppendOptions, Client, ClientOptions, Producer};

/// Every record of `name`, read through `client` from offset 0 to the tail: (offset, body).
async fn read_all(client: &Client, name: &str) -> Vec<(u64, String)> {
    let tail = client
        .head(name)
        .await
        .unwrap()
        .expect("stream exists")
        .next;
    let mut out = Vec::new();
    let mut seq = 0;
    while seq < tail {
        let chunk = client.read(name, seq, None).await.unwrap();
        assert!(
            !chunk.records.is_empty(),
            "no records at {seq} below the tail {tail}"
        );
        for r in &chunk.records {
            out.push((r.seq, String::from_utf8_lossy(&r.body).to_string()));
        }
        seq = chunk.next_seq;
    }
    out
}

fn admin(node: &Node) -> AdminClient {
    AdminClient::new(&format!("http://127.0.0.1:{}", node.admin), None).unwrap()
}

/// What a producer task got acknowledged: body → offset.
type Acked = Arc<Mutex<BTreeMap<String, u64>>>;

/// An idempotent producer (id `id`, epoch 1) appending `"{id}-{seq}"` through `client` until
/// `stop`, one record at a time; it re-sends a failed seq (same triple) on the next endpoint
/// of `endpoints` until acknowledged, so it never skips one. Returns the longest time one
/// record took, acknowledgement to acknowledgement.
async fn produce(
    id: String,
    name: String,
    endpoints: Arc<Mutex<Vec<String>>>,
    acked: Acked,
    stop: Arc<AtomicBool>,
) -> Duration {
    let options = ClientOptions {
        // Short: a node being restarted is skipped for the next one rather than waited for.
        request_timeout: Duration::from_secs(5),
        append_retry_budget: Duration::from_secs(2),
        ..ClientOptions::default()
    };
    let mut clients: BTreeMap<String, Client> = BTreeMap::new();
    let mut worst = Duration::ZERO;
    let mut seq = 0u64;
    let mut turn = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let body = format!("{id}-{seq}");
        let opts = AppendOptions {
            producer: Some(Producer {
                id: id.clone(),
                epoch: 1,
                seq,
            }),
            ..AppendOptions::default()
        };
        let t0 = Instant::now();
        loop {
            let endpoint = {
                let e = endpoints.lock().unwrap();
                e[turn % e.len()].clone()
            };
            let client = clients
                .entry(endpoint.clone())
                .or_insert_with(|| Client::new(&endpoint, options.clone()).unwrap());
            match client.append_with(&name, body.clone(), &opts).await {
                Ok(ack) => {
                    assert_eq!(ack.next_seq, ack.start_seq + 1, "{body}: {ack:?}");
                    let before = acked.lock().unwrap().insert(body.clone(), ack.start_seq);
                    assert!(before.is_none(), "{body} acknowledged twice");
                    break;
                }
                Err(e) => {
                    assert!(
                        t0.elapsed() < Duration::from_secs(30),
                        "{body} never acknowledged: {e}"
                    );
                    turn += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        worst = worst.max(t0.elapsed());
        seq += 1;
    }
    worst
}

/// Checks stream `name` holds exactly the acknowledged records, once each, at the offsets they
/// were acknowledged at, offsets consecutive from 0, each producer's records in seq order.
async fn check_stream(client: &Client, name: &str, acked: &BTreeMap<String, u64>) {
    let records = read_all(client, name).await;
    for (i, (seq, _)) in records.iter().enumerate() {
        assert_eq!(*seq, i as u64, "{name}: offsets not consecutive");
    }
    let mut seen: BTreeMap<&str, u64> = BTreeMap::new();
    let mut last_seq: BTreeMap<&str, u64> = BTreeMap::new();
    for (offset, body) in &records {
        assert!(
            seen.insert(body, *offset).is_none(),
            "{name}: {body} present twice"
        );
        let (producer, pseq) = body.rsplit_once('-').unwrap();
        let pseq: u64 = pseq.parse().unwrap();
        let prev = last_seq.insert(producer, pseq);
        assert_eq!(
            prev.map_or(0, |p| p + 1),
            pseq,
            "{name}: producer {producer} out of order or with a gap at offset {offset}"
        );
    }
    for (body, offset) in acked {
        assert_eq!(
            seen.get(body.as_str()),
            Some(offset),
            "{name}: acknowledged {body} at {offset} is not there"
        );
    }
}

/// A stream moves twice (node 1 → 2 → 3) while three idempotent producers, one through each
/// node, keep appending: every acknowledged record is present once at its offset, offsets run
/// on without a gap, and each producer's sequence continues across both handoffs (a re-sent
/// batch lands once). Prints the handoff time (admin request to the target owning it) and the
/// longest a producer waited for one record meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_transfer_under_concurrent_producers_keeps_offsets_and_records() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<Node> = (1..=3).map(|id| Node::start(id, &db, dir.path())).collect();
    let name = "orders/moving";
    let c1 = client(&nodes[0]);
    c1.create(name, Some("text/plain"), None).await.unwrap();
    let acked: Acked = Arc::default();
    // The first record opens it on node 1.
    let init = AppendOptions {
        producer: Some(Producer {
            id: "init".into(),
            epoch: 1,
            seq: 0,
        }),
        ..AppendOptions::default()
    };
    let ack = c1.append_with(name, "init-0", &init).await.unwrap();
    acked.lock().unwrap().insert("init-0".into(), ack.start_seq);
    let admin1 = admin(&nodes[0]);
    assert_eq!(
        admin1
            .placement(name)
            .await
            .unwrap()
            .unwrap()
            .owner
            .map(|o| o.node_id),
        Some(1)
    );
    // Every node's view knows node 1 owns it, so producers through 2 and 3 are redirected
    // (a write served on a node that has not seen the open yet would open it there).
    let http = raw_http();
    for n in &nodes[1..] {
        eventually("the owner is known everywhere", async || {
            let r = http
                .get(n.url("/orders/moving?seq=0"))
                .send()
                .await
                .unwrap();
            r.status() == reqwest::StatusCode::TEMPORARY_REDIRECT
        })
        .await;
    }

    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            tokio::spawn(produce(
                format!("p{i}"),
                name.to_string(),
                Arc::new(Mutex::new(vec![n.endpoint()])),
                acked.clone(),
                stop.clone(),
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut handoffs = Vec::new();
    for (to, via) in [(2u32, 0usize), (3, 2)] {
        let before = acked.lock().unwrap().len();
        let h = admin(&nodes[via])
            .transfer_and_wait(name, to, Duration::from_secs(30))
            .await
            .unwrap();
        handoffs.push(h.elapsed);
        eprintln!(
            "transfer to node {to}: handoff {} ms (epoch {} -> {}), {} records acknowledged before",
            h.elapsed.as_millis(),
            h.started.epoch,
            h.epoch,
            before
        );
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut worst = Duration::ZERO;
    for p in producers {
        worst = worst.max(p.await.unwrap());
    }
    let acked = acked.lock().unwrap().clone();
    eprintln!(
        "handoff times: {:?} ms; longest wait for one record: {} ms; {} records acknowledged",
        handoffs.iter().map(Duration::as_millis).collect::<Vec<_>>(),
        worst.as_millis(),
        acked.len()
    );
    for p in 0..3 {
        assert!(
            acked
                .keys()
                .filter(|b| b.starts_with(&format!("p{p}-")))
                .count()
                > 10,
            "producer {p} barely wrote"
        );
    }
    let p = admin1.placement(name).await.unwrap().unwrap();
    assert_eq!(p.owner.map(|o| o.node_id), Some(3));
    assert!(p.transfer.is_none());
    check_stream(&c1, name, &acked).await;

    // The CLI: a transfer back to node 1, waited for, prints its handoff time.
    let out = std::process::Command::new(PICO)
        .args(["admin", "transfer", name, "--to-node", "1", "--wait"])
        .args([
            "--admin-endpoint",
            &format!("http://127.0.0.1:{}", nodes[1].admin),
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.starts_with("node=1 ") && stdout.contains("handoff_ms="),
        "pico admin transfer: {stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("pico admin transfer --wait: {}", stdout.trim());
    let ack = c1.append(name, "after").await.unwrap();
    assert_eq!(ack.start_seq, acked.len() as u64, "offsets continue");

    // Refusals are clear 4xx answers.
    let status = |r: Result<pico_client::TransferStarted, pico_client::ClientError>| {
        r.map(|_| 202).unwrap_or_else(|e| e.status().unwrap_or(0))
    };
    eventually("node 1 owns it everywhere", async || {
        admin1
            .placement(name)
            .await
            .unwrap()
            .unwrap()
            .owner
            .map(|o| o.node_id)
            == Some(1)
    })
    .await;
    assert_eq!(status(admin1.transfer("no/such", 2).await), 404);
    assert_eq!(status(admin1.transfer(name, 9).await), 404, "unknown node");
    assert_eq!(status(admin1.transfer(name, 1).await), 409, "already there");
    let bad = http
        .post(format!(
            "http://127.0.0.1:{}/admin/transfer",
            nodes[0].admin
        ))
        .body(r#"{"stream":"orders/moving"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), reqwest::StatusCode::BAD_REQUEST);
}

/// Two nodes create the same names at the same moment: one stream per name, the loser's
/// create answered as the existing stream (201 for exactly one, 200 for the other), or 409 for
/// the one whose configuration differs; both nodes then read the same records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_two_nodes_racing_to_create_one_name_make_one_stream() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let a = Node::start(1, &db, dir.path());
    let b = Node::start(2, &db, dir.path());
    let (ca, cb) = (client(&a), client(&b));
    for i in 0..20 {
        let name = format!("race/{i}");
        let (ra, rb) = tokio::join!(
            ca.create(&name, Some("text/plain"), None),
            cb.create(&name, Some("text/plain"), None)
        );
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert!(
            ra.created != rb.created,
            "{name}: exactly one create makes it: a={} b={}",
            ra.created,
            rb.created
        );
        // The loser adopts the winner's stream: writes through it land in the same one. The
        // first write opens it on the node that takes it; the other writes once its view knows.
        let (first, second) = if ra.created { (&cb, &ca) } else { (&ca, &cb) };
        let second_node = if ra.created { &a } else { &b };
        first.append(&name, "one").await.unwrap();
        let http = raw_http();
        eventually("the other node knows the owner", async || {
            let r = http
                .get(second_node.url(&format!("/{name}?seq=0")))
                .send()
                .await
                .unwrap();
            r.status() == reqwest::StatusCode::TEMPORARY_REDIRECT
        })
        .await;
        second.append(&name, "two").await.unwrap();
        let via_a = read_all(&ca, &name).await;
        let via_b = read_all(&cb, &name).await;
        assert_eq!(via_a, via_b, "{name}: reads agree");
        assert_eq!(
            via_a,
            vec![(0, "one".to_string()), (1, "two".to_string())],
            "{name}"
        );
    }
    // Racing with different configurations: one wins, the other is a conflict.
    for i in 0..10 {
        let name = format!("race/conf/{i}");
        let (ra, rb) = tokio::join!(
            ca.create(&name, Some("text/plain"), None),
            cb.create(&name, Some("application/json"), None)
        );
        match (ra, rb) {
            (Ok(w), Err(e)) | (Err(e), Ok(w)) => {
                assert!(w.created, "{name}");
                assert_eq!(e.status(), Some(409), "{name}: {e}");
            }
            other => panic!("{name}: one create wins, the other conflicts: {other:?}"),
        }
        let ha = ca.head(&name).await.unwrap().unwrap();
        let hb = cb.head(&name).await.unwrap().unwrap();
        assert_eq!(ha.content_type, hb.content_type, "{name}: heads agree");
    }
    let listed = ca.list(Some("race/"), None, Some(100)).await.unwrap();
    assert_eq!(listed.streams.len(), 30, "one stream per name");
}

/// Every node in turn is stopped gracefully (SIGTERM), then restarted with the same id, while
/// idempotent producers keep appending to six streams spread over the nodes (re-sending through
/// another node when theirs is down): nothing acknowledged is lost, nothing is written twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_rolling_restart_under_load_loses_nothing_acknowledged() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let mut nodes: Vec<Node> = (1..=3).map(|id| Node::start(id, &db, dir.path())).collect();
    let endpoints = Arc::new(Mutex::new(
        nodes.iter().map(Node::endpoint).collect::<Vec<_>>(),
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    let mut names = Vec::new();
    for s in 0..6 {
        let name = format!("rolling/{s}");
        let c = client(&nodes[s % 3]);
        c.create(&name, Some("text/plain"), None).await.unwrap();
        let acked: Acked = Arc::default();
        // Each producer starts on another node, so the streams open on all three.
        let mine = Arc::new(Mutex::new({
            let mut e = endpoints.lock().unwrap().clone();
            e.rotate_left(s % 3);
            e
        }));
        tasks.push((
            name.clone(),
            acked.clone(),
            mine.clone(),
            tokio::spawn(produce(
                format!("w{s}"),
                name.clone(),
                mine,
                acked,
                stop.clone(),
            )),
        ));
        names.push(name);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..3 {
        let id = nodes[i].id;
        let before: usize = tasks.iter().map(|t| t.1.lock().unwrap().len()).sum();
        let t0 = Instant::now();
        sigterm_and_wait(&mut nodes[i]);
        let stopped = t0.elapsed();
        nodes[i] = Node::start(id, &db, dir.path());
        let new = nodes[i].endpoint();
        for t in &tasks {
            let mut e = t.2.lock().unwrap();
            for slot in e.iter_mut() {
                if !nodes.iter().any(|n| n.endpoint() == *slot) {
                    *slot = new.clone();
                }
            }
        }
        eprintln!(
            "node {id}: stopped in {} ms, back in {} ms; {before} records acknowledged before",
            stopped.as_millis(),
            t0.elapsed().as_millis()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let c = client(&nodes[0]);
    let mut total = 0;
    for (name, acked, _, task) in tasks {
        let worst = task.await.unwrap();
        let acked = acked.lock().unwrap().clone();
        assert!(acked.len() > 10, "{name}: barely written ({})", acked.len());
        total += acked.len();
        check_stream(&c, &name, &acked).await;
        eprintln!(
            "{name}: {} records, longest wait for one {} ms",
            acked.len(),
            worst.as_millis()
        );
    }
    eprintln!("rolling restart: {total} records acknowledged, all present once");
}

/// Sends SIGTERM and waits (bounded) for a clean exit.
fn sigterm_and_wait(node: &mut Node) {
    let mut child = node.child.take().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "node {} exited with {status}", node.id);
            return;
        }
        if Instant::now() >= deadline {
            child.kill().unwrap();
            panic!("node {} did not stop within {PATIENCE:?}", node.id);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
