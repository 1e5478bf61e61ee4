//! What tickbox needs from a database, implemented once per backend.
//!
//! Queries that read the same on both dialects are written once, in
//! [`shared_queries!`], and expanded inside each backend's impl so that diesel
//! checks them against the concrete connection type. Only what truly differs
//! (opening a pool, running migrations, how a write transaction begins) is
//! written per backend, in `sqlite.rs` and `postgres.rs`.

use crate::schema::{DeadLetterRow, OutboxRow, SubscriptionRow};
use crate::statement::{Dialect, Row, Statement};
use diesel::QueryResult;
use diesel_async::AsyncConnection;
use std::future::Future;
use std::ops::DerefMut;
use std::time::Duration;
use uuid::Uuid;

/// Where and how a module opens its database.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named only by the sealed trait's hidden methods
pub struct StoreSettings {
    /// The module that owns the database, for error messages.
    pub(crate) module: String,
    /// An SQLite path (or `sqlite://` URL) or a `postgres://` URL.
    pub(crate) url: String,
    /// PostgreSQL only: the schema holding the module's tables.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) schema: Option<String>,
    /// Connections in the module's pool.
    pub(crate) pool_size: usize,
    /// How long a checkout waits for a free connection.
    pub(crate) checkout_timeout: Duration,
    /// Run tickbox's migrations at open (false to attach to an existing
    /// database, as an operator's tool does).
    pub(crate) migrate: bool,
    /// The application's own migrations for this module's database, run
    /// after tickbox's.
    pub(crate) app_migrations: Option<AppMigrations>,
}

/// The application's embedded migrations, as a migration source diesel's
/// harness can take (it takes its source by value).
#[derive(Clone, Copy)]
pub(crate) struct AppMigrations(pub(crate) &'static diesel_migrations::EmbeddedMigrations);

impl std::fmt::Debug for AppMigrations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AppMigrations")
    }
}

impl<DB: diesel::backend::Backend> diesel::migration::MigrationSource<DB> for AppMigrations {
    fn migrations(
        &self,
    ) -> diesel::migration::Result<Vec<Box<dyn diesel::migration::Migration<DB>>>> {
        diesel::migration::MigrationSource::<DB>::migrations(self.0)
    }
}

/// Where a module's commits wake buses in other processes: a PostgreSQL
/// notification channel, one per outbox (per database and schema), and the
/// URL a bus's listener connects to. SQLite modules have none.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named only by the sealed trait's hidden methods
pub struct WakeupChannel {
    /// The module's database URL, for the listener's own connection.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) url: String,
    /// The channel name, at most 63 bytes, used as is (`pg_notify` takes it
    /// as text; `LISTEN` needs it quoted).
    pub(crate) channel: String,
}

/// A database backend: `Sqlite` or
/// `Postgres`.
///
/// The trait is implemented by tickbox for its backends and is not meant to be
/// implemented elsewhere; its hidden methods may change in any release.
pub trait Backend: Sized + Send + Sync + 'static {
    /// The diesel-async connection that handlers and transactions receive.
    type Connection: AsyncConnection + Send + 'static;

    /// A connection pool.
    #[doc(hidden)]
    type Pool: Clone + Send + Sync + 'static;

    /// A connection checked out of the pool; returned to it on drop.
    #[doc(hidden)]
    type Pooled: DerefMut<Target = Self::Connection> + Send + 'static;

    /// A short name for logs and metrics: `sqlite` or `postgres`.
    const NAME: &'static str;

    /// Pool size used when a module does not set one.
    const DEFAULT_POOL_SIZE: usize;

    /// The database takes one writer at a time (SQLite): writers of one
    /// process then queue in memory, first come first served, instead of
    /// polling the database's lock.
    #[doc(hidden)]
    const ONE_WRITER: bool;

    /// Runs the embedded migrations (if `settings.migrate`) and opens the
    /// module's pool; also returns the channel on which commits to the
    /// module's outbox wake buses, where the backend has one (PostgreSQL).
    #[doc(hidden)]
    fn open(
        settings: &StoreSettings,
    ) -> impl Future<Output = crate::Result<(Self::Pool, Option<WakeupChannel>)>> + Send;

    /// Closes the pool: idle connections now, the others when returned.
    #[doc(hidden)]
    fn close(pool: &Self::Pool);

    /// Takes a connection from the pool.
    #[doc(hidden)]
    fn checkout(pool: &Self::Pool) -> impl Future<Output = Result<Self::Pooled, String>> + Send;

    /// Begins a write transaction. SQLite takes its write lock at once
    /// (`BEGIN IMMEDIATE`), so concurrent writers wait instead of failing.
    #[doc(hidden)]
    fn begin(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Begins a read-only transaction: one snapshot, no write lock.
    #[doc(hidden)]
    fn begin_read(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Commits the transaction begun by [`Backend::begin`].
    #[doc(hidden)]
    fn commit(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls back the transaction begun by [`Backend::begin`].
    #[doc(hidden)]
    fn rollback(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Sends a wake-up on `channel` inside the open transaction: listeners
    /// receive it if and only if the transaction commits (PostgreSQL
    /// `pg_notify`). Called only with a channel `open` returned, so never on
    /// SQLite.
    #[doc(hidden)]
    fn notify(
        conn: &mut Self::Connection,
        channel: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// A task that listens on the module's wake-up channel, on a connection
    /// of its own outside the pool, and calls `wake` for every notification
    /// and once after every (re)connection (notifications sent while it was
    /// not listening are lost, so the caller scans). It reconnects with
    /// backoff when the connection fails and never ends by itself: abort it.
    /// `None` where the backend has no notifications (SQLite: another
    /// process's commits are found by the bus's periodic scan).
    #[doc(hidden)]
    fn listen(
        wakeup: WakeupChannel,
        module: std::sync::Arc<str>,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> Option<impl Future<Output = ()> + Send + 'static>;

    /// Inserts published messages into the outbox.
    #[doc(hidden)]
    fn insert_outbox(
        conn: &mut Self::Connection,
        rows: Vec<OutboxRow>,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Records `(message_id, handler)` in the inbox unless it is there;
    /// true when this call inserted it.
    #[doc(hidden)]
    fn tick_inbox(
        conn: &mut Self::Connection,
        message_id: Uuid,
        handler: &str,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// How the dialect spells what tickbox's [`Statement`]s need.
    #[doc(hidden)]
    const DIALECT: Dialect;

    /// What a claim's row selection ends with: `FOR UPDATE SKIP LOCKED` on
    /// PostgreSQL, so concurrent claims skip each other's rows instead of
    /// waiting; nothing on SQLite, whose writers take turns.
    #[doc(hidden)]
    const SKIP_LOCKED: &'static str;

    /// The `RETURNING` list of a claim, read as a
    /// [`ClaimedRow`](crate::schema::ClaimedRow): text columns as raw bytes
    /// and a creation time that is NULL unless it is an integer, so that one
    /// malformed row is decoded (and dead-lettered) on its own.
    #[doc(hidden)]
    const CLAIM_COLUMNS: &'static str;

    /// Runs a [`Statement`] and reads its rows.
    #[doc(hidden)]
    fn load<R: Row>(
        conn: &mut Self::Connection,
        statement: Statement,
    ) -> impl Future<Output = QueryResult<Vec<R>>> + Send;

    /// Runs a [`Statement`]; the number of rows it changed.
    #[doc(hidden)]
    fn execute(
        conn: &mut Self::Connection,
        statement: Statement,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Records subscriptions, or updates the ones recorded (topic, when
    /// seen), keeping when each was first recorded.
    #[doc(hidden)]
    fn record_subscriptions(
        conn: &mut Self::Connection,
        rows: Vec<SubscriptionRow>,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Every subscription recorded in this outbox's database.
    #[doc(hidden)]
    fn subscriptions(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<SubscriptionRow>>> + Send;

    /// Extends (or takes) the claim of `bus` on these undelivered rows unless
    /// another bus holds a live claim on them.
    #[doc(hidden)]
    fn renew_claims(
        conn: &mut Self::Connection,
        ids: Vec<Uuid>,
        bus: Uuid,
        now_us: i64,
        until_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Gives up every claim of `bus` on undelivered rows (on a graceful
    /// stop).
    #[doc(hidden)]
    fn release_claims(
        conn: &mut Self::Connection,
        bus: Uuid,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Records a dead letter, or updates the one already recorded for the
    /// same message and handler.
    #[doc(hidden)]
    fn insert_dead_letter(
        conn: &mut Self::Connection,
        row: DeadLetterRow,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Dead letters, oldest first, from `offset`.
    #[doc(hidden)]
    fn dead_letters(
        conn: &mut Self::Connection,
        offset: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<DeadLetterRow>>> + Send;

    /// One dead letter.
    #[doc(hidden)]
    fn dead_letter(
        conn: &mut Self::Connection,
        message_id: Uuid,
        handler: String,
    ) -> impl Future<Output = QueryResult<Option<DeadLetterRow>>> + Send;

    /// Deletes one dead letter; the number of rows deleted.
    #[doc(hidden)]
    fn delete_dead_letter(
        conn: &mut Self::Connection,
        message_id: Uuid,
        handler: String,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Writes a message into the outbox as pending and unclaimed, or puts
    /// the row already there back to that state.
    #[doc(hidden)]
    fn requeue_or_insert(
        conn: &mut Self::Connection,
        row: OutboxRow,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Deletes up to `batch` messages' inbox rows processed before
    /// `before_us`; the number of rows deleted.
    #[doc(hidden)]
    fn sweep_inbox(
        conn: &mut Self::Connection,
        before_us: i64,
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Deletes up to `batch` outbox rows delivered before `before_us`.
    #[doc(hidden)]
    fn sweep_outbox(
        conn: &mut Self::Connection,
        before_us: i64,
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// How many of tickbox's tables the database (PostgreSQL: the current
    /// schema) holds: [`TABLES`] when it is up to date, fewer when an older
    /// version of tickbox made them, none when it is not a module's database.
    #[doc(hidden)]
    fn count_tables(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<i64>> + Send;

    /// Counts the dead letters (a small table).
    #[doc(hidden)]
    fn count_dead_letters(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<i64>> + Send;

    /// Counts the rows of the inbox and of the dead letters.
    #[doc(hidden)]
    fn table_sizes(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<(i64, i64)>> + Send;

    /// Marks outbox rows delivered.
    #[doc(hidden)]
    fn mark_delivered(
        conn: &mut Self::Connection,
        ids: Vec<Uuid>,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// The number of undelivered outbox rows and the creation time of the
    /// oldest.
    #[doc(hidden)]
    fn outbox_backlog(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<(i64, Option<i64>)>> + Send;
}

/// tickbox's tables, as `count_tables` counts them.
pub(crate) const TABLES: i64 = 6;

/// What a bus asks for when it claims outbox rows.
#[derive(Debug, Clone)]
#[allow(unreachable_pub)] // named only by the sealed trait's hidden methods
pub struct Claim {
    /// The claiming bus instance.
    pub(crate) bus: Uuid,
    pub(crate) now_us: i64,
    /// The claim holds until then unless renewed.
    pub(crate) until_us: i64,
    /// A claim said to hold beyond this was not taken by a live bus (buses
    /// claim one lease at a time): it is taken like an expired one, so a
    /// corrupted claim cannot hide a row for ever.
    pub(crate) beyond_us: i64,
    /// Only rows with ids above this are read (a scan's cursor); `None`
    /// from the first row on.
    pub(crate) after: Option<Uuid>,
    pub(crate) limit: i64,
    /// The subscriptions the claiming bus serves: it claims only rows one of
    /// them still owes (or rows of a topic nobody subscribes to).
    pub(crate) served: std::sync::Arc<[Uuid]>,
}

/// The inbox guard's insert: `(message_id, handler)` unless present. Each
/// backend runs it its own way (SQLite on its blocking thread, where the
/// statement of this fixed shape is prepared once and its SQL never rebuilt).
macro_rules! tick_inbox_statement {
    ($message_id:expr, $handler:expr, $now_us:expr) => {{
        use diesel::ExpressionMethods;
        use $crate::schema::tickbox_inbox::dsl as inbox;
        diesel::insert_into(inbox::tickbox_inbox)
            .values((
                inbox::message_id.eq($crate::schema::Id($message_id)),
                inbox::handler.eq($handler),
                inbox::processed_at_us.eq($now_us),
            ))
            .on_conflict_do_nothing()
    }};
}
pub(crate) use tick_inbox_statement;

/// The queries that read the same on both dialects, expanded inside each
/// `impl Backend` so they are compiled against its concrete connection.
macro_rules! shared_queries {
    () => {
        async fn load<R: $crate::statement::Row>(
            conn: &mut Self::Connection,
            statement: $crate::statement::Statement,
        ) -> diesel::QueryResult<Vec<R>> {
            use diesel_async::RunQueryDsl;
            statement.load(conn).await
        }

        async fn execute(
            conn: &mut Self::Connection,
            statement: $crate::statement::Statement,
        ) -> diesel::QueryResult<usize> {
            use diesel_async::RunQueryDsl;
            statement.execute(conn).await
        }

        async fn record_subscriptions(
            conn: &mut Self::Connection,
            rows: Vec<$crate::schema::SubscriptionRow>,
        ) -> diesel::QueryResult<()> {
            use diesel::upsert::excluded;
            use diesel::ExpressionMethods;
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_subscriptions::dsl as subs;
            // One statement per row: SQLite's upsert takes no multi-row
            // VALUES through diesel, and a bus has few handlers.
            for row in rows {
                diesel::insert_into(subs::tickbox_subscriptions)
                    .values(&row)
                    .on_conflict(subs::id)
                    .do_update()
                    .set((
                        subs::module.eq(excluded(subs::module)),
                        subs::handler.eq(excluded(subs::handler)),
                        subs::topic.eq(excluded(subs::topic)),
                        subs::seen_at_us.eq(excluded(subs::seen_at_us)),
                        subs::alive_until_us.eq(excluded(subs::alive_until_us)),
                    ))
                    .execute(conn)
                    .await?;
            }
            Ok(())
        }

        async fn subscriptions(
            conn: &mut Self::Connection,
        ) -> diesel::QueryResult<Vec<$crate::schema::SubscriptionRow>> {
            use diesel::{QueryDsl, SelectableHelper};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_subscriptions::dsl as subs;
            subs::tickbox_subscriptions
                .select($crate::schema::SubscriptionRow::as_select())
                .order((subs::module, subs::handler))
                .load(conn)
                .await
        }

        async fn renew_claims(
            conn: &mut Self::Connection,
            ids: Vec<uuid::Uuid>,
            bus: uuid::Uuid,
            now_us: i64,
            until_us: i64,
        ) -> diesel::QueryResult<usize> {
            use diesel::{BoolExpressionMethods, ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_outbox::dsl as outbox;
            use $crate::schema::Id;
            let ids: Vec<_> = ids.into_iter().map(Id).collect();
            diesel::update(
                outbox::tickbox_outbox
                    .filter(outbox::id.eq_any(ids))
                    .filter(outbox::delivered_at_us.is_null())
                    .filter(
                        outbox::claimed_by
                            .eq(Id(bus))
                            .or(outbox::claimed_until_us.is_null())
                            .or(outbox::claimed_until_us.lt(now_us)),
                    ),
            )
            .set((
                outbox::claimed_by.eq(Id(bus)),
                outbox::claimed_until_us.eq(until_us),
            ))
            .execute(conn)
            .await
        }

        async fn release_claims(
            conn: &mut Self::Connection,
            bus: uuid::Uuid,
        ) -> diesel::QueryResult<usize> {
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_outbox::dsl as outbox;
            use $crate::schema::Id;
            diesel::update(
                outbox::tickbox_outbox
                    .filter(outbox::delivered_at_us.is_null())
                    .filter(outbox::claimed_by.eq(Id(bus))),
            )
            .set((
                outbox::claimed_by.eq(None::<Id>),
                outbox::claimed_until_us.eq(None::<i64>),
            ))
            .execute(conn)
            .await
        }

        async fn insert_dead_letter(
            conn: &mut Self::Connection,
            row: $crate::schema::DeadLetterRow,
        ) -> diesel::QueryResult<()> {
            use diesel::upsert::excluded;
            use diesel::ExpressionMethods;
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_dead_letters::dsl as dead;
            diesel::insert_into(dead::tickbox_dead_letters)
                .values(row)
                .on_conflict((dead::message_id, dead::handler))
                .do_update()
                .set((
                    dead::attempts.eq(excluded(dead::attempts)),
                    dead::reason.eq(excluded(dead::reason)),
                    dead::dead_at_us.eq(excluded(dead::dead_at_us)),
                ))
                .execute(conn)
                .await
                .map(drop)
        }

        async fn dead_letters(
            conn: &mut Self::Connection,
            offset: i64,
            limit: i64,
        ) -> diesel::QueryResult<Vec<$crate::schema::DeadLetterRow>> {
            use diesel::{QueryDsl, SelectableHelper};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_dead_letters::dsl as dead;
            dead::tickbox_dead_letters
                .order((dead::dead_at_us, dead::message_id, dead::handler))
                .offset(offset)
                .limit(limit)
                .select($crate::schema::DeadLetterRow::as_select())
                .load(conn)
                .await
        }

        async fn dead_letter(
            conn: &mut Self::Connection,
            message_id: uuid::Uuid,
            handler: String,
        ) -> diesel::QueryResult<Option<$crate::schema::DeadLetterRow>> {
            use diesel::{ExpressionMethods, OptionalExtension, QueryDsl, SelectableHelper};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_dead_letters::dsl as dead;
            dead::tickbox_dead_letters
                .filter(dead::message_id.eq($crate::schema::Id(message_id)))
                .filter(dead::handler.eq(handler))
                .select($crate::schema::DeadLetterRow::as_select())
                .first(conn)
                .await
                .optional()
        }

        async fn delete_dead_letter(
            conn: &mut Self::Connection,
            message_id: uuid::Uuid,
            handler: String,
        ) -> diesel::QueryResult<usize> {
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_dead_letters::dsl as dead;
            diesel::delete(
                dead::tickbox_dead_letters
                    .filter(dead::message_id.eq($crate::schema::Id(message_id)))
                    .filter(dead::handler.eq(handler)),
            )
            .execute(conn)
            .await
        }

        async fn requeue_or_insert(
            conn: &mut Self::Connection,
            row: $crate::schema::OutboxRow,
        ) -> diesel::QueryResult<()> {
            use diesel::ExpressionMethods;
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_outbox::dsl as outbox;
            diesel::insert_into(outbox::tickbox_outbox)
                .values(&row)
                .on_conflict(outbox::id)
                .do_update()
                .set((
                    outbox::delivered_at_us.eq(None::<i64>),
                    outbox::claimed_by.eq(None::<$crate::schema::Id>),
                    outbox::claimed_until_us.eq(None::<i64>),
                ))
                .execute(conn)
                .await?;
            // Every subscription receives it again (the inbox skips it where
            // it was handled).
            use diesel::QueryDsl;
            use $crate::schema::tickbox_outbox_done::dsl as done;
            diesel::delete(done::tickbox_outbox_done.filter(done::message_id.eq(row.id)))
                .execute(conn)
                .await
                .map(drop)
        }

        async fn count_dead_letters(conn: &mut Self::Connection) -> diesel::QueryResult<i64> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_dead_letters;
            tickbox_dead_letters::table.count().get_result(conn).await
        }

        async fn table_sizes(conn: &mut Self::Connection) -> diesel::QueryResult<(i64, i64)> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use $crate::schema::{tickbox_dead_letters, tickbox_inbox};
            let inbox = tickbox_inbox::table.count().get_result(conn).await?;
            let dead = tickbox_dead_letters::table.count().get_result(conn).await?;
            Ok((inbox, dead))
        }

        async fn mark_delivered(
            conn: &mut Self::Connection,
            ids: Vec<uuid::Uuid>,
            now_us: i64,
        ) -> diesel::QueryResult<usize> {
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_outbox::dsl as outbox;
            let ids: Vec<_> = ids.into_iter().map($crate::schema::Id).collect();
            diesel::update(outbox::tickbox_outbox.filter(outbox::id.eq_any(ids)))
                .set((
                    outbox::delivered_at_us.eq(now_us),
                    outbox::claimed_until_us.eq(None::<i64>),
                ))
                .execute(conn)
                .await
        }

        async fn outbox_backlog(
            conn: &mut Self::Connection,
        ) -> diesel::QueryResult<(i64, Option<i64>)> {
            use diesel::{ExpressionMethods, OptionalExtension, QueryDsl};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_outbox::dsl as outbox;
            // The count reads only the partial index of pending ids; the
            // oldest message is the first of them (ids are UUIDv7s, ordered
            // by time): one more row, not a scan of all pending rows.
            let pending = outbox::tickbox_outbox
                .filter(outbox::delivered_at_us.is_null())
                .count()
                .get_result(conn)
                .await?;
            let oldest = outbox::tickbox_outbox
                .filter(outbox::delivered_at_us.is_null())
                .select(outbox::created_at_us)
                .order(outbox::id)
                .first(conn)
                .await
                .optional()?;
            Ok((pending, oldest))
        }
    };
}
pub(crate) use shared_queries;

/// Builds a deadpool pool for either backend: fast recycling (no ping on
/// every checkout; broken connections are still discarded), a bounded wait for
/// a free connection, and `setup` run on every new connection.
pub(crate) fn build_pool<C>(
    settings: &StoreSettings,
    url: String,
    setup: diesel_async::pooled_connection::SetupCallback<C>,
) -> crate::Result<diesel_async::pooled_connection::deadpool::Pool<C>>
where
    C: AsyncConnection + 'static,
    diesel_async::pooled_connection::AsyncDieselConnectionManager<C>:
        deadpool::managed::Manager<Type = C, Error = diesel_async::pooled_connection::PoolError>,
{
    use diesel_async::pooled_connection::{
        AsyncDieselConnectionManager, ManagerConfig, RecyclingMethod,
    };
    let mut config = ManagerConfig::default();
    config.recycling_method = RecyclingMethod::Fast;
    config.custom_setup = setup;
    let manager = AsyncDieselConnectionManager::new_with_config(url, config);
    diesel_async::pooled_connection::deadpool::Pool::builder(manager)
        .max_size(settings.pool_size)
        .wait_timeout(Some(settings.checkout_timeout))
        .create_timeout(Some(settings.checkout_timeout))
        .runtime(deadpool::Runtime::Tokio1)
        .build()
        .map_err(|e| crate::Error::Config(format!("module `{}`: {e}", settings.module)))
}

/// Takes a connection from a deadpool pool, for either backend.
pub(crate) async fn checkout<C>(
    pool: &diesel_async::pooled_connection::deadpool::Pool<C>,
) -> Result<diesel_async::pooled_connection::deadpool::Object<C>, String>
where
    C: AsyncConnection + 'static,
    diesel_async::pooled_connection::AsyncDieselConnectionManager<C>:
        deadpool::managed::Manager<Type = C, Error = diesel_async::pooled_connection::PoolError>,
{
    pool.get().await.map_err(|e| e.to_string())
}

/// Expands to `Backend::sweep_inbox` and `Backend::sweep_outbox` running the
/// dialect's statements, whose binds are: id cutoff, time cutoff, batch, and
/// (inbox only) the time cutoff again.
///
/// A message is processed and delivered after it is created, so every row to
/// go has an id (a UUIDv7) below the cutoff: the primary key finds them, and
/// no extra index has to be kept up on every insert.
macro_rules! sweep_with {
    (inbox: $inbox:expr, outbox: $outbox:expr $(,)?) => {
        async fn sweep_inbox(
            conn: &mut Self::Connection,
            before_us: i64,
            batch: i64,
        ) -> diesel::QueryResult<usize> {
            use diesel::sql_types::BigInt;
            use diesel_async::RunQueryDsl;
            diesel::sql_query($inbox)
                .bind::<$crate::schema::DbUuid, _>($crate::schema::Id::earliest_at(before_us))
                .bind::<BigInt, _>(before_us)
                .bind::<BigInt, _>(batch)
                .bind::<BigInt, _>(before_us)
                .execute(conn)
                .await
        }

        async fn sweep_outbox(
            conn: &mut Self::Connection,
            before_us: i64,
            batch: i64,
        ) -> diesel::QueryResult<usize> {
            use diesel::sql_types::BigInt;
            use diesel_async::RunQueryDsl;
            diesel::sql_query($outbox)
                .bind::<$crate::schema::DbUuid, _>($crate::schema::Id::earliest_at(before_us))
                .bind::<BigInt, _>(before_us)
                .bind::<BigInt, _>(batch)
                .execute(conn)
                .await
        }
    };
}
pub(crate) use sweep_with;

/// Expands to `Backend::count_tables` running `$sql`, a count of tickbox's
/// tables in the dialect's catalog.
macro_rules! count_tables_with {
    ($sql:expr) => {
        async fn count_tables(conn: &mut Self::Connection) -> diesel::QueryResult<i64> {
            use diesel_async::RunQueryDsl;
            #[derive(diesel::QueryableByName)]
            struct Tables {
                #[diesel(sql_type = diesel::sql_types::BigInt)]
                n: i64,
            }
            let found: Tables = diesel::sql_query($sql).get_result(conn).await?;
            Ok(found.n)
        }
    };
}
pub(crate) use count_tables_with;

/// Refuses a database migrated by a newer tickbox: a migration applied there
/// that this build does not know means that version records things this one
/// would not honour (and, across processes, could lose messages by).
pub(crate) fn refuse_newer_migrations<DB, H, S>(
    conn: &mut H,
    known: &S,
    module: &str,
) -> crate::Result<()>
where
    DB: diesel::backend::Backend,
    H: diesel::Connection<Backend = DB>,
    S: diesel::migration::MigrationSource<DB>,
    for<'a> diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'a, H, SchemaVersionRow>,
{
    use diesel::RunQueryDsl;
    let known: std::collections::HashSet<String> = versions(known, module)?
        .into_iter()
        .map(|(version, _)| version)
        .collect();
    let applied: Vec<SchemaVersionRow> =
        diesel::sql_query("SELECT version FROM tickbox_schema_version").load(conn)?;
    let unknown: Vec<String> = applied
        .into_iter()
        .map(|row| row.version)
        .filter(|v| !known.contains(v))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(crate::Error::SchemaVersion {
        module: module.to_string(),
        reason: format!(
            "was migrated by a newer version of tickbox (migrations {} are unknown to this one); upgrade this process to that version",
            unknown.join(", ")
        ),
    })
}

/// Refuses application migrations that share a version with one of
/// tickbox's: diesel records both in one table, so such a migration would be
/// taken as applied and never run.
pub(crate) fn refuse_clashing_versions<DB: diesel::backend::Backend>(
    tickbox: &dyn diesel::migration::MigrationSource<DB>,
    app: &dyn diesel::migration::MigrationSource<DB>,
    module: &str,
) -> crate::Result<()> {
    let ours: std::collections::HashSet<String> = versions(tickbox, module)?
        .into_iter()
        .map(|(version, _)| version)
        .collect();
    let clashing: Vec<String> = versions(app, module)?
        .into_iter()
        .filter(|(version, _)| ours.contains(version))
        .map(|(_, name)| name)
        .collect();
    if clashing.is_empty() {
        return Ok(());
    }
    Err(crate::Error::Config(format!(
        "module `{module}`: the application's migrations {} have the version of a tickbox migration \
         (diesel would take them as applied and never run them); rename their folders to another \
         date and time",
        clashing.join(", ")
    )))
}

/// The (version, name) of every migration of `source`.
fn versions<DB: diesel::backend::Backend>(
    source: &dyn diesel::migration::MigrationSource<DB>,
    module: &str,
) -> crate::Result<Vec<(String, String)>> {
    let migrations = source.migrations().map_err(|e| crate::Error::Migration {
        module: module.to_string(),
        reason: e.to_string(),
    })?;
    Ok(migrations
        .iter()
        .map(|m| (m.name().version().to_string(), m.name().to_string()))
        .collect())
}

/// A row of `tickbox_schema_version`.
#[derive(diesel::QueryableByName)]
pub(crate) struct SchemaVersionRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}
