//! One request in, one reply out: the version check, the structural pass, decoding, dispatch
//! to the handler modules and response encoding.

use bytes::{Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use pico_server::Node;

use crate::KafkaOptions;
use crate::cluster::Liveness;
use crate::groups::Coordinator;
use crate::produce::ProduceAdmitted;
use crate::producers::Producers;
use crate::validate;
use crate::versions::{SUPPORTED, supported};

/// What the connection does with a request.
#[derive(Debug)]
pub enum Reply {
    Send(Bytes),
    /// acks=0 produce: Kafka sends no response.
    None,
    /// Malformed or unsupported: close the connection (as Kafka does).
    Close(String),
}

/// A request admitted by [`Broker::start`].
pub enum Started {
    /// Answered (every request but Produce).
    Done(Reply),
    /// A Produce with its batches admitted: [`Broker::finish`] waits for their writes.
    Produce(Produced),
}

/// An admitted Produce request, and how to answer it.
pub struct Produced {
    correlation: i32,
    admitted: ProduceAdmitted,
}

/// The Kafka facade's state: the node, the group coordinator, idempotent producers.
pub struct Broker {
    pub(crate) node: Node,
    pub(crate) opts: KafkaOptions,
    pub(crate) groups: Coordinator,
    pub(crate) producers: Producers,
    pub(crate) liveness: Liveness,
}

impl Broker {
    pub fn new(node: Node, opts: KafkaOptions) -> Broker {
        let clock = node.config().clock.clone();
        Broker {
            groups: Coordinator::new(node.clone(), clock.clone()),
            producers: Producers::new(clock, opts.broker_id),
            liveness: Liveness::default(),
            node,
            opts,
        }
    }

    pub fn options(&self) -> &KafkaOptions {
        &self.opts
    }

    pub fn node(&self) -> &Node {
        &self.node
    }

    pub fn coordinator(&self) -> &Coordinator {
        &self.groups
    }

    /// Answers one request frame (without its length prefix).
    pub async fn handle(&self, frame: Bytes) -> Reply {
        match self.start(frame).await {
            Started::Done(reply) => reply,
            Started::Produce(p) => self.finish(p).await,
        }
    }

    /// The answer to an admitted Produce, once its batches' writes are confirmed (none for
    /// acks=0).
    pub async fn finish(&self, p: Produced) -> Reply {
        let Produced {
            correlation,
            admitted,
        } = p;
        let (v, acks) = (admitted.version(), admitted.acks());
        let resp = admitted.finish(self).await;
        if acks == 0 {
            Reply::None
        } else {
            encode(ApiKey::Produce, v, correlation, &resp)
        }
    }

    /// Answers one request frame, except a Produce, which returns once its batches are
    /// admitted (offsets assigned, in request order) so the connection can read the next
    /// request while their writes are in flight.
    pub async fn start(&self, frame: Bytes) -> Started {
        if frame.len() < 8 {
            return Started::Done(Reply::Close("frame shorter than a request header".into()));
        }
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
        let Ok(api) = ApiKey::try_from(key) else {
            return Started::Done(Reply::Close(format!("unknown api key {key}")));
        };
        if !supported(api, version) {
            if api == ApiKey::ApiVersions {
                // The client learns the versions from a v0 answer and retries (KIP-511).
                let resp = api_versions(ResponseError::UnsupportedVersion.code());
                return Started::Done(encode(ApiKey::ApiVersions, 0, correlation, &resp));
            }
            return Started::Done(Reply::Close(format!("unsupported {api:?} v{version}")));
        }
        let header_version = api.request_header_version(version);
        if let Err(e) = validate::check_request(&frame, key, version, header_version >= 2) {
            return Started::Done(Reply::Close(format!("malformed {api:?} v{version}: {e}")));
        }
        let mut buf = frame;
        let header = match RequestHeader::decode(&mut buf, header_version) {
            Ok(h) => h,
            Err(e) => return Started::Done(Reply::Close(format!("bad request header: {e}"))),
        };
        let client_id = header.client_id.as_ref().map_or("", |c| c.as_str());
        macro_rules! decode {
            ($t:ty) => {
                match <$t>::decode(&mut buf, version) {
                    Ok(r) => r,
                    Err(e) => {
                        return Started::Done(Reply::Close(format!(
                            "malformed {api:?} v{version}: {e}"
                        )))
                    }
                }
            };
        }
        let v = version;
        let reply = match api {
            ApiKey::ApiVersions => {
                let _ = decode!(ApiVersionsRequest);
                encode(api, v, correlation, &api_versions(0))
            }
            ApiKey::Metadata => {
                let r = decode!(MetadataRequest);
                encode(api, v, correlation, &self.metadata(r, v).await)
            }
            ApiKey::CreateTopics => {
                let r = decode!(CreateTopicsRequest);
                encode(api, v, correlation, &self.create_topics(r, v).await)
            }
            ApiKey::DeleteTopics => {
                let r = decode!(DeleteTopicsRequest);
                encode(api, v, correlation, &self.delete_topics(r, v).await)
            }
            ApiKey::CreatePartitions => {
                let r = decode!(CreatePartitionsRequest);
                encode(api, v, correlation, &self.create_partitions(r, v).await)
            }
            ApiKey::Produce => {
                let r = decode!(ProduceRequest);
                let admitted = self.admit_produce(r, v).await;
                return Started::Produce(Produced {
                    correlation,
                    admitted,
                });
            }
            ApiKey::Fetch => {
                let r = decode!(FetchRequest);
                encode(api, v, correlation, &self.fetch(r, v).await)
            }
            ApiKey::ListOffsets => {
                let r = decode!(ListOffsetsRequest);
                encode(api, v, correlation, &self.list_offsets(r, v).await)
            }
            ApiKey::InitProducerId => {
                let r = decode!(InitProducerIdRequest);
                encode(api, v, correlation, &self.init_producer_id(r))
            }
            ApiKey::FindCoordinator => {
                let r = decode!(FindCoordinatorRequest);
                encode(api, v, correlation, &self.find_coordinator(r, v))
            }
            // A group's membership lives on its coordinator only: elsewhere NOT_COORDINATOR
            // sends the client back to FindCoordinator.
            ApiKey::JoinGroup => {
                let r = decode!(JoinGroupRequest);
                let resp = if self.coordinates(r.group_id.0.as_str()) {
                    self.groups.join(r, v, client_id).await
                } else {
                    let mut resp = JoinGroupResponse::default();
                    resp.error_code = ResponseError::NotCoordinator.code();
                    resp.generation_id = -1;
                    resp.member_id = r.member_id;
                    resp
                };
                encode(api, v, correlation, &resp)
            }
            ApiKey::SyncGroup => {
                let r = decode!(SyncGroupRequest);
                let resp = if self.coordinates(r.group_id.0.as_str()) {
                    self.groups.sync(r).await
                } else {
                    SyncGroupResponse::default()
                        .with_error_code(ResponseError::NotCoordinator.code())
                };
                encode(api, v, correlation, &resp)
            }
            ApiKey::Heartbeat => {
                let r = decode!(HeartbeatRequest);
                let resp = if self.coordinates(r.group_id.0.as_str()) {
                    self.groups.heartbeat(r)
                } else {
                    HeartbeatResponse::default()
                        .with_error_code(ResponseError::NotCoordinator.code())
                };
                encode(api, v, correlation, &resp)
            }
            ApiKey::LeaveGroup => {
                let r = decode!(LeaveGroupRequest);
                let resp = if self.coordinates(r.group_id.0.as_str()) {
                    self.groups.leave(r, v)
                } else {
                    LeaveGroupResponse::default()
                        .with_error_code(ResponseError::NotCoordinator.code())
                };
                encode(api, v, correlation, &resp)
            }
            ApiKey::OffsetCommit => {
                let r = decode!(OffsetCommitRequest);
                let resp = if self.coordinates(r.group_id.0.as_str()) {
                    self.groups.commit(r, v).await
                } else {
                    commit_refused(&r, ResponseError::NotCoordinator)
                };
                encode(api, v, correlation, &resp)
            }
            ApiKey::OffsetFetch => {
                let r = decode!(OffsetFetchRequest);
                encode(api, v, correlation, &self.groups.fetch_offsets(r, v))
            }
            ApiKey::ListGroups => {
                let _ = decode!(ListGroupsRequest);
                encode(api, v, correlation, &self.groups.list())
            }
            ApiKey::DescribeGroups => {
                let r = decode!(DescribeGroupsRequest);
                encode(api, v, correlation, &self.groups.describe(r))
            }
            ApiKey::DescribeCluster => {
                let r = decode!(DescribeClusterRequest);
                encode(api, v, correlation, &self.describe_cluster(r, v))
            }
            ApiKey::DescribeConfigs => {
                let r = decode!(DescribeConfigsRequest);
                encode(api, v, correlation, &self.describe_configs(r, v).await)
            }
            other => Reply::Close(format!("unsupported {other:?}")),
        };
        Started::Done(reply)
    }

    fn find_coordinator(&self, r: FindCoordinatorRequest, v: i16) -> FindCoordinatorResponse {
        let mut resp = FindCoordinatorResponse::default();
        if r.key_type != 0 {
            // Transactions are not served: no transaction coordinator exists.
            resp.error_code = ResponseError::CoordinatorNotAvailable.code();
            if v >= 1 {
                resp.error_message = Some("transactions are not supported".into());
            }
            resp.node_id = BrokerId(-1);
            resp.host = "".into();
            resp.port = -1;
            return resp;
        }
        let at = self.coordinator_for(r.key.as_str());
        resp.node_id = BrokerId(at.id);
        resp.host = StrBytes::from_string(at.host);
        resp.port = at.port;
        resp
    }

    fn init_producer_id(&self, r: InitProducerIdRequest) -> InitProducerIdResponse {
        let mut resp = InitProducerIdResponse::default();
        if r.transactional_id.as_ref().is_some_and(|t| !t.is_empty()) {
            resp.error_code = ResponseError::TransactionalIdAuthorizationFailed.code();
            resp.producer_id = ProducerId(-1);
            resp.producer_epoch = -1;
            return resp;
        }
        let (id, epoch) = self.producers.allocate();
        resp.producer_id = ProducerId(id);
        resp.producer_epoch = epoch;
        resp
    }
}

/// An OffsetCommit answer refusing every partition with `code`.
fn commit_refused(r: &OffsetCommitRequest, code: ResponseError) -> OffsetCommitResponse {
    use kafka_protocol::messages::offset_commit_response::{
        OffsetCommitResponsePartition, OffsetCommitResponseTopic,
    };
    let mut resp = OffsetCommitResponse::default();
    resp.topics = r
        .topics
        .iter()
        .map(|t| {
            let mut out = OffsetCommitResponseTopic::default();
            out.name = t.name.clone();
            out.partitions = t
                .partitions
                .iter()
                .map(|p| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code.code())
                })
                .collect();
            out
        })
        .collect();
    resp
}

/// The ApiVersions answer: every supported API at its version range.
fn api_versions(error_code: i16) -> ApiVersionsResponse {
    let mut resp = ApiVersionsResponse::default();
    resp.error_code = error_code;
    resp.api_keys = SUPPORTED
        .iter()
        .map(|&(k, min, max)| {
            ApiVersion::default()
                .with_api_key(k as i16)
                .with_min_version(min)
                .with_max_version(max)
        })
        .collect();
    resp
}

/// The response frame: header (correlation id) and body at `version`.
pub fn encode<T: Encodable>(api: ApiKey, version: i16, correlation: i32, body: &T) -> Reply {
    let mut buf = BytesMut::new();
    let header = ResponseHeader::default().with_correlation_id(correlation);
    let encoded = header
        .encode(&mut buf, api.response_header_version(version))
        .and_then(|()| body.encode(&mut buf, version));
    match encoded {
        Ok(()) => Reply::Send(buf.freeze()),
        Err(e) => {
            tracing::error!(?api, version, error = %e, "kafka response not encodable");
            Reply::Close(format!("response not encodable: {e}"))
        }
    }
}
