//! The handlers' own safeguards, beyond the inbox.
//!
//! The inbox skips a message delivered again under the same id. A message
//! carrying an old change under a new id passes it, and so does, without
//! ordering keys, a change whose retry comes after a later one. The
//! storefront applies a change only when it is newer than its copy; the
//! journeys keep each change once, by its event id (product and version).
//! What they keep out is recorded and counted (`stale_ignored`,
//! `repeats_ignored` in the report); `--disturb` puts both to the test
//! (`disturb.rs`).

use crate::tables::{self, Journey, RepeatedEvent, StaleChange};
use crate::ProductPriceChanged;
use tickbox::{Backend, Delivery, HandlerError, Tx};

/// storefront: records `change`, older than the copy, as ignored.
pub async fn ignore_stale<B: Backend>(
    tx: &mut Tx<B>,
    change: ProductPriceChanged,
    delivery: &Delivery,
) -> Result<(), HandlerError> {
    let held_version = tables::held_version(tx.conn(), &change.product_id).await?;
    tracing::debug!(product = %change.product_id, version = change.version, held_version,
        "ignoring a change older than the copy");
    let stale = StaleChange {
        message_id: delivery.envelope.id.to_string(),
        product_id: change.product_id,
        version: change.version,
        held_version,
    };
    tables::record_stale(tx.conn(), &stale).await?;
    Ok(())
}

/// journeys: records the message of `journey`, whose event is recorded
/// already, as a repeat.
pub async fn count_repeat<B: Backend>(
    tx: &mut Tx<B>,
    journey: Journey,
) -> Result<(), HandlerError> {
    tracing::warn!(event_id = %journey.event_id, message_id = %journey.message_id,
        "event already recorded; ignoring the repeat");
    let repeat = RepeatedEvent {
        message_id: journey.message_id,
        event_id: journey.event_id,
    };
    tables::record_repeat(tx.conn(), &repeat).await?;
    Ok(())
}
