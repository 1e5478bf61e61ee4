//! PostgreSQL only: commits made where no bus delivers the module's outbox
//! wake the buses that do, through LISTEN/NOTIFY, instead of waiting for
//! their periodic scan. SQLite has no notifications, so these tests have no
//! SQLite twin in the conformance suite.
//!
//! "Another process" is played by a second handle of the same module
//! database that joins no bus: its rows are written unclaimed, exactly as a
//! worker or a command-line tool in another process writes them. Every bus
//! here scans only once a minute, so a message arriving within a few
//! seconds arrived because a notification woke the bus.

use crate::suite::{drained, pair, publish};
use crate::support::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use futures_util::StreamExt;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;
use tickbox::{Bus, BusHandle, Error, ModuleHandle, Postgres};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Far longer than any wait below: a message delivered in time was not
/// found by a periodic scan.
const SWEEP: Duration = Duration::from_secs(60);

/// How long a woken bus may take to deliver.
const PROMPTLY: Duration = Duration::from_secs(5);

fn pg_url() -> String {
    std::env::var("TICKBOX_PG_URL").expect(
        "the PostgreSQL tests need TICKBOX_PG_URL, e.g. postgres://postgres@127.0.0.1:5432/test",
    )
}

/// A bus over `orders` and `warehouse` that scans only once a minute.
async fn slow_scanning_bus(
    orders: &ModuleHandle<Postgres>,
    warehouse: &ModuleHandle<Postgres>,
) -> BusHandle<Postgres> {
    Bus::builder()
        .module(orders)
        .module(warehouse)
        .retry_policy(crate::suite::fast_retries())
        .scan_interval(SWEEP)
        .start()
        .await
        .expect("bus starts")
}

/// A second handle of the `orders` module database that joins no bus, as
/// another process would have.
async fn orders_elsewhere(db: &TestDb) -> ModuleHandle<Postgres> {
    <Postgres as TestBackend>::module(db, "orders")
        .publishes::<Ping>()
        .pool_size(2)
        .start()
        .await
        .expect("a second handle of orders starts")
}

fn wakeup_channel(module: &ModuleHandle<Postgres>) -> String {
    module
        .wakeup_channel()
        .expect("a PostgreSQL module has a wake-up channel")
        .to_string()
}

/// The statement a bus's listener ran last, as `pg_stat_activity` shows it.
fn listen_statement(module: &ModuleHandle<Postgres>) -> String {
    format!("LISTEN \"{}\"", wakeup_channel(module).replace('"', "\"\""))
}

/// Server processes idle after listening on the module's channel.
async fn listeners(module: &ModuleHandle<Postgres>) -> i64 {
    count(
        module,
        format!(
            "SELECT count(*) AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'idle' AND query = '{}'",
            listen_statement(module).replace('\'', "''")
        ),
    )
    .await
}

/// The server process id of the connection listening on the module's
/// channel (0 if none).
async fn listener_pid(module: &ModuleHandle<Postgres>) -> i64 {
    count(
        module,
        format!(
            "SELECT coalesce(max(pid), 0)::bigint AS n FROM pg_stat_activity \
             WHERE datname = current_database() AND state = 'idle' AND query = '{}'",
            listen_statement(module).replace('\'', "''")
        ),
    )
    .await
}

/// Waits until a bus listens on the module's channel.
async fn until_listening(module: &ModuleHandle<Postgres>) {
    eventually("a bus listens on the outbox's channel", WAIT, || async {
        listeners(module).await == 1
    })
    .await;
}

/// Publishes Ping { n } through `elsewhere` and waits, at most
/// [`PROMPTLY`], until the warehouse has handled `handled` messages.
async fn delivered_promptly(
    elsewhere: &ModuleHandle<Postgres>,
    warehouse: &ModuleHandle<Postgres>,
    n: u64,
    handled: i64,
) {
    publish(elsewhere, n).await;
    eventually(
        &format!("message {n}, committed where no bus runs, is delivered at once"),
        PROMPTLY,
        || async { changes(warehouse, "warehouse.record").await == handled },
    )
    .await;
}

/// A LISTEN of the test's own on a channel, collecting the payloads of the
/// notifications in the order they arrive (PostgreSQL sends them in commit
/// order).
struct Listener {
    channel: String,
    payloads: mpsc::UnboundedReceiver<String>,
    task: JoinHandle<()>,
}

impl Listener {
    async fn on(channel: String) -> Self {
        let mut conn = AsyncPgConnection::establish(&pg_url())
            .await
            .expect("the test's listening connection");
        conn.batch_execute(&format!("LISTEN \"{}\"", channel.replace('"', "\"\"")))
            .await
            .expect("LISTEN");
        let (sender, payloads) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            let mut notifications = std::pin::pin!(conn.notifications_stream());
            while let Some(Ok(notification)) = notifications.next().await {
                if sender.send(notification.payload).is_err() {
                    break;
                }
            }
        });
        Listener {
            channel,
            payloads,
            task,
        }
    }

    /// Sends a notification with payload `sentinel` from a transaction of
    /// `module` and returns the payloads that arrived before it: every
    /// notification of the transactions that committed earlier.
    async fn before_sentinel(
        &mut self,
        module: &ModuleHandle<Postgres>,
        sentinel: &str,
    ) -> Vec<String> {
        use diesel_async::RunQueryDsl;
        let (channel, payload) = (self.channel.clone(), sentinel.to_string());
        module
            .transaction(async move |tx| {
                diesel::sql_query("SELECT pg_notify($1, $2)")
                    .bind::<diesel::sql_types::Text, _>(channel)
                    .bind::<diesel::sql_types::Text, _>(payload)
                    .execute(tx.conn())
                    .await?;
                Ok::<_, Error>(())
            })
            .await
            .expect("the sentinel is sent");
        let mut before = Vec::new();
        loop {
            match tokio::time::timeout(WAIT, self.payloads.recv()).await {
                Ok(Some(payload)) if payload == sentinel => return before,
                Ok(Some(payload)) => before.push(payload),
                Ok(None) => panic!("the test's listening connection closed"),
                Err(_) => panic!("the sentinel `{sentinel}` did not arrive within {WAIT:?}"),
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[actix::test]
async fn a_commit_where_no_bus_runs_wakes_the_bus_at_once() {
    trace_init();
    let db = TestDb::postgres();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Postgres>(&db, &handler).await;
    let bus = slow_scanning_bus(&orders, &warehouse).await;
    let elsewhere = orders_elsewhere(&db).await;
    assert_eq!(orders.wakeup_channel(), elsewhere.wakeup_channel());
    until_listening(&orders).await;

    // The first may still meet the scan the listener asks for once it
    // listens; the next ones only a notification can bring before a minute.
    for n in 1..=3 {
        delivered_promptly(&elsewhere, &warehouse, n, n as i64).await;
    }
    drained(&bus).await;
    assert_eq!(handler.calls.load(SeqCst), 3, "each once");

    bus.stop().await;
    eventually(
        "the listener's connection closes with the bus",
        WAIT,
        || async { listeners(&orders).await == 0 },
    )
    .await;
}

#[actix::test]
async fn a_rolled_back_publish_notifies_nobody_and_a_commit_notifies_once() {
    trace_init();
    let db = TestDb::postgres();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Postgres>(&db, &handler).await;
    let bus = slow_scanning_bus(&orders, &warehouse).await;
    let elsewhere = orders_elsewhere(&db).await;
    let mut listener = Listener::on(wakeup_channel(&orders)).await;

    let rolled_back: Result<(), Error> = elsewhere
        .transaction(async move |tx| {
            tx.publish(&Ping { n: 1 })?;
            Err(Error::Config("the caller changed its mind".into()))
        })
        .await;
    assert!(rolled_back.is_err());
    assert_eq!(
        listener.before_sentinel(&elsewhere, "after rollback").await,
        Vec::<String>::new(),
        "a transaction that rolls back notifies nobody"
    );

    // Three messages, one transaction: one notification, empty.
    elsewhere
        .transaction(async move |tx| {
            for n in 2..5 {
                tx.publish(&Ping { n })?;
            }
            Ok::<_, Error>(())
        })
        .await
        .expect("publish commits");
    assert_eq!(
        listener.before_sentinel(&elsewhere, "after commit").await,
        vec![String::new()],
        "a commit notifies once, whatever it published"
    );

    eventually("the committed messages are handled", PROMPTLY, || async {
        changes(&warehouse, "warehouse.record").await == 3
    })
    .await;
    drained(&bus).await;
    assert_eq!(
        count(&orders, "SELECT count(*) AS n FROM tickbox_outbox").await,
        3,
        "the rolled-back message does not exist"
    );
    assert_eq!(handler.calls.load(SeqCst), 3, "only committed messages ran");
    bus.stop().await;
}

#[actix::test]
async fn a_module_on_a_bus_commits_without_notifying() {
    trace_init();
    let db = TestDb::postgres();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Postgres>(&db, &handler).await;
    let bus = slow_scanning_bus(&orders, &warehouse).await;
    let mut listener = Listener::on(wakeup_channel(&orders)).await;

    // Claimed by its own bus and announced in memory: nobody is notified.
    for n in 0..5 {
        publish(&orders, n).await;
    }
    drained(&bus).await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 5);
    assert_eq!(
        listener
            .before_sentinel(&orders, "after claimed commits")
            .await,
        Vec::<String>::new(),
        "commits of a module on a bus send no notification"
    );

    // The same database through a handle without a bus does notify.
    let elsewhere = orders_elsewhere(&db).await;
    publish(&elsewhere, 5).await;
    assert_eq!(
        listener
            .before_sentinel(&orders, "after unclaimed commit")
            .await,
        vec![String::new()]
    );
    drained(&bus).await;
    bus.stop().await;
}

#[actix::test]
async fn the_listener_reconnects_when_its_connection_is_killed() {
    trace_init();
    let db = TestDb::postgres();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Postgres>(&db, &handler).await;
    let bus = slow_scanning_bus(&orders, &warehouse).await;
    let elsewhere = orders_elsewhere(&db).await;
    until_listening(&orders).await;
    delivered_promptly(&elsewhere, &warehouse, 1, 1).await;

    let killed = listener_pid(&orders).await;
    assert_ne!(killed, 0);
    let terminated = count(
        &orders,
        format!("SELECT count(*) AS n FROM (SELECT pg_terminate_backend({killed}) AS done) t WHERE done"),
    )
    .await;
    assert!(
        terminated > 0,
        "the bus's listening connection is terminated"
    );
    eventually("the listener reconnects", WAIT, || async {
        let pid = listener_pid(&orders).await;
        pid != 0 && pid != killed
    })
    .await;

    // Listening again: the first may meet the scan it asks for after
    // reconnecting, the next only a notification brings.
    delivered_promptly(&elsewhere, &warehouse, 2, 2).await;
    delivered_promptly(&elsewhere, &warehouse, 3, 3).await;
    drained(&bus).await;
    bus.stop().await;
}

#[actix::test]
async fn a_requeued_dead_letter_wakes_the_bus_at_once() {
    trace_init();
    static POISON: AtomicBool = AtomicBool::new(true);
    let db = TestDb::postgres();
    let handler = Record::new(Then::FailFor {
        n: 7,
        switch: &POISON,
        permanent: true,
    });
    let (orders, warehouse) = pair::<Postgres>(&db, &handler).await;
    let bus = slow_scanning_bus(&orders, &warehouse).await;
    let id = publish(&orders, 7).await;
    drained(&bus).await;
    let dead = warehouse.dead_letters(0, 10).await.expect("dead letters");
    assert_eq!(dead.len(), 1);
    until_listening(&warehouse).await;

    // Requeued through the module on the bus itself: the row goes back
    // unclaimed and unannounced, so only a scan finds it, and the commit
    // asks for one.
    POISON.store(false, SeqCst);
    warehouse
        .requeue_dead_letter(id, "warehouse.record")
        .await
        .expect("requeue");
    eventually(
        "the requeued message is handled at once",
        PROMPTLY,
        || async { changes(&warehouse, "warehouse.record").await == 1 },
    )
    .await;
    drained(&bus).await;
    assert!(warehouse
        .dead_letters(0, 10)
        .await
        .expect("dead letters")
        .is_empty());
    bus.stop().await;
}

#[actix::test]
async fn a_module_whose_bus_stopped_hands_its_commits_to_another_process_at_once() {
    trace_init();
    let db = TestDb::postgres();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Postgres>(&db, &handler).await;
    let stopped = slow_scanning_bus(&orders, &warehouse).await;
    stopped.stop().await;

    // Another process takes over both modules with a bus of its own.
    let orders_there = orders_elsewhere(&db).await;
    let warehouse_there = <Postgres as TestBackend>::module(&db, "warehouse")
        .handler("warehouse.record", record::<Ping>(&handler))
        .pool_size(2)
        .start()
        .await
        .expect("a second handle of warehouse starts");
    let bus = slow_scanning_bus(&orders_there, &warehouse_there).await;
    until_listening(&orders).await;

    // The first handle's bus stopped: its commits are no longer written
    // claimed by that bus (which would keep them from the other process for
    // a lease) but unclaimed, with a notification.
    for n in 1..=2 {
        delivered_promptly(&orders, &warehouse, n, n as i64).await;
    }
    drained(&bus).await;
    assert_eq!(handler.calls.load(SeqCst), 2, "each once");
    bus.stop().await;
}
