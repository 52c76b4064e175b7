//! Real `pico serve` processes for the cluster end-to-end tests: start, readiness, kill -9, and
//! small polling helpers. Shared by every `cluster*.rs` test file (`mod cluster_support;`).
#![allow(dead_code)] // each test file uses its own subset

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use pico_client::{Client, ClientOptions};
use serde_json::Value;

pub use crate::pg::TestDb;

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

    /// Like [`Node::start`], with extra `pico serve` arguments (later flags win).
    pub fn start_with(id: u32, db: &TestDb, dir: &Path, extra: &[&str]) -> Node {
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
            .args(extra)
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
