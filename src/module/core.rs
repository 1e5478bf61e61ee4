//! A module's parts, shared by its actor, its handle and the bus.

use crate::delivery::registry::Handlers;
use crate::error::Error;
use crate::message::now_us;
use crate::metrics::Mailbox;
use crate::outbox::subscription;
use crate::outbox::Outbox;
use crate::retention::Retention;
use crate::store::backend::Backend;
use crate::store::database::Database;
use std::sync::Arc;
use std::time::Duration;

/// A module: its database, its outbox, its handlers. Each layer takes only
/// the part it works on.
pub(crate) struct ModuleCore<B: Backend> {
    /// The module's name.
    pub(crate) name: Arc<str>,
    /// Its database's connections.
    pub(crate) db: Arc<Database<B>>,
    /// Its outbox, as this process sees it.
    pub(crate) outbox: Arc<Outbox>,
    /// Its handlers, with what their deliveries run on.
    pub(crate) handlers: Arc<Handlers<B>>,
    /// How long processed inbox rows and delivered outbox rows are kept.
    pub(crate) retention: Retention,
    /// The actor's mailbox counters.
    pub(crate) mailbox: Mailbox,
}

/// Reads the outbox gauges now and every `interval` for as long as the
/// module exists, whether or not a bus runs (a stopped bus shows as lag).
pub(crate) async fn sample_outbox_periodically<B: Backend>(
    core: std::sync::Weak<ModuleCore<B>>,
    interval: Duration,
) {
    while let Some(core) = core.upgrade() {
        sample_outbox(core).await;
        tokio::time::sleep(interval).await;
    }
}

/// Reads the outbox backlog, the dead-letter count and each handler's
/// parked keys and unknown effects into the module's gauges.
async fn sample_outbox<B: Backend>(core: Arc<ModuleCore<B>>) {
    let sampled = async {
        let (backlog, dead, parked) = core
            .db
            .call("reading the outbox gauges", async |conn| {
                let backlog = B::outbox_backlog(conn, core.outbox.clock.now_us()).await?;
                let dead = B::count_dead_letters(conn).await?;
                let parked = B::parked_keys(conn).await?;
                Ok((backlog, dead, parked))
            })
            .await?;
        // Only handlers make effects: a module without them reads no journal
        // (another process's handlers may have made one beside its file).
        let unknown = if core.handlers.entries.is_empty() {
            Vec::new()
        } else {
            core.handlers.journal.unknown_per_handler().await?
        };
        for entry in &core.handlers.entries {
            let keys = parked
                .iter()
                .find(|p| p.handler == *entry.name)
                .map_or(0, |p| p.keys);
            entry.counters.parked_keys(keys);
            let effects = unknown
                .iter()
                .find(|(handler, _)| *handler == *entry.name)
                .map_or(0, |(_, n)| *n);
            entry.counters.unknown_effects(effects);
        }
        let now = now_us();
        core.outbox.gauges.sampled(&backlog, dead, now);
        let subscriptions = subscription::read(&core.db).await?;
        core.outbox.gauges.subscriptions_sampled(subscriptions, now);
        Ok::<_, Error>(())
    };
    if let Err(error) = sampled.await {
        tracing::debug!(module = %core.name, %error, "reading outbox gauges failed");
    }
}
