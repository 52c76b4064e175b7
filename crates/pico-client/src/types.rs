//! Values the client takes and returns.

use bytes::Bytes;
use std::collections::BTreeMap;

/// Outcome of an idempotent create.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Created {
    /// false = the stream already existed with the same configuration.
    pub created: bool,
}

/// Stream metadata from `HEAD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamMeta {
    /// First readable offset (trim watermark).
    pub start: u64,
    /// Next offset to be written.
    pub next: u64,
    pub closed: bool,
    pub content_type: String,
}

/// Offsets assigned by an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendAck {
    /// Offset of the first record of this append.
    pub start_seq: u64,
    /// The stream's next offset after it.
    pub next_seq: u64,
}

/// An idempotent producer claim (`Pico-Producer-Id/Epoch/Seq`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Producer {
    pub id: String,
    pub epoch: u64,
    pub seq: u64,
}

/// Optional headers of a single-record append.
#[derive(Debug, Clone, Default)]
pub struct AppendOptions {
    pub content_type: Option<String>,
    pub key: Option<String>,
    pub producer: Option<Producer>,
    pub match_seq: Option<u64>,
    /// Close the stream after this append.
    pub close: bool,
}

/// One record of a JSON batch append.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchRecord {
    pub body: Bytes,
    pub key: Option<Bytes>,
    pub headers: BTreeMap<String, String>,
}

impl BatchRecord {
    pub fn new(body: impl Into<Bytes>) -> BatchRecord {
        BatchRecord {
            body: body.into(),
            ..Default::default()
        }
    }
}

/// A record as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRecord {
    pub seq: u64,
    /// Append time, ms since the Unix epoch.
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub headers: BTreeMap<String, String>,
    pub body: Bytes,
}

/// One read response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadChunk {
    pub records: Vec<ReadRecord>,
    /// Where the next read continues.
    pub next_seq: u64,
    /// Everything available was returned.
    pub up_to_date: bool,
    /// The stream is closed and its end was reached.
    pub closed: bool,
}

/// One page of `GET /`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// Stream names in order.
    pub streams: Vec<String>,
    pub has_more: bool,
}
