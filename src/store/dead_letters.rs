//! Dead letters (`tickbox_dead_letters`): deliveries given up on, kept with
//! their reason until an operator replays, skips or discards them.

use crate::store::contract::Store;
use crate::store::schema::{if_traced, Count, DeadLetterRow, MessageIdRow};
use crate::store::sql::{sql, Sql};
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// The columns of a dead letter row, in [`DeadLetterRow`]'s order, as a
/// string literal for `concat!`.
macro_rules! dead_letter_columns {
    () => {
        concat!(
            "message_id, handler, topic, payload, correlation_id, causation_id, created_at_us, \
         attempts, reason, dead_at_us, ordering_key, key_seq, key_publisher, \
         key_previous_at_us, parked_behind",
            if_traced!(", trace_context")
        )
    };
}

/// The values of a dead letter row's insert, one `?` per
/// [`dead_letter_columns!`] column, as a string literal for `concat!`.
macro_rules! dead_letter_values {
    () => {
        concat!(
            "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?",
            if_traced!(", ?")
        )
    };
}
pub(crate) use dead_letter_columns;
#[allow(
    unused_imports,
    reason = "a backend that spells the insert itself (MariaDB's) uses it"
)]
pub(crate) use dead_letter_values;

/// The dead letters' statements. The defaults are written in the SQL that
/// SQLite and PostgreSQL share; a backend overrides what its dialect spells
/// otherwise.
pub trait DeadLetterStatements: Store {
    /// Records a dead letter, or updates the one already recorded for the
    /// same message and handler (its attempts, reason, time and the dead
    /// letter it is parked behind).
    fn insert_dead_letter(
        conn: &mut Self::Conn,
        row: DeadLetterRow,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let statement = sql!(
            concat!(
                "INSERT INTO tickbox_dead_letters (",
                dead_letter_columns!(),
                ") VALUES (",
                dead_letter_values!(),
                ") ON CONFLICT (message_id, handler) DO UPDATE SET attempts = excluded.attempts, \
                 reason = excluded.reason, dead_at_us = excluded.dead_at_us, \
                 parked_behind = excluded.parked_behind"
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
        async move { Self::execute(conn, statement).await.map(drop) }
    }

    /// Dead letters, oldest first, from `offset`.
    fn dead_letters(
        conn: &mut Self::Conn,
        offset: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<DeadLetterRow>>> + Send {
        Self::load(
            conn,
            sql!(
                concat!(
                    "SELECT ",
                    dead_letter_columns!(),
                    " FROM tickbox_dead_letters \
                     ORDER BY dead_at_us, message_id, handler LIMIT ? OFFSET ?"
                ),
                limit,
                offset
            ),
        )
    }

    /// One dead letter, if there is one for this message and handler.
    fn dead_letter(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: String,
    ) -> impl Future<Output = QueryResult<Option<DeadLetterRow>>> + Send {
        let statement = sql!(
            concat!(
                "SELECT ",
                dead_letter_columns!(),
                " FROM tickbox_dead_letters WHERE message_id = ? AND handler = ?"
            ),
            message_id,
            handler
        );
        async move {
            let rows: Vec<DeadLetterRow> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().next())
        }
    }

    /// The ids of the messages that have a dead letter (which the retention
    /// sweep keeps the effects of).
    fn dead_letter_ids(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Vec<Uuid>>> + Send {
        let statement = Sql::plain("SELECT DISTINCT message_id FROM tickbox_dead_letters");
        async move {
            let rows: Vec<MessageIdRow> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().map(|row| row.message_id.0).collect())
        }
    }

    /// Deletes one dead letter; the number of rows deleted.
    fn delete_dead_letter(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: String,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                "DELETE FROM tickbox_dead_letters WHERE message_id = ? AND handler = ?",
                message_id,
                handler
            ),
        )
    }

    /// Counts the dead letters (a small table).
    fn count_dead_letters(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<i64>> + Send {
        let statement = Sql::plain("SELECT count(*) AS n FROM tickbox_dead_letters");
        async move { Ok(Count::of(Self::load(conn, statement).await?)) }
    }
}
