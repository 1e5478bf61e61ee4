//! The contract each backend implements (in `sqlite.rs` and `postgres.rs`)
//! for what truly differs between them. What reads the same on every backend
//! is written once, in [`Queries`](crate::store::queries::Queries).

use crate::store::settings::{StoreSettings, WakeupChannel};
use crate::store::sql::Sql;
use crate::store::statement::{Dialect, Statement};
use crate::store::Row;
use diesel::QueryResult;
use diesel_async::AsyncConnection;
use std::future::Future;
use std::ops::DerefMut;
use uuid::Uuid;

/// A key of one topic, from one publisher, as one handler sees it: the
/// scope of a sequence and of a handler's progress.
#[derive(Debug, Clone, Copy)]
pub struct KeyScope<'a> {
    /// The handler (its name).
    pub(crate) handler: &'a str,
    /// The module that numbered the key.
    pub(crate) publisher: &'a str,
    /// The topic.
    pub(crate) topic: &'a str,
    /// The ordering key.
    pub(crate) key: &'a str,
}

/// A [`KeyScope`] that owns its texts, to move to a blocking thread.
pub(crate) struct OwnedScope {
    handler: String,
    publisher: String,
    topic: String,
    key: String,
}

impl From<KeyScope<'_>> for OwnedScope {
    fn from(scope: KeyScope<'_>) -> Self {
        OwnedScope {
            handler: scope.handler.to_owned(),
            publisher: scope.publisher.to_owned(),
            topic: scope.topic.to_owned(),
            key: scope.key.to_owned(),
        }
    }
}

impl OwnedScope {
    /// Borrowed again.
    pub(crate) fn scope(&self) -> KeyScope<'_> {
        KeyScope {
            handler: &self.handler,
            publisher: &self.publisher,
            topic: &self.topic,
            key: &self.key,
        }
    }
}

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

    /// Records `(message_id, handler)` in the inbox unless it is there and,
    /// for a new keyed message (`key`: its scope and number), moves the
    /// handler's progress in the key to it if it is the key's next.
    fn tick_inbox(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: &str,
        now_us: i64,
        key: Option<(KeyScope<'_>, i64)>,
    ) -> impl Future<Output = QueryResult<Tick>> + Send;

    /// Inside a delivery's transaction: moves the handler's progress in the
    /// key to `sequence` if that is the key's next message; false otherwise
    /// (see [`Ordering::take_turn`](crate::store::ordering::Ordering::take_turn)).
    fn advance_key(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Inside a delivery's transaction: starts the handler's progress in the
    /// key at `sequence` unless it has progress there already; true when it
    /// did.
    fn start_key(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// How the dialect spells what tickbox's [`Statement`]s need.
    const DIALECT: Dialect;

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

    /// Where the catalog lists tables by name, as a query's `FROM` and the
    /// start of its `WHERE`: `… WHERE <name column>` (the current schema's
    /// tables on PostgreSQL).
    const TABLES_BY_NAME: &'static str;
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

/// How the inbox guard's first statement went.
#[derive(Debug, Clone, Copy)]
pub struct Tick {
    /// The inbox row was inserted: the message is new to the handler.
    pub(crate) inserted: bool,
    /// A keyed message was its key's next for the handler, and the
    /// handler's progress in the key now counts it.
    pub(crate) key_turn: bool,
}

/// A handler's progress in a key moves to `sequence` if it stands just
/// before it: one row changed means the message is the key's next.
macro_rules! advance_key_statement {
    ($scope:expr, $sequence:expr) => {{
        use diesel::{ExpressionMethods, QueryDsl};
        use $crate::store::schema::tickbox_key_progress::dsl as progress;
        diesel::update(
            progress::tickbox_key_progress
                .filter(progress::handler.eq($scope.handler))
                .filter(progress::publisher.eq($scope.publisher))
                .filter(progress::topic.eq($scope.topic))
                .filter(progress::ordering_key.eq($scope.key))
                .filter(progress::last_seq.eq($sequence - 1)),
        )
        .set(progress::last_seq.eq($sequence))
    }};
}
pub(crate) use advance_key_statement;

/// A handler's progress in a key starts at `sequence`, unless it has one.
macro_rules! start_key_statement {
    ($scope:expr, $sequence:expr) => {{
        use diesel::ExpressionMethods;
        use $crate::store::schema::tickbox_key_progress::dsl as progress;
        diesel::insert_into(progress::tickbox_key_progress)
            .values((
                progress::handler.eq($scope.handler),
                progress::publisher.eq($scope.publisher),
                progress::topic.eq($scope.topic),
                progress::ordering_key.eq($scope.key),
                progress::last_seq.eq($sequence),
            ))
            .on_conflict_do_nothing()
    }};
}
pub(crate) use start_key_statement;
