//! Runtime configuration: everything `pico serve` accepts, already parsed.

use pico_common::BucketUri;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Whether 307 redirects to the owner are sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    Redirect,
    Local,
}

/// Which protocol the root of the protocol listener speaks (Durable Streams is always also
/// served under `/v1/stream/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootProtocol {
    Pico,
    Ds,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthMode {
    Off,
    Required,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub node_id: u32,
    /// None = the start time in ms, or one above the epoch this node id last registered if
    /// the clock is behind it (grows across restarts).
    pub node_epoch: Option<u64>,
    pub listen: SocketAddr,
    /// None = no admin listener (`--no-admin`).
    pub admin_listen: Option<SocketAddr>,
    /// None = no Kafka listener (`--no-kafka`).
    pub kafka_listen: Option<SocketAddr>,
    /// `host:port` Kafka clients are told to connect to; None = the bound address.
    pub kafka_advertise: Option<String>,
    /// Advertised URL of the protocol listener; None = `http://{listen}`.
    pub http_address: Option<String>,
    /// `sqlite:./data/meta.db`, `sqlite::memory:`, `postgres://…`.
    pub meta_url: String,
    /// Object storage for data objects.
    pub storage: BucketUri,
    /// WAL location; None = `storage` with bucket id − 1.
    pub wal: Option<BucketUri>,
    pub cluster_id: String,
    pub routing: Routing,
    pub protocol: RootProtocol,
    pub slots: Option<u32>,
    pub long_poll_timeout: Duration,
    pub sse_max_duration: Duration,
    pub max_chunk_size: usize,
    pub max_request_size: usize,
    pub shutdown_drain: Duration,
    /// HTTP/2 streams (e.g. SSE tailers) one connection may have open at once.
    pub http2_max_streams: u32,
    pub wal_cache_size: usize,
    pub block_cache_size: usize,
    pub auth: AuthMode,
    pub insecure_allow_remote: bool,
    pub auth_bootstrap_token: Option<String>,
    pub auth_bootstrap_token_file: Option<PathBuf>,
    /// `--cors-origins`: web origins granted CORS on the protocol listener (`*`, or exact
    /// `scheme://host[:port]` origins); empty = none.
    pub cors_origins: Vec<String>,
    /// `--allowed-hosts`: `Host` names a loopback listener answers besides loopback names.
    pub allowed_hosts: Vec<String>,
    /// Request body limits (see `guard::BodyLimits`): least average rate in bytes/s after the
    /// grace period (0: none), and longest time for a whole body.
    pub body_min_rate: u64,
    pub body_rate_grace: Duration,
    pub body_deadline: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            node_id: 1,
            node_epoch: None,
            listen: SocketAddr::from(([127, 0, 0, 1], 4437)),
            admin_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9090))),
            kafka_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9092))),
            kafka_advertise: None,
            http_address: None,
            meta_url: "sqlite:./data/meta.db".to_string(),
            storage: BucketUri {
                id: -2,
                scheme: pico_common::Scheme::File,
                location: "./objects".to_string(),
                params: Default::default(),
            },
            wal: None,
            cluster_id: "picomq".to_string(),
            routing: Routing::Redirect,
            protocol: RootProtocol::Pico,
            slots: None,
            long_poll_timeout: Duration::from_secs(25),
            sse_max_duration: Duration::from_secs(55),
            max_chunk_size: 64 * 1024,
            max_request_size: 32 * 1024 * 1024,
            shutdown_drain: Duration::from_secs(5),
            http2_max_streams: 1024,
            wal_cache_size: 128 * 1024 * 1024,
            block_cache_size: 64 * 1024 * 1024,
            auth: AuthMode::Off,
            insecure_allow_remote: false,
            auth_bootstrap_token: None,
            auth_bootstrap_token_file: None,
            cors_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            body_min_rate: crate::listener::BODY_MIN_RATE,
            body_rate_grace: crate::listener::BODY_RATE_GRACE,
            body_deadline: crate::listener::BODY_DEADLINE,
        }
    }
}
