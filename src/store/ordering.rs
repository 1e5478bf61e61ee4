//! The ordering keys' state in a module's database, written once for both
//! backends: the publishing module numbers each key's messages
//! (`tickbox_key_sequences`), and each subscribing handler records how far
//! it has got in each key's order (`tickbox_key_progress`), inside the
//! delivery's own transaction, so the order holds whatever the transport,
//! the number of processes and the crashes in between.

use crate::store::contract::{KeyScope, Store};
use crate::store::queries::DEAD_LETTER_COLUMNS;
use crate::store::schema::DeadLetterRow;
use crate::store::statement::StatementBuilder;
use diesel::sql_types::BigInt;
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

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

/// A sequence number or progress, read back.
#[derive(diesel::QueryableByName)]
struct Seq {
    /// The number.
    #[diesel(sql_type = BigInt)]
    last_seq: i64,
}

/// The ordering statements, the same on every backend.
pub trait Ordering: Store {
    /// Inside a delivery's transaction, once the inbox guard's first
    /// statement found that message `sequence` is not simply the key's next
    /// ([`Store::tick_inbox`]): whether it may run now, and if so, records
    /// it as the handler's progress.
    ///
    /// A key the handler has no progress in starts with its message 1, or
    /// with a message whose predecessor (published at `previous_at_us`) was
    /// published before the handler first started: that one was never owed
    /// to it. Any other message waits for its predecessor.
    fn take_turn(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
        previous_at_us: Option<i64>,
    ) -> impl Future<Output = QueryResult<Turn>> + Send {
        let dialect = Self::DIALECT;
        // Binds only what the text names: PostgreSQL refuses a parameter
        // a statement does not use.
        let statement = |sql: String| {
            let mut b = StatementBuilder::new(dialect);
            let mut sql = sql;
            for (name, value) in [
                ("{handler}", scope.handler),
                ("{publisher}", scope.publisher),
                ("{topic}", scope.topic),
                ("{key}", scope.key),
            ] {
                if sql.contains(name) {
                    sql = sql.replace(name, &b.text(value));
                }
            }
            if sql.contains("{seq}") {
                sql = sql.replace("{seq}", &b.int(sequence));
            }
            b.finish(sql)
        };
        let parked = statement(format!(
            "SELECT {DEAD_LETTER_COLUMNS} FROM tickbox_dead_letters \
             WHERE handler = {{handler}} AND key_publisher = {{publisher}} AND topic = {{topic}} \
             AND ordering_key = {{key}} AND key_seq < {{seq}} ORDER BY key_seq LIMIT 1"
        ));
        let progress = statement(
            "SELECT last_seq FROM tickbox_key_progress \
             WHERE handler = {handler} AND publisher = {publisher} AND topic = {topic} \
             AND ordering_key = {key}"
                .to_string(),
        );
        let since = statement(
            "SELECT first_started_at_us AS last_seq FROM tickbox_handlers \
             WHERE handler = {handler}"
                .to_string(),
        );
        async move {
            let rows: Vec<Seq> = Self::load_statement(conn, progress).await?;
            let last = rows.into_iter().next().map(|row| row.last_seq);
            if let Some(last) = last.filter(|last| sequence <= *last) {
                return Ok(Turn::Stale(last));
            }
            let parked: Vec<DeadLetterRow> = Self::load_statement(conn, parked).await?;
            if let Some(dead) = parked.into_iter().next() {
                return Ok(Turn::Parked(dead.message_id.0));
            }
            if let Some(last) = last {
                return Ok(Turn::Early(last));
            }
            let rows: Vec<Seq> = Self::load_statement(conn, since).await?;
            // A handler with no recorded start (a database opened by a
            // tool) takes any message as the start.
            let starts = match (rows.into_iter().next(), previous_at_us) {
                (Some(since), Some(previous)) => previous < since.last_seq,
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

    /// Records when each of `handlers` first started in this database (kept
    /// from the first time on).
    fn record_handler_starts(
        conn: &mut Self::Conn,
        handlers: &[&str],
        now_us: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let statements: Vec<_> = handlers
            .iter()
            .map(|handler| {
                let mut b = StatementBuilder::new(Self::DIALECT);
                let (handler, now) = (b.text(handler), b.int(now_us));
                b.finish(format!(
                    "INSERT INTO tickbox_handlers (handler, first_started_at_us) \
                     VALUES ({handler}, {now}) ON CONFLICT (handler) DO NOTHING"
                ))
            })
            .collect();
        async move {
            for statement in statements {
                Self::execute_statement(conn, statement).await?;
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
        let mut b = StatementBuilder::new(Self::DIALECT);
        let values = [
            b.text(scope.handler),
            b.text(scope.publisher),
            b.text(scope.topic),
            b.text(scope.key),
            b.int(sequence),
        ]
        .join(", ");
        let statement = b.finish(format!(
            "INSERT INTO tickbox_key_progress (handler, publisher, topic, ordering_key, last_seq) \
             VALUES ({values}) ON CONFLICT (handler, publisher, topic, ordering_key) \
             DO UPDATE SET last_seq = excluded.last_seq \
             WHERE tickbox_key_progress.last_seq < excluded.last_seq"
        ));
        async move { Self::execute_statement(conn, statement).await.map(drop) }
    }

    /// The dead letters of the key (the one that parks it and those parked
    /// behind it), in the key's order.
    fn key_dead_letters(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
    ) -> impl Future<Output = QueryResult<Vec<DeadLetterRow>>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let sql = format!(
            "SELECT {DEAD_LETTER_COLUMNS} FROM tickbox_dead_letters WHERE handler = {} AND key_publisher = {} AND topic = {} AND ordering_key = {} \
             ORDER BY key_seq",
            b.text(scope.handler),
            b.text(scope.publisher),
            b.text(scope.topic),
            b.text(scope.key)
        );
        Self::load_statement(conn, b.finish(sql))
    }

    /// The keys parked per handler: (handler, number of keys).
    fn parked_keys(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Vec<ParkedKeys>>> + Send {
        let statement = StatementBuilder::new(Self::DIALECT).finish(
            "SELECT handler, count(*) AS keys FROM (SELECT DISTINCT handler, key_publisher, \
             topic, ordering_key FROM tickbox_dead_letters WHERE ordering_key IS NOT NULL) parked \
             GROUP BY handler ORDER BY handler"
                .to_string(),
        );
        Self::load_statement(conn, statement)
    }
}

impl<S: Store> Ordering for S {}

/// How many keys a handler has parked.
#[derive(Debug, Clone, diesel::QueryableByName)]
pub struct ParkedKeys {
    /// The handler.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub(crate) handler: String,
    /// Its parked keys.
    #[diesel(sql_type = BigInt)]
    pub(crate) keys: i64,
}
