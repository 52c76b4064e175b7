//! Turns a [`Config`] into a running node.
//!
//! - [`config`]: the parsed `pico serve` settings.
//! - [`stores`]: opens object storage and the WAL from bucket URIs; locks a local WAL directory.
//! - [`coalesce`]: HTTP/2 write coalescing (one write per fan-out round, not per stream).
//! - [`direct`]: the accepted socket, shared so a live stream's hub can write caught-up
//!   HTTP/1.1 SSE subscribers' events to it directly.
//! - [`conn_exec`]: runs an HTTP/2 connection's streams in the connection's own task, and drops
//!   those whose client stopped taking their response.
//! - [`guard`]: per-request guards (`Host`, transfer and content codings, request body timers
//!   → 408).
//! - [`host`]: which `Host` a loopback listener answers (DNS rebinding).
//! - [`listener`]: the HTTP/1.1 + HTTP/2 accept loop (TCP_NODELAY and keepalive, HTTP/2 stream
//!   limit, timers that close connections gone quiet or no longer reading).
//! - [`shutdown`]: graceful shutdown of a listener's connections (a flag load per poll).
//! - [`startup`]: waiting for an unreachable Postgres at start (`/ready` 503 meanwhile).
//! - [`run`]: open stores, build the engine and node, bind listeners, shut down gracefully.
//! - [`metrics_handle`]: the process's Prometheus recorder, installed once, drained on a timer.

pub mod coalesce;
pub mod config;
pub mod conn_exec;
pub mod direct;
pub mod guard;
pub mod head_wait;
pub mod host;
pub mod listener;
mod shutdown;
pub mod startup;
pub mod stores;
mod wait_timer;

pub use config::{AuthMode, Config, RootProtocol, Routing};

use pico_common::clock::now_ms;
use pico_server::{Node, NodeConfig};
use pico_sql::{MetaLog, MetaLogOptions};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;
use thiserror::Error;
use tokio::net::TcpListener;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("configuration: {0}")]
    Config(String),
    #[error("startup: {0}")]
    Startup(String),
    /// Another process holds this node's WAL directory ([`stores::lock_wal`]).
    #[error("WAL directory {} is in use by another process", .0.display())]
    WalInUse(std::path::PathBuf),
    #[error("listener: {0}")]
    Listen(String),
    /// A store did not answer (refused, timed out, reset): waiting may fix it.
    #[error("unreachable: {0}")]
    Unreachable(String),
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
const METRICS_UPKEEP: Duration = Duration::from_millis(100);

/// Longest long-poll wait and SSE response accepted (one week): far beyond any real use, and
/// small enough that a deadline computed from it can never overflow an `Instant`.
pub const MAX_LIVE_WAIT: Duration = Duration::from_secs(7 * 24 * 3600);

/// Largest `--node-epoch` accepted: every start must register above the last epoch, so one at
/// `u64::MAX` would leave the node id nothing to grow into; half the range leaves plenty.
pub const MAX_NODE_EPOCH: u64 = i64::MAX as u64;

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

/// Authentication is off, so binding any listener to anything but loopback must be a decision
/// (`--insecure-allow-remote`). The one check for every listener.
fn check_exposure(config: &Config) -> Result<(), RuntimeError> {
    if config.auth == AuthMode::Required || config.insecure_allow_remote {
        return Ok(());
    }
    let listeners = [
        ("--listen", Some(config.listen)),
        ("--admin-listen", config.admin_listen),
        ("--kafka-listen", config.kafka_listen),
    ];
    for (flag, addr) in listeners {
        if let Some(addr) = addr.filter(|a| !a.ip().is_loopback()) {
            return Err(RuntimeError::Config(format!(
                "{flag} {addr} is not loopback and authentication is off: pass \
                 --insecure-allow-remote to expose it without authentication"
            )));
        }
    }
    Ok(())
}

/// Checks the settings that must hold before anything is opened.
pub fn validate(config: &Config) -> Result<(), RuntimeError> {
    check_exposure(config)?;
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
    let live = |flag: &str, d: Duration| {
        if d.is_zero() || d > MAX_LIVE_WAIT {
            return Err(RuntimeError::Config(format!(
                "{flag} must be between 1 and {} seconds (one week): {d:?}",
                MAX_LIVE_WAIT.as_secs()
            )));
        }
        Ok(())
    };
    live("--long-poll-timeout-sec", config.long_poll_timeout)?;
    live("--sse-max-duration-sec", config.sse_max_duration)?;
    if config.slots == Some(0) {
        return Err(RuntimeError::Config(
            "--slots must be at least 1 (0 would refuse every stream)".into(),
        ));
    }
    if let Some(e) = config.node_epoch.filter(|e| *e > MAX_NODE_EPOCH) {
        return Err(RuntimeError::Config(format!(
            "--node-epoch {e} is above the maximum of {MAX_NODE_EPOCH}: later starts must be able \
             to register a higher one"
        )));
    }
    if let Some(url) = &config.http_address {
        check_http_address(url)?;
    }
    pico_http::cors::CorsOrigins::parse(&config.cors_origins).map_err(RuntimeError::Config)?;
    for h in &config.allowed_hosts {
        if host::normalize(h).is_none() || h.contains(['/', '@', ' ']) {
            return Err(RuntimeError::Config(format!(
                "--allowed-hosts: `{h}` is not a host name or address (like pico.internal)"
            )));
        }
    }
    if config.body_deadline.is_zero() || config.body_deadline > MAX_LIVE_WAIT {
        return Err(RuntimeError::Config(format!(
            "the request body deadline must be between 1 second and one week: {:?}",
            config.body_deadline
        )));
    }
    Ok(())
}

/// The `Host` names loopback listeners answer besides loopback ones: `--allowed-hosts`, and
/// the host of `--http-address` (what clients are sent to).
fn allowed_hosts(config: &Config) -> Vec<String> {
    let mut hosts = config.allowed_hosts.clone();
    if let Some(host) = config
        .http_address
        .as_deref()
        .and_then(|u| u.parse::<hyper::Uri>().ok())
        .and_then(|u| u.host().map(str::to_string))
    {
        hosts.push(host);
    }
    hosts
}

/// The URL other nodes send clients to in their 307s: `--http-address`, else the listener's
/// address, or, when that is a wildcard (0.0.0.0 reaches nobody), this machine's host name (what
/// containers and Kubernetes pods are reached by), with a warning to set the flag.
pub fn advertised_url(config: &Config, local: SocketAddr) -> Result<String, RuntimeError> {
    if let Some(url) = &config.http_address {
        return Ok(url.clone());
    }
    if !local.ip().is_unspecified() {
        return Ok(format!("http://{local}"));
    }
    let Some(host) = host_name() else {
        // One node needs no advertised URL; a cluster does, and is told so.
        tracing::warn!(
            addr = %local,
            "listening on a wildcard address and this machine's host name is unknown: other \
             nodes cannot redirect clients here; pass --http-address"
        );
        return Ok(format!("http://{local}"));
    };
    let url = format!("http://{host}:{}", local.port());
    tracing::warn!(
        url,
        "listening on a wildcard address: advertising the host name; pass --http-address if \
         other nodes reach this one by another URL"
    );
    Ok(url)
}

/// This machine's host name (Linux: the kernel's; else `$HOSTNAME`).
fn host_name() -> Option<String> {
    let valid = |h: String| {
        let h = h.trim().to_string();
        let ok = !h.is_empty()
            && h.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.');
        ok.then_some(h)
    };
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .and_then(valid)
        .or_else(|| std::env::var("HOSTNAME").ok().and_then(valid))
}

/// `--http-address` becomes the start of other nodes' `Location` headers: it must be an
/// absolute http(s) URL naming a host that can be reached (not 0.0.0.0 or ::), without a query.
fn check_http_address(url: &str) -> Result<(), RuntimeError> {
    let bad = |why: &str| {
        Err(RuntimeError::Config(format!(
            "--http-address `{url}` {why}: it must be an absolute http:// or https:// URL with a \
             host, like http://node1.example:4437"
        )))
    };
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return bad("is not a URL");
    };
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return bad("has no http:// or https:// scheme");
    }
    let host = uri.host().unwrap_or("");
    if host.is_empty() {
        return bad("has no host");
    }
    let ip = host.trim_start_matches('[').trim_end_matches(']');
    if ip.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        return bad("names an unspecified address, which reaches nobody");
    }
    if uri.query().is_some() {
        return bad("has a query");
    }
    Ok(())
}

/// Runs a node until `shutdown` resolves (SIGINT/SIGTERM in the binary), then drains.
///
/// A process that failover fences (its heartbeat lapsed: paused, or cut off from the
/// database) rejoins in place: it drops the fenced incarnation without flushing anything (its
/// streams belong to other nodes now), registers a new, higher node epoch on the same
/// listeners, and serves again once that incarnation is up (docs/design/failover.md).
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RuntimeError> {
    run_with(
        config,
        shutdown,
        std::sync::Arc::new(startup::Startup::default()),
    )
    .await
}

/// [`run`], reporting the start's phases to `startup` (tests cut a store at a chosen phase
/// with [`startup::Startup::with_hook`] and wait with [`startup::Startup::until_up`]).
pub async fn run_with(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    startup: std::sync::Arc<startup::Startup>,
) -> Result<(), RuntimeError> {
    validate(&config)?;
    let wal_uri = config
        .wal
        .clone()
        .unwrap_or_else(|| config.storage.with_id(config.storage.id - 1));
    // First of all: another process on this WAL directory must find it taken before this one
    // cleans, registers or recovers anything. Held until the node has stopped.
    let wal_lock = stores::lock_wal(&wal_uri, config.node_id)?;
    // Before the engine exists, so recovery's WAL reads and first commits are recorded too.
    let metrics = metrics_handle();
    tokio::pin!(shutdown);
    let timeouts = listener::Timeouts {
        body_min_rate: config.body_min_rate,
        body_rate_grace: config.body_rate_grace,
        body_deadline: config.body_deadline,
        ..listener::Timeouts::default()
    };
    let extra_hosts = allowed_hosts(&config);
    let listen = listener::ListenOptions {
        http2_max_streams: config.http2_max_streams,
    };
    // Dropped on every early return, which stops the listeners already serving.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = Vec::new();
    // The admin listener first: while the stores are waited for, `/ready` says 503.
    if let Some(a) = config.admin_listen {
        let admin = TcpListener::bind(a)
            .await
            .map_err(|e| RuntimeError::Listen(format!("{a}: {e}")))?;
        let addr = admin
            .local_addr()
            .map_err(|e| RuntimeError::Listen(e.to_string()))?;
        servers.push(tokio::spawn(listener::serve(
            admin,
            startup.router(),
            listen,
            timeouts,
            host::HostPolicy::for_listener(addr, &extra_hosts),
            stop_rx.clone(),
        )));
        tracing::info!(addr = %addr, "admin listener ready");
    }
    let clock = pico_common::clock::system();
    let meta_url = config.meta_url.clone();
    // Only Postgres is waited for: a SQLite file that fails to open will not fix itself.
    let meta_waits = !meta_url.starts_with("sqlite:");
    let opened = startup
        .retry(
            &clock,
            "metadata store",
            |e: &pico_sql::MetaError| {
                meta_waits && matches!(e.kind(), pico_common::ErrorKind::Unavailable(_))
            },
            || MetaLog::open(&meta_url, MetaLogOptions::default()),
            &mut shutdown,
        )
        .await
        .map_err(|e| {
            let url = pico_common::uri::redact(&config.meta_url);
            RuntimeError::Startup(format!("metadata log `{url}`: {e}"))
        })?;
    let Some(meta) = opened else {
        tracing::info!("stopped while waiting for the metadata store");
        return Ok(());
    };
    let node_epoch = config
        .node_epoch
        .unwrap_or_else(|| next_node_epoch(&meta, config.node_id, now_ms()));
    let checked = startup
        .retry(
            &clock,
            "metadata store",
            |e: &RuntimeError| meta_waits && matches!(e, RuntimeError::Unreachable(_)),
            || check_cluster_id(&meta, &config.cluster_id),
            &mut shutdown,
        )
        .await?;
    if checked.is_none() {
        meta.close().await;
        tracing::info!("stopped while waiting for the metadata store");
        return Ok(());
    }
    let data = stores::object_storage(&config.storage).await?;
    let opened = startup
        .retry(
            &clock,
            "WAL",
            |e: &RuntimeError| matches!(e, RuntimeError::Unreachable(_)),
            || stores::wal(&wal_uri, config.node_id, node_epoch),
            &mut shutdown,
        )
        .await?;
    let Some(wal) = opened else {
        meta.close().await;
        tracing::info!("stopped while waiting for the WAL");
        return Ok(());
    };
    let peer_wals = stores::peer_wals(&wal_uri).await?;
    if peer_wals.is_none() {
        tracing::info!(
            "the WAL is on this node's own disk: no other node can recover it, so automatic \
             failover is off (a dead node's streams wait for it to restart)"
        );
    }
    let mut engine = stores::engine_config(&wal_uri)?;
    engine.log_cache_bytes = config.wal_cache_size;
    engine.block_cache_bytes = config.block_cache_size;

    let protocol = TcpListener::bind(config.listen)
        .await
        .map_err(|e| RuntimeError::Listen(format!("{}: {e}", config.listen)))?;
    let kafka = match config.kafka_listen {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|e| RuntimeError::Listen(format!("--kafka-listen {a}: {e}")))?,
        ),
        None => None,
    };
    let local = protocol
        .local_addr()
        .map_err(|e| RuntimeError::Listen(e.to_string()))?;
    let advertised = advertised_url(&config, local)?;
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
        peer_wals,
        ..NodeConfig::default()
    };
    // Registration and WAL recovery: a store that stops answering here (the metadata log, the
    // WAL's database or bucket, the data bucket) is waited for like one unreachable at open.
    // A failed attempt may have registered its epoch, so each retry registers a higher one
    // and opens the WAL again at it.
    let mut first_wal = Some(wal);
    let mut epoch = node_epoch;
    let started = startup
        .retry(
            &clock,
            "recovery",
            |e: &RuntimeError| matches!(e, RuntimeError::Unreachable(_)),
            || {
                let wal = first_wal.take();
                if wal.is_none() {
                    epoch = retry_node_epoch(&meta, &config, epoch, now_ms());
                }
                let cfg = NodeConfig {
                    node_epoch: epoch,
                    ..node_config.clone()
                };
                let (meta, data, engine, wal_uri) =
                    (meta.clone(), data.clone(), engine.clone(), &wal_uri);
                async move {
                    let wal = match wal {
                        Some(w) => w,
                        None => stores::wal(wal_uri, cfg.node_id, cfg.node_epoch).await?,
                    };
                    Node::start(cfg, meta, data, wal, engine)
                        .await
                        .map_err(|e| match e.is_transient() {
                            true => RuntimeError::Unreachable(e.to_string()),
                            false => RuntimeError::Startup(e.to_string()),
                        })
                }
            },
            &mut shutdown,
        )
        .await?;
    let Some(mut node) = started else {
        meta.close().await;
        tracing::info!("stopped while waiting for recovery");
        return Ok(());
    };

    let opts = pico_http::HttpOptions {
        routing_local: config.routing == Routing::Local,
        ds_at_root: config.protocol == RootProtocol::Ds,
        cors: pico_http::cors::CorsOrigins::parse(&config.cors_origins)
            .map_err(RuntimeError::Config)?,
    };
    let proto_app = Swap::new(pico_http::protocol_router(node.clone(), opts.clone()));
    servers.push(tokio::spawn(listener::serve(
        protocol,
        proto_app.clone(),
        listen,
        timeouts,
        host::HostPolicy::for_listener(local, &extra_hosts),
        stop_rx.clone(),
    )));
    tracing::info!(addr = %local, "protocol listener ready");
    // The routers are swapped when the node rejoins as a new incarnation; the listeners stay.
    let admin_app = Swap::new(pico_http::admin_router(node.clone(), metrics.clone()));
    startup.serve(admin_app.router());
    let mut kafka_server = match kafka {
        Some(kafka) => Some(KafkaServer::spawn(&config, kafka, &node)?),
        None => None,
    };

    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            _ = node.fenced_by_failover() => {}
        }
        // Fenced: this incarnation's streams were taken over. Drop it without flushing (what
        // failover did not commit was never acknowledged) and rejoin at a higher epoch.
        tracing::warn!("fenced by failover: rejoining as a new incarnation of this node");
        node.abandon().await;
        let mut attempt = 0u32;
        let rejoined = loop {
            let epoch = next_node_epoch(&meta, config.node_id, now_ms());
            let started = async {
                let wal = stores::wal(&wal_uri, config.node_id, epoch).await?;
                let cfg = NodeConfig {
                    node_epoch: epoch,
                    ..node_config.clone()
                };
                Node::start(cfg, meta.clone(), data.clone(), wal, engine.clone())
                    .await
                    .map_err(|e| RuntimeError::Startup(e.to_string()))
            };
            let result = tokio::select! {
                _ = &mut shutdown => None,
                r = started => Some(r),
            };
            match result {
                None => break None,
                Some(Ok(n)) => break Some(n),
                Some(Err(e)) => {
                    attempt = attempt.saturating_add(1);
                    tracing::warn!(error = %e, attempt, "rejoin failed; retrying");
                    tokio::select! {
                        _ = &mut shutdown => break None,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            }
        };
        let Some(new) = rejoined else {
            tracing::info!("stopped while rejoining");
            let _ = stop_tx.send(true);
            if let Some(k) = kafka_server.take() {
                k.stop().await;
            }
            drop(wal_lock);
            return Ok(());
        };
        node = new;
        proto_app.swap(pico_http::protocol_router(node.clone(), opts.clone()));
        admin_app.swap(pico_http::admin_router(node.clone(), metrics.clone()));
        if let Some(k) = kafka_server.take() {
            kafka_server = Some(k.restart(&config, &node).await?);
        }
        tracing::info!(
            node_epoch = node.config().node_epoch,
            "rejoined with a new node epoch"
        );
    }
    tracing::info!("shutting down");
    // Before the listeners close: other nodes serve this node's streams as soon as they are
    // released, instead of redirecting to an address about to close or waiting for failover.
    node.release_streams(config.shutdown_drain).await;
    let _ = stop_tx.send(true);
    if let Some(k) = kafka_server.take() {
        let _ = k.stop.send(true);
        servers.push(k.task);
    }
    let drain = tokio::time::sleep(config.shutdown_drain);
    tokio::pin!(drain);
    for s in servers {
        tokio::select! {
            _ = &mut drain => break,
            _ = s => {}
        }
    }
    node.shutdown().await;
    drop(wal_lock);
    tracing::info!("stopped");
    Ok(())
}

/// An app whose routes can be replaced while its listener keeps accepting (a rejoin swaps in
/// the new incarnation's).
#[derive(Clone)]
struct Swap<A>(std::sync::Arc<std::sync::RwLock<A>>);

impl<A: Clone> Swap<A> {
    fn new(app: A) -> Swap<A> {
        Swap(std::sync::Arc::new(std::sync::RwLock::new(app)))
    }

    fn swap(&self, app: A) {
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = app;
    }

    fn current(&self) -> A {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Swap<axum::Router> {
    /// A router that sends every request to the current one.
    fn router(&self) -> axum::Router {
        use tower::ServiceExt;
        let current = self.clone();
        axum::Router::new().fallback_service(tower::service_fn(
            move |req: axum::extract::Request| current.current().oneshot(req),
        ))
    }
}

/// Each request goes to the app current when it arrives.
impl<A: listener::App> listener::App for Swap<A> {
    fn call(
        &self,
        req: axum::extract::Request,
    ) -> impl std::future::Future<Output = axum::response::Response> + Send + use<A> {
        // Called on the app under the read lock rather than on a clone of it: the answer owns
        // what it needs (a clone of its own), and each clone of the app is an atomic on a
        // cache line every request shares.
        self.0.read().unwrap_or_else(|p| p.into_inner()).call(req)
    }
}

/// The Kafka listener and its broker, which is bound to one node incarnation: a rejoin stops
/// it and binds the same address again for the new one.
struct KafkaServer {
    addr: SocketAddr,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl KafkaServer {
    fn spawn(
        config: &Config,
        kafka: TcpListener,
        node: &Node,
    ) -> Result<KafkaServer, RuntimeError> {
        let addr = kafka
            .local_addr()
            .map_err(|e| RuntimeError::Listen(e.to_string()))?;
        let (host, port) = kafka_advertised(config, addr)?;
        let opts = pico_kafka::KafkaOptions {
            broker_id: i32::try_from(config.node_id).unwrap_or(i32::MAX),
            advertised_host: host,
            advertised_port: port,
            cluster_id: config.cluster_id.clone(),
            ..pico_kafka::KafkaOptions::default()
        };
        let broker = std::sync::Arc::new(pico_kafka::Broker::new(node.clone(), opts));
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(pico_kafka::serve(kafka, broker, stop_rx));
        tracing::info!(addr = %addr, "kafka listener ready");
        Ok(KafkaServer { addr, stop, task })
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
    }

    async fn restart(self, config: &Config, node: &Node) -> Result<KafkaServer, RuntimeError> {
        let addr = self.addr;
        self.stop().await;
        let kafka = TcpListener::bind(addr)
            .await
            .map_err(|e| RuntimeError::Listen(format!("--kafka-listen {addr}: {e}")))?;
        KafkaServer::spawn(config, kafka, node)
    }
}

/// The Kafka address clients are told to connect to: `--kafka-advertise host:port`, else the
/// bound address (loopback when bound to every interface).
fn kafka_advertised(config: &Config, bound: SocketAddr) -> Result<(String, i32), RuntimeError> {
    match &config.kafka_advertise {
        Some(a) => {
            let (host, port) = a.rsplit_once(':').ok_or_else(|| {
                RuntimeError::Config(format!("--kafka-advertise `{a}` must be host:port"))
            })?;
            let port: u16 = port
                .parse()
                .map_err(|_| RuntimeError::Config(format!("--kafka-advertise `{a}`: bad port")))?;
            let host = host.trim_start_matches('[').trim_end_matches(']');
            if host.is_empty() {
                return Err(RuntimeError::Config(format!(
                    "--kafka-advertise `{a}` must name a host"
                )));
            }
            Ok((host.to_string(), i32::from(port)))
        }
        None => {
            let ip = if bound.ip().is_unspecified() {
                IpAddr::from([127, 0, 0, 1])
            } else {
                bound.ip()
            };
            Ok((ip.to_string(), i32::from(bound.port())))
        }
    }
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

/// The epoch for another try at starting after one at `prev` failed: that one may have been
/// registered (its answer lost), so always above it. An explicit `--node-epoch` steps by one;
/// otherwise, as at any start, the clock unless the registered epoch is ahead of it.
fn retry_node_epoch(meta: &MetaLog, config: &Config, prev: u64, now_ms: i64) -> u64 {
    let above = prev.saturating_add(1);
    match config.node_epoch {
        Some(_) => above.max(
            meta.view()
                .nodes
                .get(&config.node_id)
                .map_or(0, |n| n.epoch.saturating_add(1)),
        ),
        None => next_node_epoch(meta, config.node_id, now_ms).max(above),
    }
}

/// The first node to start records the cluster id in the metadata log; every later start must
/// name the same one, so a node pointed at another cluster's database refuses to join it.
/// Recorded with a conditional command, so of two first starts racing on an empty log with
/// different ids exactly one wins and the other refuses.
async fn check_cluster_id(meta: &MetaLog, cluster_id: &str) -> Result<(), RuntimeError> {
    const KEY: &str = "cluster/id";
    let other = |stored: &[u8]| {
        RuntimeError::Config(format!(
            "this metadata log belongs to another cluster: stored=`{}` given=`{cluster_id}`",
            String::from_utf8_lossy(stored)
        ))
    };
    if let Some(stored) = meta.view().kv.get(KEY) {
        return if stored.as_slice() == cluster_id.as_bytes() {
            Ok(())
        } else {
            Err(other(stored))
        };
    }
    let recorded = meta
        .propose(pico_metadata::Command::KvInit {
            key: KEY.to_string(),
            value: cluster_id.as_bytes().to_vec(),
        })
        .await
        .map_err(|e| {
            let m = format!("recording the cluster id: {e}");
            match e.kind() {
                pico_common::ErrorKind::Unavailable(_) => RuntimeError::Unreachable(m),
                _ => RuntimeError::Startup(m),
            }
        })?;
    match recorded {
        Ok(_) => Ok(()),
        Err(pico_metadata::ApplyError::Conflict { .. }) => {
            // Recorded meanwhile: by another node, or by this one's earlier try whose answer
            // was lost (then it holds our id).
            let view = meta.view();
            match view.kv.get(KEY) {
                Some(stored) if stored.as_slice() == cluster_id.as_bytes() => Ok(()),
                stored => Err(other(stored.map_or(&[][..], |v| v.as_slice()))),
            }
        }
        Err(e) => Err(RuntimeError::Startup(format!(
            "recording the cluster id: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_advertises_the_flag_or_the_bound_address() {
        let bound: SocketAddr = "0.0.0.0:9092".parse().unwrap();
        let mut c = Config::default();
        assert_eq!(
            kafka_advertised(&c, bound).unwrap(),
            ("127.0.0.1".to_string(), 9092)
        );
        c.kafka_advertise = Some("kafka.example:19092".into());
        assert_eq!(
            kafka_advertised(&c, bound).unwrap(),
            ("kafka.example".to_string(), 19092)
        );
        c.kafka_advertise = Some("[::1]:9".into());
        assert_eq!(kafka_advertised(&c, bound).unwrap(), ("::1".to_string(), 9));
        for bad in ["nohost", ":9", "h:port"] {
            c.kafka_advertise = Some(bad.into());
            assert!(kafka_advertised(&c, bound).is_err(), "{bad}");
        }
    }

    fn refused(config: Config) -> String {
        match validate(&config) {
            Err(RuntimeError::Config(m)) => m,
            other => panic!("accepted: {other:?}"),
        }
    }

    /// Each of these used to reach the node: a deadline past `Instant`'s range panicked on
    /// each live read, 0 slots refused every stream, and an epoch at u64::MAX left a restart
    /// nothing to register above.
    #[test]
    fn numbers_out_of_range_are_refused() {
        validate(&Config::default()).unwrap();
        let huge = Duration::from_secs(u64::MAX);
        let m = refused(Config {
            long_poll_timeout: huge,
            ..Config::default()
        });
        assert!(m.contains("--long-poll-timeout-sec"), "{m}");
        let m = refused(Config {
            sse_max_duration: huge,
            ..Config::default()
        });
        assert!(m.contains("--sse-max-duration-sec"), "{m}");
        refused(Config {
            long_poll_timeout: MAX_LIVE_WAIT + Duration::from_secs(1),
            ..Config::default()
        });
        refused(Config {
            sse_max_duration: Duration::ZERO,
            ..Config::default()
        });
        validate(&Config {
            long_poll_timeout: MAX_LIVE_WAIT,
            sse_max_duration: Duration::from_millis(200),
            ..Config::default()
        })
        .unwrap();
        let m = refused(Config {
            slots: Some(0),
            ..Config::default()
        });
        assert!(m.contains("--slots"), "{m}");
        validate(&Config {
            slots: Some(1),
            ..Config::default()
        })
        .unwrap();
        let m = refused(Config {
            node_epoch: Some(u64::MAX),
            ..Config::default()
        });
        assert!(m.contains("--node-epoch"), "{m}");
        validate(&Config {
            node_epoch: Some(MAX_NODE_EPOCH),
            ..Config::default()
        })
        .unwrap();
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_wildcard_listen_advertises_the_host_name() {
        let wild = Config {
            listen: "0.0.0.0:4437".parse().unwrap(),
            insecure_allow_remote: true,
            ..Config::default()
        };
        validate(&wild).unwrap();
        let url = advertised_url(&wild, wild.listen).unwrap();
        let host = host_name().expect("a Linux host name");
        assert_eq!(url, format!("http://{host}:4437"));
        let local: SocketAddr = "127.0.0.1:9".parse().unwrap();
        assert_eq!(
            advertised_url(&Config::default(), local).unwrap(),
            "http://127.0.0.1:9"
        );
        let given = Config {
            http_address: Some("http://10.1.2.3:4437".into()),
            ..wild.clone()
        };
        validate(&given).unwrap();
        assert_eq!(
            advertised_url(&given, wild.listen).unwrap(),
            "http://10.1.2.3:4437"
        );
        let m = refused(Config {
            http_address: Some("10.1.2.3:4437".into()),
            ..wild
        });
        assert!(m.contains("http://"), "{m}");
    }
}
