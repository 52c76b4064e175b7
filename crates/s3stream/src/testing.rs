//! Test doubles shared with the host's tests: an in-memory `Catalog` with the fencing rules the
//! host enforces, a `Wal` wrapper that counts writes and injects failures, an object
//! storage wrapper whose puts take time, overlap and fail on demand (`SlowStorage`), and one
//! that injects faults into every operation of any backend (`FaultStorage`).

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

/// Starts an engine on `data` and `wal` with a fresh [`MemCatalog`] and no durable hook: the
/// examples' engine, where only the data path is measured.
pub async fn start_on_mem_catalog(
    cfg: crate::EngineConfig,
    data: Arc<dyn ObjectStorage>,
    wal: Arc<dyn Wal>,
) -> crate::Engine {
    let (engine, _) = crate::Engine::start(
        cfg,
        data,
        wal,
        Arc::new(MemCatalog::new()),
        Arc::new(|_, _| {}),
    )
    .await
    .expect("engine starts on an empty catalog");
    engine
}

/// In-memory catalog. A range is accepted iff it starts at the stream's committed end and its
/// epoch is >= both the fence set with `fence` and the last accepted epoch.
#[derive(Debug, Default)]
pub struct MemCatalog {
    state: Mutex<CatalogState>,
    fail_commits: AtomicUsize,
    hang_commits: AtomicUsize,
    hang_after_commits: AtomicUsize,
    fenced: AtomicBool,
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

    /// Fences the committer as a whole (what the host's catalog answers once the node's
    /// incarnation is fenced): every commit from now on is [`CatalogError::Fenced`].
    pub fn fence_node(&self) {
        self.fenced.store(true, Ordering::SeqCst);
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
        if self.fenced.load(Ordering::SeqCst) {
            return Err(CatalogError::Fenced("stale node epoch (test)".into()));
        }
        if take_failure(&self.fail_commits) {
            return Err(CatalogError::Unavailable("injected commit failure".into()));
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

impl FaultWal {
    /// The injected failures, checked as an append starts (after any hold).
    fn injected(&self) -> Result<(), WalError> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        if self.fenced.load(Ordering::SeqCst) {
            return Err(WalError::Fenced(
                "injected: a newer epoch holds the wal".into(),
            ));
        }
        if take_failure(&self.fail_appends) {
            return Err(WalError::Other("injected append failure".into()));
        }
        Ok(())
    }

    fn count(&self, records: u64) {
        self.appends.fetch_add(1, Ordering::SeqCst);
        self.records.fetch_add(records, Ordering::SeqCst);
    }
}

/// A synchronous inner WAL stays synchronous through the wrapper, so engine tests run the
/// writer thread that production runs on it.
impl crate::wal::BlockingAppend for FaultWal {
    fn append_sync(&self, records: &[WalRecord]) -> Result<u64, WalError> {
        // A stalled disk: this thread does nothing else, so it may wait by polling.
        while *self.hold.borrow() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        self.injected()?;
        let inner = self
            .inner
            .blocking()
            .ok_or_else(|| WalError::Other("inner wal is not synchronous".into()))?;
        let pos = inner.append_sync(records)?;
        self.count(records.len() as u64);
        Ok(pos)
    }
}

#[async_trait::async_trait]
impl Wal for FaultWal {
    fn blocking(&self) -> Option<&dyn crate::wal::BlockingAppend> {
        self.inner.blocking().map(|_| self as _)
    }

    fn fences_earlier_writers(&self) -> bool {
        self.inner.fences_earlier_writers()
    }

    async fn append(&self, records: Vec<WalRecord>) -> Result<u64, WalError> {
        // The sender lives in `self`, so the wait ends only when the hold is lifted.
        let _ = self.hold.subscribe().wait_for(|held| !*held).await;
        self.injected()?;
        let n = records.len() as u64;
        let pos = self.inner.append(records).await?;
        self.count(n);
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

    /// Conditional creates (the object WAL's) are not slowed: they pass straight through.
    async fn put_if_absent(&self, key: &str, parts: Parts) -> Result<bool, StorageError> {
        self.inner.put_if_absent(key, parts).await
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

/// An object-store operation, as [`FaultStorage`] schedules faults for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `put`, `put_parts` (and any other write a backend adds).
    Put,
    Get,
    GetRange,
    Delete,
    List,
}

/// A fault [`FaultStorage`] injects into one operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The store answers with an error; nothing happened (S3's 500 / 503 SlowDown).
    Error,
    /// The connection is reset before the request reached the store; nothing happened.
    Reset,
    /// The operation ran on the store but its answer was lost on the way back (a put that
    /// landed, answered by a timeout). Lists still run whole: S3 lists are strongly consistent,
    /// so a list is never short of keys, only its answer can be lost.
    LostAnswer,
}

/// A seeded random schedule: each operation in scope draws its latency and at most one fault.
/// The same seed and the same order of operations give the same faults.
#[derive(Clone, Debug)]
pub struct FaultSchedule {
    pub seed: u64,
    /// Probability (0..=1) that an operation fails with [`Fault::Error`].
    pub error: f64,
    /// Probability that an operation fails with [`Fault::Reset`].
    pub reset: f64,
    /// Probability that an operation runs and its answer is lost ([`Fault::LostAnswer`]).
    pub lost_answer: f64,
    /// Each operation first waits a uniform random time up to this.
    pub max_latency: std::time::Duration,
}

impl FaultSchedule {
    /// No faults, no latency: a base to set a few fields on.
    pub fn quiet(seed: u64) -> FaultSchedule {
        FaultSchedule {
            seed,
            error: 0.0,
            reset: 0.0,
            lost_answer: 0.0,
            max_latency: std::time::Duration::ZERO,
        }
    }
}

/// splitmix64: a seeded, dependency-free generator (reproducible fault schedules).
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Default)]
struct FaultPlan {
    /// Faults for the next operations in scope, taken in order before the schedule is asked.
    queued: std::collections::VecDeque<(Option<Op>, Fault)>,
    schedule: Option<(FaultSchedule, Rng)>,
    /// Added to every operation in scope.
    latency: std::time::Duration,
}

/// Wraps any `ObjectStorage` and injects faults into the operations on keys under its scope:
/// errors, connection resets, lost answers and latency, from a seeded [`FaultSchedule`] or by
/// explicit switches ([`FaultStorage::fail_next`], [`FaultStorage::set_down`]). Every trait
/// method goes through [`FaultStorage::run`], so a method added to the trait is one line here.
pub struct FaultStorage {
    inner: Arc<dyn ObjectStorage>,
    /// Only keys starting with this are faulted ("" = all).
    scope: String,
    /// While set, every operation in scope fails with `Fault::Error`: a store that is down.
    down: AtomicBool,
    plan: Mutex<FaultPlan>,
    ops: AtomicU64,
    injected: AtomicU64,
}

impl FaultStorage {
    pub fn new(inner: Arc<dyn ObjectStorage>) -> FaultStorage {
        FaultStorage::scoped(inner, "")
    }

    /// Faults only keys starting with `scope` (e.g. the data objects, not the WAL).
    pub fn scoped(inner: Arc<dyn ObjectStorage>, scope: &str) -> FaultStorage {
        FaultStorage {
            inner,
            scope: scope.to_string(),
            down: AtomicBool::new(false),
            plan: Mutex::new(FaultPlan::default()),
            ops: AtomicU64::new(0),
            injected: AtomicU64::new(0),
        }
    }

    /// The wrapped store (to check what really landed).
    pub fn inner(&self) -> &Arc<dyn ObjectStorage> {
        &self.inner
    }

    fn plan(&self) -> MutexGuard<'_, FaultPlan> {
        self.plan.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Draws faults from `schedule` from now on (replacing any earlier one).
    pub fn set_schedule(&self, schedule: FaultSchedule) {
        let rng = Rng(schedule.seed);
        self.plan().schedule = Some((schedule, rng));
    }

    /// Stops the random schedule (queued faults and `down` stay).
    pub fn clear_schedule(&self) {
        self.plan().schedule = None;
    }

    /// The next operation in scope (of kind `op`, or any kind with `None`) gets `fault`.
    /// Queued faults are taken in order, one per operation.
    pub fn fail_next(&self, op: Option<Op>, fault: Fault) {
        self.plan().queued.push_back((op, fault));
    }

    /// A persistent fault: while `down`, every operation in scope fails, until set back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Latency added to every operation in scope.
    pub fn set_latency(&self, latency: std::time::Duration) {
        self.plan().latency = latency;
    }

    /// Lifts every fault: no schedule, nothing queued, not down, no latency.
    pub fn heal(&self) {
        self.set_down(false);
        *self.plan() = FaultPlan::default();
    }

    /// Operations in scope so far (faulted or not).
    pub fn op_count(&self) -> u64 {
        self.ops.load(Ordering::SeqCst)
    }

    /// Faults injected so far.
    pub fn injected_count(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    /// The fault (if any) and latency for one operation.
    fn decide(&self, op: Op) -> (Option<Fault>, std::time::Duration) {
        self.ops.fetch_add(1, Ordering::SeqCst);
        let mut plan = self.plan();
        let mut latency = plan.latency;
        let mut fault = None;
        if self.down.load(Ordering::SeqCst) {
            fault = Some(Fault::Error);
        } else if let Some(i) = plan
            .queued
            .iter()
            .position(|(o, _)| o.is_none_or(|o| o == op))
        {
            fault = plan.queued.remove(i).map(|(_, f)| f);
        } else if let Some((s, rng)) = plan.schedule.as_mut() {
            latency += s.max_latency.mul_f64(rng.unit());
            let x = rng.unit();
            fault = if x < s.error {
                Some(Fault::Error)
            } else if x < s.error + s.reset {
                Some(Fault::Reset)
            } else if x < s.error + s.reset + s.lost_answer {
                Some(Fault::LostAnswer)
            } else {
                None
            };
        }
        if fault.is_some() {
            self.injected.fetch_add(1, Ordering::SeqCst);
        }
        (fault, latency)
    }

    /// Runs one operation on `key` through the fault plan: `call` is the inner store's call.
    pub async fn run<T, F>(&self, op: Op, key: &str, call: F) -> Result<T, StorageError>
    where
        F: std::future::Future<Output = Result<T, StorageError>>,
    {
        if !key.starts_with(&self.scope) {
            return call.await;
        }
        let (fault, latency) = self.decide(op);
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match fault {
            None => call.await,
            Some(Fault::Error) => Err(StorageError::Other(format!(
                "injected fault: store error on {op:?} key=`{key}`"
            ))),
            Some(Fault::Reset) => Err(StorageError::Io {
                key: key.to_string(),
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "injected fault: connection reset",
                ),
            }),
            Some(Fault::LostAnswer) => {
                let landed = call.await;
                Err(StorageError::Io {
                    key: key.to_string(),
                    source: std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!(
                            "injected fault: answer lost (the {op:?} {} on the store)",
                            if landed.is_ok() { "ran" } else { "failed" }
                        ),
                    ),
                })
            }
        }
    }
}

#[async_trait::async_trait]
impl ObjectStorage for FaultStorage {
    async fn put(&self, key: &str, data: Bytes) -> Result<(), StorageError> {
        self.run(Op::Put, key, self.inner.put(key, data)).await
    }

    async fn put_parts(&self, key: &str, parts: Parts) -> Result<(), StorageError> {
        self.run(Op::Put, key, self.inner.put_parts(key, parts))
            .await
    }

    async fn put_if_absent(&self, key: &str, parts: Parts) -> Result<bool, StorageError> {
        self.run(Op::Put, key, self.inner.put_if_absent(key, parts))
            .await
    }

    async fn get(&self, key: &str) -> Result<Bytes, StorageError> {
        self.run(Op::Get, key, self.inner.get(key)).await
    }

    async fn get_range(&self, key: &str, start: u64, len: u64) -> Result<Bytes, StorageError> {
        self.run(Op::GetRange, key, self.inner.get_range(key, start, len))
            .await
    }

    async fn delete(&self, key: &str) -> Result<(), StorageError> {
        self.run(Op::Delete, key, self.inner.delete(key)).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>, StorageError> {
        self.run(Op::List, prefix, self.inner.list(prefix)).await
    }
}
