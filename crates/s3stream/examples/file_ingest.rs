//! The durable local-disk path alone: what batched ingest costs the engine's process per MiB
//! when the WAL is `SegmentWal` (preallocated, as `pico serve` runs it) and the data objects are
//! `FileStorage` files, with no HTTP in front. Writers append 64 KiB batches to one stream as
//! fast as acks come back (the DS batched-ingest row: 8 connections × 64 × 1 KiB) until `mib`
//! MiB are acknowledged, then everything is flushed to objects.
//!
//! ```text
//! cargo run --release -p s3stream --example file_ingest -- DIR [mib=1024] [writers=8]
//! ```
//! Prints MiB/s, the process's CPU (user and system) per MiB, and the whole machine's (which
//! includes the kernel's writeback and journal threads) per MiB.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use s3stream::testing::start_on_mem_catalog;
use s3stream::{AppendRequest, EngineConfig, FileStorage, SegmentWal};

const BATCH: usize = 64 * 1024;

/// (user, system) CPU seconds of this process.
fn own_cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<f64> = after
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // Fields 14 and 15 of the line; `after` starts at field 3.
    let tick = 100.0;
    (
        f.get(11).copied().unwrap_or(0.0) / tick,
        f.get(12).copied().unwrap_or(0.0) / tick,
    )
}

/// Busy CPU seconds of the whole machine (user, nice, system, irq, softirq, steal).
fn machine_cpu() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = stat.lines().next().unwrap_or("");
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    [0, 1, 2, 5, 6, 7]
        .iter()
        .map(|&i| f.get(i).copied().unwrap_or(0.0))
        .sum::<f64>()
        / 100.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut args = std::env::args().skip(1);
    let dir =
        std::path::PathBuf::from(args.next().expect("usage: file_ingest DIR [mib] [writers]"));
    let mib: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
    let writers: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(8);
    let data = Arc::new(FileStorage::open(dir.join("objects")).expect("object dir"));
    let wal = Arc::new(SegmentWal::new(dir.join("wal")).with_preallocation(true));
    let engine = start_on_mem_catalog(EngineConfig::default(), data, wal).await;
    engine.open(1, 1, 0);
    // Warm-up: the first segment and its spare, the first object.
    let batch = Bytes::from(vec![7u8; BATCH]);
    let crc = crc32c::crc32c(&batch);
    let total = mib * 1024 * 1024 / BATCH as u64;
    let run = |n: u64| {
        let engine = engine.clone();
        let batch = batch.clone();
        async move {
            let left = Arc::new(std::sync::atomic::AtomicU64::new(n));
            let mut tasks = Vec::new();
            for _ in 0..writers {
                let (engine, batch, left) = (engine.clone(), batch.clone(), left.clone());
                tasks.push(tokio::spawn(async move {
                    while left
                        .fetch_update(
                            std::sync::atomic::Ordering::Relaxed,
                            std::sync::atomic::Ordering::Relaxed,
                            |l| l.checked_sub(1),
                        )
                        .is_ok()
                    {
                        engine
                            .append(AppendRequest {
                                stream: 1,
                                epoch: 1,
                                record_count: 64,
                                batch: batch.clone(),
                                batch_crc: Some(crc),
                                aux: Bytes::new(),
                            })
                            .await
                            .expect("append")
                            .durable()
                            .await
                            .expect("durable");
                    }
                }));
            }
            for t in tasks {
                t.await.expect("writer");
            }
            engine.flush().await.expect("flush");
        }
    };
    run(total / 8).await;
    let (u0, s0) = own_cpu();
    let m0 = machine_cpu();
    let t0 = Instant::now();
    run(total).await;
    let secs = t0.elapsed().as_secs_f64();
    let (u1, s1) = own_cpu();
    let m1 = machine_cpu();
    let mibs = (total * BATCH as u64) as f64 / 1048576.0;
    println!(
        "{:.0} MiB/s; process {:.3} ms/MiB (user {:.3}, sys {:.3}); machine {:.3} ms/MiB",
        mibs / secs,
        1000.0 * (u1 - u0 + s1 - s0) / mibs,
        1000.0 * (u1 - u0) / mibs,
        1000.0 * (s1 - s0) / mibs,
        1000.0 * (m1 - m0) / mibs,
    );
    engine.abort();
}
