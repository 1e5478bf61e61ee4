//! Subscriptions: which handlers, in any process, subscribe to an outbox's
//! topics, recorded in the outbox's own database where every process sees
//! them, and how a shared outbox is delivered by them (the statements are
//! [`SubscriptionStatements`](crate::store::subscriptions::SubscriptionStatements)
//! and [`OutboxStatements`](crate::store::outbox::OutboxStatements)).
//!
//! A pending message is owed to every subscription of its topic. A bus
//! finishes a message (marks it delivered, or deletes it) only if no
//! subscription it does not serve still owes it — checked inside the marking
//! statement itself, so a subscription recorded by another process a moment
//! earlier is never missed. When one is still owed, the bus records that its
//! own subscriptions are done with the message (`tickbox_outbox_done`) and
//! releases its claim; the bus serving the rest finishes it.
//!
//! A subscription's id is derived from `(module, handler)`, the same pair
//! that keys the inbox, so every process computes the same one.

use crate::error::{Error, Result};
use crate::store::backend::Backend;
use crate::store::database::Database;
use crate::store::outbox::ClaimedElsewhere;
use crate::store::schema::{Id, SubscriptionRow};
use crate::store::subscriptions::Subscription;
use std::sync::Arc;
use uuid::Uuid;

/// The namespace of subscription ids (UUIDv5).
const NAMESPACE: Uuid = Uuid::from_u128(0x7469_636b_626f_7800_8000_0000_0000_0001);

/// The id of the subscription of handler `handler` of module `module`.
pub(crate) fn subscription_id(module: &str, handler: &str) -> Uuid {
    let mut name = Vec::with_capacity(module.len() + handler.len() + 1);
    name.extend_from_slice(module.as_bytes());
    name.push(0);
    name.extend_from_slice(handler.as_bytes());
    Uuid::new_v5(&NAMESPACE, &name)
}

/// A subscription a bus serves: one of its handlers whose topic an outbox on
/// the bus publishes.
#[derive(Debug, Clone)]
pub(crate) struct Served {
    pub(crate) id: Uuid,
    pub(crate) module: Arc<str>,
    pub(crate) handler: Arc<str>,
    pub(crate) topic: &'static str,
}

impl Served {
    pub(crate) fn new(module: Arc<str>, handler: Arc<str>, topic: &'static str) -> Self {
        Served {
            id: subscription_id(&module, &handler),
            module,
            handler,
            topic,
        }
    }
}

/// Records in `outbox`'s database that these subscriptions are served by a
/// running bus until `alive_until_us`, and returns whether the outbox has
/// subscriptions this bus does not serve (other processes' handlers).
///
/// With `refuse_conflicts` (at bus start), a handler that a process still
/// running records on another topic is refused: two versions of one handler
/// would each miss the other's messages.
pub(crate) async fn record<B: Backend>(
    outbox: &Database<B>,
    served: &[Served],
    now_us: i64,
    alive_until_us: i64,
    refuse_conflicts: bool,
) -> Result<bool> {
    let outbox_module = outbox.module().to_string();
    let served: Vec<Served> = served.to_vec();
    outbox
        .write_call("recording subscriptions", async move |conn| {
            let recorded = B::subscriptions(conn).await?;
            if refuse_conflicts {
                for mine in &served {
                    let clash = recorded.iter().find(|r| {
                        r.id.0 == mine.id && r.topic != mine.topic && r.alive_until_us > now_us
                    });
                    if let Some(clash) = clash {
                        return Err(Error::SubscriptionConflict {
                            outbox: outbox_module,
                            module: mine.module.to_string(),
                            handler: mine.handler.to_string(),
                            topic: mine.topic.to_string(),
                            recorded: clash.topic.clone(),
                        });
                    }
                }
            }
            let rows = served
                .iter()
                .map(|s| SubscriptionRow {
                    id: Id(s.id),
                    module: s.module.to_string(),
                    handler: s.handler.to_string(),
                    topic: s.topic.to_string(),
                    subscribed_at_us: now_us,
                    seen_at_us: now_us,
                    alive_until_us,
                })
                .collect();
            B::record_subscriptions(conn, rows).await?;
            Ok(recorded
                .iter()
                .any(|r| !served.iter().any(|s| s.id == r.id.0)))
        })
        .await
}

/// The subscriptions recorded in `outbox`'s database, with the oldest
/// message each still owes.
pub(crate) async fn read<B: Backend>(outbox: &Database<B>) -> Result<Vec<Subscription>> {
    let (rows, oldest) = outbox
        .call("reading subscriptions", async |conn| {
            let rows = B::subscriptions(conn).await?;
            let oldest = B::oldest_owed(conn, crate::message::now_us()).await?;
            Ok((rows, oldest))
        })
        .await?;
    Ok(rows
        .into_iter()
        .map(|row| Subscription {
            oldest_pending_us: oldest
                .iter()
                .find(|o| o.id == row.id)
                .and_then(|o| o.oldest),
            module: row.module,
            handler: row.handler,
            topic: row.topic,
            subscribed_at_us: row.subscribed_at_us,
            seen_at_us: row.seen_at_us,
            alive_until_us: row.alive_until_us,
        })
        .collect())
}

/// Says, at a bus's start, what of `outbox` other buses' claims hold back
/// (a process that just crashed left them): otherwise a restarted process
/// would look idle while it waits.
pub(crate) async fn report_claimed_elsewhere<B: Backend>(
    outbox: &Database<B>,
    bus: Uuid,
    now_us: i64,
) -> Result<()> {
    let claimed = outbox
        .call("reading other buses' claims", async |conn| {
            Ok(B::claimed_elsewhere(conn, bus, now_us).await?)
        })
        .await?;
    if let ClaimedElsewhere {
        n,
        until_us: Some(until),
    } = claimed
    {
        if n > 0 {
            tracing::info!(
                module = %outbox.module(),
                messages = n,
                wait_seconds = until.saturating_sub(now_us) / 1_000_000,
                "messages of this outbox are claimed by another bus: they are delivered when it \
                 finishes them or when its claims expire (a crashed process's claims expire after \
                 their lease; a process restarted with the same BusBuilder::instance takes its own \
                 back at once)"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subscription_id_depends_on_module_and_handler_only() {
        let id = subscription_id("warehouse", "warehouse.reserve_stock");
        assert_eq!(id, subscription_id("warehouse", "warehouse.reserve_stock"));
        assert_ne!(id, subscription_id("warehouse", "warehouse.release_stock"));
        assert_ne!(id, subscription_id("journeys", "warehouse.reserve_stock"));
        // The separator keeps apart pairs whose concatenations agree.
        assert_ne!(subscription_id("ab", "c"), subscription_id("a", "bc"));
        assert_eq!(id.get_version_num(), 5);
    }
}
