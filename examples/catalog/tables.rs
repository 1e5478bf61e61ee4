//! The modules' own tables, and every query the example runs on them.
//!
//! tickbox keeps its own tables (`tickbox_outbox`, `tickbox_inbox`, …) in
//! each module's database; these are the application's, beside them,
//! created by the migrations under `migrations/MODULE/` (MariaDB/MySQL:
//! `mysql_migrations/MODULE/`). Each query is written once and runs on
//! every backend ([`on_either!`]); the few MariaDB and MySQL spell otherwise
//! are written for them beside it.

use crate::cli::NewPlan;
use crate::db::{on_either, AnyConn};
use crate::plan::{product_id, Plan};
use crate::ProductPriceChanged;
#[cfg(feature = "mysql")]
use tickbox::diesel::dsl::DuplicatedKeys;
#[cfg(feature = "mysql")]
use tickbox::diesel::result::{DatabaseErrorKind, Error::DatabaseError};
use tickbox::diesel::upsert::excluded;
use tickbox::diesel::{self, ExpressionMethods, OptionalExtension, QueryDsl, QueryResult};
use tickbox::diesel_async::RunQueryDsl;
use tickbox::diesel_migrations::{self, embed_migrations, EmbeddedMigrations};

/// Each module's own migrations, which tickbox runs when the module starts
/// (after its own tables, under the same lock). One set per dialect:
/// [`PORTABLE_MIGRATIONS`] and [`MYSQL_MIGRATIONS`].
pub struct Migrations {
    pub catalog: EmbeddedMigrations,
    pub storefront: EmbeddedMigrations,
    pub journeys: EmbeddedMigrations,
}

/// `migrations/MODULE/`: SQL that runs unchanged on SQLite and PostgreSQL.
pub const PORTABLE_MIGRATIONS: Migrations = Migrations {
    catalog: embed_migrations!("examples/catalog/migrations/catalog"),
    storefront: embed_migrations!("examples/catalog/migrations/storefront"),
    journeys: embed_migrations!("examples/catalog/migrations/journeys"),
};

/// `mysql_migrations/MODULE/`: the same tables on MariaDB and MySQL, which
/// index no `TEXT` key.
#[cfg(feature = "mysql")]
pub const MYSQL_MIGRATIONS: Migrations = Migrations {
    catalog: embed_migrations!("examples/catalog/mysql_migrations/catalog"),
    storefront: embed_migrations!("examples/catalog/mysql_migrations/storefront"),
    journeys: embed_migrations!("examples/catalog/mysql_migrations/journeys"),
};

/// The price of a product no change has touched yet, in cents.
const FIRST_PRICE: i64 = 1000;

/// The tables, as the migrations create them.
mod schema {
    tickbox::diesel::table! {
        products (id) {
            id -> Text,
            price -> BigInt,
            version -> BigInt,
        }
    }

    tickbox::diesel::table! {
        price_changes (message_id) {
            message_id -> Text,
            product_id -> Text,
            version -> BigInt,
            price -> BigInt,
        }
    }

    tickbox::diesel::table! {
        change_plans (id) {
            id -> BigInt,
            seed -> BigInt,
            products -> BigInt,
            changes -> BigInt,
            published -> BigInt,
            keyed -> Bool,
        }
    }

    tickbox::diesel::table! {
        product_copies (product_id) {
            product_id -> Text,
            price -> BigInt,
            version -> BigInt,
            applied -> BigInt,
        }
    }

    tickbox::diesel::table! {
        stale_changes (message_id) {
            message_id -> Text,
            product_id -> Text,
            version -> BigInt,
            held_version -> BigInt,
        }
    }

    tickbox::diesel::table! {
        journeys (event_id) {
            event_id -> Text,
            product_id -> Text,
            version -> BigInt,
            price -> BigInt,
            message_id -> Text,
            sequence -> Nullable<BigInt>,
        }
    }

    tickbox::diesel::table! {
        repeated_events (message_id) {
            message_id -> Text,
            event_id -> Text,
        }
    }
}

use schema::{
    change_plans, journeys, price_changes, product_copies, products, repeated_events, stale_changes,
};

// ---------------------------------------------------------------------------
// catalog

/// A product as the catalog holds it.
#[derive(Debug, Clone, diesel::Insertable, diesel::Queryable)]
#[diesel(table_name = products)]
pub struct Product {
    /// `p00000`, `p00001`, …
    pub id: String,
    /// Its price, in cents.
    pub price: i64,
    /// Its changes so far.
    pub version: i64,
}

/// One row of the catalog's log of price changes.
#[derive(Debug, Clone, diesel::Insertable, diesel::Queryable)]
#[diesel(table_name = price_changes)]
pub struct LoggedChange {
    /// The id of the message that announced the change.
    pub message_id: String,
    /// The product changed.
    pub product_id: String,
    /// Its version after the change.
    pub version: i64,
    /// Its new price, in cents.
    pub price: i64,
}

impl LoggedChange {
    /// The catalog's record of `change`, announced by message `message_id`.
    pub fn of(message_id: uuid::Uuid, change: &ProductPriceChanged) -> Self {
        LoggedChange {
            message_id: message_id.to_string(),
            product_id: change.product_id.clone(),
            version: change.version,
            price: change.price,
        }
    }
}

/// Records a new plan, after creating the products it changes that do not
/// exist yet; returns it.
pub async fn create_plan(conn: &mut AnyConn, new: NewPlan) -> QueryResult<Plan> {
    for index in 0..new.products {
        let product = Product {
            id: product_id(index),
            price: FIRST_PRICE,
            version: 0,
        };
        let insert = diesel::insert_into(products::table).values(&product);
        on_either!(conn, |c| {
            insert.on_conflict_do_nothing().execute(c).await
        }, mysql: |c| {
            insert.on_conflict(DuplicatedKeys).do_nothing().execute(c).await
        })?;
    }
    let last: Option<i64> = on_either!(conn, |c| change_plans::table
        .select(diesel::dsl::max(change_plans::id))
        .get_result(c)
        .await)?;
    let plan = Plan {
        id: last.unwrap_or(0) + 1,
        seed: new.seed as i64,
        products: new.products as i64,
        changes: new.changes as i64,
        published: 0,
        keyed: new.keyed,
    };
    let row = (
        change_plans::id.eq(plan.id),
        change_plans::seed.eq(plan.seed),
        change_plans::products.eq(plan.products),
        change_plans::changes.eq(plan.changes),
        change_plans::published.eq(plan.published),
        change_plans::keyed.eq(plan.keyed),
    );
    on_either!(conn, |c| diesel::insert_into(change_plans::table)
        .values(row)
        .execute(c)
        .await)?;
    Ok(plan)
}

/// Every plan, oldest first.
pub async fn load_plans(conn: &mut AnyConn) -> QueryResult<Vec<Plan>> {
    let rows: Vec<(i64, i64, i64, i64, i64, bool)> = on_either!(conn, |c| change_plans::table
        .order(change_plans::id)
        .load(c)
        .await)?;
    Ok(rows
        .into_iter()
        .map(|(id, seed, products, changes, published, keyed)| Plan {
            id,
            seed,
            products,
            changes,
            published,
            keyed,
        })
        .collect())
}

/// Takes the number of the plan's next change, counting it as published
/// (the caller's transaction publishes it); `None` when every change of
/// the plan is. One statement, so the count can never skip or repeat a
/// change, whoever else runs the plan. (MariaDB/MySQL, without
/// `RETURNING`: the `UPDATE`, then the count it wrote, read under the row
/// lock the `UPDATE` holds until the transaction ends.)
pub async fn take_next_change(conn: &mut AnyConn, plan_id: i64) -> QueryResult<Option<i64>> {
    let plan = change_plans::table
        .find(plan_id)
        .filter(change_plans::published.lt(change_plans::changes));
    let count = diesel::update(plan).set(change_plans::published.eq(change_plans::published + 1));
    on_either!(conn, |c| {
        let taken = count.returning(change_plans::published);
        taken.get_result(c).await.optional()
    }, mysql: |c| {
        let published = change_plans::table
            .find(plan_id)
            .select(change_plans::published);
        if count.execute(c).await? == 0 {
            Ok(None)
        } else {
            published.get_result(c).await.map(Some)
        }
    })
}

/// Sets a product's price and bumps its version; the new version.
/// (MariaDB/MySQL: the `UPDATE`, then the version it wrote, read under its
/// row lock.)
pub async fn change_price(conn: &mut AnyConn, product_id: &str, price: i64) -> QueryResult<i64> {
    let product = products::table.find(product_id);
    let change = diesel::update(product).set((
        products::price.eq(price),
        products::version.eq(products::version + 1),
    ));
    on_either!(conn, |c| {
        change.returning(products::version).get_result(c).await
    }, mysql: |c| {
        change.execute(c).await?;
        product.select(products::version).get_result(c).await
    })
}

/// Adds a change to the catalog's log.
pub async fn log_change(conn: &mut AnyConn, change: &LoggedChange) -> QueryResult<()> {
    on_either!(conn, |c| diesel::insert_into(price_changes::table)
        .values(change)
        .execute(c)
        .await)
    .map(drop)
}

/// Every product.
pub async fn load_products(conn: &mut AnyConn) -> QueryResult<Vec<Product>> {
    on_either!(conn, |c| products::table.load(c).await)
}

/// The whole log of price changes, in the order they were made.
pub async fn load_price_changes(conn: &mut AnyConn) -> QueryResult<Vec<LoggedChange>> {
    on_either!(conn, |c| price_changes::table
        .order((price_changes::product_id, price_changes::version))
        .load(c)
        .await)
}

// ---------------------------------------------------------------------------
// storefront

/// The storefront's copy of a product.
#[derive(Debug, Clone, diesel::Insertable, diesel::Queryable)]
#[diesel(table_name = product_copies)]
pub struct ProductCopy {
    /// The product copied.
    pub product_id: String,
    /// Its price, in cents, as of `version`.
    pub price: i64,
    /// The product's version this copy holds.
    pub version: i64,
    /// Changes applied to this copy.
    pub applied: i64,
}

/// A change the storefront ignored because its copy was newer.
#[derive(Debug, Clone, diesel::Insertable, diesel::Queryable)]
#[diesel(table_name = stale_changes)]
pub struct StaleChange {
    /// The message that carried the change.
    pub message_id: String,
    /// The product it changed.
    pub product_id: String,
    /// The product's version after the change.
    pub version: i64,
    /// The copy's version when the change arrived.
    pub held_version: i64,
}

/// Applies a change to the storefront's copy if it is newer than the copy
/// (or the copy does not exist yet); whether it did. One statement, an
/// upsert whose update only happens for a newer version: two changes of
/// one product applied at the same moment (PostgreSQL) cannot both pass
/// the check. MariaDB and MySQL have no upsert `WHERE`: there a first
/// statement makes sure the copy exists (a new one at version 0, which any
/// change is newer than) and locks it, and an `UPDATE` applies the change
/// only to an older copy.
pub async fn apply_if_newer(conn: &mut AnyConn, change: &ProductPriceChanged) -> QueryResult<bool> {
    // An upsert's WHERE, which `QueryDsl` does not cover.
    use tickbox::diesel::query_dsl::methods::FilterDsl;
    let copy = ProductCopy {
        product_id: change.product_id.clone(),
        price: change.price,
        version: change.version,
        applied: 1,
    };
    let changed = on_either!(conn, |c| {
        let upsert = diesel::insert_into(product_copies::table)
            .values(&copy)
            .on_conflict(product_copies::product_id)
            .do_update()
            .set((
                product_copies::price.eq(excluded(product_copies::price)),
                product_copies::version.eq(excluded(product_copies::version)),
                product_copies::applied.eq(product_copies::applied + 1),
            ))
            .filter(product_copies::version.lt(excluded(product_copies::version)));
        upsert.execute(c).await
    }, mysql: |c| {
        let unchanged = ProductCopy { price: 0, version: 0, applied: 0, ..copy.clone() };
        let exists = diesel::insert_into(product_copies::table)
            .values(&unchanged)
            .on_conflict(DuplicatedKeys)
            .do_nothing();
        exists.execute(c).await?;
        let copy_of = product_copies::table.find(&copy.product_id);
        let older = QueryDsl::filter(copy_of, product_copies::version.lt(copy.version));
        let apply = diesel::update(older).set((
            product_copies::price.eq(copy.price),
            product_copies::version.eq(copy.version),
            product_copies::applied.eq(product_copies::applied + 1),
        ));
        apply.execute(c).await
    })?;
    Ok(changed == 1)
}

/// The version of the storefront's copy of a product (0 if it has none).
pub async fn held_version(conn: &mut AnyConn, product_id: &str) -> QueryResult<i64> {
    let version = product_copies::table
        .find(product_id)
        .select(product_copies::version);
    let held = on_either!(conn, |c| version.get_result(c).await.optional())?;
    Ok(held.unwrap_or(0))
}

/// Records a change the storefront ignored.
pub async fn record_stale(conn: &mut AnyConn, stale: &StaleChange) -> QueryResult<()> {
    on_either!(conn, |c| diesel::insert_into(stale_changes::table)
        .values(stale)
        .execute(c)
        .await)
    .map(drop)
}

/// Every copy.
pub async fn load_copies(conn: &mut AnyConn) -> QueryResult<Vec<ProductCopy>> {
    on_either!(conn, |c| product_copies::table.load(c).await)
}

/// Every change the storefront ignored.
pub async fn load_stale(conn: &mut AnyConn) -> QueryResult<Vec<StaleChange>> {
    on_either!(conn, |c| stale_changes::table.load(c).await)
}

// ---------------------------------------------------------------------------
// journeys

/// One audit row: a price change as the journeys recorded it.
#[derive(Debug, Clone, diesel::Insertable, diesel::Queryable)]
#[diesel(table_name = journeys)]
pub struct Journey {
    /// The change's identity, whatever message carried it.
    pub event_id: String,
    /// The product changed.
    pub product_id: String,
    /// Its version after the change.
    pub version: i64,
    /// Its new price, in cents.
    pub price: i64,
    /// The message that carried it first.
    pub message_id: String,
    /// Its number in its ordering key, when it had one.
    pub sequence: Option<i64>,
}

impl Journey {
    /// The audit row of `change`, carried by message `message_id`, whose
    /// number in its ordering key's order is `sequence` (if it had a key).
    pub fn of(change: ProductPriceChanged, message_id: uuid::Uuid, sequence: Option<i64>) -> Self {
        Journey {
            event_id: event_id(&change.product_id, change.version),
            product_id: change.product_id,
            version: change.version,
            price: change.price,
            message_id: message_id.to_string(),
            sequence,
        }
    }
}

/// A message that carried an event already recorded.
#[derive(Debug, Clone, diesel::Insertable, diesel::Queryable)]
#[diesel(table_name = repeated_events)]
pub struct RepeatedEvent {
    /// The message that carried it again.
    pub message_id: String,
    /// The event, already recorded.
    pub event_id: String,
}

/// The identity of a price change: its product and its version. Any
/// message announcing that change carries the same event.
pub fn event_id(product_id: &str, version: i64) -> String {
    format!("{product_id}@{version}")
}

/// Records a journey unless its event is already recorded (`ON CONFLICT DO
/// NOTHING` on the primary key); whether it was new. MariaDB and MySQL
/// count a row found by `ON DUPLICATE KEY UPDATE` as one changed, like a
/// row inserted: there the insert is plain, and the primary key's refusal
/// (which, unlike PostgreSQL's, leaves the transaction usable) means the
/// event is recorded.
pub async fn record_journey(conn: &mut AnyConn, journey: &Journey) -> QueryResult<bool> {
    let insert = diesel::insert_into(journeys::table).values(journey);
    on_either!(conn, |c| {
        Ok(insert.on_conflict_do_nothing().execute(c).await? == 1)
    }, mysql: |c| {
        match insert.execute(c).await {
            Ok(_) => Ok(true),
            Err(DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
            Err(error) => Err(error),
        }
    })
}

/// Records a message that carried an event already recorded.
pub async fn record_repeat(conn: &mut AnyConn, repeat: &RepeatedEvent) -> QueryResult<()> {
    on_either!(conn, |c| diesel::insert_into(repeated_events::table)
        .values(repeat)
        .execute(c)
        .await)
    .map(drop)
}

/// Every journey.
pub async fn load_journeys(conn: &mut AnyConn) -> QueryResult<Vec<Journey>> {
    on_either!(conn, |c| journeys::table.load(c).await)
}

/// Every repeated event.
pub async fn load_repeats(conn: &mut AnyConn) -> QueryResult<Vec<RepeatedEvent>> {
    on_either!(conn, |c| repeated_events::table.load(c).await)
}
