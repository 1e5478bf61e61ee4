//! Dead letters: deliveries given up on, kept in the subscriber module's
//! database with their reason until an operator replays or discards them.
//!
//! Holds [`DeadLetter`], [`Replayed`], the recording of a dead letter (by
//! the bus: [`record`]), and the work behind [`ModuleHandle`]'s dead-letter
//! methods (`dead_letters`, `dead_letter`, `replay_dead_letter`,
//! `skip_dead_letter`, `requeue_dead_letter`, `discard_dead_letter`), each
//! of which calls one function here.

use crate::error::outcome::Outcome;
use crate::error::{Error, Result};
use crate::message::{now_us, Envelope, Keyed};
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;
use crate::store::ordering::KeyScope;
use crate::store::schema::{keyed, DeadLetterRow, Id, OutboxRow};
use serde::Serialize;
use uuid::Uuid;

/// A delivery given up on: after the retry policy's last attempt, on a
/// permanent handler error, for a payload that does not decode, or for a
/// topic no module on the bus declares. It never blocks other messages.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeadLetter {
    /// The message's id.
    pub message_id: Uuid,
    /// The handler that gave up, or `""` when no handler could be chosen (an
    /// unknown topic; the dead letter then sits in the publishing module).
    pub handler: String,
    /// The message's topic.
    pub topic: String,
    /// The message's JSON payload, as published.
    pub payload: String,
    /// The message's correlation id.
    pub correlation_id: Uuid,
    /// The message's causation id.
    pub causation_id: Option<Uuid>,
    /// When the message was published (µs since the Unix epoch).
    pub created_at_us: i64,
    /// Attempts made before giving up.
    pub attempts: u32,
    /// Why: the last error.
    pub reason: String,
    /// When it was given up on (µs since the Unix epoch).
    pub dead_at_us: i64,
    /// The message's place in its key's order, when it has an ordering key:
    /// the dead letter then parks the key for its handler.
    pub keyed: Option<Keyed>,
    /// The keyed dead letter this message was parked behind, when it did not
    /// fail itself but arrived while its key was parked: it is delivered
    /// when that one is replayed or skipped.
    pub parked_behind: Option<Uuid>,
    /// The trace the message was published in, so that an operator goes
    /// from the dead letter to its trace (`tickbox dead-letters show`
    /// prints its id).
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub trace_context: Option<crate::trace::context::TraceContext>,
}

impl DeadLetter {
    /// The message as an envelope, to deliver again.
    pub fn envelope(&self) -> Envelope {
        Envelope {
            id: self.message_id,
            topic: self.topic.clone(),
            payload: self.payload.clone(),
            correlation_id: self.correlation_id,
            causation_id: self.causation_id,
            created_at_us: self.created_at_us,
            keyed: self.keyed.clone(),
            #[cfg(feature = "opentelemetry")]
            trace_context: self.trace_context.clone(),
            #[cfg(feature = "opentelemetry")]
            messaging_system: crate::trace::spans::TICKBOX,
            due_at_us: None,
        }
    }
}

impl From<DeadLetterRow> for DeadLetter {
    fn from(row: DeadLetterRow) -> Self {
        DeadLetter {
            message_id: row.message_id.0,
            handler: row.handler,
            topic: row.topic,
            payload: row.payload,
            correlation_id: row.correlation_id.0,
            causation_id: row.causation_id.map(|c| c.0),
            created_at_us: row.created_at_us,
            attempts: row.attempts.max(0) as u32,
            reason: row.reason,
            dead_at_us: row.dead_at_us,
            keyed: keyed(
                row.ordering_key,
                row.key_seq,
                row.key_publisher,
                row.key_previous_at_us,
            ),
            parked_behind: row.parked_behind.map(|id| id.0),
            #[cfg(feature = "opentelemetry")]
            trace_context: row
                .trace_context
                .as_deref()
                .and_then(crate::trace::context::TraceContext::from_stored),
        }
    }
}

/// What [`ModuleHandle::replay_dead_letter`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replayed {
    /// Delivered again through the inbox guard with this outcome.
    Delivered(Outcome),
    /// A message without a handler (unknown topic) was put back in the
    /// outbox; the bus delivers it on its next scan (on PostgreSQL, at once:
    /// the requeue wakes it).
    Requeued,
}

/// Records that delivering `envelope` to `handler` of `module` was given
/// up on (the bus calls it).
pub(crate) async fn record<B: Backend>(
    module: &ModuleHandle<B>,
    envelope: &Envelope,
    handler: &str,
    attempts: u32,
    reason: &str,
    parked_behind: Option<Uuid>,
) -> Result<()> {
    #[cfg(feature = "opentelemetry")]
    let span = crate::trace::spans::dead_letter(
        envelope.span_identity(),
        envelope.trace_context.as_ref(),
        handler,
        reason,
    );
    #[cfg(feature = "opentelemetry")]
    let _entered = span.enter();
    tracing::error!(
        module = %module.name(),
        handler,
        message_id = %envelope.id,
        topic = %envelope.topic,
        attempts,
        reason,
        "dead-lettered"
    );
    let row = DeadLetterRow {
        message_id: Id(envelope.id),
        handler: handler.to_string(),
        topic: envelope.topic.clone(),
        payload: envelope.payload.clone(),
        correlation_id: Id(envelope.correlation_id),
        causation_id: envelope.causation_id.map(Id),
        created_at_us: envelope.created_at_us,
        attempts: attempts.min(i32::MAX as u32) as i32,
        reason: reason.to_string(),
        dead_at_us: now_us(),
        ordering_key: envelope.keyed.as_ref().map(|k| k.key.clone()),
        key_seq: envelope.keyed.as_ref().map(|k| k.sequence),
        key_publisher: envelope.keyed.as_ref().map(|k| k.publisher.clone()),
        key_previous_at_us: envelope.keyed.as_ref().and_then(|k| k.previous_at_us),
        parked_behind: parked_behind.map(Id),
        #[cfg(feature = "opentelemetry")]
        trace_context: envelope
            .trace_context
            .as_ref()
            .map(|context| context.stored()),
    };
    #[cfg(feature = "opentelemetry")]
    drop(_entered);
    module
        .core
        .db
        .write_call("recording a dead letter", async move |conn| {
            Ok(B::insert_dead_letter(conn, row).await?)
        })
        .await?;
    if let Some(entry) = module
        .core
        .handlers
        .entries
        .iter()
        .find(|h| &*h.name == handler)
    {
        entry.counters.dead_lettered();
    }
    module
        .core
        .outbox
        .trackers
        .dead_lettered(module.name(), handler, envelope, attempts, reason);
    Ok(())
}

/// The work behind [`ModuleHandle::dead_letters`].
pub(crate) async fn list<B: Backend>(
    module: &ModuleHandle<B>,
    offset: u64,
    limit: u64,
) -> Result<Vec<DeadLetter>> {
    let rows = module
        .core
        .db
        .call("listing dead letters", async |conn| {
            Ok(B::dead_letters(conn, clamp(offset), clamp(limit)).await?)
        })
        .await?;
    Ok(rows.into_iter().map(DeadLetter::from).collect())
}

/// The work behind [`ModuleHandle::dead_letter`].
pub(crate) async fn find<B: Backend>(
    module: &ModuleHandle<B>,
    message_id: Uuid,
    handler: &str,
) -> Result<Option<DeadLetter>> {
    let handler = handler.to_string();
    let row = module
        .core
        .db
        .call("reading a dead letter", async move |conn| {
            Ok(B::dead_letter(conn, message_id, handler).await?)
        })
        .await?;
    Ok(row.map(DeadLetter::from))
}

/// The dead letter for this message and handler, or
/// [`Error::NoSuchDeadLetter`].
async fn existing<B: Backend>(
    module: &ModuleHandle<B>,
    message_id: Uuid,
    handler: &str,
) -> Result<DeadLetter> {
    find(module, message_id, handler)
        .await?
        .ok_or_else(|| Error::NoSuchDeadLetter {
            module: module.name().to_string(),
            message_id,
            handler: handler.to_string(),
        })
}

/// The work behind [`ModuleHandle::replay_dead_letter`].
pub(crate) async fn replay<B: Backend>(
    module: &ModuleHandle<B>,
    message_id: Uuid,
    handler: &str,
) -> Result<Replayed> {
    let dead = existing(module, message_id, handler).await?;
    if dead.handler.is_empty() {
        requeue(module, message_id, handler).await?;
        return Ok(Replayed::Requeued);
    }
    let outcome = redeliver(module, &dead).await?;
    if dead.keyed.is_some() {
        release_parked(module, &dead).await?;
    }
    Ok(Replayed::Delivered(outcome))
}

/// Delivers one dead letter again and removes it; on failure records the
/// new reason and reports it.
async fn redeliver<B: Backend>(module: &ModuleHandle<B>, dead: &DeadLetter) -> Result<Outcome> {
    let envelope = dead.envelope();
    match module.deliver_to(envelope.clone(), &dead.handler).await {
        Ok(outcome) => {
            discard(module, dead.message_id, &dead.handler).await?;
            Ok(outcome)
        }
        Err(error) => {
            record(
                module,
                &envelope,
                &dead.handler,
                dead.attempts + 1,
                &error.to_string(),
                error.parked_behind,
            )
            .await?;
            Err(Error::ReplayFailed(error))
        }
    }
}

/// The work behind [`ModuleHandle::skip_dead_letter`].
pub(crate) async fn skip<B: Backend>(
    module: &ModuleHandle<B>,
    message_id: Uuid,
    handler: &str,
) -> Result<bool> {
    let Some(dead) = find(module, message_id, handler).await? else {
        return Ok(false);
    };
    let Some(keyed) = dead.keyed.clone() else {
        return discard(module, message_id, handler).await;
    };
    let handler_name = handler.to_string();
    let topic = dead.topic.clone();
    module
        .transaction(async move |tx| {
            let scope = KeyScope {
                handler: &handler_name,
                publisher: &keyed.publisher,
                topic: &topic,
                key: &keyed.key,
            };
            B::skip_to(tx.conn(), scope, keyed.sequence).await?;
            B::delete_dead_letter(tx.conn(), message_id, handler_name.clone()).await?;
            Ok::<_, Error>(())
        })
        .await?;
    tracing::warn!(module = %module.name(), handler, %message_id, key = %dead.keyed.as_ref().map_or("", |k| k.key.as_str()), "dead letter skipped: its key moves on without it");
    release_parked(module, &dead).await?;
    Ok(true)
}

/// The messages of `head`'s key parked behind it (the key's dead letters
/// after it), delivered in the key's order once `head` no longer parks
/// the key; put back in the outbox when this process does not run the
/// handler.
async fn release_parked<B: Backend>(module: &ModuleHandle<B>, head: &DeadLetter) -> Result<()> {
    let parked = parked_after(module, head).await?;
    if parked.is_empty() {
        return Ok(());
    }
    if module.core.handlers.position(&head.handler).is_none() {
        return requeue_all(module, parked).await;
    }
    for dead in &parked {
        if let Err(error) = redeliver(module, dead).await {
            tracing::warn!(module = %module.name(), handler = %dead.handler, message_id = %dead.message_id, %error, "a parked message failed again: its key stays parked behind it");
            break;
        }
    }
    Ok(())
}

/// The dead letters of `head`'s key after it, in the key's order.
async fn parked_after<B: Backend>(
    module: &ModuleHandle<B>,
    head: &DeadLetter,
) -> Result<Vec<DeadLetter>> {
    let Some(keyed) = &head.keyed else {
        return Ok(Vec::new());
    };
    let scope = KeyScope {
        handler: &head.handler,
        publisher: &keyed.publisher,
        topic: &head.topic,
        key: &keyed.key,
    };
    let rows = module
        .core
        .db
        .call("listing a key's dead letters", async |conn| {
            Ok(B::key_dead_letters(conn, scope).await?)
        })
        .await?;
    Ok(rows
        .into_iter()
        .map(DeadLetter::from)
        .filter(|d| {
            d.keyed
                .as_ref()
                .is_some_and(|k| k.sequence > keyed.sequence)
        })
        .collect())
}

/// The work behind [`ModuleHandle::requeue_dead_letter`].
pub(crate) async fn requeue<B: Backend>(
    module: &ModuleHandle<B>,
    message_id: Uuid,
    handler: &str,
) -> Result<()> {
    let dead = existing(module, message_id, handler).await?;
    let mut all = vec![dead.clone()];
    all.extend(parked_after(module, &dead).await?);
    requeue_all(module, all).await
}

/// Puts dead letters back in the outbox and removes them, in one
/// transaction.
async fn requeue_all<B: Backend>(module: &ModuleHandle<B>, dead: Vec<DeadLetter>) -> Result<()> {
    module
        .transaction(async move |tx| {
            for dead in dead {
                B::requeue_or_insert(tx.conn(), OutboxRow::from(&dead.envelope())).await?;
                B::delete_dead_letter(tx.conn(), dead.message_id, dead.handler).await?;
            }
            tx.requeued_outbox_rows();
            Ok::<_, Error>(())
        })
        .await
}

/// The work behind [`ModuleHandle::discard_dead_letter`].
pub(crate) async fn discard<B: Backend>(
    module: &ModuleHandle<B>,
    message_id: Uuid,
    handler: &str,
) -> Result<bool> {
    let handler = handler.to_string();
    let deleted = module
        .core
        .db
        .write_call("discarding a dead letter", async move |conn| {
            Ok(B::delete_dead_letter(conn, message_id, handler).await?)
        })
        .await?;
    Ok(deleted > 0)
}

/// A count from an operator, as the database takes it.
fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}
