//! The injected clock. Logic that depends on time (TTL, producer ageing, leases, heartbeats,
//! failover, retry schedules) reads it through a [`Clock`] handed to it, so tests drive it with
//! a [`ManualClock`] instead of sleeping, and a seeded simulation replays the same times.
//!
//! Loops that run every so often (subscription timers, maintenance passes, heartbeats) wait
//! with [`Clock::sleep`], so a test that moves a [`ManualClock`] drives them too. Latency
//! measurements (`Instant`) and I/O timeouts stay on tokio's timers.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A wait on a clock (see [`Clock::sleep_until_ms`]).
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A source of wall time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now_ms(&self) -> i64;

    /// Resolves once the clock reads `deadline_ms` or later. The default suits a clock that
    /// moves with real time (the system clock): it waits on tokio's timer for what is left. A
    /// clock that moves otherwise ([`ManualClock`]) overrides it.
    fn sleep_until_ms(&self, deadline_ms: i64) -> Sleep {
        let remaining = deadline_ms.saturating_sub(self.now_ms());
        if remaining <= 0 {
            return Box::pin(std::future::ready(()));
        }
        Box::pin(tokio::time::sleep(Duration::from_millis(remaining as u64)))
    }

    /// Resolves once `d` has passed on this clock.
    fn sleep(&self, d: Duration) -> Sleep {
        self.sleep_until_ms(self.now_ms().saturating_add(duration_ms(d)))
    }
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A shared clock, as configs carry it.
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// The system clock as a [`SharedClock`].
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

/// A clock that moves only when told to. Never goes backwards unless [`ManualClock::set`]
/// says so. Moving it wakes the sleepers whose deadline it reached (they run when the test
/// next yields to the runtime).
#[derive(Debug)]
pub struct ManualClock {
    /// The time, in a watch channel so that every move reaches the sleepers (moves are
    /// serialized by it: concurrent advances add up).
    ms: tokio::sync::watch::Sender<i64>,
}

impl ManualClock {
    pub fn new(start_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            ms: tokio::sync::watch::Sender::new(start_ms),
        })
    }

    /// Moves the clock forward by `by` and returns the new time.
    pub fn advance(&self, by: Duration) -> i64 {
        let by = duration_ms(by);
        let mut now = 0;
        self.ms.send_modify(|ms| {
            *ms = ms.saturating_add(by);
            now = *ms;
        });
        now
    }

    pub fn set(&self, ms: i64) {
        self.ms.send_replace(ms);
    }

    /// How many sleeps wait on this clock now (a test can wait for a loop to be asleep
    /// before it moves the clock).
    pub fn sleepers(&self) -> usize {
        self.ms.receiver_count()
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        *self.ms.borrow()
    }

    fn sleep_until_ms(&self, deadline_ms: i64) -> Sleep {
        // Subscribed before the check, so a move between the two is not missed.
        let mut moved = self.ms.subscribe();
        if self.now_ms() >= deadline_ms {
            return Box::pin(std::future::ready(()));
        }
        Box::pin(async move {
            loop {
                if *moved.borrow_and_update() >= deadline_ms {
                    return;
                }
                if moved.changed().await.is_err() {
                    // The clock is gone: it will never move again.
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}

/// Milliseconds since the Unix epoch on the system clock (0 if it is before 1970). Code that
/// a test must control takes a [`Clock`] instead.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        let shared: SharedClock = clock.clone();
        assert_eq!(shared.now_ms(), 1_000);
        assert_eq!(clock.advance(Duration::from_secs(2)), 3_000);
        assert_eq!(shared.now_ms(), 3_000);
        clock.set(10);
        assert_eq!(shared.now_ms(), 10);
    }

    /// A sleep on a manual clock ends when the clock reaches its deadline, not before, however
    /// long it waits in real time.
    #[tokio::test(start_paused = true)]
    async fn a_sleep_on_a_manual_clock_ends_when_the_clock_reaches_it() {
        let clock = ManualClock::new(1_000);
        let shared: SharedClock = clock.clone();
        let mut sleep = shared.sleep(Duration::from_millis(500));
        assert_eq!(clock.sleepers(), 1);
        // An hour of tokio time passes: the manual clock has not moved.
        let waited = tokio::time::timeout(Duration::from_secs(3600), &mut sleep).await;
        assert!(waited.is_err(), "woke before the clock moved");
        clock.advance(Duration::from_millis(499));
        assert!(futures_poll(&mut sleep).is_pending(), "woke 1 ms early");
        clock.advance(Duration::from_millis(1));
        sleep.await;
        assert_eq!(clock.sleepers(), 0);
        // A deadline already passed does not wait.
        shared.sleep_until_ms(0).await;
        shared.sleep(Duration::ZERO).await;
    }

    fn futures_poll(sleep: &mut Sleep) -> std::task::Poll<()> {
        let waker = std::task::Waker::noop();
        sleep
            .as_mut()
            .poll(&mut std::task::Context::from_waker(waker))
    }

    #[tokio::test(start_paused = true)]
    async fn a_sleep_on_the_system_clock_waits_real_time() {
        let start = tokio::time::Instant::now();
        system().sleep(Duration::from_secs(2)).await;
        assert!(start.elapsed() >= Duration::from_millis(1_900));
    }

    #[test]
    fn the_system_clock_reads_the_wall_clock() {
        let before = now_ms();
        let read = system().now_ms();
        assert!(read >= before && read <= now_ms());
    }
}
