//! MySQL's catalog statements: the tables of the connection's database
//! (the module's) are listed in `information_schema.tables`, and a
//! module's start is recorded with `ON DUPLICATE KEY UPDATE`.

use super::{check_width, Mysql, NAME_BYTES};
use crate::store::catalog::{table_names, CatalogStatements};
use crate::store::contract::Store;
use crate::store::schema::Count;
use crate::store::sql::{sql, Sql};
use diesel::QueryResult;

/// Where MySQL's catalog lists tables by name, as a query's `FROM` and the
/// start of its `WHERE`: `… WHERE <name column>`; a string literal for
/// `concat!`.
macro_rules! tables_by_name {
    () => {
        "information_schema.tables WHERE table_schema = DATABASE() AND table_name"
    };
}
pub(crate) use tables_by_name;

impl CatalogStatements for Mysql {
    async fn record_module_start(
        conn: &mut Self::Conn,
        name: &str,
        now_us: i64,
    ) -> QueryResult<()> {
        check_width("module name", name, NAME_BYTES)?;
        let statement = sql!(
            "INSERT INTO tickbox_modules (name, last_started_at_us) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE last_started_at_us = VALUES(last_started_at_us)",
            name,
            now_us
        );
        Self::execute(conn, statement).await.map(drop)
    }

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
        // The session's cipher: empty in clear. `SHOW STATUS` reads the
        // same on MariaDB and MySQL (their status tables differ).
        let statement = Sql::plain("SHOW SESSION STATUS LIKE 'Ssl_cipher'");
        let rows: Vec<StatusValue> = Self::load(conn, statement).await?;
        Ok(Some(rows.iter().any(|row| !row.value.is_empty())))
    }
}

/// A row of `SHOW STATUS`: only its value is read.
#[derive(diesel::QueryableByName)]
struct StatusValue {
    /// The status variable's value.
    #[diesel(sql_type = diesel::sql_types::Text, column_name = Value)]
    value: String,
}
