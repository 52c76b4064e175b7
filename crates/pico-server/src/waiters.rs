//! Long-poll and SSE waiters: one watch channel per stream that somebody is waiting on, created on
//! demand and dropped once nobody waits, so idle streams cost nothing here.

use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::watch;

/// What waiters observe: the durable tail and whether the stream is closed or gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Signal {
    pub tail: u64,
    pub closed: bool,
    pub gone: bool,
}

#[derive(Default)]
pub struct Waiters {
    map: Mutex<HashMap<u64, watch::Sender<Signal>>>,
}

impl Waiters {
    /// Subscribes to a stream's signal, seeding it with `current` if nobody waited yet.
    pub fn subscribe(&self, stream: u64, current: Signal) -> watch::Receiver<Signal> {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get(&stream) {
            Some(tx) => {
                tx.send_if_modified(|s| merge(s, current));
                tx.subscribe()
            }
            None => {
                let (tx, rx) = watch::channel(current);
                map.insert(stream, tx);
                rx
            }
        }
    }

    /// The tail advanced (called from the WAL writer's durable hook: must be cheap).
    pub fn notify_tail(&self, stream: u64, tail: u64) {
        self.update(stream, |s| {
            if tail > s.tail {
                s.tail = tail;
                true
            } else {
                false
            }
        });
    }

    pub fn notify_closed(&self, stream: u64) {
        self.update(stream, |s| !std::mem::replace(&mut s.closed, true));
    }

    pub fn notify_gone(&self, stream: u64) {
        self.update(stream, |s| !std::mem::replace(&mut s.gone, true));
    }

    /// The stream moved to another node: its waiters here answer as on a timeout (their
    /// client's next request is redirected to the new owner) instead of waiting for a tail
    /// that will not move here.
    pub fn release(&self, stream: u64) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&stream);
    }

    fn update(&self, stream: u64, f: impl FnOnce(&mut Signal) -> bool) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.get(&stream) {
            if tx.receiver_count() == 0 {
                map.remove(&stream);
            } else {
                tx.send_if_modified(f);
            }
        }
    }

    /// Drops channels nobody listens to any more.
    pub fn sweep(&self) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, tx| tx.receiver_count() > 0);
    }

    pub fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn merge(s: &mut Signal, seen: Signal) -> bool {
    let before = *s;
    s.tail = s.tail.max(seen.tail);
    s.closed |= seen.closed;
    s.gone |= seen.gone;
    *s != before
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wakes_on_tail_and_cleans_up() {
        let w = Waiters::default();
        let mut rx = w.subscribe(1, Signal::default());
        w.notify_tail(1, 5);
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow().tail, 5);
        w.notify_closed(1);
        rx.changed().await.unwrap();
        assert!(rx.borrow().closed);
        drop(rx);
        w.notify_tail(1, 6);
        assert!(w.is_empty(), "channel without receivers is dropped");
        // Notifying a stream nobody waits on creates nothing.
        w.notify_tail(2, 1);
        assert!(w.is_empty());
    }
}
