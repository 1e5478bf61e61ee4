//! A module transaction: the connection handlers and application code change
//! their data with, and the place they publish messages from.

use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::message::{now_us, Envelope, Message};
use crate::module::ModuleCore;
use crate::schema::{Id, OutboxRow};
use std::future::Future;
use std::sync::Arc;
use uuid::Uuid;

/// An open transaction on a module's database.
///
/// Change the module's own tables through [`Tx::conn`] with diesel, and
/// publish messages with [`Tx::publish`]: the messages are written to the
/// module's outbox in this same transaction, so they exist if and only if it
/// commits. Inside a handler the transaction also holds the inbox row of the
/// message being handled, which the handler receives as its
/// [`Delivery`].
pub struct Tx<B: Backend> {
    /// The pooled connection the whole transaction runs on.
    conn: B::Pooled,
    /// This process's turn to write, held to the end of a write
    /// transaction where the database takes one writer at a time.
    _turn: Option<tokio::sync::OwnedSemaphorePermit>,
    /// The module whose database this is: its name, what it may publish,
    /// where committed messages are announced.
    module: Arc<ModuleCore<B>>,
    /// The message being handled, when the transaction belongs to a handler;
    /// messages published here are caused by it.
    delivery: Option<Delivery>,
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

/// The delivery a handler's transaction is processing.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The message being handled.
    pub envelope: Arc<Envelope>,
    /// The handler's name (the other half of the inbox key).
    pub handler: Arc<str>,
    /// 1 for the first delivery to this handler, then 2, 3… on retries.
    pub attempt: u32,
}

impl Delivery {
    /// A key that is the same every time this message is delivered to this
    /// handler, and different for any other pair. Pass it to external systems
    /// that accept an idempotency key (payment APIs, mail services): an
    /// external call is not part of the database transaction, so a crash after
    /// the call and before COMMIT repeats it, and only such a key makes the
    /// repeat harmless.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}", self.envelope.id, self.handler)
    }
}

impl<B: Backend> Tx<B> {
    /// Checks out a connection and begins a transaction.
    pub(crate) async fn begin(module: Arc<ModuleCore<B>>, mode: Mode) -> Result<Self> {
        let turn = match mode {
            Mode::Write => module.write_turn().await,
            Mode::Read => None,
        };
        let mut conn = module.connection().await?;
        match mode {
            Mode::Write => B::begin(&mut conn).await?,
            Mode::Read => B::begin_read(&mut conn).await?,
        }
        Ok(Tx {
            conn,
            _turn: turn,
            module,
            delivery: None,
            mode,
            published: Vec::new(),
            requeued: false,
        })
    }

    /// The connection, for the module's own diesel queries.
    pub fn conn(&mut self) -> &mut B::Connection {
        &mut self.conn
    }

    /// The name of the module whose database this transaction writes.
    pub fn module(&self) -> &str {
        &self.module.name
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
        if self.mode == Mode::Read {
            return Err(Error::ReadOnly {
                module: self.module.name.to_string(),
                topic: M::TOPIC.to_string(),
            });
        }
        if !self.module.publishes.contains(M::TOPIC) {
            return Err(Error::UnknownTopic {
                module: self.module.name.to_string(),
                topic: M::TOPIC.to_string(),
            });
        }
        let payload = serde_json::to_string(message).map_err(|source| Error::Encode {
            topic: M::TOPIC.to_string(),
            source,
        })?;
        if payload.len() > self.module.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                topic: M::TOPIC.to_string(),
                size: payload.len(),
                limit: self.module.max_payload_bytes,
            });
        }
        let cause = self.delivery.as_ref().map(|d| &*d.envelope);
        let envelope = Envelope::new(M::TOPIC, payload, cause);
        let id = envelope.id;
        self.published.push(envelope);
        Ok(id)
    }

    /// The module this transaction belongs to.
    pub(crate) fn module_core(&self) -> &Arc<ModuleCore<B>> {
        &self.module
    }

    /// Makes this the transaction of a handler processing `delivery`: what it
    /// publishes from now on is caused by that message.
    pub(crate) fn set_delivery(&mut self, delivery: Delivery) {
        self.delivery = Some(delivery);
    }

    /// Records the inbox row of the delivery; false when it was there already.
    pub(crate) async fn tick_inbox(&mut self) -> Result<bool> {
        let delivery = self
            .delivery
            .as_ref()
            .expect("only handler transactions tick the inbox");
        let (id, handler) = (delivery.envelope.id, delivery.handler.clone());
        Ok(B::tick_inbox(&mut self.conn, id, &handler, now_us()).await?)
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
            .module
            .claimant()
            .map(|(bus, lease)| (Id(bus), committing_us + lease.as_micros() as i64));
        let rows = published
            .iter()
            .map(|envelope| OutboxRow {
                claimed_by: claim.map(|(bus, _)| bus),
                claimed_until_us: claim.map(|(_, until)| until),
                ..OutboxRow::from(envelope)
            })
            .collect();
        if let Err(e) = B::insert_outbox(&mut self.conn, rows).await {
            self.rollback().await;
            return Err(e.into());
        }
        let unclaimed = claim.is_none() && !published.is_empty();
        if let Some(wakeup) = self
            .module
            .wakeup
            .as_ref()
            .filter(|_| unclaimed || self.requeued)
        {
            if let Err(e) = B::notify(&mut self.conn, &wakeup.channel).await {
                self.rollback().await;
                return Err(e.into());
            }
        }
        B::commit(&mut self.conn).await?;
        self.module.announce(published);
        Ok(())
    }

    /// Rolls back; a failed rollback leaves the connection marked broken, and
    /// the pool discards it.
    pub(crate) async fn rollback(mut self) {
        if let Err(e) = B::rollback(&mut self.conn).await {
            tracing::warn!(module = %self.module.name, error = %e, "rollback failed; the connection is discarded");
        }
    }
}

/// An `async` closure that runs inside a module transaction, written
/// `async move |tx| { … }`.
///
/// This trait only exists to require, on stable Rust, that the closure's
/// future is `Send` (so the transaction can run in its own task, where an
/// abandoned caller cannot leave it half done). It is implemented for every
/// such closure; never implement it yourself.
pub trait TxFn<T, R>: AsyncFnOnce(T) -> R + FnOnce(T) -> <Self as TxFn<T, R>>::Fut {
    /// The closure's future.
    type Fut: Future<Output = R>;
}

impl<F, T, Fut, R> TxFn<T, R> for F
where
    F: AsyncFnOnce(T) -> R + FnOnce(T) -> Fut,
    Fut: Future<Output = R>,
{
    type Fut = Fut;
}
