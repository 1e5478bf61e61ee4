//! The W3C trace context of a message: `traceparent` and `tracestate`, as
//! W3C Trace Context (level 1) spells them, stored with the outbox row and
//! carried in the broker's headers.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Where a message was published from, in a trace: the span that created
/// it (W3C Trace Context's `traceparent`, with the vendors' `tracestate`).
///
/// tickbox captures it at [`Tx::publish`](crate::Tx::publish) from the
/// current [`tracing`] span (through tracing-opentelemetry), stores it with
/// the outbox row and with a dead letter, sends it over RabbitMQ as the
/// `traceparent` and `tracestate` headers, and makes it the parent of the
/// span each handler processes the message in.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TraceContext {
    /// `00-<trace id>-<span id>-<flags>`, lower-case hex, checked.
    traceparent: String,
    /// The vendors' entries, `key=value,…`, if any.
    tracestate: Option<String>,
}

impl TraceContext {
    /// A trace context from its two W3C headers; `None` when `traceparent`
    /// is not a valid one (W3C: a receiver then starts a new trace), or a
    /// `tracestate` that spans lines (nothing valid does).
    pub fn from_headers(traceparent: &str, tracestate: Option<&str>) -> Option<Self> {
        let traceparent = traceparent.trim();
        parse(traceparent)?;
        let tracestate = tracestate.map(str::trim).filter(|state| !state.is_empty());
        if tracestate.is_some_and(|state| state.contains(['\n', '\r'])) {
            return None;
        }
        Some(TraceContext {
            traceparent: traceparent.to_string(),
            tracestate: tracestate.map(str::to_string),
        })
    }

    /// The context of the current [`tracing`] span, if it is in an
    /// OpenTelemetry trace (the subscriber has tracing-opentelemetry's
    /// layer, and the span is enabled).
    pub fn current() -> Option<Self> {
        Self::of_span(&tracing::Span::current())
    }

    /// The `traceparent` header: `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> &str {
        &self.traceparent
    }

    /// The `tracestate` header, if the context has vendors' entries.
    pub fn tracestate(&self) -> Option<&str> {
        self.tracestate.as_deref()
    }

    /// The trace's id: 32 lower-case hex digits, as tracing back-ends
    /// search for it.
    pub fn trace_id(&self) -> &str {
        &self.traceparent[3..35]
    }

    /// The id of the span that published the message: 16 hex digits.
    pub fn span_id(&self) -> &str {
        &self.traceparent[36..52]
    }

    /// The context as one column value: `traceparent`, then `tracestate` on
    /// a second line if there is one.
    pub(crate) fn stored(&self) -> String {
        match &self.tracestate {
            Some(state) => format!("{}\n{state}", self.traceparent),
            None => self.traceparent.clone(),
        }
    }

    /// The context a column holds ([`TraceContext::stored`]); `None` for a
    /// value that is not one (it is then left out, never fatal: the message
    /// still goes, in a trace of its own).
    pub(crate) fn from_stored(value: &str) -> Option<Self> {
        let (traceparent, tracestate) = match value.split_once('\n') {
            Some((parent, state)) => (parent, Some(state)),
            None => (value, None),
        };
        Self::from_headers(traceparent, tracestate)
    }

    /// The context of a span, if it belongs to a sampled or unsampled but
    /// valid OpenTelemetry trace (a span outside any, or a subscriber
    /// without tracing-opentelemetry's layer, has none).
    pub(crate) fn of_span(span: &tracing::Span) -> Option<Self> {
        if span.is_disabled() {
            return None;
        }
        let context = span.context();
        let span_context = context.span().span_context().clone();
        Self::of_span_context(&span_context)
    }

    /// The W3C headers of an OpenTelemetry span context, if it is valid.
    pub(crate) fn of_span_context(context: &SpanContext) -> Option<Self> {
        if !context.is_valid() {
            return None;
        }
        let state = context.trace_state().header();
        Some(TraceContext {
            traceparent: format!(
                "00-{}-{}-{:02x}",
                context.trace_id(),
                context.span_id(),
                context.trace_flags().to_u8()
            ),
            tracestate: (!state.is_empty()).then_some(state),
        })
    }

    /// As the OpenTelemetry span context it names, remote (it was made in
    /// another span, maybe another process).
    pub(crate) fn span_context(&self) -> SpanContext {
        let (trace_id, span_id, flags) =
            parse(&self.traceparent).expect("a TraceContext holds a checked traceparent");
        let state = self
            .tracestate
            .as_deref()
            .and_then(|state| state.parse::<TraceState>().ok())
            .unwrap_or_default();
        SpanContext::new(trace_id, span_id, flags, true, state)
    }

    /// As an OpenTelemetry context, to make a span its child.
    pub(crate) fn parent(&self) -> opentelemetry::Context {
        opentelemetry::Context::new().with_remote_span_context(self.span_context())
    }
}

/// The trace id, span id and flags of a `traceparent`, if it is one: a
/// known version (`00`), or a later one read as `00` reads (W3C), with
/// non-zero ids, in lower-case hex.
fn parse(traceparent: &str) -> Option<(TraceId, SpanId, TraceFlags)> {
    let parts: Vec<&str> = traceparent.split('-').collect();
    let [version, trace_id, span_id, flags, rest @ ..] = parts.as_slice() else {
        return None;
    };
    let hex = |text: &str, len: usize| {
        text.len() == len && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !hex(version, 2) || *version == "ff" || (*version == "00" && !rest.is_empty()) {
        return None;
    }
    if !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = TraceFlags::new(u8::from_str_radix(flags, 16).ok()?);
    Some((trace_id, span_id, flags))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let context = TraceContext::from_headers(PARENT, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(context.span_id(), "00f067aa0ba902b7");
        let span = context.span_context();
        assert!(span.is_remote() && span.is_sampled());
        assert_eq!(span.trace_state().header(), "congo=t61rcWkgMzE");
        assert_eq!(TraceContext::of_span_context(&span), Some(context.clone()));
        assert_eq!(TraceContext::from_stored(&context.stored()), Some(context));
    }

    #[test]
    fn a_context_without_tracestate_is_stored_as_its_traceparent() {
        let context = TraceContext::from_headers(PARENT, Some("  ")).unwrap();
        assert_eq!(context.tracestate(), None);
        assert_eq!(context.stored(), PARENT);
    }

    #[test]
    fn what_is_not_a_traceparent_is_refused() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceContext::from_headers(bad, None), None, "{bad:?}");
        }
        // A later version may add fields after the four it shares with 00.
        let later = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-next";
        assert!(TraceContext::from_headers(later, None).is_some());
        assert_eq!(TraceContext::from_headers(PARENT, Some("a=1\nb=2")), None);
    }
}
