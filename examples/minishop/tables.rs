//! The modules' own tables, and every query the example runs on them.
//!
//! tickbox creates and owns its own tables (`tickbox_outbox`,
//! `tickbox_inbox`, …) in each module's database; these are the
//! application's, beside them. Each query is written once and runs on
//! either backend through [`Db`].

use crate::db::Db;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tickbox::diesel::{self, ExpressionMethods, OptionalExtension, QueryDsl, QueryResult};
use tickbox::diesel_migrations::{self, embed_migrations, EmbeddedMigrations};

/// Each module's own tables, created by the migrations beside this file
/// (`migrations/MODULE/`), which tickbox runs when the module starts: after
/// its own tables, under the same lock, so processes starting together run
/// them once. The SQL runs unchanged on SQLite and PostgreSQL.
pub const ORDERS_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/minishop/migrations/orders");
pub const WAREHOUSE_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/minishop/migrations/warehouse");
pub const NOTIFICATIONS_MIGRATIONS: EmbeddedMigrations =
    embed_migrations!("examples/minishop/migrations/notifications");

/// Items the warehouse stocks (its migration seeds each far beyond what any
/// run orders).
const SKUS: [&str; 5] = ["kettle", "teapot", "mug", "spoon", "tea-tin"];

mod schema {
    tickbox::diesel::table! {
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

    tickbox::diesel::table! {
        placing_runs (id) {
            id -> Text,
            planned -> BigInt,
            started_at_us -> BigInt,
            alive_until_us -> BigInt,
            ended_at_us -> Nullable<BigInt>,
        }
    }

    tickbox::diesel::table! {
        stock (sku) {
            sku -> Text,
            seeded -> BigInt,
            available -> BigInt,
        }
    }

    tickbox::diesel::table! {
        reservations (order_id) {
            order_id -> Text,
            sku -> Text,
            quantity -> Integer,
            reserved_at_us -> BigInt,
        }
    }

    tickbox::diesel::table! {
        shortages (order_id) {
            order_id -> Text,
            sku -> Text,
            quantity -> Integer,
            short_at_us -> BigInt,
        }
    }

    tickbox::diesel::table! {
        ignored_messages (message_id, handler) {
            message_id -> Text,
            handler -> Text,
            order_id -> Text,
            reason -> Text,
            ignored_at_us -> BigInt,
        }
    }

    tickbox::diesel::table! {
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

use schema::{ignored_messages, orders, placing_runs, reservations, sent_emails, shortages, stock};

/// Where an order stands in the orders module's saga (its `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStatus {
    /// Placed, waiting for the warehouse's answer.
    Placed,
    /// The warehouse reserved the stock: confirmed (and e-mailed).
    Confirmed,
    /// The warehouse was short of stock: no confirmation, no e-mail.
    Rejected,
}

impl OrderStatus {
    /// The status as the `orders` table stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Placed => "placed",
            OrderStatus::Confirmed => "confirmed",
            OrderStatus::Rejected => "rejected",
        }
    }
}

#[derive(Debug, Clone, diesel::Insertable)]
#[diesel(table_name = orders)]
pub struct NewOrder {
    pub id: String,
    pub customer: String,
    pub sku: String,
    pub quantity: i32,
    status: &'static str,
    placed_at_us: i64,
}

impl NewOrder {
    /// An order of a random customer for a few of a random item.
    pub fn random() -> Self {
        NewOrder {
            id: uuid::Uuid::now_v7().to_string(),
            customer: format!("customer{}@example.com", fastrand::u32(1..=500)),
            sku: SKUS[fastrand::usize(..SKUS.len())].to_string(),
            quantity: fastrand::i32(1..=5),
            status: OrderStatus::Placed.as_str(),
            placed_at_us: now_us(),
        }
    }

    /// An order for more of an item than the warehouse ever stocks (its
    /// migration seeds 10⁹ of each): the warehouse finds it short and the
    /// order is rejected.
    pub fn beyond_stock() -> Self {
        NewOrder {
            quantity: i32::MAX,
            ..NewOrder::random()
        }
    }
}

#[derive(Debug, diesel::Insertable)]
#[diesel(table_name = reservations)]
pub struct NewReservation {
    pub order_id: String,
    pub sku: String,
    pub quantity: i32,
    pub reserved_at_us: i64,
}

#[derive(Debug, diesel::Insertable)]
#[diesel(table_name = shortages)]
pub struct NewShortage {
    pub order_id: String,
    pub sku: String,
    pub quantity: i32,
    pub short_at_us: i64,
}

/// A message a handler did not apply because it did not fit what its
/// module's database holds, and why (`ignored_messages`, a table of both
/// the orders and the warehouse databases).
#[derive(Debug, diesel::Insertable)]
#[diesel(table_name = ignored_messages)]
pub struct IgnoredMessage {
    pub message_id: String,
    pub handler: String,
    pub order_id: String,
    pub reason: String,
    pub ignored_at_us: i64,
}

impl IgnoredMessage {
    /// The message of `delivery`, about order `order_id`, ignored because
    /// of `reason`.
    pub fn new(delivery: &tickbox::Delivery, order_id: &str, reason: String) -> Self {
        IgnoredMessage {
            message_id: delivery.envelope.id.to_string(),
            handler: delivery.handler.to_string(),
            order_id: order_id.to_owned(),
            reason,
            ignored_at_us: now_us(),
        }
    }
}

#[derive(Debug, diesel::Insertable)]
#[diesel(table_name = sent_emails)]
pub struct NewEmail {
    pub id: String,
    pub order_id: String,
    pub recipient: String,
    pub subject: String,
    pub idempotency_key: String,
    pub sent_at_us: i64,
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

// ---------------------------------------------------------------------------
// orders

pub async fn insert_order(db: &mut Db<'_>, order: NewOrder) -> QueryResult<()> {
    db.execute(diesel::insert_into(orders::table).values(order))
        .await
        .map(drop)
}

/// Settles order `order_id`, moving it from placed to `to` (confirmed or
/// rejected) and counting a confirmation; false when the order is not
/// placed (settled already, or no such order), which it leaves as it is.
/// The condition is in the `UPDATE` itself: two transactions settling one
/// order at once cannot both find it placed.
pub async fn settle_order(db: &mut Db<'_>, order_id: &str, to: OrderStatus) -> QueryResult<bool> {
    let placed = orders::table
        .filter(orders::id.eq(order_id.to_owned()))
        .filter(orders::status.eq(OrderStatus::Placed.as_str()));
    let confirmed = to == OrderStatus::Confirmed;
    let settle = diesel::update(placed).set((
        orders::status.eq(to.as_str()),
        orders::confirmations.eq(orders::confirmations + i32::from(confirmed)),
        orders::confirmed_at_us.eq(confirmed.then(now_us)),
    ));
    Ok(db.execute(settle).await? == 1)
}

/// An order's status, or `None` if there is no such order.
pub async fn order_status(db: &mut Db<'_>, order_id: &str) -> QueryResult<Option<String>> {
    let query = orders::table
        .find(order_id.to_owned())
        .select(orders::status);
    db.get_result(query).await.optional()
}

/// An order's customer.
pub async fn order_customer(db: &mut Db<'_>, order_id: &str) -> QueryResult<String> {
    let query = orders::table
        .find(order_id.to_owned())
        .select(orders::customer);
    db.get_result(query).await
}

/// How many orders there are, and how many of them are confirmed and
/// rejected.
#[derive(Debug, Clone, Copy)]
pub struct OrderCounts {
    pub all: i64,
    pub confirmed: i64,
    pub rejected: i64,
}

pub async fn order_counts(db: &mut Db<'_>) -> QueryResult<OrderCounts> {
    let all = db.get_result(orders::table.count()).await?;
    let mut with_status = async |status: OrderStatus| {
        let query = orders::table.filter(orders::status.eq(status.as_str()));
        db.get_result(query.count()).await
    };
    Ok(OrderCounts {
        all,
        confirmed: with_status(OrderStatus::Confirmed).await?,
        rejected: with_status(OrderStatus::Rejected).await?,
    })
}

/// Every order: (id, status, confirmations).
pub async fn load_orders(db: &mut Db<'_>) -> QueryResult<Vec<(String, String, i32)>> {
    let query = orders::table.select((orders::id, orders::status, orders::confirmations));
    db.load(query).await
}

// ---------------------------------------------------------------------------
// orders: placing runs

/// How long a run placing orders counts as placing without renewing its
/// row: a run killed while placing holds the other processes back this long.
pub const RUN_LEASE: Duration = Duration::from_secs(5);

fn lease_end() -> i64 {
    now_us() + RUN_LEASE.as_micros() as i64
}

/// Records that run `id` starts placing `planned` orders.
pub async fn start_run(db: &mut Db<'_>, id: &str, planned: i64) -> QueryResult<()> {
    let insert = diesel::insert_into(placing_runs::table).values((
        placing_runs::id.eq(id.to_owned()),
        placing_runs::planned.eq(planned),
        placing_runs::started_at_us.eq(now_us()),
        placing_runs::alive_until_us.eq(lease_end()),
    ));
    db.execute(insert).await.map(drop)
}

/// Renews run `id`'s lease.
pub async fn renew_run(db: &mut Db<'_>, id: &str) -> QueryResult<()> {
    let renew = diesel::update(placing_runs::table.find(id.to_owned()))
        .set(placing_runs::alive_until_us.eq(lease_end()));
    db.execute(renew).await.map(drop)
}

/// Records that run `id` places no more orders.
pub async fn end_run(db: &mut Db<'_>, id: &str) -> QueryResult<()> {
    let end = diesel::update(placing_runs::table.find(id.to_owned()))
        .set(placing_runs::ended_at_us.eq(now_us()));
    db.execute(end).await.map(drop)
}

/// A run that placed, or places, orders.
#[derive(Debug)]
pub struct PlacingRun {
    pub planned: i64,
    /// Not ended, and its lease not run out.
    pub placing: bool,
}

pub async fn load_runs(db: &mut Db<'_>) -> QueryResult<Vec<PlacingRun>> {
    let query = placing_runs::table.select((
        placing_runs::planned,
        placing_runs::alive_until_us,
        placing_runs::ended_at_us,
    ));
    let now = now_us();
    let runs: Vec<(i64, i64, Option<i64>)> = db.load(query).await?;
    Ok(runs
        .into_iter()
        .map(|(planned, alive_until, ended)| PlacingRun {
            planned,
            placing: ended.is_none() && alive_until > now,
        })
        .collect())
}

// ---------------------------------------------------------------------------
// warehouse

/// What the warehouse answered order `order_id`: `Some("reserved")` or
/// `Some("found short")`, `None` if it has not answered it yet.
pub async fn answer_given(db: &mut Db<'_>, order_id: &str) -> QueryResult<Option<&'static str>> {
    let reserved = reservations::table.filter(reservations::order_id.eq(order_id.to_owned()));
    if db.get_result::<i64>(reserved.count()).await? > 0 {
        return Ok(Some("reserved"));
    }
    let short = shortages::table.filter(shortages::order_id.eq(order_id.to_owned()));
    if db.get_result::<i64>(short.count()).await? > 0 {
        return Ok(Some("found short"));
    }
    Ok(None)
}

/// Locks every stock row, in sku order, until the transaction ends (see
/// `ReserveStock` for why).
///
/// PostgreSQL: `SELECT sku FROM stock ORDER BY sku FOR NO KEY UPDATE` locks
/// the rows one after the other in the sort's order. `NO KEY UPDATE` is the
/// lock the later `UPDATE` of `available` takes anyway, so running this
/// again in the same transaction, on rows it already locked or updated,
/// waits for nobody. SQLite: nothing to do, a write transaction
/// (`BEGIN IMMEDIATE`) holds the whole database's one write lock from its
/// start.
pub async fn lock_stock(db: &mut Db<'_>) -> QueryResult<()> {
    match db {
        Db::Sqlite(_) => Ok(()),
        #[cfg(feature = "postgres")]
        Db::Postgres(conn) => {
            use tickbox::diesel_async::RunQueryDsl;
            let lock = stock::table
                .select(stock::sku)
                .order(stock::sku)
                .for_no_key_update();
            lock.load::<String>(&mut **conn).await.map(drop)
        }
    }
}

/// Takes the stock and records the reservation; false if out of stock.
pub async fn reserve(db: &mut Db<'_>, reservation: NewReservation) -> QueryResult<bool> {
    let quantity = i64::from(reservation.quantity);
    let item = stock::table
        .filter(stock::sku.eq(reservation.sku.clone()))
        .filter(stock::available.ge(quantity));
    let take = diesel::update(item).set(stock::available.eq(stock::available - quantity));
    if db.execute(take).await? == 0 {
        return Ok(false);
    }
    let insert = diesel::insert_into(reservations::table).values(reservation);
    db.execute(insert).await?;
    Ok(true)
}

/// Every reservation: (order id, sku, quantity).
pub async fn load_reservations(db: &mut Db<'_>) -> QueryResult<Vec<(String, String, i32)>> {
    let query = reservations::table.select((
        reservations::order_id,
        reservations::sku,
        reservations::quantity,
    ));
    db.load(query).await
}

/// Records that the warehouse was short of stock for an order.
pub async fn record_shortage(db: &mut Db<'_>, shortage: NewShortage) -> QueryResult<()> {
    let insert = diesel::insert_into(shortages::table).values(shortage);
    db.execute(insert).await.map(drop)
}

/// The order id of every shortage.
pub async fn load_shortages(db: &mut Db<'_>) -> QueryResult<Vec<String>> {
    db.load(shortages::table.select(shortages::order_id)).await
}

pub async fn reservation_count(db: &mut Db<'_>) -> QueryResult<i64> {
    db.get_result(reservations::table.count()).await
}

/// Every item: (sku, seeded, available).
pub async fn load_stock(db: &mut Db<'_>) -> QueryResult<Vec<(String, i64, i64)>> {
    let query = stock::table.select((stock::sku, stock::seeded, stock::available));
    db.load(query).await
}

// ---------------------------------------------------------------------------
// orders and warehouse: messages ignored

/// Records a message a handler ignored.
pub async fn record_ignored(db: &mut Db<'_>, ignored: IgnoredMessage) -> QueryResult<()> {
    let insert = diesel::insert_into(ignored_messages::table).values(ignored);
    db.execute(insert).await.map(drop)
}

/// Why handler `handler` ignored message `message_id`; `None` if it did
/// not.
pub async fn ignored_reason(
    db: &mut Db<'_>,
    message_id: &str,
    handler: &str,
) -> QueryResult<Option<String>> {
    let query = ignored_messages::table
        .find((message_id.to_owned(), handler.to_owned()))
        .select(ignored_messages::reason);
    db.get_result(query).await.optional()
}

/// How many messages were ignored, for each reason.
pub async fn ignored_per_reason(db: &mut Db<'_>) -> QueryResult<Vec<(String, i64)>> {
    let query = ignored_messages::table
        .group_by(ignored_messages::reason)
        .select((ignored_messages::reason, diesel::dsl::count_star()))
        .order(ignored_messages::reason);
    db.load(query).await
}

// ---------------------------------------------------------------------------
// notifications

pub async fn insert_email(db: &mut Db<'_>, email: NewEmail) -> QueryResult<()> {
    db.execute(diesel::insert_into(sent_emails::table).values(email))
        .await
        .map(drop)
}

pub async fn email_count(db: &mut Db<'_>) -> QueryResult<i64> {
    db.get_result(sent_emails::table.count()).await
}

/// The order id of every e-mail sent.
pub async fn load_email_orders(db: &mut Db<'_>) -> QueryResult<Vec<String>> {
    db.load(sent_emails::table.select(sent_emails::order_id))
        .await
}
