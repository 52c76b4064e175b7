//! Engine behaviour end to end over MemoryStorage / FileStorage, ObjectWal and MemCatalog.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use s3stream::testing::{FaultWal, MemCatalog, PutDelay, SlowStorage};
use s3stream::*;

struct Env {
    storage: Arc<dyn ObjectStorage>,
    catalog: Arc<MemCatalog>,
    wal: Arc<FaultWal>,
    hooks: Arc<Mutex<Vec<(u64, u64)>>>,
}

impl Env {
    fn memory() -> Env {
        Env::on(Arc::new(MemoryStorage::new()), Arc::new(MemCatalog::new()))
    }

    fn on(storage: Arc<dyn ObjectStorage>, catalog: Arc<MemCatalog>) -> Env {
        let wal = Arc::new(ObjectWal::new(storage.clone(), "wal/0".into()));
        Env::with_wal(storage, catalog, wal)
    }

    fn with_wal(
        storage: Arc<dyn ObjectStorage>,
        catalog: Arc<MemCatalog>,
        wal: Arc<dyn Wal>,
    ) -> Env {
        let wal = Arc::new(FaultWal::new(wal));
        Env {
            storage,
            catalog,
            wal,
            hooks: Arc::new(Mutex::new(Vec::new())),
        }
    }

    /// A fresh WAL handle on the same storage and catalog: what a restarted process sees.
    fn restart(&self) -> Env {
        Env::on(self.storage.clone(), self.catalog.clone())
    }

    async fn start(&self, cfg: EngineConfig) -> (Engine, RecoveryReport) {
        let hooks = self.hooks.clone();
        Engine::start(
            cfg,
            self.storage.clone(),
            self.wal.clone(),
            self.catalog.clone(),
            Arc::new(move |s, e| hooks.lock().unwrap().push((s, e))),
        )
        .await
        .unwrap()
    }
}

/// Uploads happen only on flush / threshold / backpressure, so tests control them.
fn cfg() -> EngineConfig {
    EngineConfig {
        upload_interval: Duration::from_secs(3600),
        ..EngineConfig::default()
    }
}

fn payload(stream: u64, base: u64) -> Bytes {
    Bytes::from(format!("stream-{stream}-offset-{base}"))
}

fn req(stream: u64, epoch: i64, count: u32, batch: Bytes) -> AppendRequest {
    // Every other request carries its CRC, as a host that just encoded the batch does.
    let batch_crc = batch
        .len()
        .is_multiple_of(2)
        .then(|| crc32c::crc32c(&batch));
    AppendRequest {
        stream,
        epoch,
        record_count: count,
        batch,
        batch_crc,
        aux: Bytes::new(),
    }
}

/// Appends `n` batches of 2 records each; returns them as (base, payload).
async fn append_n(engine: &Engine, stream: u64, epoch: i64, n: usize) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let base = engine.next_offset(stream).unwrap();
        let data = payload(stream, base);
        let p = engine
            .append(req(stream, epoch, 2, data.clone()))
            .await
            .unwrap();
        assert_eq!(p.base_offset, base);
        let a = p.durable().await.unwrap();
        assert_eq!(a.next_offset, base + 2);
        out.push((base, data));
    }
    out
}

/// Reads everything from `from` to the end, in small pages.
async fn read_all(engine: &Engine, stream: u64, from: u64) -> Vec<StoredBatch> {
    let mut out: Vec<StoredBatch> = Vec::new();
    let mut cur = from;
    loop {
        let page = engine.read(stream, cur, 64).await.unwrap();
        let Some(last) = page.last() else { break };
        cur = last.base_offset + u64::from(last.record_count);
        for b in page {
            if out.last().is_none_or(|l| l.base_offset < b.base_offset) {
                out.push(b);
            }
        }
    }
    out
}

fn assert_batches(got: &[StoredBatch], want: &[(u64, Bytes)]) {
    let got: Vec<_> = got
        .iter()
        .map(|b| (b.base_offset, b.data.clone()))
        .collect();
    assert_eq!(got, want);
}

#[tokio::test]
async fn append_assigns_consecutive_offsets_and_reads_from_log_cache() {
    let env = Env::memory();
    let (engine, report) = env.start(cfg()).await;
    assert_eq!(report.wal_entries, 0);
    engine.open(7, 1, 100);
    assert_eq!(engine.is_open(7), Some(1));
    let want = append_n(&engine, 7, 1, 5).await;
    assert_eq!(
        want.iter().map(|w| w.0).collect::<Vec<_>>(),
        vec![100, 102, 104, 106, 108]
    );
    assert_eq!(engine.next_offset(7), Some(110));
    assert_eq!(engine.durable_end(7), Some(110));
    assert_eq!(env.hooks.lock().unwrap().last(), Some(&(7, 110)));

    // The first batch may start before from_offset; max_bytes stops after it is reached.
    let got = engine.read(7, 103, 1).await.unwrap();
    assert_batches(&got, &want[1..2]);
    let got = engine.read(7, 103, 1 << 20).await.unwrap();
    assert_batches(&got, &want[1..]);
    assert!(engine.read(7, 110, 1 << 20).await.unwrap().is_empty());
    assert_eq!(
        engine.stats().block_cache_misses,
        0,
        "served from the log cache"
    );
    assert_eq!(engine.stats().open_streams, 1);
}

#[tokio::test]
async fn append_errors_not_open_stale_epoch_invalid() {
    let env = Env::memory();
    let (engine, _) = env.start(cfg()).await;
    let err = engine
        .append(req(1, 1, 1, payload(1, 0)))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::NotOpen { stream: 1 }), "{err}");
    engine.open(1, 3, 0);
    let err = engine
        .append(req(1, 2, 1, payload(1, 0)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::StaleEpoch {
                epoch: 2,
                current: 3,
                ..
            }
        ),
        "{err}"
    );
    let err = engine
        .append(req(1, 3, 0, payload(1, 0)))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::InvalidRequest(_)), "{err}");
    // A lower-epoch open is ignored.
    engine.open(1, 2, 50);
    assert_eq!(engine.is_open(1), Some(3));
    assert_eq!(engine.next_offset(1), Some(0));
}

#[tokio::test]
async fn group_commit_uses_far_fewer_wal_writes_than_appends() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            batch_interval: Duration::from_millis(5),
            ..cfg()
        })
        .await;
    for s in 0..32u64 {
        engine.open(s, 1, 0);
    }
    let mut tasks = Vec::new();
    for s in 0..32u64 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..10u64 {
                let p = engine.append(req(s, 1, 1, payload(s, i))).await.unwrap();
                assert_eq!(p.base_offset, i);
                p.durable().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let appends = 320;
    assert_eq!(env.wal.record_count(), appends);
    let writes = env.wal.append_count();
    assert!(
        writes * 4 <= appends,
        "expected group commit: {writes} wal writes for {appends} appends"
    );
    for s in 0..32u64 {
        assert_eq!(engine.durable_end(s), Some(10));
    }
}

#[tokio::test]
async fn max_bytes_in_batch_splits_wal_writes() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            batch_interval: Duration::from_millis(20),
            max_bytes_in_batch: 1000,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    let mut pending = Vec::new();
    for _ in 0..10 {
        pending.push(
            engine
                .append(req(1, 1, 1, Bytes::from(vec![0u8; 400])))
                .await
                .unwrap(),
        );
    }
    for p in pending {
        p.durable().await.unwrap();
    }
    // 400-byte appends, at most 1000 bytes per write: at least 5 writes.
    assert!(env.wal.append_count() >= 5, "{}", env.wal.append_count());
}

#[tokio::test]
async fn wal_failure_fails_appends_breaks_stream_and_never_acks_after_a_hole() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            batch_interval: Duration::ZERO,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    engine.open(2, 1, 0);
    append_n(&engine, 1, 1, 1).await;
    env.wal.fail_appends(1000);
    // Pipeline several appends: all must fail, none acked after the failed one.
    let mut pending = Vec::new();
    for i in 0..5u64 {
        pending.push(
            engine
                .append(req(1, 1, 1, payload(1, 10 + i)))
                .await
                .unwrap(),
        );
    }
    for p in pending {
        let err = p.durable().await.unwrap_err();
        assert!(matches!(err, EngineError::Durability(_)), "{err}");
    }
    let err = engine
        .append(req(1, 1, 1, payload(1, 0)))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Broken { stream: 1 }), "{err}");
    assert_eq!(engine.durable_end(1), Some(2));
    assert!(
        engine.stats().wal_write_failures >= 4,
        "retried before failing"
    );

    // Recovery of the WAL: re-open at the durable end with a higher epoch.
    env.wal.fail_appends(0);
    engine.open(1, 2, 2);
    let p = engine.append(req(1, 2, 1, payload(1, 2))).await.unwrap();
    assert_eq!(
        p.durable().await.unwrap(),
        Appended {
            base_offset: 2,
            next_offset: 3
        }
    );
    // Other streams were not broken by failures they were not part of.
    append_n(&engine, 2, 1, 1).await;
    engine.flush().await.unwrap();
    let got = read_all(&engine, 1, 0).await;
    assert_eq!(
        got.iter().map(|b| b.base_offset).collect::<Vec<_>>(),
        vec![0, 2]
    );
}

/// A batch too large for the block cache, read in small pages as a reader pages through one
/// large append, is fetched from storage once, not once per page.
#[tokio::test]
async fn paging_through_a_large_uploaded_batch_fetches_it_once() {
    let storage = Arc::new(MemoryStorage::new());
    let env = Env::on(storage.clone(), Arc::new(MemCatalog::new()));
    let (engine, _) = env
        .start(EngineConfig {
            log_cache_bytes: 0,
            block_cache_bytes: 1 << 20,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    let big = Bytes::from(vec![7u8; 5 << 20]);
    engine
        .append(req(1, 1, 1000, big.clone()))
        .await
        .unwrap()
        .durable()
        .await
        .unwrap();
    let small = append_n(&engine, 1, 1, 1).await;
    engine.flush().await.unwrap();
    let gets = storage.get_count();
    for from in (0..1000).step_by(50) {
        let page = engine.read(1, from, 64).await.unwrap();
        assert_eq!((page[0].base_offset, page[0].data.len()), (0, big.len()));
    }
    assert!(
        storage.get_count() - gets <= 1,
        "{} fetches for 20 pages of one batch",
        storage.get_count() - gets
    );
    // Past it, reads go on as usual.
    let page = engine.read(1, 1000, 64).await.unwrap();
    assert_batches(&page, &small);
}

#[tokio::test]
async fn flush_uploads_commits_trims_and_reads_come_from_objects() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            log_cache_bytes: 0, // uploaded data leaves the log cache at once
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    engine.open(2, 4, 0);
    let w1 = append_n(&engine, 1, 1, 20).await;
    let mut r = req(2, 4, 3, payload(2, 0));
    r.aux = Bytes::from_static(b"producer-state");
    engine.append(r).await.unwrap().durable().await.unwrap();
    assert!(engine.stats().unuploaded_bytes > 0);
    engine.flush().await.unwrap();

    let stats = engine.stats();
    assert_eq!(stats.unuploaded_bytes, 0);
    assert_eq!(stats.log_cache_bytes, 0);
    assert!(stats.uploads >= 1);
    assert!(env.wal.recover().await.unwrap().is_empty(), "wal trimmed");
    assert_eq!(env.catalog.committed_end(1), 40);
    assert_eq!(env.catalog.committed_end(2), 3);
    assert_eq!(
        env.catalog.aux(2),
        vec![Bytes::from_static(b"producer-state")]
    );
    let commits = env.catalog.commits();
    assert_eq!(
        commits.len(),
        1,
        "small streams share one stream-set object"
    );
    assert!(commits[0].key.starts_with("data/0/0/"));
    assert_eq!(commits[0].ranges.len(), 2);

    assert_batches(&read_all(&engine, 1, 0).await, &w1);
    let stats = engine.stats();
    assert!(stats.block_cache_misses >= 1);
    let before = stats.block_cache_hits;
    assert_batches(&read_all(&engine, 1, 0).await, &w1);
    assert!(
        engine.stats().block_cache_hits > before,
        "second read hits the block cache"
    );
    let got = engine.read(2, 1, 1 << 20).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].base_offset, got[0].record_count), (0, 3));
}

#[tokio::test]
async fn big_streams_get_their_own_stream_object() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            stream_object_min_bytes: 4096,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    engine.open(2, 1, 0);
    engine.open(3, 1, 0);
    for i in 0..10u64 {
        let p = engine
            .append(req(1, 1, 1, Bytes::from(vec![i as u8; 1000])))
            .await
            .unwrap();
        p.durable().await.unwrap();
    }
    append_n(&engine, 2, 1, 2).await;
    append_n(&engine, 3, 1, 2).await;
    engine.flush().await.unwrap();
    let commits = env.catalog.commits();
    assert_eq!(commits.len(), 2);
    let streams_of = |c: &ObjectCommit| {
        let mut s: Vec<u64> = c.ranges.iter().map(|r| r.stream).collect();
        s.dedup();
        s
    };
    let mut shapes: Vec<Vec<u64>> = commits.iter().map(streams_of).collect();
    shapes.sort();
    assert_eq!(shapes, vec![vec![1], vec![2, 3]]);
    assert_ne!(commits[0].key, commits[1].key);
    engine.close(1).await.unwrap();
    let got = read_all(&engine, 1, 0).await;
    assert_eq!(got.len(), 10);
    assert_eq!(got[9].data, Bytes::from(vec![9u8; 1000]));
}

#[tokio::test]
async fn read_never_returns_data_that_is_not_durable() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            batch_interval: Duration::ZERO,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    append_n(&engine, 1, 1, 1).await;
    env.wal.fail_appends(1000);
    let p = engine.append(req(1, 1, 1, payload(1, 2))).await.unwrap();
    // While the write is failing and retrying the data is not durable: not visible.
    for _ in 0..5 {
        let got = engine.read(1, 0, 1 << 20).await.unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(engine.durable_end(1), Some(2));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(p.durable().await.is_err());
    assert!(engine.read(1, 2, 1 << 20).await.unwrap().is_empty());
}

#[tokio::test]
async fn crash_without_flush_recovers_every_acked_append_exactly_once() {
    let env = Env::memory();
    let mut want: HashMap<u64, Vec<(u64, Bytes)>> = HashMap::new();
    {
        let (engine, _) = env.start(cfg()).await;
        for s in 1..=3u64 {
            engine.open(s, 5, 0);
            want.insert(s, append_n(&engine, s, 5, 7).await);
        }
        engine.abort(); // crash: nothing uploaded
    }
    assert!(env.catalog.commits().is_empty());

    let env2 = env.restart();
    let (engine, report) = env2.start(cfg()).await;
    assert_eq!(report.records_replayed, 21);
    assert_eq!(report.skipped, 0);
    let mut streams = report.streams.clone();
    streams.sort();
    assert_eq!(streams, vec![(1, 5, 14), (2, 5, 14), (3, 5, 14)]);
    assert!(
        env2.wal.recover().await.unwrap().is_empty(),
        "wal trimmed after recovery"
    );
    for s in 1..=3u64 {
        assert_eq!(engine.is_open(s), None);
        assert_eq!(env.catalog.committed_end(s), 14);
        assert_batches(&read_all(&engine, s, 0).await, &want[&s]);
    }

    // Re-open at the committed end: offsets continue, stable across the restart.
    engine.open(1, 6, env.catalog.committed_end(1));
    let more = append_n(&engine, 1, 6, 2).await;
    assert_eq!(more[0].0, 14);
    engine.flush().await.unwrap();
    let mut all = want[&1].clone();
    all.extend(more);
    assert_batches(&read_all(&engine, 1, 0).await, &all);

    // A second restart replays nothing.
    engine.abort();
    let (_, report) = env.restart().start(cfg()).await;
    assert_eq!(report.wal_entries, 0);
}

#[tokio::test]
async fn crash_after_commit_before_trim_does_not_duplicate() {
    let env = Env::memory();
    let want;
    {
        let (engine, _) = env.start(cfg()).await;
        engine.open(1, 1, 0);
        want = append_n(&engine, 1, 1, 6).await;
        env.wal.skip_trims(true);
        engine.flush().await.unwrap();
        engine.abort();
    }
    assert_eq!(env.catalog.committed_end(1), 12);
    let commits_before = env.catalog.commits().len();

    let env2 = env.restart();
    let (engine, report) = env2.start(cfg()).await;
    assert!(report.wal_entries >= 1);
    assert_eq!(report.records_replayed, 0);
    assert_eq!(report.skipped, 6);
    assert_eq!(
        env.catalog.commits().len(),
        commits_before,
        "nothing re-committed"
    );
    assert!(env2.wal.recover().await.unwrap().is_empty());
    assert_batches(&read_all(&engine, 1, 0).await, &want);
}

#[tokio::test]
async fn crash_recovery_on_file_storage() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Arc::new(MemCatalog::new());
    let want;
    {
        let env = Env::on(
            Arc::new(FileStorage::open(dir.path()).unwrap()),
            catalog.clone(),
        );
        let (engine, _) = env.start(cfg()).await;
        engine.open(9, 1, 0);
        want = append_n(&engine, 9, 1, 5).await;
        drop(engine); // dropping the last handle aborts the tasks: a crash
    }
    let env = Env::on(
        Arc::new(FileStorage::open(dir.path()).unwrap()),
        catalog.clone(),
    );
    let (engine, report) = env.start(cfg()).await;
    assert_eq!(report.records_replayed, 5);
    assert_batches(&read_all(&engine, 9, 0).await, &want);
    // The restarted engine does not overwrite the recovery object with its own uploads.
    engine.open(9, 2, 10);
    append_n(&engine, 9, 2, 1).await;
    engine.flush().await.unwrap();
    let keys: Vec<_> = catalog.commits().iter().map(|c| c.key.clone()).collect();
    let mut dedup = keys.clone();
    dedup.dedup();
    assert_eq!(keys, dedup);
    assert_eq!(read_all(&engine, 9, 0).await.len(), 6);
}

/// Acknowledged appends only in the WAL, their segment deleted while the node was down: the
/// engine refuses to start, naming the file, instead of starting from the catalog's committed
/// ends and giving the lost records' offsets out again.
#[tokio::test]
async fn a_deleted_wal_segment_refuses_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Arc::new(MemCatalog::new());
    let storage: Arc<dyn ObjectStorage> =
        Arc::new(FileStorage::open(dir.path().join("objects")).unwrap());
    let wal_dir = dir.path().join("wal");
    let wal = || Arc::new(SegmentWal::new(&wal_dir));
    {
        let env = Env::with_wal(storage.clone(), catalog.clone(), wal());
        let (engine, _) = env.start(cfg()).await;
        engine.open(9, 1, 0);
        append_n(&engine, 9, 1, 5).await;
        drop(engine); // a crash: nothing uploaded
    }
    let segments: Vec<_> = std::fs::read_dir(&wal_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "wal"))
        .collect();
    assert_eq!(segments.len(), 1, "{segments:?}");
    std::fs::remove_file(&segments[0]).unwrap();
    let started = Engine::start(cfg(), storage, wal(), catalog, Arc::new(|_, _| {})).await;
    let Err(err) = started else {
        panic!("started without the acknowledged records")
    };
    let msg = err.to_string();
    assert!(msg.contains(&segments[0].display().to_string()), "{msg}");
    assert!(msg.contains("refusing to start"), "{msg}");
}

/// The local-disk WAL under the engine: crash without upload, crash between commit and trim,
/// restart after restart, and segments rolling under a small segment size.
#[tokio::test]
async fn crash_recovery_on_segment_wal() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Arc::new(MemCatalog::new());
    let env = |seg: u64| {
        Env::with_wal(
            Arc::new(FileStorage::open(dir.path().join("objects")).unwrap()),
            catalog.clone(),
            Arc::new(
                SegmentWal::with_segment_bytes(dir.path().join("wal"), seg)
                    .with_preallocation(true),
            ),
        )
    };
    let mut want;
    {
        let env = env(256);
        let (engine, _) = env.start(cfg()).await;
        engine.open(9, 1, 0);
        want = append_n(&engine, 9, 1, 20).await;
        drop(engine); // a crash: nothing uploaded
    }
    {
        let env = env(256);
        let (engine, report) = env.start(cfg()).await;
        assert_eq!(report.records_replayed, 20);
        assert_batches(&read_all(&engine, 9, 0).await, &want);
        // Appends after recovery, committed but the WAL is not trimmed before the next crash.
        engine.open(9, 2, 40);
        want.extend(append_n(&engine, 9, 2, 3).await);
        env.wal.skip_trims(true);
        engine.flush().await.unwrap();
        drop(engine);
    }
    {
        let env = env(1 << 20);
        let (engine, report) = env.start(cfg()).await;
        assert_eq!(
            report.records_replayed, 0,
            "committed entries are not replayed"
        );
        assert_eq!(report.skipped, 3);
        assert!(env.wal.recover().await.unwrap().is_empty());
        assert_batches(&read_all(&engine, 9, 0).await, &want);
        engine.open(9, 3, 46);
        want.extend(append_n(&engine, 9, 3, 2).await);
        drop(engine);
    }
    let env = env(1 << 20);
    let (engine, report) = env.start(cfg()).await;
    assert_eq!(report.records_replayed, 2);
    assert_batches(&read_all(&engine, 9, 0).await, &want);
}

#[tokio::test]
async fn transient_commit_errors_are_retried_without_duplicates() {
    let env = Env::memory();
    let (engine, _) = env.start(cfg()).await;
    engine.open(1, 1, 0);
    let want = append_n(&engine, 1, 1, 4).await;
    env.catalog.fail_commits(2);
    engine.flush().await.unwrap();
    assert!(engine.stats().upload_failures >= 2);
    let commits = env.catalog.commits();
    assert_eq!(commits.len(), 1);
    assert_eq!(env.catalog.committed_end(1), 8);
    assert_batches(&read_all(&engine, 1, 0).await, &want);
}

/// A PUT or a commit that never answers is given up after `upload_timeout` and retried: the
/// data lands once, instead of every upload behind it stalling forever.
#[tokio::test]
async fn hung_puts_and_commits_time_out_and_are_retried() {
    let slow = Arc::new(SlowStorage::new(
        Arc::new(MemoryStorage::new()),
        "data",
        Box::new(|nth, _| {
            if nth == 0 {
                Duration::from_secs(3600)
            } else {
                Duration::ZERO
            }
        }),
    ));
    let env = Env::on(slow.clone(), Arc::new(MemCatalog::new()));
    let (engine, _) = env
        .start(EngineConfig {
            upload_interval: Duration::from_millis(10),
            upload_timeout: Duration::from_millis(200),
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    let mut want = append_n(&engine, 1, 1, 2).await;
    let flushed = tokio::time::timeout(Duration::from_secs(30), engine.flush()).await;
    assert!(matches!(flushed, Ok(Ok(()))), "hung put: {flushed:?}");
    assert_eq!(env.catalog.committed_end(1), 4);

    want.extend(append_n(&engine, 1, 1, 1).await);
    env.catalog.hang_commits(1);
    let flushed = tokio::time::timeout(Duration::from_secs(30), engine.flush()).await;
    assert!(matches!(flushed, Ok(Ok(()))), "hung commit: {flushed:?}");
    assert_eq!(env.catalog.committed_end(1), 6);

    // Landed, its answer lost: the retry finds it committed, nothing is taken as rejected.
    want.extend(append_n(&engine, 1, 1, 1).await);
    env.catalog.hang_after_commits(1);
    let flushed = tokio::time::timeout(Duration::from_secs(30), engine.flush()).await;
    assert!(
        matches!(flushed, Ok(Ok(()))),
        "commit landed, answer lost: {flushed:?}"
    );
    assert_eq!(env.catalog.committed_end(1), 8);
    assert!(engine.stats().upload_failures >= 3);
    assert_eq!(engine.stats().rejected_ranges, 0);
    append_n(&engine, 1, 1, 1).await; // the stream is not broken
    assert_batches(&read_all(&engine, 1, 0).await[..4], &want);
}

#[tokio::test]
async fn failing_puts_are_retried_and_flush_gives_up_when_storage_stays_down() {
    let storage = Arc::new(MemoryStorage::new());
    let env = Env::on(storage.clone(), Arc::new(MemCatalog::new()));
    let (engine, _) = env
        .start(EngineConfig {
            upload_interval: Duration::from_millis(10),
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    append_n(&engine, 1, 1, 2).await;
    storage.fail_puts(2);
    engine.flush().await.unwrap();
    assert_eq!(env.catalog.committed_end(1), 4);

    append_n(&engine, 1, 1, 1).await;
    storage.fail_puts(usize::MAX);
    let err = engine.flush().await.unwrap_err();
    assert!(matches!(err, EngineError::Upload(_)), "{err}");
    // Data is kept (log cache + WAL) and goes out once storage is back.
    assert_eq!(engine.read(1, 4, 1 << 20).await.unwrap().len(), 1);
    storage.fail_puts(0);
    engine.flush().await.unwrap();
    assert_eq!(env.catalog.committed_end(1), 6);
}

#[tokio::test]
async fn rejected_range_is_dropped_and_breaks_the_stream() {
    let env = Env::memory();
    let (engine, _) = env.start(cfg()).await;
    engine.open(1, 1, 0);
    engine.open(2, 1, 0);
    append_n(&engine, 1, 1, 3).await;
    let want2 = append_n(&engine, 2, 1, 3).await;
    env.catalog.fence(1, 2); // another owner opened stream 1 at epoch 2
    engine.flush().await.unwrap();
    let stats = engine.stats();
    assert_eq!(stats.rejected_ranges, 1);
    assert_eq!(env.catalog.committed_end(1), 0);
    assert!(
        engine.read(1, 0, 1 << 20).await.unwrap().is_empty(),
        "fenced data dropped"
    );
    let err = engine
        .append(req(1, 1, 1, payload(1, 6)))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Broken { .. }), "{err}");
    assert_batches(&read_all(&engine, 2, 0).await, &want2);
    assert!(
        env.wal.recover().await.unwrap().is_empty(),
        "rejected data is not retried"
    );
}

/// A node fenced as a whole (failover fenced it while it was paused; it resumed and uploads
/// before its heartbeat tells it) must leave its WAL to the recoverer: dropping and trimming
/// what the catalog refused, as for a rejected range, would delete appends it acknowledged
/// before the fence, which the recoverer has not read yet.
#[tokio::test]
async fn a_fenced_node_trims_nothing_and_its_recoverer_gets_every_acked_append() {
    let env = Env::memory();
    let (zombie, _) = env.start(cfg()).await;
    zombie.open(1, 1, 0);
    let want = append_n(&zombie, 1, 1, 3).await;
    env.catalog.fence_node();
    let err = tokio::time::timeout(Duration::from_secs(10), zombie.flush())
        .await
        .expect("a flush on a fenced node answers")
        .unwrap_err();
    assert!(matches!(err, EngineError::WalFenced(_)), "{err}");
    assert_eq!(env.wal.recover().await.unwrap().len(), 3, "nothing trimmed");
    // The uploader stopped: no refused commit is retried into the metadata log.
    let calls = env.catalog.commits().len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(env.catalog.commits().len(), calls);
    assert!(zombie.read(1, 0, 1 << 20).await.is_ok());

    // A recoverer fenced in turn commits nothing and trims nothing either, and says so at once.
    let fenced_holder = Arc::new(MemCatalog::new());
    fenced_holder.fence_node();
    let wal = || Arc::new(ObjectWal::new(env.storage.clone(), "wal/0".into()));
    let err = Engine::recover_wal(
        cfg(),
        "data/holder-1".into(),
        env.storage.clone(),
        wal(),
        fenced_holder,
    )
    .await
    .unwrap_err();
    assert!(
        matches!(err, EngineError::Catalog(CatalogError::Fenced(_))),
        "{err}"
    );
    assert_eq!(env.wal.recover().await.unwrap().len(), 3, "nothing trimmed");

    // Failover: the holder reads the fenced node's WAL and commits every acknowledged append.
    let holder = Arc::new(MemCatalog::new());
    let report = Engine::recover_wal(
        cfg(),
        "data/holder-2".into(),
        env.storage.clone(),
        wal(),
        holder.clone(),
    )
    .await
    .unwrap();
    assert_eq!(report.records_replayed, want.len());
    assert_eq!(holder.committed_end(1), 6);
    assert!(env.wal.recover().await.unwrap().is_empty());
}

/// An append that passed the broken check before its stream broke (the catalog rejected an
/// earlier range) and reached the WAL after must not be acknowledged, nor read: its range can
/// never commit after the hole.
#[tokio::test]
async fn an_append_written_after_its_stream_broke_is_not_acknowledged() {
    let storage: Arc<dyn ObjectStorage> = Arc::new(SlowStorage::new(
        Arc::new(MemoryStorage::new()),
        "data",
        Box::new(|_, _| Duration::from_millis(300)),
    ));
    let env = Env::on(storage, Arc::new(MemCatalog::new()));
    let (engine, _) = env
        .start(EngineConfig {
            upload_threshold_bytes: 1,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    env.catalog.fence(1, 2); // another owner opened stream 1 at epoch 2
    // Acknowledged before anyone knows; its upload (300 ms) will be rejected.
    let a = append_n(&engine, 1, 1, 1).await;
    env.wal.hold_appends(true);
    let b = engine
        .append(req(1, 1, 2, payload(1, 2)))
        .await
        .expect("queued while the stream is not yet broken");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while engine.stats().rejected_ranges == 0 {
        assert!(std::time::Instant::now() < deadline, "range never rejected");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    env.wal.hold_appends(false);
    let got = b.durable().await;
    assert!(
        matches!(got, Err(EngineError::Broken { stream: 1 })),
        "acknowledged after the hole: {got:?}"
    );
    assert!(
        engine.read(1, a[0].0, 1 << 20).await.unwrap().is_empty(),
        "data after the hole is readable"
    );
}

/// A flush waiting when the engine is aborted returns an error instead of waiting forever
/// (the host's close of a stream, and its idle pass, wait on it).
#[tokio::test]
async fn a_flush_waiting_when_the_engine_stops_returns() {
    let env = Env::memory();
    let (engine, _) = env.start(cfg()).await;
    let engine = Arc::new(engine);
    engine.open(1, 1, 0);
    env.wal.hold_appends(true);
    let _pending = engine.append(req(1, 1, 1, payload(1, 0))).await.unwrap();
    let flushing = tokio::spawn({
        let engine = engine.clone();
        async move { engine.flush().await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!flushing.is_finished(), "the append is held");
    engine.abort();
    let got = tokio::time::timeout(Duration::from_secs(5), flushing)
        .await
        .expect("flush returned after the abort")
        .unwrap();
    assert!(matches!(got, Err(EngineError::ShuttingDown)), "{got:?}");
}

#[tokio::test]
async fn backpressure_bounds_unuploaded_bytes() {
    let env = Env::memory();
    let max = 8 * 1024;
    let (engine, _) = env
        .start(EngineConfig {
            max_unflushed_bytes: max,
            upload_threshold_bytes: 1 << 30,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    for i in 0..200u64 {
        let p = engine
            .append(req(1, 1, 1, Bytes::from(vec![1u8; 500])))
            .await
            .unwrap();
        assert_eq!(p.base_offset, i);
        assert!(engine.stats().unuploaded_bytes <= max, "bound exceeded");
        if i % 7 == 0 {
            p.durable().await.unwrap();
        }
    }
    engine.flush().await.unwrap();
    assert_eq!(env.catalog.committed_end(1), 200);
    assert!(
        env.catalog.commits().len() > 1,
        "uploads were forced by backpressure"
    );
    assert_eq!(read_all(&engine, 1, 0).await.len(), 200);
}

#[tokio::test]
async fn threshold_triggers_upload_without_flush() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            upload_threshold_bytes: 1000,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    for _ in 0..5 {
        let p = engine
            .append(req(1, 1, 1, Bytes::from(vec![0u8; 300])))
            .await
            .unwrap();
        p.durable().await.unwrap();
    }
    for _ in 0..200 {
        if env.catalog.committed_end(1) >= 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        env.catalog.committed_end(1) >= 4,
        "threshold upload did not run"
    );
}

#[tokio::test]
async fn periodic_upload_runs_on_interval() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            upload_interval: Duration::from_millis(20),
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    append_n(&engine, 1, 1, 1).await;
    for _ in 0..200 {
        if env.catalog.committed_end(1) == 2 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("interval upload did not run");
}

#[tokio::test]
async fn close_uploads_then_forgets_state_and_forget_drops_without_upload() {
    let env = Env::memory();
    let (engine, _) = env.start(cfg()).await;
    engine.open(1, 1, 0);
    engine.open(2, 1, 0);
    let want = append_n(&engine, 1, 1, 3).await;
    append_n(&engine, 2, 1, 3).await;
    engine.forget(2);
    assert_eq!(engine.is_open(2), None);
    engine.close(1).await.unwrap();
    assert_eq!(engine.is_open(1), None);
    let stats = engine.stats();
    assert_eq!(stats.open_streams, 0);
    assert_eq!(stats.log_cache_bytes, 0);
    assert_eq!(stats.unuploaded_bytes, 0);
    assert_eq!(env.catalog.committed_end(1), 6);
    assert_eq!(
        env.catalog.committed_end(2),
        0,
        "forgotten stream not uploaded"
    );
    assert!(env.wal.recover().await.unwrap().is_empty());
    assert_batches(&read_all(&engine, 1, 0).await, &want);
    assert!(matches!(
        engine.append(req(1, 1, 1, payload(1, 6))).await,
        Err(EngineError::NotOpen { .. })
    ));
}

#[tokio::test]
async fn reopen_at_higher_epoch_never_acks_old_pending_appends() {
    let env = Env::memory();
    let (engine, _) = env
        .start(EngineConfig {
            batch_interval: Duration::from_millis(20),
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    let old = engine.append(req(1, 1, 1, payload(1, 0))).await.unwrap();
    engine.open(1, 2, 0);
    let new = engine.append(req(1, 2, 1, payload(1, 100))).await.unwrap();
    assert_eq!(new.base_offset, 0);
    // The old epoch's append will be fenced at commit: acknowledging it would lose acked data.
    assert!(matches!(
        old.durable().await,
        Err(EngineError::Broken { stream: 1 })
    ));
    new.durable().await.unwrap();
    env.catalog.fence(1, 2);
    engine.flush().await.unwrap();
    // The old epoch's range is fenced, the new one committed: reads see only the new data.
    let got = read_all(&engine, 1, 0).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].data, payload(1, 100));
    assert_eq!(engine.stats().rejected_ranges, 1);
}

#[tokio::test]
async fn shutdown_flushes_and_rejects_new_appends() {
    let env = Env::memory();
    let (engine, _) = env.start(cfg()).await;
    engine.open(1, 1, 0);
    let p = engine.append(req(1, 1, 1, payload(1, 0))).await.unwrap();
    engine.shutdown().await.unwrap();
    p.durable().await.unwrap();
    assert_eq!(env.catalog.committed_end(1), 1);
    assert!(matches!(
        engine.append(req(1, 1, 1, payload(1, 1))).await,
        Err(EngineError::ShuttingDown)
    ));
    engine.flush().await.unwrap();
}

#[tokio::test]
async fn corrupt_object_is_reported_on_read() {
    let storage = Arc::new(MemoryStorage::new());
    let env = Env::on(storage.clone(), Arc::new(MemCatalog::new()));
    let (engine, _) = env
        .start(EngineConfig {
            log_cache_bytes: 0,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    append_n(&engine, 1, 1, 2).await;
    engine.flush().await.unwrap();
    let key = env.catalog.commits()[0].key.clone();
    let mut data = storage.get(&key).await.unwrap().to_vec();
    let last = data.len() - 1;
    data[last] ^= 1;
    storage.raw_put(&key, Bytes::from(data));
    let err = engine.read(1, 0, 1 << 20).await.unwrap_err();
    assert!(matches!(err, EngineError::Corrupt { .. }), "{err}");
}

/// Seeded workload with crashes at random points: after every restart, each acked batch is
/// readable at its offset and nothing is duplicated. The same seed replays the same run.
#[tokio::test]
async fn seeded_crash_workload_keeps_every_acked_append_once() {
    seeded_crash_workload(Env::memory).await;
}

/// The same with data objects that take 0–31 ms to PUT, so crashes land while several PUTs
/// are in flight and finishing out of order.
#[tokio::test]
async fn seeded_crash_workload_with_slow_overlapping_puts() {
    seeded_crash_workload(|| {
        slow_env(Box::new(|n, _| {
            Duration::from_millis(n.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 59)
        }))
        .0
    })
    .await;
}

async fn seeded_crash_workload(make_env: fn() -> Env) {
    for seed in [1u64, 7, 42, 1234] {
        let mut rng = seed;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let env = make_env();
        let mut acked: HashMap<u64, Vec<(u64, Bytes)>> = HashMap::new();
        for epoch in 1i64..=4 {
            let env = env.restart();
            let (engine, _) = env
                .start(EngineConfig {
                    upload_threshold_bytes: 200 + (next() % 2000) as usize,
                    ..cfg()
                })
                .await;
            for s in 0..4u64 {
                engine.open(s, epoch, env.catalog.committed_end(s));
            }
            let ops = 5 + next() % 30;
            for _ in 0..ops {
                let s = next() % 4;
                let count = 1 + (next() % 3) as u32;
                let base = engine.next_offset(s).unwrap();
                let data = payload(s, base);
                let p = engine
                    .append(req(s, epoch, count, data.clone()))
                    .await
                    .unwrap();
                p.durable().await.unwrap();
                acked.entry(s).or_default().push((base, data));
                match next() % 10 {
                    0 => engine.flush().await.unwrap(),
                    1 => tokio::time::sleep(Duration::from_millis(next() % 15)).await,
                    _ => {}
                }
            }
            engine.abort();
        }
        let (engine, _) = env.restart().start(cfg()).await;
        for s in 0..4u64 {
            let want = acked.remove(&s).unwrap_or_default();
            assert_batches(&read_all(&engine, s, 0).await, &want);
        }
    }
}

/// An env whose data objects take `delay(nth)` to PUT; the WAL on the same storage is not
/// slowed.
fn slow_env(delay: PutDelay) -> (Env, Arc<SlowStorage>) {
    let slow = Arc::new(SlowStorage::new(
        Arc::new(MemoryStorage::new()),
        "data/",
        delay,
    ));
    (Env::on(slow.clone(), Arc::new(MemCatalog::new())), slow)
}

/// An engine on `slow_env(delay)` with a 1000-byte upload threshold and `parallelism`
/// uploads, streams 1 and 2 open at epoch 1.
async fn two_streams_on_slow_puts(
    delay: PutDelay,
    parallelism: usize,
) -> (Env, Arc<SlowStorage>, Engine) {
    let (env, slow) = slow_env(delay);
    let (engine, _) = env
        .start(EngineConfig {
            upload_threshold_bytes: 1000,
            upload_parallelism: parallelism,
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    engine.open(2, 1, 0);
    (env, slow, engine)
}

/// Appends `n` 400-byte batches alternately to streams 1 and 2 (open at epoch 1).
async fn append_alternating(engine: &Engine, n: u64) -> HashMap<u64, Vec<(u64, Bytes)>> {
    let mut want: HashMap<u64, Vec<(u64, Bytes)>> = HashMap::new();
    for i in 0..n {
        let stream = 1 + i % 2;
        let base = engine.next_offset(stream).unwrap();
        let data = Bytes::from(vec![i as u8; 400]);
        let p = engine
            .append(req(stream, 1, 1, data.clone()))
            .await
            .unwrap();
        p.durable().await.unwrap();
        want.entry(stream).or_default().push((base, data));
    }
    want
}

/// Commits went out in plan order (object keys ascend), each object once, nothing was
/// rejected, the WAL was trimmed in ascending steps, and every batch reads back.
async fn assert_uploaded_in_order(
    env: &Env,
    engine: &Engine,
    want: &HashMap<u64, Vec<(u64, Bytes)>>,
) {
    let keys: Vec<String> = env.catalog.commits().into_iter().map(|c| c.key).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(keys, sorted, "commits out of WAL order or repeated");
    assert_eq!(engine.stats().rejected_ranges, 0);
    let trims = env.wal.trimmed();
    assert!(
        trims.windows(2).all(|w| w[0] < w[1]),
        "trims must ascend: {trims:?}"
    );
    for (stream, batches) in want {
        assert_eq!(env.catalog.committed_end(*stream), batches.len() as u64);
        assert_batches(&read_all(engine, *stream, 0).await, batches);
    }
}

#[tokio::test]
async fn recovery_writes_its_objects_concurrently_and_commits_them_in_order() {
    let (env, slow) = slow_env(Box::new(|_, _| Duration::from_millis(20)));
    let big = EngineConfig {
        stream_object_min_bytes: 1,
        upload_parallelism: 4,
        ..cfg()
    };
    let mut want = HashMap::new();
    {
        let (engine, _) = env.start(big.clone()).await;
        for s in 1..=6u64 {
            engine.open(s, 1, 0);
            want.insert(s, append_n(&engine, s, 1, 3).await);
        }
        engine.abort(); // nothing uploaded: all of it is in the WAL
    }
    assert_eq!(slow.max_in_flight(), 0);
    let env = env.restart();
    let (engine, report) = env.start(big).await;
    assert_eq!(report.records_replayed, 18);
    assert!(
        slow.max_in_flight() >= 2,
        "recovery PUTs did not overlap: {}",
        slow.max_in_flight()
    );
    let keys: Vec<String> = env.catalog.commits().into_iter().map(|c| c.key).collect();
    assert_eq!(keys.len(), 6, "one object per stream");
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "{keys:?}");
    for (s, batches) in &want {
        assert_eq!(env.catalog.committed_end(*s), 6);
        assert_batches(&read_all(&engine, *s, 0).await, batches);
    }
}

#[tokio::test]
async fn puts_overlap_but_commits_and_trims_follow_wal_order() {
    // The first object takes far longer than the next ones (and than appending the rest),
    // so later PUTs finish first.
    let (env, slow, engine) = two_streams_on_slow_puts(
        Box::new(|n, _| Duration::from_millis(if n == 0 { 400 } else { 5 })),
        4,
    )
    .await;
    let want = append_alternating(&engine, 24).await;
    engine.flush().await.unwrap();

    assert!(
        slow.max_in_flight() >= 2,
        "PUTs did not overlap: {}",
        slow.max_in_flight()
    );
    let finished = slow.finished();
    let first_planned = finished.iter().min().unwrap();
    assert_ne!(
        finished.first(),
        Some(first_planned),
        "the slow first PUT should finish after later ones: {finished:?}"
    );
    assert!(env.catalog.commits().len() >= 4, "expected several cycles");
    assert_uploaded_in_order(&env, &engine, &want).await;
}

#[tokio::test]
async fn one_put_at_a_time_when_parallelism_is_one() {
    let (env, slow, engine) =
        two_streams_on_slow_puts(Box::new(|_, _| Duration::from_millis(3)), 1).await;
    let want = append_alternating(&engine, 16).await;
    engine.flush().await.unwrap();
    assert_eq!(slow.max_in_flight(), 1);
    assert_eq!(slow.finished(), {
        let mut k = slow.finished();
        k.sort();
        k
    });
    assert_uploaded_in_order(&env, &engine, &want).await;
}

#[tokio::test]
async fn a_failed_put_is_retried_and_later_objects_wait_for_its_commit() {
    // The first object is slow and then fails, while later cycles' PUTs succeed meanwhile.
    let (env, slow, engine) = two_streams_on_slow_puts(
        Box::new(|n, _| Duration::from_millis(if n == 0 { 200 } else { 5 })),
        3,
    )
    .await;
    slow.fail_put_number(0);
    let want = append_alternating(&engine, 24).await;
    engine.flush().await.unwrap();
    assert!(engine.stats().upload_failures >= 1);
    let commits: Vec<String> = env.catalog.commits().into_iter().map(|c| c.key).collect();
    let finished = slow.finished();
    assert_eq!(
        finished.iter().min(),
        commits.first(),
        "the failed first object was written again under its own key and committed first"
    );
    assert_ne!(finished.first(), commits.first(), "{finished:?}");
    assert_uploaded_in_order(&env, &engine, &want).await;
}

#[tokio::test]
async fn a_round_of_failed_puts_counts_once_against_flush() {
    // Eight streams, each its own object: four PUTs in flight fail together, three rounds
    // in a row. `flush` gives up after 8 failed attempts; these are 3.
    let (env, slow) = slow_env(Box::new(|_, _| Duration::from_millis(5)));
    let (engine, _) = env
        .start(EngineConfig {
            stream_object_min_bytes: 1,
            upload_parallelism: 4,
            ..cfg()
        })
        .await;
    let mut want = HashMap::new();
    for stream in 1..=8 {
        engine.open(stream, 1, 0);
        want.insert(stream, append_n(&engine, stream, 1, 2).await);
    }
    slow.fail_puts(12);
    engine.flush().await.unwrap();
    let failures = engine.stats().upload_failures;
    assert!((1..8).contains(&failures), "failures={failures}");
    for (stream, batches) in &want {
        assert_eq!(env.catalog.committed_end(*stream), 4);
        assert_batches(&read_all(&engine, *stream, 0).await, batches);
    }
}

#[tokio::test]
async fn forget_while_its_data_is_planned_keeps_the_accounting() {
    let (env, _slow, engine) =
        two_streams_on_slow_puts(Box::new(|_, _| Duration::from_millis(50)), 4).await;
    let want = append_alternating(&engine, 24).await;
    // Some of stream 2's data is in cycles being written, some is not planned yet.
    engine.forget(2);
    let more = append_n(&engine, 1, 1, 3).await;
    // Bounded: a broken count would stop the uploader (a debug assertion) and hang the flush.
    tokio::time::timeout(Duration::from_secs(20), engine.flush())
        .await
        .expect("flush finished")
        .unwrap();
    assert_eq!(engine.stats().unuploaded_bytes, 0);
    let mut want1 = want[&1].clone();
    let base = want1.len() as u64;
    want1.extend(more);
    assert_eq!(env.catalog.committed_end(1), base + 6);
    assert_batches(&read_all(&engine, 1, 0).await, &want1);
}

#[tokio::test]
async fn a_steady_trickle_uploads_once_per_interval_not_back_to_back() {
    let dir = tempfile::tempdir().unwrap();
    let storage: Arc<dyn ObjectStorage> = Arc::new(FileStorage::open(dir.path()).unwrap());
    let env = Env::on(storage, Arc::new(MemCatalog::new()));
    let (engine, _) = env
        .start(EngineConfig {
            upload_interval: Duration::from_millis(100),
            ..cfg()
        })
        .await;
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for stream in 1..=4u64 {
        engine.open(stream, 1, 0);
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut n = 0;
            while started.elapsed() < Duration::from_millis(500) {
                append_n(&engine, stream, 1, 1).await;
                n += 1;
            }
            n
        }));
    }
    let mut appends = 0;
    for t in tasks {
        appends += t.await.unwrap();
    }
    // About five intervals passed. Cycles run back to back whenever appends arrived during
    // the previous one would make a commit every few appends instead.
    let commits = env.catalog.commits().len();
    assert!(
        appends >= 10,
        "the trickle was too slow to test: appends={appends}"
    );
    assert!(
        commits <= 8,
        "uploads should follow the interval: commits={commits} appends={appends}"
    );
}

/// A fenced WAL (a newer incarnation of the node took it over) fails the write at once with
/// the fence named: retrying cannot succeed, and each retry would only delay the answer.
#[tokio::test]
async fn a_fenced_wal_write_fails_without_retries() {
    let env = Env::memory();
    let (engine, _) = env.start(cfg()).await;
    engine.open(1, 1, 0);
    append_n(&engine, 1, 1, 1).await;
    let before = env.wal.append_attempts();
    env.wal.fence(true);
    let p = engine.append(req(1, 1, 1, payload(1, 2))).await.unwrap();
    let err = p.durable().await.unwrap_err();
    assert!(
        matches!(&err, EngineError::WalFenced(m) if m.contains("newer epoch")),
        "{err}"
    );
    assert_eq!(
        env.wal.append_attempts() - before,
        1,
        "a fenced write was retried"
    );
}

/// On the local-disk WAL the writer is a thread that writes, syncs and acks each group itself:
/// concurrent appends to two streams are acked with their offsets in order, every acked one
/// survives a crash, a write that keeps failing fails its appends and breaks the stream (never
/// an ack after the hole), and a stopped engine writes nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_thread_acks_durable_groups_in_order_and_stops_with_the_engine() {
    let dir = tempfile::tempdir().unwrap();
    let catalog = Arc::new(MemCatalog::new());
    let storage: Arc<dyn ObjectStorage> =
        Arc::new(FileStorage::open(dir.path().join("objects")).unwrap());
    let env = || {
        Env::with_wal(
            storage.clone(),
            catalog.clone(),
            Arc::new(SegmentWal::new(dir.path().join("wal"))),
        )
    };
    let mut acked: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
    {
        let env = env();
        // The durable hook runs where the group was completed, right after its acks.
        let completed_on = Arc::new(Mutex::new(Vec::new()));
        let on = completed_on.clone();
        let (engine, _) = Engine::start(
            cfg(),
            storage.clone(),
            env.wal.clone(),
            catalog.clone(),
            Arc::new(move |_, _| {
                on.lock()
                    .unwrap()
                    .push(std::thread::current().name().map(str::to_string));
            }),
        )
        .await
        .unwrap();
        engine.open(1, 1, 0);
        engine.open(2, 1, 0);
        // Submitted in order per stream (as the host does), awaited concurrently: groups form.
        let mut pending = Vec::new();
        for i in 0..200u64 {
            let stream = 1 + i % 2;
            let p = engine
                .append(req(stream, 1, 1, payload(stream, i)))
                .await
                .unwrap();
            pending.push((stream, tokio::spawn(p.durable())));
        }
        for (stream, p) in pending {
            let a = p.await.unwrap().unwrap();
            acked
                .entry(stream)
                .or_default()
                .push((a.base_offset, a.next_offset));
        }
        for ends in acked.values() {
            let want: Vec<_> = (0..100).map(|o| (o, o + 1)).collect();
            assert_eq!(ends, &want);
        }
        assert!(
            env.wal.append_count() < 200,
            "appends queued together share a write: {}",
            env.wal.append_count()
        );
        let threads = completed_on.lock().unwrap().clone();
        assert!(!threads.is_empty());
        assert!(
            threads.iter().all(|t| t.as_deref() == Some("wal-writer")),
            "groups complete on the writer thread: {threads:?}"
        );

        // A write failing every attempt: no ack, the stream broken, later appends refused.
        env.wal.fail_appends(4);
        let p = engine.append(req(1, 1, 1, payload(1, 100))).await.unwrap();
        assert!(matches!(p.durable().await, Err(EngineError::Durability(_))));
        assert!(matches!(
            engine.append(req(1, 1, 1, payload(1, 101))).await,
            Err(EngineError::Broken { .. })
        ));
        let attempts = env.wal.append_attempts();
        engine.abort();
        // Stopped: nothing is taken or written any more.
        assert!(engine.append(req(2, 1, 1, payload(2, 100))).await.is_err());
        assert_eq!(env.wal.append_attempts(), attempts);
    }
    let env = env();
    let (engine, report) = env.start(cfg()).await;
    assert_eq!(report.records_replayed, 200, "every acked append survives");
    for stream in [1, 2] {
        let got = read_all(&engine, stream, 0).await;
        assert_eq!(got.len(), 100);
        assert_eq!(
            got.last()
                .map(|b| b.base_offset + u64::from(b.record_count)),
            Some(100)
        );
    }
}

/// An append that finds the queue full while uploads keep failing gives up with `NoRoom`:
/// nothing written, no offset taken, so the stream needs no reopen and continues at the same
/// offset once storage is back.
#[tokio::test]
async fn an_append_waiting_for_space_gives_up_with_no_room_while_uploads_fail() {
    // Data puts fail; the WAL lives on storage of its own and keeps working.
    let storage = Arc::new(MemoryStorage::new());
    let wal_storage: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let wal = Arc::new(ObjectWal::new(wal_storage, "wal/0".into()));
    let env = Env::with_wal(storage.clone(), Arc::new(MemCatalog::new()), wal);
    let (engine, _) = env
        .start(EngineConfig {
            max_unflushed_bytes: 8 * 1024,
            upload_threshold_bytes: 1 << 30,
            upload_interval: Duration::from_millis(10),
            ..cfg()
        })
        .await;
    engine.open(1, 1, 0);
    storage.fail_puts(usize::MAX);
    let mut acked = 0u64;
    let err = loop {
        match engine.try_append(req(1, 1, 1, Bytes::from(vec![7u8; 500]))) {
            Ok(p) => {
                assert_eq!(p.base_offset, acked);
                p.durable().await.unwrap();
                acked += 1;
                assert!(acked < 100, "the queue never filled");
            }
            Err(TryAppendError::Full(r)) => {
                break tokio::time::timeout(Duration::from_secs(60), engine.append(r))
                    .await
                    .expect("the wait for space gave up")
                    .unwrap_err();
            }
            Err(TryAppendError::Failed(e)) => panic!("{e}"),
        }
    };
    assert!(matches!(err, EngineError::NoRoom(_)), "{err}");
    assert_eq!(engine.next_offset(1), Some(acked), "no offset taken");
    storage.fail_puts(0);
    let more = engine
        .append(req(1, 1, 1, Bytes::from_static(b"after")))
        .await
        .unwrap();
    assert_eq!(more.base_offset, acked, "the stream continues where it was");
    more.durable().await.unwrap();
    engine.flush().await.unwrap();
    assert_eq!(env.catalog.committed_end(1), acked + 1);
}
