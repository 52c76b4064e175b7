//! Turns a [`Config`] into a running node.
//!
//! - [`config`]: the parsed `pico serve` settings.
//! - [`stores`]: opens object storage and the WAL from bucket URIs.
//! - [`coalesce`]: HTTP/2 write coalescing (one write per fan-out round, not per stream).
//! - [`conn_exec`]: runs an HTTP/2 connection's streams in the connection's own task.
//! - [`listener`]: the HTTP/1.1 + HTTP/2 accept loop (TCP_NODELAY, HTTP/2 stream limit).
//! - [`run`]: open stores, build the engine and node, bind listeners, shut down gracefully.
//! - [`metrics_handle`]: the process's Prometheus recorder, installed once, drained on a timer.

pub mod coalesce;
pub mod config;
pub mod conn_exec;
pub mod listener;
pub mod stores;

pub use config::{AuthMode, Config, RootProtocol, Routing};

use pico_common::clock::now_ms;
use pico_server::{Node, NodeConfig};
use pico_sql::{MetaLog, MetaLogOptions};
use std::net::SocketAddr;
use thiserror::Error;
use tokio::net::TcpListener;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("startup: {0}")]
    Startup(String),
    #[error("listener: {0}")]
    Listen(String),
}

/// How often the recorder's histogram samples are folded into its summaries. Without it they
/// pile up between scrapes, so memory would grow with load on a node nobody scrapes.
///
/// Short, because the exporter loses samples at some moments: a summary with no live window (at
/// start, or 40–60 s after its last sample) opens one at the first sample it is handed, and a
/// fold hands over the newest block of 64 samples first, so every older sample of that fold is
/// dropped from the quantiles (still counted in `_count` and `_sum`); after 20 s idle, a fold
/// that spans the start of a new 20 s window likewise drops its samples from before it. At 5 s,
/// a node's first seconds of traffic, and those after each idle spell, were all but missing
/// from its quantiles; at 100 ms at most a tenth of a second is. A fold costs a lock and a few
/// small allocations per histogram, ten times a second.
const METRICS_UPKEEP: std::time::Duration = std::time::Duration::from_millis(100);

/// The process-wide Prometheus recorder behind the admin listener's `/metrics`: installed by the
/// first node this process runs (several in one test process share it), with a thread that does
/// its upkeep. `None` if another recorder was installed first (then there is nothing to render).
pub fn metrics_handle() -> Option<metrics_exporter_prometheus::PrometheusHandle> {
    static HANDLE: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
        std::sync::OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
            let handle = recorder.handle();
            // The upkeep thread first: a recorder installed without it would hold every sample
            // of an unscraped node. A plain thread: the recorder outlives any one runtime.
            let h = handle.clone();
            let spawned = std::thread::Builder::new()
                .name("pico-metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(METRICS_UPKEEP);
                        h.run_upkeep();
                    }
                });
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "metrics upkeep thread did not start; /metrics is off");
                return None;
            }
            if let Err(e) = metrics::set_global_recorder(recorder) {
                // The thread then only tidies an empty recorder.
                tracing::warn!(error = %e, "metrics recorder not installed; /metrics is off");
                return None;
            }
            s3stream::telemetry::describe();
            pico_http::telemetry::describe();
            Some(handle)
        })
        .clone()
}

/// Checks the settings that must hold before anything is opened.
pub fn validate(config: &Config) -> Result<(), RuntimeError> {
    let exposed = |a: &SocketAddr| !a.ip().is_loopback();
    let remote = exposed(&config.listen) || config.admin_listen.as_ref().is_some_and(exposed);
    if remote && config.auth != AuthMode::Required && !config.insecure_allow_remote {
        return Err(RuntimeError::Config(
            "binding a non-loopback address needs --auth required or --insecure-allow-remote"
                .into(),
        ));
    }
    if config.auth == AuthMode::Required {
        return Err(RuntimeError::Config(
            "--auth required is not supported by this build yet; bind loopback or pass --insecure-allow-remote".into(),
        ));
    }
    if config.max_request_size == 0 || config.max_chunk_size == 0 {
        return Err(RuntimeError::Config(
            "sizes must be greater than zero".into(),
        ));
    }
    Ok(())
}

/// Runs a node until `shutdown` resolves (SIGINT/SIGTERM in the binary), then drains.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RuntimeError> {
    validate(&config)?;
    // Before the engine exists, so recovery's WAL reads and first commits are recorded too.
    let metrics = metrics_handle();
    let meta = MetaLog::open(&config.meta_url, MetaLogOptions::default())
        .await
        .map_err(|e| RuntimeError::Startup(format!("metadata log `{}`: {e}", config.meta_url)))?;
    let node_epoch = config
        .node_epoch
        .unwrap_or_else(|| next_node_epoch(&meta, config.node_id, now_ms()));
    check_cluster_id(&meta, &config.cluster_id).await?;
    let data = stores::object_storage(&config.storage)?;
    let wal_uri = config
        .wal
        .clone()
        .unwrap_or_else(|| config.storage.with_id(config.storage.id - 1));
    let wal = stores::wal(&wal_uri, config.node_id)?;
    let mut engine = stores::engine_config(&wal_uri)?;
    engine.log_cache_bytes = config.wal_cache_size;
    engine.block_cache_bytes = config.block_cache_size;

    let protocol = TcpListener::bind(config.listen)
        .await
        .map_err(|e| RuntimeError::Listen(format!("{}: {e}", config.listen)))?;
    let admin = match config.admin_listen {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|e| RuntimeError::Listen(format!("{a}: {e}")))?,
        ),
        None => None,
    };
    let local = protocol
        .local_addr()
        .map_err(|e| RuntimeError::Listen(e.to_string()))?;
    let advertised = config
        .http_address
        .clone()
        .unwrap_or_else(|| format!("http://{local}"));
    let node_config = NodeConfig {
        node_id: config.node_id,
        node_epoch,
        advertised_url: advertised,
        long_poll_timeout: config.long_poll_timeout,
        sse_max_duration: config.sse_max_duration,
        max_chunk_size: config.max_chunk_size,
        max_request_size: config.max_request_size,
        slots: config.slots,
        allow_local_webhooks: config.listen.ip().is_loopback(),
        ..NodeConfig::default()
    };
    let node = Node::start(node_config, meta, data, wal, engine)
        .await
        .map_err(|e| RuntimeError::Startup(e.to_string()))?;

    let opts = pico_http::HttpOptions {
        routing_local: config.routing == Routing::Local,
        ds_at_root: config.protocol == RootProtocol::Ds,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let proto_app = pico_http::protocol_router(node.clone(), opts);
    let listen = listener::ListenOptions {
        http2_max_streams: config.http2_max_streams,
    };
    let mut servers = Vec::new();
    servers.push(tokio::spawn(listener::serve(
        protocol,
        proto_app,
        listen,
        stop_rx.clone(),
    )));
    tracing::info!(addr = %local, "protocol listener ready");
    if let Some(admin) = admin {
        let addr = admin
            .local_addr()
            .map_err(|e| RuntimeError::Listen(e.to_string()))?;
        servers.push(tokio::spawn(listener::serve(
            admin,
            pico_http::admin_router(node.clone(), metrics),
            listen,
            stop_rx,
        )));
        tracing::info!(addr = %addr, "admin listener ready");
    }
    if config.kafka_listen.is_some() {
        tracing::info!("kafka listener not available in this build; serving HTTP only");
    }

    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let drain = tokio::time::sleep(config.shutdown_drain);
    tokio::pin!(drain);
    for s in servers {
        tokio::select! {
            _ = &mut drain => break,
            _ = s => {}
        }
    }
    node.shutdown().await;
    tracing::info!("stopped");
    Ok(())
}

/// This incarnation's node epoch: the clock, but always above the epoch this node id last
/// registered, so a clock stepped back between restarts (NTP, VM restore) cannot make the
/// registration stale and the node refuse to start.
fn next_node_epoch(meta: &MetaLog, node_id: u32, now_ms: i64) -> u64 {
    let now = now_ms.max(1) as u64;
    match meta.view().nodes.get(&node_id) {
        Some(n) => now.max(n.epoch.saturating_add(1)),
        None => now,
    }
}

/// The first node to start records the cluster id in the metadata log; every later start must
/// name the same one, so a node pointed at another cluster's database refuses to join it.
async fn check_cluster_id(meta: &MetaLog, cluster_id: &str) -> Result<(), RuntimeError> {
    const KEY: &str = "cluster/id";
    if let Some(stored) = meta.view().kv.get(KEY) {
        return if stored.as_slice() == cluster_id.as_bytes() {
            Ok(())
        } else {
            Err(RuntimeError::Config(format!(
                "this metadata log belongs to another cluster: stored=`{}` given=`{cluster_id}`",
                String::from_utf8_lossy(stored)
            )))
        };
    }
    meta.propose(pico_metadata::Command::KvPut {
        key: KEY.to_string(),
        value: cluster_id.as_bytes().to_vec(),
    })
    .await
    .map_err(|e| RuntimeError::Startup(format!("recording the cluster id: {e}")))?
    .map_err(|e| RuntimeError::Startup(format!("recording the cluster id: {e}")))?;
    Ok(())
}
