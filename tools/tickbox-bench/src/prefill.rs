//! Bulk loading: outbox rows for the backlog scenario, inbox rows for the
//! big-inbox scenario, written with set-based SQL while no bus runs.

use crate::backend::BenchBackend;
use crate::measure::now_us;
use crate::place::Place;
use crate::Res;
use std::time::Instant;
use tickbox::ModuleHandle;

/// Prefill statements insert this many rows each (one transaction each).
const PREFILL_CHUNK: u64 = 1_000_000;

/// Runs set-based prefill SQL (`sql(lo, hi, base_ms)`) for `rows` rows in
/// chunks, each in its own transaction. Returns the seconds it took.
pub(crate) async fn prefill<B: BenchBackend>(
    module: &ModuleHandle<B>,
    rows: u64,
    sql: fn(u64, u64, i64) -> String,
    what: &str,
) -> Res<f64> {
    let base_ms = now_us() / 1000 - 3_600_000 - (rows / 10) as i64;
    prefill_from(module, rows, sql, what, base_ms).await
}

/// [`prefill`] with ids (and times) from `base_ms` (ms since the Unix
/// epoch) on, a thousand rows a millisecond.
pub(crate) async fn prefill_from<B: BenchBackend>(
    module: &ModuleHandle<B>,
    rows: u64,
    sql: fn(u64, u64, i64) -> String,
    what: &str,
    base_ms: i64,
) -> Res<f64> {
    let started = Instant::now();
    let mut lo = 0;
    while lo < rows {
        let hi = (lo + PREFILL_CHUNK).min(rows);
        let statement = sql(lo, hi, base_ms);
        module
            .transaction(async move |tx| {
                B::batch(tx.conn(), &statement).await?;
                Ok::<_, tickbox::Error>(())
            })
            .await?;
        eprintln!(
            "  {what}: {hi} rows ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
        lo = hi;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Makes the prefilled tables look like production's (statistics,
/// checkpoint), outside any transaction (VACUUM, CHECKPOINT, SQLite
/// checkpoint).
pub(crate) async fn after_prefill<B: BenchBackend>(
    place: &Place,
    module: &ModuleHandle<B>,
) -> Res<()> {
    let pool = B::raw_pool(place, module.name(), 1)?;
    let mut conn = B::raw_get(&pool).await?;
    // One statement at a time: PostgreSQL runs a multi-statement string as
    // one transaction, where VACUUM is refused.
    for statement in B::AFTER_PREFILL.split(';').filter(|s| !s.trim().is_empty()) {
        B::batch(&mut conn, statement).await?;
    }
    Ok(())
}
