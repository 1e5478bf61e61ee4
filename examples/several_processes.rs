//! Several processes over one set of databases: every handler, in whichever
//! process, receives every message of its topic.
//!
//! This program starts itself twice more, as a `warehouse` and a
//! `notifications` process: each opens the orders database (whose outbox
//! its bus delivers from) and its own, with one handler on `OrderPlaced`.
//! The first process places orders once both handlers have subscribed (a
//! message committed while nobody subscribes to its topic reaches no one),
//! and each worker exits once it has recorded every order.
//!
//! Run it with `cargo run --example several_processes`.

use diesel::ExpressionMethods;
use diesel_migrations::{embed_migrations, EmbeddedMigrations};
use serde::{Deserialize, Serialize};
use std::process::Command;
use std::time::{Duration, Instant};
use tickbox::diesel_async::RunQueryDsl;
use tickbox::{Bus, Delivery, Handler, HandlerError, Message, Module, ModuleBuilder, Sqlite, Tx};

const ORDERS: i64 = 50;
const WORKERS: [&str; 2] = ["warehouse", "notifications"];

#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    order_id: i64,
}
impl Message for OrderPlaced {
    const TOPIC: &'static str = "orders.order_placed";
}

// Each worker module's own table, made by its migrations when it starts.
const WORKER_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/several_processes/migrations/worker");
diesel::table! {
    recorded (order_id) {
        order_id -> BigInt,
    }
}

struct RecordOrder;
impl Handler<Sqlite> for RecordOrder {
    type Message = OrderPlaced;
    async fn handle(
        &self,
        tx: &mut Tx<Sqlite>,
        order: OrderPlaced,
        _delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        diesel::insert_into(recorded::table)
            .values(recorded::order_id.eq(order.order_id))
            .execute(tx.conn())
            .await?;
        Ok(())
    }
}

/// The orders module, which publishes `OrderPlaced`.
fn orders() -> ModuleBuilder<Sqlite> {
    Module::builder("orders", "orders.db").publishes::<OrderPlaced>()
}

/// Polls `done` every 50 ms, for at most a minute.
async fn wait_for<F: AsyncFnMut() -> tickbox::Result<bool>>(what: &str, mut done: F) -> Result {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done().await? {
        if Instant::now() > deadline {
            return Err(format!("{what} within a minute").into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

#[actix::main]
async fn main() -> Result {
    match std::env::args().nth(1) {
        Some(name) => worker(&name).await,
        None => place_orders().await,
    }
}

/// The first process: starts the workers, waits for their subscriptions,
/// places the orders, waits for the workers to finish. It runs no bus.
async fn place_orders() -> Result {
    // The databases, in a temporary directory: this process's and the
    // workers' current directory.
    let dir = tempfile::tempdir()?;
    std::env::set_current_dir(dir.path())?;
    let orders = orders().start().await?;
    let mut workers = Vec::new();
    for name in WORKERS {
        workers.push(Command::new(std::env::current_exe()?).arg(name).spawn()?);
    }
    // Each worker's bus records its handler's subscription in the orders
    // database when it starts.
    let subscribed = async || Ok(orders.subscriptions().await?.len() == WORKERS.len());
    wait_for("the workers did not subscribe", subscribed).await?;
    for order_id in 1..=ORDERS {
        orders
            .transaction(async move |tx| tx.publish(&OrderPlaced { order_id }).map(drop))
            .await?;
    }
    println!("orders: placed {ORDERS} orders");
    for mut worker in workers {
        if !worker.wait()?.success() {
            return Err("a worker failed".into());
        }
    }
    Ok(())
}

/// A worker process: its module with its one handler, and the orders
/// module, whose outbox its bus delivers from.
async fn worker(name: &str) -> Result {
    let orders = orders().start().await?;
    let own = Module::<Sqlite>::builder(name, format!("{name}.db"))
        .migrations(&WORKER_MIGRATIONS)
        .handler(format!("{name}.record_order"), RecordOrder)
        .start()
        .await?;
    // SQLite has no notifications: the bus finds other processes' commits
    // by scanning the outbox, here every 100 ms (2 s by default).
    let bus = Bus::builder()
        .module(&orders)
        .module(&own)
        .scan_interval(Duration::from_millis(100))
        .start()
        .await?;
    // This process's handler counts the orders it has handled.
    let all_handled = async || Ok(bus.metrics().total(|h| h.handled) == ORDERS as u64);
    wait_for(&format!("{name}: not every order arrived"), all_handled).await?;
    bus.stop().await;
    println!("{name}: recorded all {ORDERS} orders");
    Ok(())
}
