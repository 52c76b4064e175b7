//! A structural pass over a request before the `kafka-protocol` decoder sees it.
//!
//! The decoder allocates `Vec::with_capacity(n)` for a declared array count `n` before reading
//! a single element, so a 4-byte body declaring `i32::MAX` entries aborts the process on the
//! allocation. This pass walks the same fields, for exactly the APIs and versions this
//! listener advertises (all non-flexible, except ApiVersions v3), and refuses any array count
//! or string/bytes length larger than the bytes that remain, and any field cut short. The
//! decoder then only sees requests whose every count is backed by bytes.

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ShapeError {
    #[error("request truncated: need={need} have={have} at={at}")]
    Truncated { need: usize, have: usize, at: usize },
    #[error(
        "declared length exceeds the request: declared={declared} remaining={remaining} at={at}"
    )]
    TooLong {
        declared: i64,
        remaining: usize,
        at: usize,
    },
    #[error("invalid length: {0}")]
    Negative(i64),
    #[error("varint too long at={0}")]
    Varint(usize),
    #[error("no schema for api_key={key} version={version}")]
    Unknown { key: i16, version: i16 },
}

type R = Result<(), ShapeError>;

/// A cursor over a request's bytes that only checks, never builds.
pub struct Shape<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Shape<'a> {
    pub fn new(data: &'a [u8]) -> Shape<'a> {
        Shape { data, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ShapeError> {
        if self.remaining() < n {
            return Err(ShapeError::Truncated {
                need: n,
                have: self.remaining(),
                at: self.pos,
            });
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    pub fn i8(&mut self) -> R {
        self.take(1).map(drop)
    }
    pub fn i16(&mut self) -> R {
        self.take(2).map(drop)
    }
    pub fn i32(&mut self) -> R {
        self.take(4).map(drop)
    }
    pub fn i64(&mut self) -> R {
        self.take(8).map(drop)
    }

    fn read_i16(&mut self) -> Result<i16, ShapeError> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }
    fn read_i32(&mut self) -> Result<i32, ShapeError> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn uvarint(&mut self) -> Result<u64, ShapeError> {
        let at = self.pos;
        let mut v = 0u64;
        for i in 0..5 {
            let b = self.take(1)?[0];
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ShapeError::Varint(at))
    }

    fn skip_len(&mut self, declared: i64) -> R {
        if declared < 0 {
            return Err(ShapeError::Negative(declared));
        }
        if declared as u64 > self.remaining() as u64 {
            return Err(ShapeError::TooLong {
                declared,
                remaining: self.remaining(),
                at: self.pos,
            });
        }
        self.pos += declared as usize;
        Ok(())
    }

    /// A string (i16 length); `nullable` allows -1.
    pub fn string(&mut self, nullable: bool) -> R {
        let n = i64::from(self.read_i16()?);
        if n == -1 && nullable {
            return Ok(());
        }
        self.skip_len(n)
    }
    /// Bytes (i32 length); `nullable` allows -1.
    pub fn bytes(&mut self, nullable: bool) -> R {
        let n = i64::from(self.read_i32()?);
        if n == -1 && nullable {
            return Ok(());
        }
        self.skip_len(n)
    }
    /// A compact string (unsigned varint length + 1; 0 = null).
    pub fn compact_string(&mut self) -> R {
        let n = self.uvarint()?;
        if n == 0 {
            return Ok(());
        }
        self.skip_len((n - 1) as i64)
    }
    /// Tagged fields of a flexible version: a count, then (tag, size, bytes) each.
    pub fn tagged(&mut self) -> R {
        let count = self.uvarint()?;
        self.check_count(count as i64)?;
        for _ in 0..count {
            self.uvarint()?;
            let size = self.uvarint()?;
            self.skip_len(size as i64)?;
        }
        Ok(())
    }

    fn check_count(&self, n: i64) -> R {
        // Every element takes at least one byte on the wire.
        if n as u64 > self.remaining() as u64 {
            return Err(ShapeError::TooLong {
                declared: n,
                remaining: self.remaining(),
                at: self.pos,
            });
        }
        Ok(())
    }

    /// An array (i32 count) whose elements `elem` walks; `nullable` allows -1.
    pub fn array(&mut self, nullable: bool, mut elem: impl FnMut(&mut Self) -> R) -> R {
        let n = self.read_i32()?;
        if n == -1 && nullable {
            return Ok(());
        }
        if n < 0 {
            return Err(ShapeError::Negative(i64::from(n)));
        }
        self.check_count(i64::from(n))?;
        for _ in 0..n {
            elem(self)?;
        }
        Ok(())
    }
}

/// Walks a request header (v1, or v2 when `flexible`) and the body of `key` at `version`.
/// `Ok` means every length the decoder will read is backed by bytes.
pub fn check_request(data: &[u8], key: i16, version: i16, flexible: bool) -> R {
    let mut s = Shape::new(data);
    s.i16()?; // api key
    s.i16()?; // api version
    s.i32()?; // correlation id
    s.string(true)?; // client id
    if flexible {
        s.tagged()?;
    }
    body(&mut s, key, version)
}

fn body(s: &mut Shape<'_>, key: i16, v: i16) -> R {
    use kafka_protocol::messages::ApiKey as K;
    let unknown = ShapeError::Unknown { key, version: v };
    let Ok(api) = K::try_from(key) else {
        return Err(unknown);
    };
    match api {
        K::ApiVersions => {
            if v >= 3 {
                s.compact_string()?;
                s.compact_string()?;
                s.tagged()?;
            }
            Ok(())
        }
        K::DescribeCluster => {
            s.i8()?; // include cluster authorized operations
            if v >= 1 {
                s.i8()?; // endpoint type
            }
            if v >= 2 {
                s.i8()?; // include fenced brokers
            }
            s.tagged()
        }
        K::Metadata => {
            s.array(v >= 1, |s| s.string(false))?;
            if v >= 4 {
                s.i8()?;
            }
            if v >= 8 {
                s.i8()?;
                s.i8()?;
            }
            Ok(())
        }
        K::Produce => {
            s.string(true)?; // transactional id
            s.i16()?;
            s.i32()?;
            s.array(false, |s| {
                s.string(false)?;
                s.array(false, |s| {
                    s.i32()?;
                    s.bytes(true)
                })
            })
        }
        K::Fetch => {
            s.i32()?; // replica
            s.i32()?; // max wait
            s.i32()?; // min bytes
            s.i32()?; // max bytes
            s.i8()?; // isolation
            if v >= 7 {
                s.i32()?;
                s.i32()?;
            }
            s.array(false, |s| {
                s.string(false)?;
                s.array(false, |s| {
                    s.i32()?;
                    if v >= 9 {
                        s.i32()?;
                    }
                    s.i64()?;
                    if v >= 5 {
                        s.i64()?;
                    }
                    s.i32()
                })
            })?;
            if v >= 7 {
                s.array(false, |s| {
                    s.string(false)?;
                    s.array(false, |s| s.i32())
                })?;
            }
            if v >= 11 {
                s.string(false)?;
            }
            Ok(())
        }
        K::ListOffsets => {
            s.i32()?;
            if v >= 2 {
                s.i8()?;
            }
            s.array(false, |s| {
                s.string(false)?;
                s.array(false, |s| {
                    s.i32()?;
                    if v >= 4 {
                        s.i32()?;
                    }
                    s.i64()
                })
            })
        }
        K::CreateTopics => {
            s.array(false, |s| {
                s.string(false)?;
                s.i32()?;
                s.i16()?;
                s.array(false, |s| {
                    s.i32()?;
                    s.array(false, |s| s.i32())
                })?;
                s.array(false, |s| {
                    s.string(false)?;
                    s.string(true)
                })
            })?;
            s.i32()?;
            s.i8()
        }
        K::DeleteTopics => {
            s.array(false, |s| s.string(false))?;
            s.i32()
        }
        K::CreatePartitions => {
            s.array(false, |s| {
                s.string(false)?;
                s.i32()?;
                s.array(true, |s| s.array(false, |s| s.i32()))
            })?;
            s.i32()?;
            s.i8()
        }
        K::InitProducerId => {
            s.string(true)?;
            s.i32()
        }
        K::FindCoordinator => {
            s.string(false)?;
            if v >= 1 {
                s.i8()?;
            }
            Ok(())
        }
        K::JoinGroup => {
            s.string(false)?;
            s.i32()?;
            if v >= 1 {
                s.i32()?;
            }
            s.string(false)?;
            if v >= 5 {
                s.string(true)?;
            }
            s.string(false)?;
            s.array(false, |s| {
                s.string(false)?;
                s.bytes(false)
            })
        }
        K::SyncGroup => {
            s.string(false)?;
            s.i32()?;
            s.string(false)?;
            if v >= 3 {
                s.string(true)?;
            }
            s.array(false, |s| {
                s.string(false)?;
                s.bytes(false)
            })
        }
        K::Heartbeat => {
            s.string(false)?;
            s.i32()?;
            s.string(false)?;
            if v >= 3 {
                s.string(true)?;
            }
            Ok(())
        }
        K::LeaveGroup => {
            s.string(false)?;
            if v >= 3 {
                s.array(false, |s| {
                    s.string(false)?;
                    s.string(true)
                })
            } else {
                s.string(false)
            }
        }
        K::OffsetCommit => {
            s.string(false)?;
            s.i32()?;
            s.string(false)?;
            if v >= 7 {
                s.string(true)?;
            }
            if v <= 4 {
                s.i64()?;
            }
            s.array(false, |s| {
                s.string(false)?;
                s.array(false, |s| {
                    s.i32()?;
                    s.i64()?;
                    if v >= 6 {
                        s.i32()?;
                    }
                    s.string(true)
                })
            })
        }
        K::OffsetFetch => {
            s.string(false)?;
            s.array(v >= 2, |s| {
                s.string(false)?;
                s.array(false, |s| s.i32())
            })
        }
        K::ListGroups => Ok(()),
        K::DescribeGroups => {
            s.array(false, |s| s.string(false))?;
            if v >= 3 {
                s.i8()?;
            }
            Ok(())
        }
        K::DescribeConfigs => {
            s.array(false, |s| {
                s.i8()?;
                s.string(false)?;
                s.array(true, |s| s.string(false))
            })?;
            s.i8()?;
            if v >= 3 {
                s.i8()?;
            }
            Ok(())
        }
        _ => Err(unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(key: i16, version: i16) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&key.to_be_bytes());
        b.extend_from_slice(&version.to_be_bytes());
        b.extend_from_slice(&7i32.to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b
    }

    #[test]
    fn a_huge_declared_array_is_refused_before_decoding() {
        let mut b = header(3, 1);
        b.extend_from_slice(&i32::MAX.to_be_bytes());
        let e = check_request(&b, 3, 1, false).unwrap_err();
        assert!(matches!(e, ShapeError::TooLong { .. }), "{e}");
    }

    #[test]
    fn a_string_longer_than_the_request_is_refused() {
        let mut b = header(10, 1);
        b.extend_from_slice(&100i16.to_be_bytes());
        b.extend_from_slice(b"abc");
        assert!(check_request(&b, 10, 1, false).is_err());
    }

    #[test]
    fn a_truncated_field_is_refused() {
        let mut b = header(12, 0);
        b.extend_from_slice(&1i16.to_be_bytes());
        b.push(b'g');
        b.extend_from_slice(&[0, 0]); // generation id cut short
        assert!(matches!(
            check_request(&b, 12, 0, false),
            Err(ShapeError::Truncated { .. })
        ));
    }
}
