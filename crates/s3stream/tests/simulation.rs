//! Seeded, deterministic simulation of the engine over its catalog, with faults.
//!
//! Each seed drives one history on a single-threaded runtime with paused time (timers fire in
//! virtual time, so uploads by interval, upload timeouts and retries all happen, in an order
//! that depends only on the seed): several incarnations of a node append to a few streams with
//! several appends in flight, flush, let time pass, and meet injected faults — failed object
//! puts (the WAL's and the uploads'), failed WAL appends, failed commits, commits that landed
//! with their answer lost — and each incarnation ends in a crash at a random point (between
//! upload, commit and trim, wherever the seed puts it). A last incarnation without faults then
//! reads every stream back.
//!
//! Invariants checked: every acknowledged append is read back at the offset it was given, with
//! its bytes; a stream's batches are contiguous from offset 0; every batch read back is one
//! that was appended at that offset (an append that failed or was in flight at a crash may be
//! there or not, but nothing else may).
//!
//! `PICO_SIM_SEEDS=N` runs seeds 1..=N (default 500); `PICO_SIM_SEED=S` replays one seed, and
//! `PICO_SIM_TRACE=1` prints each seed's trace. A failure prints its seed. The first seeds also run twice and must leave the same trace
//! (lost determinism would make a failure unreproducible).

use std::collections::{BTreeMap, BTreeSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use s3stream::testing::{FaultWal, MemCatalog};
use s3stream::*;

const STREAMS: u64 = 3;
const INCARNATIONS: i64 = 5;
/// Virtual time a flush or a wait may take before the incarnation counts as stuck.
const STUCK: Duration = Duration::from_secs(600);

/// xorshift64*: small, seedable, and the same on every platform.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `pct` percent.
    fn chance(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
}

/// What one seed's history did, for the invariant checks and the determinism check.
#[derive(Default)]
struct History {
    /// (stream, base) → bytes of each acknowledged append.
    acked: BTreeMap<(u64, u64), Bytes>,
    /// (stream, base) → bytes of every append attempted there.
    attempted: BTreeMap<(u64, u64), BTreeSet<Bytes>>,
    /// One line per event, compared across two runs of a seed.
    trace: Vec<String>,
}

struct World {
    storage: Arc<MemoryStorage>,
    catalog: Arc<MemCatalog>,
}

impl World {
    fn new() -> World {
        World {
            storage: Arc::new(MemoryStorage::new()),
            catalog: Arc::new(MemCatalog::new()),
        }
    }

    /// An engine as a freshly started process sees it: a new WAL handle on the same storage.
    async fn start(&self, cfg: EngineConfig) -> Result<(Engine, Arc<FaultWal>), EngineError> {
        let object_wal = Arc::new(ObjectWal::new(self.storage.clone(), "wal/0".into()));
        let wal = Arc::new(FaultWal::new(object_wal));
        let (engine, _) = Engine::start(
            cfg,
            self.storage.clone(),
            wal.clone(),
            self.catalog.clone(),
            Arc::new(|_, _| {}),
        )
        .await?;
        Ok((engine, wal))
    }

    fn clear_faults(&self) {
        self.storage.fail_puts(0);
        self.storage.fail_gets(0);
        self.catalog.fail_commits(0);
        self.catalog.hang_after_commits(0);
    }
}

fn request(stream: u64, epoch: i64, records: u32, batch: Bytes) -> AppendRequest {
    AppendRequest {
        stream,
        epoch,
        record_count: records,
        batch,
        batch_crc: None,
        aux: Bytes::new(),
    }
}

/// One incarnation: appends and faults until its crash.
async fn incarnation(world: &World, rng: &mut Rng, epoch: i64, h: &mut History) {
    let cfg = EngineConfig {
        upload_interval: Duration::from_millis(50 + rng.below(1000)),
        upload_threshold_bytes: 100 + rng.below(4000) as usize,
        upload_timeout: Duration::from_secs(5 + rng.below(30)),
        ..EngineConfig::default()
    };
    // Start-up (recovery) may meet the faults the last incarnation left armed: a failed start
    // is a crash before serving anything.
    let (engine, wal) = match world.start(cfg).await {
        Ok(started) => started,
        Err(e) => {
            h.trace.push(format!("e{epoch} start failed: {e}"));
            return;
        }
    };
    for s in 0..STREAMS {
        engine.open(s, epoch, world.catalog.committed_end(s));
    }
    let ops = 5 + rng.below(40);
    let mut in_flight: Vec<(u64, u64, Bytes, PendingAppend)> = Vec::new();
    'ops: for op in 0..ops {
        match rng.below(100) {
            0..=54 => {
                let s = rng.below(STREAMS);
                let records = 1 + rng.below(3) as u32;
                let Some(base) = engine.next_offset(s) else {
                    break 'ops;
                };
                let len = 1 + rng.below(300) as usize;
                let data = Bytes::from(format!("e{epoch}-op{op}-s{s}-b{base}-{}", "x".repeat(len)));
                h.attempted
                    .entry((s, base))
                    .or_default()
                    .insert(data.clone());
                match engine
                    .append(request(s, epoch, records, data.clone()))
                    .await
                {
                    Ok(p) => {
                        assert_eq!(p.base_offset, base, "offset handed out changed");
                        in_flight.push((s, base, data, p));
                    }
                    Err(e) => {
                        h.trace.push(format!("op{op} append s{s} refused: {e}"));
                        break 'ops;
                    }
                }
            }
            55..=69 => {
                // Wait for what is in flight.
                for (s, base, data, p) in in_flight.drain(..) {
                    match tokio::time::timeout(STUCK, p.durable()).await {
                        Ok(Ok(a)) => {
                            assert_eq!(a.base_offset, base);
                            h.trace.push(format!("op{op} ack s{s} @{base}"));
                            h.acked.insert((s, base), data);
                        }
                        Ok(Err(e)) => {
                            h.trace
                                .push(format!("op{op} append s{s} @{base} failed: {e}"));
                            break 'ops;
                        }
                        Err(_) => {
                            h.trace.push(format!("op{op} append s{s} @{base} stuck"));
                            break 'ops;
                        }
                    }
                }
            }
            70..=76 => {
                let r = tokio::time::timeout(STUCK, engine.flush()).await;
                h.trace.push(format!("op{op} flush {}", outcome(&r)));
            }
            77..=84 => {
                let ms = rng.below(3000);
                tokio::time::sleep(Duration::from_millis(ms)).await;
                h.trace.push(format!("op{op} slept {ms}ms"));
            }
            85..=88 => {
                let n = 1 + rng.below(3) as usize;
                world.storage.fail_puts(n);
                h.trace.push(format!("op{op} fail {n} puts"));
            }
            89..=92 => {
                let n = 1 + rng.below(2) as usize;
                world.catalog.fail_commits(n);
                h.trace.push(format!("op{op} fail {n} commits"));
            }
            93..=95 => {
                world.catalog.hang_after_commits(1);
                h.trace.push(format!("op{op} lose a commit's answer"));
            }
            96..=97 => {
                wal.fail_appends(1);
                h.trace.push(format!("op{op} fail a wal append"));
            }
            _ => {
                world.storage.fail_gets(1);
                h.trace.push(format!("op{op} fail a get"));
            }
        }
        // Reads of what was acknowledged, now and then, through whatever cache holds it.
        if rng.chance(10) {
            let s = rng.below(STREAMS);
            check_stream_read(&engine, s, h, false).await;
        }
    }
    // The crash: whatever is in flight (WAL writes, uploads, commits, trims) stops here.
    h.trace
        .push(format!("e{epoch} crash with {} in flight", in_flight.len()));
    engine.abort();
}

fn outcome<T, E: std::fmt::Display>(
    r: &Result<Result<T, E>, tokio::time::error::Elapsed>,
) -> String {
    match r {
        Ok(Ok(_)) => "ok".into(),
        Ok(Err(e)) => format!("failed: {e}"),
        Err(_) => "stuck".into(),
    }
}

/// Reads stream `s` from 0 and checks it against the history. `whole`: every acknowledged
/// append must be there (after recovery); else a failed read is tolerated (faults are armed)
/// and only what is read is checked.
async fn check_stream_read(engine: &Engine, s: u64, h: &History, whole: bool) {
    let mut cur = 0u64;
    let mut seen = BTreeSet::new();
    loop {
        let page = match tokio::time::timeout(STUCK, engine.read(s, cur, 1024)).await {
            Ok(Ok(page)) => page,
            Ok(Err(_)) if !whole => return,
            Ok(Err(e)) => panic!("read of stream {s} from {cur} failed: {e}"),
            Err(_) => panic!("read of stream {s} from {cur} stuck"),
        };
        let before = cur;
        for b in &page {
            if b.base_offset < cur {
                continue;
            }
            assert_eq!(b.base_offset, cur, "stream {s}: gap or overlap at {cur}");
            let tried = h.attempted.get(&(s, b.base_offset));
            assert!(
                tried.is_some_and(|t| t.contains(&b.data)),
                "stream {s} @{}: bytes that were never appended there",
                b.base_offset
            );
            if let Some(want) = h.acked.get(&(s, b.base_offset)) {
                assert_eq!(
                    &b.data, want,
                    "stream {s} @{}: acked bytes changed",
                    b.base_offset
                );
            }
            seen.insert(b.base_offset);
            cur = b.base_offset + u64::from(b.record_count);
        }
        if cur == before {
            break; // an empty page, or nothing past `cur`: the tail
        }
    }
    if whole {
        for (&(stream, base), _) in h.acked.range((s, 0)..(s + 1, 0)) {
            assert!(
                seen.contains(&base),
                "stream {stream}: acknowledged append @{base} lost"
            );
        }
    }
}

/// One seed's whole history; returns its trace.
async fn run(seed: u64) -> Vec<String> {
    let mut rng = Rng::new(seed);
    let world = World::new();
    let mut h = History::default();
    for epoch in 1..=INCARNATIONS {
        incarnation(&world, &mut rng, epoch, &mut h).await;
    }
    // Recovery without faults: everything acknowledged is there, once, in order.
    world.clear_faults();
    let (engine, _wal) = world
        .start(EngineConfig::default())
        .await
        .unwrap_or_else(|e| panic!("final start failed: {e}"));
    for s in 0..STREAMS {
        engine.open(s, INCARNATIONS + 1, world.catalog.committed_end(s));
        check_stream_read(&engine, s, &h, true).await;
    }
    engine.abort();
    h.trace.push(format!("acked {}", h.acked.len()));
    h.trace
}

fn run_seed(seed: u64) -> Vec<String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    match std::panic::catch_unwind(AssertUnwindSafe(|| rt.block_on(run(seed)))) {
        Ok(trace) => {
            if std::env::var_os("PICO_SIM_TRACE").is_some() {
                eprintln!("seed {seed}:\n  {}", trace.join("\n  "));
            }
            trace
        }
        Err(panic) => {
            eprintln!("simulation failed at seed {seed}; replay it with PICO_SIM_SEED={seed}");
            std::panic::resume_unwind(panic)
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name} must be a number, got `{v}`")),
    )
}

#[test]
fn seeded_histories_keep_every_acknowledged_append() {
    let seeds: Vec<u64> = match env_u64("PICO_SIM_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env_u64("PICO_SIM_SEEDS").unwrap_or(500)).collect(),
    };
    let mut acked = 0usize;
    for &seed in &seeds {
        let trace = run_seed(seed);
        acked += trace
            .last()
            .and_then(|l| l.strip_prefix("acked "))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        if seed <= 5 {
            assert_eq!(
                trace,
                run_seed(seed),
                "seed {seed} left a different trace on its second run: the simulation lost \
                 determinism"
            );
        }
    }
    eprintln!(
        "simulation: {} seeds, {acked} acknowledged appends checked",
        seeds.len()
    );
    assert!(
        acked > seeds.len(),
        "the workload acknowledged almost nothing"
    );
}
