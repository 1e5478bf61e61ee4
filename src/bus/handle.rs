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
        BusMetrics {
            delivered: self.core.delivered.load(Relaxed),
            duplicates_injected: self.core.duplicates_injected.load(Relaxed),
            modules: self.modules.iter().map(ModuleHandle::metrics).collect(),
        }
    }

    /// Waits until the bus has nothing left to do — no message in memory,
    /// none announced and not taken, none pending in any outbox — or until
    /// `timeout`; true if it became idle. Dead letters do not count as work.
    ///
    /// The outboxes are read one after another; the answer is trusted only
    /// if nothing was delivered or held in memory while they were read.
    pub async fn wait_idle(&self, timeout: Duration) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let (busy, delivered) = self.activity();
            if busy == 0 && self.pending().await? == 0 && self.activity() == (0, delivered) {
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Messages held in memory or waiting to be taken, and the delivered
    /// count.
    fn activity(&self) -> (usize, u64) {
        let busy = self.modules.iter().map(|m| m.core.outbox.in_memory()).sum();
        (busy, self.core.delivered.load(Relaxed))
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
