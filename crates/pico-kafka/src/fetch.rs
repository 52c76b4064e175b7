//! Fetch and ListOffsets. A fetch answers each partition with the stored batches themselves
//! (RecordBatch v2, base offsets = stream offsets, so Kafka offsets are stream offsets), from
//! the batch holding the requested offset: as in Kafka, the first batch may start below it and
//! clients skip those records. When the answer holds less than `min_bytes`
//! it waits, up to `max_wait_ms`, on the node's live-read wait for any of the partitions,
//! then reads again.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::*;
use pico_common::StreamName;
use pico_server::{ReadFrom, ReadRequest};

use crate::broker::Broker;
use crate::topics::read_error_code;

/// Longest a fetch waits, whatever the client asks.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Most record bytes one Fetch response carries (besides one first batch larger than that).
const MAX_RESPONSE_BYTES: usize = 64 << 20;
/// Partitions one fetch waits on at once (the rest are read, not awaited).
const MAX_WAITED: usize = 256;

impl Broker {
    pub(crate) async fn fetch(&self, r: FetchRequest, v: i16) -> FetchResponse {
        let wait = Duration::from_millis(r.max_wait_ms.max(0) as u64).min(MAX_WAIT);
        let min_bytes = r.min_bytes.max(0) as usize;
        let mut resp = self.fetch_once(&r, v).await;
        let got = response_bytes(&resp);
        // An error (unknown partition, offset out of range) is answered at once, as Kafka does.
        let failed = resp
            .responses
            .iter()
            .flat_map(|t| &t.partitions)
            .any(|p| p.error_code != 0);
        if got >= min_bytes.max(1) || wait.is_zero() || failed {
            return resp;
        }
        // Wait for any partition read empty to move past its fetch offset.
        let mut waits = tokio::task::JoinSet::new();
        for t in &r.topics {
            for p in &t.partitions {
                if waits.len() >= MAX_WAITED {
                    break;
                }
                let Some(name) = self.stream_of(t.topic.0.as_str(), p.partition).await else {
                    continue;
                };
                let Ok(offset) = u64::try_from(p.fetch_offset) else {
                    continue;
                };
                let node = self.node.clone();
                waits.spawn(async move { node.wait(&name, offset, wait).await });
            }
        }
        if waits.is_empty() {
            tokio::time::sleep(wait).await;
            return resp;
        }
        let deadline = tokio::time::Instant::now() + wait;
        if tokio::time::timeout_at(deadline, waits.join_next())
            .await
            .is_ok()
        {
            resp = self.fetch_once(&r, v).await;
        }
        waits.abort_all();
        resp
    }

    async fn fetch_once(&self, r: &FetchRequest, v: i16) -> FetchResponse {
        // The client's max_bytes, within the node's own cap: a response is built in memory.
        let mut budget = if r.max_bytes <= 0 {
            MAX_RESPONSE_BYTES
        } else {
            (r.max_bytes as usize).min(MAX_RESPONSE_BYTES)
        };
        let mut resp = FetchResponse::default();
        for t in &r.topics {
            let mut out = FetchableTopicResponse::default();
            out.topic = t.topic.clone();
            for p in &t.partitions {
                let mut part = PartitionData::default();
                part.partition_index = p.partition;
                part.aborted_transactions = Some(Vec::new());
                // Clients read a null record set as a protocol error: empty, never null.
                part.records = Some(Bytes::new());
                // A full response reads no more batches (as in Kafka, only the first partition
                // with data may overshoot, by its one first batch): the rest report their
                // watermarks only.
                let limit = (p.partition_max_bytes.max(1) as usize).min(budget);
                match self
                    .fetch_partition(t.topic.0.as_str(), p.partition, p.fetch_offset, limit)
                    .await
                {
                    Ok(f) => {
                        part.high_watermark = f.tail as i64;
                        part.last_stable_offset = f.tail as i64;
                        if v >= 5 {
                            part.log_start_offset = f.start as i64;
                        }
                        budget = budget.saturating_sub(f.records.as_ref().map_or(0, Bytes::len));
                        if f.records.is_some() {
                            part.records = f.records;
                        }
                    }
                    Err(code) => {
                        part.error_code = code.code();
                        part.high_watermark = -1;
                        part.last_stable_offset = -1;
                        if v >= 5 {
                            part.log_start_offset = -1;
                        }
                    }
                }
                out.partitions.push(part);
            }
            resp.responses.push(out);
        }
        resp
    }

    async fn fetch_partition(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: usize,
    ) -> Result<Fetched, ResponseError> {
        let name = self
            .stream_of(topic, partition)
            .await
            .ok_or(ResponseError::UnknownTopicOrPartition)?;
        self.check_leader(&name)?;
        let info = self
            .node
            .head(&name)
            .await
            .map_err(|e| read_error_code(&e))?;
        let from = u64::try_from(offset).map_err(|_| ResponseError::OffsetOutOfRange)?;
        if from < info.start_seq || from > info.next_seq {
            return Err(ResponseError::OffsetOutOfRange);
        }
        if from == info.next_seq || max_bytes == 0 {
            return Ok(Fetched {
                records: None,
                tail: info.next_seq,
                start: info.start_seq,
            });
        }
        let out = self
            .node
            .read_raw(&name, from, max_bytes)
            .await
            .map_err(|e| read_error_code(&e))?;
        let records = match out.batches.len() {
            0 => None,
            1 => out.batches.into_iter().next(),
            _ => {
                let mut all = BytesMut::with_capacity(out.batches.iter().map(Bytes::len).sum());
                for b in &out.batches {
                    all.extend_from_slice(b);
                }
                Some(all.freeze())
            }
        };
        Ok(Fetched {
            records,
            tail: out.tail,
            start: out.start_seq,
        })
    }

    pub(crate) async fn list_offsets(&self, r: ListOffsetsRequest, v: i16) -> ListOffsetsResponse {
        let mut resp = ListOffsetsResponse::default();
        for t in r.topics {
            let mut out = ListOffsetsTopicResponse::default();
            let topic = t.name.0.to_string();
            out.name = t.name;
            for p in t.partitions {
                let mut part = ListOffsetsPartitionResponse::default();
                part.partition_index = p.partition_index;
                match self
                    .offset_for(&topic, p.partition_index, p.timestamp)
                    .await
                {
                    Ok((ts, off)) => {
                        part.timestamp = ts;
                        part.offset = off;
                        if v >= 4 {
                            part.leader_epoch = 0;
                        }
                    }
                    Err(code) => {
                        part.error_code = code.code();
                        part.timestamp = -1;
                        part.offset = -1;
                    }
                }
                out.partitions.push(part);
            }
            resp.topics.push(out);
        }
        resp
    }

    /// (timestamp, offset) for a ListOffsets query: -2 earliest, -1 latest, else the first
    /// record whose timestamp is at least `ts` (timestamps are append times, so they do not
    /// decrease along a stream: a binary search over offsets).
    async fn offset_for(
        &self,
        topic: &str,
        partition: i32,
        ts: i64,
    ) -> Result<(i64, i64), ResponseError> {
        let name = self
            .stream_of(topic, partition)
            .await
            .ok_or(ResponseError::UnknownTopicOrPartition)?;
        self.check_leader(&name)?;
        let info = self
            .node
            .head(&name)
            .await
            .map_err(|e| read_error_code(&e))?;
        match ts {
            -2 => return Ok((-1, info.start_seq as i64)),
            -1 => return Ok((-1, info.next_seq as i64)),
            t if t < 0 => return Err(ResponseError::InvalidRequest),
            _ => {}
        }
        let (mut lo, mut hi) = (info.start_seq, info.next_seq);
        let mut found = None;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let (at, rec_ts) = self.record_ts(&name, mid).await?;
            if rec_ts >= ts {
                found = Some((rec_ts, at));
                hi = mid;
            } else {
                lo = at + 1;
            }
        }
        Ok(found.map_or((-1, -1), |(t, o)| (t, o as i64)))
    }

    async fn record_ts(&self, name: &StreamName, offset: u64) -> Result<(u64, i64), ResponseError> {
        let out = self
            .node
            .read(ReadRequest {
                name: name.clone(),
                from: ReadFrom::Offset(offset),
                max_records: Some(1),
                max_bytes: None,
                touch: false,
            })
            .await
            .map_err(|e| read_error_code(&e))?;
        out.records
            .first()
            .map(|r| (r.offset, r.record.timestamp_ms))
            .ok_or(ResponseError::OffsetOutOfRange)
    }
}

struct Fetched {
    records: Option<Bytes>,
    tail: u64,
    start: u64,
}

fn response_bytes(resp: &FetchResponse) -> usize {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.records.as_ref().map_or(0, Bytes::len))
        .sum()
}
