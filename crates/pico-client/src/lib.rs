//! Rust client for the Pico HTTP protocol (plain HTTP, optional HTTP/2 prior knowledge).
//!
//! - [`client`]: [`Client`], one method per protocol request; follows 307 redirects to owners.
//! - [`admin`]: [`AdminClient`], the admin listener's API (stream transfers, placement).
//! - [`types`]: what the methods take and return ([`ReadChunk`], [`AppendAck`], …).
//! - [`producer`]: [`IdempotentProducer`], pipelined: several batches in flight, acked in order;
//!   [`SeqWindow`]/[`drive`] are its protocol-free sequencing core.
//! - [`wire`]: sans-IO codecs: header names, JSON batch encoding, JSON read decoding.
//! - [`error`]: [`ClientError`], carrying the server's JSON error when there is one.

pub mod admin;
pub mod client;
pub mod error;
pub mod producer;
pub mod types;
pub mod wire;

pub use admin::{AdminClient, Handoff, Placement, TransferStarted};
pub use client::{Client, ClientOptions};
pub use error::ClientError;
pub use producer::{
    Attempt, IdempotentProducer, InFlight, ProducerAck, ProducerConfig, RetryHook, RetryPolicy,
    SeqWindow, drive,
};
pub use types::{
    AppendAck, AppendOptions, BatchRecord, Created, ListPage, Producer, ReadChunk, ReadRecord,
    StreamMeta,
};
