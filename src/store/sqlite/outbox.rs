//! The outbox's statements on SQLite: lists of ids spelled as in
//! [`ids`](super::ids), no row locks (SQLite's writers take turns), and the
//! publishing insert on the connection's blocking thread.

use super::ids::{among, hex_set, id_rows, json_array};
use super::Sqlite;
use crate::store::contract::Store;
use crate::store::outbox::{
    bump_sequence_statement, claim_owed_text, finish_delivered_text, first_sequence_statement,
    forget_done_text, numbering_order, record_done_text, release_text, renew_claims_text,
    still_pending_text, Claim, OutboxStatements,
};
use crate::store::schema::{tickbox_outbox, ClaimedRow, DbUuid, Id, OutboxRow};
use crate::store::sql::sql;
use diesel::QueryResult;
use uuid::Uuid;

/// The `RETURNING` list of a claim, read as a [`ClaimedRow`]: text columns
/// as raw bytes and a creation time that is NULL unless it is an integer
/// (SQLite stores any type in any column), so that one malformed row is
/// decoded (and dead-lettered) on its own.
macro_rules! claimed_columns {
    () => {
        "id, CAST(topic AS BLOB) AS topic, CAST(payload AS BLOB) AS payload, \
         correlation_id, causation_id, \
         CASE WHEN typeof(created_at_us) = 'integer' THEN created_at_us END AS created_at_us, \
         ordering_key, key_seq, key_publisher, key_previous_at_us"
    };
}

/// A message id a statement returns.
#[derive(diesel::QueryableByName)]
struct IdRow {
    /// The id.
    #[diesel(sql_type = DbUuid)]
    id: Id,
}

impl OutboxStatements for Sqlite {
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
            use diesel::{OptionalExtension, RunQueryDsl};
            for i in numbering_order(&rows) {
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
            let insert = diesel::insert_into(tickbox_outbox::table);
            match rows.as_slice() {
                [row] => insert.values(row).execute(c)?,
                rows => insert.values(rows).execute(c)?,
            };
            Ok(rows)
        })
        .await
    }

    async fn claim_owed(conn: &mut Self::Conn, claim: &Claim) -> QueryResult<Vec<ClaimedRow>> {
        let statement = claim.statement(
            claim_owed_text!("", among, "", claimed_columns),
            claim_owed_text!("AND o.id > ? ", among, "", claimed_columns),
            hex_set(&claim.served),
        );
        Self::load(conn, statement).await
    }

    async fn renew_claims(
        conn: &mut Self::Conn,
        ids: &[Uuid],
        bus: Uuid,
        now_us: i64,
        until_us: i64,
    ) -> QueryResult<usize> {
        let statement = sql!(
            renew_claims_text!(id_rows),
            bus,
            until_us,
            json_array(ids),
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
        let statement = if delete {
            sql!(
                finish_delivered_text!(delete, id_rows, among),
                json_array(ids),
                hex_set(served)
            )
        } else {
            sql!(
                finish_delivered_text!(update, id_rows, among),
                now_us,
                json_array(ids),
                hex_set(served)
            )
        };
        Self::execute(conn, statement).await
    }

    async fn still_pending(conn: &mut Self::Conn, ids: &[Uuid]) -> QueryResult<Vec<Uuid>> {
        let statement = sql!(still_pending_text!(id_rows), json_array(ids));
        let rows: Vec<IdRow> = Self::load(conn, statement).await?;
        Ok(rows.into_iter().map(|row| row.id.0).collect())
    }

    async fn hand_over(
        conn: &mut Self::Conn,
        ids: &[Uuid],
        served: &[Uuid],
        bus: Uuid,
    ) -> QueryResult<()> {
        let done = sql!(
            record_done_text!(id_rows, among),
            json_array(ids),
            hex_set(served)
        );
        Self::execute(conn, done).await?;
        let release = sql!(release_text!(id_rows), json_array(ids), bus);
        Self::execute(conn, release).await.map(drop)
    }

    async fn forget_done(conn: &mut Self::Conn, ids: &[Uuid]) -> QueryResult<usize> {
        Self::execute(conn, sql!(forget_done_text!(id_rows), json_array(ids))).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::schema::SubscriptionRow;
    use crate::store::sqlite::SqliteConnection;
    use crate::store::subscriptions::SubscriptionStatements;
    use diesel_async::AsyncConnection;
    use diesel_migrations::MigrationHarness;

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
        assert_eq!(Sqlite::outbox_backlog(&mut conn).await.unwrap().0, 1);
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
