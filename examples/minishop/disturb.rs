//! `--disturb`: the handlers' own safeguards, beyond the inbox, put to the
//! test.
//!
//! The inbox skips a message delivered again under the same id. A message
//! that says the same thing under a new id (a second `StockReserved` for an
//! order, an `OrderPlaced` sent again) passes it; what stops it is the
//! handler's own check: the orders saga applies the warehouse's answer only
//! to a placed order, the warehouse answers each order once. Each records
//! what it ignored, with why, in its database's `ignored_messages`.
//!
//! A disturbed run places two orders of its own, one the warehouse can fill
//! and one it cannot, waits until they are settled (confirmed, rejected),
//! then delivers messages that do not fit them straight to the handlers
//! (`ModuleHandle::deliver_to`, each in a new envelope) and reads back
//! whether each was ignored.

use crate::check::Problem;
use crate::cli::Args;
use crate::db::ShopDb;
use crate::faults::retrying;
use crate::tables::NewOrder;
use crate::{
    place_order, OrderPlaced, Shop, StockReserved, StockShort, CONFIRM_ORDER, REJECT_ORDER,
    RESERVE_STOCK,
};
use std::time::Duration;
use tickbox::{DeliveryError, Envelope, FailureKind, Message, ModuleHandle, Outcome};

/// The orders a disturbed run places and then disturbs.
pub struct Targets {
    /// One the warehouse can fill: it ends confirmed.
    filled: NewOrder,
    /// One for more than the warehouse stocks: it ends rejected.
    short: NewOrder,
}

impl Targets {
    /// With `--disturb`, places the two orders; without, none.
    pub async fn place_if_asked<B: ShopDb>(
        shop: &Shop<B>,
        args: &Args,
    ) -> tickbox::Result<Option<Targets>> {
        match shop.orders.as_ref().filter(|_| args.disturb) {
            Some(orders) => Ok(Some(Targets::place(orders).await?)),
            None => Ok(None),
        }
    }

    /// Places the two orders, as any order is placed.
    async fn place<B: ShopDb>(orders: &ModuleHandle<B>) -> tickbox::Result<Targets> {
        let targets = Targets {
            filled: NewOrder::random(),
            short: NewOrder::beyond_stock(),
        };
        place_order(orders, targets.filled.clone()).await?;
        place_order(orders, targets.short.clone()).await?;
        Ok(targets)
    }
}

/// One disturbing message, and what became of it.
#[derive(Debug, serde::Serialize)]
pub struct Disturbance {
    /// What the message is, and for which order.
    pub what: &'static str,
    /// The handler it was delivered to.
    pub handler: &'static str,
    /// Its id: new, so the inbox has not seen it.
    pub message_id: String,
    /// How the delivery ended: `handled` (the handler ran and committed,
    /// whether it applied the message or ignored it), `duplicate` (the
    /// inbox caught it), or the failure.
    pub outcome: String,
    /// Why the handler ignored it, as it recorded it; `None` if it did not
    /// record it as ignored.
    pub ignored: Option<String>,
}

/// Delivers the disturbing messages for `targets`, settled by now, one at
/// a time, and reads back whether each was ignored.
pub async fn deliver<B: ShopDb>(
    shop: &Shop<B>,
    targets: &Targets,
) -> tickbox::Result<Vec<Disturbance>> {
    let orders = shop.orders.as_ref().expect("--disturb runs every module");
    let warehouse = shop
        .warehouse
        .as_ref()
        .expect("--disturb runs every module");
    let never_placed = NewOrder::random();
    let reserved = |order: &NewOrder| StockReserved {
        order_id: order.id.clone(),
        sku: order.sku.clone(),
        quantity: order.quantity,
    };
    let short = |order: &NewOrder| StockShort {
        order_id: order.id.clone(),
        sku: order.sku.clone(),
        quantity: order.quantity,
    };
    let (filled, rejected) = (&targets.filled, &targets.short);
    Ok(vec![
        disturb(
            orders,
            CONFIRM_ORDER,
            &reserved(filled),
            "StockReserved again for a confirmed order",
        )
        .await?,
        disturb(
            orders,
            CONFIRM_ORDER,
            &reserved(rejected),
            "StockReserved for a rejected order",
        )
        .await?,
        disturb(
            orders,
            CONFIRM_ORDER,
            &reserved(&never_placed),
            "StockReserved for an order nobody placed",
        )
        .await?,
        disturb(
            orders,
            REJECT_ORDER,
            &short(filled),
            "StockShort for a confirmed order",
        )
        .await?,
        disturb(
            warehouse,
            RESERVE_STOCK,
            &OrderPlaced::of(filled),
            "OrderPlaced again for an order reserved",
        )
        .await?,
        disturb(
            warehouse,
            RESERVE_STOCK,
            &OrderPlaced::of(rejected),
            "OrderPlaced again for an order found short",
        )
        .await?,
    ])
}

/// Delivers `message` in a new envelope to `handler` of `module`; what
/// became of it.
async fn disturb<B: ShopDb, M: Message>(
    module: &ModuleHandle<B>,
    handler: &'static str,
    message: &M,
    what: &'static str,
) -> tickbox::Result<Disturbance> {
    let envelope = Envelope::encode(message)?;
    let message_id = envelope.id.to_string();
    let outcome = match deliver_until_it_ends(module, envelope, handler).await {
        Ok(Outcome::Handled) => "handled".to_string(),
        Ok(Outcome::Duplicate) => "duplicate".to_string(),
        Err(error) => format!("failed: {}", error.reason),
    };
    let ignored = retrying("reading the messages ignored", || {
        let message_id = message_id.clone();
        module.read(async move |tx| {
            let reason = B::ignored_reason(tx.conn(), &message_id, handler).await?;
            Ok::<_, tickbox::Error>(reason)
        })
    })
    .await?;
    Ok(Disturbance {
        what,
        handler,
        message_id,
        outcome,
        ignored,
    })
}

/// Delivers `envelope` to `handler` until a delivery ends without a
/// failure worth another try: with `--fail-rate` the handlers fail on
/// purpose, and the bus, which retries what it delivers, does not retry
/// this. At most 25 tries, as the bus's own retry policy here.
async fn deliver_until_it_ends<B: ShopDb>(
    module: &ModuleHandle<B>,
    envelope: Envelope,
    handler: &str,
) -> Result<Outcome, DeliveryError> {
    let mut delay = Duration::from_millis(20);
    for _ in 1..25 {
        match module.deliver_to(envelope.clone(), handler).await {
            Err(error) if error.kind == FailureKind::Handler || error.transient => {
                tracing::debug!(reason = %error.reason, "a disturbing delivery failed; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            ended => return ended,
        }
    }
    module.deliver_to(envelope, handler).await
}

/// The check's problem when a disturbing message was not ignored.
pub fn applied(disturbed: &[Disturbance]) -> Option<Problem> {
    let applied: Vec<&str> = disturbed
        .iter()
        .filter(|d| d.ignored.is_none())
        .map(|d| d.what)
        .collect();
    (!applied.is_empty()).then(|| Problem {
        text: format!(
            "{} disturbing messages not ignored by their handler ({})",
            applied.len(),
            applied.join("; ")
        ),
        unfinished: false,
    })
}
