//! A route: where a message of a topic goes from the bus, and the seam where
//! it leaves the bus — to a handler of a module in this process, or to the
//! message broker, whose queues take it to handlers in any process.

use crate::bus::config::BusConfig;
use crate::bus::transport::Transport;
use crate::delivery::registry::{HandlerEntry, HandlerIndex};
use crate::error::outcome::{DeliveryError, Outcome};
use crate::message::Envelope;
use crate::module::handle::ModuleHandle;
use crate::outbox::subscription::Served;
use crate::retry::RetryPolicy;
use crate::store::backend::Backend;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// One destination of a topic's messages.
pub(crate) enum Route<B: Backend> {
    /// A handler of a module on this bus.
    Handler {
        /// The module.
        module: ModuleHandle<B>,
        /// Index of the handler in its module.
        handler: HandlerIndex,
    },
    /// The message broker: a message is delivered once the broker has
    /// taken it (confirmed it); the handlers' consumers take it from there.
    Broker {
        /// The broker.
        transport: Arc<dyn Transport>,
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
            Route::Broker { transport, retry } => Route::Broker {
                transport: transport.clone(),
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
            Route::Broker { .. } => "relay",
        }
    }

    /// The handler as its module registered it.
    fn entry(&self) -> &HandlerEntry<B> {
        match self {
            Route::Handler { module, handler } => module.handlers().get(*handler),
            Route::Broker { .. } => unreachable!("the broker is no handler"),
        }
    }

    /// The module whose dead letters record what this route gave up on: the
    /// handler's, or else the message's own (`source`).
    pub(crate) fn dead_letters<'a>(&'a self, source: &'a ModuleHandle<B>) -> &'a ModuleHandle<B> {
        match self {
            Route::Handler { module, .. } => module,
            Route::Broker { .. } => source,
        }
    }

    /// The route's name among the bus's key lanes: `<module>/<handler>`, or
    /// the relay.
    pub(crate) fn lane(&self) -> String {
        match self {
            Route::Handler { module, .. } => format!("{}/{}", module.name(), self.name()),
            Route::Broker { .. } => "relay".to_string(),
        }
    }

    /// The module name to report a failure under.
    pub(crate) fn module_name(&self) -> &str {
        match self {
            Route::Handler { module, .. } => module.name(),
            Route::Broker { .. } => "the message broker",
        }
    }

    /// Whether the route leads to a handler (not to the broker).
    #[cfg(feature = "testing")]
    pub(crate) fn is_handler(&self) -> bool {
        matches!(self, Route::Handler { .. })
    }

    /// Whether attempt number `attempt` along the route takes one of the
    /// bus's delivery slots. A first attempt to a batched handler does not:
    /// it waits in the handler's batch queue, whose transactions the module
    /// bounds itself. Publishing to the broker never does: the relay bounds
    /// its publishes by its own window of unconfirmed ones
    /// (`Amqp::publish_window`), and they would otherwise hold slots the
    /// handlers' deliveries need.
    pub(crate) fn takes_slot(&self, attempt: u32) -> bool {
        match self {
            Route::Handler { .. } => attempt > 1 || self.entry().batches.is_none(),
            Route::Broker { .. } => false,
        }
    }

    /// The handler's own retry policy, or the bus's.
    pub(crate) fn retry<'a>(&'a self, bus: &'a BusConfig) -> &'a RetryPolicy {
        match self {
            Route::Handler { .. } => self.entry().retry.as_ref().unwrap_or(&bus.retry),
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
        match self {
            Route::Handler { module, handler } => module.deliver(envelope, *handler, attempt).await,
            Route::Broker { transport, .. } => transport
                .publish(source, &envelope)
                .await
                .map(|()| Outcome::Handled),
        }
    }
}

/// Where each topic's messages go: over a broker, to the broker (every
/// topic the bus's outboxes publish); else to the handlers of the bus
/// subscribed to it.
pub(crate) fn routes<B: Backend>(
    transport: Option<&Arc<dyn Transport>>,
    published: &HashSet<&'static str>,
    handlers: &[(ModuleHandle<B>, HandlerIndex)],
) -> HashMap<String, Vec<Route<B>>> {
    if let Some(transport) = transport {
        // Publishing never gives up: the bus's backoff, no last attempt.
        let retry = RetryPolicy {
            max_attempts: None,
            ..RetryPolicy::default()
        };
        return published
            .iter()
            .map(|topic| {
                let route = Route::Broker {
                    transport: transport.clone(),
                    retry: retry.clone(),
                };
                (topic.to_string(), vec![route])
            })
            .collect();
    }
    let mut routes: HashMap<String, Vec<Route<B>>> = HashMap::new();
    for (module, index) in handlers {
        let topic = module.handlers().get(*index).handler.topic();
        routes
            .entry(topic.to_string())
            .or_default()
            .push(Route::Handler {
                module: module.clone(),
                handler: *index,
            });
    }
    routes
}

/// The subscriptions to `module`'s outbox this bus serves: its handlers of
/// the topics the module publishes; over a broker, the broker, once per
/// topic (`relay <topic>`).
pub(crate) fn served<B: Backend>(
    transport: Option<&Arc<dyn Transport>>,
    module: &ModuleHandle<B>,
    handlers: &[(ModuleHandle<B>, HandlerIndex)],
) -> Vec<Served> {
    let publishes = &module.outbox().publishes;
    if let Some(transport) = transport {
        let subscriber = transport.subscriber();
        return publishes
            .iter()
            .map(|topic| {
                Served::new(
                    subscriber.clone(),
                    Arc::from(format!("relay {topic}")),
                    topic,
                )
            })
            .collect();
    }
    handlers
        .iter()
        .filter_map(|(subscriber, index)| {
            let entry = subscriber.handlers().get(*index);
            let topic = entry.handler.topic();
            publishes
                .contains(topic)
                .then(|| Served::new(subscriber.shared_name(), entry.name.clone(), topic))
        })
        .collect()
}
