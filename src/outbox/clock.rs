//! The time an outbox's scheduled messages are due by: the wall clock, or
//! ahead of it once a test session moved it
//! ([`Session::advance`](crate::testing::Session::advance)), so that a test
//! of a 15-minute timeout takes milliseconds. It decides only when
//! scheduled messages are due (publishing, claiming, cancelling, the
//! bus's timer, lateness and the scheduled gauge); leases, retries,
//! deadlines and publication times keep the wall clock.

use crate::message::now_us;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// An outbox's clock for due times.
#[derive(Debug, Default)]
pub(crate) struct DueClock {
    /// How far ahead of the wall clock it runs, in µs: 0 unless a test
    /// session advanced it. It never goes back.
    ahead_us: AtomicI64,
}

impl DueClock {
    /// Now, in µs since the Unix epoch, as due times are judged.
    pub(crate) fn now_us(&self) -> i64 {
        now_us().saturating_add(self.ahead_us.load(Relaxed))
    }

    /// Moves the clock ahead by `by`.
    #[cfg(feature = "testing")]
    pub(crate) fn advance(&self, by: std::time::Duration) {
        let by = i64::try_from(by.as_micros()).unwrap_or(i64::MAX);
        self.ahead_us.fetch_add(by, Relaxed);
    }
}
