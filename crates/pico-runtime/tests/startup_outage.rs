//! A node whose Postgres goes away in the middle of its start (after the metadata store
//! opened: while recording the cluster id, registering, recovering the WAL) waits for it and
//! comes up once it is back, instead of exiting. A TCP proxy in front of Postgres is cut at
//! the first attempt of the chosen phase and resumed once that attempt has failed; the start's
//! own events say when, so nothing here depends on timing.

#[path = "../../pico-wal-pg/tests/common/mod.rs"]
mod common;
#[path = "../../pico-sql/tests/common/proxy.rs"]
mod proxy;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use pico_common::BucketUri;
use pico_runtime::startup::{StartEvent, Startup};
use pico_runtime::{Config, run_with};
use proxy::PgProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// `GET path` on `addr`: the status code, or `None` if nothing answered.
async fn status(addr: std::net::SocketAddr, path: &str) -> Option<u16> {
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    let text = String::from_utf8_lossy(&out);
    text.split_whitespace().nth(1)?.parse().ok()
}

/// Which connections the outage cuts.
#[derive(Clone, Copy, PartialEq)]
enum Cut {
    /// Metadata log and WAL alike (one proxy for both).
    Both,
    /// The WAL's only: the metadata log has a proxy of its own that stays up, so the node
    /// registers and then its WAL recovery meets the outage.
    WalOnly,
}

/// Starts a node on Postgres (metadata and WAL) through a proxy that is cut at the first
/// attempt of `phase` and resumed after it failed; returns how many retries `phase` took.
async fn start_through_an_outage_at(phase: &'static str, cut: Cut, admin_port: u16) -> Option<u64> {
    let db = common::TestDb::create().await?;
    let pg = Arc::new(PgProxy::start(&db.url).await);
    let meta_proxy = match cut {
        Cut::Both => None,
        Cut::WalOnly => Some(PgProxy::start(&db.url).await),
    };
    let url = pg.url(&db.url);
    let meta_url = meta_proxy.as_ref().map_or(url.clone(), |m| m.url(&db.url));
    let dir = tempfile::tempdir().unwrap();
    let admin: std::net::SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: Some(admin),
        kafka_listen: None,
        meta_url,
        wal: Some(BucketUri::parse(&url).unwrap()),
        storage: BucketUri::parse(&format!("-2@file://{}/objects", dir.path().display())).unwrap(),
        ..Config::default()
    };
    let retries = Arc::new(AtomicU64::new(0));
    let hook = {
        let (pg, retries) = (pg.clone(), retries.clone());
        Arc::new(move |event: StartEvent<'_>| match event {
            StartEvent::Attempt { what, attempt: 0 } if what == phase => pg.cut(),
            StartEvent::Retrying { what, error, .. } if what == phase => {
                eprintln!("{phase}: retrying after: {error}");
                retries.fetch_add(1, Ordering::SeqCst);
                pg.resume();
            }
            _ => {}
        })
    };
    let startup = Arc::new(Startup::with_hook(hook));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let mut node = tokio::spawn(run_with(
        config,
        async {
            let _ = stopped.await;
        },
        startup.clone(),
    ));
    tokio::select! {
        _ = startup.until_up() => {}
        exited = &mut node => panic!("the node exited during its start: {exited:?}"),
    }
    // Up: its own /ready says so once its first heartbeat is in (bounded wait, no timing
    // asserted).
    let mut ready = false;
    for _ in 0..300 {
        if status(admin, "/ready").await == Some(200) {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ready, "up but never ready");
    let _ = stop.send(());
    let stopped = node.await.unwrap();
    assert!(stopped.is_ok(), "{stopped:?}");
    Some(retries.load(Ordering::SeqCst))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lost_while_recording_the_cluster_id() {
    // The metadata store's open and then the cluster id's record both meet a cut proxy.
    if let Some(retries) = start_through_an_outage_at("metadata store", Cut::Both, 25101).await {
        assert!(retries >= 2, "{retries} retries: the cut was never met");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_lost_while_registering_and_recovering() {
    if let Some(retries) = start_through_an_outage_at("recovery", Cut::Both, 25102).await {
        assert!(retries >= 1, "{retries} retries: the cut was never met");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_database_lost_during_recovery() {
    if let Some(retries) = start_through_an_outage_at("recovery", Cut::WalOnly, 25103).await {
        assert!(retries >= 1, "{retries} retries: the cut was never met");
    }
}
