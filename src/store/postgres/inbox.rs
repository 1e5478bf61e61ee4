//! PostgreSQL's inbox statements.

use crate::store::inbox::{InboxStatements, Tick, TickInbox};
use crate::store::ordering::{advance_key_statement, start_key_statement, KeyScope};
use crate::store::postgres::Postgres;
use crate::store::schema::Id;
use diesel::QueryResult;
use uuid::Uuid;

impl InboxStatements for Postgres {
    async fn tick_inbox(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: &str,
        now_us: i64,
        key: Option<(KeyScope<'_>, i64)>,
    ) -> QueryResult<Tick> {
        use diesel_async::RunQueryDsl;
        let tick = TickInbox {
            message_id: Id(message_id),
            handler,
            now_us,
        };
        let inserted = tick.execute(conn).await? == 1;
        let key_turn = match key {
            Some((scope, sequence)) if inserted => {
                let changed = if sequence == 1 {
                    start_key_statement!(scope, sequence).execute(conn).await?
                } else {
                    advance_key_statement!(scope, sequence)
                        .execute(conn)
                        .await?
                };
                changed == 1
            }
            _ => false,
        };
        Ok(Tick { inserted, key_turn })
    }
}
