//! The command line: every flag, its default and its meaning.

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser, ValueEnum};
use secret_args::redact_arguments;
use std::ffi::OsString;
use std::process::ExitCode;

// Its value parser is for URLs checked as they are parsed; the benchmark
// checks its URLs when it connects.
#[allow(dead_code)]
#[path = "../../secret_args.rs"]
mod secret_args;

/// The tickbox benchmark: end-to-end messages per second through the bus,
/// against the database's own limit measured in the same run.
///
/// Workload: C producer tasks each commit a business row and publish one
/// message per transaction; one handler per message inserts a business row
/// in its inbox-guarded transaction; a run ends when N messages are handled.
/// The baseline runs the same transactions with plain diesel-async on
/// tickbox's own tables, with no bus. BENCHMARKS.md describes the method and
/// records the results.
#[derive(Debug, Clone, Parser)]
#[command(name = "bench", version, max_term_width = 100)]
#[command(after_help = "\
Exit status: 0 success; 1 a run failed (a database error, a stalled run, a failed \
verification); 2 usage error.")]
pub(crate) struct Args {
    /// sqlite (the default feature), postgres (needs the `postgres`
    /// feature) or mysql (MariaDB or MySQL: needs the `mysql` feature)
    #[arg(long, value_enum, value_name = "B")]
    pub(crate) backend: BackendKind,

    /// postgres: the server's URL [default: $TICKBOX_PG_URL or
    /// postgres://postgres@127.0.0.1:5432/test]; mysql: the server's URL,
    /// no database [default: $TICKBOX_MYSQL_URL or
    /// mysql://root@127.0.0.1:3306]; sqlite: a directory for the temporary
    /// databases [default: the system's temporary directory]
    #[arg(long, value_name = "URL")]
    pub(crate) database_url: Option<String>,

    /// Messages per measured run (1_000_000 may be written with underscores)
    #[arg(long, value_name = "N", default_value = "20000", value_parser = at_least_one)]
    pub(crate) messages: u64,

    /// Producer tasks, and connections per side
    #[arg(long, value_name = "C", default_value = "4", value_parser = at_least_one_usize)]
    pub(crate) concurrency: usize,

    /// Producers publish at most R messages/s in total (open loop)
    #[arg(long, value_name = "R", value_parser = rate)]
    pub(crate) rate: Option<f64>,

    /// Alternate baseline and tickbox K times, fresh databases each time;
    /// medians are reported
    #[arg(long, value_name = "K", default_value = "1", value_parser = at_least_one_usize)]
    pub(crate) repeat: usize,

    /// What to measure
    #[arg(long, value_enum, value_name = "S", default_value_t = Scenario::Throughput)]
    pub(crate) scenario: Scenario,

    /// Rows prefilled into the inbox for big-inbox
    #[arg(long, value_name = "R", default_value = "10000000", value_parser = number)]
    pub(crate) inbox_rows: u64,

    /// scheduled: rows scheduled for tomorrow beside the immediate path
    #[arg(long, value_name = "R", default_value = "1000000", value_parser = number)]
    pub(crate) scheduled_rows: u64,

    /// scheduled: messages whose lateness is measured, due spread over
    /// --due-over
    #[arg(long, value_name = "N", default_value = "100000", value_parser = number)]
    pub(crate) scheduled_messages: u64,

    /// scheduled: the seconds over which those messages fall due
    #[arg(long, value_name = "S", default_value = "30", value_parser = number)]
    pub(crate) due_over: u64,

    /// postgres: also run the same workload through the npm package
    /// pg-transactional-outbox (benches/peer/bench.js; installed with
    /// `npm ci` when needed)
    #[arg(long)]
    pub(crate) peer: bool,

    /// The peer's pattern
    #[arg(long, value_enum, value_name = "M", default_value_t = PeerMode::Inbox)]
    pub(crate) peer_mode: PeerMode,

    /// The peer's batch size [default: 2 x concurrency]
    #[arg(long, value_name = "B")]
    pub(crate) peer_batch: Option<usize>,

    /// The peer's polling interval, in milliseconds
    #[arg(long, value_name = "P", default_value = "1")]
    pub(crate) peer_poll_ms: u64,

    /// Do not install the tracing layer that timestamps each handler's
    /// COMMIT; latency is then measured to handler end
    #[arg(long)]
    pub(crate) no_trace: bool,

    /// throughput: run only one side (for profiling; no ratio then)
    #[arg(long, value_enum, value_name = "WHAT")]
    pub(crate) only: Option<Only>,

    /// The bus's scan interval, in milliseconds [default: the library's, 2 s]
    #[arg(long, value_name = "MS")]
    pub(crate) sweep_ms: Option<u64>,

    /// How long a delivered message waits to be marked with others, in
    /// milliseconds [default: the library's, 10 ms]. The cost guard holds
    /// marks back (a long linger), so that how many a mark gathers does not
    /// follow the speed the process runs at
    #[arg(long, value_name = "MS")]
    pub(crate) mark_linger_ms: Option<u64>,

    /// tickbox's handler takes up to B waiting messages per transaction
    /// (HandlerOptions::batch; 1: none)
    #[arg(long, value_name = "B", default_value = "1", value_parser = at_least_one_usize)]
    pub(crate) batch: usize,

    /// tickbox's producers publish with an ordering key, message n taking key
    /// n mod K (Tx::publish_keyed): each handler then takes a key's messages
    /// one at a time, in order. Without it, messages have no key
    #[arg(long, value_name = "K", value_parser = at_least_one_usize)]
    pub(crate) keys: Option<usize>,

    /// The producer module deletes outbox rows as they are delivered (an
    /// outbox retention of zero) instead of marking them
    #[arg(long)]
    pub(crate) delete_delivered: bool,

    /// How messages travel between the modules: in process (local), or
    /// through RabbitMQ (amqp: needs the `amqp` feature)
    #[arg(long, value_enum, value_name = "T", default_value_t = Transport::Local)]
    pub(crate) transport: Transport,

    /// amqp: the broker (each run declares its own namespace and deletes its
    /// queues and exchange at the end)
    #[arg(long, value_name = "URL", default_value = DEFAULT_AMQP_URL)]
    pub(crate) amqp_url: String,

    /// amqp: unacknowledged messages per consumer, for tickbox
    /// (Amqp::prefetch) and the raw baseline alike
    #[arg(long, value_name = "P", default_value = "32", value_parser = prefetch)]
    pub(crate) amqp_prefetch: u16,

    /// amqp: tickbox's relay publishes awaiting their confirm at once
    /// (Amqp::publish_window) [default: the library's, 256]
    #[arg(long, value_name = "W", value_parser = at_least_one_usize)]
    pub(crate) amqp_publish_window: Option<usize>,

    /// amqp: the raw baseline's publishes awaiting their confirm at once
    /// (that many publisher tasks, each awaiting its confirm before its
    /// next publish)
    #[arg(long, value_name = "K", default_value = "64", value_parser = at_least_one_usize)]
    pub(crate) raw_in_flight: usize,

    /// Also run the same workload through the Rust crate hexeract 0.6
    /// (benches/hexeract, built with cargo on first use): its SQL outbox
    /// worker with --transport local, its outbox-to-RabbitMQ path with
    /// --transport amqp
    #[arg(long)]
    pub(crate) hexeract: bool,

    /// hexeract: envelopes per poll of its outbox worker
    #[arg(long, value_name = "B", default_value = "100", value_parser = at_least_one_usize)]
    pub(crate) hexeract_batch: usize,

    /// hexeract: its outbox worker's wait after an empty poll, in ms
    #[arg(long, value_name = "MS", default_value = "1")]
    pub(crate) hexeract_poll_ms: u64,

    /// hexeract: outbox workers on one outbox (postgres only: FOR UPDATE
    /// SKIP LOCKED; hexeract's SQLite store takes one)
    #[arg(long, value_name = "W", default_value = "1", value_parser = at_least_one_usize)]
    pub(crate) hexeract_workers: usize,

    /// hexeract, amqp: RabbitMQ workers on the queue (each handles one
    /// message at a time) [default: concurrency]
    #[arg(long, value_name = "K")]
    pub(crate) hexeract_consumers: Option<usize>,

    /// Print tickbox's progress every 250 ms (diagnosis)
    #[arg(long)]
    pub(crate) timeline: bool,

    /// Print a final line with one JSON object
    #[arg(long)]
    pub(crate) json: bool,
}

impl Args {
    /// Whether the tracing layer timestamps each handler's COMMIT.
    pub(crate) fn trace(&self) -> bool {
        !self.no_trace
    }

    /// Whether this run measures the baseline (`--only` aside).
    pub(crate) fn runs_baseline(&self) -> bool {
        self.only != Some(Only::Tickbox)
    }

    /// Whether this run measures tickbox (`--only` aside).
    pub(crate) fn runs_tickbox(&self) -> bool {
        self.only != Some(Only::Baseline)
    }
}

/// The broker of `--transport amqp` unless `--amqp-url` says otherwise.
const DEFAULT_AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// How messages travel from the producer module to the consumer module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Transport {
    /// In process: the bus hands each committed message to the handler
    Local,
    /// Through RabbitMQ: one topic exchange, one quorum queue per handler
    Amqp,
}

impl Transport {
    /// The name given on the command line, printed and in the JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Transport::Local => "local",
            Transport::Amqp => "amqp",
        }
    }
}

/// The database the bench runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackendKind {
    /// SQLite: one file per module in a temporary directory
    Sqlite,
    /// PostgreSQL: one fresh schema per module, dropped at the end
    Postgres,
    /// MariaDB or MySQL: one fresh database per module, dropped at the end
    Mysql,
}

impl BackendKind {
    /// The name given on the command line, printed and in the JSON.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BackendKind::Sqlite => "sqlite",
            BackendKind::Postgres => "postgres",
            BackendKind::Mysql => "mysql",
        }
    }
}

/// What a run measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// Baseline vs tickbox
    Throughput,
    /// An unthrottled run, then a run at half its rate
    Latency,
    /// N messages pending in the outbox before the bus starts (use
    /// --messages 1000000); drain rate and memory
    Backlog,
    /// tickbox with an empty inbox vs one holding --inbox-rows rows
    BigInbox,
    /// Scheduled messages: the lateness of --scheduled-messages due over
    /// --due-over seconds, and the immediate path with --scheduled-rows
    /// rows scheduled for tomorrow vs none
    Scheduled,
}

/// How the peer runs the workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum PeerMode {
    /// Outbox -> inbox table -> handler, the package's full pattern
    Inbox,
    /// The handler runs in the outbox listener's transaction, no inbox table
    Direct,
}

impl PeerMode {
    /// The name the peer's script takes.
    pub(crate) fn name(self) -> &'static str {
        match self {
            PeerMode::Inbox => "inbox",
            PeerMode::Direct => "direct",
        }
    }
}

/// The one side a throughput run measures with `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Only {
    /// The same transactions with plain diesel-async
    Baseline,
    /// The workload through the bus
    Tickbox,
}

/// A count, underscores allowed (`1_000_000`).
fn number(text: &str) -> Result<u64, String> {
    text.replace('_', "")
        .parse()
        .map_err(|e| format!("not a whole number: {e}"))
}

/// A count of at least one, underscores allowed.
fn at_least_one(text: &str) -> Result<u64, String> {
    match number(text)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

/// A count of at least one, as a `usize`.
fn at_least_one_usize(text: &str) -> Result<usize, String> {
    usize::try_from(at_least_one(text)?).map_err(|e| e.to_string())
}

/// A prefetch count: 1 to 65535.
fn prefetch(text: &str) -> Result<u16, String> {
    u16::try_from(at_least_one(text)?).map_err(|e| e.to_string())
}

/// A rate of messages per second, above zero.
fn rate(text: &str) -> Result<f64, String> {
    let rate: f64 = text.parse().map_err(|e| format!("not a number: {e}"))?;
    if rate.is_nan() || rate <= 0.0 {
        return Err("must be above zero".into());
    }
    Ok(rate)
}

/// The command line, checked; on a usage error, or after `--help` or
/// `--version`, the exit status to end with (2, or 0) once it is printed.
pub(crate) fn parse() -> Result<Args, ExitCode> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let parsed = Args::try_parse_from(&argv).and_then(|args| {
        if args.peer && args.backend != BackendKind::Postgres {
            return Err(Args::command().error(
                ErrorKind::ArgumentConflict,
                "--peer compares on PostgreSQL: use it with --backend postgres",
            ));
        }
        if args.transport == Transport::Amqp && !cfg!(feature = "amqp") {
            return Err(Args::command().error(
                ErrorKind::ArgumentConflict,
                "--transport amqp needs the `amqp` feature: \
                 cargo run --release -p tickbox-bench --features amqp -- --transport amqp ...",
            ));
        }
        if args.hexeract && args.backend == BackendKind::Mysql {
            return Err(Args::command().error(
                ErrorKind::ArgumentConflict,
                "--hexeract compares on SQLite and PostgreSQL (hexeract has no MySQL store)",
            ));
        }
        if args.hexeract && args.scenario != Scenario::Throughput {
            return Err(Args::command().error(
                ErrorKind::ArgumentConflict,
                "--hexeract runs with the throughput scenario",
            ));
        }
        Ok(args)
    });
    parsed.map_err(|error| {
        let text = redact_arguments(&error.render().to_string(), &argv);
        if error.use_stderr() {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
        ExitCode::from(error.exit_code().clamp(0, 255) as u8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `line` (without the program's name).
    fn parse_line(line: &str) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("bench").chain(line.split_whitespace()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let args = parse_line("--backend sqlite").unwrap();
        assert_eq!(args.messages, 20_000);
        assert_eq!(args.concurrency, 4);
        assert_eq!(args.repeat, 1);
        assert_eq!(args.batch, 1);
        assert_eq!(args.inbox_rows, 10_000_000);
        assert_eq!(args.scenario, Scenario::Throughput);
        assert_eq!(args.peer_mode, PeerMode::Inbox);
        assert_eq!(args.peer_poll_ms, 1);
        assert!(args.trace() && args.runs_baseline() && args.runs_tickbox());
        assert!(args.rate.is_none() && args.only.is_none() && args.sweep_ms.is_none());
        assert!(args.mark_linger_ms.is_none());
        assert_eq!(args.transport, Transport::Local);
        assert_eq!(args.amqp_url, DEFAULT_AMQP_URL);
        assert_eq!((args.amqp_prefetch, args.raw_in_flight), (32, 64));
        assert!(!args.hexeract && args.hexeract_consumers.is_none());
    }

    #[test]
    fn counts_take_underscores_and_refuse_zero() {
        let args = parse_line("--backend postgres --messages 1_000_000 --scenario big-inbox");
        assert_eq!(args.unwrap().messages, 1_000_000);
        assert!(parse_line("--backend sqlite --messages 0").is_err());
        assert!(parse_line("--backend sqlite --concurrency 0").is_err());
        assert!(parse_line("--backend sqlite --rate 0").is_err());
        assert!(
            parse_line("--messages 10").is_err(),
            "--backend is required"
        );
    }

    #[test]
    fn mysql_is_a_backend_without_peers() {
        let args = parse_line("--backend mysql --database-url mysql://root@h:3306").unwrap();
        assert_eq!(args.backend, BackendKind::Mysql);
        assert_eq!(args.backend.name(), "mysql");
    }

    #[test]
    fn a_password_in_a_stray_argument_is_masked() {
        let line = "--backend postgres postgres://u:secret@h/db";
        let error = parse_line(line).unwrap_err();
        let args: Vec<OsString> = line.split_whitespace().map(OsString::from).collect();
        let text = redact_arguments(&error.render().to_string(), &args);
        assert!(!text.contains("secret"), "{text}");
    }
}
