//! The retention sweep of a module's database: processed inbox rows and
//! delivered outbox rows older than its [`Retention`](crate::Retention).
//!
//! Holds the work behind
//! [`ModuleHandle::sweep_retention`](crate::ModuleHandle::sweep_retention),
//! which calls [`sweep`].

use crate::delivery::handler::BoxFuture;
use crate::error::Result;
use crate::message::now_us;
use crate::module::core::ModuleCore;
use crate::retention::SweepReport;
use crate::store::backend::Backend;
use crate::store::database::Database;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// Rows deleted per statement: small, so a sweep never holds a lock long.
const BATCH: i64 = 500;

/// The work behind
/// [`ModuleHandle::sweep_retention`](crate::ModuleHandle::sweep_retention):
/// sweeps the database of the module whose parts are `core`.
pub(crate) async fn sweep<B: Backend>(core: &ModuleCore<B>) -> Result<SweepReport> {
    let retention = &core.retention;
    let db = &core.db;
    let mut report = SweepReport::default();
    if let Some(before) = retention.inbox.map(cutoff) {
        report.inbox_rows =
            in_batches(db, |conn| Box::pin(B::sweep_inbox(conn, before, BATCH))).await?;
        if let Some(journal) = core.handlers.journal.open().await? {
            let dead_lettered: Arc<[Uuid]> = db
                .call("listing dead letters", async |conn| {
                    Ok(B::dead_letter_ids(conn).await?)
                })
                .await?
                .into();
            report.effect_rows = in_batches(&journal, |conn| {
                let keep = dead_lettered.clone();
                Box::pin(async move { B::sweep_effects(conn, before, &keep, BATCH).await })
            })
            .await?;
        }
    }
    if let Some(before) = retention.outbox.map(cutoff) {
        report.outbox_rows =
            in_batches(db, |conn| Box::pin(B::sweep_outbox(conn, before, BATCH))).await?;
    }
    // What subscriptions recorded done with messages since delivered.
    db.write_call("clearing subscriptions' done records", async |conn| {
        Ok(B::clear_done(conn).await?)
    })
    .await?;
    if report != SweepReport::default() {
        tracing::info!(module = %core.name, inbox_rows = report.inbox_rows, outbox_rows = report.outbox_rows, effect_rows = report.effect_rows, "retention sweep");
    }
    Ok(report)
}

/// The time a retention window ends: rows done with before it go.
fn cutoff(window: Duration) -> i64 {
    now_us().saturating_sub(window.as_micros().min(i64::MAX as u128) as i64)
}

/// Repeats one batch delete on `db` until a batch deletes less than a full
/// batch, yielding between batches.
async fn in_batches<B: Backend, F>(db: &Database<B>, mut batch: F) -> Result<u64>
where
    F: for<'c> FnMut(&'c mut B::Connection) -> BoxFuture<'c, diesel::QueryResult<usize>> + Send,
{
    let mut total = 0;
    loop {
        let deleted = db
            .write_call("a retention sweep's batch", async |conn| {
                Ok(batch(conn).await?)
            })
            .await?;
        total += deleted as u64;
        if (deleted as i64) < BATCH {
            return Ok(total);
        }
        tokio::task::yield_now().await;
    }
}
