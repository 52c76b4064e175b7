//! The engine on a `PgWal` whose Postgres connection is cut (a restarted server) or hung (a
//! server that stopped answering), through a TCP proxy in front of the real server: appends
//! fail retryably in bounded time (the statement timeout), never acknowledged-then-lost; they
//! succeed again once Postgres is back, without a restart; everything acknowledged is read
//! back after a crash and recovery.

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

const STREAM: u64 = 1;

fn cfg(node_epoch: u64) -> EngineConfig {
    EngineConfig {
        node_id: 1,
        node_epoch,
        upload_interval: Duration::from_secs(3600),
        ..EngineConfig::default()
    }
}

/// Short timeouts: a hung Postgres fails a write in well under a second.
fn quick() -> PgWalOptions {
    PgWalOptions {
        statement_timeout: Duration::from_millis(300),
        acquire_timeout: Duration::from_millis(300),
    }
}

struct Writer {
    engine: Engine,
    catalog: Arc<MemCatalog>,
    epoch: i64,
    acked: Vec<(u64, Bytes)>,
    n: u64,
}

impl Writer {
    /// One append, bounded: `true` if acknowledged (and recorded as such).
    async fn append(&mut self) -> Result<(), EngineError> {
        self.n += 1;
        let data = Bytes::from(format!("record-{}", self.n));
        let req = AppendRequest {
            stream: STREAM,
            epoch: self.epoch,
            record_count: 1,
            batch: data.clone(),
            batch_crc: None,
            aux: Bytes::new(),
        };
        let done = tokio::time::timeout(Duration::from_secs(20), async {
            self.engine.append(req).await?.durable().await
        })
        .await
        .expect("an append answered within 20 s, outage or not")?;
        self.acked.push((done.base_offset, data));
        Ok(())
    }

    /// What the host does after a failed append: flush, reopen at a new epoch.
    async fn reopen(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while let Err(e) = self.engine.flush().await {
            assert!(tokio::time::Instant::now() < deadline, "flush: {e}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.epoch += 1;
        let end = self.catalog.committed_end(STREAM);
        self.engine.open(STREAM, self.epoch, end);
    }

    /// Appends until one is acknowledged (bounded): Postgres is back.
    async fn append_until_ok(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while let Err(e) = self.append().await {
            assert!(tokio::time::Instant::now() < deadline, "never resumed: {e}");
            self.reopen().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_fail_retryably_while_postgres_is_away_and_resume_after() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let proxy = PgProxy::start(&db.url).await;
    let storage = Arc::new(MemoryStorage::new());
    let catalog = Arc::new(MemCatalog::new());
    let wal = PgWal::open_with(&proxy.url(&db.url), 1, 1, quick())
        .await
        .unwrap();
    let (engine, _) = Engine::start(
        cfg(1),
        storage.clone(),
        Arc::new(wal),
        catalog.clone(),
        Arc::new(|_, _| {}),
    )
    .await
    .unwrap();
    engine.open(STREAM, 1, 0);
    let mut w = Writer {
        engine,
        catalog: catalog.clone(),
        epoch: 1,
        acked: Vec::new(),
        n: 0,
    };
    for _ in 0..5 {
        w.append().await.unwrap();
    }

    // A restarted server: connections closed, new ones refused.
    proxy.cut();
    let err = w
        .append()
        .await
        .expect_err("acknowledged with Postgres away");
    assert!(matches!(err, EngineError::Durability(_)), "{err}");
    proxy.resume();
    w.reopen().await;
    w.append_until_ok().await;
    for _ in 0..5 {
        w.append().await.unwrap();
    }

    // A server that stopped answering: the statement timeout fails the write, no hang.
    proxy.hang();
    let err = w
        .append()
        .await
        .expect_err("acknowledged with Postgres hung");
    assert!(
        matches!(&err, EngineError::Durability(m) if m.contains("no answer")),
        "{err}"
    );
    proxy.resume();
    w.reopen().await;
    w.append_until_ok().await;
    for _ in 0..5 {
        w.append().await.unwrap();
    }
    assert!(w.acked.len() >= 17, "{}", w.acked.len());

    // Crash (no flush) and recover on the bare server: everything acknowledged is there.
    let acked = std::mem::take(&mut w.acked);
    drop(w);
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
    let mut read = Vec::new();
    let mut cur = 0;
    loop {
        let page = engine.read(STREAM, cur, 64).await.unwrap();
        let Some(last) = page.last() else { break };
        cur = last.base_offset + u64::from(last.record_count);
        read.extend(page.into_iter().map(|b| (b.base_offset, b.data)));
    }
    for (i, (base, _)) in read.iter().enumerate() {
        assert_eq!(*base, i as u64, "offsets must be consecutive: {read:?}");
    }
    for (base, data) in &acked {
        assert_eq!(
            read.get(*base as usize).map(|(_, d)| d),
            Some(data),
            "acknowledged record at {base} lost"
        );
    }
}
