//! Subscription state in the metadata log's KV: every change is written through before the
//! request that caused it is answered, and a new manager rebuilds its state from the view.
//!
//! Writes are queued, not awaited, by the manager while it holds its state lock, and one writer
//! task proposes them in queue order: the KV sees changes in the order the state made them, and
//! no lock is held while the metadata log commits. The caller awaits its [`Receipt`] after
//! releasing the lock.
//!
//! Layout: `ds/sub/{id}` = [`Record`] JSON, `ds/sublink/{id}/{path}` = [`Link`] JSON,
//! `ds/wake-event/{id}/{generation}` = a pull-wake event routed to its wake stream's owner
//! (`routed.rs`), [`SEED_KEY`] = the 32-byte signing seed.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use pico_metadata::{ApplyError, Command};
use tokio::sync::{mpsc, oneshot};

use super::error::SubError;
use super::model::{Link, Record, Sub};
use crate::Node;

pub const SEED_KEY: &str = "ds/webhook-signing-seed";
pub const SUB_PREFIX: &str = "ds/sub/";
pub const LINK_PREFIX: &str = "ds/sublink/";

/// Queued write batches; a full queue refuses new changes (the metadata log is behind).
const WRITE_QUEUE: usize = 1_024;
/// Batches proposed together by the writer.
const WRITE_BATCH: usize = 16;

/// Reads and writes subscription keys through the node's metadata log.
pub struct Store {
    node: Node,
    /// The writer's queue, started on the first write (inside a runtime).
    queue: OnceLock<mpsc::Sender<Write>>,
}

/// A batch of KV commands and who waits for its outcome.
struct Write {
    cmds: Vec<Command>,
    done: oneshot::Sender<Result<(), SubError>>,
}

/// The outcome of a queued write, to await once no lock is held.
#[must_use = "a write is only durable once its receipt says so"]
pub struct Receipt(Result<Option<oneshot::Receiver<Result<(), SubError>>>, SubError>);

impl Receipt {
    pub fn done() -> Receipt {
        Receipt(Ok(None))
    }

    /// A write that failed before it was queued.
    pub fn failed(e: SubError) -> Receipt {
        Receipt(Err(e))
    }

    /// Waits until the write is committed (or failed).
    pub async fn wait(self) -> Result<(), SubError> {
        match self.0 {
            Ok(None) => Ok(()),
            Ok(Some(rx)) => rx.await.unwrap_or_else(|_| {
                Err(SubError::Unavailable("subscription writer stopped".into()))
            }),
            Err(e) => Err(e),
        }
    }
}

impl Store {
    pub fn new(node: Node) -> Store {
        Store {
            node,
            queue: OnceLock::new(),
        }
    }

    /// The stored signing seed, if any.
    pub fn seed(&self) -> Option<[u8; 32]> {
        let view = self.node.meta().view();
        view.kv
            .get(SEED_KEY)
            .and_then(|v| <[u8; 32]>::try_from(v.as_slice()).ok())
    }

    /// Records `seed` unless a seed is stored already; returns the one stored (first writer
    /// wins, so every node signs with the same key).
    pub async fn init_seed(&self, seed: [u8; 32]) -> Result<[u8; 32], SubError> {
        let outcome = self
            .node
            .meta()
            .propose(Command::KvInit {
                key: SEED_KEY.to_string(),
                value: seed.to_vec(),
            })
            .await
            .map_err(unavailable)?;
        match outcome {
            Ok(_) | Err(ApplyError::Conflict { .. }) => {}
            Err(e) => return Err(unavailable(e)),
        }
        Ok(self.seed().unwrap_or(seed))
    }

    /// Every stored subscription with its links (unreadable entries are logged and skipped).
    pub fn load(&self) -> BTreeMap<String, Sub> {
        let view = self.node.meta().view();
        let mut subs = BTreeMap::new();
        for (key, value) in view.kv.range(SUB_PREFIX.to_string()..) {
            if !key.starts_with(SUB_PREFIX) {
                break;
            }
            match serde_json::from_slice::<Record>(value) {
                Ok(rec) => {
                    subs.insert(rec.id.clone(), Sub::new(rec));
                }
                Err(e) => tracing::warn!(key, error = %e, "unreadable subscription record"),
            }
        }
        for (key, value) in view.kv.range(LINK_PREFIX.to_string()..) {
            let Some(rest) = key.strip_prefix(LINK_PREFIX) else {
                break;
            };
            let Some((id, path)) = rest.split_once('/') else {
                continue;
            };
            match (subs.get_mut(id), serde_json::from_slice::<Link>(value)) {
                (Some(sub), Ok(link)) => {
                    sub.links.insert(path.to_string(), link);
                }
                (_, Err(e)) => tracing::warn!(key, error = %e, "unreadable subscription link"),
                (None, Ok(_)) => {}
            }
        }
        subs
    }

    /// One stored subscription with its links, read from the view (a node that does not
    /// deliver serves reads from here: its memory is not kept up to date).
    pub fn load_one(&self, id: &str) -> Option<Sub> {
        let view = self.node.meta().view();
        let rec = view.kv.get(&sub_key(id))?;
        let rec = match serde_json::from_slice::<Record>(rec) {
            Ok(rec) => rec,
            Err(e) => {
                tracing::warn!(id, error = %e, "unreadable subscription record");
                return None;
            }
        };
        let mut sub = Sub::new(rec);
        let prefix = format!("{LINK_PREFIX}{id}/");
        for (key, value) in view
            .kv
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
        {
            match serde_json::from_slice::<Link>(value) {
                Ok(link) => {
                    sub.links.insert(key[prefix.len()..].to_string(), link);
                }
                Err(e) => tracing::warn!(key, error = %e, "unreadable subscription link"),
            }
        }
        Some(sub)
    }

    /// Queues one batch of commands (one transition's writes), proposed after every batch
    /// queued before it.
    pub fn enqueue(&self, cmds: Vec<Command>) -> Receipt {
        if cmds.is_empty() {
            return Receipt::done();
        }
        let queue = match self.queue.get() {
            Some(q) => q,
            None => {
                let Ok(rt) = tokio::runtime::Handle::try_current() else {
                    return Receipt(Err(SubError::Unavailable("no runtime for writes".into())));
                };
                self.queue.get_or_init(|| {
                    let (tx, rx) = mpsc::channel(WRITE_QUEUE);
                    rt.spawn(run_writer(self.node.clone(), rx));
                    tx
                })
            }
        };
        let (done, rx) = oneshot::channel();
        match queue.try_send(Write { cmds, done }) {
            Ok(()) => Receipt(Ok(Some(rx))),
            Err(_) => Receipt(Err(SubError::Unavailable(
                "subscription writes are backlogged".into(),
            ))),
        }
    }

    /// How many links of subscription `id` are stored (tests, diagnostics).
    pub fn stored_links(&self, id: &str) -> usize {
        let prefix = format!("{LINK_PREFIX}{id}/");
        let view = self.node.meta().view();
        view.kv
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .count()
    }
}

/// Proposes queued writes in queue order until every sender is gone.
async fn run_writer(node: Node, mut rx: mpsc::Receiver<Write>) {
    let mut batch = Vec::with_capacity(WRITE_BATCH);
    while rx.recv_many(&mut batch, WRITE_BATCH).await > 0 {
        let mut cmds = Vec::new();
        let mut sizes = Vec::with_capacity(batch.len());
        for w in &mut batch {
            sizes.push(w.cmds.len());
            cmds.append(&mut w.cmds);
        }
        // Only the lease holder writes subscriptions; checked against the lease row right
        // before the write (a newer process of this node id may have taken it over at once).
        if !crate::maintenance::confirm(&node).await {
            for w in batch.drain(..) {
                let _ = w.done.send(Err(SubError::Unavailable(
                    "this node no longer holds the maintenance lease".into(),
                )));
            }
            continue;
        }
        match node.meta().propose_many(cmds).await {
            Ok(outcomes) => {
                let mut outcomes = outcomes.into_iter();
                for (w, n) in batch.drain(..).zip(sizes) {
                    let result = outcomes
                        .by_ref()
                        .take(n)
                        .try_for_each(|o| o.map(drop).map_err(unavailable));
                    let _ = w.done.send(result);
                }
            }
            Err(e) => {
                let e = unavailable(e);
                for w in batch.drain(..) {
                    let _ = w.done.send(Err(e.clone()));
                }
            }
        }
    }
}

fn unavailable(e: impl std::fmt::Display) -> SubError {
    SubError::Unavailable(e.to_string())
}

/// The command storing `sub`'s record.
pub fn record_cmd(sub: &Sub) -> Result<Command, SubError> {
    Ok(Command::KvPut {
        key: sub_key(&sub.rec.id),
        value: serde_json::to_vec(&sub.rec).map_err(unavailable)?,
    })
}

/// The commands removing `sub`'s record and every link.
pub fn delete_cmds(sub: &Sub) -> impl Iterator<Item = Command> + '_ {
    let id = &sub.rec.id;
    std::iter::once(Command::KvDelete { key: sub_key(id) }).chain(sub.links.keys().map(move |p| {
        Command::KvDelete {
            key: link_key(id, p),
        }
    }))
}

/// The commands storing the given links of `sub` (deleting those no longer linked).
pub fn link_cmds<'a>(sub: &'a Sub, links: &'a [&'a str]) -> impl Iterator<Item = Command> + 'a {
    links.iter().map(move |path| match sub.links.get(*path) {
        Some(link) => Command::KvPut {
            key: link_key(&sub.rec.id, path),
            value: serde_json::to_vec(link).unwrap_or_default(),
        },
        None => Command::KvDelete {
            key: link_key(&sub.rec.id, path),
        },
    })
}

fn sub_key(id: &str) -> String {
    format!("{SUB_PREFIX}{id}")
}

fn link_key(id: &str, path: &str) -> String {
    format!("{LINK_PREFIX}{id}/{path}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two managers starting at once (two nodes, or two routers) each generate a seed: the
    /// first one recorded is the one both sign with, so no signature or token goes stale.
    #[tokio::test]
    async fn the_first_signing_seed_recorded_wins() {
        let node = crate::testing::start_test_node().await;
        let (a, b) = (Store::new(node.clone()), Store::new(node));
        assert_eq!(a.seed(), None);
        assert_eq!(a.init_seed([1; 32]).await, Ok([1; 32]));
        assert_eq!(b.init_seed([2; 32]).await, Ok([1; 32]));
        assert_eq!(b.seed(), Some([1; 32]));
    }
}
