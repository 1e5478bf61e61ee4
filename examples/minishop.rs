//! MiniShop: three modules of a modular monolith, each with its own database,
//! talking only through tickbox messages.
//!
//! - **orders** places orders, each in its own transaction that also publishes
//!   `OrderPlaced`; on `StockReserved` it confirms the order (status and a
//!   `confirmations` counter) and publishes `OrderConfirmed`.
//! - **warehouse**, on `OrderPlaced`, takes the stock and records a
//!   reservation (one per order: it checks for an existing reservation before
//!   inserting, and `order_id` is the table's key), then publishes
//!   `StockReserved`.
//! - **notifications**, on `OrderConfirmed`, "sends" the confirmation e-mail:
//!   a row in its `sent_emails` table, written in the handler's transaction,
//!   and a log line.
//!
//! It shows the transactional outbox (a message exists iff its transaction
//! commits), at-least-once delivery with retries, and the inbox turning that
//! into exactly-once effects: `--duplicate-rate` makes the bus deliver
//! messages twice on purpose, `--fail-rate` makes handlers fail after doing
//! their work but before COMMIT. Kill it at any moment (even `kill -9`) and run
//! it again with `--resume`: it finishes the pending work. At the end it checks
//! the databases: every order has exactly one reservation, was confirmed
//! exactly once and has exactly one e-mail, no outbox message is pending and
//! no delivery was given up on (dead-lettered).
//!
//! Run it with:
//!
//! ```text
//! cargo run --release --example minishop -- [--orders N] [--data-dir DIR | --database-url postgres://…] [--resume] [--modules LIST] [--timeout SECONDS] [--duplicate-rate P] [--fail-rate P] [--metrics-addr HOST:PORT] [--json]
//! ```
//!
//! The three modules may also run as separate processes over the same
//! databases (`--modules orders`, `--modules warehouse,notifications`, …;
//! any split, and several processes of one module). Each process opens all
//! three databases but runs only the listed modules' handlers; tickbox
//! records every handler's subscription in the publishing module's database,
//! so each message reaches the handlers of every process. A process running
//! the orders module waits until the whole flow's handlers have subscribed
//! before it places orders (a message committed before any handler of its
//! topic subscribed is kept for none), and records its placing run so that
//! the others know more orders are coming. Every process runs until the whole
//! flow is done and checked, or until `--timeout`, which names what is
//! unfinished:
//!
//! ```text
//! minishop --data-dir D --modules orders --orders 2000 &
//! minishop --data-dir D --modules warehouse &
//! minishop --data-dir D --modules notifications &
//! ```
//!
//! SQLite (the default) keeps one file per module under `./minishop-data`.
//! `--database-url` needs the `postgres` feature
//! (`cargo run --release --features postgres --example minishop -- --database-url postgres://…`)
//! and puts each module in its own schema: `minishop_orders`,
//! `minishop_warehouse`, `minishop_notifications`. `RUST_LOG` sets the log
//! filter (default `warn,minishop=info`); logs go to stderr, the summary to
//! stdout, and with `--json` the last line of stdout is one JSON object
//! (its `metrics` key holds the bus's final metrics snapshot, `BusMetrics`).
//!
//! `--metrics-addr HOST:PORT` serves the metrics in Prometheus's text format
//! at `http://HOST:PORT/metrics` for as long as the run lasts (the endpoint
//! closes when the process exits); it needs the `prometheus` feature
//! (`cargo run --release --features prometheus --example minishop -- --metrics-addr 127.0.0.1:9898`).
//!
//! While it runs it shows its progress on stderr: a progress bar redrawn in
//! place when stderr is a terminal, otherwise a log line every 2 s. At the end
//! it prints a table of the bus's metrics: per handler the deliveries handled,
//! duplicates skipped, failed attempts, retries and dead letters, and the
//! p50/p99 (upper bounds of histogram buckets) and mean of the handler
//! transaction's time and of the end-to-end time from publishing to handling;
//! per module the outbox messages delivered and still pending.
//!
//! Ctrl-C (SIGINT) stops cleanly: no further orders are placed, the bus stops
//! (deliveries already running finish; everything else stays pending in the
//! outboxes), the summary reports the run as interrupted and the exit code is
//! 130; `--resume` then finishes the work (it places no new orders). A second
//! Ctrl-C quits at once, which is as safe as a crash.
//!
//! The exit code is 0 when the check passes, 1 when it fails, 2 for bad
//! arguments (or `--metrics-addr` in a build without the `prometheus`
//! feature), 130 when interrupted.

use diesel_async::SimpleAsyncConnection;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io::{IsTerminal, Write};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tickbox::{
    Backend, Bus, BusHandle, BusMetrics, Handler, HandlerError, HandlerOptions, LatencyMetrics,
    Message, ModuleBuilder, ModuleHandle, RetryPolicy, StoreStats, Tx,
};

// ---------------------------------------------------------------------------
// Messages

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
// The modules' own tables

/// Items the warehouse stocks, and how many of each it starts with.
const SKUS: [&str; 5] = ["kettle", "teapot", "mug", "spoon", "tea-tin"];
const SEEDED_STOCK: i64 = 1_000_000_000;

/// DDL written to run unchanged on SQLite and PostgreSQL.
const ORDERS_DDL: &str = "
    CREATE TABLE IF NOT EXISTS orders (
        id              TEXT PRIMARY KEY NOT NULL,
        customer        TEXT NOT NULL,
        sku             TEXT NOT NULL,
        quantity        INTEGER NOT NULL,
        status          TEXT NOT NULL,
        confirmations   INTEGER NOT NULL DEFAULT 0,
        placed_at_us    BIGINT NOT NULL,
        confirmed_at_us BIGINT
    );
    -- One row per run that places orders, so that processes running other
    -- modules know whether more orders are coming. A run renews
    -- alive_until_us while it places; one killed meanwhile stops renewing.
    CREATE TABLE IF NOT EXISTS placing_runs (
        id             TEXT PRIMARY KEY NOT NULL,
        planned        BIGINT NOT NULL,
        started_at_us  BIGINT NOT NULL,
        alive_until_us BIGINT NOT NULL,
        ended_at_us    BIGINT
    );";

const WAREHOUSE_DDL: &str = "
    CREATE TABLE IF NOT EXISTS stock (
        sku       TEXT PRIMARY KEY NOT NULL,
        seeded    BIGINT NOT NULL,
        available BIGINT NOT NULL
    );
    CREATE TABLE IF NOT EXISTS reservations (
        order_id       TEXT PRIMARY KEY NOT NULL,
        sku            TEXT NOT NULL,
        quantity       INTEGER NOT NULL,
        reserved_at_us BIGINT NOT NULL
    );";

/// Deliberately no unique key on `order_id`: a second e-mail for an order
/// would be a second row, which the final check counts.
const NOTIFICATIONS_DDL: &str = "
    CREATE TABLE IF NOT EXISTS sent_emails (
        id              TEXT PRIMARY KEY NOT NULL,
        order_id        TEXT NOT NULL,
        recipient       TEXT NOT NULL,
        subject         TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        sent_at_us      BIGINT NOT NULL
    );
    CREATE INDEX IF NOT EXISTS sent_emails_order_id ON sent_emails (order_id);";

mod schema {
    diesel::table! {
        orders (id) {
            id -> Text,
            customer -> Text,
            sku -> Text,
            quantity -> Integer,
            status -> Text,
            confirmations -> Integer,
            placed_at_us -> BigInt,
            confirmed_at_us -> Nullable<BigInt>,
        }
    }

    diesel::table! {
        placing_runs (id) {
            id -> Text,
            planned -> BigInt,
            started_at_us -> BigInt,
            alive_until_us -> BigInt,
            ended_at_us -> Nullable<BigInt>,
        }
    }

    diesel::table! {
        stock (sku) {
            sku -> Text,
            seeded -> BigInt,
            available -> BigInt,
        }
    }

    diesel::table! {
        reservations (order_id) {
            order_id -> Text,
            sku -> Text,
            quantity -> Integer,
            reserved_at_us -> BigInt,
        }
    }

    diesel::table! {
        sent_emails (id) {
            id -> Text,
            order_id -> Text,
            recipient -> Text,
            subject -> Text,
            idempotency_key -> Text,
            sent_at_us -> BigInt,
        }
    }
}

#[derive(Debug, Clone, diesel::Insertable)]
#[diesel(table_name = schema::orders)]
struct NewOrder {
    id: String,
    customer: String,
    sku: String,
    quantity: i32,
    status: String,
    confirmations: i32,
    placed_at_us: i64,
}

#[derive(Debug, Clone, diesel::Insertable)]
#[diesel(table_name = schema::reservations)]
struct NewReservation {
    order_id: String,
    sku: String,
    quantity: i32,
    reserved_at_us: i64,
}

#[derive(Debug, Clone, diesel::Insertable)]
#[diesel(table_name = schema::sent_emails)]
struct NewEmail {
    id: String,
    order_id: String,
    recipient: String,
    subject: String,
    idempotency_key: String,
    sent_at_us: i64,
}

/// What the final check reads from the three databases.
#[derive(Debug, Default)]
struct Snapshot {
    /// (id, status, confirmations)
    orders: Vec<(String, String, i32)>,
    /// (order_id, sku, quantity)
    reservations: Vec<(String, String, i32)>,
    /// (sku, seeded, available)
    stock: Vec<(String, i64, i64)>,
    /// order_id of every e-mail sent
    emails: Vec<String>,
}

// ---------------------------------------------------------------------------
// Queries, compiled once per backend

/// The MiniShop queries. diesel checks a query against a concrete connection
/// type, so they are written once in [`shop_queries!`] and expanded in an impl
/// per backend; handlers and the rest of the example are generic over `Shop`.
trait Shop: Backend {
    /// A module builder on this backend: `location` is the SQLite data
    /// directory or the PostgreSQL URL.
    fn module(location: &str, name: &str) -> ModuleBuilder<Self>;

    fn insert_order(
        conn: &mut Self::Connection,
        order: NewOrder,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;

    /// Confirms an order; its customer, or `None` if there is no such order.
    fn confirm_order(
        conn: &mut Self::Connection,
        order_id: String,
        now_us: i64,
    ) -> impl Future<Output = diesel::QueryResult<Option<String>>> + Send;

    fn reservation_exists(
        conn: &mut Self::Connection,
        order_id: String,
    ) -> impl Future<Output = diesel::QueryResult<bool>> + Send;

    /// Locks every stock row, in sku order, until the transaction ends (see
    /// [`ReserveStock`] for why).
    fn lock_stock(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;

    /// Takes the stock and records the reservation; false if out of stock.
    fn reserve(
        conn: &mut Self::Connection,
        reservation: NewReservation,
    ) -> impl Future<Output = diesel::QueryResult<bool>> + Send;

    fn insert_email(
        conn: &mut Self::Connection,
        email: NewEmail,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;

    /// (orders, confirmed orders)
    fn order_progress(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = diesel::QueryResult<(i64, i64)>> + Send;

    fn email_count(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = diesel::QueryResult<i64>> + Send;

    /// Records that run `id` starts placing `planned` orders, alive for a
    /// [`RUN_LEASE`].
    fn start_run(
        conn: &mut Self::Connection,
        id: String,
        planned: i64,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;

    /// Renews run `id`'s lease.
    fn renew_run(
        conn: &mut Self::Connection,
        id: String,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;

    /// Records that run `id` places no more orders.
    fn end_run(
        conn: &mut Self::Connection,
        id: String,
    ) -> impl Future<Output = diesel::QueryResult<()>> + Send;

    /// Every run that ever placed orders: (id, planned, still placing).
    fn load_runs(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = diesel::QueryResult<Vec<(String, i64, bool)>>> + Send;

    fn load_orders(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = diesel::QueryResult<Vec<(String, String, i32)>>> + Send;

    fn load_reservations(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = diesel::QueryResult<Vec<(String, String, i32)>>> + Send;

    fn load_stock(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = diesel::QueryResult<Vec<(String, i64, i64)>>> + Send;

    fn load_email_orders(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = diesel::QueryResult<Vec<String>>> + Send;
}

macro_rules! shop_queries {
    () => {
        async fn insert_order(
            conn: &mut Self::Connection,
            order: NewOrder,
        ) -> diesel::QueryResult<()> {
            use diesel_async::RunQueryDsl;
            diesel::insert_into(schema::orders::table)
                .values(order)
                .execute(conn)
                .await
                .map(drop)
        }

        async fn confirm_order(
            conn: &mut Self::Connection,
            order_id: String,
            now_us: i64,
        ) -> diesel::QueryResult<Option<String>> {
            use diesel::{ExpressionMethods, OptionalExtension, QueryDsl};
            use diesel_async::RunQueryDsl;
            use schema::orders::dsl as o;
            // The counter is incremented unconditionally, so that confirming
            // an order twice would show; the inbox is what prevents it.
            let updated = diesel::update(o::orders.find(&order_id))
                .set((
                    o::status.eq("confirmed"),
                    o::confirmations.eq(o::confirmations + 1),
                    o::confirmed_at_us.eq(now_us),
                ))
                .execute(conn)
                .await?;
            if updated == 0 {
                return Ok(None);
            }
            o::orders
                .find(&order_id)
                .select(o::customer)
                .first::<String>(conn)
                .await
                .optional()
        }

        async fn reservation_exists(
            conn: &mut Self::Connection,
            order_id: String,
        ) -> diesel::QueryResult<bool> {
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use schema::reservations::dsl as r;
            let n: i64 = r::reservations
                .filter(r::order_id.eq(order_id))
                .count()
                .get_result(conn)
                .await?;
            Ok(n > 0)
        }

        async fn reserve(
            conn: &mut Self::Connection,
            reservation: NewReservation,
        ) -> diesel::QueryResult<bool> {
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use schema::stock::dsl as s;
            let quantity = i64::from(reservation.quantity);
            let taken = diesel::update(
                s::stock
                    .filter(s::sku.eq(&reservation.sku))
                    .filter(s::available.ge(quantity)),
            )
            .set(s::available.eq(s::available - quantity))
            .execute(conn)
            .await?;
            if taken == 0 {
                return Ok(false);
            }
            diesel::insert_into(schema::reservations::table)
                .values(reservation)
                .execute(conn)
                .await?;
            Ok(true)
        }

        async fn insert_email(
            conn: &mut Self::Connection,
            email: NewEmail,
        ) -> diesel::QueryResult<()> {
            use diesel_async::RunQueryDsl;
            diesel::insert_into(schema::sent_emails::table)
                .values(email)
                .execute(conn)
                .await
                .map(drop)
        }

        async fn order_progress(conn: &mut Self::Connection) -> diesel::QueryResult<(i64, i64)> {
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use schema::orders::dsl as o;
            let all: i64 = o::orders.count().get_result(conn).await?;
            let confirmed: i64 = o::orders
                .filter(o::status.eq("confirmed"))
                .count()
                .get_result(conn)
                .await?;
            Ok((all, confirmed))
        }

        async fn email_count(conn: &mut Self::Connection) -> diesel::QueryResult<i64> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            schema::sent_emails::table.count().get_result(conn).await
        }

        async fn start_run(
            conn: &mut Self::Connection,
            id: String,
            planned: i64,
        ) -> diesel::QueryResult<()> {
            use diesel::ExpressionMethods;
            use diesel_async::RunQueryDsl;
            use schema::placing_runs::dsl as r;
            let now = now_us();
            diesel::insert_into(r::placing_runs)
                .values((
                    r::id.eq(id),
                    r::planned.eq(planned),
                    r::started_at_us.eq(now),
                    r::alive_until_us.eq(now + RUN_LEASE.as_micros() as i64),
                ))
                .execute(conn)
                .await
                .map(drop)
        }

        async fn renew_run(conn: &mut Self::Connection, id: String) -> diesel::QueryResult<()> {
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use schema::placing_runs::dsl as r;
            diesel::update(r::placing_runs.find(id))
                .set(r::alive_until_us.eq(now_us() + RUN_LEASE.as_micros() as i64))
                .execute(conn)
                .await
                .map(drop)
        }

        async fn end_run(conn: &mut Self::Connection, id: String) -> diesel::QueryResult<()> {
            use diesel::{ExpressionMethods, QueryDsl};
            use diesel_async::RunQueryDsl;
            use schema::placing_runs::dsl as r;
            diesel::update(r::placing_runs.find(id))
                .set(r::ended_at_us.eq(now_us()))
                .execute(conn)
                .await
                .map(drop)
        }

        async fn load_runs(
            conn: &mut Self::Connection,
        ) -> diesel::QueryResult<Vec<(String, i64, bool)>> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use schema::placing_runs::dsl as r;
            let now = now_us();
            let runs: Vec<(String, i64, i64, Option<i64>)> = r::placing_runs
                .select((r::id, r::planned, r::alive_until_us, r::ended_at_us))
                .load(conn)
                .await?;
            Ok(runs
                .into_iter()
                .map(|(id, planned, alive_until, ended)| {
                    (id, planned, ended.is_none() && alive_until > now)
                })
                .collect())
        }

        async fn load_orders(
            conn: &mut Self::Connection,
        ) -> diesel::QueryResult<Vec<(String, String, i32)>> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use schema::orders::dsl as o;
            o::orders
                .select((o::id, o::status, o::confirmations))
                .load(conn)
                .await
        }

        async fn load_reservations(
            conn: &mut Self::Connection,
        ) -> diesel::QueryResult<Vec<(String, String, i32)>> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use schema::reservations::dsl as r;
            r::reservations
                .select((r::order_id, r::sku, r::quantity))
                .load(conn)
                .await
        }

        async fn load_stock(
            conn: &mut Self::Connection,
        ) -> diesel::QueryResult<Vec<(String, i64, i64)>> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use schema::stock::dsl as s;
            s::stock
                .select((s::sku, s::seeded, s::available))
                .load(conn)
                .await
        }

        async fn load_email_orders(
            conn: &mut Self::Connection,
        ) -> diesel::QueryResult<Vec<String>> {
            use diesel::QueryDsl;
            use diesel_async::RunQueryDsl;
            use schema::sent_emails::dsl as e;
            e::sent_emails.select(e::order_id).load(conn).await
        }
    };
}

#[cfg(feature = "sqlite")]
impl Shop for tickbox::Sqlite {
    fn module(location: &str, name: &str) -> ModuleBuilder<Self> {
        let path = std::path::Path::new(location).join(format!("{name}.db"));
        tickbox::Module::builder(name, path.to_string_lossy().into_owned())
    }

    /// Nothing to do: a write transaction on SQLite (`BEGIN IMMEDIATE`)
    /// holds the whole database's one write lock from its start, so two of
    /// them never hold rows the other waits for.
    async fn lock_stock(_conn: &mut Self::Connection) -> diesel::QueryResult<()> {
        Ok(())
    }

    shop_queries!();
}

#[cfg(feature = "postgres")]
impl Shop for tickbox::Postgres {
    fn module(location: &str, name: &str) -> ModuleBuilder<Self> {
        tickbox::Module::builder(name, location).schema(format!("minishop_{name}"))
    }

    /// `SELECT sku FROM stock ORDER BY sku FOR NO KEY UPDATE`: the rows are
    /// locked one after the other in the sort's order. `NO KEY UPDATE` is
    /// the lock the later `UPDATE` of `available` takes anyway, so running
    /// this again in the same transaction, on rows it already locked or
    /// updated, waits for nobody.
    async fn lock_stock(conn: &mut Self::Connection) -> diesel::QueryResult<()> {
        use diesel::QueryDsl;
        use diesel_async::RunQueryDsl;
        use schema::stock::dsl as s;
        s::stock
            .select(s::sku)
            .order(s::sku)
            .for_no_key_update()
            .load::<String>(conn)
            .await
            .map(drop)
    }

    shop_queries!();
}

/// How long a run placing orders counts as placing without renewing its
/// row: a run killed while placing holds the other processes back this long.
const RUN_LEASE: Duration = Duration::from_secs(5);

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

// ---------------------------------------------------------------------------
// Handlers

/// Handler names: part of each inbox row's key, so stable across releases.
const CONFIRM_ORDER: &str = "orders.confirm_order";
const RESERVE_STOCK: &str = "warehouse.reserve_stock";
const SEND_CONFIRMATION: &str = "notifications.send_confirmation";

/// orders: `StockReserved` → confirm the order, publish `OrderConfirmed`.
struct ConfirmOrder;

impl<B: Shop> Handler<B> for ConfirmOrder {
    type Message = StockReserved;

    async fn handle(&self, tx: &mut Tx<B>, reserved: StockReserved) -> Result<(), HandlerError> {
        let order_id = reserved.order_id;
        let Some(customer) = B::confirm_order(tx.conn(), order_id.clone(), now_us()).await? else {
            // Cannot happen here: the order commits before OrderPlaced exists.
            return Err(HandlerError::msg(format!("no order {order_id}")));
        };
        tx.publish(&OrderConfirmed { order_id, customer })?;
        Ok(())
    }
}

/// warehouse: `OrderPlaced` → reserve stock, publish `StockReserved`.
///
/// It runs batched: up to 32 orders in one transaction, each taking the
/// stock of its own sku. Taken in the orders' order, two transactions
/// holding orders for skus A then B and for B then A would each lock one
/// row and wait for the other's: a deadlock, which PostgreSQL only breaks
/// after `deadlock_timeout` (1 s) by failing one of them, whose whole batch
/// then rolls back and is handled again one order at a time, so that a
/// stalled backlog took tens of seconds to drain. So every transaction
/// takes its stock rows in one global order, sku order, before it changes
/// any of them.
///
/// tickbox gives a handler no hook at the start of a batch's transaction,
/// nor a way to tell whether it is the first of the batch, so each call
/// locks every stock row in sku order (there are five) before its own
/// update: the first call of a transaction takes them all, and the later
/// ones find them held by their own transaction and wait for nobody. A
/// handler whose rows are not known in advance would lock, in the same
/// way, a parent row (say, its warehouse) that every transaction takes
/// first.
struct ReserveStock;

impl<B: Shop> Handler<B> for ReserveStock {
    type Message = OrderPlaced;

    async fn handle(&self, tx: &mut Tx<B>, order: OrderPlaced) -> Result<(), HandlerError> {
        B::lock_stock(tx.conn()).await?;
        // Idempotent in its own right, beyond the inbox: an order is reserved
        // once, whatever message asks for it. The reservation and its
        // StockReserved committed together, so there is nothing to redo.
        if B::reservation_exists(tx.conn(), order.order_id.clone()).await? {
            tracing::warn!(order_id = %order.order_id, "stock already reserved for this order; nothing to do");
            return Ok(());
        }
        let reservation = NewReservation {
            order_id: order.order_id.clone(),
            sku: order.sku.clone(),
            quantity: order.quantity,
            reserved_at_us: now_us(),
        };
        if !B::reserve(tx.conn(), reservation).await? {
            // The stock is seeded far above what any run orders.
            return Err(HandlerError::msg(format!("out of stock: {}", order.sku)));
        }
        tx.publish(&StockReserved {
            order_id: order.order_id,
            sku: order.sku,
            quantity: order.quantity,
        })?;
        Ok(())
    }
}

/// notifications: `OrderConfirmed` → "send" the confirmation e-mail.
struct SendConfirmation;

impl<B: Shop> Handler<B> for SendConfirmation {
    type Message = OrderConfirmed;

    async fn handle(&self, tx: &mut Tx<B>, confirmed: OrderConfirmed) -> Result<(), HandlerError> {
        let delivery = tx
            .delivery()
            .cloned()
            .ok_or_else(|| HandlerError::msg("a handler runs in a delivery"))?;
        // The same for every delivery of this message to this handler.
        let idempotency_key = delivery.idempotency_key();
        let email = NewEmail {
            id: uuid::Uuid::now_v7().to_string(),
            subject: format!("Your MiniShop order {} is confirmed", confirmed.order_id),
            order_id: confirmed.order_id,
            recipient: confirmed.customer,
            idempotency_key,
            sent_at_us: now_us(),
        };
        let (to, order_id, key) = (
            email.recipient.clone(),
            email.order_id.clone(),
            email.idempotency_key.clone(),
        );
        B::insert_email(tx.conn(), email).await?;
        // The row above commits or rolls back with the inbox row. This log
        // line (like a call to a real mail service) is outside the
        // transaction: an attempt that then fails, or a crash before COMMIT,
        // repeats it. A real mail service would be given the idempotency key,
        // which is the same on every attempt, to drop the repeat.
        tracing::info!(%to, %order_id, idempotency_key = %key, attempt = delivery.attempt, "sending confirmation e-mail");
        Ok(())
    }
}

/// Wraps a handler so that each invocation fails with probability
/// `fail_rate` after the handler did its work and before COMMIT: the inbox
/// row, the changes and any published message are rolled back, and the bus
/// retries the delivery.
struct Flaky<H> {
    inner: H,
    fail_rate: f64,
}

impl<B: Backend, H: Handler<B>> Handler<B> for Flaky<H> {
    type Message = H::Message;

    async fn handle(&self, tx: &mut Tx<B>, message: H::Message) -> Result<(), HandlerError> {
        self.inner.handle(tx, message).await?;
        if self.fail_rate > 0.0 && fastrand::f64() < self.fail_rate {
            return Err(HandlerError::msg(format!(
                "injected failure (--fail-rate {})",
                self.fail_rate
            )));
        }
        Ok(())
    }
}

fn flaky<H>(inner: H, fail_rate: f64) -> Flaky<H> {
    Flaky { inner, fail_rate }
}

// ---------------------------------------------------------------------------
// Command line

const USAGE: &str = "\
usage: minishop [--orders N] [--data-dir DIR | --database-url postgres://...] [--resume]
                [--modules LIST] [--timeout SECONDS]
                [--duplicate-rate P] [--fail-rate P] [--metrics-addr HOST:PORT] [--json]

  --orders N            place N new orders, then run until every outbox is drained (default 100;
                        only a process running the orders module places orders)
  --data-dir DIR        SQLite: one database file per module in DIR (default ./minishop-data)
  --database-url URL    PostgreSQL (needs the `postgres` feature): one schema per module,
                        minishop_orders, minishop_warehouse, minishop_notifications
  --resume              place no orders; only finish pending work (after a crash)
  --modules LIST        run only these modules' handlers, comma-separated from orders,
                        warehouse, notifications (default all three); other processes over the
                        same databases run the rest, and each runs until the whole flow is done
  --timeout SECONDS     give up after this long: exit 1 naming what is unfinished (default: a
                        deadline that grows with the orders when running all three modules,
                        none otherwise)
  --duplicate-rate P    deliver each message a second time with probability P (0..=1)
  --fail-rate P         make each handler invocation fail before COMMIT with probability P (0..=1)
  --metrics-addr HOST:PORT
                        serve the metrics for Prometheus at http://HOST:PORT/metrics while the
                        run lasts (needs the `prometheus` feature)
  --json                end with one line holding the result as a JSON object, with the final
                        metrics snapshot under `metrics`
  -h, --help            show this text

Progress goes to stderr (a progress bar on a terminal, a line every 2 s otherwise); the
summary, with a table of the final metrics, to stdout. Ctrl-C stops cleanly: no more
orders, running deliveries finish, the rest stays pending for --resume (exit code 130);
a second Ctrl-C quits at once.

exit code: 0 when every order has exactly one reservation, one confirmation and one
e-mail, no message is pending and there are no dead letters; 1 otherwise; 2 for bad
arguments (or --metrics-addr without the `prometheus` feature); 130 when interrupted";

#[derive(Debug)]
enum Store {
    Sqlite(String),
    Postgres(String),
}

/// Which modules' handlers this process runs (`--modules`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Roles {
    orders: bool,
    warehouse: bool,
    notifications: bool,
}

impl Roles {
    const ALL: Roles = Roles {
        orders: true,
        warehouse: true,
        notifications: true,
    };

    /// `orders,warehouse`, say.
    fn parse(list: &str) -> Result<Roles, String> {
        let mut roles = Roles {
            orders: false,
            warehouse: false,
            notifications: false,
        };
        for name in list.split(',').map(str::trim) {
            match name {
                "orders" => roles.orders = true,
                "warehouse" => roles.warehouse = true,
                "notifications" => roles.notifications = true,
                _ => {
                    return Err(format!(
                    "--modules takes a comma-separated list of orders, warehouse, notifications; \
                         `{name}` is none of them"
                ))
                }
            }
        }
        Ok(roles)
    }

    fn all(self) -> bool {
        self == Roles::ALL
    }

    /// The modules' names, as `--modules` takes them.
    fn names(self) -> Vec<&'static str> {
        [
            (self.orders, "orders"),
            (self.warehouse, "warehouse"),
            (self.notifications, "notifications"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

#[derive(Debug)]
struct Options {
    /// New orders to place (0 with `--resume`, or without the orders
    /// module).
    orders: u64,
    store: Store,
    resume: bool,
    /// The modules whose handlers run here.
    modules: Roles,
    /// Give up after this long.
    timeout: Option<Duration>,
    duplicate_rate: f64,
    fail_rate: f64,
    /// Where to serve the Prometheus endpoint.
    metrics_addr: Option<SocketAddr>,
    json: bool,
}

enum Parsed {
    Run(Options),
    Help,
}

fn parse_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> Result<Parsed, String> {
    let mut args = args.into_iter();
    let mut orders = None;
    let mut data_dir = None;
    let mut database_url = None;
    let mut resume = false;
    let mut duplicate_rate = None;
    let mut fail_rate = None;
    let mut metrics_addr = None;
    let mut modules = None;
    let mut timeout = None;
    let mut json = false;

    fn set<T>(slot: &mut Option<T>, flag: &str, value: T) -> Result<(), String> {
        if slot.replace(value).is_some() {
            return Err(format!("{flag} given twice"));
        }
        Ok(())
    }
    fn rate(flag: &str, value: &str) -> Result<f64, String> {
        match value.parse::<f64>() {
            Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
            _ => Err(format!(
                "{flag} takes a probability between 0 and 1, not `{value}`"
            )),
        }
    }

    while let Some(arg) = args.next() {
        let arg = arg
            .into_string()
            .map_err(|a| format!("argument {a:?} is not valid UTF-8"))?;
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value)),
            _ => (arg.clone(), None),
        };
        let takes_value = matches!(
            flag.as_str(),
            "--orders"
                | "--data-dir"
                | "--database-url"
                | "--duplicate-rate"
                | "--fail-rate"
                | "--metrics-addr"
                | "--modules"
                | "--timeout"
        );
        if !takes_value && inline.is_some() {
            return Err(format!("{flag} takes no value"));
        }
        let value = if takes_value {
            match inline {
                Some(value) => value.to_string(),
                None => args
                    .next()
                    .ok_or_else(|| format!("{flag} needs a value"))?
                    .into_string()
                    .map_err(|a| format!("the value {a:?} of {flag} is not valid UTF-8"))?,
            }
        } else {
            String::new()
        };
        match flag.as_str() {
            "--orders" => {
                let n = value
                    .parse::<u64>()
                    .map_err(|_| format!("--orders takes a whole number, not `{value}`"))?;
                set(&mut orders, "--orders", n)?;
            }
            "--data-dir" => {
                if value.is_empty() {
                    return Err("--data-dir needs a directory".into());
                }
                set(&mut data_dir, "--data-dir", value)?;
            }
            "--database-url" => {
                if !(value.starts_with("postgres://") || value.starts_with("postgresql://")) {
                    return Err(
                        "--database-url takes a PostgreSQL URL (postgres://...); use --data-dir for SQLite"
                            .into(),
                    );
                }
                set(&mut database_url, "--database-url", value)?;
            }
            "--duplicate-rate" => {
                let p = rate("--duplicate-rate", &value)?;
                set(&mut duplicate_rate, "--duplicate-rate", p)?;
            }
            "--fail-rate" => {
                let p = rate("--fail-rate", &value)?;
                set(&mut fail_rate, "--fail-rate", p)?;
            }
            "--metrics-addr" => {
                use std::net::ToSocketAddrs;
                let bad = |why: String| {
                    format!("--metrics-addr takes HOST:PORT (e.g. 127.0.0.1:9898), not `{value}`: {why}")
                };
                let addr = value
                    .to_socket_addrs()
                    .map_err(|e| bad(e.to_string()))?
                    .next()
                    .ok_or_else(|| bad("the host has no address".into()))?;
                set(&mut metrics_addr, "--metrics-addr", addr)?;
            }
            "--modules" => set(&mut modules, "--modules", Roles::parse(&value)?)?,
            "--timeout" => {
                let seconds = match value.parse::<f64>() {
                    Ok(s) if s > 0.0 && s <= 1e9 => s,
                    _ => {
                        return Err(format!(
                            "--timeout takes a number of seconds greater than 0, not `{value}`"
                        ))
                    }
                };
                set(&mut timeout, "--timeout", Duration::from_secs_f64(seconds))?;
            }
            "--resume" => resume = true,
            "--json" => json = true,
            "-h" | "--help" => return Ok(Parsed::Help),
            // Redacted: it may be a database URL missing its flag.
            _ => return Err(format!("unknown argument `{}`", tickbox::redact_url(&arg))),
        }
    }

    if resume && orders.is_some() {
        return Err("--resume places no orders; leave out --orders".into());
    }
    let modules = modules.unwrap_or(Roles::ALL);
    if !modules.orders && orders.is_some() {
        return Err(
            "--orders needs the orders module, which places them: add orders to --modules".into(),
        );
    }
    let store = match (data_dir, database_url) {
        (Some(_), Some(_)) => {
            return Err("--data-dir and --database-url exclude each other".into());
        }
        (_, Some(url)) => Store::Postgres(url),
        (dir, None) => Store::Sqlite(dir.unwrap_or_else(|| "./minishop-data".into())),
    };
    Ok(Parsed::Run(Options {
        orders: if resume || !modules.orders {
            0
        } else {
            orders.unwrap_or(100)
        },
        store,
        resume,
        modules,
        timeout,
        duplicate_rate: duplicate_rate.unwrap_or(0.0),
        fail_rate: fail_rate.unwrap_or(0.0),
        metrics_addr,
        json,
    }))
}

// ---------------------------------------------------------------------------
// Ctrl-C and progress

/// Set once by the first Ctrl-C: place no more orders, stop waiting, stop
/// the bus.
#[derive(Clone)]
struct Interrupt(Arc<tokio::sync::watch::Sender<bool>>);

impl Interrupt {
    fn new() -> Self {
        Interrupt(Arc::new(tokio::sync::watch::Sender::new(false)))
    }

    fn is_set(&self) -> bool {
        *self.0.borrow()
    }

    fn set(&self) {
        self.0.send_replace(true);
    }

    /// Returns once the interrupt is set.
    async fn wait(&self) {
        let mut receiver = self.0.subscribe();
        let _ = receiver.wait_for(|set| *set).await;
    }
}

/// Ctrl-C (SIGINT) or, on Unix, SIGTERM (how service managers ask a
/// process to stop); false if neither can be listened for.
async fn stop_signal() -> bool {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut terminate) = signal(SignalKind::terminate()) {
            return tokio::select! {
                interrupted = tokio::signal::ctrl_c() => interrupted.is_ok(),
                terminated = terminate.recv() => terminated.is_some(),
            };
        }
    }
    tokio::signal::ctrl_c().await.is_ok()
}

/// Listens for Ctrl-C (SIGINT) or SIGTERM: the first sets `interrupt`,
/// which the run polls between orders and between progress checks; the
/// second quits at once, which is as safe as a crash (the next `--resume`
/// finishes the work).
async fn on_ctrl_c(interrupt: Interrupt) {
    if !stop_signal().await {
        return;
    }
    interrupt.set();
    say(
        "minishop: interrupted — placing no more orders and stopping the bus \
         (running deliveries finish, the rest stays pending); Ctrl-C again quits at once",
    );
    if stop_signal().await {
        say("minishop: interrupted again — quitting now; run again with --resume to finish the pending work");
        std::process::exit(130);
    }
}

/// The progress bar currently on the terminal's last line (empty when none):
/// log lines and messages are written above it, and it is drawn again.
static STATUS_LINE: Mutex<String> = Mutex::new(String::new());

/// Writes `bytes` to stderr above the progress bar, if one is drawn.
fn write_above_status(bytes: &[u8]) {
    let status = STATUS_LINE.lock().unwrap_or_else(PoisonError::into_inner);
    let mut stderr = std::io::stderr().lock();
    let _ = if status.is_empty() {
        stderr.write_all(bytes)
    } else {
        // Carriage return, erase the line, the text, then the bar again.
        stderr
            .write_all(b"\r\x1b[2K")
            .and_then(|()| stderr.write_all(bytes))
            .and_then(|()| stderr.write_all(status.as_bytes()))
    };
    let _ = stderr.flush();
}

/// One line on stderr, above the progress bar.
fn say(text: &str) {
    write_above_status(format!("{text}\n").as_bytes());
}

/// The log's writer: one formatted event per writer, written out at once
/// above the progress bar when it is dropped.
#[derive(Default)]
struct LogWriter(Vec<u8>);

impl Write for LogWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogWriter {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            write_above_status(&self.0);
        }
    }
}

/// Progress of placing and of draining, on stderr: a bar redrawn in place
/// (`\r`) when stderr is a terminal, otherwise a log line every 2 s. It is
/// drawn from numbers at hand (a counter, the bus's in-memory metrics, the
/// counts the drain loop reads anyway), never from a query of its own.
struct Progress {
    tty: bool,
    /// When it was last drawn.
    last: Instant,
    drawn: bool,
}

impl Progress {
    const BAR: usize = 20;

    fn new() -> Self {
        Progress {
            tty: std::io::stderr().is_terminal(),
            last: Instant::now(),
            drawn: false,
        }
    }

    /// Whether it is time to draw again.
    fn due(&self) -> bool {
        if self.tty {
            !self.drawn || self.last.elapsed() >= Duration::from_millis(100)
        } else {
            self.last.elapsed() >= Duration::from_secs(2)
        }
    }

    /// Placing: orders placed so far by this run, and what the bus reports
    /// it has done with them, from its in-memory counters since it started.
    /// Pending is estimated from them too: the messages this run published
    /// (one per order placed, one per reservation and per confirmation
    /// handled) less those delivered. The modules' sampled outbox gauges
    /// would cost nothing either, but they lag behind under load.
    fn placing(&mut self, placed: u64, total: u64, metrics: &BusMetrics) {
        let handled = |name: &str| -> u64 {
            metrics
                .modules
                .iter()
                .flat_map(|m| &m.handlers)
                .filter(|h| h.handler == name)
                .map(|h| h.handled)
                .sum()
        };
        let published = placed + handled(RESERVE_STOCK) + handled(CONFIRM_ORDER);
        let pending = published.saturating_sub(metrics.delivered);
        self.show(
            "placing ",
            ratio(placed, total),
            &format!(
                "{placed}/{total} orders  confirmed {}  e-mails {}  pending {pending}",
                handled(CONFIRM_ORDER),
                handled(SEND_CONFIRMATION)
            ),
        );
    }

    /// Draining: the counts read from the databases.
    fn draining(&mut self, orders: i64, confirmed: i64, emails: i64, pending: i64) {
        let done = confirmed.min(orders) + emails.min(orders);
        self.show(
            "draining",
            ratio(done.max(0) as u64, 2 * orders.max(0) as u64),
            &format!("{confirmed}/{orders} confirmed  e-mails {emails}  pending {pending}"),
        );
    }

    fn show(&mut self, phase: &str, fraction: f64, text: &str) {
        self.last = Instant::now();
        self.drawn = true;
        if !self.tty {
            tracing::info!("{}: {}", phase.trim_end(), text.replace("  ", ", "));
            return;
        }
        let filled = (fraction.clamp(0.0, 1.0) * Self::BAR as f64).floor() as usize;
        let line = format!(
            "{phase} [{}{}] {text}",
            "#".repeat(filled),
            ".".repeat(Self::BAR - filled)
        );
        let mut status = STATUS_LINE.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stderr = std::io::stderr().lock();
        let _ = write!(stderr, "\r\x1b[2K{line}");
        let _ = stderr.flush();
        *status = line;
    }

    /// Leaves the last bar drawn on its own line; what follows goes below.
    fn end(&mut self) {
        let mut status = STATUS_LINE.lock().unwrap_or_else(PoisonError::into_inner);
        if !status.is_empty() {
            let mut stderr = std::io::stderr().lock();
            let _ = stderr.write_all(b"\n");
            let _ = stderr.flush();
            status.clear();
        }
        self.drawn = false;
    }
}

/// `done / total`, 1 when there is nothing to do.
fn ratio(done: u64, total: u64) -> f64 {
    if total == 0 {
        1.0
    } else {
        done as f64 / total as f64
    }
}

// ---------------------------------------------------------------------------
// The run

struct Modules<B: Backend> {
    orders: ModuleHandle<B>,
    warehouse: ModuleHandle<B>,
    notifications: ModuleHandle<B>,
}

/// What a run found, for the summary and the JSON line.
#[derive(Debug)]
struct Report {
    backend: &'static str,
    /// New orders this run placed, and was asked to place.
    placed: u64,
    to_place: u64,
    orders: usize,
    reservations: usize,
    confirmations: i64,
    emails: usize,
    pending: i64,
    dead_letters: i64,
    problems: Vec<Problem>,
    drained: bool,
    /// What was still unfinished when the deadline came.
    unfinished: Option<String>,
    /// The modules whose handlers ran here.
    modules: Roles,
    /// Ctrl-C cut the run short.
    interrupted: bool,
    metrics: BusMetrics,
    place_seconds: f64,
    drain_seconds: f64,
    total_seconds: f64,
}

impl Report {
    fn ok(&self) -> bool {
        !self.interrupted
            && self.drained
            && self.pending == 0
            && self.dead_letters == 0
            && self.problems.is_empty()
    }

    /// Problems that are not just work left to do: something done twice,
    /// or done without its cause.
    fn broken(&self) -> impl Iterator<Item = &Problem> {
        self.problems.iter().filter(|p| !p.unfinished)
    }

    fn exit_code(&self) -> ExitCode {
        if self.ok() {
            ExitCode::SUCCESS
        } else if self.interrupted && self.broken().next().is_none() {
            ExitCode::from(130)
        } else {
            ExitCode::FAILURE
        }
    }
}

/// One kind of problem the final check found.
#[derive(Debug)]
struct Problem {
    text: String,
    /// Work not done yet (which `--resume` finishes), rather than work done
    /// wrongly.
    unfinished: bool,
}

/// Runs `op` again while it fails with a transient database error (a lost
/// or terminated connection, a busy database), with backoff, for up to a
/// minute; `also` names other failures worth another try.
async fn retrying<T, F, Fut>(
    what: &str,
    also: impl Fn(&tickbox::Error) -> bool,
    mut op: F,
) -> tickbox::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = tickbox::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut delay = Duration::from_millis(20);
    loop {
        match op().await {
            Err(error) if (error.is_transient() || also(&error)) && Instant::now() < deadline => {
                tracing::warn!(%error, "{what} failed; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            result => return result,
        }
    }
}

/// Only transient errors are worth another try.
fn nothing_else(_: &tickbox::Error) -> bool {
    false
}

/// Runs a statement batch in a module transaction. Two copies of the
/// example starting together can race on `CREATE … IF NOT EXISTS` in
/// PostgreSQL (a duplicate key in the catalog): that is tried again too.
async fn execute<B: Backend>(module: &ModuleHandle<B>, sql: String) -> tickbox::Result<()> {
    let racing_ddl = |e: &tickbox::Error| {
        let text = e.to_string();
        text.contains("already exists") || text.contains("duplicate key")
    };
    retrying("creating tables", racing_ddl, || {
        let sql = sql.clone();
        module.transaction(async move |tx| {
            tx.conn().batch_execute(&sql).await?;
            Ok::<_, tickbox::Error>(())
        })
    })
    .await
}

/// Opens the three modules, with the handlers of those `--modules` lists:
/// a module whose handlers run elsewhere is still opened here, for its
/// outbox (this process may publish to, or deliver from, it) and for the
/// final check.
async fn start_modules<B: Shop>(options: &Options, location: &str) -> tickbox::Result<Modules<B>> {
    let fail = options.fail_rate;
    let run = options.modules;
    // The outbox gauges (pending, lag, dead letters) are read from each
    // database every second, for the progress display and the Prometheus
    // endpoint: two indexed queries per module, never one per message.
    let module = |name| B::module(location, name).metrics_interval(Duration::from_secs(1));
    let mut orders = module("orders")
        .publishes::<OrderPlaced>()
        .publishes::<OrderConfirmed>();
    if run.orders {
        orders = orders.handler(CONFIRM_ORDER, flaky(ConfirmOrder, fail));
    }
    // The warehouse reserves stock for up to 32 waiting orders per
    // transaction (one COMMIT for all); when one of them fails, that batch
    // rolls back and its orders are reserved one per transaction.
    let mut warehouse = module("warehouse").publishes::<StockReserved>();
    if run.warehouse {
        warehouse = warehouse.handler_with(
            RESERVE_STOCK,
            flaky(ReserveStock, fail),
            HandlerOptions::new().batch(32),
        );
    }
    let mut notifications = module("notifications");
    if run.notifications {
        notifications = notifications.handler(SEND_CONFIRMATION, flaky(SendConfirmation, fail));
    }
    let orders = orders.start().await?;
    let warehouse = warehouse.start().await?;
    let notifications = notifications.start().await?;

    // The modules' own tables, before the bus starts delivering to them.
    execute(&orders, ORDERS_DDL.into()).await?;
    let seed = SKUS
        .iter()
        .map(|sku| format!("('{sku}', {SEEDED_STOCK}, {SEEDED_STOCK})"))
        .collect::<Vec<_>>()
        .join(", ");
    execute(
        &warehouse,
        format!(
            "{WAREHOUSE_DDL}
            INSERT INTO stock (sku, seeded, available) VALUES {seed} ON CONFLICT (sku) DO NOTHING;"
        ),
    )
    .await?;
    execute(&notifications, NOTIFICATIONS_DDL.into()).await?;
    Ok(Modules {
        orders,
        warehouse,
        notifications,
    })
}

/// Places `n` orders, each in its own transaction publishing `OrderPlaced`,
/// until done or interrupted; returns how many it placed.
///
/// The run is recorded in `placing_runs` while it places, so that processes
/// running the other modules wait for its orders: it ends there when the
/// placing ends, however it ends, and renews a lease meanwhile (a run
/// killed while placing counts as ended once its lease runs out).
async fn place_orders<B: Shop>(
    orders: &ModuleHandle<B>,
    bus: &BusHandle<B>,
    n: u64,
    interrupt: &Interrupt,
    progress: &mut Progress,
) -> tickbox::Result<u64> {
    let run = uuid::Uuid::now_v7().to_string();
    let planned = i64::try_from(n).unwrap_or(i64::MAX);
    retrying("recording the run", nothing_else, || {
        let run = run.clone();
        orders.transaction(async move |tx| {
            Ok::<_, tickbox::Error>(B::start_run(tx.conn(), run, planned).await?)
        })
    })
    .await?;
    let placed = place(orders, bus, &run, n, interrupt, progress).await;
    let ended = retrying("recording the end of the run", nothing_else, || {
        let run = run.clone();
        orders
            .transaction(async move |tx| Ok::<_, tickbox::Error>(B::end_run(tx.conn(), run).await?))
    })
    .await;
    let placed = placed?;
    ended?;
    Ok(placed)
}

/// The placing itself, for [`place_orders`].
async fn place<B: Shop>(
    orders: &ModuleHandle<B>,
    bus: &BusHandle<B>,
    run: &str,
    n: u64,
    interrupt: &Interrupt,
    progress: &mut Progress,
) -> tickbox::Result<u64> {
    let started = Instant::now();
    let mut renewed = Instant::now();
    let mut done = 0;
    while done < n && !interrupt.is_set() {
        let order = NewOrder {
            id: uuid::Uuid::now_v7().to_string(),
            customer: format!("customer{}@example.com", fastrand::u32(1..=500)),
            sku: SKUS[fastrand::usize(..SKUS.len())].to_string(),
            quantity: fastrand::i32(1..=5),
            status: "placed".into(),
            confirmations: 0,
            placed_at_us: now_us(),
        };
        let placed = OrderPlaced {
            order_id: order.id.clone(),
            sku: order.sku.clone(),
            quantity: order.quantity,
        };
        // A connection lost during COMMIT leaves it unknown whether the
        // order committed: the order keeps its id across tries, so a try
        // that finds it already there knows the earlier one did.
        let mut tried = false;
        let placing = retrying("placing an order", nothing_else, || {
            let (order, placed) = (order.clone(), placed.clone());
            let retry = std::mem::replace(&mut tried, true);
            orders.transaction(async move |tx| {
                if let Err(e) = B::insert_order(tx.conn(), order).await {
                    return match e {
                        diesel::result::Error::DatabaseError(
                            diesel::result::DatabaseErrorKind::UniqueViolation,
                            _,
                        ) if retry => Ok(()),
                        e => Err(e.into()),
                    };
                }
                tx.publish(&placed)?;
                Ok::<_, tickbox::Error>(())
            })
        });
        placing.await?;
        done += 1;
        if renewed.elapsed() >= RUN_LEASE / 5 {
            retrying("renewing the run", nothing_else, || {
                let run = run.to_string();
                orders.transaction(async move |tx| {
                    Ok::<_, tickbox::Error>(B::renew_run(tx.conn(), run).await?)
                })
            })
            .await?;
            renewed = Instant::now();
        }
        if progress.due() {
            progress.placing(done, n, &bus.metrics());
        }
    }
    if n > 0 {
        if progress.tty {
            progress.placing(done, n, &bus.metrics());
            progress.end();
        } else {
            tracing::info!(
                "placed {done}/{n} orders in {:.2} s",
                started.elapsed().as_secs_f64()
            );
        }
    }
    Ok(done)
}

/// (orders, confirmed orders, e-mails) — cheap counts for waiting.
async fn progress_counts<B: Shop>(shop: &Modules<B>) -> tickbox::Result<(i64, i64, i64)> {
    let (orders, confirmed) = retrying("reading progress", nothing_else, || {
        shop.orders
            .read(async move |tx| Ok::<_, tickbox::Error>(B::order_progress(tx.conn()).await?))
    })
    .await?;
    let emails = retrying("reading progress", nothing_else, || {
        shop.notifications
            .read(async move |tx| Ok::<_, tickbox::Error>(B::email_count(tx.conn()).await?))
    })
    .await?;
    Ok((orders, confirmed, emails))
}

/// Each module's tickbox tables: pending outbox messages, dead letters.
async fn store_stats<B: Backend>(bus: &BusHandle<B>) -> tickbox::Result<Vec<(String, StoreStats)>> {
    let mut stats = Vec::new();
    for module in bus.modules() {
        let module_stats = retrying("reading the outbox and dead letters", nothing_else, || {
            module.store_stats()
        })
        .await?;
        stats.push((module.name().to_string(), module_stats));
    }
    Ok(stats)
}

/// Dead letters over every module: deliveries the bus gave up on.
async fn dead_letters<B: Backend>(bus: &BusHandle<B>) -> tickbox::Result<i64> {
    Ok(store_stats(bus)
        .await?
        .iter()
        .map(|(_, s)| s.dead_letters)
        .sum())
}

/// The bus's metrics snapshot, its outbox gauges brought up to date.
///
/// The gauges (pending, lag, dead letters) are what each module last
/// sampled from its database, up to a sampling interval old; the final
/// report has just read the same values after the bus stopped, so those
/// stand in for the sample, as if it had been taken then.
fn final_metrics<B: Backend>(bus: &BusHandle<B>, stores: &[(String, StoreStats)]) -> BusMetrics {
    let mut metrics = bus.metrics();
    let now = now_us();
    for module in &mut metrics.modules {
        if let Some((_, stats)) = stores.iter().find(|(name, _)| *name == module.module) {
            module.outbox.pending = stats.outbox_pending;
            module.outbox.dead_letters = stats.dead_letters;
            module.outbox.lag_seconds = stats
                .oldest_pending_us
                .map_or(0.0, |oldest| (now - oldest).max(0) as f64 / 1e6);
            module.outbox.sampled_at_us = now;
        }
    }
    metrics
}

/// How waiting for the work to finish ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Drain {
    /// Done, or nothing left but what dead letters hold up.
    Finished,
    /// The deadline came first; what was still unfinished.
    TimedOut(String),
    Interrupted,
}

/// The handlers of the whole flow, each with the module whose outbox it
/// receives from: (outbox, module, handler). A message committed before a
/// handler's subscription is first recorded is not kept for it, so a
/// process waits until all of them are subscribed before placing orders.
const FLOW: [(&str, &str, &str); 3] = [
    ("orders", "warehouse", RESERVE_STOCK),
    ("warehouse", "orders", CONFIRM_ORDER),
    ("orders", "notifications", SEND_CONFIRMATION),
];

/// Every subscription recorded in the outboxes of the flow, with the outbox
/// it is in.
async fn subscriptions<B: Shop>(
    shop: &Modules<B>,
) -> tickbox::Result<Vec<(&'static str, tickbox::Subscription)>> {
    let mut all = Vec::new();
    for (outbox, module) in [("orders", &shop.orders), ("warehouse", &shop.warehouse)] {
        let recorded = retrying("reading subscriptions", nothing_else, || {
            module.subscriptions()
        })
        .await?;
        all.extend(recorded.into_iter().map(|s| (outbox, s)));
    }
    Ok(all)
}

/// Waits until every handler of the [`FLOW`] is subscribed (each process
/// subscribes its own when its bus starts), until `deadline` or Ctrl-C.
async fn await_subscriptions<B: Shop>(
    shop: &Modules<B>,
    deadline: Option<Instant>,
    interrupt: &Interrupt,
) -> tickbox::Result<Drain> {
    let mut said = None::<Instant>;
    loop {
        let recorded = subscriptions(shop).await?;
        let missing: Vec<String> = FLOW
            .iter()
            .filter(|(outbox, module, handler)| {
                !recorded
                    .iter()
                    .any(|(o, s)| o == outbox && s.module == *module && s.handler == *handler)
            })
            .map(|(outbox, module, handler)| {
                format!(
                    "{handler} (start `minishop --modules {module}` over the same databases) \
                     has not subscribed to the {outbox} outbox"
                )
            })
            .collect();
        if missing.is_empty() {
            return Ok(Drain::Finished);
        }
        let waiting = format!(
            "no orders placed yet, waiting for the flow's handlers: {}",
            missing.join("; ")
        );
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(Drain::TimedOut(waiting));
        }
        if said.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
            tracing::info!("{waiting}");
            said = Some(Instant::now());
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = interrupt.wait() => return Ok(Drain::Interrupted),
        }
    }
}

/// What keeps the flow from being done, for a run that gave up waiting.
async fn unfinished<B: Shop>(
    shop: &Modules<B>,
    counts: (i64, i64, i64, i64),
    runs: &[(String, i64, bool)],
    roles: Roles,
) -> tickbox::Result<String> {
    let (orders, confirmed, emails, pending) = counts;
    let mut parts = vec![format!(
        "{confirmed}/{orders} orders confirmed, {emails} e-mails, {pending} messages pending"
    )];
    if runs.is_empty() && !roles.all() {
        parts.push(
            "no run has placed orders yet (start `minishop --modules orders --orders N` over \
             the same databases)"
                .into(),
        );
    }
    let open: Vec<_> = runs.iter().filter(|(_, _, placing)| *placing).collect();
    if !open.is_empty() {
        parts.push(format!(
            "{} runs still placing orders ({} planned)",
            open.len(),
            open.iter().map(|(_, planned, _)| planned).sum::<i64>()
        ));
    }
    let now = now_us();
    for (outbox, s) in subscriptions(shop).await? {
        if let (false, Some(oldest)) = (s.is_alive(now), s.oldest_pending_us) {
            parts.push(format!(
                "handler {} of module {} owes messages of the {outbox} outbox (the oldest {} s old) \
                 and no running process serves it (start `minishop --modules {}`)",
                s.handler,
                s.module,
                now.saturating_sub(oldest) / 1_000_000,
                s.module
            ));
        }
    }
    Ok(parts.join("; "))
}

/// Waits until the whole flow is finished, polling until `deadline`: the
/// bus idle (`BusHandle::wait_idle`: nothing in memory, announced or pending
/// in any of the three outboxes, whichever process owes it) with every order
/// confirmed and e-mailed, and no run still placing orders — or idle while
/// dead letters hold up the rest. A process running only some modules also
/// waits for a first run to place orders.
///
/// Without a deadline, a process running all three modules gives itself a
/// minute plus 20 ms per order; one running some of them waits as long as it
/// takes the others. Ctrl-C ends the wait at the next poll. Progress is
/// drawn from the counts read for the polls.
async fn wait_until_drained<B: Shop>(
    shop: &Modules<B>,
    bus: &BusHandle<B>,
    roles: Roles,
    deadline: Option<Instant>,
    interrupt: &Interrupt,
    progress: &mut Progress,
) -> tickbox::Result<Drain> {
    let (orders, _, _) = progress_counts(shop).await?;
    let deadline = deadline.or_else(|| {
        roles.all().then(|| {
            Instant::now() + Duration::from_secs(60) + Duration::from_millis(20) * orders as u32
        })
    });
    let started = Instant::now();
    let mut last = (orders, 0, 0, 0);
    let drain = loop {
        if interrupt.is_set() {
            break Drain::Interrupted;
        }
        let (orders, confirmed, emails) = progress_counts(shop).await?;
        let complete = confirmed == orders && emails >= orders;
        let pending = retrying("counting pending messages", nothing_else, || bus.pending()).await?;
        last = (orders, confirmed, emails, pending);
        let idle = retrying("checking the bus", nothing_else, || {
            bus.wait_idle(Duration::ZERO)
        })
        .await?;
        // Read last: a run that starts after the counts were read shows here.
        let runs = retrying("reading the runs", nothing_else, || {
            shop.orders
                .read(async move |tx| Ok::<_, tickbox::Error>(B::load_runs(tx.conn()).await?))
        })
        .await?;
        let placing_done =
            runs.iter().all(|(_, _, placing)| !placing) && (roles.all() || !runs.is_empty());
        if idle && complete && placing_done {
            break Drain::Finished;
        }
        if idle && dead_letters(bus).await? > 0 {
            tracing::error!(
                "stopped waiting: nothing is pending, but dead letters hold up {} orders",
                orders - confirmed.min(emails)
            );
            break Drain::Finished;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let what = unfinished(shop, last, &runs, roles).await?;
            tracing::error!(
                "timed out after waiting {:.0} s: {what}",
                started.elapsed().as_secs_f64()
            );
            break Drain::TimedOut(what);
        }
        if progress.due() {
            progress.draining(orders, confirmed, emails, pending);
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
            () = interrupt.wait() => {}
        }
    };
    if progress.tty && progress.drawn {
        let (orders, confirmed, emails, pending) = last;
        progress.draining(orders, confirmed, emails, pending);
        progress.end();
    }
    Ok(drain)
}

async fn snapshot<B: Shop>(shop: &Modules<B>) -> tickbox::Result<Snapshot> {
    let orders = retrying("reading orders", nothing_else, || {
        shop.orders
            .read(async move |tx| Ok::<_, tickbox::Error>(B::load_orders(tx.conn()).await?))
    })
    .await?;
    let (reservations, stock) = retrying("reading reservations", nothing_else, || {
        shop.warehouse.read(async move |tx| {
            let reservations = B::load_reservations(tx.conn()).await?;
            let stock = B::load_stock(tx.conn()).await?;
            Ok::<_, tickbox::Error>((reservations, stock))
        })
    })
    .await?;
    let emails = retrying("reading e-mails", nothing_else, || {
        shop.notifications
            .read(async move |tx| Ok::<_, tickbox::Error>(B::load_email_orders(tx.conn()).await?))
    })
    .await?;
    Ok(Snapshot {
        orders,
        reservations,
        stock,
        emails,
    })
}

/// Checks the databases; returns what is wrong, one entry per kind of
/// problem.
fn verify(snapshot: &Snapshot) -> Vec<Problem> {
    let mut problems: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
    let mut problem = |what: &'static str, id: &str| {
        problems.entry(what).or_default().push(id.to_string());
    };
    let mut reservations: HashMap<&str, usize> = HashMap::new();
    let mut reserved_per_sku: HashMap<&str, i64> = HashMap::new();
    for (order_id, sku, quantity) in &snapshot.reservations {
        *reservations.entry(order_id).or_default() += 1;
        *reserved_per_sku.entry(sku).or_default() += i64::from(*quantity);
    }
    let mut emails: HashMap<&str, usize> = HashMap::new();
    for order_id in &snapshot.emails {
        *emails.entry(order_id).or_default() += 1;
    }
    let mut known = std::collections::HashSet::new();
    for (id, status, confirmations) in &snapshot.orders {
        known.insert(id.as_str());
        match reservations.get(id.as_str()).copied().unwrap_or(0) {
            0 => problem("orders without a reservation", id),
            1 => {}
            _ => problem("orders with more than one reservation", id),
        }
        match (*confirmations, status.as_str()) {
            (1, "confirmed") => {}
            (0, _) => problem("orders never confirmed", id),
            (1, _) => problem("orders counted confirmed but not in status confirmed", id),
            _ => problem("orders confirmed more than once", id),
        }
        match emails.get(id.as_str()).copied().unwrap_or(0) {
            0 => problem("orders without a confirmation e-mail", id),
            1 => {}
            _ => problem("orders with more than one e-mail", id),
        }
    }
    for order_id in reservations.keys() {
        if !known.contains(order_id) {
            problem("reservations for unknown orders", order_id);
        }
    }
    for order_id in emails.keys() {
        if !known.contains(order_id) {
            problem("e-mails for unknown orders", order_id);
        }
    }
    for (sku, seeded, available) in &snapshot.stock {
        let reserved = reserved_per_sku.get(sku.as_str()).copied().unwrap_or(0);
        if seeded - available != reserved {
            problem(
                "items whose stock taken differs from their reservations",
                sku,
            );
        }
    }
    /// Work left to do, which --resume finishes.
    const UNFINISHED: [&str; 3] = [
        "orders without a reservation",
        "orders never confirmed",
        "orders without a confirmation e-mail",
    ];
    problems
        .into_iter()
        .map(|(what, ids)| {
            let examples = ids[..ids.len().min(3)].join(", ");
            let more = if ids.len() > 3 { ", …" } else { "" };
            Problem {
                text: format!("{} {what} (e.g. {examples}{more})", ids.len()),
                unfinished: UNFINISHED.contains(&what),
            }
        })
        .collect()
}

async fn run<B: Shop>(
    options: &Options,
    location: &str,
    interrupt: &Interrupt,
) -> tickbox::Result<Report> {
    let started = Instant::now();
    let shop = start_modules::<B>(options, location).await?;
    let bus = Bus::builder()
        .module(&shop.orders)
        .module(&shop.warehouse)
        .module(&shop.notifications)
        .duplicate_rate(options.duplicate_rate)
        // Quick retries: the injected failures are meant to be seen healing.
        // A delivery failing 25 times in a row (about 20 s) becomes a dead
        // letter; at --fail-rate 0.1 the odds of that are 1e-25.
        .retry_policy(RetryPolicy {
            initial_delay: Duration::from_millis(20),
            max_delay: Duration::from_secs(1),
            max_attempts: Some(25),
            ..RetryPolicy::default()
        })
        // A crashed run's claims on outbox rows keep other buses away until
        // they expire; short, so that --resume takes over its messages soon.
        .claim_lease(Duration::from_secs(2))
        .start()
        .await?;

    // Stop the bus whatever happens from here on.
    let mut progress = Progress::new();
    let deadline = options.timeout.map(|timeout| started + timeout);
    let outcome = async {
        if options.resume {
            tracing::info!("resuming: placing no orders, finishing pending work");
        }
        let placing = Instant::now();
        let mut drain = Drain::Finished;
        let mut placed = 0;
        if options.orders > 0 {
            drain = await_subscriptions(&shop, deadline, interrupt).await?;
            if drain == Drain::Finished {
                placed = place_orders(&shop.orders, &bus, options.orders, interrupt, &mut progress)
                    .await?;
                if placed < options.orders {
                    drain = Drain::Interrupted;
                }
            }
        }
        let place_seconds = placing.elapsed().as_secs_f64();
        let draining = Instant::now();
        if drain == Drain::Finished {
            drain = wait_until_drained(
                &shop,
                &bus,
                options.modules,
                deadline,
                interrupt,
                &mut progress,
            )
            .await?;
        }
        Ok::<_, tickbox::Error>((
            placed,
            place_seconds,
            draining.elapsed().as_secs_f64(),
            drain,
        ))
    }
    .await;
    progress.end();
    if matches!(outcome, Ok((_, _, _, Drain::Interrupted))) {
        tracing::info!("stopping the bus: running deliveries finish, the rest stays pending");
    }
    bus.stop().await;
    let (placed, place_seconds, drain_seconds, drain) = outcome?;

    // Everything below is read from the databases, after the bus stopped.
    let snapshot = snapshot(&shop).await?;
    let stores = store_stats(&bus).await?;
    let metrics = final_metrics(&bus, &stores);
    Ok(Report {
        backend: B::NAME,
        placed,
        to_place: options.orders,
        orders: snapshot.orders.len(),
        reservations: snapshot.reservations.len(),
        confirmations: snapshot.orders.iter().map(|(_, _, c)| i64::from(*c)).sum(),
        emails: snapshot.emails.len(),
        pending: stores.iter().map(|(_, s)| s.outbox_pending).sum(),
        dead_letters: stores.iter().map(|(_, s)| s.dead_letters).sum(),
        problems: verify(&snapshot),
        drained: drain == Drain::Finished,
        interrupted: drain == Drain::Interrupted,
        unfinished: match drain {
            Drain::TimedOut(what) => Some(what),
            _ => None,
        },
        modules: options.modules,
        metrics,
        place_seconds,
        drain_seconds,
        total_seconds: started.elapsed().as_secs_f64(),
    })
}

fn print_report(report: &Report, options: &Options) {
    let m = &report.metrics;
    let ok = report.ok();
    if report.interrupted && report.placed < report.to_place {
        println!(
            "MiniShop on {}: INTERRUPTED while placing orders — placed {} of {} new orders in {:.2} s ({:.2} s in all)",
            report.backend,
            report.placed,
            report.to_place,
            report.place_seconds,
            report.total_seconds
        );
    } else if report.interrupted {
        println!(
            "MiniShop on {}: INTERRUPTED while draining — placed {} new orders in {:.2} s, drained for {:.2} s ({:.2} s in all)",
            report.backend,
            report.placed,
            report.place_seconds,
            report.drain_seconds,
            report.total_seconds
        );
    } else {
        println!(
            "MiniShop on {}: placed {} new orders in {:.2} s, drained in {:.2} s ({:.2} s in all)",
            report.backend,
            report.placed,
            report.place_seconds,
            report.drain_seconds,
            report.total_seconds
        );
    }
    if !report.modules.all() {
        println!(
            "  modules:   ran the handlers of {} here; the rest run in other processes",
            report.modules.names().join(", ")
        );
    }
    println!(
        "  databases: {} orders, {} reservations, {} confirmations, {} e-mails, {} messages pending, {} dead letters",
        report.orders,
        report.reservations,
        report.confirmations,
        report.emails,
        report.pending,
        report.dead_letters
    );
    println!(
        "  this run:  {} handled, {} duplicates skipped ({} injected), {} failed attempts, {} retries, {} dead-lettered, {} messages delivered",
        m.total(|h| h.handled),
        m.total(|h| h.duplicates_skipped),
        m.duplicates_injected,
        m.total(|h| h.failed),
        m.total(|h| h.retried),
        m.total(|h| h.dead_lettered),
        m.delivered
    );
    print_metrics(report);
    if report.interrupted {
        println!(
            "  check:     skipped, the work is unfinished — run again with --resume to finish it \
             (it places no new orders)"
        );
        if report.placed < report.to_place {
            println!(
                "    - {} of the {} new orders were never placed",
                report.to_place - report.placed,
                report.to_place
            );
        }
        if report.pending != 0 {
            println!("    - {} outbox messages pending", report.pending);
        }
        for problem in report.problems.iter().filter(|p| p.unfinished) {
            println!("    - {}", problem.text);
        }
        if report.broken().next().is_none() {
            println!("    so far nothing was done twice or without its cause");
        } else {
            println!("  FAILED even so:");
            for problem in report.broken() {
                println!("    - {}", problem.text);
            }
        }
    } else if ok {
        println!("  check:     OK — every order has exactly one reservation, one confirmation and one e-mail; no message pending");
    } else {
        println!("  check:     FAILED");
        if let Some(what) = &report.unfinished {
            println!("    - the work did not finish before the deadline: {what}");
        }
        if report.pending != 0 {
            println!("    - {} outbox messages still pending", report.pending);
        }
        if report.dead_letters != 0 {
            println!(
                "    - {} dead letters: deliveries given up on, waiting for an operator \
                 (ModuleHandle::dead_letters, replay_dead_letter)",
                report.dead_letters
            );
        }
        for problem in &report.problems {
            println!("    - {}", problem.text);
        }
    }
    if options.json {
        let metrics = serde_json::to_value(m).unwrap_or_else(
            |e| serde_json::json!({ "error": format!("the metrics did not serialize: {e}") }),
        );
        let line = serde_json::json!({
            "backend": report.backend,
            "placed": report.placed,
            "orders": report.orders,
            "reservations": report.reservations,
            "confirmations": report.confirmations,
            "emails": report.emails,
            "handled": m.total(|h| h.handled),
            "duplicates_skipped": m.total(|h| h.duplicates_skipped),
            "duplicates_injected": m.duplicates_injected,
            "failed": m.total(|h| h.failed),
            "retries": m.total(|h| h.retried),
            "delivered": m.delivered,
            "pending": report.pending,
            "dead_letters": report.dead_letters,
            "drained": report.drained,
            "interrupted": report.interrupted,
            "unfinished": report.unfinished,
            "modules": report.modules.names(),
            "problems": report.problems.iter().map(|p| &p.text).collect::<Vec<_>>(),
            "place_seconds": report.place_seconds,
            "drain_seconds": report.drain_seconds,
            "total_seconds": report.total_seconds,
            "metrics": metrics,
            "ok": ok,
        });
        println!("{line}");
    }
}

/// The final metrics as tables: per handler its counters and latencies,
/// per module its outbox.
fn print_metrics(report: &Report) {
    let handlers: Vec<_> = report
        .metrics
        .modules
        .iter()
        .flat_map(|m| &m.handlers)
        .collect();
    let width = handlers
        .iter()
        .map(|h| h.handler.chars().count())
        .chain(report.metrics.modules.iter().map(|m| m.module.len()))
        .max()
        .unwrap_or(0)
        .max("handler".len());
    println!();
    println!(
        "  {:<width$}  {:>8}  {:>10}  {:>7}  {:>7}  {:>13}  {:>7}  {:>9}",
        "handler",
        "handled",
        "duplicates",
        "failed",
        "retried",
        "dead-lettered",
        "batches",
        "fallbacks"
    );
    for h in &handlers {
        println!(
            "  {:<width$}  {:>8}  {:>10}  {:>7}  {:>7}  {:>13}  {:>7}  {:>9}",
            h.handler,
            h.handled,
            h.duplicates_skipped,
            h.failed,
            h.retried,
            h.dead_lettered,
            h.batches,
            h.batch_fallbacks
        );
    }
    println!();
    println!(
        "  {:<width$}  {:>30}  {:>30}",
        "handler", "transaction p50 / p99 / mean", "end to end p50 / p99 / mean"
    );
    for h in &handlers {
        println!(
            "  {:<width$}  {:>30}  {:>30}",
            h.handler,
            latency(&h.latency),
            latency(&h.end_to_end)
        );
    }
    println!("  (p50 and p99 are upper bounds: the histogram bucket each falls in)");
    println!();
    println!(
        "  {:<width$}  {:>9}  {:>7}  {:>12}",
        "outbox", "delivered", "pending", "dead letters"
    );
    for module in &report.metrics.modules {
        let outbox = &module.outbox;
        println!(
            "  {:<width$}  {:>9}  {:>7}  {:>12}",
            module.module, outbox.delivered, outbox.pending, outbox.dead_letters
        );
    }
    println!();
}

/// `≤p50 / ≤p99 / mean` of a latency histogram, or `-` without observations.
fn latency(l: &LatencyMetrics) -> String {
    if l.count == 0 {
        return "-".into();
    }
    let bound = |q: f64| {
        let b = l.quantile_upper_bound(q);
        if b.is_finite() {
            format!("≤{}", seconds(b))
        } else {
            let last = l.buckets.last().map_or(0.0, |(le, _)| *le);
            format!(">{}", seconds(last))
        }
    };
    format!(
        "{} / {} / {}",
        bound(0.5),
        bound(0.99),
        seconds(l.mean_seconds())
    )
}

/// A duration in seconds, in ms below a second, three significant digits.
fn seconds(s: f64) -> String {
    let (value, unit) = if s < 1.0 { (s * 1e3, "ms") } else { (s, "s") };
    let digits = if value >= 100.0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    let text = format!("{value:.digits$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text} {unit}")
}

/// A run that could not produce a report still ends with a JSON line.
fn print_error(error: &str, options: &Options) {
    eprintln!("minishop: {error}");
    if options.json {
        let line = serde_json::json!({
            "orders": null,
            "reservations": null,
            "confirmations": null,
            "emails": null,
            "duplicates_skipped": null,
            "retries": null,
            "pending": null,
            "dead_letters": null,
            "metrics": null,
            "error": error,
            "ok": false,
        });
        println!("{line}");
    }
}

/// Serves the Prometheus endpoint, before any module starts (modules
/// register their metrics when they start); on failure the message and the
/// exit code.
fn serve_metrics(addr: SocketAddr) -> Result<(), (String, u8)> {
    #[cfg(feature = "prometheus")]
    {
        let exporter = tickbox::install_prometheus(addr)
            .map_err(|e| (format!("cannot serve the metrics: {e}"), 1))?;
        tracing::info!(
            "serving Prometheus metrics at http://{}/metrics",
            exporter.addr()
        );
        Ok(())
    }
    #[cfg(not(feature = "prometheus"))]
    {
        Err((
            format!(
                "--metrics-addr {addr} needs the Prometheus endpoint, which this build leaves out; \
                 add `--features prometheus`: cargo run --release --features prometheus --example minishop -- --metrics-addr {addr}"
            ),
            2,
        ))
    }
}

#[actix::main]
async fn main() -> ExitCode {
    let options = match parse_args(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(options)) => options,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(error) => {
            eprintln!("minishop: {error}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,minishop=info,tickbox=warn".into()),
        )
        .with_writer(LogWriter::default)
        .with_ansi(std::io::stderr().is_terminal())
        .init();

    // From here on Ctrl-C no longer kills the process at once: it asks the
    // run to stop (a second one quits).
    let interrupt = Interrupt::new();
    actix::spawn(on_ctrl_c(interrupt.clone()));
    if let Some(addr) = options.metrics_addr {
        if let Err((error, code)) = serve_metrics(addr) {
            print_error(&error, &options);
            return ExitCode::from(code);
        }
    }

    let result = match &options.store {
        Store::Sqlite(dir) => {
            #[cfg(feature = "sqlite")]
            {
                match std::fs::create_dir_all(dir) {
                    Ok(()) => run::<tickbox::Sqlite>(&options, dir, &interrupt)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(format!("cannot create the data directory {dir}: {e}")),
                }
            }
            #[cfg(not(feature = "sqlite"))]
            {
                Err(format!(
                    "SQLite (--data-dir {dir}) needs the `sqlite` feature, which this build leaves out; \
                     add `--features sqlite` or use --database-url postgres://..."
                ))
            }
        }
        Store::Postgres(url) => {
            #[cfg(feature = "postgres")]
            {
                run::<tickbox::Postgres>(&options, url, &interrupt)
                    .await
                    .map_err(|e| e.to_string())
            }
            #[cfg(not(feature = "postgres"))]
            {
                let _ = url;
                Err("--database-url needs PostgreSQL support, which this build leaves out; \
                     add `--features postgres`: cargo run --release --features postgres --example minishop -- --database-url postgres://..."
                    .to_string())
            }
        }
    };

    match result {
        Ok(report) => {
            print_report(&report, &options);
            report.exit_code()
        }
        Err(error) => {
            print_error(&error, &options);
            ExitCode::FAILURE
        }
    }
}
