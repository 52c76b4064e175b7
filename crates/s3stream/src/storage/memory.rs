//! `MemoryStorage`: the in-process storage double of tests, with fault injection.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;

use super::{ObjectStorage, StorageError, range_error};
use crate::parts::Parts;

/// In-memory storage for tests. Share it through an `Arc` to survive a simulated crash.
/// Fault injection: `fail_puts(n)` / `fail_gets(n)` / `fail_deletes(n)` make the next n calls
/// fail.
#[derive(Debug, Default)]
pub struct MemoryStorage {
    objects: Mutex<BTreeMap<String, Bytes>>,
    fail_puts: AtomicUsize,
    fail_gets: AtomicUsize,
    fail_deletes: AtomicUsize,
    puts: AtomicU64,
    gets: AtomicU64,
    /// Every key `list` returned, in order (what a listing cost).
    listed: Mutex<Vec<String>>,
}

/// Takes one injected failure from `counter` if any are left (test doubles' fault injection).
pub(crate) fn take_failure(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl MemoryStorage {
    pub fn new() -> MemoryStorage {
        MemoryStorage::default()
    }

    /// The next `n` puts fail with an injected error (nothing is stored).
    pub fn fail_puts(&self, n: usize) {
        self.fail_puts.store(n, Ordering::SeqCst);
    }

    /// The next `n` gets / range gets fail with an injected error.
    pub fn fail_gets(&self, n: usize) {
        self.fail_gets.store(n, Ordering::SeqCst);
    }

    /// The next `n` deletes fail with an injected error (nothing is deleted).
    pub fn fail_deletes(&self, n: usize) {
        self.fail_deletes.store(n, Ordering::SeqCst);
    }

    /// Every key `list` has returned so far, in order.
    pub fn listed_keys(&self) -> Vec<String> {
        self.listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Successful puts so far.
    pub fn put_count(&self) -> u64 {
        self.puts.load(Ordering::SeqCst)
    }

    /// Successful gets (whole or range) so far.
    pub fn get_count(&self) -> u64 {
        self.gets.load(Ordering::SeqCst)
    }

    /// All keys currently stored.
    pub fn keys(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    /// Overwrites an object in place, bypassing fault injection (corruption tests).
    pub fn raw_put(&self, key: &str, data: Bytes) {
        self.lock().insert(key.to_string(), data);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Bytes>> {
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait::async_trait]
impl ObjectStorage for MemoryStorage {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        if take_failure(&self.fail_puts) {
            return Err(StorageError::Other(format!(
                "injected put failure: key=`{key}`"
            )));
        }
        self.lock().insert(key.to_string(), data);
        self.puts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn put_if_absent(&self, key: &str, data: Parts) -> Result<bool, StorageError> {
        if take_failure(&self.fail_puts) {
            return Err(StorageError::Other(format!(
                "injected put failure: key=`{key}`"
            )));
        }
        let created = match self.lock().entry(key.to_string()) {
            std::collections::btree_map::Entry::Occupied(_) => false,
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(data.concat());
                true
            }
        };
        if created {
            self.puts.fetch_add(1, Ordering::SeqCst);
        }
        Ok(created)
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        if take_failure(&self.fail_gets) {
            return Err(StorageError::Other(format!(
                "injected get failure: key=`{key}`"
            )));
        }
        let data = self.lock().get(key).cloned();
        self.gets.fetch_add(1, Ordering::SeqCst);
        data.ok_or_else(|| StorageError::NotFound {
            key: key.to_string(),
        })
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError> {
        let data = self.get(key).await?;
        let size = data.len() as u64;
        match start.checked_add(len) {
            Some(end) if end <= size => Ok(data.slice(start as usize..end as usize)),
            _ => Err(range_error(key, start, len, size)),
        }
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        if take_failure(&self.fail_deletes) {
            return Err(StorageError::Other(format!(
                "injected delete failure: key=`{key}`"
            )));
        }
        self.lock().remove(key);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        let keys: Vec<String> = self
            .lock()
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect();
        self.listed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(keys.iter().cloned());
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn memory_storage_fault_injection() {
        let s = MemoryStorage::new();
        s.fail_puts(2);
        assert!(s.put("k", Bytes::new()).await.is_err());
        assert!(
            s.put_if_absent("k", Parts::from(Bytes::new()))
                .await
                .is_err()
        );
        assert!(matches!(
            s.get("k").await,
            Err(StorageError::NotFound { .. })
        ));
        s.put("k", Bytes::from_static(b"v")).await.unwrap();
        s.fail_gets(1);
        assert!(s.get("k").await.is_err());
        assert_eq!(s.get("k").await.unwrap(), Bytes::from_static(b"v"));
        assert_eq!(s.put_count(), 1);
    }
}
