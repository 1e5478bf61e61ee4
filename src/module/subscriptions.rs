//! Retiring a subscription from a module's outbox.
//!
//! Holds the work behind
//! [`ModuleHandle::retire_subscription`](crate::ModuleHandle::retire_subscription),
//! which calls [`retire`].

use crate::error::{Error, Result};
use crate::message::now_us;
use crate::module::core::ModuleCore;
use crate::outbox::subscription::{read, subscription_id};
use crate::store::backend::Backend;
use crate::store::outbox::Owed;
use std::time::Duration;

/// The work behind
/// [`ModuleHandle::retire_subscription`](crate::ModuleHandle::retire_subscription):
/// retires the subscription of handler `handler` of module `module` from
/// the outbox of the module whose parts are `core`.
pub(crate) async fn retire<B: Backend>(
    core: &ModuleCore<B>,
    module: &str,
    handler: &str,
) -> Result<usize> {
    let now = now_us();
    let recorded = read(&core.db).await?;
    let Some(subscription) = recorded
        .iter()
        .find(|s| s.module == module && s.handler == handler)
    else {
        return Err(Error::NoSuchSubscription {
            outbox: core.name.to_string(),
            module: module.to_string(),
            handler: handler.to_string(),
        });
    };
    if subscription.is_alive(now) {
        return Err(Error::SubscriptionInUse {
            module: module.to_string(),
            handler: handler.to_string(),
            seen_seconds: now.saturating_sub(subscription.seen_at_us) / 1_000_000,
        });
    }
    let delete = core.retention.outbox == Some(Duration::ZERO);
    let id = subscription_id(module, handler);
    let finished = core
        .db
        .write_call("retiring a subscription", async |conn| {
            B::retire(conn, id).await?;
            let owed = Owed::Topic(&subscription.topic);
            let finished = B::finish_completed(conn, owed, now, delete).await?;
            B::clear_done(conn).await?;
            Ok(finished)
        })
        .await?;
    tracing::info!(outbox = %core.name, module, handler, finished, "subscription retired");
    Ok(finished)
}
