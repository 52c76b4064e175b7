//! Errors of the metadata log (the "outer" error of `propose`: the log itself failed).

use pico_common::ErrorKind;
use pico_metadata::CodecError;
use thiserror::Error;

/// Cloneable so one failed group commit can be reported to every waiter in the batch.
#[derive(Debug, Clone, Error)]
pub enum MetaError {
    #[error("bad metadata url: {0}")]
    BadUrl(String),
    /// The Postgres server may lose a committed transaction in a crash (`fsync=off`), and the
    /// URL did not accept that with `allowUnsafe=true`.
    #[error(
        "the metadata database runs with {setting}={value}: a crash can lose committed cluster \
         state; refusing to use it. Turn {setting} on, or add allowUnsafe=true to the \
         --meta-url to accept that (tests only)"
    )]
    Unsafe {
        setting: &'static str,
        value: String,
    },
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
    /// The log stopped applying for good (its committer ended without `close`); see
    /// [`crate::MetaLog::health`]. Corruption keeps its own variant as the reason.
    #[error("metadata log stopped: {0}")]
    Stopped(String),
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

    /// The prescriptive kind callers map to their wire: `Unavailable` for what a retry can
    /// fix (store outage, unknown outcome, shutdown), `Internal` for what only an operator can
    /// (see [`MetaError::is_permanent`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            MetaError::BadUrl(_) | MetaError::Unsafe { .. } => ErrorKind::BadRequest,
            MetaError::Store { .. }
            | MetaError::Io(_)
            | MetaError::OutcomeUnknown { .. }
            | MetaError::Closed => ErrorKind::Unavailable(None),
            MetaError::CorruptRow { .. }
            | MetaError::BadRow { .. }
            | MetaError::CorruptSnapshot(_)
            | MetaError::Stopped(_) => ErrorKind::Internal,
        }
    }

    /// No retry helps: the stored log is damaged (a row or snapshot that does not decode, a
    /// codec error included) or the log stopped for good. A running log that meets one stops
    /// and reports it from [`crate::MetaLog::health`]; a restart (after repair) is the way out.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            MetaError::CorruptRow { .. }
                | MetaError::BadRow { .. }
                | MetaError::CorruptSnapshot(_)
                | MetaError::Stopped(_)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Permanent failures must not look like a store outage a retry could fix.
    #[test]
    fn permanent_failures_are_classified_apart_from_transient_ones() {
        let permanent = [
            MetaError::CorruptRow {
                row_id: 1,
                source: CodecError::Truncated("command"),
            },
            MetaError::BadRow {
                row_id: 1,
                reason: "count".into(),
            },
            MetaError::CorruptSnapshot("x".into()),
            MetaError::Stopped("committer ended".into()),
        ];
        for e in &permanent {
            assert!(e.is_permanent(), "{e:?}");
            assert_eq!(e.kind(), ErrorKind::Internal, "{e:?}");
        }
        let transient = [
            MetaError::Store {
                op: "append",
                message: "database is locked".into(),
            },
            MetaError::Io("x".into()),
            MetaError::OutcomeUnknown { row_id: 1 },
            MetaError::Closed,
        ];
        for e in &transient {
            assert!(!e.is_permanent(), "{e:?}");
            assert_eq!(e.kind(), ErrorKind::Unavailable(None), "{e:?}");
        }
    }
}
