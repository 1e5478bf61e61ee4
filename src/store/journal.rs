//! The effects journal's queries, written once for both backends (see
//! [`crate::effects`] for what the journal is). They run on the journal's
//! own connections: on SQLite a companion file beside the module's
//! database, on PostgreSQL the module's schema through a small pool of its
//! own, so a journal entry commits while the delivery's transaction is
//! still open.

use crate::error::Error;
use crate::store::contract::Store;
use crate::store::schema::EffectRow;
use crate::store::settings::StoreSettings;
use crate::store::sql::{sql, Sql};
use diesel::sql_types::{BigInt, Text};
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// The columns of an effect row, in [`EffectRow`]'s order, as a string
/// literal for `concat!`.
macro_rules! effect_columns {
    () => {
        "message_id, handler, effect, effect_key, policy, state, calls, window_from_us, \
         updated_at_us, result, error"
    };
}
// For a backend that spells the statements using it differently; unused
// in a build without one.
#[allow(unused_imports)]
pub(crate) use effect_columns;

/// The states a person must settle or the journal is still waiting on
/// (the partial index `tickbox_effects_unsettled` holds their rows), as a
/// condition on a row of `tickbox_effects`: a string literal for
/// `concat!`, which the retention sweep of settled effects negates.
macro_rules! unsettled {
    () => {
        "state <> 'succeeded' AND state <> 'failed'"
    };
}
pub(crate) use unsettled;

/// How many states [`JournalStatements::journal_entries`] filters on at
/// most: every state an effect can be in (`started`, `succeeded`,
/// `failed`, `unknown`, `retry`), each a slot of its fixed text.
pub(crate) const STATE_SLOTS: usize = 5;

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
    pub(crate) fn error(&self, reason: impl Into<String>) -> crate::error::Error {
        crate::error::Error::Effect {
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

/// The effects journal's statements. They run on the journal's own
/// connections ([`Store::open_journal`]). The defaults are written in the
/// SQL that SQLite and PostgreSQL share; a backend overrides what its
/// dialect spells otherwise, and states itself how it finds the journal's
/// table in its catalog ([`JournalStatements::has_journal`]).
pub trait JournalStatements: Store {
    /// Records an effect about to be called for the first time, unless a
    /// row for it exists; 1 if it was recorded.
    fn insert_journal_entry(
        conn: &mut Self::Conn,
        row: &EffectRow,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                concat!(
                    "INSERT INTO tickbox_effects (",
                    effect_columns!(),
                    ") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT (message_id, handler, effect) DO NOTHING"
                ),
                row.message_id,
                &row.handler,
                &row.effect,
                &row.effect_key,
                &row.policy,
                &row.state,
                row.calls,
                row.window_from_us,
                row.updated_at_us,
                row.result.as_deref(),
                row.error.as_deref()
            ),
        )
    }

    /// One effect's row, if it was recorded.
    fn journal_entry(
        conn: &mut Self::Conn,
        id: &EffectId,
    ) -> impl Future<Output = QueryResult<Option<EffectRow>>> + Send {
        let statement = sql!(
            concat!(
                "SELECT ",
                effect_columns!(),
                " FROM tickbox_effects WHERE message_id = ? AND handler = ? AND effect = ?"
            ),
            id.message_id,
            &id.handler,
            &id.effect
        );
        async move {
            let rows: Vec<EffectRow> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().next())
        }
    }

    /// Changes an effect's row if it is as `change` expects (its state and
    /// call count), so that of two processes changing it only one does; 1
    /// if it was changed. A `change` without a window start keeps the
    /// row's.
    fn update_journal_entry(
        conn: &mut Self::Conn,
        id: &EffectId,
        change: EffectChange,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                "UPDATE tickbox_effects SET state = ?, calls = ?, \
                 window_from_us = COALESCE(?, window_from_us), updated_at_us = ?, \
                 result = ?, error = ? \
                 WHERE message_id = ? AND handler = ? AND effect = ? \
                 AND state = ? AND calls = ?",
                change.state,
                change.calls,
                change.window_from_us,
                change.updated_at_us,
                change.result,
                change.error,
                id.message_id,
                &id.handler,
                &id.effect,
                change.from_state,
                change.from_calls
            ),
        )
    }

    /// Effects, least recently changed first, from `offset`: all of them
    /// when `states` is empty, else those in one of `states` (at most
    /// [`STATE_SLOTS`] different ones: more is a defect of the caller, and
    /// an error).
    ///
    /// One fixed text serves every filter: the number of states asked for,
    /// then a slot per state, the slots not used left NULL (a NULL in an
    /// `IN` list matches no row).
    fn journal_entries(
        conn: &mut Self::Conn,
        states: &[&str],
        offset: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<EffectRow>>> + Send {
        let mut wanted: Vec<&str> = Vec::with_capacity(states.len());
        for state in states {
            if !wanted.contains(state) {
                wanted.push(state);
            }
        }
        let asked = wanted.len();
        let slot = |i: usize| wanted.get(i).copied();
        let statement = (asked <= STATE_SLOTS).then(|| {
            sql!(
                concat!(
                    "SELECT ",
                    effect_columns!(),
                    " FROM tickbox_effects WHERE (? = 0 OR state IN (?, ?, ?, ?, ?)) \
                     ORDER BY updated_at_us, message_id, handler, effect LIMIT ? OFFSET ?"
                ),
                asked as i64,
                slot(0),
                slot(1),
                slot(2),
                slot(3),
                slot(4),
                limit,
                offset
            )
        });
        async move {
            let Some(statement) = statement else {
                return Err(diesel::result::Error::QueryBuilderError(
                    format!("{asked} effect states to filter on; there are {STATE_SLOTS}").into(),
                ));
            };
            Self::load(conn, statement).await
        }
    }

    /// Whether the database (PostgreSQL: the current schema) has the
    /// journal's table: a module's database only attached, not migrated,
    /// may predate it. Read from the backend's catalog.
    fn has_journal(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<bool>> + Send;

    /// How many effects are unknown, per handler (read through the partial
    /// index of unsettled rows).
    fn unknown_effects(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Vec<UnknownCount>>> + Send {
        Self::load(
            conn,
            Sql::plain(concat!(
                "SELECT handler, count(*) AS n FROM tickbox_effects WHERE ",
                unsettled!(),
                " AND state = 'unknown' GROUP BY handler ORDER BY handler"
            )),
        )
    }
}

/// Refuses a module's database, attached without migrating, that has no
/// effects journal (`pool` is the journal's): an older tickbox migrated
/// it. Looked for within the module's call deadline.
#[allow(dead_code)] // a build with SQLite only has no use for it
pub(crate) async fn refuse_missing_journal<S: JournalStatements>(
    pool: &S::Pool,
    settings: &StoreSettings,
) -> crate::error::Result<()> {
    let deadline = settings.deadlines.call;
    let checked = tokio::time::timeout(deadline, async {
        let mut conn = S::checkout(pool).await.map_err(|reason| Error::Pool {
            module: settings.module.clone(),
            reason,
        })?;
        Ok::<_, Error>(S::has_journal(&mut conn).await?)
    });
    let has_journal = checked.await.map_err(|_| Error::Deadline {
        module: settings.module.clone(),
        operation: "looking for the effects journal".into(),
        deadline,
    })??;
    if has_journal {
        return Ok(());
    }
    Err(Error::SchemaVersion {
        module: settings.module.clone(),
        reason: "has no effects journal (tickbox_effects): it was migrated by an older version \
                 of tickbox; start the application once with this version (it migrates its \
                 databases), then try again"
            .into(),
    })
}
