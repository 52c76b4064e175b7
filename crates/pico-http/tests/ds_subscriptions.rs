//! Durable Streams subscriptions end to end: the `__ds` router mounted at `/v1/stream/__ds` over
//! a real test node, streams written through the node API, webhooks delivered over real HTTP to
//! a receiver on 127.0.0.1.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use pico_common::StreamName;
use pico_common::clock::ManualClock;
use pico_http::ds::subscriptions;
use pico_protocol::{Record, format_offset};
use pico_server::subscriptions::HttpSender;
use pico_server::testing::read_json;
use pico_server::{AppendRequest, CreateConfig, CreateRequest, Node};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tower::ServiceExt;

const HOST: &str = "127.0.0.1:4437";
const ROOT: &str = "http://127.0.0.1:4437/v1/stream/__ds";

fn app(node: &Node) -> Router {
    app_with_clock(node).0
}

/// The router over a manager whose clock moves only when the test says so (leases and retry
/// schedules are read from it, and its timer task ticks on it: a test that needs a timer pass
/// moves the clock).
fn app_with_clock(node: &Node) -> (Router, Arc<ManualClock>) {
    let clock = ManualClock::new(pico_common::clock::now_ms());
    let mgr =
        subscriptions::Manager::with(node.clone(), clock.clone(), Arc::new(HttpSender::new()));
    let app = Router::new().nest("/v1/stream/__ds", subscriptions::router(Arc::new(mgr)));
    (app, clock)
}

async fn call(
    app: &Router,
    method: &str,
    path: &str,
    body: Option<Value>,
    bearer: Option<&str>,
) -> (StatusCode, HeaderMap, Value) {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header("host", HOST);
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    if let Some(t) = bearer {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let body = body.map(|b| Body::from(b.to_string())).unwrap_or_default();
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    let v = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()))
    };
    (status, headers, v)
}

fn sub_path(id: &str) -> String {
    format!("/v1/stream/__ds/subscriptions/{id}")
}

async fn create_stream(node: &Node, name: &str, initial: &[Value]) {
    node.create(CreateRequest {
        name: StreamName::parse(name).unwrap(),
        config: CreateConfig {
            content_type: Some("application/json".into()),
            ..CreateConfig::default()
        },
        initial: initial
            .iter()
            .map(|v| Record::from_value(v.to_string().into_bytes()))
            .collect(),
    })
    .await
    .unwrap();
}

async fn append(node: &Node, name: &str, v: Value) -> u64 {
    node.append(AppendRequest {
        name: StreamName::parse(name).unwrap(),
        records: vec![Record::from_value(v.to_string().into_bytes())],
        producer: None,
        match_seq: None,
        close: false,
        content_type: None,
    })
    .await
    .unwrap()
    .next_seq
}

struct Hook {
    body: Value,
    raw: Bytes,
    signature: Option<String>,
}

/// A webhook receiver answering each request with the next scripted (status, body) (the last one
/// repeats).
struct Receiver {
    url: String,
    rx: mpsc::UnboundedReceiver<Hook>,
}

impl Receiver {
    async fn start(script: Vec<(u16, Value)>) -> Receiver {
        let (tx, rx) = mpsc::unbounded_channel();
        let script = Arc::new(Mutex::new(script));
        let handler = move |headers: HeaderMap, raw: Bytes| {
            let tx = tx.clone();
            let script = script.clone();
            async move {
                let body = serde_json::from_slice(&raw).unwrap_or(Value::Null);
                let signature = headers
                    .get("webhook-signature")
                    .map(|v| v.to_str().unwrap().to_string());
                let _ = tx.send(Hook {
                    body,
                    raw,
                    signature,
                });
                let (status, reply) = {
                    let mut s = script.lock().unwrap();
                    if s.len() > 1 {
                        s.remove(0)
                    } else {
                        s[0].clone()
                    }
                };
                (StatusCode::from_u16(status).unwrap(), axum::Json(reply))
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let router = Router::new().route("/webhook", axum::routing::post(handler));
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        Receiver {
            url: format!("http://{addr}/webhook"),
            rx,
        }
    }

    async fn next(&mut self) -> Hook {
        tokio::time::timeout(Duration::from_secs(5), self.rx.recv())
            .await
            .expect("timed out waiting for a webhook")
            .expect("receiver closed")
    }

    async fn none_within(&mut self, d: Duration) -> bool {
        tokio::time::timeout(d, self.rx.recv()).await.is_err()
    }

    /// Moves `clock` on by `step` until a webhook arrives (a delivery's answer may land after a
    /// step, restarting its lease from the moved clock): what the manager does once that much
    /// time has passed.
    async fn next_advancing(&mut self, clock: &ManualClock, step: Duration) -> Hook {
        for _ in 0..20 {
            clock.advance(step);
            if let Ok(hook) = tokio::time::timeout(Duration::from_millis(300), self.rx.recv()).await
            {
                return hook.expect("receiver closed");
            }
        }
        panic!("no webhook after moving the clock on");
    }
}

fn verify(jwks: &Value, hook: &Hook) -> bool {
    let Some(sig) = &hook.signature else {
        return false;
    };
    let parts: Vec<&str> = sig.split(',').collect();
    let [t, kid, ed] = parts[..] else {
        return false;
    };
    let t = t.strip_prefix("t=").unwrap();
    let kid = kid.strip_prefix("kid=").unwrap();
    let ed = ed.strip_prefix("ed25519=").unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    if (now - t.parse::<i64>().unwrap()).abs() > 300 {
        return false;
    }
    let key = jwks["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["kid"] == kid)
        .unwrap();
    let x: [u8; 32] = B64
        .decode(key["x"].as_str().unwrap())
        .unwrap()
        .try_into()
        .unwrap();
    let vk = VerifyingKey::from_bytes(&x).unwrap();
    let sig = Signature::from_slice(&B64.decode(ed).unwrap()).unwrap();
    let mut msg = format!("{t}.").into_bytes();
    msg.extend_from_slice(&hook.raw);
    vk.verify(&msg, &sig).is_ok()
}

async fn wait_for<F, Fut>(mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..100 {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Whether subscription `id`, as `GET` answers it, comes to satisfy `ok` within 5 s.
async fn sub_becomes(app: &Router, id: &str, ok: impl Fn(&Value) -> bool) -> bool {
    wait_for(|| async {
        let (_, _, got) = call(app, "GET", &sub_path(id), None, None).await;
        ok(&got)
    })
    .await
}

/// Whether subscription `got` shows `path`'s cursor at `offset`.
fn acked_at(got: &Value, path: &str, offset: u64) -> bool {
    got["streams"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["path"] == path && s["acked_offset"] == format_offset(offset))
}

#[tokio::test]
async fn webhook_subscription_create_confirm_conflict_get_delete() {
    let node = pico_server::testing::start_test_node().await;
    let app = app(&node);
    let cfg = json!({
        "type": "webhook", "pattern": "events/*",
        "webhook": {"url": "http://127.0.0.1:9/webhook"},
        "lease_ttl_ms": 1000, "description": "test subscription"
    });
    let (s, _, created) = call(&app, "PUT", &sub_path("s1"), Some(cfg.clone()), None).await;
    assert_eq!(s, StatusCode::CREATED, "{created}");
    assert!(created.get("webhook_secret").is_none());
    assert_eq!(created["webhook"]["url"], "http://127.0.0.1:9/webhook");
    assert_eq!(created["webhook"]["signing"]["alg"], "ed25519");
    assert_eq!(
        created["webhook"]["signing"]["jwks_url"],
        format!("{ROOT}/jwks.json")
    );
    let kid = created["webhook"]["signing"]["kid"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(kid.starts_with("ds_"));

    let (s, h, jwks) = call(&app, "GET", "/v1/stream/__ds/jwks.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert!(
        h["content-type"]
            .to_str()
            .unwrap()
            .contains("application/jwk-set+json")
    );
    let key = &jwks["keys"][0];
    assert_eq!(
        (key["kid"].as_str(), key["kty"].as_str()),
        (Some(kid.as_str()), Some("OKP"))
    );
    assert_eq!(
        (key["crv"].as_str(), key["alg"].as_str()),
        (Some("Ed25519"), Some("EdDSA"))
    );

    let (s, _, _) = call(&app, "PUT", &sub_path("s1"), Some(cfg.clone()), None).await;
    assert_eq!(s, StatusCode::OK);
    let mut changed = cfg.clone();
    changed["lease_ttl_ms"] = json!(2000);
    let (s, _, err) = call(&app, "PUT", &sub_path("s1"), Some(changed), None).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(err["error"]["code"], "SUBSCRIPTION_ALREADY_EXISTS");

    let (s, _, got) = call(&app, "GET", &sub_path("s1"), None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        (got["id"].as_str(), got["type"].as_str()),
        (Some("s1"), Some("webhook"))
    );
    assert_eq!(got["lease_ttl_ms"], 1000);
    assert_eq!(got["status"], "active");

    let (s, _, _) = call(&app, "DELETE", &sub_path("s1"), None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, err) = call(&app, "GET", &sub_path("s1"), None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(err["error"]["code"], "SUBSCRIPTION_NOT_FOUND");
    // Deleting again is idempotent; re-creating with another config is a fresh create.
    let (s, _, _) = call(&app, "DELETE", &sub_path("s1"), None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let mut other = cfg.clone();
    other["pattern"] = json!("other/**");
    let (s, _, _) = call(&app, "PUT", &sub_path("s1"), Some(other), None).await;
    assert_eq!(s, StatusCode::CREATED);
}

#[tokio::test]
async fn bad_requests_are_rejected_with_codes() {
    let node = pico_server::testing::start_test_node().await;
    let app = app(&node);
    let (s, _, err) = call(
        &app,
        "PUT",
        &sub_path("bad"),
        Some(json!({"type": "webhook", "pattern": "events/*", "webhook": {"url": "http://10.0.0.1/hook"}})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(err["error"]["code"], "WEBHOOK_URL_REJECTED");
    let (s, _, err) = call(
        &app,
        "PUT",
        &sub_path("bad"),
        Some(json!({"type": "pull-wake", "pattern": "events/*"})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_eq!(err["error"]["code"], "INVALID_REQUEST");
    let (s, _, err) = call(&app, "GET", "/v1/stream/__ds/nope", None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(err["error"]["code"], "SUBSCRIPTION_NOT_FOUND");
    let (s, _, _) = call(&app, "POST", "/v1/stream/__ds/jwks.json", None, None).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    // Nothing was stored by the rejected creates.
    let (s, _, _) = call(&app, "GET", &sub_path("bad"), None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn webhook_done_auto_acks_the_signed_snapshot() {
    let node = pico_server::testing::start_test_node().await;
    let app = app(&node);
    // An existing matching stream is linked at its tail: no replay of history.
    create_stream(&node, "events/old", &[json!({"n": 0})]).await;
    let mut rx = Receiver::start(vec![(200, json!({"done": true}))]).await;
    let (s, _, created) = call(
        &app,
        "PUT",
        &sub_path("w1"),
        Some(json!({"type": "webhook", "pattern": "events/*", "webhook": {"url": rx.url}, "lease_ttl_ms": 1000})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    assert_eq!(created["streams"][0]["path"], "events/old");
    assert_eq!(created["streams"][0]["acked_offset"], format_offset(1));
    let (_, _, jwks) = call(&app, "GET", "/v1/stream/__ds/jwks.json", None, None).await;

    create_stream(&node, "events/new", &[json!({"event": "created"})]).await;
    let hook = rx.next().await;
    assert!(
        verify(&jwks, &hook),
        "signature must verify: {:?}",
        hook.signature
    );
    assert_eq!(hook.body["subscription_id"], "w1");
    assert_eq!(
        hook.body["callback_url"],
        format!("{ROOT}/subscriptions/w1/callback")
    );
    assert_eq!(hook.body["generation"], 1);
    let streams = hook.body["streams"].as_array().unwrap();
    let new = streams.iter().find(|s| s["path"] == "events/new").unwrap();
    assert_eq!(new["has_pending"], true);
    assert_eq!(new["acked_offset"], "-1");
    assert_eq!(new["tail_offset"], format_offset(1));
    let old = streams.iter().find(|s| s["path"] == "events/old").unwrap();
    assert_eq!(old["has_pending"], false);

    assert!(
        sub_becomes(&app, "w1", |got| acked_at(got, "events/new", 1)).await,
        "done must ack the snapshot tail"
    );
    // Non-matching streams never wake it; the next matching append is a new generation.
    create_stream(&node, "other/x", &[json!(1)]).await;
    append(&node, "events/new", json!({"event": "second"})).await;
    let hook = rx.next().await;
    assert_eq!(hook.body["generation"], 2);
    assert_ne!(hook.body["wake_id"], Value::Null);
}

#[tokio::test]
async fn webhook_callback_acks_and_fences_stale_generations() {
    let node = pico_server::testing::start_test_node().await;
    let app = app(&node);
    let mut rx = Receiver::start(vec![(200, json!({}))]).await;
    call(
        &app,
        "PUT",
        &sub_path("cb"),
        Some(json!({"type": "webhook", "pattern": "events/*", "webhook": {"url": rx.url}, "lease_ttl_ms": 1000})),
        None,
    )
    .await;
    create_stream(&node, "events/cb", &[json!({"event": "created"})]).await;
    let hook = rx.next().await;
    let b = &hook.body;
    let token = b["callback_token"].as_str().unwrap();
    let tail = b["streams"][0]["tail_offset"].clone();
    let ack = json!({
        "wake_id": b["wake_id"], "generation": b["generation"],
        "acks": [{"stream": "events/cb", "offset": tail}], "done": true
    });
    let cb = "/v1/stream/__ds/subscriptions/cb/callback";

    // Wrong token / wrong wake are rejected without effect.
    let (s, _, err) = call(&app, "POST", cb, Some(ack.clone()), Some("forged.token")).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::UNAUTHORIZED, Some("TOKEN_INVALID"))
    );
    let mut wrong_wake = ack.clone();
    wrong_wake["wake_id"] = json!("w_other");
    let (s, _, err) = call(&app, "POST", cb, Some(wrong_wake), Some(token)).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED"))
    );
    let mut beyond = ack.clone();
    beyond["acks"][0]["offset"] = json!(format_offset(99));
    let (s, _, err) = call(&app, "POST", cb, Some(beyond), Some(token)).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("INVALID_OFFSET"))
    );

    let (s, _, ok) = call(&app, "POST", cb, Some(ack.clone()), Some(token)).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(ok, json!({"ok": true, "next_wake": false}));
    let (s, _, err) = call(&app, "POST", cb, Some(ack.clone()), Some(token)).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED"))
    );
    let (_, _, got) = call(&app, "GET", &sub_path("cb"), None, None).await;
    assert_eq!(got["streams"][0]["acked_offset"], tail);
    assert!(
        rx.none_within(Duration::from_millis(300)).await,
        "nothing pending: no new wake"
    );
}

#[tokio::test]
async fn webhook_lease_expiry_rewakes_with_a_new_generation() {
    let node = pico_server::testing::start_test_node().await;
    let (app, clock) = app_with_clock(&node);
    let mut rx = Receiver::start(vec![(200, json!({}))]).await;
    call(
        &app,
        "PUT",
        &sub_path("lease"),
        Some(json!({"type": "webhook", "streams": ["jobs/a"], "webhook": {"url": rx.url}, "lease_ttl_ms": 1000})),
        None,
    )
    .await;
    create_stream(&node, "jobs/a", &[]).await;
    append(&node, "jobs/a", json!(1)).await;
    let first = rx.next().await;
    assert_eq!(first.body["generation"], 1);
    // Nobody calls back: the wake stays out while the clock stands still...
    assert!(rx.none_within(Duration::from_millis(300)).await);
    // ...and is re-issued once the lease has run out; the old token is fenced.
    let second = rx
        .next_advancing(&clock, Duration::from_millis(1_100))
        .await;
    assert_eq!(second.body["generation"], 2);
    assert_ne!(second.body["wake_id"], first.body["wake_id"]);
    let stale = json!({"wake_id": first.body["wake_id"], "generation": 1, "done": true});
    let (s, _, err) = call(
        &app,
        "POST",
        "/v1/stream/__ds/subscriptions/lease/callback",
        Some(stale),
        first.body["callback_token"].as_str(),
    )
    .await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED"))
    );
}

#[tokio::test]
async fn webhook_delivery_retries_after_failure() {
    let node = pico_server::testing::start_test_node().await;
    let (app, clock) = app_with_clock(&node);
    let mut rx = Receiver::start(vec![(500, json!({})), (200, json!({"done": true}))]).await;
    call(
        &app,
        "PUT",
        &sub_path("retry"),
        Some(json!({"type": "webhook", "pattern": "r/*", "webhook": {"url": rx.url}})),
        None,
    )
    .await;
    create_stream(&node, "r/1", &[json!(1)]).await;
    let first = rx.next().await;
    assert!(
        sub_becomes(&app, "retry", |got| { got["status"] == "failed" }).await,
        "a failed delivery marks the subscription failed"
    );
    // The retry waits for its backoff (1 s ± 20 %) on the manager's clock.
    assert!(
        rx.none_within(Duration::from_millis(300)).await,
        "no retry before the clock moves"
    );
    clock.advance(Duration::from_millis(1_300));
    let second = rx.next().await;
    assert_eq!(
        second.body["wake_id"], first.body["wake_id"],
        "a retry re-sends the same wake"
    );
    assert!(
        sub_becomes(&app, "retry", |got| {
            got["status"] == "active" && got["streams"][0]["acked_offset"] == format_offset(1)
        })
        .await
    );
}

#[tokio::test]
async fn explicit_streams_are_added_and_removed() {
    let node = pico_server::testing::start_test_node().await;
    let app = app(&node);
    let (s, _, _) = call(
        &app,
        "PUT",
        &sub_path("ex"),
        Some(json!({"type": "webhook", "pattern": "manual/*", "streams": ["manual/a"], "webhook": {"url": "http://127.0.0.1:9/webhook"}})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let streams = "/v1/stream/__ds/subscriptions/ex/streams";
    let (s, _, _) = call(
        &app,
        "POST",
        streams,
        Some(json!({"streams": ["manual/b", "x/c"]})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = call(
        &app,
        "POST",
        streams,
        Some(json!({"streams": ["manual/b"]})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "adding twice is idempotent");
    let (s, _, _) = call(&app, "DELETE", &format!("{streams}/manual%2Fb"), None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, _) = call(
        &app,
        "DELETE",
        &format!("{streams}/never%2Flinked"),
        None,
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, _, got) = call(&app, "GET", &sub_path("ex"), None, None).await;
    let list = got["streams"].as_array().unwrap();
    let paths: Vec<(&str, &str)> = list
        .iter()
        .map(|s| {
            (
                s["path"].as_str().unwrap(),
                s["link_type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(paths, vec![("manual/a", "explicit"), ("x/c", "explicit")]);
    // An explicit link to an existing stream the pattern also matches keeps its glob link.
    create_stream(&node, "manual/z", &[json!(1)]).await;
    call(
        &app,
        "POST",
        streams,
        Some(json!({"streams": ["manual/z"]})),
        None,
    )
    .await;
    let (s, _, _) = call(&app, "DELETE", &format!("{streams}/manual%2Fz"), None, None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, _, got) = call(&app, "GET", &sub_path("ex"), None, None).await;
    assert!(
        got["streams"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["path"] == "manual/z" && s["link_type"] == "glob"),
        "{got}"
    );
    assert_eq!(list[0]["acked_offset"], format_offset(0));
    let (s, _, err) = call(&app, "POST", streams, Some(json!({"streams": []})), None).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("INVALID_REQUEST"))
    );
    let (s, _, _) = call(
        &app,
        "POST",
        "/v1/stream/__ds/subscriptions/missing/streams",
        Some(json!({"streams": ["a"]})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn pull_wake_claim_ack_release_and_fencing() {
    let node = pico_server::testing::start_test_node().await;
    let (app, clock) = app_with_clock(&node);
    create_stream(&node, "wake/pool", &[]).await;
    let (s, _, _) = call(
        &app,
        "PUT",
        &sub_path("pw"),
        Some(json!({"type": "pull-wake", "pattern": "**", "wake_stream": "wake/pool", "lease_ttl_ms": 1000})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let claim = "/v1/stream/__ds/subscriptions/pw/claim";
    let (s, _, err) = call(&app, "POST", claim, Some(json!({"worker": "w1"})), None).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("NO_PENDING_WORK"))
    );

    create_stream(&node, "events/p", &[json!({"event": "created"})]).await;
    let node2 = node.clone();
    assert!(
        wait_for(|| {
            let node = node2.clone();
            async move {
                read_json(&node, "wake/pool")
                    .await
                    .iter()
                    .any(|e| e["subscription_id"] == "pw")
            }
        })
        .await,
        "a wake event is appended to the wake stream"
    );
    let events = read_json(&node, "wake/pool").await;
    assert_eq!(
        events.len(),
        1,
        "its own wake stream does not wake it: {events:?}"
    );
    assert_eq!(
        (events[0]["type"].as_str(), events[0]["stream"].as_str()),
        (Some("wake"), Some("events/p"))
    );
    assert_eq!(events[0]["generation"], 1);

    let (s, _, c1) = call(&app, "POST", claim, Some(json!({"worker": "w1"})), None).await;
    assert_eq!(s, StatusCode::OK, "{c1}");
    assert_eq!(c1["generation"], 1);
    assert_eq!(c1["lease_ttl_ms"], 1000);
    let tail = c1["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["path"] == "events/p")
        .unwrap()["tail_offset"]
        .clone();
    let (s, _, busy) = call(&app, "POST", claim, Some(json!({"worker": "w2"})), None).await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(busy["error"]["code"], "ALREADY_CLAIMED");
    assert_eq!(busy["error"]["current_holder"], "w1");

    let ack = "/v1/stream/__ds/subscriptions/pw/ack";
    let token = c1["token"].as_str().unwrap();
    // Heartbeat (no done) keeps the claim.
    let hb = json!({"wake_id": c1["wake_id"], "generation": 1});
    let (s, _, v) = call(&app, "POST", ack, Some(hb), Some(token)).await;
    assert_eq!(
        (s, v),
        (StatusCode::OK, json!({"ok": true, "next_wake": false}))
    );
    let done = json!({"wake_id": c1["wake_id"], "generation": 1, "acks": [{"stream": "events/p", "offset": tail}], "done": true});
    let (s, _, v) = call(&app, "POST", ack, Some(done.clone()), Some(token)).await;
    assert_eq!(
        (s, v),
        (StatusCode::OK, json!({"ok": true, "next_wake": false}))
    );
    let (s, _, err) = call(&app, "POST", ack, Some(done), Some(token)).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED"))
    );

    // New data: claim right away (no need to wait for the wake event), then release.
    append(&node, "events/p", json!({"event": "second"})).await;
    let (s, _, c2) = call(&app, "POST", claim, Some(json!({"worker": "w1"})), None).await;
    assert_eq!(s, StatusCode::OK, "{c2}");
    assert_eq!(c2["generation"], 2);
    let release = "/v1/stream/__ds/subscriptions/pw/release";
    let rel = json!({"wake_id": c2["wake_id"], "generation": 2});
    let (s, _, _) = call(
        &app,
        "POST",
        release,
        Some(rel.clone()),
        c2["token"].as_str(),
    )
    .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _, err) = call(&app, "POST", release, Some(rel), c2["token"].as_str()).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED"))
    );
    // Pending work remains after the release: a new wake (generation 3) is announced.
    let events = read_json(&node, "wake/pool").await;
    assert_eq!(events.last().unwrap()["generation"], 3, "{events:?}");

    // A claim whose lease runs out is fenced; another worker takes over.
    let (s, _, c3) = call(&app, "POST", claim, Some(json!({"worker": "w3"})), None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(c3["generation"], 3);
    let (s, _, busy) = call(&app, "POST", claim, Some(json!({"worker": "w4"})), None).await;
    assert_eq!(
        (s, &busy["error"]["current_holder"]),
        (StatusCode::CONFLICT, &json!("w3"))
    );
    clock.advance(Duration::from_millis(1_300));
    let (s, _, c4) = call(&app, "POST", claim, Some(json!({"worker": "w4"})), None).await;
    assert_eq!(s, StatusCode::OK, "{c4}");
    assert!(c4["generation"].as_u64().unwrap() > 3);
    let hb = json!({"wake_id": c3["wake_id"], "generation": 3});
    let (s, _, err) = call(&app, "POST", ack, Some(hb), c3["token"].as_str()).await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED"))
    );
    // A token of one subscription is worthless for another's wake.
    let (s, _, err) = call(
        &app,
        "POST",
        ack,
        Some(json!({"wake_id": c4["wake_id"], "generation": c4["generation"]})),
        c1["token"].as_str(),
    )
    .await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("FENCED"))
    );
}

#[tokio::test]
async fn subscriptions_keys_and_cursors_survive_a_new_manager() {
    let node = pico_server::testing::start_test_node().await;
    let (kid, gen_before) = {
        let app = app(&node);
        create_stream(&node, "wake/q", &[]).await;
        call(
            &app,
            "PUT",
            &sub_path("keep"),
            Some(json!({"type": "pull-wake", "pattern": "q/*", "wake_stream": "wake/q"})),
            None,
        )
        .await;
        create_stream(&node, "q/1", &[json!(1)]).await;
        let (_, _, jwks) = call(&app, "GET", "/v1/stream/__ds/jwks.json", None, None).await;
        let claim = "/v1/stream/__ds/subscriptions/keep/claim";
        let (s, _, c) = call(&app, "POST", claim, Some(json!({"worker": "w"})), None).await;
        assert_eq!(s, StatusCode::OK, "{c}");
        (jwks["keys"][0]["kid"].clone(), c["generation"].clone())
    };
    let app = app(&node);
    let (_, _, jwks) = call(&app, "GET", "/v1/stream/__ds/jwks.json", None, None).await;
    assert_eq!(jwks["keys"][0]["kid"], kid, "the signing key is persisted");
    let (s, _, got) = call(&app, "GET", &sub_path("keep"), None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(got["generation"], gen_before);
    assert_eq!(got["streams"][0]["path"], "q/1");
    // The claim held before is still held (its lease is durable state).
    let (s, _, busy) = call(
        &app,
        "POST",
        "/v1/stream/__ds/subscriptions/keep/claim",
        Some(json!({"worker": "other"})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CONFLICT);
    assert_eq!(busy["error"]["current_holder"], "w");
}

#[tokio::test]
async fn a_recreated_stream_starts_its_cursor_over() {
    let node = pico_server::testing::start_test_node().await;
    let app = app(&node);
    let mut rx = Receiver::start(vec![(200, json!({"done": true}))]).await;
    let (s, _, _) = call(
        &app,
        "PUT",
        &sub_path("inc"),
        Some(json!({"type": "webhook", "pattern": "inc/*", "webhook": {"url": rx.url}, "lease_ttl_ms": 1000})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    create_stream(&node, "inc/a", &[json!(1), json!(2), json!(3)]).await;
    rx.next().await;
    assert!(
        sub_becomes(&app, "inc", |got| acked_at(got, "inc/a", 3)).await,
        "done must ack the first stream's tail"
    );
    // Same name, new stream: its records from offset 0 are new work, not already acked.
    node.delete(&StreamName::parse("inc/a").unwrap())
        .await
        .unwrap();
    create_stream(&node, "inc/a", &[json!("fresh")]).await;
    let hook = rx.next().await;
    let streams = hook.body["streams"].as_array().unwrap();
    let a = streams.iter().find(|s| s["path"] == "inc/a").unwrap();
    assert_eq!(a["acked_offset"], "-1");
    assert_eq!(a["has_pending"], true);
}

/// A wake event whose wake stream another node owns is not appended here (that would take the
/// stream over and drop the owner's acknowledged, uncommitted appends): it waits, and is
/// written once the stream is released.
#[tokio::test]
async fn a_wake_event_waits_while_another_node_owns_the_wake_stream() {
    use pico_server::testing::{open_on_other_node, owner_of, release_on_other_node};
    let node = pico_server::testing::start_test_node().await;
    let (app, clock) = app_with_clock(&node);
    create_stream(&node, "wake/far", &[]).await;
    let (id, epoch) = open_on_other_node(&node, "wake/far").await;
    let (s, _, _) = call(
        &app,
        "PUT",
        &sub_path("far"),
        Some(json!({"type": "pull-wake", "pattern": "**", "wake_stream": "wake/far"})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    create_stream(&node, "events/far", &[json!({"event": "created"})]).await;
    assert!(
        sub_becomes(&app, "far", |got| { got["generation"] == 1 }).await,
        "the append wakes the subscription"
    );
    assert_eq!(
        owner_of(&node, id),
        Some(2),
        "the wake stream was taken over"
    );
    assert!(read_json(&node, "wake/far").await.is_empty());
    release_on_other_node(&node, id, epoch).await;
    let node2 = node.clone();
    assert!(
        wait_for(|| {
            let node = node2.clone();
            // The held event is retried by the timer, which runs on the manager's clock.
            clock.advance(pico_server::subscriptions::TICK);
            async move {
                read_json(&node, "wake/far")
                    .await
                    .iter()
                    .any(|e| e["subscription_id"] == "far" && e["generation"] == 1)
            }
        })
        .await,
        "the held wake event is written once the stream is free"
    );
}

/// Unbounded configs made every append slow (each append runs every subscription's pattern):
/// patterns, descriptions and explicit membership are bounded, refused in the DS error shape.
#[tokio::test]
async fn oversized_configs_and_memberships_are_refused() {
    let node = pico_server::testing::start_test_node().await;
    let app = app(&node);
    let pull_wake = |pattern: String| json!({"type": "pull-wake", "pattern": pattern, "wake_stream": "wake/big"});
    // Under the 2 MiB body limit, far over the pattern limit.
    let (s, _, err) = call(
        &app,
        "PUT",
        &sub_path("big"),
        Some(pull_wake("**/".repeat(300_000))),
        None,
    )
    .await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("INVALID_REQUEST")),
        "{}",
        err["error"]
    );
    let (s, _, err) = call(
        &app,
        "PUT",
        &sub_path("big"),
        Some(pull_wake(["**"; 10].join("/x/"))),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
    let mut described = pull_wake("a/*".into());
    described["description"] = json!("d".repeat(100_000));
    let (s, _, err) = call(&app, "PUT", &sub_path("big"), Some(described), None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{err}");
    let (s, _, _) = call(&app, "GET", &sub_path("big"), None, None).await;
    assert_eq!(s, StatusCode::NOT_FOUND, "nothing was stored");

    // Explicit membership: 1,000 streams per request, 10,000 links per subscription.
    let (s, _, _) = call(
        &app,
        "PUT",
        &sub_path("big"),
        Some(pull_wake("a/*".into())),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    let add = "/v1/stream/__ds/subscriptions/big/streams";
    for batch in 0..10 {
        let streams: Vec<String> = (0..1_000).map(|i| format!("m/{batch}/{i}")).collect();
        let (s, _, err) = call(&app, "POST", add, Some(json!({"streams": streams})), None).await;
        assert_eq!(s, StatusCode::NO_CONTENT, "{err}");
    }
    let (s, _, err) = call(
        &app,
        "POST",
        add,
        Some(json!({"streams": ["m/one-more"]})),
        None,
    )
    .await;
    assert_eq!(
        (s, err["error"]["code"].as_str()),
        (StatusCode::CONFLICT, Some("LIMIT_EXCEEDED")),
        "{err}"
    );
    // Already linked: no new link, accepted.
    let (s, _, _) = call(&app, "POST", add, Some(json!({"streams": ["m/0/0"]})), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (_, _, got) = call(&app, "GET", &sub_path("big"), None, None).await;
    assert_eq!(got["streams"].as_array().unwrap().len(), 10_000);
}

/// A subscription that never wakes again (here: a pull-wake nobody claims) used to keep a link,
/// and a KV key, for every matching stream it ever saw; the timer now drops links of deleted
/// streams, and an ack for one dropped during a claim is not an error.
#[tokio::test]
async fn links_of_deleted_streams_are_pruned_without_a_wake() {
    let node = pico_server::testing::start_test_node().await;
    let (app, clock) = app_with_clock(&node);
    // The prune runs every few timer passes; the timer runs on the manager's clock.
    let prune_pass = || clock.advance(pico_server::subscriptions::TICK * 10);
    create_stream(&node, "wake/tmp", &[]).await;
    let (s, _, _) = call(
        &app,
        "PUT",
        &sub_path("tmp"),
        Some(json!({"type": "pull-wake", "pattern": "tmp/*", "wake_stream": "wake/tmp"})),
        None,
    )
    .await;
    assert_eq!(s, StatusCode::CREATED);
    for i in 0..50 {
        let name = format!("tmp/{i}");
        create_stream(&node, &name, &[json!(i)]).await;
        append(&node, &name, json!("more")).await;
        node.delete(&StreamName::parse(&name).unwrap())
            .await
            .unwrap();
    }
    create_stream(&node, "tmp/keep", &[json!("live")]).await;
    let linked = |app: Router| async move {
        let (_, _, got) = call(&app, "GET", &sub_path("tmp"), None, None).await;
        got["streams"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["path"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let app2 = app.clone();
    assert!(
        wait_for(|| {
            let app = app2.clone();
            prune_pass();
            async move { linked(app).await == ["tmp/keep"] }
        })
        .await,
        "only the live stream stays linked: {:?}",
        linked(app.clone()).await
    );

    let claim = "/v1/stream/__ds/subscriptions/tmp/claim";
    let (s, _, c) = call(&app, "POST", claim, Some(json!({"worker": "w"})), None).await;
    assert_eq!(s, StatusCode::OK, "{c}");
    let keep = c["streams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["path"] == "tmp/keep")
        .cloned()
        .unwrap();
    node.delete(&StreamName::parse("tmp/keep").unwrap())
        .await
        .unwrap();
    let app2 = app.clone();
    assert!(
        wait_for(|| {
            let app = app2.clone();
            prune_pass();
            async move { linked(app).await.is_empty() }
        })
        .await,
        "the deleted stream is unlinked while the wake is claimed"
    );
    let done = json!({
        "wake_id": c["wake_id"], "generation": c["generation"], "done": true,
        "acks": [{"stream": "tmp/keep", "offset": keep["tail_offset"]}],
    });
    let (s, _, v) = call(
        &app,
        "POST",
        "/v1/stream/__ds/subscriptions/tmp/ack",
        Some(done),
        c["token"].as_str(),
    )
    .await;
    assert_eq!(
        (s, v.clone()),
        (StatusCode::OK, json!({"ok": true, "next_wake": false})),
        "{v}"
    );
}
