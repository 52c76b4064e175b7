//! Errors of the metadata log (the "outer" error of `propose`: the log itself failed).

use pico_common::ErrorKind;
use pico_metadata::CodecError;
use thiserror::Error;

/// Cloneable so one failed group commit can be reported to every waiter in the batch.
#[derive(Debug, Clone, Error)]
pub enum MetaError {
    #[error("unsupported metadata url (sqlite:… only for now): url=`{0}`")]
    Unsupported(String),
    #[error("bad metadata url: {0}")]
    BadUrl(String),
    #[error("metadata store io: {0}")]
    Io(String),
    #[error("metadata store failed: op={op} error={message}")]
    Store { op: &'static str, message: String },
    #[error("corrupted metadata log row: row_id={row_id} error={source}")]
    CorruptRow { row_id: i64, source: CodecError },
    #[error("corrupted metadata log row: row_id={row_id} reason={reason}")]
    BadRow { row_id: i64, reason: String },
    #[error("no readable metadata snapshot (log rows below it are gone): error={0}")]
    CorruptSnapshot(String),
    /// The command was written but this node cannot tell whether/how it applied (a newer
    /// snapshot replaced the rows before they were read). Retry idempotently.
    #[error("metadata command outcome unknown: row_id={row_id}")]
    OutcomeUnknown { row_id: i64 },
    #[error("metadata log is closed")]
    Closed,
}

impl MetaError {
    pub(crate) fn store(op: &'static str) -> impl FnOnce(sqlx::Error) -> MetaError {
        move |e| MetaError::Store {
            op,
            message: e.to_string(),
        }
    }

    /// The prescriptive kind callers map to their wire.
    pub fn kind(&self) -> ErrorKind {
        match self {
            MetaError::Unsupported(_) | MetaError::BadUrl(_) => ErrorKind::BadRequest,
            MetaError::Store { .. }
            | MetaError::Io(_)
            | MetaError::OutcomeUnknown { .. }
            | MetaError::Closed => ErrorKind::Unavailable(None),
            MetaError::CorruptRow { .. }
            | MetaError::BadRow { .. }
            | MetaError::CorruptSnapshot(_) => ErrorKind::Internal,
        }
    }
}
