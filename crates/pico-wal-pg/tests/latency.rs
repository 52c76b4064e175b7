//! Where a Postgres WAL append's time goes, against its floor on the same database: one
//! sequential client, 100-byte records, each figure from the same run.
//!
//! - `floor, prepared`: a single-row INSERT of 100 B and its commit (autocommit) on a prepared
//!   statement (sqlx: Bind/Execute/Close/Sync, one round trip);
//! - `floor, simple`: the same INSERT as a literal in one simple-protocol Query message, as
//!   `pgbench` sends it for `scripts/bench/storage.sh`'s floor;
//! - `fenced, bare`: the append's statement (fence + INSERT, row lock `FOR SHARE`) alone on
//!   the floor's connection, with the payload `PgWal` writes for one record;
//! - `fenced, no lock`: the same without `FOR SHARE` (what the row lock costs);
//! - `PgWal::append`: as the engine calls it (lock, encoding, timeouts around that statement);
//! - the floor and `PgWal::append` again over the Unix socket, when the server has one at
//!   `PICO_TEST_POSTGRES_SOCKET` (default `/var/run/postgresql`).
//!
//! They run interleaved, one of each per round, so a disk that changes speed under other load
//! slows each alike. A measurement, not a check (timings on a shared machine prove nothing),
//! so ignored by default:
//! `cargo test --release -p pico-wal-pg --test latency -- --ignored --nocapture`.
//! `PICO_LATENCY_ROUNDS` sets the rounds (1000).

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::TestDb;
use pico_wal_pg::{APPEND, PgWal};
use s3stream::{Wal, WalRecord};
use sqlx::Connection;
use sqlx::postgres::PgConnection;

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
        "{what:>24}: p50 {p50:.3} ms  p99 {p99:.3} ms  ({:.2}x the floor's p50)",
        p50 / floor_p50
    );
    p50
}

/// Times `f` into `out` once warmed up.
async fn timed<F: Future<Output = ()>>(keep: bool, out: &mut Vec<Duration>, f: F) {
    let t = Instant::now();
    f.await;
    if keep {
        out.push(t.elapsed());
    }
}

/// The test database's URL over the server's Unix socket, if it has one (in
/// `PICO_TEST_POSTGRES_SOCKET`, default `/var/run/postgresql`, for the URL's port).
fn unix_url(db: &TestDb) -> Option<String> {
    let dir = std::env::var("PICO_TEST_POSTGRES_SOCKET")
        .unwrap_or_else(|_| "/var/run/postgresql".to_string());
    let (head, name) = db.url.rsplit_once('/')?;
    let port = head
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .unwrap_or(5432);
    if !std::path::Path::new(&dir)
        .join(format!(".s.PGSQL.{port}"))
        .exists()
    {
        println!("(no Unix socket for port {port} in {dir}: socket figures left out)");
        return None;
    }
    Some(format!(
        "postgres://postgres@localhost:{port}/{name}?host={dir}"
    ))
}

async fn insert(conn: &mut PgConnection, body: &[u8]) {
    sqlx::query("INSERT INTO floor (body) VALUES ($1)")
        .bind(body)
        .execute(conn)
        .await
        .unwrap();
}

/// `sql` (a fenced INSERT) for `node` at position `i + 1`.
async fn bare(conn: &mut PgConnection, sql: &str, node: i32, i: usize, payload: &[u8]) {
    let r: Option<i64> = sqlx::query_scalar(sql)
        .bind(node)
        .bind(i as i64 + 1)
        .bind(1i64)
        .bind(payload)
        .bind(i as i64 + 1)
        .fetch_optional(conn)
        .await
        .unwrap();
    assert!(r.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --ignored --nocapture"]
async fn append_latency_against_a_bare_insert() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let rounds: usize = std::env::var("PICO_LATENCY_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let body = Bytes::from(vec![b'x'; 100]);
    let literal = format!(
        "INSERT INTO floor (body) VALUES ('\\x{}')",
        "78".repeat(body.len())
    );
    let rec = |i: usize| WalRecord::new(1, 1, i as u64, 1, body.clone(), Bytes::new());
    let payload = s3stream::format::encode_wal_entry(1, &[rec(0)]).unwrap();
    println!("WAL payload for one 100 B record: {} B", payload.len());
    // The append's statement without its row lock, to time what the lock costs.
    let no_lock = APPEND.replace(" FOR SHARE", "");
    assert_ne!(no_lock, APPEND);

    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("CREATE TABLE floor (id BIGSERIAL PRIMARY KEY, body BYTEA)")
        .execute(&mut conn)
        .await
        .unwrap();
    let wal = PgWal::open(&db.url, 1, 1).await.unwrap();
    sqlx::query("INSERT INTO pico_wal_nodes (node_id, epoch) VALUES (3, 1), (4, 1)")
        .execute(&mut conn)
        .await
        .unwrap();
    let unix = unix_url(&db);
    let mut unix_side = match &unix {
        Some(url) => Some((
            PgConnection::connect(url).await.unwrap(),
            PgWal::open(url, 5, 1).await.unwrap(),
        )),
        None => None,
    };

    let names = [
        "floor, prepared",
        "floor, simple",
        "fenced, bare",
        "fenced, no lock",
        "PgWal::append",
        "floor, prepared, unix",
        "PgWal::append, unix",
    ];
    let mut t: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    for i in 0..WARMUP + rounds {
        let keep = i >= WARMUP;
        timed(keep, &mut t[0], insert(&mut conn, &body)).await;
        timed(keep, &mut t[1], async {
            sqlx::raw_sql(&literal).execute(&mut conn).await.unwrap();
        })
        .await;
        timed(keep, &mut t[2], bare(&mut conn, APPEND, 3, i, &payload)).await;
        timed(keep, &mut t[3], bare(&mut conn, &no_lock, 4, i, &payload)).await;
        timed(keep, &mut t[4], async {
            wal.append(vec![rec(i)]).await.unwrap();
        })
        .await;
        if let Some((c, w)) = &mut unix_side {
            timed(keep, &mut t[5], insert(c, &body)).await;
            timed(keep, &mut t[6], async {
                w.append(vec![rec(i)]).await.unwrap();
            })
            .await;
        }
    }

    let mut f = t[0].clone();
    let floor_p50 = pct(&mut f, 0.5);
    println!("{rounds} sequential writes each, 100 B, after {WARMUP} to warm up:");
    for (name, samples) in names.iter().zip(t) {
        if !samples.is_empty() {
            report(name, samples, floor_p50);
        }
    }
}
