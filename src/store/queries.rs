//! The queries that read the same on every backend, written once: each is a
//! [`Statement`] with the dialect's placeholders, run by the backend's
//! [`Store::load`] or [`Store::execute`]. Only what truly differs (opening a
//! pool, migrations, how a transaction begins, notifications, the fast inbox
//! and outbox inserts) is written per backend, in `sqlite.rs` and
//! `postgres.rs`.

use crate::store::contract::Store;
use crate::store::schema::{Count, Id, OutboxRow, SubscriptionRow};
use crate::store::statement::{Dialect, Statement, StatementBuilder};
use diesel::sql_types::{BigInt, Nullable};
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// The columns of a subscription row, in [`SubscriptionRow`]'s order.
const SUBSCRIPTION_COLUMNS: &str =
    "id, module, handler, topic, subscribed_at_us, seen_at_us, alive_until_us";

/// When a message was published.
#[derive(diesel::QueryableByName)]
struct Published {
    /// Microseconds since the Unix epoch.
    #[diesel(sql_type = Nullable<BigInt>)]
    created_at_us: Option<i64>,
}

/// A statement without binds.
pub(crate) fn plain(dialect: Dialect, sql: &str) -> Statement {
    StatementBuilder::new(dialect).finish(sql.to_string())
}

/// Binds an optional id: its placeholder, or `NULL`.
fn optional_id(b: &mut StatementBuilder, id: Option<Id>) -> String {
    id.map_or_else(|| "NULL".to_string(), |id| b.id(id.0))
}

/// Binds an optional text: its placeholder, or `NULL`.
pub(crate) fn optional_text(b: &mut StatementBuilder, text: Option<&str>) -> String {
    text.map_or_else(|| "NULL".to_string(), |text| b.text(text))
}

/// Binds an optional integer: its placeholder, or `NULL`.
fn optional_int(b: &mut StatementBuilder, value: Option<i64>) -> String {
    value.map_or_else(|| "NULL".to_string(), |value| b.int(value))
}

/// The queries every backend runs alike, for every [`Store`].
pub trait Queries: Store {
    /// Records subscriptions, or updates the ones recorded (topic, when
    /// seen), keeping when each was first recorded.
    fn record_subscriptions(
        conn: &mut Self::Conn,
        rows: Vec<SubscriptionRow>,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            // One statement per row: a bus has few handlers.
            for row in rows {
                let mut b = StatementBuilder::new(Self::DIALECT);
                let values = [
                    b.id(row.id.0),
                    b.text(&row.module),
                    b.text(&row.handler),
                    b.text(&row.topic),
                    b.int(row.subscribed_at_us),
                    b.int(row.seen_at_us),
                    b.int(row.alive_until_us),
                ]
                .join(", ");
                let sql = format!(
                    "INSERT INTO tickbox_subscriptions ({SUBSCRIPTION_COLUMNS}) VALUES ({values}) \
                     ON CONFLICT (id) DO UPDATE SET module = excluded.module, \
                     handler = excluded.handler, topic = excluded.topic, \
                     seen_at_us = excluded.seen_at_us, alive_until_us = excluded.alive_until_us"
                );
                Self::execute_statement(conn, b.finish(sql)).await?;
            }
            Ok(())
        }
    }

    /// Every subscription recorded in this outbox's database.
    fn subscriptions(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Vec<SubscriptionRow>>> + Send {
        let sql = format!(
            "SELECT {SUBSCRIPTION_COLUMNS} FROM tickbox_subscriptions ORDER BY module, handler"
        );
        Self::load_statement(conn, plain(Self::DIALECT, &sql))
    }

    /// Extends (or takes) the claim of `bus` on these undelivered rows unless
    /// another bus holds a live claim on them.
    fn renew_claims(
        conn: &mut Self::Conn,
        ids: Vec<Uuid>,
        bus: Uuid,
        now_us: i64,
        until_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let (bus, now, until) = (b.id(bus), b.int(now_us), b.int(until_us));
        let listed = b.in_ids("id", &ids);
        let sql = format!(
            "UPDATE tickbox_outbox SET claimed_by = {bus}, claimed_until_us = {until} \
             WHERE {listed} AND delivered_at_us IS NULL \
             AND (claimed_by = {bus} OR claimed_until_us IS NULL OR claimed_until_us < {now})"
        );
        Self::execute_statement(conn, b.finish(sql))
    }

    /// Gives up every claim of `bus` on undelivered rows (on a graceful
    /// stop).
    fn release_claims(
        conn: &mut Self::Conn,
        bus: Uuid,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let bus = b.id(bus);
        let sql = format!(
            "UPDATE tickbox_outbox SET claimed_by = NULL, claimed_until_us = NULL \
             WHERE delivered_at_us IS NULL AND claimed_by = {bus}"
        );
        Self::execute_statement(conn, b.finish(sql))
    }

    /// Writes a message into the outbox as pending and unclaimed, or puts
    /// the row already there back to that state; every subscription then
    /// receives it again (the inbox skips it where it was handled).
    fn requeue_or_insert(
        conn: &mut Self::Conn,
        row: OutboxRow,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let id = b.id(row.id.0);
        let values = [
            id.clone(),
            b.text(&row.topic),
            b.text(&row.payload),
            b.id(row.correlation_id.0),
            optional_id(&mut b, row.causation_id),
            b.int(row.created_at_us),
            optional_text(&mut b, row.ordering_key.as_deref()),
            optional_int(&mut b, row.key_seq),
            optional_text(&mut b, row.key_publisher.as_deref()),
            optional_int(&mut b, row.key_previous_at_us),
        ]
        .join(", ");
        let insert = b.finish(format!(
            "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, \
             created_at_us, ordering_key, key_seq, key_publisher, key_previous_at_us) \
             VALUES ({values}) \
             ON CONFLICT (id) DO UPDATE SET delivered_at_us = NULL, claimed_by = NULL, \
             claimed_until_us = NULL"
        ));
        let mut b = StatementBuilder::new(Self::DIALECT);
        let id = b.id(row.id.0);
        let forget = b.finish(format!(
            "DELETE FROM tickbox_outbox_done WHERE message_id = {id}"
        ));
        async move {
            Self::execute_statement(conn, insert).await?;
            Self::execute_statement(conn, forget).await.map(drop)
        }
    }

    /// Marks outbox rows delivered.
    fn mark_delivered(
        conn: &mut Self::Conn,
        ids: Vec<Uuid>,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let now = b.int(now_us);
        let listed = b.in_ids("id", &ids);
        let sql = format!(
            "UPDATE tickbox_outbox SET delivered_at_us = {now}, claimed_until_us = NULL \
             WHERE {listed}"
        );
        Self::execute_statement(conn, b.finish(sql))
    }

    /// The number of undelivered outbox rows and the creation time of the
    /// oldest.
    fn outbox_backlog(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<(i64, Option<i64>)>> + Send {
        async move {
            // The count reads only the partial index of pending ids; the
            // oldest message is the first of them (ids are UUIDv7s, ordered
            // by time): one more row, not a scan of all pending rows.
            let sql = "SELECT count(*) AS n FROM tickbox_outbox WHERE delivered_at_us IS NULL";
            let pending = count::<Self>(conn, plain(Self::DIALECT, sql)).await?;
            let sql = "SELECT created_at_us FROM tickbox_outbox \
                       WHERE delivered_at_us IS NULL ORDER BY id LIMIT 1";
            let oldest: Vec<Published> =
                Self::load_statement(conn, plain(Self::DIALECT, sql)).await?;
            Ok((
                pending,
                oldest.into_iter().next().and_then(|p| p.created_at_us),
            ))
        }
    }
}

impl<S: Store> Queries for S {}

/// Runs a statement selecting one count (`n`).
pub(crate) async fn count<S: Store>(conn: &mut S::Conn, statement: Statement) -> QueryResult<i64> {
    Ok(Count::of(S::load_statement(conn, statement).await?))
}
