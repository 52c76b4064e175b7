//! The one place that maps service errors to HTTP: status, JSON body
//! `{"error": code, "message": …, "next_seq"?: N}` and the headers a client acts on.

use std::time::Duration;

use axum::Json;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pico_common::ErrorKind;
use pico_protocol::headers as h;
use pico_server::{ErrorDetails, ServiceError};
use serde_json::json;

/// Retry-After sent with 503 when the service gave no hint.
const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// An error response in the making.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// Boxed to keep `Result<_, HttpError>` small on the hot path.
    pub details: Box<ErrorDetails>,
    pub retry_after: Option<Duration>,
}

impl HttpError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> HttpError {
        HttpError {
            status,
            code,
            message: message.into(),
            details: Box::default(),
            retry_after: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub fn not_found(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn too_large(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message)
    }

    /// 408: the client stopped sending its request body ([`BodyTimeout`]).
    pub fn request_timeout(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::REQUEST_TIMEOUT, "request_timeout", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> HttpError {
        HttpError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            message,
        )
    }

    pub fn not_implemented(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::NOT_IMPLEMENTED, "not_implemented", message)
    }

    pub fn internal(message: impl Into<String>) -> HttpError {
        HttpError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }

    pub fn with_next_seq(mut self, next_seq: u64) -> HttpError {
        self.details.next_seq = Some(next_seq);
        self
    }

    /// Maps any operation error by its kind and details.
    pub fn from_service<E: ServiceError + ?Sized>(err: &E) -> HttpError {
        let kind = err.kind();
        let status = status_of(kind);
        // The client's message hides these details: the log keeps them.
        if matches!(kind, ErrorKind::Internal | ErrorKind::Durability) {
            tracing::error!(error = %err, "request failed");
        }
        HttpError {
            status,
            code: code_of(kind),
            message: public_message(kind, err),
            details: Box::new(err.details()),
            retry_after: match kind {
                ErrorKind::Unavailable(after) => Some(after.unwrap_or(DEFAULT_RETRY_AFTER)),
                ErrorKind::Durability => Some(DEFAULT_RETRY_AFTER),
                _ => None,
            },
        }
    }
}

/// A request body the listener gave up on (its timers wrap every request body and yield this
/// as the body's error); handlers answer it with [`HttpError::request_timeout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyTimeout {
    /// No data arrived for this long while the handler waited for it.
    #[error("request body timed out: no data arrived for {}s", .0.as_secs_f64())]
    Idle(Duration),
    /// Past its grace period, the body arrived slower on average than the listener's minimum.
    #[error(
        "request body too slow: {received} bytes in {}s, below the minimum of {min_rate} bytes/s",
        .elapsed.as_secs_f64()
    )]
    TooSlow {
        received: u64,
        elapsed: Duration,
        min_rate: u64,
    },
    /// The body was still arriving when its time ran out.
    #[error("request body timed out: not complete after {}s", .0.as_secs_f64())]
    Deadline(Duration),
}

impl BodyTimeout {
    /// The body timeout `err` is, or wraps (body errors arrive boxed, often twice).
    pub fn find<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a BodyTimeout> {
        let mut cur = Some(err);
        while let Some(e) = cur {
            if let Some(t) = e.downcast_ref::<BodyTimeout>() {
                return Some(t);
            }
            cur = e.source();
        }
        None
    }
}

/// The message a client sees. Server faults carry storage keys, internal ids and database
/// errors: those stay in the log (written by the caller), the client gets what happened.
pub fn public_message<E: ServiceError + ?Sized>(kind: ErrorKind, err: &E) -> String {
    match kind {
        // It may still land (a durability wait that ran out): say unknown, not failed.
        ErrorKind::Durability => "append not acknowledged: the write-ahead log could not be \
             written (storage unavailable), so its durability is unknown; retry, with an \
             idempotent producer to stay exactly-once (details in the server log)"
            .into(),
        ErrorKind::Internal => "internal error (details in the server log)".into(),
        _ => err.to_string(),
    }
}

/// The JSON `error` code: the kind's, except that a durability failure says `unavailable`
/// like its 503 (the client's move is the same: retry after `Retry-After`).
pub fn code_of(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Durability => ErrorKind::Unavailable(None).code(),
        k => k.code(),
    }
}

/// Status for each error kind. A write that could not be made durable is a 503: the storage
/// behind the node failed (or this node was superseded), nothing was acknowledged, and the
/// same request can succeed later; only bugs are 500.
pub fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
        ErrorKind::Conflict | ErrorKind::Closed | ErrorKind::SequenceGap => StatusCode::CONFLICT,
        ErrorKind::Fenced => StatusCode::FORBIDDEN,
        ErrorKind::MatchFailed => StatusCode::PRECONDITION_FAILED,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::Unavailable(_) | ErrorKind::Durability => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl<E: ServiceError> From<E> for HttpError {
    fn from(err: E) -> HttpError {
        HttpError::from_service(&err)
    }
}

fn num(v: u64) -> HeaderValue {
    HeaderValue::from(v)
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let mut body = json!({ "error": self.code, "message": self.message });
        let mut headers = HeaderMap::new();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        let d = &self.details;
        if let Some(n) = d.next_seq {
            body["next_seq"] = json!(n);
            headers.insert(HeaderName::from_static(h::PICO_NEXT_SEQ), num(n));
        }
        if let Some(n) = d.expected_seq {
            headers.insert(HeaderName::from_static(h::PICO_EXPECTED_SEQ), num(n));
        }
        if let Some(n) = d.received_seq {
            headers.insert(HeaderName::from_static(h::PICO_RECEIVED_SEQ), num(n));
        }
        if let Some(n) = d.producer_epoch {
            headers.insert(HeaderName::from_static(h::PICO_PRODUCER_EPOCH), num(n));
        }
        if d.closed {
            headers.insert(
                HeaderName::from_static(h::PICO_CLOSED),
                HeaderValue::from_static("true"),
            );
        }
        if let Some(after) = self.retry_after {
            // Whole seconds, at least 1: Retry-After has no sub-second form.
            headers.insert(header::RETRY_AFTER, num(after.as_secs().max(1)));
        }
        (self.status, headers, Json(body)).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pico_server::{AppendError, ReadError};

    async fn body_json(resp: Response) -> serde_json::Value {
        let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX)
            .await
            .unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    fn header<'a>(resp: &'a Response, name: &str) -> Option<&'a str> {
        resp.headers().get(name).map(|v| v.to_str().unwrap())
    }

    #[test]
    fn every_kind_has_its_status() {
        let cases = [
            (ErrorKind::NotFound, 404),
            (ErrorKind::BadRequest, 400),
            (ErrorKind::Conflict, 409),
            (ErrorKind::Closed, 409),
            (ErrorKind::SequenceGap, 409),
            (ErrorKind::Fenced, 403),
            (ErrorKind::MatchFailed, 412),
            (ErrorKind::TooLarge, 413),
            (ErrorKind::Unavailable(None), 503),
            (ErrorKind::Durability, 503),
            (ErrorKind::Internal, 500),
        ];
        for (kind, status) in cases {
            assert_eq!(status_of(kind).as_u16(), status, "{kind:?}");
        }
    }

    #[test]
    fn server_faults_keep_their_details_in_the_log() {
        let e = AppendError::Durability("storage io error: key=`wal/1/7.wal`".into());
        let h = HttpError::from_service(&e);
        assert_eq!(h.status, 503);
        assert_eq!(h.code, "unavailable");
        assert_eq!(h.retry_after, Some(DEFAULT_RETRY_AFTER));
        assert!(h.message.contains("durability is unknown"), "{}", h.message);
        assert!(!h.message.contains("key="), "{}", h.message);
        let e = AppendError::Internal("corrupt stored batch: stream=17".into());
        assert!(!HttpError::from_service(&e).message.contains("stream=17"));
        // Client errors keep their message: it says what to fix.
        let e = AppendError::BadRequest("empty append".into());
        assert!(HttpError::from_service(&e).message.contains("empty append"));
    }

    #[tokio::test]
    async fn sequence_gap_carries_expected_and_received() {
        let e = AppendError::SequenceGap {
            producer: "p".into(),
            expected: 3,
            received: 5,
        };
        let resp = HttpError::from(e).into_response();
        assert_eq!(resp.status(), 409);
        assert_eq!(header(&resp, "pico-expected-seq"), Some("3"));
        assert_eq!(header(&resp, "pico-received-seq"), Some("5"));
        assert_eq!(header(&resp, "cache-control"), Some("no-store"));
        let body = body_json(resp).await;
        assert_eq!(body["error"], "sequence_gap");
        assert!(body["message"].as_str().unwrap().contains("expected=3"));
    }

    #[tokio::test]
    async fn closed_and_fenced_and_trimmed() {
        let resp = HttpError::from(AppendError::Closed {
            name: "s".into(),
            next_seq: 9,
        })
        .into_response();
        assert_eq!(resp.status(), 409);
        assert_eq!(header(&resp, "pico-closed"), Some("true"));
        assert_eq!(header(&resp, "pico-next-seq"), Some("9"));
        let body = body_json(resp).await;
        assert_eq!(body["error"], "closed");
        assert_eq!(body["next_seq"], 9);

        let resp = HttpError::from(AppendError::Fenced {
            producer: "p".into(),
            given: 1,
            current: 4,
        })
        .into_response();
        assert_eq!(resp.status(), 403);
        assert_eq!(header(&resp, "pico-producer-epoch"), Some("4"));

        let resp = HttpError::from(ReadError::Trimmed {
            offset: 1,
            start_seq: 10,
        })
        .into_response();
        assert_eq!(resp.status(), 400);
        assert_eq!(body_json(resp).await["next_seq"], 10);
    }

    /// A fenced WAL write (a newer incarnation of the node took its WAL over) is a 503 that
    /// says so, not a 500 "durability unknown": nothing was written.
    #[tokio::test]
    async fn a_superseded_node_answers_503_saying_it_lost_ownership() {
        let e = AppendError::Superseded("postgres wal fenced: node 1 at epoch 9".into());
        let resp = HttpError::from(e).into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(header(&resp, "retry-after"), Some("1"));
        let body = body_json(resp).await;
        assert_eq!(body["error"], "unavailable");
        let msg = body["message"].as_str().unwrap();
        assert!(msg.contains("lost ownership"), "{msg}");
        assert!(msg.contains("not written"), "{msg}");
    }

    #[tokio::test]
    async fn unavailable_sends_retry_after() {
        let resp = HttpError::from(ReadError::Unavailable("db down".into())).into_response();
        assert_eq!(resp.status(), 503);
        assert_eq!(header(&resp, "retry-after"), Some("1"));
        let body = body_json(resp).await;
        assert_eq!(body["error"], "unavailable");
        assert!(body.get("next_seq").is_none());
    }
}
