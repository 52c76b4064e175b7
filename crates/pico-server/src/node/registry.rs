//! Name resolution through the metadata view: listing, TTL and expiry, stream info.

use super::*;
use crate::api::*;
use pico_common::StreamName;
use pico_metadata::{RegistryEntry, State, StreamMeta};

/// One look at the metadata view for a stream, taken as a request arrives (owner routing,
/// [`Node::route_request`]) and reused by the steps after it (a DS append's framing, the
/// append's admission) while the view has not moved: a request pays one view load and one
/// registry lookup where each step used to load the view and look the name up again.
///
/// Invariant: every step answers as a fresh lookup would. A step reuses the entries only while
/// the view's `applied_index` is the one they were read at: the log publishes a new view only
/// with a higher index, so an equal index is the same view. Expiry is judged again at each use
/// (it depends on the time and the in-memory touches, not the view).
#[derive(Clone, Debug, Default)]
pub struct Lookup {
    /// The view's `applied_index` when taken; `None`: not taken (every step looks itself).
    applied: Option<u64>,
    /// The registry entry, and the stream's state when the view has it.
    pub(super) entry: Option<Arc<RegistryEntry>>,
    pub(super) meta: Option<Arc<StreamMeta>>,
}

impl Lookup {
    pub(crate) fn read(view: &State, name: &StreamName) -> Lookup {
        let entry = view.registry.get(name.as_str()).cloned();
        let meta = entry
            .as_ref()
            .and_then(|e| view.streams.get(&e.stream_id).cloned());
        Lookup {
            applied: Some(view.applied_index),
            entry,
            meta,
        }
    }

    /// The stream id the registry maps the name to (soft-deleted entries included).
    pub(crate) fn stream_id(&self) -> Option<u64> {
        self.entry.as_ref().map(|e| e.stream_id)
    }
}

impl Node {
    pub fn list(&self, req: ListRequest) -> ListOutcome {
        let view = self.inner.meta.view();
        let now = self.now_ms();
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

    /// The stream by name from the view, ignoring expiry.
    pub(crate) fn resolve_raw(&self, name: &StreamName) -> Option<Resolved> {
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

    /// The live stream by name: expired streams are absent (and get removed in the background).
    pub(crate) fn resolve(&self, name: &StreamName, now: i64) -> Option<Resolved> {
        self.resolve_seen(name, now, Lookup::default())
    }

    /// [`Node::resolve`] from what `seen` read when the view has not moved since (see
    /// [`Lookup`]), else from the view. Takes `seen`'s entries rather than copying them: each
    /// copy or drop of an entry moves a reference count every core shares.
    pub(crate) fn resolve_seen(
        &self,
        name: &StreamName,
        now: i64,
        mut seen: Lookup,
    ) -> Option<Resolved> {
        self.resolve_entries_seen(name, now, &mut seen)?;
        Some(Resolved {
            name: name.clone(),
            entry: seen.entry?,
            meta: seen.meta?,
        })
    }

    /// A fresh look at the view for `name` (see [`Lookup`]).
    pub fn lookup(&self, name: &StreamName) -> Lookup {
        Lookup::read(&self.inner.meta.view(), name)
    }

    /// [`Node::resolve`] without copying the name or the entries, for callers that only read
    /// them (every DS append asks for its framing first). `seen` is read again first if the
    /// view has moved since (or it was never taken), so it serves the request's next step too.
    pub(crate) fn resolve_entries_seen<'a>(
        &self,
        name: &StreamName,
        now: i64,
        seen: &'a mut Lookup,
    ) -> Option<(&'a RegistryEntry, &'a StreamMeta)> {
        // The index is read through a guard: no reference count moves, unlike a view load.
        if seen.applied != Some(self.inner.meta.applied_index()) {
            *seen = self.lookup(name);
        }
        let (entry, meta) = (seen.entry.as_deref()?, seen.meta.as_deref()?);
        if self.expired(entry, meta.id, now) {
            // One removal per stream at a time: every request to an expired name lands here
            // (`None` also when a removal is already in flight).
            let claim = RemovalClaim::take(&self.inner.removing, meta.id)?;
            let node = self.clone();
            let name = name.clone();
            tokio::spawn(async move {
                if let Err(e) = node.remove_expired(&name, claim.stream_id).await {
                    tracing::warn!(error = %e, stream = %name, "expired stream not removed yet");
                }
                drop(claim);
            });
            return None;
        }
        Some((entry, meta))
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

    /// The readable tail: the engine's durable end when the stream is open here, else the
    /// committed end from the view. Records only in this node's WAL are shown only while it
    /// may acknowledge writes ([`Node::may_ack`]): a node failover may have fenced must not
    /// show what failover did not recover.
    pub(crate) fn tail(&self, meta: &StreamMeta) -> u64 {
        match self.inner.engine.durable_end(meta.id) {
            Some(d) if d > meta.end_offset && self.may_ack() => d,
            _ => meta.end_offset,
        }
    }

    /// Whether [`Node::tail`] holds back records this node has in its WAL: an offset past it
    /// may exist, so a read there is answered "retry" rather than "beyond the tail".
    pub(crate) fn tail_withheld(&self, meta: &StreamMeta) -> bool {
        !self.may_ack()
            && self
                .inner
                .engine
                .durable_end(meta.id)
                .is_some_and(|d| d > meta.end_offset)
    }

    /// Whether this process may acknowledge writes (and show records only its WAL holds):
    /// always with a WAL no other node reads (no failover can take its streams), else only
    /// within the acknowledgement window after its last accepted heartbeat (see
    /// `maintenance::heartbeat::ack_window` and docs/design/failover.md).
    pub(crate) fn may_ack(&self) -> bool {
        let cfg = &self.inner.config;
        cfg.peer_wals.is_none()
            || self
                .inner
                .heartbeat
                .ack_fresh(cfg.clock.now_ms(), cfg.liveness_timeout)
    }

    pub(crate) fn info(&self, r: &Resolved) -> StreamInfo {
        self.info_with_tail(r, self.tail(&r.meta))
    }

    pub(crate) fn info_with_tail(&self, r: &Resolved, tail: u64) -> StreamInfo {
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
}
