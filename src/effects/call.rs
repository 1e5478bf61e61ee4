//! [`Delivery::effect`]: one external call, journaled.

use crate::delivery::handler::{BoxFuture, Delivery, HandlerError};
use crate::effects::journal::{Begun, Journal};
use crate::effects::policy::EffectPolicy;
use crate::effects::state::EffectState;
use crate::error::Result;
use crate::store::backend::Backend;
use crate::store::journal::EffectId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::HashSet;
use std::future::Future;
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
    fn finish(
        &self,
        id: EffectId,
        calls: i64,
        state: EffectState,
        result: Option<String>,
        error: Option<String>,
    ) -> BoxFuture<'_, Result<bool>>;
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

    fn finish(
        &self,
        id: EffectId,
        calls: i64,
        state: EffectState,
        result: Option<String>,
        error: Option<String>,
    ) -> BoxFuture<'_, Result<bool>> {
        Box::pin(Journal::finish(self, id, calls, state, result, error))
    }
}

/// What one delivery's effects share: the module's journal, and the names
/// used so far (each effect of a delivery needs its own).
pub(crate) struct EffectScope {
    /// The module's journal.
    journal: Arc<dyn EffectJournal>,
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
}

impl std::fmt::Debug for EffectScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("EffectScope").field("used", &*used).finish()
    }
}

impl Delivery {
    /// Makes an external call (an e-mail, a payment, an HTTP request)
    /// through the module's effects journal, so that a redelivered message
    /// does not repeat it blindly.
    ///
    /// The database work of a handler is effectively once thanks to the
    /// inbox, but an external call is not part of the transaction: a crash
    /// after the call and before COMMIT would repeat it. Here the journal
    /// records the effect as started (committed in a short transaction of
    /// its own, before the call), then as succeeded with the call's result,
    /// or failed. A later delivery of the same message then:
    ///
    /// - finds it **succeeded**: gets the recorded result back, and `call`
    ///   is not run — even when the handler's own transaction never
    ///   committed;
    /// - finds it **started** without an outcome (a crash cut it short):
    ///   does what `policy` says ([`EffectPolicy`]): call again with the
    ///   same key, or refuse;
    /// - finds it **failed**: calls again (within the key's window, for
    ///   [`EffectPolicy::AtLeastOnceWithKey`]).
    ///
    /// `call` receives the effect's idempotency key: the same for every
    /// delivery of this message to this handler and this effect name, in
    /// every process, and different for any other. Pass it to the external
    /// system wherever it takes one (an `Idempotency-Key` header, an
    /// e-mail's `Message-ID`, a payment's key).
    ///
    /// `name` names the effect within the handler, like a handler's name
    /// within its module: keep it stable across releases. Each effect of one
    /// delivery needs its own name; using a name twice in one delivery is a
    /// permanent error.
    ///
    /// Errors: `call`'s error, recorded as failed, keeps its permanence
    /// (the handler's retry policy decides what follows). A refused call
    /// (an effect nobody can vouch for: [`EffectState::Unknown`]) is a
    /// permanent error, so the delivery is dead-lettered with the reason;
    /// a person settles the effect
    /// ([`ModuleHandle::settle_effect`](crate::ModuleHandle::settle_effect),
    /// or the operator's tool) and replays the dead letter. A journal that
    /// cannot be written is a transient error, and `call` is not run.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use serde::{Deserialize, Serialize};
    /// use tickbox::{Delivery, EffectPolicy, Handler, HandlerError, Message, Sqlite, Tx};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct OrderConfirmed { order_id: i64, email: String }
    /// impl Message for OrderConfirmed { const TOPIC: &'static str = "orders.order_confirmed"; }
    ///
    /// # async fn send_mail(_to: &str, _message_id: &str) -> Result<String, std::io::Error> { Ok("250 OK".into()) }
    /// struct SendConfirmation;
    ///
    /// impl Handler<Sqlite> for SendConfirmation {
    ///     type Message = OrderConfirmed;
    ///
    ///     async fn handle(
    ///         &self,
    ///         _tx: &mut Tx<Sqlite>,
    ///         order: OrderConfirmed,
    ///         delivery: &Delivery,
    ///     ) -> Result<(), HandlerError> {
    ///         // The mail server folds equal Message-IDs for a day.
    ///         let policy = EffectPolicy::at_least_once_with_key(Duration::from_secs(24 * 3600));
    ///         let reply: String = delivery
    ///             .effect("send_confirmation", policy, |key: String| async move {
    ///                 send_mail(&order.email, &format!("<{key}@shop.example>")).await
    ///             })
    ///             .await?;
    ///         tracing::info!(%reply, order_id = order.order_id, "confirmation sent");
    ///         Ok(())
    ///     }
    /// }
    /// ```
    pub async fn effect<T, E, F, Fut>(
        &self,
        name: &str,
        policy: EffectPolicy,
        call: F,
    ) -> Result<T, HandlerError>
    where
        T: Serialize + DeserializeOwned + Send,
        E: Into<HandlerError>,
        F: FnOnce(String) -> Fut + Send,
        Fut: Future<Output = Result<T, E>> + Send,
    {
        let scope = &self.effects;
        let id = EffectId {
            message_id: self.envelope.id,
            handler: self.handler.to_string(),
            effect: name.to_string(),
        };
        if name.trim().is_empty() {
            return Err(HandlerError::permanent(HandlerError::msg(format!(
                "handler `{}`: an effect needs a name",
                self.handler
            ))));
        }
        if let EffectPolicy::AtLeastOnceWithKey { window } = policy {
            if window.is_zero() {
                return Err(HandlerError::permanent(HandlerError::msg(format!(
                    "handler `{}`, effect `{name}`: the key's window must be above zero",
                    self.handler
                ))));
            }
        }
        let first_use = scope
            .used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(name.to_string());
        if !first_use {
            return Err(HandlerError::permanent(HandlerError::msg(format!(
                "handler `{}` used effect name `{name}` twice for message {}: each effect of a \
                 delivery needs its own name (the name is half of the effect's journal key)",
                self.handler, self.envelope.id
            ))));
        }
        let key = effect_key(self.envelope.id, &self.handler, name);
        let calls = match scope.journal.begin(id.clone(), key.clone(), policy).await? {
            Begun::Call { calls } => calls,
            Begun::Reuse(result) => {
                return serde_json::from_str(&result).map_err(|e| {
                    HandlerError::permanent(HandlerError::msg(format!(
                        "effect `{name}` succeeded before, but its recorded result ({result}) \
                         does not decode as the type the handler now expects: {e}"
                    )))
                })
            }
            Begun::Refuse(reason) => {
                return Err(HandlerError::permanent(HandlerError::msg(reason)));
            }
        };
        match call(key).await {
            Ok(value) => {
                let (state, result, error) = match serde_json::to_string(&value) {
                    Ok(json) => (EffectState::Succeeded, Some(json), None),
                    Err(e) => (
                        EffectState::Unknown,
                        None,
                        Some(format!(
                            "it returned a result that does not encode as JSON: {e}"
                        )),
                    ),
                };
                let recorded = scope
                    .journal
                    .finish(id, calls, state, result, error.clone())
                    .await?;
                if let Some(error) = error {
                    return Err(HandlerError::permanent(HandlerError::msg(format!(
                        "effect `{name}`: {error}"
                    ))));
                }
                if !recorded {
                    tracing::warn!(handler = %self.handler, effect = name, message_id = %self.envelope.id, "an effect's outcome was not recorded: its journal entry was settled meanwhile");
                }
                Ok(value)
            }
            Err(error) => {
                let error: HandlerError = error.into();
                scope
                    .journal
                    .finish(
                        id,
                        calls,
                        EffectState::Failed,
                        None,
                        Some(error.to_string()),
                    )
                    .await?;
                Err(error)
            }
        }
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
