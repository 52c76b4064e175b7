//! DS SSE subscribers following the node's live hub (`pico_server::live::hub`), through the DS
//! router on a real (in-memory) node whose hub registry the tests inspect.

use std::sync::Arc;
use std::time::Duration;

use crate::ds::{DS_ROOT, mount};
use axum::Router;
use axum::body::{Body, BodyDataStream};
use axum::http::{Method, Request};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures::StreamExt;
use pico_common::StreamName;
use pico_protocol::format_offset;
use pico_server::Node;
use pico_server::live::hub::{Hubs, SHARE_MAX};
use pico_server::testing::start_test_node;
use serde_json::Value;
use tower::ServiceExt;

const PATIENCE: Duration = Duration::from_secs(10);

async fn app() -> (Router, Arc<Hubs>) {
    let node = start_test_node().await;
    let hubs = node.hubs().clone();
    (mount(node, DS_ROOT), hubs)
}

async fn call(app: &Router, method: Method, uri: &str, ct: &str, body: Body) -> u16 {
    let mut b = Request::builder().method(method).uri(uri);
    if !ct.is_empty() {
        b = b.header("content-type", ct);
    }
    let req = b.body(body).unwrap();
    app.clone().oneshot(req).await.unwrap().status().as_u16()
}

/// One SSE response read event by event.
struct Sub {
    body: BodyDataStream,
    buf: String,
}

impl Sub {
    async fn open(app: &Router, uri: &str) -> Sub {
        let req = Request::get(format!("{uri}?offset=now&live=sse"))
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        Sub {
            body: resp.into_body().into_data_stream(),
            buf: String::new(),
        }
    }

    /// The next `(event, payload)`; None once the response ended.
    async fn event(&mut self) -> Option<(String, String)> {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..i + 2).collect();
                let mut event = String::new();
                let mut data = Vec::new();
                for line in block.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        event = e.to_string();
                    } else if let Some(d) = line.strip_prefix("data:") {
                        data.push(d.strip_prefix(' ').unwrap_or(d).to_string());
                    }
                }
                return Some((event, data.join("\n")));
            }
            let chunk = tokio::time::timeout(PATIENCE, self.body.next())
                .await
                .expect("sse event in time")?;
            self.buf
                .push_str(std::str::from_utf8(&chunk.unwrap()).unwrap());
        }
    }

    /// Every event until the response ends.
    async fn rest(mut self) -> Vec<(String, String)> {
        let mut all = Vec::new();
        while let Some(e) = self.event().await {
            all.push(e);
        }
        all
    }
}

/// Checks one subscriber's events: data always followed by its control, offsets never going
/// back, a final closed control at `end`; returns the data payloads.
fn payloads(events: &[(String, String)], end: u64) -> Vec<String> {
    let mut data = Vec::new();
    let mut last = String::new();
    let mut after_data = false;
    for (event, payload) in events {
        match event.as_str() {
            "data" => {
                assert!(!after_data, "two data events in a row: {events:?}");
                data.push(payload.clone());
                after_data = true;
            }
            "control" => {
                let v: Value = serde_json::from_str(payload).unwrap();
                let next = v["streamNextOffset"].as_str().unwrap().to_string();
                assert!(next >= last, "offset went back: {last} -> {next}");
                last = next;
                after_data = false;
            }
            other => panic!("unexpected event {other}"),
        }
    }
    let (event, payload) = events.last().unwrap();
    assert_eq!(event, "control");
    let v: Value = serde_json::from_str(payload).unwrap();
    assert_eq!(v["streamClosed"], true);
    assert_eq!(v["upToDate"], true);
    assert_eq!(v["streamNextOffset"], format_offset(end));
    data
}

/// A record of newlines renders at 6× its size: subscribers, whether following the hub or
/// reading for themselves, get it in bounded pieces, whole and in order, and the hub holds
/// no rendered copy of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_records_reach_subscribers_in_bounded_pieces() {
    // Shared by the hub as values, and too large for the hub to hold.
    for size in [SHARE_MAX, SHARE_MAX + 1] {
        large_record_reaches_subscribers_in_bounded_pieces(size).await;
    }
}

async fn large_record_reaches_subscribers_in_bounded_pieces(size: usize) {
    let (app, _hubs) = app().await;
    let u = format!("{DS_ROOT}/big-lines");
    assert_eq!(
        call(&app, Method::PUT, &u, "text/plain", Body::empty()).await,
        201
    );
    let small = b"head\n".to_vec();
    let big = vec![b'\n'; size];
    assert_eq!(
        call(&app, Method::POST, &u, "text/plain", small.clone().into()).await,
        204
    );
    // One subscriber follows the hub from the tail; one reads the start for itself.
    let mut live = Sub::open(&app, &u).await;
    assert_eq!(live.event().await.unwrap().0, "control");
    let req = Request::get(format!("{u}?offset=-1&live=sse"))
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let mut catch_up = resp.into_body().into_data_stream();
    assert_eq!(
        call(&app, Method::POST, &u, "text/plain", big.clone().into()).await,
        204
    );
    let req = Request::post(&u)
        .header("stream-closed", "true")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(req).await.unwrap().status(), 204);
    // Raw chunks, checked for size, then parsed as events.
    let mut raw = Vec::new();
    while let Some(chunk) = tokio::time::timeout(PATIENCE, catch_up.next())
        .await
        .unwrap()
    {
        let chunk = chunk.unwrap();
        assert!(
            chunk.len() <= 256 * 1024,
            "a chunk of {} bytes",
            chunk.len()
        );
        raw.extend_from_slice(&chunk);
    }
    let mut want = small.clone();
    want.extend_from_slice(&big);
    let mut parsed = Sub {
        body: Body::from(raw).into_data_stream(),
        buf: String::new(),
    };
    let events = {
        let mut all = Vec::new();
        while let Some(e) = parsed.event().await {
            all.push(e);
        }
        all
    };
    let data = payloads(&events, 2);
    assert_eq!(data.concat().into_bytes(), want);
    let mut live_raw = 0usize;
    let mut live_data = Vec::new();
    loop {
        // Events of the live subscriber, reading its raw chunk sizes as they come.
        if let Some(i) = live.buf.find("\n\n") {
            let block: String = live.buf.drain(..i + 2).collect();
            let closed = block.contains("streamClosed");
            if block.starts_with("event: data") {
                live_data.push(block);
            }
            if closed {
                break;
            }
            continue;
        }
        let chunk = tokio::time::timeout(PATIENCE, live.body.next())
            .await
            .expect("sse event in time")
            .expect("the response goes on to its close")
            .unwrap();
        assert!(
            chunk.len() <= 256 * 1024,
            "a chunk of {} bytes",
            chunk.len()
        );
        live_raw += chunk.len();
        live.buf.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    assert!(live_raw > 6 * size, "{live_raw}");
    assert_eq!(live_data.len(), 1);
    assert_eq!(live_data[0].matches("data:\n").count(), size + 1);
}

/// Several subscribers of one stream, one of them not read while the appends happen (so it
/// lags the hub's bounded channel), all get every record once and in order, in the stream's
/// rendering (text, JSON arrays, base64); one hub serves them and goes with the last one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_share_one_hub_and_see_every_append() {
    let (app, hubs) = app().await;
    const N: usize = 150;
    for ct in ["text/plain", "application/json", "application/octet-stream"] {
        let u = format!("{DS_ROOT}/fan-{}", ct.replace('/', "-"));
        assert_eq!(call(&app, Method::PUT, &u, ct, Body::empty()).await, 201);
        let mut subs = Vec::new();
        for _ in 0..4 {
            let mut s = Sub::open(&app, &u).await;
            let (event, _) = s.event().await.unwrap();
            assert_eq!(event, "control");
            subs.push(s);
        }
        // The lagging one: let it join the hub, then leave it unread.
        let mut lagging = subs.pop().unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(50), lagging.event())
                .await
                .is_err()
        );
        let eager: Vec<_> = subs.into_iter().map(|s| tokio::spawn(s.rest())).collect();
        let body = |i: usize| match ct {
            "text/plain" => format!("r{i:03};").into_bytes(),
            "application/json" => format!("{{\"i\":{i}}}").into_bytes(),
            _ => vec![i as u8, 0xff, b'\n'],
        };
        for i in 0..N {
            assert_eq!(call(&app, Method::POST, &u, ct, body(i).into()).await, 204);
        }
        let req = Request::post(&u)
            .header("stream-closed", "true")
            .body(Body::empty())
            .unwrap();
        assert_eq!(app.clone().oneshot(req).await.unwrap().status(), 204);
        let want: Vec<u8> = (0..N).flat_map(body).collect();
        let mut all = vec![lagging.rest().await];
        for t in eager {
            all.push(t.await.unwrap());
        }
        for events in all {
            let data = payloads(&events, N as u64);
            let got: Vec<u8> = match ct {
                "text/plain" => data.concat().into_bytes(),
                "application/json" => {
                    let items: Vec<String> = data
                        .iter()
                        .flat_map(|d| serde_json::from_str::<Vec<Value>>(d).unwrap())
                        .map(|v| v.to_string())
                        .collect();
                    items.concat().into_bytes()
                }
                _ => data
                    .iter()
                    .flat_map(|d| STANDARD.decode(d).unwrap())
                    .collect(),
            };
            assert_eq!(got, want, "{ct}");
        }
        assert!(hubs.is_empty(), "hub outlived its subscribers");
    }
}

/// A subscriber whose own read reached the tail just before an append, and that joins the
/// hub only after the hub published that append, gets it at once (the hub will not send it
/// again); it must not wait, reporting `upToDate` at its old offset, for the next append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_joining_after_a_frame_it_missed_reads_the_gap() {
    use crate::ds::{Ds, sse::caught_up_at};
    let node: Node = start_test_node().await;
    let hubs = node.hubs().clone();
    let app = mount(node.clone(), DS_ROOT);
    let u = format!("{DS_ROOT}/late");
    assert_eq!(
        call(&app, Method::PUT, &u, "text/plain", "ab".into()).await,
        201
    );
    // A keeps the stream's hub alive.
    let mut a = Sub::open(&app, &u).await;
    assert_eq!(a.event().await.unwrap().0, "control");
    // Polled once more, it joins the hub and waits there.
    assert!(
        tokio::time::timeout(Duration::from_millis(50), a.event())
            .await
            .is_err()
    );
    assert_eq!(hubs.len(), 1);
    let name = StreamName::parse("/late").unwrap();
    let before = node.head(&name).await.unwrap();
    assert_eq!(
        call(&app, Method::POST, &u, "text/plain", "cd".into()).await,
        204
    );
    // The hub has published the append once A got it.
    assert_eq!(a.event().await.unwrap(), ("data".into(), "cd".into()));
    let after = node.head(&name).await.unwrap().next_seq;
    assert!(after > before.next_seq);
    let ds = Ds {
        node: node.clone(),
        root: DS_ROOT,
    };
    let mut b = Sub {
        body: caught_up_at(&ds, name.clone(), before.stream_id, before.next_seq).into_data_stream(),
        buf: String::new(),
    };
    let (event, payload) = tokio::time::timeout(Duration::from_secs(2), b.event())
        .await
        .expect("an event")
        .expect("the response goes on");
    assert_eq!(
        (event.as_str(), payload.as_str()),
        ("data", "cd"),
        "the late joiner got a keep-alive instead of the append it missed"
    );
    let (event, payload) = b.event().await.unwrap();
    assert_eq!(event, "control");
    let v: Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(v["streamNextOffset"], format_offset(after));
    // And it follows the hub from there.
    assert_eq!(
        call(&app, Method::POST, &u, "text/plain", "ef".into()).await,
        204
    );
    assert_eq!(b.event().await.unwrap(), ("data".into(), "ef".into()));
}

/// Creates the stream at `u` and opens three subscribers that read up to the tail.
async fn waiting_subscribers(
    app: &Router,
    u: &str,
) -> Vec<tokio::task::JoinHandle<Vec<(String, String)>>> {
    assert_eq!(
        call(app, Method::PUT, u, "text/plain", "ab".into()).await,
        201
    );
    let mut subs = Vec::new();
    for _ in 0..3 {
        let mut s = Sub::open(app, u).await;
        assert_eq!(s.event().await.unwrap().0, "control");
        subs.push(tokio::spawn(s.rest()));
    }
    subs
}

/// Waiting subscribers end with the final control when the stream closes, and end (without
/// one) when it is deleted; neither leaves a hub behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_and_delete_end_waiting_subscribers() {
    let (app, hubs) = app().await;
    let u = format!("{DS_ROOT}/closing");
    let subs = waiting_subscribers(&app, &u).await;
    // Let them join the hub before the close.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(hubs.len(), 1);
    let req = Request::post(&u)
        .header("stream-closed", "true")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(req).await.unwrap().status(), 204);
    for t in subs {
        let events = t.await.unwrap();
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(payloads(&events, 1).is_empty());
    }
    assert!(hubs.is_empty());

    let u = format!("{DS_ROOT}/deleting");
    let subs = waiting_subscribers(&app, &u).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(hubs.len(), 1);
    assert_eq!(call(&app, Method::DELETE, &u, "", Body::empty()).await, 204);
    for t in subs {
        let events = t.await.unwrap();
        assert!(events.iter().all(|(e, _)| e == "control"), "{events:?}");
    }
    assert!(hubs.is_empty());
}

/// A subscriber following the hub still gets a keep-alive control per long-poll timeout
/// (500 ms on the test node) and then the next append.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_while_following() {
    let (app, _) = app().await;
    let u = format!("{DS_ROOT}/quiet");
    assert_eq!(
        call(&app, Method::PUT, &u, "text/plain", "ab".into()).await,
        201
    );
    let mut s = Sub::open(&app, &u).await;
    assert_eq!(s.event().await.unwrap().0, "control");
    for _ in 0..2 {
        expect_keep_alive(&mut s, Duration::from_millis(300), 1).await;
    }
    assert_eq!(
        call(&app, Method::POST, &u, "text/plain", "cd".into()).await,
        204
    );
    assert_eq!(
        s.event().await.unwrap(),
        ("data".to_string(), "cd".to_string())
    );
    let (event, payload) = s.event().await.unwrap();
    assert_eq!(event, "control");
    let v: Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(v["streamNextOffset"], format_offset(2));
    // The timer is not re-polled after a wake-up by data; it must still fire on its own.
    expect_keep_alive(&mut s, Duration::from_millis(100), 2).await;
}

/// The next event is a keep-alive control (up to date at `next`) that took at least `after`.
async fn expect_keep_alive(s: &mut Sub, after: Duration, next: u64) {
    let start = std::time::Instant::now();
    let (event, payload) = s.event().await.unwrap();
    assert_eq!(event, "control");
    assert!(
        start.elapsed() >= after,
        "keep-alive after {:?}",
        start.elapsed()
    );
    let v: Value = serde_json::from_str(&payload).unwrap();
    assert_eq!(v["upToDate"], true);
    assert_eq!(v["streamNextOffset"], format_offset(next));
}

/// Many subscribers of one stream each get every append once and in order, from one hub and,
/// with no cursor echoed, one group; a subscriber whose client is gone (its body dropped)
/// leaves the hub at once, and the last one takes the hub with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_subscribers_get_each_event_once_and_the_gone_leave() {
    let (app, hubs) = app().await;
    const SUBS: usize = 100;
    const N: usize = 20;
    let u = format!("{DS_ROOT}/many");
    assert_eq!(
        call(&app, Method::PUT, &u, "text/plain", Body::empty()).await,
        201
    );
    let mut subs = Vec::new();
    for _ in 0..SUBS {
        let mut s = Sub::open(&app, &u).await;
        assert_eq!(s.event().await.unwrap().0, "control");
        subs.push(s);
    }
    // The first append reaches everyone through the hub, which they all join meanwhile.
    assert_eq!(
        call(&app, Method::POST, &u, "text/plain", "r000;".into()).await,
        204
    );
    for s in &mut subs {
        assert_eq!(s.event().await.unwrap(), ("data".into(), "r000;".into()));
        assert_eq!(s.event().await.unwrap().0, "control");
    }
    assert_eq!(hubs.len(), 1);
    assert_eq!(hubs.subscribers(), SUBS);
    // Clients gone: their subscriptions go with their bodies.
    let gone = subs.split_off(SUBS / 2);
    drop(gone);
    assert_eq!(hubs.subscribers(), SUBS / 2);
    let readers: Vec<_> = subs.into_iter().map(|s| tokio::spawn(s.rest())).collect();
    for i in 1..N {
        let body = format!("r{i:03};");
        assert_eq!(
            call(&app, Method::POST, &u, "text/plain", body.into()).await,
            204
        );
    }
    let req = Request::post(&u)
        .header("stream-closed", "true")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.clone().oneshot(req).await.unwrap().status(), 204);
    let want: String = (1..N).map(|i| format!("r{i:03};")).collect();
    for t in readers {
        let events = t.await.unwrap();
        assert_eq!(payloads(&events, N as u64).concat(), want);
    }
    assert!(hubs.is_empty(), "hub outlived its subscribers");
}

/// Subscribers that echo different cursors send different control events: each gets its own
/// cursor with the same data, byte for byte what a subscriber reading for itself would send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_by_cursor_keep_each_subscribers_control() {
    let node: Node = start_test_node().await;
    let app = mount(node.clone(), DS_ROOT);
    let u = format!("{DS_ROOT}/cursors");
    assert_eq!(
        call(&app, Method::PUT, &u, "text/plain", Body::empty()).await,
        201
    );
    // A cursor far ahead of the clock is echoed back plus a jitter: the two differ, or at
    // least are each the subscriber's own.
    let mut subs = Vec::new();
    let mut cursors = Vec::new();
    for c in ["", "&cursor=999999999990", "&cursor=999999999000"] {
        let req = Request::get(format!("{u}?offset=now&live=sse{c}"))
            .body(Body::empty())
            .unwrap();
        let resp = app.clone().oneshot(req).await.unwrap();
        let mut s = Sub {
            body: resp.into_body().into_data_stream(),
            buf: String::new(),
        };
        let (event, payload) = s.event().await.unwrap();
        assert_eq!(event, "control");
        let v: Value = serde_json::from_str(&payload).unwrap();
        cursors.push(v["streamCursor"].as_str().unwrap().to_string());
        subs.push(s);
    }
    // Let them join the hub.
    for s in &mut subs {
        assert!(
            tokio::time::timeout(Duration::from_millis(50), s.event())
                .await
                .is_err()
        );
    }
    assert_eq!(node.hubs().subscribers(), 3);
    assert_eq!(
        call(&app, Method::POST, &u, "text/plain", "a\nb".into()).await,
        204
    );
    for (s, cursor) in subs.iter_mut().zip(&cursors) {
        assert_eq!(s.event().await.unwrap(), ("data".into(), "a\nb".into()));
        let (event, payload) = s.event().await.unwrap();
        assert_eq!(event, "control");
        assert_eq!(
            payload,
            format!(
                "{{\"streamCursor\":\"{cursor}\",\"streamNextOffset\":\"{}\",\"upToDate\":true}}",
                format_offset(1)
            )
        );
    }
}
