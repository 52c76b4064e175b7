//! Real `pico serve` processes for the cluster end-to-end tests: start, readiness, kill -9, and
//! small polling helpers. Shared by every `cluster*.rs` test file (`mod cluster_support;`).
#![allow(dead_code)] // each test file uses its own subset

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pico_client::{Client, ClientOptions};
use serde_json::Value;

pub use crate::pg::TestDb;
pub use s3stream::testing_s3::TestBucket;

pub const PICO: &str = env!("CARGO_BIN_EXE_pico");
/// Bounds every wait of these tests (none of them is a timing assertion).
pub const PATIENCE: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Nodes
// ---------------------------------------------------------------------------------------------

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One `pico serve` process of the cluster; SIGKILLed when dropped.
pub struct Node {
    pub id: u32,
    pub child: Option<Child>,
    pub port: u16,
    pub admin: u16,
    pub log: PathBuf,
}

impl Node {
    /// Starts node `id` on fresh ports and waits for `/ready`.
    pub fn start(id: u32, db: &TestDb, dir: &Path) -> Node {
        Node::start_with(id, db, dir, &[])
    }

    /// Like [`Node::start`], with extra `pico serve` arguments (not the store flags: `pico
    /// serve` refuses a repeated one).
    pub fn start_with(id: u32, db: &TestDb, dir: &Path, extra: &[&str]) -> Node {
        let args = with_extra(Layout::PgWal.args(db, dir), extra);
        Node::spawn_ready(id, dir, &args, &[])
    }

    /// `pico serve --node-id {id}` with `args` (stores included) and `envs` on fresh ports,
    /// its log in `dir`, once `/ready`.
    pub fn spawn_ready(id: u32, dir: &Path, args: &[String], envs: &[(String, String)]) -> Node {
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
            .args(args)
            .envs(envs.iter().map(|(k, v)| (k, v)))
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

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.endpoint())
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    pub fn wait_ready(&mut self) {
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
    pub fn ready(&self) -> Option<(u16, Value)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.admin)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        write!(s, "GET /ready HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        let code = buf.split_whitespace().nth(1)?.parse().ok()?;
        let body = buf.split_once("\r\n\r\n").map(|(_, b)| b)?;
        Some((code, serde_json::from_str(body).ok()?))
    }

    pub fn ready_field(&self, field: &str) -> Value {
        self.ready()
            .map(|(_, v)| v[field].clone())
            .unwrap_or(Value::Null)
    }

    /// The process id (for signals such as SIGSTOP/SIGCONT).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `sig` (`-TERM`, `-STOP`, `-CONT`) to the process.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("running").to_string();
        let status = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    }

    /// Waits (at most [`PATIENCE`]) for the process to exit by itself.
    pub fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        let mut child = self.child.take().expect("running");
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "node {} did not exit within {PATIENCE:?}; log:\n{}",
                    self.id,
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill9(&mut self) {
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
pub fn raw_http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

pub fn client(node: &Node) -> Client {
    Client::new(&node.endpoint(), ClientOptions::default()).unwrap()
}

pub fn location(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Waits until `cond` holds (polling), failing with `what` after [`PATIENCE`].
pub async fn eventually(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond().await {
        assert!(Instant::now() < deadline, "{what}: not within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// Stores: one Postgres database, and a data directory or an S3 bucket
// ---------------------------------------------------------------------------------------------

/// Where a test cluster keeps its WAL and data (metadata is always the test database).
pub enum Layout {
    /// WAL in Postgres, data in a `file://` directory.
    PgWal,
    /// WAL and data in an S3 bucket (objects under `wal/{node}/` and `data/`).
    S3(TestBucket),
}

impl Layout {
    /// The `pico serve` store flags of this layout.
    pub fn args(&self, db: &TestDb, dir: &Path) -> Vec<String> {
        let mut args = vec!["--meta-url".to_string(), db.url.clone()];
        match self {
            Layout::PgWal => {
                args.push(format!("--wal={}", db.url));
                args.push(format!("--storage=-2@file://{}/objects", dir.display()));
            }
            Layout::S3(b) => {
                args.push(format!("--storage=-2@s3://{}", b.uri_location("cluster")));
                args.push(format!("--wal=-3@s3://{}", b.uri_location("cluster-wal")));
            }
        }
        args
    }

    /// The environment a node needs for this layout (S3 credentials).
    pub fn envs(&self) -> Vec<(String, String)> {
        match self {
            Layout::PgWal => Vec::new(),
            Layout::S3(b) => vec![
                ("AWS_ACCESS_KEY_ID".into(), b.access_key.clone()),
                ("AWS_SECRET_ACCESS_KEY".into(), b.secret_key.clone()),
                ("AWS_REGION".into(), "us-east-1".into()),
            ],
        }
    }
}

/// A fresh database, a temporary directory (logs, `file://` data) and a layout: what every
/// node of one test shares.
pub struct Cluster {
    pub db: TestDb,
    pub dir: tempfile::TempDir,
    pub layout: Layout,
}

impl Cluster {
    /// WAL in Postgres, data on disk; `None` (skipped) without Postgres.
    pub async fn pg() -> Option<Cluster> {
        let db = TestDb::create().await?;
        Some(Cluster {
            db,
            dir: tempfile::tempdir().unwrap(),
            layout: Layout::PgWal,
        })
    }

    /// WAL and data on S3, metadata in Postgres; `None` (skipped) without either.
    pub async fn s3() -> Option<Cluster> {
        let bucket = TestBucket::create().await?;
        let db = TestDb::create().await?;
        Some(Cluster {
            db,
            dir: tempfile::tempdir().unwrap(),
            layout: Layout::S3(bucket),
        })
    }

    /// Node `id` of this cluster, once ready.
    pub fn start(&self, id: u32) -> Node {
        self.start_with(id, &[])
    }

    /// Like [`Cluster::start`], with extra `pico serve` arguments.
    pub fn start_with(&self, id: u32, extra: &[&str]) -> Node {
        let args = with_extra(self.layout.args(&self.db, self.dir.path()), extra);
        Node::spawn_ready(id, self.dir.path(), &args, &self.layout.envs())
    }
}

/// `args` and `extra`, with `--no-kafka` unless `extra` turns the Kafka listener on.
fn with_extra(mut args: Vec<String>, extra: &[&str]) -> Vec<String> {
    if !extra.iter().any(|a| a.starts_with("--kafka-listen")) {
        args.push("--no-kafka".into());
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

// ---------------------------------------------------------------------------------------------
// Records: what was acknowledged, and what reads back
// ---------------------------------------------------------------------------------------------

/// Every record of `name` read through `c`, as (offset, body).
pub async fn read_all(c: &Client, name: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut seq = 0;
    loop {
        let chunk = c.read(name, seq, None).await.unwrap();
        out.extend(
            chunk
                .records
                .iter()
                .map(|r| (r.seq, String::from_utf8_lossy(&r.body).to_string())),
        );
        if chunk.records.is_empty() || chunk.up_to_date {
            return out;
        }
        seq = chunk.next_seq;
    }
}

/// Checks that every acknowledged (offset, body) is in `records` at its offset, that no body
/// appears twice, and that offsets are dense from 0.
pub fn check_acked_once(records: &[(u64, String)], acked: &BTreeMap<u64, String>) {
    let at: BTreeMap<u64, &String> = records.iter().map(|(o, b)| (*o, b)).collect();
    for (offset, body) in acked {
        assert_eq!(
            at.get(offset).copied(),
            Some(body),
            "acknowledged record missing or moved: offset={offset}"
        );
    }
    let mut seen = BTreeSet::new();
    for (offset, body) in records {
        assert!(seen.insert(body), "duplicate record {body} at {offset}");
    }
    for (i, (offset, _)) in records.iter().enumerate() {
        assert_eq!(*offset, i as u64, "offsets not contiguous");
    }
}

/// Appends `{prefix}-{i}` for i in 0..n through `c`, recording each acknowledged offset.
pub async fn append_acked(
    c: &Client,
    name: &str,
    prefix: &str,
    n: usize,
    acked: &mut BTreeMap<u64, String>,
) {
    for i in 0..n {
        let body = format!("{prefix}-{i}");
        let ack = c.append(name, body.clone()).await.unwrap();
        acked.insert(ack.start_seq, body);
    }
}

/// Appends `{prefix}-{k}` through `c` until one is acknowledged (each try bounded, so a
/// redirect to a stopped node does not hang it), and records it.
pub async fn append_eventually(
    what: &str,
    c: &Client,
    name: &str,
    prefix: &str,
    acked: &mut BTreeMap<u64, String>,
) {
    let mut k = 0;
    eventually(what, async || {
        k += 1;
        let body = format!("{prefix}-{k}");
        let sent = tokio::time::timeout(Duration::from_secs(2), c.append(name, body.clone()));
        match sent.await {
            Ok(Ok(ack)) => {
                acked.insert(ack.start_seq, body);
                true
            }
            _ => false,
        }
    })
    .await;
}

/// The node holding the maintenance lease (`/ready`'s `maintenanceLease`), once exactly one
/// of `nodes` does.
pub async fn lease_holder(nodes: &[&Node]) -> u32 {
    let mut found = 0;
    eventually("one lease holder", async || {
        let h: Vec<u32> = nodes
            .iter()
            .filter(|n| n.ready_field("maintenanceLease") == Value::Bool(true))
            .map(|n| n.id)
            .collect();
        if h.len() == 1 {
            found = h[0];
        }
        h.len() == 1
    })
    .await;
    found
}

/// Waits until `node` is ready again at a node epoch above `epoch_before + 1` (the fence's
/// placeholder): it rejoined as a new incarnation.
pub async fn rejoined(node: &Node, epoch_before: u64) {
    eventually("the node rejoined with a new epoch", async || {
        node.ready().is_some_and(|(code, v)| {
            code == 200
                && v["nodeEpoch"]
                    .as_u64()
                    .is_some_and(|e| e > epoch_before + 1)
        })
    })
    .await;
}
