//! Retry delays while a store is unreachable: exponential, capped, with jitter so nodes that
//! lost the store together do not come back in lockstep.

use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// The wait before retry number `failures` (1 = after the first failure): `min` doubled per
/// failure up to `max`, then "equal jitter" (half fixed, half random), so never above `max`
/// and never below `min / 2`.
pub fn retry_delay(min: Duration, max: Duration, failures: u64) -> Duration {
    let shift = failures.saturating_sub(1).min(20) as u32;
    let exp = min.saturating_mul(1u32 << shift).min(max.max(min));
    let half = exp / 2;
    half + half.mul_f64(random_unit())
}

/// Uniform in [0, 1), from the standard library's per-process random hash keys (no RNG
/// dependency for a jitter).
fn random_unit() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_are_capped_and_jittered() {
        let (min, max) = (Duration::from_millis(100), Duration::from_secs(2));
        for failures in 1..40 {
            let d = retry_delay(min, max, failures);
            let exp = (min * 2u32.pow((failures - 1).min(20) as u32)).min(max);
            assert!(d >= exp / 2 && d <= exp, "failures={failures} d={d:?}");
        }
        // Jittered: many draws at the cap are not all equal.
        let draws: std::collections::HashSet<_> =
            (0..32).map(|_| retry_delay(min, max, 30)).collect();
        assert!(draws.len() > 1, "no jitter: {draws:?}");
    }
}
