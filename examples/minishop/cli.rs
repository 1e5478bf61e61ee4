//! The command line.

use clap::{CommandFactory, Parser, ValueEnum};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// MiniShop: three modules (orders, warehouse, notifications), each with its
/// own database, talking only through tickbox messages.
#[derive(Debug, Parser)]
#[command(
    name = "minishop",
    after_help = "\
Progress goes to stderr (a progress bar on a terminal, a line every 2 s otherwise); the
report to stdout (with --json, one JSON object and nothing else). Ctrl-C stops cleanly: no
more orders, running deliveries finish, the rest stays pending for --resume (exit code 130);
a second Ctrl-C quits at once.

Exit code: 0 when every order has exactly one reservation, one confirmation and one e-mail,
no message is pending and there are no dead letters; 1 otherwise; 2 for bad arguments (or
--metrics-addr without the `prometheus` feature); 130 when interrupted."
)]
pub struct Args {
    /// Place N new orders, then run until the whole flow is done (default
    /// 100; only a process running the orders module places orders)
    #[arg(long, value_name = "N", conflicts_with = "resume")]
    orders: Option<u64>,

    /// SQLite: one database file per module in DIR
    #[arg(long, value_name = "DIR", default_value = "./minishop-data")]
    data_dir: PathBuf,

    /// PostgreSQL (needs the `postgres` feature): one schema per module,
    /// minishop_orders, minishop_warehouse, minishop_notifications
    #[arg(long, value_name = "URL", value_parser = postgres_url, conflicts_with = "data_dir")]
    database_url: Option<String>,

    /// Place no orders; only finish pending work (after a crash)
    #[arg(long)]
    pub resume: bool,

    /// Run only these modules' handlers (default all three); other processes
    /// over the same databases run the rest, and each runs until the whole
    /// flow is done
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    modules: Vec<ModuleName>,

    /// Give up after this long: exit 1 naming what is unfinished (default: a
    /// deadline that grows with the orders when running all three modules,
    /// none otherwise)
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub timeout: Option<Duration>,

    /// Deliver each message a second time with probability P (0..=1)
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = probability)]
    pub duplicate_rate: f64,

    /// Make each handler call fail before COMMIT with probability P (0..=1)
    #[arg(long, value_name = "P", default_value_t = 0.0, value_parser = probability)]
    pub fail_rate: f64,

    /// Serve the metrics for Prometheus at http://HOST:PORT/metrics while
    /// the run lasts (needs the `prometheus` feature)
    #[arg(long, value_name = "HOST:PORT", value_parser = socket_addr)]
    pub metrics_addr: Option<SocketAddr>,

    /// Print the result as one JSON object on stdout, and nothing else
    #[arg(long)]
    pub json: bool,
}

/// The example's modules, as `--modules` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModuleName {
    Orders,
    Warehouse,
    Notifications,
}

/// Where the modules' databases are.
pub enum Store<'a> {
    /// A directory of SQLite files.
    Sqlite(&'a PathBuf),
    /// A PostgreSQL database, one schema per module.
    Postgres(&'a str),
}

impl Args {
    /// The arguments of this process; exits with code 2 and a usage message
    /// when they are wrong, with 0 after `--help`.
    pub fn parse_or_exit() -> Args {
        let args = match Args::try_parse() {
            Ok(args) => args,
            Err(error) => {
                // A database URL missing its flag would show its password.
                let text = std::env::args()
                    .skip(1)
                    .filter(|arg| arg.contains("://") || arg.contains("password"))
                    .fold(error.render().to_string(), |text, arg| {
                        text.replace(&arg, &tickbox::redact_url(&arg))
                    });
                let code = error.exit_code();
                if error.use_stderr() {
                    eprintln!("{}", text.trim_end());
                } else {
                    println!("{}", text.trim_end());
                }
                std::process::exit(code);
            }
        };
        if args.orders.is_some() && !args.runs(ModuleName::Orders) {
            Args::command()
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    "--orders needs the orders module, which places them: add orders to --modules",
                )
                .exit();
        }
        args
    }

    /// New orders this process places: none with `--resume` or without the
    /// orders module.
    pub fn orders(&self) -> u64 {
        if self.resume || !self.runs(ModuleName::Orders) {
            0
        } else {
            self.orders.unwrap_or(100)
        }
    }

    pub fn store(&self) -> Store<'_> {
        match &self.database_url {
            Some(url) => Store::Postgres(url),
            None => Store::Sqlite(&self.data_dir),
        }
    }

    /// Whether this process runs `module`'s handlers.
    pub fn runs(&self, module: ModuleName) -> bool {
        self.modules.is_empty() || self.modules.contains(&module)
    }

    /// Whether this process runs every module's handlers.
    pub fn runs_all(&self) -> bool {
        ModuleName::value_variants().iter().all(|m| self.runs(*m))
    }

    /// The modules whose handlers this process runs, as `--modules` names
    /// them.
    pub fn module_names(&self) -> Vec<&'static str> {
        ModuleName::value_variants()
            .iter()
            .filter(|m| self.runs(**m))
            .map(|m| m.name())
            .collect()
    }
}

impl ModuleName {
    pub fn name(self) -> &'static str {
        match self {
            ModuleName::Orders => "orders",
            ModuleName::Warehouse => "warehouse",
            ModuleName::Notifications => "notifications",
        }
    }
}

fn postgres_url(value: &str) -> Result<String, String> {
    if value.starts_with("postgres://") || value.starts_with("postgresql://") {
        Ok(value.to_string())
    } else {
        Err("takes a PostgreSQL URL (postgres://...); use --data-dir for SQLite".into())
    }
}

fn probability(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err("takes a probability between 0 and 1".into()),
    }
}

fn seconds(value: &str) -> Result<Duration, String> {
    match value.parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err("takes a number of seconds greater than 0".into()),
    }
}

fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    let addr = value
        .to_socket_addrs()
        .map_err(|e| format!("takes HOST:PORT (e.g. 127.0.0.1:9898): {e}"))?
        .next();
    addr.ok_or_else(|| "the host has no address".into())
}
