//! MySQL's effects journal statements (a table of the module's database):
//! the first record of an effect, which tells a new row from one already
//! there, and where the catalog lists the journal's table; the others are
//! the defaults.

use super::catalog::tables_by_name;
use super::{check_width, Mysql, NAME_BYTES};
use crate::store::contract::Store;
use crate::store::journal::{effect_columns, JournalStatements};
use crate::store::schema::{Count, EffectRow};
use crate::store::sql::{sql, Sql};
use diesel::result::{DatabaseErrorKind, Error};
use diesel::QueryResult;

impl JournalStatements for Mysql {
    async fn insert_journal_entry(conn: &mut Self::Conn, row: &EffectRow) -> QueryResult<usize> {
        check_width("handler name", &row.handler, NAME_BYTES)?;
        check_width("effect name", &row.effect, NAME_BYTES)?;
        // A plain insert, whose duplicate-key error means "already there":
        // with the connection reporting found rows, an upsert that changes
        // nothing counts 1 as an insert does, and INSERT IGNORE would hide
        // every other error too. A failed statement leaves the journal's
        // short transaction open and usable on these servers.
        let statement = sql!(
            concat!(
                "INSERT INTO tickbox_effects (",
                effect_columns!(),
                ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
            row.message_id,
            &row.handler,
            &row.effect,
            &row.effect_key,
            &row.policy,
            &row.state,
            row.calls,
            row.window_from_us,
            row.updated_at_us,
            row.result.as_deref(),
            row.error.as_deref()
        );
        match Self::execute(conn, statement).await {
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(0),
            done => done,
        }
    }

    async fn has_journal(conn: &mut Self::Conn) -> QueryResult<bool> {
        let statement = Sql::plain(concat!(
            "SELECT count(*) AS n FROM ",
            tables_by_name!(),
            " = 'tickbox_effects'"
        ));
        Ok(Count::of(Self::load(conn, statement).await?) > 0)
    }
}
