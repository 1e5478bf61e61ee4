//! Retention: deleting, in small batches, what a module no longer needs to
//! keep (processed inbox rows, delivered outbox rows, settled effects)
//! once older than its [`Retention`](crate::Retention).
//!
//! Every sweep has one shape: a message is done with after it is created,
//! so every row to go has an id (a UUIDv7) below the smallest UUIDv7 of the
//! cutoff's millisecond ([`Id::earliest_at`]): the primary key finds them,
//! and no extra index has to be kept up on every insert. The rows are
//! chosen in a subquery limited to the batch, and tested again outside it:
//! a message's rows for several handlers share its id.

use crate::store::contract::Store;
use crate::store::schema::Id;
use crate::store::sql::{sql, Sql};
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// The text of the effects journal's sweep (see
/// [`RetentionStatements::sweep_effects`]), given a backend's test that
/// `message_id` is one of a list of ids bound as one value (a string
/// literal). Its values, in order: the smallest id of the cutoff's
/// millisecond, the cutoff, the kept ids, the batch, the cutoff, the kept
/// ids.
#[allow(unused_macros)]
macro_rules! sweep_effects_text {
    ($kept:expr) => {
        concat!(
            "DELETE FROM tickbox_effects WHERE message_id IN \
             (SELECT message_id FROM tickbox_effects \
              WHERE message_id < ? AND updated_at_us < ? AND NOT (",
            $crate::store::journal::unsettled!(),
            ") AND NOT (",
            $kept,
            ") LIMIT ?) AND updated_at_us < ? AND NOT (",
            $crate::store::journal::unsettled!(),
            ") AND NOT (",
            $kept,
            ")"
        )
    };
}
// Stated for the backends that spell the statement this way; a build
// with only other backends leaves it unused.
#[allow(unused_imports)]
pub(crate) use sweep_effects_text;

/// A [`sweep_effects_text!`] statement with its values: the effects
/// journal's rows settled before `before_us`, except those of the messages
/// in `kept` (a backend's list value for its test), up to `batch`.
#[allow(dead_code)] // stated for the backends that spell the sweep this way
pub(crate) fn sweep_effects_statement(
    text: &'static str,
    before_us: i64,
    kept: String,
    batch: i64,
) -> Sql {
    sql!(
        text,
        Id::earliest_at(before_us),
        before_us,
        kept.as_str(),
        batch,
        before_us,
        kept
    )
}

/// The retention sweeps' statements. The defaults are written in the SQL
/// that SQLite and PostgreSQL share (`… IN (SELECT … LIMIT ?)`); a backend
/// overrides what its dialect spells otherwise, and states itself the
/// sweep of the effects journal, which tests ids against a list
/// ([`RetentionStatements::sweep_effects`]).
pub trait RetentionStatements: Store {
    /// Deletes up to `batch` messages' inbox rows processed before
    /// `before_us`; the number of rows deleted.
    fn sweep_inbox(
        conn: &mut Self::Conn,
        before_us: i64,
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                "DELETE FROM tickbox_inbox WHERE message_id IN \
                 (SELECT message_id FROM tickbox_inbox \
                  WHERE message_id < ? AND processed_at_us < ? LIMIT ?) \
                 AND processed_at_us < ?",
                Id::earliest_at(before_us),
                before_us,
                batch,
                before_us
            ),
        )
    }

    /// Deletes up to `batch` outbox rows delivered before `before_us`; the
    /// number of rows deleted.
    fn sweep_outbox(
        conn: &mut Self::Conn,
        before_us: i64,
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                "DELETE FROM tickbox_outbox WHERE id IN \
                 (SELECT id FROM tickbox_outbox \
                  WHERE id < ? AND delivered_at_us < ? LIMIT ?) \
                 AND delivered_at_us < ?",
                Id::earliest_at(before_us),
                before_us,
                batch,
                before_us
            ),
        )
    }

    /// On the effects journal's connection: deletes up to `batch`
    /// messages' settled effects (succeeded or failed) last changed before
    /// `before_us`, except those of the messages in `keep` (dead letters,
    /// which a replay may bring back: a succeeded effect must still be
    /// found then); the number of rows deleted. `keep` is one bound value
    /// whatever its length, in the backend's spelling of a list of ids.
    fn sweep_effects(
        conn: &mut Self::Conn,
        before_us: i64,
        keep: &[Uuid],
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send;
}
