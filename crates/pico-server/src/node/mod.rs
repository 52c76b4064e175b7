//! The node: the stream service every facade calls. Routing questions and committed state come
//! from the metadata view (never SQL); record data goes through the engine. One file per
//! operation, each an `impl Node` block:
//! - `create`: creating streams, and the records a create carries.
//! - `append`: validate → decide → submit to the engine → finish; `decide` is the pure decision
//!   over the writer's state (closed, content type, producer, `Stream-Seq`, match).
//! - `read`: catch-up reads, long-poll waits, heads.
//! - `fork`: a new stream that starts as a prefix of another.
//! - `remove`: delete, trim, removal of expired streams.
//! - `registry`: name resolution through the view, listing, TTL and expiry, stream info.
//! - `ownership`: lazy open on this node; where a stream owned elsewhere lives.
//! - `kv`: facade state in the metadata KV (Kafka committed offsets).
//! - `transfer`: live transfer of a stream to another node (drain, release, open there).
//! - `release`: on shutdown, every stream this node owns flushed and released to the cluster.
//!
//! This file holds the node itself: start, shutdown, readiness, events and proposals.

mod append;
mod create;
mod decide;
mod fork;
mod kv;
mod ownership;
mod raw;
mod read;
mod registry;
mod release;
mod remove;
mod transfer;

pub use append::Admitted;
pub use kv::KvError;
pub use ownership::{ClusterNode, Route};
pub use raw::RawRead;
pub use registry::Lookup;
pub use release::{ReleaseReport, SHUTDOWN_RELEASE};
pub use transfer::{
    DRAIN_TIMEOUT, HANDOFF_HOLD, HINT_TTL, StreamPlacement, TransferAccepted, TransferError,
};

use crate::api::*;
use crate::catalog::MetaCatalog;
use crate::config::NodeConfig;
use crate::error::*;
use crate::open::OpenTable;
use crate::ttl::Touches;
use crate::waiters::Waiters;
use pico_common::StreamName;
use pico_metadata::{ApplyError, Command, Outcome, RegistryEntry, StreamMeta};
use pico_protocol::headers::{content_type_matches, is_json, normalize_content_type};
use pico_protocol::{Record, check_storable};
use pico_sql::MetaLog;
use s3stream::{Engine, EngineConfig, EngineError, ObjectStorage, Wal};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use thiserror::Error;

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
    /// Live fan-out hubs of the streams somebody follows (`live::hub`).
    pub(crate) hubs: Arc<crate::live::hub::Hubs>,
    pub(crate) touches: Touches,
    pub(crate) serving: AtomicBool,
    pub(crate) registered: AtomicBool,
    /// This process's accepted heartbeats (readiness, fencing).
    pub(crate) heartbeat: crate::maintenance::OwnHeartbeat,
    /// Whether this process holds the maintenance lease.
    pub(crate) lease: crate::maintenance::LeaseState,
    /// Other nodes' heartbeats as seen here (routing, failover).
    pub(crate) liveness: std::sync::Mutex<crate::maintenance::LivenessWatch>,
    /// Set once a heartbeat was rejected because failover fenced this process
    /// ([`Node::fenced_by_failover`]).
    pub(crate) fenced_by_failover: tokio::sync::watch::Sender<bool>,
    pub(crate) tasks: std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>,
    pub(crate) events: crate::subscriptions::StreamEvents,
    /// Expired streams whose background removal is in flight.
    pub(crate) removing: Arc<std::sync::Mutex<HashSet<u64>>>,
    /// Live transfers this process takes part in (`transfer`).
    pub(crate) transfers: transfer::Transfers,
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
    Meta(#[source] pico_sql::MetaError),
    #[error("node registration rejected: {0}")]
    Register(String),
    #[error("engine recovery failed: {0}")]
    Engine(#[source] EngineError),
}

impl StartError {
    /// Whether a later start may succeed where this one failed: a store that did not answer
    /// (the metadata log, the WAL's database or bucket, the data bucket). Damaged or fenced
    /// state and a refused registration are not: waiting cannot fix them.
    pub fn is_transient(&self) -> bool {
        use s3stream::{StorageError, WalError};
        match self {
            StartError::Meta(e) => matches!(e.kind(), pico_common::ErrorKind::Unavailable(_)),
            StartError::Register(_) => false,
            StartError::Engine(e) => match e {
                // An object recovery needs is missing: no wait brings it back.
                EngineError::Storage(StorageError::NotFound { .. })
                | EngineError::Wal(WalError::Storage(StorageError::NotFound { .. })) => false,
                // Object storage, the metadata log behind the catalog, an upload or a WAL
                // write that failed: all an outage of a store.
                EngineError::Storage(_)
                | EngineError::Upload(_)
                | EngineError::NoRoom(_)
                | EngineError::Durability(_)
                | EngineError::Catalog(_)
                | EngineError::Wal(WalError::Storage(_) | WalError::Other(_)) => true,
                EngineError::Wal(
                    WalError::Corrupt { .. }
                    | WalError::PositionMismatch { .. }
                    | WalError::Lost { .. }
                    | WalError::Fenced(_),
                )
                | EngineError::WalFenced(_)
                | EngineError::Corrupt { .. }
                | EngineError::InvalidRequest(_)
                | EngineError::NotOpen { .. }
                | EngineError::StaleEpoch { .. }
                | EngineError::Broken { .. }
                | EngineError::ShuttingDown => false,
            },
        }
    }
}

/// A stream resolved from the view: its registry entry and internal state.
pub(crate) struct Resolved {
    name: StreamName,
    /// Shared with the metadata view: resolving a name copies two pointers, not the entries.
    entry: Arc<RegistryEntry>,
    meta: Arc<StreamMeta>,
}

/// Whether an incarnation of `node_id` older than `node_epoch` owns a stream in the view. One
/// that owns none (a graceful shutdown released them) has nothing it could still acknowledge:
/// opening a stream takes a proposal at its epoch, refused since a newer one registered. Not
/// only the incarnation this registration replaced: one that registered beside a running
/// process and never finished its own wait (killed while waiting, or its start retried after
/// a lost answer) leaves that process's streams owned at the older epoch.
fn earlier_owns_streams(meta: &MetaLog, node_id: u32, node_epoch: u64) -> bool {
    meta.view().streams.values().any(|m| {
        m.owner
            .is_some_and(|o| o.node_id == node_id && o.node_epoch < node_epoch)
    })
}

/// Waits until every earlier process of this node id can no longer acknowledge a write,
/// heartbeating meanwhile; returns the start of the last heartbeat, accepted at the end.
///
/// Such a process may still run (paused, or cut off from the metadata log), and an object WAL
/// cannot refuse its writes. What bounds it is its acknowledgement window: it acknowledges
/// only within `ack_window` after the start of its last accepted heartbeat, and every
/// heartbeat of it applied after this registration is rejected. So once `liveness_timeout`
/// (the window plus the fencer's margin for clock rates) has passed here since the
/// registration was applied, every write it acknowledged is in the WAL, and the recovery that
/// follows lists it (docs/design/failover.md, "Two processes with one node id"). The
/// heartbeats keep this process from looking lapsed to failover while it waits; one that fails
/// meanwhile is only logged, the last one must be accepted.
async fn wait_out_earlier(
    config: &NodeConfig,
    meta: &MetaLog,
    replaced: u64,
) -> Result<i64, StartError> {
    let clock = &config.clock;
    let until = clock
        .now_ms()
        .saturating_add(i64::try_from(config.liveness_timeout.as_millis()).unwrap_or(i64::MAX));
    tracing::info!(
        replaced_epoch = replaced,
        wait_ms = config.liveness_timeout.as_millis() as u64,
        "an earlier process of this node id may still be running and acknowledging writes to \
         the shared WAL: waiting out its acknowledgement window before reading the WAL"
    );
    loop {
        let left = until.saturating_sub(clock.now_ms()).max(0);
        let step = config
            .heartbeat_every
            .min(Duration::from_millis(u64::try_from(left).unwrap_or(0)));
        clock.sleep(step).await;
        let now_ms = clock.now_ms();
        let beat = meta
            .propose(Command::Heartbeat {
                node_id: config.node_id,
                node_epoch: config.node_epoch,
                now_ms,
            })
            .await;
        if now_ms >= until {
            beat.map_err(StartError::Meta)?
                .map_err(|e| StartError::Register(e.to_string()))?;
            return Ok(now_ms);
        }
        match beat {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "heartbeat rejected while waiting to read the WAL")
            }
            Err(e) => tracing::warn!(error = %e, "heartbeat failed while waiting to read the WAL"),
        }
    }
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
        let mut registered_at_ms = config.clock.now_ms();
        let registered = meta
            .propose(Command::RegisterNode {
                node_id: config.node_id,
                node_epoch: config.node_epoch,
                address: config.advertised_url.clone(),
                now_ms: registered_at_ms,
            })
            .await
            .map_err(StartError::Meta)?
            .map_err(|e| StartError::Register(e.to_string()))?;
        if let Outcome::NodeRegistered {
            replaced_unfenced: Some(previous),
        } = registered
            && config.peer_wals.is_some()
            && !wal.fences_earlier_writers()
            && earlier_owns_streams(&meta, config.node_id, config.node_epoch)
        {
            registered_at_ms = wait_out_earlier(&config, &meta, previous).await?;
        }

        engine_config.node_id = config.node_id;
        engine_config.node_epoch = config.node_epoch;
        let waiters = Arc::new(Waiters::default());
        let hook_waiters = waiters.clone();
        let catalog = Arc::new(MetaCatalog {
            meta: meta.clone(),
            node_id: config.node_id,
            node_epoch: config.node_epoch,
            clock: config.clock.clone(),
        });
        let (engine, report) = Engine::start(
            engine_config,
            data.clone(),
            wal,
            catalog,
            Arc::new(move |stream, end| hook_waiters.notify_tail(stream, end)),
        )
        .await
        .map_err(StartError::Engine)?;
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
                hubs: Arc::default(),
                touches: Touches::default(),
                serving: AtomicBool::new(true),
                registered: AtomicBool::new(true),
                heartbeat: crate::maintenance::OwnHeartbeat::new(registered_at_ms),
                lease: crate::maintenance::LeaseState::default(),
                liveness: Default::default(),
                fenced_by_failover: tokio::sync::watch::Sender::new(false),
                tasks: std::sync::Mutex::new(Vec::new()),
                events: crate::subscriptions::StreamEvents::new(EVENT_CAPACITY),
                removing: Arc::default(),
                transfers: Default::default(),
            }),
        };
        // Before the loops start, so their first passes (orphans right after a restart) already
        // run if this node is the holder.
        crate::maintenance::lease_pass(node.clone()).await;
        crate::maintenance::spawn_all(&node);
        let transfers = transfer::spawn(&node);
        node.inner
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(transfers);
        Ok(node)
    }

    pub fn config(&self) -> &NodeConfig {
        &self.inner.config
    }

    /// Whether the node still takes requests (false once shutdown began).
    pub fn is_serving(&self) -> bool {
        self.inner.serving.load(Ordering::Relaxed)
    }

    /// Whether this process holds the maintenance lease now (on its clock).
    pub fn holds_maintenance_lease(&self) -> bool {
        self.inner.lease.held(self.now_ms())
    }

    /// The registry of live fan-out hubs ([`Node::follow`]).
    pub fn hubs(&self) -> &Arc<crate::live::hub::Hubs> {
        &self.inner.hubs
    }

    /// Wall time from the node's clock (`NodeConfig::clock`).
    pub fn now_ms(&self) -> i64 {
        self.inner.config.clock.now_ms()
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

    /// Ready = serving, registered at this process's epoch (never fenced), the metadata log
    /// running, and a heartbeat accepted less than `liveness_timeout` ago: proposals are
    /// read-your-writes, so that also says the node applied the log up to it (caught up).
    pub fn ready(&self) -> ReadyInfo {
        let serving = self.inner.serving.load(Ordering::Relaxed);
        let registered = self.inner.registered.load(Ordering::Relaxed);
        let metadata_stopped = self.inner.meta.health().err().map(|e| e.to_string());
        let cfg = &self.inner.config;
        let live = self
            .inner
            .heartbeat
            .fresh(cfg.clock.now_ms(), cfg.liveness_timeout);
        let reach = self.inner.meta.reachability();
        let metadata_unreachable = (!reach.reachable).then(|| {
            reach
                .last_error
                .unwrap_or_else(|| "metadata store unreachable".into())
        });
        ReadyInfo {
            ready: serving
                && registered
                && live
                && metadata_stopped.is_none()
                && metadata_unreachable.is_none(),
            serving,
            registered,
            live,
            metadata_stopped,
            metadata_unreachable,
            applied_index: self.inner.meta.applied_index(),
            node_id: self.inner.config.node_id,
            node_epoch: self.inner.config.node_epoch,
            maintenance_lease: self.holds_maintenance_lease(),
        }
    }

    /// Resolves once failover fenced this process (its heartbeat lapsed, another node took its
    /// streams over): it acknowledges and commits nothing from then on. The host rejoins by
    /// [`Node::abandon`]ing it and starting a new incarnation (a higher epoch).
    pub async fn fenced_by_failover(&self) {
        let mut rx = self.inner.fenced_by_failover.subscribe();
        let _ = rx.wait_for(|f| *f).await;
    }

    /// Stops a fenced process without flushing anything: its streams belong to other nodes
    /// now, and whatever it holds that failover did not commit was never acknowledged. Stops
    /// the background tasks and the engine (as a crash would). The metadata log stays open:
    /// the host starts the next incarnation on it.
    pub async fn abandon(&self) {
        self.inner.serving.store(false, Ordering::Relaxed);
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            t.abort();
        }
        self.inner.lease.clear();
        self.inner.engine.abort();
    }

    /// Stops serving, releases the streams it owns ([`Node::release_streams`], bounded by
    /// [`SHUTDOWN_RELEASE`], unless the host released them already), flushes whatever is left
    /// into committed objects, stops background tasks.
    pub async fn shutdown(&self) {
        // Before the loops stop: heartbeats keep this node live meanwhile, so nobody fails it
        // over while it releases.
        if self.is_serving() {
            self.release_streams(SHUTDOWN_RELEASE).await;
        }
        // Maintenance first, so no idle release races the final flush. Writers are not locked:
        // an append stuck waiting for queue space would hold up shutdown, and the engine rejects
        // new appends once it is shutting down.
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for t in tasks {
            t.abort();
        }
        crate::maintenance::release_lease(self).await;
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

/// Longest a duplicate or close waits for earlier appends to become durable.
const DURABLE_WAIT: Duration = Duration::from_secs(60);

fn engine_append_error(e: EngineError) -> AppendError {
    match e {
        EngineError::ShuttingDown => AppendError::Unavailable("node is shutting down".into()),
        EngineError::NoRoom(e) => AppendError::Unavailable(format!(
            "storage is not keeping up: no room to queue the append ({e}); nothing was written, \
             retry later"
        )),
        other => AppendError::Unavailable(format!("stream must be reopened: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::Record;
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
        node.append(append_req(&name, "x")).await.unwrap();
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

    /// An append of one record holding `body` (the node's tests share it).
    pub(crate) fn append_req(name: &StreamName, body: &'static str) -> AppendRequest {
        AppendRequest {
            name: name.clone(),
            records: vec![Record {
                timestamp_ms: 0,
                key: None,
                value: bytes::Bytes::from_static(body.as_bytes()),
                headers: vec![],
            }],
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        }
    }

    /// A request's look at the view is used only while the view has not moved: an append that
    /// routed before its stream was deleted and created again lands in the new stream, as a
    /// fresh lookup would send it, not in the one its lookup saw.
    #[tokio::test]
    async fn a_lookup_from_an_older_view_is_read_again() {
        let node = start_test_node().await;
        let name = StreamName::parse("l").unwrap();
        let create = || {
            node.create(CreateRequest {
                name: name.clone(),
                config: Default::default(),
                initial: vec![],
            })
        };
        create().await.unwrap();
        let old_id = node.head(&name).await.unwrap().stream_id;
        let (route, seen) = node.route_request(&name, true).await;
        assert_eq!(route, super::Route::Local);
        node.delete(&name).await.unwrap();
        create().await.unwrap();
        let new_id = node.head(&name).await.unwrap().stream_id;
        assert_ne!(old_id, new_id);
        let out = node
            .append_seen(append_req(&name, "x"), Default::default(), seen)
            .await
            .expect("the append reads the view again and finds the new stream");
        assert_eq!(out.next_seq, 1);
        assert_eq!(node.head(&name).await.unwrap().next_seq, 1);
        // Unmoved, the lookup is used as it is.
        let (_, seen) = node.route_request(&name, true).await;
        let out = node
            .append_seen(append_req(&name, "x"), Default::default(), seen)
            .await
            .unwrap();
        assert_eq!(out.next_seq, 2);
    }
}
