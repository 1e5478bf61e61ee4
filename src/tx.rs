//! A module transaction: the connection handlers and application code change
//! their data with, and the place they publish messages from.

use crate::error::{Error, Result};
use crate::message::{now_us, Envelope, Keyed, Message};
use crate::outbox::Outbox;
use crate::store::backend::Backend;
use crate::store::database::Database;
use crate::store::schema::{Id, OutboxRow};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// An open transaction on a module's database.
///
/// Change the module's own tables through [`Tx::conn`] with diesel, and
/// publish messages with [`Tx::publish`]: the messages are written to the
/// module's outbox in this same transaction, so they exist if and only if it
/// commits. Inside a handler the transaction also holds the inbox row of the
/// message being handled, which the handler receives as its
/// [`Delivery`](crate::Delivery).
pub struct Tx<B: Backend> {
    /// The pooled connection the whole transaction runs on; taken out only
    /// when the transaction is dropped half way.
    conn: Option<B::Pooled>,
    /// The database it came from, which closes it if the transaction is
    /// dropped half way.
    db: Arc<Database<B>>,
    /// BEGIN was sent and neither COMMIT nor ROLLBACK has succeeded: a
    /// transaction dropped in this state (its deadline passed, its task
    /// was aborted) closes its connection instead of returning it to the
    /// pool, and the server rolls it back.
    open: bool,
    /// This process's turn to write, held to the end of a write
    /// transaction where the database takes one writer at a time.
    _turn: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The outbox of the module whose database this is: its name, what it
    /// may publish, where committed messages are announced.
    outbox: Arc<Outbox>,
    /// The message being handled, when the transaction belongs to a handler;
    /// messages published here are caused by it.
    cause: Option<Arc<Envelope>>,
    /// Whether this transaction may write and publish.
    mode: Mode,
    /// Messages published so far, written to the outbox just before COMMIT.
    published: Vec<Envelope>,
    /// Outbox rows were written directly, unclaimed and unannounced (a
    /// requeued dead letter): only a scan finds them, so the commit wakes
    /// the listening buses whether or not the module is on a bus.
    requeued: bool,
}

/// What a transaction may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Change data and publish (SQLite: `BEGIN IMMEDIATE`).
    Write,
    /// Only read, from one consistent snapshot, without taking SQLite's
    /// write lock (PostgreSQL: `READ ONLY`).
    Read,
}

impl<B: Backend> Tx<B> {
    /// Checks out a connection and begins a transaction.
    pub(crate) async fn begin(
        db: &Arc<Database<B>>,
        outbox: Arc<Outbox>,
        mode: Mode,
    ) -> Result<Self> {
        let turn = match mode {
            Mode::Write => db.write_turn().await,
            Mode::Read => None,
        };
        let mut tx = Tx {
            conn: Some(db.connection().await?),
            db: db.clone(),
            open: true,
            _turn: turn,
            outbox,
            cause: None,
            mode,
            published: Vec::new(),
            requeued: false,
        };
        let begun = match mode {
            Mode::Write => B::begin(tx.conn()).await,
            Mode::Read => B::begin_read(tx.conn()).await,
        };
        // A BEGIN that failed left no transaction: the connection goes back.
        tx.open = begun.is_ok();
        begun?;
        Ok(tx)
    }

    /// The connection, for the module's own diesel queries.
    pub fn conn(&mut self) -> &mut B::Connection {
        self.conn
            .as_mut()
            .expect("a transaction has its connection until it is dropped")
    }

    /// The name of the module whose database this transaction writes.
    pub fn module(&self) -> &str {
        &self.outbox.module
    }

    /// Publishes a message in this transaction and returns its id.
    ///
    /// The message is written to the outbox when the transaction commits and
    /// is discarded with it on rollback. Inside a handler, the new message is
    /// caused by the handled one and shares its correlation id.
    ///
    /// Fails at once, before anything is written, when the module did not
    /// declare the topic or the encoded message is over the size limit.
    pub fn publish<M: Message>(&mut self, message: &M) -> Result<Uuid> {
        self.publish_with(message, None, None)
    }

    /// Publishes a message with an ordering key (a product id, an account
    /// number) and returns its id.
    ///
    /// Each handler receives the messages of one key in the order their
    /// transactions commit: it never runs one before an earlier-committed
    /// message of the same key (and topic) has been handled, skipped as a
    /// duplicate, or dead-lettered by that handler; messages of other keys
    /// keep flowing meanwhile. A dead-lettered message parks its key for its
    /// handler until it is replayed or skipped
    /// ([`ModuleHandle::replay_dead_letter`](crate::ModuleHandle::replay_dead_letter),
    /// [`ModuleHandle::skip_dead_letter`](crate::ModuleHandle::skip_dead_letter)).
    ///
    /// The message is numbered in its key's order as this transaction
    /// commits ([`Keyed`](crate::Keyed) says what the number means, and
    /// handlers read it from [`Delivery::sequence`](crate::Delivery::sequence)).
    pub fn publish_keyed<M: Message>(&mut self, key: &str, message: &M) -> Result<Uuid> {
        self.publish_with(message, Some(key), None)
    }

    /// Publishes a message to be delivered at `when`, and returns its id.
    ///
    /// The message is written to the outbox when the transaction commits,
    /// like any other, and waits there: no handler receives it before
    /// `when`, and every subscribed handler receives it promptly after
    /// (at least once, through the inbox), whichever process, after
    /// whichever restarts, delivers it. A time already past delivers it as
    /// soon as it commits. [`Tx::cancel_scheduled`], in a later
    /// transaction, cancels it while it is not yet due.
    ///
    /// A saga's timeout is such a message: published with the step that
    /// starts the wait, and ignored by its handler if the saga has moved on
    /// by then (or cancelled by the step that ends the wait).
    ///
    /// Delivered at `when` by the bus's timer when this process committed
    /// it; a message another process committed is found by the next scan
    /// ([`BusBuilder::scan_interval`](crate::BusBuilder::scan_interval);
    /// on PostgreSQL its commit wakes the buses, which set their timers for
    /// it at once).
    pub fn publish_at<M: Message>(&mut self, when: SystemTime, message: &M) -> Result<Uuid> {
        self.publish_with(message, None, Some(unix_us(when)))
    }

    /// Publishes a message to be delivered `delay` from now, and returns
    /// its id: [`Tx::publish_at`] at now plus `delay`. Now is the wall
    /// clock, or a test session's once it moved the clock ahead
    /// ([`Session::advance`](crate::testing::Session::advance), feature
    /// `testing`).
    pub fn publish_after<M: Message>(&mut self, delay: Duration, message: &M) -> Result<Uuid> {
        let due = self.outbox.clock.now_us().saturating_add(micros(delay));
        self.publish_with(message, None, Some(due))
    }

    /// Publishes a message with an ordering key to be delivered at `when`,
    /// and returns its id.
    ///
    /// **Its place in the key** is taken when it is due, not when it
    /// commits: the publishing module numbers it ([`Keyed`](crate::Keyed))
    /// when a bus first takes it after `when`, after every message of its
    /// key committed before then, and before every one committed later.
    /// Until then it holds nothing back: the key's other messages flow as if
    /// it did not exist (a timeout must not stop the flow it watches).
    pub fn publish_keyed_at<M: Message>(
        &mut self,
        key: &str,
        when: SystemTime,
        message: &M,
    ) -> Result<Uuid> {
        self.publish_with(message, Some(key), Some(unix_us(when)))
    }

    /// Publishes a message with an ordering key to be delivered `delay`
    /// from now: [`Tx::publish_keyed_at`] at now plus `delay`.
    pub fn publish_keyed_after<M: Message>(
        &mut self,
        key: &str,
        delay: Duration,
        message: &M,
    ) -> Result<Uuid> {
        let due = self.outbox.clock.now_us().saturating_add(micros(delay));
        self.publish_with(message, Some(key), Some(due))
    }

    /// Cancels scheduled message `id` ([`Tx::publish_at`]) if it is not
    /// yet due: it is removed from the outbox when this transaction
    /// commits, and no handler receives it. Returns whether it was
    /// cancelled; `false` when it is due already (then it is delivered, or
    /// being delivered), was delivered, was cancelled before, or is no
    /// scheduled message of this module. A message published in this same
    /// transaction is cancelled at once.
    ///
    /// A bus that takes the message as it becomes due and a cancellation at
    /// that same moment never both win: a due message is only claimed
    /// unclaimed, and only an unclaimed one is cancelled.
    pub async fn cancel_scheduled(&mut self, id: Uuid) -> Result<bool> {
        if self.mode == Mode::Read {
            return Err(Error::CancelInReadOnly {
                module: self.outbox.module.to_string(),
                message_id: id,
            });
        }
        if let Some(at) = self
            .published
            .iter()
            .position(|e| e.id == id && e.due_at_us.is_some())
        {
            self.published.remove(at);
            return Ok(true);
        }
        let now = self.outbox.clock.now_us();
        let cancelled = B::cancel_scheduled(self.conn(), id, now).await?;
        Ok(cancelled > 0)
    }

    /// Publishes, with or without an ordering key, at once or when due.
    fn publish_with<M: Message>(
        &mut self,
        message: &M,
        key: Option<&str>,
        due_at_us: Option<i64>,
    ) -> Result<Uuid> {
        if self.mode == Mode::Read {
            return Err(Error::ReadOnly {
                module: self.outbox.module.to_string(),
                topic: M::TOPIC.to_string(),
            });
        }
        if !self.outbox.publishes.contains(M::TOPIC) {
            return Err(Error::UnknownTopic {
                module: self.outbox.module.to_string(),
                topic: M::TOPIC.to_string(),
            });
        }
        let payload = serde_json::to_string(message).map_err(|source| Error::Encode {
            topic: M::TOPIC.to_string(),
            source,
        })?;
        if payload.len() > self.outbox.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                topic: M::TOPIC.to_string(),
                size: payload.len(),
                limit: self.outbox.max_payload_bytes,
            });
        }
        let cause = self.cause.as_deref();
        let mut envelope = match due_at_us {
            Some(due) => {
                Envelope::scheduled(M::TOPIC, payload, cause, due, self.outbox.clock.now_us())
            }
            None => Envelope::new(M::TOPIC, payload, cause),
        };
        // Numbered at commit.
        envelope.keyed = key.map(|key| Keyed {
            key: key.to_string(),
            sequence: 0,
            publisher: self.outbox.module.to_string(),
            previous_at_us: None,
        });
        #[cfg(feature = "opentelemetry")]
        {
            // The message's `create` span, a child of the current one: its
            // context goes with the message.
            let create = crate::trace::spans::create(&self.outbox.module, envelope.span_identity());
            envelope.trace_context = crate::trace::context::TraceContext::of_span(&create);
        }
        let id = envelope.id;
        self.published.push(envelope);
        Ok(id)
    }

    /// Makes this the transaction of a handler processing `cause`: what it
    /// publishes from now on is caused by that message.
    pub(crate) fn set_cause(&mut self, cause: Arc<Envelope>) {
        self.cause = Some(cause);
    }

    /// Notes that this transaction put outbox rows back as pending and
    /// unclaimed, so that its commit wakes the buses listening for them.
    pub(crate) fn requeued_outbox_rows(&mut self) {
        self.requeued = true;
    }

    /// Writes the published messages, commits, and announces them to the bus.
    ///
    /// When the module has no claimant (no bus of this process delivers its
    /// outbox), the rows are written unclaimed and, on PostgreSQL, a
    /// notification on the outbox's wake-up channel is sent just before
    /// COMMIT: buses of other processes hear it if and only if the rows
    /// commit. The messages of a module on a bus are announced to it in
    /// memory, and nobody is notified.
    pub(crate) async fn commit(mut self) -> Result<()> {
        let mut published = std::mem::take(&mut self.published);
        // Stamped just before COMMIT, so end-to-end latency counts from the
        // commit rather than from the call to `publish`.
        let committing_us = now_us();
        for envelope in &mut published {
            envelope.created_at_us = committing_us;
        }
        let claim = self
            .outbox
            .claimant()
            .map(|(bus, lease)| (Id(bus), committing_us + lease.as_micros() as i64));
        // A message due later is written unclaimed (the bus that claims it
        // once due may be another process's) and, if keyed, unnumbered: it
        // takes its place in its key when due.
        let mut scheduled = false;
        let due_now = self.outbox.clock.now_us();
        let rows = published
            .iter()
            .map(|envelope| {
                let row = OutboxRow::from(envelope);
                if envelope.due_at_us.is_some_and(|due| due > due_now) {
                    scheduled = true;
                    OutboxRow {
                        key_seq: None,
                        ..row
                    }
                } else {
                    OutboxRow {
                        claimed_by: claim.map(|(bus, _)| bus),
                        claimed_until_us: claim.map(|(_, until)| until),
                        ..row
                    }
                }
            })
            .collect();
        // Keyed messages are numbered in their key's order as they are
        // written (see `Keyed`).
        let rows = match B::insert_outbox(self.conn(), rows).await {
            Ok(rows) => rows,
            Err(e) => {
                self.rollback().await;
                return Err(e.into());
            }
        };
        for (envelope, row) in published.iter_mut().zip(rows) {
            if let (Some(keyed), Some(sequence)) = (envelope.keyed.as_mut(), row.key_seq) {
                keyed.sequence = sequence;
                keyed.previous_at_us = row.key_previous_at_us;
            }
        }
        let unclaimed = claim.is_none() && !published.is_empty();
        if let Some(wakeup) = self
            .outbox
            .wakeup
            .as_ref()
            .filter(|_| unclaimed || self.requeued || scheduled)
        {
            let channel = &wakeup.channel;
            let conn = self
                .conn
                .as_mut()
                .expect("a transaction has its connection until it is dropped");
            if let Err(e) = B::notify(conn, channel).await {
                self.rollback().await;
                return Err(e.into());
            }
        }
        B::commit(self.conn()).await?;
        self.open = false;
        self.outbox.announce(published, due_now);
        Ok(())
    }

    /// Rolls back; a failed rollback leaves the transaction open, and its
    /// connection is closed when it is dropped.
    pub(crate) async fn rollback(mut self) {
        match B::rollback(self.conn()).await {
            Ok(()) => self.open = false,
            Err(e) => {
                tracing::warn!(module = %self.outbox.module, error = %e, "rollback failed; the connection is closed")
            }
        }
    }
}

/// `duration` in microseconds, at most `i64::MAX`.
fn micros(duration: Duration) -> i64 {
    i64::try_from(duration.as_micros()).unwrap_or(i64::MAX)
}

/// `when` in microseconds since the Unix epoch (0 before it).
fn unix_us(when: SystemTime) -> i64 {
    when.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl<B: Backend> Drop for Tx<B> {
    fn drop(&mut self) {
        if self.open {
            if let Some(conn) = self.conn.take() {
                self.db.give_up(conn);
            }
        }
    }
}
