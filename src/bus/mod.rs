//! The bus: delivers every committed outbox message at least once to every
//! subscribed handler — one dispatcher per outbox, fanning each message out
//! to its routes.

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
