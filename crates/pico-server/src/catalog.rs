//! The engine's [`Catalog`]: the committed object index read from the metadata view, and object
//! commits proposed through the metadata log. Producer claims and `Stream-Seq` values carried as
//! WAL `aux` bytes become the commit's producer marks and stream seq, so that state is committed
//! atomically with its data.

use crate::producers::decode_aux;
use pico_metadata::{ApplyError, Command, CommitRange, Outcome, ProducerMark};
use pico_sql::MetaLog;
use s3stream::{Catalog, CatalogError, ObjectCommit, ObjectSlice, RangeAux};
use std::collections::BTreeMap;

pub struct MetaCatalog {
    pub meta: MetaLog,
    pub node_id: u32,
    pub node_epoch: u64,
    /// Stamps commits (`now_ms`: producer ageing in the metadata state).
    pub clock: pico_common::clock::SharedClock,
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
        let wanted: Vec<Wanted> = commit
            .ranges
            .iter()
            .map(|r| Wanted {
                stream: r.stream,
                epoch: r.epoch,
                start: r.start_offset,
                end: r.end_offset,
            })
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
            now_ms: self.clock.now_ms(),
        };
        match self.meta.propose(cmd).await {
            Err(e) => Err(CatalogError::Unavailable(e.to_string())),
            Ok(Ok(Outcome::Committed { accepted })) if accepted.iter().all(|a| *a) => Ok(accepted),
            Ok(Ok(Outcome::Committed { accepted })) => {
                // A retry after garbage collection forgot the first attempt's object (its
                // ranges were all trimmed away) applies as new and is refused for ranges the
                // first attempt already committed: the view says which those are.
                let held = self.accepted_in_view(&key, &wanted);
                Ok(accepted.iter().zip(held).map(|(a, h)| *a || h).collect())
            }
            Ok(Ok(other)) => Err(CatalogError::Unavailable(format!(
                "unexpected outcome: {other:?}"
            ))),
            // This incarnation was fenced: none of its data may become visible through it, and
            // its WAL is its recoverer's now (failover or the next incarnation), so the engine
            // must not drop and trim what it holds, as a per-range `false` would make it.
            Ok(Err(e @ (ApplyError::StaleNodeEpoch { .. } | ApplyError::UnknownNode { .. }))) => {
                Err(CatalogError::Fenced(e.to_string()))
            }
            Ok(Err(e)) => {
                // A retry of a commit whose first attempt landed (its answer was lost) is
                // rejected as a duplicate key: what counts is what the view holds.
                let accepted = self.accepted_in_view(&key, &wanted);
                if accepted.iter().any(|a| *a) {
                    return Ok(accepted);
                }
                tracing::warn!(error = %e, "object commit rejected");
                Ok(vec![false; n])
            }
        }
    }
}

/// What a commit asked for one range, to find it in the view after a lost answer.
struct Wanted {
    stream: u64,
    epoch: i64,
    start: u64,
    end: u64,
}

impl MetaCatalog {
    /// Per range: whether the view holds it. Either a slice of this object starts at the
    /// range's start, or the range was accepted without a slice because the stream had been
    /// trimmed past it: then the stream is still at the range's epoch (only this owner
    /// commits at it) with its committed end at or past the range's and its start too.
    fn accepted_in_view(&self, key: &str, ranges: &[Wanted]) -> Vec<bool> {
        let view = self.meta.view();
        ranges
            .iter()
            .map(|w| {
                let sliced = view
                    .slices_from(w.stream, w.start, 1)
                    .first()
                    .is_some_and(|s| s.key == key && s.start_offset == w.start);
                sliced
                    || view.streams.get(&w.stream).is_some_and(|s| {
                        s.epoch == w.epoch && s.end_offset >= w.end && s.start_offset >= w.end
                    })
            })
            .collect()
    }
}

/// The last claim per producer id among a range's aux blobs, with the offsets of its append
/// (a retry of that claim is answered with them).
fn producer_marks(aux: &[RangeAux]) -> Vec<ProducerMark> {
    let mut last: BTreeMap<String, ProducerMark> = BTreeMap::new();
    for a in aux {
        if let Some(claim) = decode_aux(&a.aux).producer {
            let mark = ProducerMark {
                id: claim.id.clone(),
                epoch: claim.epoch,
                seq: claim.seq,
                start_offset: a.base_offset,
                end_offset: a.next_offset,
            };
            last.insert(claim.id, mark);
        }
    }
    last.into_values().collect()
}

/// The last `Stream-Seq` among a range's aux blobs.
fn last_stream_seq(aux: &[RangeAux]) -> Option<String> {
    aux.iter().rev().find_map(|a| decode_aux(&a.aux).stream_seq)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pico_metadata::{Initial, StreamConfig};
    use pico_sql::MetaLogOptions;

    /// Object `key` holding offsets 0..5 of stream 0 at epoch 0.
    fn one_range_commit(key: &str) -> ObjectCommit {
        ObjectCommit {
            key: key.into(),
            size: 5,
            ranges: vec![s3stream::CommitRange {
                stream: 0,
                epoch: 0,
                start_offset: 0,
                end_offset: 5,
                position: 0,
                len: 5,
                aux: vec![],
            }],
        }
    }

    /// A range committed after its stream was trimmed past it is accepted without a slice. If
    /// that answer is lost, the retry is rejected (its range no longer follows the committed
    /// end) and must still read as accepted: refusing it would break a healthy stream.
    #[tokio::test]
    async fn a_retried_commit_of_a_trimmed_range_is_accepted() {
        let meta = MetaLog::open("sqlite::memory:", MetaLogOptions::default())
            .await
            .unwrap();
        let cmds = [
            Command::RegisterNode {
                node_id: 1,
                node_epoch: 1,
                address: "n".into(),
                now_ms: 1,
            },
            Command::CreateStream {
                name: "s".into(),
                config: StreamConfig {
                    content_type: "t".into(),
                    ttl_secs: None,
                    expires_at_ms: None,
                },
                closed: false,
                initial: Initial::None,
                now_ms: 1,
            },
            Command::OpenStream {
                stream_id: 0,
                node_id: 1,
                node_epoch: 1,
            },
            Command::Trim {
                stream_id: 0,
                start_offset: 10,
            },
        ];
        for c in cmds {
            meta.propose(c).await.unwrap().unwrap();
        }
        let catalog = MetaCatalog {
            meta,
            node_id: 1,
            node_epoch: 1,
            clock: pico_common::clock::system(),
        };
        let commit = || one_range_commit("k");
        assert_eq!(catalog.commit(commit()).await.unwrap(), vec![true]);
        assert_eq!(catalog.commit(commit()).await.unwrap(), vec![true]);
        // Garbage collection forgets the object (no live slice refers to it); a retry still
        // arriving then applies as new, is refused by the state machine, and is still the
        // first attempt's commit.
        catalog
            .meta
            .propose(Command::ForgetObject { key: "k".into() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(catalog.commit(commit()).await.unwrap(), vec![true]);
        // A range of another epoch is not taken for it.
        let mut stale = commit();
        stale.ranges[0].epoch = -1;
        stale.key = "k2".into();
        assert_eq!(catalog.commit(stale).await.unwrap(), vec![false]);
    }

    /// A fenced incarnation's commit is an error the engine stops on, never per-range
    /// `false`: on `false` the engine drops the data and trims its WAL, which the incarnation's
    /// recoverer has yet to read.
    #[tokio::test]
    async fn a_fenced_incarnations_commit_is_refused_as_fenced() {
        let meta = MetaLog::open("sqlite::memory:", MetaLogOptions::default())
            .await
            .unwrap();
        for epoch in [1, 2] {
            meta.propose(Command::RegisterNode {
                node_id: 1,
                node_epoch: epoch,
                address: "n".into(),
                now_ms: 1,
            })
            .await
            .unwrap()
            .unwrap();
        }
        let commit = one_range_commit("k");
        for (node_id, node_epoch) in [(1, 1), (7, 1)] {
            let catalog = MetaCatalog {
                meta: meta.clone(),
                node_id,
                node_epoch,
                clock: pico_common::clock::system(),
            };
            let out = catalog.commit(commit.clone()).await;
            assert!(
                matches!(out, Err(CatalogError::Fenced(_))),
                "node {node_id} epoch {node_epoch}: {out:?}"
            );
        }
    }
}
