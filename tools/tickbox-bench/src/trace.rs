//! The tracing layer that timestamps each handler's COMMIT.
//!
//! The handler stamps its own end, but its COMMIT happens after it returns,
//! inside the library. tickbox runs every delivery in a `deliver` span
//! carrying the message's id (documented in the README), which ends after
//! the delivery's COMMIT (or ROLLBACK). This layer stamps the message when
//! that span closes: it reads the span's name and its `message_id` field,
//! never the text of a log line.

use crate::clock::Clock;
use std::fmt::Debug;
use std::sync::{Arc, RwLock};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::Subscriber;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{filter, Layer};
use uuid::Uuid;

/// The name of the span tickbox runs each delivery in.
const DELIVERY_SPAN: &str = "deliver";
/// Its field holding the message's id.
const MESSAGE_ID: &str = "message_id";

/// The clock of the run under way, for the tracing layer.
static CURRENT: RwLock<Option<Arc<Clock>>> = RwLock::new(None);

/// Makes `clock` the one the layer stamps (`None`: none).
pub(crate) fn set_current(clock: Option<Arc<Clock>>) {
    *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = clock;
}

/// Stamps a message on the current clock when its delivery span closes.
struct CommitLayer;

/// The message id of a delivery span, kept in the span's extensions.
struct MessageId(Uuid);

/// Reads the `message_id` field of a span's attributes.
struct IdVisitor(Option<Uuid>);

impl Visit for IdVisitor {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == MESSAGE_ID {
            self.0 = Uuid::parse_str(&format!("{value:?}")).ok();
        }
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for CommitLayer {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut visitor = IdVisitor(None);
        attrs.record(&mut visitor);
        if let (Some(message_id), Some(span)) = (visitor.0, ctx.span(id)) {
            span.extensions_mut().insert(MessageId(message_id));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let extensions = span.extensions();
        let Some(MessageId(message_id)) = extensions.get::<MessageId>() else {
            return;
        };
        if let Some(clock) = CURRENT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
            clock.handler_committed_id(message_id);
        }
    }
}

/// Installs the commit layer (on tickbox's delivery spans only) and prints
/// warnings to stderr.
pub(crate) fn install() {
    let deliveries = filter::filter_fn(|meta| {
        meta.is_span() && meta.name() == DELIVERY_SPAN && meta.target().starts_with("tickbox")
    });
    let warnings = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(filter::LevelFilter::WARN);
    let subscriber = tracing_subscriber::registry()
        .with(CommitLayer.with_filter(deliveries))
        .with(warnings);
    let _ = tracing::subscriber::set_global_default(subscriber);
}
