//! What the bench needs from a backend beyond tickbox's own API: its
//! business tables, the baseline's raw transactions on tickbox's tables,
//! and the bulk prefill. diesel queries are compiled against each
//! connection type, so each backend writes its own (`sqlite.rs`,
//! `postgres.rs`).

use crate::place::Place;
use crate::Res;
use deadpool::managed::{Manager, QueueMode};
use std::future::Future;
use tickbox::diesel::deserialize::QueryableByName;
use tickbox::diesel::QueryResult;
use tickbox::diesel_async::pooled_connection::deadpool::Pool;
use tickbox::diesel_async::pooled_connection::{
    AsyncDieselConnectionManager, ManagerConfig, PoolError, RecyclingMethod, SetupCallback,
};
use tickbox::diesel_async::{AsyncConnection, SimpleAsyncConnection};
use tickbox::{diesel, Backend, ModuleBuilder};
use uuid::Uuid;

/// The row of a `SELECT count(*) AS n`.
#[derive(QueryableByName)]
pub(crate) struct Count {
    /// The count.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(crate) n: i64,
}

/// What the benchmark needs from a backend beyond tickbox's own API.
pub(crate) trait BenchBackend: Backend {
    /// A module builder on a fresh database (`db` from [`Place::fresh`]).
    fn module(place: &Place, db: &str) -> ModuleBuilder<Self>;
    /// A plain diesel-async pool on that database, configured as tickbox
    /// configures its own (SQLite pragmas, PostgreSQL search_path, fast
    /// recycling).
    fn raw_pool(place: &Place, db: &str, size: usize) -> Res<Self::RawPool>;
    /// The pool of [`BenchBackend::raw_pool`].
    type RawPool: Clone + Send + Sync + 'static;
    /// A connection checked out of a [`BenchBackend::RawPool`].
    type RawConn: std::ops::DerefMut<Target = Self::Connection> + Send + 'static;
    /// A connection from a [`BenchBackend::raw_pool`].
    fn raw_get(pool: &Self::RawPool) -> impl Future<Output = Res<Self::RawConn>> + Send;
    /// `CREATE TABLE` of the producer's business table.
    const CREATE_ORDERS: &'static str;
    /// `CREATE TABLE` of the consumer's business table.
    const CREATE_EFFECTS: &'static str;
    /// Makes freshly bulk-loaded tables look like they would in production
    /// (statistics, checkpoint).
    const AFTER_PREFILL: &'static str;

    /// Runs `sql` (one or more statements, no result).
    fn batch(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// Runs `sql`, a `SELECT count(*) AS n`.
    fn count(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = QueryResult<i64>> + Send;
    /// The producer's business row.
    fn insert_order(
        conn: &mut Self::Connection,
        n: i64,
        note: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// The handler's business row.
    fn insert_change(
        conn: &mut Self::Connection,
        n: i64,
        id: Uuid,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// The baseline's BEGIN, in the mode tickbox begins its write
    /// transactions in.
    fn raw_begin(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;
    /// The baseline's COMMIT (the same on both dialects).
    fn raw_commit(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send {
        conn.batch_execute("COMMIT")
    }
    /// The baseline's ROLLBACK (the same on both dialects).
    fn raw_rollback(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send {
        conn.batch_execute("ROLLBACK")
    }
    /// The row tickbox writes on publish, in tickbox's outbox table.
    fn raw_insert_outbox(
        conn: &mut Self::Connection,
        id: Uuid,
        topic: &str,
        payload: &str,
        created_at_us: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// tickbox's inbox tick: insert unless present; true when inserted.
    fn raw_insert_inbox(
        conn: &mut Self::Connection,
        id: Uuid,
        handler: &str,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Set-based SQL inserting outbox rows `lo..hi` as tickbox writes them
    /// (pending, payload `{"n":i}`), ids time-ordered UUIDv7-shaped.
    fn prefill_outbox_sql(lo: u64, hi: u64, base_ms: i64) -> String;
    /// Set-based SQL inserting inbox rows `lo..hi` for
    /// [`crate::workload::HANDLER`].
    fn prefill_inbox_sql(lo: u64, hi: u64, base_ms: i64) -> String;
}

/// A pool as tickbox builds its own: fast recycling, `setup` run on each
/// new connection, at most `size` connections, and the most recently used
/// idle connection handed out first (it has the warmest caches).
pub(crate) fn pool_like_tickbox<C>(
    url: String,
    setup: SetupCallback<C>,
    size: usize,
) -> Res<Pool<C>>
where
    C: AsyncConnection + 'static,
    AsyncDieselConnectionManager<C>: Manager<Type = C, Error = PoolError>,
{
    let mut config = ManagerConfig::default();
    config.recycling_method = RecyclingMethod::Fast;
    config.custom_setup = setup;
    let manager = AsyncDieselConnectionManager::new_with_config(url, config);
    Ok(Pool::builder(manager)
        .max_size(size)
        .queue_mode(QueueMode::Lifo)
        .build()?)
}
