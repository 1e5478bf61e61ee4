//! SQLite's retention statements: the defaults, and the effects journal's
//! sweep, which keeps the dead-lettered messages' effects by testing each
//! row's id against one bound `,HEX,HEX,` value.

use crate::store::contract::Store;
use crate::store::retention::{sweep_effects_text, RetentionStatements};
use crate::store::schema::Id;
use crate::store::sql::sql;
use crate::store::sqlite::ids::{among, hex_set};
use crate::store::sqlite::Sqlite;
use diesel::QueryResult;
use uuid::Uuid;

impl RetentionStatements for Sqlite {
    async fn sweep_effects(
        conn: &mut Self::Conn,
        before_us: i64,
        keep: &[Uuid],
        batch: i64,
    ) -> QueryResult<usize> {
        let kept = hex_set(keep);
        let statement = sql!(
            sweep_effects_text!(among!("message_id")),
            Id::earliest_at(before_us),
            before_us,
            kept.as_str(),
            batch,
            before_us,
            kept
        );
        Self::execute(conn, statement).await
    }
}
