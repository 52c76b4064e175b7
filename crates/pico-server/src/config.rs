//! Node configuration (what `pico serve` flags become once parsed).

use pico_common::clock::SharedClock;
use std::sync::Arc;
use std::time::Duration;

/// Opens another node's WAL for failover (docs/design/failover.md): the runtime provides one
/// when the WAL is shared storage every node reaches (Postgres, object storage); a local
/// file WAL has none, and failover is off.
#[async_trait::async_trait]
pub trait PeerWals: Send + Sync + std::fmt::Debug {
    /// Node `node_id`'s WAL, opened at `fence_epoch` (the epoch failover registered for it):
    /// a WAL that fences by epoch (Postgres) refuses the fenced process's appends from the
    /// moment this returns, and any append it acknowledged is readable through the handle.
    async fn open(&self, node_id: u32, fence_epoch: u64) -> Result<Arc<dyn s3stream::Wal>, String>;
}

#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_id: u32,
    /// This incarnation's node epoch; must grow across restarts (the runtime's default: start
    /// time in ms, kept above the last registered epoch).
    pub node_epoch: u64,
    /// Advertised base URL of the protocol listener (for 307 redirects).
    pub advertised_url: String,
    /// Longest a long-poll read waits before 204.
    pub long_poll_timeout: Duration,
    /// Longest an SSE response stays open.
    pub sse_max_duration: Duration,
    /// Largest body one read response carries (bytes).
    pub max_chunk_size: usize,
    /// Largest accepted request body (bytes); larger → 413.
    pub max_request_size: usize,
    /// Records returned by one read when the client gives no count.
    pub default_read_records: usize,
    /// Streams not touched for this long are released by their owner (engine state dropped).
    pub idle_release: Duration,
    /// Most streams this node keeps open at once (`--slots`); None = unlimited. A request that
    /// would open one more gets 503 until idle streams are released.
    pub slots: Option<u32>,
    /// Plain-http webhook URLs to loopback hosts are accepted (local development). True only
    /// when the protocol listener itself is bound to loopback, so an exposed node cannot be
    /// made to call its own local services.
    pub allow_local_webhooks: bool,
    /// Longest an append waits for its stream's turn and the engine's queue space together
    /// (storage stalled or not keeping up); then 503.
    pub submit_timeout: Duration,
    /// Longest an append that arrived ahead of its producer's earlier batches waits for them
    /// before it is answered as a sequence gap. Pipelined requests overtake each other by well
    /// under a millisecond; a real gap (a lost batch, a client bug) costs this much more.
    pub reorder_wait: Duration,
    /// How often this node proposes a heartbeat through the metadata log.
    pub heartbeat_every: Duration,
    /// A node whose heartbeat has not been accepted for this long is not live: it stops
    /// counting itself ready, and other nodes may count it gone.
    pub liveness_timeout: Duration,
    /// Expiry of the maintenance lease; its holder renews it every third of it.
    pub lease_ttl: Duration,
    /// Other nodes' WALs, for failover; None = no failover (a local WAL no other node reads).
    pub peer_wals: Option<Arc<dyn PeerWals>>,
    /// Where wall time comes from (TTL, expiry, producer ageing, idle release); tests pass a
    /// manual clock.
    pub clock: SharedClock,
}

impl Default for NodeConfig {
    fn default() -> Self {
        NodeConfig {
            node_id: 1,
            node_epoch: 0,
            advertised_url: "http://127.0.0.1:4437".to_string(),
            long_poll_timeout: Duration::from_secs(25),
            sse_max_duration: Duration::from_secs(55),
            max_chunk_size: 64 * 1024,
            max_request_size: 32 * 1024 * 1024,
            default_read_records: 1000,
            idle_release: Duration::from_secs(60),
            slots: None,
            allow_local_webhooks: true,
            submit_timeout: Duration::from_secs(30),
            reorder_wait: Duration::from_millis(20),
            heartbeat_every: Duration::from_secs(1),
            liveness_timeout: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(10),
            peer_wals: None,
            clock: pico_common::clock::system(),
        }
    }
}
