//! Test doubles shared with the host's tests: an in-memory `Catalog` with the fencing rules the
//! host enforces, a `Wal` wrapper that counts writes and injects failures, and an object
//! storage wrapper whose puts take time, overlap and fail on demand.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;

use crate::engine::{Catalog, CatalogError, ObjectCommit, ObjectSlice};
use crate::parts::Parts;
use crate::storage::{ObjectStorage, StorageError, take_failure};
use crate::wal::{Wal, WalError, WalRecord};

#[derive(Debug)]
struct StreamMeta {
    /// Ranges below this epoch are fenced.
    min_epoch: i64,
    last_epoch: i64,
    end: u64,
    slices: Vec<ObjectSlice>,
    aux: Vec<Bytes>,
}

impl Default for StreamMeta {
    fn default() -> Self {
        StreamMeta {
            min_epoch: i64::MIN,
            last_epoch: i64::MIN,
            end: 0,
            slices: Vec::new(),
            aux: Vec::new(),
        }
    }
}

#[derive(Debug, Default)]
struct CatalogState {
    streams: HashMap<u64, StreamMeta>,
    commits: Vec<ObjectCommit>,
}

/// In-memory catalog. A range is accepted iff it starts at the stream's committed end and its
/// epoch is >= both the fence set with `fence` and the last accepted epoch.
#[derive(Debug, Default)]
pub struct MemCatalog {
    state: Mutex<CatalogState>,
    fail_commits: AtomicUsize,
    hang_commits: AtomicUsize,
    hang_after_commits: AtomicUsize,
}

impl MemCatalog {
    pub fn new() -> MemCatalog {
        MemCatalog::default()
    }

    fn lock(&self) -> MutexGuard<'_, CatalogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next `n` commits fail transiently (nothing is applied).
    pub fn fail_commits(&self, n: usize) {
        self.fail_commits.store(n, Ordering::SeqCst);
    }

    /// The next `n` commits never answer (nothing is applied): a hung metadata store.
    pub fn hang_commits(&self, n: usize) {
        self.hang_commits.store(n, Ordering::SeqCst);
    }

    /// The next `n` commits are applied, then never answer: a commit that landed with its
    /// answer lost.
    pub fn hang_after_commits(&self, n: usize) {
        self.hang_after_commits.store(n, Ordering::SeqCst);
    }

    /// Fences the stream: ranges with an epoch below `min_epoch` are rejected from now on
    /// (what the host does when a stream is opened at a new epoch).
    pub fn fence(&self, stream: u64, min_epoch: i64) {
        let mut st = self.lock();
        let m = st.streams.entry(stream).or_default();
        m.min_epoch = m.min_epoch.max(min_epoch);
    }

    /// Every commit call that was applied (accepted or not), in order.
    pub fn commits(&self) -> Vec<ObjectCommit> {
        self.lock().commits.clone()
    }

    /// Aux blobs of the accepted ranges of a stream, in order.
    pub fn aux(&self, stream: u64) -> Vec<Bytes> {
        self.lock()
            .streams
            .get(&stream)
            .map(|m| m.aux.clone())
            .unwrap_or_default()
    }

    /// Drops a stream's metadata (stream deleted).
    pub fn delete_stream(&self, stream: u64) {
        self.lock().streams.remove(&stream);
    }
}

#[async_trait::async_trait]
impl Catalog for MemCatalog {
    fn slices(&self, stream: u64, from_offset: u64, max: usize) -> Vec<ObjectSlice> {
        let st = self.lock();
        let Some(m) = st.streams.get(&stream) else {
            return Vec::new();
        };
        let i = m.slices.partition_point(|s| s.end_offset <= from_offset);
        m.slices[i..].iter().take(max).cloned().collect()
    }

    fn committed_end(&self, stream: u64) -> u64 {
        self.lock().streams.get(&stream).map_or(0, |m| m.end)
    }

    async fn commit(&self, commit: ObjectCommit) -> Result<Vec<bool>, CatalogError> {
        if take_failure(&self.fail_commits) {
            return Err(CatalogError("injected commit failure".into()));
        }
        if take_failure(&self.hang_commits) {
            std::future::pending::<()>().await;
        }
        let out = self.apply(commit);
        if take_failure(&self.hang_after_commits) {
            std::future::pending::<()>().await;
        }
        Ok(out)
    }
}

impl MemCatalog {
    /// Applies a commit (or answers a retry of one that landed).
    fn apply(&self, commit: ObjectCommit) -> Vec<bool> {
        let mut st = self.lock();
        if st.commits.iter().any(|c| c.key == commit.key) {
            // A retry of a commit that landed: answer from what it left.
            let landed = |r: &crate::CommitRange| {
                st.streams.get(&r.stream).is_some_and(|m| {
                    m.slices
                        .iter()
                        .any(|s| s.key == commit.key && s.start_offset == r.start_offset)
                })
            };
            return commit.ranges.iter().map(landed).collect();
        }
        let mut out = Vec::with_capacity(commit.ranges.len());
        for r in &commit.ranges {
            let m = st.streams.entry(r.stream).or_default();
            let ok = r.start_offset == m.end
                && r.end_offset > r.start_offset
                && r.epoch >= m.min_epoch
                && r.epoch >= m.last_epoch;
            if ok {
                m.end = r.end_offset;
                m.last_epoch = r.epoch;
                m.aux.extend(r.aux.iter().map(|a| a.aux.clone()));
                m.slices.push(ObjectSlice {
                    key: commit.key.clone(),
                    start_offset: r.start_offset,
                    end_offset: r.end_offset,
                    position: r.position,
                    len: r.len,
                });
            }
            out.push(ok);
        }
        st.commits.push(commit);
        out
    }
}

/// Wraps a `Wal`: counts appends and records, and fails the next n appends on demand.
pub struct FaultWal {
    inner: Arc<dyn Wal>,
    fail_appends: AtomicUsize,
    fenced: AtomicBool,
    attempts: AtomicU64,
    skip_trims: AtomicBool,
    appends: AtomicU64,
    records: AtomicU64,
    trims: AtomicU64,
    trimmed: Mutex<Vec<u64>>,
    hold: tokio::sync::watch::Sender<bool>,
}

impl FaultWal {
    pub fn new(inner: Arc<dyn Wal>) -> FaultWal {
        FaultWal {
            inner,
            fail_appends: AtomicUsize::new(0),
            fenced: AtomicBool::new(false),
            attempts: AtomicU64::new(0),
            skip_trims: AtomicBool::new(false),
            appends: AtomicU64::new(0),
            records: AtomicU64::new(0),
            trims: AtomicU64::new(0),
            trimmed: Mutex::new(Vec::new()),
            hold: tokio::sync::watch::channel(false).0,
        }
    }

    /// While set, appends wait before they start (a stalled disk).
    pub fn hold_appends(&self, hold: bool) {
        self.hold.send_replace(hold);
    }

    /// The next `n` appends fail without writing.
    pub fn fail_appends(&self, n: usize) {
        self.fail_appends.store(n, Ordering::SeqCst);
    }

    /// While set, appends fail as fenced: a newer incarnation of the node took the WAL over.
    pub fn fence(&self, fenced: bool) {
        self.fenced.store(fenced, Ordering::SeqCst);
    }

    /// Appends attempted so far, failed ones included.
    pub fn append_attempts(&self) -> u64 {
        self.attempts.load(Ordering::SeqCst)
    }

    /// While set, `trim` returns Ok without trimming: a crash between commit and trim.
    pub fn skip_trims(&self, skip: bool) {
        self.skip_trims.store(skip, Ordering::SeqCst);
    }

    /// Trims performed (not skipped) so far.
    pub fn trim_count(&self) -> u64 {
        self.trims.load(Ordering::SeqCst)
    }

    /// The positions of the trims performed, in order.
    pub fn trimmed(&self) -> Vec<u64> {
        self.trimmed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Successful appends so far.
    pub fn append_count(&self) -> u64 {
        self.appends.load(Ordering::SeqCst)
    }

    /// Records in successful appends so far.
    pub fn record_count(&self) -> u64 {
        self.records.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Wal for FaultWal {
    async fn append(&self, records: Vec<WalRecord>) -> Result<u64, WalError> {
        // The sender lives in `self`, so the wait ends only when the hold is lifted.
        let _ = self.hold.subscribe().wait_for(|held| !*held).await;
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.fenced.load(Ordering::SeqCst) {
            return Err(WalError::Fenced(
                "injected: a newer epoch holds the wal".into(),
            ));
        }
        if take_failure(&self.fail_appends) {
            return Err(WalError::Other("injected append failure".into()));
        }
        let n = records.len() as u64;
        let pos = self.inner.append(records).await?;
        self.appends.fetch_add(1, Ordering::SeqCst);
        self.records.fetch_add(n, Ordering::SeqCst);
        Ok(pos)
    }

    async fn recover(&self) -> Result<Vec<(u64, Vec<WalRecord>)>, WalError> {
        self.inner.recover().await
    }

    async fn trim(&self, upto: u64) -> Result<(), WalError> {
        if self.skip_trims.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.inner.trim(upto).await?;
        self.trims.fetch_add(1, Ordering::SeqCst);
        self.trimmed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(upto);
        Ok(())
    }
}

/// How long the nth put (counted from 0) under the prefix takes, given its size in bytes.
pub type PutDelay = Box<dyn Fn(u64, usize) -> std::time::Duration + Send + Sync>;

/// Wraps an `ObjectStorage`: puts of keys under `prefix` sleep first (as a remote store's
/// latency), may fail on demand, and are counted: how many overlapped at most, and the order
/// in which they finished. Other keys (a WAL on the same storage) pass straight through.
pub struct SlowStorage {
    inner: Arc<dyn ObjectStorage>,
    prefix: String,
    delay: PutDelay,
    fail_puts: AtomicUsize,
    fail_nth: AtomicU64,
    started: AtomicU64,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    finished: Mutex<Vec<String>>,
}

impl SlowStorage {
    pub fn new(inner: Arc<dyn ObjectStorage>, prefix: &str, delay: PutDelay) -> SlowStorage {
        SlowStorage {
            inner,
            prefix: prefix.to_string(),
            delay,
            fail_puts: AtomicUsize::new(0),
            fail_nth: AtomicU64::new(u64::MAX),
            started: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            finished: Mutex::new(Vec::new()),
        }
    }

    /// The next `n` puts under the prefix fail after their delay, storing nothing.
    pub fn fail_puts(&self, n: usize) {
        self.fail_puts.store(n, Ordering::SeqCst);
    }

    /// The put under the prefix started `nth` (counted from 0) fails after its delay.
    pub fn fail_put_number(&self, nth: u64) {
        self.fail_nth.store(nth, Ordering::SeqCst);
    }

    /// The most puts under the prefix that were in flight at once.
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(Ordering::SeqCst)
    }

    /// Keys of the successful puts under the prefix, in the order they finished.
    pub fn finished(&self) -> Vec<String> {
        self.finished
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    async fn slow_put(&self, key: &str, parts: Parts) -> Result<(), StorageError> {
        let nth = self.started.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep((self.delay)(nth, parts.len())).await;
        let failed = nth == self.fail_nth.load(Ordering::SeqCst) || take_failure(&self.fail_puts);
        let result = if failed {
            Err(StorageError::Other(format!(
                "injected put failure: key=`{key}`"
            )))
        } else {
            self.inner.put_parts(key, parts).await
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        if result.is_ok() {
            self.finished
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(key.to_string());
        }
        result
    }
}

#[async_trait::async_trait]
impl ObjectStorage for SlowStorage {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        if key.starts_with(&self.prefix) {
            self.slow_put(key, Parts::from(data)).await
        } else {
            self.inner.put(key, data).await
        }
    }

    async fn put_parts(&self, key: &str, parts: Parts) -> Result<(), StorageError> {
        if key.starts_with(&self.prefix) {
            self.slow_put(key, parts).await
        } else {
            self.inner.put_parts(key, parts).await
        }
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        self.inner.get(key).await
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError> {
        self.inner.get_range(key, start, len).await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.inner.list(prefix).await
    }
}
