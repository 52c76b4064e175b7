//! Facade state in the metadata KV (Kafka committed group offsets): durable once the call
//! returns, replicated with the metadata log, read from the view.

use super::*;

#[derive(Debug, Error)]
pub enum KvError {
    #[error("metadata log unavailable: {0}")]
    Unavailable(String),
    #[error("metadata write rejected: {0}")]
    Rejected(String),
}

impl Node {
    /// The value stored under `key`, if any.
    pub fn kv_get(&self, key: &str) -> Option<Vec<u8>> {
        self.inner.meta.view().kv.get(key).cloned()
    }

    /// Every `(key, value)` whose key starts with `prefix`, in key order, at most `limit`.
    pub fn kv_scan(&self, prefix: &str, limit: usize) -> Vec<(String, Vec<u8>)> {
        let view = self.inner.meta.view();
        view.kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Stores every pair in one proposal; returns once committed.
    pub async fn kv_put_many(&self, pairs: Vec<(String, Vec<u8>)>) -> Result<(), KvError> {
        let cmds = pairs
            .into_iter()
            .map(|(key, value)| Command::KvPut { key, value })
            .collect();
        let outcomes = self
            .inner
            .meta
            .propose_many(cmds)
            .await
            .map_err(|e| KvError::Unavailable(e.to_string()))?;
        for o in outcomes {
            o.map_err(|e| KvError::Rejected(e.to_string()))?;
        }
        Ok(())
    }

    /// Deletes every key in `keys`; returns once committed.
    pub async fn kv_delete_many(&self, keys: Vec<String>) -> Result<(), KvError> {
        let cmds = keys
            .into_iter()
            .map(|key| Command::KvDelete { key })
            .collect();
        let outcomes = self
            .inner
            .meta
            .propose_many(cmds)
            .await
            .map_err(|e| KvError::Unavailable(e.to_string()))?;
        for o in outcomes {
            o.map_err(|e| KvError::Rejected(e.to_string()))?;
        }
        Ok(())
    }
}
