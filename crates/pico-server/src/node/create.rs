//! Creating streams, and the records a create (or fork) carries.

use super::*;
use crate::api::*;
use crate::error::*;
use pico_common::StreamName;
use pico_metadata::{ApplyError, Command, Initial, Outcome, StreamConfig};
use pico_protocol::Record;

impl Node {
    /// Idempotent create.
    pub async fn create(&self, req: CreateRequest) -> Result<CreateOutcome, CreateError> {
        if req.config.ttl_secs.is_some() && req.config.expires_at_ms.is_some() {
            return Err(CreateError::BadRequest(
                "ttl and expires-at are mutually exclusive".into(),
            ));
        }
        if req.config.ttl_secs.is_some_and(|t| t > MAX_TTL_SECS) {
            return Err(CreateError::BadRequest(format!(
                "ttl too large: max={MAX_TTL_SECS} seconds"
            )));
        }
        let now = self.now_ms();
        // An expired stream behaves as absent: remove it so the name is free again.
        if let Some(r) = self.resolve_raw(&req.name)
            && self.expired(&r.entry, r.meta.id, now)
        {
            match self.remove_stream(&r.name, r.meta.id).await {
                // Removed meanwhile by the background expiry: the name is free either way.
                Ok(()) | Err(DeleteError::NotFound(_) | DeleteError::Gone(_)) => {}
                Err(DeleteError::Unavailable(m)) => return Err(CreateError::Unavailable(m)),
                Err(other) => return Err(CreateError::Internal(other.to_string())),
            }
        }
        let config = StreamConfig {
            content_type: normalize_content_type(req.config.content_type.as_deref()).into(),
            ttl_secs: req.config.ttl_secs,
            expires_at_ms: req.config.expires_at_ms,
        };
        let has_initial = !req.initial.is_empty();
        check_records(&req.initial)?;
        if is_json(&config.content_type) {
            check_json_values(&req.initial)?;
        }
        // A retry of a completed create-with-body-and-close finds the stream closed: the
        // command compares the closed status the request ends with, so it matches.
        let initial = Initial::new(has_initial, req.config.closed);
        let cmd = Command::CreateStream {
            name: req.name.as_str().to_string(),
            config,
            // With initial records, close after appending them.
            closed: req.config.closed && !has_initial,
            initial,
            now_ms: now,
        };
        let created = match self.propose(cmd).await.map_err(CreateError::Unavailable)? {
            Ok(Outcome::Created { created, .. }) => created,
            Ok(other) => {
                return Err(CreateError::Internal(format!(
                    "unexpected outcome {other:?}"
                )));
            }
            Err(ApplyError::Conflict { name, reason }) => {
                return Err(CreateError::Conflict { name, reason });
            }
            Err(e) => return Err(CreateError::Internal(e.to_string())),
        };
        // The body is appended under a reserved producer claim, so a retry after a failure
        // between create and append appends it exactly once. Only a stream made by the same
        // kind of create takes it: any other stream already exists, and an idempotent create
        // leaves it as it is (the command answered a conflict if the closed status differs).
        let retry_of_unfinished = !created
            && has_initial
            && self
                .resolve_raw(&req.name)
                .is_some_and(|r| r.entry.initial == initial);
        // Without initial records the create command itself made the stream closed if asked.
        if has_initial && (created || retry_of_unfinished) {
            self.write_initial(&req.name, req.initial, req.config.closed, created)
                .await?;
        }
        // Not `resolve`: a stream created already expired exists until the sweep removes it.
        let info = self
            .resolve_raw(&req.name)
            .map(|r| self.info(&r))
            .ok_or_else(|| CreateError::Conflict {
                name: req.name.to_string(),
                reason: "deleted while being created".into(),
            })?;
        Ok(CreateOutcome { created, info })
    }

    /// Writes a create's (or fork's) initial records under the reserved producer claim and
    /// applies its close, so that a retry after a failure in between does both exactly once.
    /// `created` = this request created the stream (a retry tolerates an already closed one).
    pub(crate) async fn write_initial(
        &self,
        name: &StreamName,
        records: Vec<Record>,
        close: bool,
        created: bool,
    ) -> Result<(), AppendError> {
        let has_records = !records.is_empty();
        if has_records {
            let first = self
                .append(AppendRequest {
                    name: name.clone(),
                    records,
                    producer: Some(ProducerClaim {
                        id: INITIAL_PRODUCER.to_string(),
                        epoch: 0,
                        seq: 0,
                    }),
                    match_seq: None,
                    close,
                    content_type: None,
                })
                .await;
            match first {
                Ok(_) => {}
                // A retry finding the stream closed by another writer: answered as done only
                // if the first attempt's records landed before that close (its own close was
                // what failed); otherwise they can never be written, and the create says so.
                Err(e @ AppendError::Closed { .. }) if !created => {
                    if !self.initial_written(name).await? {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        // Close-only (no records), or a retry whose records were a duplicate (a duplicate
        // answer does not close).
        if close && (!has_records || !created) {
            let closing = self
                .append(AppendRequest {
                    name: name.clone(),
                    records: Vec::new(),
                    producer: None,
                    match_seq: None,
                    close: true,
                    content_type: None,
                })
                .await;
            match closing {
                Ok(_) | Err(AppendError::Closed { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Whether a create's (or fork's) initial records are in `name`: the writer, which knows
    /// what the WAL holds beyond the metadata, has seen the reserved claim (never pruned).
    pub(crate) async fn initial_written(&self, name: &StreamName) -> Result<bool, AppendError> {
        let Some(r) = self.resolve_raw(name) else {
            return Ok(false);
        };
        let open = self.open_stream(&r).await?;
        let w = open.writer.lock().await;
        Ok(w.producers.contains_key(INITIAL_PRODUCER))
    }
}
