//! Graceful shutdown of a listener's connections, at the cost of one flag load per poll.
//!
//! hyper-util's `GracefulShutdown` wraps each connection in a future that polls a
//! `watch::Receiver::changed()` on every poll of the connection, and a pending `changed()` takes
//! the lock of one of the channel's eight `Notify` shards each time it is polled: every
//! connection of a listener shares them, so the workers' polls of unrelated connections
//! contended for a few locks, several times per request. Here a connection registers its task's
//! waker once (again only if it is polled with another one) and then loads a flag per poll.
//!
//! Invariants: every connection watched before [`Drain::shutdown`] is told once (its
//! [`Watch::stopping`] answers true on one poll) and is woken for it; `shutdown` returns once
//! every [`Watch`] has been dropped (its connection has finished).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Waker};

use tokio::sync::Notify;

#[derive(Default)]
struct Shared {
    stopping: AtomicBool,
    conns: Mutex<Conns>,
    /// Notified when the last watch is dropped after `stopping`.
    idle: Notify,
}

#[derive(Default)]
struct Conns {
    next: u64,
    /// The connections not finished yet, with the waker each was last polled with.
    wakers: HashMap<u64, Option<Waker>>,
}

impl Shared {
    fn conns(&self) -> MutexGuard<'_, Conns> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A listener's connections (see the module docs).
#[derive(Default)]
pub(crate) struct Drain(Arc<Shared>);

/// One connection's part in its listener's [`Drain`]; dropped when the connection has finished.
pub(crate) struct Watch {
    shared: Arc<Shared>,
    id: u64,
    /// The waker registered for this connection (kept to compare without the lock).
    waker: Option<Waker>,
    told: bool,
}

impl Drain {
    /// Watches a new connection.
    pub(crate) fn watch(&self) -> Watch {
        let mut conns = self.0.conns();
        let id = conns.next;
        conns.next += 1;
        conns.wakers.insert(id, None);
        Watch {
            shared: self.0.clone(),
            id,
            waker: None,
            told: false,
        }
    }

    /// Tells every watched connection to shut down gracefully, then waits until all of them
    /// have finished.
    pub(crate) async fn shutdown(self) {
        self.0.stopping.store(true, Ordering::Release);
        for w in self.0.conns().wakers.values().flatten() {
            w.wake_by_ref();
        }
        loop {
            let idle = self.0.idle.notified();
            let mut idle = std::pin::pin!(idle);
            idle.as_mut().enable();
            if self.0.conns().wakers.is_empty() {
                return;
            }
            idle.await;
        }
    }
}

impl Watch {
    /// True on the first poll after the shutdown began: the connection should start its
    /// graceful shutdown then. Call on every poll of the connection, with its context.
    pub(crate) fn stopping(&mut self, cx: &mut Context<'_>) -> bool {
        if self.told {
            return false;
        }
        if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            // Registered before the flag is loaded: a shutdown that sets it after this load
            // wakes this waker (it sets the flag, then takes the lock to wake).
            let w = cx.waker().clone();
            self.shared.conns().wakers.insert(self.id, Some(w.clone()));
            self.waker = Some(w);
        }
        if self.shared.stopping.load(Ordering::Acquire) {
            self.told = true;
            return true;
        }
        false
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let mut conns = self.shared.conns();
        conns.wakers.remove(&self.id);
        if conns.wakers.is_empty() && self.shared.stopping.load(Ordering::Acquire) {
            self.shared.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::task::Poll;
    use std::time::Duration;

    /// A connection that finishes one poll after it is told to stop.
    async fn conn(mut watch: Watch) {
        let mut told = false;
        poll_fn(|cx| {
            if told {
                return Poll::Ready(());
            }
            told = watch.stopping(cx);
            if told {
                cx.waker().wake_by_ref();
            }
            Poll::Pending
        })
        .await;
        drop(watch);
    }

    #[tokio::test]
    async fn shutdown_tells_every_connection_and_waits_for_them() {
        let drain = Drain::default();
        let conns: Vec<_> = (0..3).map(|_| tokio::spawn(conn(drain.watch()))).collect();
        // Let them register; then one more that is polled only after the shutdown began.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let late = drain.watch();
        let shutdown = tokio::spawn(drain.shutdown());
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !shutdown.is_finished(),
            "returned before a connection finished"
        );
        let late = tokio::spawn(conn(late));
        tokio::time::timeout(Duration::from_secs(10), shutdown)
            .await
            .expect("shutdown did not finish")
            .unwrap();
        for c in conns {
            assert!(c.is_finished());
        }
        late.await.unwrap();
    }

    #[tokio::test]
    async fn shutdown_without_connections_returns() {
        tokio::time::timeout(Duration::from_secs(10), Drain::default().shutdown())
            .await
            .expect("shutdown did not finish");
    }
}
