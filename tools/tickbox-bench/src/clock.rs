//! The timestamps of one measured run, and the latencies they give.
//!
//! Each message's stamps are kept (one slot per message) and paired when the
//! run is over, so that the order in which they were taken does not matter;
//! the latencies then go into an HDR histogram for their percentiles.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use uuid::Uuid;

/// Per-message timestamps of one measured run, in nanoseconds since `t0`
/// plus one (0 = not recorded).
pub(crate) struct Clock {
    /// When the run started.
    pub(crate) t0: Instant,
    /// `n` of the first message of this run (business keys are unique
    /// across the runs of one process).
    pub(crate) offset: u64,
    /// False for the backlog scenario: no per-message stamps.
    track: bool,
    /// After the producer's COMMIT returned.
    commit: Vec<AtomicU64>,
    /// At the end of the handler, before its COMMIT.
    handler_end: Vec<AtomicU64>,
    /// After the handler's COMMIT (tracing layer, or the baseline itself).
    committed: Vec<AtomicU64>,
    /// Message id -> index, for the tracing layer (which only sees ids).
    ids: Mutex<HashMap<Uuid, u32>>,
    /// Messages whose producer transaction committed.
    pub(crate) produced: AtomicU64,
    /// Handler transactions committed (counted by the baseline; tickbox's
    /// own counter is read from its metrics).
    pub(crate) handled: AtomicU64,
    /// Set when a producer or a baseline consumer failed: the run stops.
    pub(crate) failed: AtomicBool,
}

/// Locks `m`, whether or not a holder panicked.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Clock {
    /// A clock for `messages` messages numbered from `offset`, keeping their
    /// stamps when `track`.
    pub(crate) fn new(offset: u64, messages: u64, track: bool) -> Arc<Self> {
        let len = if track { messages as usize } else { 0 };
        let zeros = || (0..len).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Arc::new(Clock {
            t0: Instant::now(),
            offset,
            track,
            commit: zeros(),
            handler_end: zeros(),
            committed: zeros(),
            ids: Mutex::new(HashMap::with_capacity(len.min(1 << 20))),
            produced: AtomicU64::new(0),
            handled: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        })
    }

    /// Now, as a stamp.
    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64 + 1
    }

    /// The slot of message `n`, if this run tracks it.
    fn index(&self, n: u64) -> Option<usize> {
        let i = n.checked_sub(self.offset)? as usize;
        (self.track && i < self.commit.len()).then_some(i)
    }

    /// Message `n`'s producer transaction committed.
    pub(crate) fn producer_committed(&self, n: u64) {
        self.produced.fetch_add(1, Relaxed);
        if let Some(i) = self.index(n) {
            self.commit[i].store(self.now(), Relaxed);
        }
    }

    /// The handler of message `n` (id `id`) ended, before its COMMIT.
    pub(crate) fn handler_ended(&self, n: u64, id: Uuid) {
        if let Some(i) = self.index(n) {
            self.handler_end[i].store(self.now(), Relaxed);
            lock(&self.ids).insert(id, i as u32);
        }
    }

    /// The baseline's consumer of message `n` committed.
    pub(crate) fn handler_committed_index(&self, n: u64) {
        if let Some(i) = self.index(n) {
            self.committed[i].store(self.now(), Relaxed);
        }
    }

    /// Called by the tracing layer after a tickbox handler's COMMIT; only
    /// the first call for a message counts.
    pub(crate) fn handler_committed_id(&self, id: &Uuid) {
        if !self.track {
            return;
        }
        let now = self.now();
        if let Some(i) = lock(&self.ids).remove(id) {
            self.committed[i as usize].store(now, Relaxed);
        }
    }

    /// The handler's end against each message's due time (`due_ns[i]`, on
    /// this clock's scale): the lateness of the messages stamped, and how
    /// many ended before they were due.
    pub(crate) fn lateness(&self, due_ns: &[u64]) -> (Option<Latency>, u64) {
        let mut histogram = histogram();
        let mut early = 0;
        for (end, due) in self.handler_end.iter().zip(due_ns) {
            let end = end.load(Relaxed);
            if end == 0 {
                continue;
            }
            match end.checked_sub(*due) {
                Some(late) => histogram.saturating_record(late),
                None => early += 1,
            }
        }
        (Latency::of(&histogram), early)
    }

    /// Producer commit to the handler's COMMIT done.
    pub(crate) fn commit_to_commit(&self) -> Option<Latency> {
        self.latencies(&self.committed)
    }

    /// Producer commit to the end of the handler, before its COMMIT.
    pub(crate) fn commit_to_handler_end(&self) -> Option<Latency> {
        self.latencies(&self.handler_end)
    }

    /// Latencies from producer commit to `to`, for the messages stamped at
    /// both ends; `None` when there is none.
    fn latencies(&self, to: &[AtomicU64]) -> Option<Latency> {
        let mut histogram = histogram();
        for (c, t) in self.commit.iter().zip(to) {
            let (c, t) = (c.load(Relaxed), t.load(Relaxed));
            if c != 0 && t != 0 {
                histogram.saturating_record(t.saturating_sub(c));
            }
        }
        Latency::of(&histogram)
    }
}

/// The longest latency told apart (longer ones count as this): an hour,
/// in nanoseconds.
const LONGEST_NS: u64 = 3_600 * 1_000_000_000;

/// An empty histogram of latencies in nanoseconds, to 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_max(LONGEST_NS, 3).expect("valid bounds")
}

/// Percentiles of a run's latencies, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Latency {
    /// Messages measured.
    pub(crate) samples: u64,
    /// The median.
    pub(crate) p50: f64,
    /// The 99th percentile.
    pub(crate) p99: f64,
    /// The largest.
    pub(crate) max: f64,
}

impl Latency {
    /// The percentiles of a histogram of nanoseconds; `None` when empty.
    fn of(histogram: &Histogram<u64>) -> Option<Self> {
        let ms = |ns: u64| ns as f64 / 1e6;
        (!histogram.is_empty()).then(|| Latency {
            samples: histogram.len(),
            p50: ms(histogram.value_at_quantile(0.5)),
            p99: ms(histogram.value_at_quantile(0.99)),
            max: ms(histogram.max()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_spread() {
        let mut h = histogram();
        for ms in 1..=100u64 {
            h.saturating_record(ms * 1_000_000);
        }
        let latency = Latency::of(&h).unwrap();
        assert_eq!(latency.samples, 100);
        assert!((latency.p50 - 50.0).abs() < 0.1, "{latency:?}");
        assert!((latency.p99 - 99.0).abs() < 0.1, "{latency:?}");
        assert!((latency.max - 100.0).abs() < 0.1, "{latency:?}");
        assert!(Latency::of(&histogram()).is_none());
        h.saturating_record(u64::MAX);
        assert!(Latency::of(&h).unwrap().max >= 3_600_000.0);
    }

    #[test]
    fn only_messages_stamped_at_both_ends_count() {
        let clock = Clock::new(10, 3, true);
        clock.producer_committed(10);
        clock.producer_committed(11);
        clock.handler_committed_index(10);
        clock.handler_committed_index(12);
        clock.handler_committed_index(99);
        assert_eq!(clock.commit_to_commit().unwrap().samples, 1);
        assert!(clock.commit_to_handler_end().is_none());
    }
}
