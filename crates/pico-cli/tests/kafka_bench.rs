//! `pico bench --protocol kafka` against the real `pico serve` (SQLite metadata, file storage in
//! a temp dir, its Kafka listener on a free port): the report counts what the node stored.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const PICO: &str = env!("CARGO_BIN_EXE_pico");

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `pico` with no ambient `PICO_*` configuration.
fn pico_command() -> Command {
    let mut cmd = Command::new(PICO);
    for (k, _) in std::env::vars() {
        if k.starts_with("PICO_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A running `pico serve` with its Kafka listener; killed when dropped.
struct Server {
    child: Child,
    port: u16,
    kafka: u16,
    log: PathBuf,
}

impl Server {
    fn start(dir: &Path) -> Server {
        let (port, admin, kafka) = (free_port(), free_port(), free_port());
        let log = dir.join("server.log");
        let child = pico_command()
            .arg("serve")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-listen", &format!("127.0.0.1:{admin}")])
            .args(["--kafka-listen", &format!("127.0.0.1:{kafka}")])
            .args(["--meta-url", &format!("sqlite:{}/meta.db", dir.display())])
            .arg(format!("--storage=-2@file://{}/objects", dir.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn pico serve");
        let mut s = Server {
            child,
            port,
            kafka,
            log,
        };
        // Ready once both listeners accept.
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", kafka)).is_err()
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
        {
            if let Some(st) = s.child.try_wait().unwrap() {
                panic!("pico serve exited with {st}; log:\n{}", s.log_text());
            }
            assert!(
                Instant::now() < deadline,
                "pico serve not listening after 60 s; log:\n{}",
                s.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        s
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pico(&self, args: &[&str]) -> Output {
        pico_command()
            .args(["--endpoint", &format!("http://127.0.0.1:{}", self.port)])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The `next=` offset of a stream (`pico head`).
    fn next(&self, stream: &str) -> u64 {
        let out = self.pico(&["head", stream]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "head {stream}: {out:?}");
        text.split_whitespace()
            .find_map(|kv| kv.strip_prefix("next="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no next= in {text}"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bench(server: &Server, args: &[&str]) -> Output {
    let kafka = format!("127.0.0.1:{}", server.kafka);
    pico_command()
        .args(["bench", "--protocol", "kafka", "--endpoint", &kafka])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Pipelined Produce requests on two connections over two topics: the report counts whole
/// acknowledged batches with their latencies, and every one of them is in the streams.
#[test]
fn server_kafka_bench_counts_what_the_node_stored() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let out = bench(
        &server,
        &[
            "--output",
            "json",
            "-d",
            "1s",
            "--warmup",
            "200ms",
            "--connections",
            "2",
            "-w",
            "3",
            "-n",
            "5",
            "-b",
            "64",
            "--streams",
            "2",
            "--prefix",
            "kb",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench failed: {}\n{stdout}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log_text()
    );
    let r: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("bad report {e}: {stdout}"));
    assert_eq!(r["protocol"], "kafka", "{r}");
    let records = r["write"]["records"].as_u64().unwrap();
    assert!(records >= 10, "wrote too little: {r}");
    assert!(records.is_multiple_of(5), "counted per acked batch: {r}");
    assert_eq!(r["write"]["errors"], 0, "{r}");
    assert_eq!(
        r["write"]["bytes"].as_u64().unwrap(),
        records * 64,
        "bytes are record bytes: {r}"
    );
    let lat = &r["write_latency"];
    assert!(lat["p50_ms"].as_f64().unwrap() > 0.0, "{r}");
    assert!(lat["count"].as_u64().unwrap() >= records / 5, "{r}");
    // Topic `kb-s0` is stream `/kb-s0`. Everything acked (the warmup's too) is stored, in
    // whole batches, and requests went round-robin to both topics.
    let (s0, s1) = (server.next("kb-s0"), server.next("kb-s1"));
    assert!(s0 > 0 && s1 > 0, "both topics written: {s0} {s1}");
    assert!(s0 + s1 >= records, "stored {s0}+{s1} < acked {records}");
    assert!(s0.is_multiple_of(5) && s1.is_multiple_of(5), "{s0} {s1}");

    // The text report names the protocol and the figures the docs quote.
    let out = bench(
        &server,
        &[
            "-d", "300ms", "--warmup", "0s", "-b", "32", "--prefix", "kt",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(
        text.contains("protocol kafka over Kafka TCP (acks=all)") && text.contains("MiB/s"),
        "{text}"
    );
}

/// Settings with no Kafka form, and an HTTP URL as the endpoint, are refused up front.
#[test]
fn kafka_bench_refuses_what_it_cannot_measure() {
    let run = |args: &[&str]| {
        let out = pico_command()
            .args(["bench", "--protocol", "kafka"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} accepted");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = run(&["--endpoint", "http://127.0.0.1:4437"]);
    assert!(e.contains("HOST:PORT of the Kafka listener"), "{e}");
    for flag in ["--producer", "--http2"] {
        let e = run(&["--endpoint", "127.0.0.1:1", flag]);
        assert!(e.contains(&format!("{flag} is not supported")), "{e}");
    }
    let e = run(&["--endpoint", "127.0.0.1:1", "--readers", "1", "-b", "32"]);
    assert!(e.contains("--readers is not supported"), "{e}");
}
