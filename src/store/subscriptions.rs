//! The subscriptions' statements: which handlers, in any process, subscribe
//! to an outbox's topics, recorded in the outbox's own database where every
//! process sees them (see [`crate::outbox::subscription`]); and
//! [`Subscription`], one such record as it is read.
//!
//! What reads the same in standard SQL on every backend is stated once, as
//! the default of a [`SubscriptionStatements`] method; a statement taking a
//! list of ids is stated here as a text macro and run by each backend with
//! its spelling of the list, in `store/<backend>/subscriptions.rs`.

use crate::store::contract::Store;
use crate::store::ids::IdLists;
use crate::store::schema::{DbUuid, Id, SubscriptionRow};
use crate::store::sql::{sql, Sql};
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel::QueryResult;
use serde::Serialize;
use std::future::Future;
use uuid::Uuid;

/// A handler's subscription to an outbox, as recorded in the outbox's
/// database.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Subscription {
    /// The module whose handler it is.
    pub module: String,
    /// The handler's name.
    pub handler: String,
    /// The topic it receives.
    pub topic: String,
    /// When it was first recorded (µs since the Unix epoch): it receives
    /// every message still pending then and every one committed since.
    pub subscribed_at_us: i64,
    /// When a running bus serving it last said so.
    pub seen_at_us: i64,
    /// Until when that holds; a bus that stops sets it to the moment it
    /// stopped.
    pub alive_until_us: i64,
    /// When the oldest message still owed to it was published, if any.
    pub oldest_pending_us: Option<i64>,
}

impl Subscription {
    /// Whether a running bus serves it (it said so recently enough).
    pub fn is_alive(&self, now_us: i64) -> bool {
        self.alive_until_us > now_us
    }
}

/// The columns of a subscription row, in [`SubscriptionRow`]'s order.
macro_rules! subscription_columns {
    () => {
        "id, module, handler, topic, subscribed_at_us, seen_at_us, alive_until_us"
    };
}
// For a backend that spells the statements using it differently; unused
// in a build without one.
#[allow(unused_imports)]
pub(crate) use subscription_columns;

/// A subscription's id and the publication time of the oldest message it
/// still owes.
#[derive(diesel::QueryableByName)]
pub struct OldestOwed {
    /// The subscription's id.
    #[diesel(sql_type = DbUuid)]
    pub(crate) id: Id,
    /// Microseconds since the Unix epoch; `None` when it owes nothing.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub(crate) oldest: Option<i64>,
}

/// A subscription that still owes a message.
#[derive(diesel::QueryableByName)]
pub struct Owing {
    /// The module whose handler it is.
    #[diesel(sql_type = Text)]
    pub(crate) module: String,
    /// The handler's name.
    #[diesel(sql_type = Text)]
    pub(crate) handler: String,
    /// Until when a running bus said it serves it.
    #[diesel(sql_type = BigInt)]
    pub(crate) alive_until_us: i64,
}

/// The subscriptions' statements, implemented by each backend in
/// `store/<backend>/subscriptions.rs`.
pub trait SubscriptionStatements: Store + IdLists {
    /// [`SubscriptionStatements::stop_serving`]'s text, in this backend's
    /// spelling of a list of ids ([`stop_serving_text!`]).
    const STOP_SERVING: &'static str;

    /// At a bus's start and every scan interval: records the subscriptions
    /// a bus serves, or updates the ones recorded (module, handler, topic,
    /// when seen, until when alive), keeping when each was first recorded.
    fn record_subscriptions(
        conn: &mut Self::Conn,
        rows: Vec<SubscriptionRow>,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            // One statement per row: a bus has few handlers.
            for row in rows {
                let statement = sql!(
                    concat!(
                        "INSERT INTO tickbox_subscriptions (",
                        subscription_columns!(),
                        ") VALUES (?, ?, ?, ?, ?, ?, ?) \
                         ON CONFLICT (id) DO UPDATE SET module = excluded.module, \
                         handler = excluded.handler, topic = excluded.topic, \
                         seen_at_us = excluded.seen_at_us, \
                         alive_until_us = excluded.alive_until_us"
                    ),
                    row.id,
                    row.module,
                    row.handler,
                    row.topic,
                    row.subscribed_at_us,
                    row.seen_at_us,
                    row.alive_until_us
                );
                Self::execute(conn, statement).await?;
            }
            Ok(())
        }
    }

    /// Every subscription recorded in this outbox's database, by module
    /// and handler.
    fn subscriptions(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Vec<SubscriptionRow>>> + Send {
        Self::load(
            conn,
            Sql::plain(concat!(
                "SELECT ",
                subscription_columns!(),
                " FROM tickbox_subscriptions ORDER BY module, handler"
            )),
        )
    }

    /// When a bus stops: records that no running bus serves the
    /// subscriptions `served` any more, from `now_us`. They stay, and keep
    /// their messages, until served again or retired.
    fn stop_serving(
        conn: &mut Self::Conn,
        served: &[Uuid],
        now_us: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let statement = sql!(Self::STOP_SERVING, now_us, Self::id_rows(served));
        Self::execute(conn, statement)
    }

    /// Each subscription's id and when the oldest message it still owes at
    /// `now_us` (pending, due, of its topic, not recorded done) became
    /// deliverable: its publication time, or its due time if later.
    fn oldest_owed(
        conn: &mut Self::Conn,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<Vec<OldestOwed>>> + Send {
        Self::load(
            conn,
            sql!(
                "SELECT s.id AS id, (SELECT CASE WHEN o.due_at_us > o.created_at_us \
                         THEN o.due_at_us ELSE o.created_at_us END FROM tickbox_outbox o \
                     WHERE o.delivered_at_us IS NULL AND o.id <= ? AND o.topic = s.topic \
                     AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
                         WHERE d.message_id = o.id AND d.subscription = s.id) \
                     ORDER BY o.id LIMIT 1) AS oldest \
                 FROM tickbox_subscriptions s",
                crate::message::due_by(now_us)
            ),
        )
    }

    /// For the watchdog: the subscriptions that still owe message `id`, by
    /// module and handler.
    fn owing(
        conn: &mut Self::Conn,
        id: Uuid,
    ) -> impl Future<Output = QueryResult<Vec<Owing>>> + Send {
        Self::load(
            conn,
            sql!(
                "SELECT s.module AS module, s.handler AS handler, \
                 s.alive_until_us AS alive_until_us \
                 FROM tickbox_subscriptions s JOIN tickbox_outbox o ON s.topic = o.topic \
                 WHERE o.id = ? AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
                     WHERE d.message_id = o.id AND d.subscription = s.id) \
                 ORDER BY s.module, s.handler",
                id
            ),
        )
    }

    /// Deletes subscription `id` and what it recorded done (an operator
    /// retires a handler gone for good). The messages it alone owed are
    /// then finished by
    /// [`OutboxStatements::finish_completed`](crate::store::outbox::OutboxStatements::finish_completed).
    fn retire(conn: &mut Self::Conn, id: Uuid) -> impl Future<Output = QueryResult<()>> + Send {
        async move {
            Self::execute(
                conn,
                sql!("DELETE FROM tickbox_outbox_done WHERE subscription = ?", id),
            )
            .await?;
            Self::execute(
                conn,
                sql!("DELETE FROM tickbox_subscriptions WHERE id = ?", id),
            )
            .await
            .map(drop)
        }
    }
}

/// [`SubscriptionStatements::stop_serving`]'s statement, with the backend's
/// subquery of a list bound as one value (`$rows`). Values: now, the
/// served subscriptions.
macro_rules! stop_serving_text {
    ($rows:ident) => {
        concat!(
            "UPDATE tickbox_subscriptions SET alive_until_us = ? WHERE id IN ",
            $rows!()
        )
    };
}
pub(crate) use stop_serving_text;
