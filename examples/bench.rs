//! The tickbox benchmark: end-to-end messages per second through the bus,
//! measured in the same run against the database's own limit (the same
//! producer and consumer transactions run directly with diesel-async, no bus)
//! and, with `--peer`, against the npm package `pg-transactional-outbox` on
//! the same PostgreSQL. Also measures commit-to-handled latency, peak memory,
//! a 1,000,000-message backlog drain and handling with a 10,000,000-row inbox.
//!
//! ```text
//! cargo run --release --example bench -- --backend sqlite --messages 20000 --concurrency 4
//! cargo run --release --features postgres --example bench -- --backend postgres \
//!     --database-url postgres://postgres@127.0.0.1:5432/test --messages 20000 --concurrency 4 --json
//! ```
//!
//! Other scenarios (`--scenario latency|backlog|big-inbox`), the peer
//! comparison (`--peer`) and every flag are described by `--help` and in
//! BENCHMARKS.md, which also records the results.
//!
//! Workload: C producer tasks each commit a business row and publish one
//! message per transaction; one handler per message inserts a business row in
//! its inbox-guarded transaction; the run ends when N messages are handled.

use diesel::deserialize::QueryableByName;
use diesel::QueryResult;
use diesel_async::pooled_connection::deadpool::Pool;
use diesel_async::SimpleAsyncConnection;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::future::Future;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tickbox::{
    Backend, Bus, Delivery, Handler, HandlerError, Message, ModuleBuilder, ModuleHandle, Tx,
};
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
/// The handler's name: half of every inbox key (also used for prefilled rows).
const HANDLER: &str = "ledger.record";
/// Prefill statements insert this many rows each (one transaction each).
const PREFILL_CHUNK: u64 = 1_000_000;

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

const USAGE: &str = "\
usage: bench --backend sqlite|postgres [options]

  --backend B          sqlite (default feature) or postgres (needs --features postgres)
  --database-url URL   postgres: server URL (default $TICKBOX_PG_URL or
                       postgres://postgres@127.0.0.1:5432/test);
                       sqlite: a directory for the temporary databases
  --messages N         messages per measured run (default 20000)
  --concurrency C      producer tasks, and connections per side (default 4)
  --rate R             producers publish at most R messages/s in total (open loop)
  --repeat K           alternate baseline and tickbox K times, fresh databases
                       each time; medians are reported (default 1)
  --scenario S         throughput (default): baseline vs tickbox
                       latency: unthrottled run, then a run at half its rate
                       backlog: N messages pending in the outbox before the bus
                                starts (use --messages 1000000); drain rate and memory
                       big-inbox: tickbox with an empty inbox vs one holding
                                  --inbox-rows rows (default 10000000)
  --inbox-rows R       rows prefilled into the inbox for big-inbox
  --peer               postgres: also run the same workload through the npm
                       package pg-transactional-outbox (benches/peer/bench.js)
  --peer-mode M        inbox (default: outbox -> inbox table -> handler, the
                       package's full pattern) or direct (handler runs in the
                       outbox listener's transaction, no inbox table)
  --peer-batch B       the peer's batch size (default 2 x concurrency)
  --peer-poll-ms P     the peer's polling interval (default 1)
  --no-trace           do not install the tracing layer that timestamps each
                       handler's COMMIT; latency is then measured to handler end
  --only WHAT          throughput: run only `baseline` or only `tickbox` (for
                       profiling; no ratio then)
  --sweep-ms MS        the bus's scan interval (default: the library's, 2 s)
  --batch B            tickbox's handler takes up to B waiting messages per
                       transaction (HandlerOptions::batch; default 1: none)
  --delete-delivered   the producer module deletes outbox rows as they are
                       delivered (an outbox retention of zero) instead of
                       marking them
  --timeline           print tickbox's progress every 250 ms (diagnosis)
  --json               print a final line with one JSON object
";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    Throughput,
    Latency,
    Backlog,
    BigInbox,
}

#[derive(Debug, Clone)]
struct Args {
    backend: String,
    database_url: Option<String>,
    messages: u64,
    concurrency: usize,
    rate: Option<f64>,
    repeat: usize,
    scenario: Scenario,
    inbox_rows: u64,
    peer: bool,
    peer_mode: String,
    peer_batch: Option<usize>,
    peer_poll_ms: u64,
    trace: bool,
    timeline: bool,
    only: Option<String>,
    sweep_ms: Option<u64>,
    delete_delivered: bool,
    batch: usize,
    json: bool,
}

fn parse_args() -> Res<Args> {
    let mut args = Args {
        backend: String::new(),
        database_url: None,
        messages: 20_000,
        concurrency: 4,
        rate: None,
        repeat: 1,
        scenario: Scenario::Throughput,
        inbox_rows: 10_000_000,
        peer: false,
        peer_mode: "inbox".into(),
        peer_batch: None,
        peer_poll_ms: 1,
        trace: true,
        timeline: false,
        only: None,
        sweep_ms: None,
        delete_delivered: false,
        batch: 1,
        json: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| format!("{name} needs a value\n\n{USAGE}"))
        };
        match flag.as_str() {
            "--backend" => args.backend = value("--backend")?,
            "--database-url" => args.database_url = Some(value("--database-url")?),
            "--messages" => args.messages = value("--messages")?.replace('_', "").parse()?,
            "--concurrency" => args.concurrency = value("--concurrency")?.parse()?,
            "--rate" => args.rate = Some(value("--rate")?.parse()?),
            "--repeat" => args.repeat = value("--repeat")?.parse()?,
            "--inbox-rows" => args.inbox_rows = value("--inbox-rows")?.replace('_', "").parse()?,
            "--scenario" => {
                args.scenario = match value("--scenario")?.as_str() {
                    "throughput" => Scenario::Throughput,
                    "latency" => Scenario::Latency,
                    "backlog" => Scenario::Backlog,
                    "big-inbox" => Scenario::BigInbox,
                    other => return Err(format!("unknown scenario `{other}`\n\n{USAGE}").into()),
                }
            }
            "--peer" => args.peer = true,
            "--peer-mode" => args.peer_mode = value("--peer-mode")?,
            "--peer-batch" => args.peer_batch = Some(value("--peer-batch")?.parse()?),
            "--peer-poll-ms" => args.peer_poll_ms = value("--peer-poll-ms")?.parse()?,
            "--no-trace" => args.trace = false,
            "--timeline" => args.timeline = true,
            "--only" => args.only = Some(value("--only")?),
            "--sweep-ms" => args.sweep_ms = Some(value("--sweep-ms")?.parse()?),
            "--delete-delivered" => args.delete_delivered = true,
            "--batch" => args.batch = value("--batch")?.parse()?,
            "--json" => args.json = true,
            "-h" | "--help" => {
                print!("{USAGE}");
                std::process::exit(0);
            }
            // Redacted: it may be a database URL missing its flag.
            other => {
                let other = tickbox::redact_url(other);
                return Err(format!("unknown argument `{other}`\n\n{USAGE}").into());
            }
        }
    }
    if args.backend.is_empty() {
        return Err(format!("--backend is required\n\n{USAGE}").into());
    }
    if args.messages == 0 || args.concurrency == 0 || args.repeat == 0 || args.batch == 0 {
        return Err("--messages, --concurrency, --repeat and --batch must be at least 1".into());
    }
    if matches!(args.rate, Some(r) if r.is_nan() || r <= 0.0) {
        return Err("--rate must be above zero".into());
    }
    if args.peer && args.backend != "postgres" {
        return Err("--peer compares on PostgreSQL: use it with --backend postgres".into());
    }
    if !["inbox", "direct"].contains(&args.peer_mode.as_str()) {
        return Err("--peer-mode is inbox or direct".into());
    }
    Ok(args)
}

// ---------------------------------------------------------------------------
// The message, the handler, and the clock that timestamps every message
// ---------------------------------------------------------------------------

/// The one message type of the workload. `n` numbers the message in the run.
#[derive(Debug, Serialize, Deserialize)]
struct Work {
    n: u64,
}

impl Message for Work {
    const TOPIC: &'static str = "bench.work";
}

/// Per-message timestamps of one measured run, in nanoseconds since `t0`
/// plus one (0 = not recorded).
struct Clock {
    t0: Instant,
    /// `n` of the first message of this run (business keys are unique
    /// across the runs of one process).
    offset: u64,
    /// False for the backlog scenario: no per-message arrays.
    track: bool,
    /// After the producer's COMMIT returned.
    commit: Vec<AtomicU64>,
    /// At the end of the handler, before its COMMIT.
    handler_end: Vec<AtomicU64>,
    /// After the handler's COMMIT (tracing layer, or the baseline itself).
    committed: Vec<AtomicU64>,
    /// Message id -> index, for the tracing layer (which only sees ids).
    ids: Mutex<HashMap<Uuid, u32>>,
    /// Handler transactions committed (counted by the baseline; tickbox's
    /// own counter is read from its metrics).
    handled: AtomicU64,
    failed: AtomicBool,
}

impl Clock {
    fn new(offset: u64, messages: u64, track: bool) -> Arc<Self> {
        let len = if track { messages as usize } else { 0 };
        let zeros = || (0..len).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Arc::new(Clock {
            t0: Instant::now(),
            offset,
            track,
            commit: zeros(),
            handler_end: zeros(),
            committed: zeros(),
            ids: Mutex::new(HashMap::with_capacity(len.min(1 << 20))),
            handled: AtomicU64::new(0),
            failed: AtomicBool::new(false),
        })
    }

    fn now(&self) -> u64 {
        self.t0.elapsed().as_nanos() as u64 + 1
    }

    fn index(&self, n: u64) -> Option<usize> {
        let i = n.checked_sub(self.offset)? as usize;
        (self.track && i < self.commit.len()).then_some(i)
    }

    fn producer_committed(&self, n: u64) {
        if let Some(i) = self.index(n) {
            self.commit[i].store(self.now(), Relaxed);
        }
    }

    fn handler_ended(&self, n: u64, id: Uuid) {
        if let Some(i) = self.index(n) {
            self.handler_end[i].store(self.now(), Relaxed);
            lock(&self.ids).insert(id, i as u32);
        }
    }

    fn handler_committed_index(&self, n: u64) {
        if let Some(i) = self.index(n) {
            self.committed[i].store(self.now(), Relaxed);
        }
    }

    /// Called by the tracing layer after a tickbox handler's COMMIT.
    fn handler_committed_id(&self, id: &Uuid) {
        if !self.track {
            return;
        }
        let now = self.now();
        if let Some(i) = lock(&self.ids).remove(id) {
            self.committed[i as usize].store(now, Relaxed);
        }
    }

    /// Latencies from producer commit to `to`, in milliseconds.
    fn latencies(&self, to: &[AtomicU64]) -> Option<Latency> {
        let mut ms: Vec<f64> = self
            .commit
            .iter()
            .zip(to)
            .filter_map(|(c, t)| {
                let (c, t) = (c.load(Relaxed), t.load(Relaxed));
                (c != 0 && t != 0).then(|| t.saturating_sub(c) as f64 / 1e6)
            })
            .collect();
        if ms.is_empty() {
            return None;
        }
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        Some(Latency {
            samples: ms.len(),
            p50: at(0.5),
            p99: at(0.99),
            max: ms[ms.len() - 1],
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Latency {
    samples: usize,
    p50: f64,
    p99: f64,
    max: f64,
}

/// The consumer's handler: one business row per message, in the inbox-guarded
/// transaction.
struct Record {
    clock: Arc<RwLock<Arc<Clock>>>,
}

impl<B: BenchBackend> Handler<B> for Record {
    type Message = Work;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        work: Work,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let id = delivery.envelope.id;
        B::insert_effect(tx.conn(), work.n as i64, id).await?;
        let clock = self.clock.read().unwrap_or_else(|p| p.into_inner()).clone();
        clock.handler_ended(work.n, id);
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// A tracing layer that timestamps each handler's COMMIT
// ---------------------------------------------------------------------------

/// The clock of the run under way, for the tracing layer.
static CURRENT: RwLock<Option<Arc<Clock>>> = RwLock::new(None);

fn set_current(clock: Option<Arc<Clock>>) {
    *CURRENT.write().unwrap_or_else(|p| p.into_inner()) = clock;
}

mod commit_layer {
    //! tickbox's inbox guard opens a `deliver` span carrying `message_id` and,
    //! after COMMIT, logs "delivery finished" at debug level inside it. This
    //! layer turns that event into a timestamp: the only way to observe the
    //! handler's commit from outside the library.
    use super::CURRENT;
    use std::fmt::Debug;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id};
    use tracing::{Event, Subscriber};
    use tracing_subscriber::layer::Context;
    use tracing_subscriber::registry::LookupSpan;
    use tracing_subscriber::Layer;
    use uuid::Uuid;

    pub(super) struct CommitLayer;
    struct MessageId(Uuid);

    struct IdVisitor(Option<Uuid>);
    impl Visit for IdVisitor {
        fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
            if field.name() == "message_id" {
                self.0 = Uuid::parse_str(&format!("{value:?}")).ok();
            }
        }
    }

    struct FinishedVisitor(bool);
    impl Visit for FinishedVisitor {
        fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
            if field.name() == "message" {
                self.0 = format!("{value:?}") == "delivery finished";
            }
        }
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for CommitLayer {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            if attrs.metadata().name() != "deliver" {
                return;
            }
            let mut visitor = IdVisitor(None);
            attrs.record(&mut visitor);
            if let (Some(message_id), Some(span)) = (visitor.0, ctx.span(id)) {
                span.extensions_mut().insert(MessageId(message_id));
            }
        }

        fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
            let mut visitor = FinishedVisitor(false);
            event.record(&mut visitor);
            if !visitor.0 {
                return;
            }
            let Some(span) = ctx.event_span(event) else {
                return;
            };
            let extensions = span.extensions();
            let Some(MessageId(id)) = extensions.get::<MessageId>() else {
                return;
            };
            if let Some(clock) = CURRENT.read().unwrap_or_else(|p| p.into_inner()).as_ref() {
                clock.handler_committed_id(id);
            }
        }
    }
}

fn install_trace_layer() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::Layer;
    let filter = tracing_subscriber::filter::Targets::new()
        .with_target("tickbox::inbox", tracing::Level::DEBUG)
        .with_target("tickbox", tracing::Level::WARN);
    let warnings = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
    let subscriber = tracing_subscriber::registry()
        .with(commit_layer::CommitLayer.with_filter(filter))
        .with(warnings);
    let _ = tracing::subscriber::set_global_default(subscriber);
}

// ---------------------------------------------------------------------------
// Where the databases of one process live
// ---------------------------------------------------------------------------

struct Place {
    /// SQLite: one file per module here; removed at the end.
    dir: tempfile::TempDir,
    /// PostgreSQL: the server, and the schemas created (dropped at the end).
    pg_url: Option<String>,
    prefix: String,
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    schemas: Mutex<Vec<String>>,
    /// Number of modules created, to make each name unique.
    created: AtomicU64,
}

impl Place {
    fn new(args: &Args) -> Res<Self> {
        let dir = match (&args.database_url, args.backend.as_str()) {
            (Some(parent), "sqlite") => tempfile::Builder::new()
                .prefix("tickbox-bench-")
                .tempdir_in(parent)?,
            _ => tempfile::Builder::new()
                .prefix("tickbox-bench-")
                .tempdir()?,
        };
        let pg_url = (args.backend == "postgres").then(|| {
            args.database_url
                .clone()
                .or_else(|| std::env::var("TICKBOX_PG_URL").ok())
                .unwrap_or_else(|| DEFAULT_PG_URL.to_string())
        });
        Ok(Place {
            dir,
            pg_url,
            prefix: format!("bench_{:08x}", fastrand::u32(..)),
            schemas: Mutex::new(Vec::new()),
            created: AtomicU64::new(0),
        })
    }

    /// A fresh, unique database name for a module: `{prefix}_{k}_{name}`.
    fn fresh(&self, name: &str) -> String {
        let k = self.created.fetch_add(1, Relaxed);
        format!("{}_{k}_{name}", self.prefix)
    }
}

// ---------------------------------------------------------------------------
// Per-backend SQL: diesel queries are compiled against each connection type
// ---------------------------------------------------------------------------

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// What the benchmark needs from a backend beyond tickbox's own API.
trait BenchBackend: Backend {
    /// A module builder on a fresh database (`db` from [`Place::fresh`]).
    fn module(place: &Place, db: &str) -> ModuleBuilder<Self>;
    /// A plain diesel-async pool on that database, configured as tickbox
    /// configures its own (SQLite pragmas, PostgreSQL search_path, fast
    /// recycling).
    fn raw_pool(place: &Place, db: &str, size: usize) -> Res<Self::RawPool>;
    type RawPool: Clone + Send + Sync + 'static;
    type RawConn: std::ops::DerefMut<Target = Self::Connection> + Send + 'static;
    /// A connection from a [`BenchBackend::raw_pool`].
    fn raw_get(pool: &Self::RawPool) -> impl Future<Output = Res<Self::RawConn>> + Send;
    /// `CREATE TABLE` of the producer's and the consumer's business tables.
    const CREATE_ORDERS: &'static str;
    const CREATE_EFFECTS: &'static str;
    /// Makes freshly bulk-loaded tables look like they would in production
    /// (statistics, checkpoint).
    const AFTER_PREFILL: &'static str;

    fn batch(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    fn count(
        conn: &mut Self::Connection,
        sql: &str,
    ) -> impl Future<Output = QueryResult<i64>> + Send;
    /// The producer's business row.
    fn insert_order(
        conn: &mut Self::Connection,
        n: i64,
        note: &str,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// The handler's business row.
    fn insert_effect(
        conn: &mut Self::Connection,
        n: i64,
        id: Uuid,
    ) -> impl Future<Output = QueryResult<()>> + Send;

    // The baseline: tickbox's transactions without tickbox.
    fn raw_begin(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send;
    // COMMIT and ROLLBACK read the same on both dialects.
    fn raw_commit(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send {
        conn.batch_execute("COMMIT")
    }
    fn raw_rollback(conn: &mut Self::Connection) -> impl Future<Output = QueryResult<()>> + Send {
        conn.batch_execute("ROLLBACK")
    }
    /// The row tickbox writes on publish, in tickbox's outbox table.
    fn raw_insert_outbox(
        conn: &mut Self::Connection,
        id: Uuid,
        topic: &str,
        payload: &str,
        created_at_us: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send;
    /// tickbox's inbox tick: insert unless present; true when inserted.
    fn raw_insert_inbox(
        conn: &mut Self::Connection,
        id: Uuid,
        handler: &str,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<bool>> + Send;

    /// Set-based SQL inserting outbox rows `lo..hi` as tickbox writes them
    /// (pending, payload `{"n":i}`), ids time-ordered UUIDv7-shaped.
    fn prefill_outbox_sql(lo: u64, hi: u64, base_ms: i64) -> String;
    /// Set-based SQL inserting inbox rows `lo..hi` for [`HANDLER`].
    fn prefill_inbox_sql(lo: u64, hi: u64, base_ms: i64) -> String;
}

fn deadpool_config<C: diesel_async::AsyncConnection + 'static>(
    setup: diesel_async::pooled_connection::SetupCallback<C>,
) -> diesel_async::pooled_connection::ManagerConfig<C> {
    let mut config = diesel_async::pooled_connection::ManagerConfig::default();
    config.recycling_method = diesel_async::pooled_connection::RecyclingMethod::Fast;
    config.custom_setup = setup;
    config
}

#[cfg(feature = "sqlite")]
mod sqlite_impl {
    use super::*;
    use diesel::sql_types::{BigInt, Binary, Nullable, Text};
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::{AsyncConnection, RunQueryDsl};
    use tickbox::{Sqlite, SqliteConnection};

    /// The pragmas tickbox sets on each connection (src/sqlite.rs).
    const PRAGMAS: &str =
        "PRAGMA busy_timeout = 10000; PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;";

    fn path(place: &Place, db: &str) -> String {
        place
            .dir
            .path()
            .join(format!("{db}.db"))
            .to_string_lossy()
            .into_owned()
    }

    impl BenchBackend for Sqlite {
        fn module(place: &Place, db: &str) -> ModuleBuilder<Self> {
            tickbox::Module::builder(db, path(place, db))
        }

        type RawPool = Pool<SqliteConnection>;
        type RawConn = diesel_async::pooled_connection::deadpool::Object<SqliteConnection>;

        async fn raw_get(pool: &Self::RawPool) -> Res<Self::RawConn> {
            Ok(pool.get().await?)
        }

        fn raw_pool(place: &Place, db: &str, size: usize) -> Res<Pool<SqliteConnection>> {
            let setup: diesel_async::pooled_connection::SetupCallback<SqliteConnection> =
                Box::new(|url| {
                    Box::pin(async move {
                        let mut conn = SqliteConnection::establish(url).await?;
                        conn.batch_execute(PRAGMAS)
                            .await
                            .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                        Ok(conn)
                    })
                });
            let manager = AsyncDieselConnectionManager::<SqliteConnection>::new_with_config(
                path(place, db),
                deadpool_config(setup),
            );
            Ok(Pool::builder(manager).max_size(size).build()?)
        }

        const CREATE_ORDERS: &'static str =
            "CREATE TABLE bench_orders (n INTEGER PRIMARY KEY NOT NULL, note TEXT NOT NULL)";
        const CREATE_EFFECTS: &'static str =
            "CREATE TABLE bench_effects (n INTEGER PRIMARY KEY NOT NULL, message_id BLOB NOT NULL)";
        const AFTER_PREFILL: &'static str = "ANALYZE; PRAGMA wal_checkpoint(TRUNCATE);";

        async fn batch(conn: &mut SqliteConnection, sql: &str) -> QueryResult<()> {
            conn.batch_execute(sql).await
        }

        async fn count(conn: &mut SqliteConnection, sql: &str) -> QueryResult<i64> {
            Ok(diesel::sql_query(sql).get_result::<Count>(conn).await?.n)
        }

        async fn insert_order(conn: &mut SqliteConnection, n: i64, note: &str) -> QueryResult<()> {
            diesel::sql_query("INSERT INTO bench_orders (n, note) VALUES (?, ?)")
                .bind::<BigInt, _>(n)
                .bind::<Text, _>(note)
                .execute(conn)
                .await
                .map(drop)
        }

        async fn insert_effect(conn: &mut SqliteConnection, n: i64, id: Uuid) -> QueryResult<()> {
            diesel::sql_query("INSERT INTO bench_effects (n, message_id) VALUES (?, ?)")
                .bind::<BigInt, _>(n)
                .bind::<Binary, _>(id.as_bytes().as_slice())
                .execute(conn)
                .await
                .map(drop)
        }

        // tickbox: AnsiTransactionManager::begin_transaction_sql(c, "BEGIN IMMEDIATE")
        async fn raw_begin(conn: &mut SqliteConnection) -> QueryResult<()> {
            conn.batch_execute("BEGIN IMMEDIATE").await
        }

        async fn raw_insert_outbox(
            conn: &mut SqliteConnection,
            id: Uuid,
            topic: &str,
            payload: &str,
            created_at_us: i64,
        ) -> QueryResult<()> {
            diesel::sql_query(
                "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
                 VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind::<Binary, _>(id.as_bytes().as_slice())
            .bind::<Text, _>(topic)
            .bind::<Text, _>(payload)
            .bind::<Binary, _>(id.as_bytes().as_slice())
            .bind::<Nullable<Binary>, _>(None::<&[u8]>)
            .bind::<BigInt, _>(created_at_us)
            .execute(conn)
            .await
            .map(drop)
        }

        async fn raw_insert_inbox(
            conn: &mut SqliteConnection,
            id: Uuid,
            handler: &str,
            now_us: i64,
        ) -> QueryResult<bool> {
            let inserted = diesel::sql_query(
                "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) VALUES (?, ?, ?) \
                 ON CONFLICT DO NOTHING",
            )
            .bind::<Binary, _>(id.as_bytes().as_slice())
            .bind::<Text, _>(handler)
            .bind::<BigInt, _>(now_us)
            .execute(conn)
            .await?;
            Ok(inserted == 1)
        }

        fn prefill_outbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
            let topic = Work::TOPIC;
            format!(
                "WITH RECURSIVE seq(i) AS (SELECT {lo} UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < {hi}) \
                 INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
                 SELECT u, '{topic}', '{{\"n\":' || i || '}}', u, NULL, ({base_ms} + i / 1000) * 1000 \
                 FROM (SELECT i, unhex(printf('%012x7000', {base_ms} + i / 1000) || printf('8%015x', i)) AS u FROM seq)"
            )
        }

        fn prefill_inbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
            format!(
                "WITH RECURSIVE seq(i) AS (SELECT {lo} UNION ALL SELECT i + 1 FROM seq WHERE i + 1 < {hi}) \
                 INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) \
                 SELECT unhex(printf('%012x7%03x', {base_ms} + i / 10, abs(random()) % 4096) \
                        || printf('%x%015x', 8 + abs(random()) % 4, i)), \
                        '{HANDLER}', ({base_ms} + i / 10) * 1000 FROM seq"
            )
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres_impl {
    use super::*;
    use diesel::sql_types::{BigInt, Nullable, Text};
    use diesel_async::pooled_connection::AsyncDieselConnectionManager;
    use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
    use tickbox::Postgres;

    impl BenchBackend for Postgres {
        fn module(place: &Place, db: &str) -> ModuleBuilder<Self> {
            lock(&place.schemas).push(db.to_string());
            let url = place.pg_url.clone().expect("a PostgreSQL place");
            tickbox::Module::builder(db, url).schema(db)
        }

        type RawPool = Pool<AsyncPgConnection>;
        type RawConn = diesel_async::pooled_connection::deadpool::Object<AsyncPgConnection>;

        async fn raw_get(pool: &Self::RawPool) -> Res<Self::RawConn> {
            Ok(pool.get().await?)
        }

        fn raw_pool(place: &Place, db: &str, size: usize) -> Res<Pool<AsyncPgConnection>> {
            let schema = db.to_string();
            let setup: diesel_async::pooled_connection::SetupCallback<AsyncPgConnection> =
                Box::new(move |url| {
                    let schema = schema.clone();
                    Box::pin(async move {
                        let mut conn = AsyncPgConnection::establish(url).await?;
                        conn.batch_execute(&format!("SET search_path TO {schema}"))
                            .await
                            .map_err(diesel::ConnectionError::CouldntSetupConfiguration)?;
                        Ok(conn)
                    })
                });
            let url = place.pg_url.clone().expect("a PostgreSQL place");
            let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new_with_config(
                url,
                deadpool_config(setup),
            );
            Ok(Pool::builder(manager).max_size(size).build()?)
        }

        const CREATE_ORDERS: &'static str =
            "CREATE TABLE bench_orders (n bigint PRIMARY KEY, note text NOT NULL)";
        const CREATE_EFFECTS: &'static str =
            "CREATE TABLE bench_effects (n bigint PRIMARY KEY, message_id uuid NOT NULL)";
        const AFTER_PREFILL: &'static str =
            "VACUUM (ANALYZE) tickbox_outbox; VACUUM (ANALYZE) tickbox_inbox; CHECKPOINT;";

        async fn batch(conn: &mut AsyncPgConnection, sql: &str) -> QueryResult<()> {
            conn.batch_execute(sql).await
        }

        async fn count(conn: &mut AsyncPgConnection, sql: &str) -> QueryResult<i64> {
            Ok(diesel::sql_query(sql).get_result::<Count>(conn).await?.n)
        }

        async fn insert_order(conn: &mut AsyncPgConnection, n: i64, note: &str) -> QueryResult<()> {
            diesel::sql_query("INSERT INTO bench_orders (n, note) VALUES ($1, $2)")
                .bind::<BigInt, _>(n)
                .bind::<Text, _>(note)
                .execute(conn)
                .await
                .map(drop)
        }

        async fn insert_effect(conn: &mut AsyncPgConnection, n: i64, id: Uuid) -> QueryResult<()> {
            diesel::sql_query("INSERT INTO bench_effects (n, message_id) VALUES ($1, $2)")
                .bind::<BigInt, _>(n)
                .bind::<diesel::sql_types::Uuid, _>(id)
                .execute(conn)
                .await
                .map(drop)
        }

        // tickbox: AnsiTransactionManager::begin_transaction, i.e. BEGIN
        // (READ COMMITTED, the server default).
        async fn raw_begin(conn: &mut AsyncPgConnection) -> QueryResult<()> {
            conn.batch_execute("BEGIN").await
        }

        async fn raw_insert_outbox(
            conn: &mut AsyncPgConnection,
            id: Uuid,
            topic: &str,
            payload: &str,
            created_at_us: i64,
        ) -> QueryResult<()> {
            diesel::sql_query(
                "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind::<diesel::sql_types::Uuid, _>(id)
            .bind::<Text, _>(topic)
            .bind::<Text, _>(payload)
            .bind::<diesel::sql_types::Uuid, _>(id)
            .bind::<Nullable<diesel::sql_types::Uuid>, _>(None::<Uuid>)
            .bind::<BigInt, _>(created_at_us)
            .execute(conn)
            .await
            .map(drop)
        }

        async fn raw_insert_inbox(
            conn: &mut AsyncPgConnection,
            id: Uuid,
            handler: &str,
            now_us: i64,
        ) -> QueryResult<bool> {
            let inserted = diesel::sql_query(
                "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING",
            )
            .bind::<diesel::sql_types::Uuid, _>(id)
            .bind::<Text, _>(handler)
            .bind::<BigInt, _>(now_us)
            .execute(conn)
            .await?;
            Ok(inserted == 1)
        }

        fn prefill_outbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
            let topic = Work::TOPIC;
            format!(
                "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, causation_id, created_at_us) \
                 SELECT u, '{topic}', '{{\"n\":' || i || '}}', u, NULL, ({base_ms} + i / 1000) * 1000 \
                 FROM (SELECT i, (lpad(to_hex({base_ms} + i / 1000), 12, '0') || '7000' || '8' \
                                  || lpad(to_hex(i), 15, '0'))::uuid AS u \
                       FROM generate_series({lo}::bigint, {hi}::bigint - 1) AS i) AS s"
            )
        }

        fn prefill_inbox_sql(lo: u64, hi: u64, base_ms: i64) -> String {
            format!(
                "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) \
                 SELECT (lpad(to_hex({base_ms} + i / 10), 12, '0') || '7' \
                         || lpad(to_hex((random() * 4095)::int), 3, '0') \
                         || to_hex(8 + (random() * 3)::int) || lpad(to_hex(i), 15, '0'))::uuid, \
                        '{HANDLER}', ({base_ms} + i / 10) * 1000 \
                 FROM generate_series({lo}::bigint, {hi}::bigint - 1) AS i"
            )
        }
    }

    /// Drops every schema the run created.
    pub(super) async fn drop_schemas(place: &Place) -> Res<()> {
        let schemas = std::mem::take(&mut *lock(&place.schemas));
        if schemas.is_empty() {
            return Ok(());
        }
        let url = place.pg_url.clone().expect("a PostgreSQL place");
        let mut conn = AsyncPgConnection::establish(&url).await?;
        for schema in schemas {
            conn.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE"))
                .await?;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Measured runs
// ---------------------------------------------------------------------------

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

fn note(n: u64) -> String {
    format!("order {n}")
}

/// What one measured run produced.
#[derive(Debug, Clone, Serialize)]
struct RunResult {
    what: String,
    messages: u64,
    seconds: f64,
    per_s: f64,
    /// Producers alone: messages committed per second while producing.
    produced_per_s: f64,
    /// Producer commit to handler commit (observed through the tracing layer
    /// for tickbox, directly for the baseline).
    commit_to_commit: Option<Latency>,
    /// Producer commit to the end of the handler, before its commit.
    commit_to_handler_end: Option<Latency>,
}

impl RunResult {
    fn latency(&self) -> Option<Latency> {
        self.commit_to_commit.or(self.commit_to_handler_end)
    }
}

/// Runs `produce(n)` for n in `offset..offset + messages` on `concurrency`
/// tasks, paced at `rate` messages/s when given. Returns when all are
/// committed, with the time that took.
async fn produce<F, Fut>(args: &Args, clock: &Arc<Clock>, rate: Option<f64>, produce: F) -> Res<f64>
where
    F: Fn(u64) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Res<()>> + Send,
{
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (next, clock, produce, total) =
            (next.clone(), clock.clone(), produce.clone(), args.messages);
        tasks.push(tokio::spawn(async move {
            loop {
                let k = next.fetch_add(1, Relaxed);
                if k >= total || clock.failed.load(Relaxed) {
                    return Ok::<_, BoxError>(());
                }
                if let Some(rate) = rate {
                    let at = clock.t0 + Duration::from_secs_f64(k as f64 / rate);
                    tokio::time::sleep_until(at.into()).await;
                }
                let n = clock.offset + k;
                if let Err(e) = produce(n).await {
                    clock.failed.store(true, Relaxed);
                    return Err(e);
                }
                clock.producer_committed(n);
            }
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(clock.t0.elapsed().as_secs_f64())
}

/// Waits until `handled()` reaches `target`; fails when nothing moves for a
/// minute. Returns the seconds since the clock's start.
async fn wait_handled(clock: &Clock, target: u64, handled: impl Fn() -> u64) -> Res<f64> {
    let (mut last, mut last_change) = (0, Instant::now());
    loop {
        let now = handled();
        if now >= target {
            return Ok(clock.t0.elapsed().as_secs_f64());
        }
        if clock.failed.load(Relaxed) {
            return Err("a producer failed".into());
        }
        if now != last {
            (last, last_change) = (now, Instant::now());
        } else if last_change.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "stalled: {now} of {target} handled after a minute without progress"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

/// The baseline: the same producer and consumer transactions, executed
/// directly with diesel-async on tickbox's own tables, same pools, same
/// transaction modes, no bus. A committed message goes to its consumer
/// through memory (a spawned task per message, waiting for one of the
/// consumer pool's C connections) — the cheapest possible hand-off.
async fn run_baseline<B: BenchBackend>(
    place: &Place,
    args: &Args,
    offset: u64,
    rate: Option<f64>,
) -> Res<RunResult> {
    run_direct::<B>(place, args, offset, rate, true).await
}

/// The producers' transactions alone, with no consumer and no bus: the most
/// messages per second any outbox could take in on this database, whatever
/// delivers them.
async fn run_producers_alone<B: BenchBackend>(place: &Place, args: &Args) -> Res<RunResult> {
    run_direct::<B>(place, args, 0, None, false).await
}

/// The workload with plain diesel-async; with `consume`, each committed
/// message then goes through memory to a consumer transaction.
async fn run_direct<B: BenchBackend>(
    place: &Place,
    args: &Args,
    offset: u64,
    rate: Option<f64>,
    consume: bool,
) -> Res<RunResult> {
    let (shop, ledger) = (place.fresh("shop"), place.fresh("ledger"));
    // Starting a module runs tickbox's migrations: the baseline writes the
    // very tables (and indexes) tickbox writes.
    let shop_module = B::module(place, &shop).pool_size(1).start().await?;
    let ledger_module = B::module(place, &ledger).pool_size(1).start().await?;
    let producers = B::raw_pool(place, &shop, args.concurrency)?;
    let consumers = B::raw_pool(place, &ledger, args.concurrency)?;
    B::batch(&mut *B::raw_get(&producers).await?, B::CREATE_ORDERS).await?;
    B::batch(&mut *B::raw_get(&consumers).await?, B::CREATE_EFFECTS).await?;

    let clock = Clock::new(offset, args.messages, true);
    let task_clock = clock.clone();
    let produced = produce(args, &clock, rate, move |n| {
        let (producers, consumers, clock) =
            (producers.clone(), consumers.clone(), task_clock.clone());
        async move {
            let id = Uuid::now_v7();
            let payload = serde_json::to_string(&Work { n })?;
            {
                let mut conn = B::raw_get(&producers).await?;
                B::raw_begin(&mut *conn).await?;
                let written = async {
                    B::insert_order(&mut *conn, n as i64, &note(n)).await?;
                    B::raw_insert_outbox(&mut *conn, id, Work::TOPIC, &payload, now_us()).await
                }
                .await;
                match written {
                    Ok(()) => B::raw_commit(&mut *conn).await?,
                    Err(e) => {
                        B::raw_rollback(&mut *conn).await?;
                        return Err(e.into());
                    }
                }
            }
            if !consume {
                clock.handler_committed_index(n);
                clock.handled.fetch_add(1, Relaxed);
                return Ok(());
            }
            tokio::spawn(async move {
                let consumed: Res<()> = async {
                    let mut conn = B::raw_get(&consumers).await?;
                    B::raw_begin(&mut *conn).await?;
                    let written = async {
                        if B::raw_insert_inbox(&mut *conn, id, HANDLER, now_us()).await? {
                            let work: Work = serde_json::from_str(&payload)?;
                            B::insert_effect(&mut *conn, work.n as i64, id).await?;
                        }
                        Ok::<_, BoxError>(())
                    }
                    .await;
                    match written {
                        Ok(()) => B::raw_commit(&mut *conn).await?,
                        Err(e) => {
                            B::raw_rollback(&mut *conn).await?;
                            return Err(e);
                        }
                    }
                    Ok(())
                }
                .await;
                match consumed {
                    Ok(()) => {
                        clock.handler_committed_index(n);
                        clock.handled.fetch_add(1, Relaxed);
                    }
                    Err(e) => {
                        eprintln!("baseline consumer failed: {e}");
                        clock.failed.store(true, Relaxed);
                    }
                }
            });
            Ok(())
        }
    })
    .await?;
    let seconds = wait_handled(&clock, args.messages, || clock.handled.load(Relaxed)).await?;
    drop((shop_module, ledger_module));
    Ok(RunResult {
        what: if consume {
            "baseline"
        } else {
            "producers alone"
        }
        .into(),
        messages: args.messages,
        seconds,
        per_s: args.messages as f64 / seconds,
        produced_per_s: args.messages as f64 / produced,
        commit_to_commit: clock.latencies(&clock.committed),
        commit_to_handler_end: None,
    })
}

/// A producer module and a consumer module with the [`Record`] handler, on
/// fresh databases, and their business tables.
struct Pair<B: Backend> {
    shop: ModuleHandle<B>,
    ledger: ModuleHandle<B>,
    clock: Arc<RwLock<Arc<Clock>>>,
    /// A module joins one bus for good: started by the first run on the
    /// pair, kept for the next ones.
    bus: Mutex<Option<Arc<tickbox::BusHandle<B>>>>,
}

impl<B: BenchBackend> Pair<B> {
    async fn bus(&self, args: &Args) -> Res<Arc<tickbox::BusHandle<B>>> {
        if let Some(bus) = &*lock(&self.bus) {
            return Ok(bus.clone());
        }
        // Runs on one pair take turns, so no other run starts a bus meanwhile.
        let started = Arc::new(bus_builder(args, self).start().await?);
        *lock(&self.bus) = Some(started.clone());
        Ok(started)
    }

    async fn stop(&self) {
        let bus = lock(&self.bus).take();
        if let Some(bus) = bus {
            bus.stop().await;
        }
    }
}

async fn pair<B: BenchBackend>(place: &Place, args: &Args) -> Res<Pair<B>> {
    let clock = Arc::new(RwLock::new(Clock::new(0, 0, false)));
    // The producer's pool has one more connection than there are producers:
    // the bus's dispatcher checks out one to mark messages delivered.
    let mut shop = B::module(place, &place.fresh("shop"))
        .pool_size(args.concurrency + 1)
        .publishes::<Work>();
    if args.delete_delivered {
        shop = shop.retention(tickbox::Retention {
            outbox: Some(Duration::ZERO),
            ..tickbox::Retention::default()
        });
    }
    let shop = shop.start().await?;
    let ledger = B::module(place, &place.fresh("ledger"))
        .pool_size(args.concurrency)
        .handler_with(
            HANDLER,
            Record {
                clock: clock.clone(),
            },
            tickbox::HandlerOptions::new().batch(args.batch),
        )
        .start()
        .await?;
    shop.transaction(async move |tx| {
        B::batch(tx.conn(), B::CREATE_ORDERS).await?;
        Ok::<_, tickbox::Error>(())
    })
    .await?;
    ledger
        .transaction(async move |tx| {
            B::batch(tx.conn(), B::CREATE_EFFECTS).await?;
            Ok::<_, tickbox::Error>(())
        })
        .await?;
    Ok(Pair {
        shop,
        ledger,
        clock,
        bus: Mutex::new(None),
    })
}

/// The bus over a pair, with the library's defaults unless a flag says otherwise.
fn bus_builder<B: BenchBackend>(args: &Args, pair: &Pair<B>) -> tickbox::BusBuilder<B> {
    let builder = Bus::builder().module(&pair.shop).module(&pair.ledger);
    match args.sweep_ms {
        Some(ms) => builder.scan_interval(Duration::from_millis(ms)),
        None => builder,
    }
}

async fn count<B: BenchBackend>(module: &ModuleHandle<B>, sql: &'static str) -> Res<i64> {
    Ok(module
        .transaction(async move |tx| Ok::<_, tickbox::Error>(B::count(tx.conn(), sql).await?))
        .await?)
}

fn handled<B: Backend>(module: &ModuleHandle<B>) -> u64 {
    module.metrics().total(|h| h.handled)
}

/// The workload through tickbox on an existing pair: N messages published by
/// C producers while the bus runs, until the handler has committed N times.
async fn run_tickbox_on<B: BenchBackend>(
    pair: &Pair<B>,
    args: &Args,
    offset: u64,
    rate: Option<f64>,
    what: &str,
) -> Res<RunResult> {
    let bus = pair.bus(args).await?;
    let before = handled(&pair.ledger);
    let clock = Clock::new(offset, args.messages, true);
    *pair.clock.write().unwrap_or_else(|p| p.into_inner()) = clock.clone();
    set_current(Some(clock.clone()));

    let timeline = args.timeline.then(|| {
        let (ledger, shop, clock, bus) = (pair.ledger.clone(), pair.shop.clone(), clock.clone(), bus.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(250)).await;
                let produced = clock.commit.iter().filter(|c| c.load(Relaxed) != 0).count();
                let m = ledger.metrics();
                let pending = shop.outbox_backlog().await.map_or(-1, |b| b.0);
                eprintln!(
                    "  {:>6.2} s  produced {produced:>7}  handled {:>7}  marked {:>7}  pending {pending:>6}  mailbox queued {:>5} in flight {:>3}  failed {} retried {} duplicates {}",
                    clock.t0.elapsed().as_secs_f64(),
                    m.total(|h| h.handled) - before,
                    bus.metrics().delivered,
                    m.mailbox_queued,
                    m.mailbox_in_flight,
                    m.total(|h| h.failed),
                    m.total(|h| h.retried),
                    m.total(|h| h.duplicates_skipped),
                );
            }
        })
    });
    let shop = pair.shop.clone();
    let produced = produce(args, &clock, rate, move |n| {
        let shop = shop.clone();
        async move {
            shop.transaction(async move |tx| {
                B::insert_order(tx.conn(), n as i64, &note(n)).await?;
                tx.publish(&Work { n })?;
                Ok::<_, tickbox::Error>(())
            })
            .await?;
            Ok(())
        }
    })
    .await?;
    let ledger = pair.ledger.clone();
    let seconds = wait_handled(&clock, args.messages, move || handled(&ledger) - before).await?;
    if let Some(t) = timeline {
        t.abort();
    }
    set_current(None);
    let committed = clock.latencies(&clock.committed);
    Ok(RunResult {
        what: what.into(),
        messages: args.messages,
        seconds,
        per_s: args.messages as f64 / seconds,
        produced_per_s: args.messages as f64 / produced,
        commit_to_commit: committed,
        commit_to_handler_end: clock.latencies(&clock.handler_end),
    })
}

/// Checks that the run did what it claims: one business row and one inbox
/// row per message, nothing left pending.
async fn verify<B: BenchBackend>(pair: &Pair<B>, expected: u64) -> Res<()> {
    pair.stop().await;
    let effects = count(&pair.ledger, "SELECT count(*) AS n FROM bench_effects").await?;
    let pending = pair.shop.outbox_backlog().await?.0;
    let failed = pair.ledger.metrics().total(|h| h.failed);
    // Release the connections now (PostgreSQL: max_connections), not when
    // the last handle is dropped.
    pair.shop.close();
    pair.ledger.close();
    if effects as u64 != expected || pending != 0 {
        return Err(format!(
            "verification failed: {effects} effects (expected {expected}), {pending} outbox rows pending, {failed} failed deliveries"
        )
        .into());
    }
    Ok(())
}

async fn run_tickbox<B: BenchBackend>(
    place: &Place,
    args: &Args,
    offset: u64,
    rate: Option<f64>,
) -> Res<RunResult> {
    let pair = pair::<B>(place, args).await?;
    let result = run_tickbox_on(&pair, args, offset, rate, "tickbox").await?;
    verify(&pair, args.messages).await?;
    Ok(result)
}

// ---------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------

/// A field of /proc/self/status in MiB (VmHWM: peak resident set; VmRSS: now).
fn proc_status_mb(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
        })
        .and_then(|kb| kb.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn peak_rss_mb() -> f64 {
    proc_status_mb("VmHWM:")
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    let mid = xs.len() / 2;
    if xs.len() % 2 == 1 {
        xs[mid]
    } else {
        (xs[mid - 1] + xs[mid]) / 2.0
    }
}

fn fmt_latency(l: Option<Latency>) -> String {
    l.map_or_else(
        || "-".into(),
        |l| format!("{:.2} / {:.2} / {:.1}", l.p50, l.p99, l.max),
    )
}

fn print_runs(runs: &[RunResult]) {
    println!(
        "{:<22} {:>9} {:>8} {:>10} {:>10}   {:<26} {:<26}",
        "run",
        "messages",
        "seconds",
        "msg/s",
        "produced/s",
        "commit->commit p50/p99/max ms",
        "commit->handler end"
    );
    for r in runs {
        println!(
            "{:<22} {:>9} {:>8.2} {:>10.0} {:>10.0}   {:<29} {:<26}",
            r.what,
            r.messages,
            r.seconds,
            r.per_s,
            r.produced_per_s,
            fmt_latency(r.commit_to_commit),
            fmt_latency(r.commit_to_handler_end)
        );
    }
}

type Json = serde_json::Map<String, serde_json::Value>;

fn base_json(args: &Args) -> Json {
    let mut j = Json::new();
    j.insert("backend".into(), args.backend.clone().into());
    j.insert("concurrency".into(), args.concurrency.into());
    j.insert("batch".into(), args.batch.into());
    j.insert("messages".into(), args.messages.into());
    j.insert("rate".into(), serde_json::json!(args.rate));
    j.insert("trace_layer".into(), args.trace.into());
    j
}

fn lat_json(j: &mut Json, prefix: &str, l: Option<Latency>) {
    j.insert(
        format!("{prefix}p50_ms"),
        serde_json::json!(l.map(|l| l.p50)),
    );
    j.insert(
        format!("{prefix}p99_ms"),
        serde_json::json!(l.map(|l| l.p99)),
    );
    j.insert(
        format!("{prefix}max_ms"),
        serde_json::json!(l.map(|l| l.max)),
    );
}

async fn throughput<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let (mut baselines, mut tickboxes) = (Vec::new(), Vec::new());
    let mut offset = 0;
    for round in 0..args.repeat {
        if args.only.as_deref() != Some("tickbox") {
            eprintln!("round {}/{}: baseline", round + 1, args.repeat);
            baselines.push(run_baseline::<B>(place, args, offset, args.rate).await?);
            offset += args.messages;
        }
        if args.only.as_deref() != Some("baseline") {
            eprintln!("round {}/{}: tickbox", round + 1, args.repeat);
            tickboxes.push(run_tickbox::<B>(place, args, offset, args.rate).await?);
            offset += args.messages;
        }
    }
    if args.only.is_some() {
        let runs: Vec<RunResult> = baselines.into_iter().chain(tickboxes).collect();
        print_runs(&runs);
        let mut j = base_json(args);
        j.insert("scenario".into(), "throughput".into());
        j.insert("runs".into(), serde_json::to_value(&runs)?);
        return Ok(j);
    }
    let runs: Vec<RunResult> = baselines
        .iter()
        .zip(&tickboxes)
        .flat_map(|(b, t)| [b.clone(), t.clone()])
        .collect();
    println!(
        "\n{} · concurrency {} · {} messages per run{}",
        args.backend,
        args.concurrency,
        args.messages,
        args.rate
            .map_or(String::new(), |r| format!(" · rate {r:.0}/s"))
    );
    print_runs(&runs);
    let ratios: Vec<f64> = baselines
        .iter()
        .zip(&tickboxes)
        .map(|(b, t)| t.per_s / b.per_s)
        .collect();
    let baseline = median(baselines.iter().map(|r| r.per_s).collect());
    let tickbox = median(tickboxes.iter().map(|r| r.per_s).collect());
    // Latency of the median tickbox run.
    let mid = {
        let mut sorted: Vec<&RunResult> = tickboxes.iter().collect();
        sorted.sort_by(|a, b| a.per_s.total_cmp(&b.per_s));
        sorted[sorted.len() / 2].clone()
    };
    let ratio = median(ratios.clone());
    println!(
        "\nbaseline {baseline:.0}/s · tickbox {tickbox:.0}/s · ratio {ratio:.3} (per round: {})",
        ratios
            .iter()
            .map(|r| format!("{r:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    );

    let mut j = base_json(args);
    j.insert("scenario".into(), "throughput".into());
    j.insert("repeat".into(), args.repeat.into());
    j.insert("baseline_per_s".into(), baseline.into());
    j.insert("tickbox_per_s".into(), tickbox.into());
    j.insert("ratio".into(), ratio.into());
    j.insert("ratios".into(), serde_json::json!(ratios));
    j.insert(
        "latency_measured_to".into(),
        if mid.commit_to_commit.is_some() {
            "handler commit"
        } else {
            "handler end"
        }
        .into(),
    );
    lat_json(&mut j, "", mid.latency());
    lat_json(&mut j, "handler_end_", mid.commit_to_handler_end);
    lat_json(&mut j, "baseline_", baselines[0].commit_to_commit);
    j.insert("runs".into(), serde_json::to_value(&runs)?);

    if args.peer {
        let peer = run_peer(place, args).await?;
        let peer_per_s = peer
            .get("peer_per_s")
            .and_then(|v| v.as_f64())
            .unwrap_or(0.0);
        println!(
            "\npeer pg-transactional-outbox ({} mode): {peer_per_s:.0}/s · tickbox/peer {:.2}",
            args.peer_mode,
            tickbox / peer_per_s
        );
        eprintln!("producers alone (no consumer, no bus)");
        let alone = run_producers_alone::<B>(place, args).await?.per_s;
        println!(
            "producers alone, no delivery at all: {alone:.0}/s · producers alone/peer {:.2} (the most any outbox could reach here)",
            alone / peer_per_s
        );
        j.insert("peer_per_s".into(), peer_per_s.into());
        j.insert("tickbox_over_peer".into(), (tickbox / peer_per_s).into());
        j.insert("producers_alone_per_s".into(), alone.into());
        j.insert(
            "producers_alone_over_peer".into(),
            (alone / peer_per_s).into(),
        );
        j.insert("peer".into(), serde_json::Value::Object(peer));
    }
    Ok(j)
}

/// An unthrottled tickbox run finds the peak; a second run at half of it
/// measures latency under load that the system can sustain.
async fn latency<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let pair = pair::<B>(place, args).await?;
    eprintln!("latency: unthrottled run");
    let peak = run_tickbox_on(&pair, args, 0, args.rate, "tickbox peak").await?;
    let half = peak.per_s / 2.0;
    eprintln!("latency: run at {half:.0}/s");
    let paced = run_tickbox_on(
        &pair,
        args,
        args.messages,
        Some(half),
        "tickbox at half peak",
    )
    .await?;
    verify(&pair, 2 * args.messages).await?;
    println!(
        "\n{} · concurrency {} · {} messages per run",
        args.backend, args.concurrency, args.messages
    );
    print_runs(&[peak.clone(), paced.clone()]);
    let mut j = base_json(args);
    j.insert("scenario".into(), "latency".into());
    j.insert("tickbox_per_s".into(), peak.per_s.into());
    j.insert("paced_rate".into(), half.into());
    j.insert("paced_per_s".into(), paced.per_s.into());
    j.insert(
        "latency_measured_to".into(),
        if paced.commit_to_commit.is_some() {
            "handler commit"
        } else {
            "handler end"
        }
        .into(),
    );
    lat_json(&mut j, "", paced.latency());
    lat_json(&mut j, "handler_end_", paced.commit_to_handler_end);
    lat_json(&mut j, "peak_", peak.latency());
    j.insert("runs".into(), serde_json::to_value([peak, paced])?);
    Ok(j)
}

/// Runs set-based prefill SQL in chunks, each in its own transaction.
async fn prefill<B: BenchBackend>(
    module: &ModuleHandle<B>,
    rows: u64,
    sql: fn(u64, u64, i64) -> String,
    what: &str,
) -> Res<f64> {
    let started = Instant::now();
    let base_ms = now_us() / 1000 - 3_600_000 - (rows / 10) as i64;
    let mut lo = 0;
    while lo < rows {
        let hi = (lo + PREFILL_CHUNK).min(rows);
        let statement = sql(lo, hi, base_ms);
        module
            .transaction(async move |tx| {
                B::batch(tx.conn(), &statement).await?;
                Ok::<_, tickbox::Error>(())
            })
            .await?;
        eprintln!(
            "  {what}: {hi} rows ({:.0} s)",
            started.elapsed().as_secs_f64()
        );
        lo = hi;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Outside any transaction (VACUUM, CHECKPOINT, SQLite checkpoint).
async fn after_prefill<B: BenchBackend>(place: &Place, module: &ModuleHandle<B>) -> Res<()> {
    let pool = B::raw_pool(place, module.name(), 1)?;
    let mut conn = B::raw_get(&pool).await?;
    // One statement at a time: PostgreSQL runs a multi-statement string as
    // one transaction, where VACUUM is refused.
    for statement in B::AFTER_PREFILL.split(';').filter(|s| !s.trim().is_empty()) {
        B::batch(&mut *conn, statement).await?;
    }
    Ok(())
}

/// N messages wait in the outbox (bulk-inserted with set-based SQL while no
/// bus runs); then the bus starts and drains them. Reports the drain rate per
/// window and the process's memory while draining.
async fn backlog<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let pair = pair::<B>(place, args).await?;
    eprintln!("backlog: prefilling {} outbox rows", args.messages);
    let prefill_s = prefill(&pair.shop, args.messages, B::prefill_outbox_sql, "outbox").await?;
    after_prefill(place, &pair.shop).await?;
    let pending = pair.shop.outbox_backlog().await?.0;
    eprintln!("backlog: {pending} pending after {prefill_s:.0} s; starting the bus");
    let rss_before = proc_status_mb("VmRSS:");
    let hwm_before = peak_rss_mb();

    let clock = Clock::new(0, args.messages, false);
    *pair.clock.write().unwrap_or_else(|p| p.into_inner()) = clock.clone();
    let started = Instant::now();
    let bus = pair.bus(args).await?;
    let mut samples: Vec<(f64, u64, f64)> = Vec::new(); // (seconds, handled, rss)
    let mut last_progress = (0, Instant::now());
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let done = handled(&pair.ledger);
        let t = started.elapsed().as_secs_f64();
        let rss = proc_status_mb("VmRSS:");
        samples.push((t, done, rss));
        if samples.len().is_multiple_of(10) {
            eprintln!("  {t:>5.0} s: {done} handled, RSS {rss:.1} MiB");
        }
        if done >= args.messages {
            break;
        }
        if done != last_progress.0 {
            last_progress = (done, Instant::now());
        } else if last_progress.1.elapsed() > Duration::from_secs(60) {
            return Err(format!("backlog drain stalled at {done}").into());
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    bus.stop().await;
    let pending_after = pair.shop.outbox_backlog().await?.0;
    let effects = count(&pair.ledger, "SELECT count(*) AS n FROM bench_effects").await?;
    pair.shop.close();
    pair.ledger.close();

    // Windows of 10 s, the last (partial) one left out.
    let mut windows = Vec::new();
    let (mut t0, mut h0) = (0.0, 0);
    for &(t, h, _) in &samples {
        if t - t0 >= 10.0 {
            windows.push((h - h0) as f64 / (t - t0));
            (t0, h0) = (t, h);
        }
    }
    let max_rss = samples.iter().map(|s| s.2).fold(0.0, f64::max);
    let peak = peak_rss_mb();
    let rate = args.messages as f64 / seconds;
    println!(
        "\n{} · backlog of {} messages · concurrency {}",
        args.backend, args.messages, args.concurrency
    );
    println!("prefill (set-based SQL)            {prefill_s:>10.1} s");
    println!("drain                              {seconds:>10.1} s   {rate:.0} msg/s");
    if !windows.is_empty() {
        println!(
            "10-s windows msg/s (min/median/max) {:>9.0} / {:.0} / {:.0}   ({} windows)",
            windows.iter().cloned().fold(f64::INFINITY, f64::min),
            median(windows.clone()),
            windows.iter().cloned().fold(0.0, f64::max),
            windows.len()
        );
    }
    println!("RSS before bus / max while draining {rss_before:>9.1} / {max_rss:.1} MiB   (VmHWM {hwm_before:.1} -> {peak:.1} MiB)");
    println!("after: {pending_after} pending in the outbox, {effects} effects");
    if pending_after != 0 || effects as u64 != args.messages {
        return Err("backlog verification failed".into());
    }
    let mut j = base_json(args);
    j.insert("scenario".into(), "backlog".into());
    j.insert("prefill_seconds".into(), prefill_s.into());
    j.insert("drain_seconds".into(), seconds.into());
    j.insert("tickbox_per_s".into(), rate.into());
    j.insert("window_per_s".into(), serde_json::json!(windows));
    j.insert("rss_before_mb".into(), rss_before.into());
    j.insert("rss_max_draining_mb".into(), max_rss.into());
    j.insert(
        "rss_samples_mb".into(),
        serde_json::json!(samples
            .iter()
            .map(|s| (s.0.round(), s.1, (s.2 * 10.0).round() / 10.0))
            .collect::<Vec<_>>()),
    );
    j.insert("peak_rss_before_mb".into(), hwm_before.into());
    Ok(j)
}

/// The same workload on an empty inbox and on one holding `--inbox-rows`
/// rows, alternated `--repeat` times (default 3 here).
async fn big_inbox<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    let empty = pair::<B>(place, args).await?;
    let big = pair::<B>(place, args).await?;
    eprintln!("big-inbox: prefilling {} inbox rows", args.inbox_rows);
    let prefill_s = prefill(&big.ledger, args.inbox_rows, B::prefill_inbox_sql, "inbox").await?;
    after_prefill(place, &big.ledger).await?;
    let rows = count(&big.ledger, "SELECT count(*) AS n FROM tickbox_inbox").await?;
    eprintln!("big-inbox: {rows} inbox rows after {prefill_s:.0} s");
    let rounds = if args.repeat == 1 { 3 } else { args.repeat };
    let (mut on_empty, mut on_big) = (Vec::new(), Vec::new());
    let mut offset = 0;
    for round in 0..rounds {
        eprintln!("round {}/{rounds}: empty inbox", round + 1);
        on_empty
            .push(run_tickbox_on(&empty, args, offset, args.rate, "tickbox, empty inbox").await?);
        eprintln!("round {}/{rounds}: big inbox", round + 1);
        on_big.push(run_tickbox_on(&big, args, offset, args.rate, "tickbox, big inbox").await?);
        offset += args.messages;
    }
    verify(&empty, offset).await?;
    verify(&big, offset).await?;
    let runs: Vec<RunResult> = on_empty
        .iter()
        .zip(&on_big)
        .flat_map(|(a, b)| [a.clone(), b.clone()])
        .collect();
    println!(
        "\n{} · inbox of {rows} rows vs empty · concurrency {} · {} messages per run",
        args.backend, args.concurrency, args.messages
    );
    print_runs(&runs);
    let e = median(on_empty.iter().map(|r| r.per_s).collect());
    let b = median(on_big.iter().map(|r| r.per_s).collect());
    println!(
        "\nempty inbox {e:.0}/s · {rows}-row inbox {b:.0}/s · big/empty {:.3}",
        b / e
    );
    let mut j = base_json(args);
    j.insert("scenario".into(), "big-inbox".into());
    j.insert("inbox_rows".into(), rows.into());
    j.insert("prefill_seconds".into(), prefill_s.into());
    j.insert("empty_per_s".into(), e.into());
    j.insert("big_per_s".into(), b.into());
    j.insert("tickbox_per_s".into(), b.into());
    j.insert("big_over_empty".into(), (b / e).into());
    j.insert("runs".into(), serde_json::to_value(&runs)?);
    Ok(j)
}

// ---------------------------------------------------------------------------
// The peer: pg-transactional-outbox, through benches/peer/bench.js
// ---------------------------------------------------------------------------

async fn run_peer(place: &Place, args: &Args) -> Res<Json> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peer");
    if !dir.join("node_modules").exists() {
        eprintln!("peer: installing benches/peer with npm ci");
        let npm_dir = dir.clone();
        let status = tokio::task::spawn_blocking(move || {
            std::process::Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(npm_dir)
                .status()
        })
        .await??;
        if !status.success() {
            return Err("`npm ci` in benches/peer failed".into());
        }
    }
    let url = place.pg_url.clone().expect("a PostgreSQL place");
    let batch = args.peer_batch.unwrap_or(2 * args.concurrency);
    eprintln!(
        "peer: pg-transactional-outbox, {} mode, batch {batch}, polling every {} ms",
        args.peer_mode, args.peer_poll_ms
    );
    let mut command = std::process::Command::new("node");
    command
        .arg(dir.join("bench.js"))
        .args(["--database-url", &url])
        .args(["--messages", &args.messages.to_string()])
        .args(["--concurrency", &args.concurrency.to_string()])
        .args(["--mode", &args.peer_mode])
        .args(["--batch", &batch.to_string()])
        .args(["--poll-ms", &args.peer_poll_ms.to_string()])
        .arg("--json");
    if let Some(rate) = args.rate {
        command.args(["--rate", &rate.to_string()]);
    }
    let output = tokio::task::spawn_blocking(move || command.output()).await??;
    // The peer may echo its database URL: shown with the password masked.
    let redacted = tickbox::redact_url(&url);
    let stdout = String::from_utf8_lossy(&output.stdout);
    for line in stdout.lines() {
        if !line.starts_with('{') {
            println!("peer | {}", line.replace(&url, &redacted));
        }
    }
    for line in String::from_utf8_lossy(&output.stderr).lines() {
        eprintln!("peer | {}", line.replace(&url, &redacted));
    }
    if !output.status.success() {
        return Err(format!("the peer benchmark failed ({})", output.status).into());
    }
    let last = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("the peer printed no JSON")?;
    match serde_json::from_str(last)? {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err("the peer's JSON is not an object".into()),
    }
}

// ---------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------

async fn scenario<B: BenchBackend>(place: &Place, args: &Args) -> Res<Json> {
    match args.scenario {
        Scenario::Throughput => throughput::<B>(place, args).await,
        Scenario::Latency => latency::<B>(place, args).await,
        Scenario::Backlog => backlog::<B>(place, args).await,
        Scenario::BigInbox => big_inbox::<B>(place, args).await,
    }
}

async fn run(args: &Args) -> Res<Json> {
    let place = Place::new(args)?;
    let result = match args.backend.as_str() {
        #[cfg(feature = "sqlite")]
        "sqlite" => scenario::<tickbox::Sqlite>(&place, args).await,
        #[cfg(not(feature = "sqlite"))]
        "sqlite" => Err("this build has no `sqlite` feature".into()),
        #[cfg(feature = "postgres")]
        "postgres" => scenario::<tickbox::Postgres>(&place, args).await,
        #[cfg(not(feature = "postgres"))]
        "postgres" => Err("--backend postgres needs the `postgres` feature: \
             cargo run --release --features postgres --example bench -- --backend postgres ..."
            .into()),
        other => Err(format!("unknown backend `{other}` (sqlite or postgres)").into()),
    };
    #[cfg(feature = "postgres")]
    if let Err(e) = postgres_impl::drop_schemas(&place).await {
        eprintln!("warning: dropping the benchmark's schemas failed: {e}");
    }
    result
}

#[actix::main]
async fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.trace {
        install_trace_layer();
    }
    match run(&args).await {
        Ok(mut json) => {
            let peak = peak_rss_mb();
            println!("peak RSS (VmHWM) {peak:.1} MiB");
            json.insert("peak_rss_mb".into(), peak.into());
            for key in ["baseline_per_s", "ratio", "p50_ms", "p99_ms"] {
                json.entry(key).or_insert(serde_json::Value::Null);
            }
            if args.json {
                println!("{}", serde_json::Value::Object(json));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
