//! Deadlines on database calls, end to end: a call that gets no answer
//! fails at its deadline instead of hanging, is counted (stuck half way,
//! missed at the end), lets go of its connection, and what it was part of
//! is tried again; bad deadline settings are refused at start.
//!
//! On SQLite a handler that never finishes stands for a connection that
//! went quiet. The PostgreSQL tests (`postgres`) reach the server through
//! the fault proxy (`support::fault_proxy`) and blackhole it under a
//! running transaction or delivery; they read the server's own view of
//! the abandoned sessions straight from it, not through the proxy. The
//! MariaDB test (`mysql`) does the same under a transaction.

#[cfg(feature = "mysql")]
mod mysql;
#[cfg(feature = "postgres")]
mod postgres;

use crate::support::*;
use diesel_async::SimpleAsyncConnection;
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tickbox::testing::TestDatabases;
use tickbox::{
    Delivery, Envelope, Error, FailureKind, Handler, HandlerError, HandlerOptions, ModuleHandle,
    Sqlite, Tx,
};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How much later than its deadline a call may fail on a loaded machine.
const MARGIN: Duration = Duration::from_secs(2);

/// A handler whose first call writes its change row, says it is inside
/// ([`Stall::entered`]), waits for [`Stall::go`] and then runs one more
/// statement; later calls write their change row and succeed.
#[derive(Clone)]
pub(crate) struct Stall {
    /// Calls that reached the handler.
    pub(crate) calls: Arc<AtomicU32>,
    /// Notified once the first call is inside its transaction.
    entered: Arc<Notify>,
    /// Lets the first call go on; never notified, it waits forever.
    pub(crate) go: Arc<Notify>,
}

impl Stall {
    pub(crate) fn new() -> Self {
        Stall {
            calls: Arc::new(AtomicU32::new(0)),
            entered: Arc::new(Notify::new()),
            go: Arc::new(Notify::new()),
        }
    }

    /// Waits, at most [`WAIT`], until the first call is inside.
    pub(crate) async fn until_entered(&self) {
        tokio::time::timeout(WAIT, self.entered.notified())
            .await
            .expect("the first delivery reaches the handler");
    }
}

impl<B: TestBackend> Handler<B> for Stall {
    type Message = Ping;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        _message: Ping,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        write_change(tx, delivery).await?;
        if self.calls.fetch_add(1, SeqCst) == 0 {
            self.entered.notify_one();
            self.go.notified().await;
            tx.conn().batch_execute("SELECT 1").await?;
        }
        Ok(())
    }
}

#[actix::test]
async fn a_deadline_below_100_ms_is_refused_at_start_naming_the_setting() {
    trace_init();
    let dbs = TestDatabases::sqlite();
    let short = Duration::from_millis(99);
    let refused = [
        (
            "call deadline",
            dbs.module::<Sqlite>("calls").call_deadline(short),
        ),
        (
            "transaction deadline",
            dbs.module::<Sqlite>("transactions")
                .transaction_deadline(short),
        ),
        (
            "migration deadline",
            dbs.module::<Sqlite>("migrations")
                .migration_deadline(Duration::ZERO),
        ),
        (
            "handler `handlers.stall`",
            dbs.module::<Sqlite>("handlers").handler_with(
                "handlers.stall",
                Stall::new(),
                HandlerOptions::new().deadline(short),
            ),
        ),
    ];
    for (setting, builder) in refused {
        let error = builder.start().await.expect_err(setting);
        let Error::Config(reason) = &error else {
            panic!("{setting}: not a configuration error: {error:?}");
        };
        assert!(reason.contains(setting), "{setting}: {reason}");
        assert!(reason.contains("deadline"), "{setting}: {reason}");
        assert!(reason.contains("100ms"), "{setting}: {reason}");
    }

    // 100 ms itself is allowed. (A module without handlers makes no call
    // as it starts: a call deadline this short cannot cut one there.)
    let least = Duration::from_millis(100);
    let edge = dbs
        .module::<Sqlite>("edge")
        .call_deadline(least)
        .transaction_deadline(least)
        .start()
        .await;
    assert!(edge.is_ok(), "{:?}", edge.err());
    let edge = dbs
        .module::<Sqlite>("edge_handler")
        .handler_with(
            "edge.stall",
            Stall::new(),
            HandlerOptions::new().deadline(least),
        )
        .start()
        .await;
    assert!(edge.is_ok(), "{:?}", edge.err());
}

/// The warehouse module with the [`Stall`] handler `warehouse.stall`,
/// whose deliveries may take `deadline`.
async fn stalling_warehouse(
    dbs: &TestDatabases,
    stall: &Stall,
    deadline: Duration,
) -> ModuleHandle<Sqlite> {
    let warehouse = dbs
        .module::<Sqlite>("warehouse")
        .handler_with(
            "warehouse.stall",
            stall.clone(),
            HandlerOptions::new().deadline(deadline),
        )
        .metrics_interval(Duration::from_secs(3600))
        .start()
        .await
        .expect("warehouse starts");
    create_changes(&warehouse).await;
    warehouse
}

#[actix::test]
async fn a_handler_that_never_finishes_is_cut_at_its_deadline_and_lets_go_of_the_write_lock() {
    trace_init();
    const DEADLINE: Duration = Duration::from_secs(1);
    let dbs = TestDatabases::sqlite();
    let stall = Stall::new();
    let warehouse = stalling_warehouse(&dbs, &stall, DEADLINE).await;
    let envelope = Envelope::encode(&Ping { n: 1 }).expect("encodes");

    let started = Instant::now();
    let delivering = tokio::spawn({
        let (warehouse, envelope) = (warehouse.clone(), envelope.clone());
        async move {
            let ended = warehouse.deliver_to(envelope, "warehouse.stall").await;
            (ended, Instant::now())
        }
    });
    stall.until_entered().await;
    // A writer of the same module queues behind the delivery's write lock.
    let writing = tokio::spawn({
        let warehouse = warehouse.clone();
        async move {
            let written = execute(
                &warehouse,
                "INSERT INTO changes (handler, message_id, attempt) VALUES ('writer', '-', 0)"
                    .into(),
            )
            .await;
            (written, Instant::now())
        }
    });

    let (ended, cut_at) = tokio::time::timeout(DEADLINE + MARGIN + WAIT, delivering)
        .await
        .expect("the delivery ends")
        .expect("joined");
    let took = cut_at - started;
    assert!(
        took >= DEADLINE && took < DEADLINE + MARGIN,
        "the delivery was cut after {took:?}, its deadline is {DEADLINE:?}"
    );
    let failure = ended.expect_err("a delivery past its deadline fails");
    assert_eq!(failure.kind, FailureKind::Database, "{failure}");
    assert!(failure.transient, "{failure}");
    assert!(!failure.counts_as_attempt(), "{failure}");
    assert!(
        failure
            .reason
            .contains("a delivery had no answer within its deadline of 1s"),
        "{failure}"
    );

    let (written, written_at) = tokio::time::timeout(MARGIN, writing)
        .await
        .expect("the queued writer commits soon after the cut")
        .expect("joined");
    written.expect("the queued writer commits");
    let waited = written_at - started;
    assert!(
        waited >= DEADLINE,
        "the writer committed after {waited:?}, while the delivery still held the write lock"
    );

    // Rolled back: neither the inbox row nor the handler's change.
    assert_eq!(inbox_rows(&warehouse, "warehouse.stall").await, 0);
    assert_eq!(changes(&warehouse, "warehouse.stall").await, 0);
    assert_eq!(changes(&warehouse, "writer").await, 1);
    let calls = warehouse.metrics().database_calls;
    assert_eq!((calls.stuck, calls.deadlines_missed), (0, 1), "{calls:?}");

    // Delivered again, it is handled once.
    let again = warehouse.deliver_to(envelope, "warehouse.stall").await;
    assert_eq!(again, Ok(tickbox::Outcome::Handled));
    assert_eq!(inbox_rows(&warehouse, "warehouse.stall").await, 1);
    assert_eq!(changes(&warehouse, "warehouse.stall").await, 1);
    assert_eq!(stall.calls.load(SeqCst), 2);
}
