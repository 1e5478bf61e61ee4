//! Where an effect stands in the journal.

use crate::store::journal::EffectId;
use crate::store::schema::EffectRow;
use serde::Serialize;
use std::fmt;
use std::str::FromStr;

/// Where an effect stands in its module's journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EffectState {
    /// Recorded before the call and not finished since: the call is under
    /// way, or the process stopped during it or before its result was
    /// recorded.
    Started,
    /// The call returned a result, which is kept and handed back to every
    /// later delivery of the message instead of calling again.
    Succeeded,
    /// The call returned an error (the delivery is retried or
    /// dead-lettered after the handler's retry policy).
    Failed,
    /// Nobody knows whether it happened: an
    /// [`AtMostOnce`](crate::EffectPolicy::AtMostOnce) effect found
    /// started, or an
    /// [`AtLeastOnceWithKey`](crate::EffectPolicy::AtLeastOnceWithKey)
    /// one due again after its key's window. A person settles it.
    Unknown,
    /// A person allowed one more call (a settled unknown effect); the next
    /// delivery calls it, with the same key, and its window starts again.
    Retry,
}

impl EffectState {
    /// Every state, in the order an effect goes through them.
    pub const ALL: [EffectState; 5] = [
        EffectState::Started,
        EffectState::Succeeded,
        EffectState::Failed,
        EffectState::Unknown,
        EffectState::Retry,
    ];

    /// The state `row` records.
    pub(crate) fn of(row: &EffectRow) -> crate::error::Result<Self> {
        row.state.parse().map_err(|reason: String| {
            EffectId {
                message_id: row.message_id.0,
                handler: row.handler.clone(),
                effect: row.effect.clone(),
            }
            .error(reason)
        })
    }

    /// The state's name in the journal: `started`, `succeeded`, `failed`,
    /// `unknown` or `retry`.
    pub fn as_str(&self) -> &'static str {
        match self {
            EffectState::Started => "started",
            EffectState::Succeeded => "succeeded",
            EffectState::Failed => "failed",
            EffectState::Unknown => "unknown",
            EffectState::Retry => "retry",
        }
    }
}

impl fmt::Display for EffectState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for EffectState {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        EffectState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| {
                let names: Vec<&str> = EffectState::ALL.iter().map(EffectState::as_str).collect();
                format!("`{text}` is not an effect state ({})", names.join(", "))
            })
    }
}
