//! The in-memory record every protocol translates to and from.

use bytes::Bytes;

/// One record. `timestamp_ms` is wall-clock milliseconds assigned by the server on append.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub timestamp_ms: i64,
    pub key: Option<Bytes>,
    pub value: Bytes,
    pub headers: Vec<(String, Bytes)>,
}

impl Record {
    /// A record with only a value (timestamp 0: filled in by the server).
    pub fn from_value(value: impl Into<Bytes>) -> Record {
        Record {
            timestamp_ms: 0,
            key: None,
            value: value.into(),
            headers: Vec::new(),
        }
    }

    /// Bytes of content: body, key and every header key and value (what a read's byte budget
    /// counts; framing overhead excluded).
    pub fn size(&self) -> usize {
        let headers: usize = self.headers.iter().map(|(k, v)| k.len() + v.len()).sum();
        self.value.len() + self.key.as_ref().map_or(0, Bytes::len) + headers
    }
}
