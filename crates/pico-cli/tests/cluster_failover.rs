//! Automatic failover end-to-end (docs/design/failover.md): real `pico serve` processes on one
//! fresh Postgres database (metadata log, and the WAL unless said otherwise) and one `file://`
//! data directory or one S3 bucket (`PICO_TEST_S3_ENDPOINT`, moto in CI).
//!
//! - `kill -9` of a stream's owner under load: the stream is readable and writable through
//!   another node within 10 s (the measured failover time is printed), every acknowledged
//!   record present once at its offset; the killed node comes back with the same id cleanly.
//!   Run twice: WAL in Postgres, and WAL and data on S3.
//! - `kill -9` of the maintenance-lease holder, which also owns a stream: another node takes
//!   the lease, then fails the dead node's stream over.
//! - A SIGSTOPped owner (a zombie) resumed after failover gets no append acknowledged, and
//!   nothing it accepts becomes visible anywhere.
//! - An owner cut off from Postgres (a TCP proxy the test pauses) acknowledges nothing while
//!   cut, stops being ready, and rejoins with a new epoch once the cut heals.
//!
//! The timings are the defaults (liveness timeout 5 s, maintenance lease 10 s). Without a
//! Postgres server (or an S3 server, for the S3 case) the tests print `SKIPPED (...)` and pass,
//! or fail under `PICO_TEST_REQUIRE_ALL=1`.

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
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// A POST of one record straight to `node` (redirects not followed).
async fn raw_append(http: &reqwest::Client, node: &Node, name: &str, body: &str) -> StatusCode {
    match http
        .post(node.url(&format!("/{name}")))
        .header("content-type", "text/plain")
        .body(body.to_string())
        .timeout(Duration::from_secs(3))
        .send()
        .await
    {
        Ok(r) => r.status(),
        // Timed out or refused: not acknowledged.
        Err(_) => StatusCode::SERVICE_UNAVAILABLE,
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// Three nodes; node 2 owns a stream that three idempotent producers write through node 3
/// (307s to node 2). `kill -9` of node 2: node 3 answers 503 once it sees node 2's heartbeat
/// lapse, the lease holder fences node 2, commits its WAL and releases the stream, and the
/// producers' retries land on node 3, which reopens it. Every acknowledged record is there
/// once, at its offset. Node 2 then restarts with the same id and serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_after_kill9_of_an_owner_under_load() {
    if let Some(cluster) = Cluster::pg().await {
        failover_under_load(cluster).await;
    }
}

/// The same with the WAL (and data) on S3: the holder reads the dead node's WAL objects.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failover_with_the_wal_on_s3_after_kill9_under_load() {
    if let Some(cluster) = Cluster::s3().await {
        failover_under_load(cluster).await;
    }
}

async fn failover_under_load(cluster: Cluster) {
    let n1 = cluster.start(1);
    let mut n2 = cluster.start(2);
    let n3 = cluster.start(3);
    assert_eq!(
        lease_holder(&[&n1, &n2, &n3]).await,
        1,
        "the first node holds the lease"
    );
    let c2 = client(&n2);
    c2.create("load", Some("text/plain"), None).await.unwrap();
    c2.append("load", "p-first").await.unwrap();
    let http = raw_http();
    eventually("node 3 redirects to node 2", async || {
        let r = http.get(n3.url("/load?seq=0")).send().await.unwrap();
        r.status() == StatusCode::TEMPORARY_REDIRECT
    })
    .await;

    let acked = Arc::new(Mutex::new(BTreeMap::from([(0u64, "p-first".to_string())])));
    let stop = Arc::new(AtomicBool::new(false));
    let killed_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let first_after: Arc<Mutex<Option<Instant>>> = Arc::default();
    let mut producers = Vec::new();
    for p in 0..3 {
        let mut config = ProducerConfig::new(format!("producer-{p}"), 0, 1);
        config.retry.budget = Duration::from_secs(40);
        let producer = IdempotentProducer::new(client(&n3), "load", config).unwrap();
        let (acked, stop) = (acked.clone(), stop.clone());
        let (killed_at, first_after) = (killed_at.clone(), first_after.clone());
        producers.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let body = format!("p{p}-{i}");
                let ack = producer
                    .send(vec![BatchRecord::new(body.clone())])
                    .await
                    .unwrap()
                    .ack()
                    .await
                    .unwrap_or_else(|e| panic!("producer {p} batch {i} failed: {e}"));
                // Node 2 is dead from the kill on: an append acknowledged later went elsewhere.
                let now = Instant::now();
                if killed_at.lock().unwrap().is_some_and(|k| now > k) {
                    first_after.lock().unwrap().get_or_insert(now);
                }
                acked.lock().unwrap().insert(ack.append.start_seq, body);
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = acked.lock().unwrap().len();
    assert!(before > 10, "producers running: {before} acked");
    let kill = Instant::now();
    n2.kill9();
    *killed_at.lock().unwrap() = Some(kill);

    // The first append acknowledged after the kill went through node 3 (node 2 is dead).
    eventually("an append acknowledged after the kill", async || {
        first_after.lock().unwrap().is_some()
    })
    .await;
    let failover = first_after.lock().unwrap().unwrap() - kill;
    let wal = match cluster.layout {
        Layout::PgWal => "Postgres",
        Layout::S3(_) => "S3",
    };
    println!(
        "FAILOVER TIME (WAL on {wal}; kill -9 → first successful append elsewhere): {:.2} s",
        failover.as_secs_f64()
    );
    assert!(
        failover < Duration::from_secs(10),
        "failover took {failover:?}; node 3 log:\n{}\nnode 1 log:\n{}",
        n3.log_tail(),
        n1.log_tail()
    );
    // Keep the load on a little longer, then stop.
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop.store(true, Ordering::Relaxed);
    for p in producers {
        p.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > before, "appends continued after the failover");
    for c in [client(&n1), client(&n3)] {
        let records = read_all(&c, "load").await;
        check_acked_once(&records, &acked);
        assert_eq!(
            records.len(),
            acked.len(),
            "nothing but acknowledged records"
        );
    }

    // Node 2 comes back with the same id: a higher epoch than the fence's, ready, serving.
    let n2 = cluster.start(2);
    let c2 = client(&n2);
    let records = read_all(&c2, "load").await;
    check_acked_once(&records, &acked);
    c2.create("after-restart", Some("text/plain"), None)
        .await
        .unwrap();
    assert_eq!(c2.append("after-restart", "x").await.unwrap().start_seq, 0);
    let ack = c2.append("load", "after-restart").await.unwrap();
    assert_eq!(ack.start_seq, acked.len() as u64);
}

/// Three nodes; node 1 holds the maintenance lease and owns a stream. `kill -9` of node 1:
/// another node takes the lease once it expires, and then, as the holder, fences node 1,
/// commits its WAL and releases its stream, which is readable and writable through the
/// remaining nodes with every acknowledged record once. Prints when the lease moved and when
/// the stream was writable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_next_lease_holder_fails_over_the_dead_holders_streams() {
    let Some(cluster) = Cluster::pg().await else {
        return;
    };
    let mut n1 = cluster.start(1);
    let n2 = cluster.start(2);
    let n3 = cluster.start(3);
    assert_eq!(lease_holder(&[&n1, &n2, &n3]).await, 1);
    let c1 = client(&n1);
    c1.create("held", Some("text/plain"), None).await.unwrap();
    let mut acked = BTreeMap::new();
    append_acked(&c1, "held", "before", 50, &mut acked).await;
    let http = raw_http();
    for n in [&n2, &n3] {
        eventually("node 1 is known as the owner", async || {
            let r = http.get(n.url("/held?seq=0")).send().await.unwrap();
            r.status() == StatusCode::TEMPORARY_REDIRECT
        })
        .await;
    }

    let kill = Instant::now();
    n1.kill9();
    let new_holder = lease_holder(&[&n2, &n3]).await;
    let lease_moved = kill.elapsed();
    let (holder, other) = if new_holder == 2 {
        (&n2, &n3)
    } else {
        (&n3, &n2)
    };
    // Through the node that does not hold the lease: failover is the holder's, the stream
    // is served wherever a request lands.
    let c = client(other);
    append_eventually("the stream writable again", &c, "held", "after", &mut acked).await;
    let writable = kill.elapsed();
    println!(
        "LEASE HOLDER kill -9: lease on node {new_holder} after {:.2} s; stream writable \
         through node {} after {:.2} s",
        lease_moved.as_secs_f64(),
        other.id,
        writable.as_secs_f64()
    );
    let log = std::fs::read_to_string(&holder.log).unwrap();
    assert!(
        log.contains("failover: fenced node's streams released"),
        "the new holder did not fail node 1 over; log:\n{}",
        holder.log_tail()
    );
    append_acked(&c, "held", "more", 5, &mut acked).await;
    for c in [client(&n2), client(&n3)] {
        let records = read_all(&c, "held").await;
        check_acked_once(&records, &acked);
    }
}

/// The owner is SIGSTOPped; failover takes its stream over and it is written elsewhere. Once
/// resumed (SIGCONT), the zombie acknowledges none of the appends sent straight to it, and
/// no node, the zombie included, ever shows one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_resumed_zombie_gets_nothing_acknowledged_or_visible() {
    let Some(cluster) = Cluster::pg().await else {
        return;
    };
    let n1 = cluster.start(1);
    let n2 = cluster.start(2);
    assert_eq!(lease_holder(&[&n1, &n2]).await, 1);
    let c2 = client(&n2);
    c2.create("z", Some("text/plain"), None).await.unwrap();
    let mut acked = BTreeMap::new();
    append_acked(&c2, "z", "before", 20, &mut acked).await;
    let epoch_before = n2.ready_field("nodeEpoch").as_u64().unwrap();

    n2.signal("-STOP");
    let stopped = Instant::now();
    // Through node 1: 503s (owner lapsed, then fenced) until failover released the stream.
    let c1 = client(&n1);
    let http = raw_http();
    // Each try bounded: before node 1 sees the lapse it redirects to the stopped node, which
    // accepts the connection and never answers.
    append_eventually("node 1 takes appends", &c1, "z", "probe", &mut acked).await;
    println!(
        "SIGSTOP → stream writable on node 1: {:.2} s",
        stopped.elapsed().as_secs_f64()
    );
    append_acked(&c1, "z", "after", 5, &mut acked).await;

    n2.signal("-CONT");
    // Straight at the zombie, from the moment it resumes: never a 2xx.
    let resumed = Instant::now();
    let mut statuses = BTreeMap::new();
    let mut i = 0;
    while resumed.elapsed() < Duration::from_secs(4) {
        let s = raw_append(&http, &n2, "z", &format!("zombie-{i}")).await;
        assert!(
            !s.is_success(),
            "the zombie acknowledged append {i}: {s}; log:\n{}",
            n2.log_tail()
        );
        *statuses.entry(s.as_u16()).or_insert(0) += 1;
        i += 1;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    println!("answers of the resumed zombie: {statuses:?}");
    // It rejoins as a new incarnation and redirects to the stream's new owner.
    rejoined(&n2, epoch_before).await;
    let r = http.get(n2.url("/z?seq=0")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(location(&r), n1.url("/z?seq=0"));
    // No node shows anything of the zombie's.
    for c in [client(&n1), client(&n2)] {
        let records = read_all(&c, "z").await;
        assert!(
            records.iter().all(|(_, b)| !b.starts_with("zombie")),
            "zombie data visible: {records:?}"
        );
        check_acked_once(&records, &acked);
    }
}

/// A TCP proxy between one node and Postgres. `cut` drops every connection through it and
/// holds new ones without forwarding (the node's queries hang, as behind a partition);
/// `heal` closes the held ones and forwards again.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    /// Bumped by every cut and heal: connections of an older generation close.
    generation: Arc<tokio::sync::watch::Sender<u64>>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = Arc::new(AtomicBool::new(false));
        let generation = Arc::new(tokio::sync::watch::Sender::new(0u64));
        let task = tokio::spawn({
            let (cut, generation) = (cut.clone(), generation.clone());
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        continue;
                    };
                    let (cut, upstream) = (cut.clone(), upstream.clone());
                    let mut gen_rx = generation.subscribe();
                    let born = *gen_rx.borrow_and_update();
                    tokio::spawn(async move {
                        let mut client = client;
                        if cut.load(Ordering::Relaxed) {
                            // Held, never answered, closed when the cut heals.
                            let _ = gen_rx.wait_for(|g| *g != born).await;
                            let _ = client.shutdown().await;
                            return;
                        }
                        let Ok(mut server) = TcpStream::connect(&upstream).await else {
                            return;
                        };
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = gen_rx.wait_for(|g| *g != born) => {}
                        }
                    });
                }
            }
        });
        Proxy {
            port,
            cut,
            generation,
            task,
        }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        self.generation.send_modify(|g| *g += 1);
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::Relaxed);
        self.generation.send_modify(|g| *g += 1);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `url` with its `host:port` replaced by `127.0.0.1:{port}`.
fn through(url: &str, port: u16) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (authority, path) = rest.split_once('/').unwrap();
    let userinfo = authority
        .rsplit_once('@')
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    format!("{scheme}://{userinfo}127.0.0.1:{port}/{path}")
}

fn upstream_of(url: &str) -> String {
    let rest = url.split_once("://").unwrap().1;
    let authority = rest.split_once('/').map_or(rest, |(a, _)| a);
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:5432")
    }
}

/// Node 2 reaches Postgres through a proxy. Cut: it acknowledges none of the appends sent to
/// it, stops being ready, and failover (node 1) takes its stream over with every acknowledged
/// record. Healed: node 2 finds itself fenced and rejoins in place with a new epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_cut_off_from_the_database_acknowledges_nothing_and_rejoins() {
    let Some(mut cluster) = Cluster::pg().await else {
        return;
    };
    let proxy = Proxy::start(upstream_of(&cluster.db.url)).await;
    let via = through(&cluster.db.url, proxy.port);
    let n1 = cluster.start(1);
    // Node 2's metadata log and WAL go through the proxy (`pico serve` refuses a repeated
    // flag, so the database URL it is started with is swapped for the proxied one).
    let direct = std::mem::replace(&mut cluster.db.url, via);
    let n2 = cluster.start(2);
    cluster.db.url = direct;
    assert_eq!(lease_holder(&[&n1, &n2]).await, 1);
    let epoch_before = n2.ready_field("nodeEpoch").as_u64().unwrap();
    let c2 = client(&n2);
    c2.create("cut", Some("text/plain"), None).await.unwrap();
    let mut acked = BTreeMap::new();
    append_acked(&c2, "cut", "before", 20, &mut acked).await;

    proxy.cut();
    let cut_at = Instant::now();
    let http = raw_http();
    let mut not_ready_after = None;
    let mut i = 0;
    // Appends straight to node 2 while it is cut off: none acknowledged.
    while cut_at.elapsed() < Duration::from_secs(8) {
        let s = raw_append(&http, &n2, "cut", &format!("cut-{i}")).await;
        assert!(
            !s.is_success(),
            "acknowledged while cut off: append {i} → {s}"
        );
        if not_ready_after.is_none() && n2.ready().is_some_and(|(code, _)| code == 503) {
            not_ready_after = Some(cut_at.elapsed());
        }
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let not_ready_after = not_ready_after.expect("node 2 stayed ready while cut off");
    println!(
        "cut off: /ready 503 after {:.2} s; {i} appends refused",
        not_ready_after.as_secs_f64()
    );
    // Failover through node 1: the stream is writable there, everything acknowledged in it.
    let c1 = client(&n1);
    let mut on_1 = BTreeMap::new();
    append_eventually("node 1 takes appends", &c1, "cut", "on-1", &mut on_1).await;
    let last = on_1.values().next().unwrap().clone();
    let records = read_all(&c1, "cut").await;
    for (offset, body) in &acked {
        assert_eq!(records.get(*offset as usize).map(|r| &r.1), Some(body));
    }
    assert!(
        records.iter().all(|(_, b)| !b.starts_with("cut-")),
        "an append refused while cut off became visible: {records:?}"
    );

    proxy.heal();
    let healed = Instant::now();
    rejoined(&n2, epoch_before).await;
    println!(
        "healed → node 2 ready again at a new epoch: {:.2} s",
        healed.elapsed().as_secs_f64()
    );
    let records = read_all(&client(&n2), "cut").await;
    assert!(records.iter().all(|(_, b)| !b.starts_with("cut-")));
    assert_eq!(records.last().map(|r| &r.1), Some(&last));
    // And it takes work again: a new stream, created and written through it.
    c2.create("after-heal", Some("text/plain"), None)
        .await
        .unwrap();
    assert_eq!(c2.append("after-heal", "x").await.unwrap().start_seq, 0);
}
