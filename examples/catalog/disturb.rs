//! `--disturb N`: messages that only the handlers' own safeguards can stop.
//!
//! The inbox recognises a message by its id. These are new messages — new
//! ids — carrying what the handlers have already seen, as a publisher that
//! sends an event again, or a replay from a backup, would produce:
//!
//! - to the storefront, N older changes: for N products, the change before
//!   the last, whose version its copy has already passed. The version check
//!   must ignore each, and count it.
//! - to the journeys, N changes already recorded. The event id's primary
//!   key must keep each out, and the handler count it.
//!
//! They are delivered straight to the handlers
//! ([`tickbox::ModuleHandle::deliver_to`]), without a key, through the
//! inbox guard as any delivery is. The final check finds them by their ids
//! and reports what became of them.

use crate::tables::{self, LoggedChange};
use crate::{Modules, ProductPriceChanged, APPLY_PRICE_CHANGE, RECORD_JOURNEY};
use std::collections::BTreeMap;
use tickbox::{Backend, Envelope, ModuleHandle};
use uuid::Uuid;

/// The ids of the disturbing messages delivered.
#[derive(Debug, Default)]
pub struct Sent {
    /// Older changes, to the storefront.
    pub stale: Vec<Uuid>,
    /// Changes already recorded, to the journeys.
    pub repeats: Vec<Uuid>,
}

/// Delivers up to `n` older changes to the storefront (fewer when fewer
/// products have had two changes) and `n` recorded changes to the
/// journeys.
pub async fn disturb<B: Backend>(modules: &Modules<B>, n: usize) -> Result<Sent, String> {
    let log = modules
        .catalog
        .read(async |tx| Ok::<_, tickbox::Error>(tables::load_price_changes(tx.conn()).await?))
        .await
        .map_err(|e| e.to_string())?;
    let mut by_product: BTreeMap<&str, Vec<&LoggedChange>> = BTreeMap::new();
    for change in &log {
        by_product
            .entry(&change.product_id)
            .or_default()
            .push(change);
    }
    let mut sent = Sent::default();
    // The log is ordered by product and version: a product's last change is
    // its copy's version, the one before it is older.
    let older = by_product
        .values()
        .filter_map(|changes| changes.len().checked_sub(2).map(|i| changes[i]));
    for change in older.take(n) {
        let id = deliver_anew(&modules.storefront, APPLY_PRICE_CHANGE, change).await?;
        sent.stale.push(id);
    }
    for change in log.iter().take(n) {
        let id = deliver_anew(&modules.journeys, RECORD_JOURNEY, change).await?;
        sent.repeats.push(id);
    }
    tracing::info!(
        stale = sent.stale.len(),
        repeats = sent.repeats.len(),
        "disturbing messages delivered"
    );
    Ok(sent)
}

/// Delivers `change` to `handler` in a new message (a new id, which the
/// inbox has never seen), again while the handler fails (`--fail-rate`);
/// the message's id.
async fn deliver_anew<B: Backend>(
    module: &ModuleHandle<B>,
    handler: &str,
    change: &LoggedChange,
) -> Result<Uuid, String> {
    let message = ProductPriceChanged {
        product_id: change.product_id.clone(),
        price: change.price,
        version: change.version,
    };
    let envelope = Envelope::encode(&message).map_err(|e| e.to_string())?;
    let id = envelope.id;
    let mut tries = 0;
    loop {
        tries += 1;
        match module.deliver_to(envelope.clone(), handler).await {
            Ok(_) => return Ok(id),
            Err(error) if error.is_retryable() && tries < 100 => {
                tracing::debug!(%error, handler, "a disturbing delivery failed; trying again");
            }
            Err(error) => return Err(format!("delivering to {handler}: {error}")),
        }
    }
}
