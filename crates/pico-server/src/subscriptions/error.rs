//! What a subscription operation can fail with. Each protocol facade maps these to its wire
//! (the Durable Streams codes and statuses live in `pico-http`).

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
    /// The metadata log could not be read or written: retry later.
    #[error("subscription state unavailable: {0}")]
    Unavailable(String),
    /// Subscriptions are changed and delivered by the maintenance-lease holder, and this node
    /// does not hold it: `holder` is that node's advertised URL when known (else the lease is
    /// moving: retry shortly).
    #[error("subscriptions are served by the maintenance-lease holder{}", .holder.as_ref().map(|h| format!(" ({h})")).unwrap_or_default())]
    NotHere { holder: Option<String> },
}

impl SubError {
    pub fn invalid(msg: impl Into<String>) -> SubError {
        SubError::InvalidRequest(msg.into())
    }
}
