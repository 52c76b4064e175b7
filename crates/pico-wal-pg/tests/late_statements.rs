//! A statement whose client gave up (its deadline passed) can still reach Postgres later: the
//! network held it, or the kernel kept retransmitting after the socket closed. The engine
//! reuses the position of a group that failed all its attempts for its next group (other
//! records, acknowledged), so such a late retry must not replace what a later attempt wrote.
//!
//! The delay is played by a proxy that holds, per connection, a client->server chunk carrying
//! a marker (the failed group's payload) and forwards it when released.

mod common;
#[path = "../../pico-sql/tests/common/proxy.rs"]
mod proxy;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::TestDb;
use pico_wal_pg::{PgWal, PgWalOptions};
use proxy::PgProxy;
use s3stream::testing::MemCatalog;
use s3stream::*;

/// In the held group's payload: the proxy holds the statements that carry it.
const MARKER: &[u8] = b"HOLD-THIS-STATEMENT";

fn quick() -> PgWalOptions {
    PgWalOptions {
        statement_timeout: Duration::from_millis(300),
        acquire_timeout: Duration::from_millis(300),
    }
}

fn rec(stream: u64, epoch: i64, base: u64, data: &[u8]) -> WalRecord {
    WalRecord::new(
        stream,
        epoch,
        base,
        1,
        Bytes::copy_from_slice(data),
        Bytes::new(),
    )
}

/// The WAL alone: the engine's sequence of calls (a group retried, given up, the next group
/// at the same position) and a late retry statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_retry_never_replaces_a_later_acknowledged_append() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let proxy = PgProxy::start(&db.url).await;
    let url = proxy.url(&db.url);
    let wal = PgWal::open_with(&url, 1, 1, quick()).await.unwrap();
    let p1 = wal.append(vec![rec(1, 1, 0, b"zero")]).await.unwrap();

    proxy.hold_containing(MARKER);
    let failed = vec![rec(1, 1, 1, MARKER)];
    // Attempt 1 (plain INSERT) and attempt 2 (the upsert) both time out client-side.
    assert!(wal.append(failed.clone()).await.is_err());
    assert!(wal.append(failed.clone()).await.is_err());
    // The engine gives up on that group (its appends fail) and writes the next one, which
    // lands at the same position and is acknowledged.
    let acked = vec![rec(2, 1, 0, b"acknowledged")];
    let p2 = wal.append(acked.clone()).await.unwrap();
    assert_eq!(p2, p1 + 1);
    assert_eq!(
        wal.recover().await.unwrap(),
        vec![(p1, vec![rec(1, 1, 0, b"zero")]), (p2, acked.clone())],
        "acknowledged append in place before the late statement"
    );

    // The failed group's statements arrive late.
    proxy.release();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let now = PgWal::open(&db.url, 1, 1)
        .await
        .unwrap()
        .recover()
        .await
        .unwrap();
    assert_eq!(
        now,
        vec![(p1, vec![rec(1, 1, 0, b"zero")]), (p2, acked)],
        "the acknowledged append at position {p2} was overwritten by the failed group's late retry"
    );
}

/// The same through the engine and a crash: the acknowledged append is recovered, and the one
/// answered with an error is not replayed in its place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_keeps_an_acknowledged_append_a_late_statement_arrives_after() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let proxy = PgProxy::start(&db.url).await;
    let url = proxy.url(&db.url);
    let storage = Arc::new(MemoryStorage::new());
    let catalog = Arc::new(MemCatalog::new());
    let cfg = |node_epoch| EngineConfig {
        node_id: 1,
        node_epoch,
        upload_interval: Duration::from_secs(3600),
        ..EngineConfig::default()
    };
    let wal = PgWal::open_with(&url, 1, 1, quick()).await.unwrap();
    let (engine, _) = Engine::start(
        cfg(1),
        storage.clone(),
        Arc::new(wal),
        catalog.clone(),
        Arc::new(|_, _| {}),
    )
    .await
    .unwrap();
    let append = |stream: u64, epoch: i64, data: &'static [u8]| {
        let engine = engine.clone();
        async move {
            engine
                .append(AppendRequest {
                    stream,
                    epoch,
                    record_count: 1,
                    batch: Bytes::from_static(data),
                    batch_crc: None,
                    aux: Bytes::new(),
                })
                .await?
                .durable()
                .await
        }
    };
    engine.open(1, 1, 0);
    engine.open(2, 1, 0);
    append(1, 1, b"first").await.unwrap();

    proxy.hold_containing(MARKER);
    let err = append(1, 1, MARKER)
        .await
        .expect_err("held: all attempts time out");
    assert!(matches!(err, EngineError::Durability(_)), "{err}");
    // Another stream's append: a new group, at the failed group's position, acknowledged.
    let ok = append(2, 1, b"acknowledged").await.unwrap();
    assert_eq!(ok.base_offset, 0);

    proxy.release();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(engine); // crash: nothing uploaded

    let wal = PgWal::open(&db.url, 1, 2).await.unwrap();
    let (engine, _) = Engine::start(
        cfg(2),
        storage,
        Arc::new(wal),
        catalog.clone(),
        Arc::new(|_, _| {}),
    )
    .await
    .unwrap();
    let s1: Vec<Bytes> = engine
        .read(1, 0, 1 << 20)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.data)
        .collect();
    let s2: Vec<Bytes> = engine
        .read(2, 0, 1 << 20)
        .await
        .unwrap()
        .into_iter()
        .map(|b| b.data)
        .collect();
    assert_eq!(
        s2,
        vec![Bytes::from_static(b"acknowledged")],
        "stream 2's acknowledged append lost after the crash"
    );
    assert_eq!(
        s1,
        vec![Bytes::from_static(b"first")],
        "stream 1's failed append was replayed"
    );
}
