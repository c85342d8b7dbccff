//! The delay between tries of something that keeps failing: it starts at a base and
//! doubles with each failure up to a cap, and starts over after a success. The one
//! backoff of the audit sinks' shipping and the MCP adapter's restarts. Pure.

use std::time::Duration;

/// A doubling delay from `base` to `cap`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub const fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            failures: 0,
        }
    }

    /// Notes a failure; the delay before the next try: `base` after the first
    /// failure, twice as long after each further one, never more than `cap`.
    pub fn fail(&mut self) -> Duration {
        let exponent = self.failures.min(16);
        self.failures = self.failures.saturating_add(1);
        self.base.saturating_mul(1 << exponent).min(self.cap)
    }

    /// A success: the next failure waits `base` again.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_the_cap_and_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let waits: Vec<u128> = (0..6).map(|_| b.fail().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.failures(), 6);
        for _ in 0..100 {
            assert_eq!(b.fail(), Duration::from_secs(1));
        }
        b.reset();
        assert_eq!(b.fail(), Duration::from_millis(100));
    }
}
