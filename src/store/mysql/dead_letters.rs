//! MySQL's dead letter statements: the upsert of a dead letter, spelled
//! `ON DUPLICATE KEY UPDATE`; the others are the defaults.

use super::{check_width, Mysql, KEY_BYTES, NAME_BYTES};
use crate::store::contract::Store;
use crate::store::dead_letters::{dead_letter_columns, dead_letter_values, DeadLetterStatements};
use crate::store::schema::if_traced;
use crate::store::schema::DeadLetterRow;
use crate::store::sql::sql;
use diesel::QueryResult;

impl DeadLetterStatements for Mysql {
    async fn insert_dead_letter(conn: &mut Self::Conn, row: DeadLetterRow) -> QueryResult<()> {
        check_width("handler name", &row.handler, NAME_BYTES)?;
        check_width("topic", &row.topic, NAME_BYTES)?;
        if let Some(key) = &row.ordering_key {
            check_width("ordering key", key, KEY_BYTES)?;
        }
        let statement = sql!(
            concat!(
                "INSERT INTO tickbox_dead_letters (",
                dead_letter_columns!(),
                ") VALUES (",
                dead_letter_values!(),
                ") ON DUPLICATE KEY UPDATE attempts = VALUES(attempts), \
                 reason = VALUES(reason), dead_at_us = VALUES(dead_at_us), \
                 parked_behind = VALUES(parked_behind)"
            ),
            row.message_id,
            row.handler,
            row.topic,
            row.payload,
            row.correlation_id,
            row.causation_id,
            row.created_at_us,
            i64::from(row.attempts),
            row.reason,
            row.dead_at_us,
            row.ordering_key,
            row.key_seq,
            row.key_publisher,
            row.key_previous_at_us,
            row.parked_behind
        );
        #[cfg(feature = "opentelemetry")]
        let statement = statement.and_bind(row.trace_context);
        Self::execute(conn, statement).await.map(drop)
    }
}
