//! A batched handler: with `HandlerOptions::batch(n)`, the deliveries
//! waiting for a handler run in one transaction, up to `n` of them, each
//! with its own inbox row, and commit with one COMMIT instead of one each.
//!
//! A `sensors` module publishes 2,000 readings, 200 per transaction; the
//! `stats` module adds each reading to its sensor's total, batched by up to
//! 100. A lone message never waits to fill a batch, and a batch in which
//! one message fails rolls back and runs one message per transaction, so
//! the handler is written as if it ran alone. The databases live in a
//! temporary directory.
//!
//! Run it with `cargo run --example batched_handler`.

use diesel::ExpressionMethods;
use diesel_migrations::{embed_migrations, EmbeddedMigrations};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tickbox::diesel_async::RunQueryDsl;
use tickbox::{Bus, Delivery, Handler, HandlerError, HandlerOptions, Message, Module, Sqlite, Tx};

#[derive(Serialize, Deserialize)]
struct Reading {
    sensor: String,
    value: i64,
}
impl Message for Reading {
    const TOPIC: &'static str = "sensors.reading";
}

// The stats module's table: one running total per sensor, made by its
// migrations when the module starts.
const STATS_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/batched_handler/migrations/stats");
diesel::table! {
    totals (sensor) {
        sensor -> Text,
        readings -> BigInt,
        sum -> BigInt,
    }
}

/// Adds a reading to its sensor's total. In a batch, the same transaction
/// also holds the other readings' changes (several may update one row);
/// the inbox still records each message once.
struct AddReading;
impl Handler<Sqlite> for AddReading {
    type Message = Reading;
    async fn handle(
        &self,
        tx: &mut Tx<Sqlite>,
        reading: Reading,
        _delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        use totals::dsl::{readings, sensor, sum};
        diesel::insert_into(totals::table)
            .values((
                sensor.eq(reading.sensor),
                readings.eq(1),
                sum.eq(reading.value),
            ))
            .on_conflict(sensor)
            .do_update()
            .set((readings.eq(readings + 1), sum.eq(sum + reading.value)))
            .execute(tx.conn())
            .await?;
        Ok(())
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let path = |name: &str| dir.path().join(name).display().to_string();
    let sensors = Module::<Sqlite>::builder("sensors", path("sensors.db"))
        .publishes::<Reading>()
        .start()
        .await?;
    let stats = Module::<Sqlite>::builder("stats", path("stats.db"))
        .migrations(&STATS_MIGRATIONS)
        .handler_with(
            "stats.add_reading",
            AddReading,
            HandlerOptions::new().batch(100),
        )
        .start()
        .await?;
    let bus = Bus::builder()
        .module(&sensors)
        .module(&stats)
        .start()
        .await?;

    // 200 readings per transaction: they commit together, and wait for the
    // handler together.
    for round in 0..10 {
        sensors
            .transaction(async move |tx| {
                for i in 0..200 {
                    let sensor = format!("sensor-{}", i % 4);
                    tx.publish(&Reading {
                        sensor,
                        value: round * 200 + i,
                    })?;
                }
                Ok::<_, tickbox::Error>(())
            })
            .await?;
    }

    let idle = bus.wait_idle(Duration::from_secs(60)).await?;
    bus.stop().await;
    let handler = &bus.metrics().modules[1].handlers[0];
    let rows: Vec<(String, i64, i64)> = stats
        .read(async |tx| Ok::<_, tickbox::Error>(totals::table.load(tx.conn()).await?))
        .await?;
    for (sensor, readings, sum) in &rows {
        println!("{sensor}: {readings} readings, sum {sum}");
    }
    println!(
        "{} readings handled in {} batches of several (the rest alone); {} fallbacks",
        handler.handled, handler.batches, handler.batch_fallbacks
    );
    let counted: i64 = rows.iter().map(|(_, readings, _)| readings).sum();
    if !idle || counted != 2000 {
        return Err(format!("expected 2000 readings, counted {counted}").into());
    }
    Ok(())
}
