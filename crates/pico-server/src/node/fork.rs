//! Forks: a new stream that starts as a prefix of another.

use super::*;
use crate::api::*;
use crate::error::*;
use pico_metadata::{ApplyError, Command, ForkOrigin, Initial, Outcome, StreamConfig};
use pico_protocol::Record;

impl Node {
    /// Creates `req.name` as a fork of `req.source` without copying data: the fork's committed
    /// slices below the fork point are the source's (uncommitted source data is flushed first).
    /// A sub-offset inside a byte record stores the record's prefix as the fork's own record.
    pub async fn fork(&self, req: ForkRequest) -> Result<CreateOutcome, ForkError> {
        if req.config.ttl_secs.is_some() && req.config.expires_at_ms.is_some() {
            return Err(ForkError::BadRequest(
                "ttl and expires-at are mutually exclusive".into(),
            ));
        }
        if req.sub_offset > 0 && req.offset.is_none() {
            return Err(ForkError::BadRequest(
                "a fork sub-offset needs an explicit fork offset".into(),
            ));
        }
        if req.config.ttl_secs.is_some_and(|t| t > MAX_TTL_SECS) {
            return Err(ForkError::BadRequest(format!(
                "ttl too large: max={MAX_TTL_SECS} seconds"
            )));
        }
        let now = self.now_ms();
        let src = self.resolve(&req.source, now).ok_or_else(|| {
            if self.is_gone(&req.source) {
                ForkError::Conflict {
                    name: req.name.to_string(),
                    reason: format!("fork source is deleted: source=`{}`", req.source),
                }
            } else {
                ForkError::SourceNotFound(req.source.to_string())
            }
        })?;
        let source_ct = src.entry.config.content_type.clone();
        if let Some(ct) = &req.config.content_type
            && !content_type_matches(ct, &source_ct)
        {
            return Err(ForkError::Conflict {
                name: req.name.to_string(),
                reason: format!("content type differs from the source: source=`{source_ct}`"),
            });
        }
        // An explicit TTL or expiry wins; otherwise the fork inherits the source's.
        let (ttl_secs, expires_at_ms) =
            if req.config.ttl_secs.is_some() || req.config.expires_at_ms.is_some() {
                (req.config.ttl_secs, req.config.expires_at_ms)
            } else {
                (src.entry.config.ttl_secs, src.entry.config.expires_at_ms)
            };
        let tail = self.tail(&src.meta);
        let offset = req.offset.unwrap_or(tail);
        if offset > tail || offset < src.meta.start_offset {
            return Err(ForkError::BadRequest(format!(
                "fork offset outside the source: offset={offset} start={} tail={tail}",
                src.meta.start_offset
            )));
        }
        // Where inherited data ends, and the prefix record a byte sub-offset leaves.
        let mut inherit_end = offset;
        let mut prefix = None;
        if req.sub_offset > 0 {
            if is_json(&source_ct) {
                inherit_end = offset.saturating_add(req.sub_offset);
                if inherit_end > tail {
                    return Err(ForkError::BadRequest(format!(
                        "fork sub-offset beyond the source's messages: sub_offset={} available={}",
                        req.sub_offset,
                        tail - offset
                    )));
                }
            } else {
                let rec = self
                    .read(ReadRequest {
                        name: src.name.clone(),
                        from: ReadFrom::Offset(offset),
                        max_records: Some(1),
                        max_bytes: None,
                        touch: false,
                    })
                    .await
                    .map_err(|e| ForkError::Internal(format!("reading the fork point: {e}")))?
                    .records
                    .into_iter()
                    .next()
                    .filter(|r| r.offset == offset)
                    .ok_or_else(|| {
                        ForkError::BadRequest(format!(
                            "fork sub-offset past the source's data: offset={offset}"
                        ))
                    })?;
                let len = rec.record.value.len() as u64;
                if req.sub_offset > len {
                    return Err(ForkError::BadRequest(format!(
                        "fork sub-offset beyond the message: sub_offset={} len={len}",
                        req.sub_offset
                    )));
                }
                if req.sub_offset == len {
                    inherit_end = offset + 1;
                } else {
                    let mut r = rec.record;
                    r.value = r.value.slice(..req.sub_offset as usize);
                    prefix = Some(r);
                }
            }
        }
        let config = StreamConfig {
            content_type: source_ct.clone(),
            ttl_secs,
            expires_at_ms,
        };
        // Without records of its own the fork command creates the fork closed if asked; with
        // them it creates it open and their append closes it. A retry of such a completed fork
        // matches: the command compares the closed status the request ends with (`initial`).
        // The prefix and body go in one append after the fork command: check them first.
        if is_json(&config.content_type) {
            check_json_values(&req.initial)?;
        }
        let mut records: Vec<Record> = prefix.into_iter().collect();
        records.extend(req.initial);
        check_records(&records)?;
        let closed_by_command = req.config.closed && records.is_empty();
        let initial = Initial::new(!records.is_empty(), req.config.closed);
        let cmd = |inherit_end| Command::ForkStream {
            name: req.name.as_str().to_string(),
            origin: ForkOrigin {
                source: src.name.as_str().to_string(),
                source_stream_id: src.meta.id,
                offset,
                sub_offset: req.sub_offset,
            },
            inherit_end,
            offset_given: req.offset.is_some(),
            config: config.clone(),
            closed: closed_by_command,
            initial,
            now_ms: now,
        };
        let exists = self
            .inner
            .meta
            .view()
            .registry
            .contains_key(req.name.as_str());
        let mut attempts = 0;
        let created = loop {
            attempts += 1;
            // The fork shares committed objects only: commit the source up to the fork point.
            let committed = self
                .inner
                .meta
                .view()
                .streams
                .get(&src.meta.id)
                .map_or(0, |m| m.end_offset);
            if !exists && committed < inherit_end {
                self.inner
                    .engine
                    .flush()
                    .await
                    .map_err(|e| ForkError::Unavailable(format!("flushing the source: {e}")))?;
            }
            match self
                .propose(cmd(inherit_end))
                .await
                .map_err(ForkError::Unavailable)?
            {
                Ok(Outcome::Created { created, .. }) => break created,
                Ok(other) => {
                    return Err(ForkError::Internal(format!("unexpected outcome {other:?}")));
                }
                Err(ApplyError::Conflict { name, reason }) => {
                    return Err(ForkError::Conflict { name, reason });
                }
                Err(ApplyError::NameNotFound { .. } | ApplyError::StreamNotFound { .. }) => {
                    return Err(ForkError::SourceNotFound(req.source.to_string()));
                }
                Err(ApplyError::StreamDeleted { .. }) => {
                    return Err(ForkError::Conflict {
                        name: req.name.to_string(),
                        reason: "fork source is deleted".into(),
                    });
                }
                // The source's data was not committed yet (a racing flush): flush and retry.
                Err(ApplyError::Invalid(m)) if attempts < 3 => {
                    tracing::debug!(reason = %m, "fork retried after flush");
                }
                Err(e) => return Err(ForkError::Internal(e.to_string())),
            }
        };
        // As in `create`: the prefix and body go under the reserved producer claim, so a retry
        // after a failure between the fork and its append writes them exactly once, and only
        // into a fork made by the same kind of request.
        let retry_of_unfinished = !created
            && !records.is_empty()
            && self
                .resolve_raw(&req.name)
                .is_some_and(|r| r.entry.initial == initial);
        if !records.is_empty() && (created || retry_of_unfinished) {
            self.write_initial(&req.name, records, req.config.closed, created)
                .await?;
        }
        let info = self
            .resolve(&req.name, self.now_ms())
            .map(|r| self.info(&r))
            .ok_or_else(|| ForkError::Conflict {
                name: req.name.to_string(),
                reason: "deleted while being created".into(),
            })?;
        Ok(CreateOutcome { created, info })
    }
}
