//! The inbox guard: one delivery of one message to one handler, as one
//! transaction that records `(message id, handler)` before COMMIT.

use crate::backend::Backend;
use crate::error::{panic_message, Error};
use crate::handler::CallError;
use crate::module::{Deliver, ModuleCore};
use crate::tx::{Delivery, Mode, Tx};
use futures_util::FutureExt;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{Instrument, Span};

/// How a delivery ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran and its transaction committed with the inbox row.
    Handled,
    /// The inbox already held the message: the handler was skipped.
    Duplicate,
}

/// Why a delivery failed. Nothing of it was committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryError {
    /// What kind of failure it was.
    pub kind: FailureKind,
    /// A description, with the error's chain of causes.
    pub reason: String,
    /// The database failed in a way that may pass (a lost connection, a
    /// serialization failure, a busy database).
    pub transient: bool,
}

/// The kinds of delivery failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// The handler returned an error that a retry may fix.
    Handler,
    /// The handler returned an error marked permanent.
    Permanent,
    /// The handler panicked.
    Panic,
    /// The payload does not decode into the handler's message type.
    Undecodable,
    /// The database failed (begin, inbox insert, outbox insert or commit).
    Database,
    /// The module or its runtime stopped before the delivery finished.
    Stopped,
    /// The delivery named a handler the module does not have, or one that
    /// subscribes to another topic.
    NoSuchHandler,
}

impl DeliveryError {
    pub(crate) fn new(kind: FailureKind, reason: impl fmt::Display) -> Self {
        DeliveryError {
            kind,
            reason: reason.to_string(),
            transient: false,
        }
    }

    pub(crate) fn database(error: Error) -> Self {
        DeliveryError {
            transient: error.is_transient(),
            ..Self::new(FailureKind::Database, error)
        }
    }

    /// Whether this failure uses up one of the retry policy's attempts:
    /// transient database failures and stops do not.
    pub fn counts_as_attempt(&self) -> bool {
        match self.kind {
            FailureKind::Database => !self.transient,
            FailureKind::Stopped => false,
            _ => true,
        }
    }

    pub(crate) fn stopped(reason: impl fmt::Display) -> Self {
        Self::new(FailureKind::Stopped, reason)
    }

    /// False when no retry can succeed (a permanent error, an undecodable
    /// payload).
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self.kind,
            FailureKind::Permanent | FailureKind::Undecodable | FailureKind::NoSuchHandler
        )
    }
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.reason)
    }
}

impl std::error::Error for DeliveryError {}

/// Runs one delivery: BEGIN; insert the inbox row unless present; if it was
/// present, skip; else run the handler on the same connection; COMMIT. Any
/// error or panic rolls back, leaving no inbox row and no change.
pub(crate) async fn guard<B: Backend>(
    module: Arc<ModuleCore<B>>,
    deliver: Deliver,
) -> Result<Outcome, DeliveryError> {
    let span = delivery_span(&module, &deliver);
    let started = Instant::now();
    let label = deliver.clone();
    let result = run(module.clone(), deliver).instrument(span.clone()).await;
    observe(&module, &label, &span, started, &result);
    result
}

/// The span one delivery runs in, with what identifies it; counts a retry.
pub(crate) fn delivery_span<B: Backend>(module: &ModuleCore<B>, deliver: &Deliver) -> Span {
    let entry = &module.handlers[deliver.handler];
    if deliver.attempt > 1 {
        entry.counters.retried();
    }
    tracing::info_span!(
        "deliver",
        message_id = %deliver.envelope.id,
        topic = %deliver.envelope.topic,
        module = %module.name,
        handler = %entry.name,
        attempt = deliver.attempt,
        correlation_id = %deliver.envelope.correlation_id,
        causation_id = ?deliver.envelope.causation_id,
        outcome = tracing::field::Empty,
    )
}

/// Counts how a delivery ended and reports it in its span. A failure is
/// logged at warn level with what identifies the delivery on the event
/// itself, so that it shows whatever level the span is filtered at.
pub(crate) fn observe<B: Backend>(
    module: &ModuleCore<B>,
    deliver: &Deliver,
    span: &Span,
    started: Instant,
    result: &Result<Outcome, DeliveryError>,
) {
    let entry = &module.handlers[deliver.handler];
    let published_us = deliver.envelope.created_at_us;
    let counters = &entry.counters;
    match result {
        Ok(Outcome::Handled) => {
            let end_to_end = crate::message::now_us().saturating_sub(published_us).max(0) as u64;
            counters.handled(started.elapsed(), Duration::from_micros(end_to_end));
        }
        Ok(Outcome::Duplicate) => counters.duplicate(),
        Err(_) => counters.failed(),
    }
    let _entered = span.enter();
    match result {
        Ok(outcome) => {
            span.record("outcome", tracing::field::debug(outcome));
            tracing::debug!("delivery finished");
        }
        Err(error) => {
            span.record("outcome", tracing::field::debug(error.kind));
            tracing::warn!(
                module = %module.name,
                handler = %entry.name,
                topic = %deliver.envelope.topic,
                message_id = %deliver.envelope.id,
                attempt = deliver.attempt,
                reason = %error.reason,
                "delivery failed; rolled back"
            );
        }
    }
}

async fn run<B: Backend>(
    module: Arc<ModuleCore<B>>,
    deliver: Deliver,
) -> Result<Outcome, DeliveryError> {
    let mut tx = Tx::begin(module.clone(), Mode::Write)
        .await
        .map_err(DeliveryError::database)?;
    match handle_in(&mut tx, &deliver).await {
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

/// Inside an open write transaction: records the inbox row of `deliver`
/// and, unless it was there already, runs the handler. After an error the
/// transaction must be rolled back.
pub(crate) async fn handle_in<B: Backend>(
    tx: &mut Tx<B>,
    deliver: &Deliver,
) -> Result<Outcome, DeliveryError> {
    let entry = &tx.module_core().handlers[deliver.handler];
    let handler = entry.handler.clone();
    let delivery = Delivery {
        envelope: deliver.envelope.clone(),
        handler: entry.name.clone(),
        attempt: deliver.attempt,
    };
    tx.set_delivery(delivery.clone());
    if !tx.tick_inbox().await.map_err(DeliveryError::database)? {
        return Ok(Outcome::Duplicate);
    }
    let called = AssertUnwindSafe(handler.call(tx, &delivery))
        .catch_unwind()
        .await;
    Err(match called {
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
