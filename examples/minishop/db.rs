//! What minishop asks of a backend: its queries, written once for every
//! backend, in tickbox's supported way.
//!
//! A transaction's connection, `tx.conn()`, is a `B::Connection`, and
//! diesel checks each query against a backend at compile time. Generic
//! code says, in a `where` clause, that the backend's connection runs a
//! query — `ExecuteDsl` to execute it, `LoadQuery` to load its rows — naming
//! the query by its type (see `queries.rs`). minishop runs some 26 queries
//! from many places, so it gathers them in one trait, [`ShopDb`],
//! implemented once for every backend whose connection runs them all: the
//! rest of the example asks only for `B: ShopDb`, and the compiler checks
//! the bounds where `main` picks SQLite, PostgreSQL or MariaDB/MySQL. What
//! truly differs between the backends, the SQL of the tables' migrations
//! and how the warehouse locks its stock, is [`Dialect`], implemented for
//! each.

use crate::queries as q;
use crate::tables::{
    now_us, IgnoredMessage, Migrations, NewEmail, NewOrder, NewReservation, NewShortage,
    OrderCounts, OrderStatus, PlacingRun, RUN_LEASE,
};
use std::future::Future;
use tickbox::diesel::{OptionalExtension, QueryResult};
use tickbox::diesel_async::methods::{ExecuteDsl, LoadQuery};
use tickbox::diesel_async::RunQueryDsl;
use tickbox::Backend;

/// Every query minishop runs on a module's database, inside the
/// transaction whose connection it is given.
pub trait ShopDb: Dialect {
    // orders

    fn insert_order(
        conn: &mut Self::Connection,
        order: NewOrder,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Settles order `order_id`, moving it from placed to `to` (confirmed or
    /// rejected) and counting a confirmation; false when the order is not
    /// placed (settled already, or no such order), which it leaves as it is.
    /// The condition is in the `UPDATE` itself: two transactions settling
    /// one order at once cannot both find it placed.
    fn settle_order(
        conn: &mut Self::Connection,
        order_id: &str,
        to: OrderStatus,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// An order's status, or `None` if there is no such order.
    fn order_status(
        conn: &mut Self::Connection,
        order_id: &str,
    ) -> impl Future<Output = QueryResult<Option<String>>> + Send;

    /// An order's customer.
    fn order_customer(
        conn: &mut Self::Connection,
        order_id: &str,
    ) -> impl Future<Output = QueryResult<String>> + Send;

    fn order_counts(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<OrderCounts>> + Send;

    /// Every order: (id, status, confirmations).
    fn load_orders(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<(String, String, i32)>>> + Send;

    /// The orders cancelled before their deadline, or without one: their
    /// `OrderTimedOut` came early (none, when all is well).
    fn load_cancelled_early(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;

    // orders: placing runs

    /// Records that run `id` starts placing `planned` orders.
    fn start_run(
        conn: &mut Self::Connection,
        id: &str,
        planned: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Renews run `id`'s lease.
    fn renew_run(
        conn: &mut Self::Connection,
        id: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Records that run `id` places no more orders.
    fn end_run(
        conn: &mut Self::Connection,
        id: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    fn load_runs(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<PlacingRun>>> + Send;

    // warehouse

    /// What the warehouse answered order `order_id`: `Some("reserved")` or
    /// `Some("found short")`, `None` if it has not answered it yet.
    fn answer_given(
        conn: &mut Self::Connection,
        order_id: &str,
    ) -> impl Future<Output = QueryResult<Option<&'static str>>> + Send;

    /// Takes the stock and records the reservation; false if out of stock.
    fn reserve(
        conn: &mut Self::Connection,
        reservation: NewReservation,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Every reservation: (order id, sku, quantity).
    fn load_reservations(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<(String, String, i32)>>> + Send;

    /// Records that the warehouse was short of stock for an order.
    fn record_shortage(
        conn: &mut Self::Connection,
        shortage: NewShortage,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// The order id of every shortage.
    fn load_shortages(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;

    fn reservation_count(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<i64>> + Send;

    /// Every item: (sku, seeded, available).
    fn load_stock(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<(String, i64, i64)>>> + Send;

    // orders and warehouse: messages ignored

    /// Records a message a handler ignored.
    fn record_ignored(
        conn: &mut Self::Connection,
        ignored: IgnoredMessage,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    /// Why handler `handler` ignored message `message_id`; `None` if it did
    /// not.
    fn ignored_reason(
        conn: &mut Self::Connection,
        message_id: &str,
        handler: &str,
    ) -> impl Future<Output = QueryResult<Option<String>>> + Send;

    /// How many messages were ignored, for each reason.
    fn ignored_per_reason(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<(String, i64)>>> + Send;

    // notifications

    fn insert_email(
        conn: &mut Self::Connection,
        email: NewEmail,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    fn email_count(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<i64>> + Send;

    /// The order id of every e-mail sent.
    fn load_email_orders(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<String>>> + Send;
}

/// For every backend whose connection runs each of minishop's queries. The
/// bounds name no backend: a backend tickbox adds later serves minishop as
/// soon as its connection runs them (and it locks stock its own way).
impl<B: Dialect> ShopDb for B
where
    q::insert_order: ExecuteDsl<B::Connection>,
    q::settle_order: ExecuteDsl<B::Connection>,
    q::order_status: LoadQuery<'static, B::Connection, String>,
    q::order_customer: LoadQuery<'static, B::Connection, String>,
    q::order_count: LoadQuery<'static, B::Connection, i64>,
    q::order_count_with_status: LoadQuery<'static, B::Connection, i64>,
    q::every_order: LoadQuery<'static, B::Connection, (String, String, i32)>,
    q::cancelled_early: LoadQuery<'static, B::Connection, String>,
    q::insert_run: ExecuteDsl<B::Connection>,
    q::renew_run: ExecuteDsl<B::Connection>,
    q::end_run: ExecuteDsl<B::Connection>,
    q::every_run: LoadQuery<'static, B::Connection, (i64, i64, Option<i64>)>,
    q::reservation_count_of: LoadQuery<'static, B::Connection, i64>,
    q::shortage_count_of: LoadQuery<'static, B::Connection, i64>,
    q::take_stock: ExecuteDsl<B::Connection>,
    q::insert_reservation: ExecuteDsl<B::Connection>,
    q::every_reservation: LoadQuery<'static, B::Connection, (String, String, i32)>,
    q::insert_shortage: ExecuteDsl<B::Connection>,
    q::every_shortage: LoadQuery<'static, B::Connection, String>,
    q::reservation_count: LoadQuery<'static, B::Connection, i64>,
    q::every_item: LoadQuery<'static, B::Connection, (String, i64, i64)>,
    q::insert_ignored: ExecuteDsl<B::Connection>,
    q::ignored_reason: LoadQuery<'static, B::Connection, String>,
    q::ignored_per_reason: LoadQuery<'static, B::Connection, (String, i64)>,
    q::insert_email: ExecuteDsl<B::Connection>,
    q::email_count: LoadQuery<'static, B::Connection, i64>,
    q::every_email_order: LoadQuery<'static, B::Connection, String>,
{
    async fn insert_order(conn: &mut B::Connection, order: NewOrder) -> QueryResult<()> {
        q::insert_order(order).execute(conn).await.map(drop)
    }

    async fn settle_order(
        conn: &mut B::Connection,
        order_id: &str,
        to: OrderStatus,
    ) -> QueryResult<bool> {
        let (confirmed, cancelled) = (to == OrderStatus::Confirmed, to == OrderStatus::Cancelled);
        let settle = q::settle_order(
            order_id.to_owned(),
            OrderStatus::Placed.as_str(),
            to.as_str(),
            i32::from(confirmed),
            confirmed.then(now_us),
            cancelled.then(now_us),
        );
        Ok(settle.execute(conn).await? == 1)
    }

    async fn order_status(conn: &mut B::Connection, order_id: &str) -> QueryResult<Option<String>> {
        q::order_status(order_id.to_owned())
            .get_result(conn)
            .await
            .optional()
    }

    async fn order_customer(conn: &mut B::Connection, order_id: &str) -> QueryResult<String> {
        q::order_customer(order_id.to_owned())
            .get_result(conn)
            .await
    }

    async fn order_counts(conn: &mut B::Connection) -> QueryResult<OrderCounts> {
        let with_status = |status: OrderStatus| q::order_count_with_status(status.as_str());
        Ok(OrderCounts {
            all: q::order_count().get_result(conn).await?,
            confirmed: with_status(OrderStatus::Confirmed).get_result(conn).await?,
            rejected: with_status(OrderStatus::Rejected).get_result(conn).await?,
            cancelled: with_status(OrderStatus::Cancelled).get_result(conn).await?,
        })
    }

    async fn load_orders(conn: &mut B::Connection) -> QueryResult<Vec<(String, String, i32)>> {
        q::every_order().load(conn).await
    }

    async fn load_cancelled_early(conn: &mut B::Connection) -> QueryResult<Vec<String>> {
        q::cancelled_early(OrderStatus::Cancelled.as_str())
            .load(conn)
            .await
    }

    async fn start_run(conn: &mut B::Connection, id: &str, planned: i64) -> QueryResult<()> {
        let insert = q::insert_run(id.to_owned(), planned, now_us(), lease_end());
        insert.execute(conn).await.map(drop)
    }

    async fn renew_run(conn: &mut B::Connection, id: &str) -> QueryResult<()> {
        q::renew_run(id.to_owned(), lease_end())
            .execute(conn)
            .await
            .map(drop)
    }

    async fn end_run(conn: &mut B::Connection, id: &str) -> QueryResult<()> {
        q::end_run(id.to_owned(), now_us())
            .execute(conn)
            .await
            .map(drop)
    }

    async fn load_runs(conn: &mut B::Connection) -> QueryResult<Vec<PlacingRun>> {
        let runs: Vec<(i64, i64, Option<i64>)> = q::every_run().load(conn).await?;
        let now = now_us();
        Ok(runs
            .into_iter()
            .map(|(planned, alive_until, ended)| PlacingRun {
                planned,
                placing: ended.is_none() && alive_until > now,
            })
            .collect())
    }

    async fn answer_given(
        conn: &mut B::Connection,
        order_id: &str,
    ) -> QueryResult<Option<&'static str>> {
        let reserved = q::reservation_count_of(order_id.to_owned());
        if reserved.get_result::<i64>(conn).await? > 0 {
            return Ok(Some("reserved"));
        }
        let short = q::shortage_count_of(order_id.to_owned());
        if short.get_result::<i64>(conn).await? > 0 {
            return Ok(Some("found short"));
        }
        Ok(None)
    }

    async fn reserve(conn: &mut B::Connection, reservation: NewReservation) -> QueryResult<bool> {
        let take = q::take_stock(reservation.sku.clone(), i64::from(reservation.quantity));
        if take.execute(conn).await? == 0 {
            return Ok(false);
        }
        q::insert_reservation(reservation).execute(conn).await?;
        Ok(true)
    }

    async fn load_reservations(
        conn: &mut B::Connection,
    ) -> QueryResult<Vec<(String, String, i32)>> {
        q::every_reservation().load(conn).await
    }

    async fn record_shortage(conn: &mut B::Connection, shortage: NewShortage) -> QueryResult<()> {
        q::insert_shortage(shortage).execute(conn).await.map(drop)
    }

    async fn load_shortages(conn: &mut B::Connection) -> QueryResult<Vec<String>> {
        q::every_shortage().load(conn).await
    }

    async fn reservation_count(conn: &mut B::Connection) -> QueryResult<i64> {
        q::reservation_count().get_result(conn).await
    }

    async fn load_stock(conn: &mut B::Connection) -> QueryResult<Vec<(String, i64, i64)>> {
        q::every_item().load(conn).await
    }

    async fn record_ignored(conn: &mut B::Connection, ignored: IgnoredMessage) -> QueryResult<()> {
        q::insert_ignored(ignored).execute(conn).await.map(drop)
    }

    async fn ignored_reason(
        conn: &mut B::Connection,
        message_id: &str,
        handler: &str,
    ) -> QueryResult<Option<String>> {
        q::ignored_reason(message_id.to_owned(), handler.to_owned())
            .get_result(conn)
            .await
            .optional()
    }

    async fn ignored_per_reason(conn: &mut B::Connection) -> QueryResult<Vec<(String, i64)>> {
        q::ignored_per_reason().load(conn).await
    }

    async fn insert_email(conn: &mut B::Connection, email: NewEmail) -> QueryResult<()> {
        q::insert_email(email).execute(conn).await.map(drop)
    }

    async fn email_count(conn: &mut B::Connection) -> QueryResult<i64> {
        q::email_count().get_result(conn).await
    }

    async fn load_email_orders(conn: &mut B::Connection) -> QueryResult<Vec<String>> {
        q::every_email_order().load(conn).await
    }
}

/// When a run's lease ends if renewed now.
fn lease_end() -> i64 {
    now_us() + RUN_LEASE.as_micros() as i64
}

/// What differs per backend, written for each: the SQL that makes the
/// modules' tables, and how the warehouse locks its stock.
pub trait Dialect: Backend {
    /// The migrations that make the modules' own tables.
    const MIGRATIONS: &'static Migrations;

    /// Locks every stock row, in sku order, until the transaction ends.
    ///
    /// `ReserveStock` runs batched: up to 32 orders in one transaction,
    /// each taking the stock of its own item. Two transactions taking items
    /// A then B and B then A would each lock one row and wait for the
    /// other's: a deadlock, which PostgreSQL breaks only after a second by
    /// failing one batch. So each call first locks every stock row in one
    /// global order (there are five); the later calls of a batch find them
    /// held by their own transaction and wait for nobody.
    fn lock_stock(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;
}

/// Nothing to lock: a write transaction (`BEGIN IMMEDIATE`) holds the whole
/// database's one write lock from its start.
impl Dialect for tickbox::Sqlite {
    const MIGRATIONS: &'static Migrations = &crate::tables::PORTABLE_MIGRATIONS;

    async fn lock_stock(_: &mut Self::Connection) -> QueryResult<()> {
        Ok(())
    }
}

/// `SELECT sku FROM stock ORDER BY sku FOR NO KEY UPDATE` locks the rows
/// one after the other in the sort's order. `NO KEY UPDATE` is the lock the
/// later `UPDATE` of `available` takes anyway, so running this again in the
/// same transaction, on rows it already locked or updated, waits for
/// nobody.
#[cfg(feature = "postgres")]
impl Dialect for tickbox::Postgres {
    const MIGRATIONS: &'static Migrations = &crate::tables::PORTABLE_MIGRATIONS;

    async fn lock_stock(conn: &mut Self::Connection) -> QueryResult<()> {
        use crate::tables::schema::stock;
        use tickbox::diesel::QueryDsl;
        let lock = stock::table
            .select(stock::sku)
            .order(stock::sku)
            .for_no_key_update();
        lock.load::<String>(conn).await.map(drop)
    }
}

/// `SELECT sku FROM stock ORDER BY sku FOR UPDATE` locks the rows one after
/// the other in the primary key's order (InnoDB has one kind of row write
/// lock, the one the later `UPDATE` takes): running it again in the same
/// transaction waits for nobody.
#[cfg(feature = "mysql")]
impl Dialect for tickbox::Mysql {
    const MIGRATIONS: &'static Migrations = &crate::tables::MYSQL_MIGRATIONS;

    async fn lock_stock(conn: &mut Self::Connection) -> QueryResult<()> {
        use crate::tables::schema::stock;
        use tickbox::diesel::QueryDsl;
        let lock = stock::table
            .select(stock::sku)
            .order(stock::sku)
            .for_update();
        lock.load::<String>(conn).await.map(drop)
    }
}
