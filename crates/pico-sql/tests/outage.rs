//! The Postgres metadata log through a lost connection: a TCP proxy in front of the real
//! server is cut (a restarted server) or hung (a server that stopped answering), then resumed.
//! Proposals fail retryably meanwhile (never a crash, never a false success), reachability
//! turns false, and the log resumes by itself once Postgres is back.

mod common;
#[path = "common/proxy.rs"]
mod proxy;

use pico_common::ErrorKind;
use pico_metadata::{Command, StreamConfig};
use pico_sql::{MetaLog, MetaLogOptions};
use proxy::PgProxy;
use std::time::Duration;

fn create(name: &str) -> Command {
    Command::CreateStream {
        name: name.into(),
        config: StreamConfig {
            content_type: "text/plain".into(),
            ttl_secs: None,
            expires_at_ms: None,
        },
        closed: false,
        initial: Default::default(),
        now_ms: 1,
    }
}

/// Quick probes and backoff, so an outage shows (and heals) in well under a second.
fn opts() -> MetaLogOptions {
    MetaLogOptions {
        poll_interval: Duration::from_millis(50),
        retry_min: Duration::from_millis(10),
        retry_max: Duration::from_millis(100),
        probe_timeout: Duration::from_millis(300),
        ..MetaLogOptions::default()
    }
}

/// Waits (bounded) until `cond` holds.
async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Proposes until one is accepted (bounded): what a client retrying a 503 does.
async fn propose_until_ok(log: &MetaLog, name: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match log.propose(create(name)).await {
            // Applied, or already there from an attempt whose answer was lost.
            Ok(_) => {
                assert!(
                    log.view().registry.get(name).is_some(),
                    "{name} not applied"
                );
                return;
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable(None), "{e}");
                assert!(tokio::time::Instant::now() < deadline, "never resumed: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_fails_proposals_retryably_and_the_log_resumes() {
    let Some(db) = common::Db::postgres().await else {
        return;
    };
    let proxy = PgProxy::start(&db.url).await;
    let log = MetaLog::open(&proxy.url(&db.url), opts()).await.unwrap();
    log.propose(create("before")).await.unwrap().unwrap();
    assert!(log.reachability().reachable);

    proxy.cut();
    wait_until("unreachable after the cut", || {
        !log.reachability().reachable
    })
    .await;
    let r = log.reachability();
    assert!(
        r.consecutive_failures >= 1 && r.last_error.is_some(),
        "{r:?}"
    );
    // A proposal while Postgres is away fails with a retryable error: never a success it
    // could not have had, never a stop of the log.
    let err = log.propose(create("during")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable(None), "{err}");
    assert!(log.health().is_ok(), "an outage must not stop the log");

    proxy.resume();
    wait_until("reachable after the resume", || {
        log.reachability().reachable
    })
    .await;
    propose_until_ok(&log, "after").await;
    let view = log.view();
    assert!(view.registry.get("before").is_some());
    assert!(view.registry.get("after").is_some());
    assert!(
        view.registry.get("during").is_none(),
        "a failed proposal applied"
    );
    log.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_turns_unreachable_and_a_stalled_proposal_finishes_after() {
    let Some(db) = common::Db::postgres().await else {
        return;
    };
    let proxy = PgProxy::start(&db.url).await;
    let log = MetaLog::open(&proxy.url(&db.url), opts()).await.unwrap();
    log.propose(create("before")).await.unwrap().unwrap();

    proxy.hang();
    wait_until("unreachable while hung", || !log.reachability().reachable).await;
    // A proposal now stalls (its connection does not answer) rather than failing outright.
    let stalled = tokio::spawn({
        let log = log.clone();
        async move { log.propose(create("stalled")).await }
    });
    proxy.resume();
    wait_until("reachable after the resume", || {
        log.reachability().reachable
    })
    .await;
    let done = tokio::time::timeout(Duration::from_secs(20), stalled)
        .await
        .expect("the stalled proposal finished after the resume")
        .unwrap();
    match done {
        Ok(r) => {
            r.unwrap();
            assert!(log.view().registry.get("stalled").is_some());
        }
        // Failed on a dropped connection: retryable, and the retry applies.
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::Unavailable(None), "{e}");
            propose_until_ok(&log, "stalled").await;
        }
    }
    propose_until_ok(&log, "after").await;
    assert!(log.view().registry.get("before").is_some());
    log.close().await;
}

/// A Postgres store behind a proxy, with a short op timeout.
async fn store_behind_proxy(url: &str, op_timeout: Duration) -> (PgProxy, pico_sql::PgStore) {
    let proxy = PgProxy::start(url).await;
    let store = pico_sql::PgStore::open(&proxy.url(url))
        .await
        .unwrap()
        .with_op_timeout(op_timeout);
    (proxy, store)
}

/// Fails unless `started` is well within the 10 s the test allows each call: the calls failed
/// by their op timeout, not by the pool's acquire timeout or the server coming back.
fn assert_bounded(started: tokio::time::Instant) {
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A connection that stops answering mid-proposal (the server host frozen, the network
/// black-holing it) fails the proposal retryably within the store's op timeout, rather than
/// holding the single committer for as long as the kernel keeps the socket; once the server
/// answers again, proposals succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proposal_on_a_hung_connection_fails_within_the_op_timeout() {
    let Some(db) = common::Db::postgres().await else {
        return;
    };
    let (proxy, store) = store_behind_proxy(&db.url, Duration::from_millis(500)).await;
    let log = MetaLog::with_store(std::sync::Arc::new(store), opts())
        .await
        .unwrap();
    log.propose(create("before")).await.unwrap().unwrap();

    proxy.hang();
    let started = tokio::time::Instant::now();
    let out = tokio::time::timeout(Duration::from_secs(10), log.propose(create("hung")))
        .await
        .expect("the proposal answered while the server still hangs");
    let e = out.expect_err("no answer from the server, so no success");
    assert_eq!(e.kind(), ErrorKind::Unavailable(None), "{e}");
    assert_bounded(started);

    proxy.resume();
    propose_until_ok(&log, "hung").await;
    propose_until_ok(&log, "after").await;
    assert!(log.view().registry.get("before").is_some());
    log.close().await;
}

/// Lease calls, the snapshot listing and a snapshot's load and write on a connection that
/// stops answering fail within the op timeout too (a hung lease renewal would stall the maintenance lease holder), and work
/// again once the server answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_and_snapshot_calls_on_a_hung_connection_fail_within_the_op_timeout() {
    use pico_sql::LogStore;
    let Some(db) = common::Db::postgres().await else {
        return;
    };
    let (proxy, store) = store_behind_proxy(&db.url, Duration::from_millis(300)).await;
    assert!(store.try_acquire_lease("m", "a", 60_000, 1).await.unwrap());
    let snapshot = pico_sql::SnapshotMeta {
        applied_index: 7,
        last_row_id: 0,
    };
    store
        .write_snapshot(snapshot, b"seven", 2, 1)
        .await
        .unwrap();

    proxy.hang();
    let started = tokio::time::Instant::now();
    let bounded = Duration::from_secs(10);
    let renew = tokio::time::timeout(bounded, store.renew_lease("m", "a", 60_000, 2)).await;
    assert!(renew.expect("renewal answered").is_err());
    let read = tokio::time::timeout(bounded, store.lease("m")).await;
    assert!(read.expect("lease read answered").is_err());
    let listed = tokio::time::timeout(bounded, store.snapshots()).await;
    assert!(listed.expect("snapshot listing answered").is_err());
    let loaded = tokio::time::timeout(bounded, store.load_snapshot(7)).await;
    assert!(loaded.expect("snapshot load answered").is_err());
    assert_bounded(started);
    // A write's steps are bounded too (the first, registering its blob, by the op timeout).
    let started = tokio::time::Instant::now();
    let next = pico_sql::SnapshotMeta {
        applied_index: 8,
        last_row_id: 0,
    };
    let written = tokio::time::timeout(bounded, store.write_snapshot(next, b"eight", 2, 2)).await;
    assert!(written.expect("snapshot write answered").is_err());
    assert_bounded(started);

    proxy.resume();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match store.lease("m").await {
            Ok(Some((holder, _))) => {
                assert_eq!(holder, "a");
                break;
            }
            other => {
                assert!(tokio::time::Instant::now() < deadline, "{other:?}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
    assert!(store.renew_lease("m", "a", 60_000, 3).await.unwrap());
    assert_eq!(
        store.load_snapshot(7).await.unwrap().as_deref(),
        Some(&b"seven"[..])
    );
}

/// A client that gives up on an append after taking the append lock, on a connection the
/// network keeps half-open (its close never reaches the server), must not hold that lock:
/// the server ends the idle transaction after twice the op timeout, and another node's
/// appends go on. Without that bound they would wait until the server's keepalive noticed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_abandoned_inside_its_transaction_does_not_hold_the_append_lock() {
    use pico_sql::LogStore;
    let Some(db) = common::Db::postgres().await else {
        return;
    };
    let (proxy, stuck) = store_behind_proxy(&db.url, Duration::from_millis(300)).await;
    let other = pico_sql::PgStore::open(&db.url).await.unwrap();
    let first = other.append(b"first", 1, 1).await.unwrap();

    // The lock statement reaches the server; the insert after it does not, nor, later, the
    // client's close.
    proxy.hold_containing(b"INSERT INTO meta_log");
    let e = stuck.append(b"stuck", 1, 2).await.unwrap_err();
    assert!(matches!(e, pico_sql::MetaError::Store { .. }), "{e}");

    let started = tokio::time::Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(10), other.append(b"next", 1, 3))
        .await
        .expect("another node's append waited behind the abandoned transaction's lock")
        .unwrap();
    assert!(next > first);
    assert_bounded(started);
    proxy.release();
}
