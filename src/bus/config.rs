//! The bus's settings.

use crate::bus::transport::Broker;
use crate::retry::RetryPolicy;
use std::time::Duration;

/// The bus's settings.
#[derive(Debug, Clone)]
pub(crate) struct BusConfig {
    /// Handler attempts running at once, over all modules.
    pub(crate) max_concurrent_deliveries: usize,
    /// Messages per outbox held in memory (in delivery or waiting to retry).
    pub(crate) max_messages_in_memory: usize,
    /// How often the outbox tables are scanned for messages that neither an
    /// announcement nor a notification brought (after a crash, a lost
    /// notification, or, on SQLite, another process's commit).
    pub(crate) scan_interval: Duration,
    /// Rows read per scan query.
    pub(crate) sweep_page: i64,
    pub(crate) retry: RetryPolicy,
    /// Probability of delivering a message a second time on purpose (a
    /// test hook: only with the `testing` feature).
    #[cfg(feature = "testing")]
    pub(crate) duplicate_rate: f64,
    /// How long `stop` waits for running deliveries.
    pub(crate) stop_timeout: Duration,
    /// How long a claim on an outbox row keeps other processes' buses away;
    /// renewed while the delivery runs.
    pub(crate) claim_lease: Duration,
    /// How long a message may stay pending before the watchdog reports it.
    pub(crate) stalled_after: Duration,
    /// How long a delivered message waits for its mark, so that marks go
    /// out in batches.
    pub(crate) mark_linger: Duration,
    /// The process's stable name, if it has one: its bus id then stays the
    /// same across restarts.
    pub(crate) instance: Option<String>,
    /// The broker, when messages travel through one.
    pub(crate) broker: Option<Broker>,
}

impl Default for BusConfig {
    fn default() -> Self {
        BusConfig {
            max_concurrent_deliveries: 64,
            max_messages_in_memory: 2048,
            scan_interval: Duration::from_secs(2),
            sweep_page: 256,
            retry: RetryPolicy::default(),
            #[cfg(feature = "testing")]
            duplicate_rate: 0.0,
            stop_timeout: Duration::from_secs(30),
            claim_lease: Duration::from_secs(10),
            stalled_after: Duration::from_secs(60),
            mark_linger: Duration::from_millis(10),
            instance: None,
            broker: None,
        }
    }
}

impl BusConfig {
    /// Whether messages travel through a broker.
    pub(crate) fn over_broker(&self) -> bool {
        self.broker.is_some()
    }
}
