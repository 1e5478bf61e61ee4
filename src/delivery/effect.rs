//! [`Delivery::effect`]: one external call, made through the module's
//! effects journal.

use crate::delivery::handler::{Delivery, HandlerError};
use crate::effects::journal::{Begun, Finished};
use crate::effects::policy::EffectPolicy;
use crate::effects::scope::effect_key;
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
    /// (an effect nobody can vouch for: [`EffectState::Unknown`](crate::EffectState::Unknown)) is a
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
        let refused = |reason: String| HandlerError::permanent(HandlerError::msg(reason));
        let handler = &self.handler;
        if name.trim().is_empty() {
            return Err(refused(format!(
                "handler `{handler}`: an effect needs a name"
            )));
        }
        if matches!(policy, EffectPolicy::AtLeastOnceWithKey { window } if window.is_zero()) {
            return Err(refused(format!(
                "handler `{handler}`, effect `{name}`: the key's window must be above zero"
            )));
        }
        let scope = &self.effects;
        if !scope.first_use(name) {
            return Err(refused(format!(
                "handler `{handler}` used effect name `{name}` twice for message {}: each effect \
                 of a delivery needs its own name (the name is half of the effect's journal key)",
                self.envelope.id
            )));
        }
        let id = EffectId {
            message_id: self.envelope.id,
            handler: handler.to_string(),
            effect: name.to_string(),
        };
        let key = effect_key(self.envelope.id, handler, name);
        let calls = match scope.journal.begin(id.clone(), key.clone(), policy).await? {
            Begun::Call { calls } => calls,
            Begun::Reuse(result) => {
                return serde_json::from_str(&result).map_err(|e| {
                    refused(format!(
                        "effect `{name}` succeeded before, but its recorded result ({result}) \
                         does not decode as the type the handler now expects: {e}"
                    ))
                })
            }
            Begun::Refuse(reason) => return Err(refused(reason)),
        };
        match call(key).await {
            Ok(value) => match serde_json::to_string(&value) {
                Ok(json) => {
                    let recorded = scope
                        .journal
                        .finish(id, calls, Finished::Succeeded(json))
                        .await?;
                    if !recorded {
                        tracing::warn!(handler = %handler, effect = name, message_id = %self.envelope.id, "an effect's outcome was not recorded: its journal entry was settled meanwhile");
                    }
                    Ok(value)
                }
                Err(e) => {
                    let why = format!("it returned a result that does not encode as JSON: {e}");
                    scope
                        .journal
                        .finish(id, calls, Finished::Unknown(why.clone()))
                        .await?;
                    Err(refused(format!("effect `{name}`: {why}")))
                }
            },
            Err(error) => {
                let error: HandlerError = error.into();
                let ended = Finished::Failed(error.to_string());
                scope.journal.finish(id, calls, ended).await?;
                Err(error)
            }
        }
    }
}
