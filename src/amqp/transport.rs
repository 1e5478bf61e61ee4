//! RabbitMQ as the bus's broker: [`Amqp`] settings connect into an
//! [`AmqpTransport`], which publishes through the relay and runs one
//! consumer per handler. What the bus asks of a broker is
//! [`Transport`]; this file is the only place that answers it.

use crate::amqp::consumer;
use crate::amqp::relay::Relay;
use crate::amqp::settings::Amqp;
use crate::amqp::state::{BrokerState, ConsumerStats};
use crate::amqp::topology::{self, HandlerQueue};
use crate::bus::transport::{Broker, Connect, HandlerId, Inbound, Pacing, Task, Transport};
use crate::error::outcome::DeliveryError;
use crate::error::Result;
use crate::message::Envelope;
use crate::metrics::BrokerMetrics;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

impl From<Amqp> for Broker {
    fn from(amqp: Amqp) -> Self {
        Broker::new(amqp)
    }
}

impl Connect for Amqp {
    fn connect<'a>(
        &'a self,
        outboxes: &'a [Arc<str>],
        handlers: &'a [HandlerId],
    ) -> BoxFuture<'a, Result<Arc<dyn Transport>>> {
        Box::pin(async move {
            self.validate()?;
            let queues: Vec<HandlerQueue> = handlers
                .iter()
                .map(|id| HandlerQueue {
                    name: self.queue(&id.module, &id.handler),
                    topic: id.topic,
                })
                .collect();
            topology::declare_all(self, &queues)
                .await
                .map_err(|fault| fault.into_error(self.redacted_url()))?;
            tracing::info!(broker = %self.redacted_url(), exchange = %self.exchange(), queues = queues.len(), "connected to the message broker");
            let names: Vec<String> = outboxes.iter().map(|name| name.to_string()).collect();
            let consumers = handlers
                .iter()
                .zip(&queues)
                .map(|(id, queue)| {
                    Arc::new(ConsumerStats::new(&id.module, &id.handler, &queue.name))
                })
                .collect();
            let transport: Arc<dyn Transport> = Arc::new(AmqpTransport {
                subscriber: Arc::from(format!("amqp {}", self.exchange())),
                state: BrokerState {
                    relay: Arc::new(Relay::new(self.clone(), &names)),
                    consumers,
                },
                amqp: self.clone(),
                queues,
            });
            Ok(transport)
        })
    }
}

/// A bus's RabbitMQ broker: the relay publishing its outboxes' messages
/// and the queues its handlers consume.
pub(crate) struct AmqpTransport {
    /// Where and how.
    amqp: Amqp,
    /// The relay's name in the subscriptions (`amqp <exchange>`).
    subscriber: Arc<str>,
    /// The relay and each consumer's figures.
    state: BrokerState,
    /// Each handler's queue, in the order the bus named the handlers.
    queues: Vec<HandlerQueue>,
}

impl Transport for AmqpTransport {
    fn subscriber(&self) -> Arc<str> {
        self.subscriber.clone()
    }

    fn publish<'a>(
        &'a self,
        source: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, std::result::Result<(), DeliveryError>> {
        Box::pin(async move {
            let relay = &self.state.relay;
            relay.publish(source, envelope).await.map_err(|not_sent| {
                DeliveryError::broker(not_sent.into_error(relay, &envelope.topic))
            })
        })
    }

    fn consume(
        &self,
        inbound: Vec<Arc<dyn Inbound>>,
        stop: CancellationToken,
        pacing: Pacing,
    ) -> Vec<Task> {
        inbound
            .into_iter()
            .zip(&self.queues)
            .zip(&self.state.consumers)
            .map(|((inbound, queue), stats)| {
                Box::pin(consumer::run(
                    self.amqp.clone(),
                    inbound,
                    queue.clone(),
                    stats.clone(),
                    stop.clone(),
                    pacing,
                )) as Task
            })
            .collect()
    }

    fn in_flight(&self) -> usize {
        self.state.in_flight()
    }

    fn queued(&self) -> BoxFuture<'_, Result<u64>> {
        Box::pin(self.state.queued())
    }

    fn report(&self) -> BrokerMetrics {
        self.state.snapshot()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.state.relay.close())
    }
}
