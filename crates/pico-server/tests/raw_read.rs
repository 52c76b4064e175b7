//! `Node::read_raw`: the stored batches themselves, as the Kafka facade's Fetch serves them.

use bytes::Bytes;
use pico_common::StreamName;
use pico_protocol::{Record, decode_batch, encode_batch};
use pico_server::testing::start_test_node;
use pico_server::*;

fn name(s: &str) -> StreamName {
    StreamName::parse(s).unwrap()
}

fn rec(s: &str) -> Record {
    Record {
        timestamp_ms: 0,
        key: Some(Bytes::from(format!("k{s}"))),
        value: Bytes::from(s.to_string()),
        headers: vec![("h".to_string(), Bytes::from(s.to_string()))],
    }
}

async fn append(node: &Node, n: &str, bodies: &[&str]) -> u64 {
    node.append(AppendRequest {
        name: name(n),
        records: bodies.iter().map(|b| rec(b)).collect(),
        producer: None,
        match_seq: None,
        close: false,
        content_type: None,
    })
    .await
    .unwrap()
    .start_seq
    .unwrap()
}

async fn create(node: &Node, n: &str) {
    node.create(CreateRequest {
        name: name(n),
        config: CreateConfig::default(),
        initial: vec![],
    })
    .await
    .unwrap();
}

/// The records of `n` from `from` as the node's record read returns them (with the append
/// timestamps the stored batches hold).
async fn records(node: &Node, n: &str, from: u64, count: usize) -> Vec<Record> {
    let out = node
        .read(ReadRequest {
            name: name(n),
            from: ReadFrom::Offset(from),
            max_records: Some(count),
            max_bytes: None,
            touch: false,
        })
        .await
        .unwrap();
    out.records.into_iter().map(|r| r.record).collect()
}

#[tokio::test]
async fn raw_reads_return_the_stored_batches_whole() {
    let node = start_test_node().await;
    create(&node, "s").await;
    assert_eq!(append(&node, "s", &["a0", "a1", "a2"]).await, 0);
    assert_eq!(append(&node, "s", &["b0", "b1"]).await, 3);
    assert_eq!(append(&node, "s", &["c0"]).await, 5);
    let first = encode_batch(0, &records(&node, "s", 0, 3).await);
    let second = encode_batch(3, &records(&node, "s", 3, 2).await);
    let third = encode_batch(5, &records(&node, "s", 5, 1).await);

    // From inside the first batch: that batch whole (it starts below the offset asked), then
    // the rest, byte for byte what was stored.
    let out = node.read_raw(&name("s"), 2, 1 << 20).await.unwrap();
    assert_eq!(out.batches, vec![first.clone(), second.clone(), third]);
    assert_eq!((out.next_seq, out.tail, out.start_seq), (6, 6, 0));

    // A byte limit stops at a batch boundary, but the first batch always comes whole.
    let out = node.read_raw(&name("s"), 0, 1).await.unwrap();
    assert_eq!(out.batches, vec![first.clone()]);
    assert_eq!(out.next_seq, 3);
    let out = node
        .read_raw(&name("s"), 0, first.len() + second.len())
        .await
        .unwrap();
    assert_eq!(out.batches, vec![first, second]);
    assert_eq!(out.next_seq, 5);

    // At the tail nothing; past it or below the start, the read's errors.
    let out = node.read_raw(&name("s"), 6, 1 << 20).await.unwrap();
    assert!(out.batches.is_empty());
    assert!(matches!(
        node.read_raw(&name("s"), 7, 1 << 20).await,
        Err(ReadError::BeyondTail { .. })
    ));
    assert!(matches!(
        node.read_raw(&name("nope"), 0, 1 << 20).await,
        Err(ReadError::NotFound(_))
    ));
}

#[tokio::test]
async fn a_fork_cut_inside_a_batch_is_served_only_up_to_the_fork_point() {
    let node = start_test_node().await;
    create(&node, "src").await;
    append(&node, "src", &["0", "1", "2", "3"]).await;
    let out = node
        .fork(ForkRequest {
            name: name("f"),
            source: name("src"),
            offset: Some(2),
            sub_offset: 0,
            config: CreateConfig::default(),
            initial: vec![],
        })
        .await
        .unwrap();
    assert_eq!(out.info.next_seq, 2);
    append(&node, "f", &["f2"]).await;

    let out = node.read_raw(&name("f"), 0, 1 << 20).await.unwrap();
    let values: Vec<(u64, Vec<Bytes>)> = out
        .batches
        .iter()
        .map(|b| {
            let d = decode_batch(b).unwrap();
            (
                d.base_offset,
                d.records.into_iter().map(|r| r.value).collect(),
            )
        })
        .collect();
    assert_eq!(
        values,
        vec![
            (0, vec![Bytes::from("0"), Bytes::from("1")]),
            (2, vec![Bytes::from("f2")]),
        ]
    );
    assert_eq!(out.next_seq, 3);
    // The source still reads its own batch whole.
    let out = node.read_raw(&name("src"), 0, 1 << 20).await.unwrap();
    assert_eq!(decode_batch(&out.batches[0]).unwrap().records.len(), 4);
}
