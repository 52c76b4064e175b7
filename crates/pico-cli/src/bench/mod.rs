//! `pico bench`: a load generator for the Pico, Durable Streams and Kafka protocols.
//!
//! - [`target`]: request shapes of each protocol (create, append, producer answers).
//! - [`writer`]: plain append loops and pipelined idempotent producers.
//! - [`reader`]: tailers measuring append→delivery latency (long-poll or SSE).
//! - [`sse_conn`]: the SSE tailers' connections (HTTP/1.1 and HTTP/2, a task per connection).
//! - [`append_conn`]: the plain append loops' HTTP/1.1 connections (hyper, no pool).
//! - [`kafka`]: `--protocol kafka`, pipelined Produce requests (acks=all) over the Kafka wire.
//! - [`payload`]: record bodies stamped with their send time.
//! - [`stats`]: counters, HDR histograms, the report.
//! - [`sse`]: an incremental event-stream parser.
//! - [`machine`]: the machine's load during the run (hypervisor steal, busy cores, I/O stalls).
//!
//! Phases: create the streams, connect the readers, then writers run for `--warmup` (not
//! counted) and `--duration` (counted); bytes count when acknowledged. A progress line goes to
//! stderr every second, the report to stdout.

mod append_conn;
mod kafka;
mod machine;
mod payload;
mod reader;
mod redirect;
mod sse;
mod sse_conn;
mod stats;
mod target;
mod writer;

use crate::cli::Protocol;
use crate::size::parse_size;
use anyhow::{Context, bail};
use clap::builder::BoolishValueParser;
use clap::{Args, ValueEnum};
use futures::StreamExt;
use payload::now_us;
use stats::{Counters, Latencies, Percentiles, Report, Throughput};
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use target::Target;
use tokio::sync::watch;

/// Streams created concurrently during setup.
const CREATE_CONCURRENCY: usize = 32;
/// Longest wait for every reader to be connected before writing starts.
const READERS_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReadMode {
    Sse,
    LongPoll,
}

/// `pico bench` flags (the endpoint, protocol, HTTP/2 and token are global flags).
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Records per append request.
    #[arg(short = 'n', long = "batch", env = "PICO_BENCH_BATCH", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub batch: u32,
    /// Bytes per record (bytes, or KiB/MiB); ≥ 16 to measure end-to-end latency.
    #[arg(short = 'b', long = "record-size", env = "PICO_BENCH_RECORD_SIZE", default_value = "100", value_parser = parse_size)]
    pub record_size: usize,
    /// Requests in flight per connection (per producer with --producer).
    #[arg(short = 'w', long = "in-flight", env = "PICO_BENCH_IN_FLIGHT", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub in_flight: u32,
    /// HTTP clients; over HTTP/1.1 each in-flight request uses its own socket.
    #[arg(long, env = "PICO_BENCH_CONNECTIONS", default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub connections: u32,
    /// Streams written, round-robin (with --producer, producer i writes stream i).
    #[arg(long, env = "PICO_BENCH_STREAMS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub streams: u32,
    /// Measured time (e.g. 10s, 500ms, 1m).
    #[arg(short = 'd', long, env = "PICO_BENCH_DURATION", default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured time before the measurement.
    #[arg(long, env = "PICO_BENCH_WARMUP", default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Cap the write rate (MiB/s); a writer behind schedule measures latency from the scheduled
    /// send time, so a server that falls behind is not hidden.
    #[arg(long, env = "PICO_BENCH_TARGET_MIBPS")]
    pub target_mibps: Option<f64>,
    /// Idempotent producers (one per connection, pipelined: --in-flight batches each).
    #[arg(long, env = "PICO_BENCH_PRODUCER", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub producer: bool,
    /// Tailers following the streams (reader i follows stream i mod --streams).
    #[arg(long, env = "PICO_BENCH_READERS", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    pub readers: u32,
    /// HTTP clients the readers share [default: --connections]. Over HTTP/1.1 every reader holds
    /// its own socket anyway; over HTTP/2 each client is one connection multiplexing its readers.
    #[arg(long, env = "PICO_BENCH_READER_CONNECTIONS", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub reader_connections: Option<u32>,
    /// How readers follow [default: long-poll for pico, sse for ds].
    #[arg(long, env = "PICO_BENCH_READ_MODE", value_enum)]
    pub read_mode: Option<ReadMode>,
    /// Stream name prefix [default: bench/<pid>-<time>].
    #[arg(long, env = "PICO_BENCH_PREFIX")]
    pub prefix: Option<String>,
    /// Only create the streams (e.g. to measure a server holding many idle streams), then exit.
    #[arg(long, env = "PICO_BENCH_CREATE_ONLY", value_parser = BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub create_only: bool,
    #[arg(long, env = "PICO_BENCH_OUTPUT", value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

/// `10s`, `500ms`, `1m`, or plain seconds (`2.5`).
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let s = raw.trim();
    let (num, unit) = match s.find(|c: char| c.is_ascii_alphabetic()) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("bad duration: `{raw}` (use e.g. 10s, 500ms, 1m)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        _ => return Err(format!("bad duration unit: `{raw}` (ms, s or m)")),
    };
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("bad duration: `{raw}`"));
    }
    // The run's clock is in microseconds since start; a year keeps every sum of them far
    // from overflowing.
    if secs > MAX_DURATION.as_secs_f64() {
        return Err(format!("duration too long: `{raw}` (at most 365 days)"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Longest --duration or --warmup.
const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

/// Global rate limit shared by all writers.
pub struct Pacer {
    /// Set when the writers start.
    start_us: AtomicU64,
    bytes_per_us: f64,
    reserved: AtomicU64,
}

/// What every writer and reader task shares.
pub struct Ctx {
    target: Target,
    streams: Vec<String>,
    run_id: String,
    batch: usize,
    record_size: usize,
    in_flight: usize,
    http2: bool,
    token: Option<String>,
    pacer: Option<Pacer>,
    counters: Counters,
    lat: Latencies,
    /// Measurement window in `now_us` time; u64::MAX until writers start.
    measure_start: AtomicU64,
    measure_end: AtomicU64,
    stop: watch::Receiver<bool>,
    readers_connected: AtomicUsize,
}

impl Ctx {
    fn in_window(&self, t: u64) -> bool {
        t >= self.measure_start.load(Ordering::Relaxed)
            && t < self.measure_end.load(Ordering::Relaxed)
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }
}

/// Global flags the bench uses.
pub struct Global {
    pub endpoint: String,
    pub protocol: Protocol,
    pub http2: bool,
    pub token: Option<String>,
}

fn http_client(http2: bool, token: Option<&str>) -> anyhow::Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = token {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {t}")
                .parse()
                .context("token not allowed in a header")?,
        );
    }
    // Redirects are followed by hand (`redirect`), keeping the token across nodes.
    let mut b = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(90))
        .default_headers(headers);
    if http2 {
        b = b.http2_prior_knowledge();
    }
    Ok(b.build()?)
}

pub async fn run(args: BenchArgs, global: Global) -> anyhow::Result<()> {
    let readers = args.readers as usize;
    if readers > 0 && args.record_size < payload::STAMP_LEN {
        bail!(
            "--readers needs --record-size ≥ {} (records carry their send time)",
            payload::STAMP_LEN
        );
    }
    if args.record_size == 0 {
        bail!("--record-size must be at least 1 byte");
    }
    // A zero-length measurement would print a report of nothing that reads like a result.
    if args.duration.is_zero() && !args.create_only {
        bail!("--duration must be longer than 0 (e.g. 10s)");
    }
    if let Some(t) = args.target_mibps
        && !(t > 0.0 && t.is_finite())
    {
        bail!("--target-mibps must be a positive number");
    }
    // A producer's sequence numbers belong to one stream: producer i writes stream i only.
    if args.producer && args.streams > args.connections {
        bail!(
            "--producer runs one producer per connection, each on its own stream: \
             --streams {} needs --connections ≥ {} (or fewer streams)",
            args.streams,
            args.streams
        );
    }
    let kafka = global.protocol == Protocol::Kafka;
    if kafka {
        // The Kafka load is plain acks=all Produce requests; readers, HTTP/2 and HTTP
        // idempotent producers have no Kafka form here.
        for (set, flag) in [
            (args.producer, "--producer"),
            (readers > 0, "--readers"),
            (global.http2, "--http2"),
        ] {
            if set {
                bail!("{flag} is not supported with --protocol kafka");
            }
        }
    }
    let read_mode = args.read_mode.unwrap_or(match global.protocol {
        Protocol::Pico | Protocol::Kafka => ReadMode::LongPoll,
        Protocol::Ds => ReadMode::Sse,
    });
    let target = if kafka {
        Target::new(Protocol::Kafka, &kafka::bootstrap(&global.endpoint)?)
    } else {
        Target::new(global.protocol, &global.endpoint)
    };
    let run_id = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0)
    );
    let prefix = args
        .prefix
        .clone()
        .unwrap_or_else(|| format!("bench/{run_id}"));
    let prefix = prefix.trim_matches('/').to_string();
    // Kafka topics cannot hold `/`: `bench/1-2/s0` is the topic `bench-1-2-s0`.
    let streams: Vec<String> = (0..args.streams)
        .map(|i| format!("{prefix}/s{i}"))
        .map(|s| if kafka { kafka::topic_name(&s) } else { s })
        .collect();

    let connections = args.connections as usize;
    let clients: Vec<reqwest::Client> = if kafka {
        Vec::new()
    } else {
        (0..connections)
            .map(|_| http_client(global.http2, global.token.as_deref()))
            .collect::<anyhow::Result<_>>()?
    };

    let setup = Instant::now();
    let mut kafka_addr = None;
    if kafka {
        let addr = kafka::resolve(&target.base).await?;
        if let Err(e) = kafka::create_topics(addr, &streams).await {
            bail!("setup failed: {e}");
        }
        kafka_addr = Some(addr);
    } else if let Err(e) = create_all(&target, &clients, &streams).await {
        bail!("setup failed: {e}");
    }
    let setup_secs = setup.elapsed().as_secs_f64();
    if args.create_only {
        let summary = serde_json::json!({"streams": streams.len(), "setup_secs": setup_secs});
        match args.output {
            OutputFormat::Text => println!("created {} streams in {setup_secs:.1}s", streams.len()),
            OutputFormat::Json => println!("{summary}"),
        }
        return Ok(());
    }

    let (stop_tx, stop_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        target,
        streams,
        run_id,
        batch: args.batch as usize,
        record_size: args.record_size,
        in_flight: args.in_flight as usize,
        http2: global.http2,
        token: global.token.clone(),
        pacer: args.target_mibps.map(|mibps| Pacer {
            start_us: AtomicU64::new(0),
            bytes_per_us: mibps * stats::MIB / 1e6,
            reserved: AtomicU64::new(0),
        }),
        counters: Counters::default(),
        lat: Latencies::default(),
        measure_start: AtomicU64::new(u64::MAX),
        measure_end: AtomicU64::new(u64::MAX),
        stop: stop_rx,
        readers_connected: AtomicUsize::new(0),
    });

    // The bench's own connections (SSE readers, HTTP/1.1 append loops) share one resolution
    // of the endpoint: with several addresses it probes for the one that accepts.
    let own_endpoint = tokio::sync::OnceCell::<Arc<sse_conn::Endpoint>>::new();

    // Readers first, so they are following the tail before the first append.
    let mut reader_tasks = Vec::new();
    if readers > 0 {
        // Readers get their own connections: over HTTP/1.1 each holds one anyway.
        let n = args
            .reader_connections
            .map_or(connections, |n| n as usize)
            .min(readers);
        // Over HTTP/2 the readers past the server's per-connection stream limit would wait for
        // the whole run (in reqwest's queue for long-poll, unopened for SSE) and the run would
        // measure without them, so the limit is read first and setup stops if it is too low.
        if global.http2 && global.endpoint.starts_with("http://") {
            let ep = own_endpoint
                .get_or_try_init(|| resolve_own(&global))
                .await?;
            let limit = sse_conn::h2_stream_limit(ep, &global.endpoint)
                .await
                .map_err(|e| anyhow::anyhow!("reading the server's HTTP/2 limits: {e}"))?;
            if readers.div_ceil(n) > limit {
                return Err(too_many_h2_readers(limit, readers, n));
            }
        }
        match read_mode {
            ReadMode::LongPoll => {
                let reader_clients: Vec<reqwest::Client> = (0..n)
                    .map(|_| http_client(global.http2, global.token.as_deref()))
                    .collect::<anyhow::Result<_>>()?;
                for i in 0..readers {
                    let http = reader_clients[i % n].clone();
                    reader_tasks.push(tokio::spawn(reader::run(ctx.clone(), http, i)));
                }
            }
            ReadMode::Sse => {
                let ep = own_endpoint
                    .get_or_try_init(|| resolve_own(&global))
                    .await?
                    .clone();
                if global.http2 {
                    let mut groups: Vec<Vec<reader::SseTail>> =
                        (0..n).map(|_| Vec::new()).collect();
                    for i in 0..readers {
                        groups[i % n].push(reader::SseTail::new(ctx.clone(), i));
                    }
                    for g in groups {
                        let t = sse_conn::h2_tailers(ep.clone(), g);
                        reader_tasks.push(tokio::spawn(t));
                    }
                } else {
                    for i in 0..readers {
                        let tail = reader::SseTail::new(ctx.clone(), i);
                        let t = sse_conn::h1_tailer(ctx.clone(), ep.clone(), tail);
                        reader_tasks.push(tokio::spawn(t));
                    }
                }
            }
        }
        let deadline = Instant::now() + READERS_CONNECT_TIMEOUT;
        while ctx.readers_connected.load(Ordering::Relaxed) < readers {
            if Instant::now() > deadline {
                // Over HTTP/2 a server's limit on streams per connection (often 100–250) holds
                // the streams beyond it back for as long as the others stay open.
                let hint = if global.http2 {
                    format!(
                        " ({} per HTTP/2 connection: if the server allows fewer, raise --reader-connections)",
                        readers.div_ceil(n)
                    )
                } else {
                    String::new()
                };
                eprintln!(
                    "bench: only {}/{readers} readers connected after {}s{hint}; starting anyway",
                    ctx.readers_connected.load(Ordering::Relaxed),
                    READERS_CONNECT_TIMEOUT.as_secs()
                );
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // A long-poll or SSE request answered its headers; give the server a moment to
        // register the waiter behind it.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The pacer and the window are fixed now that writing starts.
    let start = now_us();
    let cpu_start = process_cpu_secs();
    let machine_start = machine::Sample::now();
    let warmup_us = args.warmup.as_micros() as u64;
    let duration_us = args.duration.as_micros() as u64;
    ctx.measure_start
        .store(start + warmup_us, Ordering::Relaxed);
    ctx.measure_end
        .store(start + warmup_us + duration_us, Ordering::Relaxed);
    if let Some(p) = &ctx.pacer {
        p.start_us.store(start, Ordering::Relaxed);
    }

    let mut writer_tasks = Vec::new();
    if let Some(addr) = kafka_addr {
        for c in 0..connections {
            writer_tasks.push(tokio::spawn(kafka::producer_loop(
                ctx.clone(),
                addr,
                c,
                connections,
            )));
        }
    } else if args.producer {
        for (c, http) in clients.iter().enumerate() {
            match global.protocol {
                Protocol::Pico => {
                    let client = writer::pico_client(&ctx)?;
                    writer_tasks.push(tokio::spawn(writer::pico_producer_loop(
                        ctx.clone(),
                        client,
                        c,
                    )));
                }
                Protocol::Ds => writer_tasks.push(tokio::spawn(writer::ds_producer_loop(
                    ctx.clone(),
                    http.clone(),
                    c,
                ))),
                // Refused at the start; Kafka connections are started above.
                Protocol::Kafka => {}
            }
        }
    } else {
        let loops = connections * ctx.in_flight;
        // Over HTTP/1.1 each loop has a socket either way (reqwest's pool opened one per
        // request in flight); the bench's own connections cost the server's machine less.
        let h1 = if !global.http2 && global.endpoint.starts_with("http://") {
            Some(
                own_endpoint
                    .get_or_try_init(|| resolve_own(&global))
                    .await?
                    .clone(),
            )
        } else {
            None
        };
        for k in 0..loops {
            let transport = match &h1 {
                Some(ep) => writer::Transport::H1(append_conn::Appender::new(ep.clone())),
                None => writer::Transport::Reqwest(clients[k % connections].clone()),
            };
            writer_tasks.push(tokio::spawn(writer::plain_loop(
                ctx.clone(),
                transport,
                k,
                loops,
            )));
        }
    }

    progress(&ctx, start, warmup_us, duration_us).await;
    let client_cpu_secs = process_cpu_secs() - cpu_start;
    let client_cpu_cores = client_cpu_secs / ((now_us() - start) as f64 / 1e6).max(1e-9);
    let machine = machine_start
        .zip(machine::Sample::now())
        .map(|(a, b)| a.load_until(&b));
    let _ = stop_tx.send(true);
    // Tailers wait on reads that may never end; they record as they go, so stop them outright.
    for t in &reader_tasks {
        t.abort();
    }
    let grace = tokio::time::sleep(Duration::from_secs(5));
    tokio::pin!(grace);
    for t in writer_tasks.into_iter().chain(reader_tasks) {
        tokio::select! {
            _ = t => {},
            _ = &mut grace => break,
        }
    }
    // Let producer completion tasks that finished in the window merge their samples.
    tokio::time::sleep(Duration::from_millis(50)).await;

    let measured = ctx.counters.snapshot();
    let secs = args.duration.as_secs_f64().max(1e-9);
    let report = Report {
        protocol: ctx.target.name(),
        http: if kafka {
            "Kafka TCP (acks=all)"
        } else if global.http2 {
            "HTTP/2"
        } else {
            "HTTP/1.1"
        },
        endpoint: global.endpoint.clone(),
        streams: ctx.streams.len(),
        connections,
        in_flight: ctx.in_flight,
        batch: ctx.batch,
        record_size: ctx.record_size,
        producer: args.producer,
        readers,
        read_mode: match read_mode {
            ReadMode::Sse => "sse",
            ReadMode::LongPoll => "long-poll",
        },
        target_mibps: args.target_mibps,
        warmup_secs: args.warmup.as_secs_f64(),
        duration_secs: secs,
        setup_secs,
        write: Throughput::write(&measured, secs, ctx.counters.unfinished_at_stop()),
        write_latency: Percentiles::of(&ctx.lat.ack.lock().unwrap_or_else(|p| p.into_inner())),
        read: (readers > 0).then(|| Throughput::read(&measured, secs)),
        e2e_latency: Percentiles::of(&ctx.lat.e2e()),
        first_error: ctx.counters.first_error(),
        client_cpu_secs,
        client_cpu_cores,
        machine,
    };
    match args.output {
        OutputFormat::Text => print!("{}", report.text()),
        OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(())
}

/// CPU time this process has used, in seconds: the load generator shares the machine with the
/// server it measures, so the report says how much of it the bench itself took.
fn process_cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

/// `readers` on `n` HTTP/2 connections need more streams per connection than `limit`.
fn too_many_h2_readers(limit: usize, readers: usize, n: usize) -> anyhow::Error {
    if limit == 0 {
        return anyhow::anyhow!(
            "the server allows no concurrent streams on an HTTP/2 connection: run the readers without --http2"
        );
    }
    anyhow::anyhow!(
        "the server allows {limit} concurrent streams per HTTP/2 connection, and {} readers share each of the {n} reader connections: use --reader-connections {} or more",
        readers.div_ceil(n),
        readers.div_ceil(limit)
    )
}

async fn resolve_own(global: &Global) -> anyhow::Result<Arc<sse_conn::Endpoint>> {
    let ep = sse_conn::Endpoint::resolve(&global.endpoint, global.token.as_deref()).await?;
    Ok(Arc::new(ep))
}

/// Longest wait for one stream's creation.
const CREATE_TIMEOUT: Duration = Duration::from_secs(30);

/// Creates every stream (idempotent, so a fixed --prefix can be reused).
async fn create_all(
    target: &Target,
    clients: &[reqwest::Client],
    streams: &[String],
) -> Result<(), String> {
    let created = AtomicUsize::new(0);
    let total = streams.len();
    let mut errors = std::pin::pin!(
        futures::stream::iter(streams.iter().enumerate())
            .map(|(i, s)| {
                let http = &clients[i % clients.len()];
                let created = &created;
                async move {
                    // A server that accepts and never answers must not hang the setup.
                    let r = tokio::time::timeout(CREATE_TIMEOUT, target.create(http, s))
                        .await
                        .unwrap_or_else(|_| {
                            Err(format!("create {s}: no answer in {CREATE_TIMEOUT:?}"))
                        });
                    let n = created.fetch_add(1, Ordering::Relaxed) + 1;
                    if total >= 1000 && n.is_multiple_of(1000) {
                        eprint!("\rbench: created {n}/{total} streams");
                    }
                    r
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .filter_map(|r| async move { r.err() })
    );
    let first = errors.next().await;
    if total >= 1000 {
        eprintln!();
    }
    first.map_or(Ok(()), Err)
}

/// Prints a progress line every second until the measurement ends.
async fn progress(ctx: &Ctx, start: u64, warmup_us: u64, duration_us: u64) {
    let tty = std::io::stderr().is_terminal();
    let end = start + warmup_us + duration_us;
    let mut last = ctx.counters.snapshot_all();
    let mut last_t = now_us();
    loop {
        let now = now_us();
        if now >= end {
            break;
        }
        let next_tick = (last_t + 1_000_000).min(end);
        tokio::time::sleep(Duration::from_micros(next_tick.saturating_sub(now))).await;
        let t = now_us();
        let snap = ctx.counters.snapshot_all();
        let d = snap.minus(&last);
        let dt = (t - last_t) as f64 / 1e6;
        let phase = if t < start + warmup_us {
            "warmup"
        } else {
            "run"
        };
        let mut line = format!(
            "[{phase} {:5.1}s] write {:8.2} MiB/s {:9.0} rec/s {:7.0} req/s",
            (t - start) as f64 / 1e6,
            d.write_bytes as f64 / stats::MIB / dt,
            d.write_records as f64 / dt,
            d.write_requests as f64 / dt,
        );
        if ctx.readers_connected.load(Ordering::Relaxed) > 0 {
            line.push_str(&format!(
                " | read {:8.2} MiB/s {:9.0} rec/s",
                d.read_bytes as f64 / stats::MIB / dt,
                d.read_records as f64 / dt
            ));
        }
        let errs = snap.write_errors + snap.read_errors;
        if errs > 0 {
            line.push_str(&format!(" | errors {errs}"));
        }
        let mut err = std::io::stderr().lock();
        if tty {
            let _ = write!(err, "\r\x1b[K{line}");
        } else {
            let _ = writeln!(err, "{line}");
        }
        let _ = err.flush();
        last = snap;
        last_t = t;
    }
    if tty {
        eprintln!();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2.5"), Ok(Duration::from_millis(2500)));
        assert!(parse_duration("3h").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("x").is_err());
        // Huge values are refused, not a panic in Duration or an overflow of the clock.
        let err = parse_duration("100000000000000000000s").unwrap_err();
        assert!(err.contains("too long"), "{err}");
        assert!(parse_duration("400000000m").is_err());
        assert_eq!(parse_duration("525600m"), Ok(MAX_DURATION));
    }
}
