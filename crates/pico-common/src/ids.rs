//! Identifiers shared by every crate.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Internal stream id, allocated by the metadata log; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StreamId(pub u64);

/// Node id, chosen by the operator (`--node-id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u32);

/// Stream epoch: bumped by every open; `-1` means created and never opened.
pub type Epoch = i64;

/// Record offset within a stream: consecutive from 0.
pub type Offset = u64;

/// The epoch of a stream that was created but never opened.
pub const NEVER_OPENED: Epoch = -1;

impl fmt::Display for StreamId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
