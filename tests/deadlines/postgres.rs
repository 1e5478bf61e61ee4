//! PostgreSQL behind the fault proxy: the network goes quiet under a
//! transaction, a tickbox call, a delivery, a stopping bus.
//!
//! Each module reaches the server through the test's proxy, in a schema of
//! its own, and its sessions carry the module's schema as their
//! `application_name`, so that the test can ask the server directly (never
//! through the proxy) what became of them.

use super::{Stall, MARGIN};
use crate::support::fault_proxy::{FaultProxy, Mode};
use crate::support::*;
use diesel_async::SimpleAsyncConnection;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Duration;
use tickbox::testing::{fast_retries, Session, TestDatabases};
use tickbox::{
    BusHandle, Error, HandlerMetrics, HandlerOptions, Module, ModuleBuilder, ModuleHandle,
    Postgres, RetryPolicy,
};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{timeout, Instant};

/// How long the server lets a session idle inside a transaction beyond the
/// module's longest transaction deadline.
const SERVER_MARGIN: Duration = Duration::from_secs(5);

/// The call deadline of the modules behind the proxy: the bus's own
/// statements stuck in a blackhole give up this soon.
const CALL_DEADLINE: Duration = Duration::from_secs(2);

fn pg_url() -> String {
    std::env::var("TICKBOX_PG_URL").expect(
        "the PostgreSQL tests need TICKBOX_PG_URL, e.g. postgres://postgres@127.0.0.1:5432/test",
    )
}

/// The address of the server at `TICKBOX_PG_URL`.
fn server_addr() -> SocketAddr {
    let url = url::Url::parse(&pg_url()).expect("TICKBOX_PG_URL is a URL");
    let host = url.host_str().expect("a host in TICKBOX_PG_URL");
    (host, url.port().unwrap_or(5432))
        .to_socket_addrs()
        .expect("the server's address resolves")
        .next()
        .expect("an address")
}

/// `TICKBOX_PG_URL` through `proxy`, its sessions named `application` on
/// the server.
fn through(proxy: &FaultProxy, application: &str) -> String {
    let mut url = url::Url::parse(&pg_url()).expect("TICKBOX_PG_URL is a URL");
    url.set_host(Some("127.0.0.1")).expect("a host");
    url.set_port(Some(proxy.port())).expect("a port");
    url.query_pairs_mut()
        .append_pair("application_name", application);
    url.to_string()
}

/// Module `name` reaching its schema through `proxy`, with short call
/// deadlines, a pool of 4, and its gauges read only as it starts (then
/// the only calls are the test's and its bus's).
fn behind(dbs: &TestDatabases, proxy: &FaultProxy, name: &str) -> ModuleBuilder<Postgres> {
    let schema = dbs.schema(name);
    Module::<Postgres>::builder(name, through(proxy, &schema))
        .schema(schema)
        .pool_size(4)
        .call_deadline(CALL_DEADLINE)
        .metrics_interval(Duration::from_secs(3600))
}

/// Starts a module of `dbs` and waits until its first reading of the
/// outbox gauges (made as it starts) is over, so that no call of its own is
/// under way when the test blackholes the network.
async fn start(
    server: &Server,
    dbs: &TestDatabases,
    builder: ModuleBuilder<Postgres>,
) -> ModuleHandle<Postgres> {
    let module = builder.start().await.expect("the module starts");
    eventually("the module's first gauge reading", WAIT, || async {
        module.metrics().outbox.sampled_at_us != 0
    })
    .await;
    server.until_idle(dbs, module.name()).await;
    module
}

/// Waits until the bus has nothing left to do (`wait_idle` asks again when
/// a reading fails for a while, as right after the network went quiet).
async fn until_drained(bus: &BusHandle<Postgres>) {
    let idle = bus.wait_idle(WAIT).await.expect("wait_idle");
    assert!(idle, "the bus still had work after {WAIT:?}");
}

/// The server, asked directly.
struct Server {
    client: tokio_postgres::Client,
    connection: JoinHandle<()>,
}

impl Server {
    async fn connect() -> Server {
        let (client, connection) = tokio_postgres::connect(&pg_url(), tokio_postgres::NoTls)
            .await
            .expect("the test connects to the server");
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        Server { client, connection }
    }

    /// Runs `SELECT count(*) …` and returns the count.
    async fn count(&self, sql: &str) -> i64 {
        self.client
            .query_one(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .get(0)
    }

    /// What module `name` (of `dbs`) committed: its inbox rows and its
    /// handlers' change rows for `handler`, and its dead letters.
    async fn committed(&self, dbs: &TestDatabases, name: &str, handler: &str) -> (i64, i64, i64) {
        let schema = dbs.schema(name);
        (
            self.count(&format!(
                "SELECT count(*) FROM {schema}.tickbox_inbox WHERE handler = '{handler}'"
            ))
            .await,
            self.count(&format!(
                "SELECT count(*) FROM {schema}.changes WHERE handler = '{handler}'"
            ))
            .await,
            self.count(&format!(
                "SELECT count(*) FROM {schema}.tickbox_dead_letters"
            ))
            .await,
        )
    }

    /// Waits until every session of module `name` (of `dbs`) has been idle,
    /// outside any transaction, for a while: the module has no call under
    /// way, nor one between two statements.
    async fn until_idle(&self, dbs: &TestDatabases, name: &str) {
        let busy = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = '{}' \
             AND (state <> 'idle' OR state_change > now() - interval '300 milliseconds')",
            dbs.schema(name)
        );
        eventually(&format!("module {name} is idle"), WAIT, || async {
            self.count(&busy).await == 0
        })
        .await;
    }

    /// The sessions of module `name` (of `dbs`) that are in `state`.
    async fn sessions(&self, dbs: &TestDatabases, name: &str, state: &str) -> i64 {
        self.client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE application_name = $1 AND state = $2",
                &[&dbs.schema(name), &state],
            )
            .await
            .expect("pg_stat_activity")
            .get(0)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

/// The counters of the module's only handler.
fn handler_metrics(module: &ModuleHandle<Postgres>) -> HandlerMetrics {
    let mut handlers = module.metrics().handlers;
    assert_eq!(handlers.len(), 1);
    handlers.remove(0)
}

#[actix::test]
async fn a_transaction_on_a_quiet_connection_fails_at_its_deadline_and_the_server_ends_its_session()
{
    trace_init();
    const DEADLINE: Duration = Duration::from_secs(2);
    let dbs = TestDatabases::postgres(pg_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    let orders = start(
        &server,
        &dbs,
        behind(&dbs, &proxy, "orders").transaction_deadline(DEADLINE),
    )
    .await;
    execute(&orders, "CREATE TABLE probe (n INTEGER NOT NULL)".into())
        .await
        .expect("the probe table");

    let (entered, go) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let started = Instant::now();
    let quiet = tokio::spawn({
        let (orders, entered, go) = (orders.clone(), entered.clone(), go.clone());
        async move {
            let ended = orders
                .transaction(async move |tx| {
                    tx.conn()
                        .batch_execute("INSERT INTO probe (n) VALUES (1)")
                        .await?;
                    entered.notify_one();
                    go.notified().await;
                    tx.conn()
                        .batch_execute("INSERT INTO probe (n) VALUES (2)")
                        .await?;
                    Ok::<_, Error>(())
                })
                .await;
            (ended, Instant::now())
        }
    });
    timeout(WAIT, entered.notified())
        .await
        .expect("the transaction is inside");
    let entered_at = Instant::now();
    proxy.set(Mode::Blackhole);
    let dead = proxy.open();
    go.notify_one();

    let (ended, ended_at) = timeout(DEADLINE + MARGIN, quiet)
        .await
        .expect("the transaction fails at its deadline, not never")
        .expect("joined");
    let took = ended_at - started;
    assert!(
        took >= DEADLINE && took < DEADLINE + MARGIN,
        "the transaction failed after {took:?}; its deadline is {DEADLINE:?}"
    );
    let error = ended.expect_err("a transaction past its deadline fails");
    match &error {
        Error::Deadline {
            module,
            operation,
            deadline,
        } => assert_eq!(
            (module.as_str(), operation.as_str(), *deadline),
            ("orders", "a transaction", DEADLINE)
        ),
        other => panic!("not a deadline: {other:?}"),
    }
    assert!(error.is_transient(), "{error}");
    let calls = orders.metrics().database_calls;
    assert_eq!((calls.stuck, calls.deadlines_missed), (0, 1), "{calls:?}");
    assert_eq!(
        server.sessions(&dbs, "orders", "idle in transaction").await,
        1,
        "the server still holds the abandoned transaction"
    );
    // The client closed the dead connection, and the pool's idle ones
    // with it. (Not every one: see
    // `after_a_heal_the_effects_journal_answers_at_once_too`.)
    eventually("the dead connections are closed", WAIT, || async {
        proxy.open_dead() < dead
    })
    .await;

    proxy.set(Mode::Pass);
    execute(&orders, "INSERT INTO probe (n) VALUES (3)".into())
        .await
        .expect("the next transaction commits on a new connection");
    let calls = orders.metrics().database_calls;
    assert_eq!((calls.stuck, calls.deadlines_missed), (0, 1), "{calls:?}");

    // The server ends the abandoned session at its limit: the longest
    // transaction deadline plus its margin, counted from the session's last
    // statement (just before `entered`).
    let limit = DEADLINE + SERVER_MARGIN;
    let within = (entered_at + limit + MARGIN).saturating_duration_since(Instant::now());
    eventually(
        "the server ends the abandoned transaction's session",
        within,
        || async { server.sessions(&dbs, "orders", "idle in transaction").await == 0 },
    )
    .await;
    let ended_after = entered_at.elapsed();
    assert!(
        ended_after + Duration::from_secs(1) >= limit,
        "the server ended the session after {ended_after:?}, before its limit of {limit:?}"
    );
    assert_eq!(
        count(&orders, "SELECT count(*) AS n FROM probe WHERE n = 3").await,
        1
    );
    assert_eq!(
        count(&orders, "SELECT count(*) AS n FROM probe").await,
        1,
        "nothing of the abandoned transaction committed"
    );
}

#[actix::test]
async fn a_call_past_half_its_deadline_counts_as_stuck_until_it_gives_up() {
    trace_init();
    let dbs = TestDatabases::postgres(pg_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    let orders = start(&server, &dbs, behind(&dbs, &proxy, "orders")).await;
    orders.store_stats().await.expect("the pool is warm");

    proxy.set(Mode::Blackhole);
    let started = Instant::now();
    let asking = tokio::spawn({
        let orders = orders.clone();
        async move { (orders.store_stats().await, Instant::now()) }
    });
    eventually(
        "the call counts as stuck",
        CALL_DEADLINE + MARGIN,
        || async { orders.metrics().database_calls.stuck >= 1 },
    )
    .await;
    let stuck_after = started.elapsed();
    assert!(
        stuck_after >= CALL_DEADLINE / 2,
        "stuck after {stuck_after:?}, before half the deadline of {CALL_DEADLINE:?}"
    );
    assert!(!asking.is_finished(), "the call had not given up yet");

    let (asked, gave_up_at) = timeout(CALL_DEADLINE + MARGIN, asking)
        .await
        .expect("the call gives up at its deadline")
        .expect("joined");
    let took = gave_up_at - started;
    assert!(
        took >= CALL_DEADLINE && took < CALL_DEADLINE + MARGIN,
        "the call gave up after {took:?}; its deadline is {CALL_DEADLINE:?}"
    );
    match asked {
        Err(Error::Deadline {
            module,
            operation,
            deadline,
        }) => assert_eq!(
            (module.as_str(), operation.as_str(), deadline),
            ("orders", "reading the store's figures", CALL_DEADLINE)
        ),
        other => panic!("not a deadline: {other:?}"),
    }
    let calls = orders.metrics().database_calls;
    assert_eq!((calls.stuck, calls.deadlines_missed), (0, 1), "{calls:?}");

    proxy.set(Mode::Pass);
    assert_eq!(
        count(&orders, "SELECT count(*) AS n FROM tickbox_outbox").await,
        0,
        "after the heal a new connection answers"
    );
    let calls = orders.metrics().database_calls;
    assert_eq!((calls.stuck, calls.deadlines_missed), (0, 1), "{calls:?}");
}

#[actix::test]
async fn a_delivery_on_a_quiet_connection_is_retried_without_using_up_an_attempt() {
    trace_init();
    const DEADLINE: Duration = Duration::from_secs(2);
    let dbs = TestDatabases::postgres(pg_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    // The publisher reaches the server directly; the subscriber through
    // the proxy.
    let orders = dbs
        .module::<Postgres>("orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let stall = Stall::new();
    // One attempt: a failure that counted would dead-letter the message.
    let one_attempt = RetryPolicy {
        max_attempts: Some(1),
        ..fast_retries()
    };
    let warehouse = start(
        &server,
        &dbs,
        behind(&dbs, &proxy, "warehouse")
            .transaction_deadline(DEADLINE)
            .handler_with(
                "warehouse.stall",
                stall.clone(),
                HandlerOptions::new().deadline(DEADLINE).retry(one_attempt),
            ),
    )
    .await;
    create_changes(&warehouse).await;
    let bus = dbs
        .bus()
        .module(&orders)
        .module(&warehouse)
        .start()
        .await
        .expect("bus starts");
    let session = Session::start(&bus).allow_failures().timeout(WAIT);

    crate::suite::publish(&orders, 1).await;
    stall.until_entered().await;
    let entered_at = Instant::now();
    proxy.set(Mode::Blackhole);
    stall.go.notify_one();
    // The delivery fails at its deadline, and so does its retry, whose new
    // connection reaches nothing.
    eventually(
        "two deliveries fail at their deadline in the quiet network",
        2 * DEADLINE + 2 * MARGIN,
        || async { handler_metrics(&warehouse).failed >= 2 },
    )
    .await;
    let counted = handler_metrics(&warehouse);
    assert_eq!((counted.handled, counted.dead_lettered), (0, 0));

    proxy.set(Mode::Pass);
    let report = session.wait().await;
    // The retry commits once the server has ended the first delivery's
    // session, whose uncommitted inbox row it waits for: at the server's
    // limit, counted from that session's last statement (just before
    // `entered`).
    let handled_after = entered_at.elapsed();
    assert!(
        handled_after + Duration::from_secs(1) >= DEADLINE + SERVER_MARGIN,
        "handled {handled_after:?} after the first delivery went quiet"
    );
    assert_eq!(report.handled("warehouse.stall").len(), 1, "{report}");
    assert!(
        report.dead_letters("warehouse.stall").is_empty(),
        "{report}"
    );
    let failures = report.failures("warehouse.stall");
    assert!(failures.len() >= 2, "{report}");
    for (_, reason) in &failures {
        assert!(
            reason.contains("a delivery had no answer within its deadline of 2s"),
            "{reason}"
        );
    }
    until_drained(&bus).await;
    eventually("no call of the warehouse is stuck", WAIT, || async {
        warehouse.metrics().database_calls.stuck == 0
    })
    .await;
    bus.stop().await;

    assert_eq!(
        server.committed(&dbs, "warehouse", "warehouse.stall").await,
        (1, 1, 0),
        "one inbox row, one change, no dead letter"
    );
    let counted = handler_metrics(&warehouse);
    assert_eq!((counted.handled, counted.dead_lettered), (1, 0));
    assert!(counted.failed >= 2, "{counted:?}");
    assert!(stall.calls.load(SeqCst) >= 2);
    let calls = warehouse.metrics().database_calls;
    assert!(calls.deadlines_missed >= 2, "{calls:?}");
    assert_eq!(
        server
            .sessions(&dbs, "warehouse", "idle in transaction")
            .await,
        0
    );
}

#[actix::test]
async fn stopping_the_bus_takes_at_most_its_stop_timeout_while_every_connection_is_quiet() {
    trace_init();
    const STOP_TIMEOUT: Duration = Duration::from_secs(3);
    // Longer than the stop: the delivery is still stuck when it returns.
    const DEADLINE: Duration = Duration::from_secs(6);
    let dbs = TestDatabases::postgres(pg_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    let orders = start(
        &server,
        &dbs,
        behind(&dbs, &proxy, "orders").publishes::<Ping>(),
    )
    .await;
    let stall = Stall::new();
    let warehouse = start(
        &server,
        &dbs,
        behind(&dbs, &proxy, "warehouse")
            .transaction_deadline(CALL_DEADLINE)
            .handler_with(
                "warehouse.stall",
                stall.clone(),
                HandlerOptions::new().deadline(DEADLINE),
            ),
    )
    .await;
    create_changes(&warehouse).await;
    // A named instance: the next bus takes this one's claims back at once.
    let instance = dbs.schema("bus");
    let bus = dbs
        .bus()
        .module(&orders)
        .module(&warehouse)
        .instance(instance.clone())
        .stop_timeout(STOP_TIMEOUT)
        .start()
        .await
        .expect("bus starts");

    crate::suite::publish(&orders, 1).await;
    stall.until_entered().await;
    let delivering_since = Instant::now();
    proxy.set(Mode::Blackhole);
    stall.go.notify_one();

    let stopping = Instant::now();
    timeout(STOP_TIMEOUT + MARGIN, bus.stop())
        .await
        .expect("the bus stops within its stop timeout");
    let took = stopping.elapsed();
    assert!(
        took < STOP_TIMEOUT + MARGIN,
        "stopping took {took:?}; the stop timeout is {STOP_TIMEOUT:?}"
    );
    let counted = handler_metrics(&warehouse);
    assert_eq!(
        (counted.handled, counted.failed),
        (0, 0),
        "the stop did not wait for the stuck delivery"
    );

    // The stuck delivery ends at its own deadline, after the stop.
    proxy.set(Mode::Pass);
    eventually(
        "the stuck delivery fails at its deadline",
        (delivering_since + DEADLINE + MARGIN).saturating_duration_since(Instant::now()),
        || async { handler_metrics(&warehouse).failed == 1 },
    )
    .await;

    // Nothing was lost: the next bus delivers the message, once. The calls
    // the stop cut short closed their connections, so it starts at once.
    let bus = dbs
        .bus()
        .module(&orders)
        .module(&warehouse)
        .instance(instance.clone())
        .start()
        .await
        .expect("the next bus starts");
    until_drained(&bus).await;
    bus.stop().await;
    assert_eq!(
        server.committed(&dbs, "warehouse", "warehouse.stall").await,
        (1, 1, 0),
        "one inbox row, one change, no dead letter"
    );
    assert_eq!(stall.calls.load(SeqCst), 2);
}

// ---------------------------------------------------------------------------
// Calls cut short from outside, and the effects journal's pool: what the
// tests above first ran into, each on its own.

#[actix::test]
async fn a_call_its_caller_stops_waiting_for_is_not_left_counted_stuck() {
    trace_init();
    let dbs = TestDatabases::postgres(pg_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    let orders = start(&server, &dbs, behind(&dbs, &proxy, "orders")).await;
    orders.store_stats().await.expect("the pool is warm");

    proxy.set(Mode::Blackhole);
    // The caller stops waiting past half the deadline, as an application's
    // own timeout does, or the bus's stop timeout when it cuts the
    // dispatcher's last statements short.
    let gave_up = timeout(CALL_DEADLINE * 3 / 4, orders.store_stats()).await;
    assert!(gave_up.is_err(), "the call had an answer: {gave_up:?}");
    proxy.set(Mode::Pass);

    let calls = orders.metrics().database_calls;
    assert_eq!(calls.stuck, 0, "no call is waiting: {calls:?}");
}

#[actix::test]
async fn a_call_its_caller_stops_waiting_for_does_not_give_its_connection_back() {
    trace_init();
    let dbs = TestDatabases::postgres(pg_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    // One connection: the next call takes the one the dropped call had, if
    // it went back to the pool.
    let orders = start(
        &server,
        &dbs,
        behind(&dbs, &proxy, "orders")
            .pool_size(1)
            .transaction_deadline(CALL_DEADLINE),
    )
    .await;
    orders.store_stats().await.expect("the pool is warm");

    proxy.set(Mode::Blackhole);
    let gave_up = timeout(CALL_DEADLINE / 4, orders.store_stats()).await;
    assert!(gave_up.is_err(), "the call had an answer: {gave_up:?}");
    proxy.set(Mode::Pass);

    let asked = Instant::now();
    let read: Result<i64, Error> = orders
        .read(async |tx| {
            let sql = "SELECT count(*) AS n FROM tickbox_outbox".to_string();
            Ok(<Postgres as TestBackend>::count(tx.conn(), sql).await?)
        })
        .await;
    assert!(
        read.is_ok() && asked.elapsed() < CALL_DEADLINE / 2,
        "after the heal the next transaction took {:?} and ended {read:?}: it was given the \
         connection of the call dropped in the quiet network",
        asked.elapsed()
    );
}

#[actix::test]
async fn the_effects_journals_calls_are_counted_with_the_modules() {
    trace_init();
    let dbs = TestDatabases::postgres(pg_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    let orders = start(&server, &dbs, behind(&dbs, &proxy, "orders")).await;
    orders
        .effects(&[], 0, 10)
        .await
        .expect("the journal is open");

    proxy.set(Mode::Blackhole);
    let listed = orders.effects(&[], 0, 10).await;
    assert!(
        matches!(listed, Err(Error::Deadline { .. })),
        "the journal's call had no answer: {listed:?}"
    );
    let calls = orders.metrics().database_calls;
    assert_eq!(
        calls.deadlines_missed, 1,
        "the journal's call that missed its deadline is counted: {calls:?}"
    );
}

#[actix::test]
async fn after_a_heal_the_effects_journal_answers_at_once_too() {
    trace_init();
    let dbs = TestDatabases::postgres(pg_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    let orders = start(
        &server,
        &dbs,
        behind(&dbs, &proxy, "orders").transaction_deadline(CALL_DEADLINE),
    )
    .await;
    orders.store_stats().await.expect("both pools are warm");

    proxy.set(Mode::Blackhole);
    // A transaction misses its deadline: the module closes the idle
    // connections that went quiet with it.
    let missed: Result<(), Error> = orders
        .transaction(async |tx| {
            tx.conn().batch_execute("SELECT 1").await?;
            Ok(())
        })
        .await;
    assert!(matches!(missed, Err(Error::Deadline { .. })), "{missed:?}");
    proxy.set(Mode::Pass);

    let asked = Instant::now();
    let stats = orders.store_stats().await;
    assert!(
        stats.is_ok() && asked.elapsed() < CALL_DEADLINE / 2,
        "after the heal the store's figures took {:?} and ended {stats:?}; {} connections \
         left dead by the blackhole are still open",
        asked.elapsed(),
        proxy.open_dead()
    );
}
