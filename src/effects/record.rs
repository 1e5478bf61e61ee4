//! What the operator sees of an effect, and how a person settles one.

use crate::effects::state::EffectState;
use crate::error::{Error, Result};
use crate::store::schema::EffectRow;
use serde::Serialize;
use uuid::Uuid;

/// One effect in a module's journal, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EffectRecord {
    /// The message whose delivery made the effect.
    pub message_id: Uuid,
    /// The handler the message was delivered to.
    pub handler: String,
    /// The effect's name, unique within the handler.
    pub effect: String,
    /// The idempotency key the call was given.
    pub key: String,
    /// The policy it was first called with
    /// ([`EffectPolicy::name`](crate::EffectPolicy::name)).
    pub policy: String,
    /// Where it stands.
    pub state: EffectState,
    /// How many times it was called.
    pub calls: i64,
    /// When its key's window began (µs since the Unix epoch): the first
    /// call, or the first after a person allowed a retry.
    pub window_from_us: i64,
    /// When its state last changed (µs since the Unix epoch).
    pub updated_at_us: i64,
    /// A succeeded effect's result, as JSON.
    pub result: Option<String>,
    /// Why it failed, or why it is unknown.
    pub error: Option<String>,
}

impl TryFrom<EffectRow> for EffectRecord {
    type Error = Error;

    fn try_from(row: EffectRow) -> Result<Self> {
        let state = EffectState::of(&row)?;
        Ok(EffectRecord {
            message_id: row.message_id.0,
            handler: row.handler,
            effect: row.effect,
            key: row.effect_key,
            policy: row.policy,
            state,
            calls: row.calls,
            window_from_us: row.window_from_us,
            updated_at_us: row.updated_at_us,
            result: row.result,
            error: row.error,
        })
    }
}

/// How a person settles an effect nobody can vouch for (an
/// [`Unknown`](EffectState::Unknown) one, or one left
/// [`Started`](EffectState::Started) or [`Failed`](EffectState::Failed)),
/// with [`ModuleHandle::settle_effect`](crate::ModuleHandle::settle_effect)
/// or the operator's tool. Replay the message's dead letter afterwards.
#[derive(Debug, Clone, PartialEq)]
pub enum Settlement {
    /// It happened (checked in the external system): it becomes
    /// [`Succeeded`](EffectState::Succeeded) with this result, which the
    /// next delivery gets back without calling. The result must decode as
    /// the type the handler's effect returns (`null` for `()`).
    Done {
        /// The result, as the effect would have returned it.
        result: serde_json::Value,
    },
    /// It did not happen, or may happen again: the next delivery calls it
    /// once more, with the same key, and its window starts again.
    Retry,
}
