//! Ownership routing: streams open on another node get a 307 to its advertised address.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use pico_http::{HttpOptions, protocol_router};
use pico_server::testing::{open_on_other_node, start_test_node};
use tower::ServiceExt;

async fn send(app: &axum::Router, method: &str, uri: &str) -> axum::response::Response {
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
