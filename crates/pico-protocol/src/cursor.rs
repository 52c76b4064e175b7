//! Live-read cursors (`Pico-Cursor`, DS `Stream-Cursor`): they exist to keep CDN cache keys
//! moving so collapsed long-polls never serve a stale empty response forever.
//!
//! Time is cut into 20 s intervals from 2024-10-09T00:00:00Z; the cursor is the interval number.
//! When a client echoes a cursor at or past the current interval, the answer is that cursor plus
//! a jitter, so cursors never go backwards.

/// 2024-10-09T00:00:00Z in ms since the Unix epoch.
pub const CURSOR_EPOCH_MS: i64 = 1_728_432_000_000;
pub const CURSOR_INTERVAL_MS: i64 = 20_000;
/// Jitter bounds in intervals (1 s to 3600 s worth).
pub const MAX_JITTER_INTERVALS: u64 = 180;

/// The cursor to send at `now_ms` given the client's echoed cursor. `jitter_intervals` comes
/// from the caller's randomness and is clamped to `1..=MAX_JITTER_INTERVALS`.
pub fn next_cursor(now_ms: i64, client: Option<u64>, jitter_intervals: u64) -> u64 {
    let current = (now_ms.saturating_sub(CURSOR_EPOCH_MS) / CURSOR_INTERVAL_MS).max(0) as u64;
    match client {
        Some(c) if c >= current => {
            c.saturating_add(jitter_intervals.clamp(1, MAX_JITTER_INTERVALS))
        }
        _ => current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_is_the_interval_and_never_goes_back() {
        let now = CURSOR_EPOCH_MS + 45_000;
        assert_eq!(next_cursor(now, None, 7), 2);
        assert_eq!(next_cursor(now, Some(1), 7), 2);
        assert_eq!(next_cursor(now, Some(2), 7), 9);
        assert_eq!(next_cursor(now, Some(100), 0), 101);
        assert_eq!(next_cursor(now, Some(100), 10_000), 280);
        assert_eq!(next_cursor(0, None, 1), 0);
    }
}
