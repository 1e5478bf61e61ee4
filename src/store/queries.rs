//! The queries that read the same on every backend, written once: each is a
//! [`Statement`] with the dialect's placeholders, run by the backend's
//! [`Store::load`] or [`Store::execute`]. Only what truly differs (opening a
//! pool, migrations, how a transaction begins, notifications, the fast inbox
//! and outbox inserts) is written per backend, in `sqlite.rs` and
//! `postgres.rs`.

use crate::store::contract::Store;
use crate::store::schema::{DeadLetterRow, Id};
use crate::store::sql::{sql, Sql};
use crate::store::statement::{Bind, Dialect, Statement, StatementBuilder};
use diesel::sql_types::BigInt;
use diesel::QueryResult;
use std::future::Future;
use uuid::Uuid;

/// tickbox's tables, as [`Queries::count_tables`] counts them.
pub(crate) const TABLES: i64 = 10;

/// Their names, as the catalog lists them.
const TABLE_NAMES: &str = "'tickbox_outbox', 'tickbox_inbox', 'tickbox_dead_letters', \
     'tickbox_subscriptions', 'tickbox_outbox_done', 'tickbox_schema_version', \
     'tickbox_key_sequences', 'tickbox_key_progress', 'tickbox_handlers', 'tickbox_modules'";

/// The columns of a dead letter row, in [`DeadLetterRow`]'s order.
pub(crate) const DEAD_LETTER_COLUMNS: &str =
    "message_id, handler, topic, payload, correlation_id, \
     causation_id, created_at_us, attempts, reason, dead_at_us, ordering_key, key_seq, \
     key_publisher, key_previous_at_us, parked_behind";

/// A count.
#[derive(diesel::QueryableByName)]
struct Count {
    /// The number counted.
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// A message id.
#[derive(diesel::QueryableByName)]
struct MessageIdRow {
    #[diesel(sql_type = crate::store::schema::DbUuid)]
    message_id: Id,
}

/// A module's name, as recorded in `tickbox_modules`.
#[derive(diesel::QueryableByName)]
struct ModuleName {
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
}

/// A statement without binds.
pub(crate) fn plain(dialect: Dialect, sql: &str) -> Statement {
    StatementBuilder::new(dialect).finish(sql.to_string())
}

/// Binds an optional id: its placeholder, or `NULL`.
fn optional_id(b: &mut StatementBuilder, id: Option<Id>) -> String {
    id.map_or_else(|| "NULL".to_string(), |id| b.id(id.0))
}

/// Binds an optional text: its placeholder, or `NULL`.
pub(crate) fn optional_text(b: &mut StatementBuilder, text: Option<&str>) -> String {
    text.map_or_else(|| "NULL".to_string(), |text| b.text(text))
}

/// Binds an optional integer: its placeholder, or `NULL`.
fn optional_int(b: &mut StatementBuilder, value: Option<i64>) -> String {
    value.map_or_else(|| "NULL".to_string(), |value| b.int(value))
}

/// The queries every backend runs alike, for every [`Store`].
pub trait Queries: Store {
    /// Records a dead letter, or updates the one already recorded for the
    /// same message and handler.
    fn insert_dead_letter(
        conn: &mut Self::Conn,
        row: DeadLetterRow,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let values = [
            b.id(row.message_id.0),
            b.text(&row.handler),
            b.text(&row.topic),
            b.text(&row.payload),
            b.id(row.correlation_id.0),
            optional_id(&mut b, row.causation_id),
            b.int(row.created_at_us),
            b.int(row.attempts.into()),
            b.text(&row.reason),
            b.int(row.dead_at_us),
            optional_text(&mut b, row.ordering_key.as_deref()),
            optional_int(&mut b, row.key_seq),
            optional_text(&mut b, row.key_publisher.as_deref()),
            optional_int(&mut b, row.key_previous_at_us),
            optional_id(&mut b, row.parked_behind),
        ]
        .join(", ");
        let sql = format!(
            "INSERT INTO tickbox_dead_letters ({DEAD_LETTER_COLUMNS}) VALUES ({values}) \
             ON CONFLICT (message_id, handler) DO UPDATE SET attempts = excluded.attempts, \
             reason = excluded.reason, dead_at_us = excluded.dead_at_us, \
             parked_behind = excluded.parked_behind"
        );
        let statement = b.finish(sql);
        async move { Self::execute_statement(conn, statement).await.map(drop) }
    }

    /// Dead letters, oldest first, from `offset`.
    fn dead_letters(
        conn: &mut Self::Conn,
        offset: i64,
        limit: i64,
    ) -> impl Future<Output = QueryResult<Vec<DeadLetterRow>>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let (limit, offset) = (b.int(limit), b.int(offset));
        let sql = format!(
            "SELECT {DEAD_LETTER_COLUMNS} FROM tickbox_dead_letters \
             ORDER BY dead_at_us, message_id, handler LIMIT {limit} OFFSET {offset}"
        );
        Self::load_statement(conn, b.finish(sql))
    }

    /// One dead letter.
    fn dead_letter(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: String,
    ) -> impl Future<Output = QueryResult<Option<DeadLetterRow>>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let (id, handler) = (b.id(message_id), b.text(&handler));
        let sql = format!(
            "SELECT {DEAD_LETTER_COLUMNS} FROM tickbox_dead_letters \
             WHERE message_id = {id} AND handler = {handler}"
        );
        let statement = b.finish(sql);
        async move {
            let rows: Vec<DeadLetterRow> = Self::load_statement(conn, statement).await?;
            Ok(rows.into_iter().next())
        }
    }

    /// The ids of the messages that have a dead letter.
    fn dead_letter_ids(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Vec<Uuid>>> + Send {
        let statement = Sql::plain("SELECT DISTINCT message_id FROM tickbox_dead_letters");
        async move {
            let rows: Vec<MessageIdRow> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().map(|row| row.message_id.0).collect())
        }
    }

    /// Deletes one dead letter; the number of rows deleted.
    fn delete_dead_letter(
        conn: &mut Self::Conn,
        message_id: Uuid,
        handler: String,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        Self::execute(
            conn,
            sql!(
                "DELETE FROM tickbox_dead_letters WHERE message_id = ? AND handler = ?",
                message_id,
                handler
            ),
        )
    }

    /// Deletes up to `batch` messages' inbox rows processed before
    /// `before_us`; the number of rows deleted. The row is tested again
    /// outside the subquery: a message's rows for several handlers share its
    /// id.
    fn sweep_inbox(
        conn: &mut Self::Conn,
        before_us: i64,
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let sweep = Sweep {
            table: "tickbox_inbox",
            id: "message_id",
            done_at: "processed_at_us",
        };
        Self::execute_statement(conn, sweep.statement(Self::DIALECT, before_us, batch))
    }

    /// Deletes up to `batch` outbox rows delivered before `before_us`.
    fn sweep_outbox(
        conn: &mut Self::Conn,
        before_us: i64,
        batch: i64,
    ) -> impl Future<Output = QueryResult<usize>> + Send {
        let sweep = Sweep {
            table: "tickbox_outbox",
            id: "id",
            done_at: "delivered_at_us",
        };
        Self::execute_statement(conn, sweep.statement(Self::DIALECT, before_us, batch))
    }

    /// Records that module `name` starts on this database now.
    fn record_module_start(
        conn: &mut Self::Conn,
        name: &str,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let mut b = StatementBuilder::new(Self::DIALECT);
        let (name, now) = (b.text(name), b.int(now_us));
        let statement = b.finish(format!(
            "INSERT INTO tickbox_modules (name, last_started_at_us) VALUES ({name}, {now}) \
             ON CONFLICT (name) DO UPDATE SET last_started_at_us = excluded.last_started_at_us"
        ));
        async move { Self::execute_statement(conn, statement).await.map(drop) }
    }

    /// The name of the module that started last on this database, if one
    /// has started since it was migrated.
    fn last_started_module(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Option<String>>> + Send {
        let statement = plain(
            Self::DIALECT,
            "SELECT name FROM tickbox_modules ORDER BY last_started_at_us DESC, name LIMIT 1",
        );
        async move {
            let rows: Vec<ModuleName> = Self::load_statement(conn, statement).await?;
            Ok(rows.into_iter().next().map(|row| row.name))
        }
    }

    /// How many of tickbox's tables the database (PostgreSQL: the current
    /// schema) holds: [`TABLES`] when it is up to date, fewer when an older
    /// version of tickbox made them, none when it is not a module's database.
    fn count_tables(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<i64>> + Send {
        let sql = format!(
            "SELECT count(*) AS n FROM {} IN ({TABLE_NAMES})",
            Self::TABLES_BY_NAME
        );
        count::<Self>(conn, plain(Self::DIALECT, &sql))
    }

    /// Counts the dead letters (a small table).
    fn count_dead_letters(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<i64>> + Send {
        let sql = "SELECT count(*) AS n FROM tickbox_dead_letters";
        count::<Self>(conn, plain(Self::DIALECT, sql))
    }

    /// Counts the rows of the inbox and of the dead letters.
    fn table_sizes(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<(i64, i64)>> + Send {
        async move {
            let inbox = plain(Self::DIALECT, "SELECT count(*) AS n FROM tickbox_inbox");
            let inbox = count::<Self>(conn, inbox).await?;
            let dead = Self::count_dead_letters(conn).await?;
            Ok((inbox, dead))
        }
    }
}

impl<S: Store> Queries for S {}

/// A retention sweep of one table: rows done with before a cutoff.
pub(crate) struct Sweep {
    /// The table.
    pub(crate) table: &'static str,
    /// Its message id column (a UUIDv7).
    pub(crate) id: &'static str,
    /// When a row was done with (processed, delivered).
    pub(crate) done_at: &'static str,
}

impl Sweep {
    /// Deletes up to `batch` rows done with before `before_us`.
    ///
    /// A message is done with after it is created, so every row to go has an
    /// id (a UUIDv7) below the cutoff: the primary key finds them, and no
    /// extra index has to be kept up on every insert.
    fn statement(&self, dialect: Dialect, before_us: i64, batch: i64) -> Statement {
        self.statement_where(StatementBuilder::new(dialect), "TRUE", before_us, batch)
    }

    /// Likewise, of the rows that also meet `condition` (written with the
    /// builder `b`, which holds its binds).
    pub(crate) fn statement_where(
        &self,
        mut b: StatementBuilder,
        condition: &str,
        before_us: i64,
        batch: i64,
    ) -> Statement {
        let Sweep { table, id, done_at } = self;
        let earliest = b.bind(Bind::Id(Id::earliest_at(before_us)));
        let (before, batch) = (b.int(before_us), b.int(batch));
        b.finish(format!(
            "DELETE FROM {table} WHERE {id} IN \
             (SELECT {id} FROM {table} \
              WHERE {id} < {earliest} AND {done_at} < {before} AND {condition} LIMIT {batch}) \
             AND {done_at} < {before} AND {condition}"
        ))
    }
}

/// Runs a statement selecting one count (`n`).
pub(crate) async fn count<S: Store>(conn: &mut S::Conn, statement: Statement) -> QueryResult<i64> {
    let rows: Vec<Count> = S::load_statement(conn, statement).await?;
    Ok(rows.into_iter().next().map_or(0, |row| row.n))
}
