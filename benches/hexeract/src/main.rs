//! The tickbox benchmark's workload through hexeract 0.6, run by
//! `bench --hexeract` (tools/tickbox-bench) as a subprocess:
//!
//! C producer tasks each commit a business row (`orders`) and one outbox
//! envelope (`PgOutboxPublisher`/`SqliteOutboxPublisher::publish_in_tx`) per
//! transaction; the consumer inserts one business row (`effects`) per
//! message in another database (SQLite: another file; PostgreSQL: other
//! tables). hexeract has no inbox: the consumer is not idempotent.
//!
//! Two paths:
//!
//! - `--path outbox`: hexeract's SQL outbox worker (`OutboxWorker`) polls
//!   the outbox, runs the handler in process, and marks each envelope
//!   delivered in its own transaction.
//! - `--path amqp`: the outbox worker's handler publishes each envelope to a
//!   RabbitMQ topic exchange through `RabbitMqTransport::publish_raw`
//!   (persistent, mandatory, awaiting the publisher confirm: hexeract's
//!   default); `RabbitMqWorker`s (manual ack after the handler) consume the
//!   queue and run the handler.
//!
//! The run ends when N messages have been handled; it prints one JSON
//! object on its last line (`peer_per_s`, `produced_per_s`, latencies from
//! the producer's COMMIT to the end of the handler's insert).
//!
//! ```text
//! hexeract-peer --backend postgres --database-url postgres://postgres@127.0.0.1:5432/test \
//!     --path amqp --messages 5000 --concurrency 4 --json
//! ```

use hexeract::bus::{Exchange, ExchangeKind, Message};
use hexeract::bus_rabbitmq::{
    AckMode, RabbitMqConnection, RabbitMqTransport, RabbitMqWorkerBuilder,
};
use hexeract::core::HandlerContext;
use hexeract::outbox::{
    ErasedHandler, Event, OutboxPublisher, OutboxStore, OutboxWorker, OutboxWorkerConfig,
    TypedHandler,
};
use hexeract::outbox_sql::postgres::{PgOutboxPublisher, PgOutboxStore};
use hexeract::outbox_sql::sqlite::{SqliteOutboxPublisher, SqliteOutboxStore};
use lapin::options::{QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{PgPool, SqlitePool};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Any failure, shown as text.
type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The result of a step.
type Res<T> = Result<T, BoxError>;

/// The message of the workload: `{"n":…}`, as tickbox's bench sends it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Work {
    /// The business key.
    n: u64,
}

/// The event type in the outbox, and the message type and routing key on
/// the bus.
const TOPIC: &str = "bench.work";

impl Event for Work {
    const EVENT_TYPE: &'static str = TOPIC;
}

impl Message for Work {
    const MESSAGE_TYPE: &'static str = TOPIC;
}

/// The command line.
#[derive(Debug, Clone)]
struct Args {
    /// `sqlite` or `postgres`.
    backend: String,
    /// PostgreSQL: the server; SQLite: a directory for the files.
    database_url: Option<String>,
    /// The broker (`--path amqp`).
    amqp_url: String,
    /// `outbox` or `amqp`.
    path: String,
    /// Messages handled in the run.
    messages: u64,
    /// Producer tasks (and connections per side).
    concurrency: usize,
    /// Envelopes per poll of the outbox worker.
    batch: usize,
    /// The outbox worker's sleep after an empty poll.
    poll_ms: u64,
    /// The floor between two non-empty polls (hexeract's default 5 ms).
    cycle_ms: u64,
    /// Outbox workers polling the same outbox (PostgreSQL: FOR UPDATE SKIP
    /// LOCKED; SQLite: must be 1).
    workers: usize,
    /// RabbitMQ workers consuming the queue (each handles one message at a
    /// time, in manual ack mode).
    consumers: usize,
    /// Each consumer's prefetch.
    prefetch: u16,
    /// `quorum` or `classic`.
    queue_type: String,
    /// Producers publish at most this many messages/s in total.
    rate: Option<f64>,
    /// Print a JSON object on the last line.
    json: bool,
}

impl Args {
    /// Parses the command line.
    fn parse() -> Res<Self> {
        let mut args = Args {
            backend: "postgres".into(),
            database_url: None,
            amqp_url: "amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            path: "outbox".into(),
            messages: 5000,
            concurrency: 4,
            batch: 100,
            poll_ms: 1,
            cycle_ms: 0,
            workers: 1,
            consumers: 0,
            prefetch: 32,
            queue_type: "quorum".into(),
            rate: None,
            json: false,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            if flag == "--json" {
                args.json = true;
                continue;
            }
            let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
            match flag.as_str() {
                "--backend" => args.backend = value,
                "--database-url" => args.database_url = Some(value),
                "--amqp-url" => args.amqp_url = value,
                "--path" => args.path = value,
                "--messages" => args.messages = value.replace('_', "").parse()?,
                "--concurrency" => args.concurrency = value.parse()?,
                "--batch" => args.batch = value.parse()?,
                "--poll-ms" => args.poll_ms = value.parse()?,
                "--cycle-ms" => args.cycle_ms = value.parse()?,
                "--workers" => args.workers = value.parse()?,
                "--consumers" => args.consumers = value.parse()?,
                "--prefetch" => args.prefetch = value.parse()?,
                "--queue-type" => args.queue_type = value,
                "--rate" => args.rate = Some(value.parse()?),
                other => return Err(format!("unknown flag {other}").into()),
            }
        }
        if args.consumers == 0 {
            args.consumers = args.concurrency;
        }
        if !matches!(args.backend.as_str(), "sqlite" | "postgres")
            || !matches!(args.path.as_str(), "outbox" | "amqp")
            || !matches!(args.queue_type.as_str(), "quorum" | "classic")
        {
            return Err(
                "--backend sqlite|postgres, --path outbox|amqp, --queue-type quorum|classic".into(),
            );
        }
        if args.backend == "sqlite" && args.workers != 1 {
            return Err("hexeract's SQLite store has no SKIP LOCKED: one outbox worker".into());
        }
        Ok(args)
    }
}

/// One run's stamps: producer COMMIT and handler end of each message.
struct Clock {
    /// When the run started.
    t0: Instant,
    /// Nanoseconds since `t0` (+1) at each producer's COMMIT.
    commit: Vec<AtomicU64>,
    /// Nanoseconds since `t0` (+1) at the end of each handler.
    handled_at: Vec<AtomicU64>,
    /// Messages handled (counting duplicates once).
    handled: AtomicU64,
    /// Handler calls, duplicates included.
    calls: AtomicU64,
    /// Set when a producer failed.
    failed: AtomicBool,
}

impl Clock {
    /// A clock for `n` messages.
    fn new(n: u64) -> Arc<Self> {
        let zeros = || (0..n).map(|_| AtomicU64::new(0)).collect();
        Arc::new(Clock {
            t0: Instant::now(),
            commit: zeros(),
            handled_at: zeros(),
            handled: AtomicU64::new(0),
            calls: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        })
    }

    /// Now, as a stamp.
    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64 + 1
    }

    /// The handler of message `n` finished.
    fn handled(&self, n: u64) {
        self.calls.fetch_add(1, Relaxed);
        if let Some(slot) = self.handled_at.get(n as usize) {
            if slot.swap(self.now(), Relaxed) == 0 {
                self.handled.fetch_add(1, Relaxed);
            }
        }
    }

    /// p50, p99 and max of commit → handler end, in milliseconds.
    fn latency(&self) -> (f64, f64, f64) {
        let mut ms: Vec<f64> = self
            .commit
            .iter()
            .zip(&self.handled_at)
            .filter_map(|(c, h)| {
                let (c, h) = (c.load(Relaxed), h.load(Relaxed));
                (c != 0 && h != 0).then(|| h.saturating_sub(c) as f64 / 1e6)
            })
            .collect();
        if ms.is_empty() {
            return (f64::NAN, f64::NAN, f64::NAN);
        }
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() as f64 * q).ceil() as usize).clamp(1, ms.len()) - 1];
        (at(0.5), at(0.99), ms[ms.len() - 1])
    }
}

/// The databases of a run: the producer's (outbox and orders) and the
/// consumer's (effects).
#[derive(Clone)]
enum Db {
    /// Two SQLite files.
    Sqlite {
        /// The producer's.
        shop: SqlitePool,
        /// The consumer's.
        ledger: SqlitePool,
    },
    /// One PostgreSQL database, tables named after the run.
    Postgres {
        /// The producer's connections.
        shop: PgPool,
        /// The consumer's connections.
        ledger: PgPool,
    },
}

/// Names of the run's tables.
#[derive(Clone)]
struct Names {
    /// The outbox table.
    outbox: String,
    /// The producer's business table.
    orders: String,
    /// The consumer's business table.
    effects: String,
}

impl Db {
    /// Opens the pools and creates the tables.
    async fn open(args: &Args, dir: &tempfile::TempDir, names: &Names) -> Res<Self> {
        let c = args.concurrency as u32;
        let db = if args.backend == "sqlite" {
            let options = |file: &str| {
                SqliteConnectOptions::from_str(&dir.path().join(file).to_string_lossy()).map(|o| {
                    o.create_if_missing(true)
                        .journal_mode(SqliteJournalMode::Wal)
                        .synchronous(SqliteSynchronous::Normal)
                        .busy_timeout(Duration::from_secs(10))
                })
            };
            let shop = SqlitePoolOptions::new()
                .max_connections(c + args.workers as u32)
                .connect_with(options("shop.db")?)
                .await?;
            let ledger = SqlitePoolOptions::new()
                .max_connections(c.max(args.consumers as u32))
                .connect_with(options("ledger.db")?)
                .await?;
            hexeract::outbox_sql::sqlite::ensure_schema(&shop, &names.outbox).await?;
            sqlx::raw_sql(&format!(
                "CREATE TABLE {} (n INTEGER PRIMARY KEY NOT NULL, note TEXT NOT NULL)",
                names.orders
            ))
            .execute(&shop)
            .await?;
            sqlx::raw_sql(&format!(
                "CREATE TABLE {} (n INTEGER PRIMARY KEY NOT NULL, message_id BLOB NOT NULL)",
                names.effects
            ))
            .execute(&ledger)
            .await?;
            Db::Sqlite { shop, ledger }
        } else {
            let url = args
                .database_url
                .clone()
                .unwrap_or_else(|| "postgres://postgres@127.0.0.1:5432/test".into());
            let shop = PgPoolOptions::new()
                .max_connections(c + args.workers as u32)
                .connect(&url)
                .await?;
            let ledger = PgPoolOptions::new()
                .max_connections(c.max(args.consumers as u32))
                .connect(&url)
                .await?;
            hexeract::outbox_sql::postgres::ensure_schema(&shop, &names.outbox).await?;
            sqlx::raw_sql(&format!(
                "CREATE TABLE {} (n bigint PRIMARY KEY, note text NOT NULL); \
                 CREATE TABLE {} (n bigint PRIMARY KEY, message_id uuid NOT NULL)",
                names.orders, names.effects
            ))
            .execute(&shop)
            .await?;
            Db::Postgres { shop, ledger }
        };
        Ok(db)
    }

    /// The producer's transaction: the business row and the outbox
    /// envelope, committed together.
    async fn produce(&self, publisher: &Publisher, names: &Names, n: u64) -> Res<()> {
        let note = format!("order {n}");
        match (self, publisher) {
            (Db::Sqlite { shop, .. }, Publisher::Sqlite(p)) => {
                let insert = format!("INSERT INTO {} (n, note) VALUES (?, ?)", names.orders);
                let mut tx = shop.begin().await?;
                sqlx::query(&insert)
                    .bind(n as i64)
                    .bind(&note)
                    .execute(&mut *tx)
                    .await?;
                p.publish_in_tx(&mut tx, &Work { n }).await?;
                tx.commit().await?;
            }
            (Db::Postgres { shop, .. }, Publisher::Postgres(p)) => {
                let insert = format!("INSERT INTO {} (n, note) VALUES ($1, $2)", names.orders);
                let mut tx = shop.begin().await?;
                sqlx::query(&insert)
                    .bind(n as i64)
                    .bind(&note)
                    .execute(&mut *tx)
                    .await?;
                p.publish_in_tx(&mut tx, &Work { n }).await?;
                tx.commit().await?;
            }
            _ => unreachable!("publisher and database of the same backend"),
        }
        Ok(())
    }

    /// The consumer's business row (one statement: its own transaction).
    async fn effect(&self, names: &Names, n: u64, id: uuid::Uuid) -> Result<(), sqlx::Error> {
        let insert = |marks: &str| {
            format!(
                "INSERT INTO {} (n, message_id) VALUES ({marks})",
                names.effects
            )
        };
        match self {
            Db::Sqlite { ledger, .. } => {
                let insert = insert("?, ?");
                sqlx::query(&insert)
                    .bind(n as i64)
                    .bind(id.as_bytes().as_slice())
                    .execute(ledger)
                    .await?;
            }
            Db::Postgres { ledger, .. } => {
                let insert = insert("$1, $2");
                sqlx::query(&insert)
                    .bind(n as i64)
                    .bind(id)
                    .execute(ledger)
                    .await?;
            }
        }
        Ok(())
    }

    /// Rows in a table of the consumer's (or the producer's) database.
    async fn count(&self, sql: &str, consumer: bool) -> Res<i64> {
        Ok(match self {
            Db::Sqlite { shop, ledger } => {
                sqlx::query_scalar(sql)
                    .fetch_one(if consumer { ledger } else { shop })
                    .await?
            }
            Db::Postgres { shop, ledger } => {
                sqlx::query_scalar(sql)
                    .fetch_one(if consumer { ledger } else { shop })
                    .await?
            }
        })
    }

    /// Drops the run's tables (PostgreSQL; SQLite's files go with the
    /// temporary directory).
    async fn drop_tables(&self, names: &Names) {
        if let Db::Postgres { shop, .. } = self {
            let sql = format!(
                "DROP TABLE IF EXISTS {}, {}, {}",
                names.outbox, names.orders, names.effects
            );
            if let Err(e) = sqlx::raw_sql(&sql).execute(shop).await {
                eprintln!("warning: dropping the tables failed: {e}");
            }
        }
    }
}

/// The outbox publisher of the backend.
enum Publisher {
    /// SQLite's.
    Sqlite(SqliteOutboxPublisher),
    /// PostgreSQL's.
    Postgres(PgOutboxPublisher),
}

/// The consumer's business row: the in-process outbox handler of `--path
/// outbox`, and the bus handler of `--path amqp`.
struct Record {
    /// The consumer's database.
    db: Db,
    /// Table names.
    names: Names,
    /// The run's clock.
    clock: Arc<Clock>,
}

impl Record {
    /// Writes the effect row of message `id` and stamps it handled.
    async fn record(&self, n: u64, id: uuid::Uuid) -> Result<(), String> {
        self.db
            .effect(&self.names, n, id)
            .await
            .map_err(|e| e.to_string())?;
        self.clock.handled(n);
        Ok(())
    }
}

impl hexeract::outbox::Handler<Work> for Record {
    type Error = hexeract::outbox::OutboxError;

    async fn handle(&self, event: Work, ctx: &HandlerContext) -> Result<(), Self::Error> {
        self.record(event.n, *ctx.message_id.as_uuid())
            .await
            .map_err(hexeract::outbox::OutboxError::Internal)
    }
}

impl hexeract::bus::Handler<Work> for Record {
    type Error = hexeract::bus::BusError;

    async fn handle(&self, message: Work, ctx: &HandlerContext) -> Result<(), Self::Error> {
        self.record(message.n, *ctx.message_id.as_uuid())
            .await
            .map_err(hexeract::bus::BusError::Internal)
    }
}

/// The relay handler of `--path amqp`: publishes the envelope to RabbitMQ
/// under its own id, awaiting the publisher confirm.
struct Relay {
    /// The transport, on the run's exchange.
    transport: Arc<RabbitMqTransport>,
}

impl hexeract::outbox::Handler<Work> for Relay {
    type Error = hexeract::outbox::OutboxError;

    async fn handle(&self, event: Work, ctx: &HandlerContext) -> Result<(), Self::Error> {
        use hexeract::bus::RawBusPublish;
        let payload = serde_json::to_vec(&event)?;
        self.transport
            .publish_raw(TOPIC, *ctx.message_id.as_uuid(), TOPIC, &payload)
            .await
            .map_err(|e| hexeract::outbox::OutboxError::Internal(e.to_string()))
    }
}

/// A spawned outbox worker's future.
type WorkerRun = Pin<Box<dyn Future<Output = Result<(), hexeract::outbox::OutboxError>> + Send>>;

/// The outbox worker's configuration: `--batch`, `--poll-ms`, `--cycle-ms`.
fn worker_config(args: &Args) -> OutboxWorkerConfig {
    OutboxWorkerConfig {
        poll_interval: Duration::from_millis(args.poll_ms),
        batch_size: args.batch,
        min_cycle_delay: Duration::from_millis(args.cycle_ms),
        ..OutboxWorkerConfig::default()
    }
}

/// `--workers` outbox workers dispatching to `handler`, as futures to spawn.
fn outbox_workers<S: OutboxStore + Clone>(
    store: &S,
    args: &Args,
    handler: Arc<dyn ErasedHandler>,
    cancel: &CancellationToken,
) -> Vec<WorkerRun>
where
    for<'a> S::Tx<'a>: Send,
{
    (0..args.workers)
        .map(|_| {
            let handlers = HashMap::from([(TOPIC, handler.clone())]);
            OutboxWorker::new(store.clone(), handlers, worker_config(args)).run(cancel.clone())
        })
        .collect()
}

/// The broker side of `--path amqp`: the exchange, the queue, and what to
/// delete at the end.
struct Broker {
    /// The transport the relay publishes through.
    transport: Arc<RabbitMqTransport>,
    /// A connection for declaring and deleting.
    admin: RabbitMqConnection,
    /// The run's exchange.
    exchange: String,
    /// The handler's queue.
    queue: String,
}

impl Broker {
    /// Declares a durable topic exchange and a durable queue (quorum unless
    /// `--queue-type classic`) bound to the workload's topic.
    async fn declare(args: &Args, run: &str) -> Res<Self> {
        let exchange = format!("hexeract.{run}");
        let queue = format!("hexeract.{run}.ledger.record");
        let transport = RabbitMqTransport::with_exchange(
            &args.amqp_url,
            Exchange::new(exchange.clone(), ExchangeKind::Topic)?.durable(true),
        )
        .await?;
        let admin = RabbitMqConnection::connect(&args.amqp_url).await?;
        let channel = admin.create_channel().await?;
        let mut arguments = FieldTable::default();
        arguments.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(args.queue_type.as_str().into()),
        );
        channel
            .queue_declare(
                queue.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..QueueDeclareOptions::default()
                },
                arguments,
            )
            .await?;
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                TOPIC.into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await?;
        Ok(Broker {
            transport: Arc::new(transport),
            admin,
            exchange,
            queue,
        })
    }

    /// Deletes the queue, its retry queue and the exchange.
    async fn delete(&self) {
        let deleted = async {
            let channel = self.admin.create_channel().await?;
            for queue in [self.queue.clone(), format!("{}.retry", self.queue)] {
                channel
                    .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                    .await?;
            }
            channel
                .exchange_delete(self.exchange.as_str().into(), Default::default())
                .await?;
            Ok::<_, BoxError>(())
        }
        .await;
        if let Err(e) = deleted {
            eprintln!("warning: deleting the run's queues failed: {e}");
        }
    }
}

/// Runs the producers: `messages` transactions on `concurrency` tasks,
/// paced at `--rate` when given. Returns the seconds they took.
async fn produce(
    args: &Args,
    db: &Db,
    publisher: Arc<Publisher>,
    names: &Names,
    clock: &Arc<Clock>,
) -> Res<f64> {
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (next, clock, db, publisher, names) = (
            next.clone(),
            clock.clone(),
            db.clone(),
            publisher.clone(),
            names.clone(),
        );
        let (total, rate) = (args.messages, args.rate);
        tasks.push(tokio::spawn(async move {
            loop {
                let n = next.fetch_add(1, Relaxed);
                if n >= total {
                    return Ok::<_, BoxError>(());
                }
                if let Some(rate) = rate {
                    let at = clock.t0 + Duration::from_secs_f64(n as f64 / rate);
                    tokio::time::sleep_until(at.into()).await;
                }
                if let Err(e) = db.produce(&publisher, &names, n).await {
                    clock.failed.store(true, Relaxed);
                    return Err(e);
                }
                clock.commit[n as usize].store(clock.now(), Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(clock.t0.elapsed().as_secs_f64())
}

/// Waits until every message is handled; fails after a minute without
/// progress.
async fn wait_handled(args: &Args, clock: &Clock) -> Res<f64> {
    let (mut last, mut since) = (0, Instant::now());
    loop {
        let now = clock.handled.load(Relaxed);
        if now >= args.messages {
            return Ok(clock.t0.elapsed().as_secs_f64());
        }
        if clock.failed.load(Relaxed) {
            return Err("a producer failed".into());
        }
        if now != last {
            (last, since) = (now, Instant::now());
        } else if since.elapsed() > Duration::from_secs(60) {
            return Err(format!("stalled at {now} of {} handled", args.messages).into());
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

/// The run: tables, workers, producers, the wait, the check.
async fn run(args: &Args) -> Res<serde_json::Value> {
    let run = format!("bench_hx_{:08x}", fastrand::u32(..));
    let names = Names {
        outbox: format!("{run}_outbox"),
        orders: format!("{run}_orders"),
        effects: format!("{run}_effects"),
    };
    let dir = tempfile::Builder::new()
        .prefix("hexeract-bench-")
        .tempdir_in(match (&args.database_url, args.backend.as_str()) {
            (Some(parent), "sqlite") => std::path::PathBuf::from(parent),
            _ => std::env::temp_dir(),
        })?;
    let db = Db::open(args, &dir, &names).await?;
    let result = run_on(args, &db, &names, &run).await;
    db.drop_tables(&names).await;
    result
}

/// The run on open databases.
async fn run_on(args: &Args, db: &Db, names: &Names, run: &str) -> Res<serde_json::Value> {
    let clock = Clock::new(args.messages);
    let cancel = CancellationToken::new();
    let broker = if args.path == "amqp" {
        Some(Broker::declare(args, run).await?)
    } else {
        None
    };
    let handler: Arc<dyn ErasedHandler> = match &broker {
        None => Arc::new(TypedHandler::<Work, _>::new(Record {
            db: db.clone(),
            names: names.clone(),
            clock: clock.clone(),
        })),
        Some(broker) => Arc::new(TypedHandler::<Work, _>::new(Relay {
            transport: broker.transport.clone(),
        })),
    };
    let (publisher, workers) = match db {
        Db::Sqlite { shop, .. } => {
            let store = SqliteOutboxStore::new(shop.clone(), names.outbox.clone())?;
            (
                Publisher::Sqlite(SqliteOutboxPublisher::new(
                    shop.clone(),
                    names.outbox.clone(),
                )?),
                outbox_workers(&store, args, handler, &cancel),
            )
        }
        Db::Postgres { shop, .. } => {
            let store = PgOutboxStore::new(shop.clone(), names.outbox.clone())?;
            (
                Publisher::Postgres(PgOutboxPublisher::new(shop.clone(), names.outbox.clone())?),
                outbox_workers(&store, args, handler, &cancel),
            )
        }
    };
    let mut tasks: Vec<tokio::task::JoinHandle<Res<()>>> = Vec::new();
    for worker in workers {
        tasks.push(tokio::spawn(async move { Ok(worker.await?) }));
    }
    if let Some(broker) = &broker {
        for _ in 0..args.consumers {
            let connection = RabbitMqConnection::connect(&args.amqp_url).await?;
            let worker = RabbitMqWorkerBuilder::new(connection)
                .queue(broker.queue.clone())
                .ack_mode(AckMode::Manual)
                .prefetch(args.prefetch)
                .register_handler::<Work, _>(Record {
                    db: db.clone(),
                    names: names.clone(),
                    clock: clock.clone(),
                })
                .build()?;
            let cancel = cancel.clone();
            tasks.push(tokio::spawn(async move { Ok(worker.run(cancel).await?) }));
        }
    }

    let produced = produce(args, db, Arc::new(publisher), names, &clock).await;
    let seconds = match &produced {
        Ok(_) => wait_handled(args, &clock).await,
        Err(e) => Err(e.to_string().into()),
    };
    cancel.cancel();
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: a worker ended with an error: {e}"),
            Err(e) => eprintln!("warning: a worker panicked: {e}"),
        }
    }
    if let Some(broker) = &broker {
        broker.delete().await;
    }
    let seconds = seconds?;
    let produced_s = produced?;
    let effects = db
        .count(&format!("SELECT count(*) FROM {}", names.effects), true)
        .await?;
    let pending = db
        .count(
            &format!(
                "SELECT count(*) FROM {} WHERE delivered_at IS NULL",
                names.outbox
            ),
            false,
        )
        .await?;
    let (p50, p99, max) = clock.latency();
    let per_s = args.messages as f64 / seconds;
    let produced_per_s = args.messages as f64 / produced_s;
    let calls = clock.calls.load(Relaxed);
    println!(
        "hexeract 0.6 · {} · {} path · concurrency {} · {} messages: {seconds:.2} s, {per_s:.0} msg/s \
         (produced {produced_per_s:.0}/s), commit->handler end p50 {p50:.2} / p99 {p99:.2} / max {max:.1} ms; \
         {effects} effects, {pending} outbox rows pending after the run, {calls} handler calls",
        args.backend, args.path, args.concurrency, args.messages
    );
    if effects as u64 != args.messages {
        return Err(format!(
            "verification failed: {effects} effects for {} messages",
            args.messages
        )
        .into());
    }
    Ok(serde_json::json!({
        "peer": "hexeract 0.6",
        "backend": args.backend,
        "path": args.path,
        "messages": args.messages,
        "concurrency": args.concurrency,
        "batch": args.batch,
        "poll_ms": args.poll_ms,
        "cycle_ms": args.cycle_ms,
        "workers": args.workers,
        "consumers": if args.path == "amqp" { Some(args.consumers) } else { None },
        "prefetch": if args.path == "amqp" { Some(args.prefetch) } else { None },
        "queue_type": if args.path == "amqp" { Some(args.queue_type.clone()) } else { None },
        "seconds": seconds,
        "peer_per_s": per_s,
        "produced_per_s": produced_per_s,
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": max,
        "handler_calls": calls,
        "outbox_pending_after": pending,
    }))
}

fn main() -> std::process::ExitCode {
    let args = match Args::parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("usage: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    match runtime.block_on(run(&args)) {
        Ok(json) => {
            if args.json {
                println!("{json}");
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
