//! The ordering keys' state in a module's database, written once for both
//! backends: the publishing module numbers each key's messages
//! (`tickbox_key_sequences`), and each subscribing handler records how far
//! it has got in each key's order (`tickbox_key_progress`), inside the
//! delivery's own transaction, so the order holds whatever the transport,
//! the number of processes and the crashes in between.

use crate::store::contract::Store;
use crate::store::queries::DEAD_LETTER_COLUMNS;
use crate::store::schema::DeadLetterRow;
use crate::store::statement::StatementBuilder;
use diesel::sql_types::BigInt;
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
    /// Numbers the next message of `key` in `topic`, inside the publishing
    /// transaction: the counter row stays locked until it ends, so
    /// transactions publishing for one key commit in the order of their
    /// numbers.
    fn next_sequence(
        conn: &mut Self::Connection,
        topic: &str,
        key: &str,
    ) -> impl Future<Output = QueryResult<i64>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let (topic, key) = (b.text(topic), b.text(key));
        let statement = b.finish(format!(
            "INSERT INTO tickbox_key_sequences (topic, ordering_key, last_seq) \
             VALUES ({topic}, {key}, 1) ON CONFLICT (topic, ordering_key) \
             DO UPDATE SET last_seq = tickbox_key_sequences.last_seq + 1 RETURNING last_seq"
        ));
        async move {
            let rows: Vec<Seq> = Self::load(conn, statement).await?;
            rows.into_iter()
                .next()
                .map(|row| row.last_seq)
                .ok_or(diesel::result::Error::NotFound)
        }
    }

    /// Inside a delivery's transaction: whether message `sequence` of the
    /// key may run now, and if so, records it as the handler's progress.
    /// One statement when it is the key's next message, as it nearly always
    /// is.
    fn take_turn(
        conn: &mut Self::Connection,
        scope: KeyScope<'_>,
        sequence: i64,
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
        let next = statement(
            "UPDATE tickbox_key_progress SET last_seq = {seq} \
             WHERE handler = {handler} AND publisher = {publisher} AND topic = {topic} \
             AND ordering_key = {key} AND last_seq = {seq} - 1"
                .to_string(),
        );
        let parked = statement(format!(
            "SELECT {DEAD_LETTER_COLUMNS} FROM tickbox_dead_letters \
             WHERE handler = {{handler}} AND key_publisher = {{publisher}} AND topic = {{topic}} \
             AND ordering_key = {{key}} AND key_seq < {{seq}} ORDER BY key_seq LIMIT 1"
        ));
        let first = statement(
            "INSERT INTO tickbox_key_progress (handler, publisher, topic, ordering_key, last_seq) \
             VALUES ({handler}, {publisher}, {topic}, {key}, {seq}) \
             ON CONFLICT (handler, publisher, topic, ordering_key) DO NOTHING"
                .to_string(),
        );
        let progress = statement(
            "SELECT last_seq FROM tickbox_key_progress \
             WHERE handler = {handler} AND publisher = {publisher} AND topic = {topic} \
             AND ordering_key = {key}"
                .to_string(),
        );
        async move {
            if Self::execute(conn, next).await? == 1 {
                return Ok(Turn::Next);
            }
            let parked: Vec<DeadLetterRow> = Self::load(conn, parked).await?;
            if let Some(dead) = parked.into_iter().next() {
                return Ok(Turn::Parked(dead.message_id.0));
            }
            if Self::execute(conn, first).await? == 1 {
                return Ok(Turn::Next);
            }
            let rows: Vec<Seq> = Self::load(conn, progress).await?;
            let last = rows.into_iter().next().map_or(0, |row| row.last_seq);
            Ok(if sequence <= last {
                Turn::Stale(last)
            } else {
                Turn::Early(last)
            })
        }
    }

    /// Moves the handler's progress in the key to `sequence` unless it is
    /// past it already: an operator skipped that message.
    fn skip_to(
        conn: &mut Self::Connection,
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
        async move { Self::execute(conn, statement).await.map(drop) }
    }

    /// The dead letters of the key (the one that parks it and those parked
    /// behind it), in the key's order.
    fn key_dead_letters(
        conn: &mut Self::Connection,
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
        Self::load(conn, b.finish(sql))
    }

    /// The keys parked per handler: (handler, number of keys).
    fn parked_keys(
        conn: &mut Self::Connection,
    ) -> impl Future<Output = QueryResult<Vec<ParkedKeys>>> + Send {
        let statement = StatementBuilder::new(Self::DIALECT).finish(
            "SELECT handler, count(*) AS keys FROM (SELECT DISTINCT handler, key_publisher, \
             topic, ordering_key FROM tickbox_dead_letters WHERE ordering_key IS NOT NULL) parked \
             GROUP BY handler ORDER BY handler"
                .to_string(),
        );
        Self::load(conn, statement)
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
