//! A module's effects journal: the decision taken before each call, the
//! outcome recorded after it, and what operators read and settle. Each of
//! these is one short transaction of its own on the journal's connections,
//! run in a task of its own (so that it is never dropped half way).

use crate::effects::counters::{EffectCounters, EffectEvent};
use crate::effects::policy::EffectPolicy;
use crate::effects::record::{EffectRecord, Settlement};
use crate::effects::state::EffectState;
use crate::error::{Error, Result};
use crate::message::now_us;
use crate::store::backend::Backend;
use crate::store::database::Database;
use crate::store::deadline::CallWatch;
use crate::store::journal::{EffectChange, EffectId};
use crate::store::schema::{EffectRow, Id};
use crate::store::settings::StoreSettings;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use tokio::sync::OnceCell;

/// What an effect may do on this attempt, as decided before the call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Begun {
    /// Call it; this is its `calls`-th call.
    Call {
        /// The call's number, which the outcome is recorded against.
        calls: i64,
    },
    /// Do not call: hand back this recorded result (JSON).
    Reuse(String),
    /// Do not call, and give the delivery up: nobody can say whether the
    /// effect happened (it is now, or was already, unknown).
    Refuse(String),
}

/// A decision about an existing journal entry: what to do, and how the
/// entry changes (in the same transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    pub(crate) begun: Begun,
    pub(crate) change: Option<EffectChange>,
}

/// How an effect's call ended, as [`Journal::finish`] records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finished {
    /// It returned this result (JSON).
    Succeeded(String),
    /// It returned this error.
    Failed(String),
    /// It returned, but nobody can vouch for what it did: why.
    Unknown(String),
}

/// What every refusal tells the person who reads the dead letter.
const SETTLE_IT: &str = "a person must settle it (the operator's tool: `effects done` if it \
                         happened, `effects retry` to call it again), then replay the dead letter";

/// Decides what an effect found in the journal may do now, under `policy`.
pub(crate) fn decide(found: &EffectRow, policy: EffectPolicy, now_us: i64) -> Result<Decision> {
    let state = EffectState::of(found)?;
    let from_state = state.as_str();
    let call_again = |window_from_us: Option<i64>| Decision {
        begun: Begun::Call {
            calls: found.calls + 1,
        },
        change: Some(EffectChange {
            from_state,
            from_calls: found.calls,
            state: EffectState::Started.as_str(),
            calls: found.calls + 1,
            window_from_us,
            updated_at_us: now_us,
            result: None,
            error: found.error.clone(),
        }),
    };
    let unknown = |why: String| Decision {
        begun: Begun::Refuse(format!(
            "effect `{}` is unknown: {why}; {SETTLE_IT}",
            found.effect
        )),
        change: Some(EffectChange {
            from_state,
            from_calls: found.calls,
            state: EffectState::Unknown.as_str(),
            calls: found.calls,
            window_from_us: None,
            updated_at_us: now_us,
            result: None,
            error: Some(why),
        }),
    };
    Ok(match (state, policy) {
        (EffectState::Succeeded, _) => Decision {
            begun: Begun::Reuse(found.result.clone().unwrap_or_else(|| "null".into())),
            change: None,
        },
        (EffectState::Unknown, _) => Decision {
            begun: Begun::Refuse(format!(
                "effect `{}` is unknown ({}); {SETTLE_IT}",
                found.effect,
                found.error.as_deref().unwrap_or("no reason recorded")
            )),
            change: None,
        },
        (EffectState::Retry, _) => call_again(Some(now_us)),
        (EffectState::Failed, EffectPolicy::AtMostOnce) => call_again(None),
        (EffectState::Started, EffectPolicy::AtMostOnce) => unknown(format!(
            "call {} was started but its outcome was never recorded (the call panicked, or the \
             process stopped during it or before recording it), and it may not be called twice",
            found.calls
        )),
        (
            EffectState::Started | EffectState::Failed,
            EffectPolicy::AtLeastOnceWithKey { window },
        ) => {
            let since = now_us.saturating_sub(found.window_from_us);
            if since > window.as_micros().min(i64::MAX as u128) as i64 {
                unknown(format!(
                    "it is due again {:.1} s after its first call, later than its key's window of \
                     {window:?}: the external system may no longer recognise the key, so it is not \
                     sent blind",
                    since as f64 / 1e6
                ))
            } else {
                call_again(None)
            }
        }
    })
}

/// The effects journal of one module.
pub(crate) struct Journal<B: Backend> {
    /// Where to open it.
    settings: StoreSettings,
    /// Its connections, once opened. A journal not found (the module's
    /// database is only attached and no effect was ever recorded, or
    /// another process is making it) is looked for again next time.
    db: OnceCell<Arc<Database<B>>>,
    /// What this process's effects did.
    pub(crate) counters: EffectCounters,
    /// The module's calls, which the journal's are counted with.
    watch: Arc<CallWatch>,
}

impl<B: Backend> Journal<B> {
    /// The journal of the module opened with `settings`, not opened yet;
    /// its calls are watched with the module's, by `watch`.
    pub(crate) fn new(settings: StoreSettings, watch: Arc<CallWatch>) -> Self {
        Journal {
            counters: EffectCounters::new(&settings.module),
            settings,
            db: OnceCell::new(),
            watch,
        }
    }

    /// Opens the journal unless it is open; `None` when there is none (yet).
    pub(crate) async fn open(&self) -> Result<Option<Arc<Database<B>>>> {
        if let Some(db) = self.db.get() {
            return Ok(Some(db.clone()));
        }
        let Some(pool) = B::open_journal(&self.settings).await? else {
            return Ok(None);
        };
        let db = self
            .db
            .get_or_init(|| async {
                let module: Arc<str> = Arc::from(self.settings.module.as_str());
                Arc::new(Database::new(
                    module,
                    pool,
                    self.settings.deadlines,
                    self.watch.clone(),
                ))
            })
            .await;
        Ok(Some(db.clone()))
    }

    /// The journal's connections if it was opened, without opening it.
    pub(crate) fn opened(&self) -> Option<Arc<Database<B>>> {
        self.db.get().cloned()
    }

    /// The journal's connections, for recording.
    async fn required(&self) -> Result<Arc<Database<B>>> {
        self.open().await?.ok_or_else(|| {
            Error::Config(format!(
                "module `{}` was attached without migrations and has no effects journal: start \
                 it with ModuleBuilder::start to record effects",
                self.settings.module
            ))
        })
    }

    /// Before a call: records the effect as started, or decides from its
    /// entry whether to call again, hand back its result, or refuse.
    pub(crate) async fn begin(
        &self,
        id: EffectId,
        key: String,
        policy: EffectPolicy,
    ) -> Result<Begun> {
        let db = self.required().await?;
        let (handler, effect) = (id.handler.clone(), id.effect.clone());
        let begun = in_transaction(db, move |conn| {
            Box::pin(async move {
                let now = now_us();
                let row = EffectRow {
                    message_id: Id(id.message_id),
                    handler: id.handler.clone(),
                    effect: id.effect.clone(),
                    effect_key: key,
                    policy: policy.name().to_string(),
                    state: EffectState::Started.as_str().to_string(),
                    calls: 1,
                    window_from_us: now,
                    updated_at_us: now,
                    result: None,
                    error: None,
                };
                if B::insert_journal_entry(conn, &row).await? == 1 {
                    return Ok((Begun::Call { calls: 1 }, false));
                }
                let found = B::journal_entry(conn, &id)
                    .await?
                    .ok_or_else(|| changed(&id))?;
                let decision = decide(&found, policy, now)?;
                let became_unknown = decision
                    .change
                    .as_ref()
                    .is_some_and(|c| c.state == EffectState::Unknown.as_str());
                if let Some(change) = decision.change {
                    if B::update_journal_entry(conn, &id, change).await? != 1 {
                        return Err(changed(&id));
                    }
                }
                Ok((decision.begun, became_unknown))
            })
        })
        .await?;
        let (begun, became_unknown) = begun;
        // An effect refused because it was unknown already is not counted
        // again.
        let event = match &begun {
            Begun::Call { .. } => Some(EffectEvent::Started),
            Begun::Reuse(_) => Some(EffectEvent::Reused),
            Begun::Refuse(_) => became_unknown.then_some(EffectEvent::Unknown),
        };
        if let Some(event) = event {
            self.counters.count(&handler, &effect, event);
        }
        Ok(begun)
    }

    /// After call number `calls`: records how it ended. False when the
    /// entry had changed meanwhile (a person settled it) and was left as
    /// it is.
    pub(crate) async fn finish(&self, id: EffectId, calls: i64, ended: Finished) -> Result<bool> {
        let db = self.required().await?;
        let (handler, effect) = (id.handler.clone(), id.effect.clone());
        let (state, event, result, error) = match ended {
            Finished::Succeeded(json) => (
                EffectState::Succeeded,
                EffectEvent::Succeeded,
                Some(json),
                None,
            ),
            Finished::Failed(why) => (EffectState::Failed, EffectEvent::Failed, None, Some(why)),
            Finished::Unknown(why) => (EffectState::Unknown, EffectEvent::Unknown, None, Some(why)),
        };
        let change = EffectChange {
            from_state: EffectState::Started.as_str(),
            from_calls: calls,
            state: state.as_str(),
            calls,
            window_from_us: None,
            updated_at_us: now_us(),
            result,
            error,
        };
        let recorded = in_transaction(db, move |conn| {
            Box::pin(async move { Ok(B::update_journal_entry(conn, &id, change).await? == 1) })
        })
        .await?;
        self.counters.count(&handler, &effect, event);
        Ok(recorded)
    }

    /// Effects in one of `states` (all when empty), least recently changed
    /// first, from `offset`.
    pub(crate) async fn list(
        &self,
        states: &[EffectState],
        offset: i64,
        limit: i64,
    ) -> Result<Vec<EffectRecord>> {
        let Some(db) = self.open().await? else {
            return Ok(Vec::new());
        };
        let states: Vec<&str> = states.iter().map(EffectState::as_str).collect();
        let rows = db
            .call("listing effects", async move |conn| {
                Ok(B::journal_entries(conn, &states, offset, limit).await?)
            })
            .await?;
        rows.into_iter().map(EffectRecord::try_from).collect()
    }

    /// Settles an effect nobody can vouch for; the entry as it now stands.
    pub(crate) async fn settle(
        &self,
        id: EffectId,
        settlement: Settlement,
    ) -> Result<EffectRecord> {
        let no_entry = id.error(format!(
            "module `{}` has no such effect",
            self.settings.module
        ));
        let Some(db) = self.open().await? else {
            return Err(no_entry);
        };
        let (state, result) = match &settlement {
            Settlement::Done { result } => (EffectState::Succeeded, Some(result.to_string())),
            Settlement::Retry => (EffectState::Retry, None),
        };
        let settled = in_transaction(db, move |conn| {
            Box::pin(async move {
                let Some(found) = B::journal_entry(conn, &id).await? else {
                    return Err(no_entry);
                };
                let from = EffectState::of(&found)?;
                if from == EffectState::Succeeded {
                    return Err(id.error(
                        "it succeeded and its result is recorded; there is nothing to settle",
                    ));
                }
                let change = EffectChange {
                    from_state: from.as_str(),
                    from_calls: found.calls,
                    state: state.as_str(),
                    calls: found.calls,
                    window_from_us: None,
                    updated_at_us: now_us(),
                    result,
                    error: found.error,
                };
                if B::update_journal_entry(conn, &id, change).await? != 1 {
                    return Err(changed(&id));
                }
                B::journal_entry(conn, &id)
                    .await?
                    .ok_or_else(|| changed(&id))
            })
        })
        .await?;
        settled.try_into()
    }

    /// How many effects are unknown, per handler (none when the module
    /// has no journal).
    pub(crate) async fn unknown_per_handler(&self) -> Result<Vec<(String, i64)>> {
        let Some(db) = self.open().await? else {
            return Ok(Vec::new());
        };
        let counts = db
            .call("counting unknown effects", async |conn| {
                Ok(B::unknown_effects(conn).await?)
            })
            .await?;
        Ok(counts.into_iter().map(|c| (c.handler, c.n)).collect())
    }

    /// Closes the journal's connections, if it was opened.
    pub(crate) fn close(&self) {
        if let Some(db) = self.opened() {
            db.close();
        }
    }
}

/// The error when an entry changed between reading and writing it (a
/// person settled it meanwhile): the attempt fails and is retried.
fn changed(id: &EffectId) -> Error {
    id.error("its journal entry changed while it was being read; try again")
}

/// Runs `work` in one write transaction on the journal, in a task of its
/// own; rolls back on error.
async fn in_transaction<B, T, F>(db: Arc<Database<B>>, work: F) -> Result<T>
where
    B: Backend,
    T: Send + 'static,
    F: for<'c> FnOnce(&'c mut B::Connection) -> BoxFuture<'c, Result<T>> + Send + 'static,
{
    let module = db.module().to_string();
    tokio::spawn(async move {
        let module = db.module().to_string();
        // A transaction left open past the deadline leaves with its
        // connection, which is closed (and the server rolls it back).
        db.write_call("an effects journal transaction", async move |conn| {
            B::begin(conn).await?;
            match work(conn).await {
                Ok(value) => {
                    B::commit(conn).await?;
                    Ok(value)
                }
                Err(error) => {
                    if let Err(rollback) = B::rollback(conn).await {
                        tracing::warn!(%module, error = %rollback, "rolling back a journal transaction failed");
                    }
                    Err(error)
                }
            }
        })
        .await
    })
    .await
    .map_err(|e| Error::Task {
        what: format!("the effects journal of module `{module}`"),
        reason: e.to_string(),
    })?
}
