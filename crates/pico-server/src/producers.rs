//! Idempotent producer rules (PICO-SURFACE.md), as a pure decision, plus the small `aux` codec
//! that stores a producer's claim next to its data in the WAL and object commits — so producer
//! state moves with the data and needs no metadata write per append.

use crate::api::ProducerClaim;
use bytes::{BufMut, Bytes, BytesMut};

/// A producer's last accepted (epoch, seq).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerState {
    pub epoch: u64,
    pub seq: u64,
}

/// What to do with a producer append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Write it; the producer's state becomes the claim.
    Accept,
    /// Already applied: acknowledge without writing. Carries the highest accepted seq.
    Duplicate { last_seq: u64 },
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
                Decision::Duplicate { last_seq: s.seq }
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

const AUX_VERSION: u8 = 1;

/// Encodes a producer claim as WAL `aux` bytes.
pub fn encode_aux(claim: &ProducerClaim) -> Bytes {
    let id = claim.id.as_bytes();
    let mut b = BytesMut::with_capacity(1 + 2 + id.len() + 16);
    b.put_u8(AUX_VERSION);
    b.put_u16(id.len() as u16);
    b.put_slice(id);
    b.put_u64(claim.epoch);
    b.put_u64(claim.seq);
    b.freeze()
}

/// Decodes `aux` bytes; None for empty or unknown content (never panics).
pub fn decode_aux(aux: &[u8]) -> Option<ProducerClaim> {
    let (&version, rest) = aux.split_first()?;
    if version != AUX_VERSION || rest.len() < 2 {
        return None;
    }
    let id_len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
    let rest = &rest[2..];
    if rest.len() != id_len + 16 {
        return None;
    }
    let id = std::str::from_utf8(&rest[..id_len]).ok()?.to_string();
    let epoch = u64::from_be_bytes(rest[id_len..id_len + 8].try_into().ok()?);
    let seq = u64::from_be_bytes(rest[id_len + 8..].try_into().ok()?);
    Some(ProducerClaim { id, epoch, seq })
}

/// Longest producer id accepted (it must fit the aux codec).
pub const MAX_PRODUCER_ID_LEN: usize = 1024;

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
        let s = Some(ProducerState { epoch: 2, seq: 5 });
        assert_eq!(decide(s, &claim(1, 6)), Decision::Fenced { current: 2 });
        assert_eq!(decide(s, &claim(3, 0)), Decision::Accept);
        assert_eq!(decide(s, &claim(3, 1)), Decision::EpochMustStartAtZero);
        assert_eq!(decide(s, &claim(2, 5)), Decision::Duplicate { last_seq: 5 });
        assert_eq!(decide(s, &claim(2, 0)), Decision::Duplicate { last_seq: 5 });
        assert_eq!(decide(s, &claim(2, 6)), Decision::Accept);
        assert_eq!(decide(s, &claim(2, 8)), Decision::Gap { expected: 6 });
    }

    #[test]
    fn aux_round_trip_and_garbage() {
        let c = ProducerClaim {
            id: "writer-ü".into(),
            epoch: 7,
            seq: u64::MAX,
        };
        assert_eq!(decode_aux(&encode_aux(&c)), Some(c));
        assert_eq!(decode_aux(&[]), None);
        assert_eq!(decode_aux(&[1, 0, 9, 1]), None);
        assert_eq!(decode_aux(&[2, 0, 0]), None);
    }
}
