//! The outbox's statements: what publishing writes, and what a bus does to
//! deliver a shared outbox — claim the rows its subscriptions are owed,
//! finish them, or hand them over to the subscriptions other processes
//! serve (see [`crate::outbox::subscription`]).
//!
//! What reads the same in standard SQL on every backend is stated once, as
//! the default of an [`OutboxStatements`] method. Statements that take a
//! list of ids are stated once too, here, as text macros (`*_text!`) that
//! take the backend's spelling of a list bound as one value (`$rows!()`, a
//! subquery of the ids; `$among!(column)`, a test repeated row by row); each
//! backend runs them with its spelling, in `store/<backend>/outbox.rs`.

use crate::store::contract::Store;
use crate::store::ids::IdLists;
use crate::store::schema::{if_traced, ClaimedRow, DbUuid, Id, Lenient, OutboxRow};
use crate::store::sql::{sql, Bind, Sql};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// The insert of one outbox row, the hottest statement a publish runs:
/// fixed text, and a type of its own. diesel finds it prepared on the
/// connection by that type, where the derived insert of an [`OutboxRow`]
/// had its SQL rendered, hashed and its twelve columns walked through a
/// generic tree three times for every message.
pub(crate) struct InsertOutboxRow<'a>(pub(crate) &'a OutboxRow);

impl diesel::query_builder::QueryId for InsertOutboxRow<'_> {
    type QueryId = InsertOutboxRow<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB> diesel::query_builder::QueryFragment<DB> for InsertOutboxRow<'_>
where
    DB: diesel::backend::Backend
        + diesel::sql_types::HasSqlType<DbUuid>
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<BigInt>,
    Id: diesel::serialize::ToSql<DbUuid, DB>,
    String: diesel::serialize::ToSql<Text, DB>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        let row = self.0;
        out.push_sql(concat!(
            "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, \
             created_at_us, claimed_by, claimed_until_us, ordering_key, key_seq, \
             key_publisher, key_previous_at_us, due_at_us",
            if_traced!(", trace_context"),
            ") VALUES ("
        ));
        out.push_bind_param::<DbUuid, _>(&row.id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&row.topic)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(&row.payload)?;
        out.push_sql(", ");
        out.push_bind_param::<DbUuid, _>(&row.correlation_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<DbUuid>, _>(&row.causation_id)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&row.created_at_us)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<DbUuid>, _>(&row.claimed_by)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<BigInt>, _>(&row.claimed_until_us)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<Text>, _>(&row.ordering_key)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<BigInt>, _>(&row.key_seq)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<Text>, _>(&row.key_publisher)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<BigInt>, _>(&row.key_previous_at_us)?;
        out.push_sql(", ");
        out.push_bind_param::<Nullable<BigInt>, _>(&row.due_at_us)?;
        #[cfg(feature = "opentelemetry")]
        {
            out.push_sql(", ");
            out.push_bind_param::<Nullable<Text>, _>(&row.trace_context)?;
        }
        out.push_sql(")");
        Ok(())
    }

    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}

impl<Conn> diesel::RunQueryDsl<Conn> for InsertOutboxRow<'_> {}
impl<Conn> diesel_async::RunQueryDsl<Conn> for InsertOutboxRow<'_> {}

/// What a bus asks for when it claims outbox rows.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The claiming bus instance.
    pub(crate) bus: Uuid,
    /// The time of the claim (µs since the Unix epoch): claims that ran out
    /// before it are taken over.
    pub(crate) now_us: i64,
    /// The claim holds until then unless renewed.
    pub(crate) until_us: i64,
    /// A claim said to hold beyond this was not taken by a live bus (buses
    /// claim one lease at a time): it is taken like an expired one, so a
    /// corrupted claim cannot hide a row for ever.
    pub(crate) beyond_us: i64,
    /// Only rows with ids above this are read (a scan's cursor); `None`
    /// from the first row on.
    pub(crate) after: Option<Uuid>,
    /// Only rows with ids up to this are read: [`crate::message::due_by`]
    /// `due_now_us` for a scan (ids carry due times, so the rows scheduled
    /// for later are not even read), or the last of the stray rows a bus
    /// takes beyond it (see [`OutboxStatements::look_ahead`]).
    pub(crate) upto: Uuid,
    /// Scheduled rows due by then are claimed: the outbox's clock for due
    /// times, which is `now_us` unless a test session moved it ahead.
    pub(crate) due_now_us: i64,
    /// The most rows one claim takes.
    pub(crate) limit: i64,
    /// The subscriptions the claiming bus serves: it claims only rows one of
    /// them still owes (or rows of a topic nobody subscribes to).
    pub(crate) served: std::sync::Arc<[Uuid]>,
}

impl Claim {
    /// The claim as a statement: `first_page` (a [`claim_owed_text!`]
    /// without a cursor) or `next_page` (with one), whichever
    /// [`Claim::after`] calls for, with its values in order; `served` is
    /// [`Claim::served`] as the backend binds a list tested row by row.
    #[allow(dead_code)] // a build with only backends that select and mark
    pub(crate) fn statement(
        &self,
        first_page: &'static str,
        next_page: &'static str,
        served: String,
    ) -> Sql {
        let selection = self.selection(first_page, next_page, served);
        let mut binds: Vec<Bind> = vec![self.bus.into(), self.until_us.into()];
        binds.extend(selection.binds);
        Sql {
            text: selection.text,
            binds,
        }
    }

    /// The claimable rows as a statement of their own (a
    /// [`claimable_text!`] without a cursor, or with one), for a backend
    /// that selects them and then marks them claimed; `served` as for
    /// [`Claim::statement`].
    pub(crate) fn selection(
        &self,
        first_page: &'static str,
        next_page: &'static str,
        served: String,
    ) -> Sql {
        let mut binds: Vec<Bind> = Vec::new();
        let text = match self.after {
            Some(after) => {
                binds.push(after.into());
                next_page
            }
            None => first_page,
        };
        binds.extend([
            self.upto.into(),
            self.due_now_us.into(),
            self.now_us.into(),
            self.beyond_us.into(),
            self.bus.into(),
            served.into(),
            self.bus.into(),
            self.now_us.into(),
            self.beyond_us.into(),
            self.limit.into(),
        ]);
        Sql { text, binds }
    }
}

/// Which pending messages [`OutboxStatements::finish_completed`] looks at.
#[derive(Debug, Clone, Copy)]
pub enum Owed<'a> {
    /// Those some subscription is done with (when the last two buses
    /// recorded their parts at the same moment, neither saw the other's).
    PartlyDone,
    /// Those of a topic that just lost a subscription (retired): the rest
    /// of its subscriptions may be done with them, or none be left.
    Topic(&'a str),
}

/// How many pending messages another bus holds a live claim on, and until
/// when the last of those claims runs.
#[derive(diesel::QueryableByName)]
pub struct ClaimedElsewhere {
    /// The number of such messages.
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
    /// When the last of their claims runs out; `None` when there are none.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) until_us: Option<i64>,
}

/// The oldest stalled message, as the outbox holds it.
#[derive(diesel::QueryableByName)]
pub struct StalledRow {
    /// The message's id.
    #[diesel(sql_type = DbUuid)]
    pub(crate) id: Id,
    /// The bus that claimed it, if any (read leniently: a corrupted claim
    /// must not hide the report).
    #[diesel(sql_type = Nullable<DbUuid>)]
    pub(crate) claimed_by: Lenient<Option<Id>>,
    /// Until when that claim holds.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) claimed_until_us: Lenient<Option<i64>>,
}

/// A message a statement finished.
#[derive(diesel::QueryableByName)]
struct Finished {
    /// Its id.
    #[diesel(sql_type = DbUuid)]
    #[allow(dead_code)] // counted only
    id: Id,
}

/// A message id a statement returns.
#[derive(diesel::QueryableByName)]
struct IdRow {
    /// The id.
    #[diesel(sql_type = DbUuid)]
    id: Id,
}

/// The columns of a [`ScheduledRow`].
macro_rules! scheduled_columns {
    () => {
        "id, topic, payload, correlation_id, causation_id, created_at_us, due_at_us, \
         ordering_key, claimed_by"
    };
}

/// A scheduled message as the outbox holds it.
#[derive(Debug, diesel::QueryableByName)]
pub struct ScheduledRow {
    #[diesel(sql_type = DbUuid)]
    pub(crate) id: Id,
    #[diesel(sql_type = Text)]
    pub(crate) topic: String,
    #[diesel(sql_type = Text)]
    pub(crate) payload: String,
    #[diesel(sql_type = DbUuid)]
    pub(crate) correlation_id: Id,
    #[diesel(sql_type = Nullable<DbUuid>)]
    pub(crate) causation_id: Option<Id>,
    #[diesel(sql_type = BigInt)]
    pub(crate) created_at_us: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) due_at_us: i64,
    #[diesel(sql_type = Nullable<Text>)]
    pub(crate) ordering_key: Option<String>,
    /// Set once a bus took it, due.
    #[diesel(sql_type = Nullable<DbUuid>)]
    pub(crate) claimed_by: Option<Id>,
}

/// A pending message ahead of now, and when it is due.
#[derive(diesel::QueryableByName)]
struct Ahead {
    /// Its id.
    #[diesel(sql_type = DbUuid)]
    id: Id,
    /// When it is due; NULL (or, on SQLite, not an integer) for a message
    /// that is not scheduled.
    #[diesel(sql_type = Nullable<BigInt>)]
    due_at_us: Lenient<Option<i64>>,
}

/// A count.
#[derive(diesel::QueryableByName)]
struct Counted {
    /// The number counted.
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// When a message was published, and when it was due.
#[derive(diesel::QueryableByName)]
struct Published {
    /// Microseconds since the Unix epoch.
    #[diesel(sql_type = Nullable<BigInt>)]
    created_at_us: Option<i64>,
    /// Microseconds since the Unix epoch; NULL unless it was scheduled.
    #[diesel(sql_type = Nullable<BigInt>)]
    due_at_us: Option<i64>,
}

/// The outbox's pending messages, as [`OutboxStatements::outbox_backlog`]
/// reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Backlog {
    /// Messages due and not yet finished.
    pub(crate) pending: i64,
    /// When the oldest of them became deliverable (µs since the Unix
    /// epoch): when it was published, or when it was due if that is later.
    pub(crate) oldest_us: Option<i64>,
    /// Scheduled messages not yet due.
    pub(crate) scheduled: i64,
}

/// The texts of the outbox statements that take lists of ids, in one
/// backend's spelling of such a list (see [`crate::store::ids`]): made by
/// [`outbox_texts!`] from the `*_text!` macros below.
#[derive(Debug, Clone, Copy)]
pub struct OutboxTexts {
    /// [`OutboxStatements::renew_claims`]'s.
    pub(crate) renew_claims: &'static str,
    /// [`OutboxStatements::finish_delivered`]'s, marking rows delivered.
    pub(crate) finish_update: &'static str,
    /// [`OutboxStatements::finish_delivered`]'s, deleting rows.
    pub(crate) finish_delete: &'static str,
    /// [`OutboxStatements::still_pending`]'s.
    pub(crate) still_pending: &'static str,
    /// [`OutboxStatements::hand_over`]'s first: the served subscriptions are
    /// done with the messages (a record already there stays).
    pub(crate) record_done: &'static str,
    /// [`OutboxStatements::hand_over`]'s second: the bus gives up its
    /// claims.
    pub(crate) release: &'static str,
    /// [`OutboxStatements::forget_done`]'s.
    pub(crate) forget_done: &'static str,
}

/// A backend's [`OutboxTexts`] from its list macros (`$rows`: its
/// `id_rows!`, `$among`: its `among!`), with [`record_done_text!`]'s
/// `ON CONFLICT DO NOTHING`, or with its own `record_done` text.
macro_rules! outbox_texts {
    ($rows:ident, $among:ident) => {
        $crate::store::outbox::outbox_texts!(
            $rows,
            $among,
            record_done: $crate::store::outbox::record_done_text!($rows, $among)
        )
    };
    ($rows:ident, $among:ident, record_done: $record_done:expr) => {
        $crate::store::outbox::OutboxTexts {
            renew_claims: $crate::store::outbox::renew_claims_text!($rows),
            finish_update: $crate::store::outbox::finish_delivered_text!(update, $rows, $among),
            finish_delete: $crate::store::outbox::finish_delivered_text!(delete, $rows, $among),
            still_pending: $crate::store::outbox::still_pending_text!($rows),
            record_done: $record_done,
            release: $crate::store::outbox::release_text!($rows),
            forget_done: $crate::store::outbox::forget_done_text!($rows),
        }
    };
}
pub(crate) use outbox_texts;

/// The outbox's statements, implemented by each backend in
/// `store/<backend>/outbox.rs`.
pub trait OutboxStatements: Store + IdLists {
    /// The statements below that take lists of ids, in this backend's
    /// spelling.
    const TEXTS: OutboxTexts;

    /// Inside the publishing transaction: inserts the published messages
    /// into the outbox, numbering each keyed one first, in
    /// [`numbering_order`] (its key's counter moves to the next number and
    /// stays locked until the transaction ends; a new key's counter
    /// starts at 1). Returns the rows with their numbers and the
    /// publication time of each key's previous message.
    fn insert_outbox(
        conn: &mut Self::Conn,
        rows: Vec<OutboxRow>,
    ) -> impl Future<Output = QueryResult<Vec<OutboxRow>>> + Send;

    /// Inside a transaction: numbers the keyed rows among `rows` that
    /// carry a number to replace (`key_seq` set), in [`numbering_order`],
    /// at their `created_at_us`, as [`OutboxStatements::insert_outbox`]
    /// does. Writes no outbox row.
    fn number_keys(
        conn: &mut Self::Conn,
        rows: Vec<OutboxRow>,
    ) -> impl Future<Output = QueryResult<Vec<OutboxRow>>> + Send;

    /// Inside a transaction: gives scheduled keyed messages that just
    /// became due their place in their keys ([`Tx::publish_keyed_at`]),
    /// numbered at `created_at_us` (when they are taken). `rows` hold the
    /// id, topic, key and publisher. Fails, and the transaction must roll
    /// back, if one of them was numbered meanwhile (by another bus whose
    /// claim overlapped): a number is never given twice, nor skipped.
    ///
    /// [`Tx::publish_keyed_at`]: crate::Tx::publish_keyed_at
    fn number_due(
        conn: &mut Self::Conn,
        rows: Vec<OutboxRow>,
    ) -> impl Future<Output = QueryResult<Vec<OutboxRow>>> + Send {
        async move {
            let rows: Vec<OutboxRow> = rows
                .into_iter()
                .map(|row| OutboxRow {
                    key_seq: Some(0),
                    ..row
                })
                .collect();
            let rows = Self::number_keys(conn, rows).await?;
            for row in &rows {
                let statement = sql!(
                    "UPDATE tickbox_outbox SET key_seq = ?, key_previous_at_us = ? \
                     WHERE id = ? AND key_seq IS NULL",
                    row.key_seq,
                    row.key_previous_at_us,
                    row.id
                );
                if Self::execute(conn, statement).await? != 1 {
                    return Err(diesel::result::Error::QueryBuilderError(
                        format!(
                            "scheduled message {} was numbered in its key by another bus",
                            row.id.0
                        )
                        .into(),
                    ));
                }
            }
            Ok(rows)
        }
    }

    /// A scan's page: claims, for `claim.bus`, up to `claim.limit` pending
    /// rows past the cursor, in id order, that are unclaimed, claimed by it,
    /// or whose claim expired (or is said to hold implausibly long), and
    /// that it has work for: a subscription it serves is not done with
    /// them, or their topic has no subscription at all (it then finds the
    /// topic unknown, or without subscribers, itself). A keyed row waits
    /// while an earlier row of its key is under another bus's live claim,
    /// so two processes do not deliver one key's messages at once.
    /// Concurrent claims skip each other's rows instead of waiting
    /// (PostgreSQL's `FOR UPDATE SKIP LOCKED`; SQLite's writers take
    /// turns). Returns the claimed rows, every column read leniently (text
    /// as raw bytes, a creation time that is NULL unless it is an integer),
    /// so that one malformed row is decoded, and dead-lettered, on its own.
    fn claim_owed(
        conn: &mut Self::Conn,
        claim: &Claim,
    ) -> impl Future<Output = QueryResult<Vec<ClaimedRow>>> + Send;

    /// While deliveries run: extends (or takes) the claim of `bus` on these
    /// pending rows until `until_us`, unless another bus holds a live claim
    /// on them at `now_us`. Returns how many rows it renewed.
    fn renew_claims(
        conn: &mut Self::Conn,
        ids: &[Uuid],
        bus: Uuid,
        now_us: i64,
        until_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let statement = sql!(
            Self::TEXTS.renew_claims,
            bus,
            until_us,
            Self::id_rows(ids),
            bus,
            now_us
        );
        Self::execute(conn, statement)
    }

    /// When a bus stops gracefully: gives up every claim of `bus` on
    /// pending rows, so that the next bus takes them at once. Returns how
    /// many it released.
    fn release_claims(
        conn: &mut Self::Conn,
        bus: Uuid,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                "UPDATE tickbox_outbox SET claimed_by = NULL, claimed_until_us = NULL \
                 WHERE delivered_at_us IS NULL AND claimed_by = ?",
                bus
            ),
        )
    }

    /// When every subscriber on a bus is done with `ids`: finishes those
    /// that no subscription outside `served` still owes — marks them
    /// delivered at `now_us`, or deletes them (`delete`: an outbox
    /// retention of zero). The test is part of the statement, so a
    /// subscription another process recorded a moment earlier is never
    /// missed. Returns how many rows it changed, and no rows (SQLite would
    /// gather `RETURNING` rows in a temporary table on every call): when it
    /// changed fewer than `ids`, [`OutboxStatements::still_pending`] tells
    /// which are left.
    fn finish_delivered(
        conn: &mut Self::Conn,
        ids: &[Uuid],
        served: &[Uuid],
        now_us: i64,
        delete: bool,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let (ids, served) = (Self::id_rows(ids), Self::id_set(served));
        let statement = if delete {
            sql!(Self::TEXTS.finish_delete, ids, served.clone(), served)
        } else {
            sql!(
                Self::TEXTS.finish_update,
                now_us,
                ids,
                served.clone(),
                served
            )
        };
        Self::execute(conn, statement)
    }

    /// Which of `ids` are still pending (after
    /// [`OutboxStatements::finish_delivered`]: those owed elsewhere).
    fn still_pending(
        conn: &mut Self::Conn,
        ids: &[Uuid],
    ) -> impl Future<Output = QueryResult<Vec<Uuid>>> + Send {
        let statement = sql!(Self::TEXTS.still_pending, Self::id_rows(ids));
        async move {
            let rows: Vec<IdRow> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().map(|row| row.id.0).collect())
        }
    }

    /// Hands pending messages `ids` over to the subscriptions other
    /// processes serve: records that the subscriptions in `served` are done
    /// with them (those of them whose topic each subscribes to), and gives
    /// up the claims of `bus` on them; the bus serving the rest finishes
    /// them.
    fn hand_over(
        conn: &mut Self::Conn,
        ids: &[Uuid],
        served: &[Uuid],
        bus: Uuid,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let listed = Self::id_rows(ids);
        let done = sql!(
            Self::TEXTS.record_done,
            listed.as_str(),
            Self::id_set(served)
        );
        let release = sql!(Self::TEXTS.release, listed, bus);
        async move {
            Self::execute(conn, done).await?;
            Self::execute(conn, release).await.map(drop)
        }
    }

    /// Deletes what subscriptions recorded done with messages `ids`, just
    /// finished.
    fn forget_done(
        conn: &mut Self::Conn,
        ids: &[Uuid],
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(conn, sql!(Self::TEXTS.forget_done, Self::id_rows(ids)))
    }

    /// Deletes what subscriptions recorded done with messages no longer
    /// pending (finished since, or swept). Returns how many records it
    /// deleted.
    fn clear_done(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            Sql::plain(
                "DELETE FROM tickbox_outbox_done WHERE NOT EXISTS \
                 (SELECT 1 FROM tickbox_outbox o \
                  WHERE o.id = tickbox_outbox_done.message_id AND o.delivered_at_us IS NULL)",
            ),
        )
    }

    /// Finishes every pending message among `among` that no subscription
    /// still owes (each subscription of its topic recorded done with it, or
    /// none left): marks it delivered at `now_us`, or deletes it
    /// (`delete`). Returns how many it finished.
    fn finish_completed(
        conn: &mut Self::Conn,
        among: Owed<'_>,
        now_us: i64,
        delete: bool,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        /// The part that says nobody owes the message any more.
        macro_rules! owed_by_nobody {
            () => {
                "NOT EXISTS (SELECT 1 FROM tickbox_subscriptions s \
                 WHERE s.topic = tickbox_outbox.topic \
                 AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
                     WHERE d.message_id = tickbox_outbox.id AND d.subscription = s.id)) \
                 RETURNING id"
            };
        }
        /// The messages some subscription is done with.
        macro_rules! partly_done {
            () => {
                "id IN (SELECT message_id FROM tickbox_outbox_done) AND "
            };
        }
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
        async move { Ok(Self::load::<Finished>(conn, statement).await?.len()) }
    }

    /// Inside a transaction: deletes scheduled message `id` if it is not due
    /// at `now_us` (nor claimed: a scheduled row is claimed only once due,
    /// so a claim that got there first wins). Returns how many rows it
    /// deleted: 1, or 0 when there is no such message, it is not a
    /// scheduled one, or it is due. PostgreSQL and MariaDB check the row
    /// again once a claim that holds it commits.
    fn cancel_scheduled(
        conn: &mut Self::Conn,
        id: Uuid,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                "DELETE FROM tickbox_outbox WHERE id = ? AND delivered_at_us IS NULL \
                 AND due_at_us > ? AND claimed_by IS NULL",
                id,
                now_us
            ),
        )
    }

    /// The scheduled messages not yet due at `now_us`, soonest first:
    /// `limit` of them from `offset`. Read along the pending index from the
    /// last id due by now (ids carry due times).
    fn scheduled_messages(
        conn: &mut Self::Conn,
        now_us: i64,
        offset: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<ScheduledRow>>> + Send {
        Self::load(
            conn,
            sql!(
                concat!(
                    "SELECT ",
                    scheduled_columns!(),
                    " FROM tickbox_outbox WHERE delivered_at_us IS NULL AND id > ? \
                     AND due_at_us > ? ORDER BY id LIMIT ? OFFSET ?"
                ),
                crate::message::due_by(now_us),
                now_us,
                limit,
                offset
            ),
        )
    }

    /// Scheduled message `id`, due or not, while it is pending.
    fn scheduled_message(
        conn: &mut Self::Conn,
        id: Uuid,
    ) -> impl Future<Output = QueryResult<Option<ScheduledRow>>> + Send {
        let statement = sql!(
            concat!(
                "SELECT ",
                scheduled_columns!(),
                " FROM tickbox_outbox WHERE id = ? AND delivered_at_us IS NULL \
                 AND due_at_us IS NOT NULL"
            ),
            id
        );
        async move { Ok(Self::load(conn, statement).await?.into_iter().next()) }
    }

    /// The first `limit` pending messages above `after` in id order, with
    /// their due times: when `after` is [`crate::message::due_by`] now, the
    /// next scheduled ones (ids carry due times), and any stray row among
    /// them — one due now, or not scheduled at all, whose id lies ahead
    /// all the same (written by hand, or by a process whose clock runs
    /// ahead), which a scan bounded by now would not read. Read along the
    /// pending index from `after`: as many rows as asked for.
    fn look_ahead(
        conn: &mut Self::Conn,
        after: Uuid,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<(Uuid, Option<i64>)>>> + Send {
        let statement = sql!(
            "SELECT id, due_at_us FROM tickbox_outbox WHERE delivered_at_us IS NULL AND id > ? \
             ORDER BY id LIMIT ?",
            after,
            limit
        );
        async move {
            let rows: Vec<Ahead> = Self::load(conn, statement).await?;
            Ok(rows
                .into_iter()
                .map(|row| (row.id.0, row.due_at_us.0.ok().flatten()))
                .collect())
        }
    }

    /// Marks message `id` delivered at `now_us` (a malformed row, once it
    /// is recorded as a dead letter). Returns how many rows it changed.
    fn mark_delivered(
        conn: &mut Self::Conn,
        id: Uuid,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                "UPDATE tickbox_outbox SET delivered_at_us = ?, claimed_until_us = NULL \
                 WHERE id = ?",
                now_us,
                id
            ),
        )
    }

    /// At a bus's start: how many pending messages another bus than `bus`
    /// holds a live claim on at `now_us` (a process that just crashed left
    /// them), and until when the last of those claims runs.
    fn claimed_elsewhere(
        conn: &mut Self::Conn,
        bus: Uuid,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<ClaimedElsewhere>> + Send {
        let statement = sql!(
            "SELECT count(*) AS n, max(claimed_until_us) AS until_us FROM tickbox_outbox \
             WHERE delivered_at_us IS NULL AND claimed_until_us > ? AND claimed_by <> ?",
            now_us,
            bus
        );
        async move {
            let rows: Vec<ClaimedElsewhere> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().next().unwrap_or(ClaimedElsewhere {
                n: 0,
                until_us: None,
            }))
        }
    }

    /// For the gauges, at `now_us`: the pending outbox rows that are due
    /// and when the oldest of them became due, and the scheduled rows not
    /// yet due. The counts read only the partial index of pending ids, on
    /// either side of the last id due by now (ids carry due times); the
    /// oldest message is the first of them (ids are UUIDv7s, ordered by
    /// time): one more row, not a scan of all pending rows.
    fn outbox_backlog(
        conn: &mut Self::Conn,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<Backlog>> + Send {
        let due_by = crate::message::due_by(now_us);
        async move {
            let pending: Vec<Counted> = Self::load(
                conn,
                sql!(
                    "SELECT count(*) AS n FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id <= ?",
                    due_by
                ),
            )
            .await?;
            let oldest: Vec<Published> = Self::load(
                conn,
                sql!(
                    "SELECT created_at_us, due_at_us FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id <= ? ORDER BY id LIMIT 1",
                    due_by
                ),
            )
            .await?;
            let scheduled: Vec<Counted> = Self::load(
                conn,
                sql!(
                    "SELECT count(*) AS n FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id > ?",
                    due_by
                ),
            )
            .await?;
            Ok(Backlog {
                pending: pending.into_iter().next().map_or(0, |c| c.n),
                oldest_us: oldest
                    .into_iter()
                    .next()
                    .and_then(|p| p.created_at_us.map(|c| c.max(p.due_at_us.unwrap_or(c)))),
                scheduled: scheduled.into_iter().next().map_or(0, |c| c.n),
            })
        }
    }

    /// For the watchdog: how many pending messages have ids below
    /// `before` (published before the time it encodes: ids are UUIDv7s, so
    /// the pending index answers).
    fn count_stalled(
        conn: &mut Self::Conn,
        before: Uuid,
    ) -> impl Future<Output = QueryResult<i64>> + Send {
        let statement = sql!(
            "SELECT count(*) AS n FROM tickbox_outbox \
             WHERE delivered_at_us IS NULL AND id < ?",
            before
        );
        async move {
            let rows: Vec<Counted> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().next().map_or(0, |c| c.n))
        }
    }

    /// For the watchdog: the oldest pending message with an id below
    /// `before`, and its claim.
    fn oldest_stalled(
        conn: &mut Self::Conn,
        before: Uuid,
    ) -> impl Future<Output = QueryResult<Option<StalledRow>>> + Send {
        let statement = sql!(
            "SELECT id, claimed_by, claimed_until_us FROM tickbox_outbox \
             WHERE delivered_at_us IS NULL AND id < ? ORDER BY id LIMIT 1",
            before
        );
        async move { Ok(Self::load(conn, statement).await?.into_iter().next()) }
    }

    /// Writes a message into the outbox as pending and unclaimed, or puts
    /// the row already there back to that state, and forgets which
    /// subscriptions were done with it: every subscription then receives it
    /// again (the inbox skips it where it was handled). For a dead letter
    /// put back.
    fn requeue_or_insert(
        conn: &mut Self::Conn,
        row: OutboxRow,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let insert = sql!(
            concat!(
                "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, \
                 created_at_us, ordering_key, key_seq, key_publisher, key_previous_at_us",
                if_traced!(", trace_context"),
                ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?",
                if_traced!(", ?"),
                ") ON CONFLICT (id) DO UPDATE SET delivered_at_us = NULL, claimed_by = NULL, \
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
        async move {
            Self::execute(conn, insert).await?;
            Self::execute(conn, forget).await.map(drop)
        }
    }
}

/// The rows [`OutboxStatements::claim_owed`] takes, written once: a
/// `SELECT $columns` of the claimable pending rows, in id order, up to the
/// limit. `$after` is `""` for a scan's first page or `"AND o.id > ? "`
/// for the next ones, `$among` the backend's test of a list bound as one
/// value, `$lock` what the selection ends with (`FOR UPDATE SKIP LOCKED`
/// where concurrent claims must skip each other's rows). Values, in order:
/// the cursor (if `$after` has it), the last id to read and now (a
/// scheduled message is claimed once due: its id carries its due time, so
/// the pending index is read up to now and no further, see
/// [`crate::message::scheduled_id`]), now, the implausible horizon, the
/// bus, the served subscriptions, the bus, now, the horizon, the limit (see
/// [`Claim::selection`]).
macro_rules! claimable_text {
    ($columns:expr, $after:literal, $among:ident, $lock:literal) => {
        concat!(
            "SELECT ",
            $columns,
            " FROM tickbox_outbox o WHERE o.delivered_at_us IS NULL ",
            $after,
            "AND o.id <= ? AND (o.due_at_us IS NULL OR o.due_at_us <= ?) \
             AND (o.claimed_until_us IS NULL OR o.claimed_until_us < ? \
                  OR o.claimed_until_us > ? OR o.claimed_by = ?) \
             AND (NOT EXISTS (SELECT 1 FROM tickbox_subscriptions s WHERE s.topic = o.topic) \
                  OR EXISTS (SELECT 1 FROM tickbox_subscriptions s \
                      WHERE s.topic = o.topic AND ",
            $among!("s.id"),
            " AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
                          WHERE d.message_id = o.id AND d.subscription = s.id))) \
             AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM tickbox_outbox e \
                 WHERE e.delivered_at_us IS NULL AND e.topic = o.topic \
                 AND e.ordering_key = o.ordering_key AND e.key_seq < o.key_seq \
                 AND e.claimed_by <> ? AND e.claimed_until_us >= ? \
                 AND e.claimed_until_us <= ?)) \
             ORDER BY o.id LIMIT ? ",
            $lock
        )
    };
}
pub(crate) use claimable_text;

/// [`OutboxStatements::claim_owed`]'s statement where one `UPDATE` claims
/// the [`claimable_text!`] rows and returns them: `$columns!()` is the
/// `RETURNING` list read as a [`ClaimedRow`]. Values, in order: the bus,
/// the claim's end, then those of the selection (see [`Claim::statement`]).
#[allow(unused_macros)]
macro_rules! claim_owed_text {
    ($after:literal, $among:ident, $lock:literal, $columns:ident) => {
        concat!(
            "UPDATE tickbox_outbox SET claimed_by = ?, claimed_until_us = ? WHERE id IN (",
            $crate::store::outbox::claimable_text!("o.id", $after, $among, $lock),
            ") RETURNING ",
            $columns!()
        )
    };
}
// Stated for the backends that spell the statement this way; a build
// with only other backends leaves it unused.
#[allow(unused_imports)]
pub(crate) use claim_owed_text;

/// [`OutboxStatements::renew_claims`]'s statement. Values: the bus, the
/// claim's end, the ids, the bus, now.
macro_rules! renew_claims_text {
    ($rows:ident) => {
        concat!(
            "UPDATE tickbox_outbox SET claimed_by = ?, claimed_until_us = ? \
             WHERE id IN ",
            $rows!(),
            " AND delivered_at_us IS NULL \
             AND (claimed_by = ? OR claimed_until_us IS NULL OR claimed_until_us < ?)"
        )
    };
}
pub(crate) use renew_claims_text;

/// The test that a subscription outside the served ones (bound twice, each
/// as one value tested by `$among`) still owes the `tickbox_outbox` row: a
/// subscription of its topic not done with it.
///
/// The first, uncorrelated test (is there any subscription outside the
/// served ones at all?) is evaluated once per statement; where one process
/// serves every subscription, the usual case, it spares each row the
/// correlated one (measured on SQLite: about 4,000 instructions per row).
macro_rules! owed_elsewhere_text {
    ($among:ident) => {
        concat!(
            "(EXISTS (SELECT 1 FROM tickbox_subscriptions f WHERE NOT (",
            $among!("f.id"),
            ")) AND EXISTS (SELECT 1 FROM tickbox_subscriptions s \
             WHERE s.topic = tickbox_outbox.topic AND NOT (",
            $among!("s.id"),
            ") AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
                 WHERE d.message_id = tickbox_outbox.id AND d.subscription = s.id)))"
        )
    };
}
pub(crate) use owed_elsewhere_text;

/// [`OutboxStatements::finish_delivered`]'s statements: `update` (values:
/// now, the ids, the served subscriptions twice) or `delete` (the ids, the
/// served subscriptions twice).
macro_rules! finish_delivered_text {
    (update, $rows:ident, $among:ident) => {
        concat!(
            "UPDATE tickbox_outbox SET delivered_at_us = ?, claimed_until_us = NULL \
             WHERE id IN ",
            $rows!(),
            " AND NOT ",
            $crate::store::outbox::owed_elsewhere_text!($among)
        )
    };
    (delete, $rows:ident, $among:ident) => {
        concat!(
            "DELETE FROM tickbox_outbox WHERE id IN ",
            $rows!(),
            " AND NOT ",
            $crate::store::outbox::owed_elsewhere_text!($among)
        )
    };
}
pub(crate) use finish_delivered_text;

/// [`OutboxStatements::still_pending`]'s statement. Value: the ids.
macro_rules! still_pending_text {
    ($rows:ident) => {
        concat!(
            "SELECT id FROM tickbox_outbox WHERE id IN ",
            $rows!(),
            " AND delivered_at_us IS NULL"
        )
    };
}
pub(crate) use still_pending_text;

/// The first of [`OutboxStatements::hand_over`]'s statements: the served
/// subscriptions are done with the messages. Values: the ids, the served
/// subscriptions.
#[allow(unused_macros)]
macro_rules! record_done_text {
    ($rows:ident, $among:ident) => {
        concat!(
            "INSERT INTO tickbox_outbox_done (message_id, subscription) \
             SELECT o.id, s.id FROM tickbox_outbox o \
             JOIN tickbox_subscriptions s ON s.topic = o.topic \
             WHERE o.id IN ",
            $rows!(),
            " AND ",
            $among!("s.id"),
            " ON CONFLICT DO NOTHING"
        )
    };
}
// Stated for the backends that spell the statement this way; a build
// with only other backends leaves it unused.
#[allow(unused_imports)]
pub(crate) use record_done_text;

/// The second of [`OutboxStatements::hand_over`]'s statements: the bus
/// gives up its claims on those still pending. Values: the ids, the bus.
macro_rules! release_text {
    ($rows:ident) => {
        concat!(
            "UPDATE tickbox_outbox SET claimed_by = NULL, claimed_until_us = NULL \
             WHERE id IN ",
            $rows!(),
            " AND claimed_by = ? AND delivered_at_us IS NULL"
        )
    };
}
pub(crate) use release_text;

/// [`OutboxStatements::forget_done`]'s statement. Value: the ids.
macro_rules! forget_done_text {
    ($rows:ident) => {
        concat!(
            "DELETE FROM tickbox_outbox_done WHERE message_id IN ",
            $rows!()
        )
    };
}
pub(crate) use forget_done_text;

/// A key's counter moves to its next number, published at `$at_us`:
/// `(number, when the previous one was published)`, or no row for a key that
/// has none yet. Inside the publishing transaction, the row stays locked
/// until it ends. Fixed shape, so each connection keeps it prepared (an
/// upsert's `DO UPDATE` is never kept prepared by diesel; these two are).
#[allow(unused_macros)]
macro_rules! bump_sequence_statement {
    ($topic:expr, $key:expr, $at_us:expr) => {{
        use diesel::{ExpressionMethods, NullableExpressionMethods, QueryDsl};
        use $crate::store::schema::tickbox_key_sequences::dsl as seq;
        diesel::update(
            seq::tickbox_key_sequences
                .filter(seq::topic.eq($topic))
                .filter(seq::ordering_key.eq($key)),
        )
        .set((
            seq::last_seq.eq(seq::last_seq + 1_i64),
            seq::previous_at_us.eq(seq::last_at_us.nullable()),
            seq::last_at_us.eq($at_us),
        ))
        .returning((seq::last_seq, seq::previous_at_us))
    }};
}
// Stated for the backends that spell the statement this way; a build
// with only other backends leaves it unused.
#[allow(unused_imports)]
pub(crate) use bump_sequence_statement;

/// A key's counter starts at 1, unless another transaction started it
/// first (PostgreSQL: this one then waits for that one's end).
#[allow(unused_macros)]
macro_rules! first_sequence_statement {
    ($topic:expr, $key:expr, $at_us:expr) => {{
        use diesel::ExpressionMethods;
        use $crate::store::schema::tickbox_key_sequences::dsl as seq;
        diesel::insert_into(seq::tickbox_key_sequences)
            .values((
                seq::topic.eq($topic),
                seq::ordering_key.eq($key),
                seq::last_seq.eq(1_i64),
                seq::last_at_us.eq($at_us),
            ))
            .on_conflict_do_nothing()
    }};
}
// Stated for the backends that spell the statement this way; a build
// with only other backends leaves it unused.
#[allow(unused_imports)]
pub(crate) use first_sequence_statement;

/// The order in which a transaction's keyed rows take their numbers: by
/// topic, then key, then as published, so that transactions publishing for
/// the same keys lock their counters in one order and never wait for each
/// other crosswise.
pub(crate) fn numbering_order(rows: &[OutboxRow]) -> Vec<usize> {
    // A scheduled keyed row is written without a number and numbered once
    // due ([`OutboxStatements::number_due`]).
    let mut keyed: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].ordering_key.is_some() && rows[i].key_seq.is_some())
        .collect();
    keyed.sort_by(|&a, &b| {
        (&rows[a].topic, &rows[a].ordering_key).cmp(&(&rows[b].topic, &rows[b].ordering_key))
    });
    keyed
}
