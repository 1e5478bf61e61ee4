//! What application code holds of a started module.

use crate::delivery::attempt::Attempt;
use crate::delivery::registry::{HandlerIndex, Handlers};
use crate::error::outcome::{DeliveryError, FailureKind, Outcome};
use crate::error::{Error, Result};
use crate::message::Envelope;
use crate::metrics::ModuleMetrics;
use crate::module::actor::{Deliver, Module};
use crate::module::core::ModuleCore;
use crate::outbox::Outbox;
use crate::retention::Retention;
use crate::send_async_fn::SendAsyncFn;
use crate::store::backend::Backend;
use crate::store::database::Database;
use crate::store::schema::Id;
use crate::tx::{Mode, Tx};
use actix::{Actor, Addr};
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

/// Sizes of a module's tickbox tables.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    /// Outbox messages not yet delivered to all their subscribers.
    pub outbox_pending: i64,
    /// When the oldest of them was published (µs since the Unix epoch).
    pub oldest_pending_us: Option<i64>,
    /// Rows in the inbox (the duplicate-detection window).
    pub inbox_rows: i64,
    /// Dead letters waiting for an operator.
    pub dead_letters: i64,
    /// Ordering keys held back by a dead letter, per handler: (handler,
    /// keys), handlers without any left out.
    pub parked_keys: Vec<(String, i64)>,
    /// Effects nobody can vouch for, waiting for a person to settle them,
    /// per handler: (handler, effects), handlers without any left out
    /// (see [`ModuleHandle::settle_effect`]).
    pub unknown_effects: Vec<(String, i64)>,
    /// Whether the module's connections to its database server are
    /// encrypted (TLS), as the server sees the connection that read these
    /// figures; `None` on SQLite, which has no server.
    pub encrypted: Option<bool>,
}

/// What application code holds of a started module: run transactions, read
/// metrics, give it to a [`BusBuilder`](crate::BusBuilder).
pub struct ModuleHandle<B: Backend> {
    /// The module's parts; the layers below reach them through the
    /// accessors, each for the part it works on.
    pub(super) core: Arc<ModuleCore<B>>,
    /// The module actor, which runs deliveries.
    addr: Addr<Module<B>>,
}

impl<B: Backend> Clone for ModuleHandle<B> {
    fn clone(&self) -> Self {
        ModuleHandle {
            core: self.core.clone(),
            addr: self.addr.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for ModuleHandle<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModuleHandle")
            .field("name", &self.core.name)
            .field("backend", &B::NAME)
            .finish()
    }
}

impl<B: Backend> ModuleHandle<B> {
    /// Starts the actor of a module just set up.
    pub(crate) fn start(core: Arc<ModuleCore<B>>) -> Self {
        let addr = Module { core: core.clone() }.start();
        ModuleHandle { core, addr }
    }

    /// The module's name.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The module's name, shared.
    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.core.name.clone()
    }

    /// The module's database.
    pub(crate) fn db(&self) -> &Arc<Database<B>> {
        &self.core.db
    }

    /// The module's outbox, as this process sees it.
    pub(crate) fn outbox(&self) -> &Arc<Outbox> {
        &self.core.outbox
    }

    /// The module's handlers.
    pub(crate) fn handlers(&self) -> &Handlers<B> {
        &self.core.handlers
    }

    /// How long the module keeps processed inbox rows and delivered outbox
    /// rows.
    pub(crate) fn retention(&self) -> &Retention {
        &self.core.retention
    }

    /// PostgreSQL: the notification channel of this module's outbox (one per
    /// database and schema, at most 63 bytes). A transaction that publishes
    /// messages while the module has joined no bus sends a notification on
    /// it as it commits, and every bus delivering this outbox listens on it,
    /// so messages committed by another process are delivered at once rather
    /// than at the bus's next periodic scan. A program that writes outbox
    /// rows by other means can wake the buses itself with
    /// `SELECT pg_notify('<channel>', '')`. `None` on SQLite, which has no
    /// notifications.
    pub fn wakeup_channel(&self) -> Option<&str> {
        self.core.outbox.wakeup.as_ref().map(|w| w.channel.as_str())
    }

    /// Runs `f` in a transaction on the module's database and commits it if
    /// `f` returns `Ok`.
    ///
    /// Messages published with [`Tx::publish`] are written to the outbox in
    /// the same transaction: they exist if and only if it commits, and a bus
    /// delivering this outbox is told about them the moment it does — in
    /// memory when the module is on a bus of this process; otherwise, on
    /// PostgreSQL, by a notification on [`ModuleHandle::wakeup_channel`]
    /// (on SQLite another process's bus finds them at its periodic scan).
    /// An `Err` or a panic rolls everything back (the panic then continues
    /// in the caller). The transaction runs in its own task, so dropping the
    /// returned future does not leave it half done.
    ///
    /// ```no_run
    /// # use serde::{Deserialize, Serialize};
    /// # use tickbox::{Message, ModuleHandle, Sqlite};
    /// # #[derive(Serialize, Deserialize)] struct OrderPlaced { order_id: u64 }
    /// # impl Message for OrderPlaced { const TOPIC: &'static str = "orders.order_placed"; }
    /// # async fn place(orders: ModuleHandle<Sqlite>) -> tickbox::Result<()> {
    /// use diesel_async::RunQueryDsl;
    ///
    /// orders
    ///     .transaction(async move |tx| {
    ///         diesel::sql_query("INSERT INTO orders (id) VALUES (7)")
    ///             .execute(tx.conn())
    ///             .await?;
    ///         tx.publish(&OrderPlaced { order_id: 7 })?;
    ///         Ok::<_, tickbox::Error>(())
    ///     })
    ///     .await
    /// # }
    /// ```
    pub async fn transaction<R, E, F>(&self, f: F) -> std::result::Result<R, E>
    where
        for<'r> F: AsyncFnOnce(&'r mut Tx<B>) -> std::result::Result<R, E>
            + SendAsyncFn<&'r mut Tx<B>, std::result::Result<R, E>, Fut: Send>
            + Send
            + 'static,
        R: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        self.run(Mode::Write, f).await
    }

    /// Runs `f` in a read-only transaction: one consistent snapshot of the
    /// module's database, without taking SQLite's write lock (PostgreSQL:
    /// `READ ONLY`). Publishing from it fails. For queries, reports and
    /// monitoring that must not queue behind writers.
    pub async fn read<R, E, F>(&self, f: F) -> std::result::Result<R, E>
    where
        for<'r> F: AsyncFnOnce(&'r mut Tx<B>) -> std::result::Result<R, E>
            + SendAsyncFn<&'r mut Tx<B>, std::result::Result<R, E>, Fut: Send>
            + Send
            + 'static,
        R: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        self.run(Mode::Read, f).await
    }

    /// Runs `f` in a transaction of its own task: commits a write
    /// transaction on `Ok`, rolls back otherwise (and always for reads).
    async fn run<R, E, F>(&self, mode: Mode, f: F) -> std::result::Result<R, E>
    where
        for<'r> F: AsyncFnOnce(&'r mut Tx<B>) -> std::result::Result<R, E>
            + SendAsyncFn<&'r mut Tx<B>, std::result::Result<R, E>, Fut: Send>
            + Send
            + 'static,
        R: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let core = self.core.clone();
        let task = tokio::spawn(async move {
            let db = core.db.clone();
            let operation = match mode {
                Mode::Write => "a transaction",
                Mode::Read => "a read-only transaction",
            };
            // Past its deadline the transaction is dropped: left open, it
            // closes its connection (the server rolls it back).
            let transaction = std::pin::pin!(transact(core, mode, f));
            db.watch
                .within(operation, db.deadlines.transaction, transaction)
                .await
                .unwrap_or_else(|missed| Err(missed.into()))
        });
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::Stopped("the module's runtime").into()),
        }
    }

    /// Sizes of the module's tickbox tables, read from the database now:
    /// the pending outbox messages (and when the oldest was published), the
    /// inbox rows, the dead letters. This is the exact reading; the gauges
    /// of [`ModuleHandle::metrics`] are the same figures as last sampled
    /// (every [`ModuleBuilder::metrics_interval`](crate::ModuleBuilder::metrics_interval)),
    /// for monitoring.
    pub async fn store_stats(&self) -> Result<StoreStats> {
        let (
            (outbox_pending, oldest_pending_us),
            (inbox_rows, dead_letters),
            parked_keys,
            encrypted,
        ) = self
            .core
            .db
            .call("reading the store's figures", async |conn| {
                let backlog = B::outbox_backlog(conn).await?;
                let sizes = B::table_sizes(conn).await?;
                let parked = B::parked_keys(conn).await?;
                let encrypted = B::connection_encrypted(conn).await?;
                Ok((backlog, sizes, parked, encrypted))
            })
            .await?;
        let unknown_effects = self.core.handlers.journal.unknown_per_handler().await?;
        Ok(StoreStats {
            outbox_pending,
            oldest_pending_us,
            inbox_rows,
            dead_letters,
            parked_keys: parked_keys
                .into_iter()
                .map(|p| (p.handler, p.keys))
                .collect(),
            unknown_effects,
            encrypted,
        })
    }

    /// How many outbox messages not yet delivered to all their subscribers
    /// were published before `before_us` (µs since the Unix epoch): what
    /// the bus's watchdog counts as stalled when `before_us` is now less
    /// its stall time. Read from the database now.
    pub async fn pending_published_before(&self, before_us: i64) -> Result<i64> {
        let before = Id::earliest_at(before_us).0;
        self.core
            .db
            .call("counting old pending messages", async move |conn| {
                Ok(B::count_stalled(conn, before).await?)
            })
            .await
    }

    /// Whether a handler named `handler` has run in this module's database
    /// (each module records its handlers when it starts): the module whose
    /// effects journal holds that handler's effects.
    pub async fn runs_handler(&self, handler: &str) -> Result<bool> {
        let handler = handler.to_owned();
        self.core
            .db
            .call("looking for a handler", async move |conn| {
                Ok(B::handler_started_at(conn, &handler).await?.is_some())
            })
            .await
    }

    /// Closes the module's connection pool: idle connections close now,
    /// connections in use when they are returned, and later transactions
    /// fail with [`Error::Pool`]. Stop the bus first. Dropping every handle
    /// (and the bus) closes the pool too; this does it at a known moment.
    pub fn close(&self) {
        self.core.db.close();
        self.core.handlers.journal.close();
    }

    /// A snapshot of the module's mailbox and handler counters.
    pub fn metrics(&self) -> ModuleMetrics {
        let (mailbox_queued, mailbox_in_flight) = self.core.mailbox.depth();
        ModuleMetrics {
            module: self.core.name.to_string(),
            mailbox_queued,
            mailbox_in_flight,
            outbox: self.core.outbox.gauges.snapshot(),
            handlers: self
                .core
                .handlers
                .entries
                .iter()
                .map(|h| h.counters.snapshot(&h.name, h.handler.topic()))
                .collect(),
            effects: self.core.handlers.journal.counters.snapshot(),
            database_calls: self.core.db.watch.snapshot(),
        }
    }

    /// Delivers a message straight to one of this module's handlers, through
    /// the module actor and the inbox guard but not the bus: a duplicate is
    /// skipped, a failure is reported and not retried. For operators' replays
    /// and for tests.
    pub async fn deliver_to(
        &self,
        envelope: Envelope,
        handler: &str,
    ) -> std::result::Result<Outcome, DeliveryError> {
        let index = self.core.handlers.position(handler).ok_or_else(|| {
            DeliveryError::new(
                FailureKind::NoSuchHandler,
                format!("module `{}` has no handler `{handler}`", self.name()),
            )
        })?;
        let topic = self.core.handlers.get(index).handler.topic();
        if topic != envelope.topic {
            return Err(DeliveryError::new(
                FailureKind::NoSuchHandler,
                format!(
                    "handler `{handler}` subscribes to `{topic}`, not `{}`",
                    envelope.topic
                ),
            ));
        }
        self.deliver(Arc::new(envelope), index, 1).await
    }

    /// Sends one delivery to the module actor and waits for its outcome.
    pub(crate) async fn deliver(
        &self,
        envelope: Arc<Envelope>,
        handler: HandlerIndex,
        attempt: u32,
    ) -> std::result::Result<Outcome, DeliveryError> {
        self.core.mailbox.sent();
        let sent = self.addr.send(Deliver(Attempt {
            envelope,
            handler,
            attempt,
        }));
        sent.await.unwrap_or_else(|e| {
            self.core.mailbox.lost();
            Err(DeliveryError::stopped(e.to_string()))
        })
    }
}

/// Begins a transaction on the module's database, runs `f` in it, and
/// commits a write transaction on `Ok`, rolls back otherwise (and always
/// for reads).
async fn transact<B, R, E, F>(
    core: Arc<ModuleCore<B>>,
    mode: Mode,
    f: F,
) -> std::result::Result<R, E>
where
    B: Backend,
    for<'r> F: AsyncFnOnce(&'r mut Tx<B>) -> std::result::Result<R, E>
        + SendAsyncFn<&'r mut Tx<B>, std::result::Result<R, E>, Fut: Send>
        + Send
        + 'static,
    R: Send + 'static,
    E: From<Error> + Send + 'static,
{
    let mut tx = Tx::begin(&core.db, core.outbox.clone(), mode).await?;
    match AssertUnwindSafe(f(&mut tx)).catch_unwind().await {
        Ok(Ok(value)) if mode == Mode::Write => {
            tx.commit().await?;
            Ok(value)
        }
        Ok(Ok(value)) => {
            tx.rollback().await;
            Ok(value)
        }
        Ok(Err(error)) => {
            tx.rollback().await;
            Err(error)
        }
        Err(panic) => {
            tx.rollback().await;
            std::panic::resume_unwind(panic)
        }
    }
}
