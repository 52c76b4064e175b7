//! Stream service behaviour on a real node (SQLite metadata log, engine on memory or file storage).

use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::Record;
use pico_server::testing::{
    start_test_node, start_test_node_on, start_test_node_with, start_test_node_with_wal,
};
use pico_server::*;
use pico_sql::{MetaLog, MetaLogOptions};
use s3stream::{
    EngineConfig, FileStorage, MemoryStorage, ObjectStorage, ObjectWal, SegmentWal, Wal,
};
use std::sync::Arc;
use std::time::Duration;

fn name(s: &str) -> StreamName {
    StreamName::parse(s).unwrap()
}

fn rec(s: &str) -> Record {
    Record {
        timestamp_ms: 0,
        key: None,
        value: Bytes::from(s.to_string()),
        headers: vec![],
    }
}

fn append_req(n: &str, bodies: &[&str]) -> AppendRequest {
    AppendRequest {
        name: name(n),
        records: bodies.iter().map(|b| rec(b)).collect(),
        producer: None,
        match_seq: None,
        close: false,
        content_type: None,
    }
}

/// A fork of `source` at its tail, with `body` records of its own, closed after them if asked.
fn fork_req(n: &str, source: &str, closed: bool, body: &[&str]) -> ForkRequest {
    ForkRequest {
        name: name(n),
        source: name(source),
        offset: None,
        sub_offset: 0,
        config: CreateConfig {
            closed,
            ..CreateConfig::default()
        },
        initial: body.iter().map(|b| rec(b)).collect(),
    }
}

fn create_req(n: &str) -> CreateRequest {
    CreateRequest {
        name: name(n),
        config: CreateConfig::default(),
        initial: vec![],
    }
}

/// A test node whose clock moves only when the test moves it.
async fn node_on_manual_clock() -> (Node, Arc<pico_common::clock::ManualClock>) {
    let clock = pico_common::clock::ManualClock::new(1_700_000_000_000);
    let node = start_test_node_with(NodeConfig {
        clock: clock.clone(),
        ..NodeConfig::default()
    })
    .await;
    (node, clock)
}

/// A WAL in memory whose appends a test can stall or fail.
fn fault_wal() -> Arc<s3stream::testing::FaultWal> {
    let inner: Arc<dyn Wal> =
        Arc::new(ObjectWal::new(Arc::new(MemoryStorage::new()), "wal".into()));
    Arc::new(s3stream::testing::FaultWal::new(inner))
}

async fn read_all(node: &Node, n: &str, from: u64) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut next = from;
    loop {
        let r = node
            .read(ReadRequest {
                name: name(n),
                from: ReadFrom::Offset(next),
                max_records: None,
                max_bytes: None,
                touch: true,
            })
            .await
            .unwrap();
        for rr in &r.records {
            out.push((
                rr.offset,
                String::from_utf8(rr.record.value.to_vec()).unwrap(),
            ));
        }
        next = r.next_seq;
        if r.up_to_date {
            return out;
        }
    }
}

#[tokio::test]
async fn create_append_read_round_trip() {
    let node = start_test_node().await;
    let c = node.create(create_req("/a/b")).await.unwrap();
    assert!(c.created);
    assert_eq!(c.info.next_seq, 0);
    assert_eq!(
        c.info.epoch, -1,
        "created streams are not opened until used"
    );
    let again = node.create(create_req("a/b")).await.unwrap();
    assert!(!again.created, "create is idempotent");
    let mut other = create_req("a/b");
    other.config.content_type = Some("text/plain".into());
    assert!(matches!(
        node.create(other).await,
        Err(CreateError::Conflict { .. })
    ));

    let a1 = node.append(append_req("a/b", &["x", "y"])).await.unwrap();
    assert_eq!((a1.start_seq, a1.next_seq), (Some(0), 2));
    let a2 = node.append(append_req("a/b", &["z"])).await.unwrap();
    assert_eq!((a2.start_seq, a2.next_seq), (Some(2), 3));
    let all = read_all(&node, "a/b", 0).await;
    assert_eq!(all, vec![(0, "x".into()), (1, "y".into()), (2, "z".into())]);
    let mid = read_all(&node, "a/b", 1).await;
    assert_eq!(mid.first().map(|r| r.0), Some(1));
    let head = node.head(&name("a/b")).await.unwrap();
    assert_eq!(head.next_seq, 3);
    assert_eq!(head.epoch, 0);
    assert!(matches!(
        node.append(append_req("nope", &["x"])).await,
        Err(AppendError::NotFound(_))
    ));
}

#[tokio::test]
async fn producers_pipeline_dedupe_and_fence() {
    let node = start_test_node().await;
    node.create(create_req("p")).await.unwrap();
    let claim = |epoch, seq| ProducerClaim {
        id: "w1".into(),
        epoch,
        seq,
    };
    let with = |c: ProducerClaim, body: &str| AppendRequest {
        producer: Some(c),
        ..append_req("p", &[body])
    };
    // Many in flight at once from one producer: all accepted, in order.
    let mut handles = Vec::new();
    for seq in 0..20u64 {
        let node = node.clone();
        let req = with(claim(0, seq), &format!("m{seq}"));
        handles.push(tokio::spawn(async move { node.append(req).await }));
        tokio::task::yield_now().await;
    }
    for h in handles {
        h.await.unwrap().unwrap();
    }
    let dup = node.append(with(claim(0, 5), "again")).await.unwrap();
    assert!(dup.duplicate);
    assert_eq!(dup.producer, Some((0, 19)));
    assert!(matches!(
        node.append(with(claim(0, 25), "gap")).await,
        Err(AppendError::SequenceGap {
            expected: 20,
            received: 25,
            ..
        })
    ));
    node.append(with(claim(1, 0), "new epoch")).await.unwrap();
    assert!(matches!(
        node.append(with(claim(0, 20), "zombie")).await,
        Err(AppendError::Fenced { current: 1, .. })
    ));
    let all = read_all(&node, "p", 0).await;
    assert_eq!(
        all.len(),
        21,
        "duplicates and rejected appends wrote nothing"
    );
}

#[tokio::test]
async fn producer_batches_that_overtake_their_predecessors_wait_for_them() {
    // A wide reorder window: the early batches must still be waiting when seq 0 arrives, even
    // on a loaded machine (the 20 ms default is tuned for pipelined clients, not for a test
    // whose tasks may be descheduled).
    let node = start_test_node_with(NodeConfig {
        long_poll_timeout: Duration::from_millis(500),
        reorder_wait: Duration::from_secs(2),
        ..NodeConfig::default()
    })
    .await;
    node.create(create_req("o")).await.unwrap();
    let with = |epoch, seq, body: &str| AppendRequest {
        producer: Some(ProducerClaim {
            id: "w".into(),
            epoch,
            seq,
        }),
        ..append_req("o", &[body])
    };
    // Seq 2 and 1 arrive before seq 0 (and a new epoch's seq 1 before its seq 0): each is held
    // until its predecessor is accepted, then all commit in producer order.
    let early2 = tokio::spawn({
        let (node, req) = (node.clone(), with(0, 2, "c"));
        async move { node.append(req).await }
    });
    tokio::time::sleep(Duration::from_millis(2)).await;
    let early1 = tokio::spawn({
        let (node, req) = (node.clone(), with(0, 1, "b"));
        async move { node.append(req).await }
    });
    tokio::time::sleep(Duration::from_millis(2)).await;
    let first = node.append(with(0, 0, "a")).await.unwrap();
    let (one, two) = (
        early1.await.unwrap().unwrap(),
        early2.await.unwrap().unwrap(),
    );
    assert_eq!(
        (first.start_seq, one.start_seq, two.start_seq),
        (Some(0), Some(1), Some(2))
    );
    assert!(!one.duplicate && !two.duplicate);
    let next_epoch = tokio::spawn({
        let (node, req) = (node.clone(), with(1, 1, "e"));
        async move { node.append(req).await }
    });
    tokio::time::sleep(Duration::from_millis(2)).await;
    node.append(with(1, 0, "d")).await.unwrap();
    assert_eq!(next_epoch.await.unwrap().unwrap().start_seq, Some(4));
    let bodies: Vec<_> = read_all(&node, "o", 0)
        .await
        .into_iter()
        .map(|(_, body)| body)
        .collect();
    assert_eq!(bodies, ["a", "b", "c", "d", "e"]);
    // Nothing fills a real gap: it is answered once the wait runs out.
    assert!(matches!(
        node.append(with(1, 3, "gap")).await,
        Err(AppendError::SequenceGap {
            expected: 2,
            received: 3,
            ..
        })
    ));
}

#[tokio::test]
async fn match_seq_close_delete_trim() {
    let node = start_test_node().await;
    node.create(create_req("s")).await.unwrap();
    node.append(append_req("s", &["a", "b", "c"]))
        .await
        .unwrap();
    let mut m = append_req("s", &["d"]);
    m.match_seq = Some(1);
    assert!(matches!(
        node.append(m.clone()).await,
        Err(AppendError::MatchFailed { next_seq: 3, .. })
    ));
    m.match_seq = Some(3);
    node.append(m).await.unwrap();

    assert_eq!(node.trim(&name("s"), 2).await.unwrap(), 2);
    assert!(matches!(
        node.read(ReadRequest {
            name: name("s"),
            from: ReadFrom::Offset(0),
            max_records: None,
            max_bytes: None,
            touch: false
        })
        .await,
        Err(ReadError::Trimmed { start_seq: 2, .. })
    ));
    assert!(matches!(
        node.trim(&name("s"), 99).await,
        Err(TrimError::BeyondTail { .. })
    ));

    let mut close = append_req("s", &[]);
    close.close = true;
    let c = node.append(close).await.unwrap();
    assert!(c.closed);
    assert!(matches!(
        node.append(append_req("s", &["late"])).await,
        Err(AppendError::Closed { next_seq: 4, .. })
    ));
    let r = node
        .read(ReadRequest {
            name: name("s"),
            from: ReadFrom::Offset(2),
            max_records: None,
            max_bytes: None,
            touch: true,
        })
        .await
        .unwrap();
    assert!(r.closed && r.up_to_date);
    assert_eq!(r.records.len(), 2);

    node.delete(&name("s")).await.unwrap();
    assert!(matches!(
        node.head(&name("s")).await,
        Err(ReadError::NotFound(_))
    ));
    let again = node.create(create_req("s")).await.unwrap();
    assert!(again.created, "a deleted name is reusable at once");
    assert_eq!(again.info.next_seq, 0);
}

#[tokio::test]
async fn long_poll_wakes_on_append_and_times_out() {
    let node = start_test_node().await;
    node.create(create_req("w")).await.unwrap();
    let waiter = {
        let node = node.clone();
        tokio::spawn(async move { node.wait(&name("w"), 0, Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    node.append(append_req("w", &["hi"])).await.unwrap();
    assert_eq!(waiter.await.unwrap().unwrap(), WaitOutcome::Data);
    let t = node
        .wait(&name("w"), 1, Duration::from_millis(100))
        .await
        .unwrap();
    assert_eq!(t, WaitOutcome::Timeout);
}

/// The TTL slides with each access and expires exactly when it lapses, on the node's clock.
#[tokio::test]
async fn ttl_expires_stream() {
    let (node, clock) = node_on_manual_clock().await;
    let mut c = create_req("t");
    c.config.ttl_secs = Some(2);
    node.create(c).await.unwrap();
    node.append(append_req("t", &["x"])).await.unwrap();
    clock.advance(Duration::from_millis(1_200));
    // A read slides the TTL.
    read_all(&node, "t", 0).await;
    clock.advance(Duration::from_millis(1_999));
    assert!(node.head(&name("t")).await.is_ok(), "read slid the ttl");
    // The head above slid it too: 2 s after it, the stream is gone.
    clock.advance(Duration::from_millis(2_000));
    assert!(matches!(
        node.head(&name("t")).await,
        Err(ReadError::NotFound(_))
    ));
}

/// The maintenance loops wait on the node's clock: moving a manual clock past the expiry
/// sweep's period wakes it, and it removes an expired stream nobody asks for, with no real
/// time passing for it.
#[tokio::test]
async fn the_expiry_sweep_runs_on_the_node_clock() {
    let (node, clock) = node_on_manual_clock().await;
    let mut c = create_req("swept");
    c.config.expires_at_ms = Some(node.now_ms() + 1_000);
    node.create(c).await.unwrap();
    // Past the sweep's 10 s period; nothing reads the stream, so only the sweep can see it.
    clock.advance(Duration::from_secs(11));
    for _ in 0..1_000 {
        if !node.meta().view().registry.contains_key("swept") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the sweep did not run when the clock moved");
}

#[tokio::test]
async fn list_with_prefix_and_pages() {
    let node = start_test_node().await;
    for n in ["x/1", "x/2", "x/3", "y/1"] {
        node.create(create_req(n)).await.unwrap();
    }
    let page = node.list(ListRequest {
        prefix: Some("x/".into()),
        start_after: None,
        limit: 2,
    });
    let names: Vec<_> = page.streams.iter().map(|s| s.name.to_string()).collect();
    assert_eq!(names, vec!["x/1", "x/2"]);
    assert!(page.has_more);
    let rest = node.list(ListRequest {
        prefix: Some("x/".into()),
        start_after: Some("x/2".into()),
        limit: 2,
    });
    assert_eq!(rest.streams.len(), 1);
    assert!(!rest.has_more);
}

/// Starts a node on file storage and a SQLite file in `dir`, inside its own runtime.
fn file_node(rt: &tokio::runtime::Runtime, dir: &std::path::Path, epoch: u64) -> Node {
    file_node_with(rt, dir, epoch, false)
}

/// [`file_node`], the WAL as segment files in `dir/wal` (as `pico serve` sets it up) when
/// `segments`, else an `ObjectWal` on the data storage.
fn file_node_with(
    rt: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    epoch: u64,
    segments: bool,
) -> Node {
    rt.block_on(async {
        let meta = MetaLog::open(
            &format!("sqlite:{}", dir.join("meta.db").display()),
            MetaLogOptions::default(),
        )
        .await
        .unwrap();
        let data: Arc<dyn ObjectStorage> =
            Arc::new(FileStorage::open(dir.join("objects")).unwrap());
        let wal: Arc<dyn Wal> = if segments {
            Arc::new(SegmentWal::new(dir.join("wal")).with_preallocation(true))
        } else {
            Arc::new(ObjectWal::new(data.clone(), "wal/1".into()))
        };
        let config = NodeConfig {
            node_epoch: epoch,
            ..NodeConfig::default()
        };
        Node::start(config, meta, data, wal, EngineConfig::default())
            .await
            .unwrap()
    })
}

/// Touches not yet due for persisting (under a quarter of the TTL) are persisted by a graceful
/// shutdown: a restart must not make TTL streams expire early.
#[test]
fn a_shutdown_persists_pending_ttl_touches() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt, dir.path(), 1);
    let touched = rt.block_on(async {
        let mut req = create_req("t");
        req.config.ttl_secs = Some(3600);
        node.create(req).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let out = node.append(append_req("t", &["x"])).await.unwrap();
        let created = node.meta().view().registry["t"].last_touch_ms;
        assert!(out.timestamp_ms > created);
        node.shutdown().await;
        out.timestamp_ms
    });
    drop(node);
    let node = file_node(&rt, dir.path(), 2);
    assert_eq!(node.meta().view().registry["t"].last_touch_ms, touched);
    rt.block_on(node.shutdown());
}

#[test]
fn acknowledged_appends_survive_a_crash_with_producer_state() {
    let dir = tempfile::tempdir().unwrap();
    let rt1 = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt1, dir.path(), 1);
    rt1.block_on(async {
        node.create(create_req("c")).await.unwrap();
        for seq in 0..50u64 {
            let req = producer_req("c", "p", seq, false, &[&format!("r{seq}")]);
            node.append(req).await.unwrap();
        }
    });
    // Crash: no shutdown, no flush; every task dies with the runtime.
    drop(node);
    rt1.shutdown_background();

    let rt2 = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt2, dir.path(), 2);
    rt2.block_on(async {
        let all = read_all(&node, "c", 0).await;
        let expect: Vec<(u64, String)> = (0..50).map(|i| (i, format!("r{i}"))).collect();
        assert_eq!(all, expect, "every acknowledged record at its offset, once");
        // Producer state survived with the data: a retry is a duplicate, the next seq continues.
        let dup = node
            .append(producer_req("c", "p", 49, false, &["dup"]))
            .await
            .unwrap();
        assert!(dup.duplicate);
        let next = node
            .append(producer_req("c", "p", 50, false, &["r50"]))
            .await
            .unwrap();
        assert_eq!(next.start_seq, Some(50));
        node.shutdown().await;
    });

    // A clean restart after shutdown sees the same, now from objects.
    let rt3 = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt3, dir.path(), 3);
    rt3.block_on(async {
        let all = read_all(&node, "c", 0).await;
        assert_eq!(all.len(), 51);
        assert_eq!(all[50], (50, "r50".to_string()));
    });
}

/// `bodies` appended to `stream` under producer `id` (epoch 0) at `seq`, closing if `close`.
fn producer_req(stream: &str, id: &str, seq: u64, close: bool, bodies: &[&str]) -> AppendRequest {
    AppendRequest {
        producer: Some(ProducerClaim {
            id: id.into(),
            epoch: 0,
            seq,
        }),
        close,
        ..append_req(stream, bodies)
    }
}

/// Where the committed producer state says `id`'s last append on `stream` lies.
fn committed_place(node: &Node, stream: &str, id: &str) -> (u64, u64) {
    let view = node.meta().view();
    let p = view.streams[&view.registry[stream].stream_id].producers[id];
    (p.start_offset, p.end_offset)
}

/// A retried producer append is answered with where the original's records lie, not the tail
/// (issue 36: acked at 5916, stored at 5915): exactly for the producer's last seq, and with no
/// start (unknown) for an older one, whose offsets are no longer kept.
#[tokio::test]
async fn a_duplicate_producer_append_answers_its_original_offsets() {
    let node = start_test_node().await;
    node.create(create_req("d")).await.unwrap();
    node.append(append_req("d", &["a", "b", "c"]))
        .await
        .unwrap();
    let first = node
        .append(producer_req("d", "w", 0, false, &["p0", "p0'"]))
        .await
        .unwrap();
    assert_eq!((first.start_seq, first.next_seq), (Some(3), 5));
    // Others append meanwhile, with and without a producer.
    node.append(append_req("d", &["x"])).await.unwrap();
    node.append(producer_req("d", "v", 0, false, &["v0"]))
        .await
        .unwrap();
    let retry = node
        .append(producer_req("d", "w", 0, false, &["p0", "p0'"]))
        .await
        .unwrap();
    assert!(retry.duplicate);
    assert_eq!((retry.start_seq, retry.next_seq), (Some(3), 5));
    assert_eq!(retry.producer, Some((0, 0)));

    let second = node
        .append(producer_req("d", "w", 1, false, &["p1"]))
        .await
        .unwrap();
    assert_eq!((second.start_seq, second.next_seq), (Some(7), 8));
    node.append(append_req("d", &["y"])).await.unwrap();
    let old = node
        .append(producer_req("d", "w", 0, false, &["p0"]))
        .await
        .unwrap();
    assert!(old.duplicate);
    assert_eq!(
        (old.start_seq, old.next_seq),
        (None, 9),
        "an older seq: no start (unknown), the next seq is the tail"
    );
    assert_eq!(old.producer, Some((0, 1)));
    let again = node
        .append(producer_req("d", "w", 1, false, &["p1"]))
        .await
        .unwrap();
    assert!(again.duplicate);
    assert_eq!((again.start_seq, again.next_seq), (Some(7), 8));
    assert_eq!(
        read_all(&node, "d", 0).await.len(),
        9,
        "duplicates wrote nothing"
    );

    // Uploaded: the committed producer state keeps the place, and the answer stays the same.
    node.engine().flush().await.unwrap();
    assert_eq!(committed_place(&node, "d", "w"), (7, 8));
    assert_eq!(committed_place(&node, "d", "v"), (6, 7));
    let uploaded = node
        .append(producer_req("d", "w", 1, false, &["p1"]))
        .await
        .unwrap();
    assert_eq!((uploaded.start_seq, uploaded.next_seq), (Some(7), 8));

    // The retry of an append-and-close is answered with its records' place too.
    node.create(create_req("e")).await.unwrap();
    node.append(append_req("e", &["a", "b"])).await.unwrap();
    let closing = node
        .append(producer_req("e", "w", 0, true, &["last"]))
        .await
        .unwrap();
    assert_eq!((closing.start_seq, closing.next_seq), (Some(2), 3));
    let retry = node
        .append(producer_req("e", "w", 0, true, &["last"]))
        .await
        .unwrap();
    assert!(retry.duplicate && retry.closed);
    assert_eq!((retry.start_seq, retry.next_seq), (Some(2), 3));
}

/// What a node answers the retries of [`a_duplicate_producer_append_answers_its_original_offsets_after_restarts`].
async fn check_restarted_duplicates(node: &Node) {
    let dup = node
        .append(producer_req("c", "w", 1, false, &["p1", "p1'"]))
        .await
        .unwrap();
    assert!(dup.duplicate);
    assert_eq!((dup.start_seq, dup.next_seq), (Some(4), 6));
    let old = node
        .append(producer_req("c", "w", 0, false, &["p0"]))
        .await
        .unwrap();
    assert!(old.duplicate);
    assert_eq!((old.start_seq, old.next_seq), (None, 7));
    let closer = node
        .append(producer_req("z", "q", 0, true, &["last"]))
        .await
        .unwrap();
    assert!(closer.duplicate && closer.closed);
    assert_eq!((closer.start_seq, closer.next_seq), (Some(1), 2));
}

/// The original offsets of a producer's last append survive a crash (rebuilt from the WAL) and
/// a clean restart (from the committed objects' metadata), as does the place of the append that
/// closed a stream.
#[test]
fn a_duplicate_producer_append_answers_its_original_offsets_after_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let rt1 = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt1, dir.path(), 1);
    rt1.block_on(async {
        node.create(create_req("c")).await.unwrap();
        node.append(append_req("c", &["a", "b"])).await.unwrap();
        node.append(producer_req("c", "w", 0, false, &["p0"]))
            .await
            .unwrap();
        node.append(append_req("c", &["x"])).await.unwrap();
        let last = node
            .append(producer_req("c", "w", 1, false, &["p1", "p1'"]))
            .await
            .unwrap();
        assert_eq!((last.start_seq, last.next_seq), (Some(4), 6));
        node.append(append_req("c", &["y"])).await.unwrap();
        node.create(create_req("z")).await.unwrap();
        node.append(append_req("z", &["a"])).await.unwrap();
        node.append(producer_req("z", "q", 0, true, &["last"]))
            .await
            .unwrap();
    });
    // Crash: no shutdown, no flush; every task dies with the runtime.
    drop(node);
    rt1.shutdown_background();

    let rt2 = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt2, dir.path(), 2);
    rt2.block_on(async {
        check_restarted_duplicates(&node).await;
        node.shutdown().await;
    });
    drop(node);

    let rt3 = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt3, dir.path(), 3);
    rt3.block_on(async {
        assert_eq!(committed_place(&node, "c", "w"), (4, 6));
        check_restarted_duplicates(&node).await;
        assert_eq!(read_all(&node, "c", 0).await.len(), 7);
        node.shutdown().await;
    });
}

/// Large records take the path where the batch's CRC is carried and combined into the WAL
/// frame's and the data object frame's checksums: recovery from the WAL after a crash, and
/// reads from the objects after a clean restart, verify every byte against those checksums.
#[test]
fn large_appends_survive_a_crash_and_read_back_from_objects() {
    let dir = tempfile::tempdir().unwrap();
    let node_on =
        |rt: &tokio::runtime::Runtime, epoch: u64| file_node_with(rt, dir.path(), epoch, true);
    // Sizes around and far above the size from which CRCs are combined.
    let bodies: Vec<String> = [8 << 10, (8 << 10) + 1, 65_536, 100_003, 12, 300_000]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let c = (b'a' + i as u8) as char;
            std::iter::repeat_n(c, n).collect()
        })
        .collect();
    let expect: Vec<(u64, String)> = bodies
        .iter()
        .cloned()
        .enumerate()
        .map(|(i, b)| (i as u64, b))
        .collect();

    let rt1 = tokio::runtime::Runtime::new().unwrap();
    let node = node_on(&rt1, 1);
    rt1.block_on(async {
        node.create(create_req("big")).await.unwrap();
        for b in &bodies {
            node.append(append_req("big", &[b])).await.unwrap();
        }
    });
    // Crash: no shutdown; everything comes back from the WAL.
    drop(node);
    rt1.shutdown_background();

    // First from the WAL; then, after a clean shutdown uploaded everything, from the objects.
    for (epoch, source) in [(2, "the WAL"), (3, "the data objects")] {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let node = node_on(&rt, epoch);
        rt.block_on(async {
            assert_eq!(
                read_all(&node, "big", 0).await,
                expect,
                "read from {source}"
            );
            node.shutdown().await;
        });
    }
}

#[test]
fn stream_seq_survives_a_crash_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let rt1 = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt1, dir.path(), 1);
    let seq = |s: &str| AppendOptions {
        stream_seq: Some(s.to_string()),
    };
    rt1.block_on(async {
        node.create(create_req("q")).await.unwrap();
        node.append_with(append_req("q", &["a"]), seq("b"))
            .await
            .unwrap();
        let regress = node.append_with(append_req("q", &["x"]), seq("a")).await;
        assert!(matches!(regress, Err(AppendError::SeqRegression { .. })));
    });
    drop(node);
    rt1.shutdown_background();

    let rt2 = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt2, dir.path(), 2);
    rt2.block_on(async {
        // Recovered from the WAL aux bytes with the data: "b" is still the last seq.
        let again = node.append_with(append_req("q", &["x"]), seq("b")).await;
        assert!(matches!(again, Err(AppendError::SeqRegression { .. })));
        node.append_with(append_req("q", &["c"]), seq("c"))
            .await
            .unwrap();
        let all = read_all(&node, "q", 0).await;
        assert_eq!(all, vec![(0, "a".to_string()), (1, "c".to_string())]);
    });
}

#[tokio::test]
async fn fork_reads_stop_at_the_fork_point_inside_a_batch() {
    let node = start_test_node().await;
    node.create(create_req("src")).await.unwrap();
    node.append(append_req("src", &["0", "1", "2", "3"]))
        .await
        .unwrap();
    let fork = |n: &str, source: &str, offset| ForkRequest {
        name: name(n),
        source: name(source),
        offset: Some(offset),
        sub_offset: 0,
        config: CreateConfig::default(),
        initial: vec![],
    };
    let out = node.fork(fork("f", "src", 2)).await.unwrap();
    assert!(out.created);
    assert_eq!(out.info.next_seq, 2);
    node.append(append_req("f", &["f2"])).await.unwrap();
    node.append(append_req("src", &["4"])).await.unwrap();
    assert_eq!(
        read_all(&node, "f", 0).await,
        vec![
            (0, "0".to_string()),
            (1, "1".to_string()),
            (2, "f2".to_string())
        ]
    );
    assert_eq!(read_all(&node, "src", 0).await.len(), 5);
    // Producer state is not inherited; the source's deletion is soft while the fork lives.
    node.delete(&name("src")).await.unwrap();
    assert!(node.is_gone(&name("src")));
    assert!(matches!(
        node.head(&name("src")).await,
        Err(ReadError::Gone(_))
    ));
    assert_eq!(read_all(&node, "f", 1).await.len(), 2);
    node.delete(&name("f")).await.unwrap();
    assert!(!node.is_gone(&name("src")));
    assert!(matches!(
        node.head(&name("src")).await,
        Err(ReadError::NotFound(_))
    ));
}

#[tokio::test]
async fn reads_past_the_tail_are_refused() {
    let node = start_test_node().await;
    node.create(create_req("tail")).await.unwrap();
    node.append(append_req("tail", &["a"])).await.unwrap();
    let req = |from| ReadRequest {
        name: name("tail"),
        from: ReadFrom::Offset(from),
        max_records: None,
        max_bytes: None,
        touch: false,
    };
    let at_tail = node.read(req(1)).await.unwrap();
    assert!(at_tail.records.is_empty() && at_tail.up_to_date);
    assert!(matches!(
        node.read(req(5)).await,
        Err(ReadError::BeyondTail {
            offset: 5,
            next_seq: 1
        })
    ));
}

#[tokio::test]
async fn create_with_body_and_close_is_idempotent() {
    let node = start_test_node().await;
    let req = || CreateRequest {
        name: name("once"),
        config: CreateConfig {
            closed: true,
            ..CreateConfig::default()
        },
        initial: vec![rec("first")],
    };
    assert!(node.create(req()).await.unwrap().created);
    let again = node.create(req()).await.unwrap();
    assert!(
        !again.created,
        "a retry of the same create is not a conflict"
    );
    assert!(again.info.closed);
    assert_eq!(
        read_all(&node, "once", 0).await,
        vec![(0, "first".to_string())]
    );
}

#[tokio::test]
async fn oversized_inputs_are_bad_requests() {
    let node = start_test_node().await;
    let mut c = create_req("big");
    c.config.ttl_secs = Some(u64::MAX);
    assert!(matches!(
        node.create(c).await,
        Err(CreateError::BadRequest(_))
    ));
    node.create(create_req("big")).await.unwrap();
    let seq = "s".repeat(producers::MAX_STREAM_SEQ_LEN + 1);
    let r = node
        .append_with(
            append_req("big", &["x"]),
            AppendOptions {
                stream_seq: Some(seq),
            },
        )
        .await;
    assert!(matches!(r, Err(AppendError::BadRequest(_))));
    let max = pico_server::node::MAX_RECORDS_PER_APPEND;
    let many: Vec<String> = (0..=max).map(|i| i.to_string()).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    assert!(matches!(
        node.append(append_req("big", &refs)).await,
        Err(AppendError::TooLarge { .. })
    ));
    let ok = node.append(append_req("big", &refs[..max])).await.unwrap();
    assert_eq!(ok.next_seq, max as u64);
}

#[tokio::test]
async fn slots_bound_the_open_streams() {
    let node = pico_server::testing::start_test_node_with(NodeConfig {
        slots: Some(1),
        ..NodeConfig::default()
    })
    .await;
    node.create(create_req("one")).await.unwrap();
    node.create(create_req("two")).await.unwrap();
    node.append(append_req("one", &["a"])).await.unwrap();
    assert!(matches!(
        node.append(append_req("two", &["b"])).await,
        Err(AppendError::Unavailable(_))
    ));
    assert_eq!(
        node.open_streams(),
        1,
        "a refused open leaves no slot behind"
    );
    node.append(append_req("one", &["c"])).await.unwrap();
}

#[tokio::test]
async fn a_failed_open_does_not_keep_counting_against_the_slots() {
    let node = pico_server::testing::start_test_node_with(NodeConfig {
        slots: Some(1),
        ..NodeConfig::default()
    })
    .await;
    node.create(create_req("one")).await.unwrap();
    node.create(create_req("two")).await.unwrap();
    // A newer incarnation of this node id registers: every open of this one is now rejected.
    node.meta()
        .propose(pico_metadata::Command::RegisterNode {
            node_id: node.config().node_id,
            node_epoch: node.config().node_epoch + 1,
            address: "http://127.0.0.1:1".into(),
            now_ms: 0,
        })
        .await
        .unwrap()
        .unwrap();
    let first = node.append(append_req("one", &["a"])).await;
    assert!(
        matches!(&first, Err(AppendError::Unavailable(m)) if m.contains("open rejected")),
        "got {first:?}"
    );
    assert_eq!(
        node.open_streams(),
        0,
        "a failed open leaves no slot behind"
    );
    let second = node.append(append_req("two", &["b"])).await;
    assert!(
        matches!(&second, Err(AppendError::Unavailable(m)) if !m.contains("open-stream limit")),
        "the failed open still counts against the limit: {second:?}"
    );
}

/// With the WAL stalled and the engine's queue full, appends queued behind one stream's lock
/// each give up at their own deadline (the lock wait and the queue space together), rather
/// than one full timeout after another while holding their bodies.
#[tokio::test]
async fn appends_queued_behind_a_stalled_stream_give_up_at_one_deadline() {
    let wal = fault_wal();
    let engine = EngineConfig {
        max_unflushed_bytes: 4096,
        ..EngineConfig::default()
    };
    let timeout = Duration::from_millis(400);
    let config = NodeConfig {
        submit_timeout: timeout,
        ..NodeConfig::default()
    };
    let node = start_test_node_on(config, wal.clone(), engine).await;
    node.create(create_req("s")).await.unwrap();
    wal.hold_appends(true);
    let big = "x".repeat(3000);
    // Takes the queue's space and waits for the WAL, outside the stream's lock.
    let first = tokio::spawn({
        let (node, big) = (node.clone(), big.clone());
        async move { node.append(append_req("s", &[&big])).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let queued: Vec<_> = (0..8)
        .map(|_| {
            let (node, big) = (node.clone(), big.clone());
            tokio::spawn(async move { node.append(append_req("s", &[&big])).await })
        })
        .collect();
    for q in queued {
        let r = q.await.unwrap();
        assert!(matches!(r, Err(AppendError::Unavailable(_))), "{r:?}");
    }
    // One after another would take 8 × 400 ms.
    let took = started.elapsed();
    assert!(
        took < timeout * 4,
        "the queued appends gave up after {took:?}"
    );
    wal.hold_appends(false);
    assert!(first.await.unwrap().is_ok());
}

/// An append waits for its WAL write in the request itself (no task per append); a request
/// dropped during that wait (the client went away) still has a failed write break the open
/// stream, so the next request reloads the committed state instead of trusting this writer's.
#[tokio::test]
async fn a_dropped_append_whose_write_fails_still_breaks_the_open_stream() {
    let wal = fault_wal();
    let node = start_test_node_with_wal(NodeConfig::default(), wal.clone()).await;
    node.create(create_req("s")).await.unwrap();
    assert!(node.append(append_req("s", &["a"])).await.is_ok());
    assert_eq!(node.open_streams(), 1);
    wal.hold_appends(true);
    let request = tokio::spawn({
        let node = node.clone();
        async move { node.append(append_req("s", &["b"])).await }
    });
    // Submitted, and waiting for the stalled WAL.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while node.engine().stats().appends < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the append never reached the engine"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    request.abort();
    assert!(request.await.unwrap_err().is_cancelled());
    // Every attempt of the write fails once the WAL moves again.
    wal.fail_appends(100);
    wal.hold_appends(false);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while node.open_streams() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the failed write of a dropped request left the stream open as if nothing happened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wal.fail_appends(0);
    // The next request reopens the stream at its committed state and goes on from there.
    let next = node.append(append_req("s", &["c"])).await.unwrap();
    assert_eq!(next.next_seq, 2, "{next:?}");
}

#[tokio::test]
async fn a_read_inside_a_range_fenced_before_upload_is_unavailable() {
    // Uploads happen only when asked, so the appends stay unuploaded until the fence is set up.
    let wal: Arc<dyn Wal> = Arc::new(ObjectWal::new(Arc::new(MemoryStorage::new()), "wal".into()));
    let engine = EngineConfig {
        upload_interval: Duration::from_secs(3600),
        ..EngineConfig::default()
    };
    let node = start_test_node_on(NodeConfig::default(), wal, engine).await;
    node.create(create_req("f")).await.unwrap();
    let appended = node
        .append(append_req("f", &["a", "b", "c"]))
        .await
        .unwrap();
    assert_eq!(appended.next_seq, 3);
    assert_eq!(
        node.engine().stats().uploads,
        0,
        "uploaded before the fence"
    );
    let stream_id = node.head(&name("f")).await.unwrap().stream_id;

    // The stream is released behind the engine's back (as a bug elsewhere might) and another
    // node opens it: this node's range of it is now fenced.
    let other = node.config().node_id + 1;
    node.meta()
        .propose(pico_metadata::Command::ReleaseStream {
            stream_id,
            epoch: 0,
            node_id: node.config().node_id,
            node_epoch: 1,
        })
        .await
        .unwrap()
        .unwrap();
    node.meta()
        .propose(pico_metadata::Command::RegisterNode {
            node_id: other,
            node_epoch: 1,
            address: "http://127.0.0.1:1".into(),
            now_ms: 0,
        })
        .await
        .unwrap()
        .unwrap();
    node.meta()
        .propose(pico_metadata::Command::OpenStream {
            stream_id,
            node_id: other,
            node_epoch: 1,
        })
        .await
        .unwrap()
        .unwrap();
    node.engine().flush().await.unwrap();
    assert_eq!(
        node.engine().stats().rejected_ranges,
        1,
        "the catalog did not reject the fenced range"
    );

    for from in [0, 1, 2] {
        let read = node
            .read(ReadRequest {
                name: name("f"),
                from: ReadFrom::Offset(from),
                max_records: None,
                max_bytes: None,
                touch: false,
            })
            .await;
        assert!(
            matches!(&read, Err(ReadError::Unavailable(m)) if m.contains("being recovered")),
            "read from {from} inside the rejected range: {read:?}"
        );
    }
}

#[tokio::test]
async fn retrying_a_fork_created_closed_is_idempotent() {
    let node = start_test_node().await;
    node.create(create_req("src")).await.unwrap();
    node.append(append_req("src", &["0", "1"])).await.unwrap();
    let fork = |n: &str, initial: &[&str]| fork_req(n, "src", true, initial);
    for (n, body) in [("empty", &[][..]), ("body", &["own"][..])] {
        let first = node.fork(fork(n, body)).await.unwrap();
        assert!(first.created && first.info.closed);
        let again = node.fork(fork(n, body)).await;
        let again = again.unwrap_or_else(|e| panic!("retry of closed fork `{n}` failed: {e:?}"));
        assert!(!again.created);
        assert!(again.info.closed);
        assert_eq!(again.info.stream_id, first.info.stream_id);
        assert_eq!(read_all(&node, n, 0).await.len(), 2 + body.len());
    }
    // Still a conflict when the retry asks for an open fork.
    let mut open = fork("empty", &[]);
    open.config.closed = false;
    assert!(matches!(
        node.fork(open).await,
        Err(ForkError::Conflict { .. })
    ));
}

/// Records a stream would refuse are refused before a create or fork makes the stream: it
/// must not be left behind open and empty, failing every retry the same way.
#[tokio::test]
async fn a_create_or_fork_with_records_it_cannot_store_creates_nothing() {
    let node = start_test_node().await;
    let mut bad = rec("x");
    bad.headers = vec![
        ("h".into(), Bytes::from_static(b"1")),
        ("h".into(), Bytes::new()),
    ];
    let create = CreateRequest {
        initial: vec![bad.clone()],
        ..create_req("c")
    };
    let e = node.create(create).await.unwrap_err();
    assert!(
        matches!(e, CreateError::Append(AppendError::BadRequest(_))),
        "{e:?}"
    );
    node.create(create_req("src")).await.unwrap();
    let fork = ForkRequest {
        name: name("f"),
        source: name("src"),
        offset: None,
        sub_offset: 0,
        config: CreateConfig::default(),
        initial: vec![bad],
    };
    let e = node.fork(fork).await.unwrap_err();
    assert!(
        matches!(e, ForkError::Append(AppendError::BadRequest(_))),
        "{e:?}"
    );
    for n in ["c", "f"] {
        assert!(node.head(&name(n)).await.is_err(), "`{n}` was created");
    }
}

/// A fork created closed is closed at the end of what it inherits: a read that stops short of
/// it (one inherited slice per read, or a small `count`) must not report the stream closed, or
/// readers that stop at "closed" would skip the rest.
#[tokio::test]
async fn a_fork_created_closed_reports_closed_only_at_its_end() {
    let node = start_test_node().await;
    node.create(create_req("src")).await.unwrap();
    node.append(append_req("src", &["0", "1"])).await.unwrap();
    node.engine().flush().await.unwrap();
    node.append(append_req("src", &["2", "3"])).await.unwrap();
    node.engine().flush().await.unwrap();
    let fork = fork_req("f", "src", true, &[]);
    assert!(node.fork(fork).await.unwrap().info.closed);
    let read = |from: u64| ReadRequest {
        name: name("f"),
        from: ReadFrom::Offset(from),
        max_records: Some(1),
        max_bytes: None,
        touch: false,
    };
    for from in 0..3 {
        let r = node.read(read(from)).await.unwrap();
        assert_eq!(r.next_seq, from + 1);
        assert!(!r.closed, "closed reported at {} of 4", r.next_seq);
    }
    let last = node.read(read(3)).await.unwrap();
    assert_eq!(last.next_seq, 4);
    assert!(last.closed, "the end of a closed fork is closed");
}

#[test]
fn uncommitted_objects_of_earlier_incarnations_are_collected() {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let node = file_node(&rt, dir.path(), 1);
    let storage = FileStorage::open(dir.path().join("objects")).unwrap();
    let orphan = "data/1/1/99999999999999999999";
    rt.block_on(async {
        node.create(create_req("o")).await.unwrap();
        node.append(append_req("o", &["kept"])).await.unwrap();
        node.shutdown().await;
        // An upload of incarnation 1 that never got committed (crash between PUT and commit).
        storage
            .put(orphan, Bytes::from_static(b"junk"))
            .await
            .unwrap();
    });
    let node = file_node(&rt, dir.path(), 2);
    rt.block_on(async {
        let committed: Vec<String> = node.meta().view().objects.keys().cloned().collect();
        assert!(!committed.is_empty());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while storage
            .list("data/")
            .await
            .unwrap()
            .contains(&orphan.to_string())
        {
            assert!(std::time::Instant::now() < deadline, "orphan not collected");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let left = storage.list("data/").await.unwrap();
        for key in &committed {
            assert!(left.contains(key), "committed object deleted: {key}");
        }
        assert_eq!(read_all(&node, "o", 0).await, vec![(0, "kept".to_string())]);
    });
}

fn read_req(n: &str, from: u64, max_records: usize, max_bytes: usize) -> ReadRequest {
    ReadRequest {
        name: name(n),
        from: ReadFrom::Offset(from),
        max_records: Some(max_records),
        max_bytes: Some(max_bytes),
        touch: true,
    }
}

#[tokio::test]
async fn reads_never_exceed_the_chunk_size_whatever_the_client_asks() {
    let node = pico_server::testing::start_test_node_with(NodeConfig {
        max_chunk_size: 100,
        ..NodeConfig::default()
    })
    .await;
    node.create(create_req("big")).await.unwrap();
    let thirty = "x".repeat(30);
    node.append(append_req("big", &[thirty.as_str(); 10]))
        .await
        .unwrap();
    let r = node
        .read(read_req("big", 0, usize::MAX, usize::MAX))
        .await
        .unwrap();
    let bytes: usize = r.records.iter().map(|r| r.record.value.len()).sum();
    assert_eq!(r.records.len(), 3, "three 30-byte records fit in 100 bytes");
    assert!(bytes <= 100);
    assert_eq!((r.next_seq, r.up_to_date), (3, false));
    // The reader continues at next_seq and gets everything exactly once.
    let r = node
        .read(read_req("big", r.next_seq, usize::MAX, usize::MAX))
        .await
        .unwrap();
    assert_eq!(r.records.first().map(|r| r.offset), Some(3));
    assert_eq!(r.next_seq, 6);
    // A smaller client limit still wins; one oversized record is still returned whole.
    let r = node.read(read_req("big", 0, 2, 1000)).await.unwrap();
    assert_eq!(r.records.len(), 2);
    let r = node.read(read_req("big", 0, 10, 1)).await.unwrap();
    assert_eq!((r.records.len(), r.next_seq), (1, 1));
}

#[tokio::test]
async fn reads_never_exceed_the_record_cap_whatever_the_client_asks() {
    let node = pico_server::testing::start_test_node_with(NodeConfig {
        max_chunk_size: 1 << 20,
        ..NodeConfig::default()
    })
    .await;
    node.create(create_req("many")).await.unwrap();
    let max = pico_server::node::MAX_RECORDS_PER_APPEND;
    node.append(append_req("many", &vec!["x"; max]))
        .await
        .unwrap();
    node.append(append_req("many", &["y"; 5])).await.unwrap();
    let cap = pico_server::node::MAX_READ_RECORDS;
    let r = node
        .read(read_req("many", 0, usize::MAX, usize::MAX))
        .await
        .unwrap();
    assert_eq!(r.records.len(), cap);
    assert_eq!((r.next_seq, r.up_to_date), (cap as u64, false));
    let rest = node
        .read(read_req("many", r.next_seq, usize::MAX, usize::MAX))
        .await
        .unwrap();
    assert_eq!(rest.next_seq, (max + 5) as u64);
    assert!(rest.up_to_date);
}

#[tokio::test]
async fn records_that_binary_reads_cannot_frame_are_refused() {
    let node = start_test_node().await;
    node.create(create_req("h")).await.unwrap();
    let with_headers = |headers: Vec<(String, Bytes)>| AppendRequest {
        records: vec![
            rec("fine"),
            Record {
                headers,
                ..rec("bad")
            },
        ],
        ..append_req("h", &[])
    };
    let long_key = vec![("k".repeat(70_000), Bytes::new())];
    match node.append(with_headers(long_key)).await {
        Err(AppendError::BadRequest(m)) => {
            assert!(m.contains("index=1") && m.contains("header key"), "{m}")
        }
        other => panic!("want BadRequest, got {other:?}"),
    }
    let many = vec![(String::new(), Bytes::new()); 65_536];
    assert!(matches!(
        node.append(with_headers(many)).await,
        Err(AppendError::BadRequest(_))
    ));
    // Nothing of a refused append is stored; the limits themselves are fine.
    let ok = vec![("k".repeat(65_535), Bytes::from_static(b"v"))];
    let out = node.append(with_headers(ok)).await.unwrap();
    assert_eq!((out.start_seq, out.next_seq), (Some(0), 2));
}

#[tokio::test]
async fn an_expired_stream_is_removed_by_one_task_however_often_it_is_asked_for() {
    // The stream expires only when the clock says so, not while it is being created (the
    // expiry sweep at start could remove a stream created already expired under the create).
    let (node, clock) = node_on_manual_clock().await;
    let mut c = create_req("exp");
    c.config.expires_at_ms = Some(node.now_ms() + 1_000);
    node.create(c).await.unwrap();
    clock.advance(Duration::from_secs(2));
    let metrics = tokio::runtime::Handle::current().metrics();
    // A current-thread runtime: nothing spawned runs until this test yields.
    let before = metrics.num_alive_tasks();
    for _ in 0..5 {
        assert!(matches!(
            node.head(&name("exp")).await,
            Err(ReadError::NotFound(_))
        ));
    }
    assert_eq!(
        metrics.num_alive_tasks() as i64 - before as i64,
        1,
        "one removal task per expired stream"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while node.meta().view().registry.contains_key("exp") {
        assert!(tokio::time::Instant::now() < deadline, "never removed");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Once it finished, a later expiry of the name is handled again.
    let mut c = create_req("exp");
    c.config.expires_at_ms = Some(node.now_ms() + 1_000);
    node.create(c).await.unwrap();
    clock.advance(Duration::from_secs(2));
    let before = metrics.num_alive_tasks();
    assert!(node.head(&name("exp")).await.is_err());
    assert_eq!(metrics.num_alive_tasks() as i64 - before as i64, 1);
}

/// An idempotent create with records never writes them into, or closes, a stream that some
/// other request made: its records are ignored, and asking for another closed status is a
/// conflict (Durable Streams: 409), as it is without records.
#[tokio::test]
async fn a_create_with_records_never_writes_into_or_closes_another_stream() {
    let node = start_test_node().await;
    let create = |n: &str, closed: bool, body: &[&str]| CreateRequest {
        name: name(n),
        config: CreateConfig {
            closed,
            ..CreateConfig::default()
        },
        initial: body.iter().map(|b| rec(b)).collect(),
    };
    // Made without records, still empty.
    assert!(
        node.create(create("plain", false, &[]))
            .await
            .unwrap()
            .created
    );
    let again = node.create(create("plain", false, &["x"])).await.unwrap();
    assert!(!again.created && !again.info.closed);
    assert!(matches!(
        node.create(create("plain", true, &["x"])).await,
        Err(CreateError::Conflict { .. })
    ));
    assert_eq!(read_all(&node, "plain", 0).await, vec![]);
    assert!(!node.head(&name("plain")).await.unwrap().closed);

    // Made with records and left open, then written to.
    node.create(create("live", false, &["a"])).await.unwrap();
    node.append(append_req("live", &["b"])).await.unwrap();
    assert!(matches!(
        node.create(create("live", true, &["a"])).await,
        Err(CreateError::Conflict { .. })
    ));
    assert!(
        !node
            .create(create("live", false, &["a"]))
            .await
            .unwrap()
            .created
    );
    assert!(!node.head(&name("live")).await.unwrap().closed);
    assert_eq!(
        read_all(&node, "live", 0).await,
        vec![(0, "a".to_string()), (1, "b".to_string())]
    );

    // Forks alike.
    let fork = |n: &str, closed: bool, body: &[&str]| fork_req(n, "live", closed, body);
    assert!(node.fork(fork("f", false, &[])).await.unwrap().created);
    assert!(matches!(
        node.fork(fork("f", true, &["x"])).await,
        Err(ForkError::Conflict { .. })
    ));
    assert!(!node.fork(fork("f", false, &["x"])).await.unwrap().created);
    assert_eq!(read_all(&node, "f", 0).await.len(), 2);
    assert!(!node.head(&name("f")).await.unwrap().closed);
}

/// A create with records is a command and then an append (and close): a retry after a failure
/// in between finishes the append and the close, once.
#[tokio::test]
async fn a_retried_create_finishes_what_its_first_attempt_left() {
    use pico_metadata::Initial;
    let node = start_test_node().await;
    for (n, initial, closed) in [
        ("half-open", Initial::Records, false),
        ("half-closed", Initial::RecordsThenClose, true),
    ] {
        // The first attempt's command landed; its append never happened.
        create_command_only(&node, n, initial).await;
        let retry = || CreateRequest {
            name: name(n),
            config: CreateConfig {
                closed,
                ..CreateConfig::default()
            },
            initial: vec![rec("first")],
        };
        for _ in 0..2 {
            let r = node.create(retry()).await.unwrap();
            assert!(!r.created, "{n}");
            assert_eq!(r.info.closed, closed, "{n}");
            assert_eq!(
                read_all(&node, n, 0).await,
                vec![(0, "first".to_string())],
                "{n}"
            );
        }
    }
}

/// What a create with records leaves when only its metadata command landed: the stream,
/// open, made by a create of that kind, with nothing written.
async fn create_command_only(node: &Node, name: &str, initial: pico_metadata::Initial) {
    use pico_metadata::{Command, StreamConfig};
    node.meta()
        .propose(Command::CreateStream {
            name: name.into(),
            config: StreamConfig {
                content_type: pico_protocol::headers::normalize_content_type(None).into(),
                ttl_secs: None,
                expires_at_ms: None,
            },
            closed: false,
            initial,
            now_ms: 1,
        })
        .await
        .unwrap()
        .unwrap();
}

/// A retried create-with-records-and-close whose stream another writer closed in between: done
/// if its records had landed (only its close failed), refused as closed if they had not (they
/// can never be written now), never a success with the records missing.
#[tokio::test]
async fn a_retried_create_meets_a_close_by_another_writer() {
    use pico_metadata::Initial;
    let node = start_test_node().await;
    for (n, landed) in [("never-written", false), ("written-not-closed", true)] {
        create_command_only(&node, n, Initial::RecordsThenClose).await;
        if landed {
            // The first attempt's records, under the create's reserved claim.
            node.append(producer_req(n, "\u{0}initial", 0, false, &["first"]))
                .await
                .unwrap();
        }
        node.append(AppendRequest {
            close: true,
            ..append_req(n, &[])
        })
        .await
        .unwrap();
        let retry = node
            .create(CreateRequest {
                name: name(n),
                config: CreateConfig {
                    closed: true,
                    ..CreateConfig::default()
                },
                initial: vec![rec("first")],
            })
            .await;
        if landed {
            let r = retry.unwrap();
            assert!(!r.created && r.info.closed, "{n}");
            assert_eq!(read_all(&node, n, 0).await, vec![(0, "first".to_string())]);
        } else {
            assert!(
                matches!(retry, Err(CreateError::Append(AppendError::Closed { .. }))),
                "{n}: {retry:?}"
            );
            assert!(read_all(&node, n, 0).await.is_empty(), "{n}");
        }
    }
}

/// The retry of a producer's append-and-close whose records became durable but whose close
/// did not (the metadata store failed in between) owes the close: it must not answer a plain
/// duplicate and leave the stream open for ever.
#[tokio::test]
async fn a_retried_append_and_close_closes_when_only_its_records_landed() {
    let node = start_test_node().await;
    node.create(create_req("s")).await.unwrap();
    let req = |close: bool| producer_req("s", "p", 0, close, &["last"]);
    // What the failed attempt left: its records and producer state, no close.
    node.append(req(false)).await.unwrap();
    assert!(!node.head(&name("s")).await.unwrap().closed);
    for _ in 0..2 {
        let retry = node.append(req(true)).await.unwrap();
        assert!(retry.duplicate && retry.closed, "{retry:?}");
        assert_eq!(retry.next_seq, 1);
        assert!(node.head(&name("s")).await.unwrap().closed);
    }
    assert_eq!(read_all(&node, "s", 0).await, vec![(0, "last".to_string())]);
    assert!(matches!(
        node.append(append_req("s", &["more"])).await,
        Err(AppendError::Closed { .. })
    ));
    // An older duplicate does not close.
    node.create(create_req("t")).await.unwrap();
    for seq in 0..2 {
        node.append(producer_req("t", "p", seq, false, &["r"]))
            .await
            .unwrap();
    }
    let old = node
        .append(producer_req("t", "p", 0, true, &["r"]))
        .await
        .unwrap();
    assert!(old.duplicate && !old.closed);
    assert!(!node.head(&name("t")).await.unwrap().closed);
}

/// Every record appended to a JSON stream is one JSON value, whichever protocol wrote it:
/// otherwise every Durable Streams JSON read of the stream would be broken JSON.
#[tokio::test]
async fn appends_to_a_json_stream_must_be_json_values() {
    let node = start_test_node().await;
    node.create(CreateRequest {
        config: CreateConfig {
            content_type: Some("application/json".into()),
            ..CreateConfig::default()
        },
        ..create_req("j")
    })
    .await
    .unwrap();
    for bad in [&b"hello"[..], b"", b"1 2", b"{\"a\":", b"\"\xff\""] {
        let req = AppendRequest {
            records: vec![Record {
                value: Bytes::copy_from_slice(bad),
                ..rec("")
            }],
            ..append_req("j", &[])
        };
        assert!(
            matches!(node.append(req).await, Err(AppendError::BadRequest(_))),
            "{bad:?}"
        );
    }
    node.append(append_req("j", &["{\"a\":1}", " [1, 2] ", "\"é\""]))
        .await
        .unwrap();
    assert_eq!(read_all(&node, "j", 0).await.len(), 3);
    // Other streams take any bytes.
    node.create(create_req("b")).await.unwrap();
    node.append(append_req("b", &["hello"])).await.unwrap();
    // A create's (or fork's) records are checked before the stream is made.
    let json = |n: &str, body: &str| CreateRequest {
        config: CreateConfig {
            content_type: Some("application/json".into()),
            closed: true,
            ..CreateConfig::default()
        },
        initial: vec![rec(body)],
        ..create_req(n)
    };
    assert!(matches!(
        node.create(json("k", "hello")).await,
        Err(CreateError::Append(AppendError::BadRequest(_)))
    ));
    assert!(matches!(
        node.head(&name("k")).await,
        Err(ReadError::NotFound(_))
    ));
    assert!(matches!(
        node.fork(fork_req("jf", "j", false, &["hello"])).await,
        Err(ForkError::Append(AppendError::BadRequest(_)))
    ));
    assert!(matches!(
        node.head(&name("jf")).await,
        Err(ReadError::NotFound(_))
    ));
    // A closed stream refuses any append as closed, whatever its records.
    node.create(json("k", "1")).await.unwrap();
    assert!(matches!(
        node.append(append_req("k", &["hello"])).await,
        Err(AppendError::Closed { next_seq: 1, .. })
    ));
}

/// A create with records and close of a name deleted while forks still hold it is a conflict,
/// as the same create without records is: not the deleted stream's 200.
#[tokio::test]
async fn a_create_of_a_soft_deleted_name_is_a_conflict_with_records_too() {
    let node = start_test_node().await;
    let closed_with = |body: &[&str]| CreateRequest {
        config: CreateConfig {
            closed: true,
            ..CreateConfig::default()
        },
        initial: body.iter().map(|b| rec(b)).collect(),
        ..create_req("src")
    };
    node.create(closed_with(&["a"])).await.unwrap();
    node.fork(fork_req("f", "src", false, &[])).await.unwrap();
    node.delete(&name("src")).await.unwrap();
    for body in [&[][..], &["a"][..]] {
        assert!(
            matches!(
                node.create(closed_with(body)).await,
                Err(CreateError::Conflict { .. })
            ),
            "{body:?}"
        );
    }
}

/// A metadata log that stopped for good (here: a row it cannot decode) fails every write until
/// a restart: the node must say it is not ready, with the reason, so that a supervisor or a
/// load balancer acts instead of clients retrying for ever.
#[tokio::test]
async fn a_stopped_metadata_log_makes_the_node_unready() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("meta.db").display());
    let meta = MetaLog::open(
        &url,
        MetaLogOptions {
            poll_interval: Duration::from_millis(20),
            ..MetaLogOptions::default()
        },
    )
    .await
    .unwrap();
    let data: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let wal: Arc<dyn Wal> = Arc::new(ObjectWal::new(data.clone(), "wal/1".into()));
    let node = Node::start(
        NodeConfig::default(),
        meta,
        data,
        wal,
        EngineConfig::default(),
    )
    .await
    .unwrap();
    let ready = node.ready();
    assert!(ready.ready && ready.metadata_stopped.is_none(), "{ready:?}");
    // Another writer's row that does not decode.
    let store = pico_sql::SqliteStore::open(&url).await.unwrap();
    sqlx::query("INSERT INTO meta_log (payload, count, created_at_ms) VALUES (?, 1, 0)")
        .bind(vec![9u8])
        .execute(store.pool())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let r = node.ready();
        if !r.ready {
            assert!(
                r.metadata_stopped
                    .as_ref()
                    .is_some_and(|m| m.contains("corrupt")),
                "{r:?}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still ready: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A node whose view lags (or that serves `--routing local`, or a Kafka client ignoring the
/// leader) must not open a stream another live node owns: the epoch bump would fence the
/// owner's acknowledged, not yet committed tail. The open is refused at apply, the append gets
/// a retryable 503, and the owner keeps the stream at its epoch.
#[tokio::test]
async fn an_append_here_never_takes_a_stream_another_node_owns() {
    use pico_server::testing::{OTHER_NODE, open_on_other_node, owner_of};
    let node = start_test_node().await;
    node.create(create_req("theirs")).await.unwrap();
    let (id, epoch) = open_on_other_node(&node, "theirs").await;
    let refused = node.append(append_req("theirs", &["x"])).await;
    assert!(
        matches!(&refused, Err(AppendError::Unavailable(m)) if m.contains("owned by another node")),
        "{refused:?}"
    );
    assert_eq!(owner_of(&node, id), Some(OTHER_NODE.0));
    assert_eq!(node.meta().view().streams[&id].epoch, epoch);

    // And the other way: a stream this node appended to is refused to the other node.
    node.create(create_req("mine")).await.unwrap();
    node.append(append_req("mine", &["a"])).await.unwrap();
    let mine = node.meta().view().registry["mine"].stream_id;
    let (other, other_epoch, _) = OTHER_NODE;
    let outcome = node
        .meta()
        .propose(pico_metadata::Command::OpenStream {
            stream_id: mine,
            node_id: other,
            node_epoch: other_epoch,
        })
        .await
        .unwrap();
    assert!(
        matches!(
            outcome,
            Err(pico_metadata::ApplyError::OwnedElsewhere { .. })
        ),
        "{outcome:?}"
    );
    assert_eq!(owner_of(&node, mine), Some(node.config().node_id));
    assert_eq!(
        node.append(append_req("mine", &["b"]))
            .await
            .unwrap()
            .next_seq,
        2
    );
}
