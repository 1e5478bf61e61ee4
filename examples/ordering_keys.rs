//! Ordering keys: the catalog publishes each price change with its product
//! as the ordering key (`Tx::publish_keyed`), and the storefront's handler
//! receives each product's changes in the order they were committed — even
//! though it fails the first attempt of every third change, whose retry
//! comes well after the changes committed behind it. A failing change holds
//! back only its own product's later changes; the other products flow on.
//!
//! The storefront writes down each change as it arrives. With keys, every
//! product's changes arrive as versions 1, 2, 3… in turn; with `--unordered`
//! the same changes go without a key, and the retries reorder them. The
//! databases live in a temporary directory.
//!
//! Run it with `cargo run --example ordering_keys`, then
//! `cargo run --example ordering_keys -- --unordered` to see the difference.

use diesel::{ExpressionMethods, QueryDsl};
use diesel_migrations::{embed_migrations, EmbeddedMigrations};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use tickbox::diesel_async::RunQueryDsl;
use tickbox::{Bus, Delivery, Handler, HandlerError, Message, Module, Sqlite, Tx};

const PRODUCTS: [&str; 3] = ["kettle", "teapot", "toaster"];
const VERSIONS: i64 = 20;

#[derive(Serialize, Deserialize)]
struct PriceChanged {
    product: String,
    version: i64,
    price: i64,
}
impl Message for PriceChanged {
    const TOPIC: &'static str = "catalog.price_changed";
}

// The storefront's table: each change as it arrived (SQLite numbers the
// rows in the order their transactions commit).
const STOREFRONT_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/ordering_keys/migrations/storefront");
diesel::table! {
    arrivals (id) {
        id -> Integer,
        product -> Text,
        version -> BigInt,
    }
}

struct WriteDown;
impl Handler<Sqlite> for WriteDown {
    type Message = PriceChanged;
    async fn handle(
        &self,
        tx: &mut Tx<Sqlite>,
        change: PriceChanged,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        // A flaky dependency: the bus tries the delivery again a little
        // later. Meanwhile this product's later changes wait (with a key).
        if delivery.attempt == 1 && change.version % 3 == 0 {
            return Err(HandlerError::msg("the price service is busy"));
        }
        // With a key, the catalog numbered each product's changes 1, 2, 3…
        // as they committed (`Delivery::sequence`): here, the version.
        if delivery.sequence().is_some_and(|n| n != change.version) {
            return Err(HandlerError::permanent(HandlerError::msg("misnumbered")));
        }
        diesel::insert_into(arrivals::table)
            .values((
                arrivals::product.eq(change.product),
                arrivals::version.eq(change.version),
            ))
            .execute(tx.conn())
            .await?;
        Ok(())
    }
}

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let keyed = std::env::args().nth(1).as_deref() != Some("--unordered");
    let dir = tempfile::tempdir()?;
    let path = |name: &str| dir.path().join(name).display().to_string();
    let catalog = Module::<Sqlite>::builder("catalog", path("catalog.db"))
        .publishes::<PriceChanged>()
        .start()
        .await?;
    let storefront = Module::<Sqlite>::builder("storefront", path("storefront.db"))
        .migrations(&STOREFRONT_MIGRATIONS)
        .handler("storefront.write_down", WriteDown)
        .start()
        .await?;
    let bus = Bus::builder()
        .module(&catalog)
        .module(&storefront)
        .start()
        .await?;

    // Each change in a transaction of its own, the products taking turns.
    for version in 1..=VERSIONS {
        for product in PRODUCTS {
            let price = 100 + version;
            let change = PriceChanged {
                product: product.into(),
                version,
                price,
            };
            catalog
                .transaction(async move |tx| match keyed {
                    true => tx.publish_keyed(product, &change).map(drop),
                    false => tx.publish(&change).map(drop),
                })
                .await?;
        }
    }

    let idle = bus.wait_idle(Duration::from_secs(60)).await?;
    bus.stop().await;
    let retried = bus.metrics().total(|h| h.failed);
    let arrived: Vec<(String, i64)> = storefront
        .read(async |tx| {
            let rows = arrivals::table.order(arrivals::id);
            let rows = rows.select((arrivals::product, arrivals::version));
            Ok::<_, tickbox::Error>(rows.load(tx.conn()).await?)
        })
        .await?;
    // A change is out of order when an earlier one of its product arrives
    // after it; every change must arrive once.
    let mut out_of_order = 0;
    for product in PRODUCTS {
        let versions: Vec<i64> = arrived
            .iter()
            .filter(|(p, _)| p == product)
            .map(|a| a.1)
            .collect();
        out_of_order += versions.windows(2).filter(|pair| pair[1] < pair[0]).count();
        let arrived = versions.len();
        if arrived != VERSIONS as usize {
            return Err(format!("{product}: {arrived} of {VERSIONS} changes arrived").into());
        }
    }
    let mode = if keyed { "keyed" } else { "unordered" };
    let all = arrived.len();
    println!("{mode}: {all} changes arrived, {retried} retried; out of order: {out_of_order}");
    if !idle || (keyed && out_of_order > 0) {
        return Err("keyed changes arrived out of order, or not at all".into());
    }
    Ok(())
}
