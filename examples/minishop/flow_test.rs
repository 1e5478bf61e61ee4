//! `cargo test --example minishop`: the shop's whole flow with tickbox's
//! test kit — place an order, wait for all it causes, check the result.

use crate::{check::Snapshot, cli::Args, place_order, start_modules, tables::NewOrder};
use crate::{OrderConfirmed, StockReserved, RESERVE_STOCK, SEND_CONFIRMATION};
use clap::Parser;
use tickbox::testing::{Session, TestDatabases};
use tickbox::Sqlite;

#[actix::test]
async fn an_order_is_reserved_confirmed_and_emailed_once() -> tickbox::Result<()> {
    let dbs = TestDatabases::sqlite();
    let args = Args::parse_from(["minishop"]);
    let shop = start_modules(&args, |name| dbs.module::<Sqlite>(name)).await?;
    let bus = shop.on_bus.iter().fold(dbs.bus(), |bus, m| bus.module(m));
    let bus = bus.start().await?;
    let session = Session::start(&bus);

    let order = NewOrder::random();
    let id = order.id.clone();
    place_order(shop.orders.as_ref().expect("orders"), order).await?;
    let report = session.wait().await; // every cascading message is done

    report.published_one::<StockReserved>(|reserved| reserved.order_id == id);
    report.published_one::<OrderConfirmed>(|confirmed| confirmed.order_id == id);
    assert_eq!(report.handled(RESERVE_STOCK).len(), 1);
    assert_eq!(report.handled(SEND_CONFIRMATION).len(), 1);
    let held = Snapshot::read(&shop).await?; // what the databases hold
    assert_eq!(
        held.reservations.unwrap_or_default().len(),
        1,
        "one reservation"
    );
    assert_eq!(held.orders.unwrap_or_default()[0].1, "confirmed");
    assert_eq!(held.emails, Some(vec![id]), "one e-mail");
    bus.stop().await;
    Ok(())
}
