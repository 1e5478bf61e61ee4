//! The bus: delivers every committed outbox message at least once to every
//! subscribed handler — one dispatcher per outbox, fanning each message out
//! to its routes.
//!
//! One story for tasks and stopping: every task of the bus — dispatchers,
//! their statements, deliveries, a broker's consumers — runs on the actor
//! system's thread and is spawned with `actix::spawn` (the bus starts only
//! inside an actor system, and its futures then need not be `Send`); each
//! stops on the bus's one [`CancellationToken`](tokio_util::sync::CancellationToken)
//! (`BusCore::stop`), which is passed down, never the bus itself. Code that
//! may run outside an actor system (application transactions, the
//! operator's tool, connection drivers) spawns with `tokio::spawn`.

pub(crate) mod actor;
pub(crate) mod attempts;
pub(crate) mod builder;
pub(crate) mod config;
pub(crate) mod core;
pub(crate) mod dispatcher;
#[cfg(feature = "testing")]
pub(crate) mod duplicates;
pub(crate) mod handle;
pub(crate) mod lanes;
pub(crate) mod route;
pub(crate) mod transport;
