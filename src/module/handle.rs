//! What application code holds of a started module.

use crate::delivery::attempt::Attempt;
use crate::delivery::registry::{HandlerIndex, Handlers};
use crate::effects::record::{EffectRecord, Settlement};
use crate::effects::state::EffectState;
use crate::error::outcome::{DeliveryError, FailureKind, Outcome};
use crate::error::{Error, Result};
use crate::message::Envelope;
use crate::metrics::ModuleMetrics;
use crate::module::actor::{Deliver, Module};
use crate::module::core::ModuleCore;
use crate::module::dead_letters::{self, DeadLetter, Replayed};
use crate::module::scheduled::{self, Scheduled};
use crate::module::{subscriptions, sweep};
use crate::outbox::subscription;
use crate::outbox::Outbox;
use crate::retention::{Retention, SweepReport};
use crate::send_async_fn::SendAsyncFn;
use crate::store::backend::Backend;
use crate::store::database::Database;
use crate::store::journal::EffectId;
use crate::store::schema::Id;
use crate::store::subscriptions::Subscription;
use crate::tx::{Mode, Tx};
use actix::{Actor, Addr};
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use uuid::Uuid;

/// Sizes of a module's tickbox tables.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    /// Outbox messages due and not yet delivered to all their subscribers.
    pub outbox_pending: i64,
    /// When the oldest of them was published, or was due if that is later
    /// (µs since the Unix epoch).
    pub oldest_pending_us: Option<i64>,
    /// Scheduled messages not yet due ([`Tx::publish_at`](crate::Tx::publish_at)).
    pub outbox_scheduled: i64,
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
    /// The module actor, which runs deliveries. Shared: cloning an actix
    /// address allocates (two `Arc`s of its own, freed when it is dropped),
    /// and a handle is cloned several times per message (the bus's tasks,
    /// an application's producers): 7.7 allocations per message, counted.
    addr: Arc<Addr<Module<B>>>,
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
        let addr = Arc::new(Module { core: core.clone() }.start());
        ModuleHandle { core, addr }
    }

    /// The module's name.
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// The name of the module that last started on this database, as its
    /// database records it (every module records its name when it starts);
    /// `None` when no module has started on it since its tables were made.
    ///
    /// For tools that attach to a database by its URL
    /// ([`ModuleBuilder::attach`](crate::ModuleBuilder::attach)) and must
    /// say which of the application's modules it belongs to; in the
    /// application itself it is [`ModuleHandle::name`].
    pub async fn recorded_name(&self) -> Result<Option<String>> {
        self.core
            .db
            .call("reading the module's recorded name", async |conn| {
                Ok(B::last_started_module(conn).await?)
            })
            .await
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
        let transaction = async move {
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
        };
        // In the caller's span, so that what it publishes is created in the
        // caller's trace.
        #[cfg(feature = "opentelemetry")]
        let transaction = tracing::Instrument::in_current_span(transaction);
        let task = tokio::spawn(Box::pin(transaction));
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
        let due_now = self.core.outbox.clock.now_us();
        let (backlog, (inbox_rows, dead_letters), parked_keys, encrypted) = self
            .core
            .db
            .call("reading the store's figures", async |conn| {
                let backlog = B::outbox_backlog(conn, due_now).await?;
                let sizes = B::table_sizes(conn).await?;
                let parked = B::parked_keys(conn).await?;
                let encrypted = B::connection_encrypted(conn).await?;
                Ok((backlog, sizes, parked, encrypted))
            })
            .await?;
        let unknown_effects = self.core.handlers.journal.unknown_per_handler().await?;
        Ok(StoreStats {
            outbox_pending: backlog.pending,
            oldest_pending_us: backlog.oldest_us,
            outbox_scheduled: backlog.scheduled,
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

    /// The subscriptions recorded in this module's outbox: every handler, in
    /// any process, that receives its messages, and the oldest message each
    /// still owes.
    ///
    /// A subscription stays when its process stops, and its messages wait
    /// for it (they are delivered when it runs again). One whose handler is
    /// gone for good is retired with
    /// [`ModuleHandle::retire_subscription`].
    pub async fn subscriptions(&self) -> Result<Vec<Subscription>> {
        subscription::read(&self.core.db).await
    }

    /// Retires the subscription of handler `handler` of module `module` from
    /// this module's outbox: its messages are no longer kept for it, and
    /// those only it still owed are marked delivered. Returns how many.
    ///
    /// For a handler removed from the code (or a process gone for good).
    /// Refused ([`Error::SubscriptionInUse`]) while a running process serves
    /// it; a process started later with the handler subscribes it again,
    /// from then on.
    pub async fn retire_subscription(&self, module: &str, handler: &str) -> Result<usize> {
        subscriptions::retire(&self.core, module, handler).await
    }

    /// Runs the retention sweep once: deletes inbox rows, settled effects
    /// and delivered outbox rows older than the module's retention, in small
    /// batches.
    pub async fn sweep_retention(&self) -> Result<SweepReport> {
        sweep::sweep(&self.core).await
    }

    /// The effects in the module's journal that are in one of `states`
    /// (every effect when `states` is empty), least recently changed first,
    /// from `offset`, at most `limit` of them. See
    /// [`Delivery::effect`](crate::Delivery::effect).
    pub async fn effects(
        &self,
        states: &[EffectState],
        offset: u64,
        limit: u64,
    ) -> Result<Vec<EffectRecord>> {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.core
            .handlers
            .journal
            .list(states, clamp(offset), clamp(limit))
            .await
    }

    /// Settles an effect nobody can vouch for (unknown, or left started or
    /// failed): [`Settlement::Done`] when a person checked that it happened
    /// (the next delivery gets the given result back without calling),
    /// [`Settlement::Retry`] to let the next delivery call it once more with
    /// the same key. A succeeded effect cannot be settled. Then replay the
    /// message's dead letter ([`ModuleHandle::replay_dead_letter`], which
    /// runs the handler in this process) or requeue it for the bus that runs
    /// the handler ([`ModuleHandle::requeue_dead_letter`], as the operator's
    /// tool does); returns the effect as it now stands.
    pub async fn settle_effect(
        &self,
        message_id: Uuid,
        handler: &str,
        effect: &str,
        settlement: Settlement,
    ) -> Result<EffectRecord> {
        let id = EffectId {
            message_id,
            handler: handler.to_string(),
            effect: effect.to_string(),
        };
        let settled = self.core.handlers.journal.settle(id, settlement).await?;
        tracing::info!(module = %self.name(), %message_id, handler, effect, state = %settled.state, "effect settled");
        Ok(settled)
    }

    /// Scheduled messages of this module's outbox not yet due, soonest
    /// first: `limit` of them from `offset` ([`Tx::publish_at`]).
    pub async fn scheduled(&self, offset: u64, limit: u64) -> Result<Vec<Scheduled>> {
        scheduled::list(self, offset, limit).await
    }

    /// Scheduled message `id` of this module's outbox, due or not, while it
    /// is pending; `None` once delivered or cancelled, or for a message that
    /// was not scheduled.
    pub async fn scheduled_message(&self, id: Uuid) -> Result<Option<Scheduled>> {
        scheduled::find(self, id).await
    }

    /// Cancels scheduled message `id` if it is not yet due, in a transaction
    /// of its own ([`Tx::cancel_scheduled`]); returns whether it did.
    pub async fn cancel_scheduled(&self, id: Uuid) -> Result<bool> {
        scheduled::cancel(self, id).await
    }

    /// Dead letters of this module, oldest first: `limit` of them from
    /// `offset`.
    pub async fn dead_letters(&self, offset: u64, limit: u64) -> Result<Vec<DeadLetter>> {
        dead_letters::list(self, offset, limit).await
    }

    /// One dead letter, if there is one for this message and handler.
    pub async fn dead_letter(&self, message_id: Uuid, handler: &str) -> Result<Option<DeadLetter>> {
        dead_letters::find(self, message_id, handler).await
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
        dead_letters::replay(self, message_id, handler).await
    }

    /// Gives up on a dead letter without delivering it: deletes it and, for
    /// a keyed one, moves its handler's progress in the key past it, so the
    /// key is no longer parked behind it; the messages parked behind it are
    /// then delivered in the key's order (when this process runs the
    /// handler; otherwise they are put back in this module's outbox, for the
    /// bus that runs it). False if there was no such dead letter.
    pub async fn skip_dead_letter(&self, message_id: Uuid, handler: &str) -> Result<bool> {
        dead_letters::skip(self, message_id, handler).await
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
        dead_letters::requeue(self, message_id, handler).await
    }

    /// Deletes a dead letter without delivering it; false if there was none.
    pub async fn discard_dead_letter(&self, message_id: Uuid, handler: &str) -> Result<bool> {
        dead_letters::discard(self, message_id, handler).await
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
        match sent.await {
            Ok(task) => task
                .await
                .unwrap_or_else(|e| Err(DeliveryError::stopped(e.to_string()))),
            Err(e) => {
                self.core.mailbox.lost();
                Err(DeliveryError::stopped(e.to_string()))
            }
        }
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
