//! What tickbox needs from a database, implemented once per backend.
//!
//! Queries that read the same on both dialects are written once, in
//! [`shared_queries!`], and expanded inside each backend's impl so that diesel
//! checks them against the concrete connection type. Only what truly differs
//! (opening a pool, running migrations, how a write transaction begins) is
//! written per backend, in `sqlite.rs` and `postgres.rs`.

use crate::schema::OutboxRow;
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
    pub(crate) schema: Option<String>,
    /// Connections in the module's pool.
    pub(crate) pool_size: usize,
    /// How long a checkout waits for a free connection.
    pub(crate) checkout_timeout: Duration,
}

/// A database backend: [`Sqlite`](crate::Sqlite) or
/// [`Postgres`](crate::Postgres).
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

    /// Runs the embedded migrations and opens the module's pool.
    #[doc(hidden)]
    fn open(settings: &StoreSettings) -> impl Future<Output = crate::Result<Self::Pool>> + Send;

    /// Takes a connection from the pool.
    #[doc(hidden)]
    fn checkout(pool: &Self::Pool) -> impl Future<Output = Result<Self::Pooled, String>> + Send;

    /// Begins a write transaction. SQLite takes its write lock at once
    /// (`BEGIN IMMEDIATE`), so concurrent writers wait instead of failing.
    #[doc(hidden)]
    fn begin(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Commits the transaction begun by [`Backend::begin`].
    #[doc(hidden)]
    fn commit(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

    /// Rolls back the transaction begun by [`Backend::begin`].
    #[doc(hidden)]
    fn rollback(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;

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

    /// Undelivered outbox rows with ids above `after`, oldest first.
    #[doc(hidden)]
    fn pending(
        conn: &mut Self::Connection,
        after: Option<Uuid>,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<OutboxRow>>> + Send;

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

/// The queries that read the same on both dialects, expanded inside each
/// `impl Backend` so they are compiled against its concrete connection.
macro_rules! shared_queries {
    () => {
        async fn tick_inbox(
            conn: &mut Self::Connection,
            message_id: uuid::Uuid,
            handler: &str,
            now_us: i64,
        ) -> diesel::QueryResult<bool> {
            use diesel::ExpressionMethods;
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_inbox::dsl as inbox;
            let inserted = diesel::insert_into(inbox::tickbox_inbox)
                .values((
                    inbox::message_id.eq($crate::schema::Id(message_id)),
                    inbox::handler.eq(handler),
                    inbox::processed_at_us.eq(now_us),
                ))
                .on_conflict_do_nothing()
                .execute(conn)
                .await?;
            Ok(inserted == 1)
        }

        async fn pending(
            conn: &mut Self::Connection,
            after: Option<uuid::Uuid>,
            limit: i64,
        ) -> diesel::QueryResult<Vec<$crate::schema::OutboxRow>> {
            use diesel::{ExpressionMethods, QueryDsl, SelectableHelper};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_outbox::dsl as outbox;
            let mut query = outbox::tickbox_outbox
                .filter(outbox::delivered_at_us.is_null())
                .order(outbox::id)
                .limit(limit)
                .select($crate::schema::OutboxRow::as_select())
                .into_boxed();
            if let Some(after) = after {
                query = query.filter(outbox::id.gt($crate::schema::Id(after)));
            }
            query.load(conn).await
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
                .set(outbox::delivered_at_us.eq(now_us))
                .execute(conn)
                .await
        }

        async fn outbox_backlog(
            conn: &mut Self::Connection,
        ) -> diesel::QueryResult<(i64, Option<i64>)> {
            use diesel::dsl::{count_star, min};
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use $crate::schema::tickbox_outbox::dsl as outbox;
            outbox::tickbox_outbox
                .filter(outbox::delivered_at_us.is_null())
                .select((count_star(), min(outbox::created_at_us)))
                .first(conn)
                .await
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
