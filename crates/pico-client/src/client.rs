//! [`Client`]: one async method per Pico protocol request.

use crate::error::ClientError;
use crate::types::*;
use crate::wire::{self, *};
use bytes::Bytes;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use reqwest::{Method, Response, StatusCode, Url};
use std::time::Duration;

/// Redirect hops followed before giving up (a 307 points at the owner, so one is normal).
const MAX_REDIRECTS: usize = 5;

#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// Speak HTTP/2 over cleartext without negotiation (h2c).
    pub http2_prior_knowledge: bool,
    /// Sent as `Authorization: Bearer <token>`.
    pub token: Option<String>,
}

/// A Pico protocol client. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    /// The endpoint without a trailing slash, e.g. `http://127.0.0.1:4437`.
    base: String,
    token: Option<String>,
}

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

    /// Sends a request, following 307/308 to `Location` with the same method, headers and body.
    async fn send(
        &self,
        method: Method,
        mut url: Url,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Response, ClientError> {
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
            let resp = req.send().await?;
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
        )))
    }

    /// Sends and turns any non-2xx status into [`ClientError::Http`].
    async fn send_ok(
        &self,
        method: Method,
        url: Url,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<Response, ClientError> {
        let resp = self.send(method, url, headers, body).await?;
        if resp.status().is_success() {
            Ok(resp)
        } else {
            let status = resp.status().as_u16();
            let body = resp.bytes().await.unwrap_or_default();
            Err(ClientError::from_response(status, &body))
        }
    }

    /// Sends one request to `path` (following redirects) and returns status, headers and body,
    /// whatever the status. For callers that interpret error statuses themselves.
    pub(crate) async fn raw_request(
        &self,
        method: Method,
        path: &str,
        headers: HeaderMap,
        body: Option<Bytes>,
    ) -> Result<(u16, HeaderMap, Bytes), ClientError> {
        let url = self.url(path, &[])?;
        let resp = self.send(method, url, headers, body).await?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await?;
        Ok((status, headers, body))
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
            headers.insert(H_TTL, HeaderValue::from(ttl));
        }
        let url = self.url(&stream_path(name), &[])?;
        let resp = self.send_ok(Method::PUT, url, headers, None).await?;
        Ok(Created {
            created: resp.status() == StatusCode::CREATED,
        })
    }

    /// Stream metadata (`HEAD`); `None` if the stream does not exist.
    pub async fn head(&self, name: &str) -> Result<Option<StreamMeta>, ClientError> {
        let url = self.url(&stream_path(name), &[])?;
        let resp = self.send(Method::HEAD, url, HeaderMap::new(), None).await?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !resp.status().is_success() {
            return Err(ClientError::from_response(resp.status().as_u16(), &[]));
        }
        let h = resp.headers();
        Ok(Some(StreamMeta {
            start: header_u64(h, H_START_SEQ)?.unwrap_or(0),
            next: header_u64(h, H_NEXT_SEQ)?
                .ok_or_else(|| ClientError::Decode("HEAD without Pico-Next-Seq".into()))?,
            closed: header_true(h, H_CLOSED),
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

    /// Appends one record with a raw body and optional protocol headers.
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
            headers.insert(H_KEY, header_value(key)?);
        }
        if let Some(p) = &options.producer {
            headers.insert(H_PRODUCER_ID, header_value(&p.id)?);
            headers.insert(H_PRODUCER_EPOCH, HeaderValue::from(p.epoch));
            headers.insert(H_PRODUCER_SEQ, HeaderValue::from(p.seq));
        }
        if let Some(seq) = options.match_seq {
            headers.insert(H_MATCH_SEQ, HeaderValue::from(seq));
        }
        if options.close {
            headers.insert(H_CLOSED, HeaderValue::from_static("true"));
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
            HeaderValue::from_static(BATCH_JSON_CONTENT_TYPE),
        );
        self.post(name, headers, Bytes::from(wire::encode_json_batch(records)))
            .await
    }

    /// Closes the stream to appends (`POST` with `Pico-Closed: true` and no body).
    pub async fn close(&self, name: &str) -> Result<AppendAck, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(H_CLOSED, HeaderValue::from_static("true"));
        self.post(name, headers, Bytes::new()).await
    }

    /// Drops records below `seq`; returns the new start offset.
    pub async fn trim(&self, name: &str, seq: u64) -> Result<u64, ClientError> {
        let mut headers = HeaderMap::new();
        headers.insert(H_TRIM_SEQ, HeaderValue::from(seq));
        let url = self.url(&stream_path(name), &[])?;
        let resp = self
            .send_ok(Method::POST, url, headers, Some(Bytes::new()))
            .await?;
        Ok(header_u64(resp.headers(), H_START_SEQ)?.unwrap_or(seq))
    }

    async fn post(
        &self,
        name: &str,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<AppendAck, ClientError> {
        let url = self.url(&stream_path(name), &[])?;
        let resp = self.send_ok(Method::POST, url, headers, Some(body)).await?;
        let h = resp.headers();
        let next_seq = header_u64(h, H_NEXT_SEQ)?
            .ok_or_else(|| ClientError::Decode("append response without Pico-Next-Seq".into()))?;
        let start_seq = header_u64(h, H_START_SEQ)?.unwrap_or(next_seq);
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
        self.get_chunk(name, seq, &query).await
    }

    /// Long-poll read from `seq`: returns as soon as records exist, or an empty chunk on
    /// the server's timeout (204).
    pub async fn long_poll(&self, name: &str, seq: u64) -> Result<ReadChunk, ClientError> {
        let query = [
            ("seq", seq.to_string()),
            ("format", "json".to_string()),
            ("live", "long-poll".to_string()),
        ];
        self.get_chunk(name, seq, &query).await
    }

    async fn get_chunk(
        &self,
        name: &str,
        seq: u64,
        query: &[(&str, String)],
    ) -> Result<ReadChunk, ClientError> {
        let url = self.url(&stream_path(name), query)?;
        let resp = self
            .send_ok(Method::GET, url, HeaderMap::new(), None)
            .await?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let records = if status == StatusCode::NO_CONTENT {
            Vec::new()
        } else {
            let body = resp.bytes().await?;
            wire::decode_read_json(&body)?
        };
        let next_seq = match header_u64(&headers, H_NEXT_SEQ)? {
            Some(n) => n,
            None => records.last().map(|r| r.seq + 1).unwrap_or(seq),
        };
        Ok(ReadChunk {
            records,
            next_seq,
            up_to_date: status == StatusCode::NO_CONTENT || header_true(&headers, H_UP_TO_DATE),
            closed: header_true(&headers, H_CLOSED),
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
        let resp = self
            .send_ok(Method::GET, url, HeaderMap::new(), None)
            .await?;
        let body = resp.bytes().await?;
        wire::decode_list(&body)
    }

    /// Deletes the stream; the name is reusable at once.
    pub async fn delete(&self, name: &str) -> Result<(), ClientError> {
        let url = self.url(&stream_path(name), &[])?;
        self.send_ok(Method::DELETE, url, HeaderMap::new(), None)
            .await?;
        Ok(())
    }
}

fn header_value(v: &str) -> Result<HeaderValue, ClientError> {
    HeaderValue::from_str(v)
        .map_err(|_| ClientError::Transport(format!("value not allowed in a header: value=`{v}`")))
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
mod tests {
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
                http2_prior_knowledge: false,
                token: Some("t0k".into()),
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

    #[test]
    fn rejects_non_http_endpoints() {
        assert!(Client::new("https://x", ClientOptions::default()).is_err());
        assert!(Client::new("not a url", ClientOptions::default()).is_err());
    }
}
