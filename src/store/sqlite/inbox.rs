//! SQLite's inbox statements.

use crate::store::inbox::{InboxStatements, Tick, TickInbox};
use crate::store::ordering::{advance_key_statement, start_key_statement, KeyScope};
use crate::store::schema::Id;
use crate::store::sqlite::ordering::OwnedScope;
use crate::store::sqlite::Sqlite;
use diesel::QueryResult;
use uuid::Uuid;

impl InboxStatements for Sqlite {
    async fn tick_inbox(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: &str,
        now_us: i64,
        key: Option<(KeyScope<'_>, i64)>,
    ) -> QueryResult<Tick> {
        let handler = handler.to_owned();
        let key = key.map(|(scope, sequence)| (OwnedScope::from(scope), sequence));
        // On its blocking thread, the synchronous connection prepares these
        // statements of fixed shape once and never builds their SQL again,
        // and the key's progress moves in the same visit.
        conn.spawn_blocking(move |c| {
            use diesel::RunQueryDsl;
            let tick = TickInbox {
                message_id: Id(message_id),
                handler: &handler,
                now_us,
            };
            let inserted = tick.execute(c)? == 1;
            let key_turn = match &key {
                Some((scope, sequence)) if inserted => {
                    let (scope, sequence) = (scope.scope(), *sequence);
                    let changed = if sequence == 1 {
                        start_key_statement!(scope, sequence).execute(c)?
                    } else {
                        advance_key_statement!(scope, sequence).execute(c)?
                    };
                    changed == 1
                }
                _ => false,
            };
            Ok(Tick { inserted, key_turn })
        })
        .await
    }
}
