//! Produce: each partition's record batches are checked whole (magic 2, CRC, record count,
//! every record; compressed ones inflated under a cap; not transactional) and stored as sent
//! (compressed or not) at the partition stream's tail, answered once durable. acks=0 appends
//! the same way; the connection just sends no answer.

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_common::StreamName;
use pico_protocol::batch::batch_len;
use pico_protocol::compression::Codec;
use pico_protocol::{BatchError, ProducedBatch, check_produced};
use pico_server::{Admitted, AppendError, AppendOutcome};

use crate::broker::Broker;
use crate::producers::{Check, PartitionState, Producers, StoredBatch, restore};

const ATTRIBUTES_AT: usize = 21;
const PRODUCER_ID_AT: usize = 43;
const PRODUCER_EPOCH_AT: usize = 51;
const BASE_SEQUENCE_AT: usize = 53;
const LAST_OFFSET_DELTA_AT: usize = 23;
const MAX_TIMESTAMP_AT: usize = 35;
const HEADER_LEN: usize = 61;
/// Offsets searched for a producer's latest batches, first, before widening (×8 each time).
const LOOKUP_FIRST: u64 = 1024;
/// Most bytes read when searching a partition for a producer's batches: its retries are of
/// batches written just before the restart or move, near the tail.
const LOOKUP_BYTES: usize = 64 << 20;
/// Bytes per read while searching.
const LOOKUP_READ: usize = 1 << 20;
/// Longest a batch waits for an in-flight batch of its producer to be confirmed (a retry of
/// it, or a lookup after a failure) before the client is told to retry.
const IN_FLIGHT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// Clock skew allowed between the node that handed out a producer id and this one: batches
/// appended more than this before the id was handed out cannot be the producer's.
const LOOKUP_SKEW_MS: i64 = 30_000;

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

/// A Produce request admitted: every batch has its offsets (or its refusal); what is left is
/// to wait for their writes and answer.
pub struct ProduceAdmitted {
    version: i16,
    acks: i16,
    topics: Vec<(TopicName, Vec<PartitionAdmitted>)>,
}

struct PartitionAdmitted {
    index: i32,
    /// The partition's stream, once resolved (for the log start offset).
    stream: Option<StreamName>,
    /// The batches admitted, in order.
    batches: Vec<Pending>,
    /// Why the partition's (remaining) batches were refused.
    refused: Option<Refusal>,
}

/// One batch between admission and answer.
enum Pending {
    /// Answered already (a duplicate of a durable batch).
    Done(Written),
    /// A plain batch: waited for in the answer itself.
    Admitted(Admitted),
    /// An idempotent producer's batch: its wait and what it tells the producer's state run
    /// in a task, so they happen even if the connection goes away first.
    Task(tokio::task::JoinHandle<Result<Written, Refusal>>),
}

impl Pending {
    async fn wait(self) -> Result<Written, Refusal> {
        match self {
            Pending::Done(w) => Ok(w),
            Pending::Admitted(a) => written(a.wait().await),
            Pending::Task(t) => t.await.unwrap_or_else(|e| {
                Err((
                    ResponseError::UnknownServerError,
                    format!("produce task failed: {e}"),
                ))
            }),
        }
    }
}

impl ProduceAdmitted {
    /// Kafka answers nothing to acks=0.
    pub fn acks(&self) -> i16 {
        self.acks
    }

    /// The request's version (the answer's).
    pub fn version(&self) -> i16 {
        self.version
    }

    /// Waits for every admitted batch's write, in order, and builds the answer.
    pub(crate) async fn finish(self, broker: &Broker) -> ProduceResponse {
        let v = self.version;
        let mut resp = ProduceResponse::default();
        for (name, parts) in self.topics {
            let mut out = TopicProduceResponse::default();
            out.name = name;
            for p in parts {
                let mut part = PartitionProduceResponse::default();
                part.index = p.index;
                let mut result = Err(p
                    .refused
                    .clone()
                    .unwrap_or((ResponseError::CorruptMessage, "no record batch".to_string())));
                let mut first = true;
                for b in p.batches {
                    let r = b.wait().await;
                    // The partition's answer: the first batch's offset, or the first failure
                    // (later batches' waits are dropped: their writes go on regardless).
                    match r {
                        Ok(w) if first => result = Ok(w),
                        Ok(_) => {}
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    }
                    first = false;
                }
                if let (Ok(_), Some(refused)) = (&result, p.refused) {
                    result = Err(refused);
                }
                match result {
                    Ok(w) => {
                        part.base_offset = w.base_offset as i64;
                        part.log_append_time_ms = w.append_ms;
                        if v >= 5 {
                            part.log_start_offset = match &p.stream {
                                Some(name) => broker
                                    .node
                                    .head(name)
                                    .await
                                    .map_or(-1, |i| i.start_seq as i64),
                                None => -1,
                            };
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
}

impl Broker {
    /// Admits a Produce request's batches in order: a later request's (on this connection or
    /// any) are placed after them. The answer waits for their writes
    /// ([`ProduceAdmitted::finish`]).
    pub(crate) async fn admit_produce(&self, r: ProduceRequest, v: i16) -> ProduceAdmitted {
        let transactional = r.transactional_id.as_ref().is_some_and(|t| !t.is_empty());
        let mut topics = Vec::with_capacity(r.topic_data.len());
        for topic in r.topic_data {
            let name = topic.name.0.to_string();
            let mut parts = Vec::with_capacity(topic.partition_data.len());
            for p in topic.partition_data {
                let part = if transactional {
                    PartitionAdmitted {
                        index: p.index,
                        stream: None,
                        batches: Vec::new(),
                        refused: Some((
                            ResponseError::TransactionalIdAuthorizationFailed,
                            "transactions are not supported".to_string(),
                        )),
                    }
                } else {
                    self.admit_partition(&name, p.index, p.records).await
                };
                parts.push(part);
            }
            topics.push((topic.name, parts));
        }
        ProduceAdmitted {
            version: v,
            acks: r.acks,
            topics,
        }
    }

    async fn admit_partition(
        &self,
        topic: &str,
        partition: i32,
        records: Option<Bytes>,
    ) -> PartitionAdmitted {
        let mut part = PartitionAdmitted {
            index: partition,
            stream: None,
            batches: Vec::new(),
            refused: None,
        };
        let Some(name) = self.stream_of(topic, partition).await else {
            part.refused = Some((
                ResponseError::UnknownTopicOrPartition,
                "no such topic or partition".to_string(),
            ));
            return part;
        };
        if let Err(code) = self.check_leader(&name) {
            part.refused = Some((code, "another node leads this partition".to_string()));
            return part;
        }
        let mut data = records.unwrap_or_default();
        while !data.is_empty() {
            let len = match batch_len(&data) {
                Ok(len) => len,
                Err(e) => {
                    part.refused = Some((
                        ResponseError::CorruptMessage,
                        format!("bad record batch: {e}"),
                    ));
                    break;
                }
            };
            let batch = data.split_to(len.min(data.len()));
            match self.admit_batch(&name, batch).await {
                Ok(b) => part.batches.push(b),
                Err(e) => {
                    part.refused = Some(e);
                    break;
                }
            }
        }
        part.stream = Some(name);
        part
    }

    async fn admit_batch(&self, name: &StreamName, batch: Bytes) -> Result<Pending, Refusal> {
        if batch.len() < HEADER_LEN {
            return Err((
                ResponseError::CorruptMessage,
                "record batch truncated".into(),
            ));
        }
        let attributes = i16::from_be_bytes([batch[ATTRIBUTES_AT], batch[ATTRIBUTES_AT + 1]]);
        if Codec::from_attributes(attributes).is_none() {
            return Err((
                ResponseError::UnsupportedCompressionType,
                format!("unknown compression codec: attributes={attributes:#06x}"),
            ));
        }
        if attributes & 0x30 != 0 {
            return Err((
                ResponseError::InvalidRecord,
                "transactional and control batches are not supported".into(),
            ));
        }
        let producer = batch_producer(&batch);
        let checked = check_produced(&batch).map_err(batch_refusal)?;
        let count = i32::try_from(checked.records().len()).unwrap_or(i32::MAX);
        if producer.id < 0 {
            return Ok(Pending::Admitted(self.admit(name, checked).await?));
        }
        let slot = self.producers.state(producer.id, name.as_str());
        let give_up = tokio::time::Instant::now() + IN_FLIGHT_WAIT;
        loop {
            let mut state = slot.state.lock().await;
            // Before anything is looked at: an answer landing from here on is not missed.
            let moved = slot.moved.notified();
            let check = if state.must_wait() {
                Check::Wait
            } else {
                if state.needs_lookup() {
                    if !state.lost() && self.producers.allocated_here(producer.id) {
                        state.settle();
                    } else {
                        let found = self.look_up_producer(name, producer.id).await?;
                        state.restore_from(found);
                    }
                }
                state.check(producer.epoch, producer.base_seq, count)
            };
            match check {
                Check::Wait => {
                    drop(state);
                    tokio::time::timeout_at(give_up, moved).await.map_err(|_| {
                        (
                            ResponseError::KafkaStorageError,
                            "earlier batches of this producer are not confirmed yet: retry"
                                .to_string(),
                        )
                    })?;
                }
                Check::Duplicate(base_offset) => {
                    return Ok(Pending::Done(Written {
                        base_offset,
                        append_ms: -1,
                    }));
                }
                Check::Refuse(code) => {
                    return Err((
                        code,
                        format!(
                            "producer {} epoch {} sequence {} refused",
                            producer.id, producer.epoch, producer.base_seq
                        ),
                    ));
                }
                Check::Append => {
                    let admitted = self.admit(name, checked).await?;
                    let out = admitted.outcome();
                    let base_offset = out.start_seq.unwrap_or(out.next_seq);
                    state.admit(
                        producer.epoch,
                        producer.base_seq,
                        count,
                        base_offset,
                        self.producers.now_ms(),
                    );
                    drop(state);
                    let slot = slot.clone();
                    return Ok(Pending::Task(tokio::spawn(async move {
                        let r = admitted.wait().await;
                        slot.landed(base_offset, r.is_ok()).await;
                        written(r)
                    })));
                }
            }
        }
    }

    /// The state a producer left on a partition before this process knew it (a restart, or
    /// the partition moved here): its batches among the stream's latest, searched from the
    /// tail backwards in widening windows until some are found, [`LOOKUP_BYTES`] are read, or
    /// the batches are older than the producer id (then it has none before them: a producer
    /// handed out by another node that writes here for the first time costs one short read).
    async fn look_up_producer(
        &self,
        name: &StreamName,
        producer: i64,
    ) -> Result<PartitionState, Refusal> {
        let unavailable = |e: String| {
            (
                ResponseError::KafkaStorageError,
                format!("looking up producer {producer}: {e}"),
            )
        };
        let head = self
            .node
            .head(name)
            .await
            .map_err(|e| unavailable(e.to_string()))?;
        let mut found: Vec<StoredBatch> = Vec::new();
        let mut budget = LOOKUP_BYTES;
        let mut end = head.next_seq;
        let mut window = LOOKUP_FIRST;
        let since = Producers::handed_out_ms(producer).saturating_sub(LOOKUP_SKEW_MS);
        let mut older = false;
        while end > head.start_seq && budget > 0 && found.is_empty() && !older {
            let from = end.saturating_sub(window).max(head.start_seq);
            let mut at = from;
            while at < end && budget > 0 {
                let read = self
                    .node
                    .read_raw(name, at, LOOKUP_READ.min(budget))
                    .await
                    .map_err(|e| unavailable(e.to_string()))?;
                budget = budget.saturating_sub(read.bytes());
                for b in &read.batches {
                    // Batches are appended in time order: one appended before the producer
                    // existed means the older windows hold none of its batches either.
                    older |= appended_ms(b).is_some_and(|t| t < since);
                    // A batch straddling `from` belongs to the next, older window.
                    if let Some(s) = stored_batch(b, producer).filter(|s| s.base_offset >= from)
                        && s.base_offset < end
                    {
                        found.push(s);
                    }
                }
                if read.batches.is_empty() || read.next_seq <= at {
                    break;
                }
                at = read.next_seq;
            }
            end = from;
            window = window.saturating_mul(8);
        }
        tracing::debug!(
            producer,
            stream = %name,
            found = found.len(),
            "idempotent producer looked up in its partition"
        );
        Ok(restore(&found, self.producers.now_ms()))
    }

    async fn admit(&self, name: &StreamName, batch: ProducedBatch) -> Result<Admitted, Refusal> {
        self.node
            .admit_batch(name, batch)
            .await
            .map_err(|e| (append_error_code(&e), e.to_string()))
    }
}

/// A batch's write, as its partition's answer sees it.
fn written(r: Result<AppendOutcome, AppendError>) -> Result<Written, Refusal> {
    match r {
        Ok(out) => Ok(Written {
            base_offset: out.start_seq.unwrap_or(out.next_seq),
            append_ms: out.timestamp_ms,
        }),
        Err(e) => Err((append_error_code(&e), e.to_string())),
    }
}

/// `batch` as one of `producer`'s, if it is (header fields only).
fn stored_batch(batch: &[u8], producer: i64) -> Option<StoredBatch> {
    if batch.len() < HEADER_LEN {
        return None;
    }
    let p = batch_producer(batch);
    if p.id != producer {
        return None;
    }
    let delta = i32::from_be_bytes(
        batch[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4]
            .try_into()
            .ok()?,
    );
    Some(StoredBatch {
        epoch: p.epoch,
        base_seq: p.base_seq,
        count: delta.checked_add(1)?,
        base_offset: pico_protocol::batch::base_offset(batch).ok()?,
    })
}

/// A stored batch's append time: its max timestamp (the node sets it on every append).
fn appended_ms(batch: &[u8]) -> Option<i64> {
    let at = batch.get(MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8)?;
    Some(i64::from_be_bytes(at.try_into().ok()?))
}

/// A batch the checks refused, as Kafka answers it: damage the client may fix by sending
/// again is CORRUPT_MESSAGE (retriable), anything else is not retried.
fn batch_refusal(e: BatchError) -> Refusal {
    let code = match &e {
        BatchError::Crc { .. }
        | BatchError::Truncated { .. }
        | BatchError::BadLength { .. }
        | BatchError::BadMagic(_) => ResponseError::CorruptMessage,
        BatchError::Inflated { .. } => ResponseError::MessageTooLarge,
        BatchError::Unsupported(_) => ResponseError::UnsupportedCompressionType,
        BatchError::Decompress { .. } | BatchError::BadRecord { .. } | BatchError::Mismatch(_) => {
            ResponseError::InvalidRecord
        }
    };
    (code, format!("bad record batch: {e}"))
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
