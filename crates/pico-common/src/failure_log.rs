//! Warnings for a failure that repeats while an outage lasts (a full disk under SQLite, a
//! metadata store that is down): the first failure of a run is logged at once, then at most one
//! line per period with the count of failures it stands for, and the first success ends the
//! run. Without it a loop retrying every 100 ms, or every request, writes a warning each time.
//!
//! Time is the caller's `now_ms` from the injected clock, so tests drive it with a manual one.

use std::sync::Mutex;
use std::time::Duration;

/// One failure's run: shared by the places that report the same failure.
#[derive(Debug)]
pub struct FailureLog {
    every_ms: i64,
    run: Mutex<Run>,
}

#[derive(Debug, Default)]
struct Run {
    total: u64,
    unlogged: u64,
    next_log_ms: i64,
}

impl FailureLog {
    /// At most one line per `every` while a run lasts.
    pub fn new(every: Duration) -> Self {
        FailureLog {
            every_ms: i64::try_from(every.as_millis()).unwrap_or(i64::MAX),
            run: Mutex::default(),
        }
    }

    /// The period between lines, in whole seconds (for the log line itself).
    pub fn every_secs(&self) -> i64 {
        self.every_ms / 1000
    }

    fn run(&self) -> std::sync::MutexGuard<'_, Run> {
        self.run.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a failure. Returns the failures to report (this one and those not logged since
    /// the last line) when this one is to be logged: the first of a run, then at most one per
    /// period.
    pub fn failed(&self, now_ms: i64) -> Option<u64> {
        let mut run = self.run();
        run.total += 1;
        run.unlogged += 1;
        if run.total > 1 && now_ms < run.next_log_ms {
            return None;
        }
        run.next_log_ms = now_ms.saturating_add(self.every_ms);
        Some(std::mem::take(&mut run.unlogged))
    }

    /// A success: ends the run of failures, returning its length if there was one (for a
    /// recovery line).
    pub fn answered(&self) -> Option<u64> {
        let run = std::mem::take(&mut *self.run());
        (run.total > 0).then_some(run.total)
    }
}

#[cfg(test)]
mod tests {
    use super::FailureLog;
    use crate::clock::{Clock, ManualClock};
    use std::time::Duration;

    /// Logged at its first failure, then at most once per period with the count of failures
    /// since; the first success ends the run, and the next failure is logged at once again.
    #[test]
    fn a_run_of_failures_is_logged_once_per_period_with_a_count() {
        let clock = ManualClock::new(1_000_000);
        let log = FailureLog::new(Duration::from_secs(30));
        assert_eq!(log.answered(), None, "no run to end");
        assert_eq!(log.failed(clock.now_ms()), Some(1), "the first is logged");
        for _ in 0..299 {
            clock.advance(Duration::from_millis(100));
            assert_eq!(log.failed(clock.now_ms()), None, "29.9 s into the run");
        }
        clock.advance(Duration::from_millis(100));
        assert_eq!(
            log.failed(clock.now_ms()),
            Some(300),
            "one line a period, counting the failures it stood for"
        );
        assert_eq!(log.failed(clock.now_ms()), None);
        assert_eq!(
            log.answered(),
            Some(302),
            "the recovery line counts the run"
        );
        assert_eq!(log.answered(), None);
        assert_eq!(
            log.failed(clock.now_ms()),
            Some(1),
            "a new run logs at once"
        );
    }
}
