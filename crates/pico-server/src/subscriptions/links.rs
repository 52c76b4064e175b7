//! What the manager reads about linked streams, under its state lock and without IO: each
//! link's tail (the node's in-memory view), the views a wake carries, ack validation, pattern
//! matches not linked yet, and the bounded prune of links whose stream is gone.

use std::collections::BTreeMap;
use std::ops::Bound;

use pico_common::StreamName;
use pico_protocol::{OffsetSpec, parse_offset};

use super::effects::Effects;
use super::error::SubError;
use super::manager::Manager;
use super::model::{MAX_LINKS_PER_SUB, StreamView, Sub};
use super::state;
use super::wake::AckItem;
use crate::{ListRequest, ReadError};

const LIST_PAGE: usize = 1_000;
/// Links checked for a deleted stream per tick, across all subscriptions (deletes emit no
/// event, so links are walked a bounded slice at a time).
pub(super) const PRUNE_BATCH: usize = 1_000;

pub(super) enum TailError {
    Missing,
    Unavailable,
}

impl Manager {
    /// Every link with its current tail. Glob-only links whose stream is gone are dropped.
    pub(super) fn views(&self, sub: &mut Sub, fx: &mut Effects) -> Vec<StreamView> {
        let mut out = Vec::with_capacity(sub.links.len());
        let mut gone = Vec::new();
        for (path, link) in &sub.links {
            let tail = match self.tail(path) {
                Ok(t) => t,
                Err(TailError::Missing) => {
                    if !link.explicit {
                        gone.push(path.clone());
                        continue;
                    }
                    0
                }
                Err(TailError::Unavailable) => link.acked.unwrap_or(0),
            };
            out.push(StreamView {
                path: path.clone(),
                link_type: link.link_type(),
                acked: link.acked,
                tail,
            });
        }
        if !gone.is_empty() {
            for p in &gone {
                sub.links.remove(p);
            }
            let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
            fx.persist_links(sub, &refs);
        }
        out
    }

    /// Validates every ack, then applies them all. Returns the paths whose cursor moved.
    pub(super) fn apply_acks(
        &self,
        sub: &mut Sub,
        acks: &[AckItem],
    ) -> Result<Vec<String>, SubError> {
        if acks.len() > MAX_LINKS_PER_SUB {
            return Err(SubError::invalid(format!(
                "at most {MAX_LINKS_PER_SUB} acks per request"
            )));
        }
        let mut updates = Vec::with_capacity(acks.len());
        for ack in acks {
            let path = ack
                .stream
                .as_deref()
                .or(ack.path.as_deref())
                .map(|p| p.trim_matches('/'))
                .unwrap_or("");
            let Some(link) = sub.links.get(path) else {
                // A glob link dropped because its stream was deleted (maybe after this wake was
                // handed out, see `prune_gone_links`): nothing is left to ack.
                if sub.rec.config.pattern_matches(path)
                    && matches!(self.tail(path), Err(TailError::Missing))
                {
                    continue;
                }
                return Err(SubError::InvalidOffset(format!(
                    "ack references an unlinked stream: {path:?}"
                )));
            };
            // Deleted and re-created since the wake was issued: the worker read the old stream,
            // whose offsets are no cursor for the new one.
            if sub
                .rec
                .wake
                .as_ref()
                .is_some_and(|w| !state::same_incarnation(&w.incarnations, path, link))
            {
                continue;
            }
            let offset = match parse_offset(&ack.offset) {
                Ok(OffsetSpec::At(o)) => o,
                _ => {
                    return Err(SubError::InvalidOffset(format!(
                        "ack offset must be a stream offset: {:?}",
                        ack.offset
                    )));
                }
            };
            if link.acked.is_some_and(|a| offset < a) {
                return Err(SubError::InvalidOffset(
                    "ack offset regresses the committed cursor".into(),
                ));
            }
            let tail = self.tail(path).unwrap_or(0);
            if offset > tail {
                return Err(SubError::InvalidOffset(
                    "ack offset is beyond the stream tail".into(),
                ));
            }
            updates.push((path.to_string(), offset));
        }
        let mut moved = Vec::new();
        for (path, offset) in updates {
            if let Some(link) = sub.links.get_mut(&path)
                && link.acked != Some(offset)
            {
                link.acked = Some(offset);
                moved.push(path);
            }
        }
        Ok(moved)
    }

    /// The current incarnation (internal id) of the live stream named `path`, from the view.
    pub(super) fn stream_id(&self, path: &str) -> Option<u64> {
        let view = self.node.meta().view();
        let entry = view.registry.get(path)?;
        view.streams
            .get(&entry.stream_id)
            .filter(|m| !m.deleted)
            .map(|m| m.id)
    }

    /// Links whose stream was deleted and re-created under the same name since the cursor was
    /// taken start over (acked `-1`); a link without an incarnation adopts the current one.
    /// Compared by stream id, not name: the follower sees the new id only for appends on this
    /// node, and a stream re-created elsewhere shows only in the view.
    pub(super) fn adopt_incarnations(&self, sub: &mut Sub, fx: &mut Effects) {
        let mut changed = Vec::new();
        for (path, link) in sub.links.iter_mut() {
            let Some(id) = self.stream_id(path) else {
                continue;
            };
            match link.stream_id {
                Some(old) if old == id => continue,
                Some(_) => link.acked = None,
                None => {}
            }
            link.stream_id = Some(id);
            changed.push(path.clone());
        }
        let refs: Vec<&str> = changed.iter().map(String::as_str).collect();
        fx.persist_links(sub, &refs);
    }

    /// A stream's tail from the node's in-memory state (no IO: safe under the state lock).
    pub(super) fn tail(&self, path: &str) -> Result<u64, TailError> {
        let name = StreamName::parse(path).map_err(|_| TailError::Missing)?;
        match self.node.head_now(&name) {
            Ok(info) => Ok(info.next_seq),
            Err(ReadError::NotFound(_)) => Err(TailError::Missing),
            Err(_) => Err(TailError::Unavailable),
        }
    }

    /// Existing streams matching the subscription's pattern and not linked yet (listing
    /// narrowed by the pattern's literal prefix), no more than its free link slots: once full,
    /// no listing at all.
    pub(super) fn unlinked_matches(&self, sub: &Sub) -> Vec<String> {
        let Some(pattern) = &sub.rec.config.pattern else {
            return Vec::new();
        };
        let mut out = Vec::new();
        if sub.links.len() >= MAX_LINKS_PER_SUB {
            return out;
        }
        // One past the free slots, so that `link_glob` sees (and logs) the overflow.
        let want = MAX_LINKS_PER_SUB + 1 - sub.links.len();
        let prefix = pattern.literal_prefix();
        let mut after: Option<String> = None;
        loop {
            let page = self.node.list(ListRequest {
                prefix: Some(prefix.clone()),
                start_after: after.clone(),
                limit: LIST_PAGE,
            });
            for info in &page.streams {
                let name = info.name.as_str();
                if !sub.links.contains_key(name) && sub.rec.config.pattern_matches(name) {
                    out.push(name.to_string());
                    if out.len() >= want {
                        return out;
                    }
                }
            }
            match (page.has_more, page.streams.last()) {
                (true, Some(last)) => after = Some(last.name.as_str().to_string()),
                _ => return out,
            }
        }
    }

    /// Drops glob-only links whose stream is gone, [`PRUNE_BATCH`] links per call, resuming
    /// where the previous call stopped. Deletes emit no event, and a subscription that does not
    /// wake (unclaimed, failing webhook) would otherwise keep a link, and a KV key, per stream
    /// name it ever matched. Explicit links stay: the client added them.
    pub(super) fn prune_gone_links(&self, subs: &mut BTreeMap<String, Sub>, fx: &mut Effects) {
        let mut cursor = self
            .prune_cursor
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let from = match &cursor {
            Some((id, _)) => Bound::Included(id.clone()),
            None => Bound::Unbounded,
        };
        let mut budget = PRUNE_BATCH;
        for (id, sub) in subs.range_mut((from, Bound::Unbounded)) {
            let after = cursor
                .take()
                .filter(|(cursor_id, _)| cursor_id == id)
                .map_or(Bound::Unbounded, |(_, path)| Bound::Excluded(path));
            let mut gone = Vec::new();
            let mut last = None;
            for (path, link) in sub.links.range::<String, _>((after, Bound::Unbounded)) {
                if budget == 0 {
                    break;
                }
                budget -= 1;
                last = Some(path);
                if !link.explicit && matches!(self.tail(path), Err(TailError::Missing)) {
                    gone.push(path.clone());
                }
            }
            if budget == 0 {
                cursor = last.map(|path| (id.clone(), path.clone()));
            }
            if !gone.is_empty() {
                for path in &gone {
                    sub.links.remove(path);
                }
                tracing::debug!(sub = %id, dropped = gone.len(), "links to deleted streams dropped");
                let refs: Vec<&str> = gone.iter().map(String::as_str).collect();
                fx.persist_links(sub, &refs);
            }
            if budget == 0 {
                break;
            }
        }
        *self.prune_cursor.lock().unwrap_or_else(|p| p.into_inner()) = cursor;
    }
}
