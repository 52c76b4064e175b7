//! [`Client`]: one async method per Pico protocol request.

use crate::error::ClientError;
use crate::types::*;
use crate::wire;
use bytes::Bytes;
use pico_protocol::headers::{
    CONTENT_TYPE_JSON_BATCH, PICO_CLOSED, PICO_KEY, PICO_MATCH_SEQ, PICO_NEXT_SEQ,
    PICO_PRODUCER_EPOCH, PICO_PRODUCER_ID, PICO_PRODUCER_SEQ, PICO_START_SEQ, PICO_TRIM_SEQ,
    PICO_TTL, PICO_UP_TO_DATE,
};
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION, RETRY_AFTER};
use reqwest::{Method, Response, StatusCode, Url};
use std::time::Duration;

/// Redirect hops followed before giving up (a 307 points at the owner, so one is normal).
const MAX_REDIRECTS: usize = 5;
/// Default [`ClientOptions::append_retry_budget`].
pub const APPEND_RETRY_BUDGET: Duration = Duration::from_secs(15);
/// First pause before such a resend (doubling, and at least the server's `Retry-After`).
const APPEND_BACKOFF: Duration = Duration::from_millis(10);
/// Statuses a producer append is re-sent after (the server's "retry later", and gateways').
const RETRYABLE_STATUS: [u16; 3] = [500, 502, 503];

/// Default [`ClientOptions::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Default [`ClientOptions::long_poll_timeout`]: the server's default long-poll wait (25 s)
/// plus the same margin for a slow answer.
pub const DEFAULT_LONG_POLL_TIMEOUT: Duration = Duration::from_secs(55);

#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Speak HTTP/2 over cleartext without negotiation (h2c).
    pub http2_prior_knowledge: bool,
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
    /// Longest wait for the whole answer to one request (redirects included), except long-poll
    /// reads. A producer resends a batch whose attempt ran out; a plain append fails with
    /// [`ClientError::Timeout`], its outcome unknown.
    pub request_timeout: Duration,
    /// The same for long-poll reads: keep it above the server's long-poll wait
    /// (`--long-poll-timeout-sec`), or a read at an idle tail fails instead of answering empty.
    pub long_poll_timeout: Duration,
    /// How long an append carrying a producer triple keeps being re-sent after its first
    /// failure that may pass (see [`Client::append_with`]); zero: never re-sent.
    pub append_retry_budget: Duration,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            http2_prior_knowledge: false,
            token: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            long_poll_timeout: DEFAULT_LONG_POLL_TIMEOUT,
            append_retry_budget: APPEND_RETRY_BUDGET,
        }
    }
}

/// A Pico protocol client. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The endpoint without a trailing slash, e.g. `http://127.0.0.1:4437`.
    base: String,
    token: Option<String>,
    request_timeout: Duration,
    long_poll_timeout: Duration,
    append_retry_budget: Duration,
}

/// An answer read to its end: status, headers, body.
type Answer = (StatusCode, HeaderMap, Bytes);

impl Client {
    pub fn new(endpoint: &str, options: ClientOptions) -> Result<Client, ClientError> {
        let base = endpoint.trim_end_matches('/').to_string();
        let parsed = Url::parse(&base).map_err(|e| {
            ClientError::Transport(format!("bad endpoint: {e}: endpoint=`{endpoint}`"))
        })?;
        if parsed.scheme() != "http" {
            return Err(ClientError::Transport(format!(
                "only http:// endpoints are supported: endpoint=`{endpoint}`"
            )));
        }
        let mut builder = reqwest::Client::builder()
            // Redirects are followed by hand so the body is re-sent and hops are bounded.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(10))
            .tcp_nodelay(true);
        if options.http2_prior_knowledge {
            builder = builder.http2_prior_knowledge();
        }
        let http = builder.build()?;
        Ok(Client {
            http,
            base,
            token: options.token,
            request_timeout: options.request_timeout,
            long_poll_timeout: options.long_poll_timeout,
            append_retry_budget: options.append_retry_budget,
        })
    }

    /// The endpoint this client talks to.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str, query: &[(&str, String)]) -> Result<Url, ClientError> {
        let mut url = Url::parse(&format!("{}{}", self.base, path))
            .map_err(|e| ClientError::Transport(format!("bad url: {e}: path=`{path}`")))?;
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
        }
        Ok(url)
    }

    /// The URL of stream `name`; refuses names the server would not accept (see
    /// [`wire::stream_path`]) before anything is sent.
    fn stream_url(&self, name: &str, query: &[(&str, String)]) -> Result<Url, ClientError> {
        self.url(&wire::stream_path(name)?, query)
    }

    /// Sends a request, following 307/308 to `Location` with the same method, headers and body.
    async fn send(
        &self,
        method: Method,
        mut url: Url,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Response, Failure> {
        for _ in 0..=MAX_REDIRECTS {
            let mut req = self
                .http
                .request(method.clone(), url.clone())
                .headers(headers.clone());
            if let Some(token) = &self.token {
                req = req.bearer_auth(token);
            }
            if let Some(body) = &body {
                req = req.body(body.clone());
            }
            let resp = req.send().await.map_err(Failure::sending)?;
            let status = resp.status();
            if status == StatusCode::TEMPORARY_REDIRECT || status == StatusCode::PERMANENT_REDIRECT
            {
                let location = resp
                    .headers()
                    .get(LOCATION)
                    .and_then(|v| v.to_str().ok())
                    .ok_or_else(|| ClientError::Transport(format!("{status} without Location")))?;
                let next = url.join(location).map_err(|e| {
                    ClientError::Transport(format!(
                        "bad redirect location: {e}: location=`{location}`"
                    ))
                })?;
                tracing::debug!(from = %url, to = %next, "following redirect");
                url = next;
                continue;
            }
            return Ok(resp);
        }
        Err(ClientError::Transport(format!(
            "too many redirects (>{MAX_REDIRECTS}): url=`{url}`"
        ))
        .into())
    }

    /// Sends (following redirects) and reads the whole answer, whatever its status, within
    /// `timeout`: a server that accepts and never answers must not hold the caller forever.
    async fn exchange(
        &self,
        method: Method,
        url: Url,
        headers: HeaderMap,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Answer, ClientError> {
        self.exchange_or_unsent(method, url, headers, body, timeout)
            .await
            .map_err(|f| f.error)
    }

    /// [`Client::exchange`], telling a request that certainly never reached a server apart.
    async fn exchange_or_unsent(
        &self,
        method: Method,
        url: Url,
        headers: HeaderMap,
        body: Option<Bytes>,
        timeout: Duration,
    ) -> Result<Answer, Failure> {
        let answer = async {
            let resp = self.send(method, url, headers, body).await?;
            let status = resp.status();
            let headers = resp.headers().clone();
            let body = resp.bytes().await.map_err(ClientError::from)?;
            Ok((status, headers, body))
        };
        tokio::time::timeout(timeout, answer)
            .await
            .unwrap_or(Err(ClientError::Timeout(timeout).into()))
    }

    /// [`Client::exchange`] with the request timeout, any non-2xx status turned into
    /// [`ClientError::Http`].
    async fn exchange_ok(
        &self,
        method: Method,
        url: Url,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Answer, ClientError> {
        let timeout = self.request_timeout;
        ok(self.exchange(method, url, headers, body, timeout).await?)
    }

    /// One request to stream `name` (following redirects) with the request timeout; returns
    /// status, headers and body, whatever the status. For callers that interpret error
    /// statuses themselves, and need to know whether a failed request may have been applied.
    pub(crate) async fn raw_request(
        &self,
        method: Method,
        name: &str,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<(u16, HeaderMap, Bytes), Failure> {
        let url = self.stream_url(name, &[])?;
        let (status, headers, body) = self
            .exchange_or_unsent(method, url, headers, body, self.request_timeout)
            .await?;
        Ok((status.as_u16(), headers, body))
    }

    /// Idempotent create (`PUT`): `created` is false when the same stream already existed.
    pub async fn create(
        &self,
        name: &str,
        content_type: Option<&str>,
        ttl_secs: Option<u64>,
    ) -> Result<Created, ClientError> {
        let mut headers = HeaderMap::new();
        if let Some(ct) = content_type {
            headers.insert(CONTENT_TYPE, header_value(ct)?);
        }
        if let Some(ttl) = ttl_secs {
            headers.insert(PICO_TTL, HeaderValue::from(ttl));
        }
        let url = self.stream_url(name, &[])?;
        let (status, _, _) = self.exchange_ok(Method::PUT, url, headers, None).await?;
        Ok(Created {
            created: status == StatusCode::CREATED,
        })
    }

    /// Stream metadata (`HEAD`); `None` if the stream does not exist.
    pub async fn head(&self, name: &str) -> Result<Option<StreamMeta>, ClientError> {
        let url = self.stream_url(name, &[])?;
        let (status, h, _) = self
            .exchange(
                Method::HEAD,
                url,
                HeaderMap::new(),
                None,
                self.request_timeout,
            )
            .await?;
        if status == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !status.is_success() {
            return Err(ClientError::from_response(status.as_u16(), &[]));
        }
        let h = &h;
        Ok(Some(StreamMeta {
            start: header_u64(h, PICO_START_SEQ)?.unwrap_or(0),
            next: header_u64(h, PICO_NEXT_SEQ)?
                .ok_or_else(|| ClientError::Decode("HEAD without Pico-Next-Seq".into()))?,
            closed: header_true(h, PICO_CLOSED),
            content_type: h
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("application/octet-stream")
                .to_string(),
        }))
    }

    /// Appends one record with a raw body.
    pub async fn append(
        &self,
        name: &str,
        body: impl Into<Bytes>,
    ) -> Result<AppendAck, ClientError> {
        self.append_with(name, body, &AppendOptions::default())
            .await
    }

    /// Appends one record with a raw body and optional protocol headers. With a producer
    /// triple, failures that may pass are retried (see [`ClientOptions::append_retry_budget`]).
    pub async fn append_with(
        &self,
        name: &str,
        body: impl Into<Bytes>,
        options: &AppendOptions,
    ) -> Result<AppendAck, ClientError> {
        let mut headers = HeaderMap::new();
        if let Some(ct) = &options.content_type {
            headers.insert(CONTENT_TYPE, header_value(ct)?);
        }
        if let Some(key) = &options.key {
            headers.insert(PICO_KEY, header_value(key)?);
        }
        if let Some(p) = &options.producer {
            headers.insert(PICO_PRODUCER_ID, header_value(&p.id)?);
            headers.insert(PICO_PRODUCER_EPOCH, HeaderValue::from(p.epoch));
            headers.insert(PICO_PRODUCER_SEQ, HeaderValue::from(p.seq));
        }
        if let Some(seq) = options.match_seq {
            headers.insert(PICO_MATCH_SEQ, HeaderValue::from(seq));
        }
        if options.close {
            headers.insert(PICO_CLOSED, HeaderValue::from_static("true"));
        }
        self.post(name, headers, body.into()).await
    }

    /// Appends several records in one `application/vnd.picomq.batch+json` request.
    pub async fn append_batch(
        &self,
        name: &str,
        records: &[BatchRecord],
    ) -> Result<AppendAck, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            CONTENT_TYPE,
            HeaderValue::from_static(CONTENT_TYPE_JSON_BATCH),
        );
        self.post(name, headers, Bytes::from(wire::encode_json_batch(records)))
            .await
    }

    /// Closes the stream to appends (`POST` with `Pico-Closed: true` and no body).
    pub async fn close(&self, name: &str) -> Result<AppendAck, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(PICO_CLOSED, HeaderValue::from_static("true"));
        self.post(name, headers, Bytes::new()).await
    }

    /// Drops records below `seq`; returns the new start offset.
    pub async fn trim(&self, name: &str, seq: u64) -> Result<u64, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(PICO_TRIM_SEQ, HeaderValue::from(seq));
        let url = self.stream_url(name, &[])?;
        let (_, h, _) = self
            .exchange_ok(Method::POST, url, headers, Some(Bytes::new()))
            .await?;
        Ok(header_u64(&h, PICO_START_SEQ)?.unwrap_or(seq))
    }

    /// One append. A producer append (`Pico-Producer-*` headers) is re-sent after a failure
    /// that may pass (no connection, no answer, 500/502/503 as during a restart or a stream's
    /// transfer to another node), within [`APPEND_RETRY_BUDGET`]: the server applies a producer
    /// triple at most once and answers a repeat with the original offsets, so a resend cannot
    /// write twice. Any other append is sent once (redirects aside): a 503 does not prove it
    /// was not written (a close that failed after its records were), so resending could.
    async fn post(
        &self,
        name: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<AppendAck, ClientError> {
        let url = self.stream_url(name, &[])?;
        let idempotent = headers.contains_key(PICO_PRODUCER_ID);
        let mut give_up: Option<tokio::time::Instant> = None;
        let mut resends = 0u32;
        let h = loop {
            let answer = self
                .exchange(
                    Method::POST,
                    url.clone(),
                    headers.clone(),
                    Some(body.clone()),
                    self.request_timeout,
                )
                .await;
            let (error, retry_after) = match answer {
                Ok((status, h, b)) => {
                    if !idempotent || !RETRYABLE_STATUS.contains(&status.as_u16()) {
                        break ok((status, h, b))?.1;
                    }
                    let after = h
                        .get(RETRY_AFTER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse().ok())
                        .map(Duration::from_secs);
                    (ClientError::from_response(status.as_u16(), &b), after)
                }
                Err(e @ (ClientError::Transport(_) | ClientError::Timeout(_))) if idempotent => {
                    (e, None)
                }
                Err(e) => return Err(e),
            };
            let now = tokio::time::Instant::now();
            let left = give_up
                .get_or_insert(now + self.append_retry_budget)
                .saturating_duration_since(now);
            if left.is_zero() {
                return Err(error);
            }
            resends += 1;
            tracing::debug!(%url, resends, error = %error, "resending producer append");
            let backoff = APPEND_BACKOFF
                .saturating_mul(1 << resends.min(6))
                .max(retry_after.unwrap_or_default());
            tokio::time::sleep(backoff.min(left)).await;
        };
        let h = &h;
        let next_seq = header_u64(h, PICO_NEXT_SEQ)?
            .ok_or_else(|| ClientError::Decode("append response without Pico-Next-Seq".into()))?;
        let start_seq = header_u64(h, PICO_START_SEQ)?.unwrap_or(next_seq);
        Ok(AppendAck {
            start_seq,
            next_seq,
        })
    }

    /// Catch-up read from `seq` (never waits); `count` caps the records returned.
    pub async fn read(
        &self,
        name: &str,
        seq: u64,
        count: Option<usize>,
    ) -> Result<ReadChunk, ClientError> {
        let mut query = vec![("seq", seq.to_string()), ("format", "json".to_string())];
        if let Some(count) = count {
            query.push(("count", count.to_string()));
        }
        self.get_chunk(name, seq, &query, self.request_timeout)
            .await
    }

    /// Long-poll read from `seq`: returns as soon as records exist, or an empty chunk on
    /// the server's timeout (204).
    pub async fn long_poll(&self, name: &str, seq: u64) -> Result<ReadChunk, ClientError> {
        let query = [
            ("seq", seq.to_string()),
            ("format", "json".to_string()),
            ("live", "long-poll".to_string()),
        ];
        self.get_chunk(name, seq, &query, self.long_poll_timeout)
            .await
    }

    async fn get_chunk(
        &self,
        name: &str,
        seq: u64,
        query: &[(&str, String)],
        timeout: Duration,
    ) -> Result<ReadChunk, ClientError> {
        let url = self.stream_url(name, query)?;
        let (status, headers, body) = ok(self
            .exchange(Method::GET, url, HeaderMap::new(), None, timeout)
            .await?)?;
        let records = if status == StatusCode::NO_CONTENT {
            Vec::new()
        } else {
            wire::decode_read_json(&body)?
        };
        let next_seq = match header_u64(&headers, PICO_NEXT_SEQ)? {
            Some(n) => n,
            None => records.last().map(|r| r.seq + 1).unwrap_or(seq),
        };
        Ok(ReadChunk {
            records,
            next_seq,
            up_to_date: status == StatusCode::NO_CONTENT || header_true(&headers, PICO_UP_TO_DATE),
            closed: header_true(&headers, PICO_CLOSED),
        })
    }

    /// One page of stream names (`GET /?prefix=&start_after=&limit=`).
    pub async fn list(
        &self,
        prefix: Option<&str>,
        start_after: Option<&str>,
        limit: Option<usize>,
    ) -> Result<ListPage, ClientError> {
        let mut query = Vec::new();
        if let Some(p) = prefix {
            query.push(("prefix", p.to_string()));
        }
        if let Some(s) = start_after {
            query.push(("start_after", s.to_string()));
        }
        if let Some(l) = limit {
            query.push(("limit", l.to_string()));
        }
        let url = self.url("/", &query)?;
        let (_, _, body) = self
            .exchange_ok(Method::GET, url, HeaderMap::new(), None)
            .await?;
        wire::decode_list(&body)
    }

    /// Deletes the stream; the name is reusable at once.
    pub async fn delete(&self, name: &str) -> Result<(), ClientError> {
        let url = self.stream_url(name, &[])?;
        self.exchange_ok(Method::DELETE, url, HeaderMap::new(), None)
            .await?;
        Ok(())
    }
}

/// A request that got no answer.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) error: ClientError,
    /// No connection could be made, so no server saw the request (a hop that answered with a
    /// redirect did not apply it either). Otherwise it may have been applied.
    pub(crate) unsent: bool,
}

impl Failure {
    fn sending(e: reqwest::Error) -> Failure {
        Failure {
            unsent: e.is_connect(),
            error: e.into(),
        }
    }
}

impl From<ClientError> for Failure {
    fn from(error: ClientError) -> Failure {
        Failure {
            error,
            unsent: false,
        }
    }
}

/// The answer if its status is 2xx, else the server's error.
fn ok(answer: Answer) -> Result<Answer, ClientError> {
    if answer.0.is_success() {
        Ok(answer)
    } else {
        Err(ClientError::from_response(answer.0.as_u16(), &answer.2))
    }
}

fn header_value(v: &str) -> Result<HeaderValue, ClientError> {
    HeaderValue::from_str(v)
        .map_err(|_| ClientError::Invalid(format!("value not allowed in a header: value=`{v}`")))
}

fn header_u64(h: &HeaderMap, name: &'static str) -> Result<Option<u64>, ClientError> {
    match h.get(HeaderName::from_static(name)) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .map(Some)
            .ok_or_else(|| ClientError::Decode(format!("header {name} is not a number: {v:?}"))),
    }
}

fn header_true(h: &HeaderMap, name: &'static str) -> bool {
    h.get(HeaderName::from_static(name))
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use axum::Router;
    use axum::http::{HeaderMap as AxHeaders, StatusCode as AxStatus};
    use axum::routing::{get, post, put};

    /// A tiny stand-in server: `/a` redirects to `/b`, `/b` acknowledges the body length,
    /// `/loop` redirects to itself, `/conflict` answers a JSON error.
    async fn server() -> String {
        let app = Router::new()
            .route(
                "/a",
                post(|| async { (AxStatus::TEMPORARY_REDIRECT, [("location", "/b")], "") }),
            )
            .route(
                "/b",
                post(|headers: AxHeaders, body: axum::body::Bytes| async move {
                    let auth = headers.get("authorization").cloned();
                    let status = if auth.is_some_and(|a| a == "Bearer t0k") {
                        AxStatus::OK
                    } else {
                        AxStatus::UNAUTHORIZED
                    };
                    (status, [("pico-start-seq", "3".to_string()), ("pico-next-seq", format!("{}", 3 + body.len()))])
                }),
            )
            .route(
                "/slow",
                get(|| async {
                    // Slower than the tests' request timeout, far below their long-poll one.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    (AxStatus::NO_CONTENT, [("pico-next-seq", "4")])
                }),
            )
            .route(
                "/loop",
                get(|| async { (AxStatus::TEMPORARY_REDIRECT, [("location", "/loop")], "") }),
            )
            .route(
                "/conflict",
                put(|| async {
                    (AxStatus::CONFLICT, r#"{"error":"conflict","message":"stream exists with another config: name=`conflict`"}"#)
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}")
    }

    fn client(base: &str) -> Client {
        Client::new(
            base,
            ClientOptions {
                token: Some("t0k".into()),
                ..Default::default()
            },
        )
        .unwrap()
    }

    #[tokio::test]
    async fn follows_307_resending_body_and_token() {
        let base = server().await;
        let ack = client(&base).append("a", &b"12345"[..]).await.unwrap();
        assert_eq!(
            ack,
            AppendAck {
                start_seq: 3,
                next_seq: 8
            }
        );
    }

    #[tokio::test]
    async fn redirect_loops_are_bounded() {
        let base = server().await;
        let err = client(&base).read("loop", 0, None).await.unwrap_err();
        assert!(
            matches!(err, ClientError::Transport(ref m) if m.contains("too many redirects")),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn server_errors_carry_code_and_message() {
        let base = server().await;
        let err = client(&base)
            .create("conflict", None, None)
            .await
            .unwrap_err();
        match err {
            ClientError::Http {
                status,
                code,
                message,
            } => {
                assert_eq!((status, code.as_str()), (409, "conflict"));
                assert!(message.contains("another config"));
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(client(&base).head("nope").await.unwrap(), None);
    }

    /// A server that answers the first `fail` POSTs with 503 (`Retry-After: 0`), then 200,
    /// counting every POST it gets.
    async fn flaky_server(fail: usize) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let posts = Arc::new(AtomicUsize::new(0));
        let seen = posts.clone();
        let app = Router::new().route(
            "/s",
            post(move || {
                let n = seen.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n < fail {
                        (
                            AxStatus::SERVICE_UNAVAILABLE,
                            [("retry-after", "0"), ("pico-next-seq", "0")],
                            r#"{"error":"unavailable","message":"stream is being handed off"}"#,
                        )
                    } else {
                        (
                            AxStatus::OK,
                            [("pico-start-seq", "0"), ("pico-next-seq", "1")],
                            "",
                        )
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (format!("http://{addr}"), posts)
    }

    use std::sync::Arc;

    /// A producer append is re-sent through 503s (the server applies its triple at most once);
    /// a plain one is not (a 503 does not prove it unwritten), and the budget bounds resends.
    #[tokio::test]
    async fn producer_appends_are_resent_after_503_plain_ones_are_not() {
        use std::sync::atomic::Ordering;
        let producer = AppendOptions {
            producer: Some(crate::types::Producer {
                id: "p".into(),
                epoch: 0,
                seq: 0,
            }),
            ..Default::default()
        };
        let (base, posts) = flaky_server(3).await;
        let ack = client(&base)
            .append_with("s", "x", &producer)
            .await
            .unwrap();
        assert_eq!(ack.next_seq, 1);
        assert_eq!(posts.load(Ordering::SeqCst), 4);

        let (base, posts) = flaky_server(1).await;
        let err = client(&base).append("s", "x").await.unwrap_err();
        assert_eq!(err.status(), Some(503));
        assert_eq!(posts.load(Ordering::SeqCst), 1);

        let (base, posts) = flaky_server(usize::MAX).await;
        let bounded = Client::new(
            &base,
            ClientOptions {
                append_retry_budget: Duration::from_millis(200),
                ..Default::default()
            },
        )
        .unwrap();
        let err = bounded.append_with("s", "x", &producer).await.unwrap_err();
        assert_eq!(err.status(), Some(503));
        let n = posts.load(Ordering::SeqCst);
        assert!((2..50).contains(&n), "{n} attempts in a 200 ms budget");
    }

    /// Accepts connections and never answers, holding them open.
    pub(crate) async fn silent_server() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        format!("http://{addr}")
    }

    /// Without the timeouts these calls never return: the outer timeout is a guard that turns
    /// a hang into a failure, not a measurement.
    const HANG_GUARD: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn requests_without_an_answer_time_out() {
        let options = ClientOptions {
            request_timeout: Duration::from_millis(100),
            long_poll_timeout: Duration::from_millis(150),
            ..Default::default()
        };
        let silent = Client::new(&silent_server().await, options.clone()).unwrap();
        let err = tokio::time::timeout(HANG_GUARD, silent.append("s", "x"))
            .await
            .expect("the append never returned")
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Timeout(d) if d == options.request_timeout),
            "{err:?}"
        );
        let err = tokio::time::timeout(HANG_GUARD, silent.long_poll("s", 0))
            .await
            .expect("the long-poll never returned")
            .unwrap_err();
        assert!(
            matches!(err, ClientError::Timeout(d) if d == options.long_poll_timeout),
            "{err:?}"
        );
        // A long-poll has its own, longer bound: one answered after the request timeout is
        // an answer, while a catch-up read that slow is not.
        let options = ClientOptions {
            long_poll_timeout: HANG_GUARD,
            ..options
        };
        let slow = Client::new(&server().await, options).unwrap();
        let chunk = slow.long_poll("slow", 4).await.unwrap();
        assert!(chunk.records.is_empty() && chunk.up_to_date, "{chunk:?}");
        let err = slow.read("slow", 4, None).await.unwrap_err();
        assert!(matches!(err, ClientError::Timeout(_)), "{err:?}");
    }

    /// `orders?x` would go out as `/orders` with a query and act on stream `orders`: names the
    /// server would not accept are refused before anything is sent, legal ones go unescaped.
    #[tokio::test]
    async fn stream_names_are_checked_before_any_request() {
        let seen: std::sync::Arc<std::sync::Mutex<Vec<String>>> = Default::default();
        let app = {
            let seen = seen.clone();
            Router::new().fallback(move |uri: axum::http::Uri| {
                seen.lock().unwrap().push(uri.to_string());
                async { AxStatus::NO_CONTENT }
            })
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        let c = client(&format!("http://{addr}"));
        for bad in ["orders?x", "orders#x", "a/%2e%2e/orders"] {
            let errs = [
                c.delete(bad).await.unwrap_err(),
                c.head(bad).await.unwrap_err(),
                c.trim(bad, 1).await.unwrap_err(),
                c.close(bad).await.unwrap_err(),
                c.read(bad, 0, None).await.unwrap_err(),
                c.create(bad, None, None).await.unwrap_err(),
            ];
            for err in errs {
                assert!(matches!(err, ClientError::Invalid(_)), "{bad}: {err:?}");
            }
        }
        assert_eq!(*seen.lock().unwrap(), Vec::<String>::new());
        c.delete("a%3Fb/c").await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["/a%3Fb/c"]);
    }

    #[test]
    fn rejects_non_http_endpoints() {
        assert!(Client::new("https://x", ClientOptions::default()).is_err());
        assert!(Client::new("not a url", ClientOptions::default()).is_err());
    }
}
