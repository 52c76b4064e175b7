//! The `LogStore` contract, run against SQLite and Postgres alike: every test is a function of
//! the store URL, instantiated once per backend by `contract!` (backends: `common`). The
//! `MetaLog` tests in `metalog.rs` that need no SQLite internals run on both the same way.

mod common;

use common::{Db, chunk_blobs, exec};
use pico_metadata::{Command, Outcome, StreamConfig};
use pico_sql::{LogRow, LogStore, MetaError, MetaLog, MetaLogOptions, SnapshotMeta, open_store};
use std::sync::Arc;
use std::time::Duration;

contract!(
    appends_get_growing_ids_and_read_back_in_order,
    concurrent_appends_become_visible_in_id_order,
    tables_are_created_safely_by_nodes_starting_at_once,
    snapshots_replace_prune_and_truncate,
    a_chunked_snapshot_round_trips_and_a_missing_chunk_is_corruption,
    discarding_a_snapshot_compares_its_bytes,
    leases_follow_the_callers_clock,
    a_log_restarts_from_its_snapshot_and_the_rows_after_it,
    a_node_behind_a_truncation_jumps_to_the_newest_snapshot,
);

async fn store(url: &str) -> Arc<dyn LogStore> {
    open_store(url).await.unwrap()
}

/// A store writing snapshots in chunks of `bytes`.
async fn chunked_store(url: &str, bytes: usize) -> Arc<dyn LogStore> {
    if url.starts_with("sqlite:") {
        Arc::new(
            pico_sql::SqliteStore::open(url)
                .await
                .unwrap()
                .with_snapshot_chunk_bytes(bytes),
        )
    } else {
        Arc::new(
            pico_sql::PgStore::open(url)
                .await
                .unwrap()
                .with_snapshot_chunk_bytes(bytes),
        )
    }
}

async fn appends_get_growing_ids_and_read_back_in_order(url: &str) {
    let s = store(url).await;
    let mut ids = Vec::new();
    for n in 1..=3u8 {
        ids.push(s.append(&[n; 3], u32::from(n), 1000).await.unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    let rows = s.read_after(0, 10).await.unwrap();
    let got: Vec<(i64, Vec<u8>, i64)> = rows
        .into_iter()
        .map(|r| (r.id, r.payload, r.count))
        .collect();
    assert_eq!(
        got,
        vec![
            (ids[0], vec![1; 3], 1),
            (ids[1], vec![2; 3], 2),
            (ids[2], vec![3; 3], 3)
        ]
    );
    let page = s.read_after(ids[0], 1).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(page[0].id, ids[1]);
    assert!(s.read_after(ids[2], 10).await.unwrap().is_empty());
    // Ids are never reused, even after the rows are truncated and the store reopened.
    s.write_snapshot(
        SnapshotMeta {
            applied_index: 6,
            last_row_id: ids[2],
        },
        b"state",
        1,
        1000,
    )
    .await
    .unwrap();
    assert!(s.read_after(0, 10).await.unwrap().is_empty());
    s.close().await;
    let s = store(url).await;
    let next = s.append(b"x", 1, 1000).await.unwrap();
    assert!(next > ids[2], "id reused: {next} <= {}", ids[2]);
    s.close().await;
}

/// A tailer reads `id > last seen`: a row that became visible after a larger id would be
/// skipped for good. Several nodes append at once while one tails; it must see every row.
async fn concurrent_appends_become_visible_in_id_order(url: &str) {
    const WRITERS: usize = 6;
    const EACH: usize = 40;
    let mut writers = tokio::task::JoinSet::new();
    for w in 0..WRITERS {
        // A store per writer: separate connections, as separate nodes have.
        let s = store(url).await;
        writers.spawn(async move {
            for i in 0..EACH {
                s.append(&[w as u8, i as u8], 1, 0).await.unwrap();
            }
            s.close().await;
        });
    }
    let tailer = store(url).await;
    let mut seen = Vec::new();
    let mut last = 0;
    loop {
        let done = writers.is_empty();
        for row in tailer.read_after(last, 1000).await.unwrap() {
            last = row.id;
            seen.push(row.id);
        }
        if done {
            break;
        }
        while let Some(r) = writers.try_join_next() {
            r.unwrap();
        }
    }
    let all: Vec<i64> = tailer
        .read_after(0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(all.len(), WRITERS * EACH);
    assert_eq!(seen, all, "the tailer missed rows that became visible late");
    tailer.close().await;
}

async fn tables_are_created_safely_by_nodes_starting_at_once(url: &str) {
    let mut opens = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let url = url.to_string();
        opens.spawn(async move { open_store(&url).await });
    }
    while let Some(r) = opens.join_next().await {
        let s = r.unwrap().unwrap();
        s.append(b"x", 1, 0).await.unwrap();
        s.close().await;
    }
    assert_eq!(store(url).await.read_after(0, 100).await.unwrap().len(), 6);
}

async fn snapshots_replace_prune_and_truncate(url: &str) {
    let s = store(url).await;
    let mut ids = Vec::new();
    for n in 0..6u8 {
        ids.push(s.append(&[n], 1, 0).await.unwrap());
    }
    let meta = |applied_index: u64, row: usize| SnapshotMeta {
        applied_index,
        last_row_id: ids[row],
    };
    // One snapshot of two kept: nothing truncated yet.
    assert_eq!(s.write_snapshot(meta(2, 1), b"two", 2, 0).await.unwrap(), 0);
    assert_eq!(s.snapshots().await.unwrap(), vec![meta(2, 1)]);
    // Two kept: the rows the older one covers go (it stays replayable from there).
    assert_eq!(
        s.write_snapshot(meta(4, 3), b"four", 2, 0).await.unwrap(),
        2
    );
    assert_eq!(s.read_after(0, 10).await.unwrap()[0].id, ids[2]);
    // A third prunes the oldest and truncates below the new oldest.
    assert_eq!(s.write_snapshot(meta(6, 5), b"six", 2, 0).await.unwrap(), 2);
    assert_eq!(s.snapshots().await.unwrap(), vec![meta(6, 5), meta(4, 3)]);
    assert_eq!(s.read_after(0, 10).await.unwrap()[0].id, ids[4]);
    assert_eq!(s.load_snapshot(2).await.unwrap(), None);
    assert_eq!(
        s.load_snapshot(4).await.unwrap().as_deref(),
        Some(&b"four"[..])
    );
    // A write at an existing index replaces that row.
    s.write_snapshot(meta(6, 5), b"six again", 2, 0)
        .await
        .unwrap();
    assert_eq!(s.snapshots().await.unwrap(), vec![meta(6, 5), meta(4, 3)]);
    assert_eq!(
        s.load_snapshot(6).await.unwrap().as_deref(),
        Some(&b"six again"[..])
    );
    // A writer behind two newer snapshots writes a row that is pruned at once.
    s.write_snapshot(meta(3, 2), b"three", 2, 0).await.unwrap();
    assert_eq!(s.snapshots().await.unwrap(), vec![meta(6, 5), meta(4, 3)]);
    // Replaced and pruned snapshots leave no chunks behind.
    s.close().await;
    assert_eq!(chunk_blobs(url).await, 2);
}

async fn a_chunked_snapshot_round_trips_and_a_missing_chunk_is_corruption(url: &str) {
    let s = chunked_store(url, 7).await;
    let payload: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
    let meta = SnapshotMeta {
        applied_index: 10,
        last_row_id: 0,
    };
    s.write_snapshot(meta, &payload, 2, 0).await.unwrap();
    assert_eq!(s.load_snapshot(10).await.unwrap(), Some(payload.clone()));
    // An empty state is a snapshot too.
    s.write_snapshot(
        SnapshotMeta {
            applied_index: 11,
            last_row_id: 0,
        },
        b"",
        2,
        0,
    )
    .await
    .unwrap();
    assert_eq!(s.load_snapshot(11).await.unwrap(), Some(Vec::new()));
    exec(url, "DELETE FROM meta_snapshot_chunk WHERE seq = 3").await;
    let err = s.load_snapshot(10).await.unwrap_err();
    assert!(matches!(err, MetaError::CorruptSnapshot(_)), "{err:?}");
    s.close().await;
}

async fn discarding_a_snapshot_compares_its_bytes(url: &str) {
    let s = chunked_store(url, 4).await;
    let meta = SnapshotMeta {
        applied_index: 5,
        last_row_id: 0,
    };
    s.write_snapshot(meta, b"the state bytes", 2, 0)
        .await
        .unwrap();
    assert!(!s.discard_snapshot(5, b"the state bytez").await.unwrap());
    assert!(!s.discard_snapshot(5, b"the state").await.unwrap());
    assert!(!s.discard_snapshot(6, b"the state bytes").await.unwrap());
    assert_eq!(s.snapshots().await.unwrap(), vec![meta]);
    assert!(s.discard_snapshot(5, b"the state bytes").await.unwrap());
    assert!(s.snapshots().await.unwrap().is_empty());
    assert!(!s.discard_snapshot(5, b"the state bytes").await.unwrap());
    s.close().await;
    assert_eq!(chunk_blobs(url).await, 0);
}

async fn leases_follow_the_callers_clock(url: &str) {
    let s = store(url).await;
    let t0 = 1_700_000_000_000;
    assert!(s.try_acquire_lease("maint", "n1", 200, t0).await.unwrap());
    assert!(!s.try_acquire_lease("maint", "n2", 200, t0).await.unwrap());
    assert!(
        s.try_acquire_lease("maint", "n1", 200, t0 + 10)
            .await
            .unwrap()
    );
    assert_eq!(
        s.lease("maint").await.unwrap(),
        Some(("n1".into(), t0 + 210))
    );
    assert!(s.renew_lease("maint", "n1", 200, t0 + 100).await.unwrap());
    assert!(!s.renew_lease("maint", "n2", 200, t0 + 100).await.unwrap());
    assert_eq!(
        s.lease("maint").await.unwrap(),
        Some(("n1".into(), t0 + 300))
    );
    // Expired at its expiry time: no renewal, taken over by another holder.
    assert!(!s.renew_lease("maint", "n1", 200, t0 + 300).await.unwrap());
    assert!(
        !s.try_acquire_lease("maint", "n2", 200, t0 + 299)
            .await
            .unwrap()
    );
    assert!(
        s.try_acquire_lease("maint", "n2", 200, t0 + 300)
            .await
            .unwrap()
    );
    assert!(!s.release_lease("maint", "n1").await.unwrap());
    assert!(s.release_lease("maint", "n2").await.unwrap());
    assert_eq!(s.lease("maint").await.unwrap(), None);
    s.close().await;
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

fn put(n: u64) -> Command {
    Command::KvPut {
        key: format!("k{}", n % 7),
        value: n.to_le_bytes().to_vec(),
    }
}

async fn a_log_restarts_from_its_snapshot_and_the_rows_after_it(url: &str) {
    let opts = MetaLogOptions {
        snapshot_every: 10,
        ..MetaLogOptions::default()
    };
    let log = MetaLog::open(url, opts.clone()).await.unwrap();
    for row in 0..9u64 {
        let mut cmds: Vec<Command> = (row * 5..row * 5 + 4).map(put).collect();
        cmds.push(create(&format!("s{row}")));
        log.propose_many(cmds).await.unwrap();
    }
    let before = log.view();
    assert_eq!(before.applied_index, 45);
    // Snapshots are written in the background.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while log.snapshot_stats().rows_truncated == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            log.snapshot_stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    log.close().await;
    let reopened = MetaLog::open(url, opts).await.unwrap();
    assert_eq!(
        *reopened.view(),
        *before,
        "snapshot + replay rebuild the state"
    );
    assert!(reopened.snapshot_stats().last_index >= 20);
    let out = reopened.propose(create("after")).await.unwrap();
    assert!(matches!(out, Ok(Outcome::Created { created: true, .. })));
    reopened.close().await;
}

/// A store that reads no rows while `asleep` (and whose appends never wake the tail): its log
/// is left behind on purpose, deterministically.
struct Sleepy {
    inner: Arc<dyn LogStore>,
    asleep: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl LogStore for Sleepy {
    async fn append(&self, payload: &[u8], count: u32, now_ms: i64) -> Result<i64, MetaError> {
        self.inner.append(payload, count, now_ms).await
    }
    async fn read_after(&self, after_id: i64, limit: u32) -> Result<Vec<LogRow>, MetaError> {
        if self.asleep.load(std::sync::atomic::Ordering::SeqCst) {
            return Ok(Vec::new());
        }
        self.inner.read_after(after_id, limit).await
    }
    async fn snapshots(&self) -> Result<Vec<SnapshotMeta>, MetaError> {
        self.inner.snapshots().await
    }
    async fn load_snapshot(&self, applied_index: u64) -> Result<Option<Vec<u8>>, MetaError> {
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
        meta: SnapshotMeta,
        payload: &[u8],
        keep: u32,
        now_ms: i64,
    ) -> Result<u64, MetaError> {
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

/// b sleeps through a's proposals, snapshots and truncation; its next commit finds the rows
/// after its position gone and continues from the newest snapshot.
async fn a_node_behind_a_truncation_jumps_to_the_newest_snapshot(url: &str) {
    let a = MetaLog::open(
        url,
        MetaLogOptions {
            snapshot_every: 10,
            ..MetaLogOptions::default()
        },
    )
    .await
    .unwrap();
    let sleepy = Arc::new(Sleepy {
        inner: open_store(url).await.unwrap(),
        asleep: std::sync::atomic::AtomicBool::new(true),
    });
    let b = MetaLog::with_store(
        sleepy.clone(),
        MetaLogOptions {
            poll_interval: Duration::from_secs(3600),
            ..MetaLogOptions::default()
        },
    )
    .await
    .unwrap();
    for row in 0..9u64 {
        a.propose_many((row * 5..row * 5 + 5).map(put).collect())
            .await
            .unwrap();
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while a.snapshot_stats().rows_truncated == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{:?}",
            a.snapshot_stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(b.applied_index(), 0, "b was left behind");
    sleepy
        .asleep
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let out = b.propose(create("from-b")).await.unwrap();
    assert!(matches!(out, Ok(Outcome::Created { created: true, .. })));
    assert_eq!(b.applied_index(), 46);
    a.propose(put(99)).await.unwrap().unwrap();
    assert_eq!(a.applied_index(), 47);
    b.propose(put(100)).await.unwrap().unwrap();
    tokio::time::timeout(
        Duration::from_secs(10),
        a.subscribe().wait_for(|i| *i >= 48),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(*a.view(), *b.view());
    a.close().await;
    b.close().await;
}

/// Postgres only (SQLite has no notifications): with the poll an hour away, only the append
/// notification can bring a's row to b.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_notification_wakes_another_nodes_tail() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    let opts = MetaLogOptions {
        poll_interval: Duration::from_secs(3600),
        ..MetaLogOptions::default()
    };
    let a = MetaLog::open(&db.url, opts.clone()).await.unwrap();
    let b = MetaLog::open(&db.url, opts).await.unwrap();
    for n in 1..=3u64 {
        a.propose(put(n)).await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(10), b.subscribe().wait_for(|i| *i >= n))
            .await
            .expect("b was not woken by a's append")
            .unwrap();
    }
    assert_eq!(*a.view(), *b.view());
    a.close().await;
    b.close().await;
}

/// Postgres only: a database defaulting to asynchronous commit (acks before the WAL flush)
/// must not weaken the log's durability.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_commit_synchronously_even_where_the_database_defaults_to_async() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    let name = db.url.rsplit('/').next().unwrap().to_string();
    exec(
        &db.url,
        &format!("ALTER DATABASE {name} SET synchronous_commit = off"),
    )
    .await;
    let store = pico_sql::PgStore::open(&db.url).await.unwrap();
    let mut conns = Vec::new();
    for _ in 0..3 {
        conns.push(store.pool().acquire().await.unwrap());
    }
    for conn in &mut conns {
        let setting: String = sqlx::query_scalar("SHOW synchronous_commit")
            .fetch_one(&mut **conn)
            .await
            .unwrap();
        assert_eq!(setting, "on");
    }
    drop(conns);
    store.close().await;
}

/// Metadata URL errors reach logs and operators: a password must not go with them.
#[tokio::test]
async fn a_bad_postgres_url_is_reported_without_its_password() {
    let err = open_store("postgres://pico:s3cret@localhost:port/meta")
        .await
        .err()
        .unwrap();
    assert!(matches!(err, MetaError::BadUrl(_)), "{err:?}");
    assert!(!err.to_string().contains("s3cret"), "{err}");
}

/// Postgres only, deterministic: an append that drew its id and is still in flight must keep
/// a later append's row invisible, or a tailer passes the later id and never reads the earlier
/// row. A trigger parks the first append (id drawn) on a lock the test holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_append_stays_invisible_while_an_earlier_one_is_in_flight() {
    let Some(db) = Db::postgres().await else {
        return;
    };
    let url = db.url.clone();
    let first = store(&url).await;
    let second = store(&url).await;
    let admin = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query(
        "CREATE FUNCTION park_slow() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.payload = convert_to('slow', 'UTF8') THEN
             PERFORM pg_advisory_lock(42);
             PERFORM pg_advisory_unlock(42);
           END IF;
           RETURN NEW;
         END $$",
    )
    .execute(&admin)
    .await
    .unwrap();
    sqlx::query(
        "CREATE TRIGGER park BEFORE INSERT ON meta_log
         FOR EACH ROW EXECUTE FUNCTION park_slow()",
    )
    .execute(&admin)
    .await
    .unwrap();
    let mut gate = admin.acquire().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock(42)")
        .execute(&mut *gate)
        .await
        .unwrap();
    let waiters = |n: i64| {
        let admin = admin.clone();
        async move {
            loop {
                let waiting: i64 = sqlx::query_scalar(
                    "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
                )
                .fetch_one(&admin)
                .await
                .unwrap();
                if waiting >= n {
                    return;
                }
                tokio::task::yield_now().await;
            }
        }
    };
    let slow = tokio::spawn(async move { first.append(b"slow", 1, 0).await.unwrap() });
    waiters(1).await; // parked in the trigger, its id drawn
    let fast = tokio::spawn(async move { second.append(b"fast", 1, 0).await.unwrap() });
    // The fast append either committed (no ordering) or waits behind the slow one.
    tokio::select! {
        _ = waiters(2) => {}
        _ = async { while !fast.is_finished() { tokio::task::yield_now().await } } => {}
    }
    let tailer = store(&url).await;
    let seen: Vec<i64> = tailer
        .read_after(0, 10)
        .await
        .unwrap()
        .iter()
        .map(|r| r.id)
        .collect();
    sqlx::query("SELECT pg_advisory_unlock(42)")
        .execute(&mut *gate)
        .await
        .unwrap();
    drop(gate);
    let slow_id = slow.await.unwrap();
    let fast_id = fast.await.unwrap();
    assert!(slow_id < fast_id);
    let passed = seen.iter().max().copied().unwrap_or(0);
    assert!(
        slow_id > passed,
        "a tailer saw {seen:?} and would skip row {slow_id} for good"
    );
    tailer.close().await;
    admin.close().await;
}
