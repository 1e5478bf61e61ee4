//! Quick start: two modules, each with its own SQLite database under
//! `data/` and its own table, made by its own migrations. Placing an order
//! publishes `OrderPlaced` in the order's own transaction; the bus delivers
//! it to the warehouse, whose handler reserves stock in a transaction that
//! also ticks the message off in the warehouse's inbox.
//!
//! Run it with `cargo run --example quick_start` (again and again: each run
//! places one more order).

use diesel::{ExpressionMethods, QueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tickbox::diesel_async::RunQueryDsl;
use tickbox::{Bus, Delivery, Handler, HandlerError, Message, Module, Sqlite, Tx};

#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    order_id: String,
}
impl Message for OrderPlaced {
    const TOPIC: &'static str = "orders.order_placed";
}

// The modules' own tables: orders in the orders database, reservations in
// the warehouse's. Each module's migrations create them when it starts (the
// paths are relative to the crate's root, and embedded when it compiles).
const ORDERS_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/quick_start/migrations/orders");
const WAREHOUSE_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/quick_start/migrations/warehouse");
diesel::table! {
    orders (id) {
        id -> Text,
    }
}
diesel::table! {
    reservations (order_id) {
        order_id -> Text,
    }
}

/// Runs inside a transaction on the warehouse's database that also records
/// (message id, "warehouse.reserve_stock") in its inbox: all or nothing.
struct ReserveStock;
impl Handler<Sqlite> for ReserveStock {
    type Message = OrderPlaced;
    async fn handle(
        &self,
        tx: &mut Tx<Sqlite>,
        order: OrderPlaced,
        _delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        diesel::insert_into(reservations::table)
            .values(reservations::order_id.eq(order.order_id))
            .execute(tx.conn())
            .await?;
        Ok(())
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all("data")?;
    let orders = Module::<Sqlite>::builder("orders", "data/orders.db")
        .migrations(&ORDERS_MIGRATIONS)
        .publishes::<OrderPlaced>()
        .start()
        .await?;
    let warehouse = Module::<Sqlite>::builder("warehouse", "data/warehouse.db")
        .migrations(&WAREHOUSE_MIGRATIONS)
        .handler("warehouse.reserve_stock", ReserveStock)
        .start()
        .await?;

    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .start()
        .await?;

    // The order row and the OrderPlaced message commit together, or neither does.
    let order_id = uuid::Uuid::now_v7().to_string();
    let id = order_id.clone();
    orders
        .transaction(async move |tx| {
            diesel::insert_into(orders::table)
                .values(orders::id.eq(&id))
                .execute(tx.conn())
                .await?;
            tx.publish(&OrderPlaced { order_id: id })?;
            Ok::<_, tickbox::Error>(())
        })
        .await?;

    // Wait until the warehouse has handled it, then stop.
    let delivered = bus.wait_idle(Duration::from_secs(10)).await?;
    bus.stop().await;
    let reserved: i64 = warehouse
        .read(async |tx| {
            let count = reservations::table.count().get_result(tx.conn()).await?;
            Ok::<_, tickbox::Error>(count)
        })
        .await?;
    println!("placed order {order_id}; delivered: {delivered}; reservations: {reserved}");
    if !delivered {
        return Err("the order was not delivered within 10 s".into());
    }
    Ok(())
}
