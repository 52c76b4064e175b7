//! [`MetaLog`]: proposals are group-committed into `meta_log` rows by one committer task, which
//! is also the only place commands are applied (its own rows, other writers' rows, the backstop
//! tail). It publishes an immutable `Arc<State>` after every applied page of rows, so readers
//! never lock and never touch SQL.

use crate::error::MetaError;
use crate::store::{LogStore, SnapshotMeta, open_store};
use arc_swap::ArcSwap;
use pico_common::clock::SharedClock;
use pico_common::failure_log::FailureLog;
use pico_metadata::codec;
use pico_metadata::{ApplyError, CodecError, Command, Outcome, State};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

/// Pending proposals (requests, not commands) the committer queue holds before `propose` waits.
const QUEUE_REQUESTS: usize = 4096;
/// Rows read per tail query.
const TAIL_PAGE: u32 = 256;
/// Snapshots kept; log rows are truncated below the oldest kept one so each stays replayable.
const KEEP_SNAPSHOTS: u32 = 2;

/// A snapshot waits for at least one command per this many state entries since the last one.
const ENTRIES_PER_SNAPSHOT_COMMAND: u64 = 8;

#[derive(Debug, Clone)]
pub struct MetaLogOptions {
    /// Write a snapshot every this many applied commands, or, in a larger state, once the
    /// commands since the last one reach an eighth of its entries (see [`snapshot_due`]).
    pub snapshot_every: u64,
    /// Backstop tail interval (other writers' rows are also read after every own commit).
    pub poll_interval: Duration,
    /// Commands per row (a single larger `propose_many` still gets one row).
    pub max_batch: usize,
    /// Lease expiry and row timestamps; tests pass a manual clock.
    pub clock: SharedClock,
    /// While the store is unreachable, the first and the longest wait between probes (doubled
    /// per failure, jittered; see [`crate::backoff::retry_delay`]).
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// A probe not answered within this counts as a failure (a hung connection).
    pub probe_timeout: Duration,
}

impl Default for MetaLogOptions {
    fn default() -> Self {
        MetaLogOptions {
            snapshot_every: 1024,
            poll_interval: Duration::from_secs(1),
            max_batch: 512,
            clock: pico_common::clock::system(),
            retry_min: Duration::from_millis(100),
            retry_max: Duration::from_secs(5),
            probe_timeout: Duration::from_secs(5),
        }
    }
}

/// Snapshot bookkeeping for the admin API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotStats {
    /// Applied index of the newest snapshot (loaded or written), 0 if none.
    pub last_index: u64,
    /// Snapshots written by this process.
    pub written: u64,
    /// Log rows deleted by this process's snapshots.
    pub rows_truncated: u64,
    /// Snapshot attempts that failed since the last one written (0 = the last one worked).
    /// While they fail, log rows are not truncated.
    pub consecutive_failures: u64,
}

/// Whether the store answers: the readiness signal ([`MetaLog::reachability`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Reachability {
    /// The last round-trip to the store (a probe, an append, a tail read) succeeded.
    pub reachable: bool,
    /// Failed round-trips since the last success.
    pub consecutive_failures: u64,
    /// When the store last answered (clock ms).
    pub last_ok_ms: i64,
    /// The last failure, while unreachable.
    pub last_error: Option<String>,
}

/// Updated by every round-trip of the committer and the prober.
#[derive(Default)]
struct Health {
    state: Mutex<Reachability>,
    /// Signalled when the store answers again after failing: the committer tails at once.
    recovered: tokio::sync::Notify,
}

impl Health {
    fn lock(&self) -> std::sync::MutexGuard<'_, Reachability> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self) -> Reachability {
        self.lock().clone()
    }

    fn ok(&self, now_ms: i64) {
        let was = {
            let mut r = self.lock();
            let was = r.reachable;
            *r = Reachability {
                reachable: true,
                consecutive_failures: 0,
                last_ok_ms: now_ms,
                last_error: None,
            };
            was
        };
        if !was {
            tracing::info!("metadata store reachable");
            self.recovered.notify_one();
        }
    }

    /// Records a failed round-trip. Corruption is the store answering: not an outage.
    fn failed(&self, e: &MetaError) {
        if is_corruption(e) {
            return;
        }
        let mut r = self.lock();
        if r.reachable {
            tracing::warn!(error = %e, "metadata store unreachable; retrying with backoff");
        }
        r.reachable = false;
        r.consecutive_failures += 1;
        r.last_error = Some(e.to_string());
    }

    fn record<T>(&self, result: &Result<T, MetaError>, now_ms: i64) {
        match result {
            Ok(_) => self.ok(now_ms),
            Err(e) => self.failed(e),
        }
    }
}

type Outcomes = Vec<Result<Outcome, ApplyError>>;

struct Request {
    cmds: Vec<Command>,
    reply: oneshot::Sender<Result<Outcomes, MetaError>>,
}

#[derive(Default)]
struct Stats {
    last_index: AtomicU64,
    written: AtomicU64,
    rows_truncated: AtomicU64,
    consecutive_failures: AtomicU64,
}

struct Inner {
    store: Arc<dyn LogStore>,
    view: Arc<ArcSwap<State>>,
    applied_rx: watch::Receiver<u64>,
    tx: mpsc::Sender<Request>,
    shutdown: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    stats: Arc<Stats>,
    /// Why the committer stopped for good, once it has (set once, read without a lock).
    stopped: Arc<OnceLock<MetaError>>,
    health: Arc<Health>,
    clock: SharedClock,
}

/// The metadata log. Cheap to clone.
#[derive(Clone)]
pub struct MetaLog {
    inner: Arc<Inner>,
}

impl MetaLog {
    /// Opens `sqlite:./data/meta.db` (file and parent dir created if missing),
    /// `sqlite::memory:`, or `postgres://…` (shared by several nodes; see [`crate::PgStore`]).
    /// Startup = newest readable snapshot + replay of the rows after it.
    pub async fn open(url: &str, opts: MetaLogOptions) -> Result<MetaLog, MetaError> {
        MetaLog::with_store(open_store(url).await?, opts).await
    }

    /// Opens the log on any [`LogStore`] (the seam Postgres plugs into).
    pub async fn with_store(
        store: Arc<dyn LogStore>,
        opts: MetaLogOptions,
    ) -> Result<MetaLog, MetaError> {
        let stats = Arc::new(Stats::default());
        let (state, last_row_id) = load_snapshot(store.as_ref()).await?;
        stats
            .last_index
            .store(state.applied_index, Ordering::Relaxed);
        let view = Arc::new(ArcSwap::from_pointee(state.clone()));
        let (applied_tx, applied_rx) = watch::channel(state.applied_index);
        let due = Arc::new(DueSnapshot::default());
        let (due_tx, due_rx) = watch::channel(());
        let mut applier = Applier {
            store: store.clone(),
            last_snapshot_index: state.applied_index,
            state,
            last_row_id,
            view: view.clone(),
            applied_tx,
            due: due.clone(),
            due_tx,
            snapshot_every: opts.snapshot_every.max(1),
            own: None,
            clock: opts.clock.clone(),
        };
        applier.catch_up().await?;
        tracing::info!(
            applied_index = applier.state.applied_index,
            last_row_id = applier.last_row_id,
            "metadata log opened"
        );

        let (tx, rx) = mpsc::channel(QUEUE_REQUESTS);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let stopped = Arc::new(OnceLock::new());
        let clock = opts.clock.clone();
        // Opening read the store: it answers.
        let health = Arc::new(Health::default());
        health.ok(clock.now_ms());
        let prober = tokio::spawn(run_prober(
            store.clone(),
            health.clone(),
            opts.clone(),
            shutdown_rx.clone(),
        ));
        let committer = tokio::spawn(run_committer(
            applier,
            rx,
            shutdown_rx,
            opts,
            stopped.clone(),
            health.clone(),
        ));
        let snapshotter = tokio::spawn(run_snapshotter(
            store.clone(),
            due,
            due_rx,
            stats.clone(),
            clock.clone(),
        ));
        Ok(MetaLog {
            inner: Arc::new(Inner {
                store,
                view,
                applied_rx,
                tx,
                shutdown,
                tasks: Mutex::new(vec![committer, snapshotter, prober]),
                stats,
                stopped,
                health,
                clock,
            }),
        })
    }

    /// The current applied state: an immutable snapshot; never touches SQL.
    pub fn view(&self) -> Arc<State> {
        self.inner.view.load_full()
    }

    pub fn applied_index(&self) -> u64 {
        self.inner.view.load().applied_index
    }

    /// Group commit: batched with concurrent proposals into one row; returns after this node
    /// applied it (read-your-writes). Outer `Err`: the log failed (for `Store`/`Closed` nothing
    /// was written; see [`MetaError::OutcomeUnknown`]); inner: the command's deterministic outcome.
    pub async fn propose(&self, cmd: Command) -> Result<Result<Outcome, ApplyError>, MetaError> {
        let mut out = self.propose_many(vec![cmd]).await?;
        out.pop().ok_or_else(|| MetaError::Store {
            op: "propose",
            message: "no outcome returned".into(),
        })
    }

    /// Several commands, in order, in one row.
    pub async fn propose_many(&self, cmds: Vec<Command>) -> Result<Outcomes, MetaError> {
        if cmds.is_empty() {
            return Ok(Vec::new());
        }
        self.health()?;
        let (reply, rx) = oneshot::channel();
        self.inner
            .tx
            .send(Request { cmds, reply })
            .await
            .map_err(|_| self.closed())?;
        rx.await.map_err(|_| self.closed())?
    }

    /// Whether the log still applies commands, without SQL or a lock (cheap enough for every
    /// readiness probe). `Err` with the reason once it stopped for good: the corrupt row or
    /// snapshot it met (`CorruptRow`/`BadRow`/`CorruptSnapshot`), or `Stopped` if its
    /// committer panicked; all [`MetaError::is_permanent`], and every later proposal
    /// fails with the same error. `Err(Closed)` after [`MetaLog::close`]. A store outage is
    /// not reported here: it fails single proposals with a retryable `Store` error.
    pub fn health(&self) -> Result<(), MetaError> {
        if let Some(e) = self.inner.stopped.get() {
            return Err(e.clone());
        }
        if *self.inner.shutdown.borrow() {
            return Err(MetaError::Closed);
        }
        Ok(())
    }

    /// Whether the store answered its last round-trip (a probe every `poll_interval` while it
    /// does, with capped, jittered backoff while it does not), without SQL or waiting: what
    /// readiness reports. Proposals made while it is unreachable fail with a retryable
    /// `Store` error; the log resumes by itself when the store is back.
    pub fn reachability(&self) -> Reachability {
        self.inner.health.get()
    }

    /// The error for a committer that is gone: its reason if it stopped, else `Closed`.
    fn closed(&self) -> MetaError {
        self.inner
            .stopped
            .get()
            .cloned()
            .unwrap_or(MetaError::Closed)
    }

    /// Applied-index changes (for waiters / readiness).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.inner.applied_rx.clone()
    }

    pub fn snapshot_stats(&self) -> SnapshotStats {
        let s = &self.inner.stats;
        SnapshotStats {
            last_index: s.last_index.load(Ordering::Relaxed),
            written: s.written.load(Ordering::Relaxed),
            rows_truncated: s.rows_truncated.load(Ordering::Relaxed),
            consecutive_failures: s.consecutive_failures.load(Ordering::Relaxed),
        }
    }

    /// Takes lease `name` for `holder` if it is free, expired, or already theirs.
    pub async fn try_acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, MetaError> {
        let now = self.inner.clock.now_ms();
        self.inner
            .store
            .try_acquire_lease(name, holder, ttl_ms(ttl), now)
            .await
    }

    /// Extends a lease `holder` still holds; `false` = lost (expired or taken).
    pub async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<bool, MetaError> {
        let now = self.inner.clock.now_ms();
        self.inner
            .store
            .renew_lease(name, holder, ttl_ms(ttl), now)
            .await
    }

    /// Gives a lease up; `false` = `holder` did not hold it.
    pub async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, MetaError> {
        self.inner.store.release_lease(name, holder).await
    }

    /// Current holder of a lease if unexpired: (holder, expires_at_ms).
    pub async fn lease_holder(&self, name: &str) -> Result<Option<(String, i64)>, MetaError> {
        let now = self.inner.clock.now_ms();
        Ok(self
            .inner
            .store
            .lease(name)
            .await?
            .filter(|(_, exp)| *exp > now))
    }

    /// Stops the committer (queued proposals fail with `Closed`), lets a running snapshot and
    /// the one due after it finish, and closes the store.
    pub async fn close(&self) {
        self.inner.shutdown.send_replace(true);
        let tasks: Vec<_> = match self.inner.tasks.lock() {
            Ok(mut t) => t.drain(..).collect(),
            Err(poisoned) => poisoned.into_inner().drain(..).collect(),
        };
        for t in tasks {
            let _ = t.await;
        }
        self.inner.store.close().await;
    }
}

fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

/// Newest readable snapshot (falling back to older kept ones), or the empty state. Unreadable
/// snapshots newer than the one loaded are deleted: left in place, one counts as a kept
/// snapshot when pruning, and truncating the log below it leaves a single readable snapshot.
async fn load_snapshot(store: &dyn LogStore) -> Result<(State, i64), MetaError> {
    let snaps = store.snapshots().await?;
    if snaps.is_empty() {
        return Ok((State::new(), 0));
    }
    let mut last_err = String::new();
    // A store failure (or a row pruned since the listing) says nothing about the snapshot: if no
    // snapshot loads, that is a retryable error, not `CorruptSnapshot` (which stops the log).
    let mut transient: Option<MetaError> = None;
    let mut unreadable: Vec<(u64, Vec<u8>)> = Vec::new();
    for meta in snaps {
        let index = meta.applied_index;
        match store.load_snapshot(index).await {
            Ok(Some(bytes)) => match decode_state_blocking(bytes).await? {
                (_, Ok(state)) if state.applied_index == index => {
                    for (index, bytes) in unreadable {
                        // A failed delete only leaves the row for the next start to retry;
                        // the state just loaded is good, so it must not stop this one.
                        match store.discard_snapshot(index, &bytes).await {
                            Ok(true) => tracing::warn!(
                                applied_index = index,
                                "unreadable metadata snapshot deleted"
                            ),
                            Ok(false) => {}
                            Err(e) => tracing::warn!(
                                applied_index = index,
                                error = %e,
                                "could not delete an unreadable metadata snapshot"
                            ),
                        }
                    }
                    return Ok((state, meta.last_row_id));
                }
                (bytes, Ok(state)) => {
                    last_err = format!(
                        "applied_index={index} payload_index={}",
                        state.applied_index
                    );
                    unreadable.push((index, bytes));
                }
                (bytes, Err(e)) => {
                    last_err = format!("applied_index={index} error={e}");
                    // A newer codec's snapshot is not damaged: leave it to the nodes that read it.
                    if !matches!(e, CodecError::UnsupportedVersion(v) if v > codec::VERSION) {
                        unreadable.push((index, bytes));
                    }
                }
            },
            Ok(None) => {
                last_err = format!("applied_index={index} vanished");
                transient.get_or_insert(MetaError::Store {
                    op: "load_snapshot",
                    message: last_err.clone(),
                });
            }
            // A store failure says nothing about the row: keep it.
            Err(e) => {
                last_err = e.to_string();
                if !is_corruption(&e) {
                    transient.get_or_insert(e);
                }
            }
        }
        tracing::warn!(error = %last_err, "unreadable metadata snapshot, trying an older one");
    }
    Err(transient.unwrap_or(MetaError::CorruptSnapshot(last_err)))
}

/// Decodes a snapshot on a blocking thread: a large state takes seconds, which would stall a
/// runtime worker (and every task queued on it); at open and when a lagging tail jumps alike.
/// Hands the bytes back for `discard_snapshot`.
async fn decode_state_blocking(
    bytes: Vec<u8>,
) -> Result<(Vec<u8>, Result<State, CodecError>), MetaError> {
    tokio::task::spawn_blocking(move || {
        let state = codec::decode_state(&bytes);
        (bytes, state)
    })
    .await
    // Cancelled at runtime shutdown (decoding never panics): retryable like a store failure.
    .map_err(|e| MetaError::Store {
        op: "decode snapshot",
        message: e.to_string(),
    })
}

/// Owns the mutable state: applies rows in table order and publishes views.
struct Applier {
    store: Arc<dyn LogStore>,
    state: State,
    last_row_id: i64,
    view: Arc<ArcSwap<State>>,
    applied_tx: watch::Sender<u64>,
    /// The newest state due for a snapshot, and the signal that wakes the snapshotter for it.
    due: Arc<DueSnapshot>,
    due_tx: watch::Sender<()>,
    snapshot_every: u64,
    last_snapshot_index: u64,
    clock: SharedClock,
    /// This node's just-written row: (row id, its commands, their outcomes once applied).
    own: Option<(i64, Vec<Command>, Option<Outcomes>)>,
}

impl Applier {
    /// Applies every row after `last_row_id`. On error, what was applied stays applied (and
    /// published); the failing row is retried by the next call.
    async fn catch_up(&mut self) -> Result<(), MetaError> {
        loop {
            let rows = self.store.read_after(self.last_row_id, TAIL_PAGE).await?;
            let Some(first) = rows.first() else {
                return Ok(());
            };
            // Rows may be gone (another node snapshotted and truncated): jump if a newer snapshot
            // covers them. Checked at every gap, not once per call: that node can truncate again
            // while this one pages through. A jump moves `last_row_id` forward, so this ends.
            // Sequence gaps (Postgres) land here too, harmlessly.
            if first.id != self.last_row_id + 1 && self.jump_to_newer_snapshot().await? {
                continue;
            }
            let result = self.apply_rows(rows);
            self.publish();
            result?;
        }
    }

    fn apply_rows(&mut self, rows: Vec<crate::store::LogRow>) -> Result<(), MetaError> {
        for row in rows {
            if let Some((own_id, cmds, outcomes)) = self.own.as_mut()
                && *own_id == row.id
            {
                // Our own row: apply the commands we encoded (the codec round trip is tested).
                *outcomes = Some(cmds.iter().map(|c| self.state.apply(c)).collect());
            } else {
                let cmds = codec::decode_commands(&row.payload).map_err(|source| {
                    MetaError::CorruptRow {
                        row_id: row.id,
                        source,
                    }
                })?;
                if cmds.len() as i64 != row.count {
                    return Err(MetaError::BadRow {
                        row_id: row.id,
                        reason: format!("count column={} decoded={}", row.count, cmds.len()),
                    });
                }
                for c in &cmds {
                    if let Err(e) = self.state.apply(c) {
                        tracing::debug!(row_id = row.id, kind = c.kind(), error = %e, "command rejected");
                    }
                }
            }
            self.last_row_id = row.id;
            self.maybe_snapshot();
        }
        Ok(())
    }

    async fn jump_to_newer_snapshot(&mut self) -> Result<bool, MetaError> {
        let Some(meta) = self.store.snapshots().await?.into_iter().next() else {
            return Ok(false);
        };
        if meta.last_row_id <= self.last_row_id || meta.applied_index <= self.state.applied_index {
            return Ok(false);
        }
        let (state, last_row_id) = load_snapshot(self.store.as_ref()).await?;
        if last_row_id <= self.last_row_id {
            return Ok(false);
        }
        tracing::info!(
            from = self.state.applied_index,
            to = state.applied_index,
            "metadata tail jumped to a newer snapshot"
        );
        self.state = state;
        self.last_row_id = last_row_id;
        self.last_snapshot_index = self.state.applied_index;
        self.publish();
        Ok(true)
    }

    fn maybe_snapshot(&mut self) {
        if !snapshot_due(
            self.state.applied_index,
            self.last_snapshot_index,
            self.snapshot_every,
            self.state.entry_count(),
        ) {
            return;
        }
        // O(1) clone.
        self.due.put(self.state.clone(), self.last_row_id);
        self.due_tx.send_replace(());
        self.last_snapshot_index = self.state.applied_index;
    }

    fn publish(&self) {
        // Every applied command (even a rejected one) moves the index, so it identifies the state.
        if self.view.load().applied_index != self.state.applied_index {
            self.view.store(Arc::new(self.state.clone()));
            self.applied_tx.send_replace(self.state.applied_index);
        }
    }
}

/// Whether the state at `applied` is due for a snapshot. A snapshot encodes the whole state,
/// so with one every `every` commands, creating n streams encoded O(n²) entries (100k streams:
/// 96 snapshots up to 16 MB, 40 % of the creation time). Waiting also for an eighth of the
/// state's entries in commands keeps the encoding O(1) per command amortized, and a restart
/// replays at most that many commands after the newest snapshot (a quarter halved the
/// encoding again but doubled that replay: 0.6 s more at 100k streams).
fn snapshot_due(applied: u64, last_snapshot: u64, every: u64, entries: u64) -> bool {
    applied >= last_snapshot + every.max(entries / ENTRIES_PER_SNAPSHOT_COMMAND)
}

/// While metadata appends keep failing, a warning at most this often (on the injected clock).
const APPEND_FAILURE_LOG_EVERY: Duration = Duration::from_secs(30);

async fn run_committer(
    mut applier: Applier,
    mut rx: mpsc::Receiver<Request>,
    mut shutdown: watch::Receiver<bool>,
    opts: MetaLogOptions,
    stopped: Arc<OnceLock<MetaError>>,
    health: Arc<Health>,
) {
    let _on_exit = StopOnExit {
        stopped: stopped.clone(),
        shutdown: shutdown.clone(),
    };
    let mut ticker = tokio::time::interval(opts.poll_interval.max(Duration::from_millis(1)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let max_batch = opts.max_batch.max(1);
    let mut carry: Option<Request> = None;
    // Another node's append wakes the tail at once; the ticker stays as the backstop.
    let appended = applier.store.appended();
    // While the store refuses writes (a full disk), every proposal fails: one line per period.
    let append_failures = FailureLog::new(APPEND_FAILURE_LOG_EVERY);
    loop {
        let first = match carry.take() {
            Some(r) => r,
            None => tokio::select! {
                biased;
                _ = shutdown.changed() => break,
                r = rx.recv() => match r { Some(r) => r, None => break },
                // While the store is unreachable the prober retries with backoff; the tail
                // waits for it to come back rather than fail every tick.
                _ = ticker.tick() => {
                    if health.get().reachable {
                        tail_idle(&mut applier, &stopped, &health).await;
                    }
                    continue;
                }
                _ = notified(appended.as_deref()) => {
                    if health.get().reachable {
                        tail_idle(&mut applier, &stopped, &health).await;
                    }
                    continue;
                }
                _ = health.recovered.notified() => {
                    tail_idle(&mut applier, &stopped, &health).await;
                    continue;
                }
            },
        };
        if *shutdown.borrow() {
            let _ = first.reply.send(Err(MetaError::Closed));
            break;
        }
        let mut batch = vec![first];
        let mut n = batch[0].cmds.len();
        while n < max_batch {
            match rx.try_recv() {
                Ok(r) if n + r.cmds.len() > max_batch => {
                    carry = Some(r);
                    break;
                }
                Ok(r) => {
                    n += r.cmds.len();
                    batch.push(r);
                }
                Err(_) => break,
            }
        }
        // Callers that gave up before the write are dropped: their commands are not written.
        batch.retain(|r| !r.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        if let Some(e) = stopped.get() {
            for r in batch {
                let _ = r.reply.send(Err(e.clone()));
            }
            continue;
        }
        let cmds: Vec<Command> = batch.iter().flat_map(|r| r.cmds.iter().cloned()).collect();
        let payload = codec::encode_commands(&cmds);
        let count = cmds.len() as u32;
        let appended_row = applier
            .store
            .append(&payload, count, applier.clock.now_ms())
            .await;
        health.record(&appended_row, applier.clock.now_ms());
        let row_id = match appended_row {
            Ok(id) => {
                if let Some(failures) = append_failures.answered() {
                    tracing::info!(failures, "metadata appends succeed again");
                }
                id
            }
            Err(e) => {
                if let Some(failures) = append_failures.failed(applier.clock.now_ms()) {
                    tracing::warn!(
                        error = %e,
                        failures,
                        "metadata append failed (while this lasts, logged every {} s)",
                        append_failures.every_secs()
                    );
                }
                for r in batch {
                    let _ = r.reply.send(Err(e.clone()));
                }
                continue;
            }
        };
        applier.own = Some((row_id, cmds, None));
        // The row is written: a failed read-back must not be reported as "nothing written", so
        // retry a few times before answering OutcomeUnknown.
        let mut tail = applier.catch_up().await;
        for attempt in 1..=CATCH_UP_RETRIES {
            match &tail {
                Err(e)
                    if !is_corruption(e) && applier.own.as_ref().is_some_and(|o| o.2.is_none()) =>
                {
                    tokio::time::sleep(Duration::from_millis(20 * attempt as u64)).await;
                    tail = applier.catch_up().await;
                }
                _ => break,
            }
        }
        health.record(&tail, applier.clock.now_ms());
        let outcomes = applier.own.take().and_then(|(_, _, o)| o);
        if let Err(e) = &tail {
            tracing::warn!(error = %e, row_id, "metadata tail after commit failed");
            if is_corruption(e) {
                stop(&stopped, e.clone());
            }
        }
        match outcomes {
            Some(mut all) => {
                // Split the row's outcomes back to the requests, in order.
                for r in batch.into_iter().rev() {
                    let mine = all.split_off(all.len() - r.cmds.len());
                    let _ = r.reply.send(Ok(mine));
                }
            }
            None => {
                let e = match tail {
                    Err(e) if is_corruption(&e) => e,
                    _ => MetaError::OutcomeUnknown { row_id },
                };
                for r in batch {
                    let _ = r.reply.send(Err(e.clone()));
                }
            }
        }
    }
    tracing::debug!("metadata committer stopped");
}

/// Reads other writers' rows while no proposal waits.
async fn tail_idle(applier: &mut Applier, stopped: &OnceLock<MetaError>, health: &Health) {
    if stopped.get().is_some() {
        return;
    }
    let tail = applier.catch_up().await;
    health.record(&tail, applier.clock.now_ms());
    if let Err(e) = tail {
        tracing::debug!(error = %e, "metadata tail failed");
        if is_corruption(&e) {
            stop(stopped, e);
        }
    }
}

/// Round-trips to the store: every `poll_interval` while it answers, and while it does not
/// after a capped, jittered backoff (never a tight loop, never giving up). A probe that hangs
/// past `probe_timeout` is a failure (a connection that stopped answering).
async fn run_prober(
    store: Arc<dyn LogStore>,
    health: Arc<Health>,
    opts: MetaLogOptions,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let r = health.get();
        let wait = if r.reachable {
            opts.poll_interval
        } else {
            crate::backoff::retry_delay(opts.retry_min, opts.retry_max, r.consecutive_failures)
        };
        tokio::select! {
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        let probe = match tokio::time::timeout(opts.probe_timeout, store.ping()).await {
            Ok(r) => r,
            Err(_) => Err(MetaError::Store {
                op: "ping",
                message: format!("no answer within {:?}", opts.probe_timeout),
            }),
        };
        health.record(&probe, opts.clock.now_ms());
    }
}

/// Waits for an append notification; never, for a store without them.
async fn notified(appended: Option<&tokio::sync::Notify>) {
    match appended {
        Some(n) => n.notified().await,
        None => std::future::pending().await,
    }
}

/// Stops the log for good: applying past a corrupted row or snapshot would diverge from the
/// other nodes. Every later proposal gets `reason`, and [`MetaLog::health`] reports it.
fn stop(stopped: &OnceLock<MetaError>, reason: MetaError) {
    if stopped.set(reason.clone()).is_ok() {
        tracing::error!(error = %reason, "metadata log stopped for good: repair it and restart");
    }
}

/// Marks the log stopped if the committer panics, so `health` tells instead of proposals only
/// failing with `Closed`. Ending because every handle is gone (a start that failed after the
/// log opened, for a reason of its own: a WAL refusal, a port in use) or because the runtime
/// shut down is no failure of the log, and saying it stopped for good would hide the real cause.
struct StopOnExit {
    stopped: Arc<OnceLock<MetaError>>,
    shutdown: watch::Receiver<bool>,
}

impl Drop for StopOnExit {
    fn drop(&mut self) {
        if std::thread::panicking() && !*self.shutdown.borrow() {
            stop(
                &self.stopped,
                MetaError::Stopped("metadata committer ended unexpectedly".into()),
            );
        }
    }
}

/// Read-back attempts after a committed row before answering OutcomeUnknown.
const CATCH_UP_RETRIES: u32 = 3;

fn is_corruption(e: &MetaError) -> bool {
    matches!(
        e,
        MetaError::CorruptRow { .. } | MetaError::BadRow { .. } | MetaError::CorruptSnapshot(_)
    )
}

/// The state due for a snapshot. A slot, not a queue: a state that comes due while the
/// snapshotter is still writing replaces the one waiting, so the snapshotter always takes the
/// newest and a due point is never dropped for want of room; taking it empties the slot, so no
/// old version of the state is kept alive between snapshots.
#[derive(Default)]
struct DueSnapshot(Mutex<Option<(State, i64)>>);

impl DueSnapshot {
    fn slot(&self) -> std::sync::MutexGuard<'_, Option<(State, i64)>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
    fn put(&self, state: State, last_row_id: i64) {
        *self.slot() = Some((state, last_row_id));
    }
    fn take(&self) -> Option<(State, i64)> {
        self.slot().take()
    }
}

/// Writes snapshots off the committer's path (encoding a large state takes a while).
async fn run_snapshotter(
    store: Arc<dyn LogStore>,
    due: Arc<DueSnapshot>,
    mut wake: watch::Receiver<()>,
    stats: Arc<Stats>,
    clock: SharedClock,
) {
    // `changed` reports a wake sent just before the committer ended (and dropped the sender)
    // before it reports the end, so the last due snapshot is still written.
    while wake.changed().await.is_ok() {
        let Some((state, last_row_id)) = due.take() else {
            continue;
        };
        let applied_index = state.applied_index;
        let payload = match tokio::task::spawn_blocking(move || codec::encode_state(&state)).await {
            Ok(p) => p,
            Err(e) => {
                snapshot_failed(&stats, applied_index, &e.to_string());
                continue;
            }
        };
        let meta = SnapshotMeta {
            applied_index,
            last_row_id,
        };
        match store
            .write_snapshot(meta, &payload, KEEP_SNAPSHOTS, clock.now_ms())
            .await
        {
            Ok(truncated) => {
                stats.consecutive_failures.store(0, Ordering::Relaxed);
                stats.last_index.store(applied_index, Ordering::Relaxed);
                stats.written.fetch_add(1, Ordering::Relaxed);
                stats.rows_truncated.fetch_add(truncated, Ordering::Relaxed);
                tracing::info!(
                    applied_index,
                    last_row_id,
                    bytes = payload.len(),
                    truncated,
                    "metadata snapshot written"
                );
            }
            Err(e) => snapshot_failed(&stats, applied_index, &e.to_string()),
        }
    }
}

/// Counts a failed snapshot. One failure is retried at the next due point; failures in a row
/// mean log rows pile up untruncated (and restarts slow down), so from the second on it is an
/// error for the operator.
fn snapshot_failed(stats: &Stats, applied_index: u64, error: &str) {
    let failures = stats.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
    if failures > 1 {
        tracing::error!(
            error,
            applied_index,
            failures,
            "metadata snapshots keep failing: the log is not truncated"
        );
    } else {
        tracing::warn!(error, applied_index, "metadata snapshot failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A log dropped without `close` (a start that failed for another reason) ends its
    /// committer quietly: the log did not fail, and must not say it stopped for good.
    #[tokio::test]
    async fn a_log_dropped_without_close_does_not_report_a_stop() {
        let log = MetaLog::open("sqlite::memory:", MetaLogOptions::default())
            .await
            .unwrap();
        let stopped = log.inner.stopped.clone();
        let tasks: Vec<_> = log.inner.tasks.lock().unwrap().drain(..).collect();
        drop(log);
        for t in tasks {
            t.await.unwrap();
        }
        assert!(stopped.get().is_none(), "{:?}", stopped.get());
    }

    #[test]
    fn snapshots_wait_for_an_eighth_of_a_large_state_in_commands() {
        // A small state: every `every` commands.
        assert!(!snapshot_due(1023, 0, 1024, 10));
        assert!(snapshot_due(1024, 0, 1024, 10));
        assert!(snapshot_due(2048, 1024, 1024, 4096));
        // 100k entries: 12,500 commands after the last snapshot, not 1024.
        assert!(!snapshot_due(10_000 + 12_499, 10_000, 1024, 100_000));
        assert!(snapshot_due(10_000 + 12_500, 10_000, 1024, 100_000));
    }

    /// Creating n streams one command at a time encodes O(n) entries in snapshots, not O(n²).
    #[test]
    fn snapshot_work_grows_linearly_with_the_state() {
        let encoded = |n: u64| {
            let (mut last, mut total) = (0u64, 0u64);
            for applied in 1..=n {
                // One stream per command: the registry and the stream map, 2 entries each.
                if snapshot_due(applied, last, 1024, 2 * applied) {
                    total += 2 * applied;
                    last = applied;
                }
            }
            total
        };
        let (small, large) = (encoded(100_000), encoded(1_000_000));
        assert!(large < 12 * small, "{small} -> {large}");
        assert!(
            large < 10 * 1_000_000,
            "{large} entries encoded for 1M streams"
        );
    }
}
