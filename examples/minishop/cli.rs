//! The command line.

use clap::{CommandFactory, Parser, ValueEnum};
use secret_args::Secret;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;
use tickbox::EffectPolicy;

#[path = "../../tools/secret_args.rs"]
mod secret_args;

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

Over RabbitMQ (--transport amqp, the `amqp` feature) the processes share nothing but the
broker: each opens only the databases of the modules it runs (--modules), publishes their
outboxes to the exchange tickbox.<namespace> and consumes its handlers' queues. How a process
knows the flow is finished, and what it checks, depends on the databases it sees (its own,
and those it finds with --check-data-dir / --check-database-url):
  - it sees the orders database (it runs orders, or finds it): it runs until no run is
    placing orders, every order is confirmed (and e-mailed, if it sees the notifications
    database) and no visible outbox holds a pending message, as over the local transport;
  - it does not (warehouse or notifications alone): it runs until its database holds work
    and its handlers have been idle (queues empty, nothing in flight or pending in its
    outbox) for --settle seconds on end.
It then checks what it sees and says what it could not: e.g. the warehouse alone checks that
no order has two reservations, that the stock taken matches them, that every message it
received was handled (its queues drained, no dead letter); the orders alone that every order
was confirmed exactly once. With the check flags naming the other two modules' databases,
every process waits for and checks the whole flow. A broker out of reach at start is tried
again (until --timeout, or for a minute); one refusing the credentials ends the run, exit 1.

E-mails over SMTP (--smtp): each confirmation goes to the mail server through the
notifications module's effects journal, which records it as started (committed) before the
call and as succeeded after it; a redelivered message gets the recorded result back instead of
sending again. An e-mail cut short by a crash (sent, or perhaps sent, but not recorded) follows
--email-policy: at-least-once-with-key sends it again with the same Message-ID
(<KEY@minishop.example>, KEY the effect's idempotency key), for the server or the recipient's
inbox to fold; at-most-once never sends it twice: it becomes unknown and its delivery a dead
letter, for a person to settle (the operator's tool: tickbox effects list --state unknown).
--crash-at aborts the process at one of two points of sending, to show both (run again with
--resume until it finishes):
  - after-send: the server accepted the e-mail, the journal does not know it yet;
  - after-journal: the journal recorded it, the delivery's transaction (its sent_emails row,
    its inbox row) never commits.
While a crash point is armed the e-mails are sent one at a time, so that an abort cuts exactly
the one e-mail it was placed after.

Exit code: 0 when every order has exactly one reservation, one confirmation and one e-mail
(or, rejected for want of stock, none of them; or, cancelled by its --confirm-within timeout,
no confirmation and no e-mail, and not before its deadline), no message is pending, there are
no dead letters and, with --disturb, every disturbing message was ignored; with --smtp, no e-mail is
unknown under at-least-once-with-key and the journal's e-mails (sent and unknown) add up to
the confirmed orders; an order whose e-mail is unknown under at-most-once needs no e-mail, and
its delivery's dead letter (waiting for a person) does not count against the run; 1 otherwise;
2 for bad arguments (or --metrics-addr without the `prometheus` feature); 130 when interrupted."
)]
pub struct Args {
    /// Place N new orders, then run until the whole flow is done (default
    /// 100; only a process running the orders module places orders)
    #[arg(long, value_name = "N", conflicts_with = "resume")]
    orders: Option<u64>,

    /// Wait this long between two orders: a steady pace for as long as the
    /// orders last (N orders take at least N × MILLIS ms) instead of as
    /// fast as the database takes them, e.g. to keep a run busy while its
    /// network is disturbed
    #[arg(long, value_name = "MILLIS", default_value = "0", value_parser = millis)]
    pub order_interval: Duration,

    /// Give each order placed this long to be confirmed: the transaction
    /// placing it also schedules an OrderTimedOut, due then, which cancels
    /// the order if the warehouse has not answered by that time, and which
    /// the saga ignores (saga_ignored) if it has. With the warehouse slow or
    /// stopped (--modules without it, for a while), orders time out. A run
    /// ends once every timeout it scheduled has come (default: no deadline)
    #[arg(long, value_name = "SECONDS", value_parser = seconds)]
    pub confirm_within: Option<Duration>,

    /// SQLite: one database file per module in DIR
    #[arg(long, value_name = "DIR", default_value = "./minishop-data")]
    data_dir: PathBuf,

    /// PostgreSQL (postgres://…, needs the `postgres` feature): one schema
    /// per module, minishop_orders, minishop_warehouse,
    /// minishop_notifications; MariaDB or MySQL (mysql://…, needs the
    /// `mysql` feature): one database per module, of the same names
    #[arg(long, value_name = "URL", value_parser = Secret(server_url), conflicts_with = "data_dir")]
    database_url: Option<String>,

    /// With --database-url: the prefix of the modules' schema (MariaDB/MySQL:
    /// database) names, PREFIX_orders, PREFIX_warehouse and
    /// PREFIX_notifications; several shops can share one server
    #[arg(long, value_name = "PREFIX", default_value = "minishop", value_parser = schema_prefix, requires = "database_url")]
    pub schema_prefix: String,

    /// Place no orders; only finish pending work (after a crash)
    #[arg(long)]
    pub resume: bool,

    /// Run only these modules' handlers (default all three); other processes
    /// over the same databases (or, with --transport amqp, the same broker)
    /// run the rest, and each runs until the whole flow is done (over amqp:
    /// see below)
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    modules: Vec<ModuleName>,

    /// With several processes over the same databases: how many of them
    /// place orders (--orders). Each process then waits until that many
    /// placing runs are recorded in the orders database, and all have
    /// ended, before it deems the flow done, so that one starting late is
    /// waited for (default: the runs recorded so far, and at least one for
    /// a process that places none itself)
    #[arg(long, value_name = "N")]
    pub placers: Option<usize>,

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

    /// Put the handlers' own safeguards to the test: place one more order
    /// the warehouse can fill and one it cannot (rejected); once they are
    /// settled, deliver messages that do not fit them (a second
    /// StockReserved for the confirmed order, one for the rejected order,
    /// one for an order nobody placed, a StockShort for the confirmed
    /// order, an OrderPlaced again for each), each as a new message the
    /// inbox has not seen. The handlers must ignore and record every one
    /// (saga_ignored, warehouse_ignored); the check fails if one is applied.
    /// Needs all three modules in this process
    #[arg(long, conflicts_with = "resume")]
    pub disturb: bool,

    /// Serve the metrics for Prometheus at http://HOST:PORT/metrics while
    /// the run lasts (needs the `prometheus` feature)
    #[arg(long, value_name = "HOST:PORT", value_parser = socket_addr)]
    pub metrics_addr: Option<SocketAddr>,

    /// Export this process's spans (each order's, and tickbox's create,
    /// send and process spans) over OTLP/HTTP to the collector's traces URL,
    /// e.g. http://127.0.0.1:4318/v1/traces (needs the `opentelemetry`
    /// feature): one order is one trace across every process of the shop
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// Print the result as one JSON object on stdout, and nothing else
    #[arg(long)]
    pub json: bool,

    /// How the modules' messages travel: through the shared databases
    /// (local), or through RabbitMQ (amqp, needs the `amqp` feature), each
    /// process then opening only its own modules' databases
    #[arg(long, value_enum, default_value_t = Transport::Local)]
    pub transport: Transport,

    /// The RabbitMQ broker (with --transport amqp)
    #[arg(long, value_name = "URL", default_value = DEFAULT_AMQP_URL, value_parser = Secret(amqp_url))]
    pub amqp_url: String,

    /// Prefix of the exchange and queues on the broker (tickbox.NAME,
    /// tickbox.NAME.MODULE.HANDLER); processes of one shop use the same, a
    /// new name isolates a run (use it with new databases)
    #[arg(long, value_name = "NAME", default_value = "minishop", value_parser = namespace)]
    pub amqp_namespace: String,

    /// With --transport amqp and SQLite: where to find the databases of the
    /// modules this process does not run, for waiting on and checking the
    /// whole flow; each module's is MODULE.db in the first DIR holding one
    /// (waited for until it appears). May be given several times
    #[arg(long, value_name = "DIR", conflicts_with = "database_url")]
    pub check_data_dir: Vec<PathBuf>,

    /// With --transport amqp and --database-url: the same, on the same kind
    /// of server; each module's is the schema (MariaDB/MySQL: database)
    /// PREFIX_MODULE (--schema-prefix) in the first URL's server holding
    /// it. May be given
    /// several times
    #[arg(long, value_name = "URL", value_parser = Secret(server_url), requires = "database_url")]
    pub check_database_url: Vec<String>,

    /// With --transport amqp, for a process that sees no orders database:
    /// finish once its handlers have been idle this long after its
    /// database holds work
    #[arg(long, value_name = "SECONDS", default_value = "5", value_parser = seconds)]
    pub settle: Duration,

    /// Send each order's confirmation as a real e-mail to the SMTP server at
    /// HOST:PORT (plain SMTP: no TLS, no login; a relay on a trusted network
    /// or a local sink), through the notifications module's effects journal
    /// (see below). Without it an e-mail is only a row in sent_emails, and
    /// nothing leaves the process
    #[arg(long, value_name = "HOST:PORT", value_parser = socket_addr)]
    pub smtp: Option<SocketAddr>,

    /// With --smtp: what becomes of an e-mail cut short by a crash (sent, or
    /// perhaps sent, but not recorded in the journal)
    #[arg(long, value_enum, value_name = "POLICY", default_value_t = EmailPolicy::AtLeastOnceWithKey, requires = "smtp")]
    pub email_policy: EmailPolicy,

    /// With --smtp: abort the process (as a crash would) at this point of
    /// sending an e-mail, with probability --crash-rate per e-mail; run
    /// again with --resume to finish (see below)
    #[arg(long, value_enum, value_name = "POINT", requires = "smtp")]
    pub crash_at: Option<CrashPoint>,

    /// With --crash-at: the probability (0..=1) of aborting at that point,
    /// per e-mail
    #[arg(long, value_name = "P", default_value_t = 0.1, value_parser = probability, requires = "crash_at")]
    pub crash_rate: f64,
}

/// What becomes of an e-mail cut short by a crash (`--email-policy`): the
/// effect's [`EffectPolicy`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EmailPolicy {
    /// Send it again, with the same Message-ID, within 24 hours of the
    /// first try (later it becomes unknown): the server or the recipient's
    /// inbox folds the repeat
    AtLeastOnceWithKey,
    /// Never send it twice: it becomes unknown and its delivery a dead
    /// letter, for a person to settle
    AtMostOnce,
}

/// How long a mail server or an inbox is counted on to fold a repeated
/// Message-ID, for `--email-policy at-least-once-with-key`: an e-mail due
/// again later than this after its first try is not sent blind.
pub const EMAIL_KEY_WINDOW: Duration = Duration::from_secs(24 * 3600);

impl EmailPolicy {
    /// The effects journal's policy for the confirmation e-mail.
    pub fn effect_policy(self) -> EffectPolicy {
        match self {
            EmailPolicy::AtLeastOnceWithKey => {
                EffectPolicy::at_least_once_with_key(EMAIL_KEY_WINDOW)
            }
            EmailPolicy::AtMostOnce => EffectPolicy::at_most_once(),
        }
    }
}

/// Where `--crash-at` aborts the process while sending an e-mail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CrashPoint {
    /// Right after the SMTP server accepted the e-mail, before the journal
    /// records it: the next delivery finds it started
    AfterSend,
    /// Right after the journal recorded it, before the delivery's
    /// transaction commits: the next delivery finds it succeeded
    AfterJournal,
}

/// The example's modules, as `--modules` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModuleName {
    Orders,
    Warehouse,
    Notifications,
}

/// How messages travel between the modules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Transport {
    /// Each bus reads the outboxes in the modules' databases and hands their
    /// messages to its handlers: the processes share the databases.
    Local,
    /// Through a RabbitMQ broker: the processes share nothing else.
    Amqp,
}

/// The broker `--amqp-url` names by default: a local RabbitMQ's guest
/// account.
pub const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

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

/// Where the databases of the modules this process does not run are, for
/// the check, in the order to look in.
pub enum CheckStore<'a> {
    /// Directories of SQLite files.
    Sqlite(&'a [PathBuf]),
    /// PostgreSQL databases (one schema per module) or MariaDB/MySQL
    /// servers (one database per module), of the same kind as
    /// `--database-url`.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    Servers(&'a [String]),
}

impl Args {
    /// The arguments of this process; exits with code 2 and a usage message
    /// when they are wrong, with 0 after `--help`.
    pub fn parse_or_exit() -> Args {
        let args = Args::try_parse().unwrap_or_else(|error| secret_args::exit(error));
        if args.orders.is_some() && !args.runs(ModuleName::Orders) {
            Args::command()
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    "--orders needs the orders module, which places them: add orders to --modules",
                )
                .exit();
        }
        if args.disturb && !args.runs_all() {
            Args::command()
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    "--disturb delivers messages to the handlers of all three modules: run them \
                     all in this process (no --modules)",
                )
                .exit();
        }
        if args.transport == Transport::Local
            && !(args.check_data_dir.is_empty() && args.check_database_url.is_empty())
        {
            Args::command()
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    "--check-data-dir and --check-database-url are for --transport amqp: over \
                     the local transport every process reads all three databases",
                )
                .exit();
        }
        if let Some(url) = &args.database_url {
            let kind = server_kind(url);
            if args
                .check_database_url
                .iter()
                .any(|other| server_kind(other) != kind)
            {
                Args::command()
                    .error(
                        clap::error::ErrorKind::ArgumentConflict,
                        "--check-database-url names a server of the same kind as --database-url \
                         (postgres:// or mysql://)",
                    )
                    .exit();
            }
        }
        args
    }

    /// Where this process finds the databases of the modules it does not
    /// run, for the check (`--check-data-dir`, `--check-database-url`).
    pub fn check_store(&self) -> CheckStore<'_> {
        match &self.database_url {
            Some(_) => CheckStore::Servers(&self.check_database_url),
            None => CheckStore::Sqlite(&self.check_data_dir),
        }
    }

    /// Whether the messages travel through a broker.
    pub fn over_amqp(&self) -> bool {
        self.transport == Transport::Amqp
    }

    /// Whether this build has the transport the arguments ask for; if not,
    /// why, and the exit code (2).
    pub fn transport_built(&self) -> Result<(), (String, u8)> {
        if self.over_amqp() && !cfg!(feature = "amqp") {
            let error =
                "--transport amqp needs the `amqp` feature: cargo run --release --features \
                         amqp --example minishop -- --transport amqp";
            return Err((error.to_string(), 2));
        }
        Ok(())
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
            Some(url) if url.starts_with("mysql://") => Store::Mysql(url),
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

/// A PostgreSQL URL (`postgres://`) or a MariaDB/MySQL one (`mysql://`).
fn server_url(value: &str) -> Result<String, String> {
    if server_kind(value).is_some() {
        Ok(value.to_string())
    } else {
        Err(
            "takes a PostgreSQL URL (postgres://...) or a MariaDB/MySQL URL (mysql://...); use \
             --data-dir for SQLite"
                .into(),
        )
    }
}

/// The kind of server a URL names: "PostgreSQL" or "MariaDB/MySQL".
fn server_kind(url: &str) -> Option<&'static str> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        Some("PostgreSQL")
    } else if url.starts_with("mysql://") {
        Some("MariaDB/MySQL")
    } else {
        None
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

fn amqp_url(value: &str) -> Result<String, String> {
    if value.starts_with("amqp://") || value.starts_with("amqps://") {
        Ok(value.to_string())
    } else {
        Err(
            "takes a RabbitMQ URL (amqp://user:password@host:port/vhost, or amqps:// over TLS)"
                .into(),
        )
    }
}

fn namespace(value: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !value.is_empty() && value.chars().all(allowed) {
        Ok(value.to_string())
    } else {
        Err("takes a name of letters, digits, '-', '_' and '.'".into())
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

fn millis(value: &str) -> Result<Duration, String> {
    match value.parse::<u64>() {
        Ok(ms) => Ok(Duration::from_millis(ms)),
        _ => Err("takes a whole number of milliseconds".into()),
    }
}

fn socket_addr(value: &str) -> Result<SocketAddr, String> {
    let addr = value
        .to_socket_addrs()
        .map_err(|e| format!("takes HOST:PORT (e.g. 127.0.0.1:9898): {e}"))?
        .next();
    addr.ok_or_else(|| "the host has no address".into())
}
