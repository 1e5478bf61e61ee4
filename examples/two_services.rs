//! Two services over RabbitMQ: `orders` and `warehouse`, each a process
//! with its own database, sharing nothing but the broker. Each bus sends
//! its module's committed messages to the exchange `tickbox.two_services`
//! (an outbox row counts as sent once the broker confirms it) and consumes
//! one durable queue per handler, where the inbox skips what comes twice.
//! orders places orders and confirms each when the warehouse answers.
//!
//! Run it with `cargo run --features amqp --example two_services` (a broker
//! at amqp://guest:guest@127.0.0.1:5672): this process is the warehouse,
//! and runs the orders service as a child. Or run `… --example two_services
//! -- --role warehouse` (until Ctrl-C) and `… -- --role orders` in two
//! terminals. The databases stay in `data/`: each run places ten more.

use diesel::{ExpressionMethods, QueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};
use serde::{Deserialize, Serialize};
use std::process::Command;
use std::time::{Duration, Instant};
use tickbox::diesel_async::RunQueryDsl;
use tickbox::{Amqp, Bus, Delivery, Handler, HandlerError, Message, Module};
use tickbox::{ModuleHandle, Sqlite, Tx};

#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    order_id: String,
}
impl Message for OrderPlaced {
    const TOPIC: &'static str = "orders.order_placed";
}

#[derive(Serialize, Deserialize)]
struct StockReserved {
    order_id: String,
}
impl Message for StockReserved {
    const TOPIC: &'static str = "warehouse.stock_reserved";
}

const ORDERS_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/two_services/migrations/orders");
diesel::table! {
    orders (id) {
        id -> Text,
        confirmed -> Bool,
    }
}

/// warehouse: reserves the stock (here it only says so), once per order.
struct ReserveStock;
impl Handler<Sqlite> for ReserveStock {
    type Message = OrderPlaced;
    async fn handle(
        &self,
        tx: &mut Tx<Sqlite>,
        order: OrderPlaced,
        _: &Delivery,
    ) -> Result<(), HandlerError> {
        let order_id = order.order_id;
        Ok(tx.publish(&StockReserved { order_id }).map(drop)?)
    }
}

/// orders: confirms the order whose stock was reserved.
struct ConfirmOrder;
impl Handler<Sqlite> for ConfirmOrder {
    type Message = StockReserved;
    async fn handle(
        &self,
        tx: &mut Tx<Sqlite>,
        reserved: StockReserved,
        _: &Delivery,
    ) -> Result<(), HandlerError> {
        let order = orders::table.find(reserved.order_id);
        let confirm = diesel::update(order).set(orders::confirmed.eq(true));
        confirm.execute(tx.conn()).await?;
        Ok(())
    }
}

type Result<T = (), E = Box<dyn std::error::Error>> = std::result::Result<T, E>;

#[actix::main]
async fn main() -> Result {
    // Without `--role`, this process is the warehouse, and starts the
    // orders service beside it.
    let role = std::env::args().skip_while(|arg| arg != "--role").nth(1);
    let both = role.is_none();
    let role = role.unwrap_or_else(|| "warehouse".into());
    // The service's module, on its own database, and its bus over the broker.
    std::fs::create_dir_all("data")?;
    let module = Module::builder(role.as_str(), format!("data/two_services_{role}.db"));
    let module = match role.as_str() {
        "orders" => module
            .migrations(&ORDERS_MIGRATIONS)
            .publishes::<OrderPlaced>()
            .handler("orders.confirm_order", ConfirmOrder),
        "warehouse" => module
            .publishes::<StockReserved>()
            .handler("warehouse.reserve_stock", ReserveStock),
        _ => return Err("--role orders, or --role warehouse".into()),
    };
    let module = module.start().await?;
    let broker = Amqp::new("amqp://guest:guest@127.0.0.1:5672/%2f").namespace("two_services");
    let bus = Bus::builder().module(&module).amqp(broker).start().await?;
    let served = match role.as_str() {
        "orders" => place_orders(&module).await,
        _ if both => orders_service().await,
        _ => Ok(tokio::signal::ctrl_c().await.map(|()| "stopped")?.into()),
    };
    bus.stop().await;
    let handled = bus.metrics().total(|h| h.handled);
    println!("{role}: {}; handled {handled} messages", served?);
    Ok(())
}

/// The orders service's work: ten orders placed, and each confirmed.
async fn place_orders(orders: &ModuleHandle<Sqlite>) -> Result<String> {
    for _ in 0..10 {
        let order_id = uuid::Uuid::now_v7().to_string();
        let order = (orders::id.eq(order_id.clone()), orders::confirmed.eq(false));
        let place = async move |tx: &mut Tx<Sqlite>| {
            let insert = diesel::insert_into(orders::table).values(order);
            insert.execute(tx.conn()).await?;
            tx.publish(&OrderPlaced { order_id }).map(drop)
        };
        orders.transaction(place).await?;
    }
    let unconfirmed = async |tx: &mut Tx<Sqlite>| {
        let query = orders::table.filter(orders::confirmed.eq(false)).count();
        Ok::<i64, tickbox::Error>(query.get_result(tx.conn()).await?)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while orders.read(unconfirmed).await? > 0 {
        if Instant::now() > deadline {
            return Err("some orders were not confirmed within a minute".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok("placed 10 orders; every order confirmed".into())
}

/// Runs the orders service as a child process, until it has finished.
async fn orders_service() -> Result<String> {
    let exe = std::env::current_exe()?;
    let orders = move || Command::new(exe).args(["--role", "orders"]).status();
    match tokio::task::spawn_blocking(orders).await?? {
        status if status.success() => Ok("served the orders service until it finished".into()),
        status => Err(format!("the orders service failed: {status}").into()),
    }
}
