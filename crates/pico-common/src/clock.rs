//! The injected clock. Logic that depends on time (TTL, producer ageing, leases, heartbeats,
//! failover, retry schedules) reads it through a [`Clock`] handed to it, so tests drive it with
//! a [`ManualClock`] instead of sleeping, and a seeded simulation replays the same times.
//!
//! Only wall time is here: latency measurements (`Instant`) and tokio timers stay as they are.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A source of wall time in milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    fn now_ms(&self) -> i64;
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
/// says so.
#[derive(Debug)]
pub struct ManualClock {
    ms: AtomicI64,
}

impl ManualClock {
    pub fn new(start_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            ms: AtomicI64::new(start_ms),
        })
    }

    /// Moves the clock forward by `by` and returns the new time.
    pub fn advance(&self, by: Duration) -> i64 {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        self.ms.fetch_add(by, Ordering::SeqCst).saturating_add(by)
    }

    pub fn set(&self, ms: i64) {
        self.ms.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.ms.load(Ordering::SeqCst)
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

    #[test]
    fn the_system_clock_reads_the_wall_clock() {
        let before = now_ms();
        let read = system().now_ms();
        assert!(read >= before && read <= now_ms());
    }
}
