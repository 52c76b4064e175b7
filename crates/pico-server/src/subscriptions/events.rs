//! The node's stream-event channel ([`StreamEvent`]), sent only while somebody wants it.
//!
//! Its one listener is the subscription [`Manager`](super::Manager), and only while this node
//! delivers at least one subscription does an append concern it. A broadcast send takes the
//! channel's lock and wakes the listener's task (≈ 0.5 µs an append, see
//! docs/design/http-hot-path.md), so without subscriptions an append checks one flag instead.
//!
//! No append a subscription must see is lost to the flag (docs/design/subscriptions.md, "Append
//! events"): the manager raises it *before* it reads the tails a new subscription is linked at
//! (or, on a takeover, before the rescan reads them), and an append checks it *after* its
//! records are in the view. Both sides put a `SeqCst` fence between their write and their read,
//! so of two such racing, at least one sees the other: the append sends its event, or the
//! manager reads a tail that includes it.

use std::sync::atomic::{AtomicBool, Ordering, fence};

use tokio::sync::broadcast;

use crate::StreamEvent;

pub struct StreamEvents {
    tx: broadcast::Sender<StreamEvent>,
    /// Some subscription on this node follows appends (set by the manager).
    wanted: AtomicBool,
}

impl StreamEvents {
    /// A lossy broadcast of `capacity` events (a listener further behind gets `Lagged`).
    pub fn new(capacity: usize) -> StreamEvents {
        StreamEvents {
            tx: broadcast::channel(capacity).0,
            wanted: AtomicBool::new(false),
        }
    }

    /// Sends `event` if a subscription wants it; call it once the event's records are visible
    /// in the view. `Ok(0)` when nobody wants it.
    pub fn send(
        &self,
        event: StreamEvent,
    ) -> Result<usize, broadcast::error::SendError<StreamEvent>> {
        // Orders the append's view update before the flag's read (see the module comment).
        fence(Ordering::SeqCst);
        if !self.wanted.load(Ordering::Relaxed) {
            return Ok(0);
        }
        self.tx.send(event)
    }

    pub fn subscribe(&self) -> broadcast::Receiver<StreamEvent> {
        self.tx.subscribe()
    }

    /// Whether appends send events now.
    pub fn wanted(&self) -> bool {
        self.wanted.load(Ordering::Relaxed)
    }

    /// Turns events on or off. Turning them on must come before the caller reads the tails it
    /// relies on (linking a new subscription, a rescan): the fence orders the two.
    pub(crate) fn want(&self, on: bool) {
        self.wanted.store(on, Ordering::Relaxed);
        fence(Ordering::SeqCst);
    }
}
