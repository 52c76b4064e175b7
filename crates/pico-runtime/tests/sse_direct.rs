//! DS SSE over HTTP/1.1 with the subscribers' connections lent to their hub
//! (`pico_runtime::direct`): the hub writes each event's chunk straight to the sockets. On the
//! wire nothing may change: same bytes as a response hyper writes alone, valid chunking, the
//! connection handed back for keep-alives, the deadline, a close and a pipelined request, a
//! client that stops reading caught up through the ordinary path, a dropped client's hub gone.

use std::net::SocketAddr;
use std::time::Duration;

use pico_common::StreamName;
use pico_http::HttpOptions;
use pico_protocol::Record;
use pico_runtime::host::HostPolicy;
use pico_runtime::listener::{ListenOptions, Timeouts, serve};
use pico_server::testing::start_test_node_with;
use pico_server::{AppendRequest, CreateConfig, CreateRequest, Node, NodeConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Far above anything under test, so a loaded machine does not fail it.
const PATIENCE: Duration = Duration::from_secs(20);

const STREAM: &str = "/v1/stream/live";

/// A node with `config` behind the real listener; it stops when the sender is dropped.
async fn server(config: NodeConfig) -> (SocketAddr, Node, watch::Sender<bool>) {
    let node = start_test_node_with(config).await;
    node.create(CreateRequest {
        name: StreamName::parse("live").unwrap(),
        config: CreateConfig {
            content_type: Some("text/plain".into()),
            ..CreateConfig::default()
        },
        initial: vec![],
    })
    .await
    .unwrap();
    let app = pico_http::protocol_router(node.clone(), HttpOptions::default());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = watch::channel(false);
    let opts = ListenOptions {
        http2_max_streams: 16,
    };
    let hosts = HostPolicy::for_listener(addr, &[]);
    tokio::spawn(serve(
        listener,
        app,
        opts,
        Timeouts::default(),
        hosts,
        stop_rx,
    ));
    (addr, node, stop_tx)
}

async fn append(node: &Node, values: &[String], close: bool) {
    node.append(AppendRequest {
        name: StreamName::parse("live").unwrap(),
        records: values
            .iter()
            .map(|v| Record::from_value(v.clone()))
            .collect(),
        producer: None,
        match_seq: None,
        close,
        content_type: None,
    })
    .await
    .unwrap();
}

/// Waits until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A raw HTTP client that checks the chunked framing byte by byte.
struct Client {
    tcp: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    async fn connect(addr: SocketAddr, rcvbuf: Option<usize>) -> Client {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        if let Some(n) = rcvbuf {
            sock.set_recv_buffer_size(n as u32).unwrap();
        }
        Client {
            tcp: sock.connect(addr).await.unwrap(),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, req: &str) {
        self.tcp.write_all(req.as_bytes()).await.unwrap();
    }

    /// Reads more; false at EOF.
    async fn fill(&mut self) -> bool {
        let mut b = [0u8; 16 * 1024];
        let n = tokio::time::timeout(PATIENCE, self.tcp.read(&mut b))
            .await
            .expect("server answered in time")
            .unwrap();
        self.buf.extend_from_slice(&b[..n]);
        n > 0
    }

    /// The next `n` bytes.
    async fn take(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            assert!(self.fill().await, "eof before {n} bytes");
        }
        self.buf.drain(..n).collect()
    }

    /// The next line, without its CRLF.
    async fn line(&mut self) -> String {
        loop {
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let l: Vec<u8> = self.buf.drain(..i + 2).collect();
                return String::from_utf8(l[..i].to_vec()).unwrap();
            }
            assert!(self.fill().await, "eof inside a line");
        }
    }

    /// A response head (status line and headers).
    async fn head(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            let l = self.line().await;
            if l.is_empty() {
                return lines;
            }
            lines.push(l.to_ascii_lowercase());
        }
    }

    /// The next chunk of a chunked body, `None` after the last (`0\r\n\r\n`). Exactly as hyper
    /// frames one: upper-case hex size, no extensions, never empty.
    async fn chunk(&mut self) -> Option<Vec<u8>> {
        let size = self.line().await;
        assert!(
            !size.is_empty() && size.bytes().all(|c| matches!(c, b'0'..=b'9' | b'A'..=b'F')),
            "bad chunk size line {size:?}"
        );
        let n = usize::from_str_radix(&size, 16).unwrap();
        if n == 0 {
            assert_eq!(self.line().await, "", "no trailers");
            return None;
        }
        let data = self.take(n).await;
        assert_eq!(self.take(2).await, b"\r\n", "chunk not closed by CRLF");
        Some(data)
    }
}

/// An SSE subscriber on its own connection.
struct Sse {
    c: Client,
    body: Vec<u8>,
    ended: bool,
}

impl Sse {
    /// Opens `GET {STREAM}?{query}` over HTTP/1.1 (`extra` is sent right after it:
    /// a pipelined request).
    async fn open(addr: SocketAddr, query: &str, rcvbuf: Option<usize>, extra: &str) -> Sse {
        let mut c = Client::connect(addr, rcvbuf).await;
        c.send(&format!(
            "GET {STREAM}?{query} HTTP/1.1\r\nhost: localhost\r\n\r\n{extra}"
        ))
        .await;
        let head = c.head().await;
        assert_eq!(head[0], "http/1.1 200 ok", "{head:?}");
        assert!(head.contains(&"transfer-encoding: chunked".to_string()));
        Sse {
            c,
            body: Vec::new(),
            ended: false,
        }
    }

    /// Reads chunks until the body holds `needle` or the response ends.
    async fn read_until(&mut self, needle: &str) -> bool {
        loop {
            if find(&self.body, needle) {
                return true;
            }
            if self.ended {
                return false;
            }
            self.next_chunk().await;
        }
    }

    async fn next_chunk(&mut self) {
        match self.c.chunk().await {
            Some(d) => self.body.extend_from_slice(&d),
            None => self.ended = true,
        }
    }

    async fn read_to_end(&mut self) {
        while !self.ended {
            self.next_chunk().await;
        }
    }
}

fn find(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// `(event, data)` of every event in an SSE body.
fn events(body: &[u8]) -> Vec<(String, String)> {
    let text = std::str::from_utf8(body).unwrap();
    assert!(text.is_empty() || text.ends_with("\n\n"), "cut event");
    text.split_terminator("\n\n")
        .map(|block| {
            let mut event = String::new();
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    event = e.to_string();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.to_string());
                }
            }
            (event, data.join("\n"))
        })
        .collect()
}

/// The stream's content as the data events carry it, and the control events' offsets.
fn content(body: &[u8]) -> (String, Vec<String>) {
    let mut data = String::new();
    let mut offsets = Vec::new();
    for (event, payload) in events(body) {
        match event.as_str() {
            "data" => data.push_str(&payload),
            "control" => {
                let v: serde_json::Value = serde_json::from_str(&payload).unwrap();
                offsets.push(v["streamNextOffset"].as_str().unwrap().to_string());
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    (data, offsets)
}

/// A lent subscriber's body against the one hyper wrote alone. The hub groups the appends that
/// arrive while a subscriber's previous write is in flight into one data event, so on a loaded
/// machine two subscribers can see the same records grouped differently, each grouping
/// correct. What must hold whatever the grouping: the same records in order, every control
/// event right after the records it follows (its offset is the count delivered so far), the
/// same ending, and every event both bodies carry (a data event of the same records, a control
/// event of the same offset) byte for byte the same.
fn same_stream_as(body: &[u8], reference: &[u8]) {
    let lent = events(body);
    let plain = events(reference);
    assert_eq!(
        content(body).0,
        content(reference).0,
        "the same records in order"
    );
    let mut delivered = 0u64;
    let mut same = 0usize;
    for (event, payload) in &lent {
        if event == "data" {
            delivered += payload.matches('<').count() as u64;
        } else {
            let v: serde_json::Value = serde_json::from_str(payload).unwrap();
            assert_eq!(
                v["streamNextOffset"].as_str().unwrap(),
                pico_protocol::format_offset(delivered),
                "a control event's offset is the count of records before it"
            );
            let twin = plain.iter().filter(|(e, _)| e == "control").find(|(_, p)| {
                let w: serde_json::Value = serde_json::from_str(p).unwrap();
                w["streamNextOffset"] == v["streamNextOffset"]
                    && w["streamClosed"] == v["streamClosed"]
            });
            if let Some((_, p)) = twin {
                assert_eq!(p, payload, "the same control event, byte for byte");
            }
        }
        same += usize::from(plain.contains(&(event.clone(), payload.clone())));
    }
    assert_eq!(lent.last(), plain.last(), "the same close");
    assert!(same > 0, "no event in common with hyper's body");
}

fn values(range: std::ops::Range<usize>, pad: usize) -> Vec<String> {
    range
        .map(|i| format!("<{i}:{}>", "x".repeat(pad)))
        .collect()
}

/// Subscribers whose connection the hub writes get the body of one hyper writes alone (an
/// HTTP/1.0 request never lends; byte for byte wherever both group the records alike, see
/// `same_stream_as`), in valid chunks, over many events and
/// through the close that ends it; and they stay lent while events flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lent_connection_carries_the_bytes_hyper_would_write() {
    let (addr, node, _stop) = server(NodeConfig::default()).await;
    let mut subs = Vec::new();
    for _ in 0..3 {
        subs.push(Sse::open(addr, "offset=-1&live=sse", None, "").await);
    }
    let mut plain = Client::connect(addr, None).await;
    plain
        .send(&format!(
            "GET {STREAM}?offset=-1&live=sse HTTP/1.0\r\nhost: localhost\r\n\r\n"
        ))
        .await;
    let hubs = node.hubs().clone();
    until("three connections lent", || hubs.lent() == 3).await;
    let all = values(0..300, 3);
    for (i, v) in all.iter().enumerate() {
        append(&node, std::slice::from_ref(v), false).await;
        // Paced well inside a slot's capacity: a subscriber 64 deliveries behind (a starved
        // task on a loaded machine) would read for itself and group the events differently,
        // which is correct but not the byte-for-byte comparison this test makes.
        if i % 16 == 15 {
            for s in &mut subs {
                assert!(s.read_until(v).await);
            }
        }
        if i == 150 {
            for s in &mut subs {
                assert!(s.read_until(v).await);
            }
            assert_eq!(hubs.lent(), 3, "lent while events flow");
        }
    }
    for s in &mut subs {
        assert!(s.read_until(all.last().unwrap()).await);
    }
    // Let the last events' connections be lent again before the close.
    until("lent again", || hubs.lent() == 3).await;
    append(&node, &[], true).await;
    let head = plain.head().await;
    assert!(head[0].starts_with("http/1.0 200"), "{head:?}");
    while plain.fill().await {}
    let reference = std::mem::take(&mut plain.buf);
    let (data, offsets) = content(&reference);
    assert_eq!(data, all.concat());
    assert_eq!(offsets.last().unwrap(), &pico_protocol::format_offset(300));
    for s in &mut subs {
        s.read_to_end().await;
        same_stream_as(&s.body, &reference);
    }
    until("hub gone", || hubs.is_empty()).await;
}

/// A lent connection goes back to hyper for the keep-alive (then is lent again), for the
/// deadline's end, and the request pipelined behind the SSE request is answered after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_the_deadline_and_a_pipelined_request_follow_a_lent_response() {
    let config = NodeConfig {
        long_poll_timeout: Duration::from_millis(300),
        sse_max_duration: Duration::from_secs(4),
        ..NodeConfig::default()
    };
    let (addr, node, _stop) = server(config).await;
    let next = format!("GET {STREAM}?offset=-1 HTTP/1.1\r\nhost: localhost\r\n\r\n");
    let mut s = Sse::open(addr, "offset=-1&live=sse", None, &next).await;
    let hubs = node.hubs().clone();
    until("lent", || hubs.lent() == 1).await;
    let first = values(0..20, 10);
    for v in &first {
        append(&node, std::slice::from_ref(v), false).await;
    }
    assert!(s.read_until(first.last().unwrap()).await);
    // Idle past the keep-alive interval: a control with no data before it, then lent again.
    let keepalive = format!(
        "\"streamNextOffset\":\"{}\",\"upToDate\":true}}\n\nevent: control\n",
        pico_protocol::format_offset(20)
    );
    assert!(s.read_until(&keepalive).await, "no keep-alive");
    until("lent after the keep-alive", || hubs.lent() == 1).await;
    let second = values(20..40, 10);
    for v in &second {
        append(&node, std::slice::from_ref(v), false).await;
    }
    // The deadline ends the response; the pipelined read is answered next.
    s.read_to_end().await;
    let (data, offsets) = content(&s.body);
    assert_eq!(data, [first, second].concat().concat());
    assert_eq!(offsets.last().unwrap(), &pico_protocol::format_offset(40));
    let mut sorted = offsets.clone();
    sorted.sort();
    assert_eq!(sorted, offsets, "offsets in order");
    let head = s.c.head().await;
    assert_eq!(head[0], "http/1.1 200 ok", "{head:?}");
    let len: usize = head
        .iter()
        .find_map(|h| h.strip_prefix("content-length: "))
        .expect("a catch-up read has a length")
        .parse()
        .unwrap();
    let body = s.c.take(len).await;
    assert!(find(&body, "<39:"), "{}", String::from_utf8_lossy(&body));
}

/// A client that stops reading (small receive buffer) while thousands of events go out:
/// the hub leaves what the socket does not take pending, then refuses, and the subscriber
/// takes its connection back and catches up by itself. Once it reads again it gets every
/// record once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_falls_back_and_misses_nothing() {
    let (addr, node, _stop) = server(NodeConfig::default()).await;
    let mut s = Sse::open(addr, "offset=-1&live=sse", Some(4096), "").await;
    let hubs = node.hubs().clone();
    until("lent", || hubs.lent() == 1).await;
    let all = values(0..5000, 1000);
    for v in &all {
        append(&node, std::slice::from_ref(v), false).await;
    }
    append(&node, &[], true).await;
    s.read_to_end().await;
    let (data, offsets) = content(&s.body);
    assert!(data == all.concat(), "content differs");
    assert_eq!(offsets.last().unwrap(), &pico_protocol::format_offset(5000));
    until("hub gone", || hubs.is_empty()).await;
}

/// A client gone mid-stream: its connection ends, its subscription with it, and the hub of
/// the stream nobody follows any more stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_client_frees_its_hub() {
    let (addr, node, _stop) = server(NodeConfig::default()).await;
    let s = Sse::open(addr, "offset=-1&live=sse", None, "").await;
    let hubs = node.hubs().clone();
    until("lent", || hubs.lent() == 1).await;
    drop(s);
    append(&node, &values(0..3, 10), false).await;
    until("hub gone", || hubs.is_empty()).await;
}
