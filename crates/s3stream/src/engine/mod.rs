//! The engine: the only writer of record data.
//!
//! - `writer`: the WAL writer task (group commit, ordered acks, durable hook).
//! - `uploader`: packs durable data into objects, commits them through the `Catalog`, trims the WAL.
//! - `recovery`: which WAL records to replay at start (pure).
//! - `log_cache`: recent durable batches of open streams.
//! - `block_cache`: slices read back from objects.
//! - `read`: the read path over both caches and object storage.
//!
//! `Engine` is cheap to clone (an `Arc` inside). Dropping the last clone aborts the background
//! tasks without flushing, which is exactly a crash as far as storage is concerned.

mod block_cache;
mod log_cache;
mod read;
mod recovery;
mod uploader;
mod writer;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::format::FormatError;
pub use crate::format::StoredBatch;
use crate::storage::{ObjectStorage, StorageError};
use crate::telemetry;
use crate::wal::{Wal, WalError, WalRecord};

use block_cache::BlockCache;
use log_cache::LogCache;

/// A map keyed by an engine-internal integer id (a stream id, a generation), as the append
/// path looks them up several times per append under the state lock: foldhash (randomly
/// seeded, a few instructions per `u64`) rather than SipHash. The ids are assigned by the
/// metadata service, not chosen by clients.
pub(crate) type IdMap<V> = HashMap<u64, V, foldhash::fast::RandomState>;
/// The set form of [`IdMap`].
pub(crate) type IdSet = HashSet<u64, foldhash::fast::RandomState>;

/// Upper bound of one committed slice: a stream's data in one upload is split into ranges of
/// about this size, so a read fetches (and the block cache holds) bounded pieces.
pub const SLICE_TARGET_BYTES: usize = 1024 * 1024;

/// Per-append bookkeeping charged against `max_unflushed_bytes` so that empty batches are
/// bounded too.
const APPEND_OVERHEAD_BYTES: usize = 64;

#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub node_id: u32,
    pub node_epoch: u64,
    /// Extra wait for more appends before a WAL write; 0 (default) = write as soon as the
    /// writer is free, batching whatever queued meanwhile.
    pub batch_interval: Duration,
    /// One WAL write at most this big (a single larger append is written alone).
    pub max_bytes_in_batch: usize,
    /// Appended-but-not-uploaded bytes; above it `append` waits (backpressure).
    pub max_unflushed_bytes: usize,
    /// The uploader wakes at least this often.
    pub upload_interval: Duration,
    /// Upload early when unuploaded bytes exceed this.
    pub upload_threshold_bytes: usize,
    /// A stream with at least this many bytes in one upload gets its own object.
    pub stream_object_min_bytes: usize,
    /// Upload cycles planned ahead, and object PUTs in flight, at most (commits stay in order).
    pub upload_parallelism: usize,
    /// An object PUT or catalog commit not answered within this fails and is retried (both
    /// are idempotent: same key, same bytes), so a hung store shows as upload errors instead
    /// of a silent stall of every upload behind it. A PUT gets one more second per MiB.
    pub upload_timeout: Duration,
    /// Uploaded data kept for reads (unuploaded data is always kept), bookkeeping included.
    pub log_cache_bytes: usize,
    /// Cache of object slices read from storage, bookkeeping included.
    pub block_cache_bytes: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            node_id: 0,
            node_epoch: 0,
            // Natural group commit: the writer takes whatever queued while the previous WAL
            // write was in flight. A fixed window only adds latency when the writer is idle
            // (1 ms measured as +2.2 ms p50 for a lone client, and -20% throughput under load,
            // because tokio's timer rounds the window up to the next millisecond tick).
            batch_interval: Duration::ZERO,
            max_bytes_in_batch: 4 << 20,
            max_unflushed_bytes: 256 << 20,
            upload_interval: Duration::from_secs(1),
            upload_threshold_bytes: 16 << 20,
            stream_object_min_bytes: 8 << 20,
            upload_parallelism: 4,
            upload_timeout: Duration::from_secs(60),
            log_cache_bytes: 128 << 20,
            block_cache_bytes: 64 << 20,
        }
    }
}

#[derive(Clone, Debug)]
pub struct AppendRequest {
    pub stream: u64,
    pub epoch: i64,
    pub record_count: u32,
    pub batch: Bytes,
    /// `crc32c(batch)` when the caller has it without a pass over the batch (it just encoded
    /// it); computed by `append` otherwise. Must match: the WAL and the data objects checksum
    /// the batch with it.
    pub batch_crc: Option<u32>,
    pub aux: Bytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Appended {
    pub base_offset: u64,
    pub next_offset: u64,
}

/// An append with its offsets assigned, waiting for its WAL write.
#[derive(Debug)]
pub struct PendingAppend {
    pub base_offset: u64,
    pub next_offset: u64,
    ack: oneshot::Receiver<Result<Appended, EngineError>>,
    /// Under a leader-style writer (`writer::Leader`): this append may write its own group.
    lead: Option<writer::Lead>,
}

impl PendingAppend {
    /// Resolves once the WAL write holding this append is durable.
    pub async fn durable(self) -> Result<Appended, EngineError> {
        self.await
    }
}

/// The same wait as [`PendingAppend::durable`], polled in place: a caller can keep the append
/// in a guard that hands it to a task if the caller is dropped first. Not to be polled again
/// once it has answered.
impl std::future::Future for PendingAppend {
    type Output = Result<Appended, EngineError>;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let this = &mut *self;
        writer::poll_ack(&mut this.ack, &mut this.lead, cx)
    }
}

/// Committed object slice of one stream, as recorded by the host's metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct ObjectSlice {
    pub key: String,
    pub start_offset: u64,
    pub end_offset: u64,
    pub position: u64,
    pub len: u64,
}

/// One contiguous range of one stream inside an uploaded object. An object may hold several
/// consecutive ranges of the same stream (slices are bounded by `SLICE_TARGET_BYTES`); they
/// appear in offset order and must be applied in order.
#[derive(Clone, Debug, PartialEq)]
pub struct CommitRange {
    pub stream: u64,
    pub epoch: i64,
    pub start_offset: u64,
    pub end_offset: u64,
    pub position: u64,
    pub len: u64,
    /// Non-empty aux blobs of the appends in this range, in order.
    pub aux: Vec<RangeAux>,
}

/// One append's aux blob in a [`CommitRange`], with the offsets the append was given: the host
/// keeps them with what the blob describes (a producer's last append, so that its retry can be
/// answered with where the records lie).
#[derive(Clone, Debug, PartialEq)]
pub struct RangeAux {
    pub base_offset: u64,
    pub next_offset: u64,
    pub aux: Bytes,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ObjectCommit {
    pub key: String,
    pub size: u64,
    pub ranges: Vec<CommitRange>,
}

/// Provided by the host; backed by its metadata view and log.
#[async_trait::async_trait]
pub trait Catalog: Send + Sync + 'static {
    /// Committed slices of `stream` with end_offset > from_offset, ascending, at most `max`.
    fn slices(&self, stream: u64, from_offset: u64, max: usize) -> Vec<ObjectSlice>;
    /// End of committed data for the stream (0 if none / unknown).
    fn committed_end(&self, stream: u64) -> u64;
    /// Make an uploaded object visible. Returns, per range, whether it was accepted (false =
    /// that stream fenced this range: stale stream epoch or non-contiguous; its data is
    /// dropped, never retried). [`CatalogError::Unavailable`] = transient, retried later with
    /// the same object. The engine may drop a call that takes longer than `upload_timeout` and
    /// retry it, so a commit of a key that already landed must answer what the landed one
    /// did, not reject it as non-contiguous. A committer that was fenced as a whole answers
    /// [`CatalogError::Fenced`], never per-range `false`: see there.
    async fn commit(&self, commit: ObjectCommit) -> Result<Vec<bool>, CatalogError>;
}

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// Transient (the metadata store unreachable, a timeout): the same object is committed
    /// again later.
    #[error("catalog: {0}")]
    Unavailable(String),
    /// The committer itself (this node's incarnation) was fenced: it commits nothing more.
    /// Its WAL now belongs to whoever recovers it (failover, or the node's next incarnation),
    /// so the engine neither drops nor trims anything of it: the uploader stops, and waits for
    /// its progress fail with [`EngineError::WalFenced`]. Answering per-range `false` instead
    /// would let this process trim WAL entries it acknowledged before their recoverer read
    /// them.
    #[error("catalog: this node is fenced, it commits nothing more: {0}")]
    Fenced(String),
}

/// Called by the WAL writer after each durable write, once per stream in it, in order,
/// with the stream's new durable end offset.
pub type DurableHook = Arc<dyn Fn(u64, u64) + Send + Sync>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryReport {
    pub wal_entries: usize,
    pub records_replayed: usize,
    /// (stream, epoch, committed end) of every stream that had records replayed.
    pub streams: Vec<(u64, i64, u64)>,
    /// Records not replayed: already committed, duplicates, stale epochs, or rejected.
    pub skipped: usize,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub open_streams: usize,
    /// Log cache bytes charged: payload plus a fixed bookkeeping overhead per batch.
    pub log_cache_bytes: usize,
    pub log_cache_uploaded_bytes: usize,
    pub unuploaded_bytes: usize,
    pub wal_writes: u64,
    pub wal_write_failures: u64,
    pub appends: u64,
    pub uploads: u64,
    pub upload_failures: u64,
    pub rejected_ranges: u64,
    /// Block cache bytes charged: payload, key and a fixed bookkeeping overhead per block.
    pub block_cache_bytes: usize,
    pub block_cache_hits: u64,
    pub block_cache_misses: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("stream not open on this engine: stream={stream}")]
    NotOpen { stream: u64 },
    #[error("stale epoch: stream={stream} epoch={epoch} current={current}")]
    StaleEpoch {
        stream: u64,
        epoch: i64,
        current: i64,
    },
    #[error("stream broken by a failed durable write, re-open it: stream={stream}")]
    Broken { stream: u64 },
    #[error("engine shutting down")]
    ShuttingDown,
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("wal write failed, append not durable: {0}")]
    Durability(String),
    /// A newer incarnation of this node registered a higher epoch on the WAL: this process is
    /// superseded, nothing was written, and no retry here can succeed.
    #[error("wal fenced, append not written (a newer incarnation owns the wal): {0}")]
    WalFenced(String),
    #[error("upload failed: {0}")]
    Upload(String),
    /// The append found no queue space and gave up waiting for it (uploads keep failing):
    /// nothing was written and no offset assigned, so the stream's state is unchanged.
    #[error("no room to queue the append, nothing written: {0}")]
    NoRoom(String),
    #[error("storage: {0}")]
    Storage(#[from] StorageError),
    #[error("wal: {0}")]
    Wal(#[from] WalError),
    #[error(transparent)]
    Catalog(#[from] CatalogError),
    #[error("corrupt data: key=`{key}`: {source}")]
    Corrupt {
        key: String,
        #[source]
        source: FormatError,
    },
}

// ---------------------------------------------------------------------------------------------
// Shared state
// ---------------------------------------------------------------------------------------------

/// Per open stream: a small fixed struct (no tasks, no buffers of its own).
#[derive(Debug)]
struct OpenStream {
    epoch: i64,
    /// Open generation: distinguishes re-opens (even at the same epoch after a break).
    gen_id: u64,
    next_offset: u64,
    durable_end: u64,
    broken: bool,
}

/// A WAL record that is durable but not yet uploaded.
#[derive(Debug)]
struct QueuedRecord {
    gen_id: u64,
    cost: u32,
    rec: WalRecord,
}

/// One durable WAL write still needed for upload.
#[derive(Debug)]
struct DurableEntry {
    pos: u64,
    records: Vec<QueuedRecord>,
}

/// Why [`Engine::try_append`] did not queue an append.
#[derive(Debug)]
pub enum TryAppendError {
    /// No queue space now: the request, to pass to [`Engine::append`] (which waits for it).
    Full(AppendRequest),
    /// Refused, as [`Engine::append`] would have refused it.
    Failed(EngineError),
}

/// The queue space an append takes: its bytes and fixed overhead, at most the whole queue.
fn append_cost(shared: &Shared, req: &AppendRequest) -> u32 {
    let bytes = req.batch.len() + req.aux.len() + APPEND_OVERHEAD_BYTES;
    u32::try_from(bytes.min(shared.space_total)).unwrap_or(u32::MAX)
}

/// Whether `req` may be queued on the engine as it stands (`st`).
fn check_append(st: &State, req: &AppendRequest) -> Result<(), EngineError> {
    if st.shutting_down {
        return Err(EngineError::ShuttingDown);
    }
    let s = st
        .streams
        .get(&req.stream)
        .ok_or(EngineError::NotOpen { stream: req.stream })?;
    if s.epoch != req.epoch {
        return Err(EngineError::StaleEpoch {
            stream: req.stream,
            epoch: req.epoch,
            current: s.epoch,
        });
    }
    if s.broken {
        return Err(EngineError::Broken { stream: req.stream });
    }
    if s.next_offset
        .checked_add(u64::from(req.record_count))
        .is_none()
    {
        return Err(EngineError::InvalidRequest("offset overflow".into()));
    }
    Ok(())
}

/// An append travelling from `append` to the WAL writer.
struct WriteItem {
    seq: u64,
    gen_id: u64,
    cost: u32,
    rec: WalRecord,
    ack: oneshot::Sender<Result<Appended, EngineError>>,
}

#[derive(Debug)]
struct State {
    streams: IdMap<OpenStream>,
    cache: LogCache,
    /// Durable, not-yet-uploaded WAL entries, ascending by position. Change it only through
    /// `push_durable` / `pop_durable` (and `forget`), which keep `queued_records` exact.
    queue: VecDeque<DurableEntry>,
    /// Records per stream in `queue` (no entry when none): `forget` and `release` run under
    /// this lock on every delete, and the queue can hold millions of records behind a slow
    /// store, so they skip the walk for a stream with nothing queued.
    queued_records: IdMap<usize>,
    /// Queue entries `forget` walked, so tests can tell that it skipped the walk.
    #[cfg(test)]
    forget_visits: usize,
    unuploaded_bytes: usize,
    /// Highest queue position the uploader has planned into a cycle (entries above it wait).
    planned_upto: Option<u64>,
    /// Bytes of the queued records above `planned_upto`: what the next cycle would take.
    unplanned_bytes: usize,
    /// Sequence number of the last append handed to the writer.
    enqueued_seq: u64,
    /// Highest WAL position whose records are queued or uploaded.
    durable_pos: Option<u64>,
    /// Generations with a failed WAL write: their still-queued appends must fail too, or later
    /// data would be acked after a hole. Cleared once the writer has drained the queue.
    failed_gens: IdSet,
    next_gen: u64,
    shutting_down: bool,
    stopped: bool,
    /// The writer's queue; taken (closed) when the engine stops, which also ends a writer
    /// thread waiting for work.
    tx: Option<mpsc::UnboundedSender<WriteItem>>,
}

impl State {
    /// Queues a durable WAL entry for upload.
    fn push_durable(&mut self, entry: DurableEntry) {
        for r in &entry.records {
            *self.queued_records.entry(r.rec.stream).or_default() += 1;
        }
        self.queue.push_back(entry);
    }

    /// Takes the oldest queued entry off the queue (it was uploaded and trimmed).
    fn pop_durable(&mut self) -> Option<DurableEntry> {
        let entry = self.queue.pop_front()?;
        for r in &entry.records {
            if let Some(n) = self.queued_records.get_mut(&r.rec.stream) {
                *n -= 1;
                if *n == 0 {
                    self.queued_records.remove(&r.rec.stream);
                }
            } else {
                debug_assert!(
                    false,
                    "queued record of stream {} not counted",
                    r.rec.stream
                );
            }
        }
        Some(entry)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct Progress {
    /// Highest append sequence the writer has finished (acked or failed).
    written_seq: u64,
    /// Every WAL entry <= this is uploaded, committed (or rejected) and trimmed.
    uploaded_upto: Option<u64>,
    /// Failed upload cycles so far.
    upload_failures: u64,
    /// Failed upload cycles since the uploader last made progress (a PUT or a cycle done): a
    /// long streak is a store that is down or full, not a blip.
    upload_streak: u64,
    /// The background tasks are gone (shutdown or abort): nothing above will move again, and
    /// waiters must not wait for it (the sender lives as long as the engine).
    stopped: bool,
    /// The catalog answered that this incarnation is fenced ([`CatalogError::Fenced`]): the
    /// uploader stopped, and nothing queued will be uploaded or trimmed by this process.
    fenced: bool,
}

#[derive(Debug, Default)]
struct Counters {
    wal_writes: AtomicU64,
    wal_write_failures: AtomicU64,
    appends: AtomicU64,
    uploads: AtomicU64,
    upload_failures: AtomicU64,
    rejected_ranges: AtomicU64,
}

struct Shared {
    cfg: EngineConfig,
    /// Object keys are this plus a counter (`data/{node}/{epoch}/` for a node's own engine).
    key_prefix: String,
    data: Arc<dyn ObjectStorage>,
    wal: Arc<dyn Wal>,
    catalog: Arc<dyn Catalog>,
    on_durable: DurableHook,
    state: Mutex<State>,
    /// Bytes of appends not yet uploaded (bounds the writer queue and the upload backlog).
    space: Semaphore,
    space_total: usize,
    /// Upload now, however little is waiting (flush, backpressure).
    upload_kick: Notify,
    /// Latency and size distributions for the metrics recorder (`crate::telemetry`).
    timings: telemetry::EngineTimings,
    /// Unuploaded bytes crossed the threshold: the uploader checks its backlog rules.
    upload_check: Notify,
    progress: watch::Sender<Progress>,
    block_cache: Mutex<BlockCache>,
    /// The large slice last read, decoded (`read::slice_batches`).
    large_slice: tokio::sync::Mutex<Option<read::LargeSlice>>,
    object_counter: AtomicU64,
    counters: Counters,
    /// Set when the writer is leader-style (`writer::Leader`).
    leader: std::sync::OnceLock<Arc<writer::Leader>>,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn blocks(&self) -> MutexGuard<'_, BlockCache> {
        self.block_cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn release_space(&self, cost: u64) {
        if cost > 0 {
            self.space
                .add_permits(usize::try_from(cost).unwrap_or(usize::MAX));
        }
    }

    fn next_object_key(&self) -> String {
        let n = self.object_counter.fetch_add(1, Ordering::SeqCst);
        format!("{}{n:020}", self.key_prefix)
    }
}

fn data_prefix(node_id: u32, node_epoch: u64) -> String {
    format!("data/{node_id}/{node_epoch}/")
}

struct EngineInner {
    shared: Arc<Shared>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The writer's thread, for a WAL that appends synchronously (`writer::run_on_thread`).
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl EngineInner {
    /// Closes the writer's queue and waits for its thread, if any, to end: at most the write
    /// under way finishes (a crash could land it too), and nothing is written after this
    /// returns, so a WAL reopened on the same files never sees this engine still writing.
    /// Call with the state marked `stopped`.
    fn stop_writer_thread(&self) {
        drop(self.shared.state().tx.take());
        let thread = self
            .writer_thread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(t) = thread
            && t.thread().id() != std::thread::current().id()
        {
            let _ = t.join();
        }
    }
}

impl Drop for EngineInner {
    fn drop(&mut self) {
        self.shared.state().stopped = true;
        self.stop_writer_thread();
        for t in self
            .tasks
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }
}

/// Waits for `cost` of queue space (`max_unflushed_bytes`), which only uploads free. While the
/// store refuses them for good (down, or full) an append must not wait for ever: it gives up
/// like a flush does, and is answered 503 with nothing written (no offsets were assigned).
async fn wait_for_space(
    shared: &Shared,
    cost: u32,
) -> Result<tokio::sync::SemaphorePermit<'_>, EngineError> {
    let mut progress = shared.progress.subscribe();
    let start_failures = progress.borrow_and_update().upload_failures;
    // Pinned once, so the wait keeps its place in the semaphore's queue across the loop.
    let acquire = shared.space.acquire_many(cost);
    tokio::pin!(acquire);
    loop {
        tokio::select! {
            permit = &mut acquire => return permit.map_err(|_| EngineError::ShuttingDown),
            changed = progress.changed() => {
                let p = *progress.borrow_and_update();
                if changed.is_err() || p.stopped {
                    return Err(EngineError::ShuttingDown);
                }
                if p.fenced {
                    return Err(fenced_error());
                }
                if p.uploads_failing(start_failures) {
                    return Err(EngineError::NoRoom(format!(
                        "uploads are failing ({} in a row)",
                        p.upload_streak
                    )));
                }
            }
        }
    }
}

/// What waiters for upload progress answer once the catalog fenced this incarnation.
fn fenced_error() -> EngineError {
    EngineError::WalFenced(
        "the catalog fenced this node: it uploads and commits nothing more, and its WAL is left \
         to whoever recovers it"
            .into(),
    )
}

/// The stream storage engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    inner: Arc<EngineInner>,
}

/// Consecutive failed upload cycles after which `flush` gives up with an error. Once the
/// uploader's own streak is this long, a flush (or an append waiting for queue space) gives up
/// at the next failure instead: during a long outage (a full disk) every reopen would otherwise
/// wait out eight backoffs, and the requests queued behind it several times that.
const FLUSH_MAX_UPLOAD_FAILURES: u64 = 8;

impl Progress {
    /// Whether a wait that began when `start_failures` uploads had failed should give up: eight
    /// more failed, or the uploader is in a long failure streak and failed again since.
    fn uploads_failing(&self, start_failures: u64) -> bool {
        self.upload_failures >= start_failures + FLUSH_MAX_UPLOAD_FAILURES
            || (self.upload_streak >= FLUSH_MAX_UPLOAD_FAILURES
                && self.upload_failures > start_failures)
    }
}

impl Engine {
    /// Replays the WAL (records at or after each stream's committed end are uploaded and
    /// committed with the epoch recorded in the WAL; earlier ones are skipped), trims it, and
    /// only then starts the writer and uploader tasks.
    pub async fn start(
        cfg: EngineConfig,
        data: Arc<dyn ObjectStorage>,
        wal: Arc<dyn Wal>,
        catalog: Arc<dyn Catalog>,
        on_durable: DurableHook,
    ) -> Result<(Engine, RecoveryReport), EngineError> {
        let prefix = data_prefix(cfg.node_id, cfg.node_epoch);
        let (shared, rx) = Self::shared_state(cfg, prefix, data, wal, catalog, on_durable).await?;
        let report = recovery::recover(&shared).await?;

        let mut tasks = vec![tokio::spawn(uploader::run(shared.clone()))];
        let mut writer_thread = None;
        if shared.wal.blocking().is_some() && shared.cfg.batch_interval.is_zero() {
            let s = shared.clone();
            let spawned = std::thread::Builder::new()
                .name("wal-writer".into())
                .spawn(move || writer::run_on_thread(s, rx))
                .map_err(|e| EngineError::Durability(format!("starting the wal writer: {e}")));
            match spawned {
                Ok(t) => writer_thread = Some(t),
                Err(e) => {
                    tasks.drain(..).for_each(|t| t.abort());
                    return Err(e);
                }
            }
        } else if shared.cfg.batch_interval.is_zero() {
            let leader = writer::Leader::new(rx);
            let _ = shared.leader.set(leader.clone());
            tasks.push(tokio::spawn(writer::run_led(shared.clone(), leader)));
        } else {
            tasks.push(tokio::spawn(writer::run(shared.clone(), rx)));
        }
        let engine = Engine {
            inner: Arc::new(EngineInner {
                shared,
                tasks: Mutex::new(tasks),
                writer_thread: Mutex::new(writer_thread),
            }),
        };
        Ok((engine, report))
    }

    /// Recovery alone, of a WAL that is not this process's own (failover: a fenced node's
    /// WAL): the same selection and commits as [`Engine::start`]'s, with objects written under
    /// `key_prefix` (which no other writer may use), then the WAL trimmed. Starts no tasks and
    /// opens no stream. `cfg` gives the upload settings.
    pub async fn recover_wal(
        cfg: EngineConfig,
        key_prefix: String,
        data: Arc<dyn ObjectStorage>,
        wal: Arc<dyn Wal>,
        catalog: Arc<dyn Catalog>,
    ) -> Result<RecoveryReport, EngineError> {
        let key_prefix = format!("{}/", key_prefix.trim_end_matches('/'));
        let (shared, _rx) =
            Self::shared_state(cfg, key_prefix, data, wal, catalog, Arc::new(|_, _| {})).await?;
        recovery::recover(&shared).await
    }

    async fn shared_state(
        cfg: EngineConfig,
        prefix: String,
        data: Arc<dyn ObjectStorage>,
        wal: Arc<dyn Wal>,
        catalog: Arc<dyn Catalog>,
        on_durable: DurableHook,
    ) -> Result<(Arc<Shared>, mpsc::UnboundedReceiver<WriteItem>), EngineError> {
        if cfg.max_bytes_in_batch == 0 || cfg.max_unflushed_bytes == 0 {
            return Err(EngineError::InvalidRequest(
                "max_bytes_in_batch and max_unflushed_bytes must be > 0".into(),
            ));
        }
        // Object keys must never collide with a previous run's objects at the same node epoch.
        let next_counter = data
            .list(&prefix)
            .await?
            .iter()
            .filter_map(|k| k.strip_prefix(&prefix)?.parse::<u64>().ok())
            .max()
            .map_or(0, |n| n + 1);

        let space_total = cfg.max_unflushed_bytes.min(Semaphore::MAX_PERMITS);
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                streams: IdMap::default(),
                cache: LogCache::new(cfg.log_cache_bytes),
                queue: VecDeque::new(),
                queued_records: IdMap::default(),
                #[cfg(test)]
                forget_visits: 0,
                unuploaded_bytes: 0,
                planned_upto: None,
                unplanned_bytes: 0,
                enqueued_seq: 0,
                durable_pos: None,
                failed_gens: IdSet::default(),
                next_gen: 1,
                shutting_down: false,
                stopped: false,
                tx: Some(tx),
            }),
            block_cache: Mutex::new(BlockCache::new(cfg.block_cache_bytes)),
            large_slice: tokio::sync::Mutex::new(None),
            cfg,
            key_prefix: prefix,
            data,
            wal,
            catalog,
            on_durable,
            space: Semaphore::new(space_total),
            space_total,
            upload_kick: Notify::new(),
            upload_check: Notify::new(),
            progress: watch::Sender::new(Progress::default()),
            object_counter: AtomicU64::new(next_counter),
            counters: Counters::default(),
            timings: telemetry::EngineTimings::default(),
            leader: std::sync::OnceLock::new(),
        });
        Ok((shared, rx))
    }

    fn shared(&self) -> &Shared {
        &self.inner.shared
    }

    /// Start serving appends for `stream` at `epoch` from `next_offset`. Re-opening at a higher
    /// epoch (or at the same epoch after a failed write) replaces the state; pending appends of
    /// the old state still complete. A lower epoch, or the same epoch while healthy, is ignored.
    pub fn open(&self, stream: u64, epoch: i64, next_offset: u64) {
        let mut st = self.shared().state();
        if let Some(s) = st.streams.get(&stream)
            && (s.epoch > epoch || (s.epoch == epoch && !s.broken))
        {
            if s.epoch > epoch {
                tracing::warn!(
                    stream,
                    epoch,
                    current = s.epoch,
                    "open at stale epoch ignored"
                );
            }
            return;
        }
        let gen_id = st.next_gen;
        st.next_gen += 1;
        st.streams.insert(
            stream,
            OpenStream {
                epoch,
                gen_id,
                next_offset,
                durable_end: next_offset,
                broken: false,
            },
        );
        st.cache.reset(stream, gen_id);
    }

    pub fn is_open(&self, stream: u64) -> Option<i64> {
        self.shared().state().streams.get(&stream).map(|s| s.epoch)
    }

    /// Assigns offsets and hands the append to the WAL writer. Waits only for queue space
    /// (`max_unflushed_bytes`). Offsets are assigned atomically with the enqueue, after space
    /// was granted, so a cancelled call never leaves a hole; calls for one stream must be
    /// serialized by the host and get offsets in call order.
    pub async fn append(&self, req: AppendRequest) -> Result<PendingAppend, EngineError> {
        match self.try_append(req) {
            Ok(p) => Ok(p),
            Err(TryAppendError::Failed(e)) => Err(e),
            Err(TryAppendError::Full(req)) => self.append_waiting(req).await,
        }
    }

    /// [`Engine::append`] when the queue has space for it now; otherwise the request comes back
    /// ([`TryAppendError::Full`], with its `batch_crc` filled in) and nothing happened. A host
    /// whose appends rarely wait calls this first and keeps `append`'s future (and a timeout
    /// around it) off its common path.
    pub fn try_append(&self, mut req: AppendRequest) -> Result<PendingAppend, TryAppendError> {
        if req.record_count == 0 {
            return Err(TryAppendError::Failed(EngineError::InvalidRequest(
                "record_count must be > 0".into(),
            )));
        }
        // Here, in the appending task and outside every lock, so that neither the WAL writer
        // (which serializes all streams' appends) nor the uploader reads the batch again.
        let batch_crc = match req.batch_crc {
            Some(crc) => {
                debug_assert_eq!(
                    crc,
                    crc32c::crc32c(&req.batch),
                    "batch_crc of another batch"
                );
                crc
            }
            None => crc32c::crc32c(&req.batch),
        };
        req.batch_crc = Some(batch_crc);
        let shared = self.shared();
        let cost = append_cost(shared, &req);
        // The state lock is taken once when there is space (it is checked in `enqueue`, under
        // the lock that queues the append); only an append about to wait is checked first.
        match shared.space.try_acquire_many(cost) {
            Ok(permit) => self
                .enqueue(req, cost, permit)
                .map_err(TryAppendError::Failed),
            Err(_) => Err(TryAppendError::Full(req)),
        }
    }

    /// [`Engine::append`] of a request [`Engine::try_append`] found no space for.
    async fn append_waiting(&self, req: AppendRequest) -> Result<PendingAppend, EngineError> {
        let shared = self.shared();
        check_append(&shared.state(), &req)?;
        // Full: make sure the uploader is working on freeing space, and that appends queued
        // by a caller that waits here before polling them get written.
        shared.upload_kick.notify_one();
        if let Some(l) = shared.leader.get() {
            l.wake();
        }
        let cost = append_cost(shared, &req);
        let permit = wait_for_space(shared, cost).await?;
        self.enqueue(req, cost, permit)
    }

    /// Queues an append that holds its queue space (`permit`, of `cost`); `req.batch_crc` is
    /// set. Offsets move only once it is queued.
    fn enqueue(
        &self,
        req: AppendRequest,
        cost: u32,
        permit: tokio::sync::SemaphorePermit<'_>,
    ) -> Result<PendingAppend, EngineError> {
        let shared = self.shared();
        let batch_crc = req.batch_crc.unwrap_or_else(|| crc32c::crc32c(&req.batch));
        let mut st = shared.state();
        check_append(&st, &req)?;
        let Some(s) = st.streams.get_mut(&req.stream) else {
            return Err(EngineError::NotOpen { stream: req.stream });
        };
        let base_offset = s.next_offset;
        let next_offset = base_offset + u64::from(req.record_count);
        let gen_id = s.gen_id;
        let (ack_tx, ack_rx) = oneshot::channel();
        let seq = st.enqueued_seq + 1;
        let item = WriteItem {
            seq,
            gen_id,
            cost,
            rec: WalRecord {
                stream: req.stream,
                epoch: req.epoch,
                base_offset,
                record_count: req.record_count,
                batch: req.batch,
                batch_crc,
                aux: req.aux,
            },
            ack: ack_tx,
        };
        st.tx
            .as_ref()
            .and_then(|tx| tx.send(item).ok())
            .ok_or(EngineError::ShuttingDown)?;
        // Committed to the queue: only now do offsets and accounting move.
        permit.forget();
        st.enqueued_seq = seq;
        if let Some(s) = st.streams.get_mut(&req.stream) {
            s.next_offset = next_offset;
        }
        drop(st);
        shared.counters.appends.fetch_add(1, Ordering::Relaxed);
        Ok(PendingAppend {
            base_offset,
            next_offset,
            ack: ack_rx,
            lead: shared
                .leader
                .get()
                .map(|l| writer::Lead::new(self.inner.shared.clone(), l.clone())),
        })
    }

    pub fn next_offset(&self, stream: u64) -> Option<u64> {
        self.shared()
            .state()
            .streams
            .get(&stream)
            .map(|s| s.next_offset)
    }

    pub fn durable_end(&self, stream: u64) -> Option<u64> {
        self.shared()
            .state()
            .streams
            .get(&stream)
            .map(|s| s.durable_end)
    }

    /// Batches covering [from_offset, durable end), see `read::read`.
    pub async fn read(
        &self,
        stream: u64,
        from_offset: u64,
        max_bytes: usize,
    ) -> Result<Vec<StoredBatch>, EngineError> {
        read::read(self.shared(), stream, from_offset, max_bytes).await
    }

    /// Waits until everything appended so far (to any stream, so also to `stream`) is durable,
    /// uploaded and committed, then forgets the stream's open state and cached data.
    pub async fn close(&self, stream: u64) -> Result<(), EngineError> {
        let Some(gen_id) = self.shared().state().streams.get(&stream).map(|s| s.gen_id) else {
            return Ok(());
        };
        self.flush().await?;
        let mut st = self.shared().state();
        if st.streams.get(&stream).is_some_and(|s| s.gen_id == gen_id) {
            st.streams.remove(&stream);
            st.cache.remove(stream);
        }
        Ok(())
    }

    /// Forgets the open state and cached data of each `(stream, epoch)` whose appends are all
    /// uploaded and committed, without flushing. After one `flush` this releases any number of
    /// idle streams, where `close` per stream would run one upload cycle (one object and one
    /// commit of whatever other streams appended meanwhile) per stream. Per stream, in order:
    /// `true` = released; `false` = not open at `epoch`, or appends of it are still in the WAL
    /// writer or waiting for upload (release it later).
    pub fn release(&self, streams: &[(u64, i64)]) -> Vec<bool> {
        let mut st = self.shared().state();
        streams
            .iter()
            .map(|&(stream, epoch)| {
                let done = !st.queued_records.contains_key(&stream)
                    && st.streams.get(&stream).is_some_and(|s| {
                        // A broken stream's appends still in the writer fail, never to be
                        // uploaded; a healthy one's are durable only once the end catches up.
                        s.epoch == epoch && (s.broken || s.durable_end == s.next_offset)
                    });
                if done {
                    st.streams.remove(&stream);
                    st.cache.remove(stream);
                }
                done
            })
            .collect()
    }

    /// Drops a stream's cached data, queued uploads and open state without uploading (the
    /// stream was deleted). Appends already in the WAL writer still complete and may be
    /// uploaded; the host's catalog decides what to do with them.
    pub fn forget(&self, stream: u64) {
        let shared = self.shared();
        let mut guard = shared.state();
        let st = &mut *guard;
        st.streams.remove(&stream);
        st.cache.remove(stream);
        // Counted per stream: a stream with nothing queued (the common delete) costs no walk,
        // and the walk stops at the stream's last queued record.
        let mut left = st.queued_records.remove(&stream).unwrap_or(0);
        let mut freed_cost = 0u64;
        let mut freed_bytes = 0usize;
        let mut freed_unplanned = 0usize;
        let planned_upto = st.planned_upto;
        for entry in st.queue.iter_mut() {
            if left == 0 {
                break;
            }
            #[cfg(test)]
            {
                st.forget_visits += 1;
            }
            let unplanned = planned_upto.is_none_or(|p| entry.pos > p);
            entry.records.retain(|r| {
                if r.rec.stream == stream {
                    let bytes = r.rec.batch.len() + r.rec.aux.len();
                    freed_cost += u64::from(r.cost);
                    freed_bytes += bytes;
                    if unplanned {
                        freed_unplanned += bytes;
                    }
                    left -= 1;
                    false
                } else {
                    true
                }
            });
        }
        debug_assert_eq!(left, 0, "queued records of stream {stream} miscounted");
        st.unuploaded_bytes -= freed_bytes;
        st.unplanned_bytes -= freed_unplanned;
        drop(guard);
        shared.release_space(freed_cost);
    }

    /// Everything appended so far is durable, uploaded, committed, and the WAL trimmed.
    pub async fn flush(&self) -> Result<(), EngineError> {
        let shared = self.shared();
        let mut progress = shared.progress.subscribe();
        let (seq, stopped) = {
            let st = shared.state();
            (st.enqueued_seq, st.stopped)
        };
        if stopped {
            let p = *progress.borrow();
            let st = shared.state();
            return if p.written_seq >= seq && st.queue.is_empty() {
                Ok(())
            } else {
                Err(EngineError::ShuttingDown)
            };
        }
        // Appends whose callers have not polled them yet are written all the same.
        if let Some(l) = shared.leader.get() {
            l.wake();
        }
        let p = *progress
            .wait_for(|p| p.written_seq >= seq || p.stopped)
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        if p.written_seq < seq {
            return Err(EngineError::ShuttingDown);
        }
        let target = shared.state().durable_pos;
        let start_failures = progress.borrow().upload_failures;
        shared.upload_kick.notify_one();
        // The uploader retries on its own with backoff; give up after repeated failures.
        let p = *progress
            .wait_for(|p| {
                p.uploaded_upto >= target
                    || p.uploads_failing(start_failures)
                    || p.stopped
                    || p.fenced
            })
            .await
            .map_err(|_| EngineError::ShuttingDown)?;
        if p.uploaded_upto >= target {
            Ok(())
        } else if p.stopped {
            Err(EngineError::ShuttingDown)
        } else if p.fenced {
            Err(fenced_error())
        } else {
            Err(EngineError::Upload(format!(
                "upload failed {} times while flushing ({} in a row)",
                p.upload_failures - start_failures,
                p.upload_streak
            )))
        }
    }

    /// Rejects new appends, flushes, then stops the background tasks.
    pub async fn shutdown(&self) -> Result<(), EngineError> {
        self.shared().state().shutting_down = true;
        let flushed = self.flush().await;
        self.shared().space.close();
        self.shared().state().stopped = true;
        self.inner.stop_writer_thread();
        let tasks: Vec<_> = self
            .inner
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
            .collect();
        for t in tasks {
            t.abort();
            let _ = t.await;
        }
        self.shared().progress.send_modify(|p| p.stopped = true);
        flushed
    }

    /// Stops the background tasks at once without flushing: a crash, for tests and for a
    /// host that lost its node epoch. Acked data stays in the WAL for the next start.
    pub fn abort(&self) {
        let mut st = self.shared().state();
        st.shutting_down = true;
        st.stopped = true;
        drop(st);
        self.shared().space.close();
        self.inner.stop_writer_thread();
        for t in self
            .inner
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
        self.shared().progress.send_modify(|p| p.stopped = true);
    }

    pub fn stats(&self) -> EngineStats {
        let shared = self.shared();
        let c = &shared.counters;
        let (open_streams, log_cache_bytes, log_cache_uploaded_bytes, unuploaded_bytes) = {
            let st = shared.state();
            (
                st.streams.len(),
                st.cache.total_bytes(),
                st.cache.uploaded_bytes(),
                st.unuploaded_bytes,
            )
        };
        let (block_cache_bytes, block_cache_hits, block_cache_misses) = {
            let b = shared.blocks();
            (b.bytes(), b.hits, b.misses)
        };
        EngineStats {
            open_streams,
            log_cache_bytes,
            log_cache_uploaded_bytes,
            unuploaded_bytes,
            wal_writes: c.wal_writes.load(Ordering::Relaxed),
            wal_write_failures: c.wal_write_failures.load(Ordering::Relaxed),
            appends: c.appends.load(Ordering::Relaxed),
            uploads: c.uploads.load(Ordering::Relaxed),
            upload_failures: c.upload_failures.load(Ordering::Relaxed),
            rejected_ranges: c.rejected_ranges.load(Ordering::Relaxed),
            block_cache_bytes,
            block_cache_hits,
            block_cache_misses,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::MemoryStorage;
    use crate::testing::{FaultWal, MemCatalog, SlowStorage};
    use crate::wal::ObjectWal;

    pub(super) async fn start(put_delay: Duration) -> (Engine, Arc<FaultWal>) {
        let mem: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
        let storage: Arc<dyn ObjectStorage> = Arc::new(SlowStorage::new(
            mem.clone(),
            "data/",
            Box::new(move |_, _| put_delay),
        ));
        let wal = Arc::new(FaultWal::new(Arc::new(ObjectWal::new(mem, "wal/0".into()))));
        let cfg = EngineConfig {
            upload_interval: Duration::from_secs(3600),
            ..EngineConfig::default()
        };
        let (engine, _) = Engine::start(
            cfg,
            storage,
            wal.clone(),
            Arc::new(MemCatalog::new()),
            Arc::new(|_, _| {}),
        )
        .await
        .unwrap();
        (engine, wal)
    }

    pub(super) async fn append(engine: &Engine, stream: u64) -> PendingAppend {
        let req = AppendRequest {
            stream,
            epoch: 1,
            record_count: 1,
            batch: Bytes::from_static(b"record"),
            batch_crc: None,
            aux: Bytes::new(),
        };
        engine.append(req).await.unwrap()
    }

    /// The per-stream counts equal a count over the queue itself, with no zero entries left.
    fn assert_counts_exact(engine: &Engine) {
        let st = engine.shared().state();
        let mut brute: IdMap<usize> = IdMap::default();
        for entry in &st.queue {
            for r in &entry.records {
                *brute.entry(r.rec.stream).or_default() += 1;
            }
        }
        assert_eq!(st.queued_records, brute);
    }

    fn visits(engine: &Engine) -> usize {
        engine.shared().state().forget_visits
    }

    #[tokio::test]
    async fn queued_counts_stay_exact_and_forget_skips_streams_with_nothing_queued() {
        let (engine, wal) = start(Duration::from_millis(100)).await;
        for s in 1..=5 {
            engine.open(s, 1, 0);
        }
        for i in 0..30 {
            append(&engine, 1 + i % 3).await.durable().await.unwrap();
        }
        assert_counts_exact(&engine);
        assert_eq!(engine.shared().state().queued_records.get(&1), Some(&10));
        assert!(engine.shared().state().queue.len() >= 10);

        // Nothing of stream 4 is queued: its delete does not walk the queue.
        engine.forget(4);
        assert_eq!(
            visits(&engine),
            0,
            "forget walked the queue for an idle stream"
        );
        assert_eq!(engine.release(&[(1, 1), (5, 1)]), vec![false, true]);

        engine.forget(2);
        assert!(visits(&engine) > 0);
        assert_counts_exact(&engine);
        assert!(!engine.shared().state().queued_records.contains_key(&2));

        // An append in the WAL writer when its stream is forgotten is still queued (under a
        // generation no longer open), and counted, so a second forget finds it.
        wal.hold_appends(true);
        let pending = append(&engine, 3).await;
        engine.forget(3);
        wal.hold_appends(false);
        assert!(pending.durable().await.is_err());
        assert_eq!(engine.shared().state().queued_records.get(&3), Some(&1));
        assert_counts_exact(&engine);
        engine.forget(3);
        assert_counts_exact(&engine);

        // Forgetting a stream while some of its records are planned into a cycle in flight,
        // others not yet: upload then takes the rest off the queue.
        engine.open(6, 1, 0);
        for _ in 0..5 {
            append(&engine, 6).await.durable().await.unwrap();
        }
        let flushing = tokio::spawn({
            let engine = engine.clone();
            async move { engine.flush().await }
        });
        while engine.shared().state().planned_upto.is_none() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        for _ in 0..5 {
            append(&engine, 6).await.durable().await.unwrap();
            append(&engine, 1).await.durable().await.unwrap();
        }
        assert_counts_exact(&engine);
        engine.forget(6);
        assert_counts_exact(&engine);
        flushing.await.unwrap().unwrap();
        engine.flush().await.unwrap();
        assert_counts_exact(&engine);
        assert!(engine.shared().state().queued_records.is_empty());
        assert_eq!(engine.release(&[(1, 1)]), vec![true]);
    }
}
