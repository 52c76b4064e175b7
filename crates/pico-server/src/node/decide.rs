//! The append's decision: given the stream's writer state (under its lock) and the request,
//! what to do with it. A pure function, like `producers::decide` (which it uses); the append
//! path around it (`append.rs`) only waits, writes and answers.

use crate::api::{AppendOptions, AppendRequest};
use crate::error::AppendError;
use crate::open::Writer;
use crate::producers::{self, Decision, Placed};
use pico_metadata::ProducerMark;
use pico_protocol::headers::content_type_matches;

/// What an append does, decided over the writer state.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// A failed write left the stream unusable: reopen it, the client retries.
    Broken,
    /// Write the records at the tail (and close if asked).
    Write,
    /// The stream is closed and this is the retry of the producer append that closed it:
    /// answer with that append's offsets once its data and the close are durable.
    RetryOfClose { start: u64, end: u64 },
    /// The records duplicate the producer's last append, whose close was never committed:
    /// close now under `mark` (the claim, with the original's offsets), and answer with them.
    DuplicateThenClose {
        epoch: u64,
        last_seq: u64,
        mark: ProducerMark,
    },
    /// A duplicate: answer with the original's offsets once it is durable (`None`: an older
    /// seq, whose offsets are no longer kept).
    Duplicate {
        epoch: u64,
        last_seq: u64,
        original: Option<Placed>,
    },
    /// Refused, with the error to answer.
    Refused(AppendError),
}

/// Decides `req` against writer state `w` of its stream (content type `stream_ct`), whose next
/// offset on the engine is `tail` (`None`: not open there). The checks run in the order clients
/// see their errors: broken, not open, closed, content type, producer, `Stream-Seq`, match.
pub(crate) fn decide(
    w: &Writer,
    req: &AppendRequest,
    opts: &AppendOptions,
    stream_ct: &str,
    tail: Option<u64>,
) -> Verdict {
    if w.broken {
        return Verdict::Broken;
    }
    let Some(next) = tail else {
        return Verdict::Refused(AppendError::Unavailable(
            "stream not open on the engine".into(),
        ));
    };
    if w.closed {
        return match (&req.producer, &w.closed_by) {
            (Some(p), Some(cb))
                if (p.id.as_str(), p.epoch, p.seq) == (&*cb.id, cb.epoch, cb.seq) =>
            {
                Verdict::RetryOfClose {
                    start: cb.start_offset,
                    end: cb.end_offset,
                }
            }
            _ => Verdict::Refused(AppendError::Closed {
                name: req.name.to_string(),
                next_seq: next,
            }),
        };
    }
    if let Some(ct) = &req.content_type
        && !req.records.is_empty()
        && !content_type_matches(ct, stream_ct)
    {
        return Verdict::Refused(AppendError::ContentType {
            stream: stream_ct.to_string(),
            request: ct.clone(),
        });
    }
    if let Some(p) = &req.producer {
        match producers::decide(w.producers.get(&p.id).copied(), p) {
            Decision::Accept => {}
            // The retry of an append-and-close whose records became durable but whose close
            // failed: the records are a duplicate, the close is still owed.
            Decision::Duplicate {
                last_seq,
                original: Some(at),
            } if req.close => {
                return Verdict::DuplicateThenClose {
                    epoch: p.epoch,
                    last_seq,
                    mark: ProducerMark {
                        id: p.id.clone(),
                        epoch: p.epoch,
                        seq: p.seq,
                        start_offset: at.start,
                        end_offset: at.next,
                    },
                };
            }
            Decision::Duplicate { last_seq, original } => {
                return Verdict::Duplicate {
                    epoch: p.epoch,
                    last_seq,
                    original,
                };
            }
            Decision::Fenced { current } => {
                return Verdict::Refused(AppendError::Fenced {
                    producer: p.id.clone(),
                    given: p.epoch,
                    current,
                });
            }
            Decision::Gap { expected } => {
                return Verdict::Refused(AppendError::SequenceGap {
                    producer: p.id.clone(),
                    expected,
                    received: p.seq,
                });
            }
            Decision::EpochMustStartAtZero => {
                return Verdict::Refused(AppendError::EpochSeq {
                    producer: p.id.clone(),
                    epoch: p.epoch,
                    seq: p.seq,
                });
            }
        }
    }
    // Stream-Seq after producer dedup: a retried duplicate carries the same seq.
    if let Some(seq) = &opts.stream_seq
        && !req.records.is_empty()
        && let Some(last) = &w.stream_seq
        && seq.as_bytes() <= last.as_bytes()
    {
        return Verdict::Refused(AppendError::SeqRegression {
            last: last.clone(),
            given: seq.clone(),
        });
    }
    if let Some(expected) = req.match_seq
        && expected != next
    {
        return Verdict::Refused(AppendError::MatchFailed {
            expected,
            next_seq: next,
        });
    }
    Verdict::Write
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ProducerClaim;
    use crate::producers::ProducerState;
    use pico_common::StreamName;
    use pico_protocol::Record;

    fn req(records: usize) -> AppendRequest {
        AppendRequest {
            name: StreamName::parse("s").unwrap(),
            records: (0..records).map(|_| Record::from_value("x")).collect(),
            producer: None,
            match_seq: None,
            close: false,
            content_type: None,
        }
    }

    fn claim(id: &str, epoch: u64, seq: u64) -> Option<ProducerClaim> {
        Some(ProducerClaim {
            id: id.into(),
            epoch,
            seq,
        })
    }

    fn verdict(w: &Writer, r: &AppendRequest, next: u64) -> Verdict {
        decide(w, r, &AppendOptions::default(), "text/plain", Some(next))
    }

    #[test]
    fn a_plain_append_is_written_and_a_broken_or_unopened_stream_refuses() {
        let w = Writer::default();
        assert!(matches!(verdict(&w, &req(1), 5), Verdict::Write));
        let none = decide(&w, &req(1), &AppendOptions::default(), "text/plain", None);
        assert!(matches!(
            none,
            Verdict::Refused(AppendError::Unavailable(_))
        ));
        let broken = Writer {
            broken: true,
            ..Writer::default()
        };
        assert!(matches!(verdict(&broken, &req(1), 5), Verdict::Broken));
    }

    /// A closed stream refuses everything but the retry of the producer append that closed
    /// it, which is answered with that append's offsets.
    #[test]
    fn a_closed_stream_answers_only_the_retry_of_its_close() {
        let w = Writer {
            closed: true,
            closed_by: Some(ProducerMark {
                id: "p".into(),
                epoch: 1,
                seq: 3,
                start_offset: 10,
                end_offset: 12,
            }),
            ..Writer::default()
        };
        let mut retry = req(2);
        retry.producer = claim("p", 1, 3);
        assert!(matches!(
            verdict(&w, &retry, 12),
            Verdict::RetryOfClose { start: 10, end: 12 }
        ));
        let mut other = req(1);
        other.producer = claim("p", 1, 4);
        assert!(matches!(
            verdict(&w, &other, 12),
            Verdict::Refused(AppendError::Closed { next_seq: 12, .. })
        ));
    }

    #[test]
    fn checks_run_in_order_content_type_producer_stream_seq_match() {
        let at = Placed { start: 7, next: 9 };
        let mut w = Writer::default();
        w.producers.insert(
            "p".into(),
            ProducerState {
                epoch: 1,
                seq: 4,
                at,
                last_ms: 0,
            },
        );
        w.stream_seq = Some("b".into());
        // Content type first, even for a producer duplicate.
        let mut r = req(1);
        r.content_type = Some("application/json".into());
        r.producer = claim("p", 1, 4);
        assert!(matches!(
            verdict(&w, &r, 9),
            Verdict::Refused(AppendError::ContentType { .. })
        ));
        // A duplicate of the last seq carries its offsets; with a close still owed, it closes.
        r.content_type = None;
        assert!(matches!(
            verdict(&w, &r, 9),
            Verdict::Duplicate { epoch: 1, last_seq: 4, original: Some(p) } if p == at
        ));
        r.close = true;
        assert!(matches!(
            verdict(&w, &r, 9),
            Verdict::DuplicateThenClose { epoch: 1, last_seq: 4, mark }
                if (mark.start_offset, mark.end_offset, mark.seq) == (at.start, at.next, 4)
        ));
        // An older seq's offsets are unknown.
        r.close = false;
        r.producer = claim("p", 1, 2);
        assert!(matches!(
            verdict(&w, &r, 9),
            Verdict::Duplicate { original: None, .. }
        ));
        r.producer = claim("p", 0, 5);
        assert!(matches!(
            verdict(&w, &r, 9),
            Verdict::Refused(AppendError::Fenced { current: 1, .. })
        ));
        r.producer = claim("p", 1, 6);
        assert!(matches!(
            verdict(&w, &r, 9),
            Verdict::Refused(AppendError::SequenceGap { expected: 5, .. })
        ));
        // Stream-Seq must grow, then the match offset must be the tail.
        r.producer = claim("p", 1, 5);
        let regress = AppendOptions {
            stream_seq: Some("a".into()),
        };
        assert!(matches!(
            decide(&w, &r, &regress, "text/plain", Some(9)),
            Verdict::Refused(AppendError::SeqRegression { .. })
        ));
        r.match_seq = Some(8);
        assert!(matches!(
            verdict(&w, &r, 9),
            Verdict::Refused(AppendError::MatchFailed {
                expected: 8,
                next_seq: 9
            })
        ));
        r.match_seq = Some(9);
        assert!(matches!(verdict(&w, &r, 9), Verdict::Write));
    }
}
