//! The engine over a faulty object store (`FaultStorage`): transient faults are retried and
//! nothing acknowledged is lost; a store that stays down fails appends clearly (never a false
//! ack) and the engine works again once it heals. Each scenario is a function of the inner
//! store, run here on memory and `file://`; an S3 backend plugs into the same functions.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use s3stream::testing::{Fault, FaultSchedule, FaultStorage, MemCatalog, Op};
use s3stream::testing_s3::TestBucket;
use s3stream::*;

const STREAM: u64 = 1;

struct Node {
    engine: Engine,
    catalog: Arc<MemCatalog>,
    epoch: i64,
}

/// Uploads often and in small objects, so faults hit data PUTs and commits too.
fn cfg() -> EngineConfig {
    EngineConfig {
        upload_interval: Duration::from_millis(20),
        upload_threshold_bytes: 512,
        upload_timeout: Duration::from_secs(5),
        ..EngineConfig::default()
    }
}

async fn start(storage: Arc<dyn ObjectStorage>, catalog: Arc<MemCatalog>) -> Engine {
    let wal = Arc::new(ObjectWal::new(storage.clone(), "wal/0".into()));
    let (engine, _) = Engine::start(cfg(), storage, wal, catalog, Arc::new(|_, _| {}))
        .await
        .expect("engine starts");
    engine
}

impl Node {
    async fn new(storage: Arc<dyn ObjectStorage>) -> Node {
        let catalog = Arc::new(MemCatalog::new());
        let engine = start(storage, catalog.clone()).await;
        engine.open(STREAM, 1, 0);
        Node {
            engine,
            catalog,
            epoch: 1,
        }
    }

    /// One append, answered: `Ok` only when the engine acknowledged it durable.
    async fn append(&self, data: &Bytes) -> Result<Appended, EngineError> {
        let req = AppendRequest {
            stream: STREAM,
            epoch: self.epoch,
            record_count: 1,
            batch: data.clone(),
            batch_crc: None,
            aux: Bytes::new(),
        };
        // Bounded: a faulty store must answer, never hang an append.
        tokio::time::timeout(Duration::from_secs(30), async {
            self.engine.append(req).await?.durable().await
        })
        .await
        .expect("an append under faults answered within 30 s")
    }

    /// What the host does after a failed append: flush what is durable (retried until the
    /// store lets it), then reopen the stream at a new epoch from its committed end.
    async fn reopen(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while let Err(e) = self.engine.flush().await {
            assert!(
                tokio::time::Instant::now() < deadline,
                "flush never succeeded: {e}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.epoch += 1;
        let end = self.catalog.committed_end(STREAM);
        self.engine.open(STREAM, self.epoch, end);
    }
}

/// Every batch of the stream from offset 0, in order.
async fn read_all(engine: &Engine) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    let mut cur = 0;
    loop {
        let page = engine.read(STREAM, cur, 64).await.expect("read");
        let Some(last) = page.last() else { break };
        cur = last.base_offset + u64::from(last.record_count);
        out.extend(page.into_iter().map(|b| (b.base_offset, b.data)));
    }
    out
}

/// Every acknowledged batch is read back at its offset, and the stream has no holes.
fn assert_nothing_acked_lost(read: &[(u64, Bytes)], acked: &[(u64, Bytes)]) {
    for (i, (base, _)) in read.iter().enumerate() {
        assert_eq!(*base, i as u64, "offsets must be consecutive: {read:?}");
    }
    for (base, data) in acked {
        assert_eq!(
            read.get(*base as usize).map(|(_, d)| d),
            Some(data),
            "acknowledged batch at offset {base} lost"
        );
    }
}

/// Transient faults on every operation (the WAL's PUTs, data PUTs, lists, GETs): the engine
/// retries, appends are acknowledged, and every acknowledged one is there after the store
/// heals, in this process and after a restart that recovers from the WAL.
async fn transient_faults_lose_nothing_acknowledged(inner: Arc<dyn ObjectStorage>) {
    let faulty = Arc::new(FaultStorage::new(inner.clone()));
    let mut node = Node::new(faulty.clone()).await;
    faulty.set_schedule(FaultSchedule {
        error: 0.06,
        reset: 0.04,
        lost_answer: 0.04,
        max_latency: Duration::from_millis(2),
        ..FaultSchedule::quiet(0x5eed)
    });
    // A put that lands with its answer lost, on the WAL's first write.
    faulty.fail_next(Some(Op::Put), Fault::LostAnswer);

    let mut acked = Vec::new();
    let mut failed = 0;
    for i in 0..150 {
        let data = Bytes::from(format!("record-{i}"));
        match node.append(&data).await {
            Ok(a) => acked.push((a.base_offset, data)),
            Err(e) => {
                assert!(
                    matches!(e, EngineError::Durability(_) | EngineError::Broken { .. }),
                    "{e}"
                );
                failed += 1;
                node.reopen().await;
            }
        }
    }
    assert!(
        faulty.injected_count() > 10,
        "the schedule injected too few faults to mean anything: {}",
        faulty.injected_count()
    );
    // Retries hide most faults: at most a few appends fail (all WAL attempts faulted).
    assert!(acked.len() > 100, "acked={} failed={failed}", acked.len());

    faulty.heal();
    node.reopen().await;
    assert_nothing_acked_lost(&read_all(&node.engine).await, &acked);

    // A restarted process on the bare store recovers the same.
    let restarted = start(inner, node.catalog.clone()).await;
    assert_nothing_acked_lost(&read_all(&restarted).await, &acked);
}

/// A store that stays down: appends fail with a durability error in bounded time (never an
/// ack), and once it is back the engine takes appends again without a restart.
async fn a_persistent_fault_fails_appends_then_heals(inner: Arc<dyn ObjectStorage>) {
    let faulty = Arc::new(FaultStorage::new(inner));
    let mut node = Node::new(faulty.clone()).await;
    let first = Bytes::from_static(b"before the outage");
    let a = node.append(&first).await.expect("healthy store");
    let mut acked = vec![(a.base_offset, first)];

    faulty.set_down(true);
    let err = node
        .append(&Bytes::from_static(b"during the outage"))
        .await
        .expect_err("an append on a store that is down was acknowledged");
    assert!(
        matches!(&err, EngineError::Durability(m) if m.contains("injected fault")),
        "{err}"
    );
    // Broken until reopened, as the host does; the reopen's flush needs the store.
    let err = node
        .append(&Bytes::from_static(b"still during the outage"))
        .await
        .expect_err("an append on a broken stream was acknowledged");
    assert!(matches!(err, EngineError::Broken { .. }), "{err}");
    assert!(node.engine.flush().await.is_err(), "flush on a down store");

    faulty.set_down(false);
    node.reopen().await;
    let after = Bytes::from_static(b"after the outage");
    let a = node.append(&after).await.expect("the store healed");
    acked.push((a.base_offset, after));
    node.reopen().await;
    let read = read_all(&node.engine).await;
    assert_nothing_acked_lost(&read, &acked);
    assert_eq!(read.len(), 2, "{read:?}");
}

fn file_store() -> (tempfile::TempDir, Arc<dyn ObjectStorage>) {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(FileStorage::open(dir.path().join("objects")).unwrap());
    (dir, store)
}

#[tokio::test]
async fn transient_faults_on_memory() {
    transient_faults_lose_nothing_acknowledged(Arc::new(MemoryStorage::new())).await;
}

#[tokio::test]
async fn transient_faults_on_file() {
    let (_dir, store) = file_store();
    transient_faults_lose_nothing_acknowledged(store).await;
}

#[tokio::test]
async fn persistent_fault_on_memory() {
    a_persistent_fault_fails_appends_then_heals(Arc::new(MemoryStorage::new())).await;
}

#[tokio::test]
async fn persistent_fault_on_file() {
    let (_dir, store) = file_store();
    a_persistent_fault_fails_appends_then_heals(store).await;
}

#[tokio::test]
async fn transient_faults_on_s3() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    transient_faults_lose_nothing_acknowledged(Arc::new(bucket.storage().await)).await;
    bucket.destroy().await;
}

#[tokio::test]
async fn persistent_fault_on_s3() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    a_persistent_fault_fails_appends_then_heals(Arc::new(bucket.storage().await)).await;
    bucket.destroy().await;
}

/// The wrapper itself: a lost answer lands, a list is never short, scope and down work.
#[tokio::test]
async fn fault_storage_semantics() {
    let inner: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let f = FaultStorage::scoped(inner.clone(), "data/");
    f.fail_next(Some(Op::Put), Fault::LostAnswer);
    assert!(f.put("data/a", Bytes::from_static(b"1")).await.is_err());
    assert_eq!(inner.get("data/a").await.unwrap(), Bytes::from_static(b"1"));
    f.fail_next(None, Fault::Reset);
    let err = f.get("data/a").await.unwrap_err();
    assert!(err.to_string().contains("reset"), "{err}");
    f.fail_next(Some(Op::List), Fault::LostAnswer);
    assert!(f.list("data/").await.is_err());
    assert_eq!(f.list("data/").await.unwrap(), vec!["data/a".to_string()]);
    f.set_down(true);
    assert!(f.put("data/b", Bytes::new()).await.is_err());
    assert!(inner.get("data/b").await.is_err(), "a down store stored");
    // Out of scope: untouched.
    f.put("wal/x", Bytes::new()).await.unwrap();
    f.heal();
    f.put("data/b", Bytes::new()).await.unwrap();
    assert_eq!(f.injected_count(), 4);
}
