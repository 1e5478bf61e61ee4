//! SQLite's catalog statements: its tables are listed in `sqlite_master`.

use crate::store::catalog::{table_names, CatalogStatements};
use crate::store::contract::Store;
use crate::store::schema::Count;
use crate::store::sql::Sql;
use crate::store::sqlite::Sqlite;
use diesel::QueryResult;

/// Where SQLite's catalog lists tables by name, as a query's `FROM` and
/// the start of its `WHERE`: `… WHERE <name column>`; a string literal for
/// `concat!`.
macro_rules! tables_by_name {
    () => {
        "sqlite_master WHERE type = 'table' AND name"
    };
}
pub(crate) use tables_by_name;

impl CatalogStatements for Sqlite {
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
}
