//! The PostgreSQL backend: `AsyncPgConnection` (tokio-postgres, no libpq)
//! with a pool; a module owns a database or a schema.
//!
//! Commits wake the buses of other processes through LISTEN/NOTIFY: a
//! transaction that publishes messages no bus of its own process will
//! deliver sends `pg_notify` on the outbox's channel just before COMMIT, and
//! a bus listens on that channel on a connection of its own.

use crate::error::Error;
use crate::redact::{redact_url, SecretUrl};
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
    AnsiTransactionManager, AsyncPgConnection, SimpleAsyncConnection, TransactionManager,
};
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use futures_util::StreamExt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

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

/// The PostgreSQL backend, for production. A module's tables live in its own
/// database, or in its own schema when the module sets one. Transactions run
/// at READ COMMITTED, where a concurrent duplicate delivery waits on the
/// inbox's unique index and then skips.
///
/// A bus holds one more connection per PostgreSQL module, outside the
/// module's pool, listening for the commits of processes that have no bus
/// for the module; see
/// [`ModuleHandle::wakeup_channel`](crate::ModuleHandle::wakeup_channel).
#[derive(Debug, Clone, Copy)]
pub struct Postgres;

impl Postgres {
    /// Opens one connection the way a module's pool does: the URL's TLS
    /// settings (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`, as libpq
    /// reads them; see the crate's TLS section), TCP keepalive and a
    /// bounded connection attempt unless the URL sets its own, and a
    /// failure that says why (unreachable, refused, a certificate's fault).
    /// For an application's own connections beside its modules'.
    pub async fn connect(url: &str) -> diesel::ConnectionResult<AsyncPgConnection> {
        connect(url.trim()).await
    }
}

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// Taken while migrating, so processes starting together do not race.
const MIGRATION_LOCK: i64 = 0x0074_6963_6b62_6f78; // "tickbox"

fn check_url(settings: &StoreSettings) -> crate::error::Result<()> {
    let url = settings.url.expose().trim();
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Ok(())
    } else {
        Err(Error::BadDatabaseUrl {
            module: settings.module.clone(),
            url: settings.url.redacted(),
            reason: "a PostgreSQL URL starts with postgres:// or postgresql://".into(),
        })
    }
}

/// Checks a schema name so it can be written into SQL unquoted-safe.
fn check_schema(settings: &StoreSettings) -> crate::error::Result<Option<String>> {
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

/// Connections in a module's journal pool (see [`Store::open_journal`]).
const JOURNAL_POOL_SIZE: usize = 2;

/// A pool whose connections work in `schema` (the connection's default
/// when `None`).
fn schema_pool(
    settings: &StoreSettings,
    url: String,
    schema: Option<String>,
) -> crate::error::Result<Pool<AsyncPgConnection>> {
    let limits = session_limits(settings);
    let module = settings.module.clone();
    build_pool(
        settings,
        url,
        Box::new(move |url| {
            let setup = match &schema {
                Some(schema) => format!("{limits}; SET search_path TO {schema}"),
                None => limits.clone(),
            };
            let module = module.clone();
            Box::pin(async move {
                let (mut conn, encrypted) = connect_reporting(url).await?;
                crate::tls::report_encryption(&module, "postgres", encrypted);
                conn.batch_execute(&setup)
                    .await
                    .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                Ok(conn)
            })
        }),
    )
}

/// Every wake-up channel's name starts with this.
const CHANNEL_PREFIX: &str = "tickbox.";

/// PostgreSQL's longest identifier, in bytes (NAMEDATALEN - 1); a channel
/// name is one.
const MAX_IDENTIFIER_BYTES: usize = 63;

/// The listener's first wait before reconnecting; it doubles after each
/// failure, up to [`LISTEN_BACKOFF_MAX`].
const LISTEN_BACKOFF_MIN: Duration = Duration::from_millis(100);

/// The listener's longest wait before reconnecting. A connection that stayed
/// up at least this long starts over from [`LISTEN_BACKOFF_MIN`].
const LISTEN_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// How long the listener waits for its connection to open.
const LISTEN_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the listener checks that its connection still answers.
const LISTEN_PING_INTERVAL: Duration = Duration::from_secs(10);

/// How long the listener waits for the answer to its check.
const LISTEN_PING_DEADLINE: Duration = Duration::from_secs(10);

/// The wake-up channel of the outbox in `schema`: notifications are per
/// database, so the schema tells apart the outboxes of one database.
///
/// `tickbox.<schema>` when that fits in 63 bytes; otherwise the schema is cut
/// (at a character boundary) and followed by `~` and a 64-bit FNV-1a hash of
/// the whole schema name, so every process derives the same name and long
/// names that differ only at the end still differ. Should two outboxes ever
/// share a channel, the cost is a needless scan, never a missed message.
fn wakeup_channel_name(schema: &str) -> String {
    let name = format!("{CHANNEL_PREFIX}{schema}");
    if name.len() <= MAX_IDENTIFIER_BYTES {
        return name;
    }
    let hash = format!("~{:016x}", fnv1a_64(schema.as_bytes()));
    let mut keep = MAX_IDENTIFIER_BYTES - CHANNEL_PREFIX.len() - hash.len();
    while !schema.is_char_boundary(keep) {
        keep -= 1;
    }
    format!("{CHANNEL_PREFIX}{}{hash}", &schema[..keep])
}

/// 64-bit FNV-1a: tiny and fixed by its definition, so processes built with
/// different compilers or releases derive the same channel names (std's
/// hasher promises no such thing).
fn fnv1a_64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// `name` as a quoted SQL identifier: in double quotes, any double quote
/// doubled. Quoted, a channel name keeps its case and any character.
fn quote_identifier(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// The schema unqualified table names are created in: the first existing
/// schema on the connection's search path (empty if there is none).
fn current_schema(conn: &mut AsyncConnectionWrapper<AsyncPgConnection>) -> QueryResult<String> {
    #[derive(diesel::QueryableByName)]
    struct Current {
        #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
        schema: Option<String>,
    }
    let current: Current = diesel::RunQueryDsl::get_result(
        diesel::sql_query("SELECT current_schema() AS schema"),
        conn,
    )?;
    Ok(current.schema.unwrap_or_default())
}

/// Listens on the module's wake-up channel until aborted, reconnecting with
/// backoff when the connection fails.
async fn listen_forever(wakeup: WakeupChannel, module: Arc<str>, wake: impl Fn()) {
    let mut backoff = LISTEN_BACKOFF_MIN;
    loop {
        let started = Instant::now();
        let error = listen_until_failure(&wakeup, &module, &wake).await;
        if started.elapsed() >= LISTEN_BACKOFF_MAX {
            backoff = LISTEN_BACKOFF_MIN;
        }
        tracing::warn!(
            %module,
            channel = %wakeup.channel,
            %error,
            retry_in = ?backoff,
            "listening for other processes' commits failed; their messages wait for the periodic scan until it reconnects"
        );
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(LISTEN_BACKOFF_MAX);
    }
}

/// Connects like `AsyncPgConnection::establish`, but a failure keeps its
/// cause: diesel-async reports only tokio-postgres's top line ("error
/// connecting to server"), not why (refused, unknown host, no such
/// database, authentication). The socket gets tickbox's defaults unless the
/// URL sets its own ([`client_config`]).
pub(crate) async fn connect(url: &str) -> diesel::ConnectionResult<AsyncPgConnection> {
    connect_reporting(url).await.map(|(conn, _)| conn)
}

/// Connects as [`connect`] does, and says whether the session is
/// encrypted.
async fn connect_reporting(url: &str) -> diesel::ConnectionResult<(AsyncPgConnection, bool)> {
    let (config, tls) = client_config(url)?;
    let session = open_session(&config, &tls).await?;
    tracing::trace!(
        address = %server_address(&config),
        sslmode = tls.mode.name(),
        encrypted = session.encrypted,
        "PostgreSQL session opened"
    );
    let encrypted = session.encrypted;
    let conn =
        AsyncPgConnection::try_from_client_and_connection(session.client, session.connection)
            .await?;
    Ok((conn, encrypted))
}

/// A plain tokio-postgres client, for the statements the test kit runs
/// outside any module (dropping a test's schemas): connected as
/// [`connect`] connects, TLS included, its connection driven by a task of
/// its own.
pub(crate) async fn connect_client(url: &str) -> Result<tokio_postgres::Client, String> {
    let (config, tls) = client_config(url).map_err(|e| e.to_string())?;
    let session = open_session(&config, &tls)
        .await
        .map_err(|failure| diesel::ConnectionError::from(failure).to_string())?;
    tokio::spawn(session.connection);
    Ok(session.client)
}

/// What tokio-postgres carries a session over: rustls's stream with the
/// `tls` feature, nothing without it.
#[cfg(feature = "tls")]
type TlsStream = crate::tls::postgres::PgTlsStream;
#[cfg(not(feature = "tls"))]
type TlsStream = tokio_postgres::tls::NoTlsStream;

/// An open session: the client, the connection to drive, and whether it is
/// encrypted.
struct Session {
    /// Sends the statements.
    client: tokio_postgres::Client,
    /// Must be polled for the client to get answers.
    connection: tokio_postgres::Connection<tokio_postgres::Socket, TlsStream>,
    /// Whether TLS was negotiated (under `sslmode=prefer`, the server
    /// decides).
    encrypted: bool,
}

/// Why no session could be opened.
enum SessionFailure {
    /// The server is out of reach: nothing listens at its address, the
    /// host is unknown or unreachable, or it did not answer in time.
    Unreachable {
        /// Where it was looked for.
        address: String,
        /// What happened, with the operating system's reason.
        reason: String,
    },
    /// The URL is wrong, or the server answered and refused (a wrong
    /// password, no such database).
    Refused(diesel::ConnectionError),
}

impl From<SessionFailure> for diesel::ConnectionError {
    fn from(failure: SessionFailure) -> Self {
        match failure {
            SessionFailure::Unreachable { address, reason } => {
                diesel::ConnectionError::BadConnection(format!("{address}: {reason}"))
            }
            SessionFailure::Refused(error) => error,
        }
    }
}

impl From<diesel::ConnectionError> for SessionFailure {
    fn from(error: diesel::ConnectionError) -> Self {
        SessionFailure::Refused(error)
    }
}

/// Opens a session: the socket, then the server's greeting and the
/// authentication, all within the connection attempt's time limit (the
/// client library bounds only the socket's connection by it).
async fn open_session(
    config: &tokio_postgres::Config,
    tls: &crate::tls::postgres::PgTls,
) -> Result<Session, SessionFailure> {
    let limit = config
        .get_connect_timeout()
        .copied()
        .unwrap_or(CONNECT_TIMEOUT);
    let unreachable = |reason: String| SessionFailure::Unreachable {
        address: server_address(config),
        reason,
    };
    #[cfg(feature = "tls")]
    let connector = crate::tls::postgres::PgConnector::new(
        crate::tls::client_config(&tls.settings)
            .map_err(|e| SessionFailure::Refused(diesel::ConnectionError::BadConnection(e)))?,
    );
    #[cfg(not(feature = "tls"))]
    let (connector, _) = (tokio_postgres::NoTls, tls);
    // A clone: with TLS, the connector remembers whether the handshake
    // encrypted, read once connected. Without TLS it is `NoTls`, a `Copy`.
    #[cfg_attr(not(feature = "tls"), allow(clippy::clone_on_copy))]
    let connected = tokio::time::timeout(limit, config.connect(connector.clone())).await;
    match connected {
        Ok(Ok((client, connection))) => Ok(Session {
            client,
            connection,
            #[cfg(feature = "tls")]
            encrypted: connector.encrypted(),
            #[cfg(not(feature = "tls"))]
            encrypted: false,
        }),
        Ok(Err(e)) => {
            #[cfg(feature = "tls")]
            if let Some(reason) = crate::tls::explain_handshake_failure(&e, &tls.settings) {
                return Err(SessionFailure::Refused(
                    diesel::ConnectionError::BadConnection(format!(
                        "{}: {reason}",
                        server_address(config)
                    )),
                ));
            }
            Err(match io_cause(&e) {
                Some(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                    unreachable(format!(
                "the server refused the connection ({io}); is it running, and listening there?"
            ))
                }
                Some(io) => unreachable(io.to_string()),
                None => {
                    SessionFailure::Refused(diesel::ConnectionError::BadConnection(with_causes(&e)))
                }
            })
        }
        Err(_) => Err(unreachable(format!(
            "the server did not complete the connection within {limit:?}"
        ))),
    }
}

/// The operating system's error behind a failed connection, if that is
/// what it was (not the server's answer).
fn io_cause(error: &tokio_postgres::Error) -> Option<&std::io::Error> {
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return Some(io);
        }
        source = cause.source();
    }
    None
}

/// Where `config` looks for the server: `host:port` for each host it
/// names (a Unix socket's directory and port, `host=/run/postgresql`).
fn server_address(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let port = |i: usize| match ports {
        [] => 5432,
        [one] => *one,
        many => many.get(i).copied().unwrap_or(5432),
    };
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| match host {
            tokio_postgres::config::Host::Tcp(name) if name.contains(':') => {
                format!("[{name}]:{}", port(i))
            }
            tokio_postgres::config::Host::Tcp(name) => format!("{name}:{}", port(i)),
            #[cfg(unix)]
            tokio_postgres::config::Host::Unix(path) => {
                format!("{} (Unix socket, port {})", path.display(), port(i))
            }
        })
        .collect();
    if hosts.is_empty() {
        format!("localhost:{}", port(0))
    } else {
        hosts.join(", ")
    }
}

/// How long a connection attempt may take, unless the URL says
/// (`connect_timeout`): a server that accepts but never answers (a quiet
/// network) would otherwise hold the attempt for ever.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// TCP keepalive, unless the URL says (`keepalives_idle`,
/// `keepalives_interval`, `keepalives_retries`): the kernel probes a
/// connection idle this long, so a peer that vanished without a word (a
/// host that died, a NAT entry that expired) is found out by the kernel
/// within about half a minute instead of the system's two hours.
const KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const KEEPALIVE_RETRIES: u32 = 3;

/// How long sent data may stay unacknowledged before the kernel closes the
/// connection, unless the URL says (`tcp_user_timeout`): a server that is
/// merely slow has acknowledged the query, so this cuts only a dead path.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// The client's settings from `url`, with tickbox's defaults for what the
/// URL leaves out: a bounded connection attempt, TCP keepalive and a TCP
/// user timeout. These help the kernel find a dead peer; a path that stays
/// open but silent (a proxy or a NAT that keeps answering for a vanished
/// server) is found by the calls' own deadlines
/// ([`crate::store::deadline`]).
fn client_config(
    url: &str,
) -> diesel::ConnectionResult<(tokio_postgres::Config, crate::tls::postgres::PgTls)> {
    let (client_url, tls) = crate::tls::postgres::split_url(url)
        .map_err(diesel::ConnectionError::InvalidConnectionUrl)?;
    let mut config: tokio_postgres::Config = client_url
        .parse()
        .map_err(|e| diesel::ConnectionError::InvalidConnectionUrl(with_causes(&e)))?;
    let given: Vec<String> = url::Url::parse(url)
        .map(|url| url.query_pairs().map(|(key, _)| key.into_owned()).collect())
        .unwrap_or_default();
    let unset = |key: &str| !given.iter().any(|given| given == key);
    if unset("connect_timeout") {
        config.connect_timeout(CONNECT_TIMEOUT);
    }
    if unset("keepalives_idle") {
        config.keepalives_idle(KEEPALIVE_IDLE);
    }
    if unset("keepalives_interval") {
        config.keepalives_interval(KEEPALIVE_INTERVAL);
    }
    if unset("keepalives_retries") {
        config.keepalives_retries(KEEPALIVE_RETRIES);
    }
    if unset("tcp_user_timeout") {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    Ok((config, tls))
}

/// The server's limits on a session of a module's pool, so that a client
/// that vanished (its connection quiet, never closed) does not hold locks
/// for long: a transaction idle on the server for longer than any of the
/// module's transactions may take (its deadline, plus a margin for the
/// client to give up first) is ended and rolled back
/// (`idle_in_transaction_session_timeout`), and so is a statement running
/// that long (`statement_timeout`: no call waits for it longer anyway).
fn session_limits(settings: &StoreSettings) -> String {
    let limit = (settings.longest_transaction + SERVER_MARGIN).as_millis();
    format!("SET statement_timeout = {limit}; SET idle_in_transaction_session_timeout = {limit}")
}

/// The server's limits on the session that migrates: idle inside a
/// transaction, or idle at all (PostgreSQL 14 and later), for longer than
/// the migration deadline, it is ended, releasing the migration lock.
fn migration_session_limits(
    conn: &mut AsyncConnectionWrapper<AsyncPgConnection>,
    deadline: Duration,
) -> crate::error::Result<String> {
    #[derive(diesel::QueryableByName)]
    struct Version {
        #[diesel(sql_type = diesel::sql_types::Integer)]
        version: i32,
    }
    let version: Version = diesel::RunQueryDsl::get_result(
        diesel::sql_query("SELECT current_setting('server_version_num')::int AS version"),
        conn,
    )?;
    let limit = (deadline + SERVER_MARGIN).as_millis();
    let mut limits = format!("SET idle_in_transaction_session_timeout = {limit}");
    if version.version >= 140000 {
        limits.push_str(&format!("; SET idle_session_timeout = {limit}"));
    }
    Ok(limits)
}

/// Connects like [`connect`], driving the connection in a task of its own
/// that ends, closing the socket, when the returned sender is dropped: the
/// way to free a thread blocked on the connection (migrations run on a
/// blocking thread) when its path goes quiet.
async fn connect_killable(
    url: &str,
) -> Result<(AsyncPgConnection, tokio::sync::oneshot::Sender<()>), SessionFailure> {
    let (config, tls) = client_config(url)?;
    let Session {
        client, connection, ..
    } = open_session(&config, &tls).await?;
    let (kill, killed) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        tokio::select! {
            _ = killed => {}
            _ = connection => {}
        }
    });
    let conn = AsyncPgConnection::try_from(client).await?;
    Ok((conn, kill))
}

/// How much longer than a client's deadline the server waits before it
/// ends a session: the client gives up first, and says why.
const SERVER_MARGIN: Duration = Duration::from_secs(5);

/// An error and its sources, one after another.
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Connects, listens, and calls `wake` once listening and on every
/// notification; returns why it stopped.
async fn listen_until_failure(wakeup: &WakeupChannel, module: &str, wake: &impl Fn()) -> String {
    let connecting = tokio::time::timeout(LISTEN_CONNECT_TIMEOUT, connect(wakeup.url.expose()));
    let mut conn = match connecting.await {
        Ok(Ok(conn)) => conn,
        Ok(Err(error)) => return format!("connecting: {error}"),
        Err(_) => return format!("connecting: no connection within {LISTEN_CONNECT_TIMEOUT:?}"),
    };
    let listen = format!("LISTEN {}", quote_identifier(&wakeup.channel));
    if let Err(error) = conn.batch_execute(&listen).await {
        return format!("{listen}: {error}");
    }
    tracing::debug!(%module, channel = %wakeup.channel, "listening for other processes' commits");
    // Commits made while nothing listened woke nobody: scan for them.
    wake();
    // A listening connection only receives: if its path goes quiet,
    // nothing fails. So it is asked a question every so often, and one
    // that has no answer within the deadline is given up (the loop above
    // reconnects). Notifications that come meanwhile wait in its queue.
    loop {
        let asked_at = Instant::now() + LISTEN_PING_INTERVAL;
        {
            let mut notifications = std::pin::pin!(conn.notifications_stream());
            loop {
                tokio::select! {
                    notification = notifications.next() => match notification {
                        Some(Ok(_)) => wake(),
                        Some(Err(error)) => return error.to_string(),
                        None => return "the connection closed".to_string(),
                    },
                    _ = tokio::time::sleep_until(asked_at) => break,
                }
            }
        }
        match tokio::time::timeout(LISTEN_PING_DEADLINE, conn.batch_execute("SELECT 1")).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return format!("checking the connection: {error}"),
            Err(_) => {
                return format!(
                "the connection went quiet: no answer to a check within {LISTEN_PING_DEADLINE:?}"
            )
            }
        }
    }
}

impl Schemas for Postgres {}

impl Backend for Postgres {
    const NAME: &'static str = "postgres";
    const DEFAULT_POOL_SIZE: usize = 8;
    type Connection = AsyncPgConnection;
    type Diesel = diesel::pg::Pg;
}

impl Store for Postgres {
    type Conn = AsyncPgConnection;
    type Pool = Pool<AsyncPgConnection>;
    type Pooled = Object<AsyncPgConnection>;

    const ONE_WRITER: bool = false;
    // Every transient failure comes with a SQLSTATE or as a lost connection.
    const TRANSIENT_MESSAGES: &'static [&'static str] = &[];

    async fn open(
        settings: &StoreSettings,
    ) -> crate::error::Result<(Self::Pool, Option<WakeupChannel>)> {
        check_url(settings)?;
        let schema = check_schema(settings)?;
        let url = settings.url.expose().trim().to_string();
        let module = settings.module.clone();
        let migrate_schema = schema.clone();
        let migrate = settings.migrate;
        let app_migrations = settings.app_migrations;
        let deadline = settings.deadlines.migration;
        let (first, kill) = connect_killable(&url)
            .await
            .map_err(|failure| match failure {
                SessionFailure::Unreachable { address, reason } => Error::DatabaseUnreachable {
                    module: module.clone(),
                    address,
                    reason,
                },
                SessionFailure::Refused(e) => Error::BadDatabaseUrl {
                    module: module.clone(),
                    url: redact_url(&url),
                    reason: e.to_string(),
                },
            })?;
        let opening = tokio::task::spawn_blocking(move || {
            // Synchronous, for diesel's migration harness (its async one
            // panics inside actix); it blocks on the connection's runtime.
            let mut conn: AsyncConnectionWrapper<AsyncPgConnection> = first.into();
            let migration_error = |reason: String| Error::Migration {
                module: module.clone(),
                reason,
            };
            // The schema holding the outbox names its wake-up channel: the
            // module's own, or the connection's default (so a module that
            // names `public` and one that names nothing agree).
            let outbox_schema = match &migrate_schema {
                Some(schema) => schema.clone(),
                None => current_schema(&mut conn).map_err(Error::from)?,
            };
            use diesel::connection::SimpleConnection;
            if !migrate {
                return Ok(outbox_schema);
            }
            // A client that vanishes while migrating must not hold the
            // migration lock (a session lock) or a migration's locks for
            // long: the server ends its session once idle past the deadline.
            let limits = migration_session_limits(&mut conn, deadline)?;
            SimpleConnection::batch_execute(&mut conn, &limits)
                .map_err(|e| migration_error(e.to_string()))?;
            SimpleConnection::batch_execute(
                &mut conn,
                &format!("SELECT pg_advisory_lock({MIGRATION_LOCK})"),
            )
            .map_err(|e| migration_error(e.to_string()))?;
            // All the migrations, tickbox's and the application's, commit as
            // one transaction (each runs in a savepoint): a process that
            // opens the schema without migrating (a tool, another process
            // attaching) sees all of them or none, never a half-made schema.
            let migrated = diesel::Connection::transaction(&mut conn, |conn| {
                if let Some(schema) = &migrate_schema {
                    SimpleConnection::batch_execute(
                        conn,
                        &format!(
                            "CREATE SCHEMA IF NOT EXISTS {schema}; SET search_path TO {schema}"
                        ),
                    )
                    .map_err(|e| migration_error(e.to_string()))?;
                }
                conn.run_pending_migrations(MIGRATIONS)
                    .map_err(|e| migration_error(e.to_string()))?;
                refuse_newer_migrations(conn, &MIGRATIONS, &module)?;
                if let Some(app) = app_migrations {
                    refuse_clashing_versions::<diesel::pg::Pg>(&app, &module)?;
                    conn.run_pending_migrations(app).map_err(|e| {
                        migration_error(format!("the application's migrations: {e}"))
                    })?;
                }
                Ok::<_, Error>(())
            });
            let unlocked = SimpleConnection::batch_execute(
                &mut conn,
                &format!("SELECT pg_advisory_unlock({MIGRATION_LOCK})"),
            );
            migrated?;
            unlocked.map_err(|e| migration_error(e.to_string()))?;
            Ok::<_, Error>(outbox_schema)
        });
        // Past the deadline the connection is closed under the blocked
        // thread, whose statement then fails and lets it end.
        let Ok(opened) = tokio::time::timeout(deadline, opening).await else {
            drop(kill);
            return Err(Error::Deadline {
                module: settings.module.clone(),
                operation: "opening the database (connecting and migrating)".into(),
                deadline,
            });
        };
        let outbox_schema = opened.map_err(|e| Error::Task {
            what: format!("opening module `{}`", settings.module),
            reason: e.to_string(),
        })??;

        let wakeup = WakeupChannel {
            url: SecretUrl::new(url.clone()),
            channel: wakeup_channel_name(&outbox_schema),
        };
        let pool = schema_pool(settings, url, schema)?;
        Ok((pool, Some(wakeup)))
    }

    async fn open_journal(settings: &StoreSettings) -> crate::error::Result<Option<Self::Pool>> {
        // The journal is a table of the module's schema, made by its
        // migrations; its own few connections keep journal entries from
        // waiting for the connections the deliveries hold.
        check_url(settings)?;
        let schema = check_schema(settings)?;
        let settings = StoreSettings {
            pool_size: JOURNAL_POOL_SIZE,
            ..settings.clone()
        };
        let url = settings.url.expose().trim().to_string();
        let pool = schema_pool(&settings, url, schema)?;
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
        AnsiTransactionManager::begin_transaction_sql(conn, "BEGIN READ ONLY").await
    }

    async fn commit(conn: &mut Self::Conn) -> QueryResult<()> {
        AnsiTransactionManager::commit_transaction(conn).await
    }

    async fn rollback(conn: &mut Self::Conn) -> QueryResult<()> {
        AnsiTransactionManager::rollback_transaction(conn).await
    }

    async fn notify(conn: &mut Self::Conn, channel: &str) -> QueryResult<()> {
        use diesel_async::RunQueryDsl;
        diesel::sql_query("SELECT pg_notify($1, '')")
            .bind::<diesel::sql_types::Text, _>(channel)
            .execute(conn)
            .await
            .map(drop)
    }

    fn listen(
        wakeup: WakeupChannel,
        module: Arc<str>,
        wake: impl Fn() + Send + Sync + 'static,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        Some(listen_forever(wakeup, module, wake))
    }

    async fn load<R: Row>(conn: &mut Self::Conn, sql: Sql) -> QueryResult<Vec<R>> {
        diesel_async::RunQueryDsl::load(sql, conn).await
    }

    async fn execute(conn: &mut Self::Conn, sql: Sql) -> QueryResult<usize> {
        diesel_async::RunQueryDsl::execute(sql, conn).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_that_fits_names_its_channel_as_is() {
        assert_eq!(wakeup_channel_name("public"), "tickbox.public");
        assert_eq!(
            wakeup_channel_name("minishop_orders"),
            "tickbox.minishop_orders"
        );
        // 8 bytes of prefix + 55 = 63: still as is.
        let longest = "s".repeat(55);
        assert_eq!(wakeup_channel_name(&longest), format!("tickbox.{longest}"));
    }

    #[test]
    fn a_long_schema_is_cut_and_hashed_within_63_bytes_the_same_way_every_time() {
        let long = "s".repeat(56);
        let name = wakeup_channel_name(&long);
        assert_eq!(name.len(), 63, "{name}");
        assert!(name.starts_with("tickbox.sss"), "{name}");
        assert_eq!(name, wakeup_channel_name(&long), "deterministic");
        // Pinned: processes of different builds must derive the same name.
        assert_eq!(
            wakeup_channel_name(&"a".repeat(63)),
            format!("tickbox.{}~51c1e07b2aee9066", "a".repeat(38))
        );
        let other = format!("{}t", "s".repeat(55));
        assert_ne!(wakeup_channel_name(&other), name, "differ at the end");
        for schema in [
            "x".repeat(300),
            "é".repeat(40),
            format!("a{}", "日本".repeat(30)),
        ] {
            let name = wakeup_channel_name(&schema);
            assert!(name.len() <= 63, "{name}: {} bytes", name.len());
        }
    }

    #[test]
    fn the_hash_is_fnv1a_64() {
        // The published test vectors.
        assert_eq!(fnv1a_64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a_64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a_64(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn a_channel_is_quoted_for_listen_with_double_quotes_doubled() {
        assert_eq!(quote_identifier("tickbox.orders"), "\"tickbox.orders\"");
        assert_eq!(quote_identifier("Mixed Case"), "\"Mixed Case\"");
        assert_eq!(quote_identifier("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_identifier("\""), "\"\"\"\"");
    }
}
