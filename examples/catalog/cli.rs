//! The command line.

use clap::Parser;
use secret_args::Secret;
use std::path::PathBuf;
use std::time::Duration;

#[path = "../../tools/secret_args.rs"]
mod secret_args;

/// catalog: a catalog of products whose price changes reach a storefront's
/// copy and an audit journal, in order per product thanks to ordering keys.
#[derive(Debug, Parser)]
#[command(
    name = "catalog",
    after_help = "\
Logs go to stderr (RUST_LOG sets the filter); the report to stdout (with --json, one JSON
line and nothing else). Ctrl-C stops cleanly: no more changes, running deliveries finish,
the rest stays pending for --resume (exit code 130); a second Ctrl-C quits at once.

Exit code: 0 when every planned change was published once, the storefront's copy of every
product matches the catalog, each change has exactly one journey row, nothing is pending and
nothing was dead-lettered (and, when every change was keyed, no change reached the
storefront after a newer one); 1 otherwise; 2 for bad arguments; 130 when interrupted."
)]
pub struct Args {
    /// Products in the catalog (created as needed; default 100)
    #[arg(long, value_name = "N", conflicts_with = "resume", value_parser = clap::value_parser!(u64).range(1..))]
    products: Option<u64>,

    /// Price changes to make, each to a random product (default 2000)
    #[arg(long, value_name = "M", conflicts_with = "resume")]
    changes: Option<u64>,

    /// SQLite: one database file per module in DIR
    #[arg(long, value_name = "DIR", default_value = "./catalog-data")]
    data_dir: PathBuf,

    /// PostgreSQL (postgres://…, needs the `postgres` feature): one schema
    /// per module, PREFIX_catalog, PREFIX_storefront and PREFIX_journeys
    /// (see --schema-prefix); MariaDB or MySQL (mysql://…, needs the
    /// `mysql` feature): one database per module, of the same names
    #[arg(long, value_name = "URL", value_parser = Secret(server_url), conflicts_with = "data_dir")]
    database_url: Option<String>,

    /// With --database-url: the prefix of the modules' schema (MariaDB/MySQL:
    /// database) names
    #[arg(long, value_name = "PREFIX", default_value = "catalog", value_parser = schema_prefix, requires = "database_url")]
    pub schema_prefix: String,

    /// Publish the changes without an ordering key: retries then reorder
    /// them, and only the storefront's version check keeps its copy right
    #[arg(long, conflicts_with = "resume")]
    unordered: bool,

    /// Deliver each message a second time with probability P (0..=1)
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = probability)]
    pub duplicate_rate: f64,

    /// Make each handler call fail after its work, before COMMIT, with
    /// probability P (0..=0.9)
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = failure_probability)]
    pub fail_rate: f64,

    /// Make no new changes; finish the ones planned and not yet published,
    /// and deliver what is pending (after a crash)
    #[arg(long)]
    pub resume: bool,

    /// Seed of the random choice of products and prices (default: random)
    #[arg(long, value_name = "SEED", conflicts_with = "resume")]
    seed: Option<u64>,

    /// After the run, deliver N older changes (as new messages) straight to
    /// the storefront and N repeated events to the journeys, and report
    /// how many each safeguard ignored
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub disturb: usize,

    /// Give up waiting for the deliveries after this long (exit 1)
    #[arg(long, value_name = "SECONDS", default_value = "600", value_parser = seconds)]
    pub timeout: Duration,

    /// Print the result as one JSON line on stdout, and nothing else
    #[arg(long)]
    pub json: bool,
}

/// Where the modules' databases are.
pub enum Store<'a> {
    /// A directory of SQLite files.
    Sqlite(&'a PathBuf),
    /// A PostgreSQL database, one schema per module.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres(&'a str),
    /// A MariaDB or MySQL server, one database per module.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Mysql(&'a str),
}

/// The changes a run that is not resuming plans.
#[derive(Debug, Clone, Copy)]
pub struct NewPlan {
    /// Products the changes are spread over.
    pub products: u64,
    /// How many changes.
    pub changes: u64,
    /// Seed of the random choices.
    pub seed: u64,
    /// Whether the changes are published with the product as ordering key.
    pub keyed: bool,
}

impl Args {
    /// The arguments of this process; exits with code 2 and a usage message
    /// when they are wrong (a URL in it redacted), with 0 after `--help`.
    pub fn parse_or_exit() -> Args {
        Args::try_parse().unwrap_or_else(|error| secret_args::exit(error))
    }

    /// Where the modules' databases are.
    pub fn store(&self) -> Store<'_> {
        match &self.database_url {
            Some(url) if url.starts_with("mysql://") => Store::Mysql(url),
            Some(url) => Store::Postgres(url),
            None => Store::Sqlite(&self.data_dir),
        }
    }

    /// The changes to plan: none with `--resume`.
    pub fn new_plan(&self) -> Option<NewPlan> {
        (!self.resume).then(|| NewPlan {
            products: self.products.unwrap_or(100),
            changes: self.changes.unwrap_or(2000),
            seed: self.seed.unwrap_or_else(|| fastrand::u64(..)),
            keyed: !self.unordered,
        })
    }
}

/// A PostgreSQL URL (`postgres://`) or a MariaDB/MySQL one (`mysql://`).
fn server_url(value: &str) -> Result<String, String> {
    let schemes = ["postgres://", "postgresql://", "mysql://"];
    if schemes.iter().any(|scheme| value.starts_with(scheme)) {
        Ok(value.to_string())
    } else {
        Err(
            "takes a PostgreSQL URL (postgres://...) or a MariaDB/MySQL URL (mysql://...); use \
             --data-dir for SQLite"
                .into(),
        )
    }
}

/// A schema name's start: lower-case letters, digits and `_`.
fn schema_prefix(value: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if !value.is_empty() && value.len() <= 40 && value.chars().all(allowed) {
        Ok(value.to_string())
    } else {
        Err("takes up to 40 lower-case letters, digits and '_'".into())
    }
}

/// A probability.
fn probability(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err("takes a probability between 0 and 1".into()),
    }
}

/// A failure probability low enough for the retry policy to outlast
/// (see `start_bus`).
fn failure_probability(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(p) if (0.0..=0.9).contains(&p) => Ok(p),
        _ => Err("takes a probability between 0 and 0.9".into()),
    }
}

/// A positive number of seconds.
fn seconds(value: &str) -> Result<Duration, String> {
    match value.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err("takes a number of seconds greater than 0".into()),
    }
}
