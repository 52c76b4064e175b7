//! Topics and streams. A topic is a set of streams, one per partition:
//!
//! - partition 0 of topic `t` is the stream `/t`;
//! - partition `p` ≥ 1 is the stream `/t/~p` (`~` cannot occur in a Kafka topic name, so no
//!   topic's partition 0 is ever another topic's partition).
//!
//! A topic's partition count is how many of `/t`, `/t/~1`, `/t/~2`, … exist in a row: it
//! lives in the registry with the streams, nothing else needs storing.
//!
//! Nested streams are topics under a dotted alias: `/logs/api` is topic `logs.api` when every
//! segment is a legal topic name without a dot (so the alias maps back one way only) and no
//! stream `/logs.api` exists (a literal name wins: the alias would be ambiguous). Other
//! streams (other characters, reserved namespaces) are not topics.

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult,
};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use pico_common::StreamName;
use pico_server::{CreateConfig, CreateError, CreateRequest, DeleteError, ListRequest, ReadError};

use crate::broker::Broker;
use crate::cluster::Leader;

/// Most partitions one topic may have.
pub const MAX_PARTITIONS: i32 = 1024;
/// Longest Kafka topic name.
const MAX_TOPIC_LEN: usize = 249;

/// Whether `topic` is a legal Kafka topic name that maps onto a stream.
pub fn valid_topic(topic: &str) -> bool {
    !topic.is_empty()
        && topic.len() <= MAX_TOPIC_LEN
        && topic != "."
        && topic != ".."
        && topic
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The stream of `topic`'s partition `partition`; `None` for an illegal topic or partition.
pub fn partition_stream(topic: &str, partition: i32) -> Option<StreamName> {
    if !valid_topic(topic) || !(0..MAX_PARTITIONS).contains(&partition) {
        return None;
    }
    let name = if partition == 0 {
        topic.to_string()
    } else {
        format!("{topic}/~{partition}")
    };
    let name = StreamName::parse(&name).ok()?;
    (!name.is_reserved()).then_some(name)
}

/// The nested stream a dotted topic names: `logs.api` → `logs/api` (`None` without a dot, or
/// when the result is not a legal, unreserved stream name).
pub fn dotted_alias(topic: &str) -> Option<StreamName> {
    if !valid_topic(topic) || !topic.contains('.') || topic.split('.').any(str::is_empty) {
        return None;
    }
    let name = StreamName::parse(&topic.replace('.', "/")).ok()?;
    (!name.is_reserved()).then_some(name)
}

/// The dotted topic of a nested stream: `logs/api` → `logs.api`, when every segment is a legal
/// topic name without a dot (the alias then maps back to this stream only).
pub fn nested_topic(stream: &str) -> Option<String> {
    if !stream.contains('/')
        || stream
            .split('/')
            .any(|seg| seg.contains('.') || !valid_topic(seg))
    {
        return None;
    }
    let topic = stream.replace('/', ".");
    valid_topic(&topic).then_some(topic)
}

/// The stream of partition `partition` of the topic whose partition 0 is `base`.
fn base_partition(base: &StreamName, partition: i32) -> Option<StreamName> {
    match partition {
        0 => Some(base.clone()),
        p if (1..MAX_PARTITIONS).contains(&p) => {
            StreamName::parse(&format!("{}/~{p}", base.as_str())).ok()
        }
        _ => None,
    }
}

/// Which topic and partition a stream is, if it is one.
pub fn stream_partition(name: &str) -> Option<(&str, i32)> {
    match name.split_once("/~") {
        None => valid_topic(name).then_some((name, 0)),
        Some((topic, p)) => {
            let p: i32 = p.parse().ok()?;
            (valid_topic(topic)
                && (1..MAX_PARTITIONS).contains(&p)
                && p.to_string() == name[topic.len() + 2..])
                .then_some((topic, p))
        }
    }
}

pub(crate) fn topic_error(code: ResponseError) -> i16 {
    code.code()
}

impl Broker {
    /// The stream that is partition 0 of `topic`: `/topic`, or for a dotted topic whose
    /// literal stream does not exist, the nested stream it aliases if that exists.
    pub async fn topic_base(&self, topic: &str) -> Option<StreamName> {
        let literal = partition_stream(topic, 0)?;
        if let Some(alias) = dotted_alias(topic)
            && self.node.head(&literal).await.is_err()
            && self.node.head(&alias).await.is_ok()
        {
            return Some(alias);
        }
        Some(literal)
    }

    /// The stream of `topic`'s partition `partition` (see [`Broker::topic_base`]); `None` for
    /// an illegal topic or partition.
    pub async fn stream_of(&self, topic: &str, partition: i32) -> Option<StreamName> {
        if !(0..MAX_PARTITIONS).contains(&partition) {
            return None;
        }
        base_partition(&self.topic_base(topic).await?, partition)
    }

    /// How many partitions `topic` has (0 = no such topic).
    pub async fn partitions(&self, topic: &str) -> i32 {
        let Some(base) = self.topic_base(topic).await else {
            return 0;
        };
        let mut n = 0;
        while n < MAX_PARTITIONS {
            let Some(name) = base_partition(&base, n) else {
                break;
            };
            if self.node.head(&name).await.is_err() {
                break;
            }
            n += 1;
        }
        n
    }

    /// Every topic: streams whose name is a legal topic name (their partition count follows),
    /// and nested streams under their dotted alias where no literal stream takes the name.
    fn all_topics(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut nested = Vec::new();
        let mut after = None;
        loop {
            let page = self.node.list(ListRequest {
                prefix: None,
                start_after: after.clone(),
                limit: 1000,
            });
            for s in &page.streams {
                if valid_topic(s.name.as_str()) {
                    out.push(s.name.as_str().to_string());
                } else if let Some(t) = nested_topic(s.name.as_str()) {
                    nested.push(t);
                }
            }
            if !page.has_more || page.streams.is_empty() {
                break;
            }
            after = page.streams.last().map(|s| s.name.as_str().to_string());
        }
        let literal: std::collections::HashSet<String> = out.iter().cloned().collect();
        out.extend(nested.into_iter().filter(|t| !literal.contains(t)));
        out
    }

    /// Creates `topic` with `count` partitions (its missing partition streams).
    pub async fn create_topic(
        &self,
        topic: &str,
        from: i32,
        count: i32,
    ) -> Result<(), ResponseError> {
        let base = self
            .topic_base(topic)
            .await
            .ok_or(ResponseError::InvalidTopicException)?;
        for p in from..count {
            let name = base_partition(&base, p).ok_or(ResponseError::InvalidTopicException)?;
            let created = self
                .node
                .create(CreateRequest {
                    name,
                    config: CreateConfig::default(),
                    initial: vec![],
                })
                .await;
            match created {
                Ok(_) => {}
                Err(CreateError::Conflict { .. }) => return Err(ResponseError::TopicAlreadyExists),
                Err(CreateError::BadRequest(_)) => {
                    return Err(ResponseError::InvalidTopicException);
                }
                Err(e) => {
                    tracing::warn!(topic, error = %e, "kafka topic create failed");
                    return Err(ResponseError::KafkaStorageError);
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn metadata(&self, r: MetadataRequest, v: i16) -> MetadataResponse {
        let auto_create = v < 4 || r.allow_auto_topic_creation;
        let names: Vec<String> = match r.topics {
            None => self.all_topics(),
            Some(ts) if v == 0 && ts.is_empty() => self.all_topics(),
            Some(ts) => ts
                .into_iter()
                .filter_map(|t| t.name.map(|n| n.0.to_string()))
                .collect(),
        };
        let mut topics = Vec::with_capacity(names.len());
        for name in names {
            let mut t = MetadataResponseTopic::default();
            t.name = Some(TopicName(StrBytes::from_string(name.clone())));
            if !valid_topic(&name) {
                t.error_code = topic_error(ResponseError::InvalidTopicException);
                topics.push(t);
                continue;
            }
            let mut n = self.partitions(&name).await;
            if n == 0 && auto_create && self.create_topic(&name, 0, 1).await.is_ok() {
                n = self.partitions(&name).await;
            }
            if n == 0 {
                t.error_code = topic_error(ResponseError::UnknownTopicOrPartition);
            }
            for p in 0..n {
                let mut part = MetadataResponsePartition::default();
                part.partition_index = p;
                let leader = match self.stream_of(&name, p).await {
                    Some(stream) => self.leader_of(&stream),
                    None => Leader::Here,
                };
                let leader = match leader {
                    Leader::Here => self.opts.broker_id,
                    Leader::Node(id) => id,
                    Leader::Unavailable => {
                        part.error_code = ResponseError::LeaderNotAvailable.code();
                        -1
                    }
                };
                part.leader_id = BrokerId(leader);
                if v >= 7 {
                    part.leader_epoch = 0;
                }
                if leader >= 0 {
                    part.replica_nodes = vec![BrokerId(leader)];
                    part.isr_nodes = vec![BrokerId(leader)];
                }
                t.partitions.push(part);
            }
            topics.push(t);
        }
        let mut resp = MetadataResponse::default();
        resp.brokers = self
            .brokers()
            .into_iter()
            .map(|b| {
                let mut broker = MetadataResponseBroker::default();
                broker.node_id = BrokerId(b.id);
                broker.host = StrBytes::from_string(b.host);
                broker.port = b.port;
                broker
            })
            .collect();
        if v >= 2 {
            resp.cluster_id = Some(StrBytes::from_string(self.opts.cluster_id.clone()));
        }
        if v >= 1 {
            resp.controller_id = BrokerId(self.opts.broker_id);
        }
        resp.topics = topics;
        resp
    }

    pub(crate) async fn create_topics(
        &self,
        r: CreateTopicsRequest,
        _v: i16,
    ) -> CreateTopicsResponse {
        let mut resp = CreateTopicsResponse::default();
        for t in r.topics {
            let name = t.name.0.to_string();
            let mut out = CreatableTopicResult::default();
            out.name = t.name;
            let count = if t.num_partitions == -1 {
                1
            } else {
                t.num_partitions
            };
            let result = if !valid_topic(&name) || partition_stream(&name, 0).is_none() {
                Err((ResponseError::InvalidTopicException, "illegal topic name"))
            } else if !(1..=MAX_PARTITIONS).contains(&count) {
                Err((
                    ResponseError::InvalidPartitions,
                    "partitions must be 1..=1024",
                ))
            } else if t.replication_factor != -1 && t.replication_factor != 1 {
                Err((
                    ResponseError::InvalidReplicationFactor,
                    "replication is the storage's: replication factor must be 1 or -1",
                ))
            } else if !t.assignments.is_empty() {
                Err((
                    ResponseError::InvalidRequest,
                    "manual assignments are not supported",
                ))
            } else if self.partitions(&name).await > 0 {
                Err((ResponseError::TopicAlreadyExists, "topic exists"))
            } else if r.validate_only {
                Ok(())
            } else {
                self.create_topic(&name, 0, count)
                    .await
                    .map_err(|e| (e, "topic not created"))
            };
            if let Err((code, msg)) = result {
                out.error_code = code.code();
                out.error_message = Some(StrBytes::from_static_str(msg));
            }
            resp.topics.push(out);
        }
        resp
    }

    pub(crate) async fn delete_topics(
        &self,
        r: DeleteTopicsRequest,
        _v: i16,
    ) -> DeleteTopicsResponse {
        let mut resp = DeleteTopicsResponse::default();
        for name in r.topic_names {
            let topic = name.0.to_string();
            let mut out = DeletableTopicResult::default();
            out.name = Some(name);
            let n = self.partitions(&topic).await;
            if n == 0 {
                out.error_code = ResponseError::UnknownTopicOrPartition.code();
            }
            // Highest partition first: a topic half deleted still counts its partitions from 0.
            for p in (0..n).rev() {
                let Some(stream) = self.stream_of(&topic, p).await else {
                    break;
                };
                match self.node.delete(&stream).await {
                    Ok(()) | Err(DeleteError::NotFound(_)) | Err(DeleteError::Gone(_)) => {}
                    Err(e) => {
                        tracing::warn!(topic, error = %e, "kafka topic delete failed");
                        out.error_code = ResponseError::KafkaStorageError.code();
                        break;
                    }
                }
            }
            resp.responses.push(out);
        }
        resp
    }

    pub(crate) async fn create_partitions(
        &self,
        r: CreatePartitionsRequest,
        _v: i16,
    ) -> CreatePartitionsResponse {
        let mut resp = CreatePartitionsResponse::default();
        for t in r.topics {
            let topic = t.name.0.to_string();
            let mut out = CreatePartitionsTopicResult::default();
            out.name = t.name;
            let current = self.partitions(&topic).await;
            let result = if current == 0 {
                Err((ResponseError::UnknownTopicOrPartition, "no such topic"))
            } else if t.count <= current || t.count > MAX_PARTITIONS {
                Err((
                    ResponseError::InvalidPartitions,
                    "count must grow, at most 1024",
                ))
            } else if t.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
                Err((
                    ResponseError::InvalidRequest,
                    "manual assignments are not supported",
                ))
            } else if r.validate_only {
                Ok(())
            } else {
                self.create_topic(&topic, current, t.count)
                    .await
                    .map_err(|e| (e, "partitions not created"))
            };
            if let Err((code, msg)) = result {
                out.error_code = code.code();
                out.error_message = Some(StrBytes::from_static_str(msg));
            }
            resp.results.push(out);
        }
        resp
    }

    pub(crate) async fn describe_configs(
        &self,
        r: DescribeConfigsRequest,
        _v: i16,
    ) -> DescribeConfigsResponse {
        let mut resp = DescribeConfigsResponse::default();
        for res in r.resources {
            let mut out = DescribeConfigsResult::default();
            out.resource_type = res.resource_type;
            out.resource_name = res.resource_name.clone();
            // 2 = topic, 4 = broker.
            let configs: &[(&str, &str)] = match res.resource_type {
                2 => {
                    if self.partitions(res.resource_name.as_str()).await == 0 {
                        out.error_code = ResponseError::UnknownTopicOrPartition.code();
                        &[]
                    } else {
                        &[
                            ("cleanup.policy", "delete"),
                            ("message.timestamp.type", "LogAppendTime"),
                            ("compression.type", "producer"),
                            ("retention.ms", "-1"),
                        ]
                    }
                }
                4 => &[("auto.create.topics.enable", "true")],
                _ => {
                    out.error_code = ResponseError::InvalidRequest.code();
                    &[]
                }
            };
            // Null or empty: every key.
            let wanted = res.configuration_keys.as_ref().filter(|w| !w.is_empty());
            out.configs = configs
                .iter()
                .filter(|(k, _)| wanted.is_none_or(|w| w.iter().any(|x| x.as_str() == *k)))
                .map(|(k, val)| {
                    let mut c = DescribeConfigsResourceResult::default();
                    c.name = StrBytes::from_static_str(k);
                    c.value = Some(StrBytes::from_static_str(val));
                    c.read_only = true;
                    c
                })
                .collect();
            resp.results.push(out);
        }
        resp
    }
}

/// A read error as a partition error code.
pub(crate) fn read_error_code(e: &ReadError) -> ResponseError {
    match e {
        ReadError::NotFound(_) | ReadError::Gone(_) => ResponseError::UnknownTopicOrPartition,
        ReadError::Trimmed { .. } | ReadError::BeyondTail { .. } => ResponseError::OffsetOutOfRange,
        ReadError::Unavailable(_) => ResponseError::NotLeaderOrFollower,
        ReadError::Internal(_) => ResponseError::KafkaStorageError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_map_to_streams_and_back() {
        assert_eq!(partition_stream("t", 0).unwrap().as_str(), "t");
        assert_eq!(partition_stream("t", 3).unwrap().as_str(), "t/~3");
        assert_eq!(stream_partition("t"), Some(("t", 0)));
        assert_eq!(stream_partition("t/~3"), Some(("t", 3)));
        assert_eq!(stream_partition("t/~03"), None);
        assert_eq!(stream_partition("t/x"), None);
        assert_eq!(stream_partition("logs/api"), None);
        assert!(partition_stream("a/b", 0).is_none());
        assert!(partition_stream("..", 0).is_none());
        assert!(partition_stream("t", -1).is_none());
        assert!(partition_stream("_sys", 0).is_none());
        assert!(valid_topic("my-topic_1.x"));
        assert!(!valid_topic("caf\u{e9}"));
    }

    #[test]
    fn nested_streams_have_a_dotted_alias_that_maps_back() {
        assert_eq!(dotted_alias("logs.api").unwrap().as_str(), "logs/api");
        assert_eq!(dotted_alias("a.b.c").unwrap().as_str(), "a/b/c");
        assert_eq!(nested_topic("logs/api").as_deref(), Some("logs.api"));
        assert_eq!(nested_topic("a/b/c").as_deref(), Some("a.b.c"));
        // No dot, an empty segment, a reserved namespace: no alias.
        assert!(dotted_alias("plain").is_none());
        assert!(dotted_alias("a..b").is_none());
        assert!(dotted_alias(".a").is_none());
        assert!(dotted_alias("_sys.x").is_none());
        // A segment with a dot (its alias would map back elsewhere), a partition stream, or
        // characters no topic may hold: not a topic.
        assert!(nested_topic("a.b/c").is_none());
        assert!(nested_topic("t/~1").is_none());
        assert!(nested_topic("logs/my api").is_none());
        assert!(nested_topic("plain").is_none());
    }
}
