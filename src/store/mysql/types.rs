//! [`DbUuid`] on MySQL and MariaDB: a `BINARY(16)` column holding the
//! UUID's 16 bytes in their usual order, so that ids compare bytewise as on
//! the other backends (UUIDv7 ids then sort by publication time, and
//! [`Id::earliest_at`] bounds them). diesel's own `Uuid` type is text on
//! these servers (36 characters), twice the size in every key and index.
//!
//! Both servers are reached through diesel's `Mysql` backend (diesel-async's
//! `AsyncMysqlConnection`), which speaks the protocol they share.

use crate::store::schema::{DbUuid, Id};
use diesel::deserialize::{self, FromSql};
use diesel::mysql::{Mysql, MysqlType, MysqlValue};
use diesel::serialize::{self, Output, ToSql};
use diesel::sql_types::{Binary, HasSqlType};

impl HasSqlType<DbUuid> for Mysql {
    fn metadata(lookup: &mut ()) -> MysqlType {
        <Mysql as HasSqlType<Binary>>::metadata(lookup)
    }
}

impl ToSql<DbUuid, Mysql> for Id {
    fn to_sql<'b>(&'b self, out: &mut Output<'b, '_, Mysql>) -> serialize::Result {
        <[u8] as ToSql<Binary, Mysql>>::to_sql(self.0.as_bytes().as_slice(), out)
    }
}

impl FromSql<DbUuid, Mysql> for Id {
    fn from_sql(value: MysqlValue<'_>) -> deserialize::Result<Self> {
        // A value of another length (a column that is not BINARY(16)) is an
        // error, never a truncated or padded id.
        Ok(Id(uuid::Uuid::from_slice(value.as_bytes())?))
    }
}
