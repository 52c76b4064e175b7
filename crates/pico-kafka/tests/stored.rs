//! Producers' batches stored as sent (compressed ones too), idempotent producers across a
//! restart of the facade, and the cluster view (brokers, leaders, DescribeCluster), through
//! `Broker::handle` against a real node on in-memory storage.

mod common;

use std::io::Write;

use bytes::Bytes;
use common::*;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::*;
use pico_kafka::{Broker, KafkaOptions};
use pico_protocol::{Record, encode_batch};

const HEADER_LEN: usize = 61;

/// `batch` (uncompressed, from [`batch`]) with its records compressed by Kafka codec `codec`
/// as clients do (snappy: xerial framing, as the Java client; lz4: a frame).
fn compress(batch: &[u8], codec: i16) -> Bytes {
    let records = &batch[HEADER_LEN..];
    let packed = match codec {
        1 => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(records).unwrap();
            e.finish().unwrap()
        }
        2 => {
            let mut out = vec![
                0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1,
            ];
            let c = snap::raw::Encoder::new().compress_vec(records).unwrap();
            out.extend_from_slice(&(c.len() as u32).to_be_bytes());
            out.extend_from_slice(&c);
            out
        }
        3 => {
            let mut e = lz4_flex::frame::FrameEncoder::new(Vec::new());
            e.write_all(records).unwrap();
            e.finish().unwrap()
        }
        4 => zstd::encode_all(records, 3).unwrap(),
        _ => unreachable!(),
    };
    let mut b = batch[..HEADER_LEN].to_vec();
    b.extend_from_slice(&packed);
    let len = (b.len() - 12) as i32;
    b[8..12].copy_from_slice(&len.to_be_bytes());
    let attributes = i16::from_be_bytes([b[21], b[22]]) | codec;
    b[21..23].copy_from_slice(&attributes.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

fn recs(prefix: &str, n: usize) -> Vec<Record> {
    (0..n).map(|i| rec(&format!("{prefix}-{i}"))).collect()
}

/// Compressed batches of every codec are stored as sent: Fetch returns the producer's bytes
/// (only base offset, timestamp type, max timestamp and so the CRC differ), and HTTP reads of
/// the same stream see every record, key and header at the same offsets.
#[tokio::test]
async fn compressed_batches_are_stored_as_sent_and_read_over_http() {
    let b = broker().await;
    assert_eq!(create(&b, "z", 1).await, 0);
    let mut expected: Vec<Record> = Vec::new();
    let mut sent = Vec::new();
    for codec in 1..=4i16 {
        let records = recs(&format!("codec{codec}"), 3);
        let batch = compress(&batch(&records, None), codec);
        let p = produce(&b, "z", 0, batch.clone(), 8).await;
        assert_eq!(p.error_code, 0, "codec {codec}: {:?}", p.error_message);
        assert_eq!(p.base_offset, expected.len() as i64);
        expected.extend(records);
        sent.push((p.base_offset, batch));
    }
    assert_eq!(tail(&b, "z").await, 12);
    for (offset, batch) in &sent {
        let part = fetch(&b, "z", 0, *offset).await;
        let got = part.records.unwrap();
        let len = pico_protocol::batch::batch_len(&got).unwrap();
        assert_eq!(len, batch.len());
        let stored = &got[..len];
        assert_eq!(&stored[..8], &offset.to_be_bytes(), "base offset assigned");
        assert_eq!(stored[HEADER_LEN..], batch[HEADER_LEN..], "records as sent");
        assert_eq!(
            stored[23..35],
            batch[23..35],
            "count and base timestamp kept"
        );
        assert_eq!(stored[43..61], batch[43..61], "producer fields kept");
        assert_eq!(stored[22] & 0x07, batch[22] & 0x07, "codec kept");
        assert_eq!(stored[22] & 0x08, 0x08, "LogAppendTime");
        let crc = crc32c::crc32c(&stored[21..]);
        assert_eq!(&stored[17..21], &crc.to_be_bytes(), "a valid batch");
    }
    let records = read_all(&b, "z").await;
    assert_eq!(records.len(), 12);
    for (i, (got, want)) in records.iter().zip(&expected).enumerate() {
        assert_eq!(got.offset, i as u64);
        let got = &got.record;
        assert_eq!(
            (&got.key, &got.value, &got.headers),
            (&want.key, &want.value, &want.headers)
        );
    }
}

/// A batch that would inflate past the cap is refused, nothing is stored, and the node serves on.
#[tokio::test]
async fn a_decompression_bomb_is_refused() {
    let b = broker().await;
    assert_eq!(create(&b, "bomb", 1).await, 0);
    let huge = Record {
        timestamp_ms: 0,
        key: None,
        value: Bytes::from(vec![0u8; 80 << 20]),
        headers: vec![],
    };
    let bomb = compress(&encode_batch(0, &[huge]), 4);
    assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
    let p = produce(&b, "bomb", 0, bomb, 8).await;
    assert_eq!(p.error_code, ResponseError::MessageTooLarge.code());
    assert_eq!(tail(&b, "bomb").await, 0);
    let p = produce(&b, "bomb", 0, compress(&batch(&recs("ok", 2), None), 3), 8).await;
    assert_eq!((p.error_code, p.base_offset), (0, 0));
}

/// The facade restarts (a new `Broker` over the same node: the stream is what survives): a
/// producer retries its last batches, which are answered with their original offsets and
/// not written again; its next batch is taken at the next sequence, a gap is refused.
#[tokio::test]
async fn idempotent_retries_after_a_restart_get_their_original_offsets() {
    let clock = pico_common::clock::ManualClock::new(1_000_000);
    let node = pico_server::testing::start_test_node_with(pico_server::NodeConfig {
        clock: clock.clone(),
        ..pico_server::NodeConfig::default()
    })
    .await;
    let first = Broker::new(node.clone(), KafkaOptions::default());
    assert_eq!(create(&first, "i", 1).await, 0);
    let pid = init_producer(&first).await;
    // Another producer's batches in between, so the lookup must pick this producer's out.
    let one = compress(&batch(&recs("a", 2), Some((pid, 0, 0))), 4);
    let other = batch(&recs("o", 3), Some((pid + 1, 0, 0)));
    let two = batch(&recs("b", 1), Some((pid, 0, 2)));
    assert_eq!(produce(&first, "i", 0, one.clone(), 8).await.base_offset, 0);
    assert_eq!(produce(&first, "i", 0, other, 8).await.base_offset, 2);
    assert_eq!(produce(&first, "i", 0, two.clone(), 8).await.base_offset, 5);
    drop(first);
    clock.advance(std::time::Duration::from_secs(5));

    let restarted = Broker::new(node.clone(), KafkaOptions::default());
    let p = produce(&restarted, "i", 0, two, 8).await;
    assert_eq!(
        (p.error_code, p.base_offset),
        (0, 5),
        "{:?}",
        p.error_message
    );
    let p = produce(&restarted, "i", 0, one, 8).await;
    assert_eq!(
        (p.error_code, p.base_offset),
        (0, 0),
        "{:?}",
        p.error_message
    );
    assert_eq!(tail(&restarted, "i").await, 6, "nothing written twice");
    let gap = produce(
        &restarted,
        "i",
        0,
        batch(&recs("c", 1), Some((pid, 0, 9))),
        8,
    )
    .await;
    assert_eq!(
        gap.error_code,
        ResponseError::OutOfOrderSequenceNumber.code()
    );
    let next = produce(
        &restarted,
        "i",
        0,
        batch(&recs("c", 1), Some((pid, 0, 3))),
        8,
    )
    .await;
    assert_eq!((next.error_code, next.base_offset), (0, 6));
    // A producer this process hands out is new everywhere: no lookup, taken as it comes.
    let fresh_pid = init_producer(&restarted).await;
    assert_ne!(fresh_pid, pid);
    let fresh = batch(&recs("f", 1), Some((fresh_pid, 0, 0)));
    assert_eq!(produce(&restarted, "i", 0, fresh, 8).await.base_offset, 7);
}

/// Another node (registered in the metadata log, with its Kafka address stored, its heartbeat
/// live) owns a stream: Metadata lists both brokers and names it the partition's leader, and a
/// produce or fetch here is answered NOT_LEADER_OR_FOLLOWER.
#[tokio::test]
async fn partitions_owned_by_another_node_are_led_by_it() {
    let b = broker().await;
    b.advertise().await.unwrap();
    assert_eq!(create(&b, "mine", 1).await, 0);
    assert_eq!(create(&b, "theirs", 1).await, 0);
    let (other_id, other_epoch, _) = pico_server::testing::OTHER_NODE;
    pico_server::testing::open_on_other_node(b.node(), "theirs").await;
    let advert = pico_kafka::cluster::Advert {
        node_epoch: other_epoch,
        host: "10.0.0.2".into(),
        port: 19092,
    };
    b.node()
        .kv_put_many(vec![(
            format!("{}{other_id}", pico_kafka::cluster::BROKERS_PREFIX),
            serde_json::to_vec(&advert).unwrap(),
        )])
        .await
        .unwrap();

    let req = MetadataRequest::default().with_topics(None);
    let md: MetadataResponse = call(&b, ApiKey::Metadata, 8, &req).await;
    let mut brokers: Vec<(i32, String, i32)> = md
        .brokers
        .iter()
        .map(|x| (x.node_id.0, x.host.to_string(), x.port))
        .collect();
    brokers.sort();
    let me = KafkaOptions::default();
    assert_eq!(
        brokers,
        vec![
            (me.broker_id, me.advertised_host.clone(), me.advertised_port),
            (other_id as i32, "10.0.0.2".to_string(), 19092),
        ]
    );
    let leader = |name: &str| {
        let t = md
            .topics
            .iter()
            .find(|t| t.name.as_ref().unwrap().0.as_str() == name)
            .unwrap();
        (t.partitions[0].error_code, t.partitions[0].leader_id.0)
    };
    assert_eq!(leader("mine"), (0, me.broker_id));
    assert_eq!(leader("theirs"), (0, other_id as i32));

    let p = produce(&b, "theirs", 0, batch(&recs("x", 1), None), 8).await;
    assert_eq!(p.error_code, ResponseError::NotLeaderOrFollower.code());
    assert_eq!(
        fetch(&b, "theirs", 0, 0).await.error_code,
        ResponseError::NotLeaderOrFollower.code()
    );
    let p = produce(&b, "mine", 0, batch(&recs("x", 1), None), 8).await;
    assert_eq!((p.error_code, p.base_offset), (0, 0));

    // DescribeCluster (flexible versions) lists the same brokers.
    for v in 0..=2 {
        let req = DescribeClusterRequest::default().with_endpoint_type(1);
        let dc: DescribeClusterResponse = call(&b, ApiKey::DescribeCluster, v, &req).await;
        assert_eq!(dc.error_code, 0);
        assert_eq!(dc.cluster_id.as_str(), me.cluster_id);
        let mut ids: Vec<i32> = dc.brokers.iter().map(|x| x.broker_id.0).collect();
        ids.sort();
        assert_eq!(ids, vec![me.broker_id, other_id as i32], "v{v}");
    }
}

/// A node whose heartbeat stopped is no longer listed; its partitions have no leader until it
/// is back (it still holds their unflushed tail).
#[tokio::test]
async fn a_lapsed_owner_is_not_a_broker_and_its_partitions_have_no_leader() {
    let clock = pico_common::clock::ManualClock::new(1_000_000);
    let node = pico_server::testing::start_test_node_with(pico_server::NodeConfig {
        clock: clock.clone(),
        ..pico_server::NodeConfig::default()
    })
    .await;
    let b = Broker::new(node, KafkaOptions::default());
    assert_eq!(create(&b, "theirs", 1).await, 0);
    let (other_id, other_epoch, _) = pico_server::testing::OTHER_NODE;
    pico_server::testing::open_on_other_node(b.node(), "theirs").await;
    let advert = pico_kafka::cluster::Advert {
        node_epoch: other_epoch,
        host: "10.0.0.2".into(),
        port: 19092,
    };
    b.node()
        .kv_put_many(vec![(
            format!("{}{other_id}", pico_kafka::cluster::BROKERS_PREFIX),
            serde_json::to_vec(&advert).unwrap(),
        )])
        .await
        .unwrap();
    let req = MetadataRequest::default().with_topics(None);
    let md: MetadataResponse = call(&b, ApiKey::Metadata, 8, &req).await;
    assert_eq!(md.brokers.len(), 2);
    clock.advance(b.node().config().liveness_timeout);
    let md: MetadataResponse = call(&b, ApiKey::Metadata, 8, &req).await;
    assert_eq!(md.brokers.len(), 1, "the lapsed node is not listed");
    let t = md
        .topics
        .iter()
        .find(|t| t.name.as_ref().unwrap().0.as_str() == "theirs")
        .unwrap();
    assert_eq!(
        t.partitions[0].error_code,
        ResponseError::LeaderNotAvailable.code()
    );
    assert_eq!(t.partitions[0].leader_id.0, -1);
    let p = produce(&b, "theirs", 0, batch(&recs("x", 1), None), 8).await;
    assert_eq!(p.error_code, ResponseError::NotLeaderOrFollower.code());
}
