//! ```text
//! cargo run -p tickbox-cli -- --data-dir minishop-data status
//! ```
//!
//! `tickbox` — the operator's command-line tool for the databases of a
//! tickbox application's modules.
//!
//! It attaches to the databases of an application's modules (SQLite files,
//! PostgreSQL databases and schemas, or MariaDB/MySQL databases) without
//! running migrations and without any handler code, so it is safe to run
//! while the application runs: one database (`--database-url`), several
//! (`--database-url` again, or `--schema` once per module's schema or
//! MariaDB/MySQL database), or every module database of a
//! data directory (`--data-dir`, one `NAME.db` per module). It names each
//! module by the name its database records (every module records it when
//! it starts), lists every module's rows with a module column, and finds
//! the module whose database holds the row a command acts on (`--module`
//! chooses one). It shows the outbox backlog, its lag and its stalled messages, the inbox size
//! and the dead letters; it lists the subscriptions recorded in the outbox
//! (the handlers, in any process, that receive its messages) and retires one
//! whose handler is gone for good; it puts dead letters back in the outbox
//! for redelivery or discards them; it lists the effects handlers recorded
//! in the module's effects journal and settles one nobody can vouch for
//! (then puts its message's dead letter back in the outbox); it lists,
//! shows and cancels the scheduled messages waiting in the outboxes; and it
//! runs the retention sweep once.
//!
//! It runs no bus, so what a bus would count itself it counts from the
//! database: a message is stalled when it has been pending for longer than
//! `--stalled-after` (60 s, the default of `BusBuilder::stalled_after`).
//!
//! ```text
//! cargo run -p tickbox-cli -- --data-dir minishop-data dead-letters list
//! cargo run -p tickbox-cli -- --data-dir minishop-data --module warehouse status
//! cargo run -p tickbox-cli -- --database-url minishop-data/orders.db subscriptions
//! cargo run -p tickbox-cli -- --database-url minishop-data/orders.db dead-letters list
//! cargo run -p tickbox-cli -- --database-url minishop-data/orders.db effects list --state unknown
//! cargo run -p tickbox-cli --features postgres -- \
//!     --database-url postgres://postgres@127.0.0.1/shop --schema minishop_orders status
//! cargo run -p tickbox-cli --features postgres -- --database-url postgres://postgres@127.0.0.1/shop \
//!     --schema minishop_orders --schema minishop_warehouse --schema minishop_notifications status
//! cargo run -p tickbox-cli --features mysql -- \
//!     --database-url mysql://root@127.0.0.1:3306 --schema minishop_orders dead-letters list
//! cargo run -p tickbox-cli --features mysql -- --database-url mysql://root@127.0.0.1:3306 \
//!     --schema minishop_orders --schema minishop_warehouse --schema minishop_notifications status
//! cargo run -p tickbox-cli -- help dead-letters replay
//! ```
//!
//! Exit status: 0 on success, 1 when the operation failed (a database
//! cannot be opened or has no tickbox tables, a data directory holds no
//! module database, a query failed, no module has the name --module gives,
//! the dead letter, the subscription or the effect does not exist, a
//! succeeded effect cannot be settled, a running process still serves the
//! subscription), 2 on a usage error (a destructive command without --yes,
//! a module given twice, a row several modules hold without --module among
//! them).
//!
//! # Layout
//!
//! - `main.rs` — the command line (clap) and the dispatch to a command.
//! - `target.rs` — the databases the command line names (URLs, schemas or
//!   MariaDB/MySQL databases, data directories), and attaching to one.
//! - `modules.rs` — the modules a command sees, named by their databases,
//!   and the one holding the row a command acts on.
//! - `inspect.rs` — the tool's own SQL, where the library offers no call.
//! - `status.rs` — `status`.
//! - `subscriptions.rs` — `subscriptions list` and `subscriptions retire`.
//! - `dead_letters.rs` — `dead-letters list`, `show`, `replay`, `skip`,
//!   `discard`.
//! - `effects.rs` — `effects list`, `done`, `retry`.
//! - `scheduled.rs` — `scheduled list`, `show`, `cancel`.
//! - `sweep.rs` — `sweep`.
//! - `queues.rs` — `queues` (feature `amqp`): handlers' queues on a
//!   RabbitMQ broker.
//! - `output.rs` — tables, JSON, times and durations as the tool prints them.

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]

mod dead_letters;
mod effects;
mod modules;
mod output;
#[cfg(feature = "amqp")]
mod queues;
mod scheduled;
// Its value parser is for arguments checked as they are parsed; this
// tool checks its URLs once it has them all (`Target`).
#[allow(dead_code)]
#[path = "../../secret_args.rs"]
mod secret_args;
mod status;
mod subscriptions;
mod sweep;
mod target;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use modules::Modules;
use secret_args::redact_arguments;
use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use target::Target;
use tickbox::{EffectState, Retention, Settlement};
use uuid::Uuid;

/// The longest duration accepted (100 years): longer ones would overflow
/// the microsecond arithmetic of the sweep.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// Inspect and repair the databases of a tickbox application's modules.
///
/// Attaches to the databases of an application's modules - SQLite files,
/// PostgreSQL databases and schemas, or MariaDB/MySQL databases - without
/// running migrations or any
/// handler code, so it is safe to use while the application runs. Give one
/// module's database, several, or a data directory holding one per module:
/// each module is named by the name its database records (its module's
/// name, recorded when the module starts), the lists show every module's
/// rows with a module column, and a command acting on one row finds the
/// module whose database holds it (--module chooses when several do).
#[derive(Debug, Parser)]
#[command(name = "tickbox", version, max_term_width = 100)]
#[command(after_help = "\
Examples: tickbox --data-dir minishop-data status; tickbox --database-url orders.db \
--database-url warehouse.db dead-letters list; tickbox --database-url postgres://HOST/shop \
--schema minishop_orders --schema minishop_warehouse --module warehouse status; tickbox \
--database-url mysql://root@127.0.0.1:3306 --schema minishop_orders --schema minishop_warehouse \
dead-letters list (MariaDB or MySQL: --schema names each module's database).

Exit status: 0 success; 1 the operation failed (a database cannot be opened or has no tickbox \
tables, a data directory holds no module database, a query failed, no module has the name \
--module gives, the dead letter, the subscription or the effect does not exist, a succeeded \
effect cannot be settled, a running process still serves the subscription to retire); 2 usage \
error (a module given twice, a row that several modules hold without --module among them).")]
struct Cli {
    /// A module's database: an SQLite file path or sqlite://PATH,
    /// postgres://USER:PASSWORD@HOST:PORT/DB, or (MariaDB, MySQL)
    /// mysql://USER:PASSWORD@HOST:PORT[/DB] (password, port and, with
    /// --schema, the MySQL database optional); repeat it for several
    /// modules. The environment's value is read when
    /// neither --database-url nor --data-dir is given
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "TICKBOX_DATABASE_URL",
        hide_env_values = true
    )]
    database_url: Vec<String>,

    /// PostgreSQL: the schema holding a module's tables [default: the
    /// connection's search_path]; MariaDB/MySQL: the database holding them
    /// [default: the URL's]; repeat it for several modules, one per schema
    /// or database of each server URL given
    #[arg(long, global = true, value_name = "NAME")]
    schema: Vec<String>,

    /// A directory holding one SQLite database per module, NAME.db (beside
    /// its NAME.db-effects journal), as minishop's --data-dir does: every
    /// module of it; repeat it for several directories
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Vec<PathBuf>,

    /// Only the module of this name (as `status` names it): what the lists
    /// show, and where a command acting on one row looks for it
    #[arg(
        long = "module",
        global = true,
        value_name = "NAME",
        value_parser = clap::builder::NonEmptyStringValueParser::new()
    )]
    only_module: Option<String>,

    /// Print one JSON object or array instead of text
    #[arg(long, global = true)]
    json: bool,

    /// Whether --database-url came from the environment, which counts only
    /// when no database is given on the command line.
    #[arg(skip)]
    url_from_env: bool,

    #[command(subcommand)]
    command: Command,
}

/// The commands.
#[derive(Debug, PartialEq, Subcommand)]
enum Command {
    /// Outbox backlog, lag and stalled messages, subscriptions, inbox size,
    /// dead letters, parked keys, unknown effects.
    ///
    /// Shows, for each module, its outbox backlog (messages not yet delivered
    /// to every subscriber), its lag (the age of the oldest of them) and how many of
    /// them are stalled (pending for longer than --stalled-after); the
    /// subscriptions recorded in the outbox (how many are alive and stopped,
    /// and the largest lag of one: the age of the oldest message a
    /// subscription still owes); the number of inbox rows (the
    /// duplicate-detection window), the number of dead letters, the
    /// ordering keys parked behind a dead letter and the effects waiting for
    /// a person to settle them (unknown), per handler.
    ///
    /// The application's bus counts stalled messages too
    /// (tickbox_outbox_stalled), by its own threshold,
    /// BusBuilder::stalled_after; this tool runs no bus and counts them in
    /// the database. Give the application's threshold if it changed the
    /// default.
    ///
    /// With --json: one object per module - alone when the command line
    /// names one module (one database, or --module), else in an array -
    /// with module, backend, outbox_pending,
    /// oldest_pending_us (microseconds since the Unix epoch, or null),
    /// lag_seconds (or null), stalled, stalled_after_seconds,
    /// subscriptions_alive, subscriptions_stopped, subscription_lag_seconds
    /// (or null when no subscription owes a message), lagging_subscription
    /// (the module and handler of the subscription owed the oldest message,
    /// or null), inbox_rows, dead_letters, parked_keys and unknown_effects
    /// (arrays of [handler, count]), and encrypted (whether the connection
    /// to the database server is encrypted: true or false, null on SQLite).
    Status {
        /// Count a message pending this long as stalled (the bus's default
        /// is 60s); e.g. 90s, 5m, 1h30m
        #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = stalled_after)]
        stalled_after: Duration,
    },

    /// The handlers, in any process, that receive each outbox's messages:
    /// list them (the default) or retire one.
    ///
    /// A subscription is a handler - of any module, in any process - that
    /// receives a module's messages of one topic. Each bus records the
    /// handlers it serves in the publishing module's database, and says every
    /// scan interval that they are still served: the subscription is alive.
    /// A message is finished only when no subscription still owes it, so the
    /// subscription of a process that stopped keeps the messages it owes
    /// until that process runs again: it is stopped. One whose handler is
    /// gone for good is retired.
    Subscriptions {
        #[command(subcommand)]
        command: Option<SubscriptionsCommand>,
    },

    /// List, show, replay or discard dead letters.
    ///
    /// A dead letter is kept by the module of the handler that gave up. The
    /// commands acting on one find the module whose database holds it
    /// (--module chooses when several modules hold one for the same message
    /// and handler).
    ///
    /// Dead letters are deliveries the bus gave up on: after the last retry,
    /// on a permanent handler error, for a payload that does not decode, or
    /// for a topic no module publishes. Each is keyed by its message id and
    /// the handler that gave up; the handler is empty when no handler could
    /// be chosen (an unknown topic) - write it as - or '' on the command
    /// line.
    #[command(subcommand)]
    DeadLetters(DeadLettersCommand),

    /// List, show or cancel scheduled messages.
    ///
    /// A scheduled message (Tx::publish_at, Tx::publish_after) waits in its
    /// module's outbox until it is due; the application's bus then delivers
    /// it to every subscriber, like any message. The commands acting on one
    /// find the module whose outbox holds it (--module chooses when several
    /// do).
    #[command(subcommand)]
    Scheduled(ScheduledCommand),

    /// List the effects handlers made, or settle one nobody can vouch for.
    ///
    /// An effect is an external call (an e-mail, a payment, an HTTP request)
    /// a handler made through the module's effects journal
    /// (Delivery::effect): recorded as started before the call and as
    /// succeeded or failed after it. One left started by a crash is called
    /// again with the same key, or - for an at-most-once effect, or after
    /// its key's window - becomes unknown, and the delivery is
    /// dead-lettered. A person checks the external system and settles it:
    /// done (it happened) or retry (call it once more); the tool then puts
    /// the message's dead letter back in the outbox, as `dead-letters
    /// replay` does. Each effect is keyed by its message id, its handler and
    /// its name.
    #[command(subcommand)]
    Effects(EffectsCommand),

    /// Run the retention sweep once and report what it deleted.
    ///
    /// Runs the retention sweep once, as the application's bus does every
    /// minute: deletes inbox rows processed longer ago than the inbox
    /// retention, outbox rows delivered longer ago than the outbox
    /// retention, and settled effects (succeeded or failed) last changed
    /// longer ago than the inbox retention, in small batches. Undelivered
    /// outbox rows, dead letters, unsettled effects and the effects of
    /// dead-lettered messages are never deleted.
    ///
    /// Inbox rows are the duplicate-detection window: keep the inbox
    /// retention longer than the application's redelivery horizon (its retry
    /// policies), or a late duplicate would be processed twice. This tool
    /// cannot see those policies.
    ///
    /// Every module seen is swept, one after the other.
    ///
    /// With --json: one object per module - alone when the command line
    /// names one module (one database, or --module), else in an array -
    /// with module, inbox_rows, outbox_rows and effect_rows (rows deleted)
    /// and inbox_retention_seconds and outbox_retention_seconds (null for
    /// never).
    Sweep {
        /// Keep inbox rows this long; e.g. 30d, 12h, or never to keep every row
        #[arg(
            long,
            value_name = "DURATION",
            default_value_t = Window(Retention::default().inbox),
            value_parser = retention_window
        )]
        inbox_retention: Window,

        /// Keep delivered outbox rows this long; e.g. 30d, 12h, or never to
        /// keep every row
        #[arg(
            long,
            value_name = "DURATION",
            default_value_t = Window(Retention::default().outbox),
            value_parser = retention_window
        )]
        outbox_retention: Window,
    },

    /// Messages waiting in handlers' RabbitMQ queues, and their consumers.
    ///
    /// For an application whose bus runs over a RabbitMQ broker
    /// (BusBuilder::amqp): reads the queue of each handler given - named
    /// tickbox.<namespace>.<module>.<handler> - with a passive declare, which
    /// changes nothing, and shows the messages waiting in it (not those
    /// delivered and not yet acknowledged) and its consumers (the handler's
    /// running services). Needs no database. The running bus exports the same
    /// figures, and more, as metrics (tickbox_amqp_*).
    ///
    /// With --json: an array of objects with queue, messages and consumers.
    #[cfg(feature = "amqp")]
    Queues(QueuesArgs),
}

/// `queues`: what the broker holds for handlers.
#[derive(Debug, PartialEq, Args)]
struct QueuesArgs {
    /// The broker: amqp://USER:PASSWORD@HOST:PORT/VHOST
    #[arg(
        long,
        value_name = "URL",
        env = "TICKBOX_AMQP_URL",
        hide_env_values = true,
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_default_value = true
    )]
    amqp_url: String,

    /// The namespace the application's bus runs in (Amqp::namespace)
    #[arg(long, value_name = "NAME", default_value = "")]
    amqp_namespace: String,

    /// The handlers, as MODULE/HANDLER (e.g. warehouse/warehouse.reserve_stock)
    #[arg(required = true, value_name = "MODULE/HANDLER")]
    handlers: Vec<String>,
}

/// `subscriptions …`.
#[derive(Debug, PartialEq, Subcommand)]
enum SubscriptionsCommand {
    /// List the subscriptions: state, and the oldest message each still owes.
    ///
    /// Lists the subscriptions recorded in each module's outbox, by outbox,
    /// module and handler: the outbox's module, the subscribing module, the handler, the topic it
    /// receives, its state - alive (a running bus serves it) or stopped (no
    /// running bus has since it was last seen) - when it was first recorded
    /// (UTC, ISO 8601), and the age of the oldest message it still owes (-
    /// when it owes none). `tickbox subscriptions` alone lists them too.
    ///
    /// With --json: an array of subscription objects (outbox, module,
    /// handler, topic, subscribed_at_us, seen_at_us, alive_until_us,
    /// oldest_pending_us - times in microseconds since the Unix epoch, null
    /// when none - alive, and lag_seconds, the age of the oldest message it
    /// owes or null).
    List,

    /// Retire a stopped subscription whose handler is gone for good
    /// (requires --yes).
    ///
    /// Retires the subscription of handler HANDLER of module MODULE from
    /// the outbox that records it (--module names that outbox's module when
    /// several do), for a handler removed from the code or a process
    /// gone for good: its messages are no longer kept for it, and those only
    /// it still owed are marked delivered - it will never receive them.
    /// Messages that other subscriptions still owe stay pending for them.
    /// There is no prompt; the command refuses to run without --yes.
    ///
    /// Refused while a running process serves the subscription (it would
    /// miss messages, and its process records it again): stop that process,
    /// or remove the handler from it, first. A process started later with
    /// the handler subscribes it again.
    ///
    /// When it was the last subscription of its topic, the messages of the
    /// topic still pending are left to the application's bus: it delivers
    /// them to the handlers it then has for the topic, or finishes them if
    /// it has none.
    ///
    /// With --json: one object with outbox (the outbox's module), module,
    /// handler, topic, retired, finished (the number of messages only it owed, now marked delivered)
    /// and topic_subscriptions_left (the subscriptions of its topic still
    /// recorded).
    Retire(RetireArgs),
}

/// `subscriptions retire MODULE HANDLER`.
#[derive(Debug, PartialEq, Args)]
struct RetireArgs {
    /// The subscribing module, as `tickbox subscriptions` prints it
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    module: String,

    /// The handler's name
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    handler: String,

    /// Confirm the retirement
    #[arg(short, long)]
    yes: bool,
}

/// `dead-letters …`.
#[derive(Debug, PartialEq, Subcommand)]
enum DeadLettersCommand {
    /// List dead letters, oldest first.
    ///
    /// Lists the dead letters of every module, oldest first: the module
    /// that holds it (the handler's), message id, handler (- when none),
    /// topic, ordering key, attempts, when it was given up on (UTC, ISO 8601)
    /// and the reason, shortened to one line. `show` prints one in full.
    ///
    /// With --json: an array of dead letter objects (module, message_id,
    /// handler, topic, payload, correlation_id, causation_id, created_at_us,
    /// attempts, reason, dead_at_us, keyed, parked_behind).
    List {
        /// Skip the first N dead letters
        #[arg(long, value_name = "N", default_value_t = 0)]
        offset: u64,

        /// Show at most N dead letters
        #[arg(long, value_name = "N", default_value_t = 50)]
        limit: u64,
    },

    /// Show one dead letter in full, payload included.
    ///
    /// Shows everything about one dead letter: ids, topic, times, attempts,
    /// the full reason and the payload (pretty-printed when it is JSON).
    ///
    /// With --json: the dead letter as one object, with module.
    Show(DeadLetterKey),

    /// Put a dead letter's message back in the outbox for redelivery.
    ///
    /// Puts a dead letter's message back in its module's outbox as pending
    /// and removes the dead letter, in one transaction. The application's
    /// bus delivers it again to every subscriber of its topic: on PostgreSQL
    /// at once (the commit wakes it), on SQLite, MariaDB and MySQL at its
    /// next outbox scan (every 2 s by default), and at start if no
    /// application runs now.
    /// Handlers that did process it skip it thanks to their inbox, the one
    /// that gave up tries again. No handler code runs in this tool.
    ///
    /// With --json: one object with module, message_id, handler, topic and
    /// requeued.
    ///
    /// A dead letter with an ordering key parks its key: the key's later
    /// messages wait behind it (listed as parked). Replaying it puts them
    /// back too, and the bus delivers them in the key's order.
    Replay(DeadLetterKey),

    /// Give up on a dead letter and let its ordering key move on (requires --yes).
    ///
    /// Deletes the dead letter without delivering it and, when it has an
    /// ordering key, moves its handler's place in the key past it: the
    /// key's messages parked behind it go back in the outbox and the
    /// application's bus delivers them in the key's order. Without a key it
    /// is the same as discard. The handler never processes the skipped
    /// message.
    ///
    /// With --json: one object with module, message_id, handler, topic,
    /// ordering_key and skipped.
    Skip {
        #[command(flatten)]
        key: DeadLetterKey,

        /// Confirm skipping it
        #[arg(short, long)]
        yes: bool,
    },

    /// Delete a dead letter for good (requires --yes).
    ///
    /// Deletes a dead letter without delivering its message: the handler
    /// that gave up will never process it. There is no prompt; the command
    /// refuses to run without --yes.
    ///
    /// With --json: one object with module, message_id, handler, topic and
    /// discarded.
    Discard {
        #[command(flatten)]
        key: DeadLetterKey,

        /// Confirm the deletion
        #[arg(short, long)]
        yes: bool,
    },
}

/// `scheduled …`.
#[derive(Debug, PartialEq, Subcommand)]
enum ScheduledCommand {
    /// List the scheduled messages not yet due, soonest first.
    ///
    /// Lists the scheduled messages of every module that are not yet due,
    /// soonest first: the module, message id, topic, ordering key, when it
    /// is due (UTC, ISO 8601) and how long until then. `show` prints one in
    /// full.
    ///
    /// With --json: an array of objects (module, message_id, topic,
    /// payload, correlation_id, causation_id, created_at_us, due_at_us,
    /// ordering_key, taken).
    List {
        /// Skip the first N scheduled messages
        #[arg(long, value_name = "N", default_value_t = 0)]
        offset: u64,

        /// Show at most N scheduled messages
        #[arg(long, value_name = "N", default_value_t = 50)]
        limit: u64,
    },

    /// Show one scheduled message in full, payload included.
    ///
    /// Shows a scheduled message while it is in the outbox, due or not:
    /// ids, topic, key, when it is due and was published, and the payload
    /// (pretty-printed when it is JSON).
    ///
    /// With --json: the message as one object, with module.
    Show {
        /// The message's id (a UUID, as `scheduled list` prints it)
        #[arg(value_parser = message_id)]
        message_id: Uuid,
    },

    /// Cancel a scheduled message that is not yet due (requires --yes).
    ///
    /// Removes a scheduled message from its outbox before it is due: no
    /// handler will receive it. One that is due already is being delivered
    /// and cannot be cancelled (exit 1).
    ///
    /// With --json: one object with module, message_id, topic, due_at_us
    /// and cancelled.
    Cancel {
        /// The message's id (a UUID, as `scheduled list` prints it)
        #[arg(value_parser = message_id)]
        message_id: Uuid,

        /// Confirm the cancellation
        #[arg(short, long)]
        yes: bool,
    },
}

/// `effects …`.
#[derive(Debug, PartialEq, Subcommand)]
enum EffectsCommand {
    /// List effects, least recently changed first.
    ///
    /// Lists the effects in every module's journal, least recently changed
    /// first: the module, message id, handler, effect name, state (started, succeeded,
    /// failed, unknown or retry), policy (at-most-once or
    /// at-least-once-with-key), how many times it was called, its
    /// idempotency key, when its state last changed (UTC, ISO 8601) and its
    /// error, shortened to one line. Without --state, every effect; an
    /// SQLite module whose handlers never recorded an effect has none.
    ///
    /// With --json: an array of effect objects (module, message_id,
    /// handler, effect, key, policy, state, calls, window_from_us, updated_at_us -
    /// times in microseconds since the Unix epoch - result, error).
    List {
        /// Only effects in this state (started, succeeded, failed, unknown,
        /// retry); repeat it for several
        #[arg(long = "state", value_name = "STATE", value_parser = effect_state)]
        states: Vec<EffectState>,

        /// Skip the first N effects
        #[arg(long, value_name = "N", default_value_t = 0)]
        offset: u64,

        /// Show at most N effects
        #[arg(long, value_name = "N", default_value_t = 50)]
        limit: u64,
    },

    /// Settle an effect as done: it happened (requires --yes).
    ///
    /// For an effect checked in the external system and found done: it
    /// becomes succeeded with the result given by --result (null by
    /// default), which the handler gets back on the next delivery without
    /// calling. The result must be what the effect returns, as JSON (a
    /// string needs its quotes: --result '"250 OK"'). Then, if the message
    /// has a dead letter for the handler, puts it back in that module's
    /// outbox as `dead-letters replay` does, for the application's bus to
    /// deliver again. A succeeded effect cannot be settled. There is no
    /// prompt; the command refuses to run without --yes. The effect is
    /// looked for in the journal of the module that runs HANDLER (--module
    /// chooses when several modules run a handler of that name).
    ///
    /// With --json: one object with module, settlement, effect (the effect object as
    /// `effects list --json` prints it, as it now stands), requeued (whether
    /// a dead letter was put back in the outbox) and topic (its topic, or
    /// null).
    Done {
        #[command(flatten)]
        key: EffectKey,

        /// The effect's result, as JSON (e.g. '"250 OK"', 42, '{"id":7}')
        #[arg(long, value_name = "JSON", default_value = "null", value_parser = json_value)]
        result: serde_json::Value,

        /// Confirm that it happened
        #[arg(short, long)]
        yes: bool,
    },

    /// Settle an effect as retry: call it once more (requires --yes).
    ///
    /// For an effect checked in the external system and found not done (or
    /// safe to repeat): the next delivery calls it once more, with the same
    /// idempotency key, and its key's window starts again. Then, if the
    /// message has a dead letter for the handler, puts it back in that
    /// module's outbox as `dead-letters replay` does, for the application's
    /// bus to deliver again. A succeeded effect cannot be settled. There is
    /// no prompt; the command refuses to run without --yes. The effect is
    /// looked for as for `effects done`.
    ///
    /// With --json: one object with module, settlement, effect, requeued
    /// and topic, as for `effects done`.
    Retry {
        #[command(flatten)]
        key: EffectKey,

        /// Confirm calling it again
        #[arg(short, long)]
        yes: bool,
    },
}

/// `MESSAGE_ID HANDLER EFFECT`: an effect's key in the journal.
#[derive(Debug, Clone, PartialEq, Args)]
struct EffectKey {
    /// The message's id (a UUID, as `effects list` prints it)
    #[arg(value_parser = message_id)]
    message_id: Uuid,

    /// The handler that made the effect
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    handler: String,

    /// The effect's name
    #[arg(value_parser = clap::builder::NonEmptyStringValueParser::new())]
    effect: String,
}

/// `MESSAGE_ID HANDLER`: a dead letter's key.
#[derive(Debug, Clone, PartialEq, Args)]
struct DeadLetterKey {
    /// The message's id (a UUID, as `dead-letters list` prints it)
    #[arg(value_parser = message_id)]
    message_id: Uuid,

    /// The handler that gave up; - or '' for none (an unknown topic)
    #[arg(value_parser = handler_arg)]
    handler: String,
}

/// A retention window as given on the command line: `None` keeps every row.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Window(Option<Duration>);

impl fmt::Display for Window {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(window) => f.write_str(&output::window(window)),
            None => f.write_str("never"),
        }
    }
}

/// A duration on the command line: `7d`, `12h`, `1h30m`, `90s`, `2w` — jiff's
/// friendly format (or ISO 8601), with days of 24 hours; at most 100 years.
fn duration(text: &str) -> Result<Duration, String> {
    let span: jiff::Span = text
        .trim()
        .parse()
        .map_err(|e: jiff::Error| e.to_string())?;
    let signed = span
        .to_duration(jiff::SpanRelativeTo::days_are_24_hours())
        .map_err(|_| "use units of weeks or less (w, d, h, m, s)".to_string())?;
    if signed.is_negative() {
        return Err("must be above zero".into());
    }
    let window = Duration::try_from(signed).map_err(|e| e.to_string())?;
    if window.is_zero() {
        return Err("must be above zero".into());
    }
    if window > MAX_DURATION {
        return Err("is longer than 100 years".into());
    }
    Ok(window)
}

/// `--inbox-retention`, `--outbox-retention`: a duration or `never`.
fn retention_window(text: &str) -> Result<Window, String> {
    if text.trim().eq_ignore_ascii_case("never") {
        return Ok(Window(None));
    }
    duration(text)
        .map(|window| Window(Some(window)))
        .map_err(|why| format!("{why}; write e.g. 7d, 12h, 30m, 45s, 1h30m or never"))
}

/// `--stalled-after`: a duration (not `never`).
fn stalled_after(text: &str) -> Result<Duration, String> {
    if text.trim().eq_ignore_ascii_case("never") {
        return Err("a message is stalled after some time, not never".into());
    }
    duration(text).map_err(|why| format!("{why}; write e.g. 60s, 5m, 1h or 1h30m"))
}

/// `MESSAGE_ID`: a UUID.
fn message_id(text: &str) -> Result<Uuid, String> {
    Uuid::parse_str(text.trim()).map_err(|_| {
        "not a message id; a message id is a UUID such as 0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69"
            .to_string()
    })
}

/// `--state`: an effect state's name.
fn effect_state(text: &str) -> Result<EffectState, String> {
    text.trim().parse()
}

/// `--result`: a JSON value.
fn json_value(text: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(text).map_err(|e| {
        format!(
            "not valid JSON ({e}); write e.g. '\"250 OK\"' (a string needs its quotes), 42, \
             '{{\"id\":7}}' or null"
        )
    })
}

/// `HANDLER` of a dead letter: `-`, `''` and an empty argument mean "no
/// handler".
fn handler_arg(text: &str) -> Result<String, String> {
    Ok(match text {
        "-" | "''" | "\"\"" => String::new(),
        other => other.to_string(),
    })
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

impl Command {
    /// The words that lead to this command, for its usage line.
    fn path(&self) -> &'static [&'static str] {
        match self {
            Command::Status { .. } => &["status"],
            Command::Subscriptions { command: None } => &["subscriptions"],
            Command::Subscriptions {
                command: Some(SubscriptionsCommand::List),
            } => &["subscriptions", "list"],
            Command::Subscriptions {
                command: Some(SubscriptionsCommand::Retire(_)),
            } => &["subscriptions", "retire"],
            Command::DeadLetters(DeadLettersCommand::List { .. }) => &["dead-letters", "list"],
            Command::DeadLetters(DeadLettersCommand::Show(_)) => &["dead-letters", "show"],
            Command::DeadLetters(DeadLettersCommand::Replay(_)) => &["dead-letters", "replay"],
            Command::DeadLetters(DeadLettersCommand::Skip { .. }) => &["dead-letters", "skip"],
            Command::DeadLetters(DeadLettersCommand::Discard { .. }) => {
                &["dead-letters", "discard"]
            }
            Command::Scheduled(ScheduledCommand::List { .. }) => &["scheduled", "list"],
            Command::Scheduled(ScheduledCommand::Show { .. }) => &["scheduled", "show"],
            Command::Scheduled(ScheduledCommand::Cancel { .. }) => &["scheduled", "cancel"],
            Command::Effects(EffectsCommand::List { .. }) => &["effects", "list"],
            Command::Effects(EffectsCommand::Done { .. }) => &["effects", "done"],
            Command::Effects(EffectsCommand::Retry { .. }) => &["effects", "retry"],
            Command::Sweep { .. } => &["sweep"],
            #[cfg(feature = "amqp")]
            Command::Queues(_) => &["queues"],
        }
    }

    /// A usage error (exit 2) of this command, with its usage line.
    fn usage_error(&self, kind: ErrorKind, message: impl fmt::Display) -> Failure {
        let mut command = Cli::command();
        command.build();
        let mut sub = &mut command;
        for name in self.path() {
            sub = sub
                .find_subcommand_mut(name)
                .expect("a command of the tool");
        }
        Failure::Usage(sub.error(kind, message))
    }

    /// Refuses a destructive command without `--yes`.
    fn confirmed(&self) -> Result<(), Failure> {
        let refusal = match self {
            Command::Subscriptions {
                command: Some(SubscriptionsCommand::Retire(args)),
            } if !args.yes => format!(
                "refusing to retire the subscription of handler `{}` of module `{}` without \
                 --yes: the messages only it still owes would be marked delivered, and it would \
                 never receive them; add --yes to confirm",
                args.handler, args.module
            ),
            Command::DeadLetters(DeadLettersCommand::Skip { key, yes: false }) => format!(
                "refusing to skip the dead letter of message {} ({}) without --yes: that handler \
                 would never process it, and its ordering key would move on without it; add \
                 --yes to confirm",
                key.message_id,
                handler_label(&key.handler)
            ),
            Command::DeadLetters(DeadLettersCommand::Discard { key, yes: false }) => format!(
                "refusing to discard the dead letter of message {} ({}) without --yes: it would \
                 never be delivered to that handler; add --yes to confirm",
                key.message_id,
                handler_label(&key.handler)
            ),
            Command::Scheduled(ScheduledCommand::Cancel {
                message_id,
                yes: false,
            }) => format!(
                "refusing to cancel scheduled message {message_id} without --yes: no handler \
                 would ever receive it; add --yes to confirm"
            ),
            Command::Effects(EffectsCommand::Done {
                key, yes: false, ..
            }) => format!(
                "refusing to settle effect `{}` of handler `{}` for message {} as done without \
                 --yes: it would be recorded as having happened, and the handler would never \
                 call it again; check the external system, then add --yes to confirm",
                key.effect, key.handler, key.message_id
            ),
            Command::Effects(EffectsCommand::Retry { key, yes: false }) => format!(
                "refusing to settle effect `{}` of handler `{}` for message {} as retry without \
                 --yes: the next delivery would call it again; check the external system, then \
                 add --yes to confirm",
                key.effect, key.handler, key.message_id
            ),
            _ => return Ok(()),
        };
        Err(self.usage_error(ErrorKind::MissingRequiredArgument, refusal))
    }
}

/// Why the tool stops without doing its job.
#[derive(Debug)]
enum Failure {
    /// The command line is wrong (exit 2).
    Usage(clap::Error),
    /// The operation failed (exit 1).
    Failed(String),
}

impl From<tickbox::Error> for Failure {
    fn from(error: tickbox::Error) -> Self {
        Failure::Failed(error.to_string())
    }
}

/// What the command line asks for, checked.
#[derive(Debug)]
struct Invocation {
    /// The databases the command line names by URL (none for commands that
    /// need no database).
    targets: Vec<Target>,
    /// The data directories whose module databases the command works on too.
    data_dirs: Vec<PathBuf>,
    /// `--module`: the only module to see.
    module: Option<String>,
    json: bool,
    command: Command,
}

impl Cli {
    /// Parses the command line, noting whether the database URL came from
    /// the environment.
    fn parse_args(
        args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
    ) -> Result<Cli, clap::Error> {
        let matches = Cli::command().try_get_matches_from(args)?;
        let mut cli = Cli::from_arg_matches(&matches)?;
        cli.url_from_env = matches.value_source("database_url") == Some(ValueSource::EnvVariable);
        Ok(cli)
    }

    /// Checks what clap cannot: a database is given, its URL is one the tool
    /// knows, and a destructive command is confirmed.
    fn invocation(self) -> Result<Invocation, Failure> {
        let command = self.command;
        command.confirmed()?;
        #[cfg(feature = "amqp")]
        if matches!(command, Command::Queues(_)) {
            return Ok(Invocation {
                targets: Vec::new(),
                data_dirs: Vec::new(),
                module: None,
                json: self.json,
                command,
            });
        }
        // The environment's database stands in for the command line's, not
        // beside a data directory.
        let urls = if self.url_from_env && !self.data_dir.is_empty() {
            Vec::new()
        } else {
            self.database_url
        };
        if urls.is_empty() && self.data_dir.is_empty() {
            return Err(command.usage_error(
                ErrorKind::MissingRequiredArgument,
                "no database given: pass --database-url URL or --data-dir DIR, or set \
                 TICKBOX_DATABASE_URL",
            ));
        }
        let targets = target::targets(&urls, &self.schema)
            .map_err(|why| command.usage_error(ErrorKind::InvalidValue, why))?;
        Ok(Invocation {
            targets,
            data_dirs: self.data_dir,
            module: self.only_module,
            json: self.json,
            command,
        })
    }
}

/// Opens the databases of the modules the command works on and runs it;
/// returns what to print.
async fn execute(invocation: &Invocation) -> Result<String, Failure> {
    #[cfg(feature = "amqp")]
    if let Command::Queues(args) = &invocation.command {
        let amqp = tickbox::Amqp::new(&args.amqp_url).namespace(&args.amqp_namespace);
        return queues::queues(&amqp, &args.handlers, invocation.json).await;
    }
    let retention = match &invocation.command {
        Command::Sweep {
            inbox_retention,
            outbox_retention,
        } => Some(Retention {
            inbox: inbox_retention.0,
            outbox: outbox_retention.0,
            ..Retention::default()
        }),
        _ => None,
    };
    let mut targets: Vec<&Target> = invocation.targets.iter().collect();
    let found: Vec<Target> = invocation
        .data_dirs
        .iter()
        .map(|dir| target::data_dir(dir))
        .collect::<Result<Vec<_>, _>>()
        .map_err(Failure::Failed)?
        .into_iter()
        .flatten()
        .collect();
    targets.extend(&found);
    let command = &invocation.command;
    let single = invocation.targets.len() == 1 && invocation.data_dirs.is_empty();
    let modules = Modules::attach(
        &targets,
        single,
        invocation.module.as_deref(),
        retention.clone(),
        command,
    )
    .await?;
    let modules = &modules;
    let json = invocation.json;
    match command {
        Command::Status { stalled_after } => status::status(modules, *stalled_after, json).await,
        Command::Subscriptions { command: sub } => match sub {
            None | Some(SubscriptionsCommand::List) => subscriptions::list(modules, json).await,
            Some(SubscriptionsCommand::Retire(args)) => {
                subscriptions::retire(modules, &args.module, &args.handler, json, command).await
            }
        },
        Command::DeadLetters(sub) => match sub {
            DeadLettersCommand::List { offset, limit } => {
                dead_letters::list(modules, *offset, *limit, json).await
            }
            DeadLettersCommand::Show(key) => dead_letters::show(modules, key, json, command).await,
            DeadLettersCommand::Replay(key) => {
                dead_letters::replay(modules, key, json, command).await
            }
            DeadLettersCommand::Skip { key, .. } => {
                dead_letters::skip(modules, key, json, command).await
            }
            DeadLettersCommand::Discard { key, .. } => {
                dead_letters::discard(modules, key, json, command).await
            }
        },
        Command::Scheduled(sub) => match sub {
            ScheduledCommand::List { offset, limit } => {
                scheduled::list(modules, *offset, *limit, json).await
            }
            ScheduledCommand::Show { message_id } => {
                scheduled::show(modules, *message_id, json, command).await
            }
            ScheduledCommand::Cancel { message_id, .. } => {
                scheduled::cancel(modules, *message_id, json, command).await
            }
        },
        Command::Effects(sub) => match sub {
            EffectsCommand::List {
                states,
                offset,
                limit,
            } => effects::list(modules, states, *offset, *limit, json).await,
            EffectsCommand::Done { key, result, .. } => {
                let settlement = Settlement::Done {
                    result: result.clone(),
                };
                effects::settle(modules, key, settlement, json, command).await
            }
            EffectsCommand::Retry { key, .. } => {
                effects::settle(modules, key, Settlement::Retry, json, command).await
            }
        },
        Command::Sweep { .. } => {
            let retention = retention.expect("the sweep's retention");
            sweep::sweep(modules, &retention, json).await
        }
        #[cfg(feature = "amqp")]
        Command::Queues(_) => unreachable!("queues needs no database"),
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

/// Reports a failure on stderr and returns its exit code.
fn fail(failure: Failure, args: &[OsString]) -> ExitCode {
    match failure {
        Failure::Usage(error) => {
            let code = u8::try_from(error.exit_code()).unwrap_or(2);
            match error.kind() {
                // `--help`, `--version`: clap prints them as it likes.
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
                    if let Err(e) = error.print() {
                        if e.kind() != std::io::ErrorKind::BrokenPipe {
                            return ExitCode::from(1);
                        }
                    }
                }
                _ => eprint!("{}", redact_arguments(&error.render().to_string(), args)),
            }
            ExitCode::from(code)
        }
        Failure::Failed(message) => {
            eprintln!("error: {}", redact_arguments(&message, args));
            ExitCode::from(1)
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let invocation = match Cli::parse_args(&args) {
        Ok(cli) => cli.invocation(),
        Err(error) => Err(Failure::Usage(error)),
    };
    let invocation = match invocation {
        Ok(invocation) => invocation,
        Err(failure) => return fail(failure, &args),
    };
    let result = actix::System::new().block_on(async {
        let result = execute(&invocation).await;
        settle().await;
        result
    });
    match result {
        Ok(text) => output::print(&text),
        Err(failure) => fail(failure, &args),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Kind;

    fn parse(line: &str) -> Result<Invocation, Failure> {
        let args = std::iter::once("tickbox").chain(line.split_whitespace());
        Cli::parse_args(args)
            .map_err(Failure::Usage)
            .and_then(Cli::invocation)
    }

    fn run_of(line: &str) -> Invocation {
        parse(line).unwrap_or_else(|failure| panic!("{line}: {failure:?}"))
    }

    /// The usage error's text, passwords hidden as the tool prints it.
    fn usage_error(line: &str) -> String {
        let args: Vec<OsString> = line.split_whitespace().map(OsString::from).collect();
        match parse(line) {
            Err(Failure::Usage(error)) => {
                assert_eq!(error.exit_code(), 2, "{line}: {error}");
                redact_arguments(&error.render().to_string(), &args)
            }
            other => panic!("{line}: expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_durations() {
        let secs = |s: &str| duration(s).map(|d| d.as_secs());
        assert_eq!(secs("7d"), Ok(7 * 86_400));
        assert_eq!(secs("12h"), Ok(12 * 3600));
        assert_eq!(secs("30m"), Ok(1800));
        assert_eq!(secs("45s"), Ok(45));
        assert_eq!(secs("2w"), Ok(14 * 86_400));
        assert_eq!(secs("1h30m"), Ok(5400));
        assert_eq!(secs("1h 30m"), Ok(5400));
        assert_eq!(retention_window("never"), Ok(Window(None)));
        for bad in [
            "7",
            "d",
            "7x",
            "",
            "99999999999999999999d",
            "0s",
            "-7d",
            "3y",
            "101y",
        ] {
            assert!(duration(bad).is_err(), "{bad}");
        }
        assert!(duration("36501d").unwrap_err().contains("100 years"));
        assert!(stalled_after("never").is_err());
        assert_eq!(Window(Some(Duration::from_secs(5400))).to_string(), "1h30m");
        assert_eq!(Window(Retention::default().inbox).to_string(), "7d");
        assert_eq!(Window(None).to_string(), "never");
    }

    #[test]
    fn parses_commands_and_options_in_any_order() {
        let invocation = run_of("--database-url a/orders.db --json status");
        assert_eq!(
            invocation.command,
            Command::Status {
                stalled_after: Duration::from_secs(60)
            }
        );
        assert!(invocation.json);
        assert_eq!(invocation.targets[0].kind, Kind::Sqlite);
        assert_eq!(invocation.targets[0].module, "orders");

        let invocation = run_of("dead-letters list --limit=5 --offset 10 --database-url x.db");
        assert_eq!(
            invocation.command,
            Command::DeadLetters(DeadLettersCommand::List {
                offset: 10,
                limit: 5
            })
        );

        let id = "0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69";
        let invocation = run_of(&format!("--database-url x.db dead-letters show {id} -"));
        assert_eq!(
            invocation.command,
            Command::DeadLetters(DeadLettersCommand::Show(DeadLetterKey {
                message_id: id.parse().unwrap(),
                handler: String::new()
            }))
        );
        let invocation = run_of(&format!(
            "--database-url postgres://u:p@h/shop --schema s1 dead-letters discard {id} h.x --yes"
        ));
        assert_eq!(invocation.targets[0].kind, Kind::Postgres);
        assert_eq!(invocation.targets[0].module, "s1");
        assert!(matches!(
            invocation.command,
            Command::DeadLetters(DeadLettersCommand::Discard { yes: true, .. })
        ));

        let invocation = run_of("--database-url postgresql://h/shop?sslmode=disable status");
        assert_eq!(invocation.targets[0].module, "shop");

        let invocation =
            run_of("--database-url x.db sweep --inbox-retention 14d --outbox-retention never");
        assert_eq!(
            invocation.command,
            Command::Sweep {
                inbox_retention: Window(Some(Duration::from_secs(14 * 86_400))),
                outbox_retention: Window(None),
            }
        );
        assert_eq!(
            run_of("--database-url x.db sweep").command,
            Command::Sweep {
                inbox_retention: Window(Retention::default().inbox),
                outbox_retention: Window(Retention::default().outbox),
            }
        );

        assert_eq!(
            run_of("status --stalled-after 5m --database-url x.db").command,
            Command::Status {
                stalled_after: Duration::from_secs(300)
            }
        );
        assert_eq!(
            run_of("--database-url x.db subscriptions").command,
            Command::Subscriptions { command: None }
        );
        assert_eq!(
            run_of("--database-url x.db --json subscriptions list").command,
            Command::Subscriptions {
                command: Some(SubscriptionsCommand::List)
            }
        );
        assert_eq!(
            run_of("--database-url x.db subscriptions retire warehouse warehouse.reserve -y")
                .command,
            Command::Subscriptions {
                command: Some(SubscriptionsCommand::Retire(RetireArgs {
                    module: "warehouse".into(),
                    handler: "warehouse.reserve".into(),
                    yes: true,
                }))
            }
        );
    }

    #[test]
    fn parses_the_effects_commands() {
        let id = "0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69";
        assert_eq!(
            run_of("--database-url x.db effects list").command,
            Command::Effects(EffectsCommand::List {
                states: Vec::new(),
                offset: 0,
                limit: 50
            })
        );
        assert_eq!(
            run_of("effects list --state unknown --state=failed --limit 5 --database-url x.db")
                .command,
            Command::Effects(EffectsCommand::List {
                states: vec![EffectState::Unknown, EffectState::Failed],
                offset: 0,
                limit: 5
            })
        );
        let key = EffectKey {
            message_id: id.parse().unwrap(),
            handler: "orders.notify".into(),
            effect: "notify".into(),
        };
        assert_eq!(
            run_of(&format!(
                "--database-url x.db effects done {id} orders.notify notify --yes"
            ))
            .command,
            Command::Effects(EffectsCommand::Done {
                key: key.clone(),
                result: serde_json::Value::Null,
                yes: true
            })
        );
        assert_eq!(
            run_of(&format!(
                "--database-url x.db effects done -y {id} orders.notify notify --result {{\"id\":7}}"
            ))
            .command,
            Command::Effects(EffectsCommand::Done {
                key: key.clone(),
                result: serde_json::json!({ "id": 7 }),
                yes: true
            })
        );
        assert_eq!(
            run_of(&format!(
                "--database-url x.db effects retry {id} orders.notify notify -y"
            ))
            .command,
            Command::Effects(EffectsCommand::Retry { key, yes: true })
        );
        assert_eq!(json_value(" \"ok\" "), Ok(serde_json::json!("ok")));
        assert!(json_value("ok").is_err());
        assert!(json_value("").is_err());
        assert_eq!(effect_state(" retry"), Ok(EffectState::Retry));
        assert!(effect_state("Unknown").is_err());
    }

    #[test]
    fn accepts_dash_and_quotes_for_the_empty_handler() {
        for text in ["-", "''", ""] {
            assert_eq!(handler_arg(text), Ok(String::new()), "{text:?}");
        }
        assert_eq!(
            handler_arg("warehouse.reserve"),
            Ok("warehouse.reserve".to_string())
        );
    }

    #[test]
    fn refuses_bad_usage() {
        let id = "0190c2a4-5b1e-7d3c-9a4f-1e2d3c4b5a69";
        for (line, needle) in [
            ("--database-url x.db frobnicate", "unrecognized subcommand"),
            ("--database-url x.db status --frob", "unexpected argument"),
            ("status", "TICKBOX_DATABASE_URL"),
            (
                "--database-url x.db status --yes",
                "unexpected argument '--yes'",
            ),
            ("--database-url x.db dead-letters show nope h", "UUID"),
            (
                &format!("--database-url x.db dead-letters show {id}"),
                "<HANDLER>",
            ),
            (
                &format!("--database-url x.db dead-letters discard {id} h"),
                "--yes",
            ),
            ("--database-url x.db dead-letters list --limit -1", "'-1'"),
            (
                "--database-url x.db sweep --inbox-retention 0s",
                "above zero",
            ),
            ("--database-url x.db sweep --inbox-retention 7", "unit"),
            (
                "--database-url x.db --schema s status",
                "MariaDB/MySQL (a database) only",
            ),
            ("--database-url mongodb://h/db status", "neither"),
            (
                "--data-dir d --schema s status",
                "MariaDB/MySQL (a database) only",
            ),
            ("--database-url", "a value is required"),
            ("help frobnicate", "unrecognized subcommand"),
            (
                "--database-url x.db subscriptions purge",
                "unrecognized subcommand",
            ),
            (
                "--database-url x.db subscriptions list extra",
                "unexpected argument",
            ),
            ("--database-url x.db subscriptions retire m", "<HANDLER>"),
            ("--database-url x.db subscriptions retire m h", "--yes"),
            (
                "--database-url x.db subscriptions --yes",
                "unexpected argument",
            ),
            (
                "--database-url x.db status --stalled-after 0s",
                "above zero",
            ),
            ("--database-url x.db status --stalled-after never", "never"),
            (
                "--database-url x.db effects list --state lost",
                "not an effect state",
            ),
            (
                &format!("--database-url x.db effects done {id} h e --result nope --yes"),
                "not valid JSON",
            ),
            (
                &format!("--database-url x.db effects done {id} h e"),
                "--yes",
            ),
            (
                &format!("--database-url x.db effects retry {id} h e"),
                "--yes",
            ),
            ("--database-url x.db effects retry 42 h e --yes", "UUID"),
            (
                "--database-url x.db sweep --stalled-after 1m",
                "unexpected argument",
            ),
        ] {
            let message = usage_error(line);
            assert!(message.starts_with("error: "), "{line}: {message}");
            assert!(message.contains(needle), "{line}: `{needle}` in {message}");
        }
        // No command: the help, as a usage error.
        for line in ["", "--database-url x.db dead-letters"] {
            assert!(usage_error(line).contains("Usage: tickbox"), "{line}");
        }
        let empty = Cli::parse_args(["tickbox", "subscriptions", "retire", "m", ""]);
        assert!(empty.is_err(), "an empty handler to retire");
        let empty = Cli::parse_args(["tickbox", "--data-dir", "d", "--module", "", "status"]);
        assert!(empty.is_err(), "an empty module name");
    }

    #[test]
    fn reads_the_url_from_the_environment_when_no_database_is_given() {
        let from_env = |cli: Cli| Cli {
            database_url: vec!["env.db".into()],
            url_from_env: true,
            ..cli
        };
        let cli = from_env(Cli::parse_args(["tickbox", "status"]).unwrap());
        let invocation = cli.invocation().unwrap();
        assert_eq!(invocation.targets[0].url, "env.db");
        // Beside a data directory, the environment's database is left out.
        let cli = from_env(Cli::parse_args(["tickbox", "--data-dir", "d", "status"]).unwrap());
        let invocation = cli.invocation().unwrap();
        assert!(invocation.targets.is_empty());
        assert_eq!(invocation.data_dirs, [PathBuf::from("d")]);
        let blank = Cli {
            database_url: vec!["  ".into()],
            ..Cli::parse_args(["tickbox", "status"]).unwrap()
        };
        assert!(matches!(blank.invocation(), Err(Failure::Usage(_))));
    }

    #[test]
    fn names_several_databases_at_once() {
        let invocation = run_of("--database-url a/orders.db --database-url b/warehouse.db status");
        let modules: Vec<_> = invocation.targets.iter().map(|t| &t.module).collect();
        assert_eq!(modules, ["orders", "warehouse"]);
        let invocation = run_of(
            "--database-url postgres://u:p@h/shop --schema s1 --schema s2 --module s2 status",
        );
        let schemas: Vec<_> = invocation.targets.iter().map(|t| &t.schema).collect();
        assert_eq!(schemas, [&Some("s1".to_string()), &Some("s2".to_string())]);
        assert_eq!(invocation.module.as_deref(), Some("s2"));
        // --module is not the subscribing module of `subscriptions retire`.
        let invocation =
            run_of("--data-dir d --module orders subscriptions retire warehouse w.reserve -y");
        assert_eq!(invocation.module.as_deref(), Some("orders"));
        assert!(matches!(
            invocation.command,
            Command::Subscriptions {
                command: Some(SubscriptionsCommand::Retire(RetireArgs { ref module, .. }))
            } if module == "warehouse"
        ));
        let invocation = run_of("--database-url x.db subscriptions retire warehouse w.reserve -y");
        assert_eq!(invocation.module, None);
        let invocation = run_of("dead-letters list --data-dir shop --data-dir other");
        assert_eq!(
            invocation.data_dirs,
            [PathBuf::from("shop"), PathBuf::from("other")]
        );
        assert!(invocation.targets.is_empty());
    }

    #[test]
    fn never_shows_a_password_in_a_label_or_a_usage_error() {
        let invocation =
            run_of("--database-url postgres://u@h:5432/nodb_x?password=S3cret! status");
        assert_eq!(invocation.targets[0].module, "nodb_x");
        // A raw `/` in the password: the URL cannot be read, nor its database.
        let invocation = run_of("--database-url postgres://u:S3/cret@h/shop status");
        assert_eq!(invocation.targets[0].module, "module");
        let invocation = run_of("--database-url mysql://u:S3cret@h:3306 --schema shop status");
        assert_eq!(invocation.targets[0].module, "shop");
        assert_eq!(
            invocation.targets[0].location(),
            "mysql://u:***@h:3306 database shop"
        );
        for line in [
            "--database-url x.db postgres://u:S3cret@h/db",
            "--database-url x.db status postgres://u:S3cret@h/db",
            "--database-url x.db dead-letters postgres://u:S3cret@h/db",
            "--database-url x.db dead-letters show postgres://u:S3cret@h/db h",
            "--database-url mongodb://u:S3cret@h/db status",
            "help postgres://u:S3cret@h/db",
        ] {
            let message = usage_error(line);
            assert!(!message.contains("S3cret"), "{line}: {message}");
            assert!(message.contains("***"), "{line}: {message}");
        }
        let message = usage_error("--database-url x.db status -postgres://u:S3cret@h/db");
        assert!(!message.contains("S3cret"), "{message}");
    }
}
