//! What a backend is: connections, transactions, notifications, and the
//! one way its statements run. The statements themselves are the concept
//! traits beside this file (`outbox`, `inbox`, …).

use crate::store::settings::{StoreSettings, WakeupChannel};
use crate::store::sql::Sql;
use crate::store::Row;
use diesel::QueryResult;
use diesel_async::AsyncConnection;
use std::future::Future;
use std::ops::DerefMut;

/// What tickbox needs from a database connection, implemented by each
/// backend in its folder's `mod.rs`. It lives in a private module, so no
/// other crate can name it: that seals [`Backend`](crate::Backend).
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
    ) -> impl Future<Output = crate::error::Result<(Self::Pool, Option<WakeupChannel>)>> + Send;

    /// Opens the pool of the module's effects journal (see
    /// [`crate::effects`]), whose short transactions commit while a
    /// delivery's transaction is open: on SQLite a companion file beside the
    /// module's (an SQLite write transaction holds its whole file), on
    /// PostgreSQL a few connections of its own to the module's schema.
    /// `None` when the module's database is only attached
    /// (`settings.migrate` false) and no journal was ever made.
    fn open_journal(
        settings: &StoreSettings,
    ) -> impl Future<Output = crate::error::Result<Option<Self::Pool>>> + Send;

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

    /// Runs an [`Sql`] statement and reads its rows.
    fn load<R: Row>(
        conn: &mut Self::Conn,
        sql: Sql,
    ) -> impl Future<Output = QueryResult<Vec<R>>> + Send;

    /// Runs an [`Sql`] statement; the number of rows it changed.
    fn execute(conn: &mut Self::Conn, sql: Sql) -> impl Future<Output = QueryResult<usize>> + Send;
}
