//! The bus actor: runs one dispatcher per module outbox until stopped.
//!
//! What it owns: its dispatchers and, over a broker, the broker's
//! consumers — the tasks themselves, started when the actor starts and
//! awaited when it is asked to stop — and, through the bus's state, the
//! one cancellation token every one of them stops on (consumers on child
//! tokens of it). Stopping cancels the token, waits for the tasks, then
//! closes the broker's connections.

use crate::bus::builder::BusBuilder;
use crate::bus::core::BusCore;
use crate::bus::dispatcher::Dispatcher;
use crate::bus::transport::Task;
use crate::store::backend::Backend;
use actix::{Actor, ActorContext, Addr, Context, ResponseFuture};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// The bus: an actor running one dispatcher per module outbox, started with
/// [`Bus::builder`] and stopped with [`BusHandle::stop`](crate::BusHandle::stop).
pub struct Bus<B: Backend> {
    /// The state its dispatchers share.
    core: Arc<BusCore<B>>,
    /// Dispatchers not yet started (they start with the actor).
    dispatchers: Vec<Dispatcher<B>>,
    /// Tasks not yet started that run beside the dispatchers (a broker's
    /// consumers).
    tasks: Vec<Task>,
    /// The running dispatchers and tasks.
    running: Vec<JoinHandle<()>>,
}

impl<B: Backend> Bus<B> {
    /// Starts building a bus; see [`BusBuilder`].
    pub fn builder() -> BusBuilder<B> {
        BusBuilder::default()
    }

    /// Starts the actor, which starts the dispatchers.
    pub(crate) fn start_with(
        core: Arc<BusCore<B>>,
        dispatchers: Vec<Dispatcher<B>>,
        tasks: Vec<Task>,
    ) -> Addr<Self> {
        Bus {
            core,
            dispatchers,
            tasks,
            running: Vec::new(),
        }
        .start()
    }
}

impl<B: Backend> Actor for Bus<B> {
    type Context = Context<Self>;

    fn started(&mut self, _: &mut Context<Self>) {
        self.running = self
            .dispatchers
            .drain(..)
            .map(|d| tokio::spawn(d.run()))
            .chain(self.tasks.drain(..).map(tokio::spawn))
            .collect();
    }
}

/// Asks the bus actor to stop: no new deliveries start, running ones may
/// finish within the stop timeout, everything else stays pending in the
/// outboxes for the next start.
#[derive(Debug)]
pub(crate) struct Stop;

impl actix::Message for Stop {
    type Result = ();
}

impl<B: Backend> actix::Handler<Stop> for Bus<B> {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Stop, ctx: &mut Context<Self>) -> Self::Result {
        self.core.stop();
        let running = std::mem::take(&mut self.running);
        ctx.stop();
        let core = self.core.clone();
        Box::pin(async move {
            for dispatcher in running {
                let _ = dispatcher.await;
            }
            if let Some(transport) = &core.transport {
                transport.close().await;
            }
        })
    }
}
