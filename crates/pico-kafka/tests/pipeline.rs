//! Pipelined Produce over TCP: a connection's requests written back to back are admitted while
//! the first still waits for its WAL write (held here), answered strictly in order, and a
//! failure in the middle (a refused partition, a malformed frame, a failed write) ends or
//! answers exactly what a one-at-a-time broker would have.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use common::*;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::Decodable;
use pico_kafka::{Broker, KafkaOptions};
use pico_protocol::Record;
use pico_server::NodeConfig;
use s3stream::testing::FaultWal;
use s3stream::{MemoryStorage, ObjectWal};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const PRODUCE_V: i16 = 8;

struct Server {
    broker: Arc<Broker>,
    wal: Arc<FaultWal>,
    addr: std::net::SocketAddr,
    _stop: tokio::sync::watch::Sender<bool>,
}

/// A listener over a node whose WAL the test can hold and fail, with topic `t` (1 partition).
async fn server() -> Server {
    let inner = ObjectWal::new(Arc::new(MemoryStorage::new()), "wal".into());
    let wal = Arc::new(FaultWal::new(Arc::new(inner)));
    let config = NodeConfig {
        long_poll_timeout: Duration::from_millis(500),
        ..NodeConfig::default()
    };
    let node = pico_server::testing::start_test_node_with_wal(config, wal.clone()).await;
    let broker = Arc::new(Broker::new(node, KafkaOptions::default()));
    assert_eq!(create(&broker, "t", 1).await, 0);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(pico_kafka::serve(listener, broker.clone(), rx));
    Server {
        broker,
        wal,
        addr,
        _stop: stop,
    }
}

impl Server {
    fn appends(&self) -> u64 {
        self.broker.node().engine().stats().appends
    }

    /// Waits until `n` appends have reached the engine in all.
    async fn admitted(&self, n: u64) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while self.appends() < n {
            assert!(
                std::time::Instant::now() < deadline,
                "only {} of {n} appends were admitted: the connection is not pipelined",
                self.appends()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn tail(&self) -> u64 {
        tail(&self.broker, "t").await
    }

    /// Every record value of `t`, in offset order.
    async fn values(&self) -> Vec<String> {
        read_all(&self.broker, "t")
            .await
            .iter()
            .map(|r| String::from_utf8(r.record.value.to_vec()).unwrap())
            .collect()
    }

    async fn init_producer(&self) -> i64 {
        init_producer(&self.broker).await
    }
}

fn recs(tag: &str, n: usize) -> Vec<Record> {
    (0..n).map(|i| rec(&format!("{tag}{i}"))).collect()
}

/// A length-prefixed Produce frame of `records` to `topic` partition 0.
fn produce_frame(correlation: i32, topic: &str, records: Bytes, acks: i16) -> BytesMut {
    let req = produce_request(topic, 0, records, acks);
    prefixed(&frame_with(ApiKey::Produce, PRODUCE_V, correlation, &req))
}

/// Back-to-back Produce frames to `t`, each (correlation, value tag, records, first sequence)
/// as producer `pid` epoch 0.
fn idempotent_frames(pid: i64, each: &[(i32, &str, usize, i32)]) -> BytesMut {
    let mut frames = BytesMut::new();
    for &(correlation, tag, n, seq) in each {
        let records = batch(&recs(tag, n), Some((pid, 0, seq)));
        frames.extend_from_slice(&produce_frame(correlation, "t", records, -1));
    }
    frames
}

fn prefixed(body: &[u8]) -> BytesMut {
    let mut f = BytesMut::new();
    f.put_i32(body.len() as i32);
    f.put_slice(body);
    f
}

/// The next answer on `s`: its correlation id and body (none if the connection closed).
async fn answer(s: &mut TcpStream) -> Option<(i32, Bytes)> {
    let len = tokio::time::timeout(Duration::from_secs(30), s.read_i32())
        .await
        .expect("an answer in time")
        .ok()?;
    let mut body = vec![0u8; len as usize];
    s.read_exact(&mut body).await.unwrap();
    let mut body = Bytes::from(body);
    let correlation = body.get_i32();
    Some((correlation, body))
}

/// The next answer, a Produce's: its correlation id and its one partition's response.
async fn produced(s: &mut TcpStream) -> (i32, PartitionProduceResponse) {
    let (correlation, mut body) = answer(s).await.expect("an answer, not a close");
    let resp = ProduceResponse::decode(&mut body, PRODUCE_V).unwrap();
    (
        correlation,
        resp.responses[0].partition_responses[0].clone(),
    )
}

#[tokio::test]
async fn produces_written_back_to_back_are_admitted_at_once_and_answered_in_order() {
    let srv = server().await;
    let before = srv.appends();
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    srv.wal.hold_appends(true);
    let mut frames = BytesMut::new();
    for c in 1..=5 {
        frames.extend_from_slice(&produce_frame(
            c,
            "t",
            batch(&recs(&format!("r{c}-"), 3), None),
            -1,
        ));
    }
    // acks=0: admitted like the others, never answered.
    frames.extend_from_slice(&produce_frame(6, "t", batch(&recs("z", 2), None), 0));
    frames.extend_from_slice(&produce_frame(7, "t", batch(&recs("r7-", 1), None), 1));
    // Anything else is answered after every Produce before it.
    frames.extend_from_slice(&prefixed(&frame_with(
        ApiKey::Metadata,
        1,
        8,
        &MetadataRequest::default(),
    )));
    s.write_all(&frames).await.unwrap();
    // All seven are admitted while the first one's WAL write is still held.
    srv.admitted(before + 7).await;
    srv.wal.hold_appends(false);
    let mut offsets = Vec::new();
    for c in [1, 2, 3, 4, 5, 7] {
        let (correlation, p) = produced(&mut s).await;
        assert_eq!(correlation, c, "answers in request order");
        assert_eq!(p.error_code, 0);
        offsets.push(p.base_offset);
    }
    assert_eq!(offsets, [0, 3, 6, 9, 12, 17], "consecutive offsets");
    let (correlation, mut body) = answer(&mut s).await.unwrap();
    assert_eq!(correlation, 8);
    MetadataResponse::decode(&mut body, 1).unwrap();
    assert_eq!(srv.tail().await, 18);
    let values = srv.values().await;
    assert_eq!(values[15..], ["z0", "z1", "r7-0"]);
}

#[tokio::test]
async fn a_refused_partition_mid_pipeline_is_answered_in_its_place() {
    let srv = server().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let mut frames = BytesMut::new();
    frames.extend_from_slice(&produce_frame(1, "t", batch(&recs("a", 2), None), -1));
    frames.extend_from_slice(&produce_frame(2, "nope", batch(&recs("x", 2), None), -1));
    frames.extend_from_slice(&produce_frame(3, "t", batch(&recs("b", 2), None), -1));
    s.write_all(&frames).await.unwrap();
    let got = [
        produced(&mut s).await,
        produced(&mut s).await,
        produced(&mut s).await,
    ];
    let got: Vec<(i32, i16, i64)> = got
        .iter()
        .map(|(c, p)| (*c, p.error_code, p.base_offset))
        .collect();
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    assert_eq!(got, [(1, 0, 0), (2, unknown, -1), (3, 0, 2)]);
}

#[tokio::test]
async fn a_malformed_frame_mid_pipeline_closes_after_the_answers_before_it() {
    let srv = server().await;
    let before = srv.appends();
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    srv.wal.hold_appends(true);
    let mut frames = BytesMut::new();
    frames.extend_from_slice(&produce_frame(1, "t", batch(&recs("a", 2), None), -1));
    frames.extend_from_slice(&produce_frame(2, "t", batch(&recs("b", 2), None), -1));
    // An unknown API key: Kafka closes the connection.
    let mut bad = BytesMut::new();
    bad.put_i16(999);
    bad.put_i16(0);
    bad.put_i32(3);
    bad.put_i16(-1);
    frames.extend_from_slice(&prefixed(&bad));
    frames.extend_from_slice(&produce_frame(4, "t", batch(&recs("c", 2), None), -1));
    s.write_all(&frames).await.unwrap();
    srv.admitted(before + 2).await;
    srv.wal.hold_appends(false);
    let (c1, p1) = produced(&mut s).await;
    let (c2, p2) = produced(&mut s).await;
    assert_eq!((c1, p1.error_code, p1.base_offset), (1, 0, 0));
    assert_eq!((c2, p2.error_code, p2.base_offset), (2, 0, 2));
    assert!(answer(&mut s).await.is_none(), "closed after the bad frame");
    // The request after the bad frame was never read.
    assert_eq!(srv.tail().await, 4);
}

#[tokio::test]
async fn an_idempotent_producer_pipelines_and_its_retries_get_their_offsets() {
    let srv = server().await;
    let pid = srv.init_producer().await;
    let before = srv.appends();
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    srv.wal.hold_appends(true);
    let frames = idempotent_frames(pid, &[(1, "a", 3, 0), (2, "b", 2, 3), (3, "c", 1, 5)]);
    s.write_all(&frames).await.unwrap();
    // Each is judged against the one admitted before it, not yet durable.
    srv.admitted(before + 3).await;
    srv.wal.hold_appends(false);
    for (c, offset) in [(1, 0), (2, 3), (3, 5)] {
        let (correlation, p) = produced(&mut s).await;
        assert_eq!((correlation, p.error_code, p.base_offset), (c, 0, offset));
    }
    // A retry, a new batch and a gap, pipelined: a duplicate answered with its offset.
    let frames = idempotent_frames(pid, &[(4, "b", 2, 3), (5, "d", 1, 6), (6, "e", 1, 20)]);
    s.write_all(&frames).await.unwrap();
    let got = [
        produced(&mut s).await,
        produced(&mut s).await,
        produced(&mut s).await,
    ];
    let got: Vec<(i32, i16, i64)> = got
        .iter()
        .map(|(c, p)| (*c, p.error_code, p.base_offset))
        .collect();
    let gap = ResponseError::OutOfOrderSequenceNumber.code();
    assert_eq!(got, [(4, 0, 3), (5, 0, 6), (6, gap, -1)]);
    assert_eq!(srv.tail().await, 7);
}

/// A write that fails in the middle of a pipeline fails every batch admitted after it on the
/// stream; the producer's retries of them, with the same sequences, are written again (not
/// answered as duplicates of batches the stream never kept), and only then are duplicates.
#[tokio::test]
async fn a_failed_write_mid_pipeline_fails_the_rest_and_their_retries_are_written() {
    let srv = server().await;
    let pid = srv.init_producer().await;
    let mut s = TcpStream::connect(srv.addr).await.unwrap();
    let p0 = batch(&recs("p0-", 2), Some((pid, 0, 0)));
    s.write_all(&produce_frame(1, "t", p0.clone(), -1))
        .await
        .unwrap();
    assert_eq!(produced(&mut s).await.1.base_offset, 0);

    let before = srv.appends();
    srv.wal.hold_appends(true);
    let later: Vec<Bytes> = (1..=3)
        .map(|i| batch(&recs(&format!("p{i}-"), 2), Some((pid, 0, 2 * i))))
        .collect();
    let mut frames = BytesMut::new();
    for (i, b) in later.iter().enumerate() {
        frames.extend_from_slice(&produce_frame(10 + i as i32, "t", b.clone(), -1));
    }
    s.write_all(&frames).await.unwrap();
    srv.admitted(before + 3).await;
    // Every attempt of the held write fails once it goes.
    srv.wal.fail_appends(1_000);
    srv.wal.hold_appends(false);
    let storage = ResponseError::KafkaStorageError.code();
    for c in 10..13 {
        let (correlation, p) = produced(&mut s).await;
        assert_eq!((correlation, p.error_code), (c, storage), "{p:?}");
    }
    srv.wal.fail_appends(0);

    // The client retries the three with their sequences, pipelined.
    let mut frames = BytesMut::new();
    for (i, b) in later.iter().enumerate() {
        frames.extend_from_slice(&produce_frame(20 + i as i32, "t", b.clone(), -1));
    }
    s.write_all(&frames).await.unwrap();
    for (i, c) in (20..23).enumerate() {
        let (correlation, p) = produced(&mut s).await;
        assert_eq!((correlation, p.error_code), (c, 0), "{p:?}");
        assert_eq!(p.base_offset, 2 + 2 * i as i64);
        assert!(p.log_append_time_ms > 0, "written, not a duplicate: {p:?}");
    }
    assert_eq!(srv.tail().await, 8, "the retries were written");
    // Now they are stored: another retry of the second is a duplicate, and so is p0's.
    s.write_all(&produce_frame(30, "t", later[1].clone(), -1))
        .await
        .unwrap();
    s.write_all(&produce_frame(31, "t", p0, -1)).await.unwrap();
    let (_, p) = produced(&mut s).await;
    assert_eq!((p.error_code, p.base_offset), (0, 4));
    let (_, p) = produced(&mut s).await;
    assert_eq!((p.error_code, p.base_offset), (0, 0));
    assert_eq!(srv.tail().await, 8);
    let values = srv.values().await;
    let expected: Vec<String> = (0..4)
        .flat_map(|i| (0..2).map(move |j| format!("p{i}-{j}")))
        .collect();
    assert_eq!(values, expected, "each batch stored once");
}
