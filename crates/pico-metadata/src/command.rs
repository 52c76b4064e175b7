//! The vocabulary of the metadata log: commands, their outcomes and deterministic rejections.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Stream configuration fixed at creation (compared by idempotent creates).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamConfig {
    pub content_type: std::sync::Arc<str>,
    pub ttl_secs: Option<u64>,
    pub expires_at_ms: Option<i64>,
}

/// A producer's last (epoch, seq) as seen by a commit or a close, and the offsets
/// `[start_offset, end_offset)` that append was given (equal, at the tail, for a close without
/// records): a retry of that same triple is answered with them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerMark {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
    pub start_offset: u64,
    pub end_offset: u64,
}

/// Where a fork came from: the source's name and incarnation, and the fork point the client
/// asked for (record offset plus sub-offset inside it). Compared by idempotent fork creates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    pub source: String,
    pub source_stream_id: u64,
    pub offset: u64,
    pub sub_offset: u64,
}

/// One stream's records inside an uploaded object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitRange {
    pub stream_id: u64,
    pub epoch: i64,
    pub start_offset: u64,
    pub end_offset: u64,
    /// Byte position of the range inside the object.
    pub position: u64,
    pub len: u64,
    /// Last state per producer in this range.
    pub producers: Vec<ProducerMark>,
    /// Last Durable Streams `Stream-Seq` accepted in this range.
    pub stream_seq: Option<String>,
}

/// Whether a create or fork came with records of its own, and whether it asked to close after
/// them. Such a create makes the stream open and then appends (and closes) in a second step; a
/// retry after a failure in between must finish that step, while the same name created any
/// other way must never take a later request's records or close (idempotent success ignores
/// the body; asking for another closed status is a conflict).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Initial {
    /// No records of its own.
    #[default]
    None,
    /// Records, stream left open.
    Records,
    /// Records, then closed.
    RecordsThenClose,
}

impl Initial {
    pub fn new(has_records: bool, close: bool) -> Initial {
        match (has_records, close) {
            (false, _) => Initial::None,
            (true, false) => Initial::Records,
            (true, true) => Initial::RecordsThenClose,
        }
    }
}

/// A state change. Time enters as a field (`now_ms`): `apply` never reads a clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Registers a node start. `node_epoch` must be higher than the registered one.
    RegisterNode {
        node_id: u32,
        node_epoch: u64,
        address: String,
        now_ms: i64,
    },
    /// Liveness: the node process at `node_epoch` is alive at its clock's `now_ms`. Requires
    /// `node_epoch` current, so a fenced or replaced process learns it from the rejection.
    Heartbeat {
        node_id: u32,
        node_epoch: u64,
        now_ms: i64,
    },
    /// Failover: the maintenance-lease holder `by_node_id`/`by_node_epoch` (current) fences node
    /// `node_id`'s process at `node_epoch`, whose heartbeat stopped at `last_heartbeat_ms`.
    /// Accepted only while both are still the node's registered epoch and last heartbeat (a
    /// compare-and-set on what the holder saw lapse: a heartbeat or a restart in between wins).
    /// Raises the registered epoch to `node_epoch + 1`, held by no process, and marks it fenced
    /// (`NodeInfo::fenced_epoch`): from then on that process's commits, opens, releases and
    /// heartbeats are rejected, and its streams may be committed to and released by failover.
    FenceNode {
        node_id: u32,
        node_epoch: u64,
        last_heartbeat_ms: i64,
        by_node_id: u32,
        by_node_epoch: u64,
    },
    /// Failover, after the fenced incarnation's WAL was committed: releases (owner = none)
    /// every stream owned by `node_id` at `node_epoch` or an earlier incarnation (the node's
    /// WAL holds theirs too, and failover committed it), which must be the node's fenced
    /// incarnation (a registration since then rejects it: the node's new process recovers its
    /// own WAL). The next open anywhere bumps each stream's epoch.
    ReleaseFenced {
        node_id: u32,
        node_epoch: u64,
        by_node_id: u32,
        by_node_epoch: u64,
    },
    /// Allocates an internal stream AND stores the registry entry, atomically (one command: no
    /// orphan ids). Idempotent: same name + same config (+ same closed status, counting the
    /// close `initial` asks for) -> existing; different -> Conflict. `closed` creates it closed
    /// (no records of its own); `initial` is stored so a retry can tell its own unfinished
    /// create from any other (see [`Initial`]).
    CreateStream {
        name: String,
        config: StreamConfig,
        closed: bool,
        initial: Initial,
        now_ms: i64,
    },
    /// Creates `name` as a fork of `origin.source`: a new internal stream whose committed slices
    /// below `inherit_end` are the source's (object references incremented, no data copied).
    /// The source must be live and committed up to `inherit_end`. Idempotent like
    /// `CreateStream`; the fork offset is compared only when `offset_given`. `closed` creates it
    /// closed at once (a fork that gets no records of its own; one that does is closed by its
    /// first append, so that the records land first).
    ForkStream {
        name: String,
        origin: ForkOrigin,
        inherit_end: u64,
        offset_given: bool,
        config: StreamConfig,
        closed: bool,
        initial: Initial,
        now_ms: i64,
    },
    /// Assigns the stream to a node and bumps its epoch (first open: -1 -> 0). Requires node_epoch
    /// current. The bump fences any previous owner: its commits at the old epoch are rejected.
    OpenStream {
        stream_id: u64,
        node_id: u32,
        node_epoch: u64,
    },
    /// Owner gives the stream up (flushed). Requires owner match and epoch == current.
    ReleaseStream {
        stream_id: u64,
        epoch: i64,
        node_id: u32,
        node_epoch: u64,
    },
    /// Client close (seal): no appends after `closed_at` (the tail offset). Idempotent.
    /// `producer` = the producer triple that closed it (for idempotent retries).
    SealStream {
        stream_id: u64,
        closed_at: u64,
        producer: Option<ProducerMark>,
        now_ms: i64,
    },
    /// Moves start_offset to max(current, given); drops slices wholly below it and releases their
    /// object refs (also for slices committed later that lie wholly below start_offset).
    Trim {
        stream_id: u64,
        start_offset: u64,
    },
    /// Removes the registry entry (name reusable at once), marks the stream deleted and releases
    /// its object references; objects with no live references become "destroyed". A stream
    /// that forks still reference is soft-deleted instead: its data is released but the name
    /// stays reserved until the last fork is gone (then removed, cascading up fork chains).
    DeleteStream {
        name: String,
        stream_id: u64,
    },
    /// Makes an uploaded object visible; see `State::apply` for the per-range acceptance rule.
    CommitObject {
        node_id: u32,
        node_epoch: u64,
        key: String,
        size: u64,
        ranges: Vec<CommitRange>,
        now_ms: i64,
    },
    /// GC finished deleting a destroyed object from storage; forget it.
    ForgetObject {
        key: String,
    },
    /// Sliding TTL bookkeeping: persist the last access time.
    Touch {
        stream_id: u64,
        now_ms: i64,
    },
    KvPut {
        key: String,
        value: Vec<u8>,
    },
    KvDelete {
        key: String,
    },
    /// Stores `value` under `key` unless the key holds another value (then Conflict): a value
    /// the first of several racing writers fixes for good, such as the cluster id.
    KvInit {
        key: String,
        value: Vec<u8>,
    },
    /// An operator asks for the stream to move to node `to_node` (docs/design/transfer.md).
    /// Records a pending [`crate::state::Transfer`] at the stream's current epoch and owner;
    /// the owner, tailing the log, drains and answers with `CompleteTransfer`. A stream nobody
    /// owns has nothing to drain: it is released for `to_node` at once. Rejected for a target
    /// that is not registered or already owns the stream, and while another transfer of the
    /// stream is under way.
    TransferStream {
        stream_id: u64,
        to_node: u32,
        now_ms: i64,
    },
    /// The owner flushed everything it acknowledged into committed objects and gives the stream
    /// up for `to_node`: `ReleaseStream` (same checks) plus the routing hint naming the target.
    /// Requires the pending transfer to `to_node` at `epoch`.
    CompleteTransfer {
        stream_id: u64,
        epoch: i64,
        node_id: u32,
        node_epoch: u64,
        to_node: u32,
        now_ms: i64,
    },
}

impl Command {
    /// Short name for logs and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Command::RegisterNode { .. } => "register_node",
            Command::CreateStream { .. } => "create_stream",
            Command::ForkStream { .. } => "fork_stream",
            Command::OpenStream { .. } => "open_stream",
            Command::ReleaseStream { .. } => "release_stream",
            Command::SealStream { .. } => "seal_stream",
            Command::Trim { .. } => "trim",
            Command::DeleteStream { .. } => "delete_stream",
            Command::CommitObject { .. } => "commit_object",
            Command::ForgetObject { .. } => "forget_object",
            Command::Touch { .. } => "touch",
            Command::KvPut { .. } => "kv_put",
            Command::KvDelete { .. } => "kv_delete",
            Command::KvInit { .. } => "kv_init",
            Command::Heartbeat { .. } => "heartbeat",
            Command::TransferStream { .. } => "transfer_stream",
            Command::CompleteTransfer { .. } => "complete_transfer",
            Command::FenceNode { .. } => "fence_node",
            Command::ReleaseFenced { .. } => "release_fenced",
        }
    }
}

/// What an accepted command did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// `replaced_unfenced`: the epoch of the incarnation this registration replaced, when
    /// failover had not fenced it: that process may still run (paused or cut off) and
    /// acknowledge writes until its window closes (docs/design/failover.md).
    NodeRegistered {
        replaced_unfenced: Option<u64>,
    },
    /// A heartbeat was recorded.
    HeartbeatRecorded,
    /// `created == false`: the stream existed with the same config.
    Created {
        stream_id: u64,
        created: bool,
    },
    Opened {
        epoch: i64,
        start_offset: u64,
        end_offset: u64,
    },
    Released,
    /// A node incarnation was fenced (`FenceNode`).
    NodeFenced,
    /// `ReleaseFenced` released this many streams.
    ReleasedFenced {
        streams: u64,
    },
    Sealed {
        closed_at: u64,
    },
    Trimmed {
        start_offset: u64,
    },
    Deleted,
    /// The stream is referenced by forks: data released, name reserved (see `DeleteStream`).
    SoftDeleted,
    /// One flag per range, in order.
    Committed {
        accepted: Vec<bool>,
    },
    Forgotten,
    Touched,
    KvDone,
    /// A transfer was recorded; `released` when the stream had no owner to drain (the hint
    /// already names the target).
    TransferRequested {
        from: Option<crate::state::Owner>,
        epoch: i64,
        released: bool,
    },
}

/// Deterministic rejections: the state is unchanged (except `applied_index`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ApplyError {
    #[error("stream not found: stream_id={stream_id}")]
    StreamNotFound { stream_id: u64 },
    #[error("stream name not found: name=`{name}`")]
    NameNotFound { name: String },
    #[error("stream exists with another config: name=`{name}` reason={reason}")]
    Conflict { name: String, reason: String },
    #[error(
        "stale node epoch (a newer process of this node exists): node_id={node_id} given={given} current={current}"
    )]
    StaleNodeEpoch {
        node_id: u32,
        given: u64,
        current: u64,
    },
    #[error("node not registered: node_id={node_id}")]
    UnknownNode { node_id: u32 },
    #[error(
        "stale stream epoch (the stream was reopened): stream_id={stream_id} given={given} current={current}"
    )]
    StaleStreamEpoch {
        stream_id: u64,
        given: i64,
        current: i64,
    },
    #[error("node does not own the stream: stream_id={stream_id}")]
    NotOwner { stream_id: u64 },
    /// Another node's process owns the stream: its acknowledged tail may live only in that
    /// node's WAL, so an open here (an epoch bump) would fence it. The owner releases it, a
    /// transfer hands it over, or failover releases it after committing the owner's WAL.
    #[error("stream is owned by another node: stream_id={stream_id} owner={owner_node_id}")]
    OwnedElsewhere { stream_id: u64, owner_node_id: u32 },
    #[error("stream deleted: stream_id={stream_id}")]
    StreamDeleted { stream_id: u64 },
    #[error("invalid command: {0}")]
    Invalid(String),
}

impl ApplyError {
    /// The prescriptive kind callers map to their wire.
    pub fn kind(&self) -> pico_common::ErrorKind {
        use pico_common::ErrorKind;
        match self {
            ApplyError::StreamNotFound { .. }
            | ApplyError::NameNotFound { .. }
            | ApplyError::StreamDeleted { .. } => ErrorKind::NotFound,
            ApplyError::Conflict { .. } => ErrorKind::Conflict,
            ApplyError::StaleNodeEpoch { .. }
            | ApplyError::UnknownNode { .. }
            | ApplyError::StaleStreamEpoch { .. }
            | ApplyError::NotOwner { .. } => ErrorKind::Fenced,
            ApplyError::OwnedElsewhere { .. } => {
                ErrorKind::Unavailable(Some(std::time::Duration::from_secs(1)))
            }
            ApplyError::Invalid(_) => ErrorKind::BadRequest,
        }
    }
}
