//! Shared vocabulary of PicoMQ. No IO happens here, except in [`fs`].
//!
//! - [`ids`]: `StreamId`, `NodeId`, stream `Epoch`, `Offset`.
//! - [`name`]: stream-name rules (`/orders/42` → canonical `orders/42`).
//! - [`uri`]: bucket URIs with a numeric bucket id before the scheme (`-2@file://./objects`).
//! - [`error`]: [`ErrorKind`], the small prescriptive error vocabulary every protocol maps.
//! - [`clock`]: the injected [`clock::Clock`] (system and manual); the only place the time is read.
//! - [`fs`]: directories created durably (each new entry synced into its parent).
//! - [`failure_log`]: a repeating failure logged once per period with a count, not each time.
//! - [`pg_durability`]: Postgres settings that lose commits, and `allowUnsafe=true` to accept them.

pub mod clock;
pub mod error;
pub mod failure_log;
pub mod fs;
pub mod ids;
pub mod name;
pub mod pg_durability;
pub mod uri;

pub use error::ErrorKind;
pub use ids::{Epoch, NodeId, Offset, StreamId};
pub use name::{NameError, StreamName};
pub use uri::{BucketUri, Scheme, UriError};
