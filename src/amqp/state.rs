//! What the bus knows of its broker while it runs: the relay, each
//! handler's consumer, and their figures.

use crate::amqp::relay::Relay;
use crate::error::Result;
use crate::metrics::{BrokerMetrics, ConsumerMetrics, RelayMetrics};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

/// The figures of one handler's consumer.
#[derive(Debug)]
pub(crate) struct ConsumerStats {
    /// The handler's module.
    pub(crate) module: String,
    /// The handler.
    pub(crate) handler: String,
    /// Its queue.
    pub(crate) queue: String,
    /// Messages taken from the queue and not yet acknowledged.
    pub(crate) in_flight: AtomicUsize,
    /// Messages waiting in the queue, as last sampled.
    pub(crate) depth: AtomicU64,
    /// Connections made again after one was lost.
    pub(crate) reconnects: AtomicU64,
    /// Its calls to the broker that got no answer in time.
    pub(crate) timed_out: Arc<AtomicU64>,
}

impl ConsumerStats {
    /// Figures for the consumer of `queue`, all zero.
    pub(crate) fn new(module: &str, handler: &str, queue: &str) -> Self {
        ConsumerStats {
            module: module.to_string(),
            handler: handler.to_string(),
            queue: queue.to_string(),
            in_flight: AtomicUsize::new(0),
            depth: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            timed_out: Arc::default(),
        }
    }
}

/// The bus's broker: its relay and its consumers.
pub(crate) struct BrokerState {
    /// Publishes the outboxes' messages.
    pub(crate) relay: Arc<Relay>,
    /// One per handler on the bus.
    pub(crate) consumers: Vec<Arc<ConsumerStats>>,
}

impl BrokerState {
    /// Messages the consumers hold unacknowledged.
    pub(crate) fn in_flight(&self) -> usize {
        self.consumers
            .iter()
            .map(|c| c.in_flight.load(Relaxed))
            .sum()
    }

    /// Messages waiting in the handlers' queues, read from the broker now.
    pub(crate) async fn queued(&self) -> Result<u64> {
        let mut total = 0;
        for consumer in &self.consumers {
            let depth = self
                .relay
                .depth(&consumer.queue)
                .await
                .map_err(|fault| fault.into_error(self.relay.redacted_url()))?;
            total += u64::from(depth);
        }
        Ok(total)
    }

    /// A snapshot of the figures.
    pub(crate) fn snapshot(&self) -> BrokerMetrics {
        let (unconfirmed_peak, publish_window) = self.relay.window();
        BrokerMetrics {
            unconfirmed_peak,
            publish_window,
            reconnects: self.relay.reconnects()
                + self
                    .consumers
                    .iter()
                    .map(|c| c.reconnects.load(Relaxed))
                    .sum::<u64>(),
            calls_timed_out: self.relay.calls_timed_out()
                + self
                    .consumers
                    .iter()
                    .map(|c| c.timed_out.load(Relaxed))
                    .sum::<u64>(),
            unconfirmed: self
                .relay
                .unconfirmed()
                .into_iter()
                .map(|(module, unconfirmed)| RelayMetrics {
                    module,
                    unconfirmed,
                })
                .collect(),
            consumers: self
                .consumers
                .iter()
                .map(|c| ConsumerMetrics {
                    module: c.module.clone(),
                    handler: c.handler.clone(),
                    queue: c.queue.clone(),
                    in_flight: c.in_flight.load(Relaxed) as u64,
                    queue_depth: c.depth.load(Relaxed),
                })
                .collect(),
        }
    }
}
