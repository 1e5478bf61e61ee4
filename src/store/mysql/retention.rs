//! MySQL's retention statements: each sweep is one `DELETE … ORDER BY …
//! LIMIT ?` on the primary key (the servers refuse `LIMIT` in an
//! `IN (SELECT …)`), the rows below the cutoff's smallest id, as on the
//! other backends.

use super::ids::among;
use super::Mysql;
use crate::store::contract::Store;
use crate::store::ids::IdLists;
use crate::store::retention::RetentionStatements;
use crate::store::schema::Id;
use crate::store::sql::sql;
use diesel::QueryResult;
use uuid::Uuid;

impl RetentionStatements for Mysql {
    async fn sweep_inbox(conn: &mut Self::Conn, before_us: i64, batch: i64) -> QueryResult<usize> {
        let statement = sql!(
            "DELETE FROM tickbox_inbox WHERE message_id < ? AND processed_at_us < ? \
             ORDER BY message_id LIMIT ?",
            Id::earliest_at(before_us),
            before_us,
            batch
        );
        Self::execute(conn, statement).await
    }

    async fn sweep_outbox(conn: &mut Self::Conn, before_us: i64, batch: i64) -> QueryResult<usize> {
        let statement = sql!(
            "DELETE FROM tickbox_outbox WHERE id < ? AND delivered_at_us < ? \
             ORDER BY id LIMIT ?",
            Id::earliest_at(before_us),
            before_us,
            batch
        );
        Self::execute(conn, statement).await
    }

    async fn sweep_effects(
        conn: &mut Self::Conn,
        before_us: i64,
        keep: &[Uuid],
        batch: i64,
    ) -> QueryResult<usize> {
        let statement = sql!(
            concat!(
                "DELETE FROM tickbox_effects WHERE message_id < ? AND updated_at_us < ? \
                 AND NOT (",
                crate::store::journal::unsettled!(),
                ") AND NOT (",
                among!("message_id"),
                ") ORDER BY message_id LIMIT ?"
            ),
            Id::earliest_at(before_us),
            before_us,
            Self::id_rows(keep),
            batch
        );
        Self::execute(conn, statement).await
    }
}
