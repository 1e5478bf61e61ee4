//! Subscriptions: which handlers, in any process, subscribe to an outbox's
//! topics, recorded in the outbox's own database where every process sees
//! them, and the statements that deliver a shared outbox by them.
//!
//! A pending message is owed to every subscription of its topic. A bus
//! finishes a message (marks it delivered, or deletes it) only if no
//! subscription it does not serve still owes it — checked inside the marking
//! statement itself, so a subscription recorded by another process a moment
//! earlier is never missed. When one is still owed, the bus records that its
//! own subscriptions are done with the message (`tickbox_outbox_done`) and
//! releases its claim; the bus serving the rest finishes it.
//!
//! A subscription's id is derived from `(module, handler)`, the same pair
//! that keys the inbox, so every process computes the same one.

use crate::error::{Error, Result};
use crate::store::backend::Backend;
use crate::store::contract::Claim;
use crate::store::database::Database;
use crate::store::schema::{Id, SubscriptionRow};
use crate::store::statement::{Dialect, Statement, StatementBuilder};
use serde::Serialize;
use std::sync::Arc;
use uuid::Uuid;

/// The namespace of subscription ids (UUIDv5).
const NAMESPACE: Uuid = Uuid::from_u128(0x7469_636b_626f_7800_8000_0000_0000_0001);

/// The id of the subscription of handler `handler` of module `module`.
pub(crate) fn subscription_id(module: &str, handler: &str) -> Uuid {
    let mut name = Vec::with_capacity(module.len() + handler.len() + 1);
    name.extend_from_slice(module.as_bytes());
    name.push(0);
    name.extend_from_slice(handler.as_bytes());
    Uuid::new_v5(&NAMESPACE, &name)
}

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

/// A subscription a bus serves: one of its handlers whose topic an outbox on
/// the bus publishes.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) id: Uuid,
    pub(crate) module: Arc<str>,
    pub(crate) handler: Arc<str>,
    pub(crate) topic: &'static str,
}

impl Served {
    pub(crate) fn new(module: Arc<str>, handler: Arc<str>, topic: &'static str) -> Self {
        Served {
            id: subscription_id(&module, &handler),
            module,
            handler,
            topic,
        }
    }
}

/// Records in `outbox`'s database that these subscriptions are served by a
/// running bus until `alive_until_us`, and returns whether the outbox has
/// subscriptions this bus does not serve (other processes' handlers).
///
/// With `refuse_conflicts` (at bus start), a handler that a process still
/// running records on another topic is refused: two versions of one handler
/// would each miss the other's messages.
pub(crate) async fn record<B: Backend>(
    outbox: &Database<B>,
    served: &[Served],
    now_us: i64,
    alive_until_us: i64,
    refuse_conflicts: bool,
) -> Result<bool> {
    let outbox_module = outbox.module().to_string();
    let served: Vec<Served> = served.to_vec();
    outbox
        .write_call("recording subscriptions", async move |conn| {
            let recorded = B::subscriptions(conn).await?;
            if refuse_conflicts {
                for mine in &served {
                    let clash = recorded.iter().find(|r| {
                        r.id.0 == mine.id && r.topic != mine.topic && r.alive_until_us > now_us
                    });
                    if let Some(clash) = clash {
                        return Err(Error::SubscriptionConflict {
                            outbox: outbox_module,
                            module: mine.module.to_string(),
                            handler: mine.handler.to_string(),
                            topic: mine.topic.to_string(),
                            recorded: clash.topic.clone(),
                        });
                    }
                }
            }
            let rows = served
                .iter()
                .map(|s| SubscriptionRow {
                    id: Id(s.id),
                    module: s.module.to_string(),
                    handler: s.handler.to_string(),
                    topic: s.topic.to_string(),
                    subscribed_at_us: now_us,
                    seen_at_us: now_us,
                    alive_until_us,
                })
                .collect();
            B::record_subscriptions(conn, rows).await?;
            Ok(recorded
                .iter()
                .any(|r| !served.iter().any(|s| s.id == r.id.0)))
        })
        .await
}

/// Records that no running bus serves these subscriptions any more (its bus
/// stopped): they stay, and keep their messages, until served again or
/// retired.
pub(crate) fn stopped(dialect: Dialect, served: &[Uuid], now_us: i64) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let now = b.int(now_us);
    let listed = b.in_ids("id", served);
    b.finish(format!(
        "UPDATE tickbox_subscriptions SET alive_until_us = {now} WHERE {listed}"
    ))
}

#[derive(diesel::QueryableByName)]
struct OldestOwed {
    #[diesel(sql_type = crate::store::schema::DbUuid)]
    id: Id,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    oldest: Option<i64>,
}

/// A message a statement finished.
#[derive(diesel::QueryableByName)]
pub(crate) struct Finished {
    #[diesel(sql_type = crate::store::schema::DbUuid)]
    #[allow(dead_code)] // counted only
    id: Id,
}

/// The subscriptions recorded in `outbox`'s database, with the oldest
/// message each still owes.
pub(crate) async fn read<B: Backend>(outbox: &Database<B>) -> Result<Vec<Subscription>> {
    let (rows, oldest) = outbox
        .call("reading subscriptions", async |conn| {
            let rows = B::subscriptions(conn).await?;
            let oldest: Vec<OldestOwed> = B::load_statement(conn, oldest_owed(B::DIALECT)).await?;
            Ok((rows, oldest))
        })
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| Subscription {
            oldest_pending_us: oldest
                .iter()
                .find(|o| o.id == row.id)
                .and_then(|o| o.oldest),
            module: row.module,
            handler: row.handler,
            topic: row.topic,
            subscribed_at_us: row.subscribed_at_us,
            seen_at_us: row.seen_at_us,
            alive_until_us: row.alive_until_us,
        })
        .collect())
}

/// `EXISTS` a subscription of the message `outer` (a table name or alias
/// with `id` and `topic`) that none of `served` is and that is not done with
/// it: the message is still owed elsewhere.
fn owed_elsewhere(b: &mut StatementBuilder, outer: &str, served: &[Uuid]) -> String {
    let others = b.not_among("s.id", served);
    format!(
        "EXISTS (SELECT 1 FROM tickbox_subscriptions s \
         WHERE s.topic = {outer}.topic AND {others} \
         AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
             WHERE d.message_id = {outer}.id AND d.subscription = s.id))"
    )
}

/// Finishes those of `ids` that no subscription outside `served` still owes:
/// marks them delivered at `now_us`, or deletes them (`delete`, an outbox
/// retention of zero). Returns no rows (SQLite would gather `RETURNING` rows
/// in a temporary table on every call): when it changes fewer rows than
/// `ids`, [`pending_among`] tells which are left.
pub(crate) fn finish(
    dialect: Dialect,
    ids: &[Uuid],
    served: &[Uuid],
    now_us: i64,
    delete: bool,
) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let listed = b.in_ids("id", ids);
    let owed = owed_elsewhere(&mut b, "tickbox_outbox", served);
    let sql = if delete {
        format!("DELETE FROM tickbox_outbox WHERE {listed} AND NOT {owed}")
    } else {
        let now = b.int(now_us);
        format!(
            "UPDATE tickbox_outbox SET delivered_at_us = {now}, claimed_until_us = NULL \
             WHERE {listed} AND NOT {owed}"
        )
    };
    b.finish(sql)
}

/// Which of `ids` are still pending.
pub(crate) fn pending_among(dialect: Dialect, ids: &[Uuid]) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let listed = b.in_ids("id", ids);
    b.finish(format!(
        "SELECT id FROM tickbox_outbox WHERE {listed} AND delivered_at_us IS NULL"
    ))
}

/// Records that the subscriptions in `served` are done with `ids` (those of
/// them whose topic each subscribes to).
pub(crate) fn record_done(dialect: Dialect, ids: &[Uuid], served: &[Uuid]) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let listed = b.in_ids("o.id", ids);
    let mine = b.among("s.id", served);
    b.finish(format!(
        "INSERT INTO tickbox_outbox_done (message_id, subscription) \
         SELECT o.id, s.id FROM tickbox_outbox o \
         JOIN tickbox_subscriptions s ON s.topic = o.topic \
         WHERE {listed} AND {mine} \
         ON CONFLICT DO NOTHING"
    ))
}

/// Gives up `bus`'s claims on those of `ids` still pending.
pub(crate) fn release(dialect: Dialect, ids: &[Uuid], bus: Uuid) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let listed = b.in_ids("id", ids);
    let bus = b.id(bus);
    b.finish(format!(
        "UPDATE tickbox_outbox SET claimed_by = NULL, claimed_until_us = NULL \
         WHERE {listed} AND claimed_by = {bus} AND delivered_at_us IS NULL"
    ))
}

/// Which pending messages [`complete`] looks at.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Owed<'a> {
    /// Those some subscription is done with (when the last two buses
    /// recorded their parts at the same moment, neither saw the other's).
    PartlyDone,
    /// Those of a topic that just lost a subscription (retired): the rest
    /// of its subscriptions may be done with them, or none be left.
    Topic(&'a str),
}

/// Finishes every pending message among `among` that no subscription still
/// owes. Returns the ids finished.
pub(crate) fn complete(dialect: Dialect, among: Owed<'_>, now_us: i64, delete: bool) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let owed = owed_elsewhere(&mut b, "tickbox_outbox", &[]);
    let done = match among {
        Owed::PartlyDone => "id IN (SELECT message_id FROM tickbox_outbox_done)".to_string(),
        Owed::Topic(topic) => format!("topic = {}", b.text(topic)),
    };
    let sql = if delete {
        format!(
            "DELETE FROM tickbox_outbox WHERE delivered_at_us IS NULL AND {done} \
             AND NOT {owed} RETURNING id"
        )
    } else {
        let now = b.int(now_us);
        format!(
            "UPDATE tickbox_outbox SET delivered_at_us = {now}, claimed_until_us = NULL \
             WHERE delivered_at_us IS NULL AND {done} AND NOT {owed} RETURNING id"
        )
    };
    b.finish(sql)
}

/// Deletes the done rows of messages `ids` (just finished).
pub(crate) fn forget_done(dialect: Dialect, ids: &[Uuid]) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let listed = b.in_ids("message_id", ids);
    b.finish(format!("DELETE FROM tickbox_outbox_done WHERE {listed}"))
}

/// Deletes the done rows of messages no longer pending.
pub(crate) fn clear_done(dialect: Dialect) -> Statement {
    StatementBuilder::new(dialect).finish(
        "DELETE FROM tickbox_outbox_done WHERE NOT EXISTS \
         (SELECT 1 FROM tickbox_outbox o \
          WHERE o.id = tickbox_outbox_done.message_id AND o.delivered_at_us IS NULL)"
            .to_string(),
    )
}

/// Claims, for `claim.bus`, up to `claim.limit` pending rows past the cursor
/// that are unclaimed, claimed by it, or whose claim expired, and that it
/// has work for: a subscription it serves is not done with them, or their
/// topic has no subscription at all (it then finds the topic unknown, or
/// without subscribers, itself). A keyed row waits while an earlier row of
/// its key is under another bus's live claim, so two processes do not
/// deliver one key's messages at once. `lock` is the dialect's row locking
/// (`FOR UPDATE SKIP LOCKED` on PostgreSQL), `columns` its `RETURNING` list
/// for a [`ClaimedRow`](crate::store::schema::ClaimedRow).
pub(crate) fn claim(dialect: Dialect, lock: &str, columns: &str, claim: &Claim) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let bus = b.id(claim.bus);
    let until = b.int(claim.until_us);
    let now = b.int(claim.now_us);
    let limit = b.int(claim.limit);
    let beyond = b.int(claim.beyond_us);
    let after = match claim.after {
        Some(after) => format!("AND o.id > {}", b.id(after)),
        None => String::new(),
    };
    let mine = b.among("s.id", &claim.served);
    b.finish(format!(
        "UPDATE tickbox_outbox SET claimed_by = {bus}, claimed_until_us = {until} \
         WHERE id IN (SELECT o.id FROM tickbox_outbox o \
             WHERE o.delivered_at_us IS NULL {after} \
             AND (o.claimed_until_us IS NULL OR o.claimed_until_us < {now} \
                  OR o.claimed_until_us > {beyond} OR o.claimed_by = {bus}) \
             AND (NOT EXISTS (SELECT 1 FROM tickbox_subscriptions s WHERE s.topic = o.topic) \
                  OR EXISTS (SELECT 1 FROM tickbox_subscriptions s \
                      WHERE s.topic = o.topic AND {mine} \
                      AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
                          WHERE d.message_id = o.id AND d.subscription = s.id))) \
             AND (o.ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM tickbox_outbox e \
                 WHERE e.delivered_at_us IS NULL AND e.topic = o.topic \
                 AND e.ordering_key = o.ordering_key AND e.key_seq < o.key_seq \
                 AND e.claimed_by <> {bus} AND e.claimed_until_us >= {now} \
                 AND e.claimed_until_us <= {beyond})) \
             ORDER BY o.id LIMIT {limit} {lock}) \
         RETURNING {columns}"
    ))
}

/// How many pending messages another bus holds a live claim on, and until
/// when the last of those claims runs.
#[derive(diesel::QueryableByName)]
pub(crate) struct ClaimedElsewhere {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(crate) n: i64,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub(crate) until_us: Option<i64>,
}

/// [`ClaimedElsewhere`] for bus `bus` at `now_us`.
pub(crate) fn claimed_elsewhere(dialect: Dialect, bus: Uuid, now_us: i64) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let bus = b.id(bus);
    let now = b.int(now_us);
    b.finish(format!(
        "SELECT count(*) AS n, max(claimed_until_us) AS until_us FROM tickbox_outbox \
         WHERE delivered_at_us IS NULL AND claimed_until_us > {now} AND claimed_by <> {bus}"
    ))
}

/// Says, at a bus's start, what of `outbox` other buses' claims hold back
/// (a process that just crashed left them): otherwise a restarted process
/// would look idle while it waits.
pub(crate) async fn report_claimed_elsewhere<B: Backend>(
    outbox: &Database<B>,
    bus: Uuid,
    now_us: i64,
) -> Result<()> {
    let rows: Vec<ClaimedElsewhere> = outbox
        .call("reading other buses' claims", async |conn| {
            Ok(B::load_statement(conn, claimed_elsewhere(B::DIALECT, bus, now_us)).await?)
        })
        .await?;
    if let Some(ClaimedElsewhere {
        n,
        until_us: Some(until),
    }) = rows.into_iter().next()
    {
        if n > 0 {
            tracing::info!(
                module = %outbox.module(),
                messages = n,
                wait_seconds = until.saturating_sub(now_us) / 1_000_000,
                "messages of this outbox are claimed by another bus: they are delivered when it \
                 finishes them or when its claims expire (a crashed process's claims expire after \
                 their lease; a process restarted with the same BusBuilder::instance takes its own \
                 back at once)"
            );
        }
    }
    Ok(())
}

/// Each subscription's id and the publication time of the oldest message it
/// still owes (`oldest`, NULL if none).
pub(crate) fn oldest_owed(dialect: Dialect) -> Statement {
    StatementBuilder::new(dialect).finish(
        "SELECT s.id AS id, (SELECT o.created_at_us FROM tickbox_outbox o \
             WHERE o.delivered_at_us IS NULL AND o.topic = s.topic \
             AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
                 WHERE d.message_id = o.id AND d.subscription = s.id) \
             ORDER BY o.id LIMIT 1) AS oldest \
         FROM tickbox_subscriptions s"
            .to_string(),
    )
}

/// The subscriptions that still owe message `id` (`module`, `handler`,
/// `alive_until_us`).
pub(crate) fn owing(dialect: Dialect, id: Uuid) -> Statement {
    let mut b = StatementBuilder::new(dialect);
    let id = b.id(id);
    b.finish(format!(
        "SELECT s.module AS module, s.handler AS handler, s.alive_until_us AS alive_until_us \
         FROM tickbox_subscriptions s JOIN tickbox_outbox o ON s.topic = o.topic \
         WHERE o.id = {id} AND NOT EXISTS (SELECT 1 FROM tickbox_outbox_done d \
             WHERE d.message_id = o.id AND d.subscription = s.id) \
         ORDER BY s.module, s.handler"
    ))
}

/// Deletes subscription `id` and what it recorded as done.
pub(crate) fn retire(dialect: Dialect, id: Uuid) -> [Statement; 2] {
    let statement = |sql: &str| {
        let mut b = StatementBuilder::new(dialect);
        let id = b.id(id);
        b.finish(sql.replace("{id}", &id))
    };
    [
        statement("DELETE FROM tickbox_outbox_done WHERE subscription = {id}"),
        statement("DELETE FROM tickbox_subscriptions WHERE id = {id}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_id_depends_on_module_and_handler_only() {
        let id = subscription_id("warehouse", "warehouse.reserve_stock");
        assert_eq!(id, subscription_id("warehouse", "warehouse.reserve_stock"));
        assert_ne!(id, subscription_id("warehouse", "warehouse.release_stock"));
        assert_ne!(id, subscription_id("journeys", "warehouse.reserve_stock"));
        // The separator keeps apart pairs whose concatenations agree.
        assert_ne!(subscription_id("ab", "c"), subscription_id("a", "bc"));
        assert_eq!(id.get_version_num(), 5);
    }

    #[test]
    fn finishing_excludes_only_the_served_subscriptions_and_updates_or_deletes() {
        const TEST: Dialect = Dialect {
            id_rows: |param| format!("(ROWS {param})"),
            id_rows_text: |ids| ids.len().to_string(),
            id_among: |column, param| format!("{column} AMONG {param}"),
            id_among_text: |ids| ids.len().to_string(),
        };
        let update = finish(TEST, &[Uuid::nil()], &[], 7, false);
        assert!(update
            .sql
            .starts_with("UPDATE tickbox_outbox SET delivered_at_us"));
        assert!(update.sql.contains("NOT (s.id AMONG"), "{}", update.sql);
        assert!(
            update.sql.contains("d.subscription = s.id"),
            "{}",
            update.sql
        );
        let delete = finish(TEST, &[Uuid::nil()], &[Uuid::max()], 7, true);
        assert!(
            delete
                .sql
                .starts_with("DELETE FROM tickbox_outbox WHERE id IN (ROWS"),
            "{}",
            delete.sql
        );
    }
}
