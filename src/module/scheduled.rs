//! Scheduled messages as an operator sees them: the work behind
//! [`ModuleHandle::scheduled`], [`ModuleHandle::scheduled_message`] and
//! [`ModuleHandle::cancel_scheduled`].

use crate::error::Result;
use crate::module::handle::ModuleHandle;
use crate::store::backend::Backend;
use crate::store::outbox::ScheduledRow;
use serde::Serialize;
use uuid::Uuid;

/// A scheduled message waiting in its module's outbox
/// ([`Tx::publish_at`](crate::Tx::publish_at)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Scheduled {
    /// The message's id (a UUIDv7 whose time is its due time).
    pub message_id: Uuid,
    /// Its topic.
    pub topic: String,
    /// The message encoded as JSON.
    pub payload: String,
    /// The flow it belongs to.
    pub correlation_id: Uuid,
    /// The message whose handler published it, if any.
    pub causation_id: Option<Uuid>,
    /// When its transaction committed (µs since the Unix epoch).
    pub created_at_us: i64,
    /// When it is due (µs since the Unix epoch).
    pub due_at_us: i64,
    /// Its ordering key, if it has one: it is numbered in it when due.
    pub ordering_key: Option<String>,
    /// Whether a bus has taken it for delivery (it was due then): it can
    /// no longer be cancelled.
    pub taken: bool,
}

impl From<ScheduledRow> for Scheduled {
    fn from(row: ScheduledRow) -> Self {
        Scheduled {
            message_id: row.id.0,
            topic: row.topic,
            payload: row.payload,
            correlation_id: row.correlation_id.0,
            causation_id: row.causation_id.map(|id| id.0),
            created_at_us: row.created_at_us,
            due_at_us: row.due_at_us,
            ordering_key: row.ordering_key,
            taken: row.claimed_by.is_some(),
        }
    }
}

/// The work behind [`ModuleHandle::scheduled`].
pub(crate) async fn list<B: Backend>(
    module: &ModuleHandle<B>,
    offset: u64,
    limit: u64,
) -> Result<Vec<Scheduled>> {
    let (offset, limit) = (clamp(offset), clamp(limit));
    let now = module.outbox().clock.now_us();
    let rows = module
        .db()
        .call("listing scheduled messages", async move |conn| {
            Ok(B::scheduled_messages(conn, now, offset, limit).await?)
        })
        .await?;
    Ok(rows.into_iter().map(Scheduled::from).collect())
}

/// The work behind [`ModuleHandle::scheduled_message`].
pub(crate) async fn find<B: Backend>(
    module: &ModuleHandle<B>,
    id: Uuid,
) -> Result<Option<Scheduled>> {
    let row = module
        .db()
        .call("reading a scheduled message", async move |conn| {
            Ok(B::scheduled_message(conn, id).await?)
        })
        .await?;
    Ok(row.map(Scheduled::from))
}

/// The work behind [`ModuleHandle::cancel_scheduled`].
pub(crate) async fn cancel<B: Backend>(module: &ModuleHandle<B>, id: Uuid) -> Result<bool> {
    let cancelled = module
        .transaction(async move |tx| tx.cancel_scheduled(id).await)
        .await?;
    if cancelled {
        tracing::info!(module = %module.name(), message_id = %id, "scheduled message cancelled");
    }
    Ok(cancelled)
}

/// A count as the statements take it.
fn clamp(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
