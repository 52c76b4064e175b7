//! Pull-wake events for a wake stream another node owns, routed through the metadata log.
//!
//! The deliverer (the maintenance-lease holder) may not append to a stream another node owns:
//! opening it here would bump its epoch and fence the owner's acknowledged, uncommitted tail,
//! and there is no node-to-node RPC. So it stores the event in the KV instead
//! (`ds/wake-event/{sub}/{generation}`), in the same batch as the wake that issued it, and the
//! node owning the wake stream appends it there (every node's manager timer looks) and deletes
//! the key. Unowned streams are the holder's (as for a direct append). An event whose wake was
//! claimed or replaced meanwhile is no longer news: it is dropped, as the holder drops a held
//! one. At least once: a node that dies between the append and the delete leaves the key to
//! the stream's next owner, which appends it again.

use pico_common::StreamName;
use pico_metadata::Command;
use pico_protocol::Record as DataRecord;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::SubError;
use super::manager::Manager;
use super::model::Record;
use super::store::SUB_PREFIX;
use crate::{AppendRequest, Route};

pub const ROUTED_PREFIX: &str = "ds/wake-event/";
/// Routed events looked at per timer pass on one node (bounds a pass; the rest wait a tick).
const ROUTED_PER_TICK: usize = 64;

/// One routed event as stored.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RoutedEvent {
    pub sub: String,
    pub generation: u64,
    pub stream: String,
    pub event: Value,
}

/// The command storing `ev` for the wake stream's owner.
pub(super) fn routed_cmd(ev: &RoutedEvent) -> Result<Command, SubError> {
    Ok(Command::KvPut {
        key: format!("{ROUTED_PREFIX}{}/{:020}", ev.sub, ev.generation),
        value: serde_json::to_vec(ev).map_err(|e| SubError::Unavailable(e.to_string()))?,
    })
}

impl Manager {
    /// Appends the routed events whose wake stream this node owns (or, on the holder, that
    /// nobody owns) and deletes their keys. Runs on every node's timer, holder or not.
    pub(super) async fn deliver_routed_events(&self, holder: bool) {
        let me = self.node.config().node_id;
        let mut todo: Vec<(String, Option<RoutedEvent>, bool)> = Vec::new();
        {
            let view = self.node.meta().view();
            for (key, value) in view
                .kv
                .range(ROUTED_PREFIX.to_string()..)
                .take_while(|(k, _)| k.starts_with(ROUTED_PREFIX))
                .take(ROUTED_PER_TICK)
            {
                let Ok(ev) = serde_json::from_slice::<RoutedEvent>(value) else {
                    tracing::warn!(key, "unreadable routed wake event: dropped");
                    todo.push((key.clone(), None, false));
                    continue;
                };
                let owner = view
                    .registry
                    .get(ev.stream.as_str())
                    .and_then(|e| view.streams.get(&e.stream_id))
                    .and_then(|m| m.owner.as_ref().map(|o| o.node_id));
                if !owner.map_or(holder, |id| id == me) {
                    continue;
                }
                // Still news only while its wake is the current one and unclaimed.
                let news = view
                    .kv
                    .get(&format!("{SUB_PREFIX}{}", ev.sub))
                    .and_then(|v| serde_json::from_slice::<Record>(v).ok())
                    .is_some_and(|r| {
                        r.generation == ev.generation
                            && r.wake.as_ref().is_some_and(|w| w.holder.is_none())
                    });
                todo.push((key.clone(), Some(ev), news));
            }
        }
        if todo.is_empty() {
            return;
        }
        let mut done = Vec::with_capacity(todo.len());
        for (key, ev, news) in todo {
            if let (Some(ev), true) = (ev, news) {
                let Ok(name) = StreamName::parse(&ev.stream) else {
                    done.push(key);
                    continue;
                };
                // A lapsed or fenced owner, or a view that moved on: left for the next pass.
                if !matches!(self.node.route(&name), Route::Local) {
                    continue;
                }
                let req = AppendRequest {
                    name,
                    records: vec![DataRecord::from_value(ev.event.to_string().into_bytes())],
                    producer: None,
                    match_seq: None,
                    close: false,
                    content_type: None,
                };
                if let Err(e) = self.node.append(req).await {
                    // As for a direct append: the application owns the wake stream, and a
                    // claim works without the event.
                    tracing::warn!(sub = %ev.sub, wake_stream = %ev.stream, error = %e, "routed wake event not written");
                }
            }
            done.push(key);
        }
        let cmds = done
            .into_iter()
            .map(|key| Command::KvDelete { key })
            .collect();
        if let Err(e) = self.node.meta().propose_many(cmds).await {
            tracing::warn!(error = %e, "routed wake events not cleared; appended again later");
        }
    }
}
