//! Messages and the envelope they travel in.

use serde::{de::DeserializeOwned, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// A message type: a serde type with a stable topic name.
///
/// The topic is what subscriptions and stored outbox rows refer to, so it must
/// stay the same across releases (rename the Rust type freely, never the
/// topic).
///
/// ```
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize)]
/// struct OrderPlaced {
///     order_id: u64,
/// }
///
/// impl tickbox::Message for OrderPlaced {
///     const TOPIC: &'static str = "orders.order_placed";
/// }
/// ```
pub trait Message: Serialize + DeserializeOwned + Send + Sync + 'static {
    /// The stable name of this message type.
    const TOPIC: &'static str;
}

/// A message as it is stored in an outbox and delivered to handlers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// Unique id, a UUIDv7 (time-ordered). Half of every inbox key.
    pub id: Uuid,
    /// The message type's topic.
    pub topic: String,
    /// The message encoded as JSON.
    pub payload: String,
    /// Shared by every message of one flow: a message published by a handler
    /// inherits the correlation id of the message it handles.
    pub correlation_id: Uuid,
    /// The id of the message whose handler published this one, if any.
    pub causation_id: Option<Uuid>,
    /// When the message was published, in microseconds since the Unix epoch.
    pub created_at_us: i64,
    /// The message's place in its ordering key's order, when it was
    /// published with one ([`Tx::publish_keyed`](crate::Tx::publish_keyed)).
    pub keyed: Option<Keyed>,
    /// Where the message was published from in a trace (W3C trace
    /// context): captured at publish from the current span, stored with
    /// the outbox row, carried over the broker, and made the parent of the
    /// span each handler processes it in. `None` when the publisher was in
    /// no OpenTelemetry trace.
    #[cfg(feature = "opentelemetry")]
    #[cfg_attr(docsrs, doc(cfg(feature = "opentelemetry")))]
    pub trace_context: Option<crate::trace::context::TraceContext>,
    /// The `messaging.system` of the spans it is processed in: tickbox's own
    /// bus, or the broker that carried it.
    #[cfg(feature = "opentelemetry")]
    pub(crate) messaging_system: &'static str,
    /// When a scheduled message is due, in microseconds since the Unix
    /// epoch ([`Tx::publish_at`](crate::Tx::publish_at)); `None` for a
    /// message delivered as soon as it commits.
    pub due_at_us: Option<i64>,
}

/// Where a keyed message stands in its key's order.
///
/// A handler receives the messages of one key in the order they were
/// committed: it never runs one before an earlier-committed message with the
/// same key has been handled, skipped as a duplicate, or dead-lettered by
/// that handler.
///
/// **The sequence.** The publishing module numbers each topic's keys on its
/// own: the first message of a key is 1, the next 2, without gaps. The
/// number is taken as the publishing transaction commits, under a lock on
/// the key's counter row, so two transactions publishing for one key commit
/// one after the other (on PostgreSQL the second waits at the counter for
/// the first's COMMIT; SQLite writers take turns anyway): a higher number is
/// always a later commit. Messages with different keys never wait for each
/// other.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Keyed {
    /// The ordering key given at publish (a product id, an account number).
    pub key: String,
    /// The key's sequence number: 1 for its first message of this topic
    /// from this publisher, then one more per message.
    pub sequence: i64,
    /// The module that published it and numbered the key.
    pub publisher: String,
    /// When the key's previous message was published (µs since the Unix
    /// epoch); `None` for the key's first. A handler that meets a key for
    /// the first time takes this message as the key's start only if that
    /// previous message was published before the handler first started
    /// (so it was never owed to it); otherwise it waits for it.
    pub previous_at_us: Option<i64>,
}

impl Envelope {
    /// Encodes a message in a new envelope that starts a new flow. The bus
    /// creates envelopes itself on publish; this is for delivering a message
    /// directly with [`ModuleHandle::deliver_to`](crate::ModuleHandle::deliver_to).
    pub fn encode<M: Message>(message: &M) -> crate::error::Result<Self> {
        let payload =
            serde_json::to_string(message).map_err(|source| crate::error::Error::Encode {
                topic: M::TOPIC.to_string(),
                source,
            })?;
        Ok(Envelope::new(M::TOPIC, payload, None))
    }

    /// Wraps an encoded payload in a new envelope. Without a cause the message
    /// starts a new flow and its correlation id is its own id.
    pub(crate) fn new(topic: &str, payload: String, cause: Option<&Envelope>) -> Self {
        let id = Uuid::now_v7();
        Envelope {
            id,
            topic: topic.to_string(),
            payload,
            correlation_id: cause.map_or(id, |c| c.correlation_id),
            causation_id: cause.map(|c| c.id),
            created_at_us: now_us(),
            keyed: None,
            #[cfg(feature = "opentelemetry")]
            trace_context: None,
            #[cfg(feature = "opentelemetry")]
            messaging_system: crate::trace::spans::TICKBOX,
            due_at_us: None,
        }
    }

    /// Wraps an encoded payload in a new envelope due at `due_at_us`: its id
    /// carries the due time (see [`scheduled_id`]) unless that is not after
    /// `now_us` (then it is due at once).
    pub(crate) fn scheduled(
        topic: &str,
        payload: String,
        cause: Option<&Envelope>,
        due_at_us: i64,
        now_us: i64,
    ) -> Self {
        let mut envelope = Envelope::new(topic, payload, cause);
        envelope.due_at_us = Some(due_at_us);
        if due_at_us > now_us {
            envelope.id = scheduled_id(due_at_us);
            if cause.is_none() {
                envelope.correlation_id = envelope.id;
            }
        }
        envelope
    }

    /// What identifies the message in its spans.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn span_identity(&self) -> crate::trace::spans::Identity<'_> {
        crate::trace::spans::Identity {
            topic: &self.topic,
            id: self.id,
            correlation_id: self.correlation_id,
        }
    }
}

/// The id of a message due at `due_at_us`: a UUIDv7 whose time is the due
/// time instead of the publication time. Ids order the outbox's pending
/// rows (its pending index), so this puts a scheduled message where it
/// will be due: a scan reads the rows up to [`due_by`] and stops there,
/// and rows scheduled for later cost it nothing.
pub(crate) fn scheduled_id(due_at_us: i64) -> Uuid {
    let due = due_at_us.max(0) as u64;
    Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        due / 1_000_000,
        (due % 1_000_000) as u32 * 1000,
    ))
}

/// The largest id a message due by `now_us` can have: every UUIDv7 of that
/// millisecond or before is below it, every one of a later millisecond
/// above.
pub(crate) fn due_by(now_us: i64) -> Uuid {
    let millis = (now_us.max(0) / 1000) as u128;
    Uuid::from_u128((millis << 80) | ((1u128 << 80) - 1))
}

/// The due time a message id carries (its UUIDv7 time), rounded up to
/// the next millisecond: a message of that id is due by then.
pub(crate) fn due_by_id(id: Uuid) -> i64 {
    let millis = (id.as_u128() >> 80) as i64;
    (millis + 1) * 1000
}

/// The current time in microseconds since the Unix epoch.
pub(crate) fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caused_message_inherits_the_flow() {
        let first = Envelope::new("a", "{}".into(), None);
        assert_eq!(first.correlation_id, first.id);
        assert_eq!(first.causation_id, None);
        let second = Envelope::new("b", "{}".into(), Some(&first));
        assert_eq!(second.correlation_id, first.id);
        assert_eq!(second.causation_id, Some(first.id));
        assert!(second.id > first.id, "UUIDv7 ids are time-ordered");
    }

    #[test]
    fn a_scheduled_id_lies_between_the_bounds_of_its_due_time() {
        let due = now_us() + 3_600_000_000;
        let id = scheduled_id(due);
        assert_eq!(id.get_version_num(), 7);
        assert!(id <= due_by(due), "due by its due time");
        assert!(id > due_by(due - 1000), "not due a millisecond before");
        assert!(Uuid::now_v7() < id, "after every message published now");
        assert!(due_by_id(id) >= due && due_by_id(id) - due <= 1000);
        let scheduled = Envelope::scheduled("t", "{}".into(), None, due, now_us());
        assert_eq!(scheduled.correlation_id, scheduled.id);
        assert_eq!(scheduled.due_at_us, Some(due));
        let past = Envelope::scheduled("t", "{}".into(), None, 5, now_us());
        assert!(past.id <= due_by(now_us()), "a time past is due at once");
    }
}
