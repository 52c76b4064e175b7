//! The request and response types of the stream service. Wire facades (HTTP, Kafka) translate
//! their protocol into these and back; nothing here knows about a wire.

use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::Record;

/// Configuration a stream is created with. Two creates are "the same" iff these are equal
/// (after content-type normalization) and their closed flags match.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CreateConfig {
    /// Content type; `None` means application/octet-stream.
    pub content_type: Option<String>,
    /// Sliding idle TTL in seconds.
    pub ttl_secs: Option<u64>,
    /// Absolute expiry (ms since epoch).
    pub expires_at_ms: Option<i64>,
    /// Create the stream already closed (after the initial records).
    pub closed: bool,
}

#[derive(Debug, Clone)]
pub struct CreateRequest {
    pub name: StreamName,
    pub config: CreateConfig,
    /// Initial records appended atomically with creation (DS PUT with a body).
    pub initial: Vec<Record>,
}

#[derive(Debug, Clone)]
pub struct CreateOutcome {
    /// false = the stream already existed with the same config (idempotent create).
    pub created: bool,
    pub info: StreamInfo,
}

/// An idempotent producer's claim on an append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerClaim {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

#[derive(Debug, Clone)]
pub struct AppendRequest {
    pub name: StreamName,
    pub records: Vec<Record>,
    pub producer: Option<ProducerClaim>,
    /// Append only if the stream's next offset equals this.
    pub match_seq: Option<u64>,
    /// Close the stream after these records (an empty `records` = close only).
    pub close: bool,
    /// If set, must match the stream's content type (case-insensitive, parameters ignored).
    pub content_type: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendOutcome {
    /// Offset of the first record of this append (= next_seq when it had none). A duplicate
    /// answers the original append's; `None` when that is no longer known (a duplicate of a
    /// producer seq older than its last).
    pub start_seq: Option<u64>,
    /// The stream's next offset after this append (a duplicate: after the original; when its
    /// offsets are unknown, the stream's tail).
    pub next_seq: u64,
    /// The producer triple was already applied: nothing was written.
    pub duplicate: bool,
    /// The stream is closed after this request.
    pub closed: bool,
    /// Echo for producer appends: (epoch, highest accepted seq).
    pub producer: Option<(u64, u64)>,
    /// Append timestamp (ms) given to the records.
    pub timestamp_ms: i64,
}

/// Per-append options beyond [`AppendRequest`] (kept apart so existing callers need no change).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppendOptions {
    /// Durable Streams `Stream-Seq`: must be byte-wise greater than the stream's last one.
    /// Scoped per stream; persisted with the data; forks start without one.
    pub stream_seq: Option<String>,
}

/// Create `name` as a fork of `source` (Durable Streams `Stream-Forked-From`).
#[derive(Debug, Clone)]
pub struct ForkRequest {
    pub name: StreamName,
    pub source: StreamName,
    /// The fork point (record offset); `None` = the source's tail.
    pub offset: Option<u64>,
    /// Inside the record at `offset`: bytes for byte streams, messages (records) for JSON.
    pub sub_offset: u64,
    /// Content type (must match the source's when given), TTL/expiry (inherited from the source
    /// when neither is given) and create-closed.
    pub config: CreateConfig,
    /// Records appended after the inherited data (DS PUT body).
    pub initial: Vec<Record>,
}

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadFrom {
    Offset(u64),
    /// The current tail: returns no records.
    Now,
}

#[derive(Debug, Clone)]
pub struct ReadRequest {
    pub name: StreamName,
    pub from: ReadFrom,
    /// At most this many records (None = server default).
    pub max_records: Option<usize>,
    /// Stop after about this many body bytes (None = server chunk size).
    pub max_bytes: Option<usize>,
    /// Whether this read slides the stream's TTL (HEAD-like peeks pass false).
    pub touch: bool,
}

#[derive(Debug, Clone)]
pub struct ReadRecord {
    pub offset: u64,
    pub record: Record,
}

#[derive(Debug, Clone)]
pub struct ReadOutcome {
    pub records: Vec<ReadRecord>,
    /// Where the next read continues.
    pub next_seq: u64,
    /// The stream's tail (next offset to be written) when the read was served.
    pub tail: u64,
    /// The response holds everything available at the time.
    pub up_to_date: bool,
    /// The stream is closed and this read reached its final offset.
    pub closed: bool,
    pub info: StreamInfo,
}

/// What a long-poll wait ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The tail moved past the awaited offset.
    Data,
    /// The stream was closed (and the reader is at its end).
    Closed,
    Timeout,
}

/// A stream's content type and whether it is closed ([`crate::Node::framing`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framing {
    pub content_type: std::sync::Arc<str>,
    pub closed: bool,
}

/// A stream's metadata as clients see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    pub name: StreamName,
    pub stream_id: u64,
    pub content_type: String,
    /// First readable offset (trim watermark).
    pub start_seq: u64,
    /// Next offset to be written.
    pub next_seq: u64,
    pub closed: bool,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
    pub created_at_ms: i64,
    /// Internal stream epoch (-1 = never opened).
    pub epoch: i64,
}

#[derive(Debug, Clone)]
pub struct ListRequest {
    pub prefix: Option<String>,
    pub start_after: Option<String>,
    pub limit: usize,
}

#[derive(Debug, Clone)]
pub struct ListOutcome {
    pub streams: Vec<StreamInfo>,
    pub has_more: bool,
}

/// Readiness for the admin listener's `/ready`.
#[derive(Debug, Clone)]
pub struct ReadyInfo {
    pub ready: bool,
    pub serving: bool,
    pub registered: bool,
    /// A heartbeat of this process was accepted by the log less than the liveness timeout ago.
    pub live: bool,
    /// Why the metadata log stopped for good (a corrupt row, a failed committer): no write can
    /// succeed until the node restarts, so it is not ready. `None` while it runs.
    pub metadata_stopped: Option<String>,
    /// Why the metadata store does not answer (its last round-trip failed), while it does
    /// not: writes fail until it is back, so the node is not ready. `None` when it answers.
    pub metadata_unreachable: Option<String>,
    pub applied_index: u64,
    pub node_id: u32,
    /// This process's node epoch (higher at every start).
    pub node_epoch: u64,
    /// Whether this process holds the maintenance lease.
    pub maintenance_lease: bool,
}

/// Appends and records carry raw bytes; this alias documents intent in signatures.
pub type Body = Bytes;
