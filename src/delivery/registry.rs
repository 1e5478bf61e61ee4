//! A module's registered handlers (the registry), with what their
//! deliveries need: the module's database and outbox (a handler's transaction may publish).

use crate::delivery::batch_queue::BatchQueue;
use crate::delivery::handler::ErasedHandler;
use crate::effects::journal::Journal;
use crate::error::Result;
use crate::metrics::HandlerCounters;
use crate::outbox::Outbox;
use crate::retry::RetryPolicy;
use crate::store::backend::Backend;
use crate::store::database::Database;
use crate::tx::{Mode, Tx};
use std::sync::Arc;
use std::time::Duration;

/// A handler's place among its module's handlers: how the bus, the module
/// actor and a batch name one handler of a module (typed, so that it is
/// never mistaken for a count or another index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct HandlerIndex(usize);

impl HandlerIndex {
    /// The `n`-th handler registered, from 0.
    pub(crate) fn nth(n: usize) -> Self {
        HandlerIndex(n)
    }
}

/// A registered handler.
pub(crate) struct HandlerEntry<B: Backend> {
    /// Its name, half of the inbox key.
    pub(crate) name: Arc<str>,
    /// The handler, its message type erased.
    pub(crate) handler: Arc<dyn ErasedHandler<B>>,
    /// Overrides the bus's retry policy for this handler.
    pub(crate) retry: Option<RetryPolicy>,
    /// How long one of its deliveries may take, BEGIN to COMMIT, when it
    /// says (the module's transaction deadline otherwise).
    pub(crate) deadline: Option<Duration>,
    /// Most messages handled in one transaction (1: no batching).
    pub(crate) max_batch: usize,
    /// Where deliveries wait for a batch, when `max_batch` is above 1.
    pub(crate) batches: Option<BatchQueue>,
    /// What its deliveries did.
    pub(crate) counters: HandlerCounters,
}

/// The handlers of one module and the parts of the module their deliveries
/// run on.
pub(crate) struct Handlers<B: Backend> {
    /// The module's name.
    pub(crate) module: Arc<str>,
    /// Where each delivery's transaction runs.
    pub(crate) db: Arc<Database<B>>,
    /// Where the messages a handler publishes go.
    pub(crate) outbox: Arc<Outbox>,
    /// The handlers, in registration order (named by [`HandlerIndex`]).
    pub(crate) entries: Vec<HandlerEntry<B>>,
    /// The module's effects journal, which each delivery's effects use.
    pub(crate) journal: Arc<Journal<B>>,
}

impl<B: Backend> Handlers<B> {
    /// Begins a delivery's write transaction on the module's database.
    pub(crate) async fn begin(&self) -> Result<Tx<B>> {
        Tx::begin(&self.db, self.outbox.clone(), Mode::Write).await
    }

    /// The handler at `index`.
    pub(crate) fn get(&self, index: HandlerIndex) -> &HandlerEntry<B> {
        &self.entries[index.0]
    }

    /// Every handler, with its index, in registration order.
    pub(crate) fn indexed(&self) -> impl Iterator<Item = (HandlerIndex, &HandlerEntry<B>)> {
        self.entries
            .iter()
            .enumerate()
            .map(|(index, entry)| (HandlerIndex(index), entry))
    }

    /// How long a delivery to `handler` may take.
    pub(crate) fn deadline(&self, handler: HandlerIndex) -> Duration {
        self.get(handler)
            .deadline
            .unwrap_or(self.db.deadlines.transaction)
    }

    /// The index of the handler named `name`.
    pub(crate) fn position(&self, name: &str) -> Option<HandlerIndex> {
        self.entries
            .iter()
            .position(|h| &*h.name == name)
            .map(HandlerIndex)
    }
}
