//! SQLite's effects journal statements (in the module's companion file):
//! the defaults, and where its catalog lists the journal's table.

use crate::store::contract::Store;
use crate::store::journal::JournalStatements;
use crate::store::schema::Count;
use crate::store::sql::Sql;
use crate::store::sqlite::catalog::tables_by_name;
use crate::store::sqlite::Sqlite;
use diesel::QueryResult;

impl JournalStatements for Sqlite {
    async fn has_journal(conn: &mut Self::Conn) -> QueryResult<bool> {
        let statement = Sql::plain(concat!(
            "SELECT count(*) AS n FROM ",
            tables_by_name!(),
            " = 'tickbox_effects'"
        ));
        Ok(Count::of(Self::load(conn, statement).await?) > 0)
    }
}
