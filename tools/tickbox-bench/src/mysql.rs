//! MariaDB and MySQL: the bench's queries on tickbox's MySQL connections,
//! one database per module on the server.

use crate::backend::{pool_like_tickbox, BenchBackend, Count};
use crate::clock::lock;
use crate::place::Place;
use crate::workload::{Work, HANDLER};
use crate::Res;
use tickbox::diesel::sql_types::{BigInt, Binary, Nullable, Text};
use tickbox::diesel::{self, QueryResult};
use tickbox::diesel_async::pooled_connection::deadpool::{Object, Pool};
use tickbox::diesel_async::pooled_connection::SetupCallback;
use tickbox::diesel_async::{AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use tickbox::{Message, ModuleBuilder, Mysql};
use uuid::Uuid;

/// What tickbox sets on each of its MySQL connections
/// (src/store/mysql/mod.rs): READ COMMITTED (the servers' default,
/// REPEATABLE READ, takes gap locks on the inbox's insert) and strict mode.
const SESSION_SETUP: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
     SET SESSION sql_mode = 'STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'";

/// The rows `0..1_000_000` of a prefill chunk as `k`, from six cross-joined
/// digits: set-based, and the same on MariaDB and MySQL (MariaDB's
/// `seq_0_to_n` tables are its own; MySQL caps a recursive CTE at 1,000
/// rows by default).
const MILLION_ROWS: &str = "(SELECT d0.d + 10 * d1.d + 100 * d2.d + 1000 * d3.d \
     + 10000 * d4.d + 100000 * d5.d AS k \
     FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
           UNION ALL SELECT 8 UNION ALL SELECT 9) AS d0 \
     CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
           UNION ALL SELECT 8 UNION ALL SELECT 9) AS d1 \
     CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
           UNION ALL SELECT 8 UNION ALL SELECT 9) AS d2 \
     CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
           UNION ALL SELECT 8 UNION ALL SELECT 9) AS d3 \
     CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
           UNION ALL SELECT 8 UNION ALL SELECT 9) AS d4 \
     CROSS JOIN (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
           UNION ALL SELECT 8 UNION ALL SELECT 9) AS d5)";

/// The rows `lo..hi` (at most a million) as `i`.
fn rows(lo: u64, hi: u64) -> String {
    assert!(
        hi - lo <= 1_000_000,
        "a prefill chunk is at most 1,000,000 rows"
    );
    format!("(SELECT {lo} + k AS i FROM {MILLION_ROWS} AS m WHERE k < {hi} - {lo})")
}

/// The URL of database `db` on the place's server, kept on TCP as tickbox
/// keeps it (mysql_async would move a local connection to the Unix socket).
fn database_url(place: &Place, db: &str) -> Res<String> {
    let mut url = url::Url::parse(place.mysql_url())?;
    url.set_path(&format!("/{db}"));
    if !url.query_pairs().any(|(key, _)| key == "prefer_socket") {
        url.query_pairs_mut().append_pair("prefer_socket", "false");
    }
    Ok(url.to_string())
}

impl BenchBackend for Mysql {
    fn module(place: &Place, db: &str) -> ModuleBuilder<Self> {
        lock(&place.schemas).push(db.to_string());
        let url = place.mysql_url().to_string();
        tickbox::Module::builder(db, url).schema(db)
    }

    type RawPool = Pool<AsyncMysqlConnection>;
    type RawConn = Object<AsyncMysqlConnection>;

    async fn raw_get(pool: &Self::RawPool) -> Res<Self::RawConn> {
        Ok(pool.get().await?)
    }

    fn raw_pool(place: &Place, db: &str, size: usize) -> Res<Pool<AsyncMysqlConnection>> {
        let setup: SetupCallback<AsyncMysqlConnection> = Box::new(|url| {
            Box::pin(async move {
                let mut conn = Mysql::connect(url).await?;
                conn.batch_execute(SESSION_SETUP)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        pool_like_tickbox(database_url(place, db)?, setup, size)
    }

    const CREATE_ORDERS: &'static str =
        "CREATE TABLE bench_orders (n BIGINT NOT NULL PRIMARY KEY, note TEXT NOT NULL) \
         ENGINE=InnoDB";
    const CREATE_EFFECTS: &'static str =
        "CREATE TABLE bench_changes (n BIGINT NOT NULL PRIMARY KEY, message_id BINARY(16) NOT NULL) \
         ENGINE=InnoDB";
    const AFTER_PREFILL: &'static str =
        "ANALYZE TABLE tickbox_outbox; ANALYZE TABLE tickbox_inbox;";

    async fn batch(conn: &mut AsyncMysqlConnection, sql: &str) -> QueryResult<()> {
        conn.batch_execute(sql).await
    }

    async fn count(conn: &mut AsyncMysqlConnection, sql: &str) -> QueryResult<i64> {
        Ok(diesel::sql_query(sql).get_result::<Count>(conn).await?.n)
    }

    async fn insert_order(conn: &mut AsyncMysqlConnection, n: i64, note: &str) -> QueryResult<()> {
        diesel::sql_query("INSERT INTO bench_orders (n, note) VALUES (?, ?)")
            .bind::<BigInt, _>(n)
            .bind::<Text, _>(note)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn insert_change(conn: &mut AsyncMysqlConnection, n: i64, id: Uuid) -> QueryResult<()> {
        diesel::sql_query("INSERT INTO bench_changes (n, message_id) VALUES (?, ?)")
            .bind::<BigInt, _>(n)
            .bind::<Binary, _>(id.as_bytes().as_slice())
            .execute(conn)
            .await
            .map(drop)
    }

    // tickbox: AnsiTransactionManager::begin_transaction, i.e. BEGIN (READ
    // COMMITTED, set on the connection).
    async fn raw_begin(conn: &mut AsyncMysqlConnection) -> QueryResult<()> {
        conn.batch_execute("BEGIN").await
    }

    async fn raw_insert_outbox(
        conn: &mut AsyncMysqlConnection,
        id: Uuid,
        topic: &str,
        payload: &str,
        created_at_us: i64,
    ) -> QueryResult<()> {
        diesel::sql_query(
            "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind::<Binary, _>(id.as_bytes().as_slice())
        .bind::<Text, _>(topic)
        .bind::<Text, _>(payload)
        .bind::<Binary, _>(id.as_bytes().as_slice())
        .bind::<Nullable<Binary>, _>(None::<&[u8]>)
        .bind::<BigInt, _>(created_at_us)
        .execute(conn)
        .await
        .map(drop)
    }

    // tickbox's own inbox tick on MySQL: affected rows 1 = inserted, 2 = a
    // duplicate counted.
    async fn raw_insert_inbox(
        conn: &mut AsyncMysqlConnection,
        id: Uuid,
        handler: &str,
        now_us: i64,
    ) -> QueryResult<bool> {
        let affected = diesel::sql_query(
            "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) VALUES (?, ?, ?) \
             ON DUPLICATE KEY UPDATE duplicates = duplicates + 1",
        )
        .bind::<Binary, _>(id.as_bytes().as_slice())
        .bind::<Text, _>(handler)
        .bind::<BigInt, _>(now_us)
        .execute(conn)
        .await?;
        Ok(affected == 1)
    }

    fn prefill_outbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
        let topic = Work::TOPIC;
        let rows = rows(lo, hi);
        format!(
            "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
             SELECT u, '{topic}', CONCAT('{{\"n\":', i, '}}'), u, NULL, ({base_ms} + i DIV 1000) * 1000 \
             FROM (SELECT i, UNHEX(CONCAT(LPAD(HEX({base_ms} + i DIV 1000), 12, '0'), '7000', '8', \
                                          LPAD(HEX(i), 15, '0'))) AS u \
                   FROM {rows} AS r) AS s"
        )
    }

    fn prefill_inbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
        let rows = rows(lo, hi);
        format!(
            "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) \
             SELECT UNHEX(CONCAT(LPAD(HEX({base_ms} + i DIV 10), 12, '0'), '7', \
                                 LPAD(HEX(FLOOR(RAND() * 4096)), 3, '0'), \
                                 HEX(8 + FLOOR(RAND() * 4)), LPAD(HEX(i), 15, '0'))), \
                    '{HANDLER}', ({base_ms} + i DIV 10) * 1000 \
             FROM {rows} AS r"
        )
    }
}

/// Drops every database the run created.
pub(crate) async fn drop_databases(place: &Place) -> Res<()> {
    let databases = std::mem::take(&mut *lock(&place.schemas));
    if databases.is_empty() {
        return Ok(());
    }
    let url = database_url(place, "")?;
    let mut conn = Mysql::connect(&url).await?;
    for database in databases {
        conn.batch_execute(&format!("DROP DATABASE IF EXISTS `{database}`"))
            .await?;
    }
    Ok(())
}
