//! One query, written once, for every backend.
//!
//! A transaction's connection, `tx.conn()`, is diesel-async's
//! `SyncConnectionWrapper<SqliteConnection>` on SQLite, `AsyncPgConnection`
//! on PostgreSQL and `AsyncMysqlConnection` on MariaDB/MySQL, and diesel
//! checks each query against one connection type at compile time. catalog
//! runs on any of them, so [`on_either!`] names the connection's concrete
//! type and compiles the query once for each. A query MariaDB and MySQL
//! spell otherwise (they have no `RETURNING` and no upsert `WHERE`) is
//! given for them beside it. An application on one backend needs none of
//! this: it runs its queries on `tx.conn()` directly.

/// SQLite's connection, as tickbox hands it out.
pub type SqliteConn = tickbox::SqliteConnection;

/// PostgreSQL's connection, as tickbox hands it out.
#[cfg(feature = "postgres")]
pub type PgConn = tickbox::diesel_async::AsyncPgConnection;

/// MariaDB's and MySQL's connection, as tickbox hands it out.
#[cfg(feature = "mysql")]
pub type MysqlConn = tickbox::diesel_async::AsyncMysqlConnection;

/// A transaction's connection, its backend not yet known:
/// `tx.conn()` coerces to it.
pub type AnyConn = dyn std::any::Any + Send;

/// Runs `$query`, diesel code over the connection `$conn`, on `$any` (an
/// [`AnyConn`]) as whichever backend's connection it is; on MariaDB/MySQL
/// `$mysql` instead, when given:
///
/// ```ignore
/// on_either!(conn, |c| products::table.count().get_result::<i64>(c).await)
/// on_either!(conn, |c| postgres_and_sqlite(c).await, mysql: |c| mysql(c).await)
/// ```
macro_rules! on_either {
    ($any:expr, |$conn:ident| $query:expr) => {
        $crate::db::on_either!($any, |$conn| $query, mysql: |$conn| $query)
    };
    ($any:expr, |$conn:ident| $query:expr, mysql: |$my:ident| $mysql:expr) => {{
        let any: &mut $crate::db::AnyConn = $any;
        'on: {
            if let Some($conn) = any.downcast_mut::<$crate::db::SqliteConn>() {
                break 'on ($query);
            }
            #[cfg(feature = "postgres")]
            if let Some($conn) = any.downcast_mut::<$crate::db::PgConn>() {
                break 'on ($query);
            }
            #[cfg(feature = "mysql")]
            if let Some($my) = any.downcast_mut::<$crate::db::MysqlConn>() {
                break 'on ($mysql);
            }
            unreachable!("tickbox's connections are SQLite's, PostgreSQL's and MySQL's")
        }
    }};
}

pub(crate) use on_either;
