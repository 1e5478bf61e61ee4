//! A module's subscriptions, as application code and operators see them.

use crate::error::{Error, Result};
use crate::message::now_us;
use crate::module::handle::ModuleHandle;
use crate::outbox::subscription::{read, subscription_id};
use crate::store::backend::Backend;
use crate::store::outbox::Owed;
use crate::store::subscriptions::Subscription;
use std::time::Duration;

impl<B: Backend> ModuleHandle<B> {
    /// The subscriptions recorded in this module's outbox: every handler, in
    /// any process, that receives its messages, and the oldest message each
    /// still owes.
    ///
    /// A subscription stays when its process stops, and its messages wait
    /// for it (they are delivered when it runs again). One whose handler is
    /// gone for good is retired with
    /// [`ModuleHandle::retire_subscription`].
    pub async fn subscriptions(&self) -> Result<Vec<Subscription>> {
        read(&self.core.db).await
    }

    /// Retires the subscription of handler `handler` of module `module` from
    /// this module's outbox: its messages are no longer kept for it, and
    /// those only it still owed are marked delivered. Returns how many.
    ///
    /// For a handler removed from the code (or a process gone for good).
    /// Refused ([`Error::SubscriptionInUse`]) while a running process serves
    /// it; a process started later with the handler subscribes it again,
    /// from then on.
    pub async fn retire_subscription(&self, module: &str, handler: &str) -> Result<usize> {
        let now = now_us();
        let recorded = self.subscriptions().await?;
        let Some(subscription) = recorded
            .iter()
            .find(|s| s.module == module && s.handler == handler)
        else {
            return Err(Error::NoSuchSubscription {
                outbox: self.name().to_string(),
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
        let delete = self.core.retention.outbox == Some(Duration::ZERO);
        let id = subscription_id(module, handler);
        let finished = self
            .core
            .db
            .write_call("retiring a subscription", async |conn| {
                B::retire(conn, id).await?;
                let owed = Owed::Topic(&subscription.topic);
                let finished = B::finish_completed(conn, owed, now, delete).await?;
                B::clear_done(conn).await?;
                Ok(finished)
            })
            .await?;
        tracing::info!(outbox = %self.name(), module, handler, finished, "subscription retired");
        Ok(finished)
    }
}
