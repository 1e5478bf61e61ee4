//! The conformance suite: every test is written once, generic over the
//! backend, and run against SQLite and PostgreSQL (see `lib.rs`).

pub mod batches;
pub mod effects;
pub mod faults;
pub mod generic;
pub mod hostile;
pub mod kit;
pub mod observability;
pub mod ordering;
pub mod scheduled;
pub mod shared_outbox;
#[cfg(feature = "opentelemetry")]
pub mod trace_context;

use crate::support::*;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;
use tickbox::testing::Session;
use tickbox::{Bus, BusHandle, Envelope, Error, FailureKind, ModuleHandle, Outcome, RetryPolicy};

/// Retries quickly so failure tests finish fast.
pub(crate) fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        initial_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(100),
        ..RetryPolicy::default()
    }
}

/// A publisher module `orders` (publishes Ping) and a subscriber module
/// `warehouse` with one Record handler `warehouse.record`.
pub(crate) async fn pair<B: TestBackend>(
    db: &TestDb,
    handler: &Record,
) -> (ModuleHandle<B>, ModuleHandle<B>) {
    let orders = B::module(db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let warehouse = B::module(db, "warehouse")
        .handler("warehouse.record", record::<Ping>(handler))
        .start()
        .await
        .expect("warehouse starts");
    create_changes(&orders).await;
    create_changes(&warehouse).await;
    (orders, warehouse)
}

pub(crate) async fn bus<B: TestBackend>(db: &TestDb, modules: &[&ModuleHandle<B>]) -> BusHandle<B> {
    modules
        .iter()
        .fold(db.bus(), |b, m| b.module(m))
        .retry_policy(fast_retries())
        .scan_interval(Duration::from_millis(200))
        .start()
        .await
        .expect("bus starts")
}

/// Publishes `Ping { n }` from `orders` in its own transaction.
pub(crate) async fn publish<B: TestBackend>(orders: &ModuleHandle<B>, n: u64) -> uuid::Uuid {
    orders
        .transaction(async move |tx| tx.publish(&Ping { n }))
        .await
        .expect("publish commits")
}

pub(crate) async fn drained<B: TestBackend>(bus: &BusHandle<B>) {
    let idle = bus.wait_idle(WAIT).await.expect("wait_idle");
    assert!(idle, "the bus still had work after {WAIT:?}");
    assert_eq!(pending(bus).await, 0);
}

/// Undelivered messages over every outbox of the bus, read from the
/// databases.
pub(crate) async fn pending<B: TestBackend>(bus: &BusHandle<B>) -> i64 {
    let mut total = 0;
    for module in bus.modules() {
        total += module.store_stats().await.expect("stats").outbox_pending;
    }
    total
}

pub async fn rolled_back_publish_is_never_delivered_and_committed_one_is<B: TestBackend>(
    db: TestDb,
) {
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    let session = Session::start(&bus);

    let rolled_back: Result<(), Error> = orders
        .transaction(async move |tx| {
            tx.publish(&Ping { n: 1 })?;
            Err(Error::Config("the caller changed its mind".into()))
        })
        .await;
    assert!(rolled_back.is_err());
    publish(&orders, 2).await;

    let report = session.wait().await;
    assert_eq!(report.published::<Ping>().len(), 1, "{report}");
    assert_eq!(report.handled("warehouse.record").len(), 1, "{report}");
    drained(&bus).await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 1);
    assert_eq!(
        count(&orders, "SELECT count(*) AS n FROM tickbox_outbox").await,
        1,
        "only the committed message is in the outbox"
    );
    assert_eq!(
        handler.calls.load(SeqCst),
        1,
        "the rolled-back message never reached the handler"
    );
    bus.stop().await;

    // Closed, the module refuses new transactions with a clear error.
    orders.close();
    let closed: Result<(), Error> = orders.transaction(async move |_| Ok(())).await;
    assert!(matches!(closed, Err(Error::Pool { .. })), "{closed:?}");
}

pub async fn a_redelivered_message_is_skipped_and_counted<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let bus = db
        .bus()
        .module(&orders)
        .module(&warehouse)
        .duplicate_rate(1.0)
        .start()
        .await
        .expect("bus starts");
    for n in 0..5 {
        publish(&orders, n).await;
    }
    drained(&bus).await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 5);
    assert_eq!(
        handler.calls.load(SeqCst),
        5,
        "each message ran the handler once"
    );
    let metrics = warehouse.metrics();
    assert_eq!(metrics.handlers[0].handled, 5);
    assert_eq!(
        metrics.handlers[0].duplicates_skipped, 5,
        "every second delivery was skipped"
    );
    assert_eq!(bus.metrics().duplicates_injected, 5);
    bus.stop().await;
}

pub async fn concurrent_deliveries_of_one_message_commit_once<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed).holding(Duration::from_millis(50));
    let warehouse = B::module(&db, "warehouse")
        .pool_size(16)
        .handler("warehouse.record", record::<Ping>(&handler))
        .start()
        .await
        .expect("warehouse starts");
    create_changes(&warehouse).await;
    let envelope = Envelope::encode(&Ping { n: 1 }).expect("encodes");

    let deliveries = (0..16).map(|_| warehouse.deliver_to(envelope.clone(), "warehouse.record"));
    let outcomes = futures_util::future::join_all(deliveries).await;

    let handled = outcomes
        .iter()
        .filter(|o| **o == Ok(Outcome::Handled))
        .count();
    let duplicates = outcomes
        .iter()
        .filter(|o| **o == Ok(Outcome::Duplicate))
        .count();
    assert_eq!((handled, duplicates), (1, 15), "outcomes: {outcomes:?}");
    assert_eq!(changes(&warehouse, "warehouse.record").await, 1);
    assert_eq!(inbox_rows(&warehouse, "warehouse.record").await, 1);
}

async fn failing_handler_rolls_back_then_succeeds<B: TestBackend>(
    db: TestDb,
    then: Then,
    kind: FailureKind,
) {
    let handler = Record::new(then);
    let (orders, warehouse) = pair::<B>(&db, &handler).await;

    // Delivered directly: the failure is reported and nothing is left.
    let envelope = Envelope::encode(&Ping { n: 7 }).expect("encodes");
    let failed = warehouse
        .deliver_to(envelope, "warehouse.record")
        .await
        .expect_err("the first attempt fails");
    assert_eq!(failed.kind, kind, "{failed}");
    assert_eq!(
        changes(&warehouse, "warehouse.record").await,
        0,
        "the failed attempt's changes were rolled back"
    );
    assert_eq!(
        inbox_rows(&warehouse, "warehouse.record").await,
        0,
        "no inbox row for a failed attempt"
    );

    // Through the bus: retried until it succeeds, its changes committed once.
    let bus = bus(&db, &[&orders, &warehouse]).await;
    publish(&orders, 8).await;
    drained(&bus).await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 1);
    assert_eq!(inbox_rows(&warehouse, "warehouse.record").await, 1);
    let metrics = &warehouse.metrics().handlers[0];
    assert_eq!(metrics.failed, 3, "one direct and two bus attempts failed");
    assert_eq!(metrics.retried, 2, "the bus retried twice");
    assert_eq!(metrics.handled, 1);
    bus.stop().await;
}

pub async fn a_handler_error_rolls_back_and_is_retried<B: TestBackend>(db: TestDb) {
    failing_handler_rolls_back_then_succeeds::<B>(db, Then::FailFirst(3), FailureKind::Handler)
        .await;
}

pub async fn a_handler_panic_rolls_back_and_is_retried<B: TestBackend>(db: TestDb) {
    failing_handler_rolls_back_then_succeeds::<B>(db, Then::PanicFirst(3), FailureKind::Panic)
        .await;
}

pub async fn each_handler_ticks_its_own_inbox_row<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .handler("orders.audit", record::<Ping>(&handler))
        .start()
        .await
        .expect("orders starts");
    let warehouse = B::module(&db, "warehouse")
        .handler("warehouse.reserve", record::<Ping>(&handler))
        .handler("warehouse.forecast", record::<Ping>(&handler))
        .start()
        .await
        .expect("warehouse starts");
    create_changes(&orders).await;
    create_changes(&warehouse).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    let id = publish(&orders, 1).await;
    drained(&bus).await;

    for (module, name) in [
        (&orders, "orders.audit"),
        (&warehouse, "warehouse.reserve"),
        (&warehouse, "warehouse.forecast"),
    ] {
        assert_eq!(changes(module, name).await, 1, "{name}");
        assert_eq!(
            count(module, format!("SELECT count(*) AS n FROM changes WHERE handler = '{name}' AND message_id = '{id}'")).await,
            1,
            "{name} recorded the message id"
        );
        assert_eq!(inbox_rows(module, name).await, 1, "{name}");
    }
    bus.stop().await;
}

pub async fn a_message_published_by_a_handler_exists_only_if_it_commits<B: TestBackend>(
    db: TestDb,
) {
    // warehouse handles Ping, publishes Pong, and fails its first attempt
    // after publishing: that Pong must never exist.
    let reserve = Record::new(Then::FailFirst(1)).publishing_pong();
    let confirm = Record::new(Then::Succeed);
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .handler("orders.confirm", record::<Pong>(&confirm))
        .start()
        .await
        .expect("orders starts");
    let warehouse = B::module(&db, "warehouse")
        .publishes::<Pong>()
        .handler("warehouse.reserve", record::<Ping>(&reserve))
        .start()
        .await
        .expect("warehouse starts");
    create_changes(&orders).await;
    create_changes(&warehouse).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    let session = Session::start(&bus).allow_failures();
    let ping = publish(&orders, 1).await;

    let report = session.wait().await;
    assert_eq!(report.handled("orders.confirm").len(), 1, "{report}");
    assert_eq!(changes(&orders, "orders.confirm").await, 1);
    assert_eq!(
        report.published::<Pong>().len(),
        1,
        "the failed attempt's Pong never existed: {report}"
    );
    drained(&bus).await;
    assert_eq!(
        reserve.calls.load(SeqCst),
        2,
        "the first attempt failed, the second committed"
    );
    assert_eq!(
        count(&warehouse, "SELECT count(*) AS n FROM tickbox_outbox").await,
        1,
        "only the committed attempt's Pong exists"
    );
    assert_eq!(confirm.calls.load(SeqCst), 1);
    // The Pong is caused by the Ping and shares its correlation id.
    let ping_bytes = ping;
    let chained = count(
        &warehouse,
        match B::NAME {
            "postgres" => format!("SELECT count(*) AS n FROM tickbox_outbox WHERE causation_id = '{ping_bytes}' AND correlation_id = '{ping_bytes}'"),
            _ => format!("SELECT count(*) AS n FROM tickbox_outbox WHERE causation_id = x'{}' AND correlation_id = x'{}'", ping_bytes.simple(), ping_bytes.simple()),
        },
    )
    .await;
    assert_eq!(
        chained, 1,
        "the Pong's causation and correlation ids point at the Ping"
    );
    bus.stop().await;
}

pub async fn a_crash_between_handler_commit_and_outbox_mark_redelivers_without_applying_twice<
    B: TestBackend,
>(
    db: TestDb,
) {
    static BROKEN: AtomicBool = AtomicBool::new(true);
    BROKEN.store(true, SeqCst);
    let good = Record::new(Then::Succeed);
    let flaky = Record::new(Then::FailWhile(&BROKEN));
    let start_modules = async || {
        let orders = B::module(&db, "orders")
            .publishes::<Ping>()
            .start()
            .await
            .expect("orders starts");
        let warehouse = B::module(&db, "warehouse")
            .handler("warehouse.good", record::<Ping>(&good))
            .handler("warehouse.flaky", record::<Ping>(&flaky))
            .start()
            .await
            .expect("warehouse starts");
        (orders, warehouse)
    };

    // First life: `good` commits, `flaky` keeps failing, so the message is
    // never marked delivered. Then the process "crashes" (bus and modules go).
    let (orders, warehouse) = start_modules().await;
    create_changes(&orders).await;
    create_changes(&warehouse).await;
    let first = bus(&db, &[&orders, &warehouse]).await;
    publish(&orders, 1).await;
    eventually("good has committed and flaky has failed", WAIT, || async {
        changes(&warehouse, "warehouse.good").await == 1 && flaky.calls.load(SeqCst) >= 1
    })
    .await;
    first.stop().await;
    assert_eq!(
        orders.store_stats().await.expect("stats").outbox_pending,
        1,
        "still pending after the crash"
    );
    drop((first, orders, warehouse));

    // Second life on the same databases, flaky fixed: the message is
    // delivered again; good skips it, flaky handles it.
    BROKEN.store(false, SeqCst);
    let (orders, warehouse) = start_modules().await;
    let second = bus(&db, &[&orders, &warehouse]).await;
    drained(&second).await;
    assert_eq!(
        changes(&warehouse, "warehouse.good").await,
        1,
        "not applied twice"
    );
    assert_eq!(changes(&warehouse, "warehouse.flaky").await, 1);
    assert_eq!(good.calls.load(SeqCst), 1, "good did not run again");
    let handlers = warehouse.metrics().handlers;
    assert_eq!(
        handlers[0].duplicates_skipped, 1,
        "the redelivery to good was skipped"
    );
    assert_eq!(handlers[1].handled, 1);
    second.stop().await;
}

pub async fn configuration_mistakes_fail_at_start_with_clear_errors<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);

    let duplicate = B::module(&db, "dup")
        .handler("same", record::<Ping>(&handler))
        .handler("same", record::<Pong>(&handler))
        .start()
        .await
        .expect_err("two handlers with one name");
    assert!(
        matches!(duplicate, Error::DuplicateHandler { .. }),
        "{duplicate}"
    );
    assert!(
        duplicate.to_string().contains("two handlers named `same`"),
        "{duplicate}"
    );

    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders");
    let listener = B::module(&db, "listener")
        .handler("listener.pong", record::<Pong>(&handler))
        .start()
        .await
        .expect("listener");
    let unsubscribable = Bus::builder()
        .module(&orders)
        .module(&listener)
        .start()
        .await
        .err()
        .expect("nobody publishes Pong");
    assert!(
        matches!(unsubscribable, Error::UnsubscribableTopic { .. }),
        "{unsubscribable}"
    );
    assert!(
        unsubscribable.to_string().contains("test.pong"),
        "{unsubscribable}"
    );

    let undeclared: Result<_, Error> = orders
        .transaction(async move |tx| tx.publish(&Pong { n: 1 }))
        .await;
    let undeclared = undeclared.expect_err("orders does not publish Pong");
    assert!(
        matches!(undeclared, Error::UnknownTopic { .. }),
        "{undeclared}"
    );

    let big = B::module(&db, "big")
        .publishes::<Ping>()
        .max_payload_bytes(4)
        .start()
        .await
        .expect("big");
    let too_large: Result<_, Error> = big
        .transaction(async move |tx| tx.publish(&Ping { n: 12345 }))
        .await;
    assert!(matches!(
        too_large.expect_err("over the limit"),
        Error::PayloadTooLarge { .. }
    ));

    let bad_rate = Bus::builder()
        .module(&big)
        .duplicate_rate(1.5)
        .start()
        .await
        .err()
        .expect("bad rate");
    assert!(
        bad_rate.to_string().contains("duplicate_rate"),
        "{bad_rate}"
    );

    let late_marks = Bus::builder()
        .module(&big)
        .mark_linger(Duration::from_secs(60))
        .stalled_after(Duration::from_secs(30))
        .start()
        .await
        .err()
        .expect("marks later than the watchdog's threshold");
    assert!(
        late_marks
            .to_string()
            .contains("mark_linger (60s) must be shorter than stalled_after (30s)"),
        "{late_marks}"
    );

    let zero_pool = B::module(&db, "zero")
        .pool_size(0)
        .start()
        .await
        .expect_err("zero pool");
    assert!(zero_pool.to_string().contains("pool_size"), "{zero_pool}");
}

pub async fn a_read_only_transaction_reads_without_blocking_and_cannot_publish<B: TestBackend>(
    db: TestDb,
) {
    let handler = Record::new(Then::Succeed);
    let (orders, _warehouse) = pair::<B>(&db, &handler).await;
    publish(&orders, 1).await;

    // A writer holds its transaction open; a reader does not wait for it.
    let writer = hold_writer(&orders, 2).await;
    let seen = tokio::time::timeout(
        WAIT,
        orders.read(async move |tx| {
            Ok::<_, Error>(
                B::count(tx.conn(), "SELECT count(*) AS n FROM tickbox_outbox".into()).await?,
            )
        }),
    )
    .await
    .expect("the reader did not wait for the writer")
    .expect("read");
    assert_eq!(seen, 1, "the reader sees only committed messages");
    writer.commit().await;

    let refused: Result<_, Error> = orders
        .read(async move |tx| tx.publish(&Ping { n: 3 }))
        .await;
    let refused = refused.expect_err("read-only");
    assert!(matches!(refused, Error::ReadOnly { .. }), "{refused}");
    assert_eq!(
        count(&orders, "SELECT count(*) AS n FROM tickbox_outbox").await,
        2
    );
}

/// A module is on one bus at a time: refused by a second bus while the first
/// runs (which leaves the second's other modules free), it joins a new bus
/// once the first stopped, and what was committed in between is delivered.
pub async fn the_modules_of_a_stopped_bus_join_a_new_one<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let first = bus(&db, &[&orders, &warehouse]).await;
    publish(&orders, 1).await;
    drained(&first).await;

    let lone = B::module(&db, "lone").start().await.expect("lone starts");
    let refused = Bus::builder()
        .module(&lone)
        .module(&orders)
        .start()
        .await
        .err()
        .expect("orders is on a running bus");
    assert!(matches!(refused, Error::AlreadyAttached(_)), "{refused}");
    assert!(refused.to_string().contains("orders"), "{refused}");
    let lone_bus = bus(&db, &[&lone]).await;
    lone_bus.stop().await;

    first.stop().await;
    publish(&orders, 2).await;
    let second = bus(&db, &[&orders, &warehouse]).await;
    publish(&orders, 3).await;
    drained(&second).await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 3);
    second.stop().await;
}
