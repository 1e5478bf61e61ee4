//! The modules' own tables, and every query the example runs on them.
//!
//! tickbox creates and owns its own tables (`tickbox_outbox`,
//! `tickbox_inbox`, …) in each module's database; these are the
//! application's, beside them. The queries on them are in `queries.rs`,
//! and `db.rs` runs them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tickbox::diesel;
use tickbox::diesel_migrations::{self, embed_migrations, EmbeddedMigrations};

/// Each module's own tables, created by the migrations beside this file,
/// which tickbox runs when the module starts: after its own tables, under
/// the same lock, so processes starting together run them once. One set
/// per dialect: [`PORTABLE_MIGRATIONS`] and [`MYSQL_MIGRATIONS`]; each
/// backend names its own (`db::Dialect::MIGRATIONS`).
pub struct Migrations {
    pub orders: EmbeddedMigrations,
    pub warehouse: EmbeddedMigrations,
    pub notifications: EmbeddedMigrations,
}

impl Migrations {
    /// The migrations of `module`'s own tables.
    pub fn of(&'static self, module: crate::cli::ModuleName) -> &'static EmbeddedMigrations {
        match module {
            crate::cli::ModuleName::Orders => &self.orders,
            crate::cli::ModuleName::Warehouse => &self.warehouse,
            crate::cli::ModuleName::Notifications => &self.notifications,
        }
    }
}

/// `migrations/MODULE/`: SQL that runs unchanged on SQLite and PostgreSQL.
pub const PORTABLE_MIGRATIONS: Migrations = Migrations {
    orders: embed_migrations!("examples/minishop/migrations/orders"),
    warehouse: embed_migrations!("examples/minishop/migrations/warehouse"),
    notifications: embed_migrations!("examples/minishop/migrations/notifications"),
};

/// `mysql_migrations/MODULE/`: the same tables on MariaDB and MySQL, which
/// index no `TEXT` key and spell the stock's seed `ON DUPLICATE KEY UPDATE`.
#[cfg(feature = "mysql")]
pub const MYSQL_MIGRATIONS: Migrations = Migrations {
    orders: embed_migrations!("examples/minishop/mysql_migrations/orders"),
    warehouse: embed_migrations!("examples/minishop/mysql_migrations/warehouse"),
    notifications: embed_migrations!("examples/minishop/mysql_migrations/notifications"),
};

/// Items the warehouse stocks (its migration seeds each far beyond what any
/// run orders).
const SKUS: [&str; 5] = ["kettle", "teapot", "mug", "spoon", "tea-tin"];

pub mod schema {
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
            confirm_by_us -> Nullable<BigInt>,
            cancelled_at_us -> Nullable<BigInt>,
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

use schema::{ignored_messages, orders, reservations, sent_emails, shortages};

/// Where an order stands in the orders module's saga (its `status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderStatus {
    /// Placed, waiting for the warehouse's answer.
    Placed,
    /// The warehouse reserved the stock: confirmed (and e-mailed).
    Confirmed,
    /// The warehouse was short of stock: no confirmation, no e-mail.
    Rejected,
    /// Not confirmed by its deadline (`--confirm-within`): its
    /// `OrderTimedOut` cancelled it. No confirmation, no e-mail.
    Cancelled,
}

impl OrderStatus {
    /// The status as the `orders` table stores it.
    pub fn as_str(self) -> &'static str {
        match self {
            OrderStatus::Placed => "placed",
            OrderStatus::Confirmed => "confirmed",
            OrderStatus::Rejected => "rejected",
            OrderStatus::Cancelled => "cancelled",
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
    /// With `--confirm-within`: confirmed by then, or cancelled.
    confirm_by_us: Option<i64>,
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
            confirm_by_us: None,
        }
    }

    /// The order, to be confirmed within `window` of its placing
    /// (`--confirm-within`), or cancelled.
    pub fn confirmed_within(self, window: Option<Duration>) -> Self {
        let confirm_by_us = window.map(|w| self.placed_at_us + w.as_micros() as i64);
        NewOrder {
            confirm_by_us,
            ..self
        }
    }

    /// When the order must be confirmed by, if it has a deadline.
    pub fn confirm_by(&self) -> Option<SystemTime> {
        let micros = u64::try_from(self.confirm_by_us?).ok()?;
        Some(UNIX_EPOCH + Duration::from_micros(micros))
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

impl NewReservation {
    /// A reservation of `quantity` of `sku` for order `order_id`, now.
    pub fn of(order_id: &str, sku: &str, quantity: i32) -> Self {
        NewReservation {
            order_id: order_id.to_owned(),
            sku: sku.to_owned(),
            quantity,
            reserved_at_us: now_us(),
        }
    }
}

#[derive(Debug, diesel::Insertable)]
#[diesel(table_name = shortages)]
pub struct NewShortage {
    pub order_id: String,
    pub sku: String,
    pub quantity: i32,
    pub short_at_us: i64,
}

impl NewShortage {
    /// Too little of `sku` for order `order_id`, found now.
    pub fn of(order_id: &str, sku: &str, quantity: i32) -> Self {
        NewShortage {
            order_id: order_id.to_owned(),
            sku: sku.to_owned(),
            quantity,
            short_at_us: now_us(),
        }
    }
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

impl NewEmail {
    /// The confirmation e-mail of order `order_id` to `recipient`, sent now
    /// under `idempotency_key`.
    pub fn new(
        subject: String,
        order_id: String,
        recipient: String,
        idempotency_key: String,
    ) -> Self {
        NewEmail {
            id: uuid::Uuid::now_v7().to_string(),
            order_id,
            recipient,
            subject,
            idempotency_key,
            sent_at_us: now_us(),
        }
    }
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

// ---------------------------------------------------------------------------
// What the queries read, put together (see `db.rs`).

/// How many orders there are, and how many of them are confirmed,
/// rejected and cancelled.
#[derive(Debug, Clone, Copy)]
pub struct OrderCounts {
    pub all: i64,
    pub confirmed: i64,
    pub rejected: i64,
    /// Cancelled by their timeout (`--confirm-within`).
    pub cancelled: i64,
}

/// How long a run placing orders counts as placing without renewing its
/// row: a run killed while placing holds the other processes back this long.
pub const RUN_LEASE: Duration = Duration::from_secs(5);

/// A run that placed, or places, orders.
#[derive(Debug)]
pub struct PlacingRun {
    pub planned: i64,
    /// Not ended, and its lease not run out.
    pub placing: bool,
}
