//! Webhook delivery behind [`WebhookSender`]: the manager decides what to send and when; a
//! sender only carries one signed request and reports what the receiver said. The HTTP
//! implementation ([`HttpSender`], reqwest) is a detail tests can replace.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use super::webhook_url;

/// Largest webhook response body read; a larger one counts as not `{"done": true}`.
const MAX_WEBHOOK_RESPONSE: usize = 64 * 1024;
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(10);
/// An unreachable receiver fails fast instead of holding a delivery slot for the whole timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What a finished webhook request told us.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivered {
    /// A 2xx; `done` when its body was `{"done": true}`.
    Accepted { done: bool },
    /// No answer, or not a 2xx: retried later.
    Failed(String),
}

/// Sends one webhook request: `body` as JSON to `url` with the `Webhook-Signature` header.
#[async_trait]
pub trait WebhookSender: Send + Sync + 'static {
    async fn send(&self, url: &str, signature: String, body: Vec<u8>) -> Delivered;
}

/// The reqwest sender: no proxy, no redirects, bounded time, and DNS answers checked by the SSRF
/// guard ([`webhook_url::PublicResolver`]).
pub struct HttpSender {
    http: reqwest::Client,
}

impl HttpSender {
    pub fn new() -> HttpSender {
        let http = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(DELIVERY_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .dns_resolver(Arc::new(webhook_url::PublicResolver))
            .user_agent("picomq-ds-subscriptions")
            .build()
            .unwrap_or_else(|e| {
                tracing::error!(error = %e, "webhook client setup failed; using defaults");
                reqwest::Client::new()
            });
        HttpSender { http }
    }
}

impl Default for HttpSender {
    fn default() -> HttpSender {
        HttpSender::new()
    }
}

#[async_trait]
impl WebhookSender for HttpSender {
    async fn send(&self, url: &str, signature: String, body: Vec<u8>) -> Delivered {
        let sent = self
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-signature", signature)
            .body(body)
            .send()
            .await;
        let mut resp = match sent {
            Ok(r) => r,
            Err(e) => return Delivered::Failed(e.to_string()),
        };
        let status = resp.status();
        if !status.is_success() {
            return Delivered::Failed(format!("webhook answered {status}"));
        }
        // A 2xx with an unreadable body is accepted; only `{"done": true}` finishes the wake.
        // Read at most a small body: a receiver must not make this node buffer unbounded data.
        let mut body = Vec::new();
        let mut too_big = false;
        while let Ok(Some(chunk)) = resp.chunk().await {
            if body.len() + chunk.len() > MAX_WEBHOOK_RESPONSE {
                too_big = true;
                break;
            }
            body.extend_from_slice(&chunk);
        }
        let done = !too_big
            && serde_json::from_slice::<Value>(&body)
                .ok()
                .and_then(|v| v.get("done").and_then(Value::as_bool))
                .unwrap_or(false);
        Delivered::Accepted { done }
    }
}
