//! Batched handling: deliveries to one handler that are waiting at the same
//! time run in one transaction, with one COMMIT for all of them, and fall
//! back to one transaction each when any of them fails.

use crate::delivery::batch_queue::Waiting;
use crate::delivery::guard::{delivery_span, guard, handle_in, observe};
use crate::delivery::registry::{HandlerIndex, Handlers};
use crate::error::outcome::{DeliveryError, Outcome};
use crate::store::backend::Backend;
use std::sync::{Arc, Weak};
use std::time::Instant;
use tokio::sync::{mpsc, Semaphore};
use tracing::{Instrument, Span};

/// Takes the waiting deliveries of one handler in batches of up to its
/// `max_batch`, running up to `at_once` batch transactions at a time, for as
/// long as the module exists.
///
/// A batch is taken when a transaction slot is free, so a lone delivery runs
/// at once and batches grow only while transactions are busy: batching never
/// adds latency of its own.
pub(crate) async fn run_batches<B: Backend>(
    handlers: Weak<Handlers<B>>,
    handler: HandlerIndex,
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
        let Some(handlers) = handlers.upgrade() else {
            return;
        };
        let max = handlers.get(handler).max_batch;
        let mut batch = vec![first];
        while batch.len() < max {
            match waiting.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        // Its own task: a transaction is never dropped half way.
        tokio::spawn(async move {
            handle_batch(handlers, batch).await;
            drop(slot);
        });
    }
}

/// Handles a batch in one transaction, or each of its deliveries in its own
/// when that fails.
async fn handle_batch<B: Backend>(handlers: Arc<Handlers<B>>, mut batch: Vec<Waiting>) {
    if batch.len() == 1 {
        let Waiting { attempt, reply } = batch.remove(0);
        let _ = reply.send(guard(handlers, attempt).await);
        return;
    }
    // Inbox rows are written in id order, so two batches holding some of the
    // same messages wait for each other instead of deadlocking.
    batch.sort_by_key(|waiting| waiting.attempt.envelope.id);
    let started = Instant::now();
    #[cfg(feature = "opentelemetry")]
    let batch_span = {
        let first = &batch[0].attempt;
        let entry = handlers.get(first.handler);
        crate::trace::spans::process_batch(
            &first.envelope.topic,
            crate::trace::spans::Processing {
                module: &handlers.module,
                handler: &entry.name,
                attempt: 1,
                system: first.envelope.messaging_system,
                causation_id: None,
            },
            batch
                .iter()
                .map(|waiting| waiting.attempt.envelope.trace_context.as_ref()),
            batch.len(),
        )
    };
    #[cfg(feature = "opentelemetry")]
    let in_batch = Some(&batch_span);
    #[cfg(not(feature = "opentelemetry"))]
    let in_batch = None;
    let spans: Vec<Span> = batch
        .iter()
        .map(|waiting| delivery_span(&handlers, &waiting.attempt, in_batch))
        .collect();
    let counters = &handlers.get(batch[0].attempt.handler).counters;
    let deadline = handlers.deadline(batch[0].attempt.handler);
    let in_one = {
        let transaction = in_one_transaction(&handlers, &batch, &spans);
        #[cfg(feature = "opentelemetry")]
        let transaction = transaction.instrument(batch_span.clone());
        let transaction = std::pin::pin!(transaction);
        handlers
            .db
            .watch
            .within("a batch of deliveries", deadline, transaction)
            .await
            .unwrap_or_else(|missed| Err(DeliveryError::database(missed)))
    };
    match in_one {
        Ok(outcomes) => {
            counters.batch_committed();
            for ((waiting, span), outcome) in batch.into_iter().zip(spans).zip(outcomes) {
                let result = Ok(outcome);
                observe(&handlers, &waiting.attempt, &span, started, &result);
                let _ = waiting.reply.send(result);
            }
        }
        Err(error) => {
            #[cfg(feature = "opentelemetry")]
            crate::trace::spans::failed(&batch_span, &format!("{:?}", error.kind), &error.reason);
            counters.batch_fell_back();
            tracing::debug!(module = %handlers.module, size = batch.len(), %error, "a batch rolled back; handling its messages one at a time");
            for waiting in batch {
                let result = guard(handlers.clone(), waiting.attempt).await;
                let _ = waiting.reply.send(result);
            }
        }
    }
}

/// BEGIN; each delivery through the inbox guard's steps; COMMIT. The first
/// failure rolls everything back.
async fn in_one_transaction<B: Backend>(
    handlers: &Handlers<B>,
    batch: &[Waiting],
    spans: &[Span],
) -> Result<Vec<Outcome>, DeliveryError> {
    let mut tx = handlers.begin().await.map_err(DeliveryError::database)?;
    let mut outcomes = Vec::with_capacity(batch.len());
    for (waiting, span) in batch.iter().zip(spans) {
        let handled = handle_in(handlers, &mut tx, &waiting.attempt)
            .instrument(span.clone())
            .await;
        match handled {
            Ok(outcome) => outcomes.push(outcome),
            Err(error) => {
                // The message that failed its batch says so in its span.
                #[cfg(feature = "opentelemetry")]
                crate::trace::spans::failed(span, &format!("{:?}", error.kind), &error.reason);
                tx.rollback().await;
                return Err(error);
            }
        }
    }
    tx.commit().await.map_err(DeliveryError::database)?;
    Ok(outcomes)
}
