//! Subscription state in the metadata log's KV: every change is written through before the
//! request that caused it is answered, and a new manager rebuilds its state from the view.
//!
//! Layout: `ds/sub/{id}` = [`Record`] JSON, `ds/sublink/{id}/{path}` = [`Link`] JSON,
//! [`SEED_KEY`] = the 32-byte signing seed.

use std::collections::BTreeMap;

use pico_metadata::{ApplyError, Command};

use super::error::SubError;
use super::model::{Link, Record, Sub};
use crate::Node;

pub const SEED_KEY: &str = "ds/webhook-signing-seed";
pub const SUB_PREFIX: &str = "ds/sub/";
pub const LINK_PREFIX: &str = "ds/sublink/";

/// Reads and writes subscription keys through the node's metadata log.
#[derive(Clone)]
pub struct Store {
    node: Node,
}

impl Store {
    pub fn new(node: Node) -> Store {
        Store { node }
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

    /// Writes the record and the given links (deleted from the KV when no longer linked).
    pub async fn persist(&self, sub: &Sub, links: &[&str]) -> Result<(), SubError> {
        let rec = serde_json::to_vec(&sub.rec).map_err(unavailable)?;
        let mut cmds = vec![Command::KvPut {
            key: sub_key(&sub.rec.id),
            value: rec,
        }];
        cmds.extend(link_cmds(sub, links));
        self.propose(cmds).await
    }

    /// Writes only the given links.
    pub async fn persist_links(&self, sub: &Sub, links: &[&str]) -> Result<(), SubError> {
        if links.is_empty() {
            return Ok(());
        }
        self.propose(link_cmds(sub, links).collect()).await
    }

    /// Removes the record and every link of `sub`.
    pub async fn delete(&self, sub: &Sub) -> Result<(), SubError> {
        let id = &sub.rec.id;
        let mut cmds = vec![Command::KvDelete { key: sub_key(id) }];
        cmds.extend(sub.links.keys().map(|p| Command::KvDelete {
            key: link_key(id, p),
        }));
        self.propose(cmds).await
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

    async fn propose(&self, cmds: Vec<Command>) -> Result<(), SubError> {
        let outcomes = self
            .node
            .meta()
            .propose_many(cmds)
            .await
            .map_err(unavailable)?;
        for o in outcomes {
            o.map_err(unavailable)?;
        }
        Ok(())
    }
}

fn unavailable(e: impl std::fmt::Display) -> SubError {
    SubError::Unavailable(e.to_string())
}

fn link_cmds<'a>(sub: &'a Sub, links: &'a [&'a str]) -> impl Iterator<Item = Command> + 'a {
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
