//! The SQLite backend: one database file per module, WAL mode, through
//! diesel-async's `SyncConnectionWrapper`.
//!
//! SQLite has no notifications: commits made by another process are found by
//! the bus's periodic outbox scan (`BusBuilder::scan_interval`).

use crate::error::Error;
use crate::redact::redact_url;
use crate::store::backend::Backend;
use crate::store::contract::Store;
use crate::store::journal::JournalStatements;
use crate::store::migrations::{refuse_clashing_versions, refuse_newer_migrations};
use crate::store::pool::{build_pool, checkout, close_idle, discard};
use crate::store::settings::{MigrationSet, StoreSettings, WakeupChannel};
use crate::store::sql::Sql;
use crate::store::Row;
use diesel::connection::{
    AnsiTransactionManager, Connection, SimpleConnection, TransactionManager,
};
use diesel::QueryResult;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

mod catalog;
mod dead_letters;
mod ids;
mod inbox;
mod journal;
mod ordering;
mod outbox;
mod retention;
mod scratch;
mod subscriptions;

/// The embedded SQLite backend (the default). A module's database is one file;
/// nothing needs to be installed.
///
/// Connections run with `journal_mode=WAL`, `synchronous=NORMAL` (a process
/// crash loses no committed transaction; a power cut may lose the last few,
/// data and messages together) and a busy timeout, and write transactions
/// begin with `BEGIN IMMEDIATE`, so concurrent writers queue instead of
/// failing.
#[derive(Debug, Clone, Copy)]
pub struct Sqlite;

/// The connection SQLite handlers and transactions receive.
pub type SqliteConnection = SyncConnectionWrapper<diesel::SqliteConnection>;

static MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");

/// The migrations of a module's effects journal, in its companion file.
static JOURNAL_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite-effects");

/// The companion file holding a module's effects journal is named after
/// the module's file, with this added.
const JOURNAL_SUFFIX: &str = "-effects";

/// Connections in a journal's pool: its transactions are a few statements
/// long, and SQLite takes one writer at a time anyway.
const JOURNAL_POOL_SIZE: usize = 2;

/// Set on every connection of a module's pool.
const CONNECTION_PRAGMAS: &str =
    "PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;";

/// How long opening a module waits for other processes opening or
/// migrating the same file.
const OPEN_BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Sets the file up for a pool (WAL) and, if `migrate`, runs `migrations`
/// (tickbox's) and then the application's.
fn prepare_file(
    path: &str,
    migrations: MigrationSet,
    migrate: bool,
    app_migrations: Option<MigrationSet>,
    module: &str,
) -> crate::error::Result<()> {
    let bad_url = |reason: String| Error::BadDatabaseUrl {
        module: module.to_string(),
        url: redact_url(path),
        reason,
    };
    let mut conn = diesel::SqliteConnection::establish(path).map_err(|e| bad_url(e.to_string()))?;
    conn.batch_execute(CONNECTION_PRAGMAS)
        .and_then(|()| conn.batch_execute("PRAGMA journal_mode = WAL;"))
        .map_err(|e| bad_url(e.to_string()))?;
    if !migrate {
        return Ok(());
    }
    // One process migrates at a time: the write lock BEGIN IMMEDIATE takes
    // is held across every migration (each runs in a savepoint), so a
    // process starting beside another waits for it (the busy timeout) and
    // then finds them applied.
    conn.immediate_transaction(|conn| {
        conn.run_pending_migrations(migrations)
            .map(drop)
            .map_err(|e| Error::Migration {
                module: module.to_string(),
                reason: e.to_string(),
            })?;
        refuse_newer_migrations(conn, &migrations, module)?;
        if let Some(app) = app_migrations {
            refuse_clashing_versions::<diesel::sqlite::Sqlite>(&app, module)?;
            conn.run_pending_migrations(app)
                .map(drop)
                .map_err(|e| Error::Migration {
                    module: module.to_string(),
                    reason: format!("the application's migrations: {e}"),
                })?;
        }
        Ok(())
    })
}

/// Prepares the file at `path` (see [`prepare_file`]) on a blocking thread,
/// then opens a pool of connections to it.
async fn open_file(
    settings: &StoreSettings,
    path: String,
    migrations: MigrationSet,
    app_migrations: Option<MigrationSet>,
) -> crate::error::Result<Pool<SqliteConnection>> {
    let migrate = settings.migrate;
    let migrate_path = path.clone();
    let module = settings.module.clone();
    tokio::task::spawn_blocking(move || {
        // Some lock waits return "database is locked" at once instead of
        // waiting out the busy timeout (switching a new file to WAL while
        // another process does the same): tried again for as long.
        let deadline = std::time::Instant::now() + OPEN_BUSY_TIMEOUT;
        loop {
            match prepare_file(&migrate_path, migrations, migrate, app_migrations, &module) {
                Err(e) if is_busy(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                done => return done,
            }
        }
    })
    .await
    .map_err(|e| Error::Task {
        what: format!("opening module `{}`", settings.module),
        reason: e.to_string(),
    })??;
    build_pool(
        settings,
        path,
        Box::new(|url| {
            Box::pin(async move {
                let mut conn = SqliteConnection::establish(url).await?;
                conn.batch_execute(CONNECTION_PRAGMAS)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        }),
    )
}

/// Whether opening failed only because another connection held a lock.
fn is_busy(error: &Error) -> bool {
    let reason = match error {
        Error::BadDatabaseUrl { reason, .. } | Error::Migration { reason, .. } => reason.as_str(),
        Error::Database(diesel::result::Error::DatabaseError(_, info)) => info.message(),
        _ => return false,
    };
    Sqlite::TRANSIENT_MESSAGES
        .iter()
        .any(|busy| reason.contains(busy))
}

/// Accepts a plain path or a `sqlite://`/`sqlite:` URL; refuses in-memory
/// databases, which a pool of connections cannot share.
fn database_path(settings: &StoreSettings) -> crate::error::Result<String> {
    let url = settings.url.expose().trim();
    let path = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))
        .unwrap_or(url);
    let bad = |reason: &str| Error::BadDatabaseUrl {
        module: settings.module.clone(),
        url: settings.url.redacted(),
        reason: reason.to_string(),
    };
    if path.is_empty() {
        return Err(bad("the path is empty"));
    }
    if path.contains("://") {
        return Err(bad(
            "not an SQLite path; use a file path, or enable the `postgres` feature and the Postgres backend for a postgres:// URL",
        ));
    }
    if path == ":memory:" || path.contains("mode=memory") {
        return Err(bad(
            "an in-memory database cannot be shared by a connection pool; use a file",
        ));
    }
    Ok(path.to_string())
}

/// Refuses a database file whose directory does not exist, naming the
/// directory: SQLite would only say that it is "unable to open database
/// file".
fn refuse_missing_directory(module: &str, path: &str) -> crate::error::Result<()> {
    let Some(directory) = std::path::Path::new(path)
        .parent()
        .filter(|directory| !directory.as_os_str().is_empty())
    else {
        return Ok(());
    };
    match std::fs::metadata(directory) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A path shown as typed shows its directory too (`data`, a word
            // that alone would be hidden); a hidden one only what the
            // directory alone may show.
            let shown = redact_url(path);
            let directory = directory.to_string_lossy();
            Err(Error::MissingDirectory {
                module: module.to_string(),
                directory: if shown == path.trim() {
                    directory.into_owned()
                } else {
                    redact_url(&directory)
                },
                path: shown,
            })
        }
        _ => Ok(()),
    }
}

impl Backend for Sqlite {
    const NAME: &'static str = "sqlite";
    const DEFAULT_POOL_SIZE: usize = 4;
    type Connection = SqliteConnection;
    type Diesel = diesel::sqlite::Sqlite;
}

impl Store for Sqlite {
    type Conn = SqliteConnection;
    type Pool = Pool<SqliteConnection>;
    type Pooled = Object<SqliteConnection>;

    const ONE_WRITER: bool = true;
    // SQLite reports a lock held by another connection only in words.
    const TRANSIENT_MESSAGES: &'static [&'static str] = &["database is locked", "database is busy"];

    async fn open(
        settings: &StoreSettings,
    ) -> crate::error::Result<(Self::Pool, Option<WakeupChannel>)> {
        let path = database_path(settings)?;
        refuse_missing_directory(&settings.module, &path)?;
        if !settings.migrate && !std::path::Path::new(&path).exists() {
            return Err(Error::BadDatabaseUrl {
                module: settings.module.clone(),
                url: redact_url(&path),
                reason: "no database file there".into(),
            });
        }
        let pool = open_file(
            settings,
            path,
            MigrationSet(&MIGRATIONS),
            settings.app_migrations,
        )
        .await?;
        // SQLite has no notifications: another process's commits are found
        // by the bus's periodic scan.
        Ok((pool, None))
    }

    async fn open_journal(settings: &StoreSettings) -> crate::error::Result<Option<Self::Pool>> {
        let path = format!("{}{JOURNAL_SUFFIX}", database_path(settings)?);
        if !settings.migrate && !std::path::Path::new(&path).exists() {
            // Never made: no effect was ever recorded for this module.
            return Ok(None);
        }
        let settings = StoreSettings {
            pool_size: JOURNAL_POOL_SIZE,
            ..settings.clone()
        };
        let pool = open_file(&settings, path, MigrationSet(&JOURNAL_MIGRATIONS), None).await?;
        if !settings.migrate {
            // The file may have just been made by a process that has not yet
            // migrated it (its migrations commit as one transaction): until
            // the table is there, there is no journal yet.
            let mut conn = checkout(&pool).await.map_err(|reason| Error::Pool {
                module: settings.module.clone(),
                reason,
            })?;
            if !Self::has_journal(&mut conn).await? {
                return Ok(None);
            }
        }
        Ok(Some(pool))
    }

    fn close(pool: &Self::Pool) {
        pool.close();
    }

    fn discard(conn: Self::Pooled) {
        discard(conn);
    }

    fn close_idle(pool: &Self::Pool) {
        close_idle(pool);
    }

    async fn checkout(pool: &Self::Pool) -> Result<Self::Pooled, String> {
        checkout(pool).await
    }

    async fn begin(conn: &mut Self::Conn) -> QueryResult<()> {
        conn.spawn_blocking(|c| AnsiTransactionManager::begin_transaction_sql(c, "BEGIN IMMEDIATE"))
            .await
    }

    async fn begin_read(conn: &mut Self::Conn) -> QueryResult<()> {
        conn.spawn_blocking(|c| AnsiTransactionManager::begin_transaction_sql(c, "BEGIN DEFERRED"))
            .await
    }

    async fn commit(conn: &mut Self::Conn) -> QueryResult<()> {
        conn.spawn_blocking(AnsiTransactionManager::commit_transaction)
            .await
    }

    async fn rollback(conn: &mut Self::Conn) -> QueryResult<()> {
        conn.spawn_blocking(AnsiTransactionManager::rollback_transaction)
            .await
    }

    async fn notify(_: &mut Self::Conn, _: &str) -> QueryResult<()> {
        // Never called: `open` gives SQLite modules no wake-up channel.
        Ok(())
    }

    fn listen(
        _: WakeupChannel,
        _: std::sync::Arc<str>,
        _: impl Fn() + Send + Sync + 'static,
    ) -> Option<impl std::future::Future<Output = ()> + Send + 'static> {
        None::<std::future::Ready<()>>
    }

    async fn load<R: Row>(conn: &mut Self::Conn, sql: Sql) -> QueryResult<Vec<R>> {
        diesel_async::RunQueryDsl::load(sql, conn).await
    }

    async fn execute(conn: &mut Self::Conn, sql: Sql) -> QueryResult<usize> {
        diesel_async::RunQueryDsl::execute(sql, conn).await
    }
}
