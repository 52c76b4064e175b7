//! Figures of the metadata log for the cluster page (docs/performance.md, "Cluster"); run by
//! `scripts/bench/cluster.sh`, not by CI.
//!
//! ```text
//! meta_bench propose URL [N]   sequential proposals (one 100-byte KvPut each): p50/p99 latency
//! meta_bench wake URL [N]      two logs on one Postgres database: a command proposed on one,
//!                              the time until the other applied it, woken by LISTEN/NOTIFY and
//!                              by polling alone (a store that never signals)
//! meta_bench fill URL STREAMS  creates STREAMS streams in large batches (one row per 5,000
//!                              creates), then waits for a snapshot
//! meta_bench open URL          opens the log (snapshot load + replay) and reports the time
//! ```
//!
//! Prints one `key value` line per figure (times in microseconds unless named `_ms`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pico_metadata::{Command, Initial, StreamConfig};
use pico_sql::store::{LogRow, LogStore, SnapshotMeta, open_store};
use pico_sql::{MetaError, MetaLog, MetaLogOptions};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[tokio::main]
async fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: meta_bench propose|wake|fill|open URL [N]";
    let (cmd, url) = match (args.get(1), args.get(2)) {
        (Some(c), Some(u)) => (c.as_str(), u.as_str()),
        _ => return Err(usage.into()),
    };
    let n: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(0);
    match cmd {
        "propose" => propose(url, if n == 0 { 2_000 } else { n }).await,
        "wake" => wake(url, if n == 0 { 300 } else { n }).await,
        "fill" => fill(url, n).await,
        "open" => open(url).await,
        _ => Err(usage.into()),
    }
}

fn kv(i: usize) -> Command {
    Command::KvPut {
        key: format!("bench/{}", i % 64),
        value: vec![b'x'; 100],
    }
}

/// p50 and p99 of `samples` (µs), printed as `{name}_p50_us` and `{name}_p99_us`.
fn report(name: &str, samples: &mut [u64]) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!("{name}_p50_us {}", at(0.50));
    println!("{name}_p99_us {}", at(0.99));
    println!("{name}_n {}", samples.len());
}

async fn propose(url: &str, n: usize) -> Res<()> {
    let log = MetaLog::open(url, MetaLogOptions::default()).await?;
    for i in 0..50 {
        log.propose(kv(i)).await??;
    }
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        log.propose(kv(i)).await??;
        samples.push(t.elapsed().as_micros() as u64);
    }
    report("propose", &mut samples);
    log.close().await;
    Ok(())
}

/// Delegates to a store but never signals appends: the tailer finds other writers' rows only
/// at its poll interval (what a node without LISTEN/NOTIFY would do).
struct PollOnly(Arc<dyn LogStore>);

#[async_trait]
impl LogStore for PollOnly {
    async fn append(&self, payload: &[u8], count: u32, now_ms: i64) -> Result<i64, MetaError> {
        self.0.append(payload, count, now_ms).await
    }
    async fn read_after(&self, after_id: i64, limit: u32) -> Result<Vec<LogRow>, MetaError> {
        self.0.read_after(after_id, limit).await
    }
    async fn snapshots(&self) -> Result<Vec<SnapshotMeta>, MetaError> {
        self.0.snapshots().await
    }
    async fn load_snapshot(&self, applied_index: u64) -> Result<Option<Vec<u8>>, MetaError> {
        self.0.load_snapshot(applied_index).await
    }
    async fn discard_snapshot(
        &self,
        applied_index: u64,
        payload: &[u8],
    ) -> Result<bool, MetaError> {
        self.0.discard_snapshot(applied_index, payload).await
    }
    async fn write_snapshot(
        &self,
        meta: SnapshotMeta,
        payload: &[u8],
        keep: u32,
        now_ms: i64,
    ) -> Result<u64, MetaError> {
        self.0.write_snapshot(meta, payload, keep, now_ms).await
    }
    async fn try_acquire_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool, MetaError> {
        self.0.try_acquire_lease(name, holder, ttl_ms, now_ms).await
    }
    async fn renew_lease(
        &self,
        name: &str,
        holder: &str,
        ttl_ms: i64,
        now_ms: i64,
    ) -> Result<bool, MetaError> {
        self.0.renew_lease(name, holder, ttl_ms, now_ms).await
    }
    async fn release_lease(&self, name: &str, holder: &str) -> Result<bool, MetaError> {
        self.0.release_lease(name, holder).await
    }
    async fn lease(&self, name: &str) -> Result<Option<(String, i64)>, MetaError> {
        self.0.lease(name).await
    }
    async fn ping(&self) -> Result<(), MetaError> {
        self.0.ping().await
    }
    async fn close(&self) {
        self.0.close().await
    }
}

/// Proposes on `a`, waits until `b` applied it: time from the proposal and from `a`'s
/// acknowledgement (the command committed) to `b` having applied it.
async fn cross(a: &MetaLog, b: &MetaLog, n: usize, name: &str, spread_ms: u64) -> Res<()> {
    let mut from_propose = Vec::with_capacity(n);
    let mut from_commit = Vec::with_capacity(n);
    let mut applied = b.subscribe();
    for i in 0..n {
        let t = Instant::now();
        a.propose(kv(i)).await??;
        let committed = Instant::now();
        let target = a.applied_index();
        while b.applied_index() < target {
            tokio::time::timeout(Duration::from_secs(10), applied.changed()).await??;
        }
        let done = Instant::now();
        from_propose.push((done - t).as_micros() as u64);
        from_commit.push((done - committed).as_micros() as u64);
        // Spread the proposals over the poll interval's phase (a fixed pause would keep each
        // proposal at the same distance from the next poll).
        let pause = (i as u64).wrapping_mul(7_919) % spread_ms.max(1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    report(
        &format!("{name}_commit_to_applied_elsewhere"),
        &mut from_commit,
    );
    report(
        &format!("{name}_propose_to_applied_elsewhere"),
        &mut from_propose,
    );
    Ok(())
}

async fn wake(url: &str, n: usize) -> Res<()> {
    let a = MetaLog::open(url, MetaLogOptions::default()).await?;
    let b = MetaLog::open(url, MetaLogOptions::default()).await?;
    cross(&a, &b, n, "notify", 10).await?;
    b.close().await;
    // Polling alone, at the default backstop interval (1 s) and at 100 ms.
    for (label, every) in [("poll_1s", 1_000), ("poll_100ms", 100)] {
        let opts = MetaLogOptions {
            poll_interval: Duration::from_millis(every),
            ..MetaLogOptions::default()
        };
        let store: Arc<dyn LogStore> = Arc::new(PollOnly(open_store(url).await?));
        let polled = MetaLog::with_store(store, opts).await?;
        cross(&a, &polled, n / 3, label, every).await?;
        polled.close().await;
    }
    a.close().await;
    Ok(())
}

async fn fill(url: &str, streams: usize) -> Res<()> {
    let log = MetaLog::open(url, MetaLogOptions::default()).await?;
    let config = StreamConfig {
        content_type: Arc::from("application/octet-stream"),
        ttl_secs: None,
        expires_at_ms: None,
    };
    let t = Instant::now();
    let batch = 5_000;
    let mut made = 0;
    while made < streams {
        let cmds: Vec<Command> = (made..(made + batch).min(streams))
            .map(|i| Command::CreateStream {
                name: format!("fill/{i:08}"),
                config: config.clone(),
                closed: false,
                initial: Initial::None,
                now_ms: 0,
            })
            .collect();
        made += cmds.len();
        for outcome in log.propose_many(cmds).await? {
            outcome?;
        }
    }
    println!("fill_streams {streams}");
    println!("fill_ms {}", t.elapsed().as_millis());
    // A snapshot past the creates, so that a restart loads it rather than replaying them all.
    let t = Instant::now();
    let deadline = t + Duration::from_secs(1_800);
    let filled = log.applied_index();
    while log.snapshot_stats().last_index < filled {
        if Instant::now() > deadline {
            return Err("no snapshot within 30 minutes".into());
        }
        // A snapshot is due after enough commands (an eighth of the entries in a large
        // state); propose cheap ones, a row of 1,000 at a time, until one is written.
        for outcome in log.propose_many((0..1_000).map(kv).collect()).await? {
            outcome?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    println!("fill_snapshot_wait_ms {}", t.elapsed().as_millis());
    println!("fill_snapshot_index {}", log.snapshot_stats().last_index);
    log.close().await;
    Ok(())
}

async fn open(url: &str) -> Res<()> {
    let t = Instant::now();
    let log = MetaLog::open(url, MetaLogOptions::default()).await?;
    println!("open_ms {}", t.elapsed().as_millis());
    println!("open_streams {}", log.view().streams.len());
    println!("open_applied_index {}", log.applied_index());
    log.close().await;
    Ok(())
}
