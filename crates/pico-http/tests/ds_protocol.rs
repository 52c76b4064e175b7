//! The Durable Streams protocol end to end through the router, against a real node (in-memory
//! storage, SQLite metadata log): create/append/read, offsets, JSON mode, producers, Stream-Seq,
//! closure, live modes, forks and soft delete, headers.

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use common::*;
use pico_http::HttpOptions;
use pico_protocol::format_offset;

const S: &str = "/v1/stream";
const TEXT: (&str, &str) = ("content-type", "text/plain");
const JSON: (&str, &str) = ("content-type", "application/json");
const OCTETS: (&str, &str) = ("content-type", "application/octet-stream");

#[tokio::test]
async fn create_append_read_with_record_offsets() {
    let (app, _) = app().await;
    let r = put(&app, &format!("{S}/a"), &[TEXT], "first").await;
    assert_eq!(r.code(), 201);
    assert_eq!(r.h("content-type"), Some("text/plain"));
    assert_eq!(r.h("location"), Some("http://test.local/v1/stream/a"));
    assert_eq!(r.offset(), format_offset(1));
    assert_eq!(
        put(&app, &format!("{S}/a"), &[TEXT], Body::empty())
            .await
            .code(),
        200
    );
    // Same type in another case is the same config; another type conflicts.
    assert_eq!(
        put(
            &app,
            &format!("{S}/a"),
            &[("content-type", "TEXT/PLAIN")],
            Body::empty()
        )
        .await
        .code(),
        200
    );
    assert_eq!(
        put(&app, &format!("{S}/a"), &[JSON], Body::empty())
            .await
            .code(),
        409
    );

    let r = post(&app, &format!("{S}/a"), &[TEXT], "second").await;
    assert_eq!(r.code(), 204);
    assert_eq!(r.offset(), format_offset(2));

    let r = get(&app, &format!("{S}/a")).await;
    assert_eq!((r.code(), r.text()), (200, "firstsecond"));
    assert_eq!(r.h("stream-up-to-date"), Some("true"));
    assert_eq!(r.offset(), format_offset(2));
    assert!(r.h("etag").is_some());
    assert!(r.h("stream-closed").is_none());
    // Resume from a minted offset, and the reference server's zero offset names the start.
    let r = get(&app, &format!("{S}/a?offset={}", format_offset(1))).await;
    assert_eq!(r.text(), "second");
    let r = get(
        &app,
        &format!("{S}/a?offset=0000000000000000_0000000000000000"),
    )
    .await;
    assert_eq!(r.text(), "firstsecond");
    // offset=now: empty, the tail, never cached.
    let r = get(&app, &format!("{S}/a?offset=now")).await;
    assert_eq!((r.text(), r.offset()), ("", format_offset(2)));
    assert_eq!(r.h("cache-control"), Some("no-store"));
    assert!(r.h("etag").is_none());
    // Malformed, repeated, empty or future offsets are 400s; unknown parameters are ignored.
    for q in [
        "offset=",
        "offset=0,1",
        "offset=a&offset=b",
        "offset=abc",
        "offset=99",
    ] {
        assert_eq!(get(&app, &format!("{S}/a?{q}")).await.code(), 400, "{q}");
    }
    assert_eq!(get(&app, &format!("{S}/a?offset=-1&x=y")).await.code(), 200);
    // Errors carry the browser security headers.
    let r = get(&app, &format!("{S}/missing")).await;
    assert_eq!(r.code(), 404);
    assert_eq!(r.h("x-content-type-options"), Some("nosniff"));
    assert_eq!(r.h("cross-origin-resource-policy"), Some("cross-origin"));
}

#[tokio::test]
async fn append_validation_and_content_types() {
    let (app, _) = app().await;
    put(&app, &format!("{S}/t"), &[TEXT], Body::empty()).await;
    assert_eq!(post(&app, &format!("{S}/t"), &[TEXT], "").await.code(), 400);
    assert_eq!(
        post(&app, &format!("{S}/t"), &[], "no type").await.code(),
        400
    );
    assert_eq!(
        post(&app, &format!("{S}/t"), &[JSON], "{}").await.code(),
        409
    );
    assert_eq!(
        post(
            &app,
            &format!("{S}/t"),
            &[("content-type", "text/plain; charset=utf-8")],
            "ok"
        )
        .await
        .code(),
        204
    );
    assert_eq!(
        post(&app, &format!("{S}/nope"), &[TEXT], "x").await.code(),
        404
    );
    for (k, v) in [
        ("stream-ttl", "01"),
        ("stream-ttl", "1.5"),
        ("stream-expires-at", "tomorrow"),
    ] {
        assert_eq!(
            put(&app, &format!("{S}/bad"), &[(k, v)], Body::empty())
                .await
                .code(),
            400
        );
    }
    let r = put(
        &app,
        &format!("{S}/ttl"),
        &[("stream-ttl", "3600")],
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 201);
    assert_eq!(r.h("content-type"), Some("application/octet-stream"));
    let r = head(&app, &format!("{S}/ttl")).await;
    assert_eq!(r.h("stream-ttl"), Some("3600"));
    assert_eq!(r.h("cache-control"), Some("no-store"));
    assert_eq!(
        put(
            &app,
            &format!("{S}/ttl"),
            &[("stream-ttl", "7200")],
            Body::empty()
        )
        .await
        .code(),
        409
    );
}

#[tokio::test]
async fn json_mode_flattens_one_level() {
    let (app, _) = app().await;
    let u = format!("{S}/j");
    assert_eq!(put(&app, &u, &[JSON], "[]").await.code(), 201);
    assert_eq!(get(&app, &u).await.text(), "[]");
    assert_eq!(post(&app, &u, &[JSON], "[]").await.code(), 400);
    assert_eq!(post(&app, &u, &[JSON], "{ invalid").await.code(), 400);
    post(&app, &u, &[JSON], r#"{"a":1}"#).await;
    let r = post(&app, &u, &[JSON], r#"[{"b":2}, [3,4], [[5]]]"#).await;
    assert_eq!(r.offset(), format_offset(4), "one record per message");
    let r = get(&app, &u).await;
    assert_eq!(r.h("content-type"), Some("application/json"));
    assert_eq!(r.json(), serde_json::json!([{"a":1},{"b":2},[3,4],[[5]]]));
    let r = get(&app, &format!("{u}?offset={}", format_offset(2))).await;
    assert_eq!(r.json(), serde_json::json!([[3, 4], [[5]]]));
    assert_eq!(get(&app, &format!("{u}?offset=now")).await.text(), "[]");
}

#[tokio::test]
async fn producers_and_stream_seq() {
    let (app, _) = app().await;
    let u = format!("{S}/p");
    put(&app, &u, &[TEXT], Body::empty()).await;
    let p = |epoch: &'static str, seq: &'static str| {
        vec![
            TEXT,
            ("producer-id", "w"),
            ("producer-epoch", epoch),
            ("producer-seq", seq),
        ]
    };
    let r = post(&app, &u, &p("0", "0"), "a").await;
    assert_eq!(
        (r.code(), r.h("producer-epoch"), r.h("producer-seq")),
        (200, Some("0"), Some("0"))
    );
    assert_eq!(post(&app, &u, &p("0", "1"), "b").await.code(), 200);
    let r = post(&app, &u, &p("0", "0"), "a").await;
    assert_eq!(
        (r.code(), r.h("producer-seq")),
        (204, Some("1")),
        "duplicate echoes the highest seq"
    );
    let r = post(&app, &u, &p("0", "3"), "gap").await;
    assert_eq!(
        (
            r.code(),
            r.h("producer-expected-seq"),
            r.h("producer-received-seq")
        ),
        (409, Some("2"), Some("3"))
    );
    assert_eq!(post(&app, &u, &p("1", "1"), "x").await.code(), 400);
    assert_eq!(post(&app, &u, &p("1", "0"), "c").await.code(), 200);
    let r = post(&app, &u, &p("0", "2"), "zombie").await;
    assert_eq!((r.code(), r.h("producer-epoch")), (403, Some("1")));
    assert_eq!(
        post(&app, &u, &[TEXT, ("producer-id", "w")], "x")
            .await
            .code(),
        400
    );
    assert_eq!(post(&app, &u, &p("0", "1e3"), "x").await.code(), 400);
    assert_eq!(get(&app, &u).await.text(), "abc");

    // A duplicate of the producer's last append answers the offset after the original (not
    // the tail); an older one's place is unknown, and the tail is all it gets.
    let u2 = format!("{S}/p2");
    put(&app, &u2, &[TEXT], Body::empty()).await;
    assert_eq!(post(&app, &u2, &p("0", "0"), "a").await.code(), 200);
    assert_eq!(post(&app, &u2, &[TEXT], "b").await.code(), 204);
    let r = post(&app, &u2, &p("0", "0"), "a").await;
    let next = format_offset(1);
    assert_eq!(
        (r.code(), r.h("stream-next-offset")),
        (204, Some(next.as_str()))
    );
    assert_eq!(post(&app, &u2, &p("0", "1"), "c").await.code(), 200);
    let r = post(&app, &u2, &p("0", "0"), "a").await;
    let tail = format_offset(3);
    assert_eq!(
        (r.code(), r.h("stream-next-offset")),
        (204, Some(tail.as_str()))
    );
    assert_eq!(get(&app, &u2).await.text(), "abc");

    // Stream-Seq: byte-wise increasing per stream.
    let s = |seq: &'static str| vec![TEXT, ("stream-seq", seq)];
    assert_eq!(post(&app, &u, &s("2"), "d").await.code(), 204);
    assert_eq!(
        post(&app, &u, &s("10"), "e").await.code(),
        409,
        "\"10\" < \"2\""
    );
    assert_eq!(post(&app, &u, &s("2"), "e").await.code(), 409);
    assert_eq!(post(&app, &u, &s("3"), "e").await.code(), 204);
    assert_eq!(get(&app, &u).await.text(), "abcde");
}

#[tokio::test]
async fn closure_is_durable_and_signalled_everywhere() {
    let (app, _) = app().await;
    let u = format!("{S}/c");
    put(&app, &u, &[TEXT], "data").await;
    let etag_open = get(&app, &u).await.h("etag").unwrap().to_string();
    let r = post(&app, &u, &[("stream-closed", "true")], Body::empty()).await;
    assert_eq!((r.code(), r.h("stream-closed")), (204, Some("true")));
    let tail = r.offset();
    // Close again: idempotent. Appending: 409 with the final offset.
    let r = post(&app, &u, &[("stream-closed", "true")], Body::empty()).await;
    assert_eq!((r.code(), r.h("stream-closed")), (204, Some("true")));
    let r = post(&app, &u, &[TEXT], "late").await;
    assert_eq!((r.code(), r.h("stream-closed")), (409, Some("true")));
    assert_eq!(r.offset(), tail);
    // Reads at the end say closed; the ETag changed with the closure.
    let r = get(&app, &u).await;
    assert_eq!((r.text(), r.h("stream-closed")), ("data", Some("true")));
    assert_ne!(r.h("etag").unwrap(), etag_open);
    assert_eq!(
        get_with(&app, &u, &[("if-none-match", &etag_open)])
            .await
            .code(),
        200
    );
    let etag = r.h("etag").unwrap().to_string();
    assert_eq!(
        get_with(&app, &u, &[("if-none-match", &etag)]).await.code(),
        304
    );
    assert_eq!(head(&app, &u).await.h("stream-closed"), Some("true"));
    // Long-poll at the tail of a closed stream returns at once.
    let start = Instant::now();
    let r = get(&app, &format!("{u}?offset={tail}&live=long-poll")).await;
    assert_eq!((r.code(), r.h("stream-closed")), (204, Some("true")));
    assert!(start.elapsed() < Duration::from_millis(400));
    // SSE ends after the final control event.
    let r = get(&app, &format!("{u}?offset=-1&live=sse")).await;
    assert_eq!(r.h("content-type"), Some("text/event-stream"));
    let ev = sse_events(r.text());
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert_eq!(ev[0], ("data".to_string(), "data".to_string()));
    let ctl: serde_json::Value = serde_json::from_str(&ev[1].1).unwrap();
    assert_eq!(ctl["streamClosed"], true);
    assert_eq!(ctl["streamNextOffset"], tail.as_str());
    assert!(ctl.get("streamCursor").is_none());
    // Create-closed with a body.
    let r = put(
        &app,
        &format!("{S}/once"),
        &[TEXT, ("stream-closed", "true")],
        "only",
    )
    .await;
    assert_eq!((r.code(), r.h("stream-closed")), (201, Some("true")));
    assert_eq!(
        put(&app, &format!("{S}/once"), &[TEXT], Body::empty())
            .await
            .code(),
        409
    );
}

#[tokio::test]
async fn long_poll_waits_and_times_out_with_a_cursor() {
    let (app, _) = app().await;
    let u = format!("{S}/lp");
    put(&app, &u, &[TEXT], Body::empty()).await;
    assert_eq!(get(&app, &format!("{u}?live=long-poll")).await.code(), 400);
    let r = get(&app, &format!("{u}?offset=now&live=long-poll")).await;
    assert_eq!((r.code(), r.h("stream-up-to-date")), (204, Some("true")));
    let cursor: u64 = r.h("stream-cursor").unwrap().parse().unwrap();
    // Echoing a current cursor gets a strictly later one.
    let r = get(
        &app,
        &format!("{u}?offset=now&live=long-poll&cursor={cursor}"),
    )
    .await;
    assert!(r.h("stream-cursor").unwrap().parse::<u64>().unwrap() > cursor);

    let (a2, u2) = (app.clone(), u.clone());
    let waiter =
        tokio::spawn(async move { get(&a2, &format!("{u2}?offset=now&live=long-poll")).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    post(&app, &u, &[TEXT], "news").await;
    let r = waiter.await.unwrap();
    assert_eq!((r.code(), r.text()), (200, "news"));
}

#[tokio::test]
async fn sse_pairs_each_data_event_with_a_control_and_base64_for_binary() {
    let (app, _) = app().await;
    let u = format!("{S}/bin");
    put(&app, &u, &[OCTETS], vec![0u8, 10, 13, 255]).await;
    post(&app, &u, &[OCTETS], vec![1u8, 2]).await;
    post(&app, &u, &[("stream-closed", "true")], Body::empty()).await;
    let r = get(&app, &format!("{u}?offset=-1&live=sse")).await;
    assert_eq!(r.h("stream-sse-data-encoding"), Some("base64"));
    let ev = sse_events(r.text());
    assert_eq!(
        ev.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(),
        ["data", "control"]
    );
    assert_eq!(ev[0].1, "AAoN/wEC");

    let u = format!("{S}/lines");
    put(&app, &u, &[TEXT], "a\r\n\r\nevent: control\rb").await;
    post(&app, &u, &[("stream-closed", "true")], Body::empty()).await;
    let r = get(&app, &format!("{u}?offset=-1&live=sse")).await;
    assert!(r.h("stream-sse-data-encoding").is_none());
    assert!(
        r.text()
            .contains("data:a\ndata:\ndata:event: control\ndata:b\n")
    );
    assert_eq!(sse_events(r.text()).len(), 2);
}

#[tokio::test]
async fn forks_share_data_and_stitch_reads() {
    let (app, node) = app().await;
    put(
        &app,
        &format!("{S}/src"),
        &[JSON],
        r#"[{"a":1},{"b":2},{"c":3}]"#,
    )
    .await;
    // Fork in the middle of the source's batch, then append to the fork: the inherited data
    // stops at the fork point although the shared object holds the whole batch.
    let r = put(
        &app,
        &format!("{S}/f1"),
        &[
            ("stream-forked-from", "/v1/stream/src"),
            ("stream-fork-offset", &format_offset(0)),
            ("stream-fork-sub-offset", "2"),
        ],
        Body::empty(),
    )
    .await;
    assert_eq!(
        (r.code(), r.h("content-type")),
        (201, Some("application/json"))
    );
    assert_eq!(r.offset(), format_offset(2));
    post(&app, &format!("{S}/f1"), &[JSON], r#"{"z":9}"#).await;
    post(&app, &format!("{S}/src"), &[JSON], r#"{"after":true}"#).await;
    let body = get(&app, &format!("{S}/f1")).await.json();
    assert_eq!(body, serde_json::json!([{"a":1},{"b":2},{"z":9}]));
    // A fork of the fork, read from inside the inherited range.
    put(
        &app,
        &format!("{S}/f2"),
        &[("stream-forked-from", "/v1/stream/f1")],
        Body::empty(),
    )
    .await;
    post(&app, &format!("{S}/f2"), &[JSON], r#"{"y":8}"#).await;
    let r = get(&app, &format!("{S}/f2?offset={}", format_offset(1))).await;
    assert_eq!(r.json(), serde_json::json!([{"b":2},{"z":9},{"y":8}]));
    // Inherited objects are shared, not copied.
    let view = node.meta().view();
    let f2 = view.stream_by_name("f2").unwrap().1;
    let src = view.stream_by_name("src").unwrap().1;
    assert_eq!(f2.slices[0].key, src.slices[0].key);

    // Byte sub-offset: the prefix of the record becomes the fork's own record.
    put(&app, &format!("{S}/bytes"), &[TEXT], "hello").await;
    let fork = |sub: &'static str| {
        vec![
            ("stream-forked-from", "/v1/stream/bytes"),
            ("stream-fork-offset", "0000000000000000_0000000000000000"),
            ("stream-fork-sub-offset", sub),
        ]
    };
    assert_eq!(
        put(&app, &format!("{S}/hel"), &fork("3"), "XY")
            .await
            .code(),
        201
    );
    assert_eq!(get(&app, &format!("{S}/hel")).await.text(), "helXY");
    assert_eq!(
        put(&app, &format!("{S}/hel"), &fork("3"), Body::empty())
            .await
            .code(),
        200
    );
    assert_eq!(
        put(&app, &format!("{S}/hel"), &fork("2"), Body::empty())
            .await
            .code(),
        409
    );
    assert_eq!(
        put(&app, &format!("{S}/over"), &fork("6"), Body::empty())
            .await
            .code(),
        400
    );
    let beyond = [
        ("stream-forked-from", "/v1/stream/bytes"),
        ("stream-fork-offset", "9999999999999999_9999999999999999"),
    ];
    assert_eq!(
        put(&app, &format!("{S}/far"), &beyond, Body::empty())
            .await
            .code(),
        400
    );
    let missing = [("stream-forked-from", "/v1/stream/none")];
    assert_eq!(
        put(&app, &format!("{S}/orphan"), &missing, Body::empty())
            .await
            .code(),
        404
    );
    let mismatch = [JSON, ("stream-forked-from", "/v1/stream/bytes")];
    assert_eq!(
        put(&app, &format!("{S}/mm"), &mismatch, Body::empty())
            .await
            .code(),
        409
    );
}

#[tokio::test]
async fn soft_delete_while_forked_and_cascade() {
    let (app, _) = app().await;
    put(&app, &format!("{S}/l0"), &[TEXT], "root").await;
    put(
        &app,
        &format!("{S}/l1"),
        &[("stream-forked-from", "/v1/stream/l0")],
        Body::empty(),
    )
    .await;
    put(
        &app,
        &format!("{S}/l2"),
        &[("stream-forked-from", "/v1/stream/l1")],
        Body::empty(),
    )
    .await;
    assert_eq!(delete(&app, &format!("{S}/l0")).await.code(), 204);
    assert_eq!(delete(&app, &format!("{S}/l1")).await.code(), 204);
    for path in ["l0", "l1"] {
        let u = format!("{S}/{path}");
        assert_eq!(head(&app, &u).await.code(), 410);
        assert_eq!(get(&app, &u).await.code(), 410);
        assert_eq!(post(&app, &u, &[TEXT], "x").await.code(), 410);
        assert_eq!(delete(&app, &u).await.code(), 410);
        assert_eq!(put(&app, &u, &[TEXT], Body::empty()).await.code(), 409);
    }
    let refork = [("stream-forked-from", "/v1/stream/l1")];
    assert_eq!(
        put(&app, &format!("{S}/l3"), &refork, Body::empty())
            .await
            .code(),
        409
    );
    // The leaf still reads everything it inherited.
    assert_eq!(get(&app, &format!("{S}/l2")).await.text(), "root");
    assert_eq!(delete(&app, &format!("{S}/l2")).await.code(), 204);
    for path in ["l0", "l1", "l2"] {
        assert_eq!(
            head(&app, &format!("{S}/{path}")).await.code(),
            404,
            "{path}"
        );
    }
    assert_eq!(
        put(&app, &format!("{S}/l0"), &[TEXT], Body::empty())
            .await
            .code(),
        201
    );
}

#[tokio::test]
async fn fork_inherits_ttl_unless_given() {
    let (app, _) = app().await;
    put(
        &app,
        &format!("{S}/s"),
        &[TEXT, ("stream-ttl", "3600")],
        "x",
    )
    .await;
    put(
        &app,
        &format!("{S}/f"),
        &[("stream-forked-from", "/v1/stream/s")],
        Body::empty(),
    )
    .await;
    assert_eq!(
        head(&app, &format!("{S}/f")).await.h("stream-ttl"),
        Some("3600")
    );
    put(
        &app,
        &format!("{S}/g"),
        &[
            ("stream-forked-from", "/v1/stream/s"),
            ("stream-ttl", "99999"),
        ],
        Body::empty(),
    )
    .await;
    assert_eq!(
        head(&app, &format!("{S}/g")).await.h("stream-ttl"),
        Some("99999")
    );
}

#[tokio::test]
async fn cors_preflight_allows_if_none_match() {
    let (app, _) = app_with(HttpOptions {
        cors: pico_http::cors::CorsOrigins::parse(&["https://example.com"]).unwrap(),
        ..HttpOptions::default()
    })
    .await;
    let r = send(
        &app,
        axum::http::Method::OPTIONS,
        &format!("{S}/x"),
        &[
            ("origin", "https://example.com"),
            ("access-control-request-method", "GET"),
            ("access-control-request-headers", "if-none-match"),
        ],
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 204);
    assert_eq!(
        r.h("access-control-allow-origin"),
        Some("https://example.com")
    );
    assert!(
        r.h("access-control-allow-headers")
            .unwrap()
            .contains("if-none-match")
    );
    assert!(
        r.h("access-control-expose-headers")
            .unwrap()
            .contains("stream-next-offset")
    );
}

#[tokio::test]
async fn protocol_ds_serves_ds_at_the_root_too() {
    let (app, _) = app_with(HttpOptions {
        ds_at_root: true,
        ..HttpOptions::default()
    })
    .await;
    assert_eq!(put(&app, "/root-stream", &[TEXT], "hi").await.code(), 201);
    let r = get(&app, "/root-stream").await;
    assert_eq!((r.text(), r.h("stream-up-to-date")), ("hi", Some("true")));
    // Same stream under the conventional mount.
    assert_eq!(get(&app, &format!("{S}/root-stream")).await.text(), "hi");
    // And the Pico protocol is not served there: no Pico headers.
    assert!(r.h("pico-next-seq").is_none());
}

#[tokio::test]
async fn json_arrays_past_the_record_limit_are_413() {
    let (app, _) = app().await;
    let u = format!("{S}/j");
    assert_eq!(put(&app, &u, &[JSON], Body::empty()).await.code(), 201);
    let max = pico_server::node::MAX_RECORDS_PER_APPEND;
    let array = |n: usize| format!("[{}]", vec!["1"; n].join(","));
    let r = post(&app, &u, &[JSON], array(max + 1)).await;
    assert_eq!(r.code(), 413);
    assert_eq!(
        r.text(),
        format!("too many messages in one append: max={max}")
    );
    // Also as a create's initial body, refused before the stream is created.
    let r = put(&app, &format!("{S}/j2"), &[JSON], array(max + 1)).await;
    assert_eq!(r.code(), 413);
    assert_eq!(head(&app, &format!("{S}/j2")).await.code(), 404);
    assert_eq!(post(&app, &u, &[JSON], array(max)).await.code(), 204);
}

#[tokio::test]
async fn if_none_match_may_be_split_over_several_lines() {
    let (app, _) = app().await;
    let u = format!("{S}/n");
    put(&app, &u, &[TEXT], "data").await;
    let etag = get(&app, &u).await.h("etag").unwrap().to_string();
    let r = get_with(
        &app,
        &u,
        &[("if-none-match", "\"other\""), ("if-none-match", &etag)],
    )
    .await;
    assert_eq!(r.code(), 304);
    let r = get_with(
        &app,
        &u,
        &[("if-none-match", "\"x\""), ("if-none-match", "\"y\"")],
    )
    .await;
    assert_eq!(r.code(), 200);
}

#[tokio::test]
async fn reserved_names_and_bad_escapes_are_400_like_over_pico() {
    let (app, _) = app_with(HttpOptions {
        ds_at_root: true,
        ..HttpOptions::default()
    })
    .await;
    // The Pico facade's reserved names are refused here too, under the mount and at the root,
    // with the Pico message (the whole name is reserved, whichever facade asks).
    for (path, name) in [
        (format!("{S}/_sys/x"), "_sys/x"),
        (format!("{S}/_groups"), "_groups"),
        (format!("{S}/v1/stream/x"), "v1/stream/x"),
        ("/_sys/x".to_string(), "_sys/x"),
        ("/v1/stream".to_string(), "v1/stream"),
    ] {
        let r = put(&app, &path, &[TEXT], Body::empty()).await;
        assert_eq!(r.code(), 400, "{path}");
        assert!(
            r.text()
                .starts_with("bad stream name: stream name is reserved")
                && r.text().ends_with(&format!("name=`{name}`")),
            "{path}: {}",
            r.text()
        );
    }
    // Nor can a fork be made under a reserved name.
    put(&app, &format!("{S}/src"), &[TEXT], "x").await;
    let r = put(
        &app,
        &format!("{S}/_sys/fork"),
        &[TEXT, ("stream-forked-from", "/v1/stream/src")],
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 400);
    // Malformed escapes, segments a URL parser resolves as `.`/`..`, encoded slashes and bytes
    // that are not UTF-8 are not stream names, for any request.
    for bad in [
        "a%zz", "a%2", "a/%2e%2e", "a/.%2E", "%2E", "a/%2e/b", "a%2Fb", "a%2fb", "%ff%fe",
    ] {
        for r in [
            put(&app, &format!("{S}/{bad}"), &[TEXT], Body::empty()).await,
            head(&app, &format!("/{bad}")).await,
        ] {
            assert_eq!(r.code(), 400, "{bad}: {}", r.text());
        }
        let r = put(&app, &format!("/{bad}"), &[TEXT], Body::empty()).await;
        assert!(r.text().starts_with("bad stream name: "), "{bad}");
    }
    // A name is its decoded path: `%61` is `a`, under the mount, at the root and over Pico.
    assert_eq!(
        put(&app, &format!("{S}/%61"), &[TEXT], "x").await.code(),
        201
    );
    assert_eq!(head(&app, &format!("{S}/a")).await.code(), 200);
    assert_eq!(get(&app, "/%61").await.text(), "x");
    let r = put(&app, &format!("{S}/a"), &[TEXT], Body::empty()).await;
    assert_eq!(r.code(), 200);
}

#[tokio::test]
async fn closed_json_stream_answers_409_whatever_the_body() {
    let (app, _) = app().await;
    let u = format!("{S}/cj");
    put(&app, &u, &[JSON], "[1,2]").await;
    let tail = post(&app, &u, &[("stream-closed", "true")], Body::empty())
        .await
        .offset();
    let max = pico_server::node::MAX_RECORDS_PER_APPEND;
    let too_many = format!("[{}]", vec!["1"; max + 1].join(","));
    let bodies: [Vec<u8>; 5] = [
        b"{bad".to_vec(),
        b"[]".to_vec(),
        too_many.into_bytes(),
        b"[\"\xff\"]".to_vec(),
        b"[3]".to_vec(),
    ];
    for body in bodies {
        let shown = String::from_utf8_lossy(&body[..body.len().min(8)]).into_owned();
        let r = post(&app, &u, &[JSON], body).await;
        assert_eq!(
            (r.code(), r.h("stream-closed")),
            (409, Some("true")),
            "{shown}: {}",
            r.text()
        );
        assert_eq!(r.offset(), tail, "{shown}");
    }
    // The same bodies on an open stream are still refused for what they are.
    let open = format!("{S}/oj");
    put(&app, &open, &[JSON], Body::empty()).await;
    for (body, code) in [("{bad", 400), ("[]", 400)] {
        let r = post(&app, &open, &[JSON], body).await;
        assert_eq!(r.code(), code, "{body}");
        assert!(r.h("stream-closed").is_none());
    }
}

#[tokio::test]
async fn fork_of_a_soft_deleted_source_is_409_with_or_without_a_body() {
    let (app, _) = app().await;
    put(&app, &format!("{S}/gone"), &[TEXT], "root").await;
    put(
        &app,
        &format!("{S}/keep"),
        &[("stream-forked-from", "/v1/stream/gone")],
        Body::empty(),
    )
    .await;
    assert_eq!(delete(&app, &format!("{S}/gone")).await.code(), 204);
    let from = [("stream-forked-from", "/v1/stream/gone")];
    let r = put(&app, &format!("{S}/f0"), &from, Body::empty()).await;
    assert_eq!(r.code(), 409, "{}", r.text());
    // With a body and no Content-Type the handler looks the source up to frame the body.
    let r = put(&app, &format!("{S}/f1"), &from, "more").await;
    assert_eq!(r.code(), 409, "{}", r.text());
    assert!(r.text().contains("fork source is deleted"), "{}", r.text());
    assert_eq!(head(&app, &format!("{S}/f1")).await.code(), 404);
    // A missing source is still 404 either way.
    let none = [("stream-forked-from", "/v1/stream/none")];
    assert_eq!(put(&app, &format!("{S}/f2"), &none, "x").await.code(), 404);
}

#[tokio::test]
async fn json_bodies_must_be_utf8() {
    let (app, _) = app().await;
    let u = format!("{S}/u8");
    put(&app, &u, &[JSON], r#"["é"]"#).await;
    let r = post(&app, &u, &[JSON], b"[\"\xff\"]".to_vec()).await;
    assert_eq!(r.code(), 400);
    assert!(
        r.text().contains("not valid UTF-8"),
        "clear message: {}",
        r.text()
    );
    let r = put(&app, &format!("{S}/u8b"), &[JSON], b"\"a\xc3\"".to_vec()).await;
    assert_eq!(r.code(), 400);
    assert_eq!(head(&app, &format!("{S}/u8b")).await.code(), 404);
    // Nothing was stored; valid UTF-8 reads back byte for byte.
    let r = get(&app, &u).await;
    assert_eq!((r.text(), r.offset()), (r#"["é"]"#, format_offset(1)));
    // Byte streams hold any bytes.
    put(&app, &format!("{S}/raw"), &[OCTETS], Body::empty()).await;
    let r = post(&app, &format!("{S}/raw"), &[OCTETS], b"\xff".to_vec()).await;
    assert_eq!(r.code(), 204);
}

#[tokio::test]
async fn interop_offsets_must_have_a_zero_read_seq() {
    let (app, _) = app().await;
    let u = format!("{S}/rb");
    put(&app, &u, &[TEXT], "a").await;
    post(&app, &u, &[TEXT], "b").await;
    let r = get(
        &app,
        &format!("{u}?offset=0000000000000000_0000000000000001"),
    )
    .await;
    assert_eq!((r.code(), r.text()), (200, "b"));
    // A read sequence this server never mints: refused rather than read from `B`.
    for q in ["5_1", "0000000000000001_0000000000000000"] {
        let r = get(&app, &format!("{u}?offset={q}")).await;
        assert_eq!(r.code(), 400, "{q}");
        assert!(
            r.text().contains("not an offset of this server"),
            "{q}: {}",
            r.text()
        );
    }
    let r = put(
        &app,
        &format!("{S}/rbf"),
        &[
            ("stream-forked-from", "/v1/stream/rb"),
            ("stream-fork-offset", "0000000000000001_0000000000000001"),
        ],
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 400);
}
