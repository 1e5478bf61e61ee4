//! The bus: delivers every committed outbox message at least once to every
//! subscribed handler — one dispatcher per outbox, fanning each message out
//! to its routes.
//!
//! One story for tasks and stopping: every task tickbox starts —
//! dispatchers, their statements, deliveries, batches, a broker's
//! consumers, application transactions, connection drivers — is spawned
//! with `tokio::spawn` (all their futures are `Send`). On the actor
//! system's current-thread runtime that puts the task straight on the
//! runtime's scheduler rather than in `actix::spawn`'s local set, and it
//! works the same outside an actor system (the operator's tool). Each task
//! of the bus stops on the bus's one
//! [`CancellationToken`](tokio_util::sync::CancellationToken)
//! (`BusCore::stop`), passed down (a child token per consumer), never on
//! the bus itself.

pub(crate) mod actor;
pub(crate) mod attempts;
pub(crate) mod builder;
pub(crate) mod config;
pub(crate) mod core;
pub(crate) mod dispatcher;
#[cfg(feature = "testing")]
pub(crate) mod duplicates;
pub(crate) mod handle;
pub(crate) mod id_hash;
pub(crate) mod lanes;
pub(crate) mod route;
pub(crate) mod transport;
