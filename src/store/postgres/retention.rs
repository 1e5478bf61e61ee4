//! PostgreSQL's retention statements: the defaults, and the effects journal's
//! sweep, which keeps the dead-lettered messages' effects by testing each
//! row's id against one bound `uuid[]` value.

use crate::store::contract::Store;
use crate::store::ids::IdLists;
use crate::store::postgres::ids::among;
use crate::store::postgres::Postgres;
use crate::store::retention::{sweep_effects_statement, sweep_effects_text, RetentionStatements};
use diesel::QueryResult;
use uuid::Uuid;

impl RetentionStatements for Postgres {
    async fn sweep_effects(
        conn: &mut Self::Conn,
        before_us: i64,
        keep: &[Uuid],
        batch: i64,
    ) -> QueryResult<usize> {
        let statement = sweep_effects_statement(
            sweep_effects_text!(among!("message_id")),
            before_us,
            Self::id_set(keep),
            batch,
        );
        Self::execute(conn, statement).await
    }
}
