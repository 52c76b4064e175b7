//! Ownership routing: streams open on another node get a 307 to its advertised address.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use pico_http::{HttpOptions, protocol_router};
use pico_server::testing::{open_on_other_node, start_test_node};
use tower::ServiceExt;

async fn send(
    app: &pico_http::fast::Protocol,
    method: &str,
    uri: &str,
) -> axum::response::Response {
    let req = Request::builder()
        .method(method)
        .uri(uri)
        .body(Body::empty())
        .unwrap();
    app.clone().oneshot(req).await.unwrap()
}

#[tokio::test]
async fn redirects_to_owner_unless_local_routing() {
    let node = start_test_node().await;
    let app = protocol_router(node.clone(), HttpOptions::default());
    assert_eq!(
        send(&app, "PUT", "/moved/s").await.status(),
        StatusCode::CREATED
    );
    // Another node registers and opens the stream (as its first request there would).
    let (id, _) = open_on_other_node(&node, "moved/s").await;
    let meta = node.meta();

    let r = send(&app, "GET", "/moved/s?seq=3&format=raw").await;
    assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(
        r.headers()["location"],
        "http://10.0.0.2:4437/moved/s?seq=3&format=raw"
    );
    assert_eq!(r.headers()["cache-control"], "no-store");
    let ds = send(&app, "POST", "/v1/stream/moved/s").await;
    assert_eq!(ds.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(
        ds.headers()["location"],
        "http://10.0.0.2:4437/v1/stream/moved/s"
    );
    // A create of a stream owned elsewhere goes to its owner: a retried create with a body
    // would append here and take the stream over. New names and the listing stay here.
    let put = send(&app, "PUT", "/moved/s").await;
    assert_eq!(put.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(put.headers()["location"], "http://10.0.0.2:4437/moved/s");
    let ds_put = send(&app, "PUT", "/v1/stream/moved/s").await;
    assert_eq!(ds_put.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(meta.view().streams[&id].owner.unwrap().node_id, 2);
    assert_eq!(
        send(&app, "PUT", "/new").await.status(),
        StatusCode::CREATED
    );
    assert_eq!(send(&app, "GET", "/").await.status(), StatusCode::OK);
    // Unowned streams are served here.
    send(&app, "PUT", "/here").await;
    assert_eq!(
        send(&app, "GET", "/here?seq=0").await.status(),
        StatusCode::OK
    );

    let local = protocol_router(
        node,
        HttpOptions {
            routing_local: true,
            ..HttpOptions::default()
        },
    );
    assert_eq!(
        send(&local, "HEAD", "/moved/s").await.status(),
        StatusCode::OK
    );
}

/// A closed stream whose records are all committed lives wholly in the object store: any node
/// serves it, even while another node owns it. Reads of every kind of an open stream owned
/// elsewhere (long-poll, SSE) are redirected like the rest.
#[tokio::test]
async fn closed_committed_streams_are_served_anywhere_and_live_reads_are_redirected() {
    let node = start_test_node().await;
    let app = protocol_router(node.clone(), HttpOptions::default());
    for name in ["/sealed", "/open"] {
        assert_eq!(send(&app, "PUT", name).await.status(), StatusCode::CREATED);
    }
    let close = Request::builder()
        .method("POST")
        .uri("/sealed")
        .header("pico-closed", "true")
        .body(Body::empty())
        .unwrap();
    let r = app.clone().oneshot(close).await.unwrap();
    assert!(r.status().is_success(), "close: {}", r.status());
    open_on_other_node(&node, "sealed").await;
    open_on_other_node(&node, "open").await;
    assert_eq!(
        send(&app, "GET", "/sealed?seq=0").await.status(),
        StatusCode::OK
    );
    assert_eq!(
        send(&app, "GET", "/v1/stream/sealed?offset=-1")
            .await
            .status(),
        StatusCode::OK
    );
    for uri in [
        "/open?seq=0&live=long-poll",
        "/open?seq=0&live=sse",
        "/v1/stream/open?offset=-1&live=long-poll",
        "/v1/stream/open?offset=-1&live=sse",
    ] {
        let r = send(&app, "GET", uri).await;
        assert_eq!(r.status(), StatusCode::TEMPORARY_REDIRECT, "{uri}");
        assert_eq!(
            r.headers()["location"],
            format!("http://10.0.0.2:4437{uri}").as_str(),
            "{uri}"
        );
    }
}
