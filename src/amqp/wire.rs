//! An [`Envelope`] as an AMQP message and back: the payload is the body
//! (JSON), the id is the message id, the correlation id is the correlation
//! id, the topic is the routing key, and the rest travels in headers.

use crate::message::{Envelope, Keyed};
use lapin::message::Delivery;
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::BasicProperties;
use uuid::Uuid;

/// The header holding the id of the message that caused this one.
const CAUSATION_ID: &str = "tickbox-causation-id";

/// The header holding the publication time, in µs since the Unix epoch.
const CREATED_AT_US: &str = "tickbox-created-at-us";

/// The headers holding a keyed message's ordering key, its sequence number
/// and the module that numbered it.
const ORDERING_KEY: &str = "tickbox-ordering-key";
const KEY_SEQ: &str = "tickbox-key-seq";
const KEY_PUBLISHER: &str = "tickbox-key-publisher";
/// When the key's previous message was published, µs since the Unix epoch.
const KEY_PREVIOUS_AT_US: &str = "tickbox-key-previous-at-us";

/// W3C Trace Context's headers, as any OpenTelemetry-instrumented consumer
/// of the queue reads them (AMQP 0-9-1 header-table strings).
#[cfg(feature = "opentelemetry")]
const TRACEPARENT: &str = "traceparent";
#[cfg(feature = "opentelemetry")]
const TRACESTATE: &str = "tracestate";

/// A persistent message (survives a broker restart in a durable queue).
const PERSISTENT: u8 = 2;

/// The properties of `envelope`'s AMQP message.
pub(crate) fn properties(envelope: &Envelope) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        CREATED_AT_US.into(),
        AMQPValue::LongLongInt(envelope.created_at_us),
    );
    if let Some(cause) = envelope.causation_id {
        headers.insert(
            CAUSATION_ID.into(),
            AMQPValue::LongString(cause.to_string().into()),
        );
    }
    if let Some(keyed) = &envelope.keyed {
        headers.insert(
            ORDERING_KEY.into(),
            AMQPValue::LongString(keyed.key.as_str().into()),
        );
        headers.insert(KEY_SEQ.into(), AMQPValue::LongLongInt(keyed.sequence));
        headers.insert(
            KEY_PUBLISHER.into(),
            AMQPValue::LongString(keyed.publisher.as_str().into()),
        );
        if let Some(at) = keyed.previous_at_us {
            headers.insert(KEY_PREVIOUS_AT_US.into(), AMQPValue::LongLongInt(at));
        }
    }
    #[cfg(feature = "opentelemetry")]
    if let Some(context) = &envelope.trace_context {
        headers.insert(
            TRACEPARENT.into(),
            AMQPValue::LongString(context.traceparent().into()),
        );
        if let Some(state) = context.tracestate() {
            headers.insert(TRACESTATE.into(), AMQPValue::LongString(state.into()));
        }
    }
    BasicProperties::default()
        .with_message_id(ShortString::from(envelope.id.to_string()))
        .with_correlation_id(ShortString::from(envelope.correlation_id.to_string()))
        .with_content_type("application/json".into())
        .with_delivery_mode(PERSISTENT)
        .with_timestamp((envelope.created_at_us.max(0) / 1_000_000) as u64)
        .with_headers(headers)
}

/// A message that did not come as tickbox sends them, with what could be
/// read of it.
#[derive(Debug)]
pub(crate) struct Undecodable {
    /// Why it could not be read.
    pub(crate) reason: String,
    /// As much of an envelope as could be read, for the dead letter: the id
    /// (a new one if it had none), the routing key as the topic, the body as
    /// text.
    pub(crate) envelope: Envelope,
}

/// The envelope an AMQP delivery carries.
pub(crate) fn envelope(delivery: &Delivery) -> Result<Envelope, Box<Undecodable>> {
    let properties = &delivery.properties;
    let id = properties
        .message_id()
        .as_ref()
        .and_then(|id| Uuid::parse_str(id.as_str()).ok());
    let topic = delivery.routing_key.as_str().to_string();
    let payload = String::from_utf8(delivery.data.clone());
    let undecodable = |reason: String| {
        Box::new(Undecodable {
            reason,
            envelope: Envelope {
                id: id.unwrap_or_else(Uuid::now_v7),
                topic: topic.clone(),
                payload: String::from_utf8_lossy(&delivery.data).into_owned(),
                correlation_id: id.unwrap_or_default(),
                causation_id: None,
                created_at_us: crate::message::now_us(),
                keyed: None,
                #[cfg(feature = "opentelemetry")]
                trace_context: None,
                #[cfg(feature = "opentelemetry")]
                messaging_system: crate::trace::spans::RABBITMQ,
                due_at_us: None,
            },
        })
    };
    let Some(id) = id else {
        return Err(undecodable(
            "the AMQP message has no message id that is a UUID (it was not published by tickbox)"
                .into(),
        ));
    };
    let payload = payload.map_err(|_| undecodable("the body is not UTF-8 text".into()))?;
    let headers = properties.headers().clone().unwrap_or_default();
    let header = |name: &str| headers.inner().get(name).cloned();
    let correlation_id = properties
        .correlation_id()
        .as_ref()
        .and_then(|c| Uuid::parse_str(c.as_str()).ok())
        .unwrap_or(id);
    let causation_id = match header(CAUSATION_ID) {
        Some(AMQPValue::LongString(cause)) => Some(
            std::str::from_utf8(cause.as_bytes())
                .ok()
                .and_then(|c| Uuid::parse_str(c).ok())
                .ok_or_else(|| undecodable(format!("the header {CAUSATION_ID} is not a UUID")))?,
        ),
        _ => None,
    };
    let created_at_us = match header(CREATED_AT_US) {
        Some(AMQPValue::LongLongInt(us)) => us,
        _ => {
            return Err(undecodable(format!(
                "the header {CREATED_AT_US} is missing or not an integer"
            )))
        }
    };
    let text = |name: &str| match header(name) {
        Some(AMQPValue::LongString(text)) => std::str::from_utf8(text.as_bytes())
            .ok()
            .map(str::to_string),
        _ => None,
    };
    let keyed = match (text(ORDERING_KEY), header(KEY_SEQ), text(KEY_PUBLISHER)) {
        (None, None, None) => None,
        (Some(key), Some(AMQPValue::LongLongInt(sequence)), Some(publisher)) => Some(Keyed {
            key,
            sequence,
            publisher,
            previous_at_us: match header(KEY_PREVIOUS_AT_US) {
                Some(AMQPValue::LongLongInt(at)) => Some(at),
                _ => None,
            },
        }),
        _ => {
            return Err(undecodable(format!(
                "the headers {ORDERING_KEY}, {KEY_SEQ} and {KEY_PUBLISHER} are not all there \
                 as text, integer and text"
            )))
        }
    };
    // A context that is not W3C's is left out (W3C: the receiver starts a
    // new trace), never a reason to refuse the message.
    #[cfg(feature = "opentelemetry")]
    let trace_context = text(TRACEPARENT).and_then(|parent| {
        crate::trace::context::TraceContext::from_headers(&parent, text(TRACESTATE).as_deref())
    });
    Ok(Envelope {
        id,
        topic,
        payload,
        correlation_id,
        causation_id,
        created_at_us,
        keyed,
        #[cfg(feature = "opentelemetry")]
        trace_context,
        #[cfg(feature = "opentelemetry")]
        messaging_system: crate::trace::spans::RABBITMQ,
        // The relay publishes a scheduled message once it is due: on the
        // broker it is a message like any other.
        due_at_us: None,
    })
}
