//! Name resolution through the metadata view: listing, TTL and expiry, stream info.

use super::*;
use crate::api::*;
use pico_common::StreamName;
use pico_metadata::{RegistryEntry, StreamMeta};

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
        let (entry, meta) = self.resolve_entries(name, now)?;
        Some(Resolved {
            name: name.clone(),
            entry,
            meta,
        })
    }

    /// [`Node::resolve`] without copying the name, for callers that only read the entries
    /// (every DS append asks for its framing first).
    pub(crate) fn resolve_entries(
        &self,
        name: &StreamName,
        now: i64,
    ) -> Option<(Arc<RegistryEntry>, Arc<StreamMeta>)> {
        let view = self.inner.meta.view();
        let entry = view.registry.get(name.as_str())?;
        let meta = view.streams.get(&entry.stream_id)?;
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
        Some((entry.clone(), meta.clone()))
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
