//! The module actor: runs the deliveries the bus asks for, each in its own
//! task, so one slow handler never holds up the mailbox.
//!
//! What it owns, and why no more: the module's parts ([`ModuleCore`]: the
//! pool, the outbox, the handlers and their batch queues) are shared with
//! the module's handles, which run application transactions without the
//! actor, and the mailbox counters live there so that the handles can
//! read them; the actor owns its mailbox and the deliveries it has
//! started, each a task of its own (spawned with `tokio::spawn`, like
//! every task of the bus: see `bus`), so that a
//! transaction is never dropped half way when its caller stops waiting.
//! Nothing durable is ever only in the mailbox: a delivery lost with it
//! is still pending in its outbox, and is delivered again.

use crate::delivery::attempt::Attempt;
use crate::delivery::guard::guard;
use crate::error::outcome::{DeliveryError, Outcome};
use crate::module::builder::ModuleBuilder;
use crate::module::core::ModuleCore;
use crate::store::backend::Backend;
use actix::{Actor, Context, MessageResult};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// A module: an actor the bus sends one delivery per handler and message;
/// it runs each delivery through the inbox guard in its own task, so one slow
/// handler never holds up the mailbox.
pub struct Module<B: Backend> {
    /// The module it runs the deliveries of.
    pub(crate) core: Arc<ModuleCore<B>>,
}

impl<B: Backend> Module<B> {
    /// Starts building a module; see [`ModuleBuilder`].
    pub fn builder(name: impl Into<String>, url: impl Into<String>) -> ModuleBuilder<B> {
        ModuleBuilder::new(name, url)
    }
}

impl<B: Backend> Actor for Module<B> {
    type Context = Context<Self>;
}

/// Asks a module actor to run one delivery of a message to one of its
/// handlers. Sent by the bus.
#[derive(Debug, Clone)]
pub(crate) struct Deliver(pub(crate) Attempt);

impl actix::Message for Deliver {
    /// The delivery's task, whose output is how the delivery ended.
    type Result = JoinHandle<std::result::Result<Outcome, DeliveryError>>;
}

impl<B: Backend> actix::Handler<Deliver> for Module<B> {
    type Result = MessageResult<Deliver>;

    /// Starts the delivery in a task of its own, so that a transaction is
    /// never dropped half way, even if the caller stops waiting, and answers
    /// at once with the task's handle, which the caller awaits. (Answering
    /// with the outcome would take one more task per delivery: actix runs
    /// a `ResponseFuture` as a task of its own, only to wait for this one.)
    fn handle(&mut self, Deliver(attempt): Deliver, _: &mut Context<Self>) -> Self::Result {
        let running = Running::new(self.core.clone());
        // Boxed, as the bus's tasks: moved whole, a large future costs a
        // copy at each change of the task's stage.
        MessageResult(tokio::spawn(Box::pin(deliver(running, attempt))))
    }
}

/// Runs one delivery: in its handler's batch queue, or alone through the
/// inbox guard.
async fn deliver<B: Backend>(
    running: Running<B>,
    attempt: Attempt,
) -> std::result::Result<Outcome, DeliveryError> {
    let handlers = &running.0.handlers;
    match handlers.get(attempt.handler).batches.as_ref() {
        // A retry runs alone: a message that failed once fails a whole
        // batch too often.
        Some(batches) if attempt.attempt == 1 => batches.submit(attempt).await,
        _ => guard(handlers.clone(), attempt).await,
    }
}

/// A delivery the actor has started, counted in its module's mailbox until
/// it ends, however it ends.
struct Running<B: Backend>(Arc<ModuleCore<B>>);

impl<B: Backend> Running<B> {
    fn new(core: Arc<ModuleCore<B>>) -> Self {
        core.mailbox.started();
        Running(core)
    }
}

impl<B: Backend> Drop for Running<B> {
    fn drop(&mut self) {
        self.0.mailbox.finished();
    }
}
