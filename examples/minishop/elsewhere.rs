//! Over amqp: finding the databases of the modules run by other processes,
//! for waiting on and checking the whole flow (`--check-data-dir`,
//! `--check-database-url`).
//!
//! The processes need nothing of each other's databases to run: only this
//! process's final check reads them. Each is looked for in the locations
//! given, in order, until one holds it: the file `MODULE.db` in a
//! directory, the schema `PREFIX_MODULE` (`--schema-prefix`) in a
//! PostgreSQL database or the database of that name on a MariaDB/MySQL
//! server ([`NamedSchemas`]).
//! A process started before its partners waits for theirs to appear.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Waits until `found` names a location for `module`'s database, checking
/// every 200 ms, until `deadline` (an error naming where it looked) or
/// Ctrl-C (`Ok(None)`).
pub async fn wait_for<T>(
    module: &str,
    looked_in: &str,
    deadline: Option<Instant>,
    stop: &CancellationToken,
    mut found: impl AsyncFnMut() -> Option<T>,
) -> Result<Option<T>, String> {
    let mut said = None::<Instant>;
    loop {
        if let Some(location) = found().await {
            return Ok(Some(location));
        }
        let waiting = format!(
            "the {module} database is in none of {looked_in} yet (start `minishop --transport \
             amqp --modules {module}` there)"
        );
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(format!("timed out: {waiting}"));
        }
        if said.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
            tracing::info!("waiting for the other processes' databases: {waiting}");
            said = Some(Instant::now());
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(200)) => {}
            () = stop.cancelled() => return Ok(None),
        }
    }
}

/// The SQLite file of `module` in the first of `dirs` holding one.
pub fn sqlite_file(dirs: &[PathBuf], module: &str) -> Option<PathBuf> {
    dirs.iter()
        .map(|dir| dir.join(format!("{module}.db")))
        .find(|file| Path::is_file(file))
}

/// The directories, as the error names them.
pub fn dirs_text(dirs: &[PathBuf]) -> String {
    dirs.iter()
        .map(|dir| dir.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The URLs, passwords hidden, as the error names them.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub fn urls_text(urls: &[String]) -> String {
    urls.iter()
        .map(|url| tickbox::redact::redact_url(url))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A backend that keeps each module in a named schema of a server
/// (PostgreSQL's schemas, MariaDB/MySQL's databases), and can tell whether
/// a server holds one.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub trait NamedSchemas: tickbox::Schemas {
    /// Whether the server at `url` holds the schema `schema`.
    fn holds_schema(
        url: &str,
        schema: &str,
    ) -> impl std::future::Future<Output = tickbox::diesel::QueryResult<bool>>;
}

/// Counts the rows of `count`, a `SELECT count(*)` naming one schema, on
/// `conn`, once it has connected.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn count_on<C>(
    conn: impl std::future::Future<Output = tickbox::diesel::ConnectionResult<C>>,
    count: String,
) -> tickbox::diesel::QueryResult<bool>
where
    C: tickbox::diesel_async::AsyncConnection + 'static,
    tickbox::diesel::dsl::select<
        tickbox::diesel::expression::SqlLiteral<tickbox::diesel::sql_types::BigInt>,
    >: tickbox::diesel_async::methods::LoadQuery<'static, C, i64>,
{
    use tickbox::diesel_async::RunQueryDsl;
    let mut conn = conn.await.map_err(|error| {
        tickbox::diesel::result::Error::QueryBuilderError(error.to_string().into())
    })?;
    let query = tickbox::diesel::select(tickbox::diesel::dsl::sql::<
        tickbox::diesel::sql_types::BigInt,
    >(&count));
    Ok(query.get_result::<i64>(&mut conn).await? > 0)
}

/// A schema of the database the URL names.
#[cfg(feature = "postgres")]
impl NamedSchemas for tickbox::Postgres {
    async fn holds_schema(url: &str, schema: &str) -> tickbox::diesel::QueryResult<bool> {
        // Our own module names: nothing to quote.
        let count = format!("(SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}')");
        // Connected as the modules connect: the URL's TLS settings too.
        count_on(tickbox::Postgres::connect(url), count).await
    }
}

/// A database of the server the URL names (its own database, if it names
/// one, does not matter).
#[cfg(feature = "mysql")]
impl NamedSchemas for tickbox::Mysql {
    async fn holds_schema(url: &str, schema: &str) -> tickbox::diesel::QueryResult<bool> {
        let count = format!(
            "(SELECT count(*) FROM information_schema.schemata WHERE schema_name = '{schema}')"
        );
        count_on(tickbox::Mysql::connect(url), count).await
    }
}

/// The first of `urls` whose server holds the schema `schema`; a server
/// out of reach is skipped for now.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub async fn schema_url<'a, B: NamedSchemas>(urls: &'a [String], schema: &str) -> Option<&'a str> {
    for url in urls {
        match B::holds_schema(url, schema).await {
            Ok(true) => return Some(url),
            Ok(false) => {}
            Err(error) => tracing::debug!(url = %tickbox::redact::redact_url(url), %error,
                "cannot look for the schema {schema} there yet"),
        }
    }
    None
}
