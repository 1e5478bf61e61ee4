//! What one delivery's effects share: the module's journal (its backend
//! erased) and the names used so far; and each effect's idempotency key.

use crate::effects::journal::{Begun, Finished, Journal};
use crate::effects::policy::EffectPolicy;
use crate::error::Result;
use crate::store::backend::Backend;
use crate::store::journal::EffectId;
use futures_util::future::BoxFuture;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use uuid::Uuid;

/// The namespace of effect keys (UUIDv5): fixed, so every process and
/// release derives the same key for the same effect.
const KEY_NAMESPACE: Uuid = Uuid::from_u128(0x5b1f_0c3e_8a0d_4d6e_9c1a_2f7e_4b8d_9a10);

/// The idempotency key of effect `effect` of `handler` for message
/// `message_id`: a UUIDv5 of the three, the same on every delivery and in
/// every process.
pub(crate) fn effect_key(message_id: Uuid, handler: &str, effect: &str) -> String {
    let name = format!("{message_id}:{handler}:{effect}");
    Uuid::new_v5(&KEY_NAMESPACE, name.as_bytes()).to_string()
}

/// The journal, with its backend erased, as a delivery reaches it.
pub(crate) trait EffectJournal: Send + Sync {
    /// See [`Journal::begin`].
    fn begin(
        &self,
        id: EffectId,
        key: String,
        policy: EffectPolicy,
    ) -> BoxFuture<'_, Result<Begun>>;

    /// See [`Journal::finish`].
    fn finish(&self, id: EffectId, calls: i64, ended: Finished) -> BoxFuture<'_, Result<bool>>;
}

impl<B: Backend> EffectJournal for Journal<B> {
    fn begin(
        &self,
        id: EffectId,
        key: String,
        policy: EffectPolicy,
    ) -> BoxFuture<'_, Result<Begun>> {
        Box::pin(Journal::begin(self, id, key, policy))
    }

    fn finish(&self, id: EffectId, calls: i64, ended: Finished) -> BoxFuture<'_, Result<bool>> {
        Box::pin(Journal::finish(self, id, calls, ended))
    }
}

/// What one delivery's effects share: the module's journal, and the names
/// used so far (each effect of a delivery needs its own).
pub(crate) struct EffectScope {
    /// The module's journal.
    pub(crate) journal: Arc<dyn EffectJournal>,
    /// The effect names this delivery has used.
    used: Mutex<HashSet<String>>,
}

impl EffectScope {
    /// A new delivery's scope, on `journal`.
    pub(crate) fn new(journal: Arc<dyn EffectJournal>) -> Arc<Self> {
        Arc::new(EffectScope {
            journal,
            used: Mutex::new(HashSet::new()),
        })
    }

    /// Records that this delivery uses effect `name`; false if it did
    /// before.
    pub(crate) fn first_use(&self, name: &str) -> bool {
        self.used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string())
    }
}

impl std::fmt::Debug for EffectScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("EffectScope").field("used", &*used).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_effect_key_is_the_same_for_the_same_effect_and_differs_for_any_other() {
        let id = Uuid::from_u128(7);
        let key = effect_key(id, "notifications.send", "mail");
        assert_eq!(key, effect_key(id, "notifications.send", "mail"));
        assert_ne!(
            key,
            effect_key(Uuid::from_u128(8), "notifications.send", "mail")
        );
        assert_ne!(key, effect_key(id, "notifications.other", "mail"));
        assert_ne!(key, effect_key(id, "notifications.send", "sms"));
        // Fixed by its definition: a release that derived another key would
        // send every unfinished effect again under a key nobody has seen.
        assert_eq!(
            key,
            Uuid::new_v5(
                &KEY_NAMESPACE,
                format!("{id}:notifications.send:mail").as_bytes()
            )
            .to_string()
        );
        assert_eq!(Uuid::parse_str(&key).map(|k| k.get_version_num()), Ok(5));
    }
}
