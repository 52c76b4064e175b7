//! A running node's edge (issue 36): a web page gets no CORS grant and is not served, a
//! foreign `Host` is refused on a loopback node (DNS rebinding), a trickling body is cut off.
//! Through `run`, so the settings are shown to reach the listeners.

use pico_common::BucketUri;
use pico_runtime::{Config, run};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Far above anything under test, so a loaded machine does not fail it.
const PATIENCE: Duration = Duration::from_secs(10);

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// Starts a node on a free loopback port; it stops when the sender is dropped.
async fn start(config: Config) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let config = Config {
        listen: addr,
        admin_listen: None,
        kafka_listen: None,
        meta_url: "sqlite::memory:".into(),
        storage: BucketUri::parse("-2@memory://objects").unwrap(),
        ..config
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    // Its own thread and runtime: `run`'s future is not `Send`.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(run(config, async {
            let _ = rx.await;
        }))
        .unwrap();
    });
    let deadline = std::time::Instant::now() + PATIENCE;
    while TcpStream::connect(addr).is_err() {
        assert!(std::time::Instant::now() < deadline, "node did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (addr, tx)
}

/// Sends `head` (and `body`), then reads until the server closes the connection.
async fn exchange(addr: SocketAddr, head: String, body: Vec<u8>) -> String {
    tokio::task::spawn_blocking(move || {
        let mut c = TcpStream::connect(addr).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(&body).unwrap();
        c.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut got = Vec::new();
        let _ = c.read_to_end(&mut got);
        String::from_utf8_lossy(&got).into_owned()
    })
    .await
    .unwrap()
}

fn request(method: &str, path: &str, host: &str, extra: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nhost: {host}\r\n{extra}connection: close\r\n\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_cannot_drive_a_local_node() {
    let (addr, _stop) = start(Config {
        allowed_hosts: vec!["pico.internal".into()],
        http_address: Some("http://node1.example:4437".into()),
        body_min_rate: 1000,
        body_rate_grace: Duration::from_millis(300),
        ..Config::default()
    })
    .await;
    let local = format!("127.0.0.1:{}", addr.port());
    let got = exchange(addr, request("PUT", "/s", &local, ""), vec![]).await;
    assert!(got.starts_with("HTTP/1.1 201"), "{got}");

    // A page from elsewhere: no grant, and not served.
    let page = "origin: https://example.com\r\n";
    let got = exchange(addr, request("GET", "/", &local, page), vec![]).await;
    assert!(got.starts_with("HTTP/1.1 403"), "{got}");
    assert!(
        !got.to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{got}"
    );
    let preflight = "origin: https://example.com\r\naccess-control-request-method: DELETE\r\n";
    let got = exchange(addr, request("OPTIONS", "/s", &local, preflight), vec![]).await;
    assert!(got.starts_with("HTTP/1.1 204"), "{got}");
    assert!(
        !got.to_ascii_lowercase()
            .contains("access-control-allow-origin"),
        "{got}"
    );

    // A rebound name: refused. Loopback names, --allowed-hosts and --http-address's host: served.
    let got = exchange(addr, request("GET", "/", "evil.example:4437", ""), vec![]).await;
    assert!(got.starts_with("HTTP/1.1 421"), "{got}");
    for host in ["localhost:4437", "pico.internal", "node1.example:4437"] {
        let got = exchange(addr, request("GET", "/", host, ""), vec![]).await;
        assert!(got.starts_with("HTTP/1.1 200"), "{host}: {got}");
    }

    // A body trickling in (ten bytes a second of a declared megabyte) is cut off.
    let addr2 = addr;
    let got = tokio::task::spawn_blocking(move || {
        let mut c = TcpStream::connect(addr2).unwrap();
        let head = "POST /s HTTP/1.1\r\nhost: localhost\r\ncontent-length: 1000000\r\n\r\n";
        c.write_all(head.as_bytes()).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 1024];
        let until = std::time::Instant::now() + PATIENCE;
        while std::time::Instant::now() < until {
            match c.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if c.write_all(b"x").is_err() {
                        // Refused: what the server answered is in the socket.
                        c.set_read_timeout(Some(PATIENCE)).unwrap();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    let _ = c.write_all(b"x");
                }
                Err(_) => break,
            }
        }
        String::from_utf8_lossy(&got).into_owned()
    })
    .await
    .unwrap();
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("too slow"), "{got}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_origins_grant_a_web_app() {
    let (addr, _stop) = start(Config {
        cors_origins: vec!["https://app.example.com".into()],
        ..Config::default()
    })
    .await;
    let app = "origin: https://app.example.com\r\n";
    let got = exchange(addr, request("GET", "/", "localhost", app), vec![]).await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert!(
        got.to_ascii_lowercase()
            .contains("access-control-allow-origin: https://app.example.com"),
        "{got}"
    );
}

/// The header names of an HTTP/1.1 answer in order (`date` and `connection` left out: hyper's),
/// and its body.
fn head_and_body(answer: &str) -> (Vec<String>, String) {
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((answer, ""));
    let names = head
        .lines()
        .skip(1)
        .map(|l| l.split(':').next().unwrap_or_default().to_ascii_lowercase())
        .filter(|n| n != "date" && n != "connection")
        .collect();
    (names, body.to_string())
}

/// The hot path's answers leave the listener sealed as the router's would be: the listener
/// seals them once (`Content-Length` last, after the CORS headers; no body for `HEAD`), and
/// the hot path itself no longer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_answers_are_sealed_on_the_wire() {
    let (addr, _stop) = start(Config::default()).await;
    let text = "content-type: text/plain\r\ncontent-length: 2\r\n";
    let created = exchange(
        addr,
        request(
            "PUT",
            "/v1/stream/s",
            "localhost",
            "content-type: text/plain\r\n",
        ),
        vec![],
    )
    .await;
    assert!(created.starts_with("HTTP/1.1 201"), "{created}");
    let got = exchange(
        addr,
        request("POST", "/v1/stream/s", "localhost", text),
        b"hi".to_vec(),
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 204"), "{got}");
    // hyper leaves `Content-Length` out of a 204.
    let common = ["x-content-type-options", "cross-origin-resource-policy"];
    let mut want = vec!["stream-next-offset", "cache-control"];
    want.extend(common);
    assert_eq!(
        head_and_body(&got),
        (want.iter().map(|s| s.to_string()).collect(), "".into())
    );

    let got = exchange(
        addr,
        request("HEAD", "/v1/stream/s", "localhost", ""),
        vec![],
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let mut want = vec!["content-type", "stream-next-offset", "cache-control"];
    want.extend(common);
    want.push("content-length");
    let (names, body) = head_and_body(&got);
    assert_eq!(names, want, "{got}");
    assert!(got.contains("content-length: 0\r\n"), "{got}");
    assert_eq!(body, "");

    let got = exchange(
        addr,
        request("GET", "/v1/stream/s?offset=-1", "localhost", ""),
        vec![],
    )
    .await;
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    let (names, body) = head_and_body(&got);
    assert_eq!(
        names.last().map(String::as_str),
        Some("content-length"),
        "{got}"
    );
    assert_eq!(body, "hi");
    assert!(got.contains("content-length: 2\r\n"), "{got}");
}
