//! Delete, trim and the removal of expired streams.

use super::*;
use crate::error::*;
use pico_common::StreamName;
use pico_metadata::{ApplyError, Command, Outcome};

impl Node {
    /// Deletes the stream; one that forks still reference is soft-deleted (its name stays
    /// reserved, answering "gone", until the last fork is deleted).
    pub async fn delete(&self, name: &StreamName) -> Result<(), DeleteError> {
        let r = self.resolve(name, self.now_ms()).ok_or_else(|| {
            if self.is_gone(name) {
                DeleteError::Gone(name.to_string())
            } else {
                DeleteError::NotFound(name.to_string())
            }
        })?;
        self.remove_stream(&r.name, r.meta.id).await
    }

    /// Trims records below `seq`; returns the new start offset.
    pub async fn trim(&self, name: &StreamName, seq: u64) -> Result<u64, TrimError> {
        let now = self.now_ms();
        let r = self
            .resolve(name, now)
            .ok_or_else(|| TrimError::NotFound(name.to_string()))?;
        self.touch(&r, now);
        let tail = self.tail(&r.meta);
        if seq > tail {
            return Err(TrimError::BeyondTail {
                seq,
                next_seq: tail,
            });
        }
        let outcome = self
            .propose(Command::Trim {
                stream_id: r.meta.id,
                start_offset: seq,
            })
            .await
            .map_err(TrimError::Unavailable)?;
        match outcome {
            Ok(Outcome::Trimmed { start_offset }) => Ok(start_offset),
            Ok(other) => Err(TrimError::Internal(format!("unexpected outcome {other:?}"))),
            Err(ApplyError::StreamNotFound { .. } | ApplyError::StreamDeleted { .. }) => {
                Err(TrimError::NotFound(name.to_string()))
            }
            Err(e) => Err(TrimError::Internal(e.to_string())),
        }
    }

    /// Removes an expired stream, re-checking expiry against the current view first.
    pub(crate) async fn remove_expired(
        &self,
        name: &StreamName,
        id: u64,
    ) -> Result<(), DeleteError> {
        match self.resolve_raw(name) {
            Some(r) if r.meta.id == id && self.expired(&r.entry, id, self.now_ms()) => {
                self.remove_stream(name, id).await
            }
            _ => Ok(()),
        }
    }

    pub(crate) async fn remove_stream(
        &self,
        name: &StreamName,
        stream_id: u64,
    ) -> Result<(), DeleteError> {
        // In a task of its own, as appends finish theirs: a caller cancelled (client gone) after
        // the command applied would otherwise skip the cleanup, leaving the open slot, engine
        // state and touch behind and long-pollers waiting until their timeout.
        let node = self.clone();
        let name = name.clone();
        tokio::spawn(async move { node.remove_stream_now(&name, stream_id).await })
            .await
            .map_err(|e| DeleteError::Internal(format!("delete task failed: {e}")))?
    }

    pub(crate) async fn remove_stream_now(
        &self,
        name: &StreamName,
        stream_id: u64,
    ) -> Result<(), DeleteError> {
        let outcome = self
            .propose(Command::DeleteStream {
                name: name.as_str().to_string(),
                stream_id,
            })
            .await
            .map_err(DeleteError::Unavailable)?;
        match outcome {
            Ok(_) => {}
            Err(ApplyError::NameNotFound { .. } | ApplyError::StreamNotFound { .. }) => {
                return Err(DeleteError::NotFound(name.to_string()));
            }
            Err(ApplyError::StreamDeleted { .. }) => {
                return Err(DeleteError::Gone(name.to_string()));
            }
            Err(e) => return Err(DeleteError::Internal(e.to_string())),
        }
        if let Some(open) = self.inner.open.get(stream_id) {
            open.writer.lock().await.broken = true;
        }
        self.inner.open.remove_any(stream_id);
        self.inner.engine.forget(stream_id);
        self.inner.touches.remove(stream_id);
        self.inner.waiters.notify_gone(stream_id);
        Ok(())
    }
}
