//! A route: where a message of a topic goes from the bus, and the seam where
//! it leaves the bus — to a handler of a module in this process, or to the
//! message broker, whose queues take it to handlers in any process.

use crate::bus::config::BusConfig;
use crate::delivery::handlers::HandlerEntry;
use crate::error::outcome::{DeliveryError, Outcome};
use crate::message::Envelope;
use crate::module::handle::ModuleHandle;
use crate::retry::RetryPolicy;
use crate::store::backend::Backend;
use std::sync::Arc;

#[cfg(feature = "amqp")]
use crate::amqp::relay::Relay;

/// One destination of a topic's messages.
pub(crate) enum Route<B: Backend> {
    /// A handler of a module on this bus.
    Handler {
        /// The module.
        module: ModuleHandle<B>,
        /// Index of the handler in its module.
        handler: usize,
    },
    /// The message broker: a message is delivered once the broker has
    /// confirmed it; the handlers' consumers take it from there.
    #[cfg(feature = "amqp")]
    Broker {
        /// Publishes with confirms.
        relay: Arc<Relay>,
        /// Publishing never gives up: the bus's backoff, no last attempt.
        retry: RetryPolicy,
    },
}

impl<B: Backend> Clone for Route<B> {
    fn clone(&self) -> Self {
        match self {
            Route::Handler { module, handler } => Route::Handler {
                module: module.clone(),
                handler: *handler,
            },
            #[cfg(feature = "amqp")]
            Route::Broker { relay, retry } => Route::Broker {
                relay: relay.clone(),
                retry: retry.clone(),
            },
        }
    }
}

impl<B: Backend> Route<B> {
    /// The handler's name (`relay` for the broker).
    pub(crate) fn name(&self) -> &str {
        match self {
            Route::Handler { .. } => &self.entry().name,
            #[cfg(feature = "amqp")]
            Route::Broker { .. } => "relay",
        }
    }

    /// The topic the handler receives; `None` for the broker, which takes
    /// every topic.
    #[cfg(feature = "amqp")]
    pub(crate) fn topic(&self) -> Option<&'static str> {
        match self {
            Route::Handler { .. } => Some(self.entry().handler.topic()),
            #[cfg(feature = "amqp")]
            Route::Broker { .. } => None,
        }
    }

    /// The handler as its module registered it.
    fn entry(&self) -> &HandlerEntry<B> {
        match self {
            Route::Handler { module, handler } => &module.core.handlers.entries[*handler],
            #[cfg(feature = "amqp")]
            Route::Broker { .. } => unreachable!("the broker is no handler"),
        }
    }

    /// The module whose dead letters record what this route gave up on: the
    /// handler's, or else the message's own (`source`).
    pub(crate) fn dead_letters<'a>(&'a self, source: &'a ModuleHandle<B>) -> &'a ModuleHandle<B> {
        #[cfg(not(feature = "amqp"))]
        let _ = source;
        match self {
            Route::Handler { module, .. } => module,
            #[cfg(feature = "amqp")]
            Route::Broker { .. } => source,
        }
    }

    /// The route's name among the bus's key lanes: `<module>/<handler>`, or
    /// the relay.
    pub(crate) fn lane(&self) -> String {
        match self {
            Route::Handler { module, .. } => format!("{}/{}", module.name(), self.name()),
            #[cfg(feature = "amqp")]
            Route::Broker { .. } => "relay".to_string(),
        }
    }

    /// The module name to report a failure under.
    pub(crate) fn module_name(&self) -> &str {
        match self {
            Route::Handler { module, .. } => module.name(),
            #[cfg(feature = "amqp")]
            Route::Broker { .. } => "the message broker",
        }
    }

    /// Whether the route leads to a handler (not to the broker).
    #[cfg(feature = "testing")]
    pub(crate) fn is_handler(&self) -> bool {
        matches!(self, Route::Handler { .. })
    }

    /// Whether the handler takes its deliveries in batches.
    pub(crate) fn is_batched(&self) -> bool {
        match self {
            Route::Handler { .. } => self.entry().batches.is_some(),
            #[cfg(feature = "amqp")]
            Route::Broker { .. } => false,
        }
    }

    /// The handler's own retry policy, or the bus's.
    pub(crate) fn retry<'a>(&'a self, bus: &'a BusConfig) -> &'a RetryPolicy {
        match self {
            Route::Handler { .. } => self.entry().retry.as_ref().unwrap_or(&bus.retry),
            #[cfg(feature = "amqp")]
            Route::Broker { retry, .. } => retry,
        }
    }

    /// Runs one attempt of `envelope` (from `source`'s outbox) along the
    /// route and waits for how it ended. Here a message leaves the bus: to a
    /// handler in this process, through the module actor's mailbox and the
    /// inbox guard; or to the broker, confirmed.
    pub(crate) async fn deliver(
        &self,
        source: &str,
        envelope: Arc<Envelope>,
        attempt: u32,
    ) -> Result<Outcome, DeliveryError> {
        #[cfg(not(feature = "amqp"))]
        let _ = source;
        match self {
            Route::Handler { module, handler } => module.deliver(envelope, *handler, attempt).await,
            #[cfg(feature = "amqp")]
            Route::Broker { relay, .. } => match relay.publish(source, &envelope).await {
                Ok(()) => Ok(Outcome::Handled),
                Err(not_sent) => Err(DeliveryError::broker(
                    not_sent.into_error(relay, &envelope.topic),
                )),
            },
        }
    }
}
