//! MetaLog against a real SQLite file in a temp dir; the tests listed in `contract!` run
//! against Postgres too (see `common`).

mod common;

use pico_metadata::{ApplyError, Command, Outcome, StreamConfig};
use pico_sql::{MetaError, MetaLog, MetaLogOptions, SnapshotStats};
use sqlx::Row;
use std::time::Duration;

contract!(
    propose_applies_and_reads_your_writes,
    group_commit_batches_concurrent_proposals,
    max_batch_bounds_commands_per_row,
    restart_without_snapshot_replays_everything,
    tailer_applies_rows_written_by_another_writer,
    leases_acquire_renew_expire_release,
    corrupted_row_is_a_clear_error,
    corrupted_row_from_another_writer_stops_the_log,
    a_corrupt_row_met_by_the_idle_tail_shows_in_health,
);

fn url(dir: &tempfile::TempDir) -> String {
    format!("sqlite:{}/nested/dir/meta.db", dir.path().display())
}

fn create(name: &str) -> Command {
    Command::CreateStream {
        name: name.into(),
        config: StreamConfig {
            content_type: "text/plain".into(),
            ttl_secs: None,
            expires_at_ms: None,
        },
        closed: false,
        initial: Default::default(),
        now_ms: 1,
    }
}

async fn raw_pool(dir: &tempfile::TempDir) -> sqlx::SqlitePool {
    sqlx::SqlitePool::connect(&format!("{}?mode=rw", url(dir)))
        .await
        .unwrap()
}

async fn count(pool: &sqlx::SqlitePool, table: &str) -> i64 {
    sqlx::query(&format!("SELECT COUNT(*) AS n FROM {table}"))
        .fetch_one(pool)
        .await
        .unwrap()
        .get("n")
}

/// Snapshots are written in the background: waits (up to 10 s) until `done` holds.
async fn wait_for_snapshots(log: &MetaLog, done: impl Fn(&SnapshotStats) -> bool) -> SnapshotStats {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let stats = log.snapshot_stats();
        if done(&stats) {
            return stats;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "snapshots not written: {stats:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn propose_applies_and_reads_your_writes(url: &str) {
    let log = MetaLog::open(url, MetaLogOptions::default()).await.unwrap();
    let mut sub = log.subscribe();
    let out = log.propose(create("a")).await.unwrap();
    assert_eq!(
        out,
        Ok(Outcome::Created {
            stream_id: 0,
            created: true
        })
    );
    // Read-your-writes: the view already holds it when propose returns.
    let view = log.view();
    assert_eq!(view.applied_index, 1);
    assert_eq!(view.stream_by_name("a").unwrap().0.stream_id, 0);
    assert_eq!(log.applied_index(), 1);
    assert_eq!(*sub.borrow_and_update(), 1);
    // A deterministic rejection is an inner error and still a log position.
    let out = log
        .propose(Command::OpenStream {
            stream_id: 0,
            node_id: 9,
            node_epoch: 1,
        })
        .await
        .unwrap();
    assert_eq!(out, Err(ApplyError::UnknownNode { node_id: 9 }));
    assert_eq!(log.applied_index(), 2);
    // Several commands in one row, outcomes in order.
    let outs = log
        .propose_many(vec![
            create("b"),
            create("a"),
            Command::KvPut {
                key: "k".into(),
                value: vec![7],
            },
        ])
        .await
        .unwrap();
    assert_eq!(
        outs,
        vec![
            Ok(Outcome::Created {
                stream_id: 1,
                created: true
            }),
            Ok(Outcome::Created {
                stream_id: 0,
                created: false
            }),
            Ok(Outcome::KvDone)
        ]
    );
    assert_eq!(log.view().kv["k"], vec![7]);
    assert!(log.health().is_ok());
    log.close().await;
    assert!(matches!(log.health(), Err(MetaError::Closed)));
    assert!(matches!(
        log.propose(create("c")).await,
        Err(MetaError::Closed)
    ));
}

async fn group_commit_batches_concurrent_proposals(url: &str) {
    let log = MetaLog::open(url, MetaLogOptions::default()).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..100 {
        let log = log.clone();
        tasks.push(tokio::spawn(async move {
            log.propose(create(&format!("s{i}"))).await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        match t.await.unwrap().unwrap().unwrap() {
            Outcome::Created {
                stream_id,
                created: true,
            } => ids.push(stream_id),
            o => panic!("unexpected {o:?}"),
        }
    }
    ids.sort();
    assert_eq!(
        ids,
        (0..100).collect::<Vec<_>>(),
        "each proposal got its own outcome"
    );
    assert_eq!(log.applied_index(), 100);
    let rows = common::scalar(url, "SELECT COUNT(*) FROM meta_log").await;
    eprintln!("group commit: 100 proposals in {rows} rows");
    assert!(
        rows < 100,
        "group commit should batch: rows={rows} proposals=100"
    );
    let cmds = common::scalar(url, "SELECT CAST(SUM(count) AS BIGINT) FROM meta_log").await;
    assert_eq!(cmds, 100);
    log.close().await;
}

async fn max_batch_bounds_commands_per_row(url: &str) {
    let opts = MetaLogOptions {
        max_batch: 4,
        ..MetaLogOptions::default()
    };
    let log = MetaLog::open(url, opts).await.unwrap();
    let mut set = tokio::task::JoinSet::new();
    for i in 0..20 {
        let log = log.clone();
        set.spawn(async move {
            log.propose(Command::KvPut {
                key: format!("{i}"),
                value: vec![],
            })
            .await
        });
    }
    while let Some(r) = set.join_next().await {
        assert_eq!(r.unwrap().unwrap(), Ok(Outcome::KvDone));
    }
    assert_eq!(log.applied_index(), 20);
    let max = common::scalar(url, "SELECT MAX(count) FROM meta_log").await;
    assert!(max <= 4, "row holds {max} commands, max_batch=4");
    log.close().await;
}

#[tokio::test]
async fn restart_restores_state_after_snapshot_and_truncation() {
    let dir = tempfile::tempdir().unwrap();
    let log = MetaLog::open(&url(&dir), MetaLogOptions::default())
        .await
        .unwrap();
    // 2600 commands in rows of 100: two snapshots (1024, 2048) so the log below the older
    // one is truncated, plus rows after the newest to replay.
    for batch in 0..26 {
        let cmds = (0..100)
            .map(|i| {
                let n = batch * 100 + i;
                if n % 3 == 0 {
                    create(&format!("s{n}"))
                } else {
                    Command::KvPut {
                        key: format!("k{}", n % 50),
                        value: vec![n as u8],
                    }
                }
            })
            .collect();
        log.propose_many(cmds).await.unwrap();
    }
    let before = log.view();
    assert_eq!(before.applied_index, 2600);
    let stats = wait_for_snapshots(&log, |s| s.written >= 2).await;
    assert!(
        stats.last_index >= 2048 && stats.rows_truncated > 0,
        "{stats:?}"
    );
    log.close().await;

    let pool = raw_pool(&dir).await;
    let rows = count(&pool, "meta_log").await;
    assert!(rows < 26, "log rows were truncated: rows={rows}");
    assert_eq!(count(&pool, "meta_snapshot").await, 2);
    pool.close().await;

    let reopened = MetaLog::open(&url(&dir), MetaLogOptions::default())
        .await
        .unwrap();
    assert_eq!(
        *reopened.view(),
        *before,
        "snapshot + replay must rebuild the same state"
    );
    assert!(reopened.snapshot_stats().last_index >= 2048);
    // And it keeps going from there.
    let out = reopened.propose(create("after")).await.unwrap();
    assert!(matches!(out, Ok(Outcome::Created { created: true, .. })));
    assert_eq!(reopened.applied_index(), 2601);
    let before = reopened.view();
    reopened.close().await;

    // A damaged newest snapshot falls back to the older kept one (its rows are still there).
    let pool = raw_pool(&dir).await;
    sqlx::query("UPDATE meta_snapshot SET payload = x'01ff' WHERE applied_index = (SELECT MAX(applied_index) FROM meta_snapshot)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let fallback = MetaLog::open(&url(&dir), MetaLogOptions::default())
        .await
        .unwrap();
    assert_eq!(
        *fallback.view(),
        *before,
        "older snapshot + longer replay gives the same state"
    );
    fallback.close().await;
}

fn every(snapshot_every: u64) -> MetaLogOptions {
    MetaLogOptions {
        snapshot_every,
        ..MetaLogOptions::default()
    }
}

fn put(n: u64) -> Command {
    Command::KvPut {
        key: format!("k{}", n % 3),
        value: n.to_le_bytes().to_vec(),
    }
}

/// Proposes `rows` rows of 5 commands, `cmd(n)` for each next applied index n.
async fn propose_rows(log: &MetaLog, rows: u64, cmd: fn(u64) -> Command) {
    for _ in 0..rows {
        let at = log.applied_index();
        log.propose_many((at..at + 5).map(cmd).collect())
            .await
            .unwrap();
    }
}

/// Snapshots at 10 and 20 (a snapshot every 10 commands), log rows up to the first truncated.
async fn snapshots_at_10_and_20(dir: &tempfile::TempDir, cmd: fn(u64) -> Command) -> MetaLog {
    let log = MetaLog::open(&url(dir), every(10)).await.unwrap();
    // Two rows at a time so that both due points are written (a busy snapshotter merges them).
    propose_rows(&log, 2, cmd).await;
    wait_for_snapshots(&log, |s| s.last_index == 10).await;
    propose_rows(&log, 2, cmd).await;
    wait_for_snapshots(&log, |s| s.last_index == 20).await;
    assert_eq!(snapshot_indexes(dir).await, [10, 20]);
    log
}

async fn snapshot_indexes(dir: &tempfile::TempDir) -> Vec<i64> {
    let pool = raw_pool(dir).await;
    let rows = sqlx::query("SELECT applied_index FROM meta_snapshot ORDER BY applied_index")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    rows.iter().map(|r| r.get("applied_index")).collect()
}

/// The snapshot's bytes, reassembled from its chunks.
async fn snapshot_payload(dir: &tempfile::TempDir, index: i64) -> Vec<u8> {
    use pico_sql::LogStore as _;
    let store = pico_sql::SqliteStore::open(&url(dir)).await.unwrap();
    let payload = store.load_snapshot(index as u64).await.unwrap().unwrap();
    store.close().await;
    payload
}

async fn set_snapshot_payload(dir: &tempfile::TempDir, index: i64, payload: &[u8]) {
    let pool = raw_pool(dir).await;
    let r = sqlx::query("UPDATE meta_snapshot SET payload = ? WHERE applied_index = ?")
        .bind(payload)
        .bind(index)
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(r.rows_affected(), 1);
    pool.close().await;
}

/// Replay from the older snapshot comes due at the damaged one's index again: the snapshot it
/// writes takes the damaged one's place, so the next prune keeps two readable snapshots and a
/// second damage of the newest still costs only a longer replay.
#[tokio::test]
async fn a_damaged_snapshot_is_replaced_and_two_readable_ones_stay_kept() {
    let dir = tempfile::tempdir().unwrap();
    snapshots_at_10_and_20(&dir, put).await.close().await;
    let good = snapshot_payload(&dir, 20).await;
    set_snapshot_payload(&dir, 20, &[1, 0xff]).await;

    let log = MetaLog::open(&url(&dir), every(10)).await.unwrap();
    assert_eq!(log.applied_index(), 20);
    wait_for_snapshots(&log, |s| s.written == 1).await;
    assert_eq!(snapshot_payload(&dir, 20).await, good);
    propose_rows(&log, 2, put).await;
    wait_for_snapshots(&log, |s| s.last_index == 30).await;
    let before = log.view();
    log.close().await;
    assert_eq!(
        snapshot_indexes(&dir).await,
        [20, 30],
        "the one at 10 pruned"
    );

    set_snapshot_payload(&dir, 30, &[1, 0xff]).await;
    let log = MetaLog::open(&url(&dir), every(10)).await.unwrap();
    assert_eq!(*log.view(), *before, "the older kept snapshot loads");
    log.close().await;
}

/// A damaged snapshot whose index replay does not come due at again (here: another cadence) is
/// deleted once an older one loads, instead of counting as one of the two kept.
#[tokio::test]
async fn an_unreadable_snapshot_is_deleted_when_an_older_one_loads() {
    let dir = tempfile::tempdir().unwrap();
    snapshots_at_10_and_20(&dir, put).await.close().await;
    set_snapshot_payload(&dir, 20, &[1, 0xff]).await;

    let log = MetaLog::open(&url(&dir), every(15)).await.unwrap();
    assert_eq!(log.applied_index(), 20);
    assert_eq!(snapshot_indexes(&dir).await, [10]);
    propose_rows(&log, 1, put).await;
    wait_for_snapshots(&log, |s| s.last_index == 25).await;
    let before = log.view();
    log.close().await;
    assert_eq!(snapshot_indexes(&dir).await, [10, 25]);

    set_snapshot_payload(&dir, 25, &[1, 0xff]).await;
    let log = MetaLog::open(&url(&dir), every(15)).await.unwrap();
    assert_eq!(
        *log.view(),
        *before,
        "the snapshot at 10 and its rows are kept"
    );
    log.close().await;
}

#[tokio::test]
async fn a_snapshot_write_replaces_the_row_at_its_index() {
    use pico_sql::LogStore as _;
    let dir = tempfile::tempdir().unwrap();
    let store = pico_sql::SqliteStore::open(&url(&dir)).await.unwrap();
    let meta = pico_sql::SnapshotMeta {
        applied_index: 5,
        last_row_id: 1,
    };
    store.write_snapshot(meta, &[1, 0xff], 2, 0).await.unwrap();
    store.write_snapshot(meta, b"good", 2, 0).await.unwrap();
    assert_eq!(
        store.load_snapshot(5).await.unwrap().as_deref(),
        Some(&b"good"[..])
    );
    store.close().await;
}

/// A snapshot that decodes but breaks an invariant is not trusted: here a `next_stream_id` that
/// would hand a live stream's id to the next create.
#[tokio::test]
async fn a_snapshot_with_bad_values_is_skipped_on_load() {
    let dir = tempfile::tempdir().unwrap();
    let log = snapshots_at_10_and_20(&dir, |n| create(&format!("s{n}"))).await;
    let before = log.view();
    log.close().await;
    let mut bad = before.as_ref().clone();
    bad.next_stream_id = 3;
    set_snapshot_payload(&dir, 20, &pico_metadata::codec::encode_state(&bad)).await;

    let log = MetaLog::open(&url(&dir), every(10)).await.unwrap();
    assert_eq!(
        *log.view(),
        *before,
        "loaded the snapshot at 10 and replayed"
    );
    assert_eq!(
        log.propose(create("next")).await.unwrap(),
        Ok(Outcome::Created {
            stream_id: 20,
            created: true
        })
    );
    log.close().await;
}

#[tokio::test]
async fn snapshots_thin_out_as_the_state_grows_and_restart_replays_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let opts = MetaLogOptions {
        snapshot_every: 8,
        ..MetaLogOptions::default()
    };
    let log = MetaLog::open(&url(&dir), opts.clone()).await.unwrap();
    // 2000 streams in rows of 10 commands: with a snapshot every 8 commands that could be
    // 200 snapshots; waiting for an eighth of the state's entries (2 per stream) leaves
    // about 16 due points. Fewer may be written: points that come due while the snapshotter
    // is still writing merge into the newest, so how many are written depends on how fast the
    // two run; only the upper bound is the rule under test.
    for batch in 0..200 {
        let cmds = (0..10)
            .map(|i| create(&format!("s{}", batch * 10 + i)))
            .collect();
        log.propose_many(cmds).await.unwrap();
    }
    let before = log.view();
    assert_eq!(before.applied_index, 2000);
    let stats = wait_for_snapshots(&log, |s| s.last_index >= 1000).await;
    assert!(
        (1..=40).contains(&stats.written),
        "snapshots written: {stats:?}"
    );
    log.close().await;
    let reopened = MetaLog::open(&url(&dir), opts).await.unwrap();
    assert_eq!(
        *reopened.view(),
        *before,
        "snapshot + replay rebuilds the state"
    );
    reopened.close().await;
}

/// Another writer's snapshot at `index` (covering rows up to the same id) and its truncation of
/// the log below it, run just before the first read of rows after `after_row`.
struct Truncation {
    after_row: i64,
    index: u64,
    payload: Vec<u8>,
}

/// A SQLite store with test hooks: snapshot writes wait until the test opens `gate`, reads
/// run the pending `truncations` whose time has come, and loads of the snapshots at the
/// indexes in `failing_loads` fail as a store outage would.
struct HookedStore {
    inner: pico_sql::SqliteStore,
    gate: tokio::sync::Semaphore,
    truncations: std::sync::Mutex<Vec<Truncation>>,
    failing_loads: std::sync::Mutex<Vec<u64>>,
    failing_writes: std::sync::atomic::AtomicBool,
}

impl HookedStore {
    async fn open(dir: &tempfile::TempDir, permits: usize) -> HookedStore {
        HookedStore {
            inner: pico_sql::SqliteStore::open(&url(dir)).await.unwrap(),
            gate: tokio::sync::Semaphore::new(permits),
            truncations: std::sync::Mutex::default(),
            failing_loads: std::sync::Mutex::default(),
            failing_writes: std::sync::atomic::AtomicBool::new(false),
        }
    }

    fn fail_loads(&self, indexes: &[u64]) {
        *self.failing_loads.lock().unwrap() = indexes.to_vec();
    }
}

#[async_trait::async_trait]
impl pico_sql::LogStore for HookedStore {
    async fn append(&self, payload: &[u8], count: u32, now_ms: i64) -> Result<i64, MetaError> {
        self.inner.append(payload, count, now_ms).await
    }
    async fn read_after(
        &self,
        after_id: i64,
        limit: u32,
    ) -> Result<Vec<pico_sql::LogRow>, MetaError> {
        let due: Vec<Truncation> = {
            let mut pending = self.truncations.lock().unwrap();
            let (due, later) = pending.drain(..).partition(|t| t.after_row <= after_id);
            *pending = later;
            due
        };
        for t in due {
            let pool = self.inner.pool();
            sqlx::query("INSERT INTO meta_snapshot VALUES (?, ?, ?, 0)")
                .bind(t.index as i64)
                .bind(t.index as i64)
                .bind(t.payload)
                .execute(pool)
                .await
                .unwrap();
            sqlx::query("DELETE FROM meta_log WHERE id <= ?")
                .bind(t.index as i64)
                .execute(pool)
                .await
                .unwrap();
        }
        self.inner.read_after(after_id, limit).await
    }
    async fn snapshots(&self) -> Result<Vec<pico_sql::SnapshotMeta>, MetaError> {
        self.inner.snapshots().await
    }
    async fn load_snapshot(&self, applied_index: u64) -> Result<Option<Vec<u8>>, MetaError> {
        if self.failing_loads.lock().unwrap().contains(&applied_index) {
            return Err(MetaError::Store {
                op: "load_snapshot",
                message: "injected outage".into(),
            });
        }
        self.inner.load_snapshot(applied_index).await
    }
    async fn discard_snapshot(
        &self,
        applied_index: u64,
        payload: &[u8],
    ) -> Result<bool, MetaError> {
        self.inner.discard_snapshot(applied_index, payload).await
    }
    async fn write_snapshot(
        &self,
        meta: pico_sql::SnapshotMeta,
        payload: &[u8],
        keep: u32,
        now_ms: i64,
    ) -> Result<u64, MetaError> {
        let _pass = self.gate.acquire().await;
        if self
            .failing_writes
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(MetaError::Store {
                op: "write snapshot",
                message: "injected failure".into(),
            });
        }
        self.inner.write_snapshot(meta, payload, keep, now_ms).await
    }
    async fn try_acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool, MetaError> {
        self.inner
            .try_acquire_lease(name, holder, ttl_ms, now_ms)
            .await
    }
    async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool, MetaError> {
        self.inner.renew_lease(name, holder, ttl_ms, now_ms).await
    }
    async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, MetaError> {
        self.inner.release_lease(name, holder).await
    }
    async fn lease(&self, name: &str) -> Result<Option<(String, i64)>, MetaError> {
        self.inner.lease(name).await
    }
    async fn close(&self) {
        self.inner.close().await
    }
}

#[tokio::test]
async fn a_snapshot_due_while_the_snapshotter_is_busy_is_written_once_it_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(HookedStore::open(&dir, 0).await);
    let opts = MetaLogOptions {
        snapshot_every: 8,
        ..MetaLogOptions::default()
    };
    let log = MetaLog::with_store(store.clone(), opts).await.unwrap();
    // Three rows of 8 commands: each makes a snapshot due, and the first one's write blocks,
    // so the second and third come due while the snapshotter is busy. Then the log goes
    // quiet: no later row will make anything due again.
    for row in 0..3 {
        let cmds = (0..8)
            .map(|i| create(&format!("s{}", row * 8 + i)))
            .collect();
        log.propose_many(cmds).await.unwrap();
    }
    assert_eq!(log.view().applied_index, 24);
    assert_eq!(
        log.snapshot_stats().written,
        0,
        "the gate holds every write"
    );
    store.gate.add_permits(100);
    // The newest due state is the one that must end up written, not only those that found
    // room while the snapshotter was busy.
    let stats = wait_for_snapshots(&log, |s| s.last_index == 24).await;
    assert!((1..=3).contains(&stats.written), "{stats:?}");
    log.close().await;
}

/// A reader far behind pages through the log while another writer snapshots and truncates
/// twice: it must jump over each gap, not only the first, or it silently skips commands.
#[tokio::test]
async fn a_lagging_reader_jumps_over_every_truncation_it_meets() {
    use pico_metadata::{State, codec};
    let dir = tempfile::tempdir().unwrap();
    let store = HookedStore::open(&dir, 100).await;
    // One command per row, so row id n holds the state at applied index n.
    let cmds: Vec<Command> = (0..600)
        .map(|n| Command::KvPut {
            key: format!("k{n}"),
            value: vec![],
        })
        .collect();
    let mut tx = store.inner.pool().begin().await.unwrap();
    for c in &cmds {
        sqlx::query("INSERT INTO meta_log (payload, count, created_at_ms) VALUES (?, 1, 0)")
            .bind(codec::encode_commands(std::slice::from_ref(c)))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    tx.commit().await.unwrap();
    let state_at = |n: usize| {
        let mut s = State::new();
        for c in &cmds[..n] {
            s.apply(c).unwrap();
        }
        s
    };
    // The first truncation comes before the reader's first read; the second after its first
    // page (256 rows), so it meets it on the way.
    *store.truncations.lock().unwrap() = vec![
        Truncation {
            after_row: 0,
            index: 100,
            payload: codec::encode_state(&state_at(100)),
        },
        Truncation {
            after_row: 300,
            index: 400,
            payload: codec::encode_state(&state_at(400)),
        },
    ];
    let store = std::sync::Arc::new(store);
    let log = MetaLog::with_store(store.clone(), MetaLogOptions::default())
        .await
        .unwrap();
    assert!(
        store.truncations.lock().unwrap().is_empty(),
        "both truncations ran"
    );
    let view = log.view();
    assert_eq!(
        (view.applied_index, view.kv.len()),
        (600, 600),
        "no command skipped"
    );
    assert_eq!(*view, state_at(600));
    log.close().await;
}

/// A store failure while loading snapshots says nothing about them: open fails with the
/// retryable store error, not `CorruptSnapshot`, and deletes nothing (here the newest is damaged
/// and the older one cannot be read for now).
#[tokio::test]
async fn a_store_error_loading_snapshots_at_open_is_retryable() {
    let dir = tempfile::tempdir().unwrap();
    let log = snapshots_at_10_and_20(&dir, put).await;
    let before = log.view();
    log.close().await;
    set_snapshot_payload(&dir, 20, &[1, 0xff]).await;

    let store = std::sync::Arc::new(HookedStore::open(&dir, 100).await);
    store.fail_loads(&[10]);
    let err = MetaLog::with_store(store.clone(), every(10))
        .await
        .err()
        .expect("open must fail");
    assert!(matches!(err, MetaError::Store { .. }), "{err:?}");
    assert_eq!(snapshot_indexes(&dir).await, [10, 20], "nothing deleted");

    store.fail_loads(&[]);
    let log = MetaLog::with_store(store, every(10)).await.unwrap();
    assert_eq!(*log.view(), *before, "the older snapshot and its rows load");
    log.close().await;
}

/// The tail meets rows truncated under it while the store cannot load the newer snapshot: the
/// proposal fails as retryable, and the log does not stop for good (it used to answer
/// `CorruptSnapshot` to every later proposal until a restart).
#[tokio::test]
async fn a_store_error_jumping_to_a_newer_snapshot_does_not_stop_the_log() {
    use pico_metadata::{State, codec};
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(HookedStore::open(&dir, 100).await);
    let opts = MetaLogOptions {
        poll_interval: Duration::from_secs(3600),
        ..MetaLogOptions::default()
    };
    let log = MetaLog::with_store(store.clone(), opts).await.unwrap();
    store.fail_loads(&[5]);
    // Another writer, in one transaction: rows 1..=6, a snapshot at 5, the rows it covers gone.
    let cmds: Vec<Command> = (0..6)
        .map(|n| Command::KvPut {
            key: format!("other{n}"),
            value: vec![],
        })
        .collect();
    let mut at_5 = State::new();
    for c in &cmds[..5] {
        at_5.apply(c).unwrap();
    }
    let mut tx = store.inner.pool().begin().await.unwrap();
    for c in &cmds {
        sqlx::query("INSERT INTO meta_log (payload, count, created_at_ms) VALUES (?, 1, 0)")
            .bind(codec::encode_commands(std::slice::from_ref(c)))
            .execute(&mut *tx)
            .await
            .unwrap();
    }
    sqlx::query("INSERT INTO meta_snapshot VALUES (5, 5, ?, 0)")
        .bind(codec::encode_state(&at_5))
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query("DELETE FROM meta_log WHERE id <= 5")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let err = log.propose(create("a")).await.unwrap_err();
    assert!(matches!(err, MetaError::OutcomeUnknown { .. }), "{err:?}");

    store.fail_loads(&[]);
    assert_eq!(
        log.propose(create("b")).await.unwrap(),
        Ok(Outcome::Created {
            stream_id: 1,
            created: true
        })
    );
    let view = log.view();
    assert_eq!(view.applied_index, 8, "snapshot at 5, then rows 6, 7 and 8");
    assert_eq!(view.kv.len(), 6);
    assert!(view.stream_by_name("a").is_some());
    log.close().await;
}

async fn restart_without_snapshot_replays_everything(url: &str) {
    let log = MetaLog::open(url, MetaLogOptions::default()).await.unwrap();
    log.propose(create("a")).await.unwrap().unwrap();
    log.propose(Command::Trim {
        stream_id: 7,
        start_offset: 1,
    })
    .await
    .unwrap()
    .unwrap_err();
    let before = log.view();
    log.close().await;
    let log = MetaLog::open(url, MetaLogOptions::default()).await.unwrap();
    assert_eq!(*log.view(), *before);
    assert_eq!(log.snapshot_stats().written, 0);
    log.close().await;
}

async fn tailer_applies_rows_written_by_another_writer(url: &str) {
    let opts = MetaLogOptions {
        poll_interval: Duration::from_millis(20),
        ..MetaLogOptions::default()
    };
    let a = MetaLog::open(url, opts.clone()).await.unwrap();
    let b = MetaLog::open(url, opts).await.unwrap();
    a.propose(create("from-a")).await.unwrap().unwrap();
    // b sees a's row through the backstop poll, without proposing anything.
    let mut sub = b.subscribe();
    tokio::time::timeout(Duration::from_secs(5), sub.wait_for(|i| *i >= 1))
        .await
        .unwrap()
        .unwrap();
    assert!(b.view().stream_by_name("from-a").is_some());
    // b's own commit applies a's earlier rows first (table order), so ids agree.
    a.propose(create("a2")).await.unwrap().unwrap();
    let out = b.propose(create("from-b")).await.unwrap();
    assert_eq!(
        out,
        Ok(Outcome::Created {
            stream_id: 2,
            created: true
        })
    );
    tokio::time::timeout(Duration::from_secs(5), a.subscribe().wait_for(|i| *i >= 3))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(*a.view(), *b.view());
    a.close().await;
    b.close().await;
}

async fn leases_acquire_renew_expire_release(url: &str) {
    let clock = pico_common::clock::ManualClock::new(1_700_000_000_000);
    let opts = MetaLogOptions {
        clock: clock.clone(),
        ..MetaLogOptions::default()
    };
    let log = MetaLog::open(url, opts).await.unwrap();
    let ttl = Duration::from_millis(200);
    assert!(log.try_acquire_lease("maint", "n1", ttl).await.unwrap());
    assert!(
        !log.try_acquire_lease("maint", "n2", ttl).await.unwrap(),
        "held by n1"
    );
    assert!(
        log.try_acquire_lease("maint", "n1", ttl).await.unwrap(),
        "re-acquire by holder"
    );
    assert!(log.renew_lease("maint", "n1", ttl).await.unwrap());
    assert!(!log.renew_lease("maint", "n2", ttl).await.unwrap());
    assert_eq!(log.lease_holder("maint").await.unwrap().unwrap().0, "n1");
    clock.advance(Duration::from_millis(199));
    assert_eq!(
        log.lease_holder("maint").await.unwrap().unwrap().0,
        "n1",
        "held until its ttl"
    );
    clock.advance(Duration::from_millis(1));
    assert_eq!(log.lease_holder("maint").await.unwrap(), None, "expired");
    assert!(
        !log.renew_lease("maint", "n1", ttl).await.unwrap(),
        "cannot renew an expired lease"
    );
    assert!(
        log.try_acquire_lease("maint", "n2", ttl).await.unwrap(),
        "expired lease is taken over"
    );
    assert!(!log.release_lease("maint", "n1").await.unwrap());
    assert!(log.release_lease("maint", "n2").await.unwrap());
    assert!(log.try_acquire_lease("maint", "n1", ttl).await.unwrap());
    log.close().await;
}

async fn corrupted_row_is_a_clear_error(url: &str) {
    let log = MetaLog::open(url, MetaLogOptions::default()).await.unwrap();
    log.propose(create("a")).await.unwrap().unwrap();
    log.close().await;
    common::insert_row(url, &[1u8, 2, 0xff, 0xff, 0xff], 1).await;
    let err = MetaLog::open(url, MetaLogOptions::default())
        .await
        .err()
        .expect("open must fail");
    assert!(
        matches!(err, MetaError::CorruptRow { row_id: 2, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("row_id=2"), "{err}");
}

async fn corrupted_row_from_another_writer_stops_the_log(url: &str) {
    let log = MetaLog::open(url, MetaLogOptions::default()).await.unwrap();
    log.propose(create("a")).await.unwrap().unwrap();
    common::insert_row(url, &[9u8], 1).await;
    let err = log.propose(create("b")).await.unwrap_err();
    assert!(
        matches!(err, MetaError::CorruptRow { row_id: 2, .. }),
        "{err:?}"
    );
    // It stays stopped rather than applying past the bad row, and says so.
    assert!(matches!(
        log.propose(create("c")).await,
        Err(MetaError::CorruptRow { .. })
    ));
    assert_eq!(log.applied_index(), 1);
    let health = log.health().unwrap_err();
    assert!(
        matches!(health, MetaError::CorruptRow { row_id: 2, .. }),
        "{health:?}"
    );
    assert!(health.is_permanent());
    assert_eq!(health.kind(), pico_common::ErrorKind::Internal);
    log.close().await;
}

/// A log that stops while idle (its backstop tail meets the bad row) must be visible to the
/// server's readiness probe, not only to the next proposal.
async fn a_corrupt_row_met_by_the_idle_tail_shows_in_health(url: &str) {
    let opts = MetaLogOptions {
        poll_interval: Duration::from_millis(20),
        ..MetaLogOptions::default()
    };
    let log = MetaLog::open(url, opts).await.unwrap();
    log.propose(create("a")).await.unwrap().unwrap();
    assert!(log.health().is_ok());
    common::insert_row(url, &[9u8], 1).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let err = loop {
        if let Err(e) = log.health() {
            break e;
        }
        assert!(tokio::time::Instant::now() < deadline, "health stayed ok");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        matches!(err, MetaError::CorruptRow { row_id: 2, .. }),
        "{err:?}"
    );
    assert!(err.is_permanent());
    assert!(matches!(
        log.propose(create("b")).await,
        Err(MetaError::CorruptRow { row_id: 2, .. })
    ));
    log.close().await;
    // Still the reason, not `Closed`.
    assert!(matches!(log.health(), Err(MetaError::CorruptRow { .. })));
}

#[tokio::test]
async fn memory_and_postgres_urls() {
    let log = MetaLog::open("sqlite::memory:", MetaLogOptions::default())
        .await
        .unwrap();
    log.propose(create("a")).await.unwrap().unwrap();
    assert!(log.view().stream_by_name("a").is_some());
    log.close().await;
    // Postgres URLs are opened (tests/contract.rs); a malformed one is a bad URL.
    let err = MetaLog::open("postgres://localhost:port/x", MetaLogOptions::default())
        .await
        .err()
        .unwrap();
    assert!(matches!(err, MetaError::BadUrl(_)), "{err:?}");
    assert!(matches!(
        MetaLog::open("mysql://x", MetaLogOptions::default()).await,
        Err(MetaError::BadUrl(_))
    ));
}

/// Snapshot failures in a row are counted (the server can alert on them: while they last the
/// log is not truncated), and a written snapshot resets the count.
#[tokio::test]
async fn consecutive_snapshot_failures_are_counted_and_reset_by_a_success() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(HookedStore::open(&dir, 100).await);
    store
        .failing_writes
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let log = MetaLog::with_store(store.clone(), every(10)).await.unwrap();
    propose_rows(&log, 2, put).await;
    wait_for_snapshots(&log, |s| s.consecutive_failures == 1).await;
    propose_rows(&log, 2, put).await;
    let stats = wait_for_snapshots(&log, |s| s.consecutive_failures == 2).await;
    assert_eq!(stats.written, 0, "{stats:?}");
    store
        .failing_writes
        .store(false, std::sync::atomic::Ordering::Relaxed);
    propose_rows(&log, 2, put).await;
    let stats = wait_for_snapshots(&log, |s| s.written == 1).await;
    assert_eq!(stats.consecutive_failures, 0, "{stats:?}");
    log.close().await;
}

/// (blob id, chunk count, bytes) of every stored snapshot blob, by blob id.
async fn chunk_sets(pool: &sqlx::SqlitePool) -> Vec<(i64, i64, i64)> {
    sqlx::query_as(
        "SELECT blob_id, COUNT(*), SUM(LENGTH(data)) FROM meta_snapshot_chunk
         GROUP BY blob_id ORDER BY blob_id",
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn chunked_store(dir: &tempfile::TempDir, chunk_bytes: usize) -> pico_sql::SqliteStore {
    pico_sql::SqliteStore::open(&url(dir))
        .await
        .unwrap()
        .with_snapshot_chunk_bytes(chunk_bytes)
}

/// A snapshot is stored in chunks (a small chunk size stands in for SQLite's 1 GB value
/// limit): written, pruned with its chunks, and loaded again at restart.
#[tokio::test]
async fn snapshots_are_stored_in_chunks_and_restart_loads_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(chunked_store(&dir, 64).await);
    let log = MetaLog::with_store(store.clone(), every(10)).await.unwrap();
    let name = |n: u64| create(&format!("stream-{n}"));
    for target in [10, 20, 30] {
        propose_rows(&log, 2, name).await;
        wait_for_snapshots(&log, |s| s.last_index == target).await;
    }
    let before = log.view();
    log.close().await;

    let pool = raw_pool(&dir).await;
    assert_eq!(snapshot_indexes(&dir).await, [20, 30]);
    let sets = chunk_sets(&pool).await;
    assert_eq!(
        sets.len(),
        2,
        "the pruned snapshot's chunks are gone: {sets:?}"
    );
    for (_, chunks, bytes) in &sets {
        assert!(*chunks > 1, "{sets:?}");
        assert_eq!(*chunks as u64, (*bytes as u64).div_ceil(64), "{sets:?}");
    }
    assert_eq!(count(&pool, "meta_snapshot_blob").await, 2);
    let manifest_len: i64 = sqlx::query_scalar("SELECT MAX(LENGTH(payload)) FROM meta_snapshot")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(manifest_len < 64, "rows hold manifests, not payloads");
    pool.close().await;
    assert_eq!(
        pico_metadata::codec::decode_state(&snapshot_payload(&dir, 30).await).unwrap(),
        *before,
        "its chunks reassemble to the state at 30"
    );

    // Another chunk size reads them all the same.
    let reopened = MetaLog::open(&url(&dir), every(10)).await.unwrap();
    assert_eq!(*reopened.view(), *before);
    assert_eq!(reopened.snapshot_stats().last_index, 30);
    reopened.close().await;
}

#[tokio::test]
async fn a_chunked_snapshot_round_trips_and_a_missing_chunk_is_corruption() {
    use pico_sql::LogStore as _;
    let dir = tempfile::tempdir().unwrap();
    let store = chunked_store(&dir, 7).await;
    let meta = pico_sql::SnapshotMeta {
        applied_index: 5,
        last_row_id: 1,
    };
    let payload: Vec<u8> = (0..1000u32).map(|i| (i * 31 % 251) as u8).collect();
    store.write_snapshot(meta, &payload, 2, 0).await.unwrap();
    assert_eq!(chunk_sets(store.pool()).await, [(1, 143, 1000)]);
    assert_eq!(store.load_snapshot(5).await.unwrap(), Some(payload.clone()));
    // Exact multiples and a single byte too.
    for len in [7, 14, 1] {
        store
            .write_snapshot(meta, &payload[..len], 2, 0)
            .await
            .unwrap();
        assert_eq!(
            store.load_snapshot(5).await.unwrap().as_deref(),
            Some(&payload[..len])
        );
    }
    // Rewriting the index freed the chunks of the copies it replaced.
    assert_eq!(chunk_sets(store.pool()).await, [(4, 1, 1)]);

    // Damage: a chunk shorter than written (the total length no longer adds up), then one
    // missing.
    store.write_snapshot(meta, &payload, 2, 0).await.unwrap();
    sqlx::query("UPDATE meta_snapshot_chunk SET data = x'00' WHERE seq = 142")
        .execute(store.pool())
        .await
        .unwrap();
    let err = store.load_snapshot(5).await.unwrap_err();
    assert!(matches!(err, MetaError::CorruptSnapshot(_)), "{err:?}");
    sqlx::query("DELETE FROM meta_snapshot_chunk WHERE seq = 100")
        .execute(store.pool())
        .await
        .unwrap();
    let err = store.load_snapshot(5).await.unwrap_err();
    assert!(matches!(err, MetaError::CorruptSnapshot(_)), "{err:?}");
    store.close().await;
}

/// The loader deletes an unreadable chunked snapshot (with its chunks) only while the row
/// still holds the bytes it read.
#[tokio::test]
async fn discarding_a_chunked_snapshot_compares_its_bytes() {
    use pico_sql::LogStore as _;
    let dir = tempfile::tempdir().unwrap();
    let store = chunked_store(&dir, 4).await;
    let meta = pico_sql::SnapshotMeta {
        applied_index: 5,
        last_row_id: 1,
    };
    store
        .write_snapshot(meta, b"damaged!!", 2, 0)
        .await
        .unwrap();
    let loaded = store.load_snapshot(5).await.unwrap().unwrap();
    assert!(!store.discard_snapshot(5, b"damaged!?").await.unwrap());
    assert!(!store.discard_snapshot(5, b"damaged!").await.unwrap());
    // Another writer rewrote the row since: kept.
    store
        .write_snapshot(meta, b"repaired!", 2, 0)
        .await
        .unwrap();
    assert!(!store.discard_snapshot(5, &loaded).await.unwrap());
    assert_eq!(
        store.load_snapshot(5).await.unwrap().as_deref(),
        Some(&b"repaired!"[..])
    );
    assert!(store.discard_snapshot(5, b"repaired!").await.unwrap());
    assert_eq!(store.load_snapshot(5).await.unwrap(), None);
    assert!(chunk_sets(store.pool()).await.is_empty());
    assert_eq!(count(store.pool(), "meta_snapshot_blob").await, 0);
    store.close().await;
}

/// A write that fails halfway leaves chunks nothing references: the next attempt deletes them,
/// and so does the next open when the process died instead. A failed write changes nothing else.
#[tokio::test]
async fn chunks_of_a_failed_snapshot_write_are_deleted_at_the_next_attempt_and_at_open() {
    use pico_sql::LogStore as _;
    let dir = tempfile::tempdir().unwrap();
    let store = chunked_store(&dir, 4).await;
    let meta = |applied_index| pico_sql::SnapshotMeta {
        applied_index,
        last_row_id: 1,
    };
    store
        .write_snapshot(meta(5), b"first snapshot", 2, 0)
        .await
        .unwrap();
    let fail_at_seq_2 = "CREATE TRIGGER fail_chunk BEFORE INSERT ON meta_snapshot_chunk
        WHEN NEW.seq = 2 BEGIN SELECT RAISE(ABORT, 'injected'); END";
    sqlx::query(fail_at_seq_2)
        .execute(store.pool())
        .await
        .unwrap();
    store
        .write_snapshot(meta(6), b"second snapshot", 2, 0)
        .await
        .unwrap_err();
    assert_eq!(snapshot_indexes(&dir).await, [5]);
    assert_eq!(
        chunk_sets(store.pool()).await,
        [(1, 4, 14), (2, 2, 8)],
        "the failed write's chunks are left"
    );
    assert_eq!(
        store.load_snapshot(5).await.unwrap().as_deref(),
        Some(&b"first snapshot"[..])
    );
    sqlx::query("DROP TRIGGER fail_chunk")
        .execute(store.pool())
        .await
        .unwrap();
    store
        .write_snapshot(meta(6), b"second snapshot", 2, 0)
        .await
        .unwrap();
    assert_eq!(chunk_sets(store.pool()).await, [(1, 4, 14), (3, 4, 15)]);
    assert_eq!(count(store.pool(), "meta_snapshot_blob").await, 2);

    // Fails again, and the process goes away before another attempt.
    sqlx::query(fail_at_seq_2)
        .execute(store.pool())
        .await
        .unwrap();
    store
        .write_snapshot(meta(7), b"third snapshot", 2, 0)
        .await
        .unwrap_err();
    sqlx::query("DROP TRIGGER fail_chunk")
        .execute(store.pool())
        .await
        .unwrap();
    assert_eq!(chunk_sets(store.pool()).await.len(), 3);
    store.close().await;
    let store = chunked_store(&dir, 4).await;
    assert_eq!(chunk_sets(store.pool()).await, [(1, 4, 14), (3, 4, 15)]);
    assert_eq!(count(store.pool(), "meta_snapshot_blob").await, 2);
    assert_eq!(snapshot_indexes(&dir).await, [5, 6]);
    store.close().await;
}

/// Databases written before snapshots were chunked hold each snapshot in one blob: they still
/// load, and chunked snapshots replace them through the usual pruning.
#[tokio::test]
async fn a_single_blob_snapshot_from_before_chunking_still_loads() {
    use pico_metadata::{State, codec};
    let dir = tempfile::tempdir().unwrap();
    let store = chunked_store(&dir, 16).await;
    // Rows 1..=7 of one command each, the old form of a snapshot at 5, the rows it covers gone.
    let cmds: Vec<Command> = (0..7).map(put).collect();
    let mut at_5 = State::new();
    for c in &cmds[..5] {
        at_5.apply(c).unwrap();
    }
    let pool = store.pool().clone();
    for c in &cmds {
        sqlx::query("INSERT INTO meta_log (payload, count, created_at_ms) VALUES (?, 1, 0)")
            .bind(codec::encode_commands(std::slice::from_ref(c)))
            .execute(&pool)
            .await
            .unwrap();
    }
    sqlx::query("INSERT INTO meta_snapshot VALUES (5, 5, ?, 0)")
        .bind(codec::encode_state(&at_5))
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM meta_log WHERE id <= 5")
        .execute(&pool)
        .await
        .unwrap();
    let mut at_7 = at_5.clone();
    for c in &cmds[5..] {
        at_7.apply(c).unwrap();
    }

    let log = MetaLog::with_store(std::sync::Arc::new(store), every(5))
        .await
        .unwrap();
    assert_eq!(*log.view(), at_7);
    assert_eq!(log.snapshot_stats().last_index, 5);
    propose_rows(&log, 1, put).await;
    wait_for_snapshots(&log, |s| s.last_index == 12).await;
    propose_rows(&log, 1, put).await;
    wait_for_snapshots(&log, |s| s.last_index == 17).await;
    let before = log.view();
    log.close().await;
    assert_eq!(
        snapshot_indexes(&dir).await,
        [12, 17],
        "the old form pruned"
    );
    let log = MetaLog::open(&url(&dir), every(5)).await.unwrap();
    assert_eq!(*log.view(), *before);
    log.close().await;
}

/// `allowUnsafe=true|false` is the metadata log's to read, not the driver's: it is taken off
/// the URL (the store opens), and a value that is neither is refused as a bad URL. (That the
/// server's `fsync=off` is refused without it is `postgres::tests`: this server runs with
/// fsync on, and only a restart could turn it off.)
#[tokio::test]
async fn allow_unsafe_is_read_off_a_postgres_url() {
    let Some(db) = common::Db::postgres().await else {
        return;
    };
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let log = MetaLog::open(
        &format!("{}{sep}allowUnsafe=true", db.url),
        MetaLogOptions::default(),
    )
    .await
    .unwrap();
    log.propose(create("a")).await.unwrap().unwrap();
    log.close().await;
    let Err(e) = MetaLog::open(
        &format!("{}{sep}allowUnsafe=maybe", db.url),
        MetaLogOptions::default(),
    )
    .await
    else {
        panic!("a bad allowUnsafe was accepted");
    };
    assert!(
        matches!(&e, MetaError::BadUrl(m) if m.contains("allowUnsafe")),
        "{e}"
    );
}
