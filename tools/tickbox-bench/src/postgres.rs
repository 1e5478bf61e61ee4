//! PostgreSQL: the bench's queries on tickbox's PostgreSQL connections,
//! one schema per module.

use crate::backend::{pool_like_tickbox, BenchBackend, Count};
use crate::clock::lock;
use crate::place::Place;
use crate::workload::{Work, HANDLER};
use crate::Res;
use tickbox::diesel::sql_types::{BigInt, Nullable, Text};
use tickbox::diesel::{self, QueryResult};
use tickbox::diesel_async::pooled_connection::deadpool::{Object, Pool};
use tickbox::diesel_async::pooled_connection::SetupCallback;
use tickbox::diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tickbox::{Message, ModuleBuilder, Postgres};
use uuid::Uuid;

impl BenchBackend for Postgres {
    fn module(place: &Place, db: &str) -> ModuleBuilder<Self> {
        lock(&place.schemas).push(db.to_string());
        let url = place.pg_url().to_string();
        tickbox::Module::builder(db, url).schema(db)
    }

    type RawPool = Pool<AsyncPgConnection>;
    type RawConn = Object<AsyncPgConnection>;

    async fn raw_get(pool: &Self::RawPool) -> Res<Self::RawConn> {
        Ok(pool.get().await?)
    }

    fn raw_pool(place: &Place, db: &str, size: usize) -> Res<Pool<AsyncPgConnection>> {
        let schema = db.to_string();
        let setup: SetupCallback<AsyncPgConnection> = Box::new(move |url| {
            let schema = schema.clone();
            Box::pin(async move {
                let mut conn = tickbox::Postgres::connect(url).await?;
                conn.batch_execute(&format!("SET search_path TO {schema}"))
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        });
        let url = place.pg_url().to_string();
        pool_like_tickbox(url, setup, size)
    }

    const CREATE_ORDERS: &'static str =
        "CREATE TABLE bench_orders (n bigint PRIMARY KEY, note text NOT NULL)";
    const CREATE_EFFECTS: &'static str =
        "CREATE TABLE bench_changes (n bigint PRIMARY KEY, message_id uuid NOT NULL)";
    const AFTER_PREFILL: &'static str =
        "VACUUM (ANALYZE) tickbox_outbox; VACUUM (ANALYZE) tickbox_inbox; CHECKPOINT;";

    async fn batch(conn: &mut AsyncPgConnection, sql: &str) -> QueryResult<()> {
        conn.batch_execute(sql).await
    }

    async fn count(conn: &mut AsyncPgConnection, sql: &str) -> QueryResult<i64> {
        Ok(diesel::sql_query(sql).get_result::<Count>(conn).await?.n)
    }

    async fn insert_order(conn: &mut AsyncPgConnection, n: i64, note: &str) -> QueryResult<()> {
        diesel::sql_query("INSERT INTO bench_orders (n, note) VALUES ($1, $2)")
            .bind::<BigInt, _>(n)
            .bind::<Text, _>(note)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn insert_change(conn: &mut AsyncPgConnection, n: i64, id: Uuid) -> QueryResult<()> {
        diesel::sql_query("INSERT INTO bench_changes (n, message_id) VALUES ($1, $2)")
            .bind::<BigInt, _>(n)
            .bind::<diesel::sql_types::Uuid, _>(id)
            .execute(conn)
            .await
            .map(drop)
    }

    // tickbox: AnsiTransactionManager::begin_transaction, i.e. BEGIN
    // (READ COMMITTED, the server default).
    async fn raw_begin(conn: &mut AsyncPgConnection) -> QueryResult<()> {
        conn.batch_execute("BEGIN").await
    }

    async fn raw_insert_outbox(
        conn: &mut AsyncPgConnection,
        id: Uuid,
        topic: &str,
        payload: &str,
        created_at_us: i64,
    ) -> QueryResult<()> {
        diesel::sql_query(
            "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind::<diesel::sql_types::Uuid, _>(id)
        .bind::<Text, _>(topic)
        .bind::<Text, _>(payload)
        .bind::<diesel::sql_types::Uuid, _>(id)
        .bind::<Nullable<diesel::sql_types::Uuid>, _>(None::<Uuid>)
        .bind::<BigInt, _>(created_at_us)
        .execute(conn)
        .await
        .map(drop)
    }

    async fn raw_insert_inbox(
        conn: &mut AsyncPgConnection,
        id: Uuid,
        handler: &str,
        now_us: i64,
    ) -> QueryResult<bool> {
        let inserted = diesel::sql_query(
            "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) VALUES ($1, $2, $3) \
             ON CONFLICT DO NOTHING",
        )
        .bind::<diesel::sql_types::Uuid, _>(id)
        .bind::<Text, _>(handler)
        .bind::<BigInt, _>(now_us)
        .execute(conn)
        .await?;
        Ok(inserted == 1)
    }

    fn prefill_outbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
        let topic = Work::TOPIC;
        format!(
            "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
             SELECT u, '{topic}', '{{\"n\":' || i || '}}', u, NULL, ({base_ms} + i / 1000) * 1000 \
             FROM (SELECT i, (lpad(to_hex({base_ms} + i / 1000), 12, '0') || '7000' || '8' \
                              || lpad(to_hex(i), 15, '0'))::uuid AS u \
                   FROM generate_series({lo}::bigint, {hi}::bigint - 1) AS i) AS s"
        )
    }

    fn prefill_inbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
        format!(
            "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) \
             SELECT (lpad(to_hex({base_ms} + i / 10), 12, '0') || '7' \
                     || lpad(to_hex((random() * 4095)::int), 3, '0') \
                     || to_hex(8 + (random() * 3)::int) || lpad(to_hex(i), 15, '0'))::uuid, \
                    '{HANDLER}', ({base_ms} + i / 10) * 1000 \
             FROM generate_series({lo}::bigint, {hi}::bigint - 1) AS i"
        )
    }
}

/// Drops every schema the run created.
pub(crate) async fn drop_schemas(place: &Place) -> Res<()> {
    let schemas = std::mem::take(&mut *lock(&place.schemas));
    if schemas.is_empty() {
        return Ok(());
    }
    let url = place.pg_url().to_string();
    let mut conn = tickbox::Postgres::connect(&url).await?;
    for schema in schemas {
        conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
            .await?;
    }
    Ok(())
}
