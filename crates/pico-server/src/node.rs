//! The node: the stream service every facade calls. Routing questions and committed state come
//! from the metadata view (never SQL); record data goes through the engine.

use crate::api::*;
use crate::catalog::MetaCatalog;
use crate::config::NodeConfig;
use crate::error::*;
use crate::open::{OpenStream, OpenTable, Writer};
use crate::producers::{self, Aux, Decision, ProducerState};
use crate::ttl::Touches;
use crate::waiters::{Signal, Waiters};
use pico_common::StreamName;
use pico_common::clock::now_ms;
use pico_metadata::{
    ApplyError, Command, ForkOrigin, Initial, Outcome, ProducerMark, RegistryEntry, StreamConfig,
    StreamMeta,
};
use pico_protocol::{
    BatchError, Record, batch_records_verified, check_storable, crc_parts, encode_batch,
};
use pico_sql::MetaLog;
use s3stream::{Engine, EngineConfig, EngineError, ObjectStorage, Wal, crc};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;
use thiserror::Error;
use tokio::sync::Mutex;

/// A running node. Cheap to clone.
#[derive(Clone)]
pub struct Node {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: NodeConfig,
    pub(crate) meta: MetaLog,
    pub(crate) engine: Engine,
    pub(crate) data: Arc<dyn ObjectStorage>,
    pub(crate) open: OpenTable,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) touches: Touches,
    pub(crate) serving: AtomicBool,
    pub(crate) registered: AtomicBool,
    pub(crate) tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    pub(crate) events: tokio::sync::broadcast::Sender<StreamEvent>,
    /// Expired streams whose background removal is in flight.
    pub(crate) removing: Arc<std::sync::Mutex<HashSet<u64>>>,
}

/// A stream id's place in [`Inner::removing`], released on drop (even if the task panics).
struct RemovalClaim {
    set: Arc<std::sync::Mutex<HashSet<u64>>>,
    stream_id: u64,
}

impl RemovalClaim {
    /// `None` when a removal of `stream_id` is already in flight.
    fn take(set: &Arc<std::sync::Mutex<HashSet<u64>>>, stream_id: u64) -> Option<RemovalClaim> {
        let fresh = set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(stream_id);
        fresh.then(|| RemovalClaim {
            set: set.clone(),
            stream_id,
        })
    }
}

impl Drop for RemovalClaim {
    fn drop(&mut self) {
        self.set
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.stream_id);
    }
}

/// Stream changes, for listeners such as Durable Streams subscriptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// Records were appended (and/or the stream closed); `next_seq` is the new tail.
    Appended {
        name: StreamName,
        stream_id: u64,
        next_seq: u64,
        closed: bool,
    },
}

/// Capacity of the event broadcast; a listener that falls further behind gets `Lagged` and must
/// rescan from the view.
const EVENT_CAPACITY: usize = 4096;

#[derive(Debug, Error)]
pub enum StartError {
    #[error("metadata log unavailable: {0}")]
    Meta(String),
    #[error("node registration rejected: {0}")]
    Register(String),
    #[error("engine recovery failed: {0}")]
    Engine(String),
}

/// A stream resolved from the view: its registry entry and internal state.
pub(crate) struct Resolved {
    name: StreamName,
    /// Shared with the metadata view: resolving a name copies two pointers, not the entries.
    entry: Arc<RegistryEntry>,
    meta: Arc<StreamMeta>,
}

impl Node {
    /// Registers this incarnation (new node epoch), recovers the WAL into committed objects, and
    /// starts the maintenance loops. Returns once the node can serve.
    pub async fn start(
        config: NodeConfig,
        meta: MetaLog,
        data: Arc<dyn ObjectStorage>,
        wal: Arc<dyn Wal>,
        mut engine_config: EngineConfig,
    ) -> Result<Node, StartError> {
        let registered = meta
            .propose(Command::RegisterNode {
                node_id: config.node_id,
                node_epoch: config.node_epoch,
                address: config.advertised_url.clone(),
                now_ms: now_ms(),
            })
            .await
            .map_err(|e| StartError::Meta(e.to_string()))?;
        registered.map_err(|e| StartError::Register(e.to_string()))?;

        engine_config.node_id = config.node_id;
        engine_config.node_epoch = config.node_epoch;
        let waiters = Arc::new(Waiters::default());
        let hook_waiters = waiters.clone();
        let catalog = Arc::new(MetaCatalog {
            meta: meta.clone(),
            node_id: config.node_id,
            node_epoch: config.node_epoch,
        });
        let (engine, report) = Engine::start(
            engine_config,
            data.clone(),
            wal,
            catalog,
            Arc::new(move |stream, end| hook_waiters.notify_tail(stream, end)),
        )
        .await
        .map_err(|e| StartError::Engine(e.to_string()))?;
        tracing::info!(
            wal_entries = report.wal_entries,
            records = report.records_replayed,
            skipped = report.skipped,
            "wal recovered"
        );
        let node = Node {
            inner: Arc::new(Inner {
                config,
                meta,
                engine,
                data,
                open: OpenTable::default(),
                waiters,
                touches: Touches::default(),
                serving: AtomicBool::new(true),
                registered: AtomicBool::new(true),
                tasks: std::sync::Mutex::new(Vec::new()),
                events: tokio::sync::broadcast::channel(EVENT_CAPACITY).0,
                removing: Arc::default(),
            }),
        };
        crate::maintenance::spawn_all(&node);
        Ok(node)
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    /// The metadata log. Facades never reach it (they call the node, and `stats()` for what
    /// the admin page shows); outside this crate only tests do, through the `testing` feature.
    #[cfg(any(test, feature = "testing"))]
    pub fn meta(&self) -> &MetaLog {
        &self.inner.meta
    }
    #[cfg(not(any(test, feature = "testing")))]
    pub(crate) fn meta(&self) -> &MetaLog {
        &self.inner.meta
    }

    /// The engine: like [`Node::meta`], for tests only outside this crate.
    #[cfg(any(test, feature = "testing"))]
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

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
        let now = now_ms();
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
    async fn write_initial(
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
    async fn initial_written(&self, name: &StreamName) -> Result<bool, AppendError> {
        let Some(r) = self.resolve_raw(name) else {
            return Ok(false);
        };
        let open = self.open_stream(&r).await?;
        let w = open.writer.lock().await;
        Ok(w.producers.contains_key(INITIAL_PRODUCER))
    }

    /// Append records (and/or close); returns once durable.
    pub async fn append(&self, req: AppendRequest) -> Result<AppendOutcome, AppendError> {
        self.append_with(req, AppendOptions::default()).await
    }

    /// [`Node::append`] with options (Durable Streams `Stream-Seq`).
    pub async fn append_with(
        &self,
        req: AppendRequest,
        opts: AppendOptions,
    ) -> Result<AppendOutcome, AppendError> {
        let now = now_ms();
        let r = self.resolve(&req.name, now).ok_or_else(|| {
            if self.is_gone(&req.name) {
                AppendError::Gone(req.name.to_string())
            } else {
                AppendError::NotFound(req.name.to_string())
            }
        })?;
        if let Some(p) = &req.producer
            && (p.id.is_empty() || p.id.len() > producers::MAX_PRODUCER_ID_LEN)
        {
            return Err(AppendError::BadRequest(format!(
                "producer id must be 1..={} bytes",
                producers::MAX_PRODUCER_ID_LEN
            )));
        }
        if opts
            .stream_seq
            .as_ref()
            .is_some_and(|q| q.len() > producers::MAX_STREAM_SEQ_LEN)
        {
            return Err(AppendError::BadRequest(format!(
                "stream-seq longer than {} bytes",
                producers::MAX_STREAM_SEQ_LEN
            )));
        }
        if req.records.is_empty() && !req.close {
            return Err(AppendError::BadRequest("empty append".into()));
        }
        check_records(&req.records)?;
        // A protocol that names the request's content type has parsed the records as that type
        // (Durable Streams splits a JSON array into its values); any other append to a JSON
        // stream is checked here, or its values would break every JSON read of the stream.
        if req.content_type.is_none()
            && is_json(&r.entry.config.content_type)
            && let Err(e) = check_json_values(&req.records)
        {
            // Any append to a closed stream is refused as such, whatever its records.
            return Err(if r.entry.closed {
                AppendError::Closed {
                    name: r.name.to_string(),
                    next_seq: self.tail(&r.meta),
                }
            } else {
                e
            });
        }
        let stream_id = r.meta.id;
        self.touch(&r, now);
        let open = self.open_stream(&r).await?;
        open.touch(now);
        let engine = &self.inner.engine;

        // One deadline for the stream's turn and the engine's space: with storage stalled the
        // appends queued behind the lock would each wait their full timeout in turn, holding
        // their bodies, so the k-th would hear 503 only after k timeouts.
        let give_up = tokio::time::Instant::now() + self.inner.config.submit_timeout;
        let busy = |_| {
            AppendError::Unavailable("storage is not keeping up: stream busy, retry later".into())
        };
        let mut w = tokio::time::timeout_at(give_up, open.writer.lock())
            .await
            .map_err(busy)?;
        if let Some(p) = &req.producer {
            // Arrived ahead of its predecessors: hold it (bounded) until they are accepted.
            let deadline = tokio::time::Instant::now() + REORDER_WAIT;
            while !w.broken && !w.closed && producers::early(w.producers.get(&p.id).copied(), p) {
                // Created before the lock is released, so no move between the two is missed.
                let moved = open.producers_moved.notified();
                drop(w);
                let timed_out = tokio::time::timeout_at(deadline, moved).await.is_err();
                w = tokio::time::timeout_at(give_up, open.writer.lock())
                    .await
                    .map_err(busy)?;
                if timed_out {
                    break; // decided below as it stands: most likely a real gap
                }
            }
        }
        if w.broken {
            drop(w);
            self.inner.open.remove_open(&open);
            return Err(AppendError::Unavailable(format!(
                "stream is being reopened, retry: name=`{}`",
                r.name
            )));
        }
        let next = engine
            .next_offset(stream_id)
            .ok_or_else(|| AppendError::Unavailable("stream not open on the engine".into()))?;
        if w.closed {
            let same_closer = match (&req.producer, &w.closed_by) {
                (Some(p), Some(cb)) => {
                    (p.id.as_str(), p.epoch, p.seq) == (cb.0.as_str(), cb.1, cb.2)
                }
                _ => false,
            };
            // The retry of the producer append that closed the stream is a duplicate.
            if same_closer {
                let producer = req.producer.as_ref().map(|p| (p.epoch, p.seq));
                drop(w);
                // Acknowledge only what is true: the original's data is durable and the close
                // is committed (it may still be in flight, or have failed).
                self.wait_durable(&open, next).await?;
                self.wait_sealed(&open, &r.name).await?;
                return Ok(AppendOutcome {
                    start_seq: next,
                    next_seq: next,
                    duplicate: true,
                    closed: true,
                    producer,
                    timestamp_ms: now,
                });
            }
            return Err(AppendError::Closed {
                name: r.name.to_string(),
                next_seq: next,
            });
        }
        if let Some(ct) = &req.content_type
            && !req.records.is_empty()
            && !content_type_matches(ct, &r.entry.config.content_type)
        {
            return Err(AppendError::ContentType {
                stream: r.entry.config.content_type.to_string(),
                request: ct.clone(),
            });
        }
        if let Some(p) = &req.producer {
            match producers::decide(w.producers.get(&p.id).copied(), p) {
                Decision::Accept => {}
                // The retry of an append-and-close whose records became durable but whose
                // close failed: the records are a duplicate, the close is still owed.
                Decision::Duplicate { last_seq } if req.close && last_seq == p.seq => {
                    w.closed = true;
                    w.closed_by = Some((p.id.clone(), p.epoch, p.seq));
                    drop(w);
                    let mark = ProducerMark {
                        id: p.id.clone(),
                        epoch: p.epoch,
                        seq: p.seq,
                    };
                    self.finish_detached(&open, None, next, next, Some(Some(mark)), now, &r.name)
                        .await?;
                    let _ = self.inner.events.send(StreamEvent::Appended {
                        name: r.name.clone(),
                        stream_id,
                        next_seq: next,
                        closed: true,
                    });
                    return Ok(AppendOutcome {
                        start_seq: next,
                        next_seq: next,
                        duplicate: true,
                        closed: true,
                        producer: Some((p.epoch, last_seq)),
                        timestamp_ms: now,
                    });
                }
                Decision::Duplicate { last_seq } => {
                    let closed = w.closed;
                    drop(w);
                    // The original may still be in flight: acknowledge only once it is durable
                    // in this same incarnation of the stream.
                    self.wait_durable(&open, next).await?;
                    return Ok(AppendOutcome {
                        start_seq: next,
                        next_seq: next,
                        duplicate: true,
                        closed,
                        producer: Some((p.epoch, last_seq)),
                        timestamp_ms: now,
                    });
                }
                Decision::Fenced { current } => {
                    return Err(AppendError::Fenced {
                        producer: p.id.clone(),
                        given: p.epoch,
                        current,
                    });
                }
                Decision::Gap { expected } => {
                    return Err(AppendError::SequenceGap {
                        producer: p.id.clone(),
                        expected,
                        received: p.seq,
                    });
                }
                Decision::EpochMustStartAtZero => {
                    return Err(AppendError::EpochSeq {
                        producer: p.id.clone(),
                        epoch: p.epoch,
                        seq: p.seq,
                    });
                }
            }
        }
        // Stream-Seq after producer dedup: a retried duplicate carries the same seq.
        if let Some(seq) = &opts.stream_seq
            && !req.records.is_empty()
            && let Some(last) = &w.stream_seq
            && seq.as_bytes() <= last.as_bytes()
        {
            return Err(AppendError::SeqRegression {
                last: last.clone(),
                given: seq.clone(),
            });
        }
        if let Some(expected) = req.match_seq
            && expected != next
        {
            return Err(AppendError::MatchFailed {
                expected,
                next_seq: next,
            });
        }

        let mut pending = None;
        if !req.records.is_empty() {
            let records: Vec<Record> = req
                .records
                .into_iter()
                .map(|mut rec| {
                    rec.timestamp_ms = now;
                    rec
                })
                .collect();
            let batch = encode_batch(next, &records);
            let aux = producers::encode_aux(&Aux {
                producer: req.producer.clone(),
                stream_seq: opts.stream_seq.clone(),
            });
            // The encoder has just checksummed the records: the engine's CRC of a large batch
            // combines that with the header's instead of reading the batch again (a small one
            // is cheaper to read).
            let batch_crc = crc_parts(&batch)
                .filter(|_| batch.len() >= crc::COMBINE_MIN)
                .map(|(head, rest, len)| crc::combine(head, rest, len));
            let submit = engine.append(s3stream::AppendRequest {
                stream: stream_id,
                epoch: open.epoch,
                record_count: records.len() as u32,
                batch,
                batch_crc,
                aux,
            });
            // Queue space frees as the WAL and uploads make progress; when storage is down it
            // never does, so answer 503 rather than hang (offsets are assigned only on success).
            match tokio::time::timeout_at(give_up, submit).await {
                Ok(Ok(p)) => pending = Some(p),
                Ok(Err(e)) => {
                    w.broken = true;
                    drop(w);
                    self.inner.open.remove_open(&open);
                    return Err(engine_append_error(e));
                }
                Err(_) => {
                    return Err(AppendError::Unavailable(
                        "storage is not keeping up: append queue full, retry later".into(),
                    ));
                }
            }
        }
        if pending.is_some()
            && let Some(seq) = &opts.stream_seq
        {
            w.stream_seq = Some(seq.clone());
        }
        if let Some(p) = &req.producer {
            w.accept_producer(&p.id, p.epoch, p.seq, now);
            open.producers_moved.notify_waiters();
        }
        if req.close {
            w.closed = true;
            w.closed_by = req
                .producer
                .as_ref()
                .map(|p| (p.id.clone(), p.epoch, p.seq));
        }
        let new_next = pending.as_ref().map(|p| p.next_offset).unwrap_or(next);
        drop(w);

        // Durability wait and seal run in their own task: a client that disconnects must not
        // leave a close decided in memory but never committed.
        let close = req.close.then(|| {
            req.producer.as_ref().map(|p| ProducerMark {
                id: p.id.clone(),
                epoch: p.epoch,
                seq: p.seq,
            })
        });
        self.finish_detached(&open, pending, next, new_next, close, now, &r.name)
            .await?;
        // Nobody listening is fine: the channel is a bounded, lossy broadcast.
        let _ = self.inner.events.send(StreamEvent::Appended {
            name: r.name.clone(),
            stream_id,
            next_seq: new_next,
            closed: req.close,
        });
        Ok(AppendOutcome {
            start_seq: next,
            next_seq: new_next,
            duplicate: false,
            closed: req.close,
            producer: req.producer.as_ref().map(|p| (p.epoch, p.seq)),
            timestamp_ms: now,
        })
    }

    /// Catch-up read: never waits.
    pub async fn read(&self, req: ReadRequest) -> Result<ReadOutcome, ReadError> {
        let now = now_ms();
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
    fn read_failed(
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
            .resolve(name, now_ms())
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

    /// [`Node::head`] without awaiting: it reads only the view and in-memory tails, so a caller
    /// holding a sync lock (DS subscriptions) may ask.
    pub(crate) fn head_now(&self, name: &StreamName) -> Result<StreamInfo, ReadError> {
        self.resolve(name, now_ms())
            .map(|r| self.info(&r))
            .ok_or_else(|| self.read_missing(name))
    }

    /// Deletes the stream; one that forks still reference is soft-deleted (its name stays
    /// reserved, answering "gone", until the last fork is deleted).
    pub async fn delete(&self, name: &StreamName) -> Result<(), DeleteError> {
        let r = self.resolve(name, now_ms()).ok_or_else(|| {
            if self.is_gone(name) {
                DeleteError::Gone(name.to_string())
            } else {
                DeleteError::NotFound(name.to_string())
            }
        })?;
        self.remove_stream(&r.name, r.meta.id).await
    }

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
        let now = now_ms();
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
            .resolve(&req.name, now_ms())
            .map(|r| self.info(&r))
            .ok_or_else(|| ForkError::Conflict {
                name: req.name.to_string(),
                reason: "deleted while being created".into(),
            })?;
        Ok(CreateOutcome { created, info })
    }

    /// Trims records below `seq`; returns the new start offset.
    pub async fn trim(&self, name: &StreamName, seq: u64) -> Result<u64, TrimError> {
        let now = now_ms();
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

    pub fn list(&self, req: ListRequest) -> ListOutcome {
        let view = self.inner.meta.view();
        let now = now_ms();
        let prefix = req
            .prefix
            .as_deref()
            .map(|p| p.trim_start_matches('/'))
            .unwrap_or("");
        let after = req
            .start_after
            .as_deref()
            .map(|p| p.trim_matches('/').to_string());
        let limit = req.limit.max(1);
        let mut streams = Vec::new();
        let mut has_more = false;
        let lower: std::ops::Bound<&str> = match &after {
            Some(a) if a.as_str() >= prefix => std::ops::Bound::Excluded(a.as_str()),
            _ => std::ops::Bound::Included(prefix),
        };
        for (name, entry) in view
            .registry
            .range::<_, str>((lower, std::ops::Bound::Unbounded))
        {
            if !name.starts_with(prefix) {
                break;
            }
            let Some(meta) = view.streams.get(&entry.stream_id) else {
                continue;
            };
            if self.expired(entry, meta.id, now) {
                continue;
            }
            if streams.len() == limit {
                has_more = true;
                break;
            }
            let Ok(sn) = StreamName::parse(name) else {
                continue;
            };
            let r = Resolved {
                name: sn,
                entry: entry.clone(),
                meta: meta.clone(),
            };
            streams.push(self.info(&r));
        }
        ListOutcome { streams, has_more }
    }

    pub fn ready(&self) -> ReadyInfo {
        let serving = self.inner.serving.load(Ordering::Relaxed);
        let registered = self.inner.registered.load(Ordering::Relaxed);
        let metadata_stopped = self.inner.meta.health().err().map(|e| e.to_string());
        ReadyInfo {
            ready: serving && registered && metadata_stopped.is_none(),
            serving,
            registered,
            metadata_stopped,
            applied_index: self.inner.meta.applied_index(),
            node_id: self.inner.config.node_id,
        }
    }

    /// Stops serving, flushes every open stream into committed objects, stops background tasks.
    pub async fn shutdown(&self) {
        self.inner.serving.store(false, Ordering::Relaxed);
        // Maintenance first, so no idle release races the final flush. Writers are not locked:
        // an append stuck waiting for queue space would hold up shutdown, and the engine rejects
        // new appends once it is shutting down.
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            t.abort();
        }
        if let Err(e) = self.inner.engine.shutdown().await {
            tracing::error!(error = %e, "engine shutdown did not flush everything (the WAL keeps it)");
        }
        // Touches not yet due would be lost by a restart, and their streams expire early.
        crate::maintenance::flush_touches(self).await;
        self.inner.meta.close().await;
    }

    /// Appends and closes as they become durable (bounded, lossy: see [`StreamEvent`]).
    pub fn subscribe_events(&self) -> tokio::sync::broadcast::Receiver<StreamEvent> {
        self.inner.events.subscribe()
    }

    /// The owner's advertised URL when another registered node owns the stream (for 307s).
    pub fn owner_url(&self, name: &StreamName) -> Option<String> {
        let view = self.inner.meta.view();
        let entry = view.registry.get(name.as_str())?;
        let owner = view.streams.get(&entry.stream_id)?.owner.as_ref()?;
        if owner.node_id == self.inner.config.node_id {
            return None;
        }
        view.nodes.get(&owner.node_id).map(|n| n.address.clone())
    }

    /// Number of streams open on this node (for stats and tests).
    pub fn open_streams(&self) -> usize {
        self.inner.open.len()
    }

    // ---- internals ----

    pub(crate) async fn propose(
        &self,
        cmd: Command,
    ) -> Result<Result<Outcome, ApplyError>, String> {
        self.inner
            .meta
            .propose(cmd)
            .await
            .map_err(|e| format!("metadata log: {e}"))
    }

    /// The stream by name from the view, ignoring expiry.
    fn resolve_raw(&self, name: &StreamName) -> Option<Resolved> {
        let view = self.inner.meta.view();
        let entry = view.registry.get(name.as_str())?;
        let meta = view.streams.get(&entry.stream_id)?;
        Some(Resolved {
            name: name.clone(),
            entry: entry.clone(),
            meta: meta.clone(),
        })
    }

    /// Whether `name` is soft-deleted (kept only because forks reference it).
    pub fn is_gone(&self, name: &StreamName) -> bool {
        self.inner
            .meta
            .view()
            .registry
            .get(name.as_str())
            .is_some_and(|e| e.soft_deleted)
    }

    fn read_missing(&self, name: &StreamName) -> ReadError {
        if self.is_gone(name) {
            ReadError::Gone(name.to_string())
        } else {
            ReadError::NotFound(name.to_string())
        }
    }

    /// Where a read from `next` must stop within one engine read. A fork's inherited slices may
    /// be cut inside a batch (the object holds more of the source's data): never read past the
    /// end of the slice holding `next`.
    fn read_limit(&self, r: &Resolved, next: u64, tail: u64) -> u64 {
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

    /// The live stream by name: expired streams are absent (and get removed in the background).
    pub(crate) fn resolve(&self, name: &StreamName, now: i64) -> Option<Resolved> {
        let r = self.resolve_raw(name)?;
        if self.expired(&r.entry, r.meta.id, now) {
            // One removal per stream at a time: every request to an expired name lands here
            // (`None` also when a removal is already in flight).
            let claim = RemovalClaim::take(&self.inner.removing, r.meta.id)?;
            let node = self.clone();
            let name = r.name.clone();
            tokio::spawn(async move {
                if let Err(e) = node.remove_expired(&name, claim.stream_id).await {
                    tracing::warn!(error = %e, stream = %name, "expired stream not removed yet");
                }
                drop(claim);
            });
            return None;
        }
        Some(r)
    }

    pub(crate) fn expired(&self, entry: &RegistryEntry, stream_id: u64, now: i64) -> bool {
        // A soft-deleted entry only waits for its forks; the cascade removes it.
        if entry.soft_deleted {
            return false;
        }
        if entry.config.expires_at_ms.is_some_and(|at| now >= at) {
            return true;
        }
        match entry.config.ttl_secs {
            Some(ttl) => {
                let last = self
                    .inner
                    .touches
                    .get(stream_id)
                    .unwrap_or(0)
                    .max(entry.last_touch_ms);
                now >= last.saturating_add((ttl as i64).saturating_mul(1000))
            }
            None => false,
        }
    }

    /// Slides the TTL (in memory; persisted in batches by the maintenance loop).
    pub(crate) fn touch(&self, r: &Resolved, now: i64) {
        if let Some(ttl) = r.entry.config.ttl_secs {
            let due =
                now.saturating_sub(r.entry.last_touch_ms) >= crate::ttl::persist_after_ms(ttl);
            self.inner.touches.touch(r.meta.id, now, due);
        }
    }

    /// Removes an expired stream, re-checking expiry against the current view first.
    pub(crate) async fn remove_expired(
        &self,
        name: &StreamName,
        id: u64,
    ) -> Result<(), DeleteError> {
        match self.resolve_raw(name) {
            Some(r) if r.meta.id == id && self.expired(&r.entry, id, now_ms()) => {
                self.remove_stream(name, id).await
            }
            _ => Ok(()),
        }
    }

    async fn remove_stream(&self, name: &StreamName, stream_id: u64) -> Result<(), DeleteError> {
        // In a task of its own, as appends finish theirs: a caller cancelled (client gone) after
        // the command applied would otherwise skip the cleanup, leaving the open slot, engine
        // state and touch behind and long-pollers waiting until their timeout.
        let node = self.clone();
        let name = name.clone();
        tokio::spawn(async move { node.remove_stream_now(&name, stream_id).await })
            .await
            .map_err(|e| DeleteError::Internal(format!("delete task failed: {e}")))?
    }

    async fn remove_stream_now(
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

    /// The readable tail: the engine's durable end when the stream is open here, else the
    /// committed end from the view.
    fn tail(&self, meta: &StreamMeta) -> u64 {
        self.inner
            .engine
            .durable_end(meta.id)
            .map_or(meta.end_offset, |d| d.max(meta.end_offset))
    }

    fn info(&self, r: &Resolved) -> StreamInfo {
        self.info_with_tail(r, self.tail(&r.meta))
    }

    fn info_with_tail(&self, r: &Resolved, tail: u64) -> StreamInfo {
        StreamInfo {
            name: r.name.clone(),
            stream_id: r.meta.id,
            content_type: r.entry.config.content_type.to_string(),
            start_seq: r.meta.start_offset.min(tail),
            next_seq: tail,
            closed: r.entry.closed,
            ttl_secs: r.entry.config.ttl_secs,
            expires_at_ms: r.entry.config.expires_at_ms,
            created_at_ms: r.entry.created_at_ms,
            epoch: r.meta.epoch,
        }
    }

    /// Opens the stream on this node (lazily, once: concurrent callers share the open).
    async fn open_stream(&self, r: &Resolved) -> Result<Arc<OpenStream>, AppendError> {
        let stream_id = r.meta.id;
        // Checked before taking a slot, so refused requests leave nothing in the table.
        if let Some(max) = self.inner.config.slots
            && self.inner.open.get(stream_id).is_none()
            && self.inner.open.len() >= max as usize
        {
            return Err(AppendError::Unavailable(format!(
                "node is at its open-stream limit, retry later: slots={max}"
            )));
        }
        let slot = self.inner.open.slot(stream_id);
        let result = slot
            .cell()
            .get_or_try_init(|| async {
                if !self.inner.serving.load(Ordering::Relaxed) {
                    return Err(AppendError::Unavailable("node is shutting down".into()));
                }

                // A previous incarnation of this stream still has engine state: flush it into
                // committed objects first, or the epoch bump below would fence acknowledged data.
                if self.inner.engine.is_open(stream_id).is_some() {
                    self.inner
                        .engine
                        .close(stream_id)
                        .await
                        .map_err(|e| AppendError::Unavailable(format!("flushing stream: {e}")))?;
                }
                let cfg = &self.inner.config;
                let outcome = self
                    .propose(Command::OpenStream {
                        stream_id,
                        node_id: cfg.node_id,
                        node_epoch: cfg.node_epoch,
                    })
                    .await
                    .map_err(AppendError::Unavailable)?;
                let (epoch, end) = match outcome {
                    Ok(Outcome::Opened {
                        epoch, end_offset, ..
                    }) => (epoch, end_offset),
                    Ok(other) => {
                        return Err(AppendError::Internal(format!(
                            "unexpected outcome {other:?}"
                        )));
                    }
                    Err(ApplyError::StreamNotFound { .. } | ApplyError::StreamDeleted { .. }) => {
                        return Err(AppendError::NotFound(r.name.to_string()));
                    }
                    Err(e) => return Err(AppendError::Unavailable(format!("open rejected: {e}"))),
                };
                self.inner.engine.open(stream_id, epoch, end);
                // Producer and closure state as committed; the writer keeps it current from here.
                let view = self.inner.meta.view();
                // Deleted while we were opening: drop the engine state we just created.
                if view.streams.get(&stream_id).is_none() {
                    self.inner.engine.forget(stream_id);
                    return Err(AppendError::NotFound(r.name.to_string()));
                }
                let producers: HashMap<String, ProducerState> = view
                    .streams
                    .get(&stream_id)
                    .map(|m| {
                        m.producers
                            .iter()
                            .map(|(id, p)| {
                                (
                                    id.clone(),
                                    ProducerState {
                                        epoch: p.epoch,
                                        seq: p.seq,
                                        last_ms: p.last_ms,
                                    },
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let stream_seq = view
                    .streams
                    .get(&stream_id)
                    .and_then(|m| m.stream_seq.as_deref().map(str::to_string));
                let entry = view.registry.get(r.name.as_str());
                let closed = entry.is_some_and(|e| e.closed);
                let closed_by = entry
                    .and_then(|e| e.closed_by.as_ref())
                    .map(|m| (m.id.clone(), m.epoch, m.seq));
                Ok(Arc::new(OpenStream {
                    stream_id,
                    epoch,
                    writer: Mutex::new(Writer {
                        producers,
                        closed,
                        closed_by,
                        stream_seq,
                        broken: false,
                    }),
                    last_used_ms: AtomicI64::new(now_ms()),
                    producers_moved: tokio::sync::Notify::new(),
                }))
            })
            .await
            .cloned();
        // Dropping `slot` removes it if the open failed (or is cancelled before this point)
        // and nobody else waits on it.
        result
    }

    /// [`Node::finish_append`] in a task of its own: a client that disconnects must not leave
    /// a close decided in memory but never committed.
    #[allow(clippy::too_many_arguments)]
    async fn finish_detached(
        &self,
        open: &Arc<OpenStream>,
        pending: Option<s3stream::PendingAppend>,
        next: u64,
        new_next: u64,
        close: Option<Option<ProducerMark>>,
        now: i64,
        name: &StreamName,
    ) -> Result<(), AppendError> {
        let node = self.clone();
        let finishing = open.clone();
        tokio::spawn(async move {
            node.finish_append(finishing, pending, next, new_next, close, now)
                .await
        })
        .await
        .map_err(|e| AppendError::Internal(format!("append task failed: {e}")))?
        .map_err(|e| match e {
            AppendError::NotFound(_) => AppendError::NotFound(name.to_string()),
            e => e,
        })
    }

    /// Second half of an append: waits for durability (or, close-only, for everything before
    /// it), then commits the close. Any failure breaks the open stream so the next request
    /// reloads the committed state instead of trusting what this writer decided in memory.
    async fn finish_append(
        &self,
        open: Arc<OpenStream>,
        pending: Option<s3stream::PendingAppend>,
        next: u64,
        new_next: u64,
        close: Option<Option<ProducerMark>>,
        now: i64,
    ) -> Result<(), AppendError> {
        match pending {
            Some(p) => {
                if let Err(e) = p.durable().await {
                    self.break_open(&open).await;
                    return Err(AppendError::Durability(e.to_string()));
                }
            }
            None => self.wait_durable(&open, next).await?,
        }
        if let Some(mark) = close {
            let sealed = self
                .propose(Command::SealStream {
                    stream_id: open.stream_id,
                    closed_at: new_next,
                    producer: mark,
                    now_ms: now,
                })
                .await;
            match sealed {
                Ok(Ok(_)) => self.inner.waiters.notify_closed(open.stream_id),
                // Deleted meanwhile (a racing DELETE): the caller names the stream.
                Ok(Err(ApplyError::StreamNotFound { .. } | ApplyError::StreamDeleted { .. })) => {
                    self.break_open(&open).await;
                    return Err(AppendError::NotFound(String::new()));
                }
                Ok(Err(e)) => {
                    self.break_open(&open).await;
                    return Err(AppendError::Internal(format!("close rejected: {e}")));
                }
                Err(e) => {
                    self.break_open(&open).await;
                    return Err(AppendError::Unavailable(e));
                }
            }
        }
        Ok(())
    }

    /// Marks an open stream unusable and drops it from the table (if it is still there).
    async fn break_open(&self, open: &Arc<OpenStream>) {
        open.writer.lock().await.broken = true;
        self.inner.open.remove_open(open);
    }

    /// Waits until everything submitted below `target` is durable in this incarnation of the
    /// stream. A re-open or a failed write in between means it may never be: answer 503 so the
    /// client retries against the committed state.
    async fn wait_durable(&self, open: &Arc<OpenStream>, target: u64) -> Result<(), AppendError> {
        let engine = &self.inner.engine;
        let stream_id = open.stream_id;
        let mut rx = self.inner.waiters.subscribe(stream_id, Signal::default());
        let deadline = tokio::time::Instant::now() + DURABLE_WAIT;
        loop {
            if engine.is_open(stream_id) != Some(open.epoch)
                || open.writer.try_lock().is_ok_and(|w| w.broken)
            {
                return Err(AppendError::Unavailable(
                    "stream was reopened before earlier appends were confirmed: retry".into(),
                ));
            }
            if engine.durable_end(stream_id).is_some_and(|d| d >= target) {
                return Ok(());
            }
            // A failed write sets `broken` without moving the tail: poll as well as listen.
            let tick = tokio::time::sleep(Duration::from_millis(20));
            tokio::select! {
                _ = rx.changed() => {}
                _ = tick => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(AppendError::Durability(
                    "earlier appends did not become durable in time".into(),
                ));
            }
        }
    }

    /// Waits until the stream's close is committed (a retry of the closing request).
    async fn wait_sealed(
        &self,
        open: &Arc<OpenStream>,
        name: &StreamName,
    ) -> Result<(), AppendError> {
        let deadline = tokio::time::Instant::now() + DURABLE_WAIT;
        loop {
            let sealed = self
                .inner
                .meta
                .view()
                .registry
                .get(name.as_str())
                .is_some_and(|e| e.stream_id == open.stream_id && e.closed_at.is_some());
            if sealed {
                return Ok(());
            }
            if open.writer.try_lock().is_ok_and(|w| w.broken)
                || tokio::time::Instant::now() >= deadline
            {
                return Err(AppendError::Unavailable(
                    "the close of this stream was not committed: retry".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Producer id of a create's initial records. NUL cannot occur in an HTTP header value, so no
/// client can claim it.
const INITIAL_PRODUCER: &str = "\u{0}initial";

/// The checks on the records of one append that do not depend on the stream. Creates and
/// forks with records run them before creating anything: a stream created and then refused
/// its records would stay, open and empty, and every retry would fail the same way.
fn check_records(records: &[Record]) -> Result<(), AppendError> {
    // One append is one stored batch, decoded whole by every read that touches it: bound it.
    if records.len() > MAX_RECORDS_PER_APPEND {
        return Err(AppendError::TooLarge {
            what: "records in one append",
            size: records.len(),
            max: MAX_RECORDS_PER_APPEND,
        });
    }
    // Every stored record must stay readable in every format (binary has u16 fields).
    for (index, rec) in records.iter().enumerate() {
        check_storable(rec).map_err(|e| {
            AppendError::BadRequest(format!("record cannot be stored: index={index} {e}"))
        })?;
    }
    Ok(())
}
/// Each record of an append to a JSON stream must be exactly one JSON value, in UTF-8.
fn check_json_values(records: &[Record]) -> Result<(), AppendError> {
    for (index, rec) in records.iter().enumerate() {
        let bad = |why: String| {
            AppendError::BadRequest(format!(
                "record is not one JSON value, as the stream's content type application/json requires: index={index} {why}"
            ))
        };
        // serde_json checks the text of strings only when reading a `str`.
        let text = std::str::from_utf8(&rec.value).map_err(|e| bad(e.to_string()))?;
        serde_json::from_str::<serde::de::IgnoredAny>(text).map_err(|e| bad(e.to_string()))?;
    }
    Ok(())
}

/// Most records one append may carry (a JSON array, a batch, a Kafka batch later).
pub const MAX_RECORDS_PER_APPEND: usize = 10_000;
/// Most records one read returns, whatever the client asks: bounds the memory of a response
/// of tiny records, which the byte limit alone does not.
pub const MAX_READ_RECORDS: usize = 10_000;
/// Largest accepted TTL (ten years): keeps every deadline computation far from overflow.
pub const MAX_TTL_SECS: u64 = 10 * 365 * 24 * 3600;

/// Longest an append that arrived ahead of its producer's earlier batches waits for them
/// before it is answered as a sequence gap. Pipelined requests overtake each other by well
/// under a millisecond here; a real gap (a lost batch, a client bug) costs this much more.
const REORDER_WAIT: Duration = Duration::from_millis(20);
/// Longest a duplicate or close waits for earlier appends to become durable.
const DURABLE_WAIT: Duration = Duration::from_secs(60);

fn engine_append_error(e: EngineError) -> AppendError {
    match e {
        EngineError::ShuttingDown => AppendError::Unavailable("node is shutting down".into()),
        other => AppendError::Unavailable(format!("stream must be reopened: {other}")),
    }
}

/// The stored form of a content type: the media type lowercased (parameters kept as given),
/// `application/octet-stream` when absent, so creates compare case-insensitively.
pub fn normalize_content_type(ct: Option<&str>) -> String {
    let ct = ct.map(str::trim).filter(|c| !c.is_empty());
    let Some(ct) = ct else {
        return "application/octet-stream".to_string();
    };
    match ct.split_once(';') {
        Some((media, params)) => {
            format!("{}; {}", media.trim().to_ascii_lowercase(), params.trim())
        }
        None => ct.to_ascii_lowercase(),
    }
}

/// Whether a content type selects Durable Streams JSON mode (one record per message).
pub fn is_json(ct: &str) -> bool {
    ct.split(';')
        .next()
        .is_some_and(|m| m.trim().eq_ignore_ascii_case("application/json"))
}

/// Content types match on their essence (type/subtype), case-insensitively, ignoring parameters.
pub fn content_type_matches(a: &str, b: &str) -> bool {
    // Runs twice per DS append: compare in place rather than lowercase into new strings.
    fn essence(s: &str) -> &str {
        s.split(';').next().unwrap_or("").trim()
    }
    essence(a).eq_ignore_ascii_case(essence(b))
}

#[cfg(test)]
mod tests {
    use super::{Record, content_type_matches};
    use crate::api::{AppendRequest, CreateRequest};
    use crate::testing::start_test_node;
    use pico_common::StreamName;
    use std::time::{Duration, Instant};

    #[tokio::test]
    async fn a_delete_cancelled_after_it_applied_still_cleans_up() {
        let node = start_test_node().await;
        let name = StreamName::parse("d").unwrap();
        node.create(CreateRequest {
            name: name.clone(),
            config: Default::default(),
            initial: vec![],
        })
        .await
        .unwrap();
        node.append(AppendRequest {
            name: name.clone(),
            records: vec![Record {
                timestamp_ms: 0,
                key: None,
                value: bytes::Bytes::from_static(b"x"),
                headers: vec![],
            }],
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        })
        .await
        .unwrap();
        let id = node.head(&name).await.unwrap().stream_id;
        let open = node
            .inner
            .open
            .get(id)
            .expect("stream open after an append");
        // A busy writer holds the delete at its cleanup; the client goes away meanwhile.
        let busy = open.writer.lock().await;
        let mut delete = Box::pin(node.delete(&name));
        let deadline = Instant::now() + Duration::from_secs(5);
        while node.meta().view().registry.contains_key("d") {
            assert!(Instant::now() < deadline, "delete never applied");
            tokio::select! {
                r = &mut delete => panic!("delete finished with the writer locked: {r:?}"),
                _ = tokio::time::sleep(Duration::from_millis(5)) => {}
            }
        }
        drop(delete);
        drop(busy);
        let deadline = Instant::now() + Duration::from_secs(5);
        while node.open_streams() > 0 || node.inner.engine.is_open(id).is_some() {
            assert!(
                Instant::now() < deadline,
                "the cancelled delete left the stream open"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[test]
    fn content_types_match_on_their_essence() {
        assert!(content_type_matches("text/plain", "text/plain"));
        assert!(content_type_matches(
            " Text/Plain ; charset=utf-8",
            "text/plain"
        ));
        assert!(content_type_matches(
            "application/json",
            "APPLICATION/JSON;x=1"
        ));
        assert!(!content_type_matches("text/plain", "text/html"));
        assert!(!content_type_matches("text/plain", "text/plainx"));
        assert!(!content_type_matches("", "text/plain"));
        assert!(content_type_matches("", " ; charset=x"));
    }
}
