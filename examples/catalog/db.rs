//! One query, written once, for both backends.
//!
//! A transaction's connection, `tx.conn()`, is diesel-async's
//! `SyncConnectionWrapper<SqliteConnection>` on SQLite and
//! `AsyncPgConnection` on PostgreSQL, and diesel checks each query against
//! one connection type at compile time. catalog runs on either, so
//! [`on_either!`] names the connection's concrete type and compiles the
//! query once for each. An application on one backend needs none of this:
//! it runs its queries on `tx.conn()` directly.

/// SQLite's connection, as tickbox hands it out.
pub type SqliteConn = tickbox::SqliteConnection;

/// PostgreSQL's connection, as tickbox hands it out.
#[cfg(feature = "postgres")]
pub type PgConn = tickbox::diesel_async::AsyncPgConnection;

/// A transaction's connection, its backend not yet known:
/// `tx.conn()` coerces to it.
pub type AnyConn = dyn std::any::Any + Send;

/// Runs `$query`, diesel code over the connection `$conn`, on `$any` (an
/// [`AnyConn`]) as whichever backend's connection it is:
///
/// ```ignore
/// on_either!(conn, |c| products::table.count().get_result::<i64>(c).await)
/// ```
macro_rules! on_either {
    ($any:expr, |$conn:ident| $query:expr) => {{
        let any: &mut $crate::db::AnyConn = $any;
        #[cfg(feature = "postgres")]
        let postgres = any.is::<$crate::db::PgConn>();
        #[cfg(not(feature = "postgres"))]
        let postgres = false;
        if !postgres {
            let $conn = any
                .downcast_mut::<$crate::db::SqliteConn>()
                .expect("tickbox's connections are SQLite's and PostgreSQL's");
            $query
        } else {
            #[cfg(feature = "postgres")]
            {
                let $conn = any
                    .downcast_mut::<$crate::db::PgConn>()
                    .expect("checked above");
                $query
            }
            #[cfg(not(feature = "postgres"))]
            unreachable!("PostgreSQL needs the `postgres` feature")
        }
    }};
}

pub(crate) use on_either;
