//! MiniShop: three modules of a modular monolith, each with its own
//! database, talking only through tickbox messages.
//!
//! - **orders** places orders, each in a transaction that also publishes
//!   `OrderPlaced`; each order is a small state machine (a saga): on
//!   `StockReserved` a placed order is confirmed, and `OrderConfirmed`
//!   published; on `StockShort` it is rejected.
//! - **warehouse**, on `OrderPlaced`, takes the stock, records a reservation
//!   and publishes `StockReserved` — or, short of stock, records the
//!   shortage and publishes `StockShort`.
//! - **notifications**, on `OrderConfirmed`, "sends" the confirmation
//!   e-mail: a row in its `sent_emails` table — and with `--smtp HOST:PORT`
//!   a real e-mail to that SMTP server, through the module's effects
//!   journal (see `SendConfirmation`).
//!
//! It shows the transactional outbox (a message exists iff its transaction
//! commits), at-least-once delivery with retries, and the inbox turning that
//! into exactly-once effects: `--duplicate-rate` makes the bus deliver
//! messages twice on purpose, `--fail-rate` makes handlers fail after doing
//! their work but before COMMIT. Kill it at any moment (even `kill -9`) and
//! run it again with `--resume`: it finishes the pending work. At the end it
//! checks the databases: every order has exactly one reservation, was
//! confirmed exactly once and has exactly one e-mail (a rejected order:
//! none of them), no message is pending and no delivery was given up on
//! (dead-lettered).
//!
//! Beyond the inbox, two handlers are idempotent in their own right: the
//! saga applies the warehouse's answer only to a placed order, and the
//! warehouse answers each order once. A message that does not fit (a second
//! `StockReserved` under a new id, one for a rejected or unknown order) is
//! ignored and recorded with why; the report counts them (`saga_ignored`,
//! `warehouse_ignored`). `--disturb` delivers such messages on purpose and
//! checks that each is ignored (see `disturb.rs`).
//!
//! ```text
//! cargo run --release --example minishop
//! cargo run --release --example minishop -- --orders 2000 --duplicate-rate 0.3 --fail-rate 0.1
//! cargo run --release --example minishop -- --orders 1200 --order-interval 50
//! cargo run --release --example minishop -- --disturb
//! cargo run --release --example minishop -- --smtp 127.0.0.1:2525
//! cargo run --release --example minishop -- --smtp 127.0.0.1:2525 --email-policy at-most-once --crash-at after-send --crash-rate 0.2
//! cargo run --release --features postgres --example minishop -- --database-url postgres://…
//! cargo run --release --features mysql --example minishop -- --database-url mysql://root@127.0.0.1:3306
//! cargo run --release --example minishop -- --help
//! ```
//!
//! The three modules may also run as separate processes over the same
//! databases, each running some modules' handlers (`--modules`); every
//! process runs until the whole flow is done and checked:
//!
//! ```text
//! cargo build --release --example minishop
//! target/release/examples/minishop --data-dir shop --modules orders --orders 2000 &
//! target/release/examples/minishop --data-dir shop --modules warehouse &
//! target/release/examples/minishop --data-dir shop --modules notifications &
//! ```
//!
//! Over RabbitMQ (`--transport amqp`, the `amqp` feature) the processes
//! share nothing but the broker: each opens only its own modules'
//! databases, publishes their outboxes to the exchange
//! `tickbox.<--amqp-namespace>` and consumes its handlers' queues:
//!
//! ```text
//! cargo build --release --features amqp --example minishop
//! target/release/examples/minishop --transport amqp --data-dir D1 --modules orders --orders 2000 &
//! target/release/examples/minishop --transport amqp --data-dir D2 --modules warehouse &
//! target/release/examples/minishop --transport amqp --data-dir D3 --modules notifications &
//! ```
//!
//! A process knows, and checks, only what the databases it sees tell: with
//! the orders database (its own, or found with `--check-data-dir` /
//! `--check-database-url`) it runs until every order is confirmed (and
//! e-mailed, if it sees the notifications database) or rejected and nothing
//! is pending;
//! without it (the warehouse or the notifications alone) it runs until its
//! database holds work and its handlers have been idle for `--settle`
//! seconds. Its report says which databases it checked and what it could
//! not; with the check flags naming the other two modules' databases each
//! process waits for and checks the whole flow. An unreachable broker at
//! start is retried; one refusing the credentials ends the run (exit 1).
//!
//! SQLite (the default) keeps one file per module under `./minishop-data`;
//! `--database-url postgres://…` puts each module in its own PostgreSQL
//! schema (`minishop_orders`, …; see `--schema-prefix`); `--database-url
//! mysql://…` (MariaDB ≥ 10.6 or MySQL ≥ 8.0, the `mysql` feature) in its
//! own database of the same name on that server, made if missing (the URL
//! need name no database). Logs and progress go to stderr (`RUST_LOG` sets
//! the filter, `minishop=debug` shows every e-mail), the report to stdout;
//! `--json` prints one JSON object instead. `--metrics-addr HOST:PORT`
//! serves Prometheus metrics while it runs (the `prometheus` feature).
//! Ctrl-C stops cleanly (exit code 130; `--resume` finishes the work).
//!
//! Read this file from top to bottom: the messages, the handlers, starting
//! the modules and the bus, placing orders (publishing in a transaction),
//! waiting for the flow, checking the databases. Beside it: `cli.rs` (the
//! arguments), `tables.rs` (the modules' own tables), `queries.rs` (every
//! query on them, each a named type), `db.rs` (the queries written once for
//! every backend: `ShopDb`), `flow.rs` (the flow across processes),
//! `elsewhere.rs` (finding the other processes' databases over amqp),
//! `check.rs` (the final check), `disturb.rs` (`--disturb`), `faults.rs`
//! (injected failures), `mail.rs` (the e-mail over SMTP, and `--crash-at`),
//! `shutdown.rs` (Ctrl-C), `progress.rs` and `report.rs` (what it shows).

mod check;
mod cli;
mod db;
mod disturb;
mod elsewhere;
mod faults;
mod flow;
#[cfg(test)]
mod flow_test;
mod mail;
mod progress;
mod queries;
mod report;
mod shutdown;
mod tables;

use cli::{Args, CheckStore, CrashPoint, ModuleName, Store};
use db::ShopDb;
use flow::{Counts, Drain};
use progress::Progress;
use serde::{Deserialize, Serialize};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tables::{IgnoredMessage, OrderStatus};
use tickbox::diesel::result::{DatabaseErrorKind, Error::DatabaseError};
use tickbox::{
    Bus, BusHandle, Delivery, Handler, HandlerError, HandlerOptions, Message, ModuleBuilder,
    ModuleHandle, RetryPolicy, Tx,
};
use tokio_util::sync::CancellationToken;

// ---------------------------------------------------------------------------
// 1. Messages: serde types, each with a stable topic name.

/// Published by orders when an order is placed.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct OrderPlaced {
    order_id: String,
    sku: String,
    quantity: i32,
}
impl Message for OrderPlaced {
    const TOPIC: &'static str = "orders.order_placed";
}

/// Published by the warehouse when stock for an order is reserved.
#[derive(Debug, Serialize, Deserialize)]
struct StockReserved {
    order_id: String,
    sku: String,
    quantity: i32,
}
impl Message for StockReserved {
    const TOPIC: &'static str = "warehouse.stock_reserved";
}

/// Published by the warehouse when it has too little stock for an order.
#[derive(Debug, Serialize, Deserialize)]
struct StockShort {
    order_id: String,
    sku: String,
    quantity: i32,
}
impl Message for StockShort {
    const TOPIC: &'static str = "warehouse.stock_short";
}

/// Published by orders when an order is confirmed.
#[derive(Debug, Serialize, Deserialize)]
struct OrderConfirmed {
    order_id: String,
    customer: String,
}
impl Message for OrderConfirmed {
    const TOPIC: &'static str = "orders.order_confirmed";
}

// ---------------------------------------------------------------------------
// 2. Handlers: module code subscribed to a message.
//
// Each delivery runs its handler in a transaction on the handler's module's
// database that already holds the inbox row (message id, handler name): the
// handler's changes, the messages it publishes and the inbox row commit
// together, and a message delivered again finds the row and is skipped.
//
// An application on one backend implements `Handler<Sqlite>` (say) and runs
// its queries on `tx.conn()`; minishop runs on either backend, so its
// handlers are generic over `B: ShopDb`, the backends whose connection runs
// every query minishop has (see `db.rs`), and call those queries as
// `B::settle_order(tx.conn(), …)`.

/// Handler names: part of each inbox row's key, so stable across releases.
const CONFIRM_ORDER: &str = "orders.confirm_order";
const REJECT_ORDER: &str = "orders.reject_order";
const RESERVE_STOCK: &str = "warehouse.reserve_stock";
const SEND_CONFIRMATION: &str = "notifications.send_confirmation";

/// The effect `SendConfirmation` makes with `--smtp`: named within its
/// handler, and as stable, since the journal's entries are keyed by it.
const SEND_CONFIRMATION_EFFECT: &str = "send_confirmation";

// The orders module runs a saga: each order is a small state machine that
// the warehouse's answer moves on, once.
//
//     placed ──StockReserved──▶ confirmed   (publishes OrderConfirmed: an e-mail)
//        └─────StockShort─────▶ rejected    (nothing more: no e-mail)
//
// The inbox skips a message delivered again under the same id. The saga is
// a second safeguard, for what the inbox cannot see: an answer that does
// not fit the order's state (a second StockReserved for an order already
// confirmed, one for an order rejected, one for an order nobody placed)
// arrives as a message of its own. It is not applied, nor does it fail (a
// retry would not make it fit): it is recorded in the orders database's
// `ignored_messages`, with why, and the report counts it (`saga_ignored`).

/// orders: moves order `order_id` from placed to `to` when the order is
/// placed; otherwise records the message of `delivery` as ignored. Whether
/// it moved the order.
async fn settle_order<B: ShopDb>(
    tx: &mut Tx<B>,
    order_id: &str,
    to: OrderStatus,
    delivery: &Delivery,
) -> Result<bool, HandlerError> {
    if B::settle_order(tx.conn(), order_id, to).await? {
        return Ok(true);
    }
    let reason = match B::order_status(tx.conn(), order_id).await? {
        Some(status) => format!("the order is {status} already"),
        None => "no such order".to_string(),
    };
    tracing::warn!(order_id, handler = %delivery.handler, %reason,
        "ignored a message that does not fit its order");
    B::record_ignored(tx.conn(), IgnoredMessage::new(delivery, order_id, reason)).await?;
    Ok(false)
}

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
        let order_id = reserved.order_id;
        if settle_order(tx, &order_id, OrderStatus::Confirmed, delivery).await? {
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
        settle_order(tx, &short.order_id, OrderStatus::Rejected, delivery).await?;
        Ok(())
    }
}

/// warehouse: `OrderPlaced` → reserve stock and publish `StockReserved`, or,
/// with too little stock, record the shortage and publish `StockShort`.
///
/// It runs batched (see [`start_modules`]): up to 32 orders in one
/// transaction, each taking the stock of its own item. Two transactions
/// taking items A then B and B then A would each lock one row and wait for
/// the other's: a deadlock, which PostgreSQL breaks only after a second by
/// failing one batch. So each call first locks every stock row in one
/// global order (there are five); the later calls of a batch find them
/// held by their own transaction and wait for nobody.
struct ReserveStock;

impl<B: ShopDb> Handler<B> for ReserveStock {
    type Message = OrderPlaced;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        order: OrderPlaced,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        B::lock_stock(tx.conn()).await?;
        // Idempotent in its own right, beyond the inbox: an order is
        // answered once, whatever message asks for it; a message asking
        // again is recorded as ignored (`warehouse_ignored` in the report).
        if let Some(answer) = B::answer_given(tx.conn(), &order.order_id).await? {
            let reason = format!("the order was {answer} already");
            tracing::warn!(order_id = %order.order_id, %reason, "ignored an order placed again");
            let ignored = IgnoredMessage::new(delivery, &order.order_id, reason);
            B::record_ignored(tx.conn(), ignored).await?;
            return Ok(());
        }
        let reservation = tables::NewReservation {
            order_id: order.order_id.clone(),
            sku: order.sku.clone(),
            quantity: order.quantity,
            reserved_at_us: tables::now_us(),
        };
        if B::reserve(tx.conn(), reservation).await? {
            tx.publish(&StockReserved {
                order_id: order.order_id,
                sku: order.sku,
                quantity: order.quantity,
            })?;
            return Ok(());
        }
        let shortage = tables::NewShortage {
            order_id: order.order_id.clone(),
            sku: order.sku.clone(),
            quantity: order.quantity,
            short_at_us: tables::now_us(),
        };
        B::record_shortage(tx.conn(), shortage).await?;
        tx.publish(&StockShort {
            order_id: order.order_id,
            sku: order.sku,
            quantity: order.quantity,
        })?;
        Ok(())
    }
}

/// notifications: `OrderConfirmed` → send the confirmation e-mail: a row
/// in `sent_emails`, the shop's own record, and with `--smtp` a real e-mail.
struct SendConfirmation {
    /// With `--smtp`: the mail server, the e-mail's policy and the injected
    /// crashes; without, nothing leaves the process.
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
        let subject = format!("Your MiniShop order {} is confirmed", confirmed.order_id);
        // The same on every delivery of this message to this handler.
        let mut idempotency_key = delivery.idempotency_key();
        if let Some(mailer) = &self.mailer {
            // A real e-mail is not part of the transaction below: a crash
            // after sending it and before COMMIT would send it again. So it
            // goes through the module's effects journal: recorded as started
            // (committed at once) before the call, as succeeded (with what
            // the call returned) after it. A later delivery of this message
            // finds it succeeded and gets `Sent` back without sending; one
            // that finds it started (a crash cut it short) sends it again
            // with the same key, or makes it unknown and gives the delivery
            // up (a dead letter, for a person), as `--email-policy` says.
            let _alone = mailer.crash.one_at_a_time().await;
            let (to, order_id) = (&confirmed.customer, &confirmed.order_id);
            let sent: mail::Sent = delivery
                .effect(SEND_CONFIRMATION_EFFECT, mailer.policy, |key: String| {
                    let subject = &subject;
                    async move {
                        // The key becomes the Message-ID: the same on every try.
                        let sent = mailer.send(to, subject, order_id, &key).await?;
                        // `--crash-at after-send`: the server has the e-mail,
                        // the journal does not know it yet.
                        mailer.crash.maybe(CrashPoint::AfterSend);
                        Ok::<_, HandlerError>(sent)
                    }
                })
                .await?;
            // `--crash-at after-journal`: the journal knows, but this
            // delivery's transaction (its row below, its inbox row) never
            // commits; the next delivery gets `sent` back from the journal.
            mailer.crash.maybe(CrashPoint::AfterJournal);
            tracing::debug!(message_id = %sent.message_id, reply = %sent.reply, "e-mail accepted");
            idempotency_key = sent.key;
        }
        let email = tables::NewEmail {
            id: uuid::Uuid::now_v7().to_string(),
            subject,
            order_id: confirmed.order_id,
            recipient: confirmed.customer,
            idempotency_key,
            sent_at_us: tables::now_us(),
        };
        // The row commits or rolls back with the inbox row: one per order,
        // however often the message is delivered.
        tracing::debug!(to = %email.recipient, order_id = %email.order_id,
            idempotency_key = %email.idempotency_key, attempt = delivery.attempt,
            "confirmation e-mail recorded");
        B::insert_email(tx.conn(), email).await?;
        Ok(())
    }
}

impl SendConfirmation {
    /// The handler as the arguments make it: with `--smtp`, sending real
    /// e-mails.
    fn new(args: &Args) -> Self {
        let mailer = args.smtp.map(|server| {
            let crash = mail::Crash::new(args.crash_at, args.crash_rate);
            mail::Mailer::new(server, args.email_policy.effect_policy(), crash)
        });
        SendConfirmation { mailer }
    }
}

// ---------------------------------------------------------------------------
// 3. Modules: each owns a database, declares what it publishes and hosts
//    its handlers.

/// The modules whose databases this process sees: all three over the
/// local transport; over amqp those it runs and those found with the check
/// flags (`None` for the others).
struct Shop<B: ShopDb> {
    orders: Option<ModuleHandle<B>>,
    warehouse: Option<ModuleHandle<B>>,
    notifications: Option<ModuleHandle<B>>,
    /// The modules on this process's bus: all three over the local
    /// transport (it delivers every outbox's messages), over amqp only
    /// those it runs (it publishes their outboxes, consumes their handlers'
    /// queues).
    on_bus: Vec<ModuleHandle<B>>,
}

impl<B: ShopDb> Shop<B> {
    /// The modules seen here, with their names.
    fn seen(&self) -> Vec<(&'static str, &ModuleHandle<B>)> {
        [
            ("orders", &self.orders),
            ("warehouse", &self.warehouse),
            ("notifications", &self.notifications),
        ]
        .into_iter()
        .filter_map(|(name, module)| Some((name, module.as_ref()?)))
        .collect()
    }
}

/// A module's builder made ready: its migrations, the messages it
/// publishes and, if this process runs it, its handlers.
fn configure<B: ShopDb>(
    args: &Args,
    name: ModuleName,
    builder: ModuleBuilder<B>,
) -> ModuleBuilder<B> {
    use faults::flaky;
    let fail = args.fail_rate;
    let runs = args.runs(name);
    // Sample the outbox gauges (pending, lag) every second, for the
    // Prometheus endpoint.
    let builder = builder.metrics_interval(Duration::from_secs(1));
    match name {
        ModuleName::Orders => {
            let orders = builder
                .migrations(&B::MIGRATIONS.orders)
                .publishes::<OrderPlaced>()
                .publishes::<OrderConfirmed>();
            if runs {
                orders
                    .handler(CONFIRM_ORDER, flaky(ConfirmOrder, fail))
                    .handler(REJECT_ORDER, flaky(RejectOrder, fail))
            } else {
                orders
            }
        }
        ModuleName::Warehouse => {
            let warehouse = builder
                .migrations(&B::MIGRATIONS.warehouse)
                .publishes::<StockReserved>()
                .publishes::<StockShort>();
            if runs {
                // Up to 32 waiting orders per transaction, one COMMIT for
                // all; when one fails, the batch rolls back and runs one
                // order at a time.
                let batched = HandlerOptions::new().batch(32);
                warehouse.handler_with(RESERVE_STOCK, flaky(ReserveStock, fail), batched)
            } else {
                warehouse
            }
        }
        ModuleName::Notifications => {
            let notifications = builder.migrations(&B::MIGRATIONS.notifications);
            if runs {
                notifications.handler(SEND_CONFIRMATION, flaky(SendConfirmation::new(args), fail))
            } else {
                notifications
            }
        }
    }
}

/// Starts the modules, with the handlers of those this process runs
/// (`--modules`). Over the local transport a module whose handlers run
/// elsewhere is still opened here, for its outbox and for the final check;
/// over amqp it is not (see [`open_elsewhere`]). `module` makes a module's
/// builder on the chosen backend. Starting a module creates tickbox's
/// tables in its database, then runs the module's own migrations.
async fn start_modules<B: ShopDb>(
    args: &Args,
    module: impl Fn(&str) -> ModuleBuilder<B>,
) -> tickbox::Result<Shop<B>> {
    let over_amqp = args.over_amqp();
    let mut started = Vec::new();
    // The orders module last: once its tables exist, the shop is open.
    for name in [
        ModuleName::Notifications,
        ModuleName::Warehouse,
        ModuleName::Orders,
    ] {
        if over_amqp && !args.runs(name) {
            started.push(None);
            continue;
        }
        let builder = configure(args, name, module(name.name()));
        started.push(Some(builder.start().await?));
    }
    let mut started = started.into_iter();
    let (notifications, warehouse, orders) = (
        started.next().flatten(),
        started.next().flatten(),
        started.next().flatten(),
    );
    // Over amqp only the modules this process runs were opened.
    let on_bus = [&orders, &warehouse, &notifications]
        .into_iter()
        .filter_map(|module| module.clone())
        .collect();
    Ok(Shop {
        orders,
        warehouse,
        notifications,
        on_bus,
    })
}

/// Over amqp, opens the databases of the modules other processes run,
/// where `elsewhere` finds them (the check flags; it waits for them to
/// appear), for waiting on the flow and the final check: never on this
/// process's bus. Without check flags it finds none.
async fn open_elsewhere<B: ShopDb>(
    shop: &mut Shop<B>,
    args: &Args,
    elsewhere: impl AsyncFn(&'static str) -> Result<Option<ModuleBuilder<B>>, String>,
) -> Result<(), String> {
    if !args.over_amqp() {
        return Ok(());
    }
    for name in [
        ModuleName::Notifications,
        ModuleName::Warehouse,
        ModuleName::Orders,
    ] {
        let slot = match name {
            ModuleName::Orders => &mut shop.orders,
            ModuleName::Warehouse => &mut shop.warehouse,
            ModuleName::Notifications => &mut shop.notifications,
        };
        if slot.is_some() {
            continue;
        }
        if let Some(builder) = elsewhere(name.name()).await? {
            let module = configure(args, name, builder).start().await;
            *slot = Some(module.map_err(|e| e.to_string())?);
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. The bus: routes each committed message to every subscribed handler —
//    in this process, or through RabbitMQ (`--transport amqp`).

/// Starts the bus over this process's modules. A failure worth retrying
/// (the broker out of reach or restarting, a database busy) is retried
/// with backoff until `deadline` (a minute without `--timeout`) or Ctrl-C;
/// any other (the broker refusing the credentials) ends the run at once.
async fn start_bus<B: ShopDb>(
    shop: &Shop<B>,
    args: &Args,
    deadline: Option<Instant>,
    stop: &CancellationToken,
) -> tickbox::Result<BusHandle<B>> {
    let deadline = deadline.unwrap_or_else(|| Instant::now() + Duration::from_secs(60));
    let mut delay = Duration::from_millis(200);
    loop {
        let mut bus = Bus::builder();
        for module in &shop.on_bus {
            bus = bus.module(module);
        }
        bus = bus
            .duplicate_rate(args.duplicate_rate)
            // Quick retries: the injected failures are meant to be seen
            // healing. A delivery failing 25 times in a row (about 20 s)
            // becomes a dead letter; at --fail-rate 0.1 the odds of that are
            // 1e-25.
            .retry_policy(RetryPolicy {
                initial_delay: Duration::from_millis(20),
                max_delay: Duration::from_secs(1),
                max_attempts: Some(25),
                ..RetryPolicy::default()
            })
            // A killed process's claims on outbox rows keep other buses away
            // until they expire; short, so that --resume takes over soon.
            .claim_lease(Duration::from_secs(2));
        #[cfg(feature = "amqp")]
        if args.over_amqp() {
            // One exchange, tickbox.<namespace>; one durable queue per
            // handler, tickbox.<namespace>.<module>.<handler>.
            bus = bus.amqp(broker(args));
        }
        match bus.start().await {
            Err(error) if error.is_transient() && Instant::now() < deadline => {
                tracing::warn!(%error, retry_in = ?delay, "the bus did not start; trying again");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = stop.cancelled() => return Err(error),
                }
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            started => return started,
        }
    }
}

/// The RabbitMQ broker of `--transport amqp`, in the run's namespace.
#[cfg(feature = "amqp")]
fn broker(args: &Args) -> tickbox::Amqp {
    tickbox::Amqp::new(&args.amqp_url).namespace(&args.amqp_namespace)
}

// ---------------------------------------------------------------------------
// 5. Publishing in a transaction: the order row and its `OrderPlaced`
//    commit together, or neither does.

impl OrderPlaced {
    /// The message announcing `order`.
    fn of(order: &tables::NewOrder) -> Self {
        OrderPlaced {
            order_id: order.id.clone(),
            sku: order.sku.clone(),
            quantity: order.quantity,
        }
    }
}

/// Places `order`: its row and its `OrderPlaced` in one transaction.
async fn place_order<B: ShopDb>(
    orders: &ModuleHandle<B>,
    order: tables::NewOrder,
) -> tickbox::Result<()> {
    // A connection lost during COMMIT leaves it unknown whether the order
    // committed: it keeps its id across tries, so a try that finds it
    // already there knows the earlier one did.
    let mut tried = false;
    faults::retrying("placing an order", || {
        let order = order.clone();
        let retry = std::mem::replace(&mut tried, true);
        orders.transaction(async move |tx| {
            let placed = OrderPlaced::of(&order);
            match B::insert_order(tx.conn(), order).await {
                Err(DatabaseError(DatabaseErrorKind::UniqueViolation, _)) if retry => return Ok(()),
                inserted => inserted?,
            }
            tx.publish(&placed)?;
            Ok::<_, tickbox::Error>(())
        })
    })
    .await
}

/// Places `n` orders, one transaction each, `interval` apart
/// (`--order-interval`), until done or Ctrl-C; how many it placed. The run
/// is recorded while it places (see `flow::Placing`).
async fn place_orders<B: ShopDb>(
    shop: &Shop<B>,
    bus: &BusHandle<B>,
    n: u64,
    interval: Duration,
    stop: &CancellationToken,
    progress: &mut Progress,
) -> tickbox::Result<u64> {
    let started = Instant::now();
    let orders = (shop.orders.as_ref()).expect("a process placing orders runs the orders module");
    let mut run = flow::Placing::start(orders, n).await?;
    let mut placed = 0;
    let placing = async {
        while placed < n && !stop.is_cancelled() {
            // Ctrl-C does not wait for the order being placed: its
            // transaction runs in its own task and commits or not, whole.
            // The progress keeps moving while it waits for the database.
            let order = place_order(orders, tables::NewOrder::random());
            tokio::pin!(order);
            let stopped = loop {
                tokio::select! {
                    placing = &mut order => {
                        placing?;
                        break false;
                    }
                    () = stop.cancelled() => break true,
                    () = tokio::time::sleep(progress.every()) => {
                        progress.placing(placed, n, &bus.metrics());
                    }
                }
            };
            if stopped {
                break;
            }
            placed += 1;
            run.keep_alive().await?;
            if progress.due() {
                progress.placing(placed, n, &bus.metrics());
            }
            if !interval.is_zero() && placed < n {
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = stop.cancelled() => {}
                }
            }
        }
        Ok::<_, tickbox::Error>(())
    }
    .await;
    // Recorded as ended however the placing ended; when interrupted, only
    // if the database answers soon (otherwise the run's lease ends it).
    let ended = if stop.is_cancelled() {
        tokio::time::timeout(Duration::from_secs(5), run.end())
            .await
            .unwrap_or(Ok(()))
    } else {
        run.end().await
    };
    placing.and(ended)?;
    if progress.drawn() {
        progress.placing(placed, n, &bus.metrics());
    }
    progress.finish();
    tracing::info!(
        "placed {placed}/{n} orders in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    Ok(placed)
}

// ---------------------------------------------------------------------------
// 6. Waiting until the flow is done.

/// Polls until the flow is done, as far as this process can see — or the
/// bus is idle while dead letters hold up the rest; until `deadline` or
/// Ctrl-C otherwise.
///
/// Done, when the orders database is seen here (always over the local
/// transport): the bus is idle (`BusHandle::wait_idle`: nothing in memory,
/// pending in its outboxes or, over amqp, in its handlers' queues), nothing
/// is pending in any outbox seen, every order is confirmed (and e-mailed, if
/// the notifications database is seen) or rejected, and no run is still placing
/// orders. Without the orders database (over amqp, the warehouse or the
/// notifications alone): the bus has been idle for `--settle` on end since
/// its database holds work (`flow::Settle`).
///
/// Without a deadline, a process running all three modules gives itself a
/// minute plus 20 ms per order; one running some of them waits as long as
/// the others take.
async fn wait_until_done<B: ShopDb>(
    shop: &Shop<B>,
    bus: &BusHandle<B>,
    args: &Args,
    deadline: Option<Instant>,
    stop: &CancellationToken,
    progress: &mut Progress,
) -> tickbox::Result<Drain> {
    if stop.is_cancelled() {
        return Ok(Drain::Interrupted);
    }
    let over_amqp = args.over_amqp();
    let mut counts = Counts::read(shop).await?;
    let orders = counts.orders.unwrap_or(0);
    let allowance = Duration::from_secs(60) + Duration::from_millis(20) * orders as u32;
    let deadline = deadline.or_else(|| args.runs_all().then(|| Instant::now() + allowance));
    // Over amqp the process running the orders module needs no other run
    // placing orders; over the local transport one running all modules.
    let places_here = if over_amqp {
        args.runs(ModuleName::Orders)
    } else {
        args.runs_all()
    };
    let least_runs = flow::least_placing_runs(args.placers, places_here);
    let mut settle = flow::Settle::new(args.settle);
    let drain = loop {
        if stop.is_cancelled() {
            break Drain::Interrupted;
        }
        // The runs are read before the counts, so that every order of a run
        // seen done is in the counts, and after them, so that a run that
        // starts (and perhaps ends) meanwhile shows.
        let runs_before = match &shop.orders {
            Some(orders) => Some(flow::placing_runs(orders).await?),
            None => None,
        };
        counts = Counts::read(shop).await?;
        let idle = flow::bus_idle(bus, over_amqp).await? && counts.pending == 0;
        let runs = match &shop.orders {
            Some(orders) => Some(flow::placing_runs(orders).await?),
            None => None,
        };
        let done = match (&runs_before, &runs) {
            (Some(before), Some(runs)) => {
                idle && counts.complete()
                    && flow::placing_done(before, least_runs)
                    && runs.len() == before.len()
                    && flow::placing_done(runs, least_runs)
            }
            _ => settle.over(counts.hold_work(), idle),
        };
        if done {
            break Drain::Finished;
        }
        if idle && flow::dead_letters(shop).await? > 0 {
            // With `--email-policy at-most-once`, an e-mail a crash cut
            // short is one of them, as the policy means it to be; the
            // check tells whether they all are.
            tracing::warn!("stopped waiting: nothing is pending, but dead letters hold up orders");
            break Drain::Finished;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let what =
                flow::unfinished(shop, bus, counts, runs.as_deref(), least_runs, over_amqp).await?;
            tracing::error!("timed out: {what}");
            break Drain::TimedOut(what);
        }
        if progress.due() {
            progress.draining(&counts);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
            () = stop.cancelled() => {}
        }
    };
    if progress.drawn() {
        progress.draining(&counts);
    }
    progress.finish();
    Ok(drain)
}

// ---------------------------------------------------------------------------
// 7. The run: start, place, wait, stop the bus, check the databases.

async fn run<B: ShopDb>(
    args: &Args,
    module: impl Fn(&str) -> ModuleBuilder<B>,
    elsewhere: impl AsyncFn(&'static str) -> Result<Option<ModuleBuilder<B>>, String>,
    stop: &CancellationToken,
) -> Result<report::Report, String> {
    let started = Instant::now();
    let mut shop = start_modules(args, module)
        .await
        .map_err(|e| e.to_string())?;
    open_elsewhere(&mut shop, args, elsewhere).await?;
    run_shop(&shop, args, started, stop)
        .await
        .map_err(|e| e.to_string())
}

/// The run, once the modules are open.
async fn run_shop<B: ShopDb>(
    shop: &Shop<B>,
    args: &Args,
    started: Instant,
    stop: &CancellationToken,
) -> tickbox::Result<report::Report> {
    let deadline = args.timeout.map(|timeout| started + timeout);
    let bus = start_bus(shop, args, deadline, stop).await?;

    let mut progress = Progress::new();
    let to_place = args.orders();
    let (mut placed, mut place_seconds) = (0, 0.0);
    let mut disturbed = None;
    let waited = Instant::now();
    // Stop the bus whatever happens in here.
    let drain = async {
        if args.resume {
            tracing::info!("resuming: placing no orders, finishing pending work");
        }
        // A message committed before its handlers subscribed would reach
        // none of them: wait for every process's handlers first. Over amqp
        // there is nothing to wait for: a message no queue is bound for yet
        // stays in the outbox, published again until the handler's service
        // has declared its queue.
        if (to_place > 0 || args.disturb) && !args.over_amqp() {
            let subscribed = flow::await_subscriptions(shop, deadline, stop).await?;
            if subscribed != Drain::Finished {
                return Ok(subscribed);
            }
        }
        if to_place > 0 {
            let placing = Instant::now();
            placed = place_orders(
                shop,
                &bus,
                to_place,
                args.order_interval,
                stop,
                &mut progress,
            )
            .await?;
            place_seconds = placing.elapsed().as_secs_f64();
            if placed < to_place {
                return Ok(Drain::Interrupted);
            }
        }
        let orders = shop.orders.as_ref();
        let targets = match orders.filter(|_| args.disturb) {
            Some(orders) => Some(disturb::Targets::place(orders).await?),
            None => None,
        };
        let drain = wait_until_done(shop, &bus, args, deadline, stop, &mut progress).await?;
        let Some(targets) = targets.filter(|_| drain == Drain::Finished) else {
            return Ok(drain);
        };
        // The flow is done and the targets settled: disturb them, then wait
        // for whatever the disturbing messages set off (nothing, when the
        // handlers ignore them).
        disturbed = Some(disturb::deliver(shop, &targets).await?);
        wait_until_done(shop, &bus, args, deadline, stop, &mut progress).await
    }
    .await;
    progress.finish();
    if matches!(drain, Ok(Drain::Interrupted)) {
        tracing::info!("stopping the bus: running deliveries finish, the rest stays pending");
    }
    bus.stop().await;
    let drain = drain?;
    let drain_seconds = waited.elapsed().as_secs_f64() - place_seconds;

    // The check: everything below is read from the databases seen here,
    // after the bus stopped.
    let snapshot = check::Snapshot::read(shop).await?;
    let stores = flow::store_stats(shop).await?;
    let metrics = bus.metrics();
    // The bus samples its queues' depths while it runs; the report gives
    // them as they are now, after the drain.
    #[cfg(feature = "amqp")]
    let depths_at_end = match &metrics.amqp {
        Some(amqp) => report::Broker::read_depths(&broker(args), amqp).await,
        None => Vec::new(),
    };
    Ok(report::Report {
        backend: B::NAME,
        modules: args.module_names(),
        all_modules: args.runs_all(),
        seen: shop.seen().iter().map(|(name, _)| *name).collect(),
        broker: args.over_amqp().then(|| report::Broker {
            url: tickbox::redact_url(&args.amqp_url),
            namespace: args.amqp_namespace.clone(),
            exchange: format!("tickbox.{}", args.amqp_namespace),
            #[cfg(feature = "amqp")]
            metrics: metrics.amqp.clone(),
            #[cfg(feature = "amqp")]
            depths_at_end,
        }),
        run: report::ThisRun {
            placed,
            to_place,
            metrics: report::final_metrics(metrics, &stores),
            place_seconds,
            drain_seconds,
            total_seconds: started.elapsed().as_secs_f64(),
        },
        databases: report::Databases {
            orders: snapshot.orders.as_ref().map(Vec::len),
            reservations: snapshot.reservations.as_ref().map(Vec::len),
            confirmations: snapshot.confirmations(),
            rejected: snapshot.rejected(),
            emails: snapshot.emails.as_ref().map(Vec::len),
            emails_sent: snapshot.mail.as_ref().map(|mail| mail.sent),
            effects_unknown: snapshot.mail.as_ref().map(|mail| mail.unknown),
            awaiting_a_person: snapshot
                .mail
                .as_ref()
                .map_or(0, |mail| mail.awaiting_a_person.len()),
            pending: stores.iter().map(|(_, s)| s.outbox_pending).sum(),
            dead_letters: stores.iter().map(|(_, s)| s.dead_letters).sum(),
        },
        problems: check::verify(&snapshot)
            .into_iter()
            .chain(disturbed.as_deref().and_then(disturb::applied))
            .collect(),
        ignored: report::Ignored {
            saga: snapshot.saga_ignored,
            warehouse: snapshot.warehouse_ignored,
        },
        disturbed,
        drain,
    })
}

/// Over amqp, finds the database of `module` (run by another process) with
/// `found`, waiting for it to appear; `None` without check flags.
async fn find_elsewhere<T>(
    args: &Args,
    module: &str,
    looked_in: &str,
    stop: &CancellationToken,
    found: impl AsyncFnMut() -> Option<T>,
) -> Result<Option<T>, String> {
    let deadline = args.timeout.map(|timeout| Instant::now() + timeout);
    match elsewhere::wait_for(module, looked_in, deadline, stop, found).await {
        Ok(Some(location)) => Ok(Some(location)),
        Ok(None) => Err(format!(
            "interrupted while waiting for the {module} database"
        )),
        Err(error) => Err(error),
    }
}

/// The run on a server where each module has a named schema (PostgreSQL)
/// or database (MariaDB/MySQL), `PREFIX_MODULE` (`--schema-prefix`,
/// `minishop` unless given), on the server `url`
/// names; over amqp the other processes' are looked for with
/// `--check-database-url`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn run_in_schemas<B: ShopDb + elsewhere::NamedSchemas>(
    args: &Args,
    url: &str,
    stop: &CancellationToken,
) -> Result<report::Report, String> {
    let schema = |name: &str| format!("{}_{name}", args.schema_prefix);
    let module =
        |name: &str, url: &str| tickbox::Module::<B>::builder(name, url).schema(schema(name));
    let CheckStore::Servers(urls) = args.check_store() else {
        unreachable!("a server's modules are checked on servers")
    };
    let looked_in = elsewhere::urls_text(urls);
    let elsewhere = async |name: &'static str| {
        if urls.is_empty() {
            return Ok(None);
        }
        let schema = schema(name);
        let found = async || elsewhere::schema_url::<B>(urls, &schema).await;
        let url = find_elsewhere(args, name, &looked_in, stop, found).await?;
        Ok(url.map(|url| module(name, url)))
    };
    run(args, |name| module(name, url), elsewhere, stop).await
}

#[actix::main]
async fn main() -> ExitCode {
    let args = Args::parse_or_exit();
    progress::init_logging();
    // From here on Ctrl-C asks the run to stop; a second one quits.
    let stop = shutdown::on_ctrl_c();
    if let Some(addr) = args.metrics_addr {
        if let Err((error, code)) = report::serve_metrics(addr) {
            report::print_error(&error, args.json);
            return ExitCode::from(code);
        }
    }

    if args.over_amqp() && !cfg!(feature = "amqp") {
        report::print_error(
            "--transport amqp needs the `amqp` feature: cargo run --release --features amqp \
             --example minishop -- --transport amqp",
            args.json,
        );
        return ExitCode::from(2);
    }

    let result = match args.store() {
        Store::Sqlite(dir) => match std::fs::create_dir_all(dir) {
            Ok(()) => {
                let file = |dir: &std::path::Path, name: &str| {
                    dir.join(format!("{name}.db")).display().to_string()
                };
                let module =
                    |name: &str| tickbox::Module::<tickbox::Sqlite>::builder(name, file(dir, name));
                let CheckStore::Sqlite(dirs) = args.check_store() else {
                    unreachable!("SQLite checks SQLite files")
                };
                let looked_in = elsewhere::dirs_text(dirs);
                let elsewhere = async |name: &'static str| {
                    if dirs.is_empty() {
                        return Ok(None);
                    }
                    let found = async || elsewhere::sqlite_file(dirs, name);
                    let path = find_elsewhere(&args, name, &looked_in, &stop, found).await?;
                    Ok(path.map(|path| {
                        tickbox::Module::<tickbox::Sqlite>::builder(
                            name,
                            path.display().to_string(),
                        )
                    }))
                };
                run(&args, module, elsewhere, &stop).await
            }
            Err(e) => Err(format!(
                "cannot create the data directory {}: {e}",
                dir.display()
            )),
        },
        #[cfg(feature = "postgres")]
        Store::Postgres(url) => run_in_schemas::<tickbox::Postgres>(&args, url, &stop).await,
        #[cfg(not(feature = "postgres"))]
        Store::Postgres(url) => Err(format!(
            "--database-url {} needs the `postgres` feature: cargo run --release --features \
             postgres --example minishop -- --database-url postgres://...",
            tickbox::redact_url(url)
        )),
        #[cfg(feature = "mysql")]
        Store::Mysql(url) => run_in_schemas::<tickbox::Mysql>(&args, url, &stop).await,
        #[cfg(not(feature = "mysql"))]
        Store::Mysql(url) => Err(format!(
            "--database-url {} needs the `mysql` feature: cargo run --release --features \
             mysql --example minishop -- --database-url mysql://...",
            tickbox::redact_url(url)
        )),
    };
    match result {
        Ok(report) if args.json => {
            println!("{}", report.json());
            report.exit_code()
        }
        Ok(report) => {
            report.print();
            report.exit_code()
        }
        Err(error) => {
            report::print_error(&error, args.json);
            if stop.is_cancelled() {
                ExitCode::from(130)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}
