//! MySQL's inbox statements: the inbox guard's insert counts a duplicate
//! (`ON DUPLICATE KEY UPDATE duplicates = duplicates + 1`), so that its
//! affected rows tell a new message (1) from a duplicate (2).

use super::{check_width, Mysql, NAME_BYTES};
use crate::store::contract::Store;
use crate::store::inbox::{InboxStatements, Tick};
use crate::store::ordering::{KeyScope, OrderingStatements};
use crate::store::sql::sql;
use diesel::QueryResult;
use uuid::Uuid;

impl InboxStatements for Mysql {
    async fn tick_inbox(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: &str,
        now_us: i64,
        key: Option<(KeyScope<'_>, i64)>,
    ) -> QueryResult<Tick> {
        check_width("handler name", handler, NAME_BYTES)?;
        // On the inbox's primary key, a concurrent delivery of the same
        // message waits for this one's end, then counts a duplicate (or
        // inserts, if this one rolled back). Never INSERT IGNORE (it hides
        // every error) nor a plain INSERT's duplicate-key error (the shared
        // lock it leaves deadlocks three deliveries of one message).
        let statement = sql!(
            "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE duplicates = duplicates + 1",
            message_id,
            handler,
            now_us
        );
        let inserted = Self::execute(conn, statement).await? == 1;
        let key_turn = match key {
            Some((scope, sequence)) if inserted => {
                if sequence == 1 {
                    Self::start_key(conn, scope, sequence).await?
                } else {
                    Self::advance_key(conn, scope, sequence).await?
                }
            }
            _ => false,
        };
        Ok(Tick { inserted, key_turn })
    }
}
