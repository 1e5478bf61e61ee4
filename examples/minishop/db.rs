//! One connection type over both backends, so that every query of the
//! example is written once.
//!
//! A transaction's connection, `tx.conn()`, is diesel-async's
//! `SyncConnectionWrapper<SqliteConnection>` on SQLite and
//! `AsyncPgConnection` on PostgreSQL, and diesel checks a query against one
//! connection type at compile time. minishop runs on either, so it builds
//! each query once, as a value, and hands it to [`Db`], which runs it on the
//! connection it holds. An application on one backend needs none of this:
//! it runs its queries on `tx.conn()` directly.

use std::any::Any;
use tickbox::diesel::QueryResult;
use tickbox::diesel_async::methods::{ExecuteDsl, LoadQuery};
use tickbox::diesel_async::RunQueryDsl;

/// SQLite's connection, as tickbox hands it out.
pub type SqliteConn = tickbox::SqliteConnection;

/// PostgreSQL's connection, as tickbox hands it out.
#[cfg(feature = "postgres")]
pub type PgConn = tickbox::diesel_async::AsyncPgConnection;

/// Without the `postgres` feature there is one backend, and the bounds
/// below, written for two connection types, name SQLite's twice.
#[cfg(not(feature = "postgres"))]
pub type PgConn = SqliteConn;

/// A transaction's connection, whichever backend it is on.
pub enum Db<'a> {
    Sqlite(&'a mut SqliteConn),
    #[cfg(feature = "postgres")]
    Postgres(&'a mut PgConn),
}

/// A statement (insert, update) that runs on either connection. It owns
/// its values (`'static`), as a query moved into a spawned transaction
/// would.
pub trait Statement: ExecuteDsl<SqliteConn> + ExecuteDsl<PgConn> + Send + 'static {}

impl<T: ExecuteDsl<SqliteConn> + ExecuteDsl<PgConn> + Send + 'static> Statement for T {}

/// A query returning rows of type `U` that runs on either connection.
pub trait Query<U>:
    LoadQuery<'static, SqliteConn, U>
    + LoadQuery<'static, PgConn, U>
    + RunQueryDsl<SqliteConn>
    + RunQueryDsl<PgConn>
    + Send
    + 'static
{
}

impl<U, T> Query<U> for T where
    T: LoadQuery<'static, SqliteConn, U>
        + LoadQuery<'static, PgConn, U>
        + RunQueryDsl<SqliteConn>
        + RunQueryDsl<PgConn>
        + Send
        + 'static
{
}

impl<'a> Db<'a> {
    /// The connection of a transaction on any tickbox backend:
    /// `Db::of(tx.conn())`.
    pub fn of<C: Any>(conn: &'a mut C) -> Self {
        let conn: &'a mut dyn Any = conn;
        #[cfg(feature = "postgres")]
        if conn.is::<PgConn>() {
            return Db::Postgres(conn.downcast_mut().expect("checked above"));
        }
        Db::Sqlite(
            conn.downcast_mut()
                .expect("tickbox's connections are SQLite's and PostgreSQL's"),
        )
    }

    /// Runs a statement; the number of rows it changed.
    pub fn execute(&mut self, statement: impl Statement) -> BoxFuture<'_, QueryResult<usize>> {
        Box::pin(async move {
            match self {
                Db::Sqlite(conn) => ExecuteDsl::execute(statement, &mut **conn).await,
                #[cfg(feature = "postgres")]
                Db::Postgres(conn) => ExecuteDsl::execute(statement, &mut **conn).await,
            }
        })
    }

    /// Runs a query; every row.
    pub fn load<U: Send + 'static>(
        &mut self,
        query: impl Query<U>,
    ) -> BoxFuture<'_, QueryResult<Vec<U>>> {
        Box::pin(async move {
            match self {
                Db::Sqlite(conn) => query.load(&mut **conn).await,
                #[cfg(feature = "postgres")]
                Db::Postgres(conn) => query.load(&mut **conn).await,
            }
        })
    }

    /// Runs a query; its first row (`NotFound` if none).
    pub fn get_result<U: Send + 'static>(
        &mut self,
        query: impl Query<U>,
    ) -> BoxFuture<'_, QueryResult<U>> {
        Box::pin(async move {
            match self {
                Db::Sqlite(conn) => query.get_result(&mut **conn).await,
                #[cfg(feature = "postgres")]
                Db::Postgres(conn) => query.get_result(&mut **conn).await,
            }
        })
    }
}

/// The helpers' futures are boxed: a generic future inside a transaction's
/// closure trips the compiler's proof that the closure's future is `Send`
/// ("implementation of `LoadQuery` is not general enough"); a boxed one
/// carries the proof in its type.
type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;
