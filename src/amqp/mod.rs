//! The RabbitMQ transport (feature `amqp`): the same modules, handlers,
//! transactions and inbox guard, with the broker as the hop between an
//! outbox and a handler.
//!
//! - `settings` — [`Amqp`](settings::Amqp), what a bus needs to reach the
//!   broker and how long it waits for it (heartbeat, call and confirm
//!   deadlines; their defaults and why are listed there).
//! - `link` — one connection to the broker, whose socket is released
//!   whenever it is given up, and the deadline every broker call runs
//!   under.
//! - `topology` — the exchange, the queues and their bindings, declared by
//!   tickbox, and their names; a queue as the broker reports it (the work
//!   behind [`Amqp::queue_status`](settings::Amqp::queue_status)).
//! - `wire` — an [`Envelope`](crate::Envelope) as an AMQP message and back.
//! - `relay` — publishes outbox messages with publisher confirms.
//! - `consumer` — one per handler: runs each message through the inbox
//!   guard and acknowledges it after COMMIT.
//! - `acks` — a consumer's acknowledgements, coalesced into `multiple` acks
//!   that cover only finished deliveries.
//! - `state` — the relay and consumers of a running bus, and their figures.
//! - `transport` — RabbitMQ as the bus's broker: the one place that
//!   implements the bus's transport interface.
//! - `fault` — sorts the client's errors into unreachable and refused.

pub(crate) mod acks;
pub(crate) mod consumer;
pub(crate) mod fault;
pub(crate) mod link;
pub(crate) mod relay;
pub(crate) mod settings;
pub(crate) mod state;
pub(crate) mod topology;
pub(crate) mod transport;
pub(crate) mod wire;
