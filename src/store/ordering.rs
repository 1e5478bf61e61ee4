//! The ordering keys' state in a module's database: the publishing module
//! numbers each key's messages (`tickbox_key_sequences`), and each
//! subscribing handler records how far it has got in each key's order
//! (`tickbox_key_progress`), inside the delivery's own transaction, so the
//! order holds whatever the transport, the number of processes and the
//! crashes in between.

use crate::store::contract::Store;
use crate::store::dead_letters::dead_letter_columns;
use crate::store::schema::if_traced;
use crate::store::schema::{DeadLetterRow, MessageIdRow};
use crate::store::sql::{sql, Sql};
use diesel::sql_types::{BigInt, Text};
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// A key of one topic, from one publisher, as one handler sees it: the
/// scope of a sequence and of a handler's progress.
#[derive(Debug, Clone, Copy)]
pub struct KeyScope<'a> {
    /// The handler (its name).
    pub(crate) handler: &'a str,
    /// The module that numbered the key.
    pub(crate) publisher: &'a str,
    /// The topic.
    pub(crate) topic: &'a str,
    /// The ordering key.
    pub(crate) key: &'a str,
}

/// A handler's progress in a key moves to `sequence` if it stands just
/// before it: one row changed means the message is the key's next. Fixed
/// shape, run by each backend the way it runs the inbox guard's insert
/// ([`TickInbox`](crate::store::inbox::TickInbox)).
macro_rules! advance_key_statement {
    ($scope:expr, $sequence:expr) => {{
        use diesel::{ExpressionMethods, QueryDsl};
        use $crate::store::schema::tickbox_key_progress::dsl as progress;
        diesel::update(
            progress::tickbox_key_progress
                .filter(progress::handler.eq($scope.handler))
                .filter(progress::publisher.eq($scope.publisher))
                .filter(progress::topic.eq($scope.topic))
                .filter(progress::ordering_key.eq($scope.key))
                .filter(progress::last_seq.eq($sequence - 1)),
        )
        .set(progress::last_seq.eq($sequence))
    }};
}
pub(crate) use advance_key_statement;

/// A handler's progress in a key starts at `sequence`, unless it has one.
#[allow(unused_macros)]
macro_rules! start_key_statement {
    ($scope:expr, $sequence:expr) => {{
        use diesel::ExpressionMethods;
        use $crate::store::schema::tickbox_key_progress::dsl as progress;
        diesel::insert_into(progress::tickbox_key_progress)
            .values((
                progress::handler.eq($scope.handler),
                progress::publisher.eq($scope.publisher),
                progress::topic.eq($scope.topic),
                progress::ordering_key.eq($scope.key),
                progress::last_seq.eq($sequence),
            ))
            .on_conflict_do_nothing()
    }};
}
// Stated for the backends that spell the statement this way; a build
// with only other backends leaves it unused.
#[allow(unused_imports)]
pub(crate) use start_key_statement;

/// Whether a keyed message may run now, by its handler's progress in its
/// key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// It is the key's next message (or the first this handler sees of the
    /// key): run it; the progress now counts it.
    Next,
    /// A message of the key before it is a dead letter of this handler (the
    /// earliest such, by sequence): the key is parked behind it.
    Parked(Uuid),
    /// An earlier message of the key has not been handled yet (it is on its
    /// way, or retrying): wait for it. The progress so far.
    Early(i64),
    /// The progress is already at or past it (an operator skipped it, or it
    /// arrived after a later message the handler took as the start of the
    /// key): nothing to do. The progress so far.
    Stale(i64),
}

/// How many keys a handler has parked.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct ParkedKeys {
    /// The handler.
    #[diesel(sql_type = Text)]
    pub(crate) handler: String,
    /// Its parked keys.
    #[diesel(sql_type = BigInt)]
    pub(crate) keys: i64,
}

/// A handler's progress in a key: the number of the last message of the
/// key it is done with.
#[derive(diesel::QueryableByName)]
struct Progress {
    /// That number.
    #[diesel(sql_type = BigInt)]
    last_seq: i64,
}

/// When a handler first started in the database.
#[derive(diesel::QueryableByName)]
struct Started {
    /// Microseconds since the Unix epoch.
    #[diesel(sql_type = BigInt)]
    first_started_at_us: i64,
}

/// The ordering keys' statements. The defaults are written in the SQL that
/// SQLite and PostgreSQL share; a backend overrides what its dialect spells
/// otherwise, and states itself the fixed-shape statements of the inbox
/// guard's path ([`OrderingStatements::advance_key`],
/// [`OrderingStatements::start_key`]).
pub trait OrderingStatements: Store {
    /// Inside a delivery's transaction: moves the handler's progress in the
    /// key to `sequence` if that is the key's next message; false otherwise
    /// (see [`OrderingStatements::take_turn`]).
    fn advance_key(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Inside a delivery's transaction: starts the handler's progress in the
    /// key at `sequence` unless it has progress there already; true when it
    /// did.
    fn start_key(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Inside a delivery's transaction, once the inbox guard's first
    /// statement found that message `sequence` is not simply the key's next
    /// ([`InboxStatements::tick_inbox`]): whether it may run now, and if so,
    /// records it as the handler's progress.
    ///
    /// A key the handler has no progress in starts with its message 1, or
    /// with a message whose predecessor (published at `previous_at_us`) was
    /// published before the handler first started: that one was never owed
    /// to it. Any other message waits for its predecessor.
    ///
    /// The decision, written once; what it reads are the operations
    /// [`key_progress`](OrderingStatements::key_progress),
    /// [`parking_dead_letter`](OrderingStatements::parking_dead_letter) and
    /// [`handler_started_at`](OrderingStatements::handler_started_at).
    ///
    /// [`InboxStatements::tick_inbox`]: crate::store::inbox::InboxStatements::tick_inbox
    fn take_turn(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
        previous_at_us: Option<i64>,
    ) -> impl Future<Output = QueryResult<Turn>> + Send {
        async move {
            let last = Self::key_progress(conn, scope).await?;
            if let Some(last) = last.filter(|last| sequence <= *last) {
                return Ok(Turn::Stale(last));
            }
            if let Some(head) = Self::parking_dead_letter(conn, scope, sequence).await? {
                return Ok(Turn::Parked(head));
            }
            if let Some(last) = last {
                return Ok(Turn::Early(last));
            }
            // A handler with no recorded start (a database opened by a
            // tool) takes any message as the start.
            let starts = match (
                Self::handler_started_at(conn, scope.handler).await?,
                previous_at_us,
            ) {
                (Some(since), Some(previous)) => previous < since,
                // A number above 1 without its predecessor's time was not
                // numbered by a publisher: never a start.
                (Some(_), None) => false,
                (None, _) => true,
            };
            if starts && Self::start_key(conn, scope, sequence).await? {
                return Ok(Turn::Next);
            }
            Ok(Turn::Early(0))
        }
    }

    /// The handler's progress in the key (the number of the last message
    /// of the key it is done with), if it has any.
    fn key_progress(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
    ) -> impl Future<Output = QueryResult<Option<i64>>> + Send {
        let statement = sql!(
            "SELECT last_seq FROM tickbox_key_progress \
             WHERE handler = ? AND publisher = ? AND topic = ? AND ordering_key = ?",
            scope.handler,
            scope.publisher,
            scope.topic,
            scope.key
        );
        async move {
            let rows: Vec<Progress> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().next().map(|row| row.last_seq))
        }
    }

    /// The message id of the handler's earliest dead letter of the key
    /// numbered before `sequence`, if any: the key is parked behind it.
    fn parking_dead_letter(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> impl Future<Output = QueryResult<Option<Uuid>>> + Send {
        let statement = sql!(
            "SELECT message_id FROM tickbox_dead_letters \
             WHERE handler = ? AND key_publisher = ? AND topic = ? AND ordering_key = ? \
             AND key_seq < ? ORDER BY key_seq LIMIT 1",
            scope.handler,
            scope.publisher,
            scope.topic,
            scope.key,
            sequence
        );
        async move {
            let rows: Vec<MessageIdRow> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().next().map(|row| row.message_id.0))
        }
    }

    /// When `handler` first started in this database (microseconds since
    /// the Unix epoch), if that was recorded
    /// ([`record_handler_starts`](OrderingStatements::record_handler_starts)).
    fn handler_started_at(
        conn: &mut Self::Conn,
        handler: &str,
    ) -> impl Future<Output = QueryResult<Option<i64>>> + Send {
        let statement = sql!(
            "SELECT first_started_at_us FROM tickbox_handlers WHERE handler = ?",
            handler
        );
        async move {
            let rows: Vec<Started> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().next().map(|row| row.first_started_at_us))
        }
    }

    /// At module start: records when each of `handlers` first started in
    /// this database (kept from the first time on).
    fn record_handler_starts(
        conn: &mut Self::Conn,
        handlers: &[&str],
        now_us: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let statements: Vec<_> = handlers
            .iter()
            .map(|handler| {
                sql!(
                    "INSERT INTO tickbox_handlers (handler, first_started_at_us) \
                     VALUES (?, ?) ON CONFLICT (handler) DO NOTHING",
                    *handler,
                    now_us
                )
            })
            .collect();
        async move {
            for statement in statements {
                Self::execute(conn, statement).await?;
            }
            Ok(())
        }
    }

    /// Moves the handler's progress in the key to `sequence` unless it is
    /// past it already: an operator skipped that message.
    fn skip_to(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let statement = sql!(
            "INSERT INTO tickbox_key_progress (handler, publisher, topic, ordering_key, last_seq) \
             VALUES (?, ?, ?, ?, ?) ON CONFLICT (handler, publisher, topic, ordering_key) \
             DO UPDATE SET last_seq = excluded.last_seq \
             WHERE tickbox_key_progress.last_seq < excluded.last_seq",
            scope.handler,
            scope.publisher,
            scope.topic,
            scope.key,
            sequence
        );
        async move { Self::execute(conn, statement).await.map(drop) }
    }

    /// The dead letters of the key (the one that parks it and those parked
    /// behind it), in the key's order.
    fn key_dead_letters(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
    ) -> impl Future<Output = QueryResult<Vec<DeadLetterRow>>> + Send {
        Self::load(
            conn,
            sql!(
                concat!(
                    "SELECT ",
                    dead_letter_columns!(),
                    " FROM tickbox_dead_letters \
                     WHERE handler = ? AND key_publisher = ? AND topic = ? AND ordering_key = ? \
                     ORDER BY key_seq"
                ),
                scope.handler,
                scope.publisher,
                scope.topic,
                scope.key
            ),
        )
    }

    /// The keys parked per handler: (handler, number of keys).
    fn parked_keys(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Vec<ParkedKeys>>> + Send {
        Self::load(
            conn,
            Sql::plain(
                "SELECT handler, count(*) AS keys FROM (SELECT DISTINCT handler, key_publisher, \
                 topic, ordering_key FROM tickbox_dead_letters WHERE ordering_key IS NOT NULL) \
                 parked GROUP BY handler ORDER BY handler",
            ),
        )
    }
}
