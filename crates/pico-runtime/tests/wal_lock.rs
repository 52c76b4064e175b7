//! One process per local WAL directory: a second node on it refuses to start, before it cleans,
//! registers or recovers anything the first is using.

use pico_common::BucketUri;
use pico_runtime::{Config, RuntimeError, run, stores};
use std::path::Path;
use std::time::{Duration, Instant};

fn config(dir: &Path) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: None,
        kafka_listen: None,
        meta_url: format!("sqlite:{}/meta.db", dir.display()),
        storage: BucketUri::parse(&format!("-2@file://{}/objects", dir.display())).unwrap(),
        ..Config::default()
    }
}

fn assert_in_use(result: Result<(), RuntimeError>) {
    match result {
        Err(e @ RuntimeError::WalInUse(_)) => {
            let msg = e.to_string();
            assert!(msg.contains("in use by another process"), "{msg}");
        }
        other => panic!("second node on one WAL directory: {other:?}"),
    }
}

#[tokio::test]
async fn a_node_refuses_a_wal_directory_held_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let wal = config.storage.with_id(config.storage.id - 1);
    let held = stores::lock_wal(&wal, config.node_id).unwrap();
    assert_in_use(run(config.clone(), async {}).await);
    // Refused before opening the metadata log it would have registered in.
    assert!(!dir.path().join("meta.db").exists());
    drop(held);
    run(config, async {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_node_holds_its_wal_directory_until_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let first = run(config.clone(), async move {
        let _ = stopped.await;
    });
    let second = async {
        // The first opens the metadata log only once it holds the lock.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !dir.path().join("meta.db").exists() {
            assert!(
                Instant::now() < deadline,
                "the first node never opened its metadata"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let second = run(config.clone(), async {}).await;
        let _ = stop.send(());
        second
    };
    // One task: `run`'s future is not `Send` enough for `tokio::spawn`.
    let (first, second) = tokio::join!(first, second);
    first.unwrap();
    assert_in_use(second);
    run(config, async {}).await.unwrap();
}
