//! The inbox: one row per message a handler of the module has processed
//! (`tickbox_inbox`), inserted by the inbox guard in the delivery's own
//! transaction, so a redelivered message finds it and is skipped.

use crate::store::contract::Store;
use crate::store::ordering::KeyScope;
use crate::store::schema::{DbUuid, Id};
use diesel::sql_types::{BigInt, Text};
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// The inbox guard's insert, `(message_id, handler)` unless present, on the
/// backends that say "unless present" as `ON CONFLICT DO NOTHING`: fixed
/// text and a type of its own, so that diesel finds it prepared on the
/// connection by that type instead of rendering and hashing its SQL for
/// every delivery ([`InsertOutboxRow`](crate::store::outbox::InsertOutboxRow)
/// does the same for a publish).
#[cfg_attr(not(any(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) struct TickInbox<'a> {
    /// The message.
    pub(crate) message_id: Id,
    /// The handler's name.
    pub(crate) handler: &'a str,
    /// When (µs since the Unix epoch).
    pub(crate) now_us: i64,
}

impl diesel::query_builder::QueryId for TickInbox<'_> {
    type QueryId = TickInbox<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<DB> diesel::query_builder::QueryFragment<DB> for TickInbox<'_>
where
    DB: diesel::backend::Backend
        + diesel::sql_types::HasSqlType<DbUuid>
        + diesel::sql_types::HasSqlType<Text>
        + diesel::sql_types::HasSqlType<BigInt>,
    Id: diesel::serialize::ToSql<DbUuid, DB>,
    str: diesel::serialize::ToSql<Text, DB>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> QueryResult<()> {
        out.push_sql("INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) VALUES (");
        out.push_bind_param::<DbUuid, _>(&self.message_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(self.handler)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.now_us)?;
        out.push_sql(") ON CONFLICT DO NOTHING");
        Ok(())
    }

    fn is_safe_to_cache_prepared(&self, _backend: &DB) -> QueryResult<bool> {
        Ok(true)
    }
}

impl<Conn> diesel::RunQueryDsl<Conn> for TickInbox<'_> {}
impl<Conn> diesel_async::RunQueryDsl<Conn> for TickInbox<'_> {}

/// How the inbox guard's first statement went.
#[derive(Debug, Clone, Copy)]
pub struct Tick {
    /// The inbox row was inserted: the message is new to the handler.
    pub(crate) inserted: bool,
    /// A keyed message was its key's next for the handler, and the
    /// handler's progress in the key now counts it.
    pub(crate) key_turn: bool,
}

/// The inbox's statements. Each backend states them in its folder's
/// `inbox.rs`: the guard's insert is the hottest statement tickbox runs,
/// and each backend runs it the fastest way its connection allows.
pub trait InboxStatements: Store {
    /// The inbox guard's first statement, inside the delivery's
    /// transaction: records `(message_id, handler)` in the inbox unless it
    /// is there (the affected-row count tells a new message from a
    /// duplicate, so a concurrent duplicate waits on the unique index and
    /// then skips) and, for a new keyed message (`key`: its scope and
    /// number), moves the handler's progress in the key to it if it is the
    /// key's next ([`OrderingStatements::advance_key`], or
    /// [`OrderingStatements::start_key`] for the key's first message).
    ///
    /// [`OrderingStatements::advance_key`]: crate::store::ordering::OrderingStatements::advance_key
    /// [`OrderingStatements::start_key`]: crate::store::ordering::OrderingStatements::start_key
    fn tick_inbox(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: &str,
        now_us: i64,
        key: Option<(KeyScope<'_>, i64)>,
    ) -> impl Future<Output = QueryResult<Tick>> + Send;
}
