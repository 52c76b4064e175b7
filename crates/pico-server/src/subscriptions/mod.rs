//! Durable Streams subscriptions (PROTOCOL.md §6–§7): the behaviour behind the `__ds` routes
//! that `pico-http` serves. Facades parse, call the [`Manager`], and map [`SubError`] to their
//! wire.
//!
//! - [`manager`]: the driver (state in memory, background tasks: append follower, timer).
//! - `effects`: one transition: the state lock and the writes, deliveries and events it decides.
//! - `links`: what the driver reads about linked streams (tails, acks, prune), without IO.
//! - [`state`]: pure transitions of one subscription (wake, delivery answer, claim, timer),
//!   taking `now_ms`.
//! - [`wake`]: pure rules of a wake: fencing, webhook body, retry schedule.
//! - [`store`]: subscription records and links in the metadata KV.
//! - `routed`: pull-wake events for a wake stream another node owns, through the KV.
//! - `events`: the node's append events, sent only while a subscription wants them.
//! - [`delivery`]: [`WebhookSender`] and its HTTP implementation.
//! - [`model`]: records, config parsing and hash, limits.
//! - [`signing`]: Ed25519 webhook signatures, JWKS, callback tokens.
//! - [`glob`]: `*`/`**` patterns.
//! - [`webhook_url`]: the SSRF guard.
//! - [`error`]: what an operation can fail with.

pub mod delivery;
mod effects;
pub mod error;
mod events;
pub mod glob;
mod links;
pub mod manager;
pub mod model;
mod routed;
pub mod signing;
pub mod state;
pub mod store;
#[cfg(test)]
mod test_support;
pub mod wake;
pub mod webhook_url;

pub use delivery::{Delivered, HttpSender, WebhookSender};
pub use error::SubError;
pub use events::StreamEvents;
pub use manager::{Manager, TICK, Upserted};
pub use wake::{AckItem, WakeRequest};
