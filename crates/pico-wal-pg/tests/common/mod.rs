//! A fresh Postgres database per test, dropped after it.
//!
//! The server is `PICO_TEST_POSTGRES_URL` (default `postgres://postgres@127.0.0.1:5432/postgres`).
//! Unreachable: the test fails under `PICO_TEST_REQUIRE_ALL=1`, otherwise it is skipped loudly.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::Connection;
use sqlx::postgres::PgConnection;

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

pub struct TestDb {
    admin_url: String,
    name: String,
    /// The test database's URL.
    pub url: String,
}

/// `url` with its database replaced by `db` (query kept).
fn with_database(url: &str, db: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let after_scheme = head.find("://").map_or(0, |i| i + 3);
    let base = match head[after_scheme..].find('/') {
        Some(i) => &head[..after_scheme + i],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

async fn admin(url: &str) -> Result<PgConnection, String> {
    match tokio::time::timeout(Duration::from_secs(10), PgConnection::connect(url)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("connect timed out".into()),
    }
}

impl TestDb {
    /// A new empty database, or `None` (test skipped) when no Postgres is reachable.
    pub async fn create() -> Option<TestDb> {
        let admin_url =
            std::env::var("PICO_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string());
        let mut conn = match admin(&admin_url).await {
            Ok(c) => c,
            Err(e) => {
                if std::env::var("PICO_TEST_REQUIRE_ALL").as_deref() == Ok("1") {
                    panic!(
                        "no Postgres at {admin_url} ({e}) and PICO_TEST_REQUIRE_ALL=1: start one \
                         or set PICO_TEST_POSTGRES_URL"
                    );
                }
                // Straight to the stderr stream: libtest would capture `eprintln!`, hiding it.
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED (no Postgres at {admin_url}): {e}"
                );
                return None;
            }
        };
        static N: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "pico_wal_test_{}_{}_{nanos}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(&mut conn)
            .await
            .expect("create test database");
        let url = with_database(&admin_url, &name);
        Some(TestDb {
            admin_url,
            name,
            url,
        })
    }
}

impl Drop for TestDb {
    /// Drops the database even when the test panicked, on a thread of its own (the test's
    /// runtime may be the one unwinding).
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let mut conn = admin(&admin_url).await?;
                sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>(())
            })
        })
        .join();
        if let Ok(Err(e)) = dropped {
            eprintln!("dropping test database {}: {e}", self.name);
        }
    }
}

#[test]
fn database_is_replaced_in_urls() {
    assert_eq!(
        with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
        "postgres://postgres@127.0.0.1:5432/x"
    );
    assert_eq!(
        with_database("postgres://u:p@h/db?sslmode=disable", "x"),
        "postgres://u:p@h/x?sslmode=disable"
    );
    assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
}
