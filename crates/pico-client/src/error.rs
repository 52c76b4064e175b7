//! The one error type of the client.

use std::time::Duration;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ClientError {
    /// The server answered with an error status; `code`/`message` come from its JSON body
    /// (`{"error","message"}`) when it sent one.
    #[error("{message} (http {status}, {code})")]
    Http {
        status: u16,
        code: String,
        message: String,
    },
    /// The request did not complete (connect, IO, redirect loop, bad URL).
    #[error("transport: {0}")]
    Transport(String),
    /// No complete answer within the client's timeout for this kind of request. The request
    /// may still have reached the server: an append's outcome is unknown.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The server answered 2xx but the response could not be understood.
    #[error("decode: {0}")]
    Decode(String),
    /// Refused before sending: an argument no request can carry (a stream name the server
    /// would not accept, a value not allowed in a header).
    #[error("invalid argument: {0}")]
    Invalid(String),
    /// A producer's batch that was never sent, or only refused as out of order, because an
    /// earlier batch of the same producer failed for good: sequence numbers must arrive in
    /// order, so the producer stops at the first failure. The batch is not written; the failure
    /// itself is reported once, by the batch `failed_seq`.
    #[error(
        "not written: an earlier batch of this producer failed: failed_seq={failed_seq} seq={seq}"
    )]
    Abandoned { seq: u64, failed_seq: u64 },
    /// A producer's batch that failed after an attempt of its own went unanswered (transport
    /// error after sending, timeout, 5xx): the server may have applied it. Either the batch
    /// failed itself (`failed_seq == seq`, the error that ended it in `cause`), or it was
    /// given up because an earlier batch `failed_seq` failed for good (`cause` is `None`).
    /// Unlike [`ClientError::Abandoned`] or a plain error, resending it under a new epoch may
    /// write it twice; read the stream to find out.
    #[error("{}", outcome_unknown_message(*.seq, *.failed_seq, .cause.as_deref()))]
    OutcomeUnknown {
        seq: u64,
        failed_seq: u64,
        /// Not a `source`: the message includes it, as most callers print only the top error.
        cause: Option<Box<ClientError>>,
    },
}

fn outcome_unknown_message(seq: u64, failed_seq: u64, cause: Option<&ClientError>) -> String {
    match cause {
        Some(cause) => format!(
            "outcome unknown: an attempt got no answer (or a 5xx), so the batch may be written; then it failed: seq={seq}: {cause}"
        ),
        None => format!(
            "outcome unknown: sent, then given up after an earlier batch of this producer failed: failed_seq={failed_seq} seq={seq}"
        ),
    }
}

impl ClientError {
    /// The HTTP status of a server error.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Http { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Is this a batch abandoned after an earlier batch's failure (not a failure of its own)?
    pub fn is_abandoned(&self) -> bool {
        matches!(self, ClientError::Abandoned { .. })
    }

    /// Is this a batch given up after an earlier batch's failure, but possibly applied?
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(self, ClientError::OutcomeUnknown { .. })
    }

    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// Builds the error for a non-success response from its status and body.
    pub fn from_response(status: u16, body: &[u8]) -> ClientError {
        #[derive(serde::Deserialize)]
        struct Wire {
            error: Option<String>,
            message: Option<String>,
        }
        let parsed: Option<Wire> = serde_json::from_slice(body).ok();
        let code = parsed
            .as_ref()
            .and_then(|w| w.error.clone())
            .unwrap_or_else(|| default_code(status).to_string());
        let message = parsed.and_then(|w| w.message).unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body).trim().to_string();
            if text.is_empty() {
                format!("http status {status}")
            } else {
                text
            }
        });
        ClientError::Http {
            status,
            code,
            message,
        }
    }
}

fn default_code(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "unauthenticated",
        403 => "permission_denied",
        404 => "not_found",
        409 => "conflict",
        412 => "match_failed",
        413 => "too_large",
        503 => "unavailable",
        _ => "internal",
    }
}

impl From<reqwest::Error> for ClientError {
    fn from(e: reqwest::Error) -> Self {
        // reqwest's Display hides the cause ("error sending request"); keep the whole chain.
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        ClientError::Transport(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_json_error() {
        let e = ClientError::from_response(
            409,
            br#"{"error":"sequence_gap","message":"gap: expected=1 received=3","next_seq":4}"#,
        );
        match e {
            ClientError::Http {
                status,
                code,
                message,
            } => {
                assert_eq!(status, 409);
                assert_eq!(code, "sequence_gap");
                assert_eq!(message, "gap: expected=1 received=3");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn falls_back_on_plain_bodies() {
        let e = ClientError::from_response(404, b"");
        assert!(e.is_not_found());
        assert_eq!(e.to_string(), "http status 404 (http 404, not_found)");
        let e = ClientError::from_response(502, b"bad gateway");
        assert!(matches!(e, ClientError::Http { ref code, .. } if code == "internal"));
    }
}
