//! Record bodies that carry their send time, so tailers can measure append→delivery latency.
//!
//! A body is 16 lowercase hex digits (microseconds since the bench process's clock origin)
//! followed by `x` padding up to the record size. Bodies are ASCII without newlines, so they
//! travel unchanged as `text/plain` over Durable Streams (where a batch is the concatenation
//! of its records) and as JSON strings in Pico SSE.

use std::sync::OnceLock;
use std::time::Instant;

/// Length of the timestamp prefix.
pub const STAMP_LEN: usize = 16;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Microseconds since the process's clock origin (monotonic, shared by writers and readers).
pub fn now_us() -> u64 {
    origin().elapsed().as_micros() as u64
}

/// Appends `count` records of `size` bytes stamped with `stamp_us` to `out`.
pub fn write_records(out: &mut Vec<u8>, count: usize, size: usize, stamp_us: u64) {
    let stamp = format!("{stamp_us:016x}");
    for _ in 0..count {
        if size >= STAMP_LEN {
            out.extend_from_slice(stamp.as_bytes());
            out.resize(out.len() + size - STAMP_LEN, b'x');
        } else {
            out.resize(out.len() + size, b'x');
        }
    }
}

/// One record body.
pub fn record(size: usize, stamp_us: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(size);
    write_records(&mut v, 1, size, stamp_us);
    v
}

/// The send time embedded in a record body, if it has one.
pub fn stamp_of(body: &[u8]) -> Option<u64> {
    let hex = std::str::from_utf8(body.get(..STAMP_LEN)?).ok()?;
    u64::from_str_radix(hex, 16).ok()
}

/// Splits a byte stream of fixed-size records that may arrive cut anywhere (Durable Streams
/// text delivery) back into records.
#[derive(Debug, Default)]
pub struct Splitter {
    carry: Vec<u8>,
}

impl Splitter {
    /// The start of a record cut at the end of what was fed so far.
    pub fn carry(&self) -> &[u8] {
        &self.carry
    }

    /// Starts over with `carry` as the cut record's start.
    pub fn reset_to(&mut self, carry: &[u8]) {
        self.carry.clear();
        self.carry.extend_from_slice(carry);
    }

    /// Feeds bytes; calls `each` with every complete record.
    pub fn feed(&mut self, data: &[u8], size: usize, mut each: impl FnMut(&[u8])) {
        if size == 0 {
            return;
        }
        let mut data = data;
        if !self.carry.is_empty() {
            let need = size - self.carry.len();
            let take = need.min(data.len());
            self.carry.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.carry.len() < size {
                return;
            }
            each(&self.carry);
            self.carry.clear();
        }
        let mut chunks = data.chunks_exact(size);
        for c in &mut chunks {
            each(c);
        }
        self.carry.extend_from_slice(chunks.remainder());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_carry_their_stamp_and_size() {
        let r = record(40, 0xabc);
        assert_eq!(r.len(), 40);
        assert_eq!(stamp_of(&r), Some(0xabc));
        assert!(r.iter().all(|b| b.is_ascii_alphanumeric()));
        assert_eq!(record(8, 5), b"xxxxxxxx");
        assert_eq!(stamp_of(b"xxxxxxxxxxxxxxxxxxxx"), None);
    }

    #[test]
    fn splitter_rebuilds_records_cut_anywhere() {
        let mut all = Vec::new();
        write_records(&mut all, 3, 20, 7);
        write_records(&mut all, 2, 20, 9);
        let mut s = Splitter::default();
        let mut got = Vec::new();
        for piece in all.chunks(7) {
            s.feed(piece, 20, |r| got.push(stamp_of(r).unwrap()));
        }
        assert_eq!(got, vec![7, 7, 7, 9, 9]);
    }
}
