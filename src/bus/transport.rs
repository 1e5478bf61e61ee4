//! How a bus's messages reach handlers: in this process (each topic routed
//! to the handlers of the bus's modules), or through a message broker (each
//! topic routed to the broker, each handler fed by a consumer of its queue).

use crate::bus::config::BusConfig;
use crate::bus::core::BusCore;
use crate::bus::route::Route;
use crate::error::Result;
use crate::module::handle::ModuleHandle;
use crate::outbox::subscription::Served;
use crate::store::backend::Backend;
use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;

#[cfg(feature = "amqp")]
use crate::amqp::state::{BrokerState, ConsumerStats};
#[cfg(feature = "amqp")]
use crate::amqp::{consumer, relay::Relay, settings::Amqp, topology};

/// A task the bus runs beside its dispatchers until it stops.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + 'static>>;

/// The bus's transport.
pub(crate) struct Transport<B: Backend> {
    /// The broker's side, when messages travel through one.
    #[cfg(feature = "amqp")]
    broker: Option<Broker<B>>,
    /// Local routes name the backend's modules.
    backend: PhantomData<fn() -> B>,
}

/// The bus's side of a broker.
#[cfg(feature = "amqp")]
struct Broker<B: Backend> {
    /// Where and how.
    amqp: Amqp,
    /// Publishes the outboxes' messages.
    relay: Arc<Relay>,
    /// Each handler of the bus's modules, its queue and its consumer's
    /// figures.
    queues: Vec<(
        ModuleHandle<B>,
        usize,
        topology::HandlerQueue,
        Arc<ConsumerStats>,
    )>,
}

impl<B: Backend> Transport<B> {
    /// Starts the transport: over a broker, checks the settings, connects
    /// and declares the exchange and every handler's queue (so an
    /// unreachable or refusing broker stops the bus's start).
    pub(crate) async fn start(
        config: &BusConfig,
        modules: &[ModuleHandle<B>],
        handlers: &[(ModuleHandle<B>, usize)],
    ) -> Result<Self> {
        let _ = (config, modules, handlers);
        #[cfg(feature = "amqp")]
        if let Some(amqp) = &config.amqp {
            amqp.validate()?;
            let queues: Vec<_> = handlers
                .iter()
                .map(|(module, index)| {
                    let entry = &module.core.handlers.entries[*index];
                    let queue = topology::HandlerQueue {
                        name: amqp.queue(module.name(), &entry.name),
                        topic: entry.handler.topic(),
                    };
                    let stats = ConsumerStats::new(module.name(), &entry.name, &queue.name);
                    (module.clone(), *index, queue, Arc::new(stats))
                })
                .collect();
            let declared: Vec<_> = queues
                .iter()
                .map(|(_, _, queue, _)| queue.clone())
                .collect();
            topology::declare_all(amqp, &declared)
                .await
                .map_err(|fault| fault.into_error(amqp.redacted_url()))?;
            let names: Vec<String> = modules.iter().map(|m| m.name().to_string()).collect();
            tracing::info!(broker = %amqp.redacted_url(), exchange = %amqp.exchange(), queues = queues.len(), "connected to the message broker");
            return Ok(Transport {
                broker: Some(Broker {
                    relay: Arc::new(Relay::new(amqp.clone(), &names)),
                    amqp: amqp.clone(),
                    queues,
                }),
                backend: PhantomData,
            });
        }
        Ok(Transport {
            #[cfg(feature = "amqp")]
            broker: None,
            backend: PhantomData,
        })
    }

    /// Where each topic's messages go: to the broker, or to the handlers
    /// subscribed to it on this bus.
    pub(crate) fn routes(
        &self,
        published: &HashSet<&'static str>,
        handlers: &[(ModuleHandle<B>, usize)],
    ) -> HashMap<String, Vec<Route<B>>> {
        let _ = published;
        #[cfg(feature = "amqp")]
        if let Some(broker) = &self.broker {
            return published
                .iter()
                .map(|topic| {
                    let route = Route::Broker {
                        relay: broker.relay.clone(),
                        retry: crate::retry::RetryPolicy {
                            max_attempts: None,
                            ..crate::retry::RetryPolicy::default()
                        },
                    };
                    (topic.to_string(), vec![route])
                })
                .collect();
        }
        let mut routes: HashMap<String, Vec<Route<B>>> = HashMap::new();
        for (module, index) in handlers {
            let topic = module.core.handlers.entries[*index].handler.topic();
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

    /// The subscriptions to `module`'s outbox this bus serves: its handlers
    /// of the topics the module publishes; over a broker, the relay, once
    /// per topic.
    pub(crate) fn served(
        &self,
        module: &ModuleHandle<B>,
        handlers: &[(ModuleHandle<B>, usize)],
    ) -> Vec<Served> {
        let publishes = &module.core.outbox.publishes;
        #[cfg(feature = "amqp")]
        if let Some(broker) = &self.broker {
            let relay: Arc<str> = Arc::from(format!("amqp {}", broker.amqp.exchange()));
            return publishes
                .iter()
                .map(|topic| Served::new(relay.clone(), Arc::from(format!("relay {topic}")), topic))
                .collect();
        }
        handlers
            .iter()
            .filter_map(|(subscriber, index)| {
                let entry = &subscriber.core.handlers.entries[*index];
                let topic = entry.handler.topic();
                publishes
                    .contains(topic)
                    .then(|| Served::new(subscriber.core.name.clone(), entry.name.clone(), topic))
            })
            .collect()
    }

    /// The tasks the bus runs beside its dispatchers: over a broker, one
    /// consumer per handler.
    pub(crate) fn tasks(&self, bus: &Arc<BusCore<B>>) -> Vec<Task> {
        let _ = bus;
        #[cfg(feature = "amqp")]
        if let Some(broker) = &self.broker {
            return broker
                .queues
                .iter()
                .map(|(module, handler, queue, stats)| {
                    Box::pin(consumer::run(
                        bus.clone(),
                        broker.amqp.clone(),
                        module.clone(),
                        *handler,
                        queue.clone(),
                        stats.clone(),
                    )) as Task
                })
                .collect();
        }
        Vec::new()
    }

    /// The relay and the consumers' figures, for the bus's state.
    #[cfg(feature = "amqp")]
    pub(crate) fn broker_state(&self) -> Option<BrokerState> {
        self.broker.as_ref().map(|broker| BrokerState {
            relay: broker.relay.clone(),
            consumers: broker
                .queues
                .iter()
                .map(|(.., stats)| stats.clone())
                .collect(),
        })
    }
}
