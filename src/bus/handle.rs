//! What application code holds of a started bus.

use crate::bus::actor::{Bus, Stop};
use crate::bus::core::BusCore;
use crate::error::Result;
use crate::metrics::BusMetrics;
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;
use actix::Addr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// What application code holds of a started bus.
pub struct BusHandle<B: Backend> {
    /// The bus's state.
    core: Arc<BusCore<B>>,
    /// The modules on the bus.
    modules: Vec<ModuleHandle<B>>,
    /// The bus actor, to stop it.
    addr: Addr<Bus<B>>,
}

impl<B: Backend> BusHandle<B> {
    /// The handle of a bus just started.
    pub(crate) fn new(
        core: Arc<BusCore<B>>,
        modules: Vec<ModuleHandle<B>>,
        addr: Addr<Bus<B>>,
    ) -> Self {
        BusHandle {
            core,
            modules,
            addr,
        }
    }

    /// The bus's id, as its claims on outbox rows carry it
    /// (`tickbox_outbox.claimed_by`): derived from [`BusBuilder::instance`](crate::BusBuilder::instance),
    /// or new on every start.
    pub fn id(&self) -> uuid::Uuid {
        self.core.id
    }

    /// The modules on this bus, in the order they were added.
    pub fn modules(&self) -> &[ModuleHandle<B>] {
        &self.modules
    }

    /// Stops the bus gracefully and waits until it has: no new deliveries
    /// start, running ones may finish within the stop timeout
    /// ([`BusBuilder::stop_timeout`](crate::BusBuilder::stop_timeout)), everything else stays pending in the
    /// outboxes for the next start.
    pub async fn stop(&self) {
        self.core.stop();
        // The actor may already be gone if stop was called twice.
        let _ = self.addr.send(Stop).await;
    }

    /// A snapshot of the bus's and every module's counters.
    pub fn metrics(&self) -> BusMetrics {
        let mut metrics = BusMetrics::new(
            self.core.delivered.load(Relaxed),
            self.core.duplicates_injected.load(Relaxed),
            self.modules.iter().map(ModuleHandle::metrics).collect(),
        );
        metrics.broker = self.core.transport.as_ref().map(|t| t.report());
        metrics
    }

    /// Waits until the bus has nothing left to do — no message in memory,
    /// none announced and not taken, none pending in any outbox, and over a
    /// broker none waiting in its handlers' queues or held by their
    /// consumers — or until `timeout`; true if it became idle. Dead letters
    /// do not count as work.
    ///
    /// A reading that fails for a while (a database or broker that does not
    /// answer, a call past its deadline) is tried again until `timeout`.
    ///
    /// The outboxes are read one after another; the answer is trusted only
    /// if nothing was delivered or held in memory while they were read. Over
    /// a broker the bus must also look idle for half a second on end: the
    /// broker puts the messages of a closed connection back in their queue
    /// a moment after it closed, and until then no queue shows them.
    pub async fn wait_idle(&self, timeout: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + timeout;
        let settle = if self.queued_by_broker() {
            Duration::from_millis(500)
        } else {
            Duration::ZERO
        };
        let mut idle_since = None;
        loop {
            let (busy, delivered) = self.activity();
            let idle = busy == 0
                && untried_if_transient(self.pending().await)? == Some(0)
                && untried_if_transient(self.queued().await)? == Some(0)
                && self.activity() == (0, delivered);
            if idle {
                let since = *idle_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= settle {
                    return Ok(true);
                }
            } else {
                idle_since = None;
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Whether the bus's handlers take their messages from a broker's
    /// queues.
    fn queued_by_broker(&self) -> bool {
        self.core.transport.is_some()
    }

    /// Messages held in memory or waiting to be taken, and the delivered
    /// count.
    fn activity(&self) -> (usize, u64) {
        let busy = self
            .modules
            .iter()
            .map(|m| m.outbox().in_memory())
            .sum::<usize>()
            + self.broker_in_flight();
        (busy, self.core.delivered.load(Relaxed))
    }

    /// Messages the broker's consumers hold unacknowledged.
    fn broker_in_flight(&self) -> usize {
        self.core.transport.as_ref().map_or(0, |t| t.in_flight())
    }

    /// Messages waiting in the broker's queues of this bus's handlers.
    async fn queued(&self) -> Result<u64> {
        match &self.core.transport {
            Some(transport) => transport.queued().await,
            None => Ok(0),
        }
    }

    /// Undelivered messages summed over every module's outbox.
    async fn pending(&self) -> Result<i64> {
        let mut total = 0;
        for module in &self.modules {
            total += module.store_stats().await?.outbox_pending;
        }
        Ok(total)
    }
}

/// A reading that failed for a while (a database or broker that does not
/// answer now) as no reading: the caller tries again.
fn untried_if_transient<T>(reading: Result<T>) -> Result<Option<T>> {
    match reading {
        Ok(value) => Ok(Some(value)),
        Err(error) if error.is_transient() => {
            tracing::debug!(%error, "waiting for the bus to be idle: a reading failed; trying again");
            Ok(None)
        }
        Err(error) => Err(error),
    }
}
