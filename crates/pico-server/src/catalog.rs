//! The engine's [`Catalog`]: the committed object index read from the metadata view, and object
//! commits proposed through the metadata log. Producer claims and `Stream-Seq` values carried as
//! WAL `aux` bytes become the commit's producer marks and stream seq, so that state is committed
//! atomically with its data.

use crate::producers::decode_aux;
use pico_metadata::{ApplyError, Command, CommitRange, Outcome, ProducerMark};
use pico_sql::MetaLog;
use s3stream::{Catalog, CatalogError, ObjectCommit, ObjectSlice};
use std::collections::BTreeMap;

pub struct MetaCatalog {
    pub meta: MetaLog,
    pub node_id: u32,
    pub node_epoch: u64,
}

#[async_trait::async_trait]
impl Catalog for MetaCatalog {
    fn slices(&self, stream: u64, from_offset: u64, max: usize) -> Vec<ObjectSlice> {
        self.meta
            .view()
            .slices_from(stream, from_offset, max)
            .into_iter()
            .map(|s| ObjectSlice {
                key: s.key,
                start_offset: s.start_offset,
                end_offset: s.end_offset,
                position: s.position,
                len: s.len,
            })
            .collect()
    }

    fn committed_end(&self, stream: u64) -> u64 {
        self.meta
            .view()
            .streams
            .get(&stream)
            .map(|s| s.end_offset)
            .unwrap_or(0)
    }

    async fn commit(&self, commit: ObjectCommit) -> Result<Vec<bool>, CatalogError> {
        let n = commit.ranges.len();
        let key = commit.key.clone();
        let wanted: Vec<(u64, u64)> = commit
            .ranges
            .iter()
            .map(|r| (r.stream, r.start_offset))
            .collect();
        let ranges = commit
            .ranges
            .into_iter()
            .map(|r| CommitRange {
                stream_id: r.stream,
                epoch: r.epoch,
                start_offset: r.start_offset,
                end_offset: r.end_offset,
                position: r.position,
                len: r.len,
                producers: producer_marks(&r.aux),
                stream_seq: last_stream_seq(&r.aux),
            })
            .collect();
        let cmd = Command::CommitObject {
            node_id: self.node_id,
            node_epoch: self.node_epoch,
            key: commit.key,
            size: commit.size,
            ranges,
            now_ms: pico_common::clock::now_ms(),
        };
        match self.meta.propose(cmd).await {
            Err(e) => Err(CatalogError(e.to_string())),
            Ok(Ok(Outcome::Committed { accepted })) => Ok(accepted),
            Ok(Ok(other)) => Err(CatalogError(format!("unexpected outcome: {other:?}"))),
            // This node was fenced (or the command is invalid): none of its data may become visible.
            Ok(Err(e @ (ApplyError::StaleNodeEpoch { .. } | ApplyError::UnknownNode { .. }))) => {
                tracing::error!(error = %e, "object commit fenced; dropping its data");
                Ok(vec![false; n])
            }
            Ok(Err(e)) => {
                // A retry of a commit whose first attempt landed (its answer was lost) is
                // rejected as a duplicate key: what counts is what the view holds.
                if self.meta.view().objects.contains_key(&key) {
                    return Ok(self.accepted_in_view(&key, &wanted));
                }
                tracing::warn!(error = %e, "object commit rejected");
                Ok(vec![false; n])
            }
        }
    }
}

impl MetaCatalog {
    /// Per range: whether the view has a slice of this object starting at the range's start.
    fn accepted_in_view(&self, key: &str, ranges: &[(u64, u64)]) -> Vec<bool> {
        let view = self.meta.view();
        ranges
            .iter()
            .map(|(stream, start)| {
                view.slices_from(*stream, *start, 1)
                    .first()
                    .is_some_and(|s| s.key == key && s.start_offset == *start)
            })
            .collect()
    }
}

/// The last claim per producer id among a range's aux blobs.
fn producer_marks(aux: &[bytes::Bytes]) -> Vec<ProducerMark> {
    let mut last: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for claim in aux.iter().filter_map(|a| decode_aux(a).producer) {
        last.insert(claim.id, (claim.epoch, claim.seq));
    }
    last.into_iter()
        .map(|(id, (epoch, seq))| ProducerMark { id, epoch, seq })
        .collect()
}

/// The last `Stream-Seq` among a range's aux blobs.
fn last_stream_seq(aux: &[bytes::Bytes]) -> Option<String> {
    aux.iter().rev().find_map(|a| decode_aux(a).stream_seq)
}
