//! What tickbox needs from a database, implemented once per backend.
//!
//! Queries that read the same on both dialects are written once, in
//! [`shared_queries!`], and expanded inside each backend's impl so that diesel
//! checks them against the concrete connection type. Only what truly differs
//! (opening a pool, running migrations, how a write transaction begins) is
//! written per backend, in `sqlite.rs` and `postgres.rs`.

use crate::store::schema::{DeadLetterRow, OutboxRow, SubscriptionRow};
use crate::store::settings::{StoreSettings, WakeupChannel};
use crate::store::statement::{Dialect, Row, Statement};
use diesel::QueryResult;
use diesel_async::AsyncConnection;
use std::future::Future;
use std::ops::DerefMut;
use uuid::Uuid;

/// A database backend: `Sqlite` (feature `sqlite`) or `Postgres` (feature
/// `postgres`).
///
/// Sealed: tickbox implements it for its backends, and what it needs from a
/// database (the [`Store`] it extends) is private to tickbox.
pub trait Backend: Store {
    /// A short name for logs and metrics: `sqlite` or `postgres`.
    const NAME: &'static str;

    /// Pool size used when a module does not set one.
    const DEFAULT_POOL_SIZE: usize;
}

/// What tickbox needs from a database, implemented once per backend in
/// `sqlite.rs` and `postgres.rs`. It lives in a private module, so no other
/// crate can name it: that seals [`Backend`].
pub trait Store: Sized + Send + Sync + 'static {
    /// The diesel-async connection that handlers and transactions receive.
    type Connection: AsyncConnection + Send + 'static;

    /// A connection pool.
    type Pool: Clone + Send + Sync + 'static;

    /// A connection checked out of the pool; returned to it on drop.
    type Pooled: DerefMut<Target = Self::Connection> + Send + 'static;

    /// The database takes one writer at a time (SQLite): writers of one
    /// process then queue in memory, first come first served, instead of
    /// polling the database's lock.
    const ONE_WRITER: bool;

    /// Runs the embedded migrations (if `settings.migrate`) and opens the
    /// module's pool; also returns the channel on which commits to the
    /// module's outbox wake buses, where the backend has one (PostgreSQL).
    fn open(
        settings: &StoreSettings,
    ) -> impl Future<Output = crate::Result<(Self::Pool, Option<WakeupChannel>)>> + Send;

    /// Closes the pool: idle connections now, the others when returned.
    fn close(pool: &Self::Pool);

    /// Takes a connection from the pool.
    fn checkout(pool: &Self::Pool) -> impl Future<Output = Result<Self::Pooled, String>> + Send;

    /// Begins a write transaction. SQLite takes its write lock at once
    /// (`BEGIN IMMEDIATE`), so concurrent writers wait instead of failing.
    fn begin(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Begins a read-only transaction: one snapshot, no write lock.
    fn begin_read(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Commits the transaction begun by [`Store::begin`].
    fn commit(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls back the transaction begun by [`Store::begin`].
    fn rollback(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Sends a wake-up on `channel` inside the open transaction: listeners
    /// receive it if and only if the transaction commits (PostgreSQL
    /// `pg_notify`). Called only with a channel `open` returned, so never on
    /// SQLite.
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
    fn listen(
        wakeup: WakeupChannel,
        module: std::sync::Arc<str>,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> Option<impl Future<Output = ()> + Send + 'static>;

    /// Inserts published messages into the outbox.
    fn insert_outbox(
        conn: &mut Self::Connection,
        rows: Vec<OutboxRow>,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Records `(message_id, handler)` in the inbox unless it is there;
    /// true when this call inserted it.
    fn tick_inbox(
        conn: &mut Self::Connection,
        message_id: Uuid,
        handler: &str,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// How the dialect spells what tickbox's [`Statement`]s need.
    const DIALECT: Dialect;

    /// What a claim's row selection ends with: `FOR UPDATE SKIP LOCKED` on
    /// PostgreSQL, so concurrent claims skip each other's rows instead of
    /// waiting; nothing on SQLite, whose writers take turns.
    const SKIP_LOCKED: &'static str;

    /// The `RETURNING` list of a claim, read as a
    /// [`ClaimedRow`](crate::store::schema::ClaimedRow): text columns as raw bytes
    /// and a creation time that is NULL unless it is an integer, so that one
    /// malformed row is decoded (and dead-lettered) on its own.
    const CLAIM_COLUMNS: &'static str;

    /// Runs a [`Statement`] and reads its rows.
    fn load<R: Row>(
        conn: &mut Self::Connection,
        statement: Statement,
    ) -> impl Future<Output = QueryResult<Vec<R>>> + Send;

    /// Runs a [`Statement`]; the number of rows it changed.
    fn execute(
        conn: &mut Self::Connection,
        statement: Statement,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Records subscriptions, or updates the ones recorded (topic, when
    /// seen), keeping when each was first recorded.
    fn record_subscriptions(
        conn: &mut Self::Connection,
        rows: Vec<SubscriptionRow>,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Every subscription recorded in this outbox's database.
    fn subscriptions(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<SubscriptionRow>>> + Send;

    /// Extends (or takes) the claim of `bus` on these undelivered rows unless
    /// another bus holds a live claim on them.
    fn renew_claims(
        conn: &mut Self::Connection,
        ids: Vec<Uuid>,
        bus: Uuid,
        now_us: i64,
        until_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Gives up every claim of `bus` on undelivered rows (on a graceful
    /// stop).
    fn release_claims(
        conn: &mut Self::Connection,
        bus: Uuid,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Records a dead letter, or updates the one already recorded for the
    /// same message and handler.
    fn insert_dead_letter(
        conn: &mut Self::Connection,
        row: DeadLetterRow,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Dead letters, oldest first, from `offset`.
    fn dead_letters(
        conn: &mut Self::Connection,
        offset: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<DeadLetterRow>>> + Send;

    /// One dead letter.
    fn dead_letter(
        conn: &mut Self::Connection,
        message_id: Uuid,
        handler: String,
    ) -> impl Future<Output = QueryResult<Option<DeadLetterRow>>> + Send;

    /// Deletes one dead letter; the number of rows deleted.
    fn delete_dead_letter(
        conn: &mut Self::Connection,
        message_id: Uuid,
        handler: String,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Writes a message into the outbox as pending and unclaimed, or puts
    /// the row already there back to that state.
    fn requeue_or_insert(
        conn: &mut Self::Connection,
        row: OutboxRow,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Deletes up to `batch` messages' inbox rows processed before
    /// `before_us`; the number of rows deleted.
    fn sweep_inbox(
        conn: &mut Self::Connection,
        before_us: i64,
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Deletes up to `batch` outbox rows delivered before `before_us`.
    fn sweep_outbox(
        conn: &mut Self::Connection,
        before_us: i64,
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// How many of tickbox's tables the database (PostgreSQL: the current
    /// schema) holds: [`TABLES`] when it is up to date, fewer when an older
    /// version of tickbox made them, none when it is not a module's database.
    fn count_tables(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<i64>> + Send;

    /// Counts the dead letters (a small table).
    fn count_dead_letters(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<i64>> + Send;

    /// Counts the rows of the inbox and of the dead letters.
    fn table_sizes(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<(i64, i64)>> + Send;

    /// Marks outbox rows delivered.
    fn mark_delivered(
        conn: &mut Self::Connection,
        ids: Vec<Uuid>,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// The number of undelivered outbox rows and the creation time of the
    /// oldest.
    fn outbox_backlog(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<(i64, Option<i64>)>> + Send;
}

/// tickbox's tables, as `count_tables` counts them.
pub(crate) const TABLES: i64 = 6;

/// What a bus asks for when it claims outbox rows.
#[derive(Debug, Clone)]
pub(crate) struct Claim {
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
        use $crate::store::schema::tickbox_inbox::dsl as inbox;
        diesel::insert_into(inbox::tickbox_inbox)
            .values((
                inbox::message_id.eq($crate::store::schema::Id($message_id)),
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
        async fn load<R: $crate::store::statement::Row>(
            conn: &mut Self::Connection,
            statement: $crate::store::statement::Statement,
        ) -> diesel::QueryResult<Vec<R>> {
            use diesel_async::RunQueryDsl;
            statement.load(conn).await
        }

        async fn execute(
            conn: &mut Self::Connection,
            statement: $crate::store::statement::Statement,
        ) -> diesel::QueryResult<usize> {
            use diesel_async::RunQueryDsl;
            statement.execute(conn).await
        }

        async fn record_subscriptions(
            conn: &mut Self::Connection,
            rows: Vec<$crate::store::schema::SubscriptionRow>,
        ) -> diesel::QueryResult<()> {
            use diesel::upsert::excluded;
            use diesel::ExpressionMethods;
            use diesel_async::RunQueryDsl;
            use $crate::store::schema::tickbox_subscriptions::dsl as subs;
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
        ) -> diesel::QueryResult<Vec<$crate::store::schema::SubscriptionRow>> {
            use diesel::{QueryDsl, SelectableHelper};
            use diesel_async::RunQueryDsl;
            use $crate::store::schema::tickbox_subscriptions::dsl as subs;
            subs::tickbox_subscriptions
                .select($crate::store::schema::SubscriptionRow::as_select())
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
            use $crate::store::schema::tickbox_outbox::dsl as outbox;
            use $crate::store::schema::Id;
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
            use $crate::store::schema::tickbox_outbox::dsl as outbox;
            use $crate::store::schema::Id;
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
            row: $crate::store::schema::DeadLetterRow,
        ) -> diesel::QueryResult<()> {
            use diesel::upsert::excluded;
            use diesel::ExpressionMethods;
            use diesel_async::RunQueryDsl;
            use $crate::store::schema::tickbox_dead_letters::dsl as dead;
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
        ) -> diesel::QueryResult<Vec<$crate::store::schema::DeadLetterRow>> {
            use diesel::{QueryDsl, SelectableHelper};
            use diesel_async::RunQueryDsl;
            use $crate::store::schema::tickbox_dead_letters::dsl as dead;
            dead::tickbox_dead_letters
                .order((dead::dead_at_us, dead::message_id, dead::handler))
                .offset(offset)
                .limit(limit)
                .select($crate::store::schema::DeadLetterRow::as_select())
                .load(conn)
                .await
        }

        async fn dead_letter(
            conn: &mut Self::Connection,
            message_id: uuid::Uuid,
            handler: String,
        ) -> diesel::QueryResult<Option<$crate::store::schema::DeadLetterRow>> {
            use diesel::{ExpressionMethods, OptionalExtension, QueryDsl, SelectableHelper};
            use diesel_async::RunQueryDsl;
            use $crate::store::schema::tickbox_dead_letters::dsl as dead;
            dead::tickbox_dead_letters
                .filter(dead::message_id.eq($crate::store::schema::Id(message_id)))
                .filter(dead::handler.eq(handler))
                .select($crate::store::schema::DeadLetterRow::as_select())
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
            use $crate::store::schema::tickbox_dead_letters::dsl as dead;
            diesel::delete(
                dead::tickbox_dead_letters
                    .filter(dead::message_id.eq($crate::store::schema::Id(message_id)))
                    .filter(dead::handler.eq(handler)),
            )
            .execute(conn)
            .await
        }

        async fn requeue_or_insert(
            conn: &mut Self::Connection,
            row: $crate::store::schema::OutboxRow,
        ) -> diesel::QueryResult<()> {
            use diesel::ExpressionMethods;
            use diesel_async::RunQueryDsl;
            use $crate::store::schema::tickbox_outbox::dsl as outbox;
            diesel::insert_into(outbox::tickbox_outbox)
                .values(&row)
                .on_conflict(outbox::id)
                .do_update()
                .set((
                    outbox::delivered_at_us.eq(None::<i64>),
                    outbox::claimed_by.eq(None::<$crate::store::schema::Id>),
                    outbox::claimed_until_us.eq(None::<i64>),
                ))
                .execute(conn)
                .await?;
            // Every subscription receives it again (the inbox skips it where
            // it was handled).
            use diesel::QueryDsl;
            use $crate::store::schema::tickbox_outbox_done::dsl as done;
            diesel::delete(done::tickbox_outbox_done.filter(done::message_id.eq(row.id)))
                .execute(conn)
                .await
                .map(drop)
        }

        async fn count_dead_letters(conn: &mut Self::Connection) -> diesel::QueryResult<i64> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use $crate::store::schema::tickbox_dead_letters;
            tickbox_dead_letters::table.count().get_result(conn).await
        }

        async fn table_sizes(conn: &mut Self::Connection) -> diesel::QueryResult<(i64, i64)> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use $crate::store::schema::{tickbox_dead_letters, tickbox_inbox};
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
            use $crate::store::schema::tickbox_outbox::dsl as outbox;
            let ids: Vec<_> = ids.into_iter().map($crate::store::schema::Id).collect();
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
            use $crate::store::schema::tickbox_outbox::dsl as outbox;
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
                .bind::<$crate::store::schema::DbUuid, _>($crate::store::schema::Id::earliest_at(
                    before_us,
                ))
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
                .bind::<$crate::store::schema::DbUuid, _>($crate::store::schema::Id::earliest_at(
                    before_us,
                ))
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
