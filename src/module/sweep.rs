//! The retention sweep of a module's database: processed inbox rows and
//! delivered outbox rows older than its [`Retention`](crate::Retention).

use crate::delivery::handler::BoxFuture;
use crate::error::Result;
use crate::message::now_us;
use crate::module::handle::ModuleHandle;
use crate::outbox::subscription::clear_done;
use crate::retention::SweepReport;
use crate::store::backend::Backend;
use std::sync::Arc;
use uuid::Uuid;

/// Rows deleted per statement: small, so a sweep never holds a lock long.
const BATCH: i64 = 500;

impl<B: Backend> ModuleHandle<B> {
    /// Runs the retention sweep once: deletes inbox rows, settled effects
    /// and delivered outbox rows older than the module's retention, in small
    /// batches.
    pub async fn sweep_retention(&self) -> Result<SweepReport> {
        let retention = &self.core.retention;
        let mut report = SweepReport::default();
        if let Some(window) = retention.inbox {
            let before = now_us().saturating_sub(window.as_micros().min(i64::MAX as u128) as i64);
            report.inbox_rows = self
                .sweep_in_batches(|conn| Box::pin(B::sweep_inbox(conn, before, BATCH)))
                .await?;
            let mut conn = self.connection().await?;
            let dead_lettered: Arc<[Uuid]> = B::dead_letter_ids(&mut conn).await?.into();
            drop(conn);
            report.effect_rows = self
                .core
                .handlers
                .journal
                .sweep(before, dead_lettered, BATCH)
                .await?;
        }
        if let Some(window) = retention.outbox {
            let before = now_us().saturating_sub(window.as_micros().min(i64::MAX as u128) as i64);
            report.outbox_rows = self
                .sweep_in_batches(|conn| Box::pin(B::sweep_outbox(conn, before, BATCH)))
                .await?;
        }
        // What subscriptions recorded done with messages since delivered.
        let mut conn = self.write_connection().await?;
        B::execute(&mut conn, clear_done(B::DIALECT)).await?;
        drop(conn);
        if report != SweepReport::default() {
            tracing::info!(module = %self.name(), inbox_rows = report.inbox_rows, outbox_rows = report.outbox_rows, effect_rows = report.effect_rows, "retention sweep");
        }
        Ok(report)
    }

    /// Repeats one batch delete until a batch deletes less than a full
    /// batch, yielding between batches.
    async fn sweep_in_batches<F>(&self, mut batch: F) -> Result<u64>
    where
        F: for<'c> FnMut(&'c mut B::Connection) -> BoxFuture<'c, diesel::QueryResult<usize>>,
    {
        let mut total = 0;
        loop {
            let deleted = {
                let mut conn = self.write_connection().await?;
                batch(&mut conn).await?
            };
            total += deleted as u64;
            if (deleted as i64) < BATCH {
                return Ok(total);
            }
            tokio::task::yield_now().await;
        }
    }
}
