//! End to end on object storage: the real `pico` binary with its data and its WAL on S3 (the
//! server of `PICO_TEST_S3_ENDPOINT`, a fresh bucket per test) and its metadata in Postgres (a
//! fresh database), so the node keeps nothing on its disk: kill -9 it, delete its working
//! directory, start it on other ports, and every acknowledged record is there, once, at its
//! offset. Without either server the test is skipped loudly (failed under
//! `PICO_TEST_REQUIRE_ALL=1`).

#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod pg;

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pico_client::{Client, ClientOptions};
use s3stream::testing_s3::TestBucket;

const PICO: &str = env!("CARGO_BIN_EXE_pico");
const READY_TIMEOUT: Duration = Duration::from_secs(60);

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running `pico serve`; killed (SIGKILL) when dropped.
struct Server {
    child: Option<Child>,
    port: u16,
    admin: u16,
    log: PathBuf,
}

impl Server {
    /// `pico serve` in `workdir` (its current directory) with `args`, once `/ready`.
    fn start(workdir: &Path, log_dir: &Path, bucket: &TestBucket, args: &[String]) -> Server {
        let port = free_port();
        let admin = free_port();
        let log = log_dir.join(format!("server-{port}.log"));
        let mut cmd = Command::new(PICO);
        for (k, _) in std::env::vars() {
            if k.starts_with("PICO_") {
                cmd.env_remove(k);
            }
        }
        let child = cmd
            .current_dir(workdir)
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin}"))
            .arg("--no-kafka")
            .args(args)
            // The node's credentials come from the standard AWS environment.
            .env("AWS_ACCESS_KEY_ID", &bucket.access_key)
            .env("AWS_SECRET_ACCESS_KEY", &bucket.secret_key)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn pico serve");
        let mut server = Server {
            child: Some(child),
            port,
            admin,
            log,
        };
        server.wait_ready();
        server
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "pico serve exited with {status} before answering /ready; log:\n{}",
                    self.log_tail()
                );
            }
            if admin_status(self.admin, "/ready") == Some(200) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "pico serve did not answer /ready within {READY_TIMEOUT:?}; log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// The status of a bare HTTP/1.0 GET on the admin port, or None if it cannot connect.
fn admin_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

/// Appends from several writers at once until at least `min_acks` were acknowledged, then
/// kills the node with appends in flight; returns the acknowledged (offset, body) pairs.
async fn append_then_kill9(
    server: &mut Server,
    stream: &str,
    min_acks: usize,
) -> Vec<(u64, String)> {
    const WRITERS: usize = 8;
    let client = Client::new(&server.endpoint(), ClientOptions::default()).unwrap();
    client.create(stream, None, None).await.unwrap();
    let acked: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        let acked = acked.clone();
        let stream = stream.to_string();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                // Some records large enough that data objects get written before the kill.
                let pad = if i % 16 == 0 { 64 << 10 } else { 100 };
                let body = format!("w{w}-{i}-{}", "x".repeat(pad));
                match client.append(&stream, body.clone()).await {
                    Ok(ack) => {
                        assert_eq!(ack.next_seq, ack.start_seq + 1, "one record per append");
                        acked.lock().unwrap().push((ack.start_seq, body));
                    }
                    Err(_) => return, // the server is gone
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked.lock().unwrap().len() < min_acks {
        assert!(
            Instant::now() < deadline,
            "appends too slow before the kill; log:\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    server.kill9();
    for w in writers {
        tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("writer hung")
            .unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(acked.len() >= min_acks);
    acked
}

/// Reads `stream` from the start and checks every acknowledged record is there, at its offset,
/// once; returns how many records there are.
async fn check_all_there(server: &Server, stream: &str, acked: &[(u64, String)]) -> usize {
    let client = Client::new(&server.endpoint(), ClientOptions::default()).unwrap();
    let mut records = Vec::new();
    let mut seq = 0;
    loop {
        let chunk = client.read(stream, seq, None).await.unwrap();
        records.extend(chunk.records.iter().cloned());
        if chunk.up_to_date || chunk.records.is_empty() {
            break;
        }
        seq = chunk.next_seq;
    }
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.seq, i as u64, "offsets must be consecutive from 0");
    }
    let mut bodies = HashSet::new();
    for r in &records {
        let body = String::from_utf8(r.body.to_vec()).unwrap();
        assert!(bodies.insert(body), "a record is there twice");
    }
    let by_seq: BTreeMap<u64, &[u8]> = records.iter().map(|r| (r.seq, &r.body[..])).collect();
    for (seq, body) in acked {
        assert!(
            by_seq.get(seq).copied() == Some(body.as_bytes()),
            "acknowledged record lost or moved: seq={seq} (read {} records, {} acked); log:\n{}",
            records.len(),
            acked.len(),
            server.log_tail()
        );
    }
    records.len()
}

/// Data and WAL on S3 (`wal` None: the default, the data bucket with id − 1), metadata in
/// Postgres: crash, lose the disk, restart elsewhere.
async fn node_keeps_nothing_on_disk(wal: Option<&str>) {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let Some(db) = pg::TestDb::create().await else {
        return;
    };
    let logs = tempfile::Builder::new()
        .prefix("pico-s3-e2e-logs-")
        .tempdir()
        .unwrap();
    let mut args = vec![
        "--meta-url".to_string(),
        db.url.clone(),
        format!("--storage=-2@s3://{}", bucket.uri_location("cluster")),
    ];
    if let Some(wal) = wal {
        args.push(format!("--wal=-3@s3://{}", bucket.uri_location(wal)));
    }
    let work = tempfile::Builder::new()
        .prefix("pico-s3-e2e-")
        .tempdir()
        .unwrap();
    let mut server = Server::start(work.path(), logs.path(), &bucket, &args);
    let acked = append_then_kill9(&mut server, "zero/disk", 300).await;
    // Nothing the node kept locally may matter.
    let first_dir = work.path().to_path_buf();
    drop(work);
    assert!(!first_dir.exists());

    let objects = bucket.storage().await;
    let keys = s3stream::ObjectStorage::list(&objects, "").await.unwrap();
    let wal_prefix = format!("{}/wal/1/", wal.unwrap_or("cluster"));
    assert!(
        keys.iter().any(|k| k.starts_with(&wal_prefix)),
        "no WAL entry under {wal_prefix}: {:?}",
        &keys[..keys.len().min(20)]
    );

    let work = tempfile::Builder::new()
        .prefix("pico-s3-e2e-")
        .tempdir()
        .unwrap();
    let server = Server::start(work.path(), logs.path(), &bucket, &args);
    let n = check_all_there(&server, "zero/disk", &acked).await;
    assert!(n >= acked.len());
    assert!(
        keys.iter().any(|k| k.starts_with("cluster/data/")) || {
            let after = s3stream::ObjectStorage::list(&objects, "cluster/data/")
                .await
                .unwrap();
            !after.is_empty()
        },
        "no data object was ever written to S3"
    );
    eprintln!(
        "s3 e2e (wal {:?}): {} acknowledged, {n} recovered",
        wal,
        acked.len()
    );
    drop(server);
    bucket.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_on_s3_with_its_own_wal_bucket_survives_losing_its_disk() {
    node_keeps_nothing_on_disk(Some("wal-area")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_on_s3_with_the_default_wal_survives_losing_its_disk() {
    node_keeps_nothing_on_disk(None).await;
}
