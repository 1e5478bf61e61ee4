//! The seam between the bus and a message broker: the one interface a
//! broker implements (in a folder of its own, `amqp/` for RabbitMQ), and
//! the bus's side of it.
//!
//! Without a broker the bus hands each committed message to the handlers
//! of its modules in this process ([`Route::Handler`]). Over a broker, every
//! topic has one route, the broker ([`Route::Broker`]), which
//! [publishes](Transport::publish) the message; each handler of the bus's
//! modules then gets its messages from the broker's
//! [consumers](Transport::consume), which hand each to the bus through an
//! [`Inbound`]: the same retries, dead letters, ordering and inbox guard as
//! in one process. A broker knows the bus only through this file, and the
//! bus knows a broker only through [`Transport`].

use crate::bus::attempts::{deliver_to_route, record_dead_letter, RouteEnd};
use crate::bus::core::BusCore;
#[cfg(feature = "testing")]
use crate::bus::duplicates::maybe_inject_duplicate;
use crate::bus::route::Route;
use crate::error::outcome::DeliveryError;
use crate::error::Result;
use crate::message::Envelope;
use crate::metrics::BrokerMetrics;
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;
use futures_util::future::BoxFuture;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// A task the bus runs beside its dispatchers until it stops.
pub(crate) type Task = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A message broker a bus can run over, made from the broker's settings
/// (with the `amqp` feature, [`Amqp`](crate::Amqp) converts into it) and
/// given to [`BusBuilder::broker`](crate::BusBuilder::broker).
#[derive(Clone)]
pub struct Broker(Arc<dyn Connect>);

impl Broker {
    /// The broker whose settings are `settings`.
    #[allow(
        dead_code,
        reason = "only a broker calls it; each is behind a feature of its own"
    )]
    pub(crate) fn new(settings: impl Connect) -> Self {
        Broker(Arc::new(settings))
    }

    /// Checks the settings, connects, and declares what `handlers` need.
    pub(crate) async fn connect(
        &self,
        outboxes: &[Arc<str>],
        handlers: &[HandlerId],
    ) -> Result<Arc<dyn Transport>> {
        self.0.connect(outboxes, handlers).await
    }
}

impl fmt::Debug for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A broker's settings: how to reach it. Implemented by each broker.
pub(crate) trait Connect: fmt::Debug + Send + Sync + 'static {
    /// Checks the settings, connects, and declares the broker's side of
    /// the outboxes named `outboxes` (where they publish) and of every
    /// handler in `handlers` (where each receives), so that an unreachable
    /// or refusing broker stops the bus's start.
    fn connect<'a>(
        &'a self,
        outboxes: &'a [Arc<str>],
        handlers: &'a [HandlerId],
    ) -> BoxFuture<'a, Result<Arc<dyn Transport>>>;
}

/// A connected broker, as the bus uses it while it runs.
pub(crate) trait Transport: Send + Sync + 'static {
    /// The name under which the broker is recorded as the subscriber of
    /// every topic of the bus's outboxes (`amqp <exchange>`).
    fn subscriber(&self) -> Arc<str>;

    /// Publishes a message of outbox `source`; `Ok` once the broker has
    /// taken responsibility for it (over RabbitMQ, confirmed).
    fn publish<'a>(
        &'a self,
        source: &'a str,
        envelope: &'a Envelope,
    ) -> BoxFuture<'a, std::result::Result<(), DeliveryError>>;

    /// The consumers, one per handler, in the order of the `handlers` the
    /// broker was connected with: each runs until `stop` is cancelled,
    /// handing each message it takes to its [`Inbound`].
    fn consume(
        &self,
        inbound: Vec<Arc<dyn Inbound>>,
        stop: CancellationToken,
        pacing: Pacing,
    ) -> Vec<Task>;

    /// Messages the consumers hold, taken and not yet acknowledged.
    fn in_flight(&self) -> usize;

    /// Messages waiting in the handlers' queues, read from the broker now.
    fn queued(&self) -> BoxFuture<'_, Result<u64>>;

    /// The broker's figures, for a snapshot of the bus's.
    fn report(&self) -> BrokerMetrics;

    /// Closes the broker's connections, once the bus has stopped.
    fn close(&self) -> BoxFuture<'_, ()>;
}

/// A handler of the bus, as a broker names it: its module, its name and
/// the topic it receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HandlerId {
    /// The handler's module.
    pub(crate) module: Arc<str>,
    /// The handler's name, half of the inbox key.
    pub(crate) handler: Arc<str>,
    /// The topic it receives.
    pub(crate) topic: &'static str,
}

/// How a consumer paces the work beside its messages.
#[allow(
    dead_code,
    reason = "only a broker calls it; each is behind a feature of its own"
)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pacing {
    /// How often it samples its queue's depth (the bus's scan interval).
    pub(crate) sample_every: Duration,
    /// How long, once stopped, it lets running deliveries finish.
    pub(crate) drain_within: Duration,
}

/// Where a broker's consumer hands the messages it takes: one handler of
/// the bus, with the bus's retries, ordering and dead letters.
#[allow(
    dead_code,
    reason = "only a broker calls it; each is behind a feature of its own"
)]
pub(crate) trait Inbound: Send + Sync + 'static {
    /// Runs `envelope` through the handler until it is handled, found a
    /// duplicate or recorded as a dead letter (true: acknowledge it), or
    /// the bus stops (false: the broker gives it again).
    fn deliver(&self, envelope: Envelope) -> BoxFuture<'_, bool>;

    /// Records `envelope`, which the handler cannot take, as a dead letter
    /// of the handler's module, with `reason`; false if the bus stopped
    /// first.
    fn refuse(&self, envelope: Envelope, reason: String) -> BoxFuture<'_, bool>;
}

/// The bus's [`Inbound`] for one of its handlers.
#[allow(
    dead_code,
    reason = "only a broker calls it; each is behind a feature of its own"
)]
pub(crate) struct HandlerInbound<B: Backend> {
    /// The bus, for its retry policy, its slots and its stop.
    pub(crate) bus: Arc<BusCore<B>>,
    /// The handler's module.
    pub(crate) module: ModuleHandle<B>,
    /// The handler, as a route of the bus.
    pub(crate) route: Route<B>,
    /// The handler's names.
    pub(crate) id: HandlerId,
}

impl<B: Backend> Inbound for HandlerInbound<B> {
    fn deliver(&self, envelope: Envelope) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            if envelope.topic != self.id.topic {
                let reason = format!(
                    "a message of topic `{}` reached the queue of handler `{}` (subscribed to `{}`); \
                     it is bound by hand, or the handler's topic changed",
                    envelope.topic, self.id.handler, self.id.topic
                );
                return self.refuse(envelope, reason).await;
            }
            let envelope = Arc::new(envelope);
            match deliver_to_route(&self.bus, &self.route, &self.module, &envelope).await {
                RouteEnd::Handled => {
                    #[cfg(feature = "testing")]
                    maybe_inject_duplicate(&self.bus, vec![&self.route], &self.module, &envelope)
                        .await;
                    true
                }
                RouteEnd::DeadLettered => true,
                RouteEnd::Stopped => false,
            }
        })
    }

    fn refuse(&self, envelope: Envelope, reason: String) -> BoxFuture<'_, bool> {
        Box::pin(async move {
            record_dead_letter(
                &self.bus,
                &self.module,
                &envelope,
                &self.id.handler,
                0,
                &reason,
                None,
            )
            .await
        })
    }
}
