//! The backends a contract test runs on: a SQLite file in a temp dir, and a fresh Postgres
//! database per test (`PICO_TEST_POSTGRES_URL`, default below), dropped afterwards.
//! Postgres unreachable: its variants print `SKIPPED` to stderr and pass, or fail when
//! `PICO_TEST_REQUIRE_ALL=1`.
#![allow(dead_code)] // each test binary uses its own part

use sqlx::postgres::PgPoolOptions;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub const DEFAULT_PG: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// One backend's database for one test.
pub struct Db {
    pub url: String,
    _dir: Option<tempfile::TempDir>,
    /// (admin URL, database name) of a Postgres database to drop at the end.
    pg: Option<(String, String)>,
}

impl Db {
    pub fn sqlite() -> Db {
        let dir = tempfile::tempdir().unwrap();
        Db {
            url: format!("sqlite:{}/meta.db", dir.path().display()),
            _dir: Some(dir),
            pg: None,
        }
    }

    /// A fresh Postgres database, or `None` (after a loud line) if Postgres is unreachable
    /// and not required.
    pub async fn postgres() -> Option<Db> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let admin_url = std::env::var("PICO_TEST_POSTGRES_URL").unwrap_or(DEFAULT_PG.into());
        let admin = match PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(5))
            .connect(&admin_url)
            .await
        {
            Ok(pool) => pool,
            Err(e) => {
                if std::env::var("PICO_TEST_REQUIRE_ALL").as_deref() == Ok("1") {
                    panic!("PICO_TEST_REQUIRE_ALL=1 but no Postgres at {admin_url}: {e}");
                }
                // Past the test harness's capture (which takes only `eprintln!`), so it shows.
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED (no Postgres at {admin_url}): {e}"
                );
                return None;
            }
        };
        let name = format!(
            "pico_test_{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name}"))
            .execute(&admin)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .unwrap();
        admin.close().await;
        Some(Db {
            url: with_database(&admin_url, &name),
            _dir: None,
            pg: Some((admin_url, name)),
        })
    }
}

impl Drop for Db {
    /// Drops the Postgres database even when the test panicked (on a thread of its own: this
    /// may run inside the test's runtime).
    fn drop(&mut self) {
        let Some((admin_url, name)) = self.pg.take() else {
            return;
        };
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                if let Ok(admin) = PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&admin_url)
                    .await
                {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::query(&sql).execute(&admin).await;
                    admin.close().await;
                }
            })
        })
        .join();
    }
}

/// `url` with its database path replaced by `name` (query string kept).
fn with_database(url: &str, name: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap();
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, format!("?{q}")),
        None => (rest, String::new()),
    };
    let authority = rest.split('/').next().unwrap();
    format!("{scheme}://{authority}/{name}{query}")
}

/// Runs `$test(url)` once per backend, as `$test::sqlite` and `$test::postgres`.
#[macro_export]
macro_rules! contract {
    ($($test:ident),* $(,)?) => {$(
        mod $test {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                let db = $crate::common::Db::sqlite();
                super::$test(&db.url).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                let Some(db) = $crate::common::Db::postgres().await else { return };
                super::$test(&db.url).await;
            }
        }
    )*};
}

pub fn is_sqlite(url: &str) -> bool {
    url.starts_with("sqlite:")
}

/// Runs one statement written in the SQL both backends accept.
pub async fn exec(url: &str, sql: &str) {
    if url.starts_with("sqlite:") {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        sqlx::query(sql).execute(&pool).await.unwrap();
        pool.close().await;
    } else {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::query(sql).execute(&pool).await.unwrap();
        pool.close().await;
    }
}

/// One `i64` a query written in the SQL both backends accept answers.
pub async fn scalar(url: &str, sql: &str) -> i64 {
    if is_sqlite(url) {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        let n = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        n
    } else {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        let n = sqlx::query_scalar(sql).fetch_one(&pool).await.unwrap();
        pool.close().await;
        n
    }
}

/// Inserts a log row as another writer would (no notification), e.g. a damaged one.
pub async fn insert_row(url: &str, payload: &[u8], count: i64) {
    if is_sqlite(url) {
        let pool = sqlx::SqlitePool::connect(url).await.unwrap();
        sqlx::query("INSERT INTO meta_log (payload, count, created_at_ms) VALUES (?, ?, 0)")
            .bind(payload)
            .bind(count)
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    } else {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::query("INSERT INTO meta_log (payload, count, created_at_ms) VALUES ($1, $2, 0)")
            .bind(payload)
            .bind(count)
            .execute(&pool)
            .await
            .unwrap();
        pool.close().await;
    }
}

/// Distinct blobs that still have chunks.
pub async fn chunk_blobs(url: &str) -> i64 {
    scalar(
        url,
        "SELECT COUNT(DISTINCT blob_id) FROM meta_snapshot_chunk",
    )
    .await
}
