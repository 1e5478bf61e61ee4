//! Modules: a part of the application with its own database, outbox, inbox
//! and handlers, run by an actor.

pub(crate) mod actor;
pub(crate) mod builder;
pub(crate) mod core;
pub(crate) mod dead_letters;
pub(crate) mod handle;
pub(crate) mod scheduled;
pub(crate) mod subscriptions;
pub(crate) mod sweep;
