//! Live transfer: moving a stream to another node without node-to-node RPC, through the
//! metadata log (docs/design/transfer.md).
//!
//! 1. An operator's request (`request_transfer`, any node) commits `TransferStream`: a pending
//!    transfer at the stream's current owner and epoch.
//! 2. The owner, tailing the log ([`transfer_pass`]), gates the stream: requests that would
//!    write wait at the routing door ([`Node::hold_for_handoff`]), opens are refused. It breaks
//!    the open writer (appends that get past it are refused before anything is written),
//!    flushes what it acknowledged into committed objects, and commits `CompleteTransfer`:
//!    owner none, hint naming the target.
//! 3. Routing sends the stream's requests to the target while the hint is fresh
//!    (`Node::owner_url`); the target, seeing the release, opens the stream at once (next
//!    stream epoch) with the committed producer state, so offsets and idempotent producers
//!    carry on.
//!
//! Safety never rests on the hint: once released, every acknowledged record is committed, so a
//! request opening the stream anywhere finds it whole. The hint only steers, and expires.

use super::*;
use pico_common::ErrorKind;
use pico_metadata::{Owner, Transfer};
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a released stream's hint steers requests to its target (on the observer's clock,
/// against the source's release time). Past it the stream is simply unowned: served, and
/// opened, wherever a request lands. Covers a target that died before opening it.
pub const HINT_TTL: Duration = Duration::from_secs(10);
/// Longest a request that would write waits at the door of a stream being handed off before
/// it goes on (and is refused with 503 if the handoff still runs).
pub const HANDOFF_HOLD: Duration = Duration::from_secs(5);
/// Longest the source tries to drain a stream; past it the transfer is given up (the stream
/// reopens on the source at its next request, which ends the pending transfer).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Transfer state of one node process.
#[derive(Default)]
pub(crate) struct Transfers {
    /// Streams this node is handing off: `true` once the handoff ended (either way).
    gates: Mutex<HashMap<u64, watch::Sender<bool>>>,
    /// Streams with a drain or a proactive open in flight, so each starts once.
    busy: Arc<Mutex<HashSet<u64>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A stream's place in [`Transfers::busy`], released on drop (even if the task panics).
struct BusyClaim {
    set: Arc<Mutex<HashSet<u64>>>,
    stream_id: u64,
}

impl BusyClaim {
    fn take(set: &Arc<Mutex<HashSet<u64>>>, stream_id: u64) -> Option<BusyClaim> {
        lock(set).insert(stream_id).then(|| BusyClaim {
            set: set.clone(),
            stream_id,
        })
    }
}

impl Drop for BusyClaim {
    fn drop(&mut self) {
        lock(&self.set).remove(&self.stream_id);
    }
}

/// A gate raised by a drain, lowered (and its waiters woken) on drop.
struct Gate<'a> {
    transfers: &'a Transfers,
    stream_id: u64,
}

impl Drop for Gate<'_> {
    fn drop(&mut self) {
        if let Some(tx) = lock(&self.transfers.gates).remove(&self.stream_id) {
            tx.send_replace(true);
        }
    }
}

/// Why a transfer request was refused.
#[derive(Debug, Error)]
pub enum TransferError {
    #[error("stream not found: name=`{0}`")]
    NotFound(String),
    #[error("node not registered: node_id={0}")]
    UnknownNode(u32),
    #[error(
        "target node is not live (its heartbeat did not change for {timeout_secs}s): node_id={node_id}"
    )]
    NotLive { node_id: u32, timeout_secs: u64 },
    #[error("cannot transfer: name=`{name}` {reason}")]
    Conflict { name: String, reason: String },
    #[error("metadata log unavailable: {0}")]
    Unavailable(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl crate::error::ServiceError for TransferError {
    fn kind(&self) -> ErrorKind {
        match self {
            TransferError::NotFound(_) | TransferError::UnknownNode(_) => ErrorKind::NotFound,
            TransferError::NotLive { .. } | TransferError::Conflict { .. } => ErrorKind::Conflict,
            TransferError::Unavailable(_) => ErrorKind::Unavailable(None),
            TransferError::Internal(_) => ErrorKind::Internal,
        }
    }
}

/// A transfer the log accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferAccepted {
    pub stream_id: u64,
    /// The owner that drains it (`None`: nobody owned it; released for the target at once).
    pub from_node: Option<u32>,
    pub to_node: u32,
    /// The stream epoch it leaves; the target opens at a higher one.
    pub epoch: i64,
}

/// Where a stream lives, from the view (the admin API's stream page; never opens anything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamPlacement {
    pub stream_id: u64,
    pub epoch: i64,
    pub owner: Option<Owner>,
    /// End of committed data.
    pub committed_end: u64,
    pub closed: bool,
    pub transfer: Option<Transfer>,
}

impl Node {
    /// Asks for stream `name` to move to node `to_node` (returns once the request is in the
    /// log; the handoff itself runs on the owner and the target).
    pub async fn request_transfer(
        &self,
        name: &StreamName,
        to_node: u32,
    ) -> Result<TransferAccepted, TransferError> {
        let view = self.inner.meta.view();
        let (_, meta) = view
            .stream_by_name(name.as_str())
            .ok_or_else(|| TransferError::NotFound(name.to_string()))?;
        let stream_id = meta.id;
        if !view.nodes.contains_key(&to_node) {
            return Err(TransferError::UnknownNode(to_node));
        }
        let cfg = &self.inner.config;
        let target_epoch = view.nodes.get(&to_node).map_or(0, |n| n.epoch);
        let lapsed = self
            .inner
            .liveness
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_lapsed(to_node, target_epoch);
        if to_node != cfg.node_id && lapsed {
            return Err(TransferError::NotLive {
                node_id: to_node,
                timeout_secs: cfg.liveness_timeout.as_secs(),
            });
        }
        let outcome = self
            .propose(Command::TransferStream {
                stream_id,
                to_node,
                now_ms: self.now_ms(),
            })
            .await
            .map_err(TransferError::Unavailable)?;
        match outcome {
            Ok(Outcome::TransferRequested { from, epoch, .. }) => {
                tracing::info!(stream = %name, stream_id, to_node, from = ?from, epoch, "transfer requested");
                Ok(TransferAccepted {
                    stream_id,
                    from_node: from.map(|o| o.node_id),
                    to_node,
                    epoch,
                })
            }
            Ok(other) => Err(TransferError::Internal(format!(
                "unexpected outcome {other:?}"
            ))),
            Err(ApplyError::StreamNotFound { .. } | ApplyError::StreamDeleted { .. }) => {
                Err(TransferError::NotFound(name.to_string()))
            }
            Err(ApplyError::UnknownNode { node_id }) => Err(TransferError::UnknownNode(node_id)),
            Err(ApplyError::Conflict { reason, .. }) => Err(TransferError::Conflict {
                name: name.to_string(),
                reason,
            }),
            Err(e) => Err(TransferError::Internal(e.to_string())),
        }
    }

    /// Where stream `name` lives, from the view.
    pub fn placement(&self, name: &StreamName) -> Option<StreamPlacement> {
        let view = self.inner.meta.view();
        let (entry, meta) = view.stream_by_name(name.as_str())?;
        Some(StreamPlacement {
            stream_id: meta.id,
            epoch: meta.epoch,
            owner: meta.owner,
            committed_end: meta.end_offset,
            closed: entry.closed,
            transfer: view.transfers.get(&meta.id).copied(),
        })
    }

    /// Waits (at most [`HANDOFF_HOLD`]) while this node hands stream `name` off, so a write
    /// arriving meanwhile is redirected to the target afterwards instead of refused.
    pub async fn hold_for_handoff(&self, name: &StreamName) {
        let Some(stream_id) = self
            .inner
            .meta
            .view()
            .registry
            .get(name.as_str())
            .map(|e| e.stream_id)
        else {
            return;
        };
        self.hold_for_stream(stream_id).await;
    }

    /// [`Node::hold_for_handoff`] by stream id; `true` if a handoff was under way (the caller
    /// looks at the view again: the stream may have been released meanwhile).
    pub(crate) async fn hold_for_stream(&self, stream_id: u64) -> bool {
        let rx = lock(&self.inner.transfers.gates)
            .get(&stream_id)
            .map(|tx| tx.subscribe());
        let Some(mut rx) = rx else {
            return false;
        };
        let _ = tokio::time::timeout(HANDOFF_HOLD, rx.wait_for(|done| *done)).await;
        true
    }

    /// Whether this node is handing the stream off (it must not open it meanwhile).
    pub(crate) fn handing_off(&self, stream_id: u64) -> bool {
        lock(&self.inner.transfers.gates).contains_key(&stream_id)
    }

    /// The node a released stream is steered to while its hint is fresh.
    pub(crate) fn handoff_target(
        &self,
        view: &pico_metadata::State,
        stream_id: u64,
    ) -> Option<u32> {
        let t = view.transfers.get(&stream_id)?;
        let released = t.released_ms?;
        let age = self.now_ms().saturating_sub(released);
        (age < HINT_TTL.as_millis() as i64).then_some(t.to_node)
    }

    /// The source's half: gate, break the writer, flush, release for the target.
    async fn drain(&self, stream_id: u64, t: Transfer) {
        let transfers = &self.inner.transfers;
        let (tx, _) = watch::channel(false);
        lock(&transfers.gates).insert(stream_id, tx);
        let _gate = Gate {
            transfers,
            stream_id,
        };
        let started = tokio::time::Instant::now();
        match self.drain_and_release(stream_id, t).await {
            Ok(()) => {
                tracing::info!(
                    stream_id,
                    to_node = t.to_node,
                    epoch = t.epoch,
                    drain_ms = started.elapsed().as_millis() as u64,
                    "transfer: stream released for its target"
                );
                // Long-polls parked here answer now (as on timeout) and come back redirected.
                self.inner.waiters.release(stream_id);
            }
            Err(e) => tracing::warn!(
                stream_id,
                to_node = t.to_node,
                error = %e,
                "transfer given up: the stream stays here and reopens at its next request"
            ),
        }
    }

    async fn drain_and_release(&self, stream_id: u64, t: Transfer) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT;
        // Appends that got the writer before this are submitted and finish normally; any later
        // one finds it broken and is refused before anything is written.
        if let Some(open) = self.inner.open.get(stream_id) {
            let mut w = tokio::time::timeout_at(deadline, open.writer.lock())
                .await
                .map_err(|_| "the stream's writer stayed busy".to_string())?;
            w.broken = true;
            drop(w);
            self.inner.open.remove_open(&open);
            open.producers_moved.notify_waiters();
        }
        let engine = &self.inner.engine;
        // Everything submitted at this epoch must be in committed objects before the release:
        // the target's open fences this epoch.
        while engine.is_open(stream_id) == Some(t.epoch) {
            match engine.flush().await {
                Ok(()) if engine.release(&[(stream_id, t.epoch)]) == [true] => break,
                Ok(()) => {}
                Err(e) => tracing::warn!(stream_id, error = %e, "transfer: flush failed, retrying"),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err("its data could not be flushed in time".into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let cfg = &self.inner.config;
        let cmd = Command::CompleteTransfer {
            stream_id,
            epoch: t.epoch,
            node_id: cfg.node_id,
            node_epoch: cfg.node_epoch,
            to_node: t.to_node,
            now_ms: self.now_ms(),
        };
        loop {
            match self.propose(cmd.clone()).await {
                Ok(Ok(_)) => return Ok(()),
                Ok(Err(e)) => return Err(format!("release rejected: {e}")),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e),
                Err(e) => {
                    tracing::warn!(stream_id, error = %e, "transfer: release not committed, retrying");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// The target's half: open the released stream now rather than at its first request.
    async fn open_transferred(&self, stream_id: u64) {
        let view = self.inner.meta.view();
        let Some(name) = view
            .streams
            .get(&stream_id)
            .and_then(|m| StreamName::parse(&m.name).ok())
        else {
            return;
        };
        let Some(r) = self.resolve_raw(&name) else {
            return;
        };
        match self.open_stream(&r).await {
            Ok(open) => {
                open.touch(self.now_ms());
                tracing::info!(stream = %name, stream_id, epoch = open.epoch, "transfer: opened here");
            }
            Err(e) => {
                tracing::warn!(stream = %name, stream_id, error = %e, "transfer: open failed (the next request opens it)")
            }
        }
    }
}

/// One look at the view: starts the drains this node owes (it owns a stream with a pending
/// transfer) and the opens it is due (a stream released for it). Returns the tasks started.
pub(crate) fn transfer_pass(node: &Node) -> Vec<JoinHandle<()>> {
    let view = node.inner.meta.view();
    let cfg = &node.inner.config;
    let transfers = &node.inner.transfers;
    let me = Some(Owner {
        node_id: cfg.node_id,
        node_epoch: cfg.node_epoch,
    });
    let mut started = Vec::new();
    for (&stream_id, &t) in view.transfers.iter() {
        let Some(meta) = view.streams.get(&stream_id) else {
            continue;
        };
        let drain = t.pending_on(meta) && t.from == me;
        let open = t.to_node == cfg.node_id
            && meta.owner.is_none()
            && node.handoff_target(&view, stream_id) == Some(cfg.node_id);
        if !drain && !open {
            continue;
        }
        let Some(claim) = BusyClaim::take(&transfers.busy, stream_id) else {
            continue;
        };
        let node = node.clone();
        started.push(tokio::spawn(async move {
            let _claim = claim;
            if drain {
                node.drain(stream_id, t).await;
            } else {
                node.open_transferred(stream_id).await;
            }
        }));
    }
    started
}

/// Runs [`transfer_pass`] at every change of the log (a transfer is a log row) and at least
/// every heartbeat period (liveness).
pub(crate) fn spawn(node: &Node) -> JoinHandle<()> {
    let node = node.clone();
    tokio::spawn(async move {
        let mut applied = node.inner.meta.subscribe();
        let clock = node.inner.config.clock.clone();
        let every = node.inner.config.heartbeat_every;
        loop {
            transfer_pass(&node);
            tokio::select! {
                changed = applied.changed() => if changed.is_err() { return },
                _ = clock.sleep(every) => {}
            }
        }
    })
}

#[cfg(test)]
mod tests;
