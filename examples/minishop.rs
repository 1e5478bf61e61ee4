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
//! cargo run --release --example minishop -- [--orders N] [--data-dir DIR | --database-url postgres://…] [--resume] [--duplicate-rate P] [--fail-rate P] [--json]
//! ```
//!
//! SQLite (the default) keeps one file per module under `./minishop-data`.
//! `--database-url` needs the `postgres` feature
//! (`cargo run --release --features postgres --example minishop -- --database-url postgres://…`)
//! and puts each module in its own schema: `minishop_orders`,
//! `minishop_warehouse`, `minishop_notifications`. `RUST_LOG` sets the log
//! filter (default `warn,minishop=info`); logs go to stderr, the summary to
//! stdout, and with `--json` the last line of stdout is one JSON object. The
//! exit code is 0 when the check passes, 1 when it fails, 2 for bad arguments.

use diesel_async::SimpleAsyncConnection;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tickbox::{
    Backend, Bus, BusHandle, Handler, HandlerError, Message, ModuleBuilder, ModuleHandle,
    RetryPolicy, Tx,
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
    shop_queries!();
}

#[cfg(feature = "postgres")]
impl Shop for tickbox::Postgres {
    fn module(location: &str, name: &str) -> ModuleBuilder<Self> {
        tickbox::Module::builder(name, location).schema(format!("minishop_{name}"))
    }
    shop_queries!();
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

// ---------------------------------------------------------------------------
// Handlers

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
struct ReserveStock;

impl<B: Shop> Handler<B> for ReserveStock {
    type Message = OrderPlaced;

    async fn handle(&self, tx: &mut Tx<B>, order: OrderPlaced) -> Result<(), HandlerError> {
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
                [--duplicate-rate P] [--fail-rate P] [--json]

  --orders N            place N new orders, then run until every outbox is drained (default 100)
  --data-dir DIR        SQLite: one database file per module in DIR (default ./minishop-data)
  --database-url URL    PostgreSQL (needs the `postgres` feature): one schema per module,
                        minishop_orders, minishop_warehouse, minishop_notifications
  --resume              place no orders; only finish pending work (after a crash)
  --duplicate-rate P    deliver each message a second time with probability P (0..=1)
  --fail-rate P         make each handler invocation fail before COMMIT with probability P (0..=1)
  --json                end with one line holding the result as a JSON object
  -h, --help            show this text

exit code: 0 when every order has exactly one reservation, one confirmation and one
e-mail, no message is pending and there are no dead letters; 1 otherwise; 2 for bad
arguments";

#[derive(Debug)]
enum Store {
    Sqlite(String),
    Postgres(String),
}

#[derive(Debug)]
struct Options {
    /// New orders to place (0 with `--resume`).
    orders: u64,
    store: Store,
    resume: bool,
    duplicate_rate: f64,
    fail_rate: f64,
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
            "--orders" | "--data-dir" | "--database-url" | "--duplicate-rate" | "--fail-rate"
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
            "--resume" => resume = true,
            "--json" => json = true,
            "-h" | "--help" => return Ok(Parsed::Help),
            _ => return Err(format!("unknown argument `{arg}`")),
        }
    }

    if resume && orders.is_some() {
        return Err("--resume places no orders; leave out --orders".into());
    }
    let store = match (data_dir, database_url) {
        (Some(_), Some(_)) => {
            return Err("--data-dir and --database-url exclude each other".into());
        }
        (_, Some(url)) => Store::Postgres(url),
        (dir, None) => Store::Sqlite(dir.unwrap_or_else(|| "./minishop-data".into())),
    };
    Ok(Parsed::Run(Options {
        orders: if resume { 0 } else { orders.unwrap_or(100) },
        store,
        resume,
        duplicate_rate: duplicate_rate.unwrap_or(0.0),
        fail_rate: fail_rate.unwrap_or(0.0),
        json,
    }))
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
    placed: u64,
    orders: usize,
    reservations: usize,
    confirmations: i64,
    emails: usize,
    pending: i64,
    dead_letters: i64,
    problems: Vec<String>,
    drained: bool,
    metrics: tickbox::BusMetrics,
    place_seconds: f64,
    drain_seconds: f64,
    total_seconds: f64,
}

impl Report {
    fn ok(&self) -> bool {
        self.drained && self.pending == 0 && self.dead_letters == 0 && self.problems.is_empty()
    }
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

async fn start_modules<B: Shop>(options: &Options, location: &str) -> tickbox::Result<Modules<B>> {
    let fail = options.fail_rate;
    let orders = B::module(location, "orders")
        .publishes::<OrderPlaced>()
        .publishes::<OrderConfirmed>()
        .handler("orders.confirm_order", flaky(ConfirmOrder, fail))
        .start()
        .await?;
    let warehouse = B::module(location, "warehouse")
        .publishes::<StockReserved>()
        .handler("warehouse.reserve_stock", flaky(ReserveStock, fail))
        .start()
        .await?;
    let notifications = B::module(location, "notifications")
        .handler(
            "notifications.send_confirmation",
            flaky(SendConfirmation, fail),
        )
        .start()
        .await?;

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

/// Places `n` orders, each in its own transaction publishing `OrderPlaced`.
async fn place_orders<B: Shop>(orders: &ModuleHandle<B>, n: u64) -> tickbox::Result<()> {
    let step = (n / 10).max(1);
    for i in 1..=n {
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
        if i % step == 0 || i == n {
            tracing::info!("placed {i}/{n} orders");
        }
    }
    Ok(())
}

/// (orders, confirmed orders, e-mails) — cheap counts for waiting.
async fn progress<B: Shop>(shop: &Modules<B>) -> tickbox::Result<(i64, i64, i64)> {
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

/// Dead letters over every module: deliveries the bus gave up on.
async fn dead_letters<B: Backend>(bus: &BusHandle<B>) -> tickbox::Result<i64> {
    let mut total = 0;
    for module in bus.modules() {
        total += retrying("counting dead letters", nothing_else, || {
            module.store_stats()
        })
        .await?
        .dead_letters;
    }
    Ok(total)
}

/// Waits until the work is finished, polling with a deadline: every order
/// confirmed and e-mailed and no outbox message pending — or nothing pending
/// any more while dead letters hold up the rest. True when that happened in
/// time.
///
/// `BusHandle::pending` reads the outboxes one after another, so on its own a
/// message moving from one module's outbox to another's while they are read
/// can be missed. The business state is read first: once every order has its
/// confirmation and e-mail, no new message is published, and a later count of
/// zero pending messages is final. Without that (dead letters), nothing
/// pending must hold for several polls in a row.
async fn wait_until_drained<B: Shop>(
    shop: &Modules<B>,
    bus: &BusHandle<B>,
) -> tickbox::Result<bool> {
    let (orders, _, _) = progress(shop).await?;
    let timeout = Duration::from_secs(60) + Duration::from_millis(20) * orders as u32;
    let started = Instant::now();
    let mut last_log = Instant::now();
    let mut idle_polls = 0;
    loop {
        let (orders, confirmed, emails) = progress(shop).await?;
        let complete = confirmed == orders && emails >= orders;
        let pending = retrying("counting pending messages", nothing_else, || bus.pending()).await?;
        if complete && pending == 0 {
            return Ok(true);
        }
        idle_polls = if pending == 0 { idle_polls + 1 } else { 0 };
        if idle_polls >= 5 && dead_letters(bus).await? > 0 {
            tracing::error!(
                "stopped waiting: nothing is pending, but dead letters hold up {} orders",
                orders - confirmed.min(emails)
            );
            return Ok(true);
        }
        if started.elapsed() >= timeout {
            tracing::error!(
                "timed out after {timeout:?}: {confirmed}/{orders} orders confirmed, {emails} e-mails, {pending} messages pending"
            );
            return Ok(false);
        }
        if last_log.elapsed() >= Duration::from_secs(2) {
            last_log = Instant::now();
            tracing::info!(
                "waiting: {confirmed}/{orders} orders confirmed, {emails} e-mails, {pending} messages pending"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// Checks the databases; returns what is wrong, one line per kind of problem.
fn verify(snapshot: &Snapshot) -> Vec<String> {
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
    problems
        .into_iter()
        .map(|(what, ids)| {
            let examples = ids[..ids.len().min(3)].join(", ");
            let more = if ids.len() > 3 { ", …" } else { "" };
            format!("{} {what} (e.g. {examples}{more})", ids.len())
        })
        .collect()
}

async fn run<B: Shop>(options: &Options, location: &str) -> tickbox::Result<Report> {
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
        .start()?;

    // Stop the bus whatever happens from here on.
    let outcome = async {
        if options.resume {
            tracing::info!("resuming: placing no orders, finishing pending work");
        }
        let placing = Instant::now();
        place_orders(&shop.orders, options.orders).await?;
        let place_seconds = placing.elapsed().as_secs_f64();
        let draining = Instant::now();
        let drained = wait_until_drained(&shop, &bus).await?;
        Ok::<_, tickbox::Error>((place_seconds, draining.elapsed().as_secs_f64(), drained))
    }
    .await;
    bus.stop().await;
    let (place_seconds, drain_seconds, drained) = outcome?;

    // Everything below is read from the databases, after the bus stopped.
    let snapshot = snapshot(&shop).await?;
    let pending = retrying("counting pending messages", nothing_else, || bus.pending()).await?;
    let dead_letters = dead_letters(&bus).await?;
    Ok(Report {
        backend: B::NAME,
        placed: options.orders,
        orders: snapshot.orders.len(),
        reservations: snapshot.reservations.len(),
        confirmations: snapshot.orders.iter().map(|(_, _, c)| i64::from(*c)).sum(),
        emails: snapshot.emails.len(),
        pending,
        dead_letters,
        problems: verify(&snapshot),
        drained,
        metrics: bus.metrics(),
        place_seconds,
        drain_seconds,
        total_seconds: started.elapsed().as_secs_f64(),
    })
}

fn print_report(report: &Report, options: &Options) {
    let m = &report.metrics;
    let ok = report.ok();
    println!(
        "MiniShop on {}: placed {} new orders in {:.2} s, drained in {:.2} s ({:.2} s in all)",
        report.backend,
        report.placed,
        report.place_seconds,
        report.drain_seconds,
        report.total_seconds
    );
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
    if ok {
        println!("  check:     OK — every order has exactly one reservation, one confirmation and one e-mail; no message pending");
    } else {
        println!("  check:     FAILED");
        if !report.drained {
            println!("    - the work did not finish before the deadline");
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
            println!("    - {problem}");
        }
    }
    if options.json {
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
            "problems": report.problems,
            "place_seconds": report.place_seconds,
            "drain_seconds": report.drain_seconds,
            "total_seconds": report.total_seconds,
            "ok": ok,
        });
        println!("{line}");
    }
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
            "error": error,
            "ok": false,
        });
        println!("{line}");
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
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();

    let result = match &options.store {
        Store::Sqlite(dir) => {
            #[cfg(feature = "sqlite")]
            {
                match std::fs::create_dir_all(dir) {
                    Ok(()) => run::<tickbox::Sqlite>(&options, dir)
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
                run::<tickbox::Postgres>(&options, url)
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
            if report.ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(error) => {
            print_error(&error, &options);
            ExitCode::FAILURE
        }
    }
}
