//! The spans of a message's life, as OpenTelemetry's semantic conventions
//! for messaging (version 1.42.0, the schema opentelemetry-semantic-conventions 0.33 names; status "development") name them: `create`
//! (producer) where a transaction publishes, `send` (producer) where the
//! relay hands a message to RabbitMQ, `process` (consumer) where a handler
//! runs it — child of the `create` span for one message, linked to each
//! message's for a batch.
//!
//! tracing-opentelemetry reads the fields: `otel.name` is the span's name,
//! `otel.kind` its kind, the other fields its attributes.

use crate::trace::context::TraceContext;
use opentelemetry::trace::{Status, TraceContextExt};
use opentelemetry::KeyValue;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

/// `messaging.system` of a message delivered in process or through a
/// shared outbox: the conventions have no value for tickbox's own bus, so
/// it is named after tickbox.
pub(crate) const TICKBOX: &str = "tickbox";

/// `messaging.system` of a message carried by RabbitMQ (the conventions'
/// value).
#[cfg(feature = "amqp")]
pub(crate) const RABBITMQ: &str = "rabbitmq";

/// What identifies a message in its spans.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Identity<'a> {
    /// The topic: the destination.
    pub(crate) topic: &'a str,
    /// The message's id.
    pub(crate) id: Uuid,
    /// Its flow's correlation id: the conversation.
    pub(crate) correlation_id: Uuid,
}

/// The `create` span of a message a transaction of `module` publishes; its
/// context is the message's [`TraceContext`].
pub(crate) fn create(module: &str, message: Identity<'_>) -> Span {
    tracing::info_span!(
        "create",
        otel.name = %format_args!("create {}", message.topic),
        otel.kind = "producer",
        messaging.system = TICKBOX,
        messaging.operation.type = "create",
        messaging.operation.name = "create",
        messaging.destination.name = message.topic,
        messaging.message.id = %message.id,
        messaging.message.conversation_id = %message.correlation_id,
        tickbox.module = module,
    )
}

/// The relay's `send` span, publishing a message to `exchange` with its
/// topic as the routing key: a child of the message's `create` span.
#[cfg(feature = "amqp")]
pub(crate) fn send(exchange: &str, message: Identity<'_>, context: Option<&TraceContext>) -> Span {
    let span = tracing::info_span!(
        "send",
        otel.name = %format_args!("send {exchange}:{}", message.topic),
        otel.kind = "producer",
        messaging.system = RABBITMQ,
        messaging.operation.type = "send",
        messaging.operation.name = "send",
        messaging.destination.name = %format_args!("{exchange}:{}", message.topic),
        messaging.rabbitmq.destination.routing_key = message.topic,
        messaging.message.id = %message.id,
        messaging.message.conversation_id = %message.correlation_id,
    );
    follow(&span, context);
    span
}

/// What a `process` span says about the delivery beside the message.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Processing<'a> {
    /// The handler's module.
    pub(crate) module: &'a str,
    /// The handler: the consumer group (each handler receives every
    /// message of its topic).
    pub(crate) handler: &'a str,
    /// 1 for the first delivery to this handler, then 2, 3… on retries.
    pub(crate) attempt: u32,
    /// `messaging.system`: [`TICKBOX`] or `rabbitmq`.
    pub(crate) system: &'static str,
    /// The message whose handler published this one, if any.
    pub(crate) causation_id: Option<Uuid>,
}

/// The `process` span of one message's delivery to one handler: a child of
/// the message's `create` span when it has one (and of the current span
/// otherwise), so that what the handler publishes stays in the message's
/// trace; in a batch, also linked to the batch's span. `outcome` is
/// recorded when the delivery ends; a retry shows as an event.
pub(crate) fn process(
    message: Identity<'_>,
    context: Option<&TraceContext>,
    delivery: Processing<'_>,
    batch: Option<&Span>,
) -> Span {
    let span = tracing::info_span!(
        "deliver",
        otel.name = %format_args!("process {}", message.topic),
        otel.kind = "consumer",
        messaging.system = delivery.system,
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = message.topic,
        messaging.consumer.group.name = delivery.handler,
        messaging.message.id = %message.id,
        messaging.message.conversation_id = %message.correlation_id,
        // The names tickbox's logs have always used.
        message_id = %message.id,
        topic = message.topic,
        module = delivery.module,
        handler = delivery.handler,
        attempt = delivery.attempt,
        correlation_id = %message.correlation_id,
        causation_id = ?delivery.causation_id,
        outcome = tracing::field::Empty,
    );
    follow(&span, context);
    if let (Some(batch), false) = (batch, span.is_disabled()) {
        span.add_link(batch.context().span().span_context().clone());
    }
    if delivery.attempt > 1 {
        span.add_event(
            "retry",
            vec![KeyValue::new(
                "tickbox.attempt",
                i64::from(delivery.attempt),
            )],
        );
    }
    span
}

/// The `process` span of a batch: deliveries of several messages to one
/// handler in one transaction, linked to each message's `create` span; each
/// message's own [`process`] span stays in its message's trace, linked to
/// this one.
pub(crate) fn process_batch<'a>(
    topic: &str,
    delivery: Processing<'_>,
    contexts: impl Iterator<Item = Option<&'a TraceContext>>,
    count: usize,
) -> Span {
    let span = tracing::info_span!(
        "deliver_batch",
        otel.name = %format_args!("process {topic}"),
        otel.kind = "consumer",
        messaging.system = delivery.system,
        messaging.operation.type = "process",
        messaging.operation.name = "process",
        messaging.destination.name = topic,
        messaging.consumer.group.name = delivery.handler,
        messaging.batch.message_count = count as i64,
        module = delivery.module,
        handler = delivery.handler,
    );
    if !span.is_disabled() {
        for context in contexts.flatten() {
            span.add_link(context.span_context());
        }
    }
    span
}

/// Makes `span` a child of the message's `create` span when the message has
/// a trace context; it stays a child of the current span otherwise.
fn follow(span: &Span, context: Option<&TraceContext>) {
    if let (Some(context), false) = (context, span.is_disabled()) {
        // Refused only when the subscriber has no OpenTelemetry layer.
        let _ = span.set_parent(context.parent());
    }
}

/// Marks `span` failed: `error.type` (the failure's kind, as tickbox names
/// it) and an error status with the reason.
pub(crate) fn failed(span: &Span, error_type: &str, reason: &str) {
    if span.is_disabled() {
        return;
    }
    span.set_attribute("error.type", error_type.to_string());
    span.set_status(Status::error(reason.to_string()));
}

/// Notes on `span` (a `process` span) that the inbox already held the
/// message: the handler did not run again.
pub(crate) fn skipped_duplicate(span: &Span) {
    if !span.is_disabled() {
        span.add_event("duplicate skipped", Vec::new());
    }
}

/// The span of a dead letter being recorded: a child of the message's
/// `create` span, in the handler's consumer group, with the reason.
pub(crate) fn dead_letter(
    message: Identity<'_>,
    context: Option<&TraceContext>,
    handler: &str,
    reason: &str,
) -> Span {
    let span = tracing::info_span!(
        "dead_letter",
        otel.name = %format_args!("dead_letter {}", message.topic),
        messaging.destination.name = message.topic,
        messaging.consumer.group.name = handler,
        messaging.message.id = %message.id,
        messaging.message.conversation_id = %message.correlation_id,
        tickbox.dead_letter.reason = reason,
    );
    follow(&span, context);
    span
}

/// The span of an external effect a handler makes
/// ([`Delivery::effect`](crate::Delivery::effect)): a child of the current
/// span, the delivery's `process` span.
pub(crate) fn effect(name: &str, policy: &str) -> Span {
    tracing::info_span!(
        "effect",
        otel.name = %format_args!("effect {name}"),
        otel.kind = "client",
        tickbox.effect.name = name,
        tickbox.effect.policy = policy,
    )
}
