//! A route: one subscriber of a topic (a handler of a module), and the seam
//! where a message leaves the bus towards it.

use crate::bus::config::BusConfig;
use crate::delivery::handlers::HandlerEntry;
use crate::delivery::outcome::{DeliveryError, Outcome};
use crate::message::Envelope;
use crate::module::handle::ModuleHandle;
use crate::retry::RetryPolicy;
use crate::store::backend::Backend;
use std::sync::Arc;

/// One subscriber of a topic: a handler of a module.
pub(crate) struct Route<B: Backend> {
    pub(crate) module: ModuleHandle<B>,
    /// Index of the handler in its module.
    pub(crate) handler: usize,
}

impl<B: Backend> Route<B> {
    /// The handler's name.
    pub(crate) fn name(&self) -> &str {
        &self.entry().name
    }

    /// The handler's name, shared.
    pub(crate) fn name_arc(&self) -> Arc<str> {
        self.entry().name.clone()
    }

    /// The topic the handler subscribes to.
    pub(crate) fn topic(&self) -> &'static str {
        self.entry().handler.topic()
    }

    /// The handler as its module registered it.
    fn entry(&self) -> &HandlerEntry<B> {
        &self.module.core.handlers.entries[self.handler]
    }

    /// Whether the handler takes its deliveries in batches.
    pub(crate) fn is_batched(&self) -> bool {
        self.entry().batches.is_some()
    }

    /// The handler's own retry policy, or the bus's.
    pub(crate) fn retry<'a>(&'a self, bus: &'a BusConfig) -> &'a RetryPolicy {
        self.entry().retry.as_ref().unwrap_or(&bus.retry)
    }

    /// Runs one attempt of `envelope` through the handler and waits for how
    /// it ended. Here a message leaves the bus for a handler: in this
    /// process, through the module actor's mailbox and the inbox guard.
    pub(crate) async fn deliver(
        &self,
        envelope: Arc<Envelope>,
        attempt: u32,
    ) -> Result<Outcome, DeliveryError> {
        self.module.deliver(envelope, self.handler, attempt).await
    }
}
