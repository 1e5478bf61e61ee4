//! Where the modules' databases are, as the arguments say: a directory of
//! SQLite files (`--data-dir`), or a server (`--database-url`) with a
//! schema (PostgreSQL) or a database (MariaDB/MySQL) per module, each with
//! the modules' migrations in its dialect. Each makes the module builders
//! [`crate::run`] starts the run with.

use crate::cli::{Args, Store};
use crate::report::Report;
use crate::tables;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use crate::tables::Migrations;
use tokio_util::sync::CancellationToken;

/// The run, on the databases the arguments name.
pub async fn run(args: &Args, stop: &CancellationToken) -> Result<Report, String> {
    match args.store() {
        Store::Sqlite(dir) => match std::fs::create_dir_all(dir) {
            Ok(()) => {
                let module = |name: &str| {
                    let file = dir.join(format!("{name}.db")).display().to_string();
                    tickbox::Module::<tickbox::Sqlite>::builder(name, file)
                };
                crate::run(args, module, &tables::PORTABLE_MIGRATIONS, stop).await
            }
            Err(e) => Err(format!("cannot create {}: {e}", dir.display())),
        },
        #[cfg(feature = "postgres")]
        Store::Postgres(url) => {
            let migrations = &tables::PORTABLE_MIGRATIONS;
            run_in_schemas::<tickbox::Postgres>(args, url, migrations, stop).await
        }
        #[cfg(not(feature = "postgres"))]
        Store::Postgres(_) => Err("--database-url needs the `postgres` feature: cargo run \
             --release --features postgres --example catalog -- --database-url postgres://..."
            .to_string()),
        #[cfg(feature = "mysql")]
        Store::Mysql(url) => {
            let migrations = &tables::MYSQL_MIGRATIONS;
            run_in_schemas::<tickbox::Mysql>(args, url, migrations, stop).await
        }
        #[cfg(not(feature = "mysql"))]
        Store::Mysql(_) => Err(
            "--database-url mysql://... needs the `mysql` feature: cargo run \
             --release --features mysql --example catalog -- --database-url mysql://..."
                .to_string(),
        ),
    }
}

/// One run on a server where each module has a named schema (PostgreSQL)
/// or database (MariaDB/MySQL), `PREFIX_MODULE` (`--schema-prefix`), on the
/// server `url` names.
#[cfg(any(feature = "postgres", feature = "mysql"))]
async fn run_in_schemas<B: tickbox::Schemas>(
    args: &Args,
    url: &str,
    migrations: &'static Migrations,
    stop: &CancellationToken,
) -> Result<Report, String> {
    let module = |name: &str| {
        tickbox::Module::<B>::builder(name, url).schema(format!("{}_{name}", args.schema_prefix))
    };
    crate::run(args, module, migrations, stop).await
}
