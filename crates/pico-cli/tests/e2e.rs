//! End-to-end tests: the real `pico` binary started with `serve` on free ports (SQLite metadata
//! and file storage in a temp dir), driven through the CLI and over raw HTTP.
//!
//! Every test that needs a server has `server` in its name; if `pico serve` cannot start or
//! never answers `/ready`, the failure says so and shows the server's log.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use pico_client::{Client, ClientOptions};
use pico_protocol::Record;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const PICO: &str = env!("CARGO_BIN_EXE_pico");
const READY_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `Command` for the binary with no ambient `PICO_*` configuration leaking in.
fn pico_command() -> Command {
    let mut cmd = Command::new(PICO);
    for (k, _) in std::env::vars() {
        if k.starts_with("PICO_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A running `pico serve`; killed (SIGKILL) when dropped.
struct Server {
    child: Option<Child>,
    port: u16,
    admin: u16,
    log: PathBuf,
}

impl Server {
    /// Starts `pico serve` with its state under `dir` and waits for `/ready`.
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let port = free_port();
        let admin = free_port();
        let log = dir.join(format!("server-{port}.log"));
        let log_file = std::fs::File::create(&log).unwrap();
        let child = pico_command()
            .arg("serve")
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin}"))
            .arg("--meta-url")
            .arg(format!("sqlite:{}/meta.db", dir.display()))
            .args(
                (!extra.iter().any(|a| a.starts_with("--storage")))
                    .then(|| format!("--storage=-2@file://{}/objects", dir.display())),
            )
            .arg("--no-kafka")
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
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

    fn url(&self, path_and_query: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path_and_query)
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Polls the admin listener's `/ready` (plain HTTP/1.0 over a std socket) until 200.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "pico serve exited with {status} before answering /ready (this test needs a \
                     working `pico serve`); log:\n{}",
                    self.log_tail()
                );
            }
            if admin_get(self.admin, "/ready").is_some_and(|(code, _)| code == 200) {
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "pico serve did not answer /ready within {READY_TIMEOUT:?} (this test needs a \
                     working `pico serve`); log:\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The process is alive and the admin listener says healthy.
    fn assert_alive(&mut self) {
        assert!(
            self.child.as_mut().unwrap().try_wait().unwrap().is_none(),
            "pico serve died; log:\n{}",
            self.log_tail()
        );
        let health = admin_get(self.admin, "/health");
        assert!(
            health.as_ref().is_some_and(|(code, _)| *code == 200),
            "/health did not answer 200: {health:?}; log:\n{}",
            self.log_tail()
        );
    }

    /// `kill -9`: no shutdown path runs.
    fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A bare HTTP/1.0 GET on the admin port: `(status, body)`, or None if it cannot connect.
fn admin_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let code = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((code, body))
}

/// Runs `pico <args>` against `server`, feeding `stdin`.
fn pico(server: &Server, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = pico_command()
        .args(args)
        .arg("--endpoint")
        .arg(server.endpoint())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn pico");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    // Write from a thread: a large stdin must not deadlock against a full stdout pipe.
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

/// Runs `pico <args>` and asserts success; returns stdout.
fn pico_ok(server: &Server, args: &[&str], stdin: &[u8]) -> (String, String) {
    let out = pico(server, args, stdin);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "pico {args:?} failed: {}\nstderr: {stderr}",
        out.status
    );
    (stdout, stderr)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

fn header<'a>(resp: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

fn header_u64(resp: &reqwest::Response, name: &str) -> u64 {
    header(resp, name)
        .unwrap_or_else(|| panic!("missing header {name}: {:?}", resp.headers()))
        .parse()
        .unwrap_or_else(|_| panic!("header {name} is not a number: {:?}", resp.headers()))
}

/// Asserts a JSON error response with `status` and returns its `error` code.
async fn expect_error(resp: reqwest::Response, status: u16, what: &str) -> String {
    let got = resp.status().as_u16();
    let body = resp.text().await.unwrap();
    assert_eq!(got, status, "{what}: wrong status; body: {body}");
    let v: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e}): {body}"));
    let code = v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{what}: no `error` code: {body}"));
    assert!(v["message"].is_string(), "{what}: no `message`: {body}");
    code.to_string()
}

fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("pico-e2e-")
        .tempdir()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// 1. The seed walkthrough through the CLI
// ---------------------------------------------------------------------------------------------

#[test]
fn server_walkthrough_via_cli() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &[]);

    // pico create /streams/orders --content-type text/plain
    let (_, err) = pico_ok(
        &server,
        &["create", "/streams/orders", "--content-type", "text/plain"],
        b"",
    );
    assert!(
        err.contains("created /streams/orders"),
        "create note: {err}"
    );
    let (_, err) = pico_ok(
        &server,
        &["create", "/streams/orders", "--content-type", "text/plain"],
        b"",
    );
    assert!(
        err.contains("exists /streams/orders"),
        "second create note: {err}"
    );

    // seq 1 1000 | pico append /streams/orders --batch 100
    let input: String = (1..=1000).map(|i| format!("{i}\n")).collect();
    let (_, err) = pico_ok(
        &server,
        &["append", "/streams/orders", "--batch", "100"],
        input.as_bytes(),
    );
    assert!(
        err.contains("1000 records") && err.contains("next seq 1000"),
        "append note: {err}"
    );

    // pico read /streams/orders
    let (out, _) = pico_ok(&server, &["read", "/streams/orders"], b"");
    let expected: Vec<String> = (1..=1000).map(|i| i.to_string()).collect();
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        expected,
        "read must print 1..1000 in order"
    );

    let (out, _) = pico_ok(&server, &["read", "/streams/orders", "--from", "998"], b"");
    assert_eq!(out, "999\n1000\n");
    let (out, _) = pico_ok(&server, &["head", "/streams/orders"], b"");
    assert_eq!(out.trim(), "start=0 next=1000 closed=false type=text/plain");
    let (out, _) = pico_ok(&server, &["ls", "--prefix", "streams/"], b"");
    assert_eq!(out.lines().collect::<Vec<_>>(), vec!["streams/orders"]);

    // pico tail /streams/orders -f: a follower started now sees records appended later.
    let mut tail = pico_command()
        .args([
            "tail",
            "/streams/orders",
            "-f",
            "--endpoint",
            &server.endpoint(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = tail.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // The follower may still be starting: append until it shows the first live record, then
    // require every later record, in order and without gaps.
    let mut seen = Vec::new();
    let mut appended = Vec::new();
    for i in 0..40 {
        let body = format!("live-{i}");
        pico_ok(
            &server,
            &["append", "/streams/orders"],
            format!("{body}\n").as_bytes(),
        );
        appended.push(body);
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            seen.push(line);
            break;
        }
    }
    assert!(
        !seen.is_empty(),
        "tail -f printed nothing while 40 records were appended"
    );
    let finals: Vec<String> = (1..=3).map(|i| format!("final-{i}")).collect();
    let final_input: String = finals.iter().map(|f| format!("{f}\n")).collect();
    pico_ok(
        &server,
        &["append", "/streams/orders", "--batch", "2"],
        final_input.as_bytes(),
    );
    appended.extend(finals.iter().cloned());
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.last() != finals.last() {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("tail -f did not print the new records; got {seen:?}"),
        }
    }
    let first = appended
        .iter()
        .position(|a| *a == seen[0])
        .expect("tail printed an old record");
    assert_eq!(
        seen,
        appended[first..],
        "tail -f must print new records in order, no gaps"
    );

    // pico close /streams/orders && pico delete /streams/orders
    let (_, err) = pico_ok(&server, &["close", "/streams/orders"], b"");
    assert!(err.contains("closed /streams/orders"), "close note: {err}");
    // The follower ends when the stream closes.
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = tail.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = tail.kill();
            panic!("tail -f kept running after the stream was closed");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        status.success(),
        "tail -f exit status after close: {status}"
    );
    reader.join().unwrap();
    let (out, _) = pico_ok(&server, &["head", "/streams/orders"], b"");
    assert!(out.contains("closed=true"), "head after close: {out}");
    let out = pico(&server, &["append", "/streams/orders"], b"late\n");
    assert!(!out.status.success(), "append to a closed stream must fail");

    let (_, err) = pico_ok(&server, &["delete", "/streams/orders"], b"");
    assert!(
        err.contains("deleted /streams/orders"),
        "delete note: {err}"
    );
    let out = pico(&server, &["head", "/streams/orders"], b"");
    assert_eq!(out.status.code(), Some(1), "head after delete must exit 1");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not found") && err.lines().count() == 1,
        "one-line error: {err}"
    );
}

#[test]
fn server_cli_trim_ls_and_json_format() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &[]);
    for name in ["/cli/a", "/cli/b", "/cli/c", "/elsewhere"] {
        pico_ok(&server, &["create", name], b"");
    }
    let (out, _) = pico_ok(&server, &["ls", "--prefix", "/cli/"], b"");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        vec!["cli/a", "cli/b", "cli/c"]
    );

    // Single-record appends (the default batch of 1), including an empty line.
    pico_ok(
        &server,
        &["append", "/cli/a"],
        b"zero\none\n\nthree\nfour\n",
    );
    let (out, _) = pico_ok(&server, &["read", "/cli/a", "--format", "json"], b"");
    let recs: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let bodies: Vec<&str> = recs.iter().map(|r| r["body"].as_str().unwrap()).collect();
    assert_eq!(bodies, vec!["zero", "one", "", "three", "four"]);
    let seqs: Vec<u64> = recs.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![0, 1, 2, 3, 4]);

    let (_, err) = pico_ok(&server, &["trim", "/cli/a", "--seq", "3"], b"");
    assert!(err.contains("start seq 3"), "trim note: {err}");
    let (out, _) = pico_ok(&server, &["head", "/cli/a"], b"");
    assert!(out.starts_with("start=3 next=5 "), "head after trim: {out}");
    let (out, _) = pico_ok(&server, &["tail", "/cli/a", "-n", "2"], b"");
    assert_eq!(out, "three\nfour\n");
    let (out, _) = pico_ok(&server, &["tail", "/cli/a"], b"");
    assert_eq!(out, "", "tail without -n starts at the tail");
    // Without --from, read starts at the first record left, not at the trimmed-away 0.
    let (out, _) = pico_ok(&server, &["read", "/cli/a"], b"");
    assert_eq!(out, "three\nfour\n");

    // Batches the server must refuse are refused before anything is sent: more records than
    // one append takes, or a line longer than one request.
    let out = pico(&server, &["append", "/cli/b", "--batch", "10001"], b"x\n");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let long = vec![b'a'; (32 << 20) + 1];
    let out = pico(&server, &["append", "/cli/b", "--batch", "10"], &long);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("longer than 32 MiB"), "{err}");
    // Full batches of long lines are split by size: 9,000 lines of 4,000 bytes (36 MB, more
    // than one request may carry) all land.
    let mut input = Vec::new();
    for _ in 0..9000 {
        input.extend_from_slice(&[b'y'; 4000]);
        input.push(b'\n');
    }
    pico_ok(&server, &["append", "/cli/b", "--batch", "10000"], &input);
    let (out, _) = pico_ok(&server, &["head", "/cli/b"], b"");
    assert!(out.starts_with("start=0 next=9000 "), "{out}");

    let out = pico(&server, &["read", "/missing"], b"");
    assert_eq!(out.status.code(), Some(1));
    let out = pico(&server, &["delete", "/missing"], b"");
    assert_eq!(out.status.code(), Some(1));
}

/// One sample's value in Prometheus text (`name` with its labels, exactly as rendered).
fn prom_value(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Polls `/metrics` until `ready` holds for the page, and returns it; panics with `what`, the
/// page and the server's log after 20 s.
async fn await_metrics(server: &Server, what: &str, ready: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, text) = admin_get(server.admin, "/metrics").expect("admin listener answers");
        assert_eq!(code, 200, "{text}");
        if ready(&text) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "not in 20 s: {what}\n{text}\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls `/metrics` until `name` reads `want`.
async fn await_metric(server: &Server, name: &str, want: f64) -> String {
    await_metrics(server, &format!("{name} = {want}"), |t| {
        prom_value(t, name) == Some(want)
    })
    .await
}

#[tokio::test]
async fn server_metrics_report_the_wal_and_the_uploads() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &[]);
    let c = http();
    let r = c.put(server.url("/metrics/s")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    const APPENDS: usize = 20;
    for i in 0..APPENDS {
        let r = c
            .post(server.url("/metrics/s"))
            .body(format!("record {i}"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "append {i}: {}", r.status());
    }
    // Objects are put on the upload interval (1 s): wait for the first one to be counted.
    let text = await_metrics(&server, "an upload counted", |t| {
        prom_value(t, "pico_object_uploads_total").is_some_and(|v| v >= 1.0)
    })
    .await;
    let v = |name: &str| {
        prom_value(&text, name).unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
    };
    assert_eq!(v("pico_streams"), 1.0);
    assert!(v("pico_appends_total") >= APPENDS as f64);
    // Every acknowledged append went through a group commit: a write and an fdatasync each.
    let commits = v("pico_wal_commits_total");
    assert!(commits >= 1.0 && commits <= APPENDS as f64, "{commits}");
    assert_eq!(v("pico_wal_commit_seconds_count"), commits);
    // A trim after an upload that removes no segment syncs one more write, to record its
    // watermark on disk: at most one per upload.
    let syncs = v("pico_wal_sync_seconds_count");
    assert!(
        syncs >= commits && syncs <= commits + v("pico_object_uploads_total"),
        "{syncs} syncs for {commits} commits"
    );
    assert_eq!(v("pico_wal_group_appends_sum"), v("pico_appends_total"));
    assert!(v("pico_wal_group_bytes_sum") >= (APPENDS * "record 0".len()) as f64);
    assert!(v("pico_wal_sync_seconds{quantile=\"0.5\"}") > 0.0);
    assert!(v("pico_object_put_seconds_count") >= 1.0);
    assert!(v("pico_object_put_bytes_sum") > 0.0);
    assert!(
        text.contains("# TYPE pico_wal_sync_seconds summary"),
        "{text}"
    );
}

/// Opens an SSE response at `url`, checks `pico_http_sse_streams{protocol}` reads 1 while it is
/// open and 0 once the client drops it.
async fn sse_counted_while_open(c: &reqwest::Client, server: &Server, url: &str, protocol: &str) {
    let gauge = format!("pico_http_sse_streams{{protocol=\"{protocol}\"}}");
    let mut sse = c.get(url).send().await.unwrap();
    assert_eq!(sse.status(), StatusCode::OK, "{url}");
    let first = sse.chunk().await.unwrap().expect("the first events");
    assert!(
        String::from_utf8_lossy(&first).contains("event:"),
        "{url}: {first:?}"
    );
    await_metric(server, &gauge, 1.0).await;
    drop(sse);
    await_metric(server, &gauge, 0.0).await;
}

#[tokio::test]
async fn server_metrics_count_requests_and_open_sse_streams() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &["--long-poll-timeout-sec", "20"]);
    let c = http();
    let s = server.url("/v1/stream/m/s");
    let r = c
        .put(&s)
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    for i in 0..5 {
        let r = c
            .post(&s)
            .header("content-type", "text/plain")
            .body(format!("r{i}"))
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "append {i}: {}", r.status());
    }
    let r = c.get(server.url("/v1/stream/m/none")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);

    let text = await_metric(&server, "pico_http_sse_streams{protocol=\"ds\"}", 0.0).await;
    let v = |name: &str| prom_value(&text, name).unwrap_or_else(|| panic!("{name}:\n{text}"));
    assert_eq!(
        v(r#"pico_http_requests_total{method="PUT",status="2xx"}"#),
        1.0
    );
    assert_eq!(
        v(r#"pico_http_requests_total{method="POST",status="2xx"}"#),
        5.0
    );
    assert_eq!(
        v(r#"pico_http_requests_total{method="GET",status="4xx"}"#),
        1.0
    );
    assert_eq!(v("pico_http_requests_in_flight"), 0.0);
    assert!(
        text.contains("# HELP pico_http_requests_total "),
        "described:\n{text}"
    );

    // An open SSE response is counted until the client goes away, on either protocol.
    let ds_sse = format!("{s}?offset=-1&live=sse");
    sse_counted_while_open(&c, &server, &ds_sse, "ds").await;
    sse_counted_while_open(&c, &server, &server.url("/m/s?seq=0&live=sse"), "pico").await;

    // A long-poll at the tail is in flight until an append answers it.
    let head = c.head(&s).send().await.unwrap();
    let tail = header(&head, "stream-next-offset").unwrap().to_string();
    let poll = tokio::spawn({
        let c = c.clone();
        let url = format!("{s}?offset={tail}&live=long-poll");
        async move { c.get(url).send().await.map(|r| r.status()) }
    });
    await_metric(&server, "pico_http_requests_in_flight", 1.0).await;
    let r = c
        .post(&s)
        .header("content-type", "text/plain")
        .body("wake")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert_eq!(poll.await.unwrap().unwrap(), StatusCode::OK);
    let text = await_metric(&server, "pico_http_requests_in_flight", 0.0).await;
    assert_eq!(
        prom_value(
            &text,
            r#"pico_http_requests_total{method="GET",status="2xx"}"#
        ),
        Some(3.0),
        "the two SSE responses and the long-poll:\n{text}"
    );
    // Timed: the appends and the 404; not the three live reads, whose answers wait by design.
    assert_eq!(
        prom_value(&text, r#"pico_http_request_seconds_count{method="POST"}"#),
        Some(6.0),
        "{text}"
    );
    assert_eq!(
        prom_value(&text, r#"pico_http_request_seconds_count{method="GET"}"#),
        Some(1.0),
        "{text}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Raw HTTP against each protocol row
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn server_http_protocol_rows() {
    let dir = tempdir();
    let mut server = Server::start(
        dir.path(),
        &[
            "--long-poll-timeout-sec",
            "1",
            "--max-request-size",
            "64KiB",
            "--sse-max-duration-sec",
            "3",
        ],
    );
    let c = http();
    create_rows(&c, &server).await;
    append_and_read_rows(&c, &server).await;
    live_rows(&c, &server).await;
    head_delete_list_rows(&c, &server).await;
    trim_and_close_rows(&c, &server).await;
    producer_rows(&c, &server).await;
    limit_and_malformed_rows(&c, &mut server).await;
    server.assert_alive();
}

async fn create_rows(c: &reqwest::Client, s: &Server) {
    let put = |ct: &'static str| {
        c.put(s.url("/rows/create"))
            .header("content-type", ct)
            .send()
    };
    let r = put("text/plain").await.unwrap();
    assert_eq!(r.status(), StatusCode::CREATED, "PUT new → 201");
    assert!(header(&r, "location").is_some(), "201 carries Location");
    assert_eq!(header(&r, "x-content-type-options"), Some("nosniff"));
    let r = put("text/plain").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "PUT same config → 200");
    let code = expect_error(
        put("application/json").await.unwrap(),
        409,
        "PUT other type",
    )
    .await;
    assert_eq!(code, "conflict");
    let r = c
        .put(s.url("/rows/ttl"))
        .header("pico-ttl", "abc")
        .send()
        .await
        .unwrap();
    assert_eq!(expect_error(r, 400, "bad TTL").await, "bad_request");
    let r = c
        .put(s.url("/rows/ttl"))
        .header("pico-ttl", "60")
        .header("pico-expires-at", "2099-01-01T00:00:00Z")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "TTL and Expires-At together").await;
    let r = c
        .put(s.url("/rows/ttl"))
        .header("pico-ttl", "60")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = c.head(s.url("/rows/ttl")).send().await.unwrap();
    assert_eq!(header(&r, "pico-ttl"), Some("60"), "HEAD echoes the TTL");
    let r = c
        .request(Method::OPTIONS, s.url("/rows/create"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NO_CONTENT,
        "OPTIONS preflight → 204"
    );
}

fn rec(body: &[u8], headers: &[(&str, &[u8])]) -> Record {
    let mut r = Record::from_value(Bytes::copy_from_slice(body));
    r.headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), Bytes::copy_from_slice(v)))
        .collect();
    r
}

async fn append_and_read_rows(c: &reqwest::Client, s: &Server) {
    let url = s.url("/rows/data");
    assert_eq!(
        c.put(&url).send().await.unwrap().status(),
        StatusCode::CREATED
    );

    // Raw single record.
    let r = c.post(&url).body("hello").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "raw POST");
    assert_eq!(
        (
            header_u64(&r, "pico-start-seq"),
            header_u64(&r, "pico-next-seq")
        ),
        (0, 1)
    );
    assert!(header(&r, "cache-control").is_some_and(|v| v.contains("no-store")));
    // JSON batch: text and base64 bodies, a key and headers.
    let batch = json!({"records": [
        {"body": "json-1", "key": "k1", "headers": {"h": "v"}},
        {"body_b64": B64.encode([0u8, 1, 255])},
    ]});
    let r = c
        .post(&url)
        .header("content-type", "application/vnd.picomq.batch+json")
        .body(batch.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "JSON batch POST");
    assert_eq!(
        (
            header_u64(&r, "pico-start-seq"),
            header_u64(&r, "pico-next-seq")
        ),
        (1, 3)
    );
    // Binary batch.
    let recs = [rec(b"bin-1", &[("x", b"y")]), rec(b"bin-2", &[])];
    let body = pico_protocol::encode_binary(recs.iter().map(|r| (0, r))).unwrap();
    let r = c
        .post(&url)
        .header("content-type", "application/vnd.picomq.batch")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "binary batch POST");
    assert_eq!(
        (
            header_u64(&r, "pico-start-seq"),
            header_u64(&r, "pico-next-seq")
        ),
        (3, 5)
    );
    let r = c
        .post(s.url("/rows/missing"))
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(
        expect_error(r, 404, "append to missing stream").await,
        "not_found"
    );

    // GET json.
    let r = c
        .get(format!("{url}?seq=0&format=json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(header_u64(&r, "pico-next-seq"), 5);
    assert_eq!(header(&r, "pico-up-to-date"), Some("true"));
    assert!(header(&r, "cache-control").is_some_and(|v| v.contains("max-age=60")));
    let etag = header(&r, "etag")
        .expect("catch-up reads carry an ETag")
        .to_string();
    let arr: Vec<Value> = r.json().await.unwrap();
    assert_eq!(arr.len(), 5);
    let seqs: Vec<u64> = arr.iter().map(|v| v["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![0, 1, 2, 3, 4]);
    assert_eq!(arr[0]["body"], "hello");
    assert!(
        arr[0]["timestamp"].as_i64().unwrap() > 1_600_000_000_000,
        "timestamps are ms"
    );
    assert_eq!(
        (arr[1]["body"].as_str(), arr[1]["key"].as_str()),
        (Some("json-1"), Some("k1"))
    );
    assert_eq!(arr[1]["headers"]["h"], "v");
    assert_eq!(arr[2]["body_b64"], B64.encode([0u8, 1, 255]));
    assert_eq!(arr[3]["headers"]["x"], "y");
    // If-None-Match with the same ETag → 304.
    let r = c
        .get(format!("{url}?seq=0&format=json"))
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "If-None-Match → 304");
    // count limits the chunk.
    let r = c.get(format!("{url}?seq=1&count=2")).send().await.unwrap();
    assert_eq!(header_u64(&r, "pico-next-seq"), 3);
    assert_ne!(
        header(&r, "pico-up-to-date"),
        Some("true"),
        "a partial read is not up to date"
    );
    assert_eq!(r.json::<Vec<Value>>().await.unwrap().len(), 2);
    // GET binary.
    let r = c
        .get(format!("{url}?seq=0&format=binary"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let decoded = pico_protocol::decode_binary(&r.bytes().await.unwrap()).unwrap();
    let got: Vec<(u64, &[u8])> = decoded.iter().map(|(s, r)| (*s, &r.value[..])).collect();
    let want: Vec<(u64, &[u8])> = vec![
        (0, b"hello"),
        (1, b"json-1"),
        (2, &[0, 1, 255]),
        (3, b"bin-1"),
        (4, b"bin-2"),
    ];
    assert_eq!(got, want, "binary read");
    assert_eq!(
        decoded[3].1.headers,
        vec![("x".to_string(), Bytes::from_static(b"y"))]
    );
    // GET raw: bodies concatenated, in the stream's content type.
    let text_url = s.url("/rows/create");
    for body in ["ab", "cd", "ef"] {
        assert!(
            c.post(&text_url)
                .body(body)
                .send()
                .await
                .unwrap()
                .status()
                .is_success()
        );
    }
    let r = c
        .get(format!("{text_url}?seq=1&format=raw"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header(&r, "content-type").is_some_and(|v| v.starts_with("text/plain")));
    assert_eq!(r.text().await.unwrap(), "cdef");
    // seq=now: no records, positioned at the tail.
    let r = c.get(format!("{url}?seq=now")).send().await.unwrap();
    assert!(r.status().is_success(), "seq=now: {}", r.status());
    assert_eq!(header_u64(&r, "pico-next-seq"), 5);
    let body = r.bytes().await.unwrap();
    assert!(
        body.is_empty()
            || serde_json::from_slice::<Vec<Value>>(&body)
                .unwrap()
                .is_empty()
    );
}

async fn live_rows(c: &reqwest::Client, s: &Server) {
    let url = s.url("/rows/live");
    assert_eq!(
        c.put(&url).send().await.unwrap().status(),
        StatusCode::CREATED
    );
    c.post(&url).body("first").send().await.unwrap();

    // Long-poll times out with 204 after --long-poll-timeout-sec 1.
    let t0 = Instant::now();
    let r = c
        .get(format!("{url}?seq=1&live=long-poll"))
        .send()
        .await
        .unwrap();
    let waited = t0.elapsed();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "quiet long-poll → 204");
    assert!(
        waited >= Duration::from_millis(800) && waited < Duration::from_secs(10),
        "{waited:?}"
    );
    assert_eq!(header_u64(&r, "pico-next-seq"), 1);
    assert_eq!(header(&r, "pico-up-to-date"), Some("true"));
    assert!(
        header(&r, "pico-cursor").is_some(),
        "long-poll carries Pico-Cursor"
    );
    assert!(header(&r, "cache-control").is_some_and(|v| v.contains("no-store")));

    // Long-poll wakes up on an append.
    let waiter = tokio::spawn({
        let c = c.clone();
        let url = url.clone();
        async move {
            c.get(format!("{url}?seq=1&live=long-poll"))
                .send()
                .await
                .unwrap()
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    c.post(&url).body("second").send().await.unwrap();
    let r = waiter.await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "long-poll answered by an append"
    );
    assert_eq!(header_u64(&r, "pico-next-seq"), 2);
    let arr: Vec<Value> = r.json().await.unwrap();
    assert_eq!((arr.len(), arr[0]["body"].as_str()), (1, Some("second")));

    // SSE: data (id = next seq) + control, then live data.
    let mut r = c.get(format!("{url}?seq=0&live=sse")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert!(header(&r, "content-type").is_some_and(|v| v.starts_with("text/event-stream")));
    let mut sse = SseReader::default();
    let ev = sse.next(&mut r).await;
    assert_eq!(
        (ev.event.as_str(), ev.id.as_deref()),
        ("data", Some("2")),
        "{ev:?}"
    );
    let arr: Vec<Value> = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(
        arr.iter()
            .map(|v| v["body"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["first", "second"]
    );
    let ev = sse.next(&mut r).await;
    assert_eq!(ev.event, "control", "{ev:?}");
    let ctl: Value = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(
        (ctl["next_seq"].as_u64(), ctl["up_to_date"].as_bool()),
        (Some(2), Some(true))
    );
    c.post(&url).body("third").send().await.unwrap();
    let ev = sse.next(&mut r).await;
    assert_eq!(
        (ev.event.as_str(), ev.id.as_deref()),
        ("data", Some("3")),
        "live SSE data {ev:?}"
    );
    assert!(ev.data.contains("third"));
    drop(r);

    // Resume with Last-Event-ID.
    let mut r = c
        .get(format!("{url}?live=sse"))
        .header("last-event-id", "2")
        .send()
        .await
        .unwrap();
    let mut sse = SseReader::default();
    let ev = sse.next(&mut r).await;
    assert_eq!(ev.event, "data", "{ev:?}");
    let arr: Vec<Value> = serde_json::from_str(&ev.data).unwrap();
    assert_eq!(arr.len(), 1, "resume from Last-Event-ID 2: {arr:?}");
    assert_eq!(arr[0]["seq"], 2);
}

#[derive(Debug, Default)]
struct SseEvent {
    event: String,
    id: Option<String>,
    data: String,
}

#[derive(Default)]
struct SseReader {
    buf: String,
}

impl SseReader {
    /// The next event that is not a comment/keep-alive (bounded wait).
    async fn next(&mut self, resp: &mut reqwest::Response) -> SseEvent {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let normalized = self.buf.replace("\r\n", "\n");
            if let Some((raw, rest)) = normalized.split_once("\n\n") {
                let (raw, rest) = (raw.to_string(), rest.to_string());
                self.buf = rest;
                let mut ev = SseEvent {
                    event: "message".into(),
                    ..Default::default()
                };
                let mut data = Vec::new();
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        ev.event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        ev.id = Some(v.trim().to_string());
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push(v.strip_prefix(' ').unwrap_or(v).to_string());
                    }
                }
                if data.is_empty() && ev.id.is_none() {
                    continue; // keep-alive comment
                }
                ev.data = data.join("\n");
                return ev;
            }
            let chunk = tokio::time::timeout_at(deadline, resp.chunk())
                .await
                .expect("no SSE event within 10s")
                .unwrap()
                .expect("SSE stream ended before the next event");
            self.buf.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

async fn head_delete_list_rows(c: &reqwest::Client, s: &Server) {
    let url = s.url("/rows/data");
    let r = c.head(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        (
            header_u64(&r, "pico-start-seq"),
            header_u64(&r, "pico-next-seq")
        ),
        (0, 5)
    );
    assert!(header(&r, "content-type").is_some_and(|v| v.starts_with("application/octet-stream")));
    assert_eq!(
        c.head(s.url("/rows/missing"))
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NOT_FOUND
    );

    let r = c.delete(&url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT, "DELETE → 204");
    let r = c.delete(&url).send().await.unwrap();
    assert_eq!(expect_error(r, 404, "second DELETE").await, "not_found");
    let r = c.get(format!("{url}?seq=0")).send().await.unwrap();
    expect_error(r, 404, "read after delete").await;
    // The name is reusable at once and starts empty.
    assert_eq!(
        c.put(&url).send().await.unwrap().status(),
        StatusCode::CREATED
    );
    let r = c.head(&url).send().await.unwrap();
    assert_eq!(
        header_u64(&r, "pico-next-seq"),
        0,
        "a recreated stream starts at 0"
    );

    for name in ["a", "b", "c"] {
        let r = c
            .put(s.url(&format!("/listing/{name}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
    }
    let names = |v: &Value| -> Vec<String> {
        v["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                e.as_str()
                    .or_else(|| e["name"].as_str())
                    .unwrap()
                    .to_string()
            })
            .collect()
    };
    let v: Value = c
        .get(s.url("/?prefix=listing/&limit=2"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(names(&v), ["listing/a", "listing/b"]);
    assert_eq!(v["has_more"], true);
    let v: Value = c
        .get(s.url("/?prefix=listing/&limit=2&start_after=listing/b"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(names(&v), ["listing/c"]);
    assert_eq!(v["has_more"], false);
    let r = c.get(s.url("/?limit=abc")).send().await.unwrap();
    expect_error(r, 400, "bad list limit").await;
}

async fn trim_and_close_rows(c: &reqwest::Client, s: &Server) {
    let url = s.url("/rows/trim");
    assert_eq!(
        c.put(&url).send().await.unwrap().status(),
        StatusCode::CREATED
    );
    let batch =
        json!({"records": (0..10).map(|i| json!({"body": format!("r{i}")})).collect::<Vec<_>>()});
    let r = c
        .post(&url)
        .header("content-type", "application/vnd.picomq.batch+json")
        .body(batch.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(header_u64(&r, "pico-next-seq"), 10);
    let r = c
        .post(&url)
        .header("pico-trim-seq", "4")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "trim");
    assert_eq!(header_u64(&r, "pico-start-seq"), 4);
    let r = c.head(&url).send().await.unwrap();
    assert_eq!(
        (
            header_u64(&r, "pico-start-seq"),
            header_u64(&r, "pico-next-seq")
        ),
        (4, 10)
    );
    let arr: Vec<Value> = c
        .get(format!("{url}?seq=4"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(arr.first().map(|v| v["body"].clone()), Some(json!("r4")));
    assert_eq!(arr.len(), 6);
    let r = c
        .post(&url)
        .header("pico-trim-seq", "6")
        .body("x")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "trim with a body").await;

    // Close: empty body + Pico-Closed: true.
    let r = c
        .post(&url)
        .header("pico-closed", "true")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "close");
    let r = c.post(&url).body("late").send().await.unwrap();
    assert_eq!(expect_error(r, 409, "append after close").await, "closed");
    let r = c.head(&url).send().await.unwrap();
    assert_eq!(header(&r, "pico-closed"), Some("true"));
    let r = c.get(format!("{url}?seq=4")).send().await.unwrap();
    assert_eq!(
        header(&r, "pico-closed"),
        Some("true"),
        "fully read closed stream"
    );
    // Long-poll at the end of a closed stream answers at once.
    let t0 = Instant::now();
    let r = c
        .get(format!("{url}?seq=10&live=long-poll"))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    assert_eq!(header(&r, "pico-closed"), Some("true"));
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "closed long-poll must not wait"
    );
}

async fn producer_rows(c: &reqwest::Client, s: &Server) {
    let url = s.url("/rows/producer");
    assert_eq!(
        c.put(&url).send().await.unwrap().status(),
        StatusCode::CREATED
    );
    let send = |epoch: u64, seq: u64, body: &'static str| {
        c.post(&url)
            .header("pico-producer-id", "p1")
            .header("pico-producer-epoch", epoch.to_string())
            .header("pico-producer-seq", seq.to_string())
            .body(body)
            .send()
    };
    let next = |r: &reqwest::Response| header_u64(r, "pico-next-seq");
    let r = send(0, 0, "a").await.unwrap();
    assert_eq!(
        (r.status(), next(&r)),
        (StatusCode::OK, 1),
        "first producer append"
    );
    let r = send(0, 0, "a").await.unwrap();
    assert_eq!(
        (r.status(), next(&r)),
        (StatusCode::OK, 1),
        "duplicate: 200, nothing written"
    );
    let r = send(0, 2, "c").await.unwrap();
    assert_eq!(
        header(&r, "pico-expected-seq"),
        Some("1"),
        "gap names the expected seq"
    );
    assert_eq!(expect_error(r, 409, "producer gap").await, "sequence_gap");
    let r = send(0, 1, "b").await.unwrap();
    assert_eq!((r.status(), next(&r)), (StatusCode::OK, 2));
    let r = send(1, 0, "new-epoch").await.unwrap();
    assert_eq!(
        (r.status(), next(&r)),
        (StatusCode::OK, 3),
        "higher epoch restarts at 0"
    );
    let r = send(0, 2, "stale").await.unwrap();
    assert_eq!(expect_error(r, 403, "stale producer epoch").await, "fenced");
    let r = c
        .post(&url)
        .header("pico-producer-id", "p2")
        .body("x")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "partial producer headers").await;
    let r = c.head(&url).send().await.unwrap();
    assert_eq!(next(&r), 3, "only accepted producer appends were written");

    // Match-seq.
    let r = c
        .post(&url)
        .header("pico-match-seq", "99")
        .body("m")
        .send()
        .await
        .unwrap();
    assert_eq!(
        expect_error(r, 412, "match-seq mismatch").await,
        "match_failed"
    );
    let r = c
        .post(&url)
        .header("pico-match-seq", "3")
        .body("m")
        .send()
        .await
        .unwrap();
    assert_eq!(
        (r.status(), next(&r)),
        (StatusCode::OK, 4),
        "match-seq equal to the tail"
    );
}

async fn limit_and_malformed_rows(c: &reqwest::Client, s: &mut Server) {
    let url = s.url("/rows/limits");
    assert_eq!(
        c.put(&url).send().await.unwrap().status(),
        StatusCode::CREATED
    );
    // 413 above --max-request-size 64KiB.
    let r = c
        .post(&url)
        .body(vec![b'x'; 100 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(
        expect_error(r, 413, "body above max-request-size").await,
        "too_large"
    );
    let r = c
        .post(&url)
        .body(vec![b'x'; 32 * 1024])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "body below the limit");

    let json_ct = "application/vnd.picomq.batch+json";
    /// (what, request headers, body)
    type BadPost = (&'static str, Vec<(&'static str, &'static str)>, Vec<u8>);
    let bad_posts: Vec<BadPost> = vec![
        (
            "bad JSON",
            vec![("content-type", json_ct)],
            b"{not json".to_vec(),
        ),
        (
            "records not an array",
            vec![("content-type", json_ct)],
            br#"{"records":5}"#.to_vec(),
        ),
        (
            "bad body_b64",
            vec![("content-type", json_ct)],
            br#"{"records":[{"body_b64":"***"}]}"#.to_vec(),
        ),
        (
            "record without body",
            vec![("content-type", json_ct)],
            br#"{"records":[{"key":"k"}]}"#.to_vec(),
        ),
        (
            "truncated binary batch",
            vec![("content-type", "application/vnd.picomq.batch")],
            vec![1, 0, 0, 0, 9, 0],
        ),
        (
            "bad match-seq",
            vec![("pico-match-seq", "abc")],
            b"x".to_vec(),
        ),
        (
            "negative match-seq",
            vec![("pico-match-seq", "-1")],
            b"x".to_vec(),
        ),
        (
            "bad producer epoch",
            vec![
                ("pico-producer-id", "p"),
                ("pico-producer-epoch", "x"),
                ("pico-producer-seq", "0"),
            ],
            b"x".to_vec(),
        ),
        ("bad trim seq", vec![("pico-trim-seq", "x")], Vec::new()),
        (
            "bad closed flag",
            vec![("pico-closed", "maybe")],
            Vec::new(),
        ),
        ("empty append", vec![], Vec::new()),
    ];
    for (what, headers, body) in bad_posts {
        let mut req = c.post(&url).body(body);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let r = req.send().await.unwrap();
        assert_eq!(expect_error(r, 400, what).await, "bad_request", "{what}");
    }
    for (what, query) in [
        ("bad seq", "?seq=abc"),
        ("negative seq", "?seq=-1"),
        ("bad format", "?format=xml"),
        ("bad live", "?live=forever"),
        ("bad count", "?count=x"),
    ] {
        let r = c.get(format!("{url}{query}")).send().await.unwrap();
        assert_eq!(expect_error(r, 400, what).await, "bad_request", "{what}");
    }
    let r = c.put(s.url("/rows/bad//name")).send().await.unwrap();
    assert!(
        r.status().is_client_error(),
        "bad name → 4xx, got {}",
        r.status()
    );
    let r = c
        .put(s.url("/rows/ttl2"))
        .header("pico-ttl", "+5")
        .send()
        .await
        .unwrap();
    expect_error(r, 400, "non-strict TTL").await;
    // Nothing above crashed the node or wrote a record.
    s.assert_alive();
    let r = c.head(&url).send().await.unwrap();
    assert_eq!(
        header_u64(&r, "pico-next-seq"),
        1,
        "rejected requests wrote nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// 3. kill -9 while appends are in flight
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_crash_keeps_acknowledged_records() {
    crash_keeps_acknowledged_records(None, false, 0, false).await;
}

/// The same with 64 KiB records, so data objects are being written (several at once) when the
/// server dies: objects PUT but not committed are orphans, their data comes back from the WAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_crash_during_overlapping_uploads_keeps_acknowledged_records() {
    crash_keeps_acknowledged_records(Some("maxInflightUploadCount=8"), false, 64 << 10, true).await;
}

/// The same crash with WAL segments of 64 KiB, killed just after a trimmed segment was recycled
/// as the active one: recovery must tell its old frames from the new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn server_crash_in_recycled_wal_segments_keeps_acknowledged_records() {
    crash_keeps_acknowledged_records(Some("segmentBytes=65536"), true, 300, false).await;
}

async fn crash_keeps_acknowledged_records(
    wal_params: Option<&str>,
    wait_for_recycled_segment: bool,
    pad: usize,
    expect_uploads: bool,
) {
    const WRITERS: usize = 8;
    const MIN_ACKS_BEFORE_KILL: usize = 1000;
    let dir = tempdir();
    let storage =
        wal_params.map(|p| format!("--storage=-2@file://{}/objects?{p}", dir.path().display()));
    let extra: Vec<&str> = storage.iter().map(String::as_str).collect();
    let mut server = Server::start(dir.path(), &extra);
    let client = Client::new(&server.endpoint(), ClientOptions::default()).unwrap();
    client.create("crash/s", None, None).await.unwrap();

    let acked: Arc<Mutex<Vec<(u64, String)>>> = Arc::default();
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let client = client.clone();
        let acked = acked.clone();
        writers.push(tokio::spawn(async move {
            for i in 0.. {
                let body = format!("w{w}-{i}-{}", "x".repeat(pad));
                match client.append("crash/s", body.clone()).await {
                    Ok(ack) => {
                        assert_eq!(ack.next_seq, ack.start_seq + 1, "one record per append");
                        acked.lock().unwrap().push((ack.start_seq, body));
                    }
                    Err(_) => return, // the server is gone
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    // If asked, the kill comes right after a recycled segment became the active one
    // (the spare holding old frames was seen, then taken): its new frames lie over old ones.
    let spare = dir.path().join("objects/wal/1/spare.segment");
    let mut recycled_spare = false;
    loop {
        assert!(
            Instant::now() < deadline,
            "appends too slow before the crash (or no WAL segment recycled); log:\n{}",
            server.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        if acked.lock().unwrap().len() < MIN_ACKS_BEFORE_KILL {
            continue;
        }
        if !wait_for_recycled_segment {
            break;
        }
        if !recycled_spare {
            recycled_spare = std::fs::read(&spare).is_ok_and(|b| b.iter().any(|&x| x != 0));
        } else if !spare.exists() {
            break;
        }
    }
    // Appends are in flight right now: kill -9.
    server.kill9();
    for w in writers {
        tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("writer hung")
            .unwrap();
    }
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    assert!(acked.len() >= MIN_ACKS_BEFORE_KILL);
    if expect_uploads {
        let objects = count_files(&dir.path().join("objects/data"));
        assert!(objects >= 1, "no data object was uploaded before the crash");
        eprintln!("crash test: {objects} data objects (or temp files) on disk at the crash");
    }

    // Restart on the same metadata and storage.
    let server = Server::start(dir.path(), &extra);
    let client = Client::new(&server.endpoint(), ClientOptions::default()).unwrap();
    let mut records = Vec::new();
    let mut seq = 0;
    loop {
        let chunk = client.read("crash/s", seq, None).await.unwrap();
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
        assert!(bodies.insert(body.clone()), "body written twice: {body}");
    }
    let by_seq: BTreeMap<u64, &[u8]> = records.iter().map(|r| (r.seq, &r.body[..])).collect();
    for (seq, body) in &acked {
        assert_eq!(
            by_seq.get(seq).copied(),
            Some(body.as_bytes()),
            "acknowledged record lost or moved: seq={seq} body={body} (read {} records, {} acked)",
            records.len(),
            acked.len()
        );
    }
    assert!(records.len() >= acked.len());
    eprintln!(
        "crash test: {} acknowledged, {} recovered",
        acked.len(),
        records.len()
    );
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                if e.path().is_dir() {
                    count_files(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

// ---------------------------------------------------------------------------------------------
// 4. Configuration surface (no server needed)
// ---------------------------------------------------------------------------------------------

#[test]
fn serve_help_lists_a_pico_env_var_for_every_flag() {
    let out = pico_command().args(["serve", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    // Split the help into one block per flag: a block starts at a line whose first
    // non-blank characters are `--` or `-x` (not a `- value: …` line of "Possible values").
    let mut blocks: Vec<(String, String)> = Vec::new();
    for line in help.lines() {
        let t = line.trim_start();
        let is_flag = t.starts_with("--")
            || (t.starts_with('-') && t.chars().nth(1).is_some_and(|c| c.is_ascii_alphabetic()));
        if is_flag {
            let flag = t
                .split([' ', ',', '\t'])
                .find(|w| w.starts_with("--"))
                .unwrap_or(t)
                .to_string();
            blocks.push((flag, line.to_string()));
        } else if let Some(last) = blocks.last_mut() {
            last.1.push('\n');
            last.1.push_str(line);
        }
    }
    let flags: HashSet<&str> = blocks.iter().map(|(f, _)| f.as_str()).collect();
    for (flag, block) in &blocks {
        if flag == "--help" || flag == "--version" {
            continue;
        }
        let want = format!(
            "PICO_{}",
            flag.trim_start_matches("--")
                .replace('-', "_")
                .to_uppercase()
        );
        assert!(
            block.contains(&format!("[env: {want}")),
            "{flag} does not list {want}:\n{block}"
        );
    }
    for want in [
        "--node-id",
        "--node-epoch",
        "--listen",
        "--admin-listen",
        "--no-admin",
        "--http-address",
        "--meta-url",
        "--storage",
        "--wal",
        "--cluster-id",
        "--routing",
        "--protocol",
        "--slots",
        "--long-poll-timeout-sec",
        "--sse-max-duration-sec",
        "--max-chunk-size",
        "--max-request-size",
        "--shutdown-drain-sec",
        "--wal-cache-size",
        "--block-cache-size",
        "--insecure-allow-remote",
        "--endpoint",
        "--http2",
        "--token",
    ] {
        assert!(flags.contains(want), "serve --help lacks {want}");
    }
    // Flags of features not built yet parse but are not offered.
    for shown in ["--kafka-listen", "--kafka-advertise", "--no-kafka"] {
        assert!(flags.contains(shown), "serve --help lacks {shown}");
    }
    for hidden in [
        "--auth",
        "--auth-bootstrap-token",
        "--auth-bootstrap-token-file",
        "--profile",
    ] {
        assert!(!flags.contains(hidden), "serve --help offers {hidden}");
    }
}

#[test]
fn serve_refuses_remote_binds_without_auth() {
    let dir = tempdir();
    let out = pico_command()
        .current_dir(dir.path())
        .args(["serve", "--listen", "0.0.0.0:0", "--no-kafka", "--no-admin"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--listen") && err.contains("--insecure-allow-remote"),
        "{err}"
    );
    // The env var form is honoured the same way.
    let out = pico_command()
        .current_dir(dir.path())
        .args(["serve", "--no-kafka", "--no-admin"])
        .env("PICO_LISTEN", "0.0.0.0:0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn client_commands_report_one_line_errors() {
    let port = free_port(); // nothing listens here
    let out = pico_command()
        .args([
            "head",
            "/x",
            "--endpoint",
            &format!("http://127.0.0.1:{port}"),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: ") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    let out = pico_command()
        .args(["--protocol", "ds", "ls"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported by the client commands"));
}

/// A name the server would refuse is refused by every command before any request: the server
/// reads the name from the raw path, so `pico delete 'orders?x'` used to send
/// `DELETE /orders?x` and delete stream `orders`.
#[test]
fn client_commands_refuse_names_no_url_carries_as_they_are() {
    let port = free_port(); // nothing listens here: the refusal must come first
    let endpoint = format!("http://127.0.0.1:{port}");
    let commands: [&[&str]; 8] = [
        &["delete"],
        &["head"],
        &["close"],
        &["read"],
        &["tail", "-f"],
        &["trim", "--seq", "1"],
        &["create"],
        &["append"],
    ];
    for name in ["orders?x", "orders#x", "a/%2e%2e/orders"] {
        for cmd in commands {
            let out = pico_command()
                .args(&cmd[..1])
                .arg(name)
                .args(&cmd[1..])
                .args(["--endpoint", &endpoint])
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{cmd:?} {name}: {err}");
            assert!(
                err.starts_with("error: stream name") && !err.contains("transport"),
                "{cmd:?} {name}: {err}"
            );
        }
    }
}

/// A stand-in server for `pico bench` that creates streams (201) and never answers an append,
/// holding every connection open until the client closes it. Returns its port.
fn server_that_stops_answering_appends() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return; // the client closed the connection
                    }
                    let mut len = 0usize;
                    loop {
                        let mut h = String::new();
                        if reader.read_line(&mut h).unwrap_or(0) == 0 {
                            return;
                        }
                        if h.trim().is_empty() {
                            break;
                        }
                        if let Some((k, v)) = h.split_once(':')
                            && k.eq_ignore_ascii_case("content-length")
                        {
                            len = v.trim().parse().unwrap();
                        }
                    }
                    let mut body = vec![0; len];
                    reader.read_exact(&mut body).unwrap();
                    if !line.starts_with("PUT ") {
                        // Unanswered: wait for the client to go away.
                        let _ = reader.read_to_end(&mut Vec::new());
                        return;
                    }
                    conn.write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n")
                        .unwrap();
                }
            });
        }
    });
    port
}

/// Requests still unanswered when a bench run stops are reported (how many, the oldest's age)
/// and their ages are ack latencies: before, a server that stopped answering showed no
/// latency at all, or a clean tail from the requests answered before it stalled.
#[test]
fn bench_reports_requests_unanswered_at_the_stop() {
    let port = server_that_stops_answering_appends();
    let endpoint = format!("http://127.0.0.1:{port}");
    // Plain loops: one request each in flight; a producer: its window of 3 batches.
    for (args, pending) in [
        (&["--connections", "2"][..], 2),
        (&["--producer", "--connections", "1", "-w", "3"][..], 3),
    ] {
        let out = pico_command()
            .args(["bench", "--output", "json", "-d", "1s", "--warmup", "0s"])
            .args(["--endpoint", &endpoint])
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
        let w = &r["write"];
        assert_eq!(w["records"], 0, "{args:?}: {r}");
        assert_eq!(w["unfinished"], pending, "{args:?}: {r}");
        let oldest = w["unfinished_max_ms"].as_f64().unwrap();
        let lat = &r["write_latency"];
        assert_eq!(lat["count"], pending, "{args:?}: {r}");
        // The histogram keeps 3 significant digits.
        let max = lat["max_ms"].as_f64().unwrap();
        assert!(
            oldest > 0.0 && (max - oldest).abs() <= oldest * 0.002,
            "{args:?}: {r}"
        );
    }
}

/// `pico bench` refuses settings that would measure nothing or cannot be met, before it
/// touches a server, with a one-line error naming the flag.
#[test]
fn bench_rejects_settings_that_measure_nothing() {
    let port = free_port(); // nothing listens here: a refusal must come first
    let endpoint = format!("http://127.0.0.1:{port}");
    for (args, flag) in [
        (&["-d", "0s"][..], "--duration"),
        (&["-b", "0"][..], "--record-size"),
        (&["--target-mibps", "0"][..], "--target-mibps"),
        (&["--readers", "1", "-b", "8"][..], "--readers"),
        (
            &["--producer", "--streams", "5", "--connections", "2"][..],
            "--streams",
        ),
    ] {
        let out = pico_command()
            .args(["bench", "--endpoint", &endpoint])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.starts_with("error: ") && err.contains(flag) && err.trim_end().lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// 5. HTTP/2 without TLS (h2c, prior knowledge) on the same listener
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn server_speaks_h2c_and_http1_on_one_port() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &[]);
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = format!("{}/h2c/s", server.endpoint());
    let put = h2.put(&url).send().await.unwrap();
    assert_eq!(put.version(), reqwest::Version::HTTP_2);
    assert_eq!(put.status(), StatusCode::CREATED);
    let post = h2.post(&url).body("over h2").send().await.unwrap();
    assert_eq!(post.status(), StatusCode::OK);
    assert_eq!(post.headers()["pico-next-seq"], "1");
    let h1 = reqwest::Client::builder().http1_only().build().unwrap();
    let read = h1
        .get(format!("{url}?seq=0&format=raw"))
        .send()
        .await
        .unwrap();
    assert_eq!(read.version(), reqwest::Version::HTTP_11);
    assert_eq!(read.text().await.unwrap(), "over h2");
}

/// Opens `n` DS SSE tailers of `url` over the one HTTP/2 connection `h2` holds; each must
/// answer its headers within `wait`.
async fn h2_tailers(
    h2: &reqwest::Client,
    url: &str,
    n: usize,
    wait: Duration,
) -> Result<Vec<reqwest::Response>, String> {
    let opens = (0..n).map(|_| h2.get(format!("{url}?offset=now&live=sse")).send());
    let all = tokio::time::timeout(wait, futures::future::join_all(opens))
        .await
        .map_err(|_| format!("{n} tailers did not all get their headers within {wait:?}"))?;
    all.into_iter()
        .map(|r| {
            let r = r.map_err(|e| e.to_string())?;
            assert_eq!(r.version(), reqwest::Version::HTTP_2);
            assert_eq!(r.status(), StatusCode::OK);
            Ok(r)
        })
        .collect()
}

/// Starts a server with `extra` flags and creates a text stream at `path` over HTTP/2 prior
/// knowledge; returns the server, the h2 client (one connection) and the stream URL.
async fn h2_server_with_stream(
    dir: &Path,
    extra: &[&str],
    path: &str,
) -> (Server, reqwest::Client, String) {
    let server = Server::start(dir, extra);
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = server.url(path);
    let put = h2
        .put(&url)
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), StatusCode::CREATED);
    (server, h2, url)
}

/// One HTTP/2 connection holds more tailers than hyper's default stream limit (200), every one
/// of them gets the next append, and `--http2-max-streams` sets the limit.
#[tokio::test]
async fn h2_connection_holds_hundreds_of_sse_tailers() {
    let dir = tempdir();
    let (_server, h2, url) = h2_server_with_stream(dir.path(), &[], "/v1/stream/h2/fanout").await;
    let mut tailers = h2_tailers(&h2, &url, 300, Duration::from_secs(20))
        .await
        .unwrap();
    let post = h2
        .post(&url)
        .header("content-type", "text/plain")
        .body("to all 300")
        .send()
        .await
        .unwrap();
    assert!(post.status().is_success(), "{}", post.status());
    for resp in &mut tailers {
        let mut sse = SseReader::default();
        let ev = loop {
            let ev = sse.next(resp).await;
            if ev.event == "data" {
                break ev;
            }
        };
        assert_eq!(ev.data, "to all 300");
    }
    drop(tailers);

    // A lower limit holds: the 21st stream waits for one of the first 20 to end.
    let dir = tempdir();
    let (_limited, h2, url) = h2_server_with_stream(
        dir.path(),
        &["--http2-max-streams", "20"],
        "/v1/stream/h2/limited",
    )
    .await;
    let first = h2_tailers(&h2, &url, 20, Duration::from_secs(20))
        .await
        .unwrap();
    // It must wait, not fail: only a timeout counts.
    let more = h2_tailers(&h2, &url, 1, Duration::from_millis(500)).await;
    match more {
        Err(e) => assert!(e.contains("did not all get their headers"), "{e}"),
        Ok(_) => panic!("a 21st stream was opened past the limit"),
    }
    drop(first);
    h2_tailers(&h2, &url, 1, Duration::from_secs(20))
        .await
        .unwrap();
}

/// `pico bench --output json ARGS` against `server`, its report parsed.
fn bench_report(server: &Server, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["bench", "--output", "json"];
    all.extend_from_slice(args);
    let (out, _) = pico_ok(server, &all, b"");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("bad report {e}: {out}"))
}

/// `pico bench` against the real server: pipelined producers and plain appends with tailers.
/// Asserts the report counts acknowledged records, readers saw them with a latency, and that
/// the data is really in the streams.
#[test]
fn server_bench_producer_and_readers_report_real_counts() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &[]);
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["-d", "1s", "--warmup", "200ms"];
        all.extend_from_slice(args);
        bench_report(&server, &all)
    };

    let r = json(&[
        "--producer",
        "-w",
        "4",
        "--connections",
        "2",
        "-n",
        "5",
        "-b",
        "32",
        "--prefix",
        "bp",
    ]);
    let records = r["write"]["records"].as_u64().unwrap();
    assert!(records >= 10, "producer wrote too little: {r}");
    assert_eq!(r["write"]["errors"], 0, "{r}");
    assert!(
        records.is_multiple_of(5),
        "records are counted per acked batch: {r}"
    );
    assert!(r["write_latency"]["p50_ms"].as_f64().unwrap() > 0.0, "{r}");
    // Every acked batch is in the streams exactly once (warmup batches too, so at least).
    let (out, _) = pico_ok(&server, &["head", "bp/s0"], b"");
    let next: u64 = out
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("next="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no next= in {out}"));
    assert!(
        next > 0 && next.is_multiple_of(5),
        "whole batches only: {out}"
    );

    // One batch in flight: a batch's latency is its own round trip, so the latencies of the
    // batches acked in a window add up to at most the window (Little's law: rate × mean ≤ 1).
    // Counting the wait for the previous batch's slot made the median about two round trips.
    for proto in ["pico", "ds"] {
        let r = json(&[
            "--protocol",
            proto,
            "--producer",
            "-w",
            "1",
            "--connections",
            "1",
            "-n",
            "5",
            "-b",
            "32",
            "--prefix",
            &format!("bw-{proto}"),
        ]);
        let rate = r["write"]["requests_per_sec"].as_f64().unwrap();
        let p50 = r["write_latency"]["p50_ms"].as_f64().unwrap();
        assert!(rate > 0.0 && p50 > 0.0, "{r}");
        assert!(
            rate * p50 / 1000.0 < 1.5,
            "{proto}: median latency {p50} ms is longer than the round trip at {rate} req/s: {r}"
        );
    }

    let r = json(&[
        "--connections",
        "2",
        "--readers",
        "3",
        "--streams",
        "2",
        "-b",
        "40",
        "--prefix",
        "br",
    ]);
    assert!(r["write"]["records"].as_u64().unwrap() > 0, "{r}");
    let read = r["read"]["records"].as_u64().unwrap();
    assert!(read > 0, "readers saw nothing: {r}");
    assert_eq!(r["e2e_latency"]["count"].as_u64().unwrap(), read, "{r}");
    assert_eq!(r["read"]["errors"], 0, "{r}");
}

/// Refused appends are counted as errors, not as throughput, on both transports of the plain
/// loops (the bench's own HTTP/1.1 connections, which the server closes after each 413, and
/// reqwest over HTTP/2), and the run still ends on time with a report.
#[test]
fn server_bench_counts_refused_appends_as_errors() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &["--max-request-size", "1KiB"]);
    for h2 in [false, true] {
        let mut args = vec![
            "-d",
            "1s",
            "--warmup",
            "0s",
            "--connections",
            "2",
            "-b",
            "2KiB",
            "--prefix",
            "refused",
        ];
        if h2 {
            args.push("--http2");
        }
        let r = bench_report(&server, &args);
        assert_eq!(r["write"]["records"], 0, "h2={h2}: {r}");
        assert!(r["write"]["errors"].as_u64().unwrap() >= 2, "h2={h2}: {r}");
    }
    let r = bench_report(
        &server,
        &[
            "-d", "1s", "--warmup", "0s", "-b", "512", "--prefix", "fine",
        ],
    );
    assert!(r["write"]["records"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["write"]["errors"], 0, "{r}");
}

/// HTTP/2 readers beyond the server's stream limit would wait for the whole run: the bench
/// stops at setup, as soon as it learns the limit, and names the setting that fits (it used to
/// print a hint after waiting 30 s and measure with the readers missing).
#[test]
fn server_bench_refuses_more_h2_readers_than_the_server_allows() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &["--http2-max-streams", "8"]);
    // Both read modes: SSE streams past the limit would stay unopened, long-poll requests would
    // wait in reqwest's queue.
    for mode in ["sse", "long-poll"] {
        // 20 readers over HTTP/2, on the reader connections the caller adds.
        let readers = |extra: &[&'static str]| {
            let mut args = vec![
                "--protocol",
                "ds",
                "--http2",
                "--read-mode",
                mode,
                "--readers",
                "20",
            ];
            args.extend_from_slice(extra);
            args
        };
        let started = std::time::Instant::now();
        let mut args = vec!["bench"];
        args.extend(readers(&[
            "--reader-connections",
            "1",
            "-d",
            "2s",
            "--prefix",
            "h2-limit",
        ]));
        let out = pico(&server, &args, b"");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{mode}: {err}");
        assert!(
            err.contains("allows 8 concurrent streams") && err.contains("--reader-connections 3"),
            "{mode}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{mode}: refused only after {:?}",
            started.elapsed()
        );
        // Within the limit, the same readers run.
        let r = bench_report(
            &server,
            &readers(&[
                "--reader-connections",
                "3",
                "-d",
                "1s",
                "--warmup",
                "0s",
                "--prefix",
                "h2-fits",
            ]),
        );
        assert!(r["read"]["records"].as_u64().unwrap() > 0, "{mode}: {r}");
    }
}

/// A producer stops at its first batch that fails for good; the batches in flight behind it
/// and the next one sent to it are abandoned unsent. The report counts the failure once and
/// the abandoned batches apart (before, each of them was one more error, so one refusal read
/// as up to `-w` + 1 of them).
#[test]
fn server_bench_counts_a_producer_failure_once() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &["--max-request-size", "1KiB"]);
    for protocol in ["pico", "ds"] {
        let r = bench_report(
            &server,
            &[
                "--protocol",
                protocol,
                "--producer",
                "-w",
                "5",
                "-d",
                "1s",
                "--warmup",
                "0s",
                "-b",
                "2KiB",
                "--prefix",
                &format!("abandon-{protocol}"),
            ],
        );
        let w = &r["write"];
        let errors = w["errors"].as_u64().unwrap();
        let abandoned = w["abandoned"].as_u64().unwrap();
        assert_eq!(w["records"], 0, "{protocol}: {r}");
        assert!(errors >= 1, "{protocol}: {r}");
        // Each failure poisons its producer: the send that finds it so is abandoned, then the
        // bench opens a new producer. Only the run's last failure may have none.
        assert!(abandoned + 1 >= errors, "{protocol}: {r}");
        assert!(
            r["first_error"].as_str().unwrap().contains("413"),
            "{protocol}: the failure itself is reported, not an abandoned batch: {r}"
        );
    }
}

/// A paced writer asleep until its next slot when the measurement ends still hands in the
/// latencies of the appends it made: at 0.01 MiB/s a 100 KiB request is one slot every 10 s, so
/// in a 1 s run the first loop appends once and then sleeps past the end (the other three loops
/// never get a slot). Before the pacer's sleep gave way to the stop, that loop's histogram was
/// never merged and the report had counts without an ack latency.
#[test]
fn server_bench_paced_writers_hand_in_their_samples() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &[]);
    let r = bench_report(
        &server,
        &[
            "-d",
            "1s",
            "--warmup",
            "0s",
            "--connections",
            "4",
            "-n",
            "100",
            "-b",
            "1KiB",
            "--target-mibps",
            "0.01",
            "--prefix",
            "paced",
        ],
    );
    let requests = r["write"]["records"].as_u64().unwrap() / 100;
    assert!(requests >= 1, "{r}");
    assert_eq!(r["write_latency"]["count"].as_u64(), Some(requests), "{r}");
}

/// The bench's SSE tailers (their own HTTP/1.1 and HTTP/2 transports) see the records of both
/// protocols, and reopen from their last position when the server ends a response: with
/// `--sse-max-duration-sec 1` every tailer is cut off about three times in a 3 s run, and
/// still sees every record without an error.
#[test]
fn server_bench_sse_tailers_follow_across_reopened_responses() {
    let dir = tempdir();
    let server = Server::start(dir.path(), &["--sse-max-duration-sec", "1"]);
    for proto in ["pico", "ds"] {
        for h2 in [false, true] {
            let prefix = format!("sse-{proto}-{h2}");
            let mut args = vec![
                "-d",
                "3s",
                "--warmup",
                "200ms",
                "--protocol",
                proto,
                "--read-mode",
                "sse",
                "--connections",
                "2",
                "--readers",
                "3",
                "--streams",
                "1",
                "--reader-connections",
                "2",
                "-b",
                "40",
                "--target-mibps",
                "0.2",
                "--prefix",
                &prefix,
            ];
            if h2 {
                args.push("--http2");
            }
            let r = bench_report(&server, &args);
            let written = r["write"]["records"].as_u64().unwrap();
            let read = r["read"]["records"].as_u64().unwrap();
            assert!(written > 1000, "{proto} h2={h2}: wrote too little: {r}");
            assert_eq!(r["read"]["errors"], 0, "{proto} h2={h2}: {r}");
            assert_eq!(r["e2e_latency"]["count"].as_u64().unwrap(), read, "{r}");
            // The bench reports its own CPU: tailing and writing for 3 s cannot take none, nor
            // more than the machine has.
            let cpu = r["client_cpu_cores"].as_f64().unwrap();
            let cores = std::thread::available_parallelism().unwrap().get() as f64;
            assert!(cpu > 0.0 && cpu <= cores, "client_cpu_cores {cpu}: {r}");
            // And the whole machine's load over the run: the bench and the server kept it busy,
            // and steal is a share of CPU time.
            let m = &r["machine"];
            let busy = m["busy_cores"].as_f64().unwrap_or(-1.0);
            let steal = m["steal_pct"].as_f64().unwrap_or(-1.0);
            assert!(
                busy > 0.0 && busy <= cores + 0.05,
                "machine busy_cores: {r}"
            );
            assert!((0.0..=100.0).contains(&steal), "machine steal_pct: {r}");
            // Three readers of one stream: reads are about 3 × writes (the window's edges
            // aside); a tailer that lost records at a reopen would fall short of that.
            assert!(
                read * 100 >= written * 290,
                "{proto} h2={h2}: read {read} of {written} written: {r}"
            );
        }
    }
}

/// `pico append` goes through an idempotent producer: an append refused in passing (a 503, as
/// while a server restarts) is resent with the same producer sequence number and the command
/// succeeds. Before, the first 503 ended the command with part of the input written.
#[test]
fn append_resends_a_batch_refused_in_passing_with_the_same_seq() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
    let log = seen.clone();
    std::thread::spawn(move || {
        let mut next = 0u64;
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                let (mut len, mut seq) = (0usize, String::new());
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                        break;
                    }
                    if let Some((k, v)) = h.split_once(':') {
                        if k.eq_ignore_ascii_case("content-length") {
                            len = v.trim().parse().unwrap();
                        }
                        if k.eq_ignore_ascii_case("pico-producer-seq") {
                            seq = v.trim().to_string();
                        }
                    }
                }
                let mut body = vec![0; len];
                reader.read_exact(&mut body).unwrap();
                let mut log = log.lock().unwrap();
                log.push(seq.clone());
                let reply = if log.len() == 1 {
                    "HTTP/1.1 503 Service Unavailable\r\nretry-after: 0\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}".to_string()
                } else {
                    let start = next;
                    next += 2;
                    format!(
                        "HTTP/1.1 200 OK\r\npico-start-seq: {start}\r\npico-next-seq: {next}\r\ncontent-length: 0\r\n\r\n"
                    )
                };
                conn.write_all(reply.as_bytes()).unwrap();
            }
        }
    });
    let out = pico_command()
        .args(["append", "/s", "--batch", "2", "--endpoint"])
        .arg(format!("http://127.0.0.1:{port}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().unwrap().write_all(b"a\nb\nc\nd\n")?;
            child.wait_with_output()
        })
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("appended 4 records"), "{err}");
    assert_eq!(*seen.lock().unwrap(), ["0", "0", "1"]);
}
