//! The MariaDB and MySQL backend: diesel's `Mysql` backend through
//! diesel-async's `AsyncMysqlConnection` (mysql_async, pure Rust, no
//! libmysqlclient) with a pool; a module owns a database.
//!
//! The servers have no notifications: as on SQLite, commits made by another
//! process are found by the bus's periodic outbox scan
//! (`BusBuilder::scan_interval`).

use crate::error::Error;
use crate::redact::redact_url;
use crate::store::backend::{Backend, Schemas};
use crate::store::contract::Store;
use crate::store::journal::refuse_missing_journal;
use crate::store::migrations::{refuse_clashing_versions, refuse_newer_migrations};
use crate::store::pool::{build_pool, checkout, close_idle, discard};
use crate::store::settings::{StoreSettings, WakeupChannel};
use crate::store::sql::Sql;
use crate::store::Row;
use diesel::QueryResult;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::pooled_connection::deadpool::{Object, Pool};
use diesel_async::{
    AnsiTransactionManager, AsyncMysqlConnection, SimpleAsyncConnection, TransactionManager,
};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use std::time::Duration;

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
mod types;

/// The MariaDB (≥ 10.6) and MySQL (≥ 8.0) backend. A module's tables live in
/// a database of their own: the one the module names
/// ([`ModuleBuilder::schema`](crate::ModuleBuilder::schema), created if
/// missing), or else the URL's.
///
/// What differs from PostgreSQL:
///
/// - **No notifications.** A commit wakes the buses of its own process in
///   memory; another process's commits are found by the bus's periodic
///   scan (`BusBuilder::scan_interval`), as on SQLite.
/// - **READ COMMITTED**, set on every connection (the servers' default is
///   REPEATABLE READ, where the inbox's insert and the claims take gap
///   locks). A concurrent duplicate delivery waits on the inbox's primary
///   key, then skips. Deadlocks (1213) and lock wait timeouts (1205) are
///   transient: the delivery is tried again.
/// - **Row-based binary log.** Claims read `FOR UPDATE SKIP LOCKED`, which
///   a server logging statements (`binlog_format` `STATEMENT` or `MIXED`)
///   reports as unsafe on every claim: set `binlog_format=ROW` where a
///   binary log is on.
/// - **Text keys are bytes** (`VARBINARY`): names compare exactly, as on
///   the other backends, and have widths — topics, module, handler and
///   publisher names up to 255 bytes, ordering keys up to 512. A longer one
///   is refused with an error naming it, never cut.
/// - Ids are `BINARY(16)`; times are microseconds in `BIGINT`, as
///   elsewhere. A session runs in strict mode, in `utf8mb4`, at UTC.
/// - The server's own `sql_mode` and isolation level are replaced on
///   tickbox's connections only (a handler's queries run on them too); its
///   lock wait timeout (`innodb_lock_wait_timeout`) is kept.
#[derive(Debug, Clone, Copy)]
pub struct Mysql;

impl Mysql {
    /// Opens one connection the way a module's pool does: the URL's TLS
    /// settings (`ssl-mode`, `ssl-ca`, `ssl-cert`, `ssl-key`, as the `mysql`
    /// client spells them; see the crate's TLS section) and a failure that
    /// says why (a certificate's fault in plain words). For an
    /// application's own connections beside its modules'.
    pub async fn connect(url: &str) -> diesel::ConnectionResult<AsyncMysqlConnection> {
        establish(url.trim()).await
    }
}

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/mysql");

/// Connections in a module's journal pool (see [`Store::open_journal`]).
const JOURNAL_POOL_SIZE: usize = 2;

/// Set on every connection: READ COMMITTED (no gap locks on the inbox's
/// insert or the claims), strict mode (a text longer than its column is an
/// error, never cut), and none of the modes that would change how tickbox's
/// statements read (`ANSI_QUOTES`, `PIPES_AS_CONCAT`…).
const SESSION_SETUP: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED; \
     SET SESSION sql_mode = 'STRICT_TRANS_TABLES,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'";

/// How long the server lets a session idle inside a transaction, or run
/// one statement, beyond the module's longest transaction deadline: the
/// client gives up first, and a session it abandoned (its connection gone
/// quiet) is ended by the server soon after, releasing its locks.
const SERVER_MARGIN: Duration = Duration::from_secs(5);

/// TCP keepalive, unless the URL says (`tcp_keepalive`, in milliseconds):
/// the kernel probes a connection idle this long, so a server that vanished
/// without a word is found out sooner than after the system's two hours.
const KEEPALIVE_IDLE_MS: &str = "10000";

/// The server's limits on a session of a module's pools, so that a client
/// that vanished does not hold locks for long: a transaction idle on the
/// server for longer than any of the module's transactions may take (plus
/// [`SERVER_MARGIN`]) is rolled back and its session ended
/// (`idle_transaction_timeout`), and a statement running that long is
/// stopped (`max_statement_time`). MariaDB's variables, added to the end
/// of [`SESSION_SETUP`]'s last `SET` in a comment only MariaDB runs
/// (`/*M! … */`): MySQL 8 has no such limit on an idle transaction, and
/// ends an abandoned session only at its `wait_timeout`.
fn session_limits(settings: &StoreSettings) -> String {
    let limit = (settings.longest_transaction + SERVER_MARGIN)
        .as_secs_f64()
        .ceil() as u64;
    format!(
        " /*M! , SESSION idle_transaction_timeout = {limit}, SESSION max_statement_time = {limit} */"
    )
}

/// How long a connection attempt may take: a server that accepts but never
/// answers would otherwise hold it for ever (mysql_async has no timeout of
/// its own).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest database name the servers take, in characters.
const MAX_DATABASE_NAME: usize = 64;

/// The widths the migrations gave tickbox's keyed texts, in bytes.
pub(crate) const NAME_BYTES: usize = 255;
/// The width of an ordering key, in bytes.
pub(crate) const KEY_BYTES: usize = 512;

/// Refuses `value` (what `what` names) when it is longer than its column
/// (`limit` bytes): the server would refuse it with "Data too long", which
/// names the column but not the value; the error here names both.
pub(crate) fn check_width(what: &str, value: &str, limit: usize) -> QueryResult<()> {
    if value.len() <= limit {
        return Ok(());
    }
    let shown: String = value.chars().take(40).collect();
    Err(diesel::result::Error::QueryBuilderError(
        format!(
            "{what} `{shown}…` is {} bytes long; MariaDB and MySQL keep at most {limit}",
            value.len()
        )
        .into(),
    ))
}

/// Where a module's tables live: the server, and the database on it.
#[derive(Clone)]
struct Place {
    /// The server's URL without a database, for creating the module's.
    server: String,
    /// The URL of the module's database, for its pools.
    module: String,
    /// The database's name.
    database: String,
}

impl Place {
    /// The module's place from its settings: the database
    /// [`StoreSettings::schema`] names, or else the URL's. The URLs keep
    /// the connection on TCP (`prefer_socket=false`) unless the URL says
    /// otherwise: mysql_async would switch a connection to a local server
    /// over to its Unix socket, around any proxy the URL names.
    fn of(settings: &StoreSettings) -> crate::error::Result<Place> {
        let bad = |reason: String| Error::BadDatabaseUrl {
            module: settings.module.clone(),
            url: settings.url.redacted(),
            reason,
        };
        let given = settings.url.expose().trim();
        if !given.starts_with("mysql://") {
            return Err(bad(
                "a MariaDB or MySQL URL starts with mysql:// (for both servers)".into(),
            ));
        }
        let mut url = url::Url::parse(given).map_err(|e| bad(e.to_string()))?;
        let database = match &settings.schema {
            Some(schema) => check_database_name(&settings.module, schema)?,
            None => {
                let path = url.path().trim_start_matches('/');
                let path = percent_decode(path);
                if path.is_empty() {
                    return Err(bad(
                        "the URL names no database (mysql://host/DATABASE), and the module \
                         names none (ModuleBuilder::schema)"
                            .into(),
                    ));
                }
                path
            }
        };
        if !url.query_pairs().any(|(key, _)| key == "prefer_socket") {
            url.query_pairs_mut().append_pair("prefer_socket", "false");
        }
        if !url.query_pairs().any(|(key, _)| key == "tcp_keepalive") {
            url.query_pairs_mut()
                .append_pair("tcp_keepalive", KEEPALIVE_IDLE_MS);
        }
        let mut server = url.clone();
        server.set_path("");
        url.set_path(&format!("/{database}"));
        Ok(Place {
            server: server.to_string(),
            module: url.to_string(),
            database,
        })
    }
}

/// A database name's `%XX` escapes read back as characters.
fn percent_decode(text: &str) -> String {
    url::form_urlencoded::parse(format!("d={}", text.replace('+', "%2B")).as_bytes())
        .next()
        .map(|(_, value)| value.into_owned())
        .unwrap_or_default()
}

/// Checks a database name a module gives: 1–64 characters of a-z, 0-9 and
/// `_`, not starting with a digit, as for a PostgreSQL schema.
fn check_database_name(module: &str, name: &str) -> crate::error::Result<String> {
    let valid = !name.is_empty()
        && name.len() <= MAX_DATABASE_NAME
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(name.to_owned())
    } else {
        Err(Error::Config(format!(
            "module `{module}`: database name `{name}` must be 1-{MAX_DATABASE_NAME} characters \
             of a-z, 0-9 and _, not starting with a digit"
        )))
    }
}

/// `name` as a quoted identifier: in backquotes, any backquote doubled.
fn quote_identifier(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// The name of the server-wide lock taken while a module's database is
/// made or migrated (the servers' named locks span every database).
fn migration_lock(database: &str) -> String {
    format!("tickbox.migrate.{database}")
}

/// Opens a connection within [`CONNECT_TIMEOUT`], sorting failures into a
/// server out of reach and a URL, login or database the server refused.
async fn connect(
    settings: &StoreSettings,
    url: &str,
) -> crate::error::Result<AsyncMysqlConnection> {
    let failed = |reason: String| {
        if reason.contains("os error") || reason.contains("Input/output error") {
            Error::DatabaseUnreachable {
                module: settings.module.clone(),
                address: server_address(url),
                reason,
            }
        } else {
            Error::BadDatabaseUrl {
                module: settings.module.clone(),
                url: redact_url(url),
                reason,
            }
        }
    };
    match tokio::time::timeout(CONNECT_TIMEOUT, establish(url)).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(error)) => Err(failed(error.to_string())),
        Err(_) => Err(Error::DatabaseUnreachable {
            module: settings.module.clone(),
            address: server_address(url),
            reason: format!(
                "the server did not complete the connection within {CONNECT_TIMEOUT:?}"
            ),
        }),
    }
}

/// Opens a connection to `url` as diesel-async's `establish` does, but
/// with the TLS the URL asks for (`ssl-mode`, `ssl-ca`, `ssl-cert`,
/// `ssl-key`: [`crate::tls::mysql`]), a failed handshake told in plain
/// words; says whether the session is encrypted.
pub(crate) async fn establish_reporting(
    url: &str,
) -> diesel::ConnectionResult<(AsyncMysqlConnection, bool)> {
    use diesel::ConnectionError;
    let (client_url, tls) =
        crate::tls::mysql::split_url(url).map_err(ConnectionError::InvalidConnectionUrl)?;
    let opts = mysql_async::Opts::from_url(&client_url)
        .map_err(|e| ConnectionError::InvalidConnectionUrl(e.to_string()))?;
    // As diesel-async's own `establish`: its statement cache, not
    // mysql_async's, and the rows a statement matched, not only those it
    // changed.
    let builder = mysql_async::OptsBuilder::from_opts(opts)
        .stmt_cache_size(0)
        .client_found_rows(true);
    #[cfg(feature = "tls")]
    let builder = builder
        .ssl_opts(crate::tls::mysql::ssl_opts(&tls).map_err(ConnectionError::BadConnection)?);
    let conn = mysql_async::Conn::new(builder).await.map_err(|error| {
        #[cfg(feature = "tls")]
        if let Some(reason) = crate::tls::explain_handshake_failure(&error, &tls.settings) {
            return ConnectionError::BadConnection(format!("{}: {reason}", server_address(url)));
        }
        match error {
            mysql_async::Error::Url(e) => ConnectionError::InvalidConnectionUrl(e.to_string()),
            mysql_async::Error::Driver(mysql_async::DriverError::NoClientSslFlagFromServer) => {
                ConnectionError::BadConnection(format!(
                    "{}: the URL asks for TLS (ssl-mode={}), and the server offers none",
                    server_address(url),
                    tls.mode.name()
                ))
            }
            other => ConnectionError::BadConnection(other.to_string()),
        }
    })?;
    tracing::trace!(
        address = %server_address(url),
        ssl_mode = tls.mode.name(),
        encrypted = tls.mode.encrypts(),
        "MariaDB/MySQL session opened"
    );
    // A mode that encrypts refuses a session in clear; the others never
    // ask for TLS.
    let encrypted = tls.mode.encrypts();
    Ok((AsyncMysqlConnection::try_from(conn).await?, encrypted))
}

/// Opens a connection as [`establish_reporting`] does.
pub(crate) async fn establish(url: &str) -> diesel::ConnectionResult<AsyncMysqlConnection> {
    establish_reporting(url).await.map(|(conn, _)| conn)
}

/// `host:port` of a URL, for an error.
fn server_address(url: &str) -> String {
    url::Url::parse(url)
        .ok()
        .map(|url| {
            format!(
                "{}:{}",
                url.host_str().unwrap_or("localhost"),
                url.port().unwrap_or(3306)
            )
        })
        .unwrap_or_else(|| redact_url(url))
}

/// A pool of connections to `url`, each set up with [`SESSION_SETUP`] and
/// the [`session_limits`].
fn session_pool(
    settings: &StoreSettings,
    url: String,
) -> crate::error::Result<Pool<AsyncMysqlConnection>> {
    let limits = session_limits(settings);
    let module = settings.module.clone();
    build_pool(
        settings,
        url,
        Box::new(move |url| {
            let setup = format!("{SESSION_SETUP}{limits}");
            let module = module.clone();
            Box::pin(async move {
                let (mut conn, encrypted) = establish_reporting(url).await?;
                crate::tls::report_encryption(&module, "mysql", encrypted);
                conn.batch_execute(&setup)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        }),
    )
}

/// The result of `GET_LOCK`: 1 when taken.
#[derive(diesel::QueryableByName)]
struct Locked {
    /// 1 taken, 0 timed out, NULL on an error.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::BigInt>)]
    locked: Option<i64>,
}

/// Takes the server-wide lock `name`, waiting up to `wait`; an error if it
/// was not taken.
fn take_lock(
    conn: &mut AsyncConnectionWrapper<AsyncMysqlConnection>,
    name: &str,
    wait: Duration,
) -> QueryResult<()> {
    let locked: Locked = diesel::RunQueryDsl::get_result(
        diesel::sql_query("SELECT CAST(GET_LOCK(?, ?) AS SIGNED) AS locked")
            .bind::<diesel::sql_types::Text, _>(name)
            .bind::<diesel::sql_types::BigInt, _>(wait.as_secs().max(1) as i64),
        conn,
    )?;
    if locked.locked == Some(1) {
        Ok(())
    } else {
        Err(diesel::result::Error::QueryBuilderError(
            format!("the lock `{name}` was held by another connection for {wait:?}").into(),
        ))
    }
}

/// Gives the server-wide lock `name` back.
fn release_lock(
    conn: &mut AsyncConnectionWrapper<AsyncMysqlConnection>,
    name: &str,
) -> QueryResult<()> {
    diesel::RunQueryDsl::execute(
        diesel::sql_query("DO RELEASE_LOCK(?)").bind::<diesel::sql_types::Text, _>(name),
        conn,
    )
    .map(drop)
}

/// On a blocking thread: makes the module's database if missing and runs
/// the migrations, tickbox's then the application's, under the database's
/// migration lock, so that processes starting together migrate it once.
/// The servers commit each DDL statement on its own, so the lock is also
/// what keeps a process attaching meanwhile from seeing a half-made
/// database ([`wait_for_migrations`]).
fn migrate(
    conn: AsyncMysqlConnection,
    place: &Place,
    settings: &StoreSettings,
) -> crate::error::Result<()> {
    use diesel::connection::SimpleConnection;
    let module = settings.module.clone();
    let migration_error = |reason: String| Error::Migration {
        module: module.clone(),
        reason,
    };
    let mut conn: AsyncConnectionWrapper<AsyncMysqlConnection> = conn.into();
    let lock = migration_lock(&place.database);
    take_lock(&mut conn, &lock, settings.deadlines.migration)
        .map_err(|e| migration_error(e.to_string()))?;
    let migrated = (|| {
        let database = quote_identifier(&place.database);
        SimpleConnection::batch_execute(
            &mut conn,
            &format!(
            "CREATE DATABASE IF NOT EXISTS {database} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin; \
             USE {database}"
        ),
        )
        .map_err(|e| migration_error(e.to_string()))?;
        conn.run_pending_migrations(MIGRATIONS)
            .map_err(|e| migration_error(e.to_string()))?;
        refuse_newer_migrations(&mut conn, &MIGRATIONS, &module)?;
        if let Some(app) = settings.app_migrations {
            refuse_clashing_versions::<diesel::mysql::Mysql>(&app, &module)?;
            conn.run_pending_migrations(app)
                .map_err(|e| migration_error(format!("the application's migrations: {e}")))?;
        }
        Ok::<_, Error>(())
    })();
    let released = release_lock(&mut conn, &lock);
    migrated?;
    released.map_err(|e| migration_error(e.to_string()))
}

/// For a process that attaches without migrating: waits until no process
/// is making or migrating the module's database (its migration lock is
/// free), so that the database is seen as it was before or after, never
/// half made.
async fn wait_for_migrations(
    conn: AsyncMysqlConnection,
    place: &Place,
    settings: &StoreSettings,
) -> crate::error::Result<()> {
    let lock = migration_lock(&place.database);
    let wait = settings.deadlines.migration;
    let module = settings.module.clone();
    tokio::task::spawn_blocking(move || {
        let mut conn: AsyncConnectionWrapper<AsyncMysqlConnection> = conn.into();
        take_lock(&mut conn, &lock, wait)?;
        release_lock(&mut conn, &lock)
    })
    .await
    .map_err(|e| Error::Task {
        what: format!("opening module `{module}`"),
        reason: e.to_string(),
    })?
    .map_err(Error::from)
}

impl Schemas for Mysql {}

impl Backend for Mysql {
    const NAME: &'static str = "mysql";
    const DEFAULT_POOL_SIZE: usize = 8;
    type Connection = AsyncMysqlConnection;
    type Diesel = diesel::mysql::Mysql;
}

impl Store for Mysql {
    type Conn = AsyncMysqlConnection;
    type Pool = Pool<AsyncMysqlConnection>;
    type Pooled = Object<AsyncMysqlConnection>;

    const ONE_WRITER: bool = false;
    // A lock wait timeout (1205) comes without a code diesel keeps, and a
    // connection lost mid-statement as mysql_async's I/O error.
    const TRANSIENT_MESSAGES: &'static [&'static str] =
        &["Lock wait timeout exceeded", "Input/output error"];

    async fn open(
        settings: &StoreSettings,
    ) -> crate::error::Result<(Self::Pool, Option<WakeupChannel>)> {
        let place = Place::of(settings)?;
        let deadline = settings.deadlines.migration;
        let opening = async {
            if settings.migrate {
                let conn = connect(settings, &place.server).await?;
                let (place, settings) = (place.clone(), settings.clone());
                // Synchronous, for diesel's migration harness (its async
                // one panics inside actix).
                tokio::task::spawn_blocking(move || migrate(conn, &place, &settings))
                    .await
                    .map_err(|e| Error::Task {
                        what: "migrating".into(),
                        reason: e.to_string(),
                    })?
            } else {
                let conn = connect(settings, &place.module).await?;
                wait_for_migrations(conn, &place, settings).await
            }
        };
        tokio::time::timeout(deadline, opening)
            .await
            .map_err(|_| Error::Deadline {
                module: settings.module.clone(),
                operation: "opening the database (connecting and migrating)".into(),
                deadline,
            })??;
        let pool = session_pool(settings, place.module)?;
        // No notifications: another process's commits are found by the
        // bus's periodic scan.
        Ok((pool, None))
    }

    async fn open_journal(settings: &StoreSettings) -> crate::error::Result<Option<Self::Pool>> {
        // The journal is a table of the module's database, made by its
        // migrations; its own few connections keep journal entries from
        // waiting for the connections the deliveries hold.
        let place = Place::of(settings)?;
        let settings = StoreSettings {
            pool_size: JOURNAL_POOL_SIZE,
            ..settings.clone()
        };
        let pool = session_pool(&settings, place.module)?;
        if !settings.migrate {
            // Attached: a database an older tickbox migrated has no journal.
            refuse_missing_journal::<Self>(&pool, &settings).await?;
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
        AnsiTransactionManager::begin_transaction(conn).await
    }

    async fn begin_read(conn: &mut Self::Conn) -> QueryResult<()> {
        AnsiTransactionManager::begin_transaction_sql(conn, "START TRANSACTION READ ONLY").await
    }

    async fn commit(conn: &mut Self::Conn) -> QueryResult<()> {
        AnsiTransactionManager::commit_transaction(conn).await
    }

    async fn rollback(conn: &mut Self::Conn) -> QueryResult<()> {
        AnsiTransactionManager::rollback_transaction(conn).await
    }

    async fn notify(_: &mut Self::Conn, _: &str) -> QueryResult<()> {
        // Never called: `open` gives MySQL modules no wake-up channel.
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

/// Runs `work` in a transaction of its own (a savepoint inside one already
/// open): committed when it succeeds, rolled back when it fails.
macro_rules! in_transaction {
    ($conn:expr, $work:expr) => {{
        use $crate::store::contract::Store as _;
        $crate::store::mysql::Mysql::begin($conn).await?;
        let done = $work;
        match done {
            Ok(value) => {
                $crate::store::mysql::Mysql::commit($conn).await?;
                Ok(value)
            }
            Err(error) => {
                // The failure is what the caller is told; the rollback's
                // own failure leaves the connection broken, and the pool
                // discards it.
                let _ = $crate::store::mysql::Mysql::rollback($conn).await;
                Err(error)
            }
        }
    }};
}
pub(crate) use in_transaction;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::redact::SecretUrl;

    fn settings(url: &str, schema: Option<&str>) -> StoreSettings {
        StoreSettings {
            module: "orders".into(),
            url: SecretUrl::new(url),
            schema: schema.map(str::to_owned),
            pool_size: 1,
            checkout_timeout: Duration::from_secs(1),
            deadlines: Default::default(),
            longest_transaction: Duration::from_secs(1),
            migrate: true,
            app_migrations: None,
        }
    }

    #[test]
    fn the_module_names_its_database_or_the_url_does() {
        let place = Place::of(&settings("mysql://root@db:3306", Some("shop_orders"))).unwrap();
        assert_eq!(place.database, "shop_orders");
        assert_eq!(
            place.module,
            "mysql://root@db:3306/shop_orders?prefer_socket=false&tcp_keepalive=10000"
        );
        assert_eq!(
            place.server,
            "mysql://root@db:3306?prefer_socket=false&tcp_keepalive=10000"
        );
        // What the URL says is kept.
        let url = "mysql://root@db/shop?prefer_socket=true&tcp_keepalive=2000";
        let place = Place::of(&settings(url, None)).unwrap();
        assert_eq!(place.database, "shop");
        assert_eq!(place.module, url);
    }

    #[test]
    fn a_url_without_a_database_or_of_another_scheme_is_refused() {
        assert!(Place::of(&settings("mysql://root@db:3306", None)).is_err());
        assert!(Place::of(&settings("mysql://root@db:3306/", None)).is_err());
        assert!(Place::of(&settings("mariadb://root@db/shop", None)).is_err());
        assert!(Place::of(&settings("mysql://root@db", Some("Shop"))).is_err());
        assert!(Place::of(&settings("mysql://root@db", Some(&"a".repeat(65)))).is_err());
    }

    #[test]
    fn a_text_longer_than_its_column_is_refused_with_its_name() {
        assert!(check_width("topic", &"t".repeat(255), NAME_BYTES).is_ok());
        let error = check_width("topic", &"t".repeat(256), NAME_BYTES)
            .unwrap_err()
            .to_string();
        assert!(error.contains("topic `tttt"), "{error}");
        assert!(error.contains("256 bytes"), "{error}");
        // Bytes, not characters: 128 two-byte characters are 256 bytes.
        assert!(check_width("handler", &"é".repeat(128), NAME_BYTES).is_err());
    }

    #[test]
    fn identifiers_are_backquoted() {
        assert_eq!(quote_identifier("shop"), "`shop`");
        assert_eq!(quote_identifier("a`b"), "`a``b`");
    }
}
