//! The error vocabulary every wire protocol maps in exactly one place.

use std::time::Duration;

/// What the caller should do about an error. Operation-specific error enums
/// (in the crates that own the operations) each expose one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The stream (or other named thing) does not exist.
    NotFound,
    /// The request conflicts with existing state (e.g. create with another config).
    Conflict,
    /// The stream is closed to appends.
    Closed,
    /// A newer writer (producer or node epoch) exists; this one must stop.
    Fenced,
    /// A producer sequence number skipped ahead.
    SequenceGap,
    /// A conditional append's expected tail did not match.
    MatchFailed,
    /// The request is malformed.
    BadRequest,
    /// The request or record is larger than allowed.
    TooLarge,
    /// Try again later (overload, shutting down, dependency down).
    Unavailable(Option<Duration>),
    /// Data could not be made durable; the write was not acknowledged.
    Durability,
    /// A bug or an unexpected failure.
    Internal,
}

impl ErrorKind {
    /// Stable lowercase code used in JSON error bodies.
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Closed => "closed",
            ErrorKind::Fenced => "fenced",
            ErrorKind::SequenceGap => "sequence_gap",
            ErrorKind::MatchFailed => "match_failed",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Unavailable(_) => "unavailable",
            ErrorKind::Durability | ErrorKind::Internal => "internal",
        }
    }
}
