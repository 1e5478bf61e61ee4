//! SQLite: the bench's queries on tickbox's SQLite connections.

use crate::backend::{pool_like_tickbox, BenchBackend, Count};
use crate::place::Place;
use crate::workload::{Work, HANDLER};
use crate::Res;
use tickbox::diesel::sql_types::{BigInt, Binary, Text};
use tickbox::diesel::{self, QueryResult};
use tickbox::diesel_async::pooled_connection::deadpool::{Object, Pool};
use tickbox::diesel_async::pooled_connection::SetupCallback;
use tickbox::diesel_async::{AsyncConnection, RunQueryDsl, SimpleAsyncConnection};
use tickbox::{Message, ModuleBuilder, Sqlite, SqliteConnection};
use uuid::Uuid;

/// The pragmas tickbox sets on each connection (src/sqlite.rs).
const PRAGMAS: &str =
    "PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;";

/// The file of database `db`.
fn path(place: &Place, db: &str) -> String {
    place
        .dir
        .path()
        .join(format!("{db}.db"))
        .to_string_lossy()
        .into_owned()
}

impl BenchBackend for Sqlite {
    fn module(place: &Place, db: &str) -> ModuleBuilder<Self> {
        tickbox::Module::builder(db, path(place, db))
    }

    type RawPool = Pool<SqliteConnection>;
    type RawConn = Object<SqliteConnection>;

    async fn raw_get(pool: &Self::RawPool) -> Res<Self::RawConn> {
        Ok(pool.get().await?)
    }

    fn raw_pool(place: &Place, db: &str, size: usize) -> Res<Pool<SqliteConnection>> {
        let setup: SetupCallback<SqliteConnection> = Box::new(|url| {
            Box::pin(async move {
                let mut conn = SqliteConnection::establish(url).await?;
                conn.batch_execute(PRAGMAS)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        pool_like_tickbox(path(place, db), setup, size)
    }

    const CREATE_ORDERS: &'static str =
        "CREATE TABLE bench_orders (n INTEGER PRIMARY KEY NOT NULL, note TEXT NOT NULL)";
    const CREATE_EFFECTS: &'static str =
        "CREATE TABLE bench_changes (n INTEGER PRIMARY KEY NOT NULL, message_id BLOB NOT NULL)";
    const AFTER_PREFILL: &'static str = "ANALYZE; PRAGMA wal_checkpoint(TRUNCATE);";

    async fn batch(conn: &mut SqliteConnection, sql: &str) -> QueryResult<()> {
        conn.batch_execute(sql).await
    }

    async fn count(conn: &mut SqliteConnection, sql: &str) -> QueryResult<i64> {
        Ok(diesel::sql_query(sql).get_result::<Count>(conn).await?.n)
    }

    async fn insert_order(conn: &mut SqliteConnection, n: i64, note: &str) -> QueryResult<()> {
        diesel::sql_query("INSERT INTO bench_orders (n, note) VALUES (?, ?)")
            .bind::<BigInt, _>(n)
            .bind::<Text, _>(note)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn insert_change(conn: &mut SqliteConnection, n: i64, id: Uuid) -> QueryResult<()> {
        diesel::sql_query("INSERT INTO bench_changes (n, message_id) VALUES (?, ?)")
            .bind::<BigInt, _>(n)
            .bind::<Binary, _>(id.as_bytes().as_slice())
            .execute(conn)
            .await
            .map(drop)
    }

    // tickbox: AnsiTransactionManager::begin_transaction_sql(c, "BEGIN IMMEDIATE")
    async fn raw_begin(conn: &mut SqliteConnection) -> QueryResult<()> {
        conn.batch_execute("BEGIN IMMEDIATE").await
    }

    // The two statements on tickbox's tables are written as a careful
    // diesel user writes them: typed inserts that diesel prepares once per
    // connection, run on the connection's own thread (the async wrapper
    // would render their SQL for every call), as tickbox runs its own.
    async fn raw_insert_outbox(
        conn: &mut SqliteConnection,
        id: Uuid,
        topic: &str,
        payload: &str,
        created_at_us: i64,
    ) -> QueryResult<()> {
        let (topic, payload) = (topic.to_owned(), payload.to_owned());
        conn.spawn_blocking(move |c| {
            use diesel::ExpressionMethods;
            use tables::tickbox_outbox::dsl as o;
            let id = id.as_bytes().as_slice();
            let insert = diesel::insert_into(o::tickbox_outbox).values((
                o::id.eq(id),
                o::topic.eq(&topic),
                o::payload.eq(&payload),
                o::correlation_id.eq(id),
                o::causation_id.eq(None::<&[u8]>),
                o::created_at_us.eq(created_at_us),
            ));
            diesel::RunQueryDsl::execute(insert, c).map(drop)
        })
        .await
    }

    async fn raw_insert_inbox(
        conn: &mut SqliteConnection,
        id: Uuid,
        handler: &str,
        now_us: i64,
    ) -> QueryResult<bool> {
        let handler = handler.to_owned();
        conn.spawn_blocking(move |c| {
            use diesel::ExpressionMethods;
            use tables::tickbox_inbox::dsl as i;
            let insert = diesel::insert_into(i::tickbox_inbox).values((
                i::message_id.eq(id.as_bytes().as_slice()),
                i::handler.eq(&handler),
                i::processed_at_us.eq(now_us),
            ));
            diesel::RunQueryDsl::execute(insert.on_conflict_do_nothing(), c)
                .map(|inserted| inserted == 1)
        })
        .await
    }

    fn prefill_outbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
        let topic = Work::TOPIC;
        format!(
            "WITH RECURSIVE seq(i) AS (SELECT {lo} UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < {hi}) \
             INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
             SELECT u, '{topic}', '{{\"n\":' || i || '}}', u, NULL, ({base_ms} + i / 1000) * 1000 \
             FROM (SELECT i, unhex(printf('%012x7000', {base_ms} + i / 1000) || printf('8%015x', i)) AS u FROM seq)"
        )
    }

    fn prefill_inbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
        format!(
            "WITH RECURSIVE seq(i) AS (SELECT {lo} UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < {hi}) \
             INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) \
             SELECT unhex(printf('%012x7%03x', {base_ms} + i / 10, abs(random()) % 4096) \
                    || printf('%x%015x', 8 + abs(random()) % 4, i)), \
                    '{HANDLER}', ({base_ms} + i / 10) * 1000 FROM seq"
        )
    }
}

/// tickbox's two tables, as far as the baseline writes them (SQLite keeps
/// ids as 16-byte blobs).
mod tables {
    diesel::table! {
        tickbox_outbox (id) {
            id -> Binary,
            topic -> Text,
            payload -> Text,
            correlation_id -> Binary,
            causation_id -> Nullable<Binary>,
            created_at_us -> BigInt,
        }
    }

    diesel::table! {
        tickbox_inbox (message_id, handler) {
            message_id -> Binary,
            handler -> Text,
            processed_at_us -> BigInt,
        }
    }
}
