//! Reads, long-poll waits and heads.

use super::*;
use crate::api::*;
use crate::error::*;
use crate::waiters::Signal;
use pico_common::StreamName;
use pico_protocol::{BatchError, batch_records_verified};
use s3stream::EngineError;
use std::time::Duration;

impl Node {
    /// Catch-up read: never waits.
    pub async fn read(&self, req: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let now = self.now_ms();
        let r = self
            .resolve(&req.name, now)
            .ok_or_else(|| self.read_missing(&req.name))?;
        if req.touch {
            self.touch(&r, now);
        }
        let stream_id = r.meta.id;
        let tail = self.tail(&r.meta);
        let start = r.meta.start_offset;
        let from = match req.from {
            ReadFrom::Now => tail,
            ReadFrom::Offset(o) => o,
        };
        if from < start {
            return Err(ReadError::Trimmed {
                offset: from,
                start_seq: start,
            });
        }
        // Offsets past the tail were never handed out: answering an empty, cacheable 200 would
        // let a reader skip the records written there later.
        if from > tail && self.tail_withheld(&r.meta) {
            return Err(ReadError::Unavailable(
                "this node cannot confirm its liveness with the metadata log: retry".into(),
            ));
        }
        if from > tail {
            return Err(ReadError::BeyondTail {
                offset: from,
                next_seq: tail,
            });
        }
        // Client limits only narrow the server's: a response carries at most `max_chunk_size`
        // bytes (or one larger record, whole) and `MAX_READ_RECORDS` records; `next_seq` says
        // where to continue.
        let max_records = req
            .max_records
            .unwrap_or(self.inner.config.default_read_records)
            .clamp(1, MAX_READ_RECORDS);
        let chunk = self.inner.config.max_chunk_size.max(1);
        let max_bytes = req.max_bytes.map_or(chunk, |b| b.clamp(1, chunk));
        let mut records = Vec::new();
        let mut next = from;
        let mut bytes = 0usize;
        'outer: while next < tail && records.len() < max_records && bytes < max_bytes {
            let limit = self.read_limit(&r, next, tail);
            let batches = self
                .inner
                .engine
                .read(stream_id, next, max_bytes - bytes)
                .await
                .map_err(|e| self.read_failed(&req.name, stream_id, next, e))?;
            if batches.is_empty() {
                // Below the tail but nowhere to read: a range was fenced away (the stream is
                // being re-opened). An empty 200 would read as "no more records yet".
                if records.is_empty() && next < tail {
                    return Err(ReadError::Unavailable(format!(
                        "stream data is being recovered, retry: offset={next}"
                    )));
                }
                break;
            }
            let mut progressed = false;
            'batches: for b in batches {
                let corrupt = |e: BatchError| {
                    ReadError::Internal(format!(
                        "corrupt stored batch: stream={stream_id} offset={} {e}",
                        b.base_offset
                    ))
                };
                // Decoded lazily, values sliced from the batch: paging through a large batch
                // costs each page its own records, not the whole batch's. No CRC pass: the
                // engine verified these bytes under its object or WAL frame checksums.
                let mut decoded = batch_records_verified(&b.data).map_err(corrupt)?;
                let skip = next.saturating_sub(b.base_offset);
                decoded
                    .skip_records(usize::try_from(skip).unwrap_or(usize::MAX))
                    .map_err(corrupt)?;
                let first = b.base_offset.saturating_add(skip);
                for (i, record) in decoded.enumerate() {
                    let record = record.map_err(corrupt)?;
                    let offset = first + i as u64;
                    if offset >= limit {
                        break 'batches;
                    }
                    // Offsets are consecutive: data starting past `next` means a range was
                    // fenced away (its stream is being re-opened). Never skip over it.
                    if offset > next {
                        if records.is_empty() {
                            return Err(ReadError::Unavailable(format!(
                                "stream data is being recovered, retry: offset={next}"
                            )));
                        }
                        break 'outer;
                    }
                    // Always return at least one record, however large, so readers progress.
                    // Keys and headers count too: records of tiny bodies and big keys or
                    // headers must not fill a response up to the record limit.
                    let size = record.size();
                    if !records.is_empty()
                        && (records.len() >= max_records || bytes + size > max_bytes)
                    {
                        break 'outer;
                    }
                    bytes += size;
                    records.push(ReadRecord { offset, record });
                    next = offset + 1;
                    progressed = true;
                }
            }
            if !progressed {
                break;
            }
        }
        let closed = r.entry.closed && r.entry.closed_at.is_none_or(|c| next >= c);
        let info = self.info_with_tail(&r, tail);
        Ok(ReadOutcome {
            records,
            next_seq: next,
            tail,
            up_to_date: next >= tail,
            closed,
            info,
        })
    }

    /// A storage read that fails because a trim (or delete) released the object between this
    /// read's view and its GET is the client's "trimmed", not a server error.
    pub(crate) fn read_failed(
        &self,
        name: &StreamName,
        stream_id: u64,
        offset: u64,
        e: EngineError,
    ) -> ReadError {
        if let EngineError::Storage(s3stream::StorageError::NotFound { .. }) = &e {
            match self.inner.meta.view().streams.get(&stream_id) {
                Some(m) if m.start_offset > offset => {
                    return ReadError::Trimmed {
                        offset,
                        start_seq: m.start_offset,
                    };
                }
                None => return ReadError::NotFound(name.to_string()),
                Some(_) => {}
            }
        }
        // The store failing (an outage, a reset, a timeout) is retryable; what it returned
        // being wrong (a corrupt object) is not.
        if matches!(e, EngineError::Storage(_)) {
            tracing::warn!(error = %e, stream_id, offset, "read failed: object storage unavailable");
            return ReadError::Unavailable("object storage unavailable: retry".into());
        }
        ReadError::Internal(e.to_string())
    }

    /// Waits until the tail passes `offset`, the stream closes, or `timeout` elapses.
    pub async fn wait(
        &self,
        name: &StreamName,
        offset: u64,
        timeout: Duration,
    ) -> Result<WaitOutcome, ReadError> {
        let r = self
            .resolve(name, self.now_ms())
            .ok_or_else(|| self.read_missing(name))?;
        let stream_id = r.meta.id;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.inner.waiters.subscribe(
            stream_id,
            Signal {
                tail: self.tail(&r.meta),
                closed: r.entry.closed,
                gone: false,
            },
        );
        // Re-check after subscribing: a tail move between the read and the subscribe is not lost.
        if let Some(r) = self.resolve_raw(name).filter(|r| r.meta.id == stream_id) {
            self.inner
                .waiters
                .notify_tail(stream_id, self.tail(&r.meta));
            if r.entry.closed {
                self.inner.waiters.notify_closed(stream_id);
            }
        }
        loop {
            let s = *rx.borrow_and_update();
            if s.gone {
                return Err(ReadError::NotFound(name.to_string()));
            }
            if s.tail > offset {
                return Ok(WaitOutcome::Data);
            }
            if s.closed {
                return Ok(WaitOutcome::Closed);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) | Err(_) => return Ok(WaitOutcome::Timeout),
            }
        }
    }

    /// Metadata without touching the TTL.
    pub async fn head(&self, name: &StreamName) -> Result<StreamInfo, ReadError> {
        self.head_now(name)
    }

    /// What a protocol needs to frame an append's body: the stream's content type (shared, not
    /// copied) and whether it is closed. [`Node::head`] without the tail (which takes the
    /// engine's lock the WAL writer holds for a whole group) or the copies: asked once per
    /// Durable Streams append.
    pub fn framing(&self, name: &StreamName) -> Result<Framing, ReadError> {
        self.framing_seen(name, &mut Lookup::default())
    }

    /// [`Node::framing`] from the request's look at the view (see [`Lookup`]).
    /// `seen` is brought up to date for the request's next step.
    pub fn framing_seen(&self, name: &StreamName, seen: &mut Lookup) -> Result<Framing, ReadError> {
        self.resolve_entries_seen(name, self.now_ms(), seen)
            .map(|(entry, _)| Framing {
                content_type: entry.config.content_type.clone(),
                closed: entry.closed,
            })
            .ok_or_else(|| self.read_missing(name))
    }

    /// [`Node::head`] without awaiting: it reads only the view and in-memory tails, so a caller
    /// holding a sync lock (DS subscriptions) may ask.
    pub(crate) fn head_now(&self, name: &StreamName) -> Result<StreamInfo, ReadError> {
        self.resolve(name, self.now_ms())
            .map(|r| self.info(&r))
            .ok_or_else(|| self.read_missing(name))
    }

    pub(crate) fn read_missing(&self, name: &StreamName) -> ReadError {
        if self.is_gone(name) {
            ReadError::Gone(name.to_string())
        } else {
            ReadError::NotFound(name.to_string())
        }
    }

    /// Where a read from `next` must stop within one engine read. A fork's inherited slices may
    /// be cut inside a batch (the object holds more of the source's data): never read past the
    /// end of the slice holding `next`.
    pub(crate) fn read_limit(&self, r: &Resolved, next: u64, tail: u64) -> u64 {
        if r.entry.fork.is_none() {
            return tail;
        }
        self.inner
            .meta
            .view()
            .slices_from(r.meta.id, next, 1)
            .first()
            .filter(|s| s.start_offset <= next && next < s.end_offset)
            .map_or(tail, |s| s.end_offset.min(tail))
    }
}
