//! The Pico protocol end to end through the router, against a real node (in-memory storage,
//! SQLite metadata log). Each test names the protocol row it pins.

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, Method, Request, StatusCode};
use bytes::Bytes;
use pico_http::{HttpOptions, admin_router, protocol_router};
use pico_protocol::{Record, decode_binary, encode_binary};
use pico_server::testing::{start_test_node, start_test_node_with};
use pico_server::{Node, NodeConfig};
use serde_json::{Value, json};
use tower::ServiceExt;

#[path = "common/app.rs"]
mod app;
use app::App;

struct Resp {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Resp {
    fn h(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {:?}", self.body))
    }
    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }
}

async fn app() -> (pico_http::fast::Protocol, Node) {
    let node = start_test_node().await;
    (protocol_router(node.clone(), HttpOptions::default()), node)
}

async fn app_with(config: NodeConfig) -> pico_http::fast::Protocol {
    let node = start_test_node_with(config).await;
    protocol_router(node, HttpOptions::default())
}

async fn send(app: &impl App, req: Request<Body>) -> Resp {
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = axum::body::to_bytes(resp.into_body(), usize::MAX)
        .await
        .unwrap();
    Resp {
        status,
        headers,
        body,
    }
}

fn req(
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: impl Into<Body>,
) -> Request<Body> {
    let mut b = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(body.into()).unwrap()
}

async fn put(app: &impl App, uri: &str, headers: &[(&str, &str)]) -> Resp {
    send(app, req(Method::PUT, uri, headers, Body::empty())).await
}

async fn post(app: &impl App, uri: &str, headers: &[(&str, &str)], body: impl Into<Body>) -> Resp {
    send(app, req(Method::POST, uri, headers, body)).await
}

async fn get(app: &impl App, uri: &str) -> Resp {
    send(app, req(Method::GET, uri, &[], Body::empty())).await
}

fn assert_error(r: &Resp, status: u16, code: &str) {
    assert_eq!(
        r.status.as_u16(),
        status,
        "body: {}",
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.json()["error"], code);
    assert!(r.json()["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(r.h("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.h("content-type"), Some("application/json"));
}

#[tokio::test]
async fn create_is_idempotent_and_conflicts_on_different_config() {
    let (app, _) = app().await;
    let r = put(&app, "/orders/1", &[("content-type", "text/plain")]).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.h("location"), Some("/orders/1"));
    assert_eq!(r.h("pico-next-seq"), Some("0"));
    assert_eq!(r.h("cache-control"), Some("no-store"));
    let r = put(&app, "/orders/1", &[("content-type", "text/plain")]).await;
    assert_eq!(r.status, 200);
    assert!(r.h("location").is_none());
    let r = put(&app, "/orders/1", &[("content-type", "application/json")]).await;
    assert_error(&r, 409, "conflict");
    let r = put(
        &app,
        "/orders/1",
        &[("content-type", "text/plain"), ("pico-ttl", "60")],
    )
    .await;
    assert_error(&r, 409, "conflict");
}

#[tokio::test]
async fn create_rejects_bad_headers_and_names() {
    let (app, _) = app().await;
    for (h, v) in [
        ("pico-ttl", "1.5"),
        ("pico-ttl", "-1"),
        ("pico-ttl", "01"),
        ("pico-expires-at", "next tuesday"),
        ("pico-closed", "maybe"),
        ("content-type", "nonsense"),
    ] {
        assert_error(&put(&app, "/s", &[(h, v)]).await, 400, "bad_request");
    }
    let both = put(
        &app,
        "/s",
        &[
            ("pico-ttl", "5"),
            ("pico-expires-at", "2099-01-01T00:00:00Z"),
        ],
    )
    .await;
    assert_error(&both, 400, "bad_request");
    assert_error(&put(&app, "/a/../b", &[]).await, 400, "bad_request");
    assert_error(&put(&app, "/a|b", &[]).await, 400, "bad_request");
    assert_error(&put(&app, "/_sys/x", &[]).await, 400, "bad_request");
    assert_error(&put(&app, "/_groups/x", &[]).await, 400, "bad_request");
    // The DS mount point itself is a reserved name (DS paths below it are the DS router's):
    // never created, so never found.
    assert_error(&put(&app, "/v1/stream", &[]).await, 400, "bad_request");
    assert_error(&get(&app, "/v1/stream").await, 404, "not_found");
}

#[tokio::test]
async fn raw_append_and_json_read() {
    let (app, _) = app().await;
    put(&app, "/s", &[("content-type", "text/plain")]).await;
    let r = post(
        &app,
        "/s",
        &[("content-type", "text/plain"), ("pico-key", "k1")],
        "hello",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("pico-start-seq"), Some("0"));
    assert_eq!(r.h("pico-next-seq"), Some("1"));
    assert!(r.h("pico-timestamp").unwrap().parse::<i64>().unwrap() > 0);
    assert_eq!(r.h("cache-control"), Some("no-store"));
    // Request Content-Type is ignored for raw appends.
    let r = post(
        &app,
        "/s",
        &[("content-type", "application/weird")],
        &b"\xff\x00"[..],
    )
    .await;
    assert_eq!(r.h("pico-start-seq"), Some("1"));

    let r = get(&app, "/s").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("content-type"), Some("application/json"));
    assert_eq!(r.h("pico-next-seq"), Some("2"));
    assert_eq!(r.h("pico-up-to-date"), Some("true"));
    assert!(r.h("pico-closed").is_none());
    let v = r.json();
    assert_eq!(v[0]["seq"], 0);
    assert_eq!(v[0]["body"], "hello");
    assert_eq!(v[0]["key"], "k1");
    assert!(v[0]["timestamp"].as_i64().unwrap() > 0);
    assert_eq!(v[1]["seq"], 1);
    assert_eq!(v[1]["body_b64"], "/wA=");

    let r = get(&app, "/s?seq=1&count=1").await;
    assert_eq!(r.json().as_array().unwrap().len(), 1);
    assert_eq!(r.json()[0]["seq"], 1);
    let r = get(&app, "/s?count=1").await;
    assert_eq!(r.h("pico-next-seq"), Some("1"));
    assert!(r.h("pico-up-to-date").is_none());

    assert_error(&post(&app, "/missing", &[], "x").await, 404, "not_found");
    assert_error(&get(&app, "/missing").await, 404, "not_found");
}

#[tokio::test]
async fn json_batch_append() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    let body = json!({"records":[
        {"body":"a","headers":{"h":"1"},"key":"k"},
        {"body_b64":"/wA="},
        {"body":"c"}
    ]});
    let r = post(
        &app,
        "/s",
        &[
            ("content-type", "application/vnd.picomq.batch+json"),
            ("pico-key", "dflt"),
        ],
        body.to_string(),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("pico-start-seq"), Some("0"));
    assert_eq!(r.h("pico-next-seq"), Some("3"));
    let v = get(&app, "/s").await.json();
    assert_eq!(v[0]["headers"], json!({"h":"1"}));
    assert_eq!(v[0]["key"], "k");
    assert_eq!(v[1]["body_b64"], "/wA=");
    // Pico-Key fills in records that carry no key.
    assert_eq!(v[1]["key"], "dflt");
    assert_eq!(v[2]["body"], "c");

    let bad = post(
        &app,
        "/s",
        &[("content-type", "application/vnd.picomq.batch+json")],
        r#"{"records":[{"body":"a"},{"body":7}]}"#,
    )
    .await;
    assert_error(&bad, 400, "bad_request");
    assert!(bad.json()["message"].as_str().unwrap().contains("index=1"));
    let empty = post(
        &app,
        "/s",
        &[("content-type", "application/vnd.picomq.batch+json")],
        r#"{"records":[]}"#,
    )
    .await;
    assert_error(&empty, 400, "bad_request");
    assert_error(&post(&app, "/s", &[], "").await, 400, "bad_request");
}

#[tokio::test]
async fn binary_batch_append_and_binary_and_raw_reads() {
    let (app, _) = app().await;
    put(&app, "/s", &[("content-type", "text/plain")]).await;
    let recs = [
        Record {
            timestamp_ms: 0,
            key: None,
            value: Bytes::from_static(b"one\n"),
            headers: vec![("h".into(), Bytes::from_static(b"v"))],
        },
        Record::from_value(Bytes::from_static(b"two\n")),
    ];
    let body = encode_binary(recs.iter().map(|r| (99, r))).unwrap();
    let r = post(
        &app,
        "/s",
        &[("content-type", "application/vnd.picomq.batch")],
        body,
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("pico-next-seq"), Some("2"));

    let r = get(&app, "/s?format=binary").await;
    assert_eq!(r.h("content-type"), Some("application/vnd.picomq.batch"));
    let got = decode_binary(&r.body).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!((got[0].0, got[1].0), (0, 1));
    assert_eq!(got[0].1.value, recs[0].value);
    assert_eq!(got[0].1.headers, recs[0].headers);
    assert!(got[1].1.timestamp_ms > 0);

    let r = get(&app, "/s?format=raw").await;
    assert_eq!(r.h("content-type"), Some("text/plain"));
    assert_eq!(r.text(), "one\ntwo\n");

    let bad = post(
        &app,
        "/s",
        &[("content-type", "application/vnd.picomq.batch")],
        &b"\x01\x00"[..],
    )
    .await;
    assert_error(&bad, 400, "bad_request");
}

#[tokio::test]
async fn read_query_validation() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    for q in [
        "seq=abc",
        "seq=-1",
        "seq=1.0",
        "count=0",
        "count=x",
        "bytes=0",
        "format=xml",
        "live=forever",
        "cursor=x",
        "seq=1&seq=2",
        "live=sse&format=raw",
    ] {
        assert_error(&get(&app, &format!("/s?{q}")).await, 400, "bad_request");
    }
    // Unknown parameters (cache busters) are ignored.
    assert_eq!(get(&app, "/s?_=123").await.status, 200);
}

#[tokio::test]
async fn catch_up_reads_are_cacheable_with_etag() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    post(&app, "/s", &[], "a").await;
    let r = get(&app, "/s?seq=0").await;
    assert_eq!(
        r.h("cache-control"),
        Some("public, max-age=60, stale-while-revalidate=300")
    );
    let etag = r.h("etag").unwrap().to_string();
    let r304 = send(
        &app,
        req(
            Method::GET,
            "/s?seq=0",
            &[("if-none-match", &etag)],
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(r304.status, 304);
    assert!(r304.body.is_empty());
    assert_eq!(r304.h("etag"), Some(etag.as_str()));
    // Other formats and later tails are other representations.
    assert_ne!(
        get(&app, "/s?seq=0&format=raw").await.h("etag"),
        Some(etag.as_str())
    );
    post(&app, "/s", &[], "b").await;
    let r = send(
        &app,
        req(
            Method::GET,
            "/s?seq=0",
            &[("if-none-match", &etag)],
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
    assert_ne!(r.h("etag"), Some(etag.as_str()));
    // Closing changes the tag of the final chunk.
    let open_tag = get(&app, "/s?seq=0").await.h("etag").unwrap().to_string();
    post(&app, "/s", &[("pico-closed", "true")], "").await;
    let closed = get(&app, "/s?seq=0").await;
    assert_eq!(closed.h("pico-closed"), Some("true"));
    assert_ne!(closed.h("etag"), Some(open_tag.as_str()));

    let now = get(&app, "/s?seq=now").await;
    assert_eq!(now.status, 200);
    assert_eq!(now.h("cache-control"), Some("no-store"));
    assert!(now.h("etag").is_none());
    assert_eq!(now.h("pico-next-seq"), Some("2"));
    assert_eq!(now.json(), json!([]));
}

#[tokio::test]
async fn close_then_append_is_409_and_readers_see_closed() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    let r = post(&app, "/s", &[("pico-closed", "true")], "last").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("pico-closed"), Some("true"));
    assert_eq!(r.h("pico-next-seq"), Some("1"));
    let r = post(&app, "/s", &[], "more").await;
    assert_error(&r, 409, "closed");
    assert_eq!(r.json()["next_seq"], 1);
    assert_eq!(r.h("pico-next-seq"), Some("1"));
    let r = get(&app, "/s?seq=0").await;
    assert_eq!(r.h("pico-closed"), Some("true"));
    assert_eq!(r.h("pico-up-to-date"), Some("true"));
    // Close-only on an already closed stream is refused too.
    assert_error(
        &post(&app, "/s", &[("pico-closed", "true")], "").await,
        409,
        "closed",
    );
    // A stream created closed.
    let r = put(&app, "/c", &[("pico-closed", "true")]).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.h("pico-closed"), Some("true"));
}

#[tokio::test]
async fn long_poll_times_out_with_204_and_wakes_on_append() {
    let (app, node) = app().await;
    put(&app, "/s", &[]).await;
    let started = std::time::Instant::now();
    let r = get(&app, "/s?seq=0&live=long-poll").await;
    assert_eq!(r.status, 204);
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "did not wait"
    );
    assert_eq!(r.h("pico-next-seq"), Some("0"));
    assert_eq!(r.h("pico-up-to-date"), Some("true"));
    assert!(
        r.h("pico-cursor")
            .unwrap()
            .bytes()
            .all(|b| b.is_ascii_digit())
    );
    assert_eq!(r.h("cache-control"), Some("no-store"));

    let app2 = app.clone();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        post(&app2, "/s", &[], "woke").await
    });
    let r = get(&app, "/s?seq=now&live=long-poll").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()[0]["body"], "woke");
    assert_eq!(r.h("pico-next-seq"), Some("1"));
    assert!(r.h("pico-cursor").is_some());
    assert_eq!(writer.await.unwrap().status, 200);

    // Data already there: immediate 200.
    let r = get(&app, "/s?seq=0&live=long-poll").await;
    assert_eq!(r.status, 200);
    // Closed and at the tail: immediate 204 with Pico-Closed.
    post(&app, "/s", &[("pico-closed", "true")], "").await;
    let started = std::time::Instant::now();
    let r = get(&app, "/s?seq=1&live=long-poll").await;
    assert_eq!(r.status, 204);
    assert_eq!(r.h("pico-closed"), Some("true"));
    assert!(started.elapsed() < Duration::from_millis(400));
    drop(node);
}

#[tokio::test]
async fn long_poll_cursor_moves_forward_when_echoed() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    post(&app, "/s", &[], "x").await;
    let c1: u64 = get(&app, "/s?seq=0&live=long-poll")
        .await
        .h("pico-cursor")
        .unwrap()
        .parse()
        .unwrap();
    let c2: u64 = get(&app, &format!("/s?seq=0&live=long-poll&cursor={c1}"))
        .await
        .h("pico-cursor")
        .unwrap()
        .parse()
        .unwrap();
    assert!(c2 > c1, "{c2} > {c1}");
}

fn sse_events(text: &str) -> Vec<(String, Option<String>, Value)> {
    text.split("\n\n")
        .filter(|e| e.contains("event:"))
        .map(|e| {
            let mut event = String::new();
            let mut id = None;
            let mut data = String::new();
            for line in e.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_string();
                } else if let Some(v) = line.strip_prefix("id:") {
                    id = Some(v.trim().to_string());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim_start());
                }
            }
            (event, id, serde_json::from_str(&data).unwrap())
        })
        .collect()
}

#[tokio::test]
async fn sse_sends_data_then_control_and_ends_at_close() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    post(&app, "/s", &[], "a").await;
    post(&app, "/s", &[("pico-closed", "true")], "b").await;
    let r = get(&app, "/s?seq=0&live=sse").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("content-type"), Some("text/event-stream"));
    assert_eq!(r.h("cache-control"), Some("no-store"));
    let ev = sse_events(r.text());
    assert_eq!(ev.len(), 2, "{}", r.text());
    assert_eq!(ev[0].0, "data");
    assert_eq!(ev[0].1.as_deref(), Some("2"));
    assert_eq!(ev[0].2[0]["body"], "a");
    assert_eq!(ev[0].2[1]["body"], "b");
    assert_eq!(ev[1].0, "control");
    assert_eq!(
        ev[1].2,
        json!({"next_seq":2,"up_to_date":true,"closed":true})
    );

    // Resume with Last-Event-ID: only what follows.
    let r = send(
        &app,
        req(
            Method::GET,
            "/s?seq=0&live=sse",
            &[("last-event-id", "1")],
            Body::empty(),
        ),
    )
    .await;
    let ev = sse_events(r.text());
    assert_eq!(ev[0].2.as_array().unwrap().len(), 1);
    assert_eq!(ev[0].2[0]["seq"], 1);
    let r = send(
        &app,
        req(
            Method::GET,
            "/s?live=sse",
            &[("last-event-id", "x")],
            Body::empty(),
        ),
    )
    .await;
    assert_error(&r, 400, "bad_request");
}

/// A record of control bytes renders as JSON at 6× its size: a JSON read and an SSE response
/// send it in bounded pieces, whole and exact, whatever the record size.
#[tokio::test]
async fn large_records_are_rendered_in_bounded_pieces() {
    use futures::StreamExt;
    let (app, _) = app().await;
    put(&app, "/big", &[]).await;
    let big = vec![1u8; 1 << 20];
    assert_eq!(post(&app, "/big", &[], big.clone()).await.status, 200);
    let end = post(&app, "/big", &[("pico-closed", "true")], "end").await;
    assert_eq!(end.status, 200);
    for uri in ["/big?seq=0&format=json", "/big?seq=0&live=sse"] {
        let req = Request::get(uri).body(Body::empty()).unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 200, "{uri}");
        let mut body = resp.into_body().into_data_stream();
        let mut all = Vec::new();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.unwrap();
            assert!(
                chunk.len() <= 256 * 1024,
                "{uri}: a chunk of {} bytes",
                chunk.len()
            );
            all.extend_from_slice(&chunk);
        }
        assert!(all.len() > 6 << 20, "{uri}: {} bytes", all.len());
        let text = String::from_utf8(all).unwrap();
        let records: Vec<Value> = if uri.contains("sse") {
            let ev = sse_events(&text);
            assert_eq!(ev.last().unwrap().2["closed"], true, "{uri}");
            ev.iter()
                .filter(|e| e.0 == "data")
                .flat_map(|e| e.2.as_array().unwrap().clone())
                .collect()
        } else {
            serde_json::from_str::<Value>(&text)
                .unwrap()
                .as_array()
                .unwrap()
                .clone()
        };
        assert_eq!(records[0]["seq"], 0, "{uri}");
        assert_eq!(
            records[0]["body"].as_str().unwrap().as_bytes(),
            &big[..],
            "{uri}"
        );
        if uri.contains("sse") {
            assert_eq!(records.len(), 2);
            assert_eq!(records[1]["body"], "end");
        }
    }
}

#[tokio::test]
async fn sse_follows_live_appends_until_max_duration() {
    let node = start_test_node_with(NodeConfig {
        long_poll_timeout: Duration::from_millis(200),
        sse_max_duration: Duration::from_millis(900),
        ..NodeConfig::default()
    })
    .await;
    let app = protocol_router(node, HttpOptions::default());
    put(&app, "/s", &[]).await;
    let app2 = app.clone();
    let writer = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(150)).await;
        post(&app2, "/s", &[], "live").await
    });
    let started = std::time::Instant::now();
    let r = get(&app, "/s?seq=now&live=sse").await;
    assert!(started.elapsed() >= Duration::from_millis(800));
    assert_eq!(writer.await.unwrap().status, 200);
    let ev = sse_events(r.text());
    assert_eq!(ev[0].0, "control", "{}", r.text());
    assert_eq!(ev[0].2, json!({"next_seq":0,"up_to_date":true}));
    let data: Vec<_> = ev.iter().filter(|e| e.0 == "data").collect();
    assert_eq!(data.len(), 1, "{}", r.text());
    assert_eq!(data[0].2[0]["body"], "live");
    assert_eq!(data[0].1.as_deref(), Some("1"));
    // Every data event is followed by a control event.
    let i = ev.iter().position(|e| e.0 == "data").unwrap();
    assert_eq!(ev[i + 1].0, "control");
    assert_eq!(ev[i + 1].2["next_seq"], 1);
    assert!(ev.iter().all(|e| e.2.get("closed").is_none()));
}

#[tokio::test]
async fn idempotent_producers() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    let p = |epoch: &'static str, seq: &'static str| {
        [
            ("pico-producer-id", "p1"),
            ("pico-producer-epoch", epoch),
            ("pico-producer-seq", seq),
        ]
    };
    let r = post(&app, "/s", &p("1", "0"), "a").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("pico-producer-epoch"), Some("1"));
    assert_eq!(r.h("pico-producer-seq"), Some("0"));
    let dup = post(&app, "/s", &p("1", "0"), "a").await;
    assert_eq!(dup.status, 200);
    assert_eq!(dup.h("pico-next-seq"), Some("1"));
    let gap = post(&app, "/s", &p("1", "5"), "x").await;
    assert_error(&gap, 409, "sequence_gap");
    assert_eq!(gap.h("pico-expected-seq"), Some("1"));
    assert_eq!(gap.h("pico-received-seq"), Some("5"));
    assert_eq!(post(&app, "/s", &p("2", "0"), "b").await.status, 200);
    let fenced = post(&app, "/s", &p("1", "1"), "late").await;
    assert_error(&fenced, 403, "fenced");
    assert_eq!(fenced.h("pico-producer-epoch"), Some("2"));
    let partial = post(&app, "/s", &[("pico-producer-id", "p1")], "x").await;
    assert_error(&partial, 400, "bad_request");
    assert_eq!(get(&app, "/s").await.json().as_array().unwrap().len(), 2);
}

/// A retried producer append is answered with where the original's records lie, marked
/// `Pico-Duplicate: true`; for an older seq than the producer's last, whose place is no longer
/// known, without `Pico-Start-Seq` (and `Pico-Next-Seq` is only the tail).
#[tokio::test]
async fn a_duplicate_append_answers_where_the_original_lies() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    let p = |seq: &'static str| {
        [
            ("pico-producer-id", "p1"),
            ("pico-producer-epoch", "0"),
            ("pico-producer-seq", seq),
        ]
    };
    let offsets = |r: &Resp| {
        (
            r.h("pico-start-seq").map(str::to_string),
            r.h("pico-next-seq").map(str::to_string),
            r.h("pico-duplicate").map(str::to_string),
        )
    };
    let some = |s: &str| Some(s.to_string());
    assert_eq!(post(&app, "/s", &[], "a").await.status, 200);
    let first = post(&app, "/s", &p("0"), "b").await;
    assert_eq!(
        (first.status.as_u16(), offsets(&first)),
        (200, (some("1"), some("2"), None))
    );
    assert_eq!(post(&app, "/s", &[], "c").await.status, 200);
    let dup = post(&app, "/s", &p("0"), "b").await;
    assert_eq!(
        (dup.status.as_u16(), offsets(&dup)),
        (200, (some("1"), some("2"), some("true")))
    );
    assert_eq!(post(&app, "/s", &p("1"), "d").await.status, 200);
    let old = post(&app, "/s", &p("0"), "b").await;
    assert_eq!(
        (old.status.as_u16(), offsets(&old)),
        (200, (None, some("4"), some("true"))),
        "an older seq: no start, the next seq is the tail"
    );
    assert_eq!(old.h("pico-producer-seq"), Some("1"));
    assert_eq!(get(&app, "/s").await.json().as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn match_seq() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    assert_eq!(
        post(&app, "/s", &[("pico-match-seq", "0")], "a")
            .await
            .status,
        200
    );
    let r = post(&app, "/s", &[("pico-match-seq", "0")], "b").await;
    assert_error(&r, 412, "match_failed");
    assert_eq!(r.json()["next_seq"], 1);
    assert_error(
        &post(&app, "/s", &[("pico-match-seq", "x")], "b").await,
        400,
        "bad_request",
    );
}

#[tokio::test]
async fn trim() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    for v in ["a", "b", "c"] {
        post(&app, "/s", &[], v).await;
    }
    let r = post(&app, "/s", &[("pico-trim-seq", "2")], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.h("pico-start-seq"), Some("2"));
    assert_eq!(r.h("pico-next-seq"), Some("3"));
    assert_error(
        &post(&app, "/s", &[("pico-trim-seq", "2")], "body").await,
        400,
        "bad_request",
    );
    assert_error(
        &post(&app, "/s", &[("pico-trim-seq", "9")], "").await,
        400,
        "bad_request",
    );
    // Default start follows the trim; an explicit offset below it is a 400 naming the start.
    let v = get(&app, "/s").await.json();
    assert_eq!(v[0]["seq"], 2);
    assert_eq!(v.as_array().unwrap().len(), 1);
    let r = get(&app, "/s?seq=0").await;
    assert_error(&r, 400, "bad_request");
    assert_eq!(r.json()["next_seq"], 2);
}

#[tokio::test]
async fn head_and_delete() {
    let (app, _) = app().await;
    put(
        &app,
        "/s",
        &[("content-type", "text/plain"), ("pico-ttl", "3600")],
    )
    .await;
    post(&app, "/s", &[], "a").await;
    let r = send(&app, req(Method::HEAD, "/s", &[], Body::empty())).await;
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(r.h("pico-next-seq"), Some("1"));
    assert_eq!(r.h("pico-start-seq"), Some("0"));
    assert_eq!(r.h("content-type"), Some("text/plain"));
    assert_eq!(r.h("pico-ttl"), Some("3600"));
    assert_eq!(r.h("cache-control"), Some("no-store"));
    assert!(r.h("pico-closed").is_none());

    put(&app, "/e", &[("pico-expires-at", "2099-01-01T00:00:00Z")]).await;
    let r = send(&app, req(Method::HEAD, "/e", &[], Body::empty())).await;
    assert_eq!(r.h("pico-expires-at"), Some("2099-01-01T00:00:00.000Z"));

    let r = send(&app, req(Method::DELETE, "/s", &[], Body::empty())).await;
    assert_eq!(r.status, 204);
    let r = send(&app, req(Method::HEAD, "/s", &[], Body::empty())).await;
    assert_eq!(r.status, 404);
    assert_error(
        &send(&app, req(Method::DELETE, "/s", &[], Body::empty())).await,
        404,
        "not_found",
    );
    // The name is reusable at once, and starts empty.
    assert_eq!(put(&app, "/s", &[]).await.status, 201);
    assert_eq!(get(&app, "/s").await.json(), json!([]));
}

#[tokio::test]
async fn list_streams() {
    let (app, _) = app().await;
    for n in ["/a/1", "/a/2", "/b/1"] {
        put(&app, n, &[]).await;
    }
    post(&app, "/a/2", &[], "x").await;
    let v = get(&app, "/?prefix=a").await.json();
    let names: Vec<_> = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["a/1", "a/2"]);
    assert_eq!(v["has_more"], false);
    assert_eq!(v["streams"][1]["next_seq"], 1);
    assert_eq!(v["streams"][1]["content_type"], "application/octet-stream");
    assert_eq!(v["streams"][1]["closed"], false);
    let v = get(&app, "/?limit=1").await.json();
    assert_eq!(v["streams"].as_array().unwrap().len(), 1);
    assert_eq!(v["has_more"], true);
    let v = get(&app, "/?start_after=a/2").await.json();
    assert_eq!(v["streams"][0]["name"], "b/1");
    assert_error(&get(&app, "/?limit=abc").await, 400, "bad_request");
    assert_error(&get(&app, "/?limit=0").await, 400, "bad_request");
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let app = app_with(NodeConfig {
        max_request_size: 16,
        ..NodeConfig::default()
    })
    .await;
    put(&app, "/s", &[]).await;
    assert_eq!(post(&app, "/s", &[], "0123456789abcdef").await.status, 200);
    let r = post(&app, "/s", &[], "0123456789abcdefX").await;
    assert_error(&r, 413, "too_large");
    // Without a Content-Length (streamed body) too.
    let chunks = futures::stream::iter(
        (0..4).map(|_| Ok::<_, std::io::Error>(Bytes::from_static(b"123456"))),
    );
    let r = post(&app, "/s", &[], Body::from_stream(chunks)).await;
    assert_error(&r, 413, "too_large");
}

#[tokio::test]
async fn cors_preflight_and_method_not_allowed() {
    let (app, _) = app().await;
    // A preflight is answered, but without a configured origin it grants nothing.
    let r = send(
        &app,
        req(
            Method::OPTIONS,
            "/any/stream",
            &[("access-control-request-headers", "pico-producer-id")],
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(r.status, 204);
    assert_eq!(r.h("access-control-allow-origin"), None);
    assert!(
        r.h("access-control-allow-headers")
            .unwrap()
            .contains("pico-producer-id")
    );
    assert!(r.h("access-control-allow-methods").unwrap().contains("PUT"));
    let r = get(&app, "/missing").await;
    assert_eq!(r.h("access-control-allow-origin"), None);
    let r = send(&app, req(Method::PATCH, "/s", &[], Body::empty())).await;
    assert_error(&r, 405, "method_not_allowed");
}

#[tokio::test]
async fn admin_health_and_ready() {
    let node = start_test_node().await;
    let admin = admin_router(node, None);
    // No recorder handed over (this test process installs none): a clear 503, not an empty 200.
    let r = send(&admin, req(Method::GET, "/metrics", &[], Body::empty())).await;
    assert_eq!(r.status, 503);
    assert!(r.text().contains("no metrics recorder"), "{}", r.text());
    let r = send(&admin, req(Method::GET, "/health", &[], Body::empty())).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "ok");
    // No CORS on the admin listener: a web page may not read it.
    assert_eq!(r.h("access-control-allow-origin"), None);
    assert_eq!(r.h("x-content-type-options"), Some("nosniff"));
    let r = send(&admin, req(Method::GET, "/ready", &[], Body::empty())).await;
    assert_eq!(r.status, 200);
    let v = r.json();
    assert_eq!(v["ready"], true);
    assert_eq!(v["serving"], true);
    assert_eq!(v["registered"], true);
    assert_eq!(v["nodeId"], 1);
    assert!(v["appliedIndex"].as_u64().is_some());
}

#[tokio::test]
async fn keys_and_headers_count_against_a_reads_byte_budget() {
    let app = app_with(NodeConfig {
        max_chunk_size: 1024,
        ..NodeConfig::default()
    })
    .await;
    put(&app, "/k", &[]).await;
    let key = "k".repeat(10_000);
    let batch = |rec: String| format!(r#"{{"records":[{rec}]}}"#);
    let json = &[("content-type", "application/vnd.picomq.batch+json")];
    for _ in 0..3 {
        let r = post(
            &app,
            "/k",
            json,
            batch(format!(r#"{{"key":"{key}","body":"x"}}"#)),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let header = format!(r#"{{"body":"x","headers":{{"h":"{key}"}}}}"#);
    for _ in 0..3 {
        assert_eq!(
            post(&app, "/k", json, batch(header.clone())).await.status,
            200
        );
    }
    // Each record is over the 1 KiB budget alone: one per read, whatever its body.
    for seq in 0..6 {
        let r = get(&app, &format!("/k?seq={seq}")).await;
        assert_eq!(r.status, 200);
        assert_eq!(r.json().as_array().unwrap().len(), 1, "read from {seq}");
        assert_eq!(r.h("pico-next-seq"), Some((seq + 1).to_string().as_str()));
    }
}

#[tokio::test]
async fn close_only_with_a_batch_content_type_closes() {
    let (app, _) = app().await;
    for (s, t) in [
        ("/cj", "application/vnd.picomq.batch+json"),
        ("/cb", "application/vnd.picomq.batch"),
    ] {
        put(&app, s, &[]).await;
        let r = post(&app, s, &[("content-type", t), ("pico-closed", "true")], "").await;
        assert_eq!(r.status, 200, "{t}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.h("pico-closed"), Some("true"));
        assert_eq!(
            get(&app, &format!("{s}?seq=0")).await.h("pico-closed"),
            Some("true")
        );
        // Without the close an empty batch is still refused.
        let r = post(&app, s, &[("content-type", t)], "").await;
        assert_eq!(r.status, 400);
    }
}

#[tokio::test]
async fn reads_are_capped_by_the_chunk_size_whatever_the_query_asks() {
    let app = app_with(NodeConfig {
        max_chunk_size: 100,
        ..NodeConfig::default()
    })
    .await;
    put(&app, "/big", &[]).await;
    let rec = format!(r#"{{"body":"{}"}}"#, "x".repeat(30));
    let batch = format!(r#"{{"records":[{}]}}"#, vec![rec; 10].join(","));
    let r = post(
        &app,
        "/big",
        &[("content-type", "application/vnd.picomq.batch+json")],
        batch,
    )
    .await;
    assert_eq!(r.h("pico-next-seq"), Some("10"));
    let max = u64::MAX;
    let mut seq = 0;
    let mut seen = 0;
    loop {
        let r = get(&app, &format!("/big?seq={seq}&count={max}&bytes={max}")).await;
        assert_eq!(r.status, 200);
        let n = r.json().as_array().unwrap().len();
        // Three 30-byte records fit in 100 bytes; a fourth would not.
        assert!((1..=3).contains(&n), "read returned {n} records");
        seen += n;
        let next: u64 = r.h("pico-next-seq").unwrap().parse().unwrap();
        assert_eq!(
            next,
            seq + n as u64,
            "next_seq continues where the read stopped"
        );
        seq = next;
        if r.h("pico-up-to-date").is_some() {
            break;
        }
    }
    assert_eq!(seen, 10);
    // A smaller client limit still narrows the read.
    let r = get(&app, "/big?count=2&bytes=1000").await;
    assert_eq!(r.json().as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn header_keys_too_long_for_binary_reads_are_400() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    let batch = |key: &str| json!({"records": [{"body": "a", "headers": {key: "v"}}]}).to_string();
    let ct = [("content-type", "application/vnd.picomq.batch+json")];
    let r = post(&app, "/s", &ct, batch(&"k".repeat(70_000))).await;
    assert_error(&r, 400, "bad_request");
    let msg = r.json()["message"].as_str().unwrap().to_string();
    assert!(msg.contains("header key too long"), "{msg}");
    assert!(msg.contains("index=0"), "{msg}");
    assert_eq!(post(&app, "/s", &ct, batch("k")).await.status, 200);
    let r = get(&app, "/s?format=binary").await;
    assert_eq!(r.status, 200, "body: {}", String::from_utf8_lossy(&r.body));
    let got = decode_binary(&r.body).unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].1.headers,
        vec![("k".to_string(), Bytes::from_static(b"v"))]
    );
}

#[tokio::test]
async fn batches_past_the_record_limit_are_413_before_parsing_them_whole() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    let max = pico_server::node::MAX_RECORDS_PER_APPEND;
    let recs = vec![r#"{"body":""}"#; max + 1].join(",");
    // The record past the limit is not even valid: parsing stopped before it.
    let body = format!(r#"{{"records":[{recs},{{"body": !!!"#);
    let ct = [("content-type", "application/vnd.picomq.batch+json")];
    let r = post(&app, "/s", &ct, body).await;
    assert_error(&r, 413, "too_large");
    assert_eq!(
        r.json()["message"],
        format!("too many records in one batch: max={max}")
    );
    let rec = Record::from_value(Bytes::new());
    let body = encode_binary((0..=max as u64).map(|i| (i, &rec))).unwrap();
    let r = post(
        &app,
        "/s",
        &[("content-type", "application/vnd.picomq.batch")],
        body,
    )
    .await;
    assert_error(&r, 413, "too_large");
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap()
            .contains(&format!("max={max}"))
    );
    assert_eq!(get(&app, "/s").await.h("pico-next-seq"), Some("0"));
}

#[tokio::test]
async fn if_none_match_may_be_split_over_several_lines() {
    let (app, _) = app().await;
    put(&app, "/s", &[]).await;
    post(&app, "/s", &[], "a").await;
    let etag = get(&app, "/s?seq=0").await.h("etag").unwrap().to_string();
    let r = send(
        &app,
        req(
            Method::GET,
            "/s?seq=0",
            &[("if-none-match", "\"other\""), ("if-none-match", &etag)],
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(r.status, 304);
    let r = send(
        &app,
        req(
            Method::GET,
            "/s?seq=0",
            &[("if-none-match", "\"x\""), ("if-none-match", "\"y\"")],
            Body::empty(),
        ),
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn reserved_names_are_refused_alike_by_both_facades() {
    let (app, _) = app().await;
    // Each reserved name through Pico and through DS: 400 with the same message, so a name
    // made through one facade can always be reached through the other.
    for name in ["_sys/x", "_groups/g", "v1/stream"] {
        let p = put(&app, &format!("/{name}"), &[]).await;
        assert_error(&p, 400, "bad_request");
        let msg = p.json()["message"].as_str().unwrap().to_string();
        assert!(
            msg.starts_with("bad stream name: stream name is reserved"),
            "{msg}"
        );
        let ds = format!("/v1/stream/{name}");
        let d = send(&app, req(Method::PUT, &ds, &[], Body::empty())).await;
        assert_eq!((d.status.as_u16(), d.text()), (400, msg.as_str()), "{ds}");
    }
    // The DS control namespace through Pico, and a Pico-looking path through DS.
    for path in ["/__ds/x", "/v1/stream/v1/stream/x", "/v1/stream/_sys"] {
        let r = send(&app, req(Method::PUT, path, &[], Body::empty())).await;
        assert_eq!(r.status, 400, "{path}");
        assert!(r.text().contains("stream name is reserved"), "{path}");
    }
    // Names that only look like them are streams.
    for free in ["/_system", "/__dsq", "/v1/streams", "/x/_sys"] {
        assert_eq!(put(&app, free, &[]).await.status, 201, "{free}");
    }
    let v = get(&app, "/").await.json();
    assert_eq!(v["streams"].as_array().unwrap().len(), 4);
}

#[tokio::test]
async fn a_name_means_its_decoded_path() {
    let (app, _) = app().await;
    for bad in [
        "/a%zz",
        "/a%2",
        "/a/%",
        "/a/%2e%2e",
        "/a/.%2E",
        "/a/%2e/b",
        "/%2E%2e",
        // An encoded slash would let `/a%2Fb` alias `/a/b`; bytes that are not UTF-8 and
        // encoded control characters have no text to mean.
        "/a%2Fb",
        "/a%2fb",
        "/%ff%fe",
        "/a%0A",
    ] {
        for r in [put(&app, bad, &[]).await, get(&app, bad).await] {
            assert_error(&r, 400, "bad_request");
            assert!(
                r.json()["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("bad stream name: "),
                "{bad}"
            );
        }
    }
    // One stream however spelled: `%61` is `a`, `%3a` is `:`, hex case does not matter.
    assert_eq!(put(&app, "/%61", &[]).await.status, 201);
    let r = send(&app, req(Method::HEAD, "/a", &[], Body::empty())).await;
    assert_eq!(r.status, 200);
    assert_eq!(put(&app, "/a", &[]).await.status, 200);
    assert_eq!(put(&app, "/b%3a/caf%c3%a9", &[]).await.status, 201);
    post(&app, "/b:/caf%C3%A9", &[], "x").await;
    assert_eq!(
        get(&app, "/b%3A/caf%C3%a9").await.h("pico-next-seq"),
        Some("1")
    );
    let v = get(&app, "/").await.json();
    let names: Vec<&str> = v["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b:/caf%C3%A9"]);
}

/// Caught-up Pico SSE subscribers follow the stream's one live hub, the same one DS SSE
/// subscribers follow, instead of each waiting and reading for itself; each still gets every
/// record once, in order, within its own `count`, and the hub goes with the last subscriber.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_subscribers_share_the_live_hub_with_ds() {
    let (app, node) = app().await;
    put(&app, "/s", &[]).await;
    let open = |uri: &'static str| {
        let app = app.clone();
        tokio::spawn(async move { get(&app, uri).await })
    };
    let wide = open("/s?seq=now&live=sse");
    let narrow = open("/s?seq=now&live=sse&count=1");
    // Both reach the tail and join the hub (bounded wait: without a hub this fails). Both must
    // have joined before the first append, or one would start past it.
    for _ in 0..1000 {
        if node.hubs().subscribers() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(node.hubs().len(), 1, "Pico SSE subscribers start no hub");
    assert_eq!(
        node.hubs().subscribers(),
        2,
        "both subscribers follow the hub"
    );
    let ds = open("/v1/stream/s?offset=now&live=sse");
    assert_eq!(post(&app, "/s", &[], "a").await.status, 200);
    let batch = json!({"records":[{"body":"b"},{"body":"c"}]});
    let ct = ("content-type", "application/vnd.picomq.batch+json");
    assert_eq!(post(&app, "/s", &[ct], batch.to_string()).await.status, 200);
    assert_eq!(node.hubs().len(), 1, "one hub for both protocols");
    let end = post(&app, "/s", &[("pico-closed", "true")], "d").await;
    assert_eq!(end.status, 200);
    for (sub, most) in [(wide, usize::MAX), (narrow, 1)] {
        let r = sub.await.unwrap();
        let ev = sse_events(r.text());
        assert_eq!(ev[0].2, json!({"next_seq":0,"up_to_date":true}));
        let mut bodies = Vec::new();
        for (i, (event, id, v)) in ev.iter().enumerate() {
            if event != "data" {
                continue;
            }
            let records = v.as_array().unwrap();
            assert!(records.len() <= most, "{}", r.text());
            for rec in records {
                assert_eq!(rec["seq"], bodies.len());
                bodies.push(rec["body"].as_str().unwrap().to_string());
            }
            assert_eq!(id.as_deref(), Some(bodies.len().to_string().as_str()));
            assert_eq!(ev[i + 1].0, "control");
            assert_eq!(ev[i + 1].2["next_seq"], bodies.len());
        }
        assert_eq!(bodies, ["a", "b", "c", "d"], "{}", r.text());
        assert_eq!(
            ev.last().unwrap().2,
            json!({"next_seq":4,"up_to_date":true,"closed":true})
        );
    }
    let r = ds.await.unwrap();
    assert!(r.text().contains("\"streamClosed\":true"), "{}", r.text());
    assert!(node.hubs().is_empty(), "the hub outlived its subscribers");
}

/// A Pico SSE subscriber following the hub when its stream is deleted ends with an error event,
/// decided by its own read once the hub ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_follower_ends_with_an_error_when_its_stream_is_deleted() {
    let (app, node) = app().await;
    put(&app, "/s", &[]).await;
    let sub = {
        let app = app.clone();
        tokio::spawn(async move { get(&app, "/s?seq=now&live=sse").await })
    };
    for _ in 0..1000 {
        if !node.hubs().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let r = send(&app, req(Method::DELETE, "/s", &[], Body::empty())).await;
    assert_eq!(r.status, 204);
    let r = sub.await.unwrap();
    let ev = sse_events(r.text());
    let last = ev.last().unwrap();
    assert_eq!(last.0, "error", "{}", r.text());
    assert!(
        ["not_found", "gone"].contains(&last.2["error"].as_str().unwrap()),
        "{}",
        r.text()
    );
    assert!(node.hubs().is_empty());
}
