//! The PostgreSQL backend: `AsyncPgConnection` (tokio-postgres, no libpq)
//! with a pool; a module owns a database or a schema.

use crate::backend::{
    build_pool, checkout, claim_with, has_tables_with, shared_queries, sweep_with, Backend,
    StoreSettings,
};
use crate::error::{redact_url, Error};
use crate::schema::{tickbox_outbox, OutboxRow};
use diesel::QueryResult;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{
    AnsiTransactionManager, AsyncConnection, AsyncPgConnection, SimpleAsyncConnection,
    TransactionManager,
};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

/// The PostgreSQL backend, for production. A module's tables live in its own
/// database, or in its own schema when the module sets one. Transactions run
/// at READ COMMITTED, where a concurrent duplicate delivery waits on the
/// inbox's unique index and then skips.
#[derive(Debug, Clone, Copy)]
pub struct Postgres;

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// Taken while migrating, so processes starting together do not race.
const MIGRATION_LOCK: i64 = 0x0074_6963_6b62_6f78; // "tickbox"

fn check_url(settings: &StoreSettings) -> crate::Result<()> {
    let url = settings.url.trim();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(())
    } else {
        Err(Error::BadDatabaseUrl {
            module: settings.module.clone(),
            url: redact_url(url),
            reason: "a PostgreSQL URL starts with postgres:// or postgresql://".into(),
        })
    }
}

/// Checks a schema name so it can be written into SQL unquoted-safe.
fn check_schema(settings: &StoreSettings) -> crate::Result<Option<String>> {
    let Some(schema) = &settings.schema else {
        return Ok(None);
    };
    let valid = !schema.is_empty()
        && schema.len() <= 63
        && !schema.starts_with(|c: char| c.is_ascii_digit())
        && schema
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(Some(schema.clone()))
    } else {
        Err(Error::Config(format!(
            "module `{}`: schema name `{schema}` must be 1-63 characters of a-z, 0-9 and _, not starting with a digit",
            settings.module
        )))
    }
}

impl Backend for Postgres {
    type Connection = AsyncPgConnection;
    type Pool = Pool<AsyncPgConnection>;
    type Pooled = Object<AsyncPgConnection>;

    const NAME: &'static str = "postgres";
    const DEFAULT_POOL_SIZE: usize = 8;
    const ONE_WRITER: bool = false;

    async fn open(settings: &StoreSettings) -> crate::Result<Self::Pool> {
        check_url(settings)?;
        let schema = check_schema(settings)?;
        let url = settings.url.trim().to_string();
        let module = settings.module.clone();
        let migrate_url = url.clone();
        let migrate_schema = schema.clone();
        let migrate = settings.migrate;
        tokio::task::spawn_blocking(move || {
            let mut conn: AsyncConnectionWrapper<AsyncPgConnection> =
                diesel::Connection::establish(&migrate_url).map_err(|e| Error::BadDatabaseUrl {
                    module: module.clone(),
                    url: redact_url(&migrate_url),
                    reason: e.to_string(),
                })?;
            let migration_error = |reason: String| Error::Migration {
                module: module.clone(),
                reason,
            };
            use diesel::connection::SimpleConnection;
            if !migrate {
                return Ok(());
            }
            SimpleConnection::batch_execute(
                &mut conn,
                &format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"),
            )
            .map_err(|e| migration_error(e.to_string()))?;
            let migrated = (|| {
                if let Some(schema) = &migrate_schema {
                    SimpleConnection::batch_execute(
                        &mut conn,
                        &format!(
                            "CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path TO {schema}"
                        ),
                    )?;
                }
                conn.run_pending_migrations(MIGRATIONS).map(drop)
            })();
            let unlocked = SimpleConnection::batch_execute(
                &mut conn,
                &format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"),
            );
            migrated.map_err(|e| migration_error(e.to_string()))?;
            unlocked.map_err(|e| migration_error(e.to_string()))
        })
        .await
        .map_err(|e| Error::Config(format!("opening module `{}`: {e}", settings.module)))??;

        build_pool(
            settings,
            url,
            Box::new(move |url| {
                let schema = schema.clone();
                Box::pin(async move {
                    let mut conn = AsyncPgConnection::establish(url).await?;
                    if let Some(schema) = schema {
                        conn.batch_execute(&format!("SET search_path TO {schema}"))
                            .await
                            .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                    }
                    Ok(conn)
                })
            }),
        )
    }

    fn close(pool: &Self::Pool) {
        pool.close();
    }

    async fn checkout(pool: &Self::Pool) -> Result<Self::Pooled, String> {
        checkout(pool).await
    }

    async fn begin(conn: &mut Self::Connection) -> QueryResult<()> {
        AnsiTransactionManager::begin_transaction(conn).await
    }

    async fn begin_read(conn: &mut Self::Connection) -> QueryResult<()> {
        AnsiTransactionManager::begin_transaction_sql(conn, "BEGIN READ ONLY").await
    }

    async fn commit(conn: &mut Self::Connection) -> QueryResult<()> {
        AnsiTransactionManager::commit_transaction(conn).await
    }

    async fn rollback(conn: &mut Self::Connection) -> QueryResult<()> {
        AnsiTransactionManager::rollback_transaction(conn).await
    }

    async fn insert_outbox(conn: &mut Self::Connection, rows: Vec<OutboxRow>) -> QueryResult<()> {
        use diesel_async::RunQueryDsl;
        if rows.is_empty() {
            return Ok(());
        }
        diesel::insert_into(tickbox_outbox::table)
            .values(rows)
            .execute(conn)
            .await
            .map(drop)
    }

    // SKIP LOCKED: rows another process is claiming right now are passed
    // over, not waited for.
    claim_with!(
        "UPDATE tickbox_outbox SET claimed_by = $1, claimed_until_us = $2 \
         WHERE id IN (SELECT id FROM tickbox_outbox \
             WHERE delivered_at_us IS NULL AND id > $3 \
             AND (claimed_until_us IS NULL OR claimed_until_us < $4 OR claimed_by = $1) \
             ORDER BY id LIMIT $5 FOR UPDATE SKIP LOCKED) \
         RETURNING id, topic, payload, correlation_id, causation_id, created_at_us, \
             claimed_by, claimed_until_us"
    );

    sweep_with!(
        inbox: "DELETE FROM tickbox_inbox WHERE message_id IN \
            (SELECT message_id FROM tickbox_inbox \
             WHERE message_id < $1 AND processed_at_us < $2 LIMIT $3) \
            AND processed_at_us < $4",
        outbox: "DELETE FROM tickbox_outbox WHERE id IN \
            (SELECT id FROM tickbox_outbox \
             WHERE id < $1 AND delivered_at_us < $2 LIMIT $3)",
    );

    has_tables_with!(
        "SELECT count(*) AS n FROM information_schema.tables \
         WHERE table_schema = current_schema() \
         AND table_name IN ('tickbox_outbox', 'tickbox_inbox', 'tickbox_dead_letters')"
    );

    shared_queries!();
}
