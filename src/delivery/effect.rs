//! [`Delivery::effect`]: one external call, made through the module's
//! effects journal.

use crate::delivery::handler::{Delivery, HandlerError};
use crate::effects::journal::Begun;
use crate::effects::policy::EffectPolicy;
use crate::effects::scope::effect_key;
use crate::effects::state::EffectState;
use crate::store::journal::EffectId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;

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
    /// cannot be written before the call is a transient error, and `call`
    /// is not run; one that cannot be written after it is a transient error
    /// too, though the call happened: the entry stays started, and the next
    /// delivery does what `policy` says of an effect cut short.
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
        if !scope.first_use(name) {
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
