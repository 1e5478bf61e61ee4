//! `tickbox` — the operator's command-line tool for a tickbox module's
//! database.
//!
//! It attaches to the database of one module (an SQLite file, or a
//! PostgreSQL database and schema) without running migrations and without
//! any handler code, so it is safe to run while the application runs. It
//! shows the outbox backlog, its lag and its stalled messages, the inbox size
//! and the dead letters; it lists the subscriptions recorded in the outbox
//! (the handlers, in any process, that receive its messages) and retires one
//! whose handler is gone for good; it puts dead letters back in the outbox
//! for redelivery or discards them; and it runs the retention sweep once.
//!
//! It runs no bus, so what a bus would count itself it counts from the
//! database: a message is stalled when it has been pending for longer than
//! `--stalled-after` (60 s, the default of `BusBuilder::stalled_after`).
//!
//! ```text
//! cargo run --bin tickbox -- --database-url minishop-data/orders.db status
//! cargo run --bin tickbox -- --database-url minishop-data/orders.db subscriptions
//! cargo run --bin tickbox -- --database-url minishop-data/orders.db dead-letters list
//! cargo run --features postgres --bin tickbox -- \
//!     --database-url postgres://postgres@127.0.0.1/shop --schema minishop_orders status
//! cargo run --bin tickbox -- help
//! ```
//!
//! Exit status: 0 on success, 1 when the operation failed (the database
//! cannot be opened or has no tickbox tables, a query failed, the dead letter
//! or the subscription does not exist, a running process still serves the
//! subscription), 2 on a usage error.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tickbox::{Backend, DeadLetter, Module, ModuleHandle, Retention, Subscription};
use uuid::Uuid;

/// The environment variable read when `--database-url` is not given.
const DATABASE_URL_ENV: &str = "TICKBOX_DATABASE_URL";

/// Dead letters listed per page unless `--limit` says otherwise.
const DEFAULT_LIMIT: u64 = 50;

/// Characters of a dead letter's reason shown in `dead-letters list`.
const REASON_WIDTH: usize = 60;

/// The longest retention accepted (100 years): longer ones would overflow
/// the microsecond arithmetic of the sweep.
const MAX_RETENTION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How long a message is pending before `status` counts it as stalled,
/// unless `--stalled-after` says otherwise: the default of the bus's
/// `BusBuilder::stalled_after`, so that both count the same messages.
const DEFAULT_STALLED_AFTER: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------
// Help texts

/// A page of help: the main one or one command's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topic {
    Main,
    Status,
    DeadLetters,
    List,
    Show,
    Replay,
    Discard,
    Subscriptions,
    SubscriptionsList,
    Retire,
    Sweep,
    Help,
}

impl Topic {
    /// The command words that lead to this page (`dead-letters show`).
    fn command(self) -> &'static str {
        match self {
            Topic::Main => "",
            Topic::Status => "status",
            Topic::DeadLetters => "dead-letters",
            Topic::List => "dead-letters list",
            Topic::Show => "dead-letters show",
            Topic::Replay => "dead-letters replay",
            Topic::Discard => "dead-letters discard",
            Topic::Subscriptions => "subscriptions",
            Topic::SubscriptionsList => "subscriptions list",
            Topic::Retire => "subscriptions retire",
            Topic::Sweep => "sweep",
            Topic::Help => "help",
        }
    }

    /// The usage line (without the `Usage: ` prefix).
    fn usage(self) -> &'static str {
        match self {
            Topic::Main => "tickbox [OPTIONS] <COMMAND> [ARGS]",
            Topic::Status => "tickbox [OPTIONS] status [--stalled-after DURATION]",
            Topic::DeadLetters => {
                "tickbox [OPTIONS] dead-letters <list|show|replay|discard> [ARGS]"
            }
            Topic::List => "tickbox [OPTIONS] dead-letters list [--offset N] [--limit N]",
            Topic::Show => "tickbox [OPTIONS] dead-letters show MESSAGE_ID HANDLER",
            Topic::Replay => "tickbox [OPTIONS] dead-letters replay MESSAGE_ID HANDLER",
            Topic::Discard => "tickbox [OPTIONS] dead-letters discard MESSAGE_ID HANDLER --yes",
            Topic::Subscriptions => "tickbox [OPTIONS] subscriptions [list|retire] [ARGS]",
            Topic::SubscriptionsList => "tickbox [OPTIONS] subscriptions [list]",
            Topic::Retire => "tickbox [OPTIONS] subscriptions retire MODULE HANDLER --yes",
            Topic::Sweep => {
                "tickbox [OPTIONS] sweep [--inbox-retention DURATION]\n                               [--outbox-retention DURATION]"
            }
            Topic::Help => "tickbox help [COMMAND]",
        }
    }

    /// The page after the usage line.
    fn body(self) -> &'static str {
        match self {
            Topic::Main => MAIN_HELP,
            Topic::Status => STATUS_HELP,
            Topic::DeadLetters => DEAD_LETTERS_HELP,
            Topic::List => LIST_HELP,
            Topic::Show => SHOW_HELP,
            Topic::Replay => REPLAY_HELP,
            Topic::Discard => DISCARD_HELP,
            Topic::Subscriptions => SUBSCRIPTIONS_HELP,
            Topic::SubscriptionsList => SUBSCRIPTIONS_LIST_HELP,
            Topic::Retire => RETIRE_HELP,
            Topic::Sweep => SWEEP_HELP,
            Topic::Help => HELP_HELP,
        }
    }

    /// The whole help page.
    fn help(self) -> String {
        let mut page = String::new();
        if self == Topic::Main {
            page.push_str(concat!(
                "tickbox ",
                env!("CARGO_PKG_VERSION"),
                " - inspect and repair the database of a tickbox module\n\n"
            ));
        }
        page.push_str("Usage: ");
        page.push_str(self.usage());
        page.push_str("\n\n");
        // Global options go after the command's own text, before its examples.
        let body = self.body();
        let (text, examples) = match body.find("\nExamples:\n") {
            Some(at) => body.split_at(at + 1),
            None => (body, ""),
        };
        page.push_str(text.trim_end());
        page.push('\n');
        if self != Topic::Help {
            page.push_str(GLOBAL_OPTIONS);
        }
        if !examples.is_empty() {
            page.push('\n');
            page.push_str(examples);
        }
        if self != Topic::Main {
            page.push_str(
                "\nExit status: 0 success, 1 the operation failed, 2 usage error \
                 (see `tickbox help`).\n",
            );
        }
        if !cfg!(feature = "postgres") {
            page.push_str(
                "\nThis binary was built without PostgreSQL support; build it with\n\
                 `--features postgres` to open postgres:// URLs.\n",
            );
        }
        page
    }

    /// The command's words of the page for `tickbox help …`, if any.
    fn from_words(words: &[String]) -> Option<Topic> {
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        Some(match words.as_slice() {
            [] => Topic::Main,
            ["status"] => Topic::Status,
            ["dead-letters"] => Topic::DeadLetters,
            ["dead-letters", "list"] => Topic::List,
            ["dead-letters", "show"] => Topic::Show,
            ["dead-letters", "replay"] => Topic::Replay,
            ["dead-letters", "discard"] => Topic::Discard,
            ["subscriptions"] => Topic::Subscriptions,
            ["subscriptions", "list"] => Topic::SubscriptionsList,
            ["subscriptions", "retire"] => Topic::Retire,
            ["sweep"] => Topic::Sweep,
            ["help"] => Topic::Help,
            _ => return None,
        })
    }
}

const MAIN_HELP: &str = "\
Attaches to the database of one module - an SQLite file, or a PostgreSQL
database and schema - without running migrations or any handler code, so it
is safe to use while the application runs.

Commands:
  status                 Outbox backlog, lag and stalled messages, subscriptions,
                         inbox size, dead letter count
  subscriptions [list]   List the handlers, in any process, that receive this outbox's
                         messages: alive or stopped, and the oldest message each still owes
  subscriptions retire   Retire a stopped subscription whose handler is gone for good
                         (requires --yes)
  dead-letters list      List dead letters, oldest first
  dead-letters show      Show one dead letter in full, payload included
  dead-letters replay    Put a dead letter's message back in the outbox for redelivery
  dead-letters discard   Delete a dead letter for good (requires --yes)
  sweep                  Run the retention sweep once and report what it deleted
  help [COMMAND]         Show this help, or a command's

Examples:
  tickbox --database-url minishop-data/orders.db status
  tickbox --database-url minishop-data/orders.db subscriptions
  tickbox --database-url minishop-data/warehouse.db dead-letters list --limit 20
  tickbox --database-url minishop-data/warehouse.db dead-letters replay \\
      0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69 warehouse.reserve_stock
  TICKBOX_DATABASE_URL=postgres://app@db.internal/shop \\
      tickbox --schema minishop_orders --json status
  tickbox help dead-letters discard

Exit status:
  0  Success
  1  The operation failed: the database cannot be opened or has no tickbox
     tables, a query failed, the dead letter or the subscription does not
     exist, or a running process still serves the subscription to retire
  2  Usage error: unknown command or option, missing or malformed argument,
     or a destructive command without --yes
";

const STATUS_HELP: &str = "\
Shows the module's outbox backlog (messages not yet delivered to every
subscriber), its lag (the age of the oldest of them) and how many of them are
stalled (pending for longer than --stalled-after); the subscriptions recorded
in the outbox (how many are alive and stopped, and the largest lag of one:
the age of the oldest message a subscription still owes); the number of inbox
rows (the duplicate-detection window) and the number of dead letters.

The application's bus counts stalled messages too (tickbox_outbox_stalled),
by its own threshold, BusBuilder::stalled_after; this tool runs no bus and
counts them in the database. Give the application's threshold if it changed
the default.

Options:
      --stalled-after DURATION   Count a message pending this long as stalled
                                 [default: 60s, the bus's default]

A DURATION is a number with a unit - s, m, h, d or w - or several of them
(1h30m).

With --json: one object with backend, outbox_pending, oldest_pending_us
(microseconds since the Unix epoch, or null), lag_seconds (or null), stalled,
stalled_after_seconds, subscriptions_alive, subscriptions_stopped,
subscription_lag_seconds (or null when no subscription owes a message),
lagging_subscription (the module and handler of the subscription owed the
oldest message, or null), inbox_rows and dead_letters.

Examples:
  tickbox --database-url minishop-data/orders.db status
  tickbox --database-url minishop-data/orders.db status --stalled-after 5m
  tickbox --database-url minishop-data/orders.db --json status
";

const SUBSCRIPTIONS_HELP: &str = "\
A subscription is a handler - of any module, in any process - that receives
this module's messages of one topic. Each bus records the handlers it serves
in the publishing module's database, and says every sweep interval that they
are still served: the subscription is alive. A message is finished only when
no subscription still owes it, so the subscription of a process that stopped
keeps the messages it owes until that process runs again: it is stopped. One
whose handler is gone for good is retired.

Subcommands:
  list      List the subscriptions: state, and the oldest message each still owes
            (the default: `tickbox subscriptions` alone lists them)
  retire    Retire a stopped subscription whose handler is gone (requires --yes)

Run `tickbox help subscriptions <SUBCOMMAND>` for a subcommand's options.

Examples:
  tickbox --database-url minishop-data/orders.db subscriptions
  tickbox --database-url minishop-data/orders.db subscriptions retire \\
      warehouse warehouse.reserve_stock --yes
";

const SUBSCRIPTIONS_LIST_HELP: &str = "\
Lists the subscriptions recorded in this module's outbox, by module and
handler: the subscribing module, the handler, the topic it receives, its
state - alive (a running bus serves it) or stopped (no running bus has since
it was last seen) - when it was first recorded (UTC, ISO 8601), and the age
of the oldest message it still owes (- when it owes none).

A stopped subscription keeps its messages until a process serving it runs
again; `tickbox subscriptions retire` gives up on one whose handler is gone.

With --json: an array of subscription objects (module, handler, topic,
subscribed_at_us, seen_at_us, alive_until_us, oldest_pending_us - times in
microseconds since the Unix epoch, null when none - alive, and lag_seconds,
the age of the oldest message it owes or null).

Examples:
  tickbox --database-url minishop-data/orders.db subscriptions
  tickbox --database-url minishop-data/orders.db --json subscriptions list
";

const RETIRE_HELP: &str = "\
Retires the subscription of handler HANDLER of module MODULE from this
module's outbox, for a handler removed from the code or a process gone for
good: its messages are no longer kept for it, and those only it still owed
are marked delivered - it will never receive them. Messages that other
subscriptions still owe stay pending for them. There is no prompt; the
command refuses to run without --yes.

Refused while a running process serves the subscription (it would miss
messages, and its process records it again): stop that process, or remove
the handler from it, first. A process started later with the handler
subscribes it again.

Arguments:
  MODULE    The subscribing module, as `tickbox subscriptions` prints it
  HANDLER   The handler's name

Options:
  -y, --yes     Confirm the retirement

When it was the last subscription of its topic, the messages of the topic
still pending are left to the application's bus: it delivers them to the
handlers it then has for the topic, or finishes them if it has none.

With --json: one object with module, handler, topic, retired, finished (the
number of messages only it owed, now marked delivered) and
topic_subscriptions_left (the subscriptions of its topic still recorded).

Examples:
  tickbox --database-url minishop-data/orders.db subscriptions retire \\
      warehouse warehouse.reserve_stock --yes
";

const DEAD_LETTERS_HELP: &str = "\
Dead letters are deliveries the bus gave up on: after the last retry, on a
permanent handler error, for a payload that does not decode, or for a topic no
module publishes. Each is keyed by its message id and the handler that gave
up; the handler is empty when no handler could be chosen (an unknown topic) -
write it as - or '' on the command line.

Subcommands:
  list      List dead letters, oldest first
  show      Show one dead letter in full, payload included
  replay    Put a dead letter's message back in the outbox for redelivery
  discard   Delete a dead letter for good (requires --yes)

Run `tickbox help dead-letters <SUBCOMMAND>` for a subcommand's options.

Examples:
  tickbox --database-url minishop-data/warehouse.db dead-letters list
  tickbox --database-url minishop-data/orders.db dead-letters show \\
      0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69 -
";

const LIST_HELP: &str = "\
Lists the module's dead letters, oldest first: message id, handler (- when
none), topic, attempts, when it was given up on (UTC, ISO 8601) and the
reason, shortened to one line. `show` prints one in full.

Options:
      --offset N    Skip the first N dead letters [default: 0]
      --limit N     Show at most N dead letters [default: 50]

With --json: an array of dead letter objects (message_id, handler, topic,
payload, correlation_id, causation_id, created_at_us, attempts, reason,
dead_at_us).

Examples:
  tickbox --database-url minishop-data/warehouse.db dead-letters list
  tickbox --database-url minishop-data/warehouse.db dead-letters list \\
      --offset 50 --limit 50
";

const SHOW_HELP: &str = "\
Shows everything about one dead letter: ids, topic, times, attempts, the full
reason and the payload (pretty-printed when it is JSON).

Arguments:
  MESSAGE_ID   The message's id (a UUID, as `dead-letters list` prints it)
  HANDLER      The handler that gave up; - or '' for none (an unknown topic)

With --json: the dead letter as one object.

Examples:
  tickbox --database-url minishop-data/warehouse.db dead-letters show \\
      0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69 warehouse.reserve_stock
  tickbox --database-url minishop-data/orders.db dead-letters show \\
      0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69 -
";

const REPLAY_HELP: &str = "\
Puts a dead letter's message back in this module's outbox as pending and
removes the dead letter, in one transaction. The application's bus delivers it
again to every subscriber of its topic: on PostgreSQL at once (the commit
wakes it), on SQLite at its next outbox scan (every 2 s by default), and at
start if no application runs now. Handlers that did process it skip it thanks
to their inbox, the one that gave up tries again.
No handler code runs in this tool.

Arguments:
  MESSAGE_ID   The message's id (a UUID, as `dead-letters list` prints it)
  HANDLER      The handler that gave up; - or '' for none (an unknown topic)

With --json: one object with message_id, handler, topic and requeued.

Examples:
  tickbox --database-url minishop-data/warehouse.db dead-letters replay \\
      0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69 warehouse.reserve_stock
";

const DISCARD_HELP: &str = "\
Deletes a dead letter without delivering its message: the handler that gave
up will never process it. There is no prompt; the command refuses to run
without --yes.

Arguments:
  MESSAGE_ID   The message's id (a UUID, as `dead-letters list` prints it)
  HANDLER      The handler that gave up; - or '' for none (an unknown topic)

Options:
  -y, --yes     Confirm the deletion

With --json: one object with message_id, handler, topic and discarded.

Examples:
  tickbox --database-url minishop-data/warehouse.db dead-letters discard \\
      0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69 warehouse.reserve_stock --yes
";

const SWEEP_HELP: &str = "\
Runs the retention sweep once, as the application's bus does every minute:
deletes inbox rows processed longer ago than the inbox retention and outbox
rows delivered longer ago than the outbox retention, in small batches.
Undelivered outbox rows and dead letters are never deleted.

Inbox rows are the duplicate-detection window: keep the inbox retention
longer than the application's redelivery horizon (its retry policies), or a
late duplicate would be processed twice. This tool cannot see those policies.

Options:
      --inbox-retention DURATION    Keep inbox rows this long [default: 7d]
      --outbox-retention DURATION   Keep delivered outbox rows this long [default: 7d]

A DURATION is a number with a unit - s, m, h, d or w - or several of them
(1h30m), or `never` to keep every row.

With --json: one object with inbox_rows and outbox_rows (rows deleted) and
inbox_retention_seconds and outbox_retention_seconds (null for never).

Examples:
  tickbox --database-url minishop-data/warehouse.db sweep
  tickbox --database-url minishop-data/warehouse.db sweep \\
      --inbox-retention 30d --outbox-retention 12h
  tickbox --database-url minishop-data/orders.db sweep --inbox-retention never
";

const HELP_HELP: &str = "\
Shows the main help, or a command's: `tickbox help dead-letters replay` is
the same as `tickbox dead-letters replay --help`.
";

const GLOBAL_OPTIONS: &str = "
Global options (before or after the command):
      --database-url URL   The module's database: an SQLite file path or
                           sqlite://PATH, or postgres://USER[:PASSWORD]@HOST[:PORT]/DB
                           [env: TICKBOX_DATABASE_URL]
      --schema NAME        PostgreSQL: the schema holding the module's tables
                           [default: the connection's search_path]
      --json               Print one JSON object or array instead of text
  -h, --help               Show help
  -V, --version            Show the version
";

// ---------------------------------------------------------------------------
// Command line

/// Why the tool stops without doing its job.
#[derive(Debug, PartialEq)]
enum Failure {
    /// The command line is wrong (exit 2); `topic` names the help page to
    /// point to.
    Usage { message: String, topic: Topic },
    /// The operation failed (exit 1).
    Failed(String),
}

impl Failure {
    fn usage(topic: Topic, message: impl Into<String>) -> Self {
        Failure::Usage {
            message: message.into(),
            topic,
        }
    }
}

impl From<tickbox::Error> for Failure {
    fn from(error: tickbox::Error) -> Self {
        Failure::Failed(error.to_string())
    }
}

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Parsed {
    Help(Topic),
    Version,
    Run(Invocation),
}

/// A command to run against a database.
#[derive(Debug, PartialEq)]
struct Invocation {
    target: Target,
    json: bool,
    command: Command,
}

/// The database to attach to.
#[derive(Debug, PartialEq)]
struct Target {
    url: String,
    schema: Option<String>,
    kind: Kind,
    /// The module name, which only labels error messages: the SQLite file's
    /// stem, or the PostgreSQL schema or database name.
    module: String,
}

/// Which backend a URL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Sqlite,
    Postgres,
}

/// A dead letter's key as given on the command line.
#[derive(Debug, Clone, PartialEq)]
struct Key {
    message_id: Uuid,
    /// `""` for a dead letter without a handler.
    handler: String,
}

/// A subscription's key as given on the command line.
#[derive(Debug, Clone, PartialEq)]
struct SubscriptionKey {
    module: String,
    handler: String,
}

/// The commands.
#[derive(Debug, PartialEq)]
enum Command {
    Status { stalled_after: Duration },
    Subscriptions,
    Retire(SubscriptionKey),
    List { offset: u64, limit: u64 },
    Show(Key),
    Replay(Key),
    Discard(Key),
    Sweep(Retention),
}

impl Command {
    /// The command's help page.
    fn topic(&self) -> Topic {
        match self {
            Command::Status { .. } => Topic::Status,
            Command::Subscriptions => Topic::SubscriptionsList,
            Command::Retire(_) => Topic::Retire,
            Command::List { .. } => Topic::List,
            Command::Show(_) => Topic::Show,
            Command::Replay(_) => Topic::Replay,
            Command::Discard(_) => Topic::Discard,
            Command::Sweep(_) => Topic::Sweep,
        }
    }
}

/// Options as collected from the command line, before they are checked
/// against the command.
#[derive(Default)]
struct Options {
    database_url: Option<String>,
    schema: Option<String>,
    json: bool,
    help: bool,
    version: bool,
    offset: Option<String>,
    limit: Option<String>,
    yes: bool,
    inbox_retention: Option<String>,
    outbox_retention: Option<String>,
    stalled_after: Option<String>,
    /// Command-specific options seen, by their long name, to check that they
    /// apply to the command.
    command_options: Vec<&'static str>,
}

/// Parses the arguments (without the program name). `env_url` is the value
/// of `TICKBOX_DATABASE_URL`, used when `--database-url` is absent.
fn parse(args: &[String], env_url: Option<String>) -> Result<Parsed, Failure> {
    let mut options = Options::default();
    let mut words: Vec<String> = Vec::new();
    let mut args = args.iter();
    let mut only_words = false;
    while let Some(arg) = args.next() {
        if only_words || !arg.starts_with('-') || arg == "-" {
            words.push(arg.clone());
            continue;
        }
        if arg == "--" {
            only_words = true;
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        let topic = topic_of(&words);
        let mut value = |name: &str| -> Result<String, Failure> {
            match inline.clone().or_else(|| args.next().cloned()) {
                Some(value) => Ok(value),
                None => Err(Failure::usage(topic, format!("{name} needs a value"))),
            }
        };
        let flag = |name: &str| -> Result<bool, Failure> {
            match inline {
                Some(_) => Err(Failure::usage(topic, format!("{name} takes no value"))),
                None => Ok(true),
            }
        };
        match name {
            "--database-url" => once(&mut options.database_url, name, value(name)?, topic)?,
            "--schema" => once(&mut options.schema, name, value(name)?, topic)?,
            "--json" => options.json = flag(name)?,
            "-h" | "--help" => options.help = flag(name)?,
            "-V" | "--version" => options.version = flag(name)?,
            "--offset" => {
                once(&mut options.offset, name, value(name)?, topic)?;
                options.command_options.push("--offset");
            }
            "--limit" => {
                once(&mut options.limit, name, value(name)?, topic)?;
                options.command_options.push("--limit");
            }
            "-y" | "--yes" => {
                options.yes = flag(name)?;
                options.command_options.push("--yes");
            }
            "--inbox-retention" => {
                once(&mut options.inbox_retention, name, value(name)?, topic)?;
                options.command_options.push("--inbox-retention");
            }
            "--outbox-retention" => {
                once(&mut options.outbox_retention, name, value(name)?, topic)?;
                options.command_options.push("--outbox-retention");
            }
            "--stalled-after" => {
                once(&mut options.stalled_after, name, value(name)?, topic)?;
                options.command_options.push("--stalled-after");
            }
            _ => {
                return Err(Failure::usage(
                    topic,
                    format!("unknown option `{}`", shown(name)),
                ))
            }
        }
    }

    let topic = topic_of(&words);
    if options.help {
        return Ok(Parsed::Help(topic));
    }
    if options.version {
        return Ok(Parsed::Version);
    }
    let Some(first) = words.first() else {
        return Err(Failure::usage(Topic::Main, "no command given"));
    };
    if first == "help" {
        return match Topic::from_words(&words[1..]) {
            Some(topic) => Ok(Parsed::Help(topic)),
            None => Err(Failure::usage(
                Topic::Help,
                format!("no help for `{}`", shown(&words[1..].join(" "))),
            )),
        };
    }
    let (topic, args) = match first.as_str() {
        "status" => (Topic::Status, &words[1..]),
        "sweep" => (Topic::Sweep, &words[1..]),
        "subscriptions" => match words.get(1).map(String::as_str) {
            None => (Topic::SubscriptionsList, &words[1..]),
            Some("list") => (Topic::SubscriptionsList, &words[2..]),
            Some("retire") => (Topic::Retire, &words[2..]),
            Some(other) => {
                return Err(Failure::usage(
                    Topic::Subscriptions,
                    format!(
                        "unknown subcommand `subscriptions {}`; use list or retire",
                        shown(other)
                    ),
                ))
            }
        },
        "dead-letters" => match words.get(1).map(String::as_str) {
            Some("list") => (Topic::List, &words[2..]),
            Some("show") => (Topic::Show, &words[2..]),
            Some("replay") => (Topic::Replay, &words[2..]),
            Some("discard") => (Topic::Discard, &words[2..]),
            Some(other) => {
                return Err(Failure::usage(
                    Topic::DeadLetters,
                    format!(
                        "unknown subcommand `dead-letters {}`; use list, show, replay or discard",
                        shown(other)
                    ),
                ))
            }
            None => {
                return Err(Failure::usage(
                    Topic::DeadLetters,
                    "`dead-letters` needs a subcommand: list, show, replay or discard",
                ))
            }
        },
        other => {
            return Err(Failure::usage(
                Topic::Main,
                format!("unknown command `{}`", shown(other)),
            ))
        }
    };

    let applies: &[&str] = match topic {
        Topic::Status => &["--stalled-after"],
        Topic::List => &["--offset", "--limit"],
        Topic::Discard | Topic::Retire => &["--yes"],
        Topic::Sweep => &["--inbox-retention", "--outbox-retention"],
        _ => &[],
    };
    if let Some(option) = options
        .command_options
        .iter()
        .find(|o| !applies.contains(o))
    {
        return Err(Failure::usage(
            topic,
            format!("{option} does not apply to `{}`", topic.command()),
        ));
    }

    let command = match topic {
        Topic::Status => {
            no_more(topic, args)?;
            let stalled_after = match &options.stalled_after {
                Some(text) => stalled_after_arg(topic, text)?,
                None => DEFAULT_STALLED_AFTER,
            };
            Command::Status { stalled_after }
        }
        Topic::SubscriptionsList => {
            no_more(topic, args)?;
            Command::Subscriptions
        }
        Topic::Retire => {
            let key = subscription_key(topic, args)?;
            if !options.yes {
                return Err(Failure::usage(
                    topic,
                    format!(
                        "refusing to retire the subscription of handler `{}` of module `{}` \
                         without --yes: the messages only it still owes would be marked \
                         delivered, and it would never receive them; add --yes to confirm",
                        shown(&key.handler),
                        shown(&key.module)
                    ),
                ));
            }
            Command::Retire(key)
        }
        Topic::List => {
            no_more(topic, args)?;
            Command::List {
                offset: count(topic, "--offset", options.offset.as_deref(), 0)?,
                limit: count(topic, "--limit", options.limit.as_deref(), DEFAULT_LIMIT)?,
            }
        }
        Topic::Show => Command::Show(key(topic, args)?),
        Topic::Replay => Command::Replay(key(topic, args)?),
        Topic::Discard => {
            let key = key(topic, args)?;
            if !options.yes {
                return Err(Failure::usage(
                    topic,
                    format!(
                        "refusing to discard the dead letter of message {} ({}) without \
                         --yes: it would never be delivered to that handler; add --yes to confirm",
                        key.message_id,
                        handler_label(&key.handler)
                    ),
                ));
            }
            Command::Discard(key)
        }
        Topic::Sweep => {
            no_more(topic, args)?;
            let mut retention = Retention::default();
            if let Some(text) = &options.inbox_retention {
                retention.inbox = retention_arg(topic, "--inbox-retention", text)?;
            }
            if let Some(text) = &options.outbox_retention {
                retention.outbox = retention_arg(topic, "--outbox-retention", text)?;
            }
            Command::Sweep(retention)
        }
        Topic::Main | Topic::DeadLetters | Topic::Subscriptions | Topic::Help => {
            unreachable!("not a command")
        }
    };

    let url = options
        .database_url
        .or(env_url.filter(|url| !url.trim().is_empty()))
        .ok_or_else(|| {
            Failure::usage(
                topic,
                format!("no database given: pass --database-url URL or set {DATABASE_URL_ENV}"),
            )
        })?;
    let target = target(topic, url, options.schema)?;
    Ok(Parsed::Run(Invocation {
        target,
        json: options.json,
        command,
    }))
}

/// Stores an option's value; an option given twice is a usage error.
fn once(slot: &mut Option<String>, name: &str, value: String, topic: Topic) -> Result<(), Failure> {
    if slot.replace(value).is_some() {
        return Err(Failure::usage(topic, format!("{name} is given twice")));
    }
    Ok(())
}

/// The help page for the command words seen so far (for `--help` and for
/// usage errors).
fn topic_of(words: &[String]) -> Topic {
    match words.first().map(String::as_str) {
        Some("help") => Topic::from_words(&words[1..]).unwrap_or(Topic::Help),
        Some("dead-letters") => {
            Topic::from_words(&words[..words.len().min(2)]).unwrap_or(Topic::DeadLetters)
        }
        Some("subscriptions") => {
            Topic::from_words(&words[..words.len().min(2)]).unwrap_or(Topic::Subscriptions)
        }
        Some(_) => Topic::from_words(&words[..1]).unwrap_or(Topic::Main),
        None => Topic::Main,
    }
}

/// Refuses arguments left over after a command's own.
fn no_more(topic: Topic, args: &[String]) -> Result<(), Failure> {
    match args.first() {
        None => Ok(()),
        Some(extra) => Err(Failure::usage(
            topic,
            format!("unexpected argument `{}`", shown(extra)),
        )),
    }
}

/// A non-negative integer option.
fn count(topic: Topic, name: &str, text: Option<&str>, default: u64) -> Result<u64, Failure> {
    match text {
        None => Ok(default),
        Some(text) => text.parse().map_err(|_| {
            Failure::usage(
                topic,
                format!("{name} takes a whole number of at least 0, not `{text}`"),
            )
        }),
    }
}

/// `MESSAGE_ID HANDLER`.
fn key(topic: Topic, args: &[String]) -> Result<Key, Failure> {
    match args {
        [id, handler] => {
            let message_id = Uuid::parse_str(id.trim()).map_err(|_| {
                Failure::usage(
                    topic,
                    format!(
                        "`{}` is not a message id; a message id is a UUID such as 0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69",
                        shown(id)
                    ),
                )
            })?;
            Ok(Key {
                message_id,
                handler: handler_arg(handler),
            })
        }
        [] | [_] => Err(Failure::usage(
            topic,
            "expected MESSAGE_ID and HANDLER (- for a dead letter without a handler)",
        )),
        [_, _, extra, ..] => Err(Failure::usage(
            topic,
            format!("unexpected argument `{}`", shown(extra)),
        )),
    }
}

/// `MODULE HANDLER`.
fn subscription_key(topic: Topic, args: &[String]) -> Result<SubscriptionKey, Failure> {
    match args {
        [module, handler] if !module.is_empty() && !handler.is_empty() => Ok(SubscriptionKey {
            module: module.clone(),
            handler: handler.clone(),
        }),
        [_, _] => Err(Failure::usage(
            topic,
            "MODULE and HANDLER must not be empty; `tickbox subscriptions` lists them",
        )),
        [] | [_] => Err(Failure::usage(
            topic,
            "expected MODULE and HANDLER, as `tickbox subscriptions` lists them",
        )),
        [_, _, extra, ..] => Err(Failure::usage(
            topic,
            format!("unexpected argument `{}`", shown(extra)),
        )),
    }
}

/// A handler argument: `-`, `''` and an empty argument mean "no handler".
fn handler_arg(text: &str) -> String {
    match text {
        "-" | "''" | "\"\"" => String::new(),
        other => other.to_string(),
    }
}

/// A handler for messages: "handler `name`", or "no handler (-)" for the
/// dead letter of an unknown topic.
fn handler_label(handler: &str) -> String {
    if handler.is_empty() {
        "no handler (-)".to_string()
    } else {
        format!("handler `{handler}`")
    }
}

/// A command-line word as an error message may show it: a database URL
/// given in the wrong place keeps its password hidden.
fn shown(word: &str) -> String {
    tickbox::redact_url(word)
}

/// A retention option: a positive duration or `never`.
fn retention_arg(topic: Topic, name: &str, text: &str) -> Result<Option<Duration>, Failure> {
    let bad = |why: &str| {
        Failure::usage(
            topic,
            format!("{name} `{text}`: {why}; write e.g. 7d, 12h, 30m, 45s, 1h30m or never"),
        )
    };
    let window = parse_duration(text).map_err(|why| bad(&why))?;
    match window {
        Some(window) if window.is_zero() => Err(bad("must be above zero (never keeps every row)")),
        Some(window) if window > MAX_RETENTION => Err(bad("is longer than 100 years")),
        window => Ok(window),
    }
}

/// `--stalled-after`: a positive duration.
fn stalled_after_arg(topic: Topic, text: &str) -> Result<Duration, Failure> {
    let bad = |why: &str| {
        Failure::usage(
            topic,
            format!("--stalled-after `{text}`: {why}; write e.g. 60s, 5m, 1h or 1h30m"),
        )
    };
    match parse_duration(text).map_err(|why| bad(&why))? {
        None => Err(bad("a message is stalled after some time, not never")),
        Some(window) if window.is_zero() => Err(bad("must be above zero")),
        Some(window) if window > MAX_RETENTION => Err(bad("is longer than 100 years")),
        Some(window) => Ok(window),
    }
}

/// Parses `7d`, `12h`, `30m`, `45s`, `2w`, `1h30m`; `never` is `None`.
fn parse_duration(text: &str) -> Result<Option<Duration>, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("never") {
        return Ok(None);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        if digits == 0 {
            return Err("expected a number".into());
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| "number too large".to_string())?;
        rest = &rest[digits..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "w" => 7 * 86_400,
            "" => return Err("missing unit (s, m, h, d or w)".into()),
            other => return Err(format!("unknown unit `{other}` (use s, m, h, d or w)")),
        };
        rest = &rest[unit_len..];
        total = number
            .checked_mul(unit)
            .and_then(|seconds| total.checked_add(seconds))
            .ok_or_else(|| "duration too large".to_string())?;
    }
    Ok(Some(Duration::from_secs(total)))
}

/// Works out the backend and a module label from the URL.
fn target(topic: Topic, url: String, schema: Option<String>) -> Result<Target, Failure> {
    let trimmed = url.trim();
    let lower = trimmed.to_ascii_lowercase();
    let kind = if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
        Kind::Postgres
    } else {
        Kind::Sqlite
    };
    if kind == Kind::Sqlite && lower.contains("://") && !lower.starts_with("sqlite://") {
        return Err(Failure::usage(
            topic,
            format!(
                "`{}` is neither an SQLite path (or sqlite://PATH) nor a postgres:// URL",
                tickbox::redact_url(trimmed)
            ),
        ));
    }
    if kind == Kind::Sqlite && schema.is_some() {
        return Err(Failure::usage(
            topic,
            "--schema applies to PostgreSQL only; an SQLite module has its own file",
        ));
    }
    let module = match kind {
        Kind::Sqlite => {
            let path = trimmed
                .strip_prefix("sqlite://")
                .or_else(|| trimmed.strip_prefix("sqlite:"))
                .unwrap_or(trimmed);
            std::path::Path::new(path)
                .file_stem()
                .and_then(|stem| stem.to_str())
                .map(str::to_string)
        }
        Kind::Postgres => schema.clone().or_else(|| {
            // Read from the redacted URL: a password that breaks the URL (a
            // raw `/` in it) must not become the label of error messages.
            let redacted = tickbox::redact_url(trimmed);
            let after_scheme = &redacted[redacted.find("://").map_or(0, |i| i + 3)..];
            let path = after_scheme.split_once('/').map(|(_, path)| path)?;
            let database = path.split(['?', '#']).next().unwrap_or_default();
            Some(database.to_string())
        }),
    }
    .filter(|name| !name.trim().is_empty())
    .unwrap_or_else(|| "module".to_string());
    Ok(Target {
        url: trimmed.to_string(),
        schema,
        kind,
        module,
    })
}

// ---------------------------------------------------------------------------
// Commands

/// Opens the module's database with the URL's backend and runs the command;
/// returns what to print.
async fn execute(invocation: &Invocation) -> Result<String, Failure> {
    match invocation.target.kind {
        Kind::Sqlite => run_sqlite(invocation).await,
        Kind::Postgres => run_postgres(invocation).await,
    }
}

#[cfg(feature = "sqlite")]
async fn run_sqlite(invocation: &Invocation) -> Result<String, Failure> {
    run::<tickbox::Sqlite>(invocation).await
}

#[cfg(not(feature = "sqlite"))]
async fn run_sqlite(invocation: &Invocation) -> Result<String, Failure> {
    Err(Failure::Failed(format!(
        "`{}` is an SQLite database, but this tickbox binary was built without SQLite \
         support; rebuild it with `--features sqlite`",
        tickbox::redact_url(&invocation.target.url)
    )))
}

#[cfg(feature = "postgres")]
async fn run_postgres(invocation: &Invocation) -> Result<String, Failure> {
    run::<tickbox::Postgres>(invocation).await
}

#[cfg(not(feature = "postgres"))]
async fn run_postgres(invocation: &Invocation) -> Result<String, Failure> {
    Err(Failure::Failed(format!(
        "`{}` is a PostgreSQL URL, but this tickbox binary was built without PostgreSQL \
         support; rebuild it with `--features postgres` \
         (cargo build --release --features postgres --bin tickbox)",
        tickbox::redact_url(&invocation.target.url)
    )))
}

/// What the tool reads from a module's database with SQL of its own, where
/// the library offers no call: written once per backend.
trait Inspect: Backend {
    /// The number of outbox messages still pending that were published
    /// before `before_us` (µs since the Unix epoch).
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64>;
}

/// A row of `SELECT count(*) AS n`.
#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// The smallest UUIDv7 of the millisecond holding `unix_us`: every UUIDv7
/// made before that millisecond compares lower. Pending messages are told
/// by their ids, as the bus's watchdog tells them (so the pending index
/// answers, and `status` counts what `tickbox_outbox_stalled` counts).
fn earliest_id_at(unix_us: i64) -> Uuid {
    let ms = (unix_us / 1000).max(0) as u64;
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&ms.to_be_bytes()[2..]);
    bytes[6] = 0x70;
    Uuid::from_bytes(bytes)
}

#[cfg(feature = "sqlite")]
impl Inspect for tickbox::Sqlite {
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64> {
        use diesel_async::RunQueryDsl as _;
        let cutoff = earliest_id_at(before_us).as_bytes().to_vec();
        module
            .read(async move |tx| {
                let count: Count = diesel::sql_query(
                    "SELECT count(*) AS n FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id < ?",
                )
                .bind::<diesel::sql_types::Binary, _>(cutoff)
                .get_result(tx.conn())
                .await?;
                Ok::<_, tickbox::Error>(count.n)
            })
            .await
    }
}

#[cfg(feature = "postgres")]
impl Inspect for tickbox::Postgres {
    async fn pending_before(module: &ModuleHandle<Self>, before_us: i64) -> tickbox::Result<i64> {
        use diesel_async::RunQueryDsl as _;
        let cutoff = earliest_id_at(before_us);
        module
            .read(async move |tx| {
                let count: Count = diesel::sql_query(
                    "SELECT count(*) AS n FROM tickbox_outbox \
                     WHERE delivered_at_us IS NULL AND id < $1",
                )
                .bind::<diesel::sql_types::Uuid, _>(cutoff)
                .get_result(tx.conn())
                .await?;
                Ok::<_, tickbox::Error>(count.n)
            })
            .await
    }
}

/// Attaches to the module's database and runs the command, for any backend.
async fn run<B: Inspect>(invocation: &Invocation) -> Result<String, Failure> {
    let target = &invocation.target;
    let mut builder = Module::<B>::builder(target.module.clone(), target.url.clone())
        .pool_size(2)
        .checkout_timeout(Duration::from_secs(10));
    if let Some(schema) = &target.schema {
        builder = builder.schema(schema.clone());
    }
    if let Command::Sweep(retention) = &invocation.command {
        builder = builder.retention(retention.clone());
    }
    // The only configuration `attach` can refuse is what the command line
    // gave it (a malformed schema name): a usage error.
    let module = builder.attach().await.map_err(|error| match error {
        tickbox::Error::Config(reason) => Failure::usage(invocation.command.topic(), reason),
        other => other.into(),
    })?;
    let json = invocation.json;
    match &invocation.command {
        Command::Status { stalled_after } => status(&module, *stalled_after, json).await,
        Command::Subscriptions => subscriptions(&module, json).await,
        Command::Retire(key) => retire(&module, key, json).await,
        Command::List { offset, limit } => list(&module, *offset, *limit, json).await,
        Command::Show(key) => show(&module, key, json).await,
        Command::Replay(key) => replay(&module, key, json).await,
        Command::Discard(key) => discard(&module, key, json).await,
        Command::Sweep(retention) => sweep(&module, retention, json).await,
    }
}

/// `status`.
async fn status<B: Inspect>(
    module: &ModuleHandle<B>,
    stalled_after: Duration,
    json: bool,
) -> Result<String, Failure> {
    let stats = module.store_stats().await?;
    let subscriptions = module.subscriptions().await?;
    let now = now_us();
    let stalled_before =
        now.saturating_sub(i64::try_from(stalled_after.as_micros()).unwrap_or(i64::MAX));
    let stalled = B::pending_before(module, stalled_before).await?;
    let alive = subscriptions.iter().filter(|s| s.is_alive(now)).count();
    let stopped = subscriptions.len() - alive;
    // The subscription owed the oldest message: the largest lag.
    let lagging = subscriptions
        .iter()
        .filter_map(|s| s.oldest_pending_us.map(|oldest| (oldest, s)))
        .min_by(|(a, x), (b, y)| (a, &x.module, &x.handler).cmp(&(b, &y.module, &y.handler)))
        .map(|(oldest, s)| (lag_us(oldest, now), s));
    let lag_us = stats.oldest_pending_us.map(|oldest| lag_us(oldest, now));
    if json {
        let mut value = to_json(&stats)?;
        if let Some(object) = value.as_object_mut() {
            object.insert("backend".into(), B::NAME.into());
            object.insert("lag_seconds".into(), lag_us.map(seconds_of).into());
            object.insert("stalled".into(), stalled.into());
            object.insert(
                "stalled_after_seconds".into(),
                stalled_after.as_secs().into(),
            );
            object.insert("subscriptions_alive".into(), alive.into());
            object.insert("subscriptions_stopped".into(), stopped.into());
            object.insert(
                "subscription_lag_seconds".into(),
                lagging.map(|(lag, _)| seconds_of(lag)).into(),
            );
            object.insert(
                "lagging_subscription".into(),
                lagging.map_or(
                    serde_json::Value::Null,
                    |(_, s)| serde_json::json!({ "module": s.module, "handler": s.handler }),
                ),
            );
        }
        return json_line(&value);
    }
    let lag = match (lag_us, stats.oldest_pending_us) {
        (Some(_), Some(oldest)) if oldest > now => format!(
            "0s (oldest pending message published {}, in the future: \
             a clock ahead of this one, or a bad timestamp)",
            iso8601(oldest, false)
        ),
        (Some(lag), Some(oldest)) => format!(
            "{} (oldest pending message published {})",
            human_duration(lag),
            iso8601(oldest, false)
        ),
        _ => "0s (nothing pending)".to_string(),
    };
    let mut out = String::new();
    out.push_str(&format!("backend          {}\n", B::NAME));
    out.push_str(&format!(
        "outbox pending   {}\n",
        plural(stats.outbox_pending, "message")
    ));
    out.push_str(&format!("outbox lag       {lag}\n"));
    out.push_str(&format!(
        "outbox stalled   {} pending longer than {}\n",
        plural(stalled, "message"),
        compact_duration(stalled_after)
    ));
    if subscriptions.is_empty() {
        out.push_str(
            "subscriptions    none recorded (no bus with a handler of this outbox's topics has run)\n",
        );
    } else {
        out.push_str(&format!(
            "subscriptions    {}: {alive} alive, {stopped} stopped",
            subscriptions.len()
        ));
        if stopped > 0 {
            out.push_str("  (see `tickbox subscriptions`)");
        }
        out.push('\n');
        let lag = match lagging {
            Some((lag, s)) => format!(
                "{} (handler `{}` of module `{}`, {})",
                human_duration(lag),
                s.handler,
                s.module,
                if s.is_alive(now) { "alive" } else { "stopped" }
            ),
            None => "0s (no subscription owes a message)".to_string(),
        };
        out.push_str(&format!("subscription lag {lag}\n"));
    }
    out.push_str(&format!("inbox rows       {}\n", stats.inbox_rows));
    out.push_str(&format!("dead letters     {}", stats.dead_letters));
    if stats.dead_letters > 0 {
        out.push_str("  (see `tickbox dead-letters list`)");
    }
    out.push('\n');
    Ok(out)
}

/// `subscriptions [list]`.
async fn subscriptions<B: Backend>(
    module: &ModuleHandle<B>,
    json: bool,
) -> Result<String, Failure> {
    let mut subscriptions = module.subscriptions().await?;
    subscriptions.sort_by(|a, b| (&a.module, &a.handler).cmp(&(&b.module, &b.handler)));
    let now = now_us();
    if json {
        let mut all = Vec::with_capacity(subscriptions.len());
        for subscription in &subscriptions {
            let mut value = to_json(subscription)?;
            if let Some(object) = value.as_object_mut() {
                object.insert("alive".into(), subscription.is_alive(now).into());
                object.insert(
                    "lag_seconds".into(),
                    subscription
                        .oldest_pending_us
                        .map(|oldest| seconds_of(lag_us(oldest, now)))
                        .into(),
                );
            }
            all.push(value);
        }
        return json_line(&serde_json::Value::Array(all));
    }
    if subscriptions.is_empty() {
        return Ok(
            "no subscriptions recorded in this outbox: no bus with a handler of its topics has run\n"
                .to_string(),
        );
    }
    let header = [
        "MODULE",
        "HANDLER",
        "TOPIC",
        "STATE",
        "SUBSCRIBED SINCE (UTC)",
        "OLDEST OWED",
    ];
    let rows: Vec<[String; 6]> = subscriptions
        .iter()
        .map(|s| {
            let seen = human_duration(lag_us(s.seen_at_us, now));
            [
                s.module.clone(),
                s.handler.clone(),
                s.topic.clone(),
                if s.is_alive(now) {
                    format!("alive, seen {seen} ago")
                } else {
                    format!("stopped, last seen {seen} ago")
                },
                iso8601(s.subscribed_at_us, false),
                s.oldest_pending_us.map_or_else(
                    || "-".to_string(),
                    |oldest| format!("{} ago", human_duration(lag_us(oldest, now))),
                ),
            ]
        })
        .collect();
    let mut out = table(&header, &rows);
    let alive = subscriptions.iter().filter(|s| s.is_alive(now)).count();
    let stopped = subscriptions.len() - alive;
    out.push_str(&format!(
        "\n{}: {alive} alive, {stopped} stopped\n",
        plural(subscriptions.len() as i64, "subscription")
    ));
    if subscriptions
        .iter()
        .any(|s| !s.is_alive(now) && s.oldest_pending_us.is_some())
    {
        out.push_str(
            "A stopped subscription keeps the messages it owes until a process serving it runs\n\
             again. Retire one whose handler is gone for good:\n  \
             tickbox subscriptions retire MODULE HANDLER --yes\n",
        );
    }
    Ok(out)
}

/// `subscriptions retire`.
async fn retire<B: Backend>(
    module: &ModuleHandle<B>,
    key: &SubscriptionKey,
    json: bool,
) -> Result<String, Failure> {
    let no_such = || {
        Failure::Failed(format!(
            "{} (`tickbox subscriptions` lists them)",
            tickbox::Error::NoSuchSubscription {
                outbox: module.name().to_string(),
                module: key.module.clone(),
                handler: key.handler.clone(),
            }
        ))
    };
    let subscription: Subscription = module
        .subscriptions()
        .await?
        .into_iter()
        .find(|s| s.module == key.module && s.handler == key.handler)
        .ok_or_else(no_such)?;
    let finished = module
        .retire_subscription(&key.module, &key.handler)
        .await
        .map_err(|error| match error {
            tickbox::Error::NoSuchSubscription { .. } => no_such(),
            other => other.into(),
        })?;
    let topic_left = module
        .subscriptions()
        .await?
        .iter()
        .filter(|s| s.topic == subscription.topic)
        .count();
    if json {
        return json_line(&serde_json::json!({
            "module": subscription.module,
            "handler": subscription.handler,
            "topic": subscription.topic,
            "retired": true,
            "finished": finished,
            "topic_subscriptions_left": topic_left,
        }));
    }
    let mut out = format!(
        "retired the subscription of handler `{}` of module `{}` (topic {}):\n\
         {} that only it still owed {} marked delivered; it will never receive them.\n",
        subscription.handler,
        subscription.module,
        subscription.topic,
        plural(finished as i64, "message"),
        if finished == 1 { "was" } else { "were" },
    );
    if topic_left == 0 {
        out.push_str(&format!(
            "No subscription of topic {} is left.\n",
            subscription.topic
        ));
    } else {
        out.push_str("Messages that other subscriptions still owe stay pending for them.\n");
    }
    out.push_str("A process started later with this handler subscribes it again.\n");
    Ok(out)
}

/// `dead-letters list`.
async fn list<B: Backend>(
    module: &ModuleHandle<B>,
    offset: u64,
    limit: u64,
    json: bool,
) -> Result<String, Failure> {
    let letters = module.dead_letters(offset, limit).await?;
    if json {
        return json_line(&to_json(&letters)?);
    }
    let total = module.store_stats().await?.dead_letters.max(0) as u64;
    if letters.is_empty() {
        return Ok(if total == 0 {
            "no dead letters\n".to_string()
        } else {
            format!(
                "no dead letters from offset {offset} (there are {total}; try a smaller --offset)\n"
            )
        });
    }
    let header = [
        "MESSAGE ID",
        "HANDLER",
        "TOPIC",
        "ATTEMPTS",
        "DEAD AT (UTC)",
        "REASON",
    ];
    let rows: Vec<[String; 6]> = letters
        .iter()
        .map(|letter| {
            [
                letter.message_id.to_string(),
                if letter.handler.is_empty() {
                    "-".to_string()
                } else {
                    letter.handler.clone()
                },
                letter.topic.clone(),
                letter.attempts.to_string(),
                iso8601(letter.dead_at_us, false),
                one_line(&letter.reason, REASON_WIDTH),
            ]
        })
        .collect();
    let mut out = table(&header, &rows);
    let first = offset + 1;
    let last = offset + letters.len() as u64;
    out.push('\n');
    if first == 1 && last >= total {
        out.push_str(&format!("{}\n", plural(total as i64, "dead letter")));
    } else {
        out.push_str(&format!("dead letters {first}-{last} of {total}"));
        if last < total {
            out.push_str(&format!("; next page: --offset {last} --limit {limit}"));
        }
        out.push('\n');
    }
    Ok(out)
}

/// Reads a dead letter or fails with "not found".
async fn find<B: Backend>(module: &ModuleHandle<B>, key: &Key) -> Result<DeadLetter, Failure> {
    module
        .dead_letter(key.message_id, &key.handler)
        .await?
        .ok_or_else(|| not_found(key))
}

/// The "no such dead letter" failure.
fn not_found(key: &Key) -> Failure {
    Failure::Failed(format!(
        "no dead letter for message {} and {} in this database \
         (`tickbox dead-letters list` shows them)",
        key.message_id,
        handler_label(&key.handler)
    ))
}

/// `dead-letters show`.
async fn show<B: Backend>(
    module: &ModuleHandle<B>,
    key: &Key,
    json: bool,
) -> Result<String, Failure> {
    let letter = find(module, key).await?;
    if json {
        return json_line(&to_json(&letter)?);
    }
    let handler = if letter.handler.is_empty() {
        "- (none: no handler could be chosen, the topic is unknown)".to_string()
    } else {
        letter.handler.clone()
    };
    let mut out = String::new();
    out.push_str(&format!("message id       {}\n", letter.message_id));
    out.push_str(&format!("handler          {handler}\n"));
    out.push_str(&format!("topic            {}\n", letter.topic));
    out.push_str(&format!("attempts         {}\n", letter.attempts));
    out.push_str(&format!(
        "dead at          {}\n",
        iso8601(letter.dead_at_us, true)
    ));
    out.push_str(&format!(
        "published at     {}\n",
        iso8601(letter.created_at_us, true)
    ));
    out.push_str(&format!("correlation id   {}\n", letter.correlation_id));
    out.push_str(&format!(
        "causation id     {}\n",
        letter
            .causation_id
            .map_or_else(|| "- (none)".to_string(), |id| id.to_string())
    ));
    out.push_str("reason\n");
    out.push_str(&indent(&letter.reason));
    match serde_json::from_str::<serde::de::IgnoredAny>(&letter.payload) {
        Ok(_) => {
            out.push_str("payload (JSON)\n");
            out.push_str(&indent(&pretty_json(&letter.payload)));
        }
        Err(_) => {
            out.push_str("payload (not valid JSON; as stored)\n");
            out.push_str(&indent(&letter.payload));
        }
    }
    Ok(out)
}

/// `dead-letters replay`.
async fn replay<B: Backend>(
    module: &ModuleHandle<B>,
    key: &Key,
    json: bool,
) -> Result<String, Failure> {
    let letter = find(module, key).await?;
    module
        .requeue_dead_letter(key.message_id, &key.handler)
        .await
        .map_err(|error| match error {
            tickbox::Error::NoSuchDeadLetter { .. } => not_found(key),
            other => other.into(),
        })?;
    if json {
        return json_line(&serde_json::json!({
            "message_id": letter.message_id,
            "handler": letter.handler,
            "topic": letter.topic,
            "requeued": true,
        }));
    }
    let mut out = format!(
        "requeued message {} (topic {}, {}):\n\
         it is back in the outbox as pending, and its dead letter is gone.\n\
         The application's bus delivers it again to every subscriber of its topic:\n\
         at once on PostgreSQL, on its next outbox scan on SQLite, or when it starts.\n\
         Handlers that already processed it skip it in their inbox. `tickbox status`\n\
         counts it as pending until then.\n",
        letter.message_id,
        letter.topic,
        handler_label(&letter.handler),
    );
    if letter.handler.is_empty() {
        out.push_str(
            "If still no module on the bus publishes its topic, it becomes a dead letter again.\n",
        );
    }
    Ok(out)
}

/// `dead-letters discard`.
async fn discard<B: Backend>(
    module: &ModuleHandle<B>,
    key: &Key,
    json: bool,
) -> Result<String, Failure> {
    let letter = find(module, key).await?;
    if !module
        .discard_dead_letter(key.message_id, &key.handler)
        .await?
    {
        return Err(not_found(key));
    }
    if json {
        return json_line(&serde_json::json!({
            "message_id": letter.message_id,
            "handler": letter.handler,
            "topic": letter.topic,
            "discarded": true,
        }));
    }
    Ok(format!(
        "discarded the dead letter of message {} (topic {}, {});\n\
         it will not be delivered to that handler again.\n",
        letter.message_id,
        letter.topic,
        handler_label(&letter.handler)
    ))
}

/// `sweep`.
async fn sweep<B: Backend>(
    module: &ModuleHandle<B>,
    retention: &Retention,
    json: bool,
) -> Result<String, Failure> {
    let report = module.sweep_retention().await?;
    if json {
        let mut value = to_json(&report)?;
        if let Some(object) = value.as_object_mut() {
            let seconds = |window: Option<Duration>| window.map(|w| w.as_secs());
            object.insert(
                "inbox_retention_seconds".into(),
                seconds(retention.inbox).into(),
            );
            object.insert(
                "outbox_retention_seconds".into(),
                seconds(retention.outbox).into(),
            );
        }
        return json_line(&value);
    }
    let inbox = match retention.inbox {
        Some(window) => format!(
            "deleted {} processed more than {} ago",
            plural(report.inbox_rows as i64, "row"),
            compact_duration(window)
        ),
        None => "kept every row (retention: never)".to_string(),
    };
    let outbox = match retention.outbox {
        Some(window) => format!(
            "deleted {} delivered more than {} ago",
            plural(report.outbox_rows as i64, "row"),
            compact_duration(window)
        ),
        None => "kept every row (retention: never)".to_string(),
    };
    Ok(format!(
        "inbox   {inbox}\noutbox  {outbox}\n(undelivered outbox rows and dead letters are never swept)\n"
    ))
}

// ---------------------------------------------------------------------------
// Formatting

/// Serializes a value for `--json`.
fn to_json<T: serde::Serialize>(value: &T) -> Result<serde_json::Value, Failure> {
    serde_json::to_value(value).map_err(|e| Failure::Failed(format!("cannot encode JSON: {e}")))
}

/// One JSON document on one line.
fn json_line(value: &serde_json::Value) -> Result<String, Failure> {
    Ok(format!("{value}\n"))
}

/// A table with a header line, its columns two spaces apart.
fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; N]| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            text.push_str(cell);
            if i + 1 < N {
                let pad = widths[i] - cell.chars().count() + 2;
                text.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(*header);
    for row in rows {
        line(row.each_ref().map(String::as_str));
    }
    out
}

/// Microseconds as seconds for `--json`, to the millisecond.
fn seconds_of(us: i64) -> f64 {
    (us / 1000) as f64 / 1e3
}

/// `1 row`, `2 rows`.
fn plural(n: i64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// The first line of `text`, at most `width` characters, marked when cut.
fn one_line(text: &str, width: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= width {
        flat
    } else {
        let mut cut: String = flat.chars().take(width.saturating_sub(3)).collect();
        cut.push_str("...");
        cut
    }
}

/// Re-indents valid JSON text, two spaces a level, keeping its keys in
/// their stored order and its numbers and strings exactly as written
/// (parsing it into a `serde_json::Value` would sort the keys).
fn pretty_json(text: &str) -> String {
    fn newline(out: &mut String, depth: usize) {
        out.push('\n');
        out.extend(std::iter::repeat_n("  ", depth));
    }
    let mut out = String::with_capacity(text.len() * 2);
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = text.trim().chars().peekable();
    while let Some(c) = chars.next() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                out.push(c);
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while chars.next_if(|c| c.is_whitespace()).is_some() {}
                out.push(c);
                if chars.next_if_eq(&close).is_some() {
                    out.push(close);
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
    }
    out
}

/// Indents every line of `text` by four spaces, ending with a newline.
fn indent(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        out.push_str("    ");
        out.push_str(line);
        out.push('\n');
    }
    if text.is_empty() {
        out.push_str("    (empty)\n");
    }
    out
}

/// How long ago (µs) a message stamped `created_at_us` was published, as
/// seen at `now_us`: 0 for a timestamp in the future, and no overflow for
/// any stored value (a row may hold 0, a negative number or `i64::MAX`).
fn lag_us(created_at_us: i64, now_us: i64) -> i64 {
    now_us.saturating_sub(created_at_us).max(0)
}

/// Microseconds since the Unix epoch, now.
fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Microseconds since the Unix epoch as UTC ISO 8601:
/// `2026-12-01T10:20:30Z`, or with `precise` `2026-12-01T10:20:30.123456Z`.
fn iso8601(us: i64, precise: bool) -> String {
    let seconds = us.div_euclid(1_000_000);
    let micros = us.rem_euclid(1_000_000);
    let days = seconds.div_euclid(86_400);
    let of_day = seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (h, m, s) = (of_day / 3600, of_day % 3600 / 60, of_day % 60);
    if precise {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{micros:06}Z")
    } else {
        format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}Z")
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// A lag for people: `850ms`, `42.3s`, `5m 12s`, `3h 4m`, `2d 5h`.
fn human_duration(us: i64) -> String {
    let us = us.max(0);
    if us < 1_000_000 {
        return format!("{}ms", us / 1000);
    }
    if us < 60_000_000 {
        return format!("{:.1}s", us as f64 / 1e6);
    }
    let seconds = us / 1_000_000;
    let (d, h, m, s) = (
        seconds / 86_400,
        seconds % 86_400 / 3600,
        seconds % 3600 / 60,
        seconds % 60,
    );
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else {
        format!("{m}m {s}s")
    }
}

/// A retention window as written on the command line: `7d`, `1h30m`.
fn compact_duration(window: Duration) -> String {
    let mut seconds = window.as_secs();
    if seconds == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    for (unit, size) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if seconds >= size {
            out.push_str(&format!("{}{unit}", seconds / size));
            seconds %= size;
        }
    }
    out
}

// ---------------------------------------------------------------------------
// Entry point

/// Writes `text` to stdout; a closed pipe (`tickbox … | head`) is not an
/// error.
fn print(text: &str) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            ExitCode::from(1)
        }
    }
}

/// Reports a failure on stderr and returns its exit code.
fn fail(failure: Failure) -> ExitCode {
    match failure {
        Failure::Usage { message, topic } => {
            let more = match topic {
                Topic::Main => "tickbox help".to_string(),
                topic => format!("tickbox help {}", topic.command()),
            };
            eprintln!(
                "error: {message}\n\nUsage: {}\nRun `{more}` for more information.",
                topic.usage()
            );
            ExitCode::from(2)
        }
        Failure::Failed(message) => {
            eprintln!("error: {message}");
            ExitCode::from(1)
        }
    }
}

/// Lets the module actor that `attach` started (and whose handle is gone by
/// now) run before the runtime shuts down.
///
/// An actor first polled while the runtime is being dropped panics in
/// `Module::started` (`run_interval` needs a running Tokio runtime); tokio
/// catches that panic but prints it. It happens when every await of a
/// command completes at once, so that the actor never got a turn - e.g. a
/// failing `attach` on a loaded machine. A few yields give the actor its
/// turn: it starts, sees that no handle is left, and stops.
async fn settle() {
    for _ in 0..3 {
        tokio::task::yield_now().await;
    }
}

#[actix::main]
async fn main() -> ExitCode {
    let mut args = Vec::new();
    for arg in std::env::args_os().skip(1) {
        match arg.into_string() {
            Ok(arg) => args.push(arg),
            Err(arg) => {
                return fail(Failure::usage(
                    Topic::Main,
                    format!("argument {arg:?} is not valid UTF-8"),
                ))
            }
        }
    }
    let env_url = std::env::var(DATABASE_URL_ENV).ok();
    match parse(&args, env_url) {
        Ok(Parsed::Help(topic)) => print(&topic.help()),
        Ok(Parsed::Version) => print(concat!("tickbox ", env!("CARGO_PKG_VERSION"), "\n")),
        Ok(Parsed::Run(invocation)) => {
            let result = execute(&invocation).await;
            settle().await;
            match result {
                Ok(output) => print(&output),
                Err(failure) => fail(failure),
            }
        }
        Err(failure) => fail(failure),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_string).collect()
    }

    fn run_of(line: &str) -> Invocation {
        match parse(&args(line), None) {
            Ok(Parsed::Run(invocation)) => invocation,
            other => panic!("{line}: {other:?}"),
        }
    }

    fn usage_error(line: &str) -> String {
        match parse(&args(line), None) {
            Err(Failure::Usage { message, .. }) => message,
            other => panic!("{line}: expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn formats_timestamps_as_utc_iso8601() {
        assert_eq!(iso8601(0, false), "1970-01-01T00:00:00Z");
        assert_eq!(iso8601(951_782_400_000_000, false), "2000-02-29T00:00:00Z");
        assert_eq!(
            iso8601(1_700_000_000_123_456, true),
            "2023-11-14T22:13:20.123456Z"
        );
        assert_eq!(iso8601(-1, true), "1969-12-31T23:59:59.999999Z");
        assert_eq!(
            iso8601(4_102_444_800_000_000, false),
            "2100-01-01T00:00:00Z"
        );
    }

    #[test]
    fn parses_durations() {
        let secs = |s: &str| parse_duration(s).map(|d| d.map(|d| d.as_secs()));
        assert_eq!(secs("7d"), Ok(Some(7 * 86_400)));
        assert_eq!(secs("12h"), Ok(Some(12 * 3600)));
        assert_eq!(secs("30m"), Ok(Some(1800)));
        assert_eq!(secs("45s"), Ok(Some(45)));
        assert_eq!(secs("2w"), Ok(Some(14 * 86_400)));
        assert_eq!(secs("1h30m"), Ok(Some(5400)));
        assert_eq!(secs("never"), Ok(None));
        assert!(secs("7").is_err());
        assert!(secs("d").is_err());
        assert!(secs("7x").is_err());
        assert!(secs("").is_err());
        assert!(secs("99999999999999999999d").is_err());
        assert_eq!(compact_duration(Duration::from_secs(5400)), "1h30m");
        assert_eq!(compact_duration(Duration::from_secs(7 * 86_400)), "7d");
    }

    #[test]
    fn parses_commands_and_options_in_any_order() {
        let invocation = run_of("--database-url a/orders.db --json status");
        assert_eq!(
            invocation.command,
            Command::Status {
                stalled_after: DEFAULT_STALLED_AFTER
            }
        );
        assert!(invocation.json);
        assert_eq!(invocation.target.kind, Kind::Sqlite);
        assert_eq!(invocation.target.module, "orders");

        let invocation = run_of("dead-letters list --limit=5 --offset 10 --database-url x.db");
        assert_eq!(
            invocation.command,
            Command::List {
                offset: 10,
                limit: 5
            }
        );

        let id = "0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69";
        let invocation = run_of(&format!("--database-url x.db dead-letters show {id} -"));
        assert_eq!(
            invocation.command,
            Command::Show(Key {
                message_id: id.parse().unwrap(),
                handler: String::new()
            })
        );
        let invocation = run_of(&format!(
            "--database-url postgres://u:p@h/shop --schema s1 dead-letters discard {id} h.x --yes"
        ));
        assert_eq!(invocation.target.kind, Kind::Postgres);
        assert_eq!(invocation.target.module, "s1");
        assert!(matches!(invocation.command, Command::Discard(_)));

        let invocation = run_of("--database-url postgresql://h/shop?sslmode=disable status");
        assert_eq!(invocation.target.module, "shop");

        let invocation =
            run_of("--database-url x.db sweep --inbox-retention 14d --outbox-retention never");
        assert_eq!(
            invocation.command,
            Command::Sweep(Retention {
                inbox: Some(Duration::from_secs(14 * 86_400)),
                outbox: None,
                ..Retention::default()
            })
        );
        assert_eq!(
            run_of("--database-url x.db sweep").command,
            Command::Sweep(Retention::default())
        );

        assert_eq!(
            run_of("status --stalled-after 5m --database-url x.db").command,
            Command::Status {
                stalled_after: Duration::from_secs(300)
            }
        );
        assert_eq!(
            run_of("--database-url x.db subscriptions").command,
            Command::Subscriptions
        );
        assert_eq!(
            run_of("--database-url x.db --json subscriptions list").command,
            Command::Subscriptions
        );
        assert_eq!(
            run_of("--database-url x.db subscriptions retire warehouse warehouse.reserve -y")
                .command,
            Command::Retire(SubscriptionKey {
                module: "warehouse".into(),
                handler: "warehouse.reserve".into()
            })
        );
    }

    #[test]
    fn reads_the_url_from_the_environment_when_the_flag_is_absent() {
        let parsed = parse(&args("status"), Some("env.db".into())).unwrap();
        let Parsed::Run(invocation) = parsed else {
            panic!("{parsed:?}")
        };
        assert_eq!(invocation.target.url, "env.db");
        let parsed = parse(
            &args("--database-url flag.db status"),
            Some("env.db".into()),
        )
        .unwrap();
        let Parsed::Run(invocation) = parsed else {
            panic!("{parsed:?}")
        };
        assert_eq!(invocation.target.url, "flag.db");
    }

    #[test]
    fn finds_help_pages() {
        assert_eq!(parse(&args("--help"), None), Ok(Parsed::Help(Topic::Main)));
        assert_eq!(parse(&args("help"), None), Ok(Parsed::Help(Topic::Main)));
        assert_eq!(
            parse(&args("help dead-letters replay"), None),
            Ok(Parsed::Help(Topic::Replay))
        );
        assert_eq!(
            parse(&args("dead-letters replay --help"), None),
            Ok(Parsed::Help(Topic::Replay))
        );
        assert_eq!(
            parse(&args("dead-letters -h"), None),
            Ok(Parsed::Help(Topic::DeadLetters))
        );
        assert_eq!(
            parse(&args("sweep --help"), None),
            Ok(Parsed::Help(Topic::Sweep))
        );
        assert_eq!(
            parse(&args("subscriptions --help"), None),
            Ok(Parsed::Help(Topic::Subscriptions))
        );
        assert_eq!(
            parse(&args("subscriptions list -h"), None),
            Ok(Parsed::Help(Topic::SubscriptionsList))
        );
        assert_eq!(
            parse(&args("help subscriptions retire"), None),
            Ok(Parsed::Help(Topic::Retire))
        );
        assert_eq!(parse(&args("-V"), None), Ok(Parsed::Version));
        for topic in [
            Topic::Main,
            Topic::Status,
            Topic::DeadLetters,
            Topic::List,
            Topic::Show,
            Topic::Replay,
            Topic::Discard,
            Topic::Subscriptions,
            Topic::SubscriptionsList,
            Topic::Retire,
            Topic::Sweep,
            Topic::Help,
        ] {
            let page = topic.help();
            assert!(page.contains("Usage: tickbox"), "{page}");
            assert!(
                page.lines().all(|line| line.chars().count() <= 100),
                "{page}"
            );
        }
    }

    #[test]
    fn refuses_bad_usage() {
        let id = "0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69";
        assert!(usage_error("").contains("no command"));
        assert!(usage_error("--database-url x.db frobnicate").contains("unknown command"));
        assert!(usage_error("--database-url x.db status --frob").contains("unknown option"));
        assert!(usage_error("status").contains("TICKBOX_DATABASE_URL"));
        assert!(usage_error("--database-url x.db status --yes").contains("does not apply"));
        assert!(usage_error("--database-url x.db dead-letters").contains("subcommand"));
        assert!(usage_error("--database-url x.db dead-letters show nope h").contains("UUID"));
        assert!(
            usage_error(&format!("--database-url x.db dead-letters show {id}"))
                .contains("MESSAGE_ID and HANDLER")
        );
        assert!(
            usage_error(&format!("--database-url x.db dead-letters discard {id} h"))
                .contains("--yes")
        );
        assert!(
            usage_error("--database-url x.db dead-letters list --limit -1").contains("--limit")
        );
        assert!(
            usage_error("--database-url x.db sweep --inbox-retention 0s").contains("above zero")
        );
        assert!(usage_error("--database-url x.db sweep --inbox-retention 7").contains("unit"));
        assert!(usage_error("--database-url x.db --schema s status").contains("PostgreSQL only"));
        assert!(usage_error("--database-url mysql://h/db status").contains("neither"));
        assert!(usage_error("--database-url a.db --database-url b.db status").contains("twice"));
        assert!(usage_error("--database-url").contains("needs a value"));
        assert!(usage_error("help frobnicate").contains("no help"));
        assert!(usage_error("--database-url x.db subscriptions purge").contains("list or retire"));
        assert!(usage_error("--database-url x.db subscriptions list extra").contains("unexpected"));
        assert!(usage_error("--database-url x.db subscriptions retire m").contains("MODULE and"));
        assert!(usage_error("--database-url x.db subscriptions retire m h").contains("--yes"));
        assert!(matches!(
            subscription_key(Topic::Retire, &["m".to_string(), String::new()]),
            Err(Failure::Usage { message, .. }) if message.contains("must not be empty")
        ));
        assert!(usage_error("--database-url x.db subscriptions --yes").contains("does not apply"));
        assert!(usage_error("--database-url x.db status --stalled-after 0s").contains("above zero"));
        assert!(usage_error("--database-url x.db status --stalled-after never").contains("never"));
        assert!(
            usage_error("--database-url x.db sweep --stalled-after 1m").contains("does not apply")
        );
    }

    #[test]
    fn accepts_dash_and_quotes_for_the_empty_handler() {
        assert_eq!(handler_arg("-"), "");
        assert_eq!(handler_arg("''"), "");
        assert_eq!(handler_arg(""), "");
        assert_eq!(handler_arg("warehouse.reserve"), "warehouse.reserve");
    }

    #[test]
    fn pretty_prints_json_in_its_own_key_order() {
        assert_eq!(
            pretty_json(r#"{"z":1,"a":[1, 2.50,{}],"s":"x,{\"y\":[]}","e":[]}"#),
            "{\n  \"z\": 1,\n  \"a\": [\n    1,\n    2.50,\n    {}\n  ],\n  \"s\": \"x,{\\\"y\\\":[]}\",\n  \"e\": []\n}"
        );
        assert_eq!(pretty_json(" 42 "), "42");
    }

    #[test]
    fn shortens_reasons_and_redacts_passwords() {
        assert_eq!(one_line("a\n  b", 10), "a b");
        assert_eq!(one_line("abcdefghijk", 8), "abcde...");
        assert_eq!(
            tickbox::redact_url("postgres://u:secret@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(human_duration(90_000_000), "1m 30s");
        assert_eq!(human_duration(500_000), "500ms");
    }

    #[test]
    fn shows_a_sane_lag_for_any_stored_timestamp() {
        let now = 1_767_225_600_000_000; // 2026-01-01T00:00:00Z
        assert_eq!(lag_us(now - 90_000_000, now), 90_000_000);
        assert_eq!(lag_us(now, now), 0);
        // In the future: no lag, not a negative one.
        assert_eq!(lag_us(now + 1, now), 0);
        assert_eq!(lag_us(i64::MAX, now), 0);
        assert_eq!(lag_us(i64::MAX, i64::MIN), 0);
        // Far in the past: saturates instead of overflowing.
        assert_eq!(lag_us(0, now), now);
        assert_eq!(lag_us(-1, now), now + 1);
        assert_eq!(lag_us(i64::MIN, now), i64::MAX);
        assert_eq!(lag_us(i64::MIN + 1, 0), i64::MAX);
        assert_eq!(lag_us(i64::MIN, i64::MIN), 0);

        assert_eq!(human_duration(0), "0ms");
        assert_eq!(human_duration(-5), "0ms");
        assert_eq!(human_duration(i64::MIN), "0ms");
        assert_eq!(human_duration(3 * 86_400_000_000 + 7_200_000_000), "3d 2h");
        assert_eq!(human_duration(now), "20454d 0h");
        assert_eq!(human_duration(i64::MAX), "106751991d 4h");

        assert_eq!(iso8601(i64::MAX, false), "294247-01-10T04:00:54Z");
        assert_eq!(iso8601(i64::MAX, true), "294247-01-10T04:00:54.775807Z");
        assert_eq!(iso8601(i64::MIN, false), "-290308-12-21T19:59:05Z");
        assert_eq!(iso8601(i64::MIN, true), "-290308-12-21T19:59:05.224192Z");
    }

    #[test]
    fn never_shows_a_password_in_a_label_or_a_usage_error() {
        let invocation =
            run_of("--database-url postgres://u@h:5432/nodb_x?password=S3cret! status");
        assert_eq!(invocation.target.module, "nodb_x");
        // A raw `/` in the password: the URL cannot be read, nor its database.
        let invocation = run_of("--database-url postgres://u:S3/cret@h/shop status");
        assert_eq!(invocation.target.module, "module");
        for line in [
            "--database-url x.db postgres://u:S3cret@h/db",
            "--database-url x.db status postgres://u:S3cret@h/db",
            "--database-url x.db dead-letters postgres://u:S3cret@h/db",
            "--database-url x.db dead-letters show postgres://u:S3cret@h/db h",
            "--database-url mysql://u:S3cret@h/db status",
            "help postgres://u:S3cret@h/db",
        ] {
            let message = usage_error(line);
            assert!(!message.contains("S3cret"), "{line}: {message}");
            assert!(message.contains("u:***@h/db"), "{line}: {message}");
        }
        let message = usage_error("--database-url x.db status -postgres://u:S3cret@h/db");
        assert!(
            message.contains("unknown option `-postgres://***`"),
            "{message}"
        );
    }
}
