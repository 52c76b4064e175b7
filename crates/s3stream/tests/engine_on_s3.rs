//! The engine with its data objects and its WAL (`ObjectWal`) on S3: every acknowledged append
//! survives a crash and restart. Needs `PICO_TEST_S3_ENDPOINT` (see `testing_s3`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use s3stream::testing::MemCatalog;
use s3stream::testing_s3::TestBucket;
use s3stream::*;

fn cfg(node_epoch: u64) -> EngineConfig {
    EngineConfig {
        node_id: 1,
        node_epoch,
        // Uploads only when the test flushes: a crash leaves the appends in the WAL alone.
        upload_interval: Duration::from_secs(3600),
        ..EngineConfig::default()
    }
}

/// A node as `pico serve` opens it on S3: one storage for data, one for the WAL under
/// `wal/{node_id}` (the default WAL is the data bucket).
async fn start(
    bucket: &TestBucket,
    catalog: &Arc<MemCatalog>,
    node_epoch: u64,
) -> (Engine, RecoveryReport) {
    let data = Arc::new(bucket.storage().await);
    let wal = ObjectWal::new(Arc::new(bucket.storage().await), "wal/1".into());
    Engine::start(
        cfg(node_epoch),
        data,
        Arc::new(wal),
        catalog.clone(),
        Arc::new(|_, _| {}),
    )
    .await
    .unwrap()
}

async fn append_acked(engine: &Engine, stream: u64, epoch: i64, n: u64) -> Vec<(u64, Bytes)> {
    let mut pending = Vec::new();
    for i in 0..n {
        let data = Bytes::from(format!("s{stream}-e{epoch}-{i}"));
        let p = engine
            .append(AppendRequest {
                stream,
                epoch,
                record_count: 1,
                batch: data.clone(),
                batch_crc: None,
                aux: Bytes::new(),
            })
            .await
            .unwrap();
        pending.push((p, data));
    }
    let mut out = Vec::new();
    for (p, data) in pending {
        let base = p.base_offset;
        p.durable().await.unwrap();
        out.push((base, data));
    }
    out
}

async fn read_all(engine: &Engine, stream: u64) -> Vec<(u64, Bytes)> {
    let mut out = Vec::new();
    let mut cur = 0;
    loop {
        let page = engine.read(stream, cur, 1 << 20).await.unwrap();
        let Some(last) = page.last() else { break };
        cur = last.next_offset();
        out.extend(page.into_iter().map(|b| (b.base_offset, b.data)));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acknowledged_append_on_s3_is_read_back_after_a_crash() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let catalog = Arc::new(MemCatalog::new());
    let mut want: HashMap<u64, Vec<(u64, Bytes)>> = HashMap::new();
    {
        let (engine, _) = start(&bucket, &catalog, 1).await;
        for s in 1..=3u64 {
            engine.open(s, 1, 0);
        }
        let (a, b, c) = tokio::join!(
            append_acked(&engine, 1, 1, 20),
            append_acked(&engine, 2, 1, 20),
            append_acked(&engine, 3, 1, 20)
        );
        want.insert(1, a);
        want.insert(2, b);
        want.insert(3, c);
        drop(engine); // a crash: nothing uploaded, everything only in the WAL on S3
    }
    assert!(catalog.commits().is_empty());
    let whole = bucket.storage().await;
    assert!(!whole.list("wal/1/").await.unwrap().is_empty());

    let (engine, report) = start(&bucket, &catalog, 2).await;
    assert_eq!(report.records_replayed, 60);
    for s in 1..=3u64 {
        assert_eq!(catalog.committed_end(s), 20);
        assert_eq!(read_all(&engine, s).await, want[&s]);
    }
    // Recovery uploaded the replayed records as data objects on S3.
    assert!(!whole.list("data/1/").await.unwrap().is_empty());

    // More appends after the restart, half uploaded, then another crash.
    engine.open(1, 2, catalog.committed_end(1));
    let mut all = want[&1].clone();
    all.extend(append_acked(&engine, 1, 2, 5).await);
    engine.flush().await.unwrap();
    all.extend(append_acked(&engine, 1, 2, 5).await);
    drop(engine);

    let (engine, report) = start(&bucket, &catalog, 3).await;
    assert_eq!(report.records_replayed, 5);
    assert_eq!(read_all(&engine, 1).await, all);
    assert_eq!(all.last().map(|(o, _)| *o), Some(29));
    drop(engine);
    bucket.destroy().await;
}

/// Two WAL writers on one prefix (a zombie and its successor) never both write one position:
/// on S3 the loser's entry is refused, the winner's kept.
#[tokio::test]
async fn two_object_wals_on_s3_never_both_write_one_position() {
    let Some(bucket) = TestBucket::create().await else {
        return;
    };
    let rec = |s: u64| WalRecord::new(s, 1, 0, 1, Bytes::from(format!("r{s}")), Bytes::new());
    let zombie = ObjectWal::new(Arc::new(bucket.storage().await), "wal/1".into());
    let successor = ObjectWal::new(Arc::new(bucket.storage().await), "wal/1".into());
    assert!(zombie.recover().await.unwrap().is_empty());
    assert!(successor.recover().await.unwrap().is_empty());
    let (a, b) = tokio::join!(zombie.append(vec![rec(1)]), successor.append(vec![rec(2)]));
    let (won, lost) = match (a, b) {
        (Ok(p), Err(e)) => ((p, 1), e),
        (Err(e), Ok(p)) => ((p, 2), e),
        other => panic!("both or neither wrote position 1: {other:?}"),
    };
    assert!(matches!(lost, WalError::Fenced(_)), "{lost}");
    let entries = successor.recover().await.unwrap();
    assert_eq!(entries, vec![(won.0, vec![rec(won.1)])]);
    bucket.destroy().await;
}
