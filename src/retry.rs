//! How long to wait before a failed delivery is tried again.

use std::time::Duration;

/// Exponential backoff with jitter, and when to give up.
///
/// The n-th retry waits `initial × multiplier^(n-1)`, capped at `max_delay`,
/// then spread by ±`jitter` so that deliveries failing together do not retry
/// in lockstep. After `max_attempts` failed attempts the delivery becomes a
/// dead letter. Transient database failures (a lost connection, a busy
/// database, a call past its deadline) and an unreachable broker are
/// retried with the same backoff, but waiting at most 5 s, and do not use
/// up attempts: an outage pauses delivery instead of burying messages, and
/// delivery resumes within seconds of its end.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Delay before the first retry.
    pub initial_delay: Duration,
    /// Upper bound of any delay.
    pub max_delay: Duration,
    /// Growth factor per attempt (at least 1).
    pub multiplier: f64,
    /// Relative spread, from 0 (none) to 1 (±100 %).
    pub jitter: f64,
    /// Failed attempts before the delivery is dead-lettered; `None` retries
    /// forever (and rules out inbox retention, whose window must outlast
    /// every redelivery).
    pub max_attempts: Option<u32>,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            initial_delay: Duration::from_millis(50),
            max_delay: Duration::from_secs(30),
            multiplier: 2.0,
            jitter: 0.2,
            max_attempts: Some(10),
        }
    }
}

impl RetryPolicy {
    /// The delay after the given failed attempt (1 for the first).
    pub fn delay(&self, failed_attempt: u32) -> Duration {
        let exponent = failed_attempt.saturating_sub(1).min(64) as i32;
        let base = self.initial_delay.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = base.min(self.max_delay.as_secs_f64());
        let spread = 1.0 + self.jitter * (fastrand::f64() * 2.0 - 1.0);
        Duration::from_secs_f64((capped * spread).max(0.0))
    }

    /// The longest a delivery can go on failing before it is dead-lettered:
    /// every backoff at its largest jitter. `None` when attempts are
    /// unbounded.
    pub fn horizon(&self) -> Option<Duration> {
        let attempts = self.max_attempts?;
        let total: f64 = (1..attempts)
            .map(|n| {
                let exponent = (n - 1).min(64) as i32;
                let base = self.initial_delay.as_secs_f64() * self.multiplier.powi(exponent);
                base.min(self.max_delay.as_secs_f64()) * (1.0 + self.jitter)
            })
            .sum();
        Some(Duration::from_secs_f64(total))
    }

    /// Checks the settings; `Err` names the bad one.
    pub(crate) fn validate(&self) -> crate::error::Result<()> {
        let bad = |what: &str| Err(crate::error::Error::Config(format!("retry policy: {what}")));
        if self.initial_delay.is_zero() {
            return bad("initial_delay must be above zero");
        }
        if self.max_delay < self.initial_delay {
            return bad("max_delay must be at least initial_delay");
        }
        if !(self.multiplier >= 1.0 && self.multiplier.is_finite()) {
            return bad("multiplier must be a finite number of at least 1");
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return bad("jitter must be between 0 and 1");
        }
        if self.max_attempts == Some(0) {
            return bad("max_attempts must be at least 1 (or None to retry forever)");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_and_are_capped() {
        let policy = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        assert_eq!(policy.delay(1), Duration::from_millis(50));
        assert_eq!(policy.delay(2), Duration::from_millis(100));
        assert_eq!(policy.delay(3), Duration::from_millis(200));
        assert_eq!(policy.delay(40), Duration::from_secs(30));
    }

    #[test]
    fn jitter_stays_within_its_spread() {
        let policy = RetryPolicy::default();
        for _ in 0..1000 {
            let d = policy.delay(1).as_secs_f64();
            assert!((0.040..=0.060).contains(&d), "{d}");
        }
    }

    #[test]
    fn the_horizon_adds_every_backoff_at_its_largest() {
        let policy = RetryPolicy {
            max_attempts: Some(4),
            jitter: 0.5,
            ..RetryPolicy::default()
        };
        // Three waits: 50, 100 and 200 ms, each at +50 %.
        assert_eq!(policy.horizon(), Some(Duration::from_millis(525)));
        let forever = RetryPolicy {
            max_attempts: None,
            ..RetryPolicy::default()
        };
        assert_eq!(forever.horizon(), None);
    }

    #[test]
    fn bad_settings_are_refused() {
        let policy = RetryPolicy {
            jitter: 1.5,
            ..RetryPolicy::default()
        };
        assert!(policy
            .validate()
            .unwrap_err()
            .to_string()
            .contains("jitter"));
    }
}
