//! The handlers' own safeguards, beyond the inbox.
//!
//! The inbox skips a message delivered again under the same id. A message
//! that says the same thing under a new id passes it: a second
//! `StockReserved` for an order, one for an order rejected or never placed,
//! an `OrderPlaced` sent again. And a saga's timeout (`--confirm-within`)
//! comes whether or not its order still waits, as the warehouse's answer
//! may come after the timeout. So the orders saga moves an order on only
//! from placed, and the warehouse answers each order once. A message that
//! does not fit is neither applied nor failed (a retry would not make it
//! fit): it is recorded in the module's `ignored_messages`, with why, and
//! the report counts it (`saga_ignored`, `warehouse_ignored`). `--disturb`
//! puts both to the test (`disturb.rs`).

use crate::db::ShopDb;
use crate::tables::{IgnoredMessage, OrderStatus};
use tickbox::{Delivery, HandlerError, Tx};

/// orders: moves order `order_id` from placed to `to`, or records the
/// message of `delivery` as ignored. Whether it moved the order.
pub async fn settle_order<B: ShopDb>(
    tx: &mut Tx<B>,
    order_id: &str,
    to: OrderStatus,
    delivery: &Delivery,
) -> Result<bool, HandlerError> {
    if B::settle_order(tx.conn(), order_id, to).await? {
        return Ok(true);
    }
    let status = B::order_status(tx.conn(), order_id).await?;
    let reason = match &status {
        Some(status) => format!("the order is {status} already"),
        None => "no such order".to_string(),
    };
    // A timeout that finds its order settled, or an answer that finds it
    // cancelled by its timeout: the usual end of a saga's wait.
    let cancelled = OrderStatus::Cancelled.as_str();
    if to == OrderStatus::Cancelled || status.as_deref() == Some(cancelled) {
        tracing::debug!(order_id, handler = %delivery.handler, %reason,
            "ignored a message that came after its order's wait ended");
    } else {
        tracing::warn!(order_id, handler = %delivery.handler, %reason,
            "ignored a message that does not fit its order");
    }
    B::record_ignored(tx.conn(), IgnoredMessage::new(delivery, order_id, reason)).await?;
    Ok(false)
}

/// warehouse: whether order `order_id` was answered already (reserved or
/// short); if so, records the message of `delivery`, which asks again, as
/// ignored.
pub async fn answered_already<B: ShopDb>(
    tx: &mut Tx<B>,
    order_id: &str,
    delivery: &Delivery,
) -> Result<bool, HandlerError> {
    let Some(answer) = B::answer_given(tx.conn(), order_id).await? else {
        return Ok(false);
    };
    let reason = format!("the order was {answer} already");
    tracing::warn!(order_id, %reason, "ignored an order placed again");
    B::record_ignored(tx.conn(), IgnoredMessage::new(delivery, order_id, reason)).await?;
    Ok(true)
}
