//! The outbox's statements on SQLite: lists of ids spelled as in
//! [`ids`](super::ids), no row locks (SQLite's writers take turns), and the
//! publishing insert on the connection's blocking thread.

use super::ids::{among, id_rows};
use super::Sqlite;
use crate::store::contract::Store;
use crate::store::ids::IdLists;
use crate::store::outbox::{
    bump_sequence_statement, claim_owed_text, first_sequence_statement, numbering_order,
    outbox_texts, owed_elsewhere_text, Claim, InsertOutboxRow, OutboxStatements, OutboxTexts,
};
use crate::store::schema::{if_traced, tickbox_outbox, ClaimedRow, OutboxRow};
use diesel::QueryResult;

/// The `RETURNING` list of a claim, read as a [`ClaimedRow`]: text columns
/// as raw bytes and a creation time that is NULL unless it is an integer
/// (SQLite stores any type in any column), so that one malformed row is
/// decoded (and dead-lettered) on its own.
macro_rules! claimed_columns {
    () => {
        concat!(
            "id, CAST(topic AS BLOB) AS topic, CAST(payload AS BLOB) AS payload, \
         correlation_id, causation_id, \
         CASE WHEN typeof(created_at_us) = 'integer' THEN created_at_us END AS created_at_us, \
         ordering_key, key_seq, key_publisher, key_previous_at_us, \
         CASE WHEN typeof(due_at_us) = 'integer' THEN due_at_us END AS due_at_us",
            if_traced!(", trace_context")
        )
    };
}

impl OutboxStatements for Sqlite {
    const TEXTS: OutboxTexts = OutboxTexts {
        // Marking joins the list of ids (`UPDATE … FROM`, same values in the
        // same order) instead of testing `id IN` it, for which SQLite builds
        // a temporary table and a Bloom filter of the list in every
        // statement. Measured alone (tickbox's schema, 1,000 rows, marks of
        // 1, 10 and 100 rows): 65.2 k -> 36.1 k, 17.7 k -> 14.4 k and
        // 13.1 k -> 12.4 k instructions per marked row. (A `DELETE` takes no
        // `FROM`: deleting keeps the shared text.)
        finish_update: concat!(
            "UPDATE tickbox_outbox SET delivered_at_us = ?, claimed_until_us = NULL FROM ",
            id_rows!(),
            " AS listed WHERE tickbox_outbox.id = listed.id AND NOT ",
            owed_elsewhere_text!(among)
        ),
        ..outbox_texts!(id_rows, among)
    };

    async fn insert_outbox(
        conn: &mut Self::Conn,
        mut rows: Vec<OutboxRow>,
    ) -> QueryResult<Vec<OutboxRow>> {
        if rows.is_empty() {
            return Ok(rows);
        }
        // On its blocking thread, the synchronous connection prepares
        // statements of fixed shape once and never builds their SQL again
        // (the async wrapper would render them for every call), and batches
        // multi-row inserts: the keys' numbers and the rows in one visit.
        conn.spawn_blocking(move |c| {
            use diesel::RunQueryDsl;
            number_keys(c, &mut rows)?;
            let insert = diesel::insert_into(tickbox_outbox::table);
            match rows.as_slice() {
                [row] => InsertOutboxRow(row).execute(c)?,
                rows => insert.values(rows).execute(c)?,
            };
            Ok(rows)
        })
        .await
    }

    async fn number_keys(
        conn: &mut Self::Conn,
        mut rows: Vec<OutboxRow>,
    ) -> QueryResult<Vec<OutboxRow>> {
        conn.spawn_blocking(move |c| {
            number_keys(c, &mut rows)?;
            Ok(rows)
        })
        .await
    }

    async fn claim_owed(conn: &mut Self::Conn, claim: &Claim) -> QueryResult<Vec<ClaimedRow>> {
        let statement = claim.statement(
            claim_owed_text!("", among, "", claimed_columns),
            claim_owed_text!("AND o.id > ? ", among, "", claimed_columns),
            Self::id_set(&claim.served),
        );
        Self::load(conn, statement).await
    }
}

/// [`OutboxStatements::number_keys`] on the connection's blocking thread.
fn number_keys(c: &mut diesel::SqliteConnection, rows: &mut [OutboxRow]) -> QueryResult<()> {
    use diesel::{OptionalExtension, RunQueryDsl};
    for i in numbering_order(rows) {
        let row = &rows[i];
        let (topic, key, at) = (
            &row.topic,
            row.ordering_key.as_deref().unwrap_or_default(),
            row.created_at_us,
        );
        let numbered = match bump_sequence_statement!(topic, key, at)
            .get_result::<(i64, Option<i64>)>(c)
            .optional()?
        {
            Some(numbered) => numbered,
            None => {
                // One writer at a time: nobody started it meanwhile.
                first_sequence_statement!(topic, key, at).execute(c)?;
                (1, None)
            }
        };
        (rows[i].key_seq, rows[i].key_previous_at_us) = (Some(numbered.0), numbered.1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::schema::Id;
    use crate::store::schema::SubscriptionRow;
    use crate::store::sqlite::SqliteConnection;
    use crate::store::subscriptions::SubscriptionStatements;
    use diesel_async::AsyncConnection;
    use diesel_migrations::MigrationHarness;
    use uuid::Uuid;

    /// A migrated module database in `dir`.
    async fn database(dir: &tempfile::TempDir) -> SqliteConnection {
        let path = dir.path().join("module.db").to_string_lossy().into_owned();
        let mut migrating = <diesel::SqliteConnection as diesel::Connection>::establish(&path)
            .expect("the database opens");
        migrating
            .run_pending_migrations(crate::store::settings::MigrationSet(
                &super::super::MIGRATIONS,
            ))
            .expect("the migrations run");
        SqliteConnection::establish(&path)
            .await
            .expect("the database opens")
    }

    /// A pending message of topic `t`.
    fn message(id: Uuid) -> OutboxRow {
        OutboxRow {
            id: Id(id),
            topic: "t".into(),
            payload: "{}".into(),
            correlation_id: Id(id),
            causation_id: None,
            created_at_us: 1,
            claimed_by: None,
            claimed_until_us: None,
            ordering_key: None,
            key_seq: None,
            key_publisher: None,
            key_previous_at_us: None,
            #[cfg(feature = "opentelemetry")]
            trace_context: None,
            due_at_us: None,
        }
    }

    /// A live subscription `id` of handler `handler` to topic `t`.
    fn subscription(id: Uuid, handler: &str) -> SubscriptionRow {
        SubscriptionRow {
            id: Id(id),
            module: "m".into(),
            handler: handler.into(),
            topic: "t".into(),
            subscribed_at_us: 1,
            seen_at_us: 1,
            alive_until_us: i64::MAX,
        }
    }

    #[tokio::test]
    async fn finishing_leaves_what_a_subscription_served_elsewhere_owes_and_updates_or_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = database(&dir).await;
        let (here, elsewhere, bus) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        Sqlite::record_subscriptions(
            &mut conn,
            vec![
                subscription(here, "here"),
                subscription(elsewhere, "elsewhere"),
            ],
        )
        .await
        .unwrap();
        let (done, owed, gone) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
        Sqlite::insert_outbox(&mut conn, vec![message(done), message(owed), message(gone)])
            .await
            .unwrap();
        // The subscription served elsewhere handed `done` and `gone` over.
        Sqlite::hand_over(&mut conn, &[done, gone], &[elsewhere], bus)
            .await
            .unwrap();

        let changed = Sqlite::finish_delivered(&mut conn, &[done, owed], &[here], 7, false)
            .await
            .unwrap();
        assert_eq!(changed, 1, "only the message nobody else owes is marked");
        let pending = Sqlite::still_pending(&mut conn, &[done, owed, gone])
            .await
            .unwrap();
        assert_eq!(pending, vec![owed, gone]);

        let deleted = Sqlite::finish_delivered(&mut conn, &[gone], &[here], 7, true)
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        assert_eq!(
            Sqlite::outbox_backlog(&mut conn, crate::message::now_us())
                .await
                .unwrap()
                .pending,
            1
        );
        // Serving every subscription, nothing is owed elsewhere.
        let changed = Sqlite::finish_delivered(&mut conn, &[owed], &[here, elsewhere], 8, false)
            .await
            .unwrap();
        assert_eq!(changed, 1);
        assert_eq!(
            Sqlite::forget_done(&mut conn, &[done, gone]).await.unwrap(),
            2
        );
    }
}
