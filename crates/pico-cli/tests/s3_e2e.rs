//! End to end on object storage: the real `pico` binary with its data on S3 (the server of
//! `PICO_TEST_S3_ENDPOINT`, a fresh bucket per test), its WAL on S3 or in Postgres, and its
//! metadata in Postgres (a fresh database), so the node keeps nothing on its disk: kill -9 it,
//! delete its working directory, start it on other ports, and every acknowledged record is
//! there, once, at its offset; idle, it sends the object store nothing. Also, through a TCP
//! proxy in front of Postgres: a node started before its database waits for it (`/ready` 503,
//! no exit), and appends during a Postgres restart fail with 503 + `Retry-After` or succeed,
//! never lose an acknowledged record. Without a server a test needs, it is skipped loudly
//! (failed under `PICO_TEST_REQUIRE_ALL=1`).

#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod pg;
#[path = "../../pico-sql/tests/common/proxy.rs"]
mod proxy;

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
    fn start(
        workdir: &Path,
        log_dir: &Path,
        bucket: Option<&TestBucket>,
        args: &[String],
    ) -> Server {
        let mut server = Server::spawn(workdir, log_dir, bucket, args);
        server.wait_ready();
        server
    }

    /// `pico serve` started, not waited for.
    fn spawn(
        workdir: &Path,
        log_dir: &Path,
        bucket: Option<&TestBucket>,
        args: &[String],
    ) -> Server {
        let port = free_port();
        let admin = free_port();
        let log = log_dir.join(format!("server-{port}.log"));
        let mut cmd = Command::new(PICO);
        for (k, _) in std::env::vars() {
            if k.starts_with("PICO_") {
                cmd.env_remove(k);
            }
        }
        // The node's credentials come from the standard AWS environment.
        if let Some(b) = bucket {
            cmd.env("AWS_ACCESS_KEY_ID", &b.access_key)
                .env("AWS_SECRET_ACCESS_KEY", &b.secret_key);
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
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn pico serve");
        Server {
            child: Some(child),
            port,
            admin,
            log,
        }
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
    let mut server = Server::start(work.path(), logs.path(), Some(&bucket), &args);
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
    let server = Server::start(work.path(), logs.path(), Some(&bucket), &args);
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

/// Status and body of a bare HTTP/1.0 GET on `port`, or None if it cannot connect.
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Some((status, body))
}

/// A TCP relay in front of the S3 server that counts what the node sends it: the bytes, and
/// the requests (HTTP/1.1 request lines; no record body here contains one).
struct CountingRelay {
    endpoint: String,
    bytes: Arc<std::sync::atomic::AtomicU64>,
    requests: Arc<std::sync::atomic::AtomicU64>,
}

impl CountingRelay {
    async fn start(upstream: &str) -> CountingRelay {
        use std::sync::atomic::{AtomicU64, Ordering};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let upstream = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let bytes = Arc::new(AtomicU64::new(0));
        let requests = Arc::new(AtomicU64::new(0));
        let (b, r) = (bytes.clone(), requests.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (b, r) = (b.clone(), r.clone());
                tokio::spawn(async move {
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = async move {
                        let mut buf = vec![0u8; 64 << 10];
                        // The tail of the previous read: a request line split across reads.
                        let mut carry: Vec<u8> = Vec::new();
                        loop {
                            let n = match cr.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            b.fetch_add(n as u64, Ordering::SeqCst);
                            carry.extend_from_slice(&buf[..n]);
                            let pat = b" HTTP/1.1\r\n";
                            let hits = carry.windows(pat.len()).filter(|w| w == pat).count();
                            r.fetch_add(hits as u64, Ordering::SeqCst);
                            let keep = carry.len().min(pat.len() - 1);
                            carry.drain(..carry.len() - keep);
                            if sw.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    let down = async move {
                        let _ = tokio::io::copy(&mut sr, &mut cw).await;
                    };
                    tokio::select! { _ = up => {}, _ = down => {} }
                });
            }
        });
        CountingRelay {
            endpoint,
            bytes,
            requests,
        }
    }

    fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering;
        (
            self.requests.load(Ordering::SeqCst),
            self.bytes.load(Ordering::SeqCst),
        )
    }
}

/// Rows of `pico_wal` in the database at `url`.
async fn pg_wal_rows(url: &str) -> i64 {
    use sqlx::Connection;
    let mut c = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query_scalar("SELECT COUNT(*) FROM pico_wal")
        .fetch_one(&mut c)
        .await
        .unwrap()
}

/// The zero-disk configuration of the issue: metadata and WAL in Postgres, data on S3. Crash,
/// lose the disk, restart on other ports: every acknowledged record is there once at its
/// offset. Then, idle, the node sends the object store nothing (counted at a relay in front
/// of it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_with_its_wal_in_postgres_survives_losing_its_disk_and_idles_silently() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let Some(db) = pg::TestDb::create().await else {
        return;
    };
    let relay = CountingRelay::start(&bucket.endpoint).await;
    let logs = tempfile::Builder::new()
        .prefix("pico-pg-e2e-logs-")
        .tempdir()
        .unwrap();
    let data = bucket
        .uri_location("cluster")
        .replace(&bucket.endpoint, &relay.endpoint);
    let args = vec![
        "--meta-url".to_string(),
        db.url.clone(),
        format!("--storage=-2@s3://{data}"),
        "--wal".to_string(),
        db.url.clone(),
    ];
    let work = tempfile::Builder::new()
        .prefix("pico-pg-e2e-")
        .tempdir()
        .unwrap();
    let mut server = Server::start(work.path(), logs.path(), Some(&bucket), &args);
    let acked = append_then_kill9(&mut server, "zero/pg", 300).await;
    let first_dir = work.path().to_path_buf();
    drop(work);
    assert!(!first_dir.exists());
    // The WAL is in Postgres, not on S3.
    let objects = bucket.storage().await;
    let keys = s3stream::ObjectStorage::list(&objects, "").await.unwrap();
    assert!(
        !keys.iter().any(|k| k.contains("/wal/")),
        "WAL objects on S3 with the WAL in Postgres: {:?}",
        &keys[..keys.len().min(20)]
    );
    let rows = pg_wal_rows(&db.url).await;
    eprintln!(
        "pg e2e: {} acknowledged, {rows} WAL rows left in Postgres at the kill",
        acked.len()
    );

    let work = tempfile::Builder::new()
        .prefix("pico-pg-e2e-")
        .tempdir()
        .unwrap();
    let server = Server::start(work.path(), logs.path(), Some(&bucket), &args);
    let n = check_all_there(&server, "zero/pg", &acked).await;
    assert!(n >= acked.len());

    // Idle: wait for the recovered data's upload and the start-up passes to finish (3 s
    // without a request, within 90 s), then count for 15 s, longer than any periodic pass
    // of the node but the hourly ones.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = relay.counts();
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(3) {
        assert!(
            Instant::now() < deadline,
            "the node never went quiet toward S3: {last:?} (requests, bytes); log:\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = relay.counts();
        if now != last {
            last = now;
            quiet_since = Instant::now();
        }
    }
    let before = relay.counts();
    tokio::time::sleep(Duration::from_secs(15)).await;
    let after = relay.counts();
    assert!(before.0 > 0, "no request ever went through the relay");
    assert_eq!(
        after,
        before,
        "an idle node sent the object store {} requests ({} bytes) in 15 s",
        after.0 - before.0,
        after.1 - before.1
    );
    eprintln!(
        "pg e2e: {n} recovered; idle 15 s: 0 S3 requests ({} before)",
        before.0
    );
    drop(server);
    bucket.destroy().await;
}

/// A node whose Postgres is not there yet (the proxy closes every connection) stays up,
/// answers `/health` 200 and `/ready` 503, logs its wait a bounded number of times, and
/// comes up by itself once Postgres answers; one still waiting stops cleanly on SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_started_before_postgres_waits_for_it() {
    let Some(db) = pg::TestDb::create().await else {
        return;
    };
    let pg = proxy::PgProxy::start(&db.url).await;
    pg.cut();
    let url = pg.url(&db.url);
    let dir = tempfile::Builder::new()
        .prefix("pico-pg-wait-")
        .tempdir()
        .unwrap();
    let args = vec![
        "--meta-url".to_string(),
        url.clone(),
        "--wal".to_string(),
        url.clone(),
        format!("--storage=-2@file://{}/objects", dir.path().display()),
    ];
    let mut server = Server::spawn(dir.path(), dir.path(), None, &args);
    // Waiting, for 4 s: alive, healthy, not ready.
    let until = Instant::now() + Duration::from_secs(4);
    let mut saw_waiting = false;
    while Instant::now() < until {
        if let Some(status) = server.child.as_mut().unwrap().try_wait().unwrap() {
            panic!(
                "exited with {status} while Postgres was away; log:\n{}",
                server.log_tail()
            );
        }
        if let Some((status, body)) = http_get(server.admin, "/ready") {
            assert_eq!(status, 503, "ready without Postgres: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(v["starting"], true, "{body}");
            assert_eq!(v["waitingFor"], "metadata store", "{body}");
            assert_eq!(http_get(server.admin, "/health").map(|r| r.0), Some(200));
            saw_waiting = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        saw_waiting,
        "the admin listener never answered while waiting"
    );
    let log = std::fs::read_to_string(&server.log).unwrap();
    let lines = log.matches("unreachable at start").count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} wait lines in 4 s (want the first, then one per 30 s); log:\n{log}"
    );

    pg.resume();
    server.wait_ready();
    let client = Client::new(&server.endpoint(), ClientOptions::default()).unwrap();
    client.create("waited/for/pg", None, None).await.unwrap();
    let ack = client.append("waited/for/pg", "hello").await.unwrap();
    assert_eq!(ack.start_seq, 0);
    let log = std::fs::read_to_string(&server.log).unwrap();
    assert!(log.contains("reachable; starting"), "log:\n{log}");
    drop(server);

    // Shut down while waiting: a clean exit, not a crash.
    pg.cut();
    let mut waiting = Server::spawn(dir.path(), dir.path(), None, &args);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(waiting.admin, "/ready").map(|r| r.0) != Some(503) {
        assert!(Instant::now() < deadline, "log:\n{}", waiting.log_tail());
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut child = waiting.child.take().unwrap();
    let killed = Command::new("kill")
        .arg("-TERM")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "SIGTERM while waiting did not stop the node"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "exit after SIGTERM while waiting: {status}"
    );
}

/// What the writers saw while Postgres restarted under them.
#[derive(Default)]
struct Seen {
    acked: Vec<(u64, String)>,
    unavailable: usize,
    /// Anything but an ack or a 503 with `Retry-After`.
    unexpected: Vec<String>,
}

/// Postgres restarted mid-load (the proxy in front of it closes every connection for 3 s,
/// metadata and WAL alike): each append is acknowledged or answered 503 with `Retry-After`,
/// appends resume by themselves, and after a kill -9 and a restart every acknowledged record
/// is there, once, at its offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn appends_ride_out_a_postgres_restart_mid_load() {
    const WRITERS: usize = 4;
    let Some(db) = pg::TestDb::create().await else {
        return;
    };
    let pg = proxy::PgProxy::start(&db.url).await;
    let url = pg.url(&db.url);
    let dir = tempfile::Builder::new()
        .prefix("pico-pg-restart-")
        .tempdir()
        .unwrap();
    let storage = format!("--storage=-2@file://{}/objects", dir.path().display());
    let via_proxy = vec![
        "--meta-url".to_string(),
        url.clone(),
        "--wal".to_string(),
        url.clone(),
        storage.clone(),
    ];
    let mut server = Server::start(dir.path(), dir.path(), None, &via_proxy);
    let client = Client::new(&server.endpoint(), ClientOptions::default()).unwrap();
    client.create("pg/restart", None, None).await.unwrap();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let target = format!("{}/pg/restart", server.endpoint());
    let seen: Arc<Mutex<Seen>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let (http, target, seen, stop) = (http.clone(), target.clone(), seen.clone(), stop.clone());
        writers.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                i += 1;
                let body = format!("w{w}-{i}");
                let outcome = http.post(&target).body(body.clone()).send().await;
                let mut failed = false;
                match outcome {
                    Ok(r) if r.status().is_success() => {
                        let h =
                            |n: &str| -> u64 { r.headers()[n].to_str().unwrap().parse().unwrap() };
                        let (start, next) = (h("pico-start-seq"), h("pico-next-seq"));
                        assert_eq!(next, start + 1);
                        seen.lock().unwrap().acked.push((start, body));
                    }
                    Ok(r) if r.status() == 503 && r.headers().contains_key("retry-after") => {
                        seen.lock().unwrap().unavailable += 1;
                        failed = true;
                    }
                    Ok(r) => {
                        let status = r.status();
                        let text = r.text().await.unwrap_or_default();
                        seen.lock()
                            .unwrap()
                            .unexpected
                            .push(format!("{status}: {text}"));
                        failed = true;
                    }
                    Err(e) => {
                        seen.lock()
                            .unwrap()
                            .unexpected
                            .push(format!("transport: {e}"));
                        failed = true;
                    }
                }
                if failed {
                    // A client honouring Retry-After would wait longer; this keeps the test short.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }));
    }
    let acks = |n: usize| {
        let seen = seen.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            while seen.lock().unwrap().acked.len() < n {
                assert!(Instant::now() < deadline, "appends stalled below {n} acks");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    acks(100).await;
    pg.cut();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during = seen.lock().unwrap().acked.len();
    pg.resume();
    acks(during + 200).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for w in writers {
        tokio::time::timeout(Duration::from_secs(90), w)
            .await
            .expect("writer hung")
            .unwrap();
    }
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    assert!(
        seen.unexpected.is_empty(),
        "answers other than an ack or 503 + Retry-After: {:?}; log:\n{}",
        &seen.unexpected[..seen.unexpected.len().min(10)],
        server.log_tail()
    );
    assert!(
        seen.unavailable > 0,
        "no append failed while Postgres was away: the cut did not bite"
    );
    check_all_there(&server, "pg/restart", &seen.acked).await;

    // Everything acknowledged is durable: kill -9, restart on the database itself.
    server.kill9();
    let direct = vec![
        "--meta-url".to_string(),
        db.url.clone(),
        "--wal".to_string(),
        db.url.clone(),
        storage,
    ];
    let server = Server::start(dir.path(), dir.path(), None, &direct);
    let n = check_all_there(&server, "pg/restart", &seen.acked).await;
    eprintln!(
        "pg restart: {} acknowledged, {} answered 503 + Retry-After, {n} read back",
        seen.acked.len(),
        seen.unavailable
    );
}
