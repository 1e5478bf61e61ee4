//! Where the modules' databases are, as the arguments say: a directory of
//! SQLite files (`--data-dir`), or a server (`--database-url`) with a
//! schema (PostgreSQL) or a database (MariaDB/MySQL) per module; and, over
//! amqp, where to find the databases of the modules other processes run
//! (`--check-data-dir`, `--check-database-url`, see `elsewhere.rs`). Each
//! makes the module builders [`crate::run::run`] starts the run with.

use crate::cli::{Args, CheckStore, Store};
use crate::elsewhere;
use crate::report::Report;
use std::time::Instant;
use tokio_util::sync::CancellationToken;

/// The run, on the databases the arguments name.
pub async fn run(args: &Args, stop: &CancellationToken) -> Result<Report, String> {
    match args.store() {
        Store::Sqlite(dir) => match std::fs::create_dir_all(dir) {
            Ok(()) => {
                let file = |dir: &std::path::Path, name: &str| {
                    dir.join(format!("{name}.db")).display().to_string()
                };
                let module =
                    |name: &str| tickbox::Module::<tickbox::Sqlite>::builder(name, file(dir, name));
                let CheckStore::Sqlite(dirs) = args.check_store() else {
                    unreachable!("SQLite checks SQLite files")
                };
                let looked_in = elsewhere::dirs_text(dirs);
                let elsewhere = async |name: &'static str| {
                    if dirs.is_empty() {
                        return Ok(None);
                    }
                    let found = async || elsewhere::sqlite_file(dirs, name);
                    let path = find_elsewhere(args, name, &looked_in, stop, found).await?;
                    Ok(path.map(|path| {
                        tickbox::Module::<tickbox::Sqlite>::builder(
                            name,
                            path.display().to_string(),
                        )
                    }))
                };
                crate::run::run(args, module, elsewhere, stop).await
            }
            Err(e) => Err(format!(
                "cannot create the data directory {}: {e}",
                dir.display()
            )),
        },
        #[cfg(feature = "postgres")]
        Store::Postgres(url) => run_in_schemas::<tickbox::Postgres>(args, url, stop).await,
        #[cfg(not(feature = "postgres"))]
        Store::Postgres(url) => Err(format!(
            "--database-url {} needs the `postgres` feature: cargo run --release --features \
             postgres --example minishop -- --database-url postgres://...",
            tickbox::redact::redact_url(url)
        )),
        #[cfg(feature = "mysql")]
        Store::Mysql(url) => run_in_schemas::<tickbox::Mysql>(args, url, stop).await,
        #[cfg(not(feature = "mysql"))]
        Store::Mysql(url) => Err(format!(
            "--database-url {} needs the `mysql` feature: cargo run --release --features \
             mysql --example minishop -- --database-url mysql://...",
            tickbox::redact::redact_url(url)
        )),
    }
}

/// Over amqp, finds the database of `module` (run by another process) with
/// `found`, waiting for it to appear; `None` without check flags.
async fn find_elsewhere<T>(
    args: &Args,
    module: &str,
    looked_in: &str,
    stop: &CancellationToken,
    found: impl AsyncFnMut() -> Option<T>,
) -> Result<Option<T>, String> {
    let deadline = args.timeout.map(|timeout| Instant::now() + timeout);
    match elsewhere::wait_for(module, looked_in, deadline, stop, found).await {
        Ok(Some(location)) => Ok(Some(location)),
        Ok(None) => Err(format!(
            "interrupted while waiting for the {module} database"
        )),
        Err(error) => Err(error),
    }
}

/// The run on a server where each module has a named schema (PostgreSQL)
/// or database (MariaDB/MySQL), `PREFIX_MODULE` (`--schema-prefix`,
/// `minishop` unless given), on the server `url`
/// names; over amqp the other processes' are looked for with
/// `--check-database-url`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn run_in_schemas<B: crate::ShopDb + elsewhere::NamedSchemas>(
    args: &Args,
    url: &str,
    stop: &CancellationToken,
) -> Result<Report, String> {
    let schema = |name: &str| format!("{}_{name}", args.schema_prefix);
    let module =
        |name: &str, url: &str| tickbox::Module::<B>::builder(name, url).schema(schema(name));
    let CheckStore::Servers(urls) = args.check_store() else {
        unreachable!("a server's modules are checked on servers")
    };
    let looked_in = elsewhere::urls_text(urls);
    let elsewhere = async |name: &'static str| {
        if urls.is_empty() {
            return Ok(None);
        }
        let schema = schema(name);
        let found = async || elsewhere::schema_url::<B>(urls, &schema).await;
        let url = find_elsewhere(args, name, &looked_in, stop, found).await?;
        Ok(url.map(|url| module(name, url)))
    };
    crate::run::run(args, |name| module(name, url), elsewhere, stop).await
}
