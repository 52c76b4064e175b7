//! PicoMQ metadata state machine. No IO, no clock: time arrives as a field of a command.
//!
//! - [`command`]: [`Command`], [`Outcome`], [`ApplyError`] and the small value types they carry.
//! - [`state`]: [`State`] (persistent `im` maps, O(1) clone), the pure deterministic
//!   [`State::apply`], and read queries for views.
//! - [`invariants`]: the rules `apply` maintains, one function (and one comment) each.
//! - [`codec`]: the versioned hand-written binary codec for log rows and snapshots.

pub mod codec;
pub mod command;
pub mod invariants;
pub mod state;

pub use codec::CodecError;
pub use command::{
    ApplyError, Command, CommitRange, ForkOrigin, Initial, Outcome, ProducerMark, StreamConfig,
};
pub use state::{
    NodeInfo, ObjectMeta, Owner, ProducerState, Producers, RegistryEntry, Slice, State, StreamMeta,
    Transfer,
};
