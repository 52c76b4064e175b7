//! `Parts`: bytes kept as consecutive pieces, so large record batches reach a vectored write
//! (WAL segment, data object file) without being copied into one buffer first.
//!
//! `PartsWriter` copies small pieces (headers, small batches) into one shared buffer and keeps
//! large ones as references: a group commit of thousands of 100-byte appends stays a handful of
//! pieces, while a 64 KiB batch is never copied. Measured on batched ingest, building each data
//! object contiguously cost ≈ 8 % of the server's CPU (a copy, and page faults on the fresh
//! multi-MiB buffer), the WAL entry's copy another 3.6 %.

use bytes::{BufMut, Bytes, BytesMut};

/// Pieces at least this long are referenced, not copied.
pub const COPY_BELOW: usize = 4096;

/// Consecutive pieces of one encoded value.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parts {
    parts: Vec<Bytes>,
    len: usize,
}

impl Parts {
    /// Total length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn pieces(&self) -> &[Bytes] {
        &self.parts
    }

    /// One contiguous buffer (no copy when there is a single piece).
    pub fn concat(&self) -> Bytes {
        match self.parts.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            many => {
                let mut buf = BytesMut::with_capacity(self.len);
                for p in many {
                    buf.put_slice(p);
                }
                buf.freeze()
            }
        }
    }
}

impl From<Bytes> for Parts {
    fn from(b: Bytes) -> Parts {
        let len = b.len();
        Parts {
            parts: if len == 0 { Vec::new() } else { vec![b] },
            len,
        }
    }
}

/// Builds `Parts`: small writes go into one buffer, large `Bytes` are referenced.
#[derive(Debug)]
pub struct PartsWriter {
    parts: Vec<Bytes>,
    small: BytesMut,
    len: usize,
}

impl PartsWriter {
    /// `small_capacity`: the bytes that will be copied (headers and pieces below
    /// [`COPY_BELOW`]), so the shared buffer never grows by reallocating.
    pub fn with_capacity(small_capacity: usize) -> PartsWriter {
        PartsWriter {
            parts: Vec::new(),
            small: BytesMut::with_capacity(small_capacity),
            len: 0,
        }
    }

    /// What [`PartsWriter::put_bytes`] will copy of a piece of `len` bytes.
    pub fn copied(len: usize) -> usize {
        if len < COPY_BELOW { len } else { 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data`.
    pub fn put_slice(&mut self, data: &[u8]) {
        self.small.put_slice(data);
        self.len += data.len();
    }

    /// Copies `data` if small, references it otherwise.
    pub fn put_bytes(&mut self, data: &Bytes) {
        if data.len() < COPY_BELOW {
            self.put_slice(data);
            return;
        }
        self.flush_small();
        self.parts.push(data.clone());
        self.len += data.len();
    }

    fn flush_small(&mut self) {
        if !self.small.is_empty() {
            // `split` keeps the rest of the allocation for the next small writes.
            self.parts.push(self.small.split().freeze());
        }
    }

    pub fn finish(mut self) -> Parts {
        self.flush_small();
        Parts {
            parts: self.parts,
            len: self.len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_pieces_are_copied_and_large_ones_referenced() {
        let big = Bytes::from(vec![7u8; COPY_BELOW]);
        let mut w = PartsWriter::with_capacity(64);
        w.put_slice(b"head");
        w.put_bytes(&Bytes::from_static(b"small"));
        w.put_bytes(&big);
        w.put_slice(b"tail");
        let parts = w.finish();
        assert_eq!(parts.pieces().len(), 3);
        assert_eq!(parts.pieces()[0], Bytes::from_static(b"headsmall"));
        // The large piece is the caller's buffer, not a copy.
        assert_eq!(parts.pieces()[1].as_ptr(), big.as_ptr());
        assert_eq!(parts.len(), 9 + COPY_BELOW + 4);
        let flat = parts.concat();
        assert_eq!(flat.len(), parts.len());
        assert_eq!(&flat[..9], b"headsmall");
        assert_eq!(&flat[flat.len() - 4..], b"tail");
    }

    #[test]
    fn one_piece_concatenates_without_a_copy() {
        let b = Bytes::from_static(b"abc");
        let parts = Parts::from(b.clone());
        assert_eq!(parts.concat().as_ptr(), b.as_ptr());
        assert!(Parts::from(Bytes::new()).is_empty());
        assert!(Parts::from(Bytes::new()).pieces().is_empty());
    }
}
