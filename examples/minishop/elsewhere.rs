//! Over amqp: finding the databases of the modules run by other processes,
//! for waiting on and checking the whole flow (`--check-data-dir`,
//! `--check-database-url`).
//!
//! The processes need nothing of each other's databases to run: only this
//! process's final check reads them. Each is looked for in the locations
//! given, in order, until one holds it: the file `MODULE.db` in a
//! directory, the schema `minishop_MODULE` in a PostgreSQL database. A
//! process started before its partners waits for theirs to appear.

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
#[cfg(feature = "postgres")]
pub fn urls_text(urls: &[String]) -> String {
    urls.iter()
        .map(|url| tickbox::redact_url(url))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The first of `urls` whose database holds the schema `schema`; a
/// database out of reach is skipped for now.
#[cfg(feature = "postgres")]
pub async fn postgres_url<'a>(urls: &'a [String], schema: &str) -> Option<&'a str> {
    use tickbox::diesel::dsl::sql;
    use tickbox::diesel::sql_types::BigInt;
    use tickbox::diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    // Our own module names: nothing to quote.
    let query = tickbox::diesel::select(sql::<BigInt>(&format!(
        "(SELECT count(*) FROM pg_namespace WHERE nspname = '{schema}')"
    )));
    for url in urls {
        let found = match AsyncPgConnection::establish(url).await {
            Ok(mut conn) => query.clone().get_result::<i64>(&mut conn).await,
            Err(error) => Err(tickbox::diesel::result::Error::QueryBuilderError(
                error.to_string().into(),
            )),
        };
        match found {
            Ok(n) if n > 0 => return Some(url),
            Ok(_) => {}
            Err(error) => tracing::debug!(url = %tickbox::redact_url(url), %error,
                "cannot look for the schema {schema} there yet"),
        }
    }
    None
}
