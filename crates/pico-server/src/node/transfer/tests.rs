//! Two node processes in one test, sharing one metadata log and one object store (as a cluster
//! shares Postgres and a bucket), each with its own WAL. Background loops are stopped: the test
//! runs each node's transfer pass itself, on a manual clock.

use super::*;
use crate::api::{AppendRequest, CreateRequest, ProducerClaim};
use crate::config::NodeConfig;
use pico_common::clock::ManualClock;
use pico_protocol::Record;
use pico_sql::{MetaLog, MetaLogOptions};
use s3stream::{EngineConfig, MemoryStorage, ObjectStorage, ObjectWal};

struct Pair {
    a: Node,
    b: Node,
    clock: Arc<ManualClock>,
}

async fn pair() -> Pair {
    let clock = ManualClock::new(1_000_000);
    let meta = MetaLog::open(
        "sqlite::memory:",
        MetaLogOptions {
            clock: clock.clone(),
            ..MetaLogOptions::default()
        },
    )
    .await
    .unwrap();
    let data: Arc<dyn ObjectStorage> = Arc::new(MemoryStorage::new());
    let start = |node_id: u32| {
        let (meta, data, clock) = (meta.clone(), data.clone(), clock.clone());
        async move {
            let config = NodeConfig {
                node_id,
                node_epoch: 10 + node_id as u64,
                advertised_url: format!("http://node{node_id}"),
                clock,
                ..NodeConfig::default()
            };
            let wal = Arc::new(ObjectWal::new(
                Arc::new(MemoryStorage::new()),
                "wal".to_string(),
            ));
            let engine = EngineConfig {
                upload_interval: Duration::from_secs(3600),
                ..EngineConfig::default()
            };
            let node = Node::start(config, meta, data, wal, engine).await.unwrap();
            for task in node.inner.tasks.lock().unwrap().drain(..) {
                task.abort();
            }
            node
        }
    };
    let a = start(1).await;
    let b = start(2).await;
    Pair { a, b, clock }
}

fn name(n: &str) -> StreamName {
    StreamName::parse(n).unwrap()
}

async fn create(node: &Node, n: &str) {
    node.create(CreateRequest {
        name: name(n),
        config: Default::default(),
        initial: vec![],
    })
    .await
    .unwrap();
}

fn produce(n: &str, seq: u64, body: &str) -> AppendRequest {
    AppendRequest {
        name: name(n),
        records: vec![Record::from_value(body.to_string())],
        producer: Some(ProducerClaim {
            id: "p".into(),
            epoch: 3,
            seq,
        }),
        match_seq: None,
        close: false,
        content_type: None,
    }
}

/// Runs one transfer pass on `node` and waits for what it started.
async fn pass(node: &Node) -> usize {
    let started = transfer_pass(node);
    let n = started.len();
    for t in started {
        t.await.unwrap();
    }
    n
}

/// One heartbeat of `node`, as its loop would send.
async fn beat(node: &Node) {
    let cfg = node.config();
    node.meta()
        .propose(Command::Heartbeat {
            node_id: cfg.node_id,
            node_epoch: cfg.node_epoch,
            now_ms: node.now_ms(),
        })
        .await
        .unwrap()
        .unwrap();
}

fn owner(node: &Node, n: &str) -> Option<u32> {
    node.placement(&name(n)).unwrap().owner.map(|o| o.node_id)
}

/// The whole handoff between two nodes: the owner drains and releases with a hint, routing on
/// the source points at the target, the target opens at the next epoch, and the idempotent
/// producer carries on there: the next seq lands at the next offset, a retry of the last one
/// before the move is answered as a duplicate with its original offsets.
#[tokio::test]
async fn a_transfer_moves_the_stream_with_offsets_and_producer_state() {
    let Pair { a, b, .. } = pair().await;
    create(&a, "s").await;
    for seq in 0..5 {
        let out = a.append(produce("s", seq, "x")).await.unwrap();
        assert_eq!(out.start_seq, Some(seq));
    }
    assert_eq!(owner(&a, "s"), Some(1));
    let accepted = b.request_transfer(&name("s"), 2).await.unwrap();
    assert_eq!(accepted.from_node, Some(1));
    assert_eq!(accepted.epoch, 0);
    assert_eq!(
        pass(&b).await,
        0,
        "nothing for the target before the release"
    );

    assert_eq!(pass(&a).await, 1, "the owner drains");
    let p = a.placement(&name("s")).unwrap();
    assert_eq!(p.owner, None, "released");
    assert_eq!(p.committed_end, 5, "everything acknowledged is committed");
    assert!(p.transfer.is_some_and(|t| t.released_ms.is_some()));
    assert_eq!(a.open_streams(), 0);
    assert_eq!(a.engine().is_open(p.stream_id), None);
    assert_eq!(a.owner_url(&name("s")).as_deref(), Some("http://node2"));
    assert_eq!(b.owner_url(&name("s")), None, "the target serves it");

    assert_eq!(pass(&b).await, 1, "the target opens it at once");
    let p = b.placement(&name("s")).unwrap();
    assert_eq!(p.owner.map(|o| o.node_id), Some(2));
    assert_eq!(p.epoch, 1);
    assert_eq!(p.transfer, None, "the open ends the transfer");
    assert_eq!(b.open_streams(), 1);

    let out = b.append(produce("s", 5, "y")).await.unwrap();
    assert_eq!((out.start_seq, out.next_seq), (Some(5), 6));
    let dup = b.append(produce("s", 5, "y")).await.unwrap();
    assert!(dup.duplicate);
    assert_eq!(dup.start_seq, Some(5));
    // A gap is still a gap on the target: its state is the source's.
    let gap = b.append(produce("s", 7, "z")).await.unwrap_err();
    assert!(matches!(gap, AppendError::SequenceGap { .. }), "{gap:?}");
}

/// While the source drains, an append already queued on the writer is refused before anything
/// is written (503, the client retries), a write at the routing door waits for the handoff,
/// and no open happens here; once released the door sends it to the target.
#[tokio::test]
async fn writes_during_the_drain_are_held_or_refused_unwritten() {
    let Pair { a, b, .. } = pair().await;
    create(&a, "s").await;
    a.append(produce("s", 0, "x")).await.unwrap();
    let id = a.placement(&name("s")).unwrap().stream_id;
    let open = a.inner.open.get(id).unwrap();
    // An append in progress holds the writer.
    let busy = open.writer.lock().await;
    a.request_transfer(&name("s"), 2).await.unwrap();
    let drains = transfer_pass(&a);
    assert_eq!(drains.len(), 1);
    while !a.handing_off(id) {
        tokio::task::yield_now().await;
    }
    assert_eq!(transfer_pass(&a).len(), 0, "one drain per stream");
    let queued = tokio::spawn({
        let a = a.clone();
        async move { a.append(produce("s", 1, "y")).await }
    });
    let held = tokio::spawn({
        let a = a.clone();
        async move { a.hold_for_handoff(&name("s")).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        !held.is_finished(),
        "the door holds writes during the drain"
    );
    drop(busy);
    for d in drains {
        d.await.unwrap();
    }
    held.await.unwrap();
    let refused = queued.await.unwrap().unwrap_err();
    assert!(
        matches!(refused, AppendError::Unavailable(_)),
        "{refused:?}"
    );
    assert_eq!(a.placement(&name("s")).unwrap().committed_end, 1);
    assert_eq!(a.owner_url(&name("s")).as_deref(), Some("http://node2"));
    // The client's retry, redirected, lands once on the target.
    let out = b.append(produce("s", 1, "y")).await.unwrap();
    assert_eq!((out.start_seq, out.duplicate), (Some(1), false));
}

/// A stream nobody owns is released for the target at once, which opens it; the hint steers
/// only for `HINT_TTL` (a target that never opens does not strand the stream).
#[tokio::test]
async fn an_unowned_stream_goes_straight_to_the_target_and_the_hint_expires() {
    let Pair { a, b, clock } = pair().await;
    create(&a, "u").await;
    let accepted = a.request_transfer(&name("u"), 2).await.unwrap();
    assert_eq!(accepted.from_node, None);
    assert_eq!(a.owner_url(&name("u")).as_deref(), Some("http://node2"));
    clock.advance(HINT_TTL);
    assert_eq!(a.owner_url(&name("u")), None, "the hint expired");
    assert_eq!(pass(&b).await, 0, "too late to act on");

    beat(&b).await; // still live after the clock moved
    a.request_transfer(&name("u"), 2).await.unwrap();
    assert_eq!(pass(&b).await, 1);
    assert_eq!(owner(&a, "u"), Some(2));
}

/// Refusals: unknown stream or node, a target that already owns it, a transfer under way, and
/// a target whose heartbeat this node saw unchanged for the liveness timeout.
#[tokio::test]
async fn transfer_requests_are_refused_with_reasons() {
    let Pair { a, b, clock } = pair().await;
    create(&a, "s").await;
    a.append(produce("s", 0, "x")).await.unwrap();
    assert!(matches!(
        a.request_transfer(&name("nope"), 2).await,
        Err(TransferError::NotFound(_))
    ));
    assert!(matches!(
        a.request_transfer(&name("s"), 9).await,
        Err(TransferError::UnknownNode(9))
    ));
    let e = a.request_transfer(&name("s"), 1).await.unwrap_err();
    assert!(e.to_string().contains("already on node 1"), "{e}");
    b.request_transfer(&name("s"), 2).await.unwrap();
    let e = a.request_transfer(&name("s"), 2).await.unwrap_err();
    assert!(e.to_string().contains("under way"), "{e}");
    // Node 2 stops heartbeating (its loops are stopped); node 1 watches it for the timeout.
    create(&a, "t").await;
    // The node's liveness watch runs every heartbeat period (a longer gap resets it).
    for _ in 0..4 {
        crate::maintenance::liveness_pass(a.clone()).await;
        clock.advance(a.config().liveness_timeout / 3);
    }
    crate::maintenance::liveness_pass(a.clone()).await;
    let e = a.request_transfer(&name("t"), 2).await.unwrap_err();
    assert!(
        matches!(e, TransferError::NotLive { node_id: 2, .. }),
        "{e}"
    );
    assert_eq!(
        crate::error::ServiceError::kind(&e),
        pico_common::ErrorKind::Conflict
    );
    // A node is always live to itself.
    a.request_transfer(&name("t"), 1).await.unwrap();
}

/// A long-poll parked on the source answers when the stream leaves (as on a timeout), so its
/// client comes back and is redirected instead of waiting for a tail that moved away.
#[tokio::test]
async fn a_long_poll_on_the_source_returns_when_the_stream_leaves() {
    let Pair { a, .. } = pair().await;
    create(&a, "s").await;
    a.append(produce("s", 0, "x")).await.unwrap();
    let poll = tokio::spawn({
        let a = a.clone();
        async move { a.wait(&name("s"), 1, Duration::from_secs(60)).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    a.request_transfer(&name("s"), 2).await.unwrap();
    pass(&a).await;
    let out = tokio::time::timeout(Duration::from_secs(5), poll)
        .await
        .expect("the long-poll returned")
        .unwrap()
        .unwrap();
    assert_eq!(out, crate::api::WaitOutcome::Timeout);
}
