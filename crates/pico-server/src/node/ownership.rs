//! Ownership: lazy open of a stream on this node, and where a stream owned elsewhere lives.

use super::*;
use crate::error::*;
use crate::open::{OpenStream, Writer};
use crate::producers::{Placed, ProducerState};
use pico_common::StreamName;
use pico_metadata::{ApplyError, Command, Outcome};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tokio::sync::Mutex;

/// Where a request for a stream is served ([`Node::route`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Serve it here.
    Local,
    /// Redirect (307) to the owner's advertised base URL.
    Redirect(String),
    /// Nobody can serve it for now (the owner lapsed or was fenced): 503, retry shortly.
    Unavailable(String),
}

/// A registered node as [`Node::cluster_nodes`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterNode {
    pub node_id: u32,
    pub epoch: u64,
    /// The node's own clock at its latest accepted heartbeat.
    pub last_heartbeat_ms: i64,
}

impl Node {
    /// The owner's advertised URL when another registered node owns the stream (for 307s);
    /// `None` when it is served here, or nowhere for now (see [`Node::route`]).
    pub fn owner_url(&self, name: &StreamName) -> Option<String> {
        match self.route(name) {
            Route::Redirect(url) => Some(url),
            Route::Local | Route::Unavailable(_) => None,
        }
    }

    /// Where a request naming `name` is served (the routing middleware asks, no SQL):
    /// - here: unowned, owned by this node, or closed with everything up to its close
    ///   committed (nothing of it lives only on the owner, so any node reads it and answers
    ///   appends with the closed error);
    /// - on its owner (a 307): owned by another live node. A closed stream whose tail is still
    ///   uncommitted goes there too, as the owner holds that tail;
    /// - nowhere for now (a 503 with `Retry-After`): its owner's heartbeat lapsed as seen here,
    ///   or failover fenced it and has not released the stream yet. Its acknowledged appends
    ///   may sit only in the owner's WAL, so opening it here would fence them, and a redirect
    ///   would send the client to a dead address; failover releases it within seconds.
    pub fn route(&self, name: &StreamName) -> Route {
        let view = self.inner.meta.view();
        self.route_in(&view, &Lookup::read(&view, name))
    }

    /// [`Node::route`] for a request, after [`Node::hold_for_handoff`] when it would write
    /// (`writes`), with the look at the view it made: the request's later steps take the
    /// stream's entries from it ([`Lookup`]) instead of looking the name up again.
    pub async fn route_request(&self, name: &StreamName, writes: bool) -> (Route, Lookup) {
        let mut view = self.inner.meta.view();
        let mut seen = Lookup::read(&view, name);
        // A write held at the door routes by the view after the handoff (the release).
        if writes
            && let Some(stream_id) = seen.stream_id()
            && self.hold_for_stream(stream_id).await
        {
            view = self.inner.meta.view();
            seen = Lookup::read(&view, name);
        }
        (self.route_in(&view, &seen), seen)
    }

    /// [`Node::route`] from `seen`, read from `view`.
    fn route_in(&self, view: &pico_metadata::State, seen: &Lookup) -> Route {
        let (Some(entry), Some(meta)) = (seen.entry.as_deref(), seen.meta.as_deref()) else {
            return Route::Local;
        };
        let Some(owner) = meta.owner.as_ref() else {
            // Released by a transfer: steered to its target while the hint is fresh.
            return match self.handoff_target(view, meta.id) {
                Some(to) if to != self.inner.config.node_id => view
                    .nodes
                    .get(&to)
                    .map_or(Route::Local, |n| Route::Redirect(n.address.clone())),
                _ => Route::Local,
            };
        };
        if owner.node_id == self.inner.config.node_id {
            return Route::Local;
        }
        if entry.closed && entry.closed_at.is_some_and(|at| meta.end_offset >= at) {
            return Route::Local;
        }
        let Some(n) = view.nodes.get(&owner.node_id) else {
            return Route::Local;
        };
        if n.fenced(owner) {
            return Route::Unavailable(format!(
                "stream owner node {} was fenced by failover; its streams are being recovered",
                owner.node_id
            ));
        }
        let lapsed = owner.node_epoch == n.epoch
            && self
                .inner
                .liveness
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .is_lapsed(owner.node_id, owner.node_epoch);
        if lapsed {
            return Route::Unavailable(format!(
                "stream owner node {} stopped heartbeating; failover is taking its streams over",
                owner.node_id
            ));
        }
        Route::Redirect(n.address.clone())
    }

    /// The id of the node requests for `name` go to (the Kafka facade names it partition
    /// leader): its owner, or a transfer's target; `None` = serve here.
    pub fn owner_node(&self, name: &StreamName) -> Option<u32> {
        if self.route(name) == Route::Local {
            return None;
        }
        let view = self.inner.meta.view();
        let entry = view.registry.get(name.as_str())?;
        let meta = view.streams.get(&entry.stream_id)?;
        match meta.owner.as_ref() {
            Some(owner) => Some(owner.node_id),
            None => self.handoff_target(&view, meta.id),
        }
    }

    /// Every registered node, in id order: what a facade lists as the cluster (liveness is
    /// the caller's to judge, from whether `last_heartbeat_ms` moves).
    pub fn cluster_nodes(&self) -> Vec<ClusterNode> {
        let view = self.inner.meta.view();
        view.nodes
            .values()
            .map(|n| ClusterNode {
                node_id: n.node_id,
                epoch: n.epoch,
                last_heartbeat_ms: n.last_heartbeat_ms,
            })
            .collect()
    }

    /// Number of streams open on this node (for stats and tests).
    pub fn open_streams(&self) -> usize {
        self.inner.open.len()
    }

    // ---- internals ----

    /// Opens the stream on this node (lazily, once: concurrent callers share the open).
    pub(crate) async fn open_stream(&self, r: &Resolved) -> Result<Arc<OpenStream>, AppendError> {
        // Open already (nearly every append): no slot is taken, and the open's large future is
        // boxed, so it is not part of (nor copied with) every append's future.
        if let Some(open) = self.inner.open.get(r.meta.id) {
            return Ok(open);
        }
        Box::pin(self.open_stream_new(r)).await
    }

    /// [`Node::open_stream`] of a stream that was not open a moment ago.
    async fn open_stream_new(&self, r: &Resolved) -> Result<Arc<OpenStream>, AppendError> {
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
        let seen = slot.failures();
        let result = slot
            .cell()
            .get_or_try_init(|| async {
                // An open this request waited behind failed meanwhile: its answer is this
                // request's too (the outage that failed it is most likely still there).
                if let Some(e) = slot.failed_since(seen) {
                    return Err(AppendError::Unavailable(e));
                }
                let opened = async {
                    if !self.inner.serving.load(Ordering::Relaxed) {
                        return Err(AppendError::Unavailable("node is shutting down".into()));
                    }
                    // Its acknowledged tail is being flushed for a transfer: an open here would
                    // take it back. The request is answered 503 and retried (then redirected).
                    if self.handing_off(stream_id) {
                        return Err(AppendError::Unavailable(format!(
                            "stream is being handed off to another node, retry: name=`{}`",
                            r.name
                        )));
                    }

                    // A previous incarnation of this stream still has engine state: flush it into
                    // committed objects first, or the epoch bump below would fence acknowledged data.
                    if self.inner.engine.is_open(stream_id).is_some() {
                        self.inner.engine.close(stream_id).await.map_err(|e| {
                            AppendError::Unavailable(format!("flushing stream: {e}"))
                        })?;
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
                        Err(
                            ApplyError::StreamNotFound { .. } | ApplyError::StreamDeleted { .. },
                        ) => {
                            return Err(AppendError::NotFound(r.name.to_string()));
                        }
                        Err(e) => {
                            return Err(AppendError::Unavailable(format!("open rejected: {e}")));
                        }
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
                                            at: Placed {
                                                start: p.start_offset,
                                                next: p.end_offset,
                                            },
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
                    let closed_by = entry.and_then(|e| e.closed_by.as_deref()).cloned();
                    Ok(Arc::new(OpenStream {
                        stream_id,
                        epoch,
                        writer: Mutex::new(Writer {
                            producers,
                            closed,
                            closed_by,
                            stream_seq,
                            broken: false,
                            next_offset: None,
                        }),
                        last_used_ms: AtomicI64::new(self.now_ms()),
                        producers_moved: tokio::sync::Notify::new(),
                    }))
                }
                .await;
                // Recorded before the cell lets the next request in.
                if let Err(AppendError::Unavailable(m)) = &opened {
                    slot.record_failure(m);
                }
                opened
            })
            .await
            .cloned();
        // Dropping `slot` removes it if the open failed (or is cancelled before this point)
        // and nobody else waits on it.
        result
    }
}
