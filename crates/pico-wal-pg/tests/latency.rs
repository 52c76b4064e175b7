//! Where a Postgres WAL append's time goes, against its floor on the same database: one
//! sequential client, 100-byte records, each figure from the same run.
//!
//! - `floor`: a single-row INSERT and its commit (autocommit) on a prepared statement;
//! - `append`: `PgWal::append` as the engine calls it (one statement: fence + INSERT);
//! - `fenced, bare conn`: the append's statement alone on the floor's connection (what
//!   `PgWal` adds around it: encoding, its lock, timeouts);
//! - `same, as an upsert`: that statement with `ON CONFLICT DO UPDATE`, as a retry runs it
//!   (and every append did before);
//! - `five round trips`: what an append cost before (pool acquire with its ping, BEGIN, the
//!   fence's `SELECT … FOR SHARE`, the INSERT, COMMIT), for comparison.
//!
//! The three run interleaved, one of each per round, so a disk that changes speed under other
//! load slows each alike. A measurement, not a check (timings on a shared machine prove nothing), so ignored by
//! default: `cargo test --release -p pico-wal-pg --test latency -- --ignored --nocapture`.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::TestDb;
use pico_wal_pg::PgWal;
use s3stream::{Wal, WalRecord};
use sqlx::Connection;
use sqlx::postgres::{PgConnection, PgPoolOptions};

const N: usize = 1000;
const WARMUP: usize = 100;

fn pct(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let i = ((samples.len() as f64 * p) as usize).min(samples.len() - 1);
    samples[i].as_secs_f64() * 1000.0
}

fn report(what: &str, mut samples: Vec<Duration>, floor_p50: f64) -> f64 {
    let p50 = pct(&mut samples, 0.50);
    let p99 = pct(&mut samples, 0.99);
    println!(
        "{what:>18}: p50 {p50:.3} ms  p99 {p99:.3} ms  ({:.2}x the floor's p50)",
        p50 / floor_p50
    );
    p50
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn append_latency_against_a_bare_insert() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let body = Bytes::from(vec![b'x'; 100]);

    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("CREATE TABLE floor (id BIGSERIAL PRIMARY KEY, body BYTEA)")
        .execute(&mut conn)
        .await
        .unwrap();
    let wal = PgWal::open(&db.url, 1, 1).await.unwrap();
    // The former path, on the same tables (node 2, positions of its own).
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&db.url)
        .await
        .unwrap();
    sqlx::query("INSERT INTO pico_wal_nodes (node_id, epoch) VALUES (2, 1)")
        .execute(&pool)
        .await
        .unwrap();

    // Interleaved, one of each per round: a shared machine's disk changes speed by the
    // second, and each gets the same share of it.
    let (mut floor, mut append, mut old) = (Vec::new(), Vec::new(), Vec::new());
    let (mut fo, mut ex) = (Vec::new(), Vec::new());
    sqlx::query("INSERT INTO pico_wal_nodes (node_id, epoch) VALUES (3, 1), (4, 1)")
        .execute(&mut conn)
        .await
        .unwrap();
    const FENCED: &str = "INSERT INTO pico_wal (node_id, position, node_epoch, payload)
     SELECT node_id, $2, $3, $4 FROM pico_wal_nodes
         WHERE node_id = $1 AND epoch <= $3 FOR SHARE
     RETURNING position";
    // The retry's form, which every append used before.
    const UPSERT: &str = "INSERT INTO pico_wal (node_id, position, node_epoch, payload)
     SELECT node_id, $2, $3, $4 FROM pico_wal_nodes
         WHERE node_id = $1 AND epoch <= $3 FOR SHARE
     ON CONFLICT (node_id, position)
     DO UPDATE SET node_epoch = EXCLUDED.node_epoch, payload = EXCLUDED.payload
     RETURNING position";
    for i in 0..WARMUP + N {
        let keep = i >= WARMUP;
        let t = Instant::now();
        sqlx::query("INSERT INTO floor (body) VALUES ($1)")
            .bind(&body[..])
            .execute(&mut conn)
            .await
            .unwrap();
        if keep {
            floor.push(t.elapsed());
        }

        let t = Instant::now();
        let r: Option<i64> = sqlx::query_scalar(FENCED)
            .bind(3i32)
            .bind(i as i64 + 1)
            .bind(1i64)
            .bind(&body[..])
            .fetch_optional(&mut conn)
            .await
            .unwrap();
        assert!(r.is_some());
        if keep {
            fo.push(t.elapsed());
        }
        let t = Instant::now();
        let r: Option<i64> = sqlx::query_scalar(UPSERT)
            .bind(4i32)
            .bind(i as i64 + 1)
            .bind(1i64)
            .bind(&body[..])
            .fetch_optional(&mut conn)
            .await
            .unwrap();
        assert!(r.is_some());
        if keep {
            ex.push(t.elapsed());
        }

        let rec = WalRecord::new(1, 1, i as u64, 1, body.clone(), Bytes::new());
        let t = Instant::now();
        wal.append(vec![rec]).await.unwrap();
        if keep {
            append.push(t.elapsed());
        }

        let t = Instant::now();
        let mut c = pool.acquire().await.unwrap();
        let mut tx = c.begin().await.unwrap();
        let _: Option<i64> =
            sqlx::query_scalar("SELECT epoch FROM pico_wal_nodes WHERE node_id = $1 FOR SHARE")
                .bind(2i32)
                .fetch_optional(&mut *tx)
                .await
                .unwrap();
        sqlx::query(
            "INSERT INTO pico_wal (node_id, position, node_epoch, payload) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (node_id, position) \
             DO UPDATE SET node_epoch = EXCLUDED.node_epoch, payload = EXCLUDED.payload",
        )
        .bind(2i32)
        .bind(i as i64 + 1)
        .bind(1i64)
        .bind(&body[..])
        .execute(&mut *tx)
        .await
        .unwrap();
        tx.commit().await.unwrap();
        drop(c);
        if keep {
            old.push(t.elapsed());
        }
    }

    let mut f = floor.clone();
    let floor_p50 = pct(&mut f, 0.5);
    println!("{N} sequential writes each, 100 B, after {WARMUP} to warm up:");
    report("floor (INSERT)", floor, floor_p50);
    let a = report("PgWal::append", append, floor_p50);
    report("five round trips", old, floor_p50);
    report("fenced, bare conn", fo, floor_p50);
    report("same, as an upsert", ex, floor_p50);
    assert!(a > 0.0);
}
