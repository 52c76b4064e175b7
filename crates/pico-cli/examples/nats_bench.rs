//! Acknowledged JetStream publishes from a Rust client (`async-nats`), for the NATS rows of
//! `scripts/bench/compare.sh`: the same shape as `pico bench --connections N -n 1` (each of N
//! tasks publishes one message and awaits its PubAck before the next) and the same JSON fields
//! as `pico bench --output json` (`write.*`, `write_latency.*`, `client_cpu_secs`). It sits next
//! to `scripts/bench/nats_bench.py` so the JetStream figures do not depend on a CPython client
//! that itself uses a core at these rates.
//!
//! `cargo run --release -p pico-cli --example nats_bench -- --url nats://127.0.0.1:4222
//!  --in-flight 64 --size 100 --duration 10 --warmup 2`

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use hdrhistogram::Histogram;
use std::time::{Duration, Instant};

struct Args {
    url: String,
    stream: String,
    size: usize,
    in_flight: usize,
    duration: f64,
    warmup: f64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        url: "nats://127.0.0.1:4222".into(),
        stream: "BENCH".into(),
        size: 100,
        in_flight: 64,
        duration: 10.0,
        warmup: 2.0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let v = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<f64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--url" => a.url = v,
            "--stream" => a.stream = v,
            "--size" => a.size = num(&v)? as usize,
            "--in-flight" => a.in_flight = (num(&v)? as usize).max(1),
            "--duration" => a.duration = num(&v)?,
            "--warmup" => a.warmup = num(&v)?,
            _ => return Err(format!("unknown flag {flag}")),
        }
    }
    if a.duration <= 0.0 {
        return Err("--duration must be positive".into());
    }
    Ok(a)
}

fn process_cpu_secs() -> f64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    let client = async_nats::connect(a.url.as_str()).await?;
    let js = jetstream::new(client);
    let subject = format!("{}.x", a.stream.to_lowercase());
    // A fresh stream each run, file storage (the server's sync_interval decides the fsync).
    let _ = js.delete_stream(&a.stream).await;
    js.create_stream(stream::Config {
        name: a.stream.clone(),
        subjects: vec![subject.clone()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await?;

    let payload = Bytes::from(vec![b'x'; a.size]);
    let start = Instant::now();
    let m0 = start + Duration::from_secs_f64(a.warmup);
    let m1 = m0 + Duration::from_secs_f64(a.duration);
    let cpu0 = process_cpu_secs();
    let mut tasks = Vec::with_capacity(a.in_flight);
    for _ in 0..a.in_flight {
        let (js, subject, payload) = (js.clone(), subject.clone(), payload.clone());
        // Each task keeps its own histogram (1 µs to 1 min, 3 digits) and error count, merged
        // once the run is over: nothing shared on the publish path.
        let mut hist = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
        tasks.push(tokio::spawn(async move {
            let mut errors = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= m1 {
                    return (hist, errors);
                }
                let acked = match js.publish(subject.clone(), payload.clone()).await {
                    Ok(ack) => ack.await.is_ok(),
                    Err(_) => false,
                };
                let t1 = Instant::now();
                if !acked {
                    errors += 1;
                    // A refused or lost publish fails at once: pause rather than spin a core.
                    tokio::time::sleep(Duration::from_millis(1)).await;
                } else if t1 >= m0 && t1 < m1 {
                    hist.saturating_record((t1 - t0).as_micros().max(1) as u64);
                }
            }
        }));
    }
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut errors = 0u64;
    for t in tasks {
        let (th, te) = t.await?;
        h.add(&th)?;
        errors += te;
    }
    let cpu = process_cpu_secs() - cpu0;
    let n = h.len();
    let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
    let out = serde_json::json!({
        "client": "async-nats (Rust)",
        "in_flight": a.in_flight,
        "record_size": a.size,
        "duration_secs": a.duration,
        "client_cpu_secs": cpu,
        "write": {
            "records_per_sec": n as f64 / a.duration,
            "mib_per_sec": (n as usize * a.size) as f64 / a.duration / 1048576.0,
            "records": n,
            "errors": errors,
        },
        "write_latency": {
            "p50_ms": ms(0.50),
            "p90_ms": ms(0.90),
            "p99_ms": ms(0.99),
            "p999_ms": ms(0.999),
            "max_ms": h.max() as f64 / 1000.0,
        },
    });
    println!("{out}");
    Ok(())
}
