//! Metrics: counters kept per module and per handler, recorded both in
//! atomics (read back as typed snapshots by [`BusHandle::metrics`]) and
//! through the [`metrics`] facade, so any exporter sees them.
//!
//! Facade handles are registered when a module starts, so install the
//! application's recorder (for example
//! [`install_prometheus`](crate::install_prometheus)) before starting
//! modules. Names follow Prometheus conventions:
//!
//! | name | kind | labels |
//! | --- | --- | --- |
//! | `tickbox_inbox_handled_total` | counter | module, handler, topic |
//! | `tickbox_inbox_duplicates_total` | counter | module, handler, topic |
//! | `tickbox_inbox_failed_total` | counter | module, handler, topic |
//! | `tickbox_inbox_retried_total` | counter | module, handler, topic |
//! | `tickbox_inbox_dead_lettered_total` | counter | module, handler, topic |
//! | `tickbox_inbox_batches_total` | counter | module, handler, topic |
//! | `tickbox_inbox_batch_fallbacks_total` | counter | module, handler, topic |
//! | `tickbox_parked_keys` | gauge | module, handler, topic |
//! | `tickbox_unknown_effects` | gauge | module, handler, topic |
//! | `tickbox_effects_total` | counter | module, handler, effect, event |
//! | `tickbox_handler_duration_seconds` | histogram | module, handler, topic |
//! | `tickbox_end_to_end_seconds` | histogram | module, handler, topic |
//! | `tickbox_mailbox_queued` | gauge | module |
//! | `tickbox_mailbox_in_flight` | gauge | module |
//! | `tickbox_outbox_pending` | gauge | module |
//! | `tickbox_outbox_scheduled` | gauge | module |
//! | `tickbox_scheduled_lateness_seconds` | histogram | module |
//! | `tickbox_outbox_lag_seconds` | gauge | module |
//! | `tickbox_outbox_published_total` | counter | module |
//! | `tickbox_outbox_delivered_total` | counter | module |
//! | `tickbox_dead_letters` | gauge | module |
//! | `tickbox_outbox_stalled` | gauge | module |
//! | `tickbox_subscription_lag_seconds` | gauge | module, subscriber, handler |
//! | `tickbox_database_calls_stuck` | gauge | module |
//! | `tickbox_database_deadlines_missed_total` | counter | module |
//! | `tickbox_connection_encrypted` | gauge | module, server (`postgres`); connection, server (`amqp`) |
//!
//! The outbox gauges, the dead-letter count, the parked keys and the
//! unknown effects are read from the database at an interval (indexed
//! queries), never per message. `tickbox_effects_total` counts, per effect,
//! each `event`: `started` (a call made), `succeeded`, `failed`, `unknown`
//! (found unfinished and not to be called again) and `reused` (a recorded
//! result handed back instead of calling).
//!
//! [`BusHandle::metrics`]: crate::BusHandle::metrics

use crate::store::deadline::CallMetrics;
use crate::store::outbox::Backlog;
use crate::store::subscriptions::Subscription;
use serde::Serialize;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, Once};
use std::time::Duration;

/// Upper bounds of the latency buckets, in seconds (shared with the
/// Prometheus exporter).
pub(crate) const LATENCY_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Registers descriptions (the `# HELP` lines) with the recorder, once per
/// process.
pub(crate) fn describe() {
    static ONCE: Once = Once::new();
    ONCE.call_once(describe_to_recorder);
}

/// Registers descriptions (the `# HELP` lines) with the current recorder.
pub(crate) fn describe_to_recorder() {
    {
        use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        describe_counter!(
            "tickbox_inbox_handled_total",
            "Deliveries whose handler transaction committed with its inbox row."
        );
        describe_counter!(
            "tickbox_inbox_duplicates_total",
            "Deliveries skipped because the inbox already held the message."
        );
        describe_counter!(
            "tickbox_inbox_failed_total",
            "Delivery attempts that failed and were rolled back."
        );
        describe_counter!(
            "tickbox_inbox_retried_total",
            "Delivery attempts that retried a failed one."
        );
        describe_counter!(
            "tickbox_inbox_dead_lettered_total",
            "Deliveries given up on and recorded as dead letters."
        );
        describe_counter!(
            "tickbox_inbox_batches_total",
            "Transactions that committed several deliveries to a batched handler."
        );
        describe_counter!(
            "tickbox_inbox_batch_fallbacks_total",
            "Batches rolled back because one delivery failed, then handled one at a time."
        );
        describe_histogram!(
            "tickbox_handler_duration_seconds",
            Unit::Seconds,
            "Time of a committed delivery transaction, BEGIN to COMMIT."
        );
        describe_histogram!(
            "tickbox_end_to_end_seconds",
            Unit::Seconds,
            "Time from the publishing transaction's commit to the handler's commit."
        );
        describe_gauge!(
            "tickbox_connection_encrypted",
            "1 when the newest connection (a module's to its database, or one to the broker) is encrypted (TLS), 0 in clear."
        );
        describe_gauge!(
            "tickbox_mailbox_queued",
            "Deliveries waiting in the module actor's mailbox."
        );
        describe_gauge!(
            "tickbox_mailbox_in_flight",
            "Delivery transactions running in the module."
        );
        describe_gauge!(
            "tickbox_outbox_pending",
            "Outbox messages due and not yet delivered to all subscribers."
        );
        describe_gauge!(
            "tickbox_outbox_scheduled",
            "Scheduled outbox messages not yet due."
        );
        describe_histogram!(
            "tickbox_scheduled_lateness_seconds",
            Unit::Seconds,
            "Time from a scheduled message's due time to its delivery to every subscriber on the bus (or the broker's confirm)."
        );
        describe_gauge!(
            "tickbox_outbox_lag_seconds",
            Unit::Seconds,
            "Age of the oldest pending outbox message (from its due time, for a scheduled one)."
        );
        describe_counter!(
            "tickbox_outbox_published_total",
            "Messages committed to the outbox by this process."
        );
        describe_counter!(
            "tickbox_outbox_delivered_total",
            "Outbox messages delivered to all subscribers and marked."
        );
        describe_gauge!(
            "tickbox_dead_letters",
            "Dead letters waiting for an operator."
        );
        describe_gauge!(
            "tickbox_parked_keys",
            "Ordering keys held back for the handler by a dead letter, until it is replayed or skipped."
        );
        describe_gauge!(
            "tickbox_unknown_effects",
            "Effects of the handler nobody can vouch for, waiting for a person to settle them."
        );
        describe_counter!(
            "tickbox_effects_total",
            "What the handler's external effects did, by event: started, succeeded, failed, unknown, reused."
        );
        describe_gauge!(
            "tickbox_outbox_stalled",
            "Outbox messages pending for longer than the bus's stall threshold."
        );
        describe_gauge!(
            "tickbox_database_calls_stuck",
            "Calls to the module's database waiting longer than half their deadline now"
        );
        describe_counter!(
            "tickbox_database_deadlines_missed_total",
            "Calls to the module's database given up at their deadline (their connections closed)"
        );
        describe_gauge!(
            "tickbox_subscription_lag_seconds",
            Unit::Seconds,
            "Age of the oldest outbox message a subscription still owes (module is the outbox's, subscriber and handler the subscription's)."
        );
    }
}

/// A latency histogram with fixed buckets, kept in atomics.
#[derive(Debug, Default)]
pub(crate) struct Latency {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Latency {
    fn record(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        if let Some(i) = LATENCY_BUCKETS.iter().position(|le| seconds <= *le) {
            self.buckets[i].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_us.fetch_add(elapsed.as_micros() as u64, Relaxed);
    }

    fn snapshot(&self) -> LatencyMetrics {
        let mut cumulative = 0;
        let buckets = LATENCY_BUCKETS
            .iter()
            .zip(&self.buckets)
            .map(|(le, n)| {
                cumulative += n.load(Relaxed);
                (*le, cumulative)
            })
            .collect();
        LatencyMetrics {
            count: self.count.load(Relaxed),
            sum_seconds: self.sum_us.load(Relaxed) as f64 / 1e6,
            buckets,
        }
    }
}

/// A latency distribution at a point in time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyMetrics {
    /// Observations.
    pub count: u64,
    /// Their sum, in seconds.
    pub sum_seconds: f64,
    /// Cumulative counts: (upper bound in seconds, observations at or below
    /// it). Observations above the last bound are only in `count`.
    pub buckets: Vec<(f64, u64)>,
}

impl LatencyMetrics {
    /// The mean, in seconds (0 without observations).
    pub fn mean_seconds(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_seconds / self.count as f64
        }
    }

    /// The upper bound of the bucket holding quantile `q` (0..=1): an upper
    /// estimate, in seconds; infinite if it lies above the last bucket.
    pub fn quantile_upper_bound(&self, q: f64) -> f64 {
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64;
        self.buckets
            .iter()
            .find(|(_, n)| *n >= rank.max(1))
            .map_or(f64::INFINITY, |(le, _)| *le)
    }
}

/// Live counters of one handler, and their facade handles.
pub(crate) struct HandlerCounters {
    handled: AtomicU64,
    duplicates: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    dead_lettered: AtomicU64,
    batches: AtomicU64,
    batch_fallbacks: AtomicU64,
    /// Keys parked by a dead letter, as last read from the database.
    parked_keys: AtomicI64,
    /// Unknown effects, as last read from the effects journal.
    unknown_effects: AtomicI64,
    latency: Latency,
    end_to_end: Latency,
    exported: HandlerExport,
}

/// The facade handles of one handler's metrics.
struct HandlerExport {
    handled: metrics::Counter,
    duplicates: metrics::Counter,
    failed: metrics::Counter,
    retried: metrics::Counter,
    dead_lettered: metrics::Counter,
    batches: metrics::Counter,
    batch_fallbacks: metrics::Counter,
    parked_keys: metrics::Gauge,
    unknown_effects: metrics::Gauge,
    latency: metrics::Histogram,
    end_to_end: metrics::Histogram,
}

impl HandlerCounters {
    pub(crate) fn new(module: &str, handler: &str, topic: &str) -> Self {
        describe();
        let labels = [
            ("module", module.to_string()),
            ("handler", handler.to_string()),
            ("topic", topic.to_string()),
        ];
        HandlerCounters {
            handled: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            retried: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            batches: AtomicU64::new(0),
            batch_fallbacks: AtomicU64::new(0),
            parked_keys: AtomicI64::new(0),
            unknown_effects: AtomicI64::new(0),
            latency: Latency::default(),
            end_to_end: Latency::default(),
            exported: HandlerExport {
                handled: metrics::counter!("tickbox_inbox_handled_total", &labels),
                duplicates: metrics::counter!("tickbox_inbox_duplicates_total", &labels),
                failed: metrics::counter!("tickbox_inbox_failed_total", &labels),
                retried: metrics::counter!("tickbox_inbox_retried_total", &labels),
                dead_lettered: metrics::counter!("tickbox_inbox_dead_lettered_total", &labels),
                batches: metrics::counter!("tickbox_inbox_batches_total", &labels),
                batch_fallbacks: metrics::counter!("tickbox_inbox_batch_fallbacks_total", &labels),
                parked_keys: metrics::gauge!("tickbox_parked_keys", &labels),
                unknown_effects: metrics::gauge!("tickbox_unknown_effects", &labels),
                latency: metrics::histogram!("tickbox_handler_duration_seconds", &labels),
                end_to_end: metrics::histogram!("tickbox_end_to_end_seconds", &labels),
            },
        }
    }

    /// A committed delivery: its transaction time, and the time since the
    /// message's publishing transaction committed.
    pub(crate) fn handled(&self, latency: Duration, end_to_end: Duration) {
        self.handled.fetch_add(1, Relaxed);
        self.exported.handled.increment(1);
        self.latency.record(latency);
        self.exported.latency.record(latency.as_secs_f64());
        self.end_to_end.record(end_to_end);
        self.exported.end_to_end.record(end_to_end.as_secs_f64());
    }

    pub(crate) fn duplicate(&self) {
        self.duplicates.fetch_add(1, Relaxed);
        self.exported.duplicates.increment(1);
    }

    pub(crate) fn failed(&self) {
        self.failed.fetch_add(1, Relaxed);
        self.exported.failed.increment(1);
    }

    pub(crate) fn retried(&self) {
        self.retried.fetch_add(1, Relaxed);
        self.exported.retried.increment(1);
    }

    pub(crate) fn dead_lettered(&self) {
        self.dead_lettered.fetch_add(1, Relaxed);
        self.exported.dead_lettered.increment(1);
    }

    /// A transaction that committed several deliveries.
    pub(crate) fn batch_committed(&self) {
        self.batches.fetch_add(1, Relaxed);
        self.exported.batches.increment(1);
    }

    /// The keys a dead letter parks for the handler, as read now.
    pub(crate) fn parked_keys(&self, keys: i64) {
        self.parked_keys.store(keys, Relaxed);
        self.exported.parked_keys.set(keys as f64);
    }

    /// The handler's unknown effects, as read now.
    pub(crate) fn unknown_effects(&self, effects: i64) {
        self.unknown_effects.store(effects, Relaxed);
        self.exported.unknown_effects.set(effects as f64);
    }

    /// A batch that rolled back and was handled one delivery at a time.
    pub(crate) fn batch_fell_back(&self) {
        self.batch_fallbacks.fetch_add(1, Relaxed);
        self.exported.batch_fallbacks.increment(1);
    }

    pub(crate) fn snapshot(&self, handler: &str, topic: &str) -> HandlerMetrics {
        let latency = self.latency.snapshot();
        HandlerMetrics {
            handler: handler.to_string(),
            topic: topic.to_string(),
            handled: self.handled.load(Relaxed),
            duplicates_skipped: self.duplicates.load(Relaxed),
            failed: self.failed.load(Relaxed),
            retried: self.retried.load(Relaxed),
            dead_lettered: self.dead_lettered.load(Relaxed),
            batches: self.batches.load(Relaxed),
            batch_fallbacks: self.batch_fallbacks.load(Relaxed),
            parked_keys: self.parked_keys.load(Relaxed),
            unknown_effects: self.unknown_effects.load(Relaxed),
            mean_latency_seconds: latency.mean_seconds(),
            latency,
            end_to_end: self.end_to_end.snapshot(),
        }
    }
}

/// Deliveries sent to a module actor and not yet answered.
pub(crate) struct Mailbox {
    queued: AtomicU64,
    in_flight: AtomicU64,
    queued_gauge: metrics::Gauge,
    in_flight_gauge: metrics::Gauge,
}

impl Mailbox {
    pub(crate) fn new(module: &str) -> Self {
        describe();
        let labels = [("module", module.to_string())];
        Mailbox {
            queued: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            queued_gauge: metrics::gauge!("tickbox_mailbox_queued", &labels),
            in_flight_gauge: metrics::gauge!("tickbox_mailbox_in_flight", &labels),
        }
    }

    /// The bus sent a delivery.
    pub(crate) fn sent(&self) {
        self.queued.fetch_add(1, Relaxed);
        self.queued_gauge.increment(1.0);
    }

    /// A sent delivery never reached the actor.
    pub(crate) fn lost(&self) {
        self.queued.fetch_sub(1, Relaxed);
        self.queued_gauge.decrement(1.0);
    }

    /// The actor picked a delivery up and started its transaction.
    pub(crate) fn started(&self) {
        self.queued.fetch_sub(1, Relaxed);
        self.queued_gauge.decrement(1.0);
        self.in_flight.fetch_add(1, Relaxed);
        self.in_flight_gauge.increment(1.0);
    }

    /// The delivery's transaction ended.
    pub(crate) fn finished(&self) {
        self.in_flight.fetch_sub(1, Relaxed);
        self.in_flight_gauge.decrement(1.0);
    }

    pub(crate) fn depth(&self) -> (u64, u64) {
        (self.queued.load(Relaxed), self.in_flight.load(Relaxed))
    }
}

/// What the bus last read from a module's outbox, and its delivered count.
pub(crate) struct OutboxGauges {
    pending: AtomicI64,
    /// Scheduled messages not yet due.
    scheduled: AtomicI64,
    /// Time from each scheduled message's due time to its delivery.
    lateness: Latency,
    /// Creation time of the oldest pending message; 0 when none.
    oldest_pending_us: AtomicI64,
    dead_letters: AtomicI64,
    /// When the values above were read; 0 before the first read.
    sampled_at_us: AtomicI64,
    published: AtomicU64,
    delivered: AtomicU64,
    stalled: AtomicI64,
    /// The subscriptions recorded in the outbox's database, as last read.
    subscriptions: Mutex<Vec<Subscription>>,
    module: String,
    pending_gauge: metrics::Gauge,
    scheduled_gauge: metrics::Gauge,
    lateness_histogram: metrics::Histogram,
    lag_gauge: metrics::Gauge,
    dead_letters_gauge: metrics::Gauge,
    published_counter: metrics::Counter,
    delivered_counter: metrics::Counter,
    stalled_gauge: metrics::Gauge,
}

impl OutboxGauges {
    pub(crate) fn new(module: &str) -> Self {
        describe();
        let labels = [("module", module.to_string())];
        OutboxGauges {
            pending: AtomicI64::new(0),
            scheduled: AtomicI64::new(0),
            lateness: Latency::default(),
            oldest_pending_us: AtomicI64::new(0),
            dead_letters: AtomicI64::new(0),
            sampled_at_us: AtomicI64::new(0),
            published: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            stalled: AtomicI64::new(0),
            subscriptions: Mutex::new(Vec::new()),
            module: module.to_string(),
            stalled_gauge: metrics::gauge!("tickbox_outbox_stalled", &labels),
            pending_gauge: metrics::gauge!("tickbox_outbox_pending", &labels),
            scheduled_gauge: metrics::gauge!("tickbox_outbox_scheduled", &labels),
            lateness_histogram: metrics::histogram!("tickbox_scheduled_lateness_seconds", &labels),
            lag_gauge: metrics::gauge!("tickbox_outbox_lag_seconds", &labels),
            dead_letters_gauge: metrics::gauge!("tickbox_dead_letters", &labels),
            published_counter: metrics::counter!("tickbox_outbox_published_total", &labels),
            delivered_counter: metrics::counter!("tickbox_outbox_delivered_total", &labels),
        }
    }

    pub(crate) fn published(&self, n: u64) {
        self.published.fetch_add(n, Relaxed);
        self.published_counter.increment(n);
    }

    pub(crate) fn delivered(&self, n: u64) {
        self.delivered.fetch_add(n, Relaxed);
        self.delivered_counter.increment(n);
    }

    /// A scheduled message was delivered `late` after its due time.
    pub(crate) fn delivered_late(&self, late: Duration) {
        self.lateness.record(late);
        self.lateness_histogram.record(late.as_secs_f64());
    }

    /// Stores a reading taken from the database at `now_us`.
    pub(crate) fn sampled(&self, backlog: &Backlog, dead_letters: i64, now_us: i64) {
        let (pending, oldest) = (backlog.pending, backlog.oldest_us.unwrap_or(0));
        self.pending.store(pending, Relaxed);
        self.scheduled.store(backlog.scheduled, Relaxed);
        self.scheduled_gauge.set(backlog.scheduled as f64);
        self.oldest_pending_us.store(oldest, Relaxed);
        self.dead_letters.store(dead_letters, Relaxed);
        self.sampled_at_us.store(now_us, Relaxed);
        self.pending_gauge.set(pending as f64);
        self.lag_gauge.set(lag_seconds(oldest, now_us));
        self.dead_letters_gauge.set(dead_letters as f64);
    }

    /// Stores the watchdog's count of stalled messages.
    pub(crate) fn stalled(&self, count: i64) {
        self.stalled.store(count, Relaxed);
        self.stalled_gauge.set(count as f64);
    }

    /// Stores the subscriptions read from the database at `now_us`, and
    /// their lags.
    pub(crate) fn subscriptions_sampled(&self, subscriptions: Vec<Subscription>, now_us: i64) {
        let gauge = |s: &Subscription| {
            metrics::gauge!(
                "tickbox_subscription_lag_seconds",
                "module" => self.module.clone(),
                "subscriber" => s.module.clone(),
                "handler" => s.handler.clone()
            )
        };
        let mut kept = self.subscriptions.lock().unwrap_or_else(|p| p.into_inner());
        for gone in kept.iter().filter(|old| {
            !subscriptions
                .iter()
                .any(|s| s.module == old.module && s.handler == old.handler)
        }) {
            gauge(gone).set(0.0);
        }
        for s in &subscriptions {
            gauge(s).set(lag_seconds(s.oldest_pending_us.unwrap_or(0), now_us));
        }
        *kept = subscriptions;
    }

    pub(crate) fn snapshot(&self) -> OutboxMetrics {
        let sampled_at_us = self.sampled_at_us.load(Relaxed);
        OutboxMetrics {
            stalled: self.stalled.load(Relaxed),
            subscriptions: self
                .subscriptions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            pending: self.pending.load(Relaxed),
            scheduled: self.scheduled.load(Relaxed),
            lateness: self.lateness.snapshot(),
            lag_seconds: lag_seconds(self.oldest_pending_us.load(Relaxed), sampled_at_us),
            dead_letters: self.dead_letters.load(Relaxed),
            published: self.published.load(Relaxed),
            delivered: self.delivered.load(Relaxed),
            sampled_at_us,
        }
    }
}

fn lag_seconds(oldest_pending_us: i64, now_us: i64) -> f64 {
    if oldest_pending_us == 0 {
        0.0
    } else {
        now_us.saturating_sub(oldest_pending_us).max(0) as f64 / 1e6
    }
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
    /// Transactions that committed several deliveries at once (a handler
    /// with [`HandlerOptions::batch`](crate::HandlerOptions::batch)).
    pub batches: u64,
    /// Batches that rolled back because one of their deliveries failed, and
    /// were then handled one delivery per transaction.
    pub batch_fallbacks: u64,
    /// Ordering keys a dead letter holds back for this handler until it is
    /// replayed or skipped (read from the database at an interval).
    pub parked_keys: i64,
    /// Effects of this handler nobody can vouch for, waiting for a person
    /// to settle them (read from the effects journal at an interval).
    pub unknown_effects: i64,
    /// Mean time of a committed delivery, from BEGIN to COMMIT.
    pub mean_latency_seconds: f64,
    /// Time of committed deliveries, BEGIN to COMMIT.
    pub latency: LatencyMetrics,
    /// Time from the publishing transaction's commit to this handler's.
    pub end_to_end: LatencyMetrics,
}

/// The outbox of one module, as last read by the bus.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OutboxMetrics {
    /// Messages due and not yet delivered to all their subscribers.
    pub pending: i64,
    /// Scheduled messages not yet due ([`Tx::publish_at`](crate::Tx::publish_at)).
    pub scheduled: i64,
    /// Time from each scheduled message's due time to its delivery to
    /// every subscriber on this process's bus (or to the broker's
    /// confirm), for the messages this process delivered.
    pub lateness: LatencyMetrics,
    /// Age of the oldest of the pending messages when read, in seconds (0
    /// when none), counted from its due time for a scheduled one.
    pub lag_seconds: f64,
    /// Dead letters held by the module.
    pub dead_letters: i64,
    /// Messages committed to the outbox by this process since the module
    /// started.
    pub published: u64,
    /// Messages delivered and marked since the module started.
    pub delivered: u64,
    /// When the database values were read (µs since the Unix epoch; 0 if
    /// never, e.g. before a bus runs).
    pub sampled_at_us: i64,
    /// Messages pending for longer than the bus's stall threshold, as its
    /// watchdog last counted (0 when no bus runs over the outbox).
    pub stalled: i64,
    /// The subscriptions recorded in the outbox's database — every handler,
    /// in any process, that receives its messages — with the oldest message
    /// each still owes.
    pub subscriptions: Vec<Subscription>,
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
    /// The module's outbox.
    pub outbox: OutboxMetrics,
    /// One entry per handler, in registration order.
    pub handlers: Vec<HandlerMetrics>,
    /// What the handlers' effects did in this process, per handler and
    /// effect name ([`Delivery::effect`](crate::Delivery::effect)).
    pub effects: Vec<crate::effects::counters::EffectMetrics>,
    /// Calls to the module's database that are stuck now or missed their
    /// deadline ([`ModuleBuilder::call_deadline`](crate::ModuleBuilder::call_deadline)).
    pub database_calls: CallMetrics,
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
    /// The broker's figures, when the bus runs over one (RabbitMQ, with
    /// the `amqp` feature).
    pub broker: Option<BrokerMetrics>,
}

impl BusMetrics {
    /// A snapshot without a broker's figures (a broker adds its own).
    pub(crate) fn new(
        delivered: u64,
        duplicates_injected: u64,
        modules: Vec<ModuleMetrics>,
    ) -> Self {
        BusMetrics {
            delivered,
            duplicates_injected,
            modules,
            broker: None,
        }
    }

    /// Sums a handler counter over every module.
    pub fn total(&self, counter: impl Fn(&HandlerMetrics) -> u64 + Copy) -> u64 {
        self.modules.iter().map(|m| m.total(counter)).sum()
    }
}

/// A broker's figures ([`BusMetrics::broker`]): its relay, which publishes
/// the outboxes' messages, and its consumers, one per handler. The same for
/// every broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokerMetrics {
    /// Connections made again after the broker was lost (relay and
    /// consumers).
    pub reconnects: u64,
    /// Calls to the broker (relay and consumers) that got no answer within
    /// their deadline (over RabbitMQ, `Amqp::call_deadline` and
    /// `Amqp::confirm_timeout`), each of which gave up its connection. Over
    /// RabbitMQ also exported as `tickbox_amqp_calls_timed_out_total{role}`.
    pub calls_timed_out: u64,
    /// Each outbox's publishes waiting for the broker's confirm.
    pub unconfirmed: Vec<RelayMetrics>,
    /// The most publishes that have waited for their confirm at once, over
    /// every outbox, since the bus started: at most
    /// [`publish_window`](Self::publish_window).
    pub unconfirmed_peak: u64,
    /// The relay's window: publishes it lets wait for their confirm at once
    /// (over RabbitMQ, `Amqp::publish_window`).
    pub publish_window: u64,
    /// Each handler's consumer.
    pub consumers: Vec<ConsumerMetrics>,
}

/// One outbox's relay figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RelayMetrics {
    /// The module whose outbox it is.
    pub module: String,
    /// Publishes waiting for the broker's confirm.
    pub unconfirmed: i64,
}

/// One handler's consumer figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ConsumerMetrics {
    /// The handler's module.
    pub module: String,
    /// The handler.
    pub handler: String,
    /// Its queue on the broker.
    pub queue: String,
    /// Messages taken and not yet acknowledged.
    pub in_flight: u64,
    /// Messages waiting in the queue, as last sampled (every scan
    /// interval).
    pub queue_depth: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_come_from_cumulative_buckets() {
        let latency = Latency::default();
        for ms in [1, 1, 1, 1, 1, 1, 1, 1, 1, 40] {
            latency.record(Duration::from_millis(ms));
        }
        let snapshot = latency.snapshot();
        assert_eq!(snapshot.count, 10);
        assert_eq!(snapshot.quantile_upper_bound(0.5), 0.001);
        assert_eq!(snapshot.quantile_upper_bound(0.99), 0.05);
        assert!((snapshot.mean_seconds() - 0.0049).abs() < 1e-9);
    }
}
