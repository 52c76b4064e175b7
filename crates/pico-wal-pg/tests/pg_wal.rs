//! `PgWal` against a real Postgres: round trips, trim, concurrency, fencing, server checks.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use common::TestDb;
use pico_wal_pg::{PgWal, PgWalError};
use s3stream::{Wal, WalError, WalRecord};
use sqlx::Connection;

fn rec(stream: u64, base: u64, n: u32) -> WalRecord {
    WalRecord::new(
        stream,
        4,
        base,
        n,
        Bytes::from(format!("batch-{stream}-{base}")),
        Bytes::from_static(b"aux"),
    )
}

async fn open(db: &TestDb, node: u32, epoch: u64) -> PgWal {
    PgWal::open(&db.url, node, epoch).await.unwrap()
}

async fn sql_count(db: &TestDb, sql: &str) -> i64 {
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query_scalar(sql).fetch_one(&mut c).await.unwrap()
}

#[tokio::test]
async fn append_recover_round_trip_across_reopen_and_positions_continue() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let (p1, p2);
    {
        let wal = open(&db, 1, 10).await;
        assert!(wal.recover().await.unwrap().is_empty());
        p1 = wal.append(vec![rec(1, 0, 2), rec(2, 0, 1)]).await.unwrap();
        p2 = wal.append(vec![rec(1, 2, 1)]).await.unwrap();
        assert!(p2 > p1);
    }
    // Another node's WAL in the same tables is separate.
    let other = open(&db, 2, 1).await;
    let q = other.append(vec![rec(9, 0, 1)]).await.unwrap();

    let wal = open(&db, 1, 11).await;
    assert_eq!(
        wal.recover().await.unwrap(),
        vec![
            (p1, vec![rec(1, 0, 2), rec(2, 0, 1)]),
            (p2, vec![rec(1, 2, 1)])
        ]
    );
    let p3 = wal.append(vec![rec(3, 0, 1)]).await.unwrap();
    assert!(p3 > p2, "positions continue after the highest recovered");
    assert_eq!(
        other.recover().await.unwrap(),
        vec![(q, vec![rec(9, 0, 1)])]
    );
}

#[tokio::test]
async fn trim_drops_positions_upto_and_positions_never_restart() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let wal = open(&db, 1, 1).await;
    let p1 = wal.append(vec![rec(1, 0, 1)]).await.unwrap();
    let p2 = wal.append(vec![rec(1, 1, 1)]).await.unwrap();
    let p3 = wal.append(vec![rec(1, 2, 1)]).await.unwrap();
    wal.trim(p1).await.unwrap();
    assert_eq!(
        wal.recover().await.unwrap(),
        vec![(p2, vec![rec(1, 1, 1)]), (p3, vec![rec(1, 2, 1)])]
    );
    wal.trim(p3).await.unwrap();
    assert!(wal.recover().await.unwrap().is_empty());
    drop(wal);
    // Emptied by trim, then reopened: still above every position given out before.
    let wal = open(&db, 1, 2).await;
    let p4 = wal.append(vec![rec(1, 3, 1)]).await.unwrap();
    assert!(p4 > p3, "p4={p4} p3={p3}");
}

#[tokio::test]
async fn concurrent_appends_are_all_durable_at_distinct_ascending_positions() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let wal = Arc::new(open(&db, 1, 1).await);
    let mut tasks = Vec::new();
    for t in 0..16u64 {
        let wal = wal.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in 0..5u64 {
                let r = rec(t, i, 1);
                let p = wal.append(vec![r.clone()]).await.unwrap();
                got.push((p, r));
            }
            got
        }));
    }
    let mut acked = BTreeMap::new();
    for t in tasks {
        for (p, r) in t.await.unwrap() {
            assert!(
                acked.insert(p, vec![r]).is_none(),
                "position {p} given twice"
            );
        }
    }
    assert_eq!(acked.len(), 80);
    let reopened = open(&db, 1, 2).await;
    let recovered = reopened.recover().await.unwrap();
    assert!(recovered.windows(2).all(|w| w[0].0 < w[1].0), "ascending");
    assert_eq!(recovered, acked.into_iter().collect::<Vec<_>>());
}

#[tokio::test]
async fn a_zombie_is_fenced_and_its_rows_are_not_there() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let zombie = open(&db, 1, 10).await;
    let p1 = zombie.append(vec![rec(1, 0, 1)]).await.unwrap();

    let next = open(&db, 1, 11).await;
    let err = zombie.append(vec![rec(1, 1, 1)]).await.unwrap_err();
    assert!(matches!(err, WalError::Fenced(_)), "{err}");
    assert!(err.to_string().contains("epoch 11"), "{err}");
    // Nor may it delete what its successor recovers.
    let err = zombie.trim(p1).await.unwrap_err();
    assert!(matches!(err, WalError::Fenced(_)), "{err}");

    assert_eq!(
        next.recover().await.unwrap(),
        vec![(p1, vec![rec(1, 0, 1)])]
    );
    assert_eq!(sql_count(&db, "SELECT count(*) FROM pico_wal").await, 1);
    let p2 = next.append(vec![rec(1, 1, 1)]).await.unwrap();
    assert!(p2 > p1);
}

/// A zombie appending while its node is re-opened: every append it got acknowledged is in
/// what the new incarnation recovers, and nothing else of it is.
#[tokio::test]
async fn zombie_appends_racing_a_reopen_are_either_recovered_or_refused() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let zombie = Arc::new(open(&db, 1, 10).await);
    let (first_acked_tx, first_acked) = tokio::sync::oneshot::channel();
    let z = zombie.clone();
    let appender = tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut tx = Some(first_acked_tx);
        for i in 0..10_000u64 {
            match z.append(vec![rec(1, i, 1)]).await {
                Ok(p) => acked.push((p, vec![rec(1, i, 1)])),
                Err(WalError::Fenced(_)) => return acked,
                Err(e) => panic!("{e}"),
            }
            if acked.len() == 3
                && let Some(tx) = tx.take()
            {
                let _ = tx.send(());
            }
        }
        panic!("never fenced");
    });
    first_acked.await.unwrap();
    let next = open(&db, 1, 11).await;
    let recovered = next.recover().await.unwrap();
    let acked = appender.await.unwrap();
    assert!(acked.len() >= 3);
    assert_eq!(recovered, acked);
}

#[tokio::test]
async fn opening_at_a_lower_epoch_is_refused() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let wal = open(&db, 1, 10).await;
    match PgWal::open(&db.url, 1, 9).await {
        Err(PgWalError::Fenced {
            node_id: 1,
            epoch: 9,
            registered: 10,
        }) => {}
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("opened below the registered epoch"),
    }
    // The refused open changed nothing: the registered incarnation still writes.
    wal.append(vec![rec(1, 0, 1)]).await.unwrap();
    // The same epoch again (a restart with an explicit epoch) is accepted.
    let again = open(&db, 1, 10).await;
    assert_eq!(again.recover().await.unwrap().len(), 1);
}

#[tokio::test]
async fn unsafe_session_settings_are_refused_unless_allowed() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    // Set for this session only, as a role or database setting would: the server is untouched.
    let sep = if db.url.contains('?') { '&' } else { '?' };
    let off = format!("{}{sep}options[synchronous_commit]=off", db.url);
    match PgWal::open(&off, 1, 1).await {
        Err(e @ PgWalError::Unsafe { .. }) => {
            assert!(e.to_string().contains("synchronous_commit=off"), "{e}")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("opened on synchronous_commit=off"),
    }
    let allowed = PgWal::open(&format!("{off}&allowUnsafe=true"), 1, 1)
        .await
        .unwrap();
    allowed.append(vec![rec(1, 0, 1)]).await.unwrap();
    // Stripped before connecting, on a safe server too.
    let safe = PgWal::open(&format!("{}{sep}allowUnsafe=false", db.url), 1, 2)
        .await
        .unwrap();
    assert_eq!(safe.recover().await.unwrap().len(), 1);
    match PgWal::open(&format!("{}{sep}allowUnsafe=1", db.url), 1, 3).await {
        Err(PgWalError::Url(m)) => assert!(m.contains("allowUnsafe"), "{m}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a bad allowUnsafe was accepted"),
    }
}

#[tokio::test]
async fn a_corrupt_row_fails_recovery_loudly() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let wal = open(&db, 1, 1).await;
    wal.append(vec![rec(1, 0, 1)]).await.unwrap();
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("UPDATE pico_wal SET payload = set_byte(payload, 30, get_byte(payload, 30) # 64)")
        .execute(&mut c)
        .await
        .unwrap();
    let err = wal.recover().await.unwrap_err();
    assert!(matches!(err, WalError::Corrupt { .. }), "{err}");
}

/// A commit that landed although the client saw it fail leaves a row at the position the
/// retry reuses: the retry replaces it instead of failing on the key forever. A first attempt
/// at a position is a plain INSERT, so a row it did not expect there fails it (here the row
/// stands for the failed attempt's); the engine's retry then replaces it.
#[tokio::test]
async fn a_retry_replaces_a_row_whose_failed_commit_had_landed() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let wal = open(&db, 1, 1).await;
    let p1 = wal.append(vec![rec(1, 0, 1)]).await.unwrap();
    let landed = s3stream::format::encode_wal_entry(p1 + 1, &[rec(1, 1, 1)]).unwrap();
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("INSERT INTO pico_wal VALUES (1, $1, 1, $2)")
        .bind(i64::try_from(p1 + 1).unwrap())
        .bind(landed.as_ref())
        .execute(&mut c)
        .await
        .unwrap();
    let first = wal.append(vec![rec(1, 1, 1)]).await;
    assert!(first.is_err(), "a first attempt overwrote a row: {first:?}");
    let p2 = wal.append(vec![rec(1, 1, 1)]).await.unwrap();
    assert_eq!(p2, p1 + 1);
    assert_eq!(
        wal.recover().await.unwrap(),
        vec![(p1, vec![rec(1, 0, 1)]), (p2, vec![rec(1, 1, 1)])]
    );
}

/// A statement that reaches Postgres after its position was trimmed (its client gave up on it
/// long before) writes nothing: no row reappears below the trim watermark to be replayed.
#[tokio::test]
async fn a_statement_for_a_trimmed_position_writes_nothing() {
    let Some(db) = TestDb::create().await else {
        return;
    };
    let wal = open(&db, 1, 1).await;
    let p = wal.append(vec![rec(1, 0, 1)]).await.unwrap();
    wal.trim(p).await.unwrap();
    let late = s3stream::format::encode_wal_entry(p, &[rec(1, 0, 1)]).unwrap();
    let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
    let wrote: Option<i64> = sqlx::query_scalar(pico_wal_pg::APPEND)
        .bind(1i32)
        .bind(i64::try_from(p).unwrap())
        .bind(1i64)
        .bind(late.as_ref())
        .bind(i64::MAX)
        .fetch_optional(&mut c)
        .await
        .unwrap();
    assert_eq!(wrote, None);
    assert!(wal.recover().await.unwrap().is_empty());
}
