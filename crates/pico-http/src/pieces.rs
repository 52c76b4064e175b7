//! Streamed response bodies as a queue of pieces, some rendered only as they are sent.
//!
//! A read returns at least one record whole, however large, and its rendering (SSE framing,
//! JSON escaping, base64) can be several times its size: rendered at once, every reader would
//! hold that much. Reads of more than [`RENDER_AT_ONCE_MAX`] record bytes are queued as a
//! [`Render`] instead, which produces the same bytes a piece at a time.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use pico_server::{ReadOutcome, ReadRecord};

/// Reads holding more record bytes than this are rendered piece by piece.
pub const RENDER_AT_ONCE_MAX: usize = 64 * 1024;

/// Record bytes of a read: values, keys and header values.
pub fn payload_len(out: &ReadOutcome) -> usize {
    pico_server::live::payload_len(&out.records)
}

/// Records from this size up are sent as the cache's own bytes, not copied (see [`raw_body`]).
pub const SHARE_RECORD_MIN: usize = 64 * 1024;

/// A read's record values, concatenated. One large record (any record larger than a read's
/// byte limit comes alone) is its bytes, shared with the cache rather than copied per reader;
/// a small one is copied, so a slow reader does not keep the whole buffer it was sliced from.
pub fn raw_body(out: &ReadOutcome) -> Bytes {
    raw_values(&out.records)
}

/// [`raw_body`] of some records.
pub fn raw_values(records: &[ReadRecord]) -> Bytes {
    if let [one] = records
        && one.record.value.len() >= SHARE_RECORD_MIN
    {
        return one.record.value.clone();
    }
    let mut buf = BytesMut::new();
    for r in records {
        buf.extend_from_slice(&r.record.value);
    }
    buf.freeze()
}

/// Something rendered a piece at a time; `None` once it is all out.
pub trait Render: Send {
    fn next_chunk(&mut self) -> Option<Bytes>;
}

enum Piece {
    Ready(Bytes),
    Render(Box<dyn Render>),
}

/// What a response still has to send, in order.
#[derive(Default)]
pub struct Pieces(VecDeque<Piece>);

impl Pieces {
    pub fn ready(&mut self, b: Bytes) {
        self.0.push_back(Piece::Ready(b));
    }

    pub fn render(&mut self, r: impl Render + 'static) {
        self.0.push_back(Piece::Render(Box::new(r)));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The next bytes to send, rendering as needed.
    pub fn next_bytes(&mut self) -> Option<Bytes> {
        loop {
            match self.0.front_mut()? {
                Piece::Ready(_) => {
                    if let Some(Piece::Ready(b)) = self.0.pop_front() {
                        return Some(b);
                    }
                }
                Piece::Render(r) => match r.next_chunk() {
                    Some(b) => return Some(b),
                    None => {
                        self.0.pop_front();
                    }
                },
            }
        }
    }
}
