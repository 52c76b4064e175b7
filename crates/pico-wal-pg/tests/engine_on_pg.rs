//! The engine over a `PgWal`: every acknowledged append survives a crash and restart.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestDb;
use pico_wal_pg::PgWal;
use s3stream::testing::MemCatalog;
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

async fn start(
    db: &TestDb,
    storage: &Arc<MemoryStorage>,
    catalog: &Arc<MemCatalog>,
    node_epoch: u64,
) -> (Engine, RecoveryReport) {
    let wal = PgWal::open(&db.url, 1, node_epoch).await.unwrap();
    Engine::start(
        cfg(node_epoch),
        storage.clone(),
        Arc::new(wal),
        catalog.clone(),
        Arc::new(|_, _| {}),
    )
    .await
    .unwrap()
}

/// Appends `n` batches of one record to `stream` concurrently (one group commit may carry
/// several); returns the acknowledged (offset, payload) pairs, ascending.
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

#[tokio::test]
async fn every_acknowledged_append_is_read_back_after_a_crash() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let storage = Arc::new(MemoryStorage::new());
    let catalog = Arc::new(MemCatalog::new());
    let mut want: HashMap<u64, Vec<(u64, Bytes)>> = HashMap::new();
    {
        let (engine, _) = start(&db, &storage, &catalog, 1).await;
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
        drop(engine); // a crash: nothing uploaded, everything only in the WAL
    }
    assert!(catalog.commits().is_empty());

    let (engine, report) = start(&db, &storage, &catalog, 2).await;
    assert_eq!(report.records_replayed, 60);
    for s in 1..=3u64 {
        assert_eq!(catalog.committed_end(s), 20);
        assert_eq!(read_all(&engine, s).await, want[&s]);
    }

    // More appends after the restart, half uploaded, then another crash.
    engine.open(1, 2, catalog.committed_end(1));
    let mut all = want[&1].clone();
    all.extend(append_acked(&engine, 1, 2, 5).await);
    engine.flush().await.unwrap();
    all.extend(append_acked(&engine, 1, 2, 5).await);
    drop(engine);

    let (engine, report) = start(&db, &storage, &catalog, 3).await;
    assert_eq!(report.records_replayed, 5);
    assert_eq!(read_all(&engine, 1).await, all);
    assert_eq!(all.last().map(|(o, _)| *o), Some(29));
}
