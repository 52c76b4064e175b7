//! Opens the storage named by bucket URIs.

use crate::RuntimeError;
use pico_common::{BucketUri, Scheme};
use pico_server::PeerWals;
use pico_wal_pg::{PgWal, PgWalError};
use s3stream::{
    EngineConfig, FileStorage, MemoryStorage, ObjectStorage, ObjectWal, S3Config, S3Storage,
    SegmentWal, Wal,
};
use std::fs::{File, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Object storage for data objects (and an object WAL). For `s3://bucket/prefix`, keys go
/// under `prefix/` in the bucket, laid out as under a `file://` root.
pub async fn object_storage(uri: &BucketUri) -> Result<Arc<dyn ObjectStorage>, RuntimeError> {
    match uri.scheme {
        Scheme::File => {
            // The root's own entry in its parent must be durable before any object under it
            // is committed to the metadata log (FileStorage syncs entries below the root).
            pico_common::fs::create_dir_durably(Path::new(&uri.location))
                .map_err(|e| RuntimeError::Startup(format!("storage `{uri}`: {e}")))?;
            FileStorage::open(uri.location.clone())
                .map(|s| Arc::new(s) as Arc<dyn ObjectStorage>)
                .map_err(|e| RuntimeError::Startup(format!("storage `{uri}`: {e}")))
        }
        Scheme::Memory => Ok(Arc::new(MemoryStorage::new())),
        Scheme::S3 => {
            let cfg = S3Config::from_uri(&uri.location, &uri.params)
                .map_err(|e| RuntimeError::Config(format!("storage `{uri}`: {e}")))?;
            Ok(Arc::new(S3Storage::connect(&cfg).await))
        }
        Scheme::Postgres => Err(RuntimeError::Config(format!(
            "postgres cannot hold data objects, only the WAL: `{uri}`"
        ))),
    }
}

/// Smallest `segmentBytes` accepted: below a page, every group commit would start a segment.
const MIN_SEGMENT_BYTES: u64 = 4096;
/// Largest `segmentBytes` accepted: each new segment may first be written as that many zeros
/// (preallocation), and WAL disk use is about one segment beyond what awaits upload.
const MAX_SEGMENT_BYTES: u64 = 1 << 30;

/// The name of the lock file in a node's local WAL directory.
const LOCK_FILE: &str = "LOCK";

/// This process's claim on a node's local WAL directory, held until dropped (see [`lock_wal`]).
#[derive(Debug)]
pub struct WalLock {
    _file: File,
}

/// The directory of `node_id`'s WAL under a `file://` WAL URI.
fn wal_dir(uri: &BucketUri, node_id: u32) -> PathBuf {
    Path::new(&uri.location)
        .join("wal")
        .join(node_id.to_string())
}

/// Locks `node_id`'s WAL directory when the WAL is on a local disk (`None` otherwise).
///
/// A second process on the same directory would clear temp files, register a higher epoch,
/// then recover and trim the segments the first still appends to: appends the first goes on
/// acknowledging would be lost. So this comes before anything opens the node's storage or
/// registers it, and the lock lives as long as the node. An advisory `flock` on `{dir}/LOCK`:
/// the kernel releases it when the process ends, however it ends, so a crash leaves no stale
/// lock behind.
pub fn lock_wal(uri: &BucketUri, node_id: u32) -> Result<Option<WalLock>, RuntimeError> {
    if uri.scheme != Scheme::File {
        return Ok(None);
    }
    let dir = wal_dir(uri, node_id);
    let path = dir.join(LOCK_FILE);
    let failed = |e: std::io::Error| {
        RuntimeError::Startup(format!("locking the WAL directory {}: {e}", dir.display()))
    };
    pico_common::fs::create_dir_durably(&dir).map_err(failed)?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .open(&path)
        .map_err(failed)?;
    match file.try_lock() {
        Ok(()) => Ok(Some(WalLock { _file: file })),
        Err(TryLockError::WouldBlock) => Err(RuntimeError::WalInUse(dir)),
        Err(TryLockError::Error(e)) => Err(failed(e)),
    }
}

/// The node's WAL, under `wal/{node_id}/`: segment files on a local disk (one write and one
/// fdatasync per group commit; `segmentBytes` sets their size), one object per group commit on
/// object storage; in Postgres, one row per group commit, fenced by `node_epoch` (a process
/// still running at an older epoch can no longer write to it).
pub async fn wal(
    uri: &BucketUri,
    node_id: u32,
    node_epoch: u64,
) -> Result<Arc<dyn Wal>, RuntimeError> {
    let segment_bytes = uri
        .param_u64("segmentBytes")
        .map_err(|e| RuntimeError::Config(e.to_string()))?;
    if let Some(b) = segment_bytes {
        if uri.scheme != Scheme::File {
            return Err(RuntimeError::Config(format!(
                "segmentBytes applies to a file:// WAL only: `{uri}`"
            )));
        }
        if b < MIN_SEGMENT_BYTES {
            return Err(RuntimeError::Config(format!(
                "segmentBytes={b} is below the minimum of {MIN_SEGMENT_BYTES}"
            )));
        }
        if b > MAX_SEGMENT_BYTES {
            return Err(RuntimeError::Config(format!(
                "segmentBytes={b} is above the maximum of {MAX_SEGMENT_BYTES} (1 GiB)"
            )));
        }
    }
    match uri.scheme {
        Scheme::Postgres => match PgWal::open(&uri.location, node_id, node_epoch).await {
            Ok(w) => Ok(Arc::new(w)),
            Err(e) => {
                let at = pico_common::uri::redact(&uri.location);
                Err(match e {
                    PgWalError::Url(_) | PgWalError::Unsafe { .. } | PgWalError::EpochRange(_) => {
                        RuntimeError::Config(format!("WAL `{at}`: {e}"))
                    }
                    // No answer, or an answer a later try may not give (starting up, too
                    // many connections, ...): the node waits for it (see `startup`).
                    PgWalError::Db(_) | PgWalError::Timeout(_) => {
                        RuntimeError::Unreachable(format!("WAL `{at}`: {e}"))
                    }
                    _ => RuntimeError::Startup(format!("WAL `{at}`: {e}")),
                })
            }
        },
        Scheme::File => {
            // Opening the storage creates the root and clears temp files of a crashed put.
            object_storage(uri).await?;
            let dir = wal_dir(uri, node_id);
            let bytes = segment_bytes.unwrap_or(s3stream::segment_wal::DEFAULT_SEGMENT_BYTES);
            Ok(Arc::new(
                SegmentWal::with_segment_bytes(dir, bytes).with_preallocation(true),
            ))
        }
        _ => {
            let storage = object_storage(uri).await?;
            Ok(Arc::new(ObjectWal::new(storage, format!("wal/{node_id}"))))
        }
    }
}

/// Other nodes' WALs, for failover (pico-server's `PeerWals`): the same place as this node's,
/// for any node id. `None` for a WAL on local disk (`file://`), which no other node reads, and
/// for `memory://` (one process's own): failover is then off.
pub async fn peer_wals(uri: &BucketUri) -> Result<Option<Arc<dyn PeerWals>>, RuntimeError> {
    Ok(match uri.scheme {
        Scheme::Postgres => Some(Arc::new(PgPeerWals {
            url: uri.location.clone(),
        })),
        Scheme::File | Scheme::Memory => None,
        Scheme::S3 => Some(Arc::new(ObjectPeerWals {
            storage: object_storage(uri).await?,
        })),
    })
}

/// Postgres WALs: opening one at the fence epoch registers that epoch for the node, which
/// waits for the fenced process's append in flight and refuses every later one.
struct PgPeerWals {
    url: String,
}

impl std::fmt::Debug for PgPeerWals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PgPeerWals({})", pico_common::uri::redact(&self.url))
    }
}

#[async_trait::async_trait]
impl PeerWals for PgPeerWals {
    async fn open(&self, node_id: u32, fence_epoch: u64) -> Result<Arc<dyn Wal>, String> {
        match PgWal::open(&self.url, node_id, fence_epoch).await {
            Ok(w) => Ok(Arc::new(w)),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// Object-storage WALs (`wal/{node_id}/`): readable by anyone; the fenced process's later
/// appends are kept from being acknowledged by its acknowledgement window, not by the store.
struct ObjectPeerWals {
    storage: Arc<dyn ObjectStorage>,
}

impl std::fmt::Debug for ObjectPeerWals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectPeerWals")
    }
}

#[async_trait::async_trait]
impl PeerWals for ObjectPeerWals {
    async fn open(&self, node_id: u32, _fence_epoch: u64) -> Result<Arc<dyn Wal>, String> {
        Ok(Arc::new(ObjectWal::new(
            self.storage.clone(),
            format!("wal/{node_id}"),
        )))
    }
}

/// Upper bound of `maxInflightUploadCount`.
const MAX_INFLIGHT_UPLOADS: u64 = 64;

/// Engine settings from the WAL URI parameters (`batchInterval` ms, `maxBytesInBatch`,
/// `maxUnflushedBytes`, `maxInflightUploadCount`: object PUTs in flight).
pub fn engine_config(uri: &BucketUri) -> Result<EngineConfig, RuntimeError> {
    let bad = |e: pico_common::UriError| RuntimeError::Config(e.to_string());
    let mut cfg = EngineConfig::default();
    if let Some(ms) = uri.param_u64("batchInterval").map_err(bad)? {
        cfg.batch_interval = Duration::from_millis(ms);
    }
    if let Some(b) = uri.param_u64("maxBytesInBatch").map_err(bad)? {
        cfg.max_bytes_in_batch = b as usize;
    }
    if let Some(b) = uri.param_u64("maxUnflushedBytes").map_err(bad)? {
        cfg.max_unflushed_bytes = b as usize;
    }
    if let Some(n) = uri.param_u64("maxInflightUploadCount").map_err(bad)? {
        // Each cycle planned ahead holds copies of its small batches (up to 2x the upload
        // threshold), so the count bounds memory too.
        if !(1..=MAX_INFLIGHT_UPLOADS).contains(&n) {
            return Err(RuntimeError::Config(format!(
                "maxInflightUploadCount must be between 1 and {MAX_INFLIGHT_UPLOADS}: {n}"
            )));
        }
        cfg.upload_parallelism = usize::try_from(n).unwrap_or(usize::MAX);
    }
    Ok(cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn err(uri: &str) -> String {
        match wal(&BucketUri::parse(uri).unwrap(), 1, 1).await {
            Ok(_) => panic!("{uri} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[tokio::test]
    async fn a_postgres_wal_url_is_checked_before_connecting() {
        // Checked before connecting: no server needed.
        let e = err("-3@postgres://u:secret@127.0.0.1:1/db?allowUnsafe=maybe").await;
        assert!(e.contains("allowUnsafe"), "{e}");
        assert!(!e.contains("secret"), "password in an error: {e}");
    }

    #[tokio::test]
    async fn segment_bytes_is_checked() {
        let dir = tempfile::tempdir().unwrap();
        let ok = format!("-3@file://{}?segmentBytes=65536", dir.path().display());
        assert!(wal(&BucketUri::parse(&ok).unwrap(), 1, 1).await.is_ok());
        let small = format!("-3@file://{}?segmentBytes=100", dir.path().display());
        let e = err(&small).await;
        assert!(e.contains("below the minimum"), "{e}");
        let max = format!("-3@file://{}?segmentBytes=1073741824", dir.path().display());
        assert!(wal(&BucketUri::parse(&max).unwrap(), 1, 1).await.is_ok());
        let big = format!("-3@file://{}?segmentBytes=1073741825", dir.path().display());
        let e = err(&big).await;
        assert!(e.contains("above the maximum"), "{e}");
        let huge = format!(
            "-3@file://{}?segmentBytes={}",
            dir.path().display(),
            u64::MAX
        );
        let e = err(&huge).await;
        assert!(e.contains("above the maximum"), "{e}");
        let junk = format!("-3@file://{}?segmentBytes=lots", dir.path().display());
        let e = err(&junk).await;
        assert!(e.contains("segmentBytes"), "{e}");
        assert!(
            err("-3@memory://x?segmentBytes=65536")
                .await
                .contains("file:// WAL only")
        );
    }

    /// `s3://` URIs are parsed into the storage's settings; bad ones are refused by name,
    /// before any request (none is made here: the region is given, the endpoint never called).
    #[tokio::test]
    async fn s3_uris_open_s3_storage_and_bad_ones_are_refused() {
        let open = |uri: &str| {
            let uri = BucketUri::parse(uri).unwrap();
            async move { object_storage(&uri).await.map(|_| ()) }
        };
        let ok =
            "-2@s3://bucket/prefix?region=us-east-1&endpoint=http://127.0.0.1:1&pathStyle=true";
        assert!(open(ok).await.is_ok());
        for (uri, what) in [
            ("-2@s3://b?region=us-east-1&pathStyle=maybe", "pathStyle"),
            ("-2@s3://b?region=us-east-1&concurrency=0", "concurrency"),
            (
                "-2@s3://b?region=us-east-1&endpoint=127.0.0.1:9000",
                "endpoint",
            ),
        ] {
            match open(uri).await {
                Err(e @ RuntimeError::Config(_)) => assert!(e.to_string().contains(what), "{e}"),
                other => panic!("{uri}: {other:?}"),
            }
        }
        // An object WAL on S3 opens the same way (no local directory to lock).
        let wal_uri = BucketUri::parse(&ok.replace("-2@", "-3@")).unwrap();
        assert!(lock_wal(&wal_uri, 1).unwrap().is_none());
        assert!(wal(&wal_uri, 1, 1).await.is_ok());
    }

    #[test]
    fn a_local_wal_directory_is_locked_by_one_holder_at_a_time() {
        let dir = tempfile::tempdir().unwrap();
        let uri = BucketUri::parse(&format!("-3@file://{}/w", dir.path().display())).unwrap();
        let first = lock_wal(&uri, 1).unwrap();
        assert!(first.is_some());
        assert!(dir.path().join("w/wal/1/LOCK").is_file());
        match lock_wal(&uri, 1) {
            Err(e @ RuntimeError::WalInUse(_)) => {
                let msg = e.to_string();
                assert!(msg.contains("in use by another process"), "{msg}");
                assert!(msg.contains(&format!("{}", dir.path().join("w/wal/1").display())));
            }
            other => panic!("second lock: {other:?}"),
        }
        // Another node's directory is its own.
        assert!(lock_wal(&uri, 2).unwrap().is_some());
        drop(first);
        assert!(lock_wal(&uri, 1).unwrap().is_some());
        // Nothing to lock for a WAL that is not a local directory.
        let mem = BucketUri::parse("-3@memory://w").unwrap();
        assert!(lock_wal(&mem, 1).unwrap().is_none());
    }

    #[test]
    fn engine_parameters_are_read_from_the_wal_uri() {
        let cfg = |uri: &str| engine_config(&BucketUri::parse(uri).unwrap());
        let c = cfg("-3@file:///w?maxInflightUploadCount=8&maxUnflushedBytes=1048576").unwrap();
        assert_eq!(c.upload_parallelism, 8);
        assert_eq!(c.max_unflushed_bytes, 1 << 20);
        assert_eq!(
            cfg("-3@file:///w").unwrap().upload_parallelism,
            EngineConfig::default().upload_parallelism
        );
        let zero = cfg("-3@file:///w?maxInflightUploadCount=0").unwrap_err();
        assert!(zero.to_string().contains("between 1 and 64"), "{zero}");
        assert!(cfg("-3@file:///w?maxInflightUploadCount=65").is_err());
        assert!(cfg("-3@file:///w?maxInflightUploadCount=many").is_err());
    }
}
