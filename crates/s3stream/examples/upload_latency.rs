//! Ingest through the engine when object PUTs are slow, as on S3: how much one node can
//! acknowledge when the uploader, not the WAL, is the limit.
//!
//! The WAL and the catalog are in memory (instant), data objects go to memory behind a PUT
//! latency of `base_ms + size / mib_per_sec`. Writers append 64 KiB batches to their own stream
//! as fast as acks come back; appends wait once `max_unflushed_bytes` are not yet uploaded.
//!
//! ```text
//! cargo run --release -p s3stream --example upload_latency -- \
//!     [parallelism=4] [base_ms=30] [mib_per_sec=80] [secs=5]
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use s3stream::testing::{SlowStorage, start_on_mem_catalog};
use s3stream::{AppendRequest, EngineConfig, MemoryStorage, ObjectStorage, ObjectWal};

const WRITERS: u64 = 8;
const BATCH: usize = 64 * 1024;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let arg = |i: usize, default: u64| -> u64 {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let parallelism = arg(1, 4) as usize;
    let base_ms = arg(2, 30);
    let mib_per_sec = arg(3, 80).max(1);
    let secs = arg(4, 5);

    let data: Arc<dyn ObjectStorage> = Arc::new(SlowStorage::new(
        Arc::new(MemoryStorage::new()),
        "data/",
        Box::new(move |_, len| {
            Duration::from_millis(base_ms)
                + Duration::from_secs_f64(len as f64 / (mib_per_sec as f64 * 1048576.0))
        }),
    ));
    let wal = Arc::new(ObjectWal::new(Arc::new(MemoryStorage::new()), "wal".into()));
    let cfg = EngineConfig {
        upload_parallelism: parallelism,
        ..EngineConfig::default()
    };
    let engine = start_on_mem_catalog(cfg, data, wal).await;

    let acked = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for stream in 0..WRITERS {
        engine.open(stream, 1, 0);
        let (engine, acked) = (engine.clone(), acked.clone());
        tasks.push(tokio::spawn(async move {
            let batch = Bytes::from(vec![stream as u8; BATCH]);
            while Instant::now() < deadline {
                let pending = engine
                    .append(AppendRequest {
                        stream,
                        epoch: 1,
                        record_count: 64,
                        batch: batch.clone(),
                        batch_crc: None,
                        aux: Bytes::new(),
                    })
                    .await
                    .expect("append");
                pending.durable().await.expect("durable");
                acked.fetch_add(BATCH as u64, Ordering::Relaxed);
            }
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await.expect("writer");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stats = engine.stats();
    let acked = acked.load(Ordering::Relaxed) as f64;
    // What the uploader moved: the first `max_unflushed_bytes` were acked from the buffer.
    let uploaded = acked - stats.unuploaded_bytes as f64;
    println!(
        "parallelism={parallelism} put={base_ms}ms+size/{mib_per_sec}MiB/s over {elapsed:.1}s: \
         acked {:.0} MiB/s, uploaded {:.0} MiB/s, {} objects",
        acked / 1048576.0 / elapsed,
        uploaded / 1048576.0 / elapsed,
        stats.uploads,
    );
}
