//! Cluster end-to-end: several real `pico serve` processes on 127.0.0.1, sharing one fresh
//! Postgres database (metadata log and WAL) and one `file://` data directory.
//!
//! Postgres comes from `PICO_TEST_POSTGRES_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); each test creates its own database and drops
//! it. Without a server the tests print `SKIPPED (...)` and pass, or fail under
//! `PICO_TEST_REQUIRE_ALL=1`.

#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod pg;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pg::TestDb;
use pico_client::{Client, ClientOptions};
use reqwest::StatusCode;
use serde_json::Value;

const PICO: &str = env!("CARGO_BIN_EXE_pico");
/// Bounds every wait of these tests (none of them is a timing assertion).
const PATIENCE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `pico serve` process of the cluster; SIGKILLed when dropped.
struct Node {
    id: u32,
    child: Option<Child>,
    port: u16,
    admin: u16,
    log: PathBuf,
}

impl Node {
    /// Starts node `id` on fresh ports and waits for `/ready`.
    fn start(id: u32, db: &TestDb, dir: &Path) -> Node {
        let port = free_port();
        let admin = free_port();
        let log = dir.join(format!("node-{id}-{port}.log"));
        let mut cmd = Command::new(PICO);
        for (k, _) in std::env::vars() {
            if k.starts_with("PICO_") {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .arg("serve")
            .args(["--node-id", &id.to_string()])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--meta-url", &db.url])
            .args(["--wal", &db.url])
            .arg(format!("--storage=-2@file://{}/objects", dir.display()))
            .arg("--no-kafka")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn pico serve");
        let mut node = Node {
            id,
            child: Some(child),
            port,
            admin,
            log,
        };
        node.wait_ready();
        node
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.endpoint())
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "node {} exited with {status} before /ready; log:\n{}",
                    self.id,
                    self.log_tail()
                );
            }
            if self.ready().is_some_and(|(code, _)| code == 200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "node {} not ready within {PATIENCE:?}; log:\n{}",
                self.id,
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `/ready`: status and JSON body.
    fn ready(&self) -> Option<(u16, Value)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.admin)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET /ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        let code = buf.split_whitespace().nth(1)?.parse().ok()?;
        let body = buf.split_once("\r\n\r\n").map(|(_, b)| b)?;
        Some((code, serde_json::from_str(body).ok()?))
    }

    fn ready_field(&self, field: &str) -> Value {
        self.ready()
            .map(|(_, v)| v[field].clone())
            .unwrap_or(Value::Null)
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A client that shows redirects instead of following them.
fn raw_http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn client(node: &Node) -> Client {
    Client::new(&node.endpoint(), ClientOptions::default()).unwrap()
}

fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Waits until `cond` holds (polling), failing with `what` after [`PATIENCE`].
async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond().await {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

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
