//! The wire form of subscription errors: `{"error": {"code": "...", "message": "..."}}` with the
//! codes and statuses of the Durable Streams spec (§6–§7). The one place that maps
//! [`SubError`] to HTTP.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use pico_server::subscriptions::SubError;
use serde_json::json;

/// A [`SubError`] on its way to the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError(pub SubError);

impl From<SubError> for ApiError {
    fn from(e: SubError) -> ApiError {
        ApiError(e)
    }
}

pub fn code(e: &SubError) -> &'static str {
    match e {
        SubError::InvalidRequest(_) => "INVALID_REQUEST",
        SubError::NotFound | SubError::RouteNotFound => "SUBSCRIPTION_NOT_FOUND",
        SubError::AlreadyExists => "SUBSCRIPTION_ALREADY_EXISTS",
        SubError::WebhookUrlRejected(_) => "WEBHOOK_URL_REJECTED",
        SubError::TokenInvalid => "TOKEN_INVALID",
        SubError::Fenced => "FENCED",
        SubError::AlreadyClaimed { .. } => "ALREADY_CLAIMED",
        SubError::NoPendingWork => "NO_PENDING_WORK",
        SubError::InvalidOffset(_) => "INVALID_OFFSET",
        SubError::MethodNotAllowed => "METHOD_NOT_ALLOWED",
        SubError::LimitExceeded(_) => "LIMIT_EXCEEDED",
        SubError::Unavailable(_) | SubError::NotHere { .. } => "UNAVAILABLE",
    }
}

pub fn status(e: &SubError) -> StatusCode {
    match e {
        SubError::InvalidRequest(_) | SubError::WebhookUrlRejected(_) => StatusCode::BAD_REQUEST,
        SubError::NotFound | SubError::RouteNotFound => StatusCode::NOT_FOUND,
        SubError::AlreadyExists
        | SubError::Fenced
        | SubError::AlreadyClaimed { .. }
        | SubError::NoPendingWork
        | SubError::InvalidOffset(_)
        | SubError::LimitExceeded(_) => StatusCode::CONFLICT,
        SubError::TokenInvalid => StatusCode::UNAUTHORIZED,
        SubError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
        SubError::Unavailable(_) | SubError::NotHere { .. } => StatusCode::SERVICE_UNAVAILABLE,
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let e = self.0;
        let mut error = json!({ "code": code(&e), "message": e.to_string() });
        if let SubError::AlreadyClaimed { holder, generation } = &e {
            error["current_holder"] = json!(holder);
            error["generation"] = json!(generation);
        }
        let status = status(&e);
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(error = %e, "subscription request failed");
        }
        let mut resp = (status, Json(json!({ "error": error }))).into_response();
        if matches!(e, SubError::NotHere { .. }) {
            // The maintenance lease is moving (or moved during the request): soon answered.
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        resp
    }
}
