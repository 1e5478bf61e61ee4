//! The messages the modules send each other: serde types, each with a
//! topic name that stays the same across releases (every message and
//! every subscription is stored with it).

use serde::{Deserialize, Serialize};
use tickbox::Message;

/// Published by orders when an order is placed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
    pub sku: String,
    pub quantity: i32,
}
impl Message for OrderPlaced {
    const TOPIC: &'static str = "orders.order_placed";
}

/// Published by the warehouse when stock for an order is reserved.
#[derive(Debug, Serialize, Deserialize)]
pub struct StockReserved {
    pub order_id: String,
    pub sku: String,
    pub quantity: i32,
}
impl Message for StockReserved {
    const TOPIC: &'static str = "warehouse.stock_reserved";
}

/// Published by the warehouse when it has too little stock for an order.
#[derive(Debug, Serialize, Deserialize)]
pub struct StockShort {
    pub order_id: String,
    pub sku: String,
    pub quantity: i32,
}
impl Message for StockShort {
    const TOPIC: &'static str = "warehouse.stock_short";
}

/// Published by orders when an order is confirmed.
#[derive(Debug, Serialize, Deserialize)]
pub struct OrderConfirmed {
    pub order_id: String,
    pub customer: String,
}
impl Message for OrderConfirmed {
    const TOPIC: &'static str = "orders.order_confirmed";
}

/// Published by orders, with `--confirm-within`, in the transaction that
/// places an order, due at the order's deadline: cancels the order if it is
/// still waiting for the warehouse then; ignored if it was settled first.
#[derive(Debug, Serialize, Deserialize)]
pub struct OrderTimedOut {
    pub order_id: String,
}
impl Message for OrderTimedOut {
    const TOPIC: &'static str = "orders.order_timed_out";
}

impl OrderPlaced {
    /// The message announcing `order`.
    pub fn of(order: &crate::tables::NewOrder) -> Self {
        OrderPlaced {
            order_id: order.id.clone(),
            sku: order.sku.clone(),
            quantity: order.quantity,
        }
    }
}

impl StockReserved {
    /// The warehouse's answer to `order`: its stock is reserved.
    pub fn of(order: &OrderPlaced) -> Self {
        StockReserved {
            order_id: order.order_id.clone(),
            sku: order.sku.clone(),
            quantity: order.quantity,
        }
    }
}

impl StockShort {
    /// The warehouse's answer to `order`: too little stock.
    pub fn of(order: &OrderPlaced) -> Self {
        StockShort {
            order_id: order.order_id.clone(),
            sku: order.sku.clone(),
            quantity: order.quantity,
        }
    }
}
