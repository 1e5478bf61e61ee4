//! A module's effects journal, as operators read and settle it.

use crate::effects::record::{EffectRecord, Settlement};
use crate::effects::state::EffectState;
use crate::error::Result;
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;
use crate::store::journal::EffectId;
use uuid::Uuid;

impl<B: Backend> ModuleHandle<B> {
    /// The effects in the module's journal that are in one of `states`
    /// (every effect when `states` is empty), least recently changed first,
    /// from `offset`, at most `limit` of them. See
    /// [`Delivery::effect`](crate::Delivery::effect).
    pub async fn effects(
        &self,
        states: &[EffectState],
        offset: u64,
        limit: u64,
    ) -> Result<Vec<EffectRecord>> {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.core
            .handlers
            .journal
            .list(states, clamp(offset), clamp(limit))
            .await
    }

    /// Settles an effect nobody can vouch for (unknown, or left started or
    /// failed): [`Settlement::Done`] when a person checked that it happened
    /// (the next delivery gets the given result back without calling),
    /// [`Settlement::Retry`] to let the next delivery call it once more with
    /// the same key. A succeeded effect cannot be settled. Then replay the
    /// message's dead letter ([`ModuleHandle::replay_dead_letter`], which
    /// runs the handler in this process) or requeue it for the bus that runs
    /// the handler ([`ModuleHandle::requeue_dead_letter`], as the operator's
    /// tool does); returns the effect as it now stands.
    pub async fn settle_effect(
        &self,
        message_id: Uuid,
        handler: &str,
        effect: &str,
        settlement: Settlement,
    ) -> Result<EffectRecord> {
        let id = EffectId {
            message_id,
            handler: handler.to_string(),
            effect: effect.to_string(),
        };
        let settled = self.core.handlers.journal.settle(id, settlement).await?;
        tracing::info!(module = %self.name(), %message_id, handler, effect, state = %settled.state, "effect settled");
        Ok(settled)
    }
}
