//! The outbox's statements on MySQL: lists of ids spelled as in
//! [`ids`](super::ids); claims that select their rows `FOR UPDATE SKIP
//! LOCKED` and then mark them, in one transaction (neither server has
//! `UPDATE … RETURNING`); upserts spelled `ON DUPLICATE KEY UPDATE`; and
//! counts of changed rows where the other backends count `RETURNING` rows.

use super::ids::{among, id_rows, join_ids};
use super::{check_width, in_transaction, Mysql, KEY_BYTES, NAME_BYTES};
use crate::store::contract::Store;
use crate::store::ids::IdLists;
use crate::store::outbox::{
    claimable_text, numbering_order, outbox_texts, owed_elsewhere_text, Claim, InsertOutboxRow,
    OutboxStatements, OutboxTexts, Owed,
};
use crate::store::schema::{if_traced, tickbox_outbox, ClaimedRow, OutboxRow};
use crate::store::sql::sql;
use diesel::sql_types::{BigInt, Nullable};
use diesel::QueryResult;
use uuid::Uuid;

/// The columns a claim selects, read as a [`ClaimedRow`] (text columns as
/// the bytes they hold, so that one row whose text does not decode is
/// decoded, and dead-lettered, on its own).
macro_rules! claimed_columns {
    () => {
        concat!(
            "o.id AS id, o.topic AS topic, o.payload AS payload, \
         o.correlation_id AS correlation_id, o.causation_id AS causation_id, \
         o.created_at_us AS created_at_us, o.ordering_key AS ordering_key, \
         o.key_seq AS key_seq, o.key_publisher AS key_publisher, \
         o.key_previous_at_us AS key_previous_at_us, o.due_at_us AS due_at_us",
            if_traced!(", o.trace_context AS trace_context")
        )
    };
}

/// The part of [`OutboxStatements::finish_completed`]'s statements that
/// says nobody owes the `tickbox_outbox` row any more.
macro_rules! owed_by_nobody {
    () => {
        "NOT EXISTS (SELECT 1 FROM tickbox_subscriptions s \
         WHERE s.topic = tickbox_outbox.topic \
         AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
             WHERE d.message_id = tickbox_outbox.id AND d.subscription = s.id))"
    };
}

/// The messages some subscription is done with.
macro_rules! partly_done {
    () => {
        "id IN (SELECT message_id FROM tickbox_outbox_done) AND "
    };
}

/// A key's counter, just moved on by this transaction.
#[derive(diesel::QueryableByName)]
struct Numbered {
    /// The number it moved to.
    #[diesel(sql_type = BigInt)]
    last_seq: i64,
    /// When the key's previous message was published.
    #[diesel(sql_type = Nullable<BigInt>)]
    previous_at_us: Option<i64>,
}

impl OutboxStatements for Mysql {
    // Used by `still_pending` and `hand_over`'s record of what is done (a
    // record already there stays as it is); the other writes by a list of
    // ids join it, below.
    const TEXTS: OutboxTexts = outbox_texts!(
        id_rows,
        among,
        record_done: concat!(
            "INSERT INTO tickbox_outbox_done (message_id, subscription) \
             SELECT o.id, s.id FROM tickbox_outbox o \
             JOIN tickbox_subscriptions s ON s.topic = o.topic \
             WHERE o.id IN ",
            id_rows!(),
            " AND ",
            among!("s.id"),
            " ON DUPLICATE KEY UPDATE subscription = tickbox_outbox_done.subscription"
        )
    );

    async fn insert_outbox(
        conn: &mut Self::Conn,
        rows: Vec<OutboxRow>,
    ) -> QueryResult<Vec<OutboxRow>> {
        use diesel_async::RunQueryDsl;
        for row in &rows {
            check_width("topic", &row.topic, NAME_BYTES)?;
            if let Some(key) = &row.ordering_key {
                check_width("ordering key", key, KEY_BYTES)?;
            }
            if let Some(publisher) = &row.key_publisher {
                check_width("publisher name", publisher, NAME_BYTES)?;
            }
        }
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
        for i in numbering_order(&rows) {
            let row = &rows[i];
            let (topic, key, at) = (
                row.topic.as_str(),
                row.ordering_key.as_deref().unwrap_or_default(),
                row.created_at_us,
            );
            // Starts the key's counter at 1 (1 row affected), or moves it on
            // (2: the connection counts an updated row twice); the row stays
            // locked until the transaction ends, so a concurrent publisher
            // of the key waits. The assignments run left to right: the
            // previous time is read before it is replaced.
            let bumped = Self::execute(
                conn,
                sql!(
                    "INSERT INTO tickbox_key_sequences \
                     (topic, ordering_key, last_seq, last_at_us, previous_at_us) \
                     VALUES (?, ?, 1, ?, NULL) \
                     ON DUPLICATE KEY UPDATE previous_at_us = last_at_us, \
                     last_seq = last_seq + 1, last_at_us = VALUES(last_at_us)",
                    topic,
                    key,
                    at
                ),
            )
            .await?;
            let numbered = if bumped == 1 {
                (1, None)
            } else {
                let read: Vec<Numbered> = Self::load(
                    conn,
                    sql!(
                        "SELECT last_seq, previous_at_us FROM tickbox_key_sequences \
                         WHERE topic = ? AND ordering_key = ?",
                        topic,
                        key
                    ),
                )
                .await?;
                let read = read.into_iter().next().ok_or(diesel::NotFound)?;
                (read.last_seq, read.previous_at_us)
            };
            (rows[i].key_seq, rows[i].key_previous_at_us) = (Some(numbered.0), numbered.1);
        }
        Ok(rows)
    }

    async fn claim_owed(conn: &mut Self::Conn, claim: &Claim) -> QueryResult<Vec<ClaimedRow>> {
        let selection = claim.selection(
            claimable_text!(claimed_columns!(), "", among, "FOR UPDATE SKIP LOCKED"),
            claimable_text!(
                claimed_columns!(),
                "AND o.id > ? ",
                among,
                "FOR UPDATE SKIP LOCKED"
            ),
            Self::id_rows(&claim.served),
        );
        in_transaction!(
            conn,
            async {
                let rows: Vec<ClaimedRow> = Self::load(conn, selection).await?;
                // A row whose id does not read cannot be named to mark it; it is
                // still returned, to be dead-lettered by what it holds.
                let ids: Vec<Uuid> = rows
                    .iter()
                    .filter_map(|row| row.id.0.as_ref().ok().map(|id| id.0))
                    .collect();
                if !ids.is_empty() {
                    let mark = sql!(
                        concat!(
                            "UPDATE tickbox_outbox",
                            join_ids!("tickbox_outbox.id"),
                            "SET claimed_by = ?, claimed_until_us = ?"
                        ),
                        Self::id_rows(&ids),
                        claim.bus,
                        claim.until_us
                    );
                    Self::execute(conn, mark).await?;
                }
                Ok(rows)
            }
            .await
        )
    }

    async fn renew_claims(
        conn: &mut Self::Conn,
        ids: &[Uuid],
        bus: Uuid,
        now_us: i64,
        until_us: i64,
    ) -> QueryResult<usize> {
        let statement = sql!(
            concat!(
                "UPDATE tickbox_outbox",
                join_ids!("tickbox_outbox.id"),
                "SET claimed_by = ?, claimed_until_us = ? WHERE delivered_at_us IS NULL \
                 AND (claimed_by = ? OR claimed_until_us IS NULL OR claimed_until_us < ?)"
            ),
            Self::id_rows(ids),
            bus,
            until_us,
            bus,
            now_us
        );
        Self::execute(conn, statement).await
    }

    async fn finish_delivered(
        conn: &mut Self::Conn,
        ids: &[Uuid],
        served: &[Uuid],
        now_us: i64,
        delete: bool,
    ) -> QueryResult<usize> {
        let (ids, served) = (Self::id_rows(ids), Self::id_set(served));
        let statement = if delete {
            sql!(
                concat!(
                    "DELETE tickbox_outbox FROM tickbox_outbox",
                    join_ids!("tickbox_outbox.id"),
                    "WHERE NOT ",
                    owed_elsewhere_text!(among)
                ),
                ids,
                served.clone(),
                served
            )
        } else {
            sql!(
                concat!(
                    "UPDATE tickbox_outbox",
                    join_ids!("tickbox_outbox.id"),
                    "SET delivered_at_us = ?, claimed_until_us = NULL WHERE NOT ",
                    owed_elsewhere_text!(among)
                ),
                ids,
                now_us,
                served.clone(),
                served
            )
        };
        Self::execute(conn, statement).await
    }

    async fn hand_over(
        conn: &mut Self::Conn,
        ids: &[Uuid],
        served: &[Uuid],
        bus: Uuid,
    ) -> QueryResult<()> {
        let listed = Self::id_rows(ids);
        let done = sql!(
            Self::TEXTS.record_done,
            listed.as_str(),
            Self::id_set(served)
        );
        Self::execute(conn, done).await?;
        let release = sql!(
            concat!(
                "UPDATE tickbox_outbox",
                join_ids!("tickbox_outbox.id"),
                "SET claimed_by = NULL, claimed_until_us = NULL \
                 WHERE claimed_by = ? AND delivered_at_us IS NULL"
            ),
            listed,
            bus
        );
        Self::execute(conn, release).await.map(drop)
    }

    async fn forget_done(conn: &mut Self::Conn, ids: &[Uuid]) -> QueryResult<usize> {
        let statement = sql!(
            concat!(
                "DELETE tickbox_outbox_done FROM tickbox_outbox_done",
                join_ids!("tickbox_outbox_done.message_id")
            ),
            Self::id_rows(ids)
        );
        Self::execute(conn, statement).await
    }

    async fn finish_completed(
        conn: &mut Self::Conn,
        among: Owed<'_>,
        now_us: i64,
        delete: bool,
    ) -> QueryResult<usize> {
        // The changed rows are counted by the server: no `RETURNING` here.
        let statement = match (among, delete) {
            (Owed::PartlyDone, true) => sql!(concat!(
                "DELETE FROM tickbox_outbox WHERE delivered_at_us IS NULL AND ",
                partly_done!(),
                owed_by_nobody!()
            )),
            (Owed::PartlyDone, false) => sql!(
                concat!(
                    "UPDATE tickbox_outbox SET delivered_at_us = ?, claimed_until_us = NULL \
                     WHERE delivered_at_us IS NULL AND ",
                    partly_done!(),
                    owed_by_nobody!()
                ),
                now_us
            ),
            (Owed::Topic(topic), true) => sql!(
                concat!(
                    "DELETE FROM tickbox_outbox WHERE delivered_at_us IS NULL AND topic = ? AND ",
                    owed_by_nobody!()
                ),
                topic
            ),
            (Owed::Topic(topic), false) => sql!(
                concat!(
                    "UPDATE tickbox_outbox SET delivered_at_us = ?, claimed_until_us = NULL \
                     WHERE delivered_at_us IS NULL AND topic = ? AND ",
                    owed_by_nobody!()
                ),
                now_us,
                topic
            ),
        };
        Self::execute(conn, statement).await
    }

    async fn requeue_or_insert(conn: &mut Self::Conn, row: OutboxRow) -> QueryResult<()> {
        let insert = sql!(
            concat!(
                "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, \
                 created_at_us, ordering_key, key_seq, key_publisher, key_previous_at_us",
                if_traced!(", trace_context"),
                ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?",
                if_traced!(", ?"),
                ") ON DUPLICATE KEY UPDATE delivered_at_us = NULL, claimed_by = NULL, \
             claimed_until_us = NULL"
            ),
            row.id,
            row.topic,
            row.payload,
            row.correlation_id,
            row.causation_id,
            row.created_at_us,
            row.ordering_key,
            row.key_seq,
            row.key_publisher,
            row.key_previous_at_us
        );
        #[cfg(feature = "opentelemetry")]
        let insert = insert.and_bind(row.trace_context.clone());
        let forget = sql!(
            "DELETE FROM tickbox_outbox_done WHERE message_id = ?",
            row.id
        );
        Self::execute(conn, insert).await?;
        Self::execute(conn, forget).await.map(drop)
    }
}
