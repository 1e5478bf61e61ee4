//! Counters kept per module and per handler, and the snapshots read from them.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Live counters of one handler.
#[derive(Debug, Default)]
pub(crate) struct HandlerCounters {
    pub(crate) handled: AtomicU64,
    pub(crate) duplicates: AtomicU64,
    pub(crate) failed: AtomicU64,
    pub(crate) retried: AtomicU64,
    pub(crate) dead_lettered: AtomicU64,
    pub(crate) latency_us_sum: AtomicU64,
}

impl HandlerCounters {
    pub(crate) fn record_handled(&self, latency: Duration) {
        self.handled.fetch_add(1, Relaxed);
        self.latency_us_sum
            .fetch_add(latency.as_micros() as u64, Relaxed);
    }

    pub(crate) fn snapshot(&self, handler: &str, topic: &str) -> HandlerMetrics {
        let handled = self.handled.load(Relaxed);
        let sum = self.latency_us_sum.load(Relaxed);
        HandlerMetrics {
            handler: handler.to_string(),
            topic: topic.to_string(),
            handled,
            duplicates_skipped: self.duplicates.load(Relaxed),
            failed: self.failed.load(Relaxed),
            retried: self.retried.load(Relaxed),
            dead_lettered: self.dead_lettered.load(Relaxed),
            mean_latency_seconds: if handled == 0 {
                0.0
            } else {
                sum as f64 / handled as f64 / 1e6
            },
        }
    }
}

/// Deliveries sent to a module actor and not yet answered.
#[derive(Debug, Default)]
pub(crate) struct Mailbox {
    /// Sent by the bus, not yet picked up by the actor.
    pub(crate) queued: AtomicU64,
    /// Picked up, transaction running.
    pub(crate) in_flight: AtomicU64,
}

/// A point-in-time view of one handler's counters.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HandlerMetrics {
    /// The handler's name.
    pub handler: String,
    /// The topic it subscribes to.
    pub topic: String,
    /// Deliveries whose transaction committed.
    pub handled: u64,
    /// Deliveries skipped because the inbox already held the message.
    pub duplicates_skipped: u64,
    /// Attempts that failed (error, panic, undecodable payload, database).
    pub failed: u64,
    /// Attempts that were retries of a failed one.
    pub retried: u64,
    /// Deliveries given up on and recorded as dead letters.
    pub dead_lettered: u64,
    /// Mean time of a committed delivery, from BEGIN to COMMIT.
    pub mean_latency_seconds: f64,
}

/// A point-in-time view of one module.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModuleMetrics {
    /// The module's name.
    pub module: String,
    /// Deliveries waiting in the module actor's mailbox.
    pub mailbox_queued: u64,
    /// Deliveries whose transaction is running.
    pub mailbox_in_flight: u64,
    /// One entry per handler, in registration order.
    pub handlers: Vec<HandlerMetrics>,
}

impl ModuleMetrics {
    /// Sums a counter over the module's handlers.
    pub fn total(&self, counter: impl Fn(&HandlerMetrics) -> u64) -> u64 {
        self.handlers.iter().map(counter).sum()
    }
}

/// A point-in-time view of the bus and every module on it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BusMetrics {
    /// Outbox messages delivered to all their subscribers and marked.
    pub delivered: u64,
    /// Extra deliveries made on purpose by the duplicate-injection setting.
    pub duplicates_injected: u64,
    /// One entry per module, in the order they were added to the bus.
    pub modules: Vec<ModuleMetrics>,
}

impl BusMetrics {
    /// Sums a handler counter over every module.
    pub fn total(&self, counter: impl Fn(&HandlerMetrics) -> u64 + Copy) -> u64 {
        self.modules.iter().map(|m| m.total(counter)).sum()
    }
}
