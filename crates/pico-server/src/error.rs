//! One error enum per operation. Each maps to a [`ErrorKind`] plus the details a wire needs
//! (next offset, expected sequence, current producer epoch); facades map those in one place.

use pico_common::ErrorKind;
use thiserror::Error;

/// Extra facts an error carries to the wire (headers such as `Pico-Next-Seq`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorDetails {
    pub next_seq: Option<u64>,
    pub expected_seq: Option<u64>,
    pub received_seq: Option<u64>,
    pub producer_epoch: Option<u64>,
    /// The stream is closed (DS sends `Stream-Closed: true` with a 409).
    pub closed: bool,
}

/// Implemented by every operation error so facades can map them generically.
pub trait ServiceError: std::error::Error {
    fn kind(&self) -> ErrorKind;
    fn details(&self) -> ErrorDetails {
        ErrorDetails::default()
    }
}

#[derive(Debug, Error)]
pub enum CreateError {
    #[error("stream exists with a different configuration: name=`{name}` {reason}")]
    Conflict { name: String, reason: String },
    #[error("bad create request: {0}")]
    BadRequest(String),
    #[error("stream is deleted but still referenced: name=`{0}`")]
    Gone(String),
    #[error("metadata log unavailable: {0}")]
    Unavailable(String),
    #[error("initial append failed: {0}")]
    Append(#[from] AppendError),
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Debug, Error)]
pub enum ForkError {
    #[error("fork source not found: name=`{0}`")]
    SourceNotFound(String),
    #[error("stream exists with a different configuration: name=`{name}` {reason}")]
    Conflict { name: String, reason: String },
    #[error("bad fork request: {0}")]
    BadRequest(String),
    #[error("metadata log unavailable: {0}")]
    Unavailable(String),
    #[error("initial append failed: {0}")]
    Append(#[from] AppendError),
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Debug, Error)]
pub enum AppendError {
    #[error("stream not found: name=`{0}`")]
    NotFound(String),
    #[error("stream is deleted but still referenced by forks: name=`{0}`")]
    Gone(String),
    #[error("stream-seq must increase: last=`{last}` given=`{given}`")]
    SeqRegression { last: String, given: String },
    #[error("stream is closed: name=`{name}` next_seq={next_seq}")]
    Closed { name: String, next_seq: u64 },
    #[error("content type mismatch: stream=`{stream}` request=`{request}`")]
    ContentType { stream: String, request: String },
    #[error("producer fenced: producer=`{producer}` epoch={given} current={current}")]
    Fenced {
        producer: String,
        given: u64,
        current: u64,
    },
    #[error("producer sequence gap: producer=`{producer}` expected={expected} received={received}")]
    SequenceGap {
        producer: String,
        expected: u64,
        received: u64,
    },
    #[error(
        "new producer epoch must start at seq 0: producer=`{producer}` epoch={epoch} seq={seq}"
    )]
    EpochSeq {
        producer: String,
        epoch: u64,
        seq: u64,
    },
    #[error("match-seq failed: expected={expected} next_seq={next_seq}")]
    MatchFailed { expected: u64, next_seq: u64 },
    #[error("append too large: {what}={size} max={max}")]
    TooLarge {
        what: &'static str,
        size: usize,
        max: usize,
    },
    #[error("bad append: {0}")]
    BadRequest(String),
    #[error("append not durable: {0}")]
    Durability(String),
    /// A newer incarnation of this node took its write-ahead log over (the WAL's epoch fence):
    /// nothing was written, and this process must not write again.
    #[error(
        "this node lost ownership of its write-ahead log to a newer incarnation; the append \
         was not written: retry ({0})"
    )]
    Superseded(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Debug, Error)]
pub enum ReadError {
    #[error("stream not found: name=`{0}`")]
    NotFound(String),
    #[error("stream is deleted but still referenced by forks: name=`{0}`")]
    Gone(String),
    #[error("offset below the stream start: offset={offset} start_seq={start_seq}")]
    Trimmed { offset: u64, start_seq: u64 },
    #[error("offset beyond the tail: offset={offset} next_seq={next_seq}")]
    BeyondTail { offset: u64, next_seq: u64 },
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Debug, Error)]
pub enum DeleteError {
    #[error("stream not found: name=`{0}`")]
    NotFound(String),
    #[error("stream is deleted but still referenced by forks: name=`{0}`")]
    Gone(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

#[derive(Debug, Error)]
pub enum TrimError {
    #[error("stream not found: name=`{0}`")]
    NotFound(String),
    #[error("trim beyond the tail: seq={seq} next_seq={next_seq}")]
    BeyondTail { seq: u64, next_seq: u64 },
    #[error("unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ServiceError for CreateError {
    fn kind(&self) -> ErrorKind {
        match self {
            CreateError::Conflict { .. } | CreateError::Gone(_) => ErrorKind::Conflict,
            CreateError::BadRequest(_) => ErrorKind::BadRequest,
            CreateError::Unavailable(_) => ErrorKind::Unavailable(None),
            CreateError::Append(e) => e.kind(),
            CreateError::Internal(_) => ErrorKind::Internal,
        }
    }
    fn details(&self) -> ErrorDetails {
        match self {
            CreateError::Append(e) => e.details(),
            _ => ErrorDetails::default(),
        }
    }
}

impl ServiceError for ForkError {
    fn kind(&self) -> ErrorKind {
        match self {
            ForkError::SourceNotFound(_) => ErrorKind::NotFound,
            ForkError::Conflict { .. } => ErrorKind::Conflict,
            ForkError::BadRequest(_) => ErrorKind::BadRequest,
            ForkError::Unavailable(_) => ErrorKind::Unavailable(None),
            ForkError::Append(e) => e.kind(),
            ForkError::Internal(_) => ErrorKind::Internal,
        }
    }
    fn details(&self) -> ErrorDetails {
        match self {
            ForkError::Append(e) => e.details(),
            _ => ErrorDetails::default(),
        }
    }
}

impl ServiceError for AppendError {
    fn kind(&self) -> ErrorKind {
        match self {
            // A soft-deleted stream is not found for protocols without a "gone" status.
            AppendError::NotFound(_) | AppendError::Gone(_) => ErrorKind::NotFound,
            AppendError::SeqRegression { .. } => ErrorKind::Conflict,
            AppendError::Closed { .. } => ErrorKind::Closed,
            AppendError::ContentType { .. } => ErrorKind::Conflict,
            AppendError::Fenced { .. } => ErrorKind::Fenced,
            AppendError::SequenceGap { .. } => ErrorKind::SequenceGap,
            AppendError::EpochSeq { .. } | AppendError::BadRequest(_) => ErrorKind::BadRequest,
            AppendError::MatchFailed { .. } => ErrorKind::MatchFailed,
            AppendError::TooLarge { .. } => ErrorKind::TooLarge,
            AppendError::Durability(_) => ErrorKind::Durability,
            AppendError::Superseded(_) | AppendError::Unavailable(_) => {
                ErrorKind::Unavailable(None)
            }
            AppendError::Internal(_) => ErrorKind::Internal,
        }
    }
    fn details(&self) -> ErrorDetails {
        match self {
            AppendError::Closed { next_seq, .. } => ErrorDetails {
                next_seq: Some(*next_seq),
                closed: true,
                ..Default::default()
            },
            AppendError::Fenced { current, .. } => ErrorDetails {
                producer_epoch: Some(*current),
                ..Default::default()
            },
            AppendError::SequenceGap {
                expected, received, ..
            } => ErrorDetails {
                expected_seq: Some(*expected),
                received_seq: Some(*received),
                ..Default::default()
            },
            AppendError::MatchFailed { next_seq, .. } => ErrorDetails {
                next_seq: Some(*next_seq),
                ..Default::default()
            },
            _ => ErrorDetails::default(),
        }
    }
}

impl ServiceError for ReadError {
    fn kind(&self) -> ErrorKind {
        match self {
            ReadError::NotFound(_) | ReadError::Gone(_) => ErrorKind::NotFound,
            ReadError::Trimmed { .. } | ReadError::BeyondTail { .. } => ErrorKind::BadRequest,
            ReadError::Unavailable(_) => ErrorKind::Unavailable(None),
            ReadError::Internal(_) => ErrorKind::Internal,
        }
    }
    fn details(&self) -> ErrorDetails {
        match self {
            ReadError::Trimmed { start_seq, .. } => ErrorDetails {
                next_seq: Some(*start_seq),
                ..Default::default()
            },
            ReadError::BeyondTail { next_seq, .. } => ErrorDetails {
                next_seq: Some(*next_seq),
                ..Default::default()
            },
            _ => ErrorDetails::default(),
        }
    }
}

impl ServiceError for DeleteError {
    fn kind(&self) -> ErrorKind {
        match self {
            DeleteError::NotFound(_) | DeleteError::Gone(_) => ErrorKind::NotFound,
            DeleteError::Unavailable(_) => ErrorKind::Unavailable(None),
            DeleteError::Internal(_) => ErrorKind::Internal,
        }
    }
}

impl ServiceError for TrimError {
    fn kind(&self) -> ErrorKind {
        match self {
            TrimError::NotFound(_) => ErrorKind::NotFound,
            TrimError::BeyondTail { .. } => ErrorKind::BadRequest,
            TrimError::Unavailable(_) => ErrorKind::Unavailable(None),
            TrimError::Internal(_) => ErrorKind::Internal,
        }
    }
    fn details(&self) -> ErrorDetails {
        match self {
            TrimError::BeyondTail { next_seq, .. } => ErrorDetails {
                next_seq: Some(*next_seq),
                ..Default::default()
            },
            _ => ErrorDetails::default(),
        }
    }
}
