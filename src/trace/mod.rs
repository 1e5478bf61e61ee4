//! Trace context across modules (feature `opentelemetry`): the W3C trace
//! context a message carries from its publication to every delivery
//! (`context`), and the spans tickbox makes along the way, named and
//! attributed as OpenTelemetry's messaging conventions say (`spans`).

pub(crate) mod context;
pub(crate) mod spans;
