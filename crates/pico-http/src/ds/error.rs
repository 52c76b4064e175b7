//! The one place Durable Streams errors become HTTP: status, a short `text/plain` body and the
//! headers a DS client acts on (`Stream-Closed` + `Stream-Next-Offset` on closed streams,
//! `Producer-*` on fencing and gaps). Soft-deleted streams answer 410.

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pico_common::ErrorKind;
use pico_protocol::format_offset;
use pico_protocol::headers as h;
use pico_server::{
    AppendError, CreateError, DeleteError, ErrorDetails, ForkError, ReadError, ServiceError,
};

use crate::error::{HttpError, status_of};

#[derive(Debug, Clone)]
pub struct DsError {
    pub status: StatusCode,
    pub message: String,
    pub details: ErrorDetails,
}

impl DsError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> DsError {
        DsError {
            status,
            message: message.into(),
            details: ErrorDetails::default(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> DsError {
        DsError::new(StatusCode::BAD_REQUEST, message)
    }

    pub fn too_large(message: impl Into<String>) -> DsError {
        DsError::new(StatusCode::PAYLOAD_TOO_LARGE, message)
    }

    pub fn conflict(message: impl Into<String>) -> DsError {
        DsError::new(StatusCode::CONFLICT, message)
    }

    pub fn gone(name: &str) -> DsError {
        DsError::new(
            StatusCode::GONE,
            format!("stream is deleted: name=`{name}`"),
        )
    }

    fn service<E: ServiceError + ?Sized>(e: &E) -> DsError {
        let kind = e.kind();
        let status = match kind {
            // Producer fencing is 403 on the DS wire too; a failed match is not a DS concept.
            ErrorKind::MatchFailed => StatusCode::CONFLICT,
            k => status_of(k),
        };
        // The client's message hides these details: the log keeps them.
        if matches!(kind, ErrorKind::Internal | ErrorKind::Durability) {
            tracing::error!(error = %e, "durable streams request failed");
        }
        DsError {
            status,
            message: crate::error::public_message(kind, e),
            details: e.details(),
        }
    }
}

impl From<HttpError> for DsError {
    fn from(e: HttpError) -> DsError {
        DsError {
            status: e.status,
            message: e.message,
            details: *e.details,
        }
    }
}

impl From<ReadError> for DsError {
    fn from(e: ReadError) -> DsError {
        match &e {
            ReadError::Gone(name) => DsError::gone(name),
            // A position before the retention window is gone for good.
            ReadError::Trimmed { .. } => DsError::new(StatusCode::GONE, e.to_string()),
            _ => DsError::service(&e),
        }
    }
}

impl From<AppendError> for DsError {
    fn from(e: AppendError) -> DsError {
        match &e {
            AppendError::Gone(name) => DsError::gone(name),
            _ => DsError::service(&e),
        }
    }
}

impl From<DeleteError> for DsError {
    fn from(e: DeleteError) -> DsError {
        match &e {
            DeleteError::Gone(name) => DsError::gone(name),
            _ => DsError::service(&e),
        }
    }
}

impl From<CreateError> for DsError {
    fn from(e: CreateError) -> DsError {
        match e {
            CreateError::Append(a) => a.into(),
            e => DsError::service(&e),
        }
    }
}

impl From<ForkError> for DsError {
    fn from(e: ForkError) -> DsError {
        match e {
            ForkError::Append(a) => a.into(),
            e => DsError::service(&e),
        }
    }
}

fn set(headers: &mut HeaderMap, name: &'static str, value: HeaderValue) {
    headers.insert(HeaderName::from_static(name), value);
}

impl IntoResponse for DsError {
    fn into_response(self) -> Response {
        let mut headers = HeaderMap::new();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        let d = &self.details;
        if d.closed {
            set(
                &mut headers,
                h::DS_STREAM_CLOSED,
                HeaderValue::from_static("true"),
            );
        }
        if let Some(n) = d.next_seq
            && let Ok(v) = HeaderValue::from_str(&format_offset(n))
        {
            set(&mut headers, h::DS_STREAM_NEXT_OFFSET, v);
        }
        if let Some(n) = d.expected_seq {
            set(
                &mut headers,
                h::DS_PRODUCER_EXPECTED_SEQ,
                HeaderValue::from(n),
            );
        }
        if let Some(n) = d.received_seq {
            set(
                &mut headers,
                h::DS_PRODUCER_RECEIVED_SEQ,
                HeaderValue::from(n),
            );
        }
        if let Some(n) = d.producer_epoch {
            set(&mut headers, h::DS_PRODUCER_EPOCH, HeaderValue::from(n));
        }
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(1u64));
        }
        (self.status, headers, self.message).into_response()
    }
}
