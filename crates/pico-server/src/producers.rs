//! Idempotent producer rules (PICO-SURFACE.md), as a pure decision, plus the small `aux` codec
//! that stores a producer's claim (and the Durable Streams `Stream-Seq`) next to its data in the
//! WAL and object commits — so that state moves with the data and needs no metadata write per
//! append.

use crate::api::ProducerClaim;
use bytes::{BufMut, Bytes, BytesMut};

/// A producer's last accepted (epoch, seq), where that append lies, and when (ms) it was last
/// accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerState {
    pub epoch: u64,
    pub seq: u64,
    pub at: Placed,
    pub last_ms: i64,
}

/// Where an append lies: offsets `[start, next)` (equal, at the tail, for a close without
/// records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    pub start: u64,
    pub next: u64,
}

/// What to do with a producer append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Write it; the producer's state becomes the claim.
    Accept,
    /// Already applied: acknowledge without writing. Carries the highest accepted seq and,
    /// when the claim is that very seq, where its append lies; an older seq's offsets are no
    /// longer known (`None`), and the answer must say so rather than invent them.
    Duplicate {
        last_seq: u64,
        original: Option<Placed>,
    },
    /// Epoch lower than the stored one.
    Fenced { current: u64 },
    /// Same epoch, seq skipped ahead.
    Gap { expected: u64 },
    /// A new (higher) epoch or an unknown producer must start at seq 0.
    EpochMustStartAtZero,
}

/// Decides a claim against the stored state (None = unknown producer).
pub fn decide(stored: Option<ProducerState>, claim: &ProducerClaim) -> Decision {
    match stored {
        None => {
            if claim.seq == 0 {
                Decision::Accept
            } else {
                Decision::Gap { expected: 0 }
            }
        }
        Some(s) if claim.epoch < s.epoch => Decision::Fenced { current: s.epoch },
        Some(s) if claim.epoch > s.epoch => {
            if claim.seq == 0 {
                Decision::Accept
            } else {
                Decision::EpochMustStartAtZero
            }
        }
        Some(s) => {
            if claim.seq <= s.seq {
                Decision::Duplicate {
                    last_seq: s.seq,
                    original: (claim.seq == s.seq).then_some(s.at),
                }
            } else if claim.seq == s.seq + 1 {
                Decision::Accept
            } else {
                Decision::Gap {
                    expected: s.seq + 1,
                }
            }
        }
    }
}

/// How far ahead of its producer's state a claim may arrive and still be held for its
/// predecessors (see [`early`]); a pipelining client keeps fewer than this in flight.
pub const REORDER_WINDOW: u64 = 32;

/// Whether `claim` arrived ahead of batches of the same producer that may still be on their
/// way: it would be a gap (or a new epoch not starting at 0) now, but becomes acceptable once
/// at most [`REORDER_WINDOW`] predecessors are accepted. Pipelined batches travel on separate
/// requests and overtake each other; holding such a claim briefly lets them commit together
/// instead of the early one bouncing back as `sequence_gap` and waiting for a whole round trip.
pub fn early(stored: Option<ProducerState>, claim: &ProducerClaim) -> bool {
    let within = |expected: u64| claim.seq > expected && claim.seq - expected <= REORDER_WINDOW;
    match stored {
        None => within(0),
        Some(s) if claim.epoch > s.epoch => within(0),
        Some(s) if claim.epoch == s.epoch => within(s.seq + 1),
        Some(_) => false,
    }
}

const AUX_V1: u8 = 1;
const AUX_V2: u8 = 2;

/// What an append carries next to its data in the WAL `aux` bytes: the producer claim and the
/// Durable Streams `Stream-Seq`, both committed atomically with the records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Aux {
    pub producer: Option<ProducerClaim>,
    pub stream_seq: Option<String>,
}

/// Callers bound both strings to 1 KiB (`MAX_PRODUCER_ID_LEN`, `MAX_STREAM_SEQ_LEN`), so the
/// u16 length never truncates.
fn put_str(b: &mut BytesMut, s: &str) {
    b.put_u16(s.len() as u16);
    b.put_slice(s.as_bytes());
}

/// Encodes the aux bytes (empty when there is nothing to carry). Version 2 layout:
/// `2, flags(1=producer, 2=seq), [u16 id len, id, u64 epoch, u64 seq], [u16 len, stream seq]`.
pub fn encode_aux(aux: &Aux) -> Bytes {
    if aux.producer.is_none() && aux.stream_seq.is_none() {
        return Bytes::new();
    }
    let mut b = BytesMut::with_capacity(64);
    b.put_u8(AUX_V2);
    let flags = u8::from(aux.producer.is_some()) | (u8::from(aux.stream_seq.is_some()) << 1);
    b.put_u8(flags);
    if let Some(p) = &aux.producer {
        put_str(&mut b, &p.id);
        b.put_u64(p.epoch);
        b.put_u64(p.seq);
    }
    if let Some(s) = &aux.stream_seq {
        put_str(&mut b, s);
    }
    b.freeze()
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_be_bytes(self.take(8)?.try_into().ok()?))
    }
    fn str(&mut self) -> Option<String> {
        let len = u16::from_be_bytes(self.take(2)?.try_into().ok()?) as usize;
        Some(std::str::from_utf8(self.take(len)?).ok()?.to_string())
    }
    fn producer(&mut self) -> Option<ProducerClaim> {
        let id = self.str()?;
        Some(ProducerClaim {
            id,
            epoch: self.u64()?,
            seq: self.u64()?,
        })
    }
}

/// Decodes aux bytes (version 1: a producer claim only; version 2: see [`encode_aux`]).
/// Empty or unknown content decodes to nothing (never panics).
pub fn decode_aux(aux: &[u8]) -> Aux {
    let Some((&version, rest)) = aux.split_first() else {
        return Aux::default();
    };
    let mut c = Cursor(rest);
    let decoded = match version {
        AUX_V1 => c.producer().map(|p| Aux {
            producer: Some(p),
            stream_seq: None,
        }),
        AUX_V2 => (|| {
            let flags = c.take(1)?[0];
            let producer = if flags & 1 != 0 {
                Some(c.producer()?)
            } else {
                None
            };
            let stream_seq = if flags & 2 != 0 { Some(c.str()?) } else { None };
            Some(Aux {
                producer,
                stream_seq,
            })
        })(),
        _ => None,
    };
    match decoded {
        Some(a) if c.0.is_empty() => a,
        _ => Aux::default(),
    }
}

/// Longest producer id accepted (it must fit the aux codec).
pub const MAX_PRODUCER_ID_LEN: usize = 1024;

/// Longest `Stream-Seq` accepted (it must fit the aux codec's u16 length, with room to spare).
pub const MAX_STREAM_SEQ_LEN: usize = 1024;

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(epoch: u64, seq: u64) -> ProducerClaim {
        ProducerClaim {
            id: "p".into(),
            epoch,
            seq,
        }
    }

    #[test]
    fn rules_of_the_surface() {
        assert_eq!(decide(None, &claim(0, 0)), Decision::Accept);
        assert_eq!(decide(None, &claim(0, 3)), Decision::Gap { expected: 0 });
        let at = Placed {
            start: 40,
            next: 43,
        };
        let s = Some(ProducerState {
            epoch: 2,
            seq: 5,
            at,
            last_ms: 0,
        });
        assert_eq!(decide(s, &claim(1, 6)), Decision::Fenced { current: 2 });
        assert_eq!(decide(s, &claim(3, 0)), Decision::Accept);
        assert_eq!(decide(s, &claim(3, 1)), Decision::EpochMustStartAtZero);
        // The last seq again: answered with where it lies; an older one's place is unknown.
        assert_eq!(
            decide(s, &claim(2, 5)),
            Decision::Duplicate {
                last_seq: 5,
                original: Some(at)
            }
        );
        assert_eq!(
            decide(s, &claim(2, 0)),
            Decision::Duplicate {
                last_seq: 5,
                original: None
            }
        );
        assert_eq!(decide(s, &claim(2, 6)), Decision::Accept);
        assert_eq!(decide(s, &claim(2, 8)), Decision::Gap { expected: 6 });
    }

    #[test]
    fn early_claims_are_those_a_predecessor_can_still_make_acceptable() {
        assert!(!early(None, &claim(0, 0)), "acceptable now");
        assert!(early(None, &claim(0, 1)));
        assert!(early(None, &claim(4, REORDER_WINDOW)));
        assert!(
            !early(None, &claim(0, REORDER_WINDOW + 1)),
            "too far: a real gap"
        );
        let s = Some(ProducerState {
            epoch: 2,
            seq: 5,
            at: Placed { start: 9, next: 10 },
            last_ms: 0,
        });
        assert!(!early(s, &claim(2, 5)), "duplicate");
        assert!(!early(s, &claim(2, 6)), "acceptable now");
        assert!(early(s, &claim(2, 7)));
        assert!(early(s, &claim(2, 6 + REORDER_WINDOW)));
        assert!(!early(s, &claim(2, 7 + REORDER_WINDOW)));
        assert!(
            early(s, &claim(3, 1)),
            "a new epoch's seq 0 may still be on its way"
        );
        assert!(!early(s, &claim(3, 0)));
        assert!(!early(s, &claim(1, 9)), "fenced stays fenced");
    }

    #[test]
    fn aux_round_trip_and_garbage() {
        let c = ProducerClaim {
            id: "writer-ü".into(),
            epoch: 7,
            seq: u64::MAX,
        };
        for aux in [
            Aux {
                producer: Some(c.clone()),
                stream_seq: None,
            },
            Aux {
                producer: Some(c.clone()),
                stream_seq: Some("seq-009".into()),
            },
            Aux {
                producer: None,
                stream_seq: Some(String::new()),
            },
        ] {
            assert_eq!(decode_aux(&encode_aux(&aux)), aux);
        }
        assert!(encode_aux(&Aux::default()).is_empty());
        // Version 1 (a bare producer claim) still decodes.
        let mut v1 = vec![1u8, 0, 1, b'p'];
        v1.extend_from_slice(&3u64.to_be_bytes());
        v1.extend_from_slice(&4u64.to_be_bytes());
        assert_eq!(
            decode_aux(&v1).producer,
            Some(ProducerClaim {
                id: "p".into(),
                epoch: 3,
                seq: 4
            })
        );
        for garbage in [&[][..], &[1, 0, 9, 1], &[2, 0, 0], &[2, 3, 0], &[9, 9]] {
            assert_eq!(decode_aux(garbage), Aux::default(), "{garbage:?}");
        }
    }
}
