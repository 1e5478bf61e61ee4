//! The library's own tables, one schema for both backends.
//!
//! Every table is prefixed `tickbox_` so it never collides with the
//! application's tables in the same database.
//!
//! Rows the sealed [`Backend`](crate::Backend)'s queries take and return are
//! `pub` because those queries name them; the module itself is private.

use diesel::query_builder::QueryId;
use diesel::sql_types::SqlType;

/// A UUID column: `uuid` on PostgreSQL, a 16-byte `BLOB` on SQLite (which
/// has no UUID type). Rust values are always [`uuid::Uuid`].
#[derive(Debug, Clone, Copy, Default, SqlType, QueryId)]
pub struct DbUuid;

/// A UUID as a [`DbUuid`] column value.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    diesel::expression::AsExpression,
    diesel::deserialize::FromSqlRow,
)]
#[diesel(sql_type = DbUuid)]
pub struct Id(pub(crate) uuid::Uuid);

impl Id {
    /// The smallest UUIDv7 of the millisecond holding `unix_us`: every
    /// UUIDv7 made before that millisecond compares lower (UUIDs compare
    /// bytewise on both backends).
    pub(crate) fn earliest_at(unix_us: i64) -> Id {
        let ms = (unix_us / 1000).max(0) as u64;
        let mut bytes = [0u8; 16];
        bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
        bytes[6] = 0x70;
        Id(uuid::Uuid::from_bytes(bytes))
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::DbUuid;

    /// Messages published by this module, waiting for or done with delivery.
    tickbox_outbox (id) {
        id -> DbUuid,
        topic -> Text,
        payload -> Text,
        correlation_id -> DbUuid,
        causation_id -> Nullable<DbUuid>,
        created_at_us -> BigInt,
        delivered_at_us -> Nullable<BigInt>,
        claimed_by -> Nullable<DbUuid>,
        claimed_until_us -> Nullable<BigInt>,
        ordering_key -> Nullable<Text>,
        key_seq -> Nullable<BigInt>,
        key_publisher -> Nullable<Text>,
        key_previous_at_us -> Nullable<BigInt>,
        trace_context -> Nullable<Text>,
        due_at_us -> Nullable<BigInt>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::DbUuid;

    /// One row per message a handler of this module has processed.
    tickbox_inbox (message_id, handler) {
        message_id -> DbUuid,
        handler -> Text,
        processed_at_us -> BigInt,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::DbUuid;

    /// Deliveries given up on, kept until replayed or discarded.
    tickbox_dead_letters (message_id, handler) {
        message_id -> DbUuid,
        handler -> Text,
        topic -> Text,
        payload -> Text,
        correlation_id -> DbUuid,
        causation_id -> Nullable<DbUuid>,
        created_at_us -> BigInt,
        attempts -> Integer,
        reason -> Text,
        dead_at_us -> BigInt,
        ordering_key -> Nullable<Text>,
        key_seq -> Nullable<BigInt>,
        key_publisher -> Nullable<Text>,
        key_previous_at_us -> Nullable<BigInt>,
        parked_behind -> Nullable<DbUuid>,
        trace_context -> Nullable<Text>,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::DbUuid;

    /// The handlers, in any process, that subscribe to this outbox's topics.
    tickbox_subscriptions (id) {
        id -> DbUuid,
        module -> Text,
        handler -> Text,
        topic -> Text,
        subscribed_at_us -> BigInt,
        seen_at_us -> BigInt,
        alive_until_us -> BigInt,
    }
}

diesel::table! {
    /// The last sequence number a publishing module gave each key of a topic.
    tickbox_key_sequences (topic, ordering_key) {
        topic -> Text,
        ordering_key -> Text,
        last_seq -> BigInt,
        last_at_us -> BigInt,
        previous_at_us -> Nullable<BigInt>,
    }
}

diesel::table! {
    /// How far each handler has got in each key's order.
    tickbox_key_progress (handler, publisher, topic, ordering_key) {
        handler -> Text,
        publisher -> Text,
        topic -> Text,
        ordering_key -> Text,
        last_seq -> BigInt,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::DbUuid;

    /// Subscriptions done with a pending message that others still owe.
    tickbox_outbox_done (message_id, subscription) {
        message_id -> DbUuid,
        subscription -> DbUuid,
    }
}

diesel::table! {
    use diesel::sql_types::*;
    use super::DbUuid;

    /// The effects journal: each external effect a handler made through
    /// `Delivery::effect`, and how it ended.
    tickbox_effects (message_id, handler, effect) {
        message_id -> DbUuid,
        handler -> Text,
        effect -> Text,
        effect_key -> Text,
        policy -> Text,
        state -> Text,
        calls -> BigInt,
        window_from_us -> BigInt,
        updated_at_us -> BigInt,
        result -> Nullable<Text>,
        error -> Nullable<Text>,
    }
}

/// A count, selected as `n`.
#[derive(diesel::QueryableByName)]
pub(crate) struct Count {
    /// The number counted.
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub(crate) n: i64,
}

impl Count {
    /// The count a statement selecting one count read (0 if it read no
    /// row).
    pub(crate) fn of(rows: Vec<Count>) -> i64 {
        rows.into_iter().next().map_or(0, |row| row.n)
    }
}

/// A message id, selected as `message_id`.
#[derive(diesel::QueryableByName)]
pub(crate) struct MessageIdRow {
    /// The id.
    #[diesel(sql_type = DbUuid)]
    pub(crate) message_id: Id,
}

/// One row of the effects journal.
#[derive(Debug, Clone, diesel::QueryableByName)]
#[diesel(table_name = tickbox_effects)]
pub struct EffectRow {
    pub(crate) message_id: Id,
    pub(crate) handler: String,
    pub(crate) effect: String,
    /// The idempotency key given to the call.
    pub(crate) effect_key: String,
    /// The policy's name ([`EffectPolicy::name`](crate::EffectPolicy)).
    pub(crate) policy: String,
    /// The state's name ([`EffectState`](crate::EffectState)).
    pub(crate) state: String,
    /// How many times the effect was called.
    pub(crate) calls: i64,
    /// When the key's window began: the first call, or the first after a
    /// person allowed a retry.
    pub(crate) window_from_us: i64,
    pub(crate) updated_at_us: i64,
    /// A succeeded effect's result, as JSON.
    pub(crate) result: Option<String>,
    /// Why the effect failed, or why it is unknown.
    pub(crate) error: Option<String>,
}

/// One subscription row.
#[derive(Debug, Clone, diesel::QueryableByName)]
#[diesel(table_name = tickbox_subscriptions)]
pub struct SubscriptionRow {
    pub(crate) id: Id,
    pub(crate) module: String,
    pub(crate) handler: String,
    pub(crate) topic: String,
    pub(crate) subscribed_at_us: i64,
    pub(crate) seen_at_us: i64,
    pub(crate) alive_until_us: i64,
}

/// One dead letter row.
#[derive(Debug, Clone, diesel::QueryableByName)]
#[diesel(table_name = tickbox_dead_letters, treat_none_as_default_value = false)]
pub struct DeadLetterRow {
    pub(crate) message_id: Id,
    pub(crate) handler: String,
    pub(crate) topic: String,
    pub(crate) payload: String,
    pub(crate) correlation_id: Id,
    pub(crate) causation_id: Option<Id>,
    pub(crate) created_at_us: i64,
    pub(crate) attempts: i32,
    pub(crate) reason: String,
    pub(crate) dead_at_us: i64,
    /// The message's ordering key, if it has one.
    pub(crate) ordering_key: Option<String>,
    /// Its key's sequence number.
    pub(crate) key_seq: Option<i64>,
    /// The module that numbered the key.
    pub(crate) key_publisher: Option<String>,
    /// When the key's previous message was published.
    pub(crate) key_previous_at_us: Option<i64>,
    /// The keyed dead letter this message waits for (it parks the key).
    pub(crate) parked_behind: Option<Id>,
    /// The message's trace context, as stored
    /// ([`TraceContext`](crate::trace::context::TraceContext)).
    #[cfg(feature = "opentelemetry")]
    pub(crate) trace_context: Option<String>,
}

/// One outbox row, as written at publish and read back for redelivery.
#[derive(
    Debug, Clone, diesel::Queryable, diesel::QueryableByName, diesel::Insertable, diesel::Selectable,
)]
#[diesel(table_name = tickbox_outbox, treat_none_as_default_value = false)]
pub struct OutboxRow {
    pub(crate) id: Id,
    pub(crate) topic: String,
    pub(crate) payload: String,
    pub(crate) correlation_id: Id,
    pub(crate) causation_id: Option<Id>,
    pub(crate) created_at_us: i64,
    /// The bus delivering the message, from the moment it is written when a
    /// bus runs over the publishing module.
    pub(crate) claimed_by: Option<Id>,
    pub(crate) claimed_until_us: Option<i64>,
    /// The message's ordering key, if it has one.
    pub(crate) ordering_key: Option<String>,
    /// Its key's sequence number.
    pub(crate) key_seq: Option<i64>,
    /// The module that numbered the key.
    pub(crate) key_publisher: Option<String>,
    /// When the key's previous message was published.
    pub(crate) key_previous_at_us: Option<i64>,
    /// The trace context it was published in, as stored
    /// ([`TraceContext`](crate::trace::context::TraceContext)); read and
    /// written only with the `opentelemetry` feature.
    #[cfg(feature = "opentelemetry")]
    pub(crate) trace_context: Option<String>,
    /// When a scheduled message is due (µs since the Unix epoch).
    pub(crate) due_at_us: Option<i64>,
}

/// `$text` with the `opentelemetry` feature, nothing without it: the
/// trace context's column in a statement's text, for `concat!`.
#[cfg(feature = "opentelemetry")]
macro_rules! if_traced {
    ($text:literal) => {
        $text
    };
}
/// `$text` with the `opentelemetry` feature, nothing without it.
#[cfg(not(feature = "opentelemetry"))]
macro_rules! if_traced {
    ($text:literal) => {
        ""
    };
}
pub(crate) use if_traced;

/// A column value read without failing: what diesel decoded, or why it
/// could not. A scan reads rows one by one through this, so one row that
/// cannot be read becomes a dead letter instead of failing the whole page.
#[derive(Debug)]
pub(crate) struct Lenient<T>(pub(crate) Result<T, String>);

impl<T, ST, DB> diesel::deserialize::FromSql<ST, DB> for Lenient<T>
where
    DB: diesel::backend::Backend,
    T: diesel::deserialize::FromSql<ST, DB>,
{
    fn from_sql(value: DB::RawValue<'_>) -> diesel::deserialize::Result<Self> {
        Ok(Lenient(T::from_sql(value).map_err(|e| e.to_string())))
    }

    fn from_nullable_sql(value: Option<DB::RawValue<'_>>) -> diesel::deserialize::Result<Self> {
        Ok(Lenient(
            T::from_nullable_sql(value).map_err(|e| e.to_string()),
        ))
    }
}

/// An outbox row as a scan claims it: every column read leniently (text as
/// raw bytes), so each row is decoded on its own.
#[derive(Debug, diesel::QueryableByName)]
pub struct ClaimedRow {
    #[diesel(sql_type = DbUuid)]
    pub(crate) id: Lenient<Id>,
    #[diesel(sql_type = diesel::sql_types::Binary)]
    pub(crate) topic: Lenient<Vec<u8>>,
    #[diesel(sql_type = diesel::sql_types::Binary)]
    pub(crate) payload: Lenient<Vec<u8>>,
    #[diesel(sql_type = DbUuid)]
    pub(crate) correlation_id: Lenient<Id>,
    #[diesel(sql_type = diesel::sql_types::Nullable<DbUuid>)]
    pub(crate) causation_id: Lenient<Option<Id>>,
    /// NULL when the stored value is not an integer (SQLite stores any type
    /// in any column).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub(crate) created_at_us: Lenient<Option<i64>>,
    /// The ordering key, the key's sequence number and publisher: all NULL
    /// or none.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub(crate) ordering_key: Lenient<Option<String>>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub(crate) key_seq: Lenient<Option<i64>>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub(crate) key_publisher: Lenient<Option<String>>,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub(crate) key_previous_at_us: Lenient<Option<i64>>,
    /// The trace context, as stored; a value that is not one is left out
    /// (the message goes on in a trace of its own).
    #[cfg(feature = "opentelemetry")]
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub(crate) trace_context: Lenient<Option<String>>,
    /// When a scheduled message is due; NULL for one delivered at once
    /// (and, on SQLite, unless it is an integer).
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    pub(crate) due_at_us: Lenient<Option<i64>>,
}

/// An outbox row a scan could not turn into an envelope: a dead letter in
/// the making, holding what could be read of it.
#[derive(Debug, Clone)]
pub(crate) struct MalformedRow {
    /// The row's id, when even that could not be read: then it can only be
    /// reported.
    pub(crate) id: Option<uuid::Uuid>,
    /// What could be read, with the unreadable parts replaced (text lossily,
    /// ids by the nil id, the time by 0).
    pub(crate) envelope: crate::message::Envelope,
    /// Which columns could not be read, and why.
    pub(crate) reason: String,
}

impl ClaimedRow {
    /// The envelope, or what is wrong with the row.
    pub(crate) fn decode(self) -> Result<crate::message::Envelope, Box<MalformedRow>> {
        let mut problems = Vec::new();
        let mut text = |column: &str, value: Lenient<Vec<u8>>| match value.0 {
            Ok(bytes) => match String::from_utf8(bytes) {
                Ok(text) => text,
                Err(e) => {
                    problems.push(format!("{column} is not valid UTF-8 ({})", e.utf8_error()));
                    String::from_utf8_lossy(e.as_bytes()).into_owned()
                }
            },
            Err(e) => {
                problems.push(format!("{column} cannot be read ({e})"));
                String::new()
            }
        };
        let topic = text("topic", self.topic);
        let payload = text("payload", self.payload);
        let id = match self.id.0 {
            Ok(id) => Some(id.0),
            Err(e) => {
                problems.push(format!("id cannot be read ({e})"));
                None
            }
        };
        let correlation_id = match self.correlation_id.0 {
            Ok(id) => id.0,
            Err(e) => {
                problems.push(format!("correlation_id cannot be read ({e})"));
                uuid::Uuid::nil()
            }
        };
        let causation_id = match self.causation_id.0 {
            Ok(id) => id.map(|id| id.0),
            Err(e) => {
                problems.push(format!("causation_id cannot be read ({e})"));
                None
            }
        };
        let created_at_us = match self.created_at_us.0 {
            Ok(Some(us)) => us,
            Ok(None) => {
                problems.push("created_at_us is not an integer".to_string());
                0
            }
            Err(e) => {
                problems.push(format!("created_at_us cannot be read ({e})"));
                0
            }
        };
        let previous_at_us = self.key_previous_at_us.0.unwrap_or_else(|e| {
            problems.push(format!("key_previous_at_us cannot be read ({e})"));
            None
        });
        let due_at_us = self.due_at_us.0.unwrap_or_else(|e| {
            problems.push(format!("due_at_us cannot be read ({e})"));
            None
        });
        let keyed = match (self.ordering_key.0, self.key_seq.0, self.key_publisher.0) {
            (Ok(None), Ok(None), Ok(None)) => None,
            (Ok(Some(key)), Ok(Some(sequence)), Ok(Some(publisher))) => {
                Some(crate::message::Keyed {
                    key,
                    sequence,
                    publisher,
                    previous_at_us,
                })
            }
            _ => {
                problems.push(
                    "ordering_key, key_seq and key_publisher are not all set or all NULL"
                        .to_string(),
                );
                None
            }
        };
        let envelope = crate::message::Envelope {
            id: id.unwrap_or_default(),
            topic,
            payload,
            correlation_id,
            causation_id,
            created_at_us,
            keyed,
            #[cfg(feature = "opentelemetry")]
            trace_context: self
                .trace_context
                .0
                .ok()
                .flatten()
                .and_then(|text| crate::trace::context::TraceContext::from_stored(&text)),
            #[cfg(feature = "opentelemetry")]
            messaging_system: crate::trace::spans::TICKBOX,
            due_at_us,
        };
        if problems.is_empty() {
            Ok(envelope)
        } else {
            Err(Box::new(MalformedRow {
                id,
                envelope,
                reason: format!("malformed outbox row: {}", problems.join("; ")),
            }))
        }
    }
}

impl From<OutboxRow> for crate::message::Envelope {
    fn from(row: OutboxRow) -> Self {
        crate::message::Envelope {
            id: row.id.0,
            topic: row.topic,
            payload: row.payload,
            correlation_id: row.correlation_id.0,
            causation_id: row.causation_id.map(|c| c.0),
            created_at_us: row.created_at_us,
            keyed: keyed(
                row.ordering_key,
                row.key_seq,
                row.key_publisher,
                row.key_previous_at_us,
            ),
            #[cfg(feature = "opentelemetry")]
            trace_context: row
                .trace_context
                .as_deref()
                .and_then(crate::trace::context::TraceContext::from_stored),
            #[cfg(feature = "opentelemetry")]
            messaging_system: crate::trace::spans::TICKBOX,
            due_at_us: row.due_at_us,
        }
    }
}

/// A message's place in its key's order, from the columns that store it.
pub(crate) fn keyed(
    key: Option<String>,
    sequence: Option<i64>,
    publisher: Option<String>,
    previous_at_us: Option<i64>,
) -> Option<crate::message::Keyed> {
    Some(crate::message::Keyed {
        key: key?,
        sequence: sequence?,
        publisher: publisher?,
        previous_at_us,
    })
}

impl From<&crate::message::Envelope> for OutboxRow {
    fn from(e: &crate::message::Envelope) -> Self {
        OutboxRow {
            id: Id(e.id),
            topic: e.topic.clone(),
            payload: e.payload.clone(),
            correlation_id: Id(e.correlation_id),
            causation_id: e.causation_id.map(Id),
            created_at_us: e.created_at_us,
            claimed_by: None,
            claimed_until_us: None,
            ordering_key: e.keyed.as_ref().map(|k| k.key.clone()),
            key_seq: e.keyed.as_ref().map(|k| k.sequence),
            key_publisher: e.keyed.as_ref().map(|k| k.publisher.clone()),
            key_previous_at_us: e.keyed.as_ref().and_then(|k| k.previous_at_us),
            #[cfg(feature = "opentelemetry")]
            trace_context: e.trace_context.as_ref().map(|context| context.stored()),
            due_at_us: e.due_at_us,
        }
    }
}

#[cfg(feature = "sqlite")]
mod sqlite_uuid {
    use super::{DbUuid, Id};
    use diesel::deserialize::{self, FromSql};
    use diesel::serialize::{self, IsNull, Output, ToSql};
    use diesel::sql_types::{Binary, HasSqlType};
    use diesel::sqlite::{Sqlite, SqliteType, SqliteValue};

    impl HasSqlType<DbUuid> for Sqlite {
        fn metadata(_: &mut ()) -> SqliteType {
            SqliteType::Binary
        }
    }

    impl ToSql<DbUuid, Sqlite> for Id {
        fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Sqlite>) -> serialize::Result {
            out.set_value(self.0.as_bytes().as_slice());
            Ok(IsNull::No)
        }
    }

    impl FromSql<DbUuid, Sqlite> for Id {
        fn from_sql(value: SqliteValue<'_, '_, '_>) -> deserialize::Result<Self> {
            let bytes = <Vec<u8> as FromSql<Binary, Sqlite>>::from_sql(value)?;
            Ok(Id(uuid::Uuid::from_slice(&bytes)?))
        }
    }
}

#[cfg(feature = "postgres")]
mod pg_uuid {
    use super::{DbUuid, Id};
    use diesel::deserialize::{self, FromSql};
    use diesel::pg::{Pg, PgTypeMetadata, PgValue};
    use diesel::serialize::{self, Output, ToSql};
    use diesel::sql_types::{self, HasSqlType};

    impl HasSqlType<DbUuid> for Pg {
        fn metadata(lookup: &mut Self::MetadataLookup) -> PgTypeMetadata {
            <Pg as HasSqlType<sql_types::Uuid>>::metadata(lookup)
        }
    }

    impl ToSql<DbUuid, Pg> for Id {
        fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Pg>) -> serialize::Result {
            <uuid::Uuid as ToSql<sql_types::Uuid, Pg>>::to_sql(&self.0, out)
        }
    }

    impl FromSql<DbUuid, Pg> for Id {
        fn from_sql(value: PgValue<'_>) -> deserialize::Result<Self> {
            <uuid::Uuid as FromSql<sql_types::Uuid, Pg>>::from_sql(value).map(Id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    #[test]
    fn the_earliest_id_of_a_millisecond_orders_below_its_uuidv7s() {
        let at_us = 1_767_225_600_123_456;
        let cutoff = Id::earliest_at(at_us).0;
        let same_ms = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_767_225_600,
            123_999_000,
        ));
        let earlier = Uuid::new_v7(uuid::Timestamp::from_unix(
            uuid::NoContext,
            1_767_225_600,
            122_999_000,
        ));
        assert!(earlier < cutoff && cutoff <= same_ms);
        assert_eq!(
            Id::earliest_at(-5).0,
            Uuid::from_bytes([0, 0, 0, 0, 0, 0, 0x70, 0, 0, 0, 0, 0, 0, 0, 0, 0])
        );
    }
}
