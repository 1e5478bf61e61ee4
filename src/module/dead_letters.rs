//! Dead letters: deliveries given up on, kept in the subscriber module's
//! database with their reason until an operator replays or discards them.

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

impl<B: Backend> ModuleHandle<B> {
    /// Records that delivering `envelope` to `handler` was given up on.
    pub(crate) async fn record_dead_letter(
        &self,
        envelope: &Envelope,
        handler: &str,
        attempts: u32,
        reason: &str,
        parked_behind: Option<Uuid>,
    ) -> Result<()> {
        tracing::error!(
            module = %self.name(),
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
        };
        self.core
            .db
            .write_call("recording a dead letter", async move |conn| {
                Ok(B::insert_dead_letter(conn, row).await?)
            })
            .await?;
        if let Some(entry) = self
            .core
            .handlers
            .entries
            .iter()
            .find(|h| &*h.name == handler)
        {
            entry.counters.dead_lettered();
        }
        self.core
            .outbox
            .trackers
            .dead_lettered(self.name(), handler, envelope, attempts, reason);
        Ok(())
    }

    /// Dead letters of this module, oldest first: `limit` of them from
    /// `offset`.
    pub async fn dead_letters(&self, offset: u64, limit: u64) -> Result<Vec<DeadLetter>> {
        let rows = self
            .core
            .db
            .call("listing dead letters", async |conn| {
                Ok(B::dead_letters(conn, clamp(offset), clamp(limit)).await?)
            })
            .await?;
        Ok(rows.into_iter().map(DeadLetter::from).collect())
    }

    /// One dead letter, if there is one for this message and handler.
    pub async fn dead_letter(&self, message_id: Uuid, handler: &str) -> Result<Option<DeadLetter>> {
        let handler = handler.to_string();
        let row = self
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
    async fn existing_dead_letter(&self, message_id: Uuid, handler: &str) -> Result<DeadLetter> {
        self.dead_letter(message_id, handler)
            .await?
            .ok_or_else(|| Error::NoSuchDeadLetter {
                module: self.name().to_string(),
                message_id,
                handler: handler.to_string(),
            })
    }

    /// Delivers a dead letter again, through the inbox guard (so a message
    /// the handler did process is skipped, not processed twice), and removes
    /// it once delivered. A message without a handler is put back in this
    /// module's outbox instead. If the delivery fails again the dead letter
    /// stays, with the new reason.
    ///
    /// A keyed dead letter parks its key: once it is delivered, the messages
    /// of the key parked behind it are delivered too, in the key's order (a
    /// failure among them stops there, and parks the key again). Replaying
    /// a parked message while the one it waits for is still a dead letter
    /// fails ([`FailureKind::Parked`](crate::FailureKind::Parked)).
    pub async fn replay_dead_letter(&self, message_id: Uuid, handler: &str) -> Result<Replayed> {
        let dead = self.existing_dead_letter(message_id, handler).await?;
        if dead.handler.is_empty() {
            self.requeue_dead_letter(message_id, handler).await?;
            return Ok(Replayed::Requeued);
        }
        let outcome = self.redeliver(&dead).await?;
        if dead.keyed.is_some() {
            self.release_parked(&dead).await?;
        }
        Ok(Replayed::Delivered(outcome))
    }

    /// Delivers one dead letter again and removes it; on failure records the
    /// new reason and reports it.
    async fn redeliver(&self, dead: &DeadLetter) -> Result<Outcome> {
        let envelope = dead.envelope();
        match self.deliver_to(envelope.clone(), &dead.handler).await {
            Ok(outcome) => {
                self.discard_dead_letter(dead.message_id, &dead.handler)
                    .await?;
                Ok(outcome)
            }
            Err(error) => {
                self.record_dead_letter(
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

    /// Gives up on a dead letter without delivering it: deletes it and, for
    /// a keyed one, moves its handler's progress in the key past it, so the
    /// key is no longer parked behind it; the messages parked behind it are
    /// then delivered in the key's order (when this process runs the
    /// handler; otherwise they are put back in this module's outbox, for the
    /// bus that runs it). False if there was no such dead letter.
    pub async fn skip_dead_letter(&self, message_id: Uuid, handler: &str) -> Result<bool> {
        let Some(dead) = self.dead_letter(message_id, handler).await? else {
            return Ok(false);
        };
        let Some(keyed) = dead.keyed.clone() else {
            return self.discard_dead_letter(message_id, handler).await;
        };
        let handler_name = handler.to_string();
        let topic = dead.topic.clone();
        self.transaction(async move |tx| {
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
        tracing::warn!(module = %self.name(), handler, %message_id, key = %dead.keyed.as_ref().map_or("", |k| k.key.as_str()), "dead letter skipped: its key moves on without it");
        self.release_parked(&dead).await?;
        Ok(true)
    }

    /// The messages of `head`'s key parked behind it (the key's dead letters
    /// after it), delivered in the key's order once `head` no longer parks
    /// the key; put back in the outbox when this process does not run the
    /// handler.
    async fn release_parked(&self, head: &DeadLetter) -> Result<()> {
        let parked = self.parked_after(head).await?;
        if parked.is_empty() {
            return Ok(());
        }
        if self.core.handlers.position(&head.handler).is_none() {
            return self.requeue_all(parked).await;
        }
        for dead in &parked {
            if let Err(error) = self.redeliver(dead).await {
                tracing::warn!(module = %self.name(), handler = %dead.handler, message_id = %dead.message_id, %error, "a parked message failed again: its key stays parked behind it");
                break;
            }
        }
        Ok(())
    }

    /// The dead letters of `head`'s key after it, in the key's order.
    async fn parked_after(&self, head: &DeadLetter) -> Result<Vec<DeadLetter>> {
        let Some(keyed) = &head.keyed else {
            return Ok(Vec::new());
        };
        let scope = KeyScope {
            handler: &head.handler,
            publisher: &keyed.publisher,
            topic: &head.topic,
            key: &keyed.key,
        };
        let rows = self
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

    /// Puts a dead letter's message back in this module's outbox and removes
    /// the dead letter, in one transaction. Whichever bus runs over this
    /// database delivers it again to every subscriber of its topic — on
    /// PostgreSQL at once (the commit wakes it), on SQLite at its next
    /// periodic scan: handlers that did process it skip it in their inbox,
    /// the one that gave up tries again. Unlike
    /// [`ModuleHandle::replay_dead_letter`] this needs no handler code, so an
    /// operator's tool can do it while the application runs elsewhere. A
    /// keyed dead letter goes back with the messages of its key parked
    /// behind it, and the bus delivers them in the key's order.
    pub async fn requeue_dead_letter(&self, message_id: Uuid, handler: &str) -> Result<()> {
        let dead = self.existing_dead_letter(message_id, handler).await?;
        let mut all = vec![dead.clone()];
        all.extend(self.parked_after(&dead).await?);
        self.requeue_all(all).await
    }

    /// Puts dead letters back in the outbox and removes them, in one
    /// transaction.
    async fn requeue_all(&self, dead: Vec<DeadLetter>) -> Result<()> {
        self.transaction(async move |tx| {
            for dead in dead {
                B::requeue_or_insert(tx.conn(), OutboxRow::from(&dead.envelope())).await?;
                B::delete_dead_letter(tx.conn(), dead.message_id, dead.handler).await?;
            }
            tx.requeued_outbox_rows();
            Ok::<_, Error>(())
        })
        .await
    }

    /// Deletes a dead letter without delivering it; false if there was none.
    pub async fn discard_dead_letter(&self, message_id: Uuid, handler: &str) -> Result<bool> {
        let handler = handler.to_string();
        let deleted = self
            .core
            .db
            .write_call("discarding a dead letter", async move |conn| {
                Ok(B::delete_dead_letter(conn, message_id, handler).await?)
            })
            .await?;
        Ok(deleted > 0)
    }
}

fn clamp(n: u64) -> i64 {
    n.min(i64::MAX as u64) as i64
}
