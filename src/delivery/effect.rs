//! One external call, made through the module's effects journal: the work
//! behind [`Delivery::effect`], which calls [`run`].

use crate::delivery::handler::{Delivery, HandlerError};
use crate::effects::journal::{Begun, Finished};
use crate::effects::policy::EffectPolicy;
use crate::effects::scope::effect_key;
use crate::store::journal::EffectId;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::future::Future;

/// The work behind [`Delivery::effect`], which calls it for `delivery`.
pub(crate) async fn run<T, E, Fut>(
    delivery: &Delivery,
    name: &str,
    policy: EffectPolicy,
    call: impl FnOnce(String) -> Fut,
) -> Result<T, HandlerError>
where
    T: Serialize + DeserializeOwned,
    E: Into<HandlerError>,
    Fut: Future<Output = Result<T, E>>,
{
    let refused = |reason: String| HandlerError::permanent(HandlerError::msg(reason));
    let handler = &delivery.handler;
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
    let scope = &delivery.effects;
    if !scope.first_use(name) {
        return Err(refused(format!(
            "handler `{handler}` used effect name `{name}` twice for message {}: each effect \
             of a delivery needs its own name (the name is half of the effect's journal key)",
            delivery.envelope.id
        )));
    }
    let id = EffectId {
        message_id: delivery.envelope.id,
        handler: handler.to_string(),
        effect: name.to_string(),
    };
    let key = effect_key(delivery.envelope.id, handler, name);
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
                    tracing::warn!(handler = %handler, effect = name, message_id = %delivery.envelope.id, "an effect's outcome was not recorded: its journal entry was settled meanwhile");
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
