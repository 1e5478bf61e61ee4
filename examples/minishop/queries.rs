//! Every query minishop runs, each a function whose type diesel's
//! `#[dsl::auto_type]` names after it (`queries::insert_order`, …): the
//! names [`ShopDb`](crate::db::ShopDb)'s bounds use to say that a backend
//! runs them. Each takes what it binds by value, so that its type holds no
//! borrow.

use crate::tables::schema::{
    ignored_messages, orders, placing_runs, reservations, sent_emails, shortages, stock,
};
use crate::tables::{IgnoredMessage, NewEmail, NewOrder, NewReservation, NewShortage};
use tickbox::diesel::{dsl, BoolExpressionMethods, ExpressionMethods, QueryDsl};

// orders

#[dsl::auto_type]
pub fn insert_order(order: NewOrder) -> _ {
    dsl::insert_into(orders::table).values(order)
}

/// Moves order `id` from `from` to `to`, adding `confirmations` to its
/// count and setting when it was confirmed or cancelled.
#[dsl::auto_type]
pub fn settle_order(
    id: String,
    from: &'static str,
    to: &'static str,
    confirmations: i32,
    confirmed_at_us: Option<i64>,
    cancelled_at_us: Option<i64>,
) -> _ {
    let order = orders::table
        .filter(orders::id.eq(id))
        .filter(orders::status.eq(from));
    dsl::update(order).set((
        orders::status.eq(to),
        orders::confirmations.eq(orders::confirmations + confirmations),
        orders::confirmed_at_us.eq(confirmed_at_us),
        orders::cancelled_at_us.eq(cancelled_at_us),
    ))
}

#[dsl::auto_type]
pub fn order_status(id: String) -> _ {
    orders::table.find(id).select(orders::status)
}

#[dsl::auto_type]
pub fn order_customer(id: String) -> _ {
    orders::table.find(id).select(orders::customer)
}

#[dsl::auto_type]
pub fn order_count() -> _ {
    orders::table.count()
}

#[dsl::auto_type]
pub fn order_count_with_status(status: &'static str) -> _ {
    orders::table.filter(orders::status.eq(status)).count()
}

/// Every order: (id, status, confirmations).
#[dsl::auto_type]
pub fn every_order() -> _ {
    orders::table.select((orders::id, orders::status, orders::confirmations))
}

/// The orders cancelled with no deadline, or before it: a timeout
/// delivered early (none, when all is well).
#[dsl::auto_type]
pub fn cancelled_early(cancelled: &'static str) -> _ {
    let no_deadline = orders::confirm_by_us.is_null();
    orders::table
        .filter(orders::status.eq(cancelled))
        .filter(no_deadline.or(orders::cancelled_at_us.lt(orders::confirm_by_us)))
        .select(orders::id)
}

// orders: placing runs

#[dsl::auto_type]
pub fn insert_run(id: String, planned: i64, started_at_us: i64, alive_until_us: i64) -> _ {
    dsl::insert_into(placing_runs::table).values((
        placing_runs::id.eq(id),
        placing_runs::planned.eq(planned),
        placing_runs::started_at_us.eq(started_at_us),
        placing_runs::alive_until_us.eq(alive_until_us),
    ))
}

#[dsl::auto_type]
pub fn renew_run(id: String, alive_until_us: i64) -> _ {
    dsl::update(placing_runs::table.find(id)).set(placing_runs::alive_until_us.eq(alive_until_us))
}

#[dsl::auto_type]
pub fn end_run(id: String, ended_at_us: i64) -> _ {
    dsl::update(placing_runs::table.find(id)).set(placing_runs::ended_at_us.eq(ended_at_us))
}

/// Every run: (planned, alive until, ended at).
#[dsl::auto_type]
pub fn every_run() -> _ {
    placing_runs::table.select((
        placing_runs::planned,
        placing_runs::alive_until_us,
        placing_runs::ended_at_us,
    ))
}

// warehouse

#[dsl::auto_type]
pub fn reservation_count_of(order_id: String) -> _ {
    reservations::table
        .filter(reservations::order_id.eq(order_id))
        .count()
}

#[dsl::auto_type]
pub fn shortage_count_of(order_id: String) -> _ {
    shortages::table
        .filter(shortages::order_id.eq(order_id))
        .count()
}

/// Takes `quantity` of `sku` if that many are available.
#[dsl::auto_type]
pub fn take_stock(sku: String, quantity: i64) -> _ {
    let item = stock::table
        .filter(stock::sku.eq(sku))
        .filter(stock::available.ge(quantity));
    dsl::update(item).set(stock::available.eq(stock::available - quantity))
}

#[dsl::auto_type]
pub fn insert_reservation(reservation: NewReservation) -> _ {
    dsl::insert_into(reservations::table).values(reservation)
}

/// Every reservation: (order id, sku, quantity).
#[dsl::auto_type]
pub fn every_reservation() -> _ {
    reservations::table.select((
        reservations::order_id,
        reservations::sku,
        reservations::quantity,
    ))
}

#[dsl::auto_type]
pub fn reservation_count() -> _ {
    reservations::table.count()
}

#[dsl::auto_type]
pub fn insert_shortage(shortage: NewShortage) -> _ {
    dsl::insert_into(shortages::table).values(shortage)
}

/// The order id of every shortage.
#[dsl::auto_type]
pub fn every_shortage() -> _ {
    shortages::table.select(shortages::order_id)
}

/// Every item: (sku, seeded, available).
#[dsl::auto_type]
pub fn every_item() -> _ {
    stock::table.select((stock::sku, stock::seeded, stock::available))
}

// orders and warehouse: messages ignored

#[dsl::auto_type]
pub fn insert_ignored(ignored: IgnoredMessage) -> _ {
    dsl::insert_into(ignored_messages::table).values(ignored)
}

#[dsl::auto_type]
pub fn ignored_reason(message_id: String, handler: String) -> _ {
    ignored_messages::table
        .find((message_id, handler))
        .select(ignored_messages::reason)
}

/// How many messages were ignored, for each reason.
#[dsl::auto_type]
pub fn ignored_per_reason() -> _ {
    let count: dsl::count_star = dsl::count_star();
    ignored_messages::table
        .group_by(ignored_messages::reason)
        .select((ignored_messages::reason, count))
        .order(ignored_messages::reason)
}

// notifications

#[dsl::auto_type]
pub fn insert_email(email: NewEmail) -> _ {
    dsl::insert_into(sent_emails::table).values(email)
}

#[dsl::auto_type]
pub fn email_count() -> _ {
    sent_emails::table.count()
}

/// The order id of every e-mail sent.
#[dsl::auto_type]
pub fn every_email_order() -> _ {
    sent_emails::table.select(sent_emails::order_id)
}
