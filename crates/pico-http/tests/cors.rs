//! Who may call the listeners from a web page: no origin by default, `--cors-origins` exactly.

mod common;

use axum::body::Body;
use axum::http::Method;
use common::{Resp, app, app_with, send};
use pico_http::cors::CorsOrigins;
use pico_http::{HttpOptions, admin_router};
use pico_server::testing::start_test_node;

const PAGE: &str = "https://example.com";

fn with_origin(origin: &str) -> [(&str, &str); 1] {
    [("origin", origin)]
}

fn no_grant(r: &Resp) {
    assert_eq!(r.h("access-control-allow-origin"), None);
    assert_eq!(r.h("access-control-expose-headers"), None);
    assert_eq!(r.h("access-control-allow-credentials"), None);
}

fn preflight(origin: &str) -> [(&str, &str); 3] {
    [
        ("origin", origin),
        ("access-control-request-method", "DELETE"),
        (
            "access-control-request-headers",
            "pico-producer-id, if-none-match",
        ),
    ]
}

async fn next_seq(app: &pico_http::fast::Protocol, stream: &str) -> String {
    let r = send(app, Method::HEAD, stream, &[], Body::empty()).await;
    assert_eq!(r.code(), 200, "{stream} missing");
    r.h("pico-next-seq").unwrap().to_string()
}

/// The page: a site open in the user's browser could list, read, append to and delete
/// a local node's streams. Now it can neither read an answer nor get a request served.
#[tokio::test]
async fn without_cors_origins_a_web_page_gets_nothing() {
    let (app, _) = app().await;
    let r = send(&app, Method::PUT, "/s", &[], Body::empty()).await;
    assert_eq!(r.code(), 201);
    no_grant(&r);
    let before = next_seq(&app, "/s").await;

    // Reading (the listing, a stream): refused, and no grant to read the refusal either.
    for uri in ["/", "/s?seq=0"] {
        let r = send(&app, Method::GET, uri, &with_origin(PAGE), Body::empty()).await;
        assert_eq!(r.code(), 403, "{uri}");
        assert_eq!(r.json()["error"], "forbidden_origin");
        assert!(r.json()["message"].as_str().unwrap().contains(PAGE));
        assert_eq!(r.h("x-content-type-options"), Some("nosniff"));
        no_grant(&r);
    }
    // A "simple" request is sent without a preflight: it must not be served.
    let ct = [("origin", PAGE), ("content-type", "text/plain")];
    let r = send(&app, Method::POST, "/s", &ct, "from a web page").await;
    assert_eq!(r.code(), 403);
    assert_eq!(next_seq(&app, "/s").await, before, "the page appended");
    let r = send(
        &app,
        Method::DELETE,
        "/s",
        &with_origin(PAGE),
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 403);
    // Sandboxed frames and files send `null`.
    let r = send(
        &app,
        Method::DELETE,
        "/s",
        &with_origin("null"),
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 403);
    next_seq(&app, "/s").await;

    // The preflight is answered (the DS suite asks for one) but grants nothing.
    let r = send(&app, Method::OPTIONS, "/s", &preflight(PAGE), Body::empty()).await;
    assert_eq!(r.code(), 204);
    no_grant(&r);

    // The node's own origin (the request's host) and clients without `Origin` are served.
    let own = with_origin("http://test.local");
    let r = send(&app, Method::GET, "/s?seq=0", &own, Body::empty()).await;
    assert_eq!(r.code(), 200);
    no_grant(&r);
    let r = send(&app, Method::GET, "/s?seq=0", &[], Body::empty()).await;
    assert_eq!(r.code(), 200);
    no_grant(&r);
    assert_eq!(r.h("vary"), None);
}

#[tokio::test]
async fn configured_origins_are_granted_exactly() {
    let app_origin = "https://app.example.com";
    let (app, _) = app_with(HttpOptions {
        cors: CorsOrigins::parse(&[app_origin, "http://localhost:5173"]).unwrap(),
        ..HttpOptions::default()
    })
    .await;
    let r = send(
        &app,
        Method::PUT,
        "/s",
        &with_origin(app_origin),
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 201);
    assert_eq!(r.h("access-control-allow-origin"), Some(app_origin));
    assert!(r.h("vary").unwrap().contains("origin"));
    assert!(
        r.h("access-control-expose-headers")
            .unwrap()
            .contains("pico-next-seq")
    );
    assert_eq!(r.h("access-control-allow-credentials"), None);

    let r = send(
        &app,
        Method::OPTIONS,
        "/s",
        &preflight(app_origin),
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 204);
    assert_eq!(r.h("access-control-allow-origin"), Some(app_origin));
    assert!(r.h("vary").unwrap().contains("origin"));
    assert!(
        r.h("access-control-allow-methods")
            .unwrap()
            .contains("DELETE")
    );
    let allowed = r.h("access-control-allow-headers").unwrap();
    for h in [
        "pico-producer-id",
        "producer-id",
        "stream-seq",
        "content-type",
        "last-event-id",
        "if-none-match",
        "authorization",
    ] {
        assert!(allowed.contains(h), "{h} not in {allowed}");
    }
    assert_eq!(r.h("access-control-allow-credentials"), None);

    // Another origin, even one that starts like a listed one: no grant, not served.
    for other in [
        PAGE,
        "https://app.example.com.evil.test",
        "http://app.example.com",
    ] {
        let r = send(
            &app,
            Method::OPTIONS,
            "/s",
            &preflight(other),
            Body::empty(),
        )
        .await;
        assert_eq!(r.code(), 204, "{other}");
        no_grant(&r);
        let r = send(
            &app,
            Method::GET,
            "/s?seq=0",
            &with_origin(other),
            Body::empty(),
        )
        .await;
        assert_eq!(r.code(), 403, "{other}");
        no_grant(&r);
        assert!(r.h("vary").unwrap().contains("origin"));
    }
    // No `Origin`: served, no grant, but caches still keep one answer per origin.
    let r = send(&app, Method::GET, "/s?seq=0", &[], Body::empty()).await;
    assert_eq!(r.code(), 200);
    no_grant(&r);
    assert!(r.h("vary").unwrap().contains("origin"));
}

#[tokio::test]
async fn star_grants_every_origin_without_credentials() {
    let (app, _) = app_with(HttpOptions {
        cors: CorsOrigins::parse(&["*"]).unwrap(),
        ..HttpOptions::default()
    })
    .await;
    let r = send(&app, Method::PUT, "/s", &with_origin(PAGE), Body::empty()).await;
    assert_eq!(r.code(), 201);
    assert_eq!(r.h("access-control-allow-origin"), Some("*"));
    assert_eq!(r.h("access-control-allow-credentials"), None);
    let r = send(&app, Method::OPTIONS, "/s", &preflight(PAGE), Body::empty()).await;
    assert_eq!(r.h("access-control-allow-origin"), Some("*"));
    assert_eq!(r.h("access-control-allow-credentials"), None);
}

/// The admin listener grants no origin, whatever `--cors-origins` says; its own pages (same
/// origin) are served.
#[tokio::test]
async fn the_admin_listener_serves_its_own_pages_only() {
    let admin = admin_router(start_test_node().await, None);
    let r = send(
        &admin,
        Method::GET,
        "/health",
        &with_origin(PAGE),
        Body::empty(),
    )
    .await;
    assert_eq!(r.code(), 403);
    assert_eq!(r.json()["error"], "forbidden_origin");
    no_grant(&r);
    let own = with_origin("http://test.local");
    let r = send(&admin, Method::GET, "/health", &own, Body::empty()).await;
    assert_eq!((r.code(), r.text()), (200, "ok"));
    let r = send(&admin, Method::GET, "/health", &[], Body::empty()).await;
    assert_eq!(r.code(), 200);
    no_grant(&r);
}
