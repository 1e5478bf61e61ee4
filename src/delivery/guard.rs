//! The inbox guard: one delivery of one message to one handler, as one
//! transaction that records `(message id, handler)` before COMMIT.

use crate::delivery::attempt::Attempt;
use crate::delivery::handler::{CallError, Delivery};
use crate::delivery::registry::Handlers;
use crate::effects::scope::EffectScope;
use crate::error::outcome::{DeliveryError, FailureKind, Outcome};
use crate::error::panic_message;
use crate::message::now_us;
use crate::store::backend::Backend;
use crate::store::ordering::KeyScope;
use crate::store::ordering::Turn;
use crate::tx::Tx;
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{Instrument, Span};

/// Runs one delivery: BEGIN; insert the inbox row unless present; if it was
/// present, skip; else run the handler on the same connection; COMMIT. Any
/// error or panic rolls back, leaving no inbox row and no change.
pub(crate) async fn guard<B: Backend>(
    handlers: Arc<Handlers<B>>,
    attempt: Attempt,
) -> Result<Outcome, DeliveryError> {
    let span = delivery_span(&handlers, &attempt, None);
    let started = Instant::now();
    let label = attempt.clone();
    let deadline = handlers.deadline(attempt.handler);
    // Past its deadline the delivery is dropped: its transaction, left
    // open, closes its connection (the server rolls it back).
    let delivery = std::pin::pin!(run(handlers.clone(), attempt).instrument(span.clone()));
    let result = handlers
        .db
        .watch
        .within("a delivery", deadline, delivery)
        .await
        .unwrap_or_else(|missed| Err(DeliveryError::database(missed)));
    observe(&handlers, &label, &span, started, &result);
    result
}

/// The span one delivery runs in, with what identifies it; counts a retry.
/// With the `opentelemetry` feature, the delivery's `process` span: a child
/// of the message's `create` span, linked to `batch`'s span when it runs in
/// a batch.
pub(crate) fn delivery_span<B: Backend>(
    handlers: &Handlers<B>,
    attempt: &Attempt,
    batch: Option<&Span>,
) -> Span {
    let entry = &handlers.get(attempt.handler);
    if attempt.attempt > 1 {
        entry.counters.retried();
    }
    #[cfg(feature = "opentelemetry")]
    return crate::trace::spans::process(
        attempt.envelope.span_identity(),
        attempt.envelope.trace_context.as_ref(),
        crate::trace::spans::Processing {
            module: &handlers.module,
            handler: &entry.name,
            attempt: attempt.attempt,
            system: attempt.envelope.messaging_system,
            causation_id: attempt.envelope.causation_id,
        },
        batch,
    );
    #[cfg(not(feature = "opentelemetry"))]
    let _ = batch;
    #[cfg(not(feature = "opentelemetry"))]
    tracing::info_span!(
        "deliver",
        message_id = %attempt.envelope.id,
        topic = %attempt.envelope.topic,
        module = %handlers.module,
        handler = %entry.name,
        attempt = attempt.attempt,
        correlation_id = %attempt.envelope.correlation_id,
        causation_id = ?attempt.envelope.causation_id,
        outcome = tracing::field::Empty,
    )
}

/// Counts how a delivery ended and reports it in its span. A failure is
/// logged at warn level with what identifies the delivery on the event
/// itself, so that it shows whatever level the span is filtered at.
pub(crate) fn observe<B: Backend>(
    handlers: &Handlers<B>,
    attempt: &Attempt,
    span: &Span,
    started: Instant,
    result: &Result<Outcome, DeliveryError>,
) {
    let entry = &handlers.get(attempt.handler);
    handlers.outbox.trackers.delivered(
        &handlers.module,
        &entry.name,
        attempt.attempt,
        &attempt.envelope,
        result,
    );
    // A scheduled message's end-to-end time counts from its due time.
    let published_us = attempt
        .envelope
        .created_at_us
        .max(attempt.envelope.due_at_us.unwrap_or(i64::MIN));
    let counters = &entry.counters;
    match result {
        Ok(Outcome::Handled) => {
            let end_to_end = now_us().saturating_sub(published_us).max(0) as u64;
            counters.handled(started.elapsed(), Duration::from_micros(end_to_end));
        }
        Ok(Outcome::Duplicate) => counters.duplicate(),
        // Not a failure of the handler, which did not run: the message waits
        // for an earlier one of its key.
        Err(error) if error.kind == FailureKind::Early => {}
        Err(_) => counters.failed(),
    }
    let _entered = span.enter();
    match result {
        Ok(outcome) => {
            span.record("outcome", tracing::field::debug(outcome));
            #[cfg(feature = "opentelemetry")]
            if *outcome == Outcome::Duplicate {
                crate::trace::spans::skipped_duplicate(span);
            }
            tracing::debug!("delivery finished");
        }
        Err(error) if error.kind == FailureKind::Early => {
            span.record("outcome", tracing::field::debug(error.kind));
            tracing::debug!(reason = %error.reason, "waiting for an earlier message of the key");
        }
        Err(error) => {
            span.record("outcome", tracing::field::debug(error.kind));
            #[cfg(feature = "opentelemetry")]
            crate::trace::spans::failed(span, &format!("{:?}", error.kind), &error.reason);
            tracing::warn!(
                module = %handlers.module,
                handler = %entry.name,
                topic = %attempt.envelope.topic,
                message_id = %attempt.envelope.id,
                attempt = attempt.attempt,
                reason = %error.reason,
                "delivery failed; rolled back"
            );
        }
    }
}

async fn run<B: Backend>(
    handlers: Arc<Handlers<B>>,
    attempt: Attempt,
) -> Result<Outcome, DeliveryError> {
    let mut tx = handlers.begin().await.map_err(DeliveryError::database)?;
    match handle_in(&handlers, &mut tx, &attempt).await {
        Ok(Outcome::Handled) => tx
            .commit()
            .await
            .map(|()| Outcome::Handled)
            .map_err(DeliveryError::database),
        ended => {
            tx.rollback().await;
            ended
        }
    }
}

/// Inside an open write transaction: records the inbox row of `attempt`
/// and, unless it was there already, runs the handler. After an error the
/// transaction must be rolled back.
pub(crate) async fn handle_in<B: Backend>(
    handlers: &Handlers<B>,
    tx: &mut Tx<B>,
    attempt: &Attempt,
) -> Result<Outcome, DeliveryError> {
    let entry = &handlers.get(attempt.handler);
    let handler = entry.handler.clone();
    let delivery = Delivery {
        envelope: attempt.envelope.clone(),
        handler: entry.name.clone(),
        attempt: attempt.attempt,
        effects: EffectScope::new(handlers.journal.clone()),
    };
    tx.set_cause(attempt.envelope.clone());
    let keyed = attempt.envelope.keyed.as_ref();
    let scope = keyed.map(|keyed| KeyScope {
        handler: &entry.name,
        publisher: &keyed.publisher,
        topic: &attempt.envelope.topic,
        key: &keyed.key,
    });
    let key = scope.zip(keyed.map(|k| k.sequence));
    let tick = B::tick_inbox(tx.conn(), attempt.envelope.id, &entry.name, now_us(), key)
        .await
        .map_err(|e| DeliveryError::database(e.into()))?;
    if !tick.inserted {
        return Ok(Outcome::Duplicate);
    }
    if let (Some(keyed), Some(scope), false) = (keyed, scope, tick.key_turn) {
        let turn = B::take_turn(tx.conn(), scope, keyed.sequence, keyed.previous_at_us)
            .await
            .map_err(|e| DeliveryError::database(e.into()))?;
        match turn {
            Turn::Next => {}
            Turn::Parked(head) => {
                return Err(DeliveryError::parked(
                    head,
                    format!(
                        "key `{}` is parked behind dead letter {head}: this message waits \
                         until it is replayed or skipped",
                        keyed.key
                    ),
                ))
            }
            Turn::Early(last) => {
                return Err(DeliveryError::new(
                    FailureKind::Early,
                    format!(
                        "message {} of key `{}` came before message {} of the key was done with",
                        keyed.sequence,
                        keyed.key,
                        last + 1
                    ),
                ))
            }
            Turn::Stale(last) => {
                tracing::warn!(
                    handler = %entry.name,
                    key = %keyed.key,
                    sequence = keyed.sequence,
                    progress = last,
                    "a keyed message came after the handler had got past it in its key's order \
                     (it was skipped by an operator, or arrived after a later message the handler \
                     took as the key's first): skipped"
                );
                return Ok(Outcome::Duplicate);
            }
        }
    }
    let called = AssertUnwindSafe(handler.call(tx, &delivery))
        .catch_unwind()
        .await;
    Err(match called {
        // A test hook, compiled only with the `testing` feature.
        #[cfg(feature = "testing")]
        Ok(Ok(())) if handlers.outbox.trackers.inject_failure() => DeliveryError::new(
            FailureKind::Injected,
            "a failure injected by the test session, after the handler's work and before COMMIT",
        ),
        Ok(Ok(())) => return Ok(Outcome::Handled),
        Ok(Err(CallError::Undecodable(reason))) => DeliveryError::new(
            FailureKind::Undecodable,
            format!("payload does not decode as this handler's message: {reason}"),
        ),
        Ok(Err(CallError::Handler(error))) if error.is_permanent() => {
            DeliveryError::new(FailureKind::Permanent, error)
        }
        Ok(Err(CallError::Handler(error))) if error.is_transient_database() => DeliveryError {
            transient: true,
            ..DeliveryError::new(FailureKind::Database, error)
        },
        Ok(Err(CallError::Handler(error))) => DeliveryError::new(FailureKind::Handler, error),
        Err(panic) => DeliveryError::new(
            FailureKind::Panic,
            format!("handler panicked: {}", panic_message(&*panic)),
        ),
    })
}
