//! Object storage abstraction: the only durable medium the engine writes data to.
//!
//! - `file`: `FileStorage`, keys onto a directory tree with crash-atomic puts.
//! - `memory`: `MemoryStorage`, the in-process double used by tests, with fault injection.
//! - `s3`: `S3Storage`, any S3-compatible object store through `aws-sdk-s3`.

mod file;
mod memory;
mod s3;

pub use file::FileStorage;
pub(crate) use file::{create_dir_durably, fsync_dir, write_all_at};
pub use memory::MemoryStorage;
#[cfg(any(test, feature = "testing"))]
pub(crate) use memory::take_failure;
pub use s3::{S3Config, S3ConfigError, S3Storage};

use bytes::Bytes;

use crate::parts::Parts;

/// Errors of every storage operation.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("object not found: key=`{key}`")]
    NotFound { key: String },
    #[error("storage io error: key=`{key}`: {source}")]
    Io {
        key: String,
        #[source]
        source: std::io::Error,
    },
    #[error("storage error: {0}")]
    Other(String),
}

/// A flat key space of immutable objects (keys may contain '/').
#[async_trait::async_trait]
pub trait ObjectStorage: Send + Sync + 'static {
    /// Atomic: readers see the whole object or nothing.
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError>;
    /// `put` of an object given as pieces; storages that write vectored override it.
    async fn put_parts(&self, key: &str, parts: Parts) -> Result<(), StorageError> {
        self.put(key, parts.concat()).await
    }
    /// Creates the object only if `key` does not exist yet: `Ok(true)` if this call created
    /// it, `Ok(false)` if an object was already there (left untouched). Of several racing
    /// calls on one key, exactly one gets `true`. Used wherever an overwrite could hide
    /// another writer's object (a zombie's WAL entry).
    /// Required of every storage (no look-then-put default): a wrapper forwards it.
    async fn put_if_absent(&self, key: &str, parts: Parts) -> Result<bool, StorageError>;
    /// `NotFound` if missing.
    async fn get(&self, key: &str) -> Result<Bytes, StorageError>;
    /// Exactly `len` bytes from `start`; a range past the end of the object is an error.
    async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError>;
    /// A missing key is Ok.
    async fn delete(&self, key: &str) -> Result<(), StorageError>;
    /// `delete` of every key in `keys`; stores that delete many keys in one request override
    /// it. On an error some of the keys may be deleted already.
    async fn delete_many(&self, keys: &[String]) -> Result<(), StorageError> {
        for key in keys {
            self.delete(key).await?;
        }
        Ok(())
    }
    /// Keys starting with `prefix`, sorted ascending.
    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError>;
}

pub(crate) fn range_error(key: &str, start: u64, len: u64, size: u64) -> StorageError {
    StorageError::Other(format!(
        "range out of bounds: key=`{key}` start={start} len={len} size={size}"
    ))
}
