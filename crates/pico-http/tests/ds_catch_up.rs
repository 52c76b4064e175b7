//! DS catch-up reads (`GET` without `live`) answer everything up to the tail as of the request,
//! streamed a page at a time: real DS clients end a non-live read after its first response.
//! Live modes keep the per-response cap.

mod common;

use axum::body::Body;
use axum::http::{Method, Request};
use common::*;
use futures::StreamExt;
use pico_protocol::format_offset;
use tower::ServiceExt;

const S: &str = "/v1/stream";
const TEXT: (&str, &str) = ("content-type", "text/plain");
const JSON: (&str, &str) = ("content-type", "application/json");
/// The test node's `max_chunk_size`.
const CHUNK: usize = 64 * 1024;

/// Record `i` of a test stream: 10,000 bytes, distinct per record.
fn record(i: usize) -> String {
    format!("{i:05}").repeat(2_000)
}

/// A text stream of `n` records of [`record`]; returns its URL and contents.
async fn text_stream(app: &pico_http::fast::Protocol, name: &str, n: usize) -> (String, String) {
    let u = format!("{S}/{name}");
    assert_eq!(put(app, &u, &[TEXT], "").await.code(), 201);
    let mut all = String::new();
    for i in 0..n {
        assert_eq!(post(app, &u, &[TEXT], record(i)).await.code(), 204);
        all.push_str(&record(i));
    }
    (u, all)
}

/// A GET whose body is left unread: its headers, and the body to read later.
async fn get_lazy(app: &pico_http::fast::Protocol, uri: &str) -> (axum::http::Response<()>, Body) {
    let req = Request::builder()
        .method(Method::GET)
        .uri(uri)
        .header("host", "test.local")
        .body(Body::empty())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let (parts, body) = resp.into_parts();
    (axum::http::Response::from_parts(parts, ()), body)
}

#[tokio::test]
async fn catch_up_reads_to_the_tail_in_bounded_pieces() {
    let (app, _) = app().await;
    // 500 KB: about eight chunk caps.
    let (u, all) = text_stream(&app, "big", 50).await;
    let (resp, body) = get_lazy(&app, &format!("{u}?offset=-1")).await;
    assert_eq!(resp.status(), 200);
    let h = |n: &str| {
        resp.headers()
            .get(n)
            .map(|v| v.to_str().unwrap().to_string())
    };
    assert_eq!(h("stream-next-offset"), Some(format_offset(50)));
    assert_eq!(h("stream-up-to-date").as_deref(), Some("true"));
    assert!(h("stream-closed").is_none());
    assert!(h("etag").is_some());
    // The body arrives as pages, none larger than the chunk cap: memory stays bounded.
    let mut frames = body.into_data_stream();
    let mut got = Vec::new();
    let mut pieces = 0;
    while let Some(f) = frames.next().await {
        let f = f.unwrap();
        assert!(f.len() <= CHUNK, "a piece of {} bytes", f.len());
        got.extend_from_slice(&f);
        pieces += 1;
    }
    assert!(pieces >= all.len() / CHUNK, "{pieces} pieces");
    assert_eq!(String::from_utf8(got).unwrap(), all);

    // From the middle: the rest, whole.
    let r = get(&app, &format!("{u}?offset={}", format_offset(7))).await;
    assert_eq!(r.text(), &all[7 * 10_000..]);
    assert_eq!(r.offset(), format_offset(50));
}

#[tokio::test]
async fn catch_up_ends_at_the_tail_of_the_requests_start() {
    let (app, _) = app().await;
    let (u, all) = text_stream(&app, "moving", 20).await;
    let (resp, body) = get_lazy(&app, &u).await;
    let next = resp.headers().get("stream-next-offset").unwrap().clone();
    assert_eq!(next.to_str().unwrap(), format_offset(20));
    // Records appended while the body is being sent belong to the next read.
    for i in 20..30 {
        post(&app, &u, &[TEXT], record(i)).await;
    }
    let got = axum::body::to_bytes(body, usize::MAX).await.unwrap();
    assert_eq!(std::str::from_utf8(&got).unwrap(), all);
    let rest = get(&app, &format!("{u}?offset={}", next.to_str().unwrap())).await;
    assert_eq!(rest.text().len(), 10 * 10_000);
    assert_eq!(rest.offset(), format_offset(30));
}

#[tokio::test]
async fn json_catch_up_is_one_array_across_pages() {
    let (app, _) = app().await;
    let u = format!("{S}/doc");
    put(&app, &u, &[JSON], "").await;
    let mut want = Vec::new();
    for i in 0..40 {
        let batch: Vec<serde_json::Value> = (0..5)
            .map(|j| serde_json::json!({"i": i, "j": j, "s": record(i)[..2_000]}))
            .collect();
        let r = post(&app, &u, &[JSON], serde_json::to_string(&batch).unwrap()).await;
        assert_eq!(r.code(), 204);
        want.extend(batch);
    }
    let r = get(&app, &u).await;
    assert!(r.body.len() > 2 * CHUNK);
    assert_eq!(r.json(), serde_json::Value::Array(want));
    assert_eq!(r.offset(), format_offset(200));
}

#[tokio::test]
async fn a_closed_stream_read_whole_says_closed() {
    let (app, _) = app().await;
    let (u, all) = text_stream(&app, "done", 10).await;
    let r = post(&app, &u, &[("stream-closed", "true")], "").await;
    assert_eq!(r.code(), 204);
    let r = get(&app, &u).await;
    assert_eq!(r.text(), all);
    assert_eq!(r.h("stream-closed"), Some("true"));
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
}

#[tokio::test]
async fn a_stream_replaced_mid_body_cuts_the_body_short() {
    let (app, _) = app().await;
    let (u, _) = text_stream(&app, "gone", 20).await;
    let (resp, body) = get_lazy(&app, &u).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(delete(&app, &u).await.code(), 204);
    text_stream(&app, "gone", 20).await;
    // The headers promised the old stream's 20 records: an error, not the new stream's bytes.
    assert!(axum::body::to_bytes(body, usize::MAX).await.is_err());
}

#[tokio::test]
async fn etag_changes_when_the_tail_moves() {
    let (app, _) = app().await;
    let (u, _) = text_stream(&app, "tagged", 10).await;
    let first = get(&app, &u).await;
    let tag = first.h("etag").unwrap().to_string();
    let r = get_with(&app, &u, &[("if-none-match", &tag)]).await;
    assert_eq!(r.code(), 304);
    assert_eq!(r.offset(), format_offset(10));
    post(&app, &u, &[TEXT], record(10)).await;
    // The same request now covers one more record: a new tag, never a stale 304.
    let r = get_with(&app, &u, &[("if-none-match", &tag)]).await;
    assert_eq!(r.code(), 200);
    assert_eq!(r.offset(), format_offset(11));
    assert_ne!(r.h("etag"), Some(tag.as_str()));
}

#[tokio::test]
async fn long_poll_keeps_the_cap() {
    let (app, _) = app().await;
    let (u, _) = text_stream(&app, "live", 20).await;
    let r = get(&app, &format!("{u}?offset=-1&live=long-poll")).await;
    assert_eq!(r.code(), 200);
    assert!(r.body.len() <= CHUNK);
    assert!(r.h("stream-up-to-date").is_none());
    assert_eq!(r.offset(), format_offset((r.body.len() / 10_000) as u64));
}
