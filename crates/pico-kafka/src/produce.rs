//! Produce: each partition's record batches are checked (magic 2, CRC, no compression, not
//! transactional), their records appended to the partition's stream, and answered once the
//! append is durable. acks=0 appends the same way; the connection just sends no answer.

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_protocol::batch::batch_len;
use pico_protocol::decode_batch;
use pico_server::{AppendError, AppendRequest};

use crate::broker::Broker;
use crate::producers::Check;

const ATTRIBUTES_AT: usize = 21;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const HEADER_LEN: usize = 61;

/// The producer fields of a batch header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchProducer {
    pub id: i64,
    pub epoch: i16,
    pub base_seq: i32,
}

/// A partition's outcome.
struct Written {
    base_offset: u64,
    append_ms: i64,
}

type Refusal = (ResponseError, String);

impl Broker {
    pub(crate) async fn produce(&self, r: ProduceRequest, v: i16) -> ProduceResponse {
        let mut resp = ProduceResponse::default();
        for topic in r.topic_data {
            let mut out = TopicProduceResponse::default();
            let name = topic.name.0.to_string();
            out.name = topic.name;
            for p in topic.partition_data {
                let mut part = PartitionProduceResponse::default();
                part.index = p.index;
                let result = if r.transactional_id.as_ref().is_some_and(|t| !t.is_empty()) {
                    Err((
                        ResponseError::TransactionalIdAuthorizationFailed,
                        "transactions are not supported".to_string(),
                    ))
                } else {
                    self.produce_partition(&name, p.index, p.records).await
                };
                match result {
                    Ok(w) => {
                        part.base_offset = w.base_offset as i64;
                        part.log_append_time_ms = w.append_ms;
                        if v >= 5 {
                            part.log_start_offset = self.log_start(&name, p.index).await;
                        }
                    }
                    Err((code, msg)) => {
                        part.error_code = code.code();
                        part.base_offset = -1;
                        if v >= 8 {
                            part.error_message = Some(StrBytes::from_string(msg));
                        }
                    }
                }
                out.partition_responses.push(part);
            }
            resp.responses.push(out);
        }
        resp
    }

    async fn log_start(&self, topic: &str, partition: i32) -> i64 {
        match self.stream_of(topic, partition).await {
            Some(name) => self
                .node
                .head(&name)
                .await
                .map_or(-1, |i| i.start_seq as i64),
            None => -1,
        }
    }

    async fn produce_partition(
        &self,
        topic: &str,
        partition: i32,
        records: Option<Bytes>,
    ) -> Result<Written, Refusal> {
        let name = self.stream_of(topic, partition).await.ok_or((
            ResponseError::UnknownTopicOrPartition,
            "no such topic or partition".to_string(),
        ))?;
        let mut data = records.unwrap_or_default();
        if data.is_empty() {
            return Err((ResponseError::CorruptMessage, "no record batch".into()));
        }
        let mut first: Option<Written> = None;
        while !data.is_empty() {
            let len = batch_len(&data).map_err(|e| {
                (
                    ResponseError::CorruptMessage,
                    format!("bad record batch: {e}"),
                )
            })?;
            let batch = data.split_to(len.min(data.len()));
            let w = self.produce_batch(&name, batch).await?;
            first.get_or_insert(w);
        }
        first.ok_or((ResponseError::CorruptMessage, "no record batch".into()))
    }

    async fn produce_batch(
        &self,
        name: &pico_common::StreamName,
        batch: Bytes,
    ) -> Result<Written, Refusal> {
        if batch.len() < HEADER_LEN {
            return Err((
                ResponseError::CorruptMessage,
                "record batch truncated".into(),
            ));
        }
        let attributes = i16::from_be_bytes([batch[ATTRIBUTES_AT], batch[ATTRIBUTES_AT + 1]]);
        if attributes & 0x07 != 0 {
            return Err((
                ResponseError::UnsupportedCompressionType,
                "compressed batches are not supported: produce with compression.type=none".into(),
            ));
        }
        if attributes & 0x30 != 0 {
            return Err((
                ResponseError::InvalidRecord,
                "transactional and control batches are not supported".into(),
            ));
        }
        let producer = batch_producer(&batch);
        let decoded = decode_batch(&batch).map_err(|e| {
            (
                ResponseError::CorruptMessage,
                format!("bad record batch: {e}"),
            )
        })?;
        let count = i32::try_from(decoded.records.len()).unwrap_or(i32::MAX);
        if count == 0 {
            return Err((ResponseError::CorruptMessage, "empty record batch".into()));
        }
        let request = AppendRequest {
            name: name.clone(),
            records: decoded.records,
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        };
        if producer.id < 0 {
            return self.append(request).await;
        }
        // The producer's partition state is held from the check to the accept: a retry on
        // another connection waits and then sees the first attempt's outcome.
        let state = self.producers.state(producer.id, name.as_str());
        let mut state = state.lock().await;
        match state.check(producer.epoch, producer.base_seq, count) {
            Check::Duplicate(base_offset) => Ok(Written {
                base_offset,
                append_ms: -1,
            }),
            Check::Refuse(code) => Err((
                code,
                format!(
                    "producer {} epoch {} sequence {} refused",
                    producer.id, producer.epoch, producer.base_seq
                ),
            )),
            Check::Append => {
                let w = self.append(request).await?;
                state.accept(
                    producer.epoch,
                    producer.base_seq,
                    count,
                    w.base_offset,
                    self.producers.now_ms(),
                );
                Ok(w)
            }
        }
    }

    async fn append(&self, request: AppendRequest) -> Result<Written, Refusal> {
        match self.node.append(request).await {
            Ok(out) => Ok(Written {
                base_offset: out.start_seq.unwrap_or(out.next_seq),
                append_ms: out.timestamp_ms,
            }),
            Err(e) => Err((append_error_code(&e), e.to_string())),
        }
    }
}

/// The producer id, epoch and base sequence of a batch (header already length-checked).
pub fn batch_producer(batch: &[u8]) -> BatchProducer {
    let mut id = [0u8; 8];
    id.copy_from_slice(&batch[PRODUCER_ID_AT..PRODUCER_ID_AT + 8]);
    BatchProducer {
        id: i64::from_be_bytes(id),
        epoch: i16::from_be_bytes([batch[PRODUCER_EPOCH_AT], batch[PRODUCER_EPOCH_AT + 1]]),
        base_seq: i32::from_be_bytes([
            batch[BASE_SEQUENCE_AT],
            batch[BASE_SEQUENCE_AT + 1],
            batch[BASE_SEQUENCE_AT + 2],
            batch[BASE_SEQUENCE_AT + 3],
        ]),
    }
}

fn append_error_code(e: &AppendError) -> ResponseError {
    match e {
        AppendError::NotFound(_) | AppendError::Gone(_) => ResponseError::UnknownTopicOrPartition,
        AppendError::TooLarge { .. } => ResponseError::MessageTooLarge,
        AppendError::Closed { .. }
        | AppendError::ContentType { .. }
        | AppendError::BadRequest(_)
        | AppendError::SeqRegression { .. }
        | AppendError::MatchFailed { .. } => ResponseError::InvalidRecord,
        AppendError::Fenced { .. } => ResponseError::InvalidProducerEpoch,
        AppendError::SequenceGap { .. } | AppendError::EpochSeq { .. } => {
            ResponseError::OutOfOrderSequenceNumber
        }
        // Retriable: the client tries again, and nothing was acknowledged.
        AppendError::Durability(_) | AppendError::Unavailable(_) => {
            ResponseError::KafkaStorageError
        }
        // This process lost its WAL to a newer incarnation: the client re-routes and retries.
        AppendError::Superseded(_) => ResponseError::NotLeaderOrFollower,
        AppendError::Internal(_) => ResponseError::UnknownServerError,
    }
}
