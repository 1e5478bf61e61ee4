//! PostgreSQL's catalog statements: the tables of the connection's current
//! schema (the module's) are listed in `information_schema.tables`.

use crate::store::catalog::{table_names, CatalogStatements};
use crate::store::contract::Store;
use crate::store::postgres::Postgres;
use crate::store::schema::Count;
use crate::store::sql::Sql;
use diesel::QueryResult;

/// Where PostgreSQL's catalog lists tables by name, as a query's `FROM` and
/// the start of its `WHERE`: `… WHERE <name column>`; a string literal for
/// `concat!`.
macro_rules! tables_by_name {
    () => {
        "information_schema.tables WHERE table_schema = current_schema() AND table_name"
    };
}
pub(crate) use tables_by_name;

impl CatalogStatements for Postgres {
    async fn count_tables(conn: &mut Self::Conn) -> QueryResult<i64> {
        let statement = Sql::plain(concat!(
            "SELECT count(*) AS n FROM ",
            tables_by_name!(),
            " IN (",
            table_names!(),
            ")"
        ));
        Ok(Count::of(Self::load(conn, statement).await?))
    }

    async fn connection_encrypted(conn: &mut Self::Conn) -> QueryResult<Option<bool>> {
        let statement = Sql::plain(
            "SELECT count(*) AS n FROM pg_stat_ssl WHERE pid = pg_backend_pid() AND ssl",
        );
        Ok(Some(Count::of(Self::load(conn, statement).await?) > 0))
    }
}
