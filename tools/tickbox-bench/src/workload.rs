//! The workload's message and its handler.

use crate::backend::BenchBackend;
use crate::clock::Clock;
use serde::{Deserialize, Serialize};
use std::sync::{Arc, RwLock};
use tickbox::{Delivery, Handler, HandlerError, Message, Tx};

/// The handler's name: half of every inbox key (also used for prefilled rows).
pub(crate) const HANDLER: &str = "ledger.record";

/// The one message type of the workload. `n` numbers the message in the
/// process (business keys are unique across the runs of one process).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Work {
    /// The message's number, and the key of both business rows.
    pub(crate) n: u64,
}

impl Message for Work {
    const TOPIC: &'static str = "bench.work";
}

/// The producer's business row's note for message `n`.
pub(crate) fn note(n: u64) -> String {
    format!("order {n}")
}

/// The clock of the run under way, swapped by each run on a pair of modules
/// (the handler is registered once, when the consumer module starts).
pub(crate) type CurrentClock = Arc<RwLock<Arc<Clock>>>;

/// The consumer's handler: one business row per message, in the
/// inbox-guarded transaction; it stamps its own end on the run's clock.
pub(crate) struct Record {
    /// The clock of the run under way.
    pub(crate) clock: CurrentClock,
}

impl<B: BenchBackend> Handler<B> for Record {
    type Message = Work;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        work: Work,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let id = delivery.envelope.id;
        B::insert_change(tx.conn(), work.n as i64, id).await?;
        let clock = self.clock.read().unwrap_or_else(|p| p.into_inner()).clone();
        clock.handler_ended(work.n, id);
        Ok(())
    }
}
