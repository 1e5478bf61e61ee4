//! MiniShop: three modules of a modular monolith, each with its own
//! database, talking only through tickbox messages. **orders** places
//! orders, each in a transaction that publishes `OrderPlaced`; the
//! **warehouse** reserves the stock and answers `StockReserved` (or
//! `StockShort`); orders confirms the order and publishes `OrderConfirmed`
//! (or rejects it); **notifications** records the confirmation e-mail, and
//! with `--smtp` sends it. At the end it checks the databases: each order
//! reserved, confirmed and e-mailed once (a rejected one: none), nothing
//! pending, nothing given up on. Kill it at any moment (even `kill -9`),
//! then run it again with `--resume`: it finishes the work.
//!
//! Run it with `cargo run --release --example minishop`; `-- --help` shows
//! the rest: failures and duplicates on purpose, several processes,
//! RabbitMQ, PostgreSQL and MariaDB, e-mails, crashes. Read this file top
//! to bottom: handlers, modules, bus, flow. The crash-test fixtures and the
//! bookkeeping of several processes live in the files below.

mod check; // the final check of the databases
mod cli; // the arguments
mod db; // the queries, written once for every backend (`ShopDb`)
mod disturb; // `--disturb`: messages that test the handlers' safeguards
mod elsewhere; // over amqp: finding the other processes' databases
mod faults; // `--fail-rate`, and statements retried through faults
mod flow; // when the flow is done, as far as a process can tell
#[cfg(test)]
mod flow_test; // `cargo test --example minishop`
mod mail; // `--smtp`, `--crash-at`: the e-mail through the effects journal
mod messages; // the messages the modules send each other
#[cfg(feature = "opentelemetry")]
mod otlp; // `--otlp-endpoint`: the spans exported over OTLP/HTTP
mod placing; // `--orders`, `--order-interval`: placing the run's orders
mod progress; // logs and the progress bar
mod queries; // every query on the modules' tables, each a named type
mod report; // what a run shows, and its exit code
mod run; // a whole run: modules, bus, orders, the wait, the check
mod safeguards; // the handlers' own checks, beyond the inbox
mod shop; // which modules this process opens, and starting its bus
mod shutdown; // Ctrl-C
mod stores; // where the databases are: SQLite, PostgreSQL, MariaDB/MySQL
mod tables; // the modules' own tables

use cli::{Args, ModuleName};
use db::ShopDb;
use faults::flaky;
use messages::{OrderConfirmed, OrderPlaced, OrderTimedOut, StockReserved, StockShort};
#[cfg(test)]
use shop::start_modules; // the flow test starts the modules as a run does
use shop::Shop;
use std::time::Duration;
use tables::{NewEmail, NewOrder, NewReservation, NewShortage, OrderStatus};
use tickbox::diesel::result::{DatabaseErrorKind::UniqueViolation, Error::DatabaseError};
use tickbox::{Bus, BusBuilder, Delivery, Handler, HandlerError, HandlerOptions};
use tickbox::{ModuleBuilder, ModuleHandle, RetryPolicy, Tx};
use tracing::Instrument;

// ---------------------------------------------------------------------------
// 1. Handlers. Each delivery runs in a transaction that already holds the
//    inbox row (message id, handler name): the handler's changes, what it
//    publishes and the inbox row commit together, and a message delivered
//    again is skipped. Generic over `B: ShopDb`, they run on every backend
//    (`db.rs`); an application on one writes `impl Handler<Sqlite>`.

/// Handler names: half of each inbox row's key, so stable across releases.
const CONFIRM_ORDER: &str = "orders.confirm_order";
const REJECT_ORDER: &str = "orders.reject_order";
const TIME_OUT_ORDER: &str = "orders.time_out_order";
const RESERVE_STOCK: &str = "warehouse.reserve_stock";
const SEND_CONFIRMATION: &str = "notifications.send_confirmation";

/// orders: `StockReserved` → confirm the order, publish `OrderConfirmed`.
struct ConfirmOrder;
impl<B: ShopDb> Handler<B> for ConfirmOrder {
    type Message = StockReserved;
    async fn handle(
        &self,
        tx: &mut Tx<B>,
        reserved: StockReserved,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        // A saga: the answer moves the order on once, from placed; one that
        // does not fit is recorded as ignored (see `safeguards.rs`).
        let order_id = reserved.order_id;
        if safeguards::settle_order(tx, &order_id, OrderStatus::Confirmed, delivery).await? {
            let customer = B::order_customer(tx.conn(), &order_id).await?;
            tx.publish(&OrderConfirmed { order_id, customer })?;
        }
        Ok(())
    }
}

/// orders: `StockShort` → reject the order.
struct RejectOrder;
impl<B: ShopDb> Handler<B> for RejectOrder {
    type Message = StockShort;
    async fn handle(
        &self,
        tx: &mut Tx<B>,
        short: StockShort,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        safeguards::settle_order(tx, &short.order_id, OrderStatus::Rejected, delivery).await?;
        Ok(())
    }
}

/// orders: `OrderTimedOut`, due at the order's deadline → cancel the order
/// if it still waits; if it was settled first, the saga ignores the timeout.
struct TimeOutOrder;
impl<B: ShopDb> Handler<B> for TimeOutOrder {
    type Message = OrderTimedOut;
    async fn handle(
        &self,
        tx: &mut Tx<B>,
        timed_out: OrderTimedOut,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        safeguards::settle_order(tx, &timed_out.order_id, OrderStatus::Cancelled, delivery).await?;
        Ok(())
    }
}

/// warehouse: `OrderPlaced` → reserve stock and publish `StockReserved`, or
/// record the shortage and publish `StockShort`.
struct ReserveStock;
impl<B: ShopDb> Handler<B> for ReserveStock {
    type Message = OrderPlaced;
    async fn handle(
        &self,
        tx: &mut Tx<B>,
        order: OrderPlaced,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        // Batched: it locks the stock rows in one order, lest batches deadlock.
        B::lock_stock(tx.conn()).await?;
        let (id, sku, quantity) = (&order.order_id, &order.sku, order.quantity);
        if safeguards::answered_already(tx, id, delivery).await? {
            return Ok(());
        }
        if B::reserve(tx.conn(), NewReservation::of(id, sku, quantity)).await? {
            tx.publish(&StockReserved::of(&order))?;
        } else {
            B::record_shortage(tx.conn(), NewShortage::of(id, sku, quantity)).await?;
            tx.publish(&StockShort::of(&order))?;
        }
        Ok(())
    }
}

/// notifications: `OrderConfirmed` → the confirmation e-mail: a row in
/// `sent_emails`, and with `--smtp` a real e-mail.
struct SendConfirmation {
    /// With `--smtp`: the mail server, the policy, the injected crashes.
    mailer: Option<mail::Mailer>,
}
impl<B: ShopDb> Handler<B> for SendConfirmation {
    type Message = OrderConfirmed;
    async fn handle(
        &self,
        tx: &mut Tx<B>,
        confirmed: OrderConfirmed,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let OrderConfirmed { order_id, customer } = confirmed;
        let subject = format!("Your MiniShop order {order_id} is confirmed");
        // An e-mail is no part of this transaction (a crash before COMMIT
        // would send it again): it goes through the effects journal, under a
        // key the same on every delivery (`Delivery::effect`, in `mail.rs`).
        let key = match &self.mailer {
            Some(mail) => mail.send(delivery, &customer, &subject, &order_id).await?,
            None => delivery.idempotency_key(),
        };
        // The row commits with the inbox row: one per order, however often.
        let email = NewEmail::new(subject, order_id, customer, key);
        B::insert_email(tx.conn(), email).await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// 2. Modules: each owns a database, runs its own migrations, declares what
//    it publishes and hosts its handlers.

/// A module's builder made ready: its migrations, what it publishes and, if
/// this process runs it (`--modules`), its handlers, each failing before
/// COMMIT at `--fail-rate` (`faults.rs`).
fn configure<B: ShopDb>(args: &Args, name: ModuleName, m: ModuleBuilder<B>) -> ModuleBuilder<B> {
    // Sample the outbox gauges (pending, lag) every second, for Prometheus.
    let m = m.metrics_interval(Duration::from_secs(1));
    let m = m.migrations(B::MIGRATIONS.of(name));
    let m = match name {
        ModuleName::Orders => m
            .publishes::<OrderPlaced>()
            .publishes::<OrderConfirmed>()
            .publishes::<OrderTimedOut>(),
        ModuleName::Warehouse => m.publishes::<StockReserved>().publishes::<StockShort>(),
        ModuleName::Notifications => m,
    };
    if !args.runs(name) {
        return m; // its handlers run in another process
    }
    // The warehouse's handler runs batched: up to 32 waiting orders in one
    // transaction, one COMMIT; when one fails, they run one by one.
    let (fail, batched) = (args.fail_rate, HandlerOptions::new().batch(32));
    match name {
        ModuleName::Orders => m
            .handler(CONFIRM_ORDER, flaky(ConfirmOrder, fail))
            .handler(REJECT_ORDER, flaky(RejectOrder, fail))
            .handler(TIME_OUT_ORDER, flaky(TimeOutOrder, fail)),
        ModuleName::Warehouse => m.handler_with(RESERVE_STOCK, flaky(ReserveStock, fail), batched),
        ModuleName::Notifications => {
            let mailer = mail::Mailer::from_args(args);
            m.handler(SEND_CONFIRMATION, flaky(SendConfirmation { mailer }, fail))
        }
    }
}

// ---------------------------------------------------------------------------
// 3. The bus: delivers each committed message to every subscribed handler,
//    in this process or through RabbitMQ (`--transport amqp`).

/// The bus over this process's modules; `shop::start_bus` starts it.
fn bus<B: ShopDb>(shop: &Shop<B>, args: &Args) -> BusBuilder<B> {
    let bus = shop.on_bus.iter().fold(Bus::builder(), BusBuilder::module);
    // Quick retries, to see injected failures heal; 25 in a row dead-letter.
    let retries = RetryPolicy {
        initial_delay: Duration::from_millis(20),
        max_delay: Duration::from_secs(1),
        max_attempts: Some(25),
        ..RetryPolicy::default()
    };
    let bus = bus
        .duplicate_rate(args.duplicate_rate)
        .retry_policy(retries);
    // A killed process's claims on outbox rows keep other buses away until
    // they expire: short, so that `--resume` takes over soon.
    let bus = bus.claim_lease(Duration::from_secs(2));
    // Over amqp: an exchange per namespace, a durable queue per handler.
    #[cfg(feature = "amqp")]
    if args.over_amqp() {
        return bus.amqp(shop::broker(args));
    }
    bus
}

// ---------------------------------------------------------------------------
// 4. The flow: orders placed, each publishing in a transaction; a wait
//    until every message has done its work; the check.

/// Places `order`: its row, its `OrderPlaced` and, with a deadline, its `OrderTimedOut`
/// due then commit together, or not at all (a retry after a lost COMMIT may find the row).
async fn place_order<B: ShopDb>(orders: &ModuleHandle<B>, order: NewOrder) -> tickbox::Result<()> {
    // The order's trace begins here (`--otlp-endpoint`): what it publishes
    // is created in this span.
    let span = tracing::info_span!("place_order", order_id = %order.id);
    let mut tried = false;
    faults::retrying("placing an order", || {
        let (order, retry) = (order.clone(), std::mem::replace(&mut tried, true));
        orders.transaction(async move |tx| {
            let (placed, order_id) = (OrderPlaced::of(&order), order.id.clone());
            let deadline = order.confirm_by();
            match B::insert_order(tx.conn(), order).await {
                Err(DatabaseError(UniqueViolation, _)) if retry => return Ok(()),
                inserted => inserted?,
            }
            if let Some(deadline) = deadline {
                tx.publish_at(deadline, &OrderTimedOut { order_id })?;
            }
            tx.publish(&placed).map(drop)
        })
    })
    .instrument(span)
    .await
}

#[actix::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse_or_exit();
    // Logs (with `--otlp-endpoint`, the spans' export too), the metrics
    // endpoint, the transport: a setting that cannot be served ends the run.
    let started = progress::init_logging(&args).and_then(|exporting| {
        report::serve_metrics(&args).and_then(|()| args.transport_built())?;
        Ok(exporting)
    });
    let exporting = match started {
        Ok(exporting) => exporting,
        Err((error, code)) => {
            report::print_error(&error, args.json);
            return std::process::ExitCode::from(code);
        }
    };
    // From here on Ctrl-C asks the run to stop; a second one quits.
    let stop = shutdown::on_ctrl_c();
    // `run`, on the databases the arguments name.
    let result = stores::run(&args, &stop).await;
    // The last spans are sent before the process ends.
    if let Some(exporting) = exporting {
        exporting.finish();
    }
    report::finish(result, args.json, stop.is_cancelled())
}
