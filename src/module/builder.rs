//! Setting up a module: its database, what it publishes, its handlers.

use crate::delivery::batch;
use crate::delivery::batch_queue::BatchQueue;
use crate::delivery::handler::{Handler, HandlerOptions, Typed};
use crate::delivery::registry::{HandlerEntry, HandlerIndex, Handlers};
use crate::effects::journal::Journal;
use crate::error::{Error, Result};
use crate::message::{now_us, Message};
use crate::metrics::{HandlerCounters, Mailbox};
use crate::module::core::{sample_outbox_periodically, ModuleCore};
use crate::module::handle::ModuleHandle;
use crate::outbox::Outbox;
use crate::redact::SecretUrl;
use crate::retention::Retention;
use crate::store::backend::{Backend, Schemas};
use crate::store::database::Database;
use crate::store::deadline::{CallWatch, Deadlines, MIN_DEADLINE};
use crate::store::settings::{MigrationSet, StoreSettings};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

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
    pub(crate) settings: StoreSettings,
    max_payload_bytes: usize,
    retention: Retention,
    metrics_interval: Duration,
    publishes: HashSet<&'static str>,
    handlers: Vec<HandlerEntry<B>>,
}

impl<B: Schemas> ModuleBuilder<B> {
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
                url: SecretUrl::new(url),
                schema: None,
                pool_size: B::DEFAULT_POOL_SIZE,
                checkout_timeout: Duration::from_secs(30),
                deadlines: Deadlines::default(),
                longest_transaction: Deadlines::default().transaction,
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
    /// ```no_run
    /// # use tickbox::{Module, Sqlite};
    /// use diesel_migrations::{embed_migrations, EmbeddedMigrations};
    /// # use tickbox::diesel_migrations;
    /// // The folder, relative to the crate's root, holds one folder per
    /// // migration: 2026-12-07-120000_create_reservations/up.sql, …
    /// const WAREHOUSE: EmbeddedMigrations =
    ///     embed_migrations!("examples/quick_start/migrations/warehouse");
    /// # async fn start() -> tickbox::Result<()> {
    /// let warehouse = Module::<Sqlite>::builder("warehouse", "data/warehouse.db")
    ///     .migrations(&WAREHOUSE)
    ///     .start()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// The README's quick start shows it whole, with the migrations' files.
    ///
    /// They are recorded in diesel's own table (`__diesel_schema_migrations`),
    /// as the diesel CLI records them, so `diesel migration run` and this
    /// agree. tickbox keeps its own versions apart (`tickbox_schema_version`),
    /// so the application's migrations never look like a newer tickbox's.
    ///
    /// Name each migration's folder as `diesel migration generate NAME`
    /// does, `YYYY-MM-DD-HHMMSS_name`, at the date and time it is written.
    /// diesel records tickbox's own migrations in that table too, so their
    /// versions are reserved: those of tickbox's migrations on every
    /// backend, all named at midnight (`YYYY-MM-DD-000000_…`). A module
    /// given a migration with one of them fails to start with
    /// [`Error::Config`] naming the folder, on every backend alike.
    pub fn migrations(
        mut self,
        migrations: &'static diesel_migrations::EmbeddedMigrations,
    ) -> Self {
        self.settings.app_migrations = Some(MigrationSet(migrations));
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

    /// How long one of tickbox's own calls to this module's database may
    /// take (default 10 s): a claim, a mark, a scan page, the
    /// subscriptions' upkeep, a gauge's reading, an operator's query. Half
    /// way it is reported; at the deadline its connection is closed and the
    /// call fails with [`Error::Deadline`] (transient: it runs again). Its
    /// statements are short and indexed: raise it only for a database that
    /// is slow to answer even when healthy.
    pub fn call_deadline(mut self, deadline: Duration) -> Self {
        self.settings.deadlines.call = deadline;
        self
    }

    /// How long a transaction on this module's database may take, BEGIN
    /// to COMMIT (default 30 s): one run through
    /// [`ModuleHandle::transaction`] or [`ModuleHandle::read`], and one
    /// delivery to a handler that sets no deadline of its own
    /// ([`HandlerOptions::deadline`]). Past it the transaction is dropped,
    /// its connection closed (the server rolls it back) and it fails with
    /// [`Error::Deadline`]; a delivery is retried.
    ///
    /// On PostgreSQL the server is told to end a session idle inside a
    /// transaction, or a statement running, for longer than the longest
    /// of these deadlines plus 5 s, so that locks held by a client that
    /// vanished are released.
    pub fn transaction_deadline(mut self, deadline: Duration) -> Self {
        self.settings.deadlines.transaction = deadline;
        self
    }

    /// How long opening the database may take when the module starts:
    /// connecting, and running tickbox's and the application's migrations
    /// (default 5 minutes; raise it for migrations that build indexes on
    /// big tables).
    pub fn migration_deadline(mut self, deadline: Duration) -> Self {
        self.settings.deadlines.migration = deadline;
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
            deadline: options.deadline,
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

    async fn open(mut self) -> Result<ModuleHandle<B>> {
        self.settings.longest_transaction = self
            .handlers
            .iter()
            .filter_map(|entry| entry.deadline)
            .fold(self.settings.deadlines.transaction, Duration::max);
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
        self.settings.deadlines.validate(name)?;
        let mut seen = HashSet::new();
        for entry in &self.handlers {
            if entry.deadline.is_some_and(|d| d < MIN_DEADLINE) {
                return Err(Error::Config(format!(
                    "module `{name}`: handler `{}`: a deadline below {MIN_DEADLINE:?} would cut healthy deliveries",
                    entry.name
                )));
            }
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
        let name: Arc<str> = Arc::from(name);
        let watch = Arc::new(CallWatch::new(name.clone()));
        let db = Arc::new(Database::new(
            name.clone(),
            pool,
            self.settings.deadlines,
            watch.clone(),
        ));
        if !self.settings.migrate {
            let tables = db
                .call("counting tickbox's tables", async |conn| {
                    Ok(B::count_tables(conn).await?)
                })
                .await?;
            match tables {
                0 => {
                    return Err(Error::NotATickboxDatabase {
                        module: name.to_string(),
                        url: self.settings.url.redacted(),
                    })
                }
                crate::store::catalog::TABLES => {
                    let latest = crate::store::catalog::LATEST_MIGRATION;
                    let migrated = db
                        .call("reading tickbox's schema version", async |conn| {
                            Ok(B::has_migration(conn, latest).await?)
                        })
                        .await?;
                    if !migrated {
                        return Err(Error::SchemaVersion {
                            module: name.to_string(),
                            reason: format!("was migrated by an older version of tickbox (migration {latest} is missing); start the application once with this version (it migrates its databases), then try again"),
                        });
                    }
                }
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
                (HandlerIndex::nth(index), waiting)
            })
            .collect();
        if self.settings.migrate {
            // The module's name, for tools that attach by URL, and its
            // handlers' first start, for the ordering keys.
            let module = name.clone();
            let names: Vec<Arc<str>> = handlers.iter().map(|entry| entry.name.clone()).collect();
            db.write_call("recording the module's start", async move |conn| {
                let now = now_us();
                B::record_module_start(conn, &module, now).await?;
                let names: Vec<&str> = names.iter().map(|name| &**name).collect();
                Ok(B::record_handler_starts(conn, &names, now).await?)
            })
            .await?;
        }
        let outbox = Arc::new(Outbox::new(
            name.clone(),
            self.publishes,
            self.max_payload_bytes,
            wakeup,
        ));
        // A module without handlers makes no effects: it reads a journal
        // other processes' handlers made, if there is one, and makes none.
        // One with handlers opens (and makes) its journal now, so that a
        // journal that cannot be opened stops the module here rather than
        // failing its deliveries.
        let makes_effects = self.settings.migrate && !handlers.is_empty();
        let journal = Arc::new(Journal::new(
            StoreSettings {
                migrate: makes_effects,
                ..self.settings.clone()
            },
            watch,
        ));
        if makes_effects {
            journal.open().await?;
        }
        let handlers = Arc::new(Handlers {
            module: name.clone(),
            db: db.clone(),
            outbox: outbox.clone(),
            entries: handlers,
            journal,
        });
        let core = Arc::new(ModuleCore {
            mailbox: Mailbox::new(&name),
            name,
            db,
            outbox,
            handlers,
            retention: self.retention,
        });
        tracing::info!(module = %core.name, backend = B::NAME, handlers = core.handlers.entries.len(), "module started");
        tokio::spawn(sample_outbox_periodically(
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
            tokio::spawn(batch::run_batches(
                Arc::downgrade(&core.handlers),
                handler,
                waiting,
                batches_at_once,
            ));
        }
        Ok(ModuleHandle::start(core))
    }
}
