//! Shared test support: a fresh database per test on each backend, test
//! messages and handlers, and waiting on conditions with a timeout; a TCP
//! proxy that injects network faults (`fault_proxy`); an SMTP server that
//! keeps every e-mail it accepts (`smtp_sink`); what a panic said and where
//! (`panics`); the MariaDB/MySQL server the process tests use (`mysql`).

pub mod fault_proxy;
#[cfg(feature = "mysql")]
pub mod mysql;
pub mod otlp_receiver;
pub mod panics;
pub mod smtp_sink;

pub use panics::{panic_location, panic_message};

use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Once};
use std::time::Duration;
use tickbox::{Backend, Delivery, Handler, HandlerError, Message, ModuleBuilder, ModuleHandle, Tx};

/// Logs to the test writer; `RUST_LOG=tickbox=debug` shows deliveries.
pub fn trace_init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "tickbox=warn".into()),
            )
            .with_test_writer()
            .try_init();
    });
}

/// A backend the suite runs against.
pub trait TestBackend: Backend {
    /// A builder for module `name` in a database nobody else uses.
    fn module(db: &TestDb, name: &str) -> ModuleBuilder<Self>;

    /// Runs `SELECT count(*) AS n …` and returns n.
    fn count(
        conn: &mut Self::Connection,
        sql: String,
    ) -> impl Future<Output = diesel::QueryResult<i64>> + Send;

    /// Runs `SELECT ordering_key, seq, n …` and returns its rows.
    fn keyed_rows(
        conn: &mut Self::Connection,
        sql: String,
    ) -> impl Future<Output = diesel::QueryResult<Vec<KeyedRow>>> + Send;

    /// SQL that the database refuses with a failure worth retrying, run in a
    /// read transaction while another transaction of the module writes.
    const TRANSIENT_FAILURE: &'static str;
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// A keyed message as a test handler recorded it.
#[derive(Debug, diesel::QueryableByName)]
pub struct KeyedRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub ordering_key: String,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub seq: i64,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    pub n: i64,
}

macro_rules! count_impl {
    () => {
        async fn count(conn: &mut Self::Connection, sql: String) -> diesel::QueryResult<i64> {
            Ok(diesel::sql_query(sql).get_result::<Count>(conn).await?.n)
        }

        async fn keyed_rows(
            conn: &mut Self::Connection,
            sql: String,
        ) -> diesel::QueryResult<Vec<KeyedRow>> {
            diesel::sql_query(sql).load::<KeyedRow>(conn).await
        }
    };
}

/// Where one test keeps its databases: the test kit's throw-away ones.
pub struct TestDb {
    /// A fresh SQLite file or PostgreSQL schema per module, removed on
    /// drop.
    dbs: tickbox::testing::TestDatabases,
    /// Makes the test's broker names unique.
    #[cfg_attr(not(feature = "amqp"), allow(dead_code))]
    prefix: String,
    /// The RabbitMQ transport the test's buses run over, if any.
    #[cfg(feature = "amqp")]
    amqp: Option<tickbox::Amqp>,
    /// Over a broker: held while the test runs, so that no test restarts
    /// the broker under it.
    #[cfg(feature = "amqp")]
    _broker: Option<BrokerGuard>,
}

impl TestDb {
    pub fn new() -> Self {
        Self::at(tickbox::testing::TestDatabases::sqlite())
    }

    fn at(dbs: tickbox::testing::TestDatabases) -> Self {
        TestDb {
            dbs,
            prefix: format!("t{:08x}", fastrand::u32(..)),
            #[cfg(feature = "amqp")]
            amqp: None,
            #[cfg(feature = "amqp")]
            _broker: None,
        }
    }

    /// The same place, with buses that run over the RabbitMQ broker at
    /// `TICKBOX_AMQP_URL` (default: the local broker's), in a namespace of
    /// the test's own. The AMQP suite fails rather than skips without a
    /// broker.
    #[cfg(feature = "amqp")]
    #[allow(dead_code)]
    pub fn over_amqp(mut self) -> Self {
        let namespace = format!("test.{}", self.prefix);
        self._broker = Some(broker_shared());
        // Room for every message a test holds at once behind a gate.
        self.amqp = Some(
            tickbox::Amqp::new(amqp_url())
                .namespace(namespace)
                .prefetch(256),
        );
        self
    }

    /// Whether the test's buses run over a broker.
    pub fn over_broker(&self) -> bool {
        #[cfg(feature = "amqp")]
        if self.amqp.is_some() {
            return true;
        }
        false
    }

    /// A bus builder for this test: over its broker, if it has one.
    pub fn bus<B: TestBackend>(&self) -> tickbox::BusBuilder<B> {
        let builder = tickbox::Bus::builder();
        #[cfg(feature = "amqp")]
        if let Some(amqp) = &self.amqp {
            return builder.amqp(amqp.clone());
        }
        builder
    }

    /// The PostgreSQL suite needs `TICKBOX_PG_URL`; without it, it fails
    /// rather than passing silently.
    #[cfg(feature = "postgres")]
    pub fn postgres() -> Self {
        let url = std::env::var("TICKBOX_PG_URL").expect(
            "the PostgreSQL suite needs TICKBOX_PG_URL, e.g. postgres://postgres@127.0.0.1:5432/test",
        );
        Self::at(tickbox::testing::TestDatabases::postgres(url))
    }

    /// The PostgreSQL server at `url` (a URL with TLS parameters, say).
    #[cfg(feature = "postgres")]
    #[allow(dead_code)]
    pub fn postgres_at(url: String) -> Self {
        Self::at(tickbox::testing::TestDatabases::postgres(url))
    }

    /// The MariaDB/MySQL suite needs `TICKBOX_MYSQL_URL` (the server, with
    /// no database: each module gets one of its own); without it, it fails
    /// rather than passing silently.
    #[cfg(feature = "mysql")]
    pub fn mysql() -> Self {
        let url = std::env::var("TICKBOX_MYSQL_URL").expect(
            "the MariaDB/MySQL suite needs TICKBOX_MYSQL_URL, e.g. mysql://root@127.0.0.1:3306",
        );
        Self::at(tickbox::testing::TestDatabases::on::<tickbox::Mysql>(url))
    }

    /// The schema (PostgreSQL) or database (MariaDB/MySQL) module `name`
    /// works in.
    #[allow(dead_code)]
    pub fn schema(&self, name: &str) -> String {
        self.dbs.schema(name)
    }

    /// The MariaDB/MySQL server at `url` (a URL with TLS parameters, say).
    #[cfg(feature = "mysql")]
    #[allow(dead_code)]
    pub fn mysql_at(url: String) -> Self {
        Self::at(tickbox::testing::TestDatabases::on::<tickbox::Mysql>(url))
    }
}

/// Over a broker, deletes the test's exchange and queues, so that a run
/// leaves the broker as it found it (the databases go with the kit's
/// `TestDatabases`).
impl Drop for TestDb {
    fn drop(&mut self) {
        #[cfg(feature = "amqp")]
        if let Some(amqp) = &self.amqp {
            delete_from_broker(&amqp.exchange());
        }
    }
}

impl TestBackend for tickbox::Sqlite {
    fn module(db: &TestDb, name: &str) -> ModuleBuilder<Self> {
        db.dbs.module(name)
    }
    count_impl!();
    // Taking the write lock that the writer holds, without waiting for it.
    const TRANSIENT_FAILURE: &'static str =
        "PRAGMA busy_timeout = 0; CREATE TABLE lock_probe (x INTEGER)";
}

#[cfg(feature = "postgres")]
impl TestBackend for tickbox::Postgres {
    fn module(db: &TestDb, name: &str) -> ModuleBuilder<Self> {
        db.dbs.module(name)
    }
    count_impl!();
    // The server raises the SQLSTATE of a deadlock (40P01), as it does when
    // it breaks one.
    const TRANSIENT_FAILURE: &'static str = "DO $$ BEGIN RAISE EXCEPTION 'deadlock detected' \
         USING ERRCODE = 'deadlock_detected'; END $$";
}

#[cfg(feature = "mysql")]
impl TestBackend for tickbox::Mysql {
    fn module(db: &TestDb, name: &str) -> ModuleBuilder<Self> {
        db.dbs.module(name)
    }
    count_impl!();
    // The SQLSTATE of a deadlock (40001), raised as the server does when it
    // breaks one (MariaDB takes SIGNAL outside a stored program).
    const TRANSIENT_FAILURE: &'static str = "SIGNAL SQLSTATE '40001' SET MESSAGE_TEXT = \
         'Deadlock found when trying to get lock; try restarting transaction'";
}

/// Tests that use the broker share it; a test that restarts it, closes its
/// connections or blocks its publishers has it alone.
#[cfg(feature = "amqp")]
static BROKER: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A test's hold on the broker.
#[cfg(feature = "amqp")]
#[allow(dead_code)]
pub enum BrokerGuard {
    /// Used beside other tests.
    Shared(std::sync::RwLockReadGuard<'static, ()>),
    /// Alone: its faults hit no other test.
    Alone(std::sync::RwLockWriteGuard<'static, ()>),
}

/// Uses the broker beside other tests.
#[cfg(feature = "amqp")]
#[allow(dead_code)]
pub fn broker_shared() -> BrokerGuard {
    BrokerGuard::Shared(BROKER.read().unwrap_or_else(|p| p.into_inner()))
}

/// Has the broker alone, to inject faults into it.
#[cfg(feature = "amqp")]
#[allow(dead_code)]
pub fn broker_alone() -> BrokerGuard {
    BrokerGuard::Alone(BROKER.write().unwrap_or_else(|p| p.into_inner()))
}

/// Deletes exchange `exchange` and every queue named after it
/// (`<exchange>.…`): what a test's buses declared on the broker. A broker
/// that cannot be reached keeps them (`.ci/run` removes what is left).
#[cfg(feature = "amqp")]
#[allow(dead_code)]
pub fn delete_from_broker(exchange: &str) {
    use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
    let Ok(listed) = std::process::Command::new("rabbitmqctl")
        .args(["list_queues", "-q", "--no-table-headers", "name"])
        .output()
    else {
        return;
    };
    let prefix = format!("{exchange}.");
    let queues: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::trim)
        .filter(|queue| queue.starts_with(&prefix))
        .map(String::from)
        .collect();
    let (url, exchange) = (amqp_url(), exchange.to_string());
    // Called as a test ends, maybe inside its runtime: a runtime of its own.
    let _ = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            let properties = lapin::ConnectionProperties::default();
            let Ok(connection) = lapin::Connection::connect(&url, properties).await else {
                return;
            };
            if let Ok(channel) = connection.create_channel().await {
                for queue in queues {
                    let options = QueueDeleteOptions::default();
                    let _ = channel.queue_delete(queue.as_str().into(), options).await;
                }
                let options = ExchangeDeleteOptions::default();
                let _ = channel
                    .exchange_delete(exchange.as_str().into(), options)
                    .await;
            }
            let _ = connection.close(200, "test done".into()).await;
        });
    })
    .join();
}

/// Runs `program` with `args` and returns what it printed; fails the test
/// if it fails.
#[allow(dead_code)]
pub fn run_tool(program: &str, args: &[&str]) -> String {
    let output = std::process::Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs `rabbitmqctl` with `args` and fails the test if it fails.
#[cfg(feature = "amqp")]
#[allow(dead_code)]
pub fn rabbitmqctl(args: &[&str]) -> String {
    run_tool("rabbitmqctl", args)
}

/// The broker the AMQP tests use: `TICKBOX_AMQP_URL`, or the local one.
#[cfg(feature = "amqp")]
#[allow(dead_code)]
pub fn amqp_url() -> String {
    std::env::var("TICKBOX_AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".to_string())
}

/// Counts rows in a module's database.
pub async fn count<B: TestBackend>(module: &ModuleHandle<B>, sql: impl Into<String>) -> i64 {
    let sql = sql.into();
    module
        .read(async move |tx| Ok::<_, tickbox::Error>(B::count(tx.conn(), sql).await?))
        .await
        .expect("count query")
}

/// Changes a handler has committed (rows of the test's `changes` table).
pub async fn changes<B: TestBackend>(module: &ModuleHandle<B>, handler: &str) -> i64 {
    count(
        module,
        format!("SELECT count(*) AS n FROM changes WHERE handler = '{handler}'"),
    )
    .await
}

/// Inbox rows a handler has committed.
pub async fn inbox_rows<B: TestBackend>(module: &ModuleHandle<B>, handler: &str) -> i64 {
    count(
        module,
        format!("SELECT count(*) AS n FROM tickbox_inbox WHERE handler = '{handler}'"),
    )
    .await
}

/// Creates the table test handlers write their changes to.
pub async fn create_changes<B: TestBackend>(module: &ModuleHandle<B>) {
    module
        .transaction(async move |tx| {
            tx.conn()
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS changes (
                        handler TEXT NOT NULL,
                        message_id TEXT NOT NULL,
                        attempt INTEGER NOT NULL
                    )",
                )
                .await?;
            Ok::<_, tickbox::Error>(())
        })
        .await
        .expect("create changes table");
}

/// A write transaction of a module, held open (having published one
/// `Ping`) until [`HeldWriter::commit`].
pub struct HeldWriter {
    release: tokio::sync::oneshot::Sender<()>,
    writing: tokio::task::JoinHandle<Result<(), tickbox::Error>>,
}

/// Opens a write transaction on `module` that publishes `Ping { n }` and
/// waits; returns once the transaction is inside.
pub async fn hold_writer<B: TestBackend>(module: &ModuleHandle<B>, n: u64) -> HeldWriter {
    let (entered, holding) = tokio::sync::oneshot::channel();
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let writer = module.clone();
    let writing = tokio::spawn(async move {
        writer
            .transaction(async move |tx| {
                tx.publish(&Ping { n })?;
                let _ = entered.send(());
                let _ = released.await;
                Ok::<_, tickbox::Error>(())
            })
            .await
    });
    holding.await.expect("the writer is inside its transaction");
    HeldWriter { release, writing }
}

impl HeldWriter {
    /// Lets the transaction commit, and fails the test if it does not.
    pub async fn commit(self) {
        self.release.send(()).expect("release");
        self.writing
            .await
            .expect("joined")
            .expect("the writer commits");
    }
}

/// Waits until `condition` holds, checking every 20 ms, for at most
/// `timeout`; panics with `what` if it never does.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if condition().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a test waits for a condition before failing.
pub const WAIT: Duration = Duration::from_secs(20);

#[derive(Debug, Serialize, Deserialize)]
pub struct Ping {
    pub n: u64,
}
impl Message for Ping {
    const TOPIC: &'static str = "test.ping";
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Pong {
    pub n: u64,
}
impl Message for Pong {
    const TOPIC: &'static str = "test.pong";
}

/// What a [`Record`] handler does after writing its change row.
#[derive(Debug, Clone, Copy)]
pub enum Then {
    Succeed,
    /// Return an error on the first n calls.
    FailFirst(u32),
    /// Panic on the first n calls.
    PanicFirst(u32),
    /// Fail every call while the switch is on.
    FailWhile(&'static std::sync::atomic::AtomicBool),
    /// Fail calls for message number `n` while the switch is on, with a
    /// permanent error if `permanent`.
    FailFor {
        n: u64,
        switch: &'static std::sync::atomic::AtomicBool,
        permanent: bool,
    },
}

/// A test handler: writes an change row in its transaction, then succeeds,
/// fails or panics, and may publish a [`Pong`].
#[derive(Clone)]
pub struct Record {
    pub then: Then,
    pub publish_pong: bool,
    /// Calls that reached the handler, failed or not.
    pub calls: Arc<AtomicU32>,
    /// Held for this long inside the transaction, to make deliveries overlap.
    pub hold: Duration,
}

impl Record {
    pub fn new(then: Then) -> Self {
        Record {
            then,
            publish_pong: false,
            calls: Arc::new(AtomicU32::new(0)),
            hold: Duration::ZERO,
        }
    }

    pub fn publishing_pong(mut self) -> Self {
        self.publish_pong = true;
        self
    }

    pub fn holding(mut self, hold: Duration) -> Self {
        self.hold = hold;
        self
    }
}

/// Writes the change row of `delivery` in the handler's transaction.
pub async fn write_change<B: TestBackend>(
    tx: &mut Tx<B>,
    delivery: &Delivery,
) -> Result<(), HandlerError> {
    tx.conn()
        .batch_execute(&format!(
            "INSERT INTO changes (handler, message_id, attempt) VALUES ('{}', '{}', {})",
            delivery.handler, delivery.envelope.id, delivery.attempt
        ))
        .await?;
    Ok(())
}

impl<B: TestBackend, M: Message + HasN> Handler<B> for RecordOf<M> {
    type Message = M;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        message: M,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let record = &self.0;
        write_change(tx, delivery).await?;
        if !record.hold.is_zero() {
            tokio::time::sleep(record.hold).await;
        }
        let call = record.calls.fetch_add(1, SeqCst) + 1;
        match record.then {
            Then::FailFirst(n) if call <= n => {
                return Err(HandlerError::msg(format!("failure {call} of {n}")))
            }
            Then::PanicFirst(n) if call <= n => panic!("panic {call} of {n}"),
            Then::FailWhile(switch) if switch.load(SeqCst) => {
                return Err(HandlerError::msg("switched to fail"))
            }
            Then::FailFor {
                n,
                switch,
                permanent,
            } if n == message.n() && switch.load(SeqCst) => {
                let error = HandlerError::msg(format!("message {n} is poison"));
                return Err(if permanent {
                    HandlerError::permanent(error)
                } else {
                    error
                });
            }
            _ => {}
        }
        if record.publish_pong {
            tx.publish(&Pong { n: message.n() })?;
        }
        Ok(())
    }
}

/// A [`Record`] handler for message type `M`.
pub struct RecordOf<M>(pub Record, pub std::marker::PhantomData<fn() -> M>);

pub fn record<M>(record: &Record) -> RecordOf<M> {
    RecordOf(record.clone(), std::marker::PhantomData)
}

/// Test messages carry a number.
pub trait HasN {
    fn n(&self) -> u64;
}
impl HasN for Ping {
    fn n(&self) -> u64 {
        self.n
    }
}
impl HasN for Pong {
    fn n(&self) -> u64 {
        self.n
    }
}

/// A UUID as an SQL literal of the backend.
pub fn uuid_literal<B: TestBackend>(id: uuid::Uuid) -> String {
    match B::NAME {
        "postgres" => format!("'{id}'"),
        _ => format!("x'{}'", id.simple()),
    }
}

/// A UUIDv7 of `ago` in the past.
pub fn uuid_ago(ago: Duration) -> uuid::Uuid {
    let at = std::time::SystemTime::now() - ago;
    let since = at
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970");
    uuid::Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        since.as_secs(),
        since.subsec_nanos(),
    ))
}

/// Microseconds since the Unix epoch, `ago` in the past.
pub fn micros_ago(ago: Duration) -> i64 {
    let at = std::time::SystemTime::now() - ago;
    at.duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// Runs SQL on a module's database in a transaction.
pub async fn execute<B: TestBackend>(
    module: &ModuleHandle<B>,
    sql: String,
) -> Result<(), tickbox::Error> {
    module
        .transaction(async move |tx| {
            tx.conn().batch_execute(&sql).await?;
            Ok::<_, tickbox::Error>(())
        })
        .await
}

/// Writes an outbox row by hand, as an operator or another program might.
pub async fn insert_outbox_row<B: TestBackend>(
    module: &ModuleHandle<B>,
    id: uuid::Uuid,
    topic: &str,
    payload: &str,
    created_at_us: i64,
) -> Result<(), tickbox::Error> {
    let id = uuid_literal::<B>(id);
    execute(
        module,
        format!(
            "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, created_at_us) \
             VALUES ({id}, '{topic}', '{payload}', {id}, {created_at_us})"
        ),
    )
    .await
}
