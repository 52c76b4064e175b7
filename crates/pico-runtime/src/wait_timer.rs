//! The timer behind the listener's stall and idle limits: it counts one wait at a time (from
//! the first `Pending` after progress) and is allocated at the first wait only, since most
//! connections, bodies and streams never wait long.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;
use tokio::time::{Instant, Sleep};

#[derive(Debug, Default)]
pub(crate) struct WaitTimer {
    sleep: Option<Pin<Box<Sleep>>>,
    /// A wait is being counted.
    counting: bool,
}

impl WaitTimer {
    /// Progress: the next wait counts from its own start.
    pub(crate) fn stop(&mut self) {
        self.counting = false;
    }

    /// Counts the current wait, starting it now if it is a new one; true once it has lasted
    /// `limit`. Registers `cx` to be woken then.
    pub(crate) fn expired(&mut self, cx: &mut Context<'_>, limit: Duration) -> bool {
        if !self.counting {
            let deadline = Instant::now() + limit;
            match self.sleep.as_mut() {
                Some(s) => s.as_mut().reset(deadline),
                None => self.sleep = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
            self.counting = true;
        }
        self.sleep
            .as_mut()
            .is_some_and(|s| s.as_mut().poll(cx).is_ready())
    }
}
