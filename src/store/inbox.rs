//! The inbox: one row per message a handler of the module has processed
//! (`tickbox_inbox`), inserted by the inbox guard in the delivery's own
//! transaction, so a redelivered message finds it and is skipped.

use crate::store::contract::Store;
use crate::store::ordering::KeyScope;
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// The inbox guard's insert: `(message_id, handler)` unless present. Each
/// backend runs it its own way (SQLite on its blocking thread, where the
/// statement of this fixed shape is prepared once and its SQL never rebuilt).
#[allow(unused_macros)]
macro_rules! tick_inbox_statement {
    ($message_id:expr, $handler:expr, $now_us:expr) => {{
        use diesel::ExpressionMethods;
        use $crate::store::schema::tickbox_inbox::dsl as inbox;
        diesel::insert_into(inbox::tickbox_inbox)
            .values((
                inbox::message_id.eq($crate::store::schema::Id($message_id)),
                inbox::handler.eq($handler),
                inbox::processed_at_us.eq($now_us),
            ))
            .on_conflict_do_nothing()
    }};
}
// Stated for the backends that spell the statement this way; a build
// with only other backends leaves it unused.
#[allow(unused_imports)]
pub(crate) use tick_inbox_statement;

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
