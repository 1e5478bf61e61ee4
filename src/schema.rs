//! The library's own tables, one schema for both backends.
//!
//! Every table is prefixed `tickbox_` so it never collides with the
//! application's tables in the same database.
//!
//! Items here are `pub` only because the hidden methods of the sealed
//! [`Backend`](crate::Backend) trait name them; the module itself is private.
#![allow(unreachable_pub)]

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
    }
}

/// One dead letter row.
#[derive(Debug, Clone, diesel::Queryable, diesel::Insertable, diesel::Selectable)]
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
}

impl From<OutboxRow> for crate::Envelope {
    fn from(row: OutboxRow) -> Self {
        crate::Envelope {
            id: row.id.0,
            topic: row.topic,
            payload: row.payload,
            correlation_id: row.correlation_id.0,
            causation_id: row.causation_id.map(|c| c.0),
            created_at_us: row.created_at_us,
        }
    }
}

impl From<&crate::Envelope> for OutboxRow {
    fn from(e: &crate::Envelope) -> Self {
        OutboxRow {
            id: Id(e.id),
            topic: e.topic.clone(),
            payload: e.payload.clone(),
            correlation_id: Id(e.correlation_id),
            causation_id: e.causation_id.map(Id),
            created_at_us: e.created_at_us,
            claimed_by: None,
            claimed_until_us: None,
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
