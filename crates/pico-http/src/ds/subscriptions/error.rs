//! Subscription API errors and their wire form: `{"error": {"code": "...", "message": "..."}}`
//! with the codes and statuses of the Durable Streams spec (§6–§7).

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SubError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("subscription not found")]
    NotFound,
    #[error("Durable Streams control route not found")]
    RouteNotFound,
    #[error("subscription already exists with a different configuration")]
    AlreadyExists,
    #[error("{0}")]
    WebhookUrlRejected(String),
    #[error("missing, malformed or foreign bearer token")]
    TokenInvalid,
    #[error("wake generation is stale")]
    Fenced,
    #[error("subscription is claimed by {holder}")]
    AlreadyClaimed { holder: String, generation: u64 },
    #[error("subscription has no pending work")]
    NoPendingWork,
    #[error("{0}")]
    InvalidOffset(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    /// A per-node or per-subscription capacity is full (the same request can succeed once
    /// subscriptions or links are removed).
    #[error("{0}")]
    LimitExceeded(String),
    #[error("subscription state unavailable: {0}")]
    Unavailable(String),
}

impl SubError {
    pub fn invalid(msg: impl Into<String>) -> SubError {
        SubError::InvalidRequest(msg.into())
    }

    pub fn code(&self) -> &'static str {
        match self {
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
            SubError::Unavailable(_) => "UNAVAILABLE",
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            SubError::InvalidRequest(_) | SubError::WebhookUrlRejected(_) => {
                StatusCode::BAD_REQUEST
            }
            SubError::NotFound | SubError::RouteNotFound => StatusCode::NOT_FOUND,
            SubError::AlreadyExists
            | SubError::Fenced
            | SubError::AlreadyClaimed { .. }
            | SubError::NoPendingWork
            | SubError::InvalidOffset(_)
            | SubError::LimitExceeded(_) => StatusCode::CONFLICT,
            SubError::TokenInvalid => StatusCode::UNAUTHORIZED,
            SubError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            SubError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for SubError {
    fn into_response(self) -> Response {
        let mut error = json!({ "code": self.code(), "message": self.to_string() });
        if let SubError::AlreadyClaimed { holder, generation } = &self {
            error["current_holder"] = json!(holder);
            error["generation"] = json!(generation);
        }
        let status = self.status();
        if status == StatusCode::SERVICE_UNAVAILABLE {
            tracing::warn!(error = %self, "subscription request failed");
        }
        (status, Json(json!({ "error": error }))).into_response()
    }
}
