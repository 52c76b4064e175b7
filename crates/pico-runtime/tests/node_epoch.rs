//! A node's epoch grows across restarts even when the clock stepped back in between.

use pico_common::BucketUri;
use pico_common::clock::now_ms;
use pico_metadata::Command;
use pico_runtime::{Config, run};
use pico_sql::{MetaLog, MetaLogOptions};

#[tokio::test]
async fn node_starts_above_its_registered_epoch_when_the_clock_is_behind() {
    let dir = tempfile::tempdir().unwrap();
    let config = Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: None,
        kafka_listen: None,
        meta_url: format!("sqlite:{}/meta.db", dir.path().display()),
        storage: BucketUri::parse(&format!("-2@file://{}/objects", dir.path().display())).unwrap(),
        ..Config::default()
    };
    // The last run registered with a clock an hour ahead of the current one.
    let ahead = now_ms() as u64 + 3_600_000;
    let meta = MetaLog::open(&config.meta_url, MetaLogOptions::default())
        .await
        .unwrap();
    meta.propose(Command::RegisterNode {
        node_id: config.node_id,
        node_epoch: ahead,
        address: "http://127.0.0.1:1".into(),
        now_ms: 0,
    })
    .await
    .unwrap()
    .unwrap();
    meta.close().await;

    let started = run(config.clone(), async {}).await;
    assert!(started.is_ok(), "node refused to start: {started:?}");
    let meta = MetaLog::open(&config.meta_url, MetaLogOptions::default())
        .await
        .unwrap();
    let epoch = meta.view().nodes.get(&config.node_id).map(|n| n.epoch);
    assert!(
        epoch.is_some_and(|e| e > ahead),
        "registered epoch {epoch:?}, stored before {ahead}"
    );
    meta.close().await;
}
