//! Batched handling: deliveries to one handler that are waiting at the same
//! time run in one transaction, with one COMMIT for all of them, and fall
//! back to one transaction each when any of them fails.

use crate::backend::Backend;
use crate::inbox::{self, delivery_span, observe, DeliveryError, Outcome};
use crate::module::{Deliver, ModuleCore};
use crate::tx::{Mode, Tx};
use std::sync::{Arc, Weak};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tracing::{Instrument, Span};

/// Where the deliveries to one batched handler wait for their transaction.
pub(crate) struct BatchQueue {
    sender: mpsc::UnboundedSender<Waiting>,
}

/// A delivery waiting for a batch, and where its outcome goes.
pub(crate) struct Waiting {
    deliver: Deliver,
    reply: oneshot::Sender<Result<Outcome, DeliveryError>>,
}

impl BatchQueue {
    /// A queue, and its receiving end for [`run_batches`]. Unbounded: the
    /// bus's limit on concurrent deliveries bounds it.
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<Waiting>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (BatchQueue { sender }, receiver)
    }

    /// Queues a delivery and waits for the outcome of its transaction.
    pub(crate) async fn submit(&self, deliver: Deliver) -> Result<Outcome, DeliveryError> {
        let (reply, outcome) = oneshot::channel();
        if self.sender.send(Waiting { deliver, reply }).is_err() {
            return Err(DeliveryError::stopped("the module stopped taking batches"));
        }
        outcome.await.unwrap_or_else(|_| {
            Err(DeliveryError::stopped(
                "the module stopped before the batch ended",
            ))
        })
    }
}

/// Takes the waiting deliveries of one handler in batches of up to its
/// `max_batch`, running up to `at_once` batch transactions at a time, for as
/// long as the module exists.
///
/// A batch is taken when a transaction slot is free, so a lone delivery runs
/// at once and batches grow only while transactions are busy: batching never
/// adds latency of its own.
pub(crate) async fn run_batches<B: Backend>(
    module: Weak<ModuleCore<B>>,
    handler: usize,
    mut waiting: mpsc::UnboundedReceiver<Waiting>,
    at_once: usize,
) {
    let slots = Arc::new(Semaphore::new(at_once));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = waiting.recv().await else {
            return;
        };
        let Some(module) = module.upgrade() else {
            return;
        };
        let max = module.handlers[handler].max_batch;
        let mut batch = vec![first];
        while batch.len() < max {
            match waiting.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        // Its own task: a transaction is never dropped half way.
        tokio::spawn(async move {
            handle_batch(module, batch).await;
            drop(slot);
        });
    }
}

/// Handles a batch in one transaction, or each of its deliveries in its own
/// when that fails.
async fn handle_batch<B: Backend>(module: Arc<ModuleCore<B>>, mut batch: Vec<Waiting>) {
    if batch.len() == 1 {
        let Waiting { deliver, reply } = batch.remove(0);
        let _ = reply.send(inbox::guard(module, deliver).await);
        return;
    }
    // Inbox rows are written in id order, so two batches holding some of the
    // same messages wait for each other instead of deadlocking.
    batch.sort_by_key(|waiting| waiting.deliver.envelope.id);
    let started = Instant::now();
    let spans: Vec<Span> = batch
        .iter()
        .map(|waiting| delivery_span(&module, &waiting.deliver))
        .collect();
    let counters = &module.handlers[batch[0].deliver.handler].counters;
    match in_one_transaction(&module, &batch, &spans).await {
        Ok(outcomes) => {
            counters.batch_committed();
            for ((waiting, span), outcome) in batch.into_iter().zip(spans).zip(outcomes) {
                let result = Ok(outcome);
                observe(&module, &waiting.deliver, &span, started, &result);
                let _ = waiting.reply.send(result);
            }
        }
        Err(error) => {
            counters.batch_fell_back();
            tracing::debug!(module = %module.name, size = batch.len(), %error, "a batch rolled back; handling its messages one at a time");
            for waiting in batch {
                let result = inbox::guard(module.clone(), waiting.deliver).await;
                let _ = waiting.reply.send(result);
            }
        }
    }
}

/// BEGIN; each delivery through the inbox guard's steps; COMMIT. The first
/// failure rolls everything back.
async fn in_one_transaction<B: Backend>(
    module: &Arc<ModuleCore<B>>,
    batch: &[Waiting],
    spans: &[Span],
) -> Result<Vec<Outcome>, DeliveryError> {
    let mut tx = Tx::begin(module.clone(), Mode::Write)
        .await
        .map_err(DeliveryError::database)?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for (waiting, span) in batch.iter().zip(spans) {
        let handled = inbox::handle_in(&mut tx, &waiting.deliver)
            .instrument(span.clone())
            .await;
        match handled {
            Ok(outcome) => outcomes.push(outcome),
            Err(error) => {
                tx.rollback().await;
                return Err(error);
            }
        }
    }
    tx.commit().await.map_err(DeliveryError::database)?;
    Ok(outcomes)
}
