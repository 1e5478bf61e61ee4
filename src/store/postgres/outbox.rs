//! The outbox's statements on PostgreSQL: lists of ids spelled as in
//! [`ids`](super::ids), and claims that skip each other's rows
//! (`FOR UPDATE SKIP LOCKED`) instead of waiting for them.

use super::ids::{among, id_rows};
use super::Postgres;
use crate::store::contract::Store;
use crate::store::ids::IdLists;
use crate::store::outbox::{
    bump_sequence_statement, claim_owed_text, first_sequence_statement, numbering_order,
    outbox_texts, Claim, InsertOutboxRow, OutboxStatements, OutboxTexts,
};
use crate::store::schema::{if_traced, tickbox_outbox, ClaimedRow, OutboxRow};
use diesel::QueryResult;

/// The `RETURNING` list of a claim, read as a [`ClaimedRow`]: text columns
/// as raw bytes (`convert_to`), so that one row whose text does not decode
/// is decoded (and dead-lettered) on its own.
macro_rules! claimed_columns {
    () => {
        concat!(
            "id, convert_to(topic, 'UTF8') AS topic, convert_to(payload, 'UTF8') AS payload, \
         correlation_id, causation_id, created_at_us, ordering_key, key_seq, key_publisher, \
         key_previous_at_us, due_at_us",
            if_traced!(", trace_context")
        )
    };
}

impl OutboxStatements for Postgres {
    const TEXTS: OutboxTexts = outbox_texts!(id_rows, among);

    async fn insert_outbox(
        conn: &mut Self::Conn,
        rows: Vec<OutboxRow>,
    ) -> QueryResult<Vec<OutboxRow>> {
        use diesel_async::RunQueryDsl;
        let rows = Self::number_keys(conn, rows).await?;
        // One row (the common case) is a statement of its own type, prepared
        // once per connection and found by that type ([`InsertOutboxRow`]).
        let insert = diesel::insert_into(tickbox_outbox::table);
        match rows.as_slice() {
            [] => 0,
            [row] => InsertOutboxRow(row).execute(conn).await?,
            many => insert.values(many).execute(conn).await?,
        };
        Ok(rows)
    }

    async fn number_keys(
        conn: &mut Self::Conn,
        mut rows: Vec<OutboxRow>,
    ) -> QueryResult<Vec<OutboxRow>> {
        use diesel::OptionalExtension;
        use diesel_async::RunQueryDsl;
        for i in numbering_order(&rows) {
            let row = &rows[i];
            let (topic, key, at) = (
                &row.topic,
                row.ordering_key.as_deref().unwrap_or_default(),
                row.created_at_us,
            );
            let numbered = loop {
                let bumped = bump_sequence_statement!(topic, key, at)
                    .get_result::<(i64, Option<i64>)>(conn)
                    .await
                    .optional()?;
                if let Some(numbered) = bumped {
                    break numbered;
                }
                // A new key: start it, unless another transaction did
                // first (this insert then waits for that one's end, and the
                // counter is bumped again).
                if first_sequence_statement!(topic, key, at)
                    .execute(conn)
                    .await?
                    == 1
                {
                    break (1, None);
                }
            };
            (rows[i].key_seq, rows[i].key_previous_at_us) = (Some(numbered.0), numbered.1);
        }
        Ok(rows)
    }

    async fn claim_owed(conn: &mut Self::Conn, claim: &Claim) -> QueryResult<Vec<ClaimedRow>> {
        let statement = claim.statement(
            claim_owed_text!("", among, "FOR UPDATE SKIP LOCKED", claimed_columns),
            claim_owed_text!(
                "AND o.id > ? ",
                among,
                "FOR UPDATE SKIP LOCKED",
                claimed_columns
            ),
            Self::id_set(&claim.served),
        );
        Self::load(conn, statement).await
    }
}
