//! The handlers through `Broker::handle`: requests encoded as clients encode them, against a
//! real node on in-memory storage.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_common::StreamName;
use pico_kafka::broker::Reply;
use pico_protocol::{Record, decode_batch, stamp_batch};
use pico_server::AppendRequest;

#[tokio::test]
async fn api_versions_advertises_and_answers_unknown_versions_in_v0() {
    let b = broker().await;
    let resp: ApiVersionsResponse = call(
        &b,
        ApiKey::ApiVersions,
        3,
        &ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("t"))
            .with_client_software_version(StrBytes::from_static_str("1")),
    )
    .await;
    assert_eq!(resp.error_code, 0);
    let produce = resp
        .api_keys
        .iter()
        .find(|k| k.api_key == ApiKey::Produce as i16)
        .unwrap();
    assert_eq!((produce.min_version, produce.max_version), (3, 8));
    // A version past ours: the v0 answer carries UNSUPPORTED_VERSION and our ranges.
    let mut f =
        bytes::BytesMut::from(&frame(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())[..]);
    f[2..4].copy_from_slice(&9i16.to_be_bytes());
    let resp: ApiVersionsResponse =
        decode_reply(ApiKey::ApiVersions, 0, b.handle(f.freeze()).await);
    assert_eq!(resp.error_code, 35);
    assert!(!resp.api_keys.is_empty());
}

#[tokio::test]
async fn unknown_and_unsupported_apis_close_the_connection() {
    let b = broker().await;
    let mut f =
        bytes::BytesMut::from(&frame(ApiKey::ListGroups, 0, &ListGroupsRequest::default())[..]);
    f[0..2].copy_from_slice(&999i16.to_be_bytes());
    assert!(matches!(b.handle(f.freeze()).await, Reply::Close(_)));
    let f = frame(ApiKey::DeleteRecords, 0, &DeleteRecordsRequest::default());
    assert!(matches!(b.handle(f).await, Reply::Close(_)));
}

#[tokio::test]
async fn a_hostile_metadata_request_is_refused_without_allocating() {
    let b = broker().await;
    let mut f = frame(
        ApiKey::Metadata,
        1,
        &MetadataRequest::default().with_topics(Some(vec![])),
    )
    .to_vec();
    let n = f.len();
    f[n - 4..].copy_from_slice(&i32::MAX.to_be_bytes());
    assert!(matches!(b.handle(Bytes::from(f)).await, Reply::Close(_)));
    // Still serving.
    let resp: MetadataResponse = call(&b, ApiKey::Metadata, 1, &MetadataRequest::default()).await;
    assert_eq!(resp.brokers.len(), 1);
}

#[tokio::test]
async fn topics_are_streams_and_partitions_their_own_streams() {
    let b = broker().await;
    assert_eq!(create(&b, "orders", 4).await, 0);
    assert_eq!(
        create(&b, "orders", 4).await,
        ResponseError::TopicAlreadyExists.code()
    );
    assert_eq!(
        create(&b, "bad/name", 1).await,
        ResponseError::InvalidTopicException.code()
    );
    for (p, name) in ["orders", "orders/~1", "orders/~2", "orders/~3"]
        .iter()
        .enumerate()
    {
        let info = b.node().head(&StreamName::parse(name).unwrap()).await;
        assert!(info.is_ok(), "partition {p} stream {name}");
    }
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(topic("orders"));
    let req = MetadataRequest::default()
        .with_topics(Some(vec![mt]))
        .with_allow_auto_topic_creation(false);
    for v in [1, 4, 8] {
        let req = req.clone().with_allow_auto_topic_creation(v < 4);
        let resp: MetadataResponse = call(&b, ApiKey::Metadata, v, &req).await;
        assert_eq!(resp.topics[0].error_code, 0);
        assert_eq!(resp.topics[0].partitions.len(), 4);
    }
    // CreatePartitions grows the topic; DeleteTopics removes every partition.
    let mut cp = CreatePartitionsTopic::default();
    cp.name = topic("orders");
    cp.count = 6;
    let resp: CreatePartitionsResponse = call(
        &b,
        ApiKey::CreatePartitions,
        1,
        &CreatePartitionsRequest::default()
            .with_topics(vec![cp])
            .with_timeout_ms(1000),
    )
    .await;
    assert_eq!(resp.results[0].error_code, 0);
    assert_eq!(b.partitions("orders").await, 6);
    let resp: DeleteTopicsResponse = call(
        &b,
        ApiKey::DeleteTopics,
        3,
        &DeleteTopicsRequest::default()
            .with_topic_names(vec![topic("orders")])
            .with_timeout_ms(1000),
    )
    .await;
    assert_eq!(resp.responses[0].error_code, 0);
    assert_eq!(b.partitions("orders").await, 0);
    // Metadata auto-creates a topic when asked to.
    let mut mt = MetadataRequestTopic::default();
    mt.name = Some(topic("auto"));
    let resp: MetadataResponse = call(
        &b,
        ApiKey::Metadata,
        4,
        &MetadataRequest::default()
            .with_topics(Some(vec![mt]))
            .with_allow_auto_topic_creation(true),
    )
    .await;
    assert_eq!(resp.topics[0].partitions.len(), 1);
}

async fn create_stream(b: &pico_kafka::Broker, name: &str) {
    b.node()
        .create(pico_server::CreateRequest {
            name: StreamName::parse(name).unwrap(),
            config: pico_server::CreateConfig::default(),
            initial: vec![],
        })
        .await
        .unwrap();
}

async fn all_topics(b: &pico_kafka::Broker) -> Vec<(String, usize)> {
    let resp: MetadataResponse = call(
        b,
        ApiKey::Metadata,
        8,
        &MetadataRequest::default().with_topics(None),
    )
    .await;
    let mut out: Vec<(String, usize)> = resp
        .topics
        .iter()
        .map(|t| (t.name.as_ref().unwrap().to_string(), t.partitions.len()))
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn nested_streams_are_topics_under_their_dotted_alias() {
    let b = broker().await;
    create_stream(&b, "logs/api").await;
    create_stream(&b, "logs/api/~1").await;
    // `/x/y` and `/x.y` both exist: the literal stream is topic `x.y`, the nested one hidden.
    create_stream(&b, "x/y").await;
    create_stream(&b, "x.y").await;
    create_stream(&b, "odd/a.b").await;
    assert_eq!(
        all_topics(&b).await,
        [("logs.api".to_string(), 2), ("x.y".to_string(), 1)]
    );
    assert_eq!(b.partitions("logs.api").await, 2);
    // Produced to the alias, stored in the nested stream, fetched back through the alias.
    let p = produce(&b, "logs.api", 1, batch(&[rec("n0"), rec("n1")], None), 8).await;
    assert_eq!((p.error_code, p.base_offset), (0, 0));
    let info = b
        .node()
        .head(&StreamName::parse("logs/api/~1").unwrap())
        .await
        .unwrap();
    assert_eq!(info.next_seq, 2);
    let part = fetch(&b, "logs.api", 1, 0).await;
    let got = record_set(part.records.as_ref().unwrap());
    assert_eq!(got[1].1.value, Bytes::from_static(b"n1"));
    // The alias is taken: creating it again says so, and new partitions are nested streams.
    assert_eq!(
        create(&b, "logs.api", 1).await,
        ResponseError::TopicAlreadyExists.code()
    );
    let mut cp = CreatePartitionsTopic::default();
    cp.name = topic("logs.api");
    cp.count = 3;
    let resp: CreatePartitionsResponse = call(
        &b,
        ApiKey::CreatePartitions,
        1,
        &CreatePartitionsRequest::default()
            .with_topics(vec![cp])
            .with_timeout_ms(1000),
    )
    .await;
    assert_eq!(resp.results[0].error_code, 0);
    assert!(
        b.node()
            .head(&StreamName::parse("logs/api/~2").unwrap())
            .await
            .is_ok()
    );
    // A dotted topic with no nested stream behind it is created under its literal name.
    assert_eq!(create(&b, "new.topic", 1).await, 0);
    assert!(
        b.node()
            .head(&StreamName::parse("new.topic").unwrap())
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn produced_records_are_fetched_at_their_stream_offsets() {
    let b = broker().await;
    assert_eq!(create(&b, "t", 2).await, 0);
    let first: Vec<Record> = (0..3).map(|i| rec(&format!("a{i}"))).collect();
    let second: Vec<Record> = (0..2).map(|i| rec(&format!("b{i}"))).collect();
    for v in [3, 8] {
        let _ = v;
    }
    let p = produce(&b, "t", 1, batch(&first, None), 8).await;
    assert_eq!((p.error_code, p.base_offset), (0, 0));
    let p = produce(&b, "t", 1, batch(&second, None), 3).await;
    assert_eq!((p.error_code, p.base_offset), (0, 3));
    // Partition 0 is untouched.
    assert_eq!(fetch(&b, "t", 0, 0).await.high_watermark, 0);

    let part = fetch(&b, "t", 1, 2).await;
    assert_eq!((part.error_code, part.high_watermark), (0, 5));
    // The stored batches whole, as Kafka serves its log: the first starts below the fetch
    // offset and clients skip what they did not ask for.
    let set = part.records.clone().unwrap();
    let got = record_set(&set);
    let offsets: Vec<u64> = got.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, [0, 1, 2, 3, 4], "base offsets are stream offsets");
    let values: Vec<&[u8]> = got[2..].iter().map(|(_, r)| &r.value[..]).collect();
    assert_eq!(values, [&b"a2"[..], b"b0", b"b1"]);
    assert_eq!(got[2].1.key.as_deref(), Some(&b"k-a2"[..]));
    assert_eq!(
        got[2].1.headers,
        vec![("h".to_string(), Bytes::from_static(b"v"))]
    );

    // The same records over the node's own read (HTTP's path), at the same offsets.
    let records = read_all(&b, "t/~1").await;
    let offs: Vec<u64> = records.iter().map(|r| r.offset).collect();
    assert_eq!(offs, [0, 1, 2, 3, 4]);
    assert_eq!(records[3].record.value, Bytes::from_static(b"b0"));
    // Byte for byte the producer's batches as stored: only the base offset, the
    // LogAppendTime bit and the append time as max timestamp (so the CRC) are set.
    let recs: Vec<Record> = records.iter().map(|r| r.record.clone()).collect();
    let mut stored = stamp_batch(&batch(&first, None), 0, recs[0].timestamp_ms).to_vec();
    stored.extend_from_slice(&stamp_batch(&batch(&second, None), 3, recs[3].timestamp_ms));
    assert_eq!(
        &set[..],
        &stored[..],
        "fetch serves the stored bytes unchanged"
    );

    // At the tail: nothing; past it, or below the start: out of range.
    let part = fetch(&b, "t", 1, 5).await;
    assert_eq!(part.error_code, 0);
    // Empty, not null: clients read a null record set as a protocol error.
    assert_eq!(part.records.as_deref(), Some(&[][..]));
    assert_eq!(
        fetch(&b, "t", 1, 6).await.error_code,
        ResponseError::OffsetOutOfRange.code()
    );
    assert_eq!(
        fetch(&b, "nope", 0, 0).await.error_code,
        ResponseError::UnknownTopicOrPartition.code()
    );

    // An append over the node (as HTTP does) is fetched over Kafka.
    b.node()
        .append(AppendRequest {
            name: StreamName::parse("t/~1").unwrap(),
            records: vec![rec("http")],
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        })
        .await
        .unwrap();
    let part = fetch(&b, "t", 1, 5).await;
    let got = record_set(part.records.as_ref().unwrap());
    assert_eq!((got[0].0, &got[0].1.value[..]), (5, &b"http"[..]));
}

/// Every record of a fetched record set (concatenated batches) with its offset.
fn record_set(mut set: &[u8]) -> Vec<(u64, Record)> {
    let mut out = Vec::new();
    while !set.is_empty() {
        let len = pico_protocol::batch::batch_len(set).unwrap();
        let d = decode_batch(&set[..len]).unwrap();
        out.extend(
            d.records
                .into_iter()
                .enumerate()
                .map(|(i, r)| (d.base_offset + i as u64, r)),
        );
        set = &set[len..];
    }
    out
}

#[tokio::test]
async fn corrupt_batches_and_unknown_codecs_are_refused() {
    let b = broker().await;
    assert_eq!(create(&b, "c", 1).await, 0);
    let mut bad = batch(&[rec("x")], None).to_vec();
    let n = bad.len();
    bad[n - 1] ^= 0xff; // CRC no longer matches
    let p = produce(&b, "c", 0, Bytes::from(bad), 8).await;
    assert_eq!(p.error_code, ResponseError::CorruptMessage.code());
    // Marked gzip, but the records are not gzip.
    let mut gz = batch(&[rec("x")], None).to_vec();
    gz[22] |= 1;
    let crc = crc32c::crc32c(&gz[21..]);
    gz[17..21].copy_from_slice(&crc.to_be_bytes());
    let p = produce(&b, "c", 0, Bytes::from(gz), 8).await;
    assert_eq!(p.error_code, ResponseError::InvalidRecord.code());
    // Codec 5 does not exist.
    let mut five = batch(&[rec("x")], None).to_vec();
    five[22] |= 5;
    let p = produce(&b, "c", 0, Bytes::from(five), 8).await;
    assert_eq!(
        p.error_code,
        ResponseError::UnsupportedCompressionType.code()
    );
    let p = produce(&b, "nope", 0, batch(&[rec("x")], None), 8).await;
    assert_eq!(p.error_code, ResponseError::UnknownTopicOrPartition.code());
    assert_eq!(
        b.node()
            .head(&StreamName::parse("c").unwrap())
            .await
            .unwrap()
            .next_seq,
        0
    );
}

#[tokio::test]
async fn a_fetch_at_the_tail_waits_for_the_next_append() {
    let b = std::sync::Arc::new(broker().await);
    assert_eq!(create(&b, "w", 1).await, 0);
    let waiting = {
        let b = b.clone();
        tokio::spawn(async move {
            let resp: FetchResponse =
                call(&b, ApiKey::Fetch, 11, &fetch_req("w", 0, 0, 20_000)).await;
            resp
        })
    };
    tokio::task::yield_now().await;
    let p = produce(&b, "w", 0, batch(&[rec("late")], None), 8).await;
    assert_eq!(p.error_code, 0);
    let resp = tokio::time::timeout(Duration::from_secs(15), waiting)
        .await
        .unwrap()
        .unwrap();
    let got = decode_batch(resp.responses[0].partitions[0].records.as_ref().unwrap()).unwrap();
    assert_eq!(&got.records[0].value[..], b"late");
}

#[tokio::test]
async fn a_waiting_fetch_of_a_bad_offset_is_answered_at_once() {
    let b = broker().await;
    assert_eq!(create(&b, "e", 1).await, 0);
    let req = fetch_req("e", 0, 7, 60_000);
    let resp: FetchResponse =
        tokio::time::timeout(Duration::from_secs(20), call(&b, ApiKey::Fetch, 11, &req))
            .await
            .expect("answered without waiting out max_wait");
    assert_eq!(
        resp.responses[0].partitions[0].error_code,
        ResponseError::OffsetOutOfRange.code()
    );
}

#[tokio::test]
async fn idempotent_retries_get_the_original_offset() {
    let b = broker().await;
    assert_eq!(create(&b, "i", 1).await, 0);
    let pid = init_producer(&b).await;
    assert!(pid > 0);
    let one = batch(&[rec("1"), rec("2")], Some((pid, 0, 0)));
    assert_eq!(produce(&b, "i", 0, one.clone(), 8).await.base_offset, 0);
    let two = batch(&[rec("3")], Some((pid, 0, 2)));
    assert_eq!(produce(&b, "i", 0, two.clone(), 8).await.base_offset, 2);
    // Retries of both: answered with their offsets, nothing written.
    let p = produce(&b, "i", 0, one, 8).await;
    assert_eq!((p.error_code, p.base_offset), (0, 0));
    assert_eq!(produce(&b, "i", 0, two, 8).await.base_offset, 2);
    assert_eq!(
        b.node()
            .head(&StreamName::parse("i").unwrap())
            .await
            .unwrap()
            .next_seq,
        3
    );
    // A gap and an old epoch are refused.
    let gap = produce(&b, "i", 0, batch(&[rec("x")], Some((pid, 0, 9))), 8).await;
    assert_eq!(
        gap.error_code,
        ResponseError::OutOfOrderSequenceNumber.code()
    );
    let old = produce(&b, "i", 0, batch(&[rec("x")], Some((pid, -1, 3))), 8).await;
    assert_eq!(old.error_code, ResponseError::InvalidProducerEpoch.code());
    assert_eq!(
        b.node()
            .head(&StreamName::parse("i").unwrap())
            .await
            .unwrap()
            .next_seq,
        3
    );
}

#[tokio::test]
async fn list_offsets_answers_earliest_latest_and_by_time() {
    let b = broker().await;
    assert_eq!(create(&b, "l", 1).await, 0);
    produce(&b, "l", 0, batch(&[rec("a"), rec("b")], None), 8).await;
    let ask = |ts: i64| {
        let mut p = ListOffsetsPartition::default();
        p.partition_index = 0;
        p.timestamp = ts;
        let mut t = ListOffsetsTopic::default();
        t.name = topic("l");
        t.partitions = vec![p];
        ListOffsetsRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_topics(vec![t])
    };
    let off = |r: ListOffsetsResponse| r.topics[0].partitions[0].offset;
    assert_eq!(off(call(&b, ApiKey::ListOffsets, 5, &ask(-2)).await), 0);
    assert_eq!(off(call(&b, ApiKey::ListOffsets, 1, &ask(-1)).await), 2);
    assert_eq!(off(call(&b, ApiKey::ListOffsets, 5, &ask(0)).await), 0);
    assert_eq!(
        off(call(&b, ApiKey::ListOffsets, 5, &ask(i64::MAX)).await),
        -1
    );
}

#[tokio::test]
async fn committed_offsets_are_stored_in_the_metadata_kv() {
    let b = broker().await;
    let mut p = OffsetCommitRequestPartition::default();
    p.partition_index = 3;
    p.committed_offset = 42;
    p.committed_metadata = Some(StrBytes::from_static_str("m"));
    let mut t = OffsetCommitRequestTopic::default();
    t.name = topic("t");
    t.partitions = vec![p];
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(StrBytes::from_static_str("g/1")))
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![t]);
    let resp: OffsetCommitResponse = call(&b, ApiKey::OffsetCommit, 7, &req).await;
    assert_eq!(resp.topics[0].partitions[0].error_code, 0);
    // A fresh coordinator (a restart keeps the KV) answers the same.
    let again = pico_kafka::Broker::new(b.node().clone(), Default::default());
    let mut ft = OffsetFetchRequestTopic::default();
    ft.name = topic("t");
    ft.partition_indexes = vec![3, 4];
    let resp: OffsetFetchResponse = call(
        &again,
        ApiKey::OffsetFetch,
        5,
        &OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g/1")))
            .with_topics(Some(vec![ft])),
    )
    .await;
    let parts = &resp.topics[0].partitions;
    assert_eq!(
        (parts[0].committed_offset, parts[1].committed_offset),
        (42, -1)
    );
    assert_eq!(parts[0].metadata.as_deref(), Some("m"));
    let resp: OffsetFetchResponse = call(
        &again,
        ApiKey::OffsetFetch,
        5,
        &OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g/1")))
            .with_topics(None),
    )
    .await;
    assert_eq!(resp.topics.len(), 1);
    assert_eq!(resp.topics[0].partitions[0].committed_offset, 42);
    let resp: OffsetFetchResponse = call(
        &again,
        ApiKey::OffsetFetch,
        5,
        &OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str("g")))
            .with_topics(None),
    )
    .await;
    assert!(
        resp.topics.is_empty(),
        "group `g` sees nothing of group `g/1`"
    );
}

#[tokio::test]
async fn every_response_encodes_at_every_advertised_version() {
    let b = broker().await;
    assert_eq!(create(&b, "v", 1).await, 0);
    produce(&b, "v", 0, batch(&[rec("a")], None), 8).await;
    for v in 0..=8 {
        let _: MetadataResponse = call(&b, ApiKey::Metadata, v, &MetadataRequest::default()).await;
    }
    for v in 3..=8 {
        let p = produce(&b, "v", 0, batch(&[rec("a")], None), v).await;
        assert_eq!(p.error_code, 0, "produce v{v}");
    }
    for v in 4..=11 {
        let resp: FetchResponse = call(&b, ApiKey::Fetch, v, &fetch_req("v", 0, 0, 0)).await;
        assert_eq!(resp.responses[0].partitions[0].error_code, 0, "fetch v{v}");
    }
    for v in 0..=2 {
        let r: FindCoordinatorResponse = call(
            &b,
            ApiKey::FindCoordinator,
            v,
            &FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("g")),
        )
        .await;
        assert_eq!(r.error_code, 0);
    }
    for v in 0..=2 {
        let _: ListGroupsResponse =
            call(&b, ApiKey::ListGroups, v, &ListGroupsRequest::default()).await;
    }
    for v in 0..=4 {
        let _: DescribeGroupsResponse = call(
            &b,
            ApiKey::DescribeGroups,
            v,
            &DescribeGroupsRequest::default()
                .with_groups(vec![GroupId(StrBytes::from_static_str("g"))]),
        )
        .await;
    }
    for v in 1..=3 {
        let mut res = DescribeConfigsResource::default();
        res.resource_type = 2;
        res.resource_name = StrBytes::from_static_str("v");
        let r: DescribeConfigsResponse = call(
            &b,
            ApiKey::DescribeConfigs,
            v,
            &DescribeConfigsRequest::default().with_resources(vec![res]),
        )
        .await;
        assert_eq!(r.results[0].error_code, 0);
        assert!(!r.results[0].configs.is_empty());
    }
}

#[tokio::test]
async fn a_full_fetch_response_reads_no_more_partitions() {
    let b = broker().await;
    assert_eq!(create(&b, "full", 2).await, 0);
    for p in 0..2 {
        for i in 0..2 {
            let recs = [rec(&format!("p{p}-{i}"))];
            assert_eq!(
                produce(&b, "full", p, batch(&recs, None), 8)
                    .await
                    .error_code,
                0
            );
        }
    }
    let mut req = fetch_req("full", 0, 0, 0).with_max_bytes(1);
    let mut second = req.topics[0].partitions[0].clone();
    second.partition = 1;
    req.topics[0].partitions.push(second);
    let resp: FetchResponse = call(&b, ApiKey::Fetch, 11, &req).await;
    let parts = &resp.responses[0].partitions;
    // The first partition's first batch, whole, though larger than max_bytes; then nothing.
    let first = record_set(parts[0].records.as_ref().unwrap());
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].1.value, Bytes::from_static(b"p0-0"));
    assert_eq!(parts[1].records.as_deref(), Some(&[][..]));
    assert_eq!((parts[1].error_code, parts[1].high_watermark), (0, 2));
}
