//! Modules: actors that own a database, its outbox and inbox, and handlers.

use crate::backend::{Backend, StoreSettings, WakeupChannel};
use crate::batch::{self, BatchQueue};
use crate::error::{Error, Result};
use crate::handler::{ErasedHandler, Handler, HandlerOptions, Typed};
use crate::inbox::{self, DeliveryError, Outcome};
use crate::message::{Envelope, Message};
use crate::metrics::{HandlerCounters, Mailbox, ModuleMetrics, OutboxGauges};
use crate::retention::Retention;
use crate::retry::RetryPolicy;
use crate::tx::{Mode, Tx, TxFn};
use actix::{Actor, Addr, Context, ResponseFuture};
use futures_util::FutureExt;
use std::collections::HashSet;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

/// Committed messages the bus has not received yet are held in memory up to
/// this many per module; past it the bus finds them in the outbox table.
const ANNOUNCE_CAPACITY: usize = 4096;

/// Sets up a module: its database, what it publishes and its handlers.
///
/// ```no_run
/// # use tickbox::{Module, Sqlite};
/// # async fn start() -> tickbox::Result<()> {
/// let orders = Module::<Sqlite>::builder("orders", "data/orders.db")
///     .start()
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `start` is called"]
pub struct ModuleBuilder<B: Backend> {
    settings: StoreSettings,
    max_payload_bytes: usize,
    retention: Retention,
    metrics_interval: Duration,
    publishes: HashSet<&'static str>,
    handlers: Vec<HandlerEntry<B>>,
}

/// A registered handler.
pub(crate) struct HandlerEntry<B: Backend> {
    pub(crate) name: Arc<str>,
    pub(crate) handler: Arc<dyn ErasedHandler<B>>,
    /// Overrides the bus's retry policy for this handler.
    pub(crate) retry: Option<RetryPolicy>,
    /// Most messages handled in one transaction (1: no batching).
    pub(crate) max_batch: usize,
    /// Where deliveries wait for a batch, when `max_batch` is above 1.
    pub(crate) batches: Option<BatchQueue>,
    pub(crate) counters: HandlerCounters,
}

#[cfg(feature = "postgres")]
impl ModuleBuilder<crate::Postgres> {
    /// Keeps the module's tables in this schema (created if missing)
    /// instead of the connection's default one. Lets several modules share
    /// one database while each owns its tables.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.settings.schema = Some(schema.into());
        self
    }
}

impl<B: Backend> ModuleBuilder<B> {
    /// Starts a builder for module `name` on the database at `url`: an SQLite
    /// file path for `Sqlite`, a `postgres://` URL for
    /// `Postgres`.
    pub(crate) fn new(name: impl Into<String>, url: impl Into<String>) -> Self {
        ModuleBuilder {
            settings: StoreSettings {
                module: name.into(),
                url: url.into(),
                schema: None,
                pool_size: B::DEFAULT_POOL_SIZE,
                checkout_timeout: Duration::from_secs(30),
                migrate: true,
                app_migrations: None,
            },
            max_payload_bytes: 256 * 1024,
            retention: Retention::default(),
            metrics_interval: Duration::from_secs(5),
            publishes: HashSet::new(),
            handlers: Vec::new(),
        }
    }

    /// The application's own migrations for this module's tables, run when
    /// the module starts, after tickbox's own and under the same lock (so
    /// processes starting together run them once):
    ///
    /// ```ignore
    /// use tickbox::diesel_migrations::{self, embed_migrations, EmbeddedMigrations};
    /// const WAREHOUSE: EmbeddedMigrations = embed_migrations!("migrations/warehouse");
    /// Module::<Sqlite>::builder("warehouse", "data/warehouse.db").migrations(&WAREHOUSE)
    /// ```
    ///
    /// They are recorded in diesel's own table (`__diesel_schema_migrations`),
    /// as the diesel CLI records them, so `diesel migration run` and this
    /// agree. tickbox keeps its own versions apart (`tickbox_schema_version`),
    /// so the application's migrations never look like a newer tickbox's.
    pub fn migrations(
        mut self,
        migrations: &'static diesel_migrations::EmbeddedMigrations,
    ) -> Self {
        self.settings.app_migrations = Some(crate::backend::AppMigrations(migrations));
        self
    }

    /// Connections in the module's pool; each running transaction holds one.
    pub fn pool_size(mut self, size: usize) -> Self {
        self.settings.pool_size = size;
        self
    }

    /// How long a transaction waits for a free connection before failing
    /// (default 30 s).
    pub fn checkout_timeout(mut self, timeout: Duration) -> Self {
        self.settings.checkout_timeout = timeout;
        self
    }

    /// Largest encoded message this module may publish (default 256 KiB).
    pub fn max_payload_bytes(mut self, limit: usize) -> Self {
        self.max_payload_bytes = limit;
        self
    }

    /// Declares that this module publishes messages of type `M`. Publishing
    /// an undeclared type fails, and the bus refuses subscriptions to topics
    /// no module declares — both catch a mistyped topic early.
    pub fn publishes<M: Message>(mut self) -> Self {
        self.publishes.insert(M::TOPIC);
        self
    }

    /// Subscribes `handler` to its message type under `name`.
    ///
    /// The name is half of the inbox key: keep it stable across releases (a
    /// renamed handler would process old messages again) and unique within
    /// the module.
    pub fn handler<H: Handler<B>>(self, name: impl Into<String>, handler: H) -> Self {
        self.handler_with(name, handler, HandlerOptions::new())
    }

    /// Like [`ModuleBuilder::handler`], with [`HandlerOptions`]: a retry
    /// policy of its own, batches of messages per transaction.
    pub fn handler_with<H: Handler<B>>(
        mut self,
        name: impl Into<String>,
        handler: H,
        options: HandlerOptions,
    ) -> Self {
        let name = name.into();
        let counters = HandlerCounters::new(&self.settings.module, &name, H::Message::TOPIC);
        self.handlers.push(HandlerEntry {
            name: Arc::from(name),
            handler: Arc::new(Typed(handler)),
            retry: options.retry,
            max_batch: options.max_batch,
            batches: None,
            counters,
        });
        self
    }

    /// How often the module reads its outbox gauges (pending count, lag,
    /// dead letters) from its database (default 5 s). Indexed queries, never
    /// one per message.
    pub fn metrics_interval(mut self, interval: Duration) -> Self {
        self.metrics_interval = interval;
        self
    }

    /// How long processed inbox rows and delivered outbox rows are kept
    /// (default: [`Retention::default`], seven days). The bus refuses an
    /// inbox window shorter than a handler's redelivery horizon.
    pub fn retention(mut self, retention: Retention) -> Self {
        self.retention = retention;
        self
    }

    /// Checks the configuration, opens the database (running tickbox's
    /// migrations) and starts the module actor.
    pub async fn start(self) -> Result<ModuleHandle<B>> {
        self.open().await
    }

    /// Opens an existing module database without running migrations, for
    /// tools that inspect or repair it while the application runs elsewhere.
    /// Fails with [`Error::NotATickboxDatabase`] when the database has no
    /// tickbox tables.
    pub async fn attach(mut self) -> Result<ModuleHandle<B>> {
        self.settings.migrate = false;
        self.open().await
    }

    async fn open(self) -> Result<ModuleHandle<B>> {
        let name = self.settings.module.trim();
        if name.is_empty() {
            return Err(Error::Config("a module name must not be empty".into()));
        }
        if self.settings.pool_size == 0 {
            return Err(Error::Config(format!(
                "module `{name}`: pool_size must be at least 1"
            )));
        }
        if self.max_payload_bytes == 0 {
            return Err(Error::Config(format!(
                "module `{name}`: max_payload_bytes must be at least 1"
            )));
        }
        if self.metrics_interval.is_zero() {
            return Err(Error::Config(format!(
                "module `{name}`: the metrics interval must be above zero"
            )));
        }
        if self.retention.interval.is_zero() {
            return Err(Error::Config(format!(
                "module `{name}`: the retention interval must be above zero"
            )));
        }
        let mut seen = HashSet::new();
        for entry in &self.handlers {
            if let Some(policy) = &entry.retry {
                policy.validate()?;
            }
            if entry.name.trim().is_empty() {
                return Err(Error::Config(format!(
                    "module `{name}`: a handler name must not be empty"
                )));
            }
            if entry.max_batch == 0 {
                return Err(Error::Config(format!(
                    "module `{name}`: handler `{}`: a batch holds at least 1 message",
                    entry.name
                )));
            }
            if !seen.insert(entry.name.clone()) {
                return Err(Error::DuplicateHandler {
                    module: name.to_string(),
                    handler: entry.name.to_string(),
                });
            }
        }
        let (pool, wakeup) = B::open(&self.settings).await?;
        if !self.settings.migrate {
            let mut conn = B::checkout(&pool).await.map_err(|reason| Error::Pool {
                module: name.to_string(),
                reason,
            })?;
            match B::count_tables(&mut conn).await? {
                0 => {
                    return Err(Error::NotATickboxDatabase {
                        module: name.to_string(),
                        url: crate::error::redact_url(&self.settings.url),
                    })
                }
                crate::backend::TABLES => {}
                _ => {
                    return Err(Error::SchemaVersion {
                        module: name.to_string(),
                        reason: "has the tables of an older version of tickbox; start the application once with this version (it migrates its databases), then try again".into(),
                    })
                }
            }
        }
        let mut handlers = self.handlers;
        let batch_queues: Vec<_> = handlers
            .iter_mut()
            .enumerate()
            .filter(|(_, entry)| entry.max_batch > 1)
            .map(|(index, entry)| {
                let (queue, waiting) = BatchQueue::new();
                entry.batches = Some(queue);
                (index, waiting)
            })
            .collect();
        let (sender, receiver) = mpsc::channel(ANNOUNCE_CAPACITY);
        let core = Arc::new(ModuleCore {
            name: Arc::from(name),
            pool,
            publishes: self.publishes,
            max_payload_bytes: self.max_payload_bytes,
            retention: self.retention,
            handlers,
            mailbox: Mailbox::new(name),
            outbox: OutboxGauges::new(name),
            announced: sender,
            announcements: Mutex::new(Some(receiver)),
            scan_requested: AtomicBool::new(false),
            wake: Notify::new(),
            wakeup,
            busy: std::sync::atomic::AtomicUsize::new(0),
            claimant: Mutex::new(None),
            write_gate: B::ONE_WRITER.then(|| Arc::new(tokio::sync::Semaphore::new(1))),
        });
        tracing::info!(module = %core.name, backend = B::NAME, handlers = core.handlers.len(), "module started");
        actix::spawn(sample_outbox_periodically(
            Arc::downgrade(&core),
            self.metrics_interval,
        ));
        // Batches of one module's handlers share its connections: as many
        // run at once as the database takes writers, at most half the pool.
        let batches_at_once = if B::ONE_WRITER {
            1
        } else {
            self.settings.pool_size.div_ceil(2)
        };
        for (handler, waiting) in batch_queues {
            actix::spawn(batch::run_batches(
                Arc::downgrade(&core),
                handler,
                waiting,
                batches_at_once,
            ));
        }
        let addr = Module { core: core.clone() }.start();
        Ok(ModuleHandle { core, addr })
    }
}

/// A module's state, shared by its actor, its handle, its transactions and
/// the bus.
pub(crate) struct ModuleCore<B: Backend> {
    pub(crate) name: Arc<str>,
    pub(crate) pool: B::Pool,
    /// Topics this module may publish.
    pub(crate) publishes: HashSet<&'static str>,
    pub(crate) max_payload_bytes: usize,
    pub(crate) retention: Retention,
    pub(crate) handlers: Vec<HandlerEntry<B>>,
    pub(crate) mailbox: Mailbox,
    /// The outbox as last read by the bus, and its delivered count.
    pub(crate) outbox: OutboxGauges,
    /// Committed messages on their way to the bus (the fast path: no polling).
    announced: mpsc::Sender<Arc<Envelope>>,
    /// The receiving end, taken by the bus when the module joins it.
    announcements: Mutex<Option<mpsc::Receiver<Arc<Envelope>>>>,
    /// Set when the bus must look in the outbox table: a committed message
    /// did not fit in the channel, or another process committed messages
    /// (PostgreSQL notification).
    pub(crate) scan_requested: AtomicBool,
    /// Wakes the bus after a scan is requested.
    pub(crate) wake: Notify,
    /// PostgreSQL: the channel that wakes buses when messages no bus of the
    /// committing process will deliver are committed, and the URL a bus
    /// listens on it with. `None` on SQLite.
    pub(crate) wakeup: Option<WakeupChannel>,
    /// Messages of this outbox the bus holds in memory (in delivery or
    /// waiting for a retry).
    pub(crate) busy: std::sync::atomic::AtomicUsize,
    /// The bus this module joined and its claim lease: messages are written
    /// already claimed by it, so no other process's bus delivers them while
    /// this one does.
    /// Cleared when that bus stops, so that later commits are written
    /// unclaimed (and, on PostgreSQL, wake other processes' buses) instead of
    /// waiting for a dead claim's lease.
    claimant: Mutex<Option<(uuid::Uuid, Duration)>>,
    /// One permit per writer the database takes at once, when it takes one
    /// (SQLite): this process's writers queue here, fairly, rather than
    /// sleep in the database's busy handler.
    write_gate: Option<Arc<tokio::sync::Semaphore>>,
}

impl<B: Backend> ModuleCore<B> {
    /// Hands messages that just committed to the bus.
    pub(crate) fn announce(&self, published: Vec<Envelope>) {
        self.outbox.published(published.len() as u64);
        let mut overflowed = false;
        for envelope in published {
            if self.announced.try_send(Arc::new(envelope)).is_err() {
                overflowed = true;
            }
        }
        if overflowed {
            self.request_scan();
        }
    }

    /// The bus delivering this module's messages in this process, and its
    /// claim lease.
    pub(crate) fn claimant(&self) -> Option<(uuid::Uuid, Duration)> {
        *self.claimant.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `bus` delivers this module's messages from now on
    /// (`Some`), or that it stopped (`None`, only if it is still `bus`).
    pub(crate) fn set_claimant(&self, bus: uuid::Uuid, lease: Option<Duration>) {
        let mut claimant = self.claimant.lock().unwrap_or_else(|p| p.into_inner());
        match lease {
            Some(lease) => *claimant = Some((bus, lease)),
            None if claimant.is_some_and(|(id, _)| id == bus) => *claimant = None,
            None => {}
        }
    }

    /// Asks the bus to scan the outbox table from the beginning. Requests
    /// made while it is busy collapse into one.
    pub(crate) fn request_scan(&self) {
        self.scan_requested.store(true, Relaxed);
        self.wake.notify_one();
    }

    /// Waits for this process's turn to write, where the database takes one
    /// writer at a time.
    pub(crate) async fn write_turn(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        match &self.write_gate {
            Some(gate) => gate.clone().acquire_owned().await.ok(),
            None => None,
        }
    }

    /// A connection from the pool, outside any transaction.
    pub(crate) async fn connection(&self) -> Result<B::Pooled> {
        B::checkout(&self.pool).await.map_err(|reason| Error::Pool {
            module: self.name.to_string(),
            reason,
        })
    }

    /// A connection for statements that write, taken in this process's turn.
    pub(crate) async fn write_connection(&self) -> Result<WriteConnection<B>> {
        let turn = self.write_turn().await;
        Ok(WriteConnection {
            conn: self.connection().await?,
            _turn: turn,
        })
    }

    /// Committed messages announced to the bus and not yet taken by it.
    pub(crate) fn announced_waiting(&self) -> usize {
        self.announced.max_capacity() - self.announced.capacity()
    }

    /// Returns the stream of committed messages when the bus it joined
    /// stops, so that the module can join another.
    pub(crate) fn give_back_announcements(&self, announcements: mpsc::Receiver<Arc<Envelope>>) {
        *self.announcements.lock().unwrap_or_else(|p| p.into_inner()) = Some(announcements);
    }

    /// Takes the stream of committed messages; a module joins one bus at a
    /// time.
    pub(crate) fn take_announcements(&self) -> Result<mpsc::Receiver<Arc<Envelope>>> {
        self.announcements
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| Error::AlreadyAttached(self.name.to_string()))
    }
}

/// A module: an actor the bus sends one delivery per handler and message;
/// it runs each delivery through the inbox guard in its own task, so one slow
/// handler never holds up the mailbox.
pub struct Module<B: Backend> {
    core: Arc<ModuleCore<B>>,
}

impl<B: Backend> Module<B> {
    /// Starts building a module; see [`ModuleBuilder`].
    pub fn builder(name: impl Into<String>, url: impl Into<String>) -> ModuleBuilder<B> {
        ModuleBuilder::new(name, url)
    }
}

impl<B: Backend> Actor for Module<B> {
    type Context = Context<Self>;
}

/// Reads the outbox gauges now and every `interval` for as long as the
/// module exists, whether or not a bus runs (a stopped bus shows as lag).
async fn sample_outbox_periodically<B: Backend>(
    core: std::sync::Weak<ModuleCore<B>>,
    interval: Duration,
) {
    while let Some(core) = core.upgrade() {
        sample_outbox(core).await;
        tokio::time::sleep(interval).await;
    }
}

/// Reads the outbox backlog and the dead-letter count into the module's
/// gauges.
async fn sample_outbox<B: Backend>(core: Arc<ModuleCore<B>>) {
    let sampled = async {
        let mut conn = core.connection().await?;
        let (pending, oldest) = B::outbox_backlog(&mut conn).await?;
        let dead = B::count_dead_letters(&mut conn).await?;
        drop(conn);
        let now = crate::message::now_us();
        core.outbox.sampled(pending, oldest, dead, now);
        let subscriptions = crate::subscription::read(&core).await?;
        core.outbox.subscriptions_sampled(subscriptions, now);
        Ok::<_, Error>(())
    };
    if let Err(error) = sampled.await {
        tracing::debug!(module = %core.name, %error, "reading outbox gauges failed");
    }
}

/// Asks a module actor to run one delivery of a message to one of its
/// handlers. Sent by the bus.
#[derive(Debug, Clone)]
pub(crate) struct Deliver {
    pub(crate) envelope: Arc<Envelope>,
    pub(crate) handler: usize,
    pub(crate) attempt: u32,
}

impl actix::Message for Deliver {
    type Result = std::result::Result<Outcome, DeliveryError>;
}

impl<B: Backend> actix::Handler<Deliver> for Module<B> {
    type Result = ResponseFuture<std::result::Result<Outcome, DeliveryError>>;

    fn handle(&mut self, deliver: Deliver, _: &mut Context<Self>) -> Self::Result {
        let core = self.core.clone();
        core.mailbox.started();
        Box::pin(async move {
            let batches = core.handlers[deliver.handler].batches.as_ref();
            let result = match batches {
                // A retry runs alone: a message that failed once fails a
                // whole batch too often.
                Some(batches) if deliver.attempt == 1 => batches.submit(deliver).await,
                // Its own task: a transaction is never dropped half way, even
                // if the caller stops waiting.
                _ => tokio::spawn(inbox::guard(core.clone(), deliver))
                    .await
                    .unwrap_or_else(|e| Err(DeliveryError::stopped(e.to_string()))),
            };
            core.mailbox.finished();
            result
        })
    }
}

/// A pooled connection holding this process's turn to write.
pub(crate) struct WriteConnection<B: Backend> {
    conn: B::Pooled,
    _turn: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<B: Backend> std::ops::Deref for WriteConnection<B> {
    type Target = B::Connection;
    fn deref(&self) -> &B::Connection {
        &self.conn
    }
}

impl<B: Backend> std::ops::DerefMut for WriteConnection<B> {
    fn deref_mut(&mut self) -> &mut B::Connection {
        &mut self.conn
    }
}

/// Sizes of a module's tickbox tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StoreStats {
    /// Outbox messages not yet delivered to all their subscribers.
    pub outbox_pending: i64,
    /// When the oldest of them was published (µs since the Unix epoch).
    pub oldest_pending_us: Option<i64>,
    /// Rows in the inbox (the duplicate-detection window).
    pub inbox_rows: i64,
    /// Dead letters waiting for an operator.
    pub dead_letters: i64,
}

/// What application code holds of a started module: run transactions, read
/// metrics, give it to a [`BusBuilder`](crate::BusBuilder).
pub struct ModuleHandle<B: Backend> {
    pub(crate) core: Arc<ModuleCore<B>>,
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
    /// The module's name.
    pub fn name(&self) -> &str {
        &self.core.name
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
        self.core.wakeup.as_ref().map(|w| w.channel.as_str())
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
            + TxFn<&'r mut Tx<B>, std::result::Result<R, E>, Fut: Send>
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
            + TxFn<&'r mut Tx<B>, std::result::Result<R, E>, Fut: Send>
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
            + TxFn<&'r mut Tx<B>, std::result::Result<R, E>, Fut: Send>
            + Send
            + 'static,
        R: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        let core = self.core.clone();
        let task = tokio::spawn(async move {
            let mut tx = Tx::begin(core, mode).await?;
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
        });
        match task.await {
            Ok(result) => result,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(_) => Err(Error::Stopped("the module's runtime").into()),
        }
    }

    /// The number of outbox messages not yet delivered to all their
    /// subscribers, and when the oldest of them was published (microseconds
    /// since the Unix epoch).
    pub async fn outbox_backlog(&self) -> Result<(i64, Option<i64>)> {
        let mut conn = self.connection().await?;
        Ok(B::outbox_backlog(&mut conn).await?)
    }

    /// Sizes of the module's tickbox tables, read from the database.
    pub async fn store_stats(&self) -> Result<StoreStats> {
        let mut conn = self.connection().await?;
        let (outbox_pending, oldest_pending_us) = B::outbox_backlog(&mut conn).await?;
        let (inbox_rows, dead_letters) = B::table_sizes(&mut conn).await?;
        Ok(StoreStats {
            outbox_pending,
            oldest_pending_us,
            inbox_rows,
            dead_letters,
        })
    }

    /// A connection from the module's pool, outside any transaction.
    pub(crate) async fn connection(&self) -> Result<B::Pooled> {
        self.core.connection().await
    }

    /// A connection for statements that write, taken in this process's turn.
    pub(crate) async fn write_connection(&self) -> Result<WriteConnection<B>> {
        self.core.write_connection().await
    }

    /// Closes the module's connection pool: idle connections close now,
    /// connections in use when they are returned, and later transactions
    /// fail with [`Error::Pool`]. Stop the bus first. Dropping every handle
    /// (and the bus) closes the pool too; this does it at a known moment.
    pub fn close(&self) {
        B::close(&self.core.pool);
    }

    /// A snapshot of the module's mailbox and handler counters.
    pub fn metrics(&self) -> ModuleMetrics {
        let (mailbox_queued, mailbox_in_flight) = self.core.mailbox.depth();
        ModuleMetrics {
            module: self.core.name.to_string(),
            mailbox_queued,
            mailbox_in_flight,
            outbox: self.core.outbox.snapshot(),
            handlers: self
                .core
                .handlers
                .iter()
                .map(|h| h.counters.snapshot(&h.name, h.handler.topic()))
                .collect(),
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
        let index = self
            .core
            .handlers
            .iter()
            .position(|h| &*h.name == handler)
            .ok_or_else(|| {
                DeliveryError::new(
                    crate::FailureKind::NoSuchHandler,
                    format!("module `{}` has no handler `{handler}`", self.name()),
                )
            })?;
        if self.core.handlers[index].handler.topic() != envelope.topic {
            return Err(DeliveryError::new(
                crate::FailureKind::NoSuchHandler,
                format!(
                    "handler `{handler}` subscribes to `{}`, not `{}`",
                    self.core.handlers[index].handler.topic(),
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
        handler: usize,
        attempt: u32,
    ) -> std::result::Result<Outcome, DeliveryError> {
        self.core.mailbox.sent();
        let sent = self.addr.send(Deliver {
            envelope,
            handler,
            attempt,
        });
        sent.await.unwrap_or_else(|e| {
            self.core.mailbox.lost();
            Err(DeliveryError::stopped(e.to_string()))
        })
    }
}
