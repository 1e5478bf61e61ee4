//! The effects journal's queries, written once for both backends (see
//! [`crate::effects`] for what the journal is). They run on the journal's
//! own connections: on SQLite a companion file beside the module's
//! database, on PostgreSQL the module's schema through a small pool of its
//! own, so a journal entry commits while the delivery's transaction is
//! still open.

use crate::store::contract::Store;
use crate::store::queries::{count, optional_text, Sweep};
use crate::store::schema::EffectRow;
use crate::store::statement::StatementBuilder;
use diesel::sql_types::{BigInt, Text};
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// The columns of an effect row, in [`EffectRow`]'s order.
const EFFECT_COLUMNS: &str = "message_id, handler, effect, effect_key, policy, state, calls, \
     window_from_us, updated_at_us, result, error";

/// The states a person must settle or the journal is still waiting on
/// (the partial index `tickbox_effects_unsettled` holds their rows).
const UNSETTLED: &str = "state <> 'succeeded' AND state <> 'failed'";

/// Which effect of which delivery.
#[derive(Debug, Clone)]
pub struct EffectId {
    /// The message.
    pub(crate) message_id: Uuid,
    /// The handler it was delivered to.
    pub(crate) handler: String,
    /// The effect's name, unique within the handler.
    pub(crate) effect: String,
}

impl EffectId {
    /// An error about this effect.
    pub(crate) fn error(&self, reason: impl Into<String>) -> crate::Error {
        crate::Error::Effect {
            message_id: self.message_id,
            handler: self.handler.clone(),
            effect: self.effect.clone(),
            reason: reason.into(),
        }
    }
}

/// What an update of an effect row expects to find, and what it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectChange {
    /// The state the row must be in (else nothing is written).
    pub(crate) from_state: &'static str,
    /// The call count the row must have (else nothing is written).
    pub(crate) from_calls: i64,
    /// The new state.
    pub(crate) state: &'static str,
    /// The new call count.
    pub(crate) calls: i64,
    /// When the key's window begins from now on (`None`: as it was).
    pub(crate) window_from_us: Option<i64>,
    pub(crate) updated_at_us: i64,
    /// A succeeded effect's result, as JSON.
    pub(crate) result: Option<String>,
    /// Why it failed, or why it is unknown.
    pub(crate) error: Option<String>,
}

/// How many unknown effects one handler has.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct UnknownCount {
    /// The handler.
    #[diesel(sql_type = Text)]
    pub(crate) handler: String,
    /// How many effects.
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
}

/// The journal's queries, for every [`Store`].
pub trait JournalQueries: Store {
    /// Records an effect about to be called for the first time, unless a
    /// row for it exists; 1 if it was recorded.
    fn insert_journal_entry(
        conn: &mut Self::Conn,
        row: &EffectRow,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let values = [
            b.id(row.message_id.0),
            b.text(&row.handler),
            b.text(&row.effect),
            b.text(&row.effect_key),
            b.text(&row.policy),
            b.text(&row.state),
            b.int(row.calls),
            b.int(row.window_from_us),
            b.int(row.updated_at_us),
            optional_text(&mut b, row.result.as_deref()),
            optional_text(&mut b, row.error.as_deref()),
        ]
        .join(", ");
        let sql = format!(
            "INSERT INTO tickbox_effects ({EFFECT_COLUMNS}) VALUES ({values}) \
             ON CONFLICT (message_id, handler, effect) DO NOTHING"
        );
        Self::execute_statement(conn, b.finish(sql))
    }

    /// One effect's row.
    fn journal_entry(
        conn: &mut Self::Conn,
        id: &EffectId,
    ) -> impl Future<Output = QueryResult<Option<EffectRow>>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let (message, handler, effect) =
            (b.id(id.message_id), b.text(&id.handler), b.text(&id.effect));
        let sql = format!(
            "SELECT {EFFECT_COLUMNS} FROM tickbox_effects \
             WHERE message_id = {message} AND handler = {handler} AND effect = {effect}"
        );
        let statement = b.finish(sql);
        async move {
            let rows: Vec<EffectRow> = Self::load_statement(conn, statement).await?;
            Ok(rows.into_iter().next())
        }
    }

    /// Changes an effect's row if it is as `change` expects; 1 if it was.
    fn update_journal_entry(
        conn: &mut Self::Conn,
        id: &EffectId,
        change: EffectChange,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let (message, handler, effect) =
            (b.id(id.message_id), b.text(&id.handler), b.text(&id.effect));
        let (from_state, from_calls) = (b.text(change.from_state), b.int(change.from_calls));
        let (state, calls) = (b.text(change.state), b.int(change.calls));
        let window_from = match change.window_from_us {
            Some(from) => b.int(from),
            None => "window_from_us".to_string(),
        };
        let updated_at = b.int(change.updated_at_us);
        let result = optional_text(&mut b, change.result.as_deref());
        let error = optional_text(&mut b, change.error.as_deref());
        let sql = format!(
            "UPDATE tickbox_effects SET state = {state}, calls = {calls}, \
             window_from_us = {window_from}, updated_at_us = {updated_at}, \
             result = {result}, error = {error} \
             WHERE message_id = {message} AND handler = {handler} AND effect = {effect} \
             AND state = {from_state} AND calls = {from_calls}"
        );
        Self::execute_statement(conn, b.finish(sql))
    }

    /// Effects, most recently changed last, from `offset`: all of them, or
    /// those in one of `states`.
    fn journal_entries(
        conn: &mut Self::Conn,
        states: &[&str],
        offset: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<EffectRow>>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let filter = if states.is_empty() {
            "TRUE".to_string()
        } else {
            let listed: Vec<String> = states.iter().map(|state| b.text(state)).collect();
            format!("state IN ({})", listed.join(", "))
        };
        let (limit, offset) = (b.int(limit), b.int(offset));
        let sql = format!(
            "SELECT {EFFECT_COLUMNS} FROM tickbox_effects WHERE {filter} \
             ORDER BY updated_at_us, message_id, handler, effect LIMIT {limit} OFFSET {offset}"
        );
        Self::load_statement(conn, b.finish(sql))
    }

    /// Whether the database (PostgreSQL: the current schema) has the
    /// journal's table.
    fn has_journal(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<bool>> + Send {
        let sql = format!(
            "SELECT count(*) AS n FROM {} = 'tickbox_effects'",
            Self::TABLES_BY_NAME
        );
        let statement = StatementBuilder::new(Self::DIALECT).finish(sql);
        async move { Ok(count::<Self>(conn, statement).await? > 0) }
    }

    /// How many effects are unknown, per handler (read through the partial
    /// index of unsettled rows).
    fn unknown_effects(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Vec<UnknownCount>>> + Send {
        let sql = format!(
            "SELECT handler, count(*) AS n FROM tickbox_effects \
             WHERE {UNSETTLED} AND state = 'unknown' GROUP BY handler ORDER BY handler"
        );
        Self::load_statement(conn, StatementBuilder::new(Self::DIALECT).finish(sql))
    }

    /// Deletes up to `batch` messages' settled effects (succeeded or
    /// failed) last changed before `before_us`, except those of the
    /// messages in `keep` (dead letters, which a replay may bring back: a
    /// succeeded effect must still be found then).
    fn sweep_effects(
        conn: &mut Self::Conn,
        before_us: i64,
        keep: &[Uuid],
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let kept = b.not_among("message_id", keep);
        let condition = format!("NOT ({UNSETTLED}) AND {kept}");
        let sweep = Sweep {
            table: "tickbox_effects",
            id: "message_id",
            done_at: "updated_at_us",
        };
        Self::execute_statement(conn, sweep.statement_where(b, &condition, before_us, batch))
    }
}

impl<S: Store> JournalQueries for S {}
