//! MariaDB behind the fault proxy: the network goes quiet under a
//! transaction. The client gives up at the transaction's deadline; the
//! server, which never hears from that client again, rolls the abandoned
//! transaction back and ends its session at its own limit
//! (`idle_transaction_timeout`, which tickbox sets on its sessions), so its
//! locks do not outlive the client for long.
//!
//! The module reaches the server through the test's proxy; the test asks
//! the server directly (never through the proxy) what became of the
//! module's sessions, which it tells by their database.

use super::MARGIN;
use crate::support::fault_proxy::{FaultProxy, Mode};
use crate::support::*;
use diesel_async::{AsyncConnection, AsyncMysqlConnection, RunQueryDsl, SimpleAsyncConnection};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;
use tickbox::testing::TestDatabases;
use tickbox::{Error, Module, ModuleHandle, Mysql};
use tokio::sync::Notify;
use tokio::time::{timeout, Instant};

/// How long the server lets a session idle inside a transaction beyond the
/// module's longest transaction deadline.
const SERVER_MARGIN: Duration = Duration::from_secs(5);

fn mysql_url() -> String {
    std::env::var("TICKBOX_MYSQL_URL")
        .expect("the MariaDB tests need TICKBOX_MYSQL_URL, e.g. mysql://root@127.0.0.1:3306")
}

/// The address of the server at `TICKBOX_MYSQL_URL`.
fn server_addr() -> SocketAddr {
    let url = url::Url::parse(&mysql_url()).expect("TICKBOX_MYSQL_URL is a URL");
    let host = url.host_str().expect("a host in TICKBOX_MYSQL_URL");
    (host, url.port().unwrap_or(3306))
        .to_socket_addrs()
        .expect("the server's address resolves")
        .next()
        .expect("an address")
}

/// `TICKBOX_MYSQL_URL` through `proxy`.
fn through(proxy: &FaultProxy) -> String {
    let mut url = url::Url::parse(&mysql_url()).expect("TICKBOX_MYSQL_URL is a URL");
    url.set_host(Some("127.0.0.1")).expect("a host");
    url.set_port(Some(proxy.port())).expect("a port");
    url.to_string()
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

/// The server, asked directly.
struct Server {
    conn: tokio::sync::Mutex<AsyncMysqlConnection>,
}

impl Server {
    async fn connect() -> Server {
        let mut url = url::Url::parse(&mysql_url()).expect("TICKBOX_MYSQL_URL is a URL");
        url.query_pairs_mut().append_pair("prefer_socket", "false");
        let conn = AsyncMysqlConnection::establish(url.as_str())
            .await
            .expect("the test connects to the server");
        Server {
            conn: tokio::sync::Mutex::new(conn),
        }
    }

    /// The open transactions of sessions on database `database`.
    async fn open_transactions(&self, database: &str) -> i64 {
        diesel::sql_query(
            "SELECT count(*) AS n FROM information_schema.innodb_trx t \
             JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE p.db = ?",
        )
        .bind::<diesel::sql_types::Text, _>(database)
        .get_result::<Count>(&mut *self.conn.lock().await)
        .await
        .expect("information_schema")
        .n
    }
}

/// Starts module `name` of `dbs` behind `proxy`, with a transaction
/// deadline of `deadline`, and waits until its first gauge reading is over
/// (no call of its own is under way when the test blackholes the network).
async fn start_behind(
    dbs: &TestDatabases,
    proxy: &FaultProxy,
    name: &str,
    deadline: Duration,
) -> ModuleHandle<Mysql> {
    let module = Module::<Mysql>::builder(name, through(proxy))
        .schema(dbs.schema(name))
        .pool_size(4)
        .call_deadline(Duration::from_secs(2))
        .transaction_deadline(deadline)
        .metrics_interval(Duration::from_secs(3600))
        .start()
        .await
        .expect("the module starts");
    eventually("the module's first gauge reading", WAIT, || async {
        module.metrics().outbox.sampled_at_us != 0
    })
    .await;
    module
}

#[actix::test]
async fn a_transaction_on_a_quiet_connection_fails_at_its_deadline_and_the_server_ends_it() {
    trace_init();
    const DEADLINE: Duration = Duration::from_secs(2);
    let dbs = TestDatabases::on::<Mysql>(mysql_url());
    let proxy = FaultProxy::start(server_addr()).await;
    let server = Server::connect().await;
    let orders = start_behind(&dbs, &proxy, "orders", DEADLINE).await;
    let database = dbs.schema("orders");
    execute(
        &orders,
        "CREATE TABLE probe (n INTEGER NOT NULL PRIMARY KEY)".into(),
    )
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
    assert!(
        matches!(&error, Error::Deadline { operation, .. } if operation == "a transaction"),
        "not a transaction's deadline: {error:?}"
    );
    assert!(error.is_transient(), "{error}");
    assert_eq!(
        server.open_transactions(&database).await,
        1,
        "the server still holds the abandoned transaction, and its row lock"
    );

    // The server rolls it back and ends its session at its limit: the
    // longest transaction deadline plus its margin, counted from the
    // session's last statement (just before `entered`).
    let limit = DEADLINE + SERVER_MARGIN;
    let within = (entered_at + limit + MARGIN).saturating_duration_since(Instant::now());
    eventually(
        "the server ends the abandoned transaction",
        within,
        || async { server.open_transactions(&database).await == 0 },
    )
    .await;
    let ended_after = entered_at.elapsed();
    assert!(
        ended_after + Duration::from_secs(1) >= limit,
        "the server ended the transaction after {ended_after:?}, before its limit of {limit:?}"
    );

    // Its row lock is gone: the same key commits now, on a new connection.
    proxy.set(Mode::Pass);
    execute(&orders, "INSERT INTO probe (n) VALUES (1)".into())
        .await
        .expect("the abandoned transaction's key is free");
    assert_eq!(
        count(&orders, "SELECT count(*) AS n FROM probe").await,
        1,
        "nothing of the abandoned transaction committed"
    );
}
