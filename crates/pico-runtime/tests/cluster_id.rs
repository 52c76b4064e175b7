//! A metadata log remembers its cluster id; a node started with another one refuses to join.

use pico_common::BucketUri;
use pico_runtime::{Config, RuntimeError, run};

fn config(dir: &std::path::Path, cluster: &str) -> Config {
    Config {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: None,
        kafka_listen: None,
        meta_url: format!("sqlite:{}/meta.db", dir.display()),
        storage: BucketUri::parse(&format!("-2@file://{}/objects", dir.display())).unwrap(),
        cluster_id: cluster.to_string(),
        ..Config::default()
    }
}

#[tokio::test]
async fn node_refuses_another_clusters_metadata_log() {
    let dir = tempfile::tempdir().unwrap();
    run(config(dir.path(), "alpha"), async {}).await.unwrap();
    run(config(dir.path(), "alpha"), async {}).await.unwrap();
    let other = run(config(dir.path(), "beta"), async {}).await;
    assert!(
        matches!(&other, Err(RuntimeError::Config(m)) if m.contains("another cluster")),
        "got {other:?}"
    );
}
