//! The contract each backend implements (in `sqlite.rs` and `postgres.rs`)
//! for what truly differs between them. What reads the same on every backend
//! is written once, in [`Queries`](crate::store::queries::Queries).

use crate::store::schema::OutboxRow;
use crate::store::settings::{StoreSettings, WakeupChannel};
use crate::store::sql::Row;
use crate::store::sql::Sql;
use crate::store::statement::{Dialect, Statement};
use diesel::QueryResult;
use diesel_async::AsyncConnection;
use std::future::Future;
use std::ops::DerefMut;
use uuid::Uuid;

/// What tickbox needs from a database, implemented once per backend in
/// `sqlite.rs` and `postgres.rs`. It lives in a private module, so no other
/// crate can name it: that seals [`Backend`](crate::Backend).
pub trait Store: Sized + Send + Sync + 'static {
    /// The diesel-async connection tickbox's statements run on: the
    /// backend's public [`Backend::Connection`](crate::Backend::Connection),
    /// under another name so that a backend's bounds name only the public
    /// one.
    type Conn: AsyncConnection + Send + 'static;

    /// A connection pool.
    type Pool: Clone + Send + Sync + 'static;

    /// A connection checked out of the pool; returned to it on drop.
    type Pooled: DerefMut<Target = Self::Conn> + Send + 'static;

    /// The database takes one writer at a time (SQLite): writers of one
    /// process then queue in memory, first come first served, instead of
    /// polling the database's lock.
    const ONE_WRITER: bool;

    /// The texts by which the database reports a failure worth retrying
    /// when it gives no error code for it (SQLite's busy database). Codes
    /// are read first, in [`is_transient`](crate::transient::is_transient).
    const TRANSIENT_MESSAGES: &'static [&'static str];

    /// Runs the embedded migrations (if `settings.migrate`) and opens the
    /// module's pool; also returns the channel on which commits to the
    /// module's outbox wake buses, where the backend has one (PostgreSQL).
    fn open(
        settings: &StoreSettings,
    ) -> impl Future<Output = crate::Result<(Self::Pool, Option<WakeupChannel>)>> + Send;

    /// Opens the pool of the module's effects journal (see
    /// [`crate::effects`]), whose short transactions commit while a
    /// delivery's transaction is open: on SQLite a companion file beside the
    /// module's (an SQLite write transaction holds its whole file), on
    /// PostgreSQL a few connections of its own to the module's schema.
    /// `None` when the module's database is only attached
    /// (`settings.migrate` false) and no journal was ever made.
    fn open_journal(
        settings: &StoreSettings,
    ) -> impl Future<Output = crate::Result<Option<Self::Pool>>> + Send;

    /// Closes the pool: idle connections now, the others when returned.
    fn close(pool: &Self::Pool);

    /// Closes a connection for good, taking it out of its pool.
    fn discard(conn: Self::Pooled);

    /// Closes the pool's idle connections; the pool stays open and makes
    /// new ones as they are needed.
    fn close_idle(pool: &Self::Pool);

    /// Takes a connection from the pool.
    fn checkout(pool: &Self::Pool) -> impl Future<Output = Result<Self::Pooled, String>> + Send;

    /// Begins a write transaction. SQLite takes its write lock at once
    /// (`BEGIN IMMEDIATE`), so concurrent writers wait instead of failing.
    fn begin(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<()>> + Send;

    /// Begins a read-only transaction: one snapshot, no write lock.
    fn begin_read(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<()>> + Send;

    /// Commits the transaction begun by [`Store::begin`].
    fn commit(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls back the transaction begun by [`Store::begin`].
    fn rollback(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<()>> + Send;

    /// Sends a wake-up on `channel` inside the open transaction: listeners
    /// receive it if and only if the transaction commits (PostgreSQL
    /// `pg_notify`). Called only with a channel `open` returned, so never on
    /// SQLite.
    fn notify(conn: &mut Self::Conn, channel: &str)
        -> impl Future<Output = QueryResult<()>> + Send;

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

    /// Inserts published messages into the outbox, numbering each keyed
    /// one first (in [`numbering_order`]); returns the rows with their
    /// numbers.
    fn insert_outbox(
        conn: &mut Self::Conn,
        rows: Vec<OutboxRow>,
    ) -> impl Future<Output = QueryResult<Vec<OutboxRow>>> + Send;

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
    fn load_statement<R: Row>(
        conn: &mut Self::Conn,
        statement: Statement,
    ) -> impl Future<Output = QueryResult<Vec<R>>> + Send;

    /// Runs a [`Statement`]; the number of rows it changed.
    fn execute_statement(
        conn: &mut Self::Conn,
        statement: Statement,
    ) -> impl Future<Output = QueryResult<usize>> + Send;

    /// Runs an [`Sql`] statement and reads its rows.
    fn load<R: Row>(
        conn: &mut Self::Conn,
        sql: Sql,
    ) -> impl Future<Output = QueryResult<Vec<R>>> + Send;

    /// Runs an [`Sql`] statement; the number of rows it changed.
    fn execute(conn: &mut Self::Conn, sql: Sql) -> impl Future<Output = QueryResult<usize>> + Send;
}

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

/// A key's counter moves to its next number, published at `$at_us`:
/// `(number, when the previous one was published)`, or no row for a key that
/// has none yet. Inside the publishing transaction, the row stays locked
/// until it ends. Fixed shape, like
/// [`tick_inbox_statement`](crate::store::inbox::tick_inbox_statement) (an upsert's
/// `DO UPDATE` is never kept prepared by diesel; these two are).
macro_rules! bump_sequence_statement {
    ($topic:expr, $key:expr, $at_us:expr) => {{
        use diesel::{ExpressionMethods, NullableExpressionMethods, QueryDsl};
        use $crate::store::schema::tickbox_key_sequences::dsl as seq;
        diesel::update(
            seq::tickbox_key_sequences
                .filter(seq::topic.eq($topic))
                .filter(seq::ordering_key.eq($key)),
        )
        .set((
            seq::last_seq.eq(seq::last_seq + 1_i64),
            seq::previous_at_us.eq(seq::last_at_us.nullable()),
            seq::last_at_us.eq($at_us),
        ))
        .returning((seq::last_seq, seq::previous_at_us))
    }};
}
pub(crate) use bump_sequence_statement;

/// A key's counter starts at 1, unless another transaction started it
/// first (PostgreSQL: this one then waits for that one's end).
macro_rules! first_sequence_statement {
    ($topic:expr, $key:expr, $at_us:expr) => {{
        use diesel::ExpressionMethods;
        use $crate::store::schema::tickbox_key_sequences::dsl as seq;
        diesel::insert_into(seq::tickbox_key_sequences)
            .values((
                seq::topic.eq($topic),
                seq::ordering_key.eq($key),
                seq::last_seq.eq(1_i64),
                seq::last_at_us.eq($at_us),
            ))
            .on_conflict_do_nothing()
    }};
}
pub(crate) use first_sequence_statement;

/// The order in which a transaction's keyed rows take their numbers: by
/// topic, then key, then as published, so that transactions publishing for
/// the same keys lock their counters in one order and never wait for each
/// other crosswise.
pub(crate) fn numbering_order(rows: &[OutboxRow]) -> Vec<usize> {
    let mut keyed: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].ordering_key.is_some())
        .collect();
    keyed.sort_by(|&a, &b| {
        (&rows[a].topic, &rows[a].ordering_key).cmp(&(&rows[b].topic, &rows[b].ordering_key))
    });
    keyed
}
