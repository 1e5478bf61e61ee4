//! Faults inside one process: poison messages and dead letters, retention,
//! shutdown with deliveries in flight, bad input, claims and takeover.

use super::{bus, drained, fast_retries, pair, publish};
use crate::support::*;
use diesel_async::SimpleAsyncConnection;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::{Duration, Instant};
use tickbox::{Bus, Error, Outcome, Replayed, Retention, RetryPolicy};

pub async fn a_poison_message_is_dead_lettered_while_others_flow_and_replayed_once<
    B: TestBackend,
>(
    db: TestDb,
) {
    static POISONED: AtomicBool = AtomicBool::new(true);
    POISONED.store(true, SeqCst);
    let handler = Record::new(Then::FailFor {
        n: 13,
        switch: &POISONED,
        permanent: false,
    });
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let bus = db
        .bus()
        .module(&orders)
        .module(&warehouse)
        .retry_policy(RetryPolicy {
            max_attempts: Some(3),
            ..fast_retries()
        })
        .start()
        .await
        .expect("bus starts");
    let mut poison = None;
    for n in 10..30 {
        let id = publish(&orders, n).await;
        if n == 13 {
            poison = Some(id);
        }
    }
    let poison = poison.expect("published");
    drained(&bus).await;

    assert_eq!(
        changes(&warehouse, "warehouse.record").await,
        19,
        "every other message was handled"
    );
    let dead = warehouse.dead_letters(0, 10).await.expect("dead letters");
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(
        (
            dead[0].message_id,
            dead[0].handler.as_str(),
            dead[0].attempts
        ),
        (poison, "warehouse.record", 3)
    );
    assert!(
        dead[0].reason.contains("message 13 is poison"),
        "{}",
        dead[0].reason
    );
    assert_eq!(warehouse.metrics().handlers[0].dead_lettered, 1);
    assert_eq!(
        warehouse.store_stats().await.expect("stats").dead_letters,
        1
    );

    POISONED.store(false, SeqCst);
    let replayed = warehouse
        .replay_dead_letter(poison, "warehouse.record")
        .await
        .expect("replay");
    assert_eq!(replayed, Replayed::Delivered(Outcome::Handled));
    assert_eq!(changes(&warehouse, "warehouse.record").await, 20);
    assert!(warehouse
        .dead_letters(0, 10)
        .await
        .expect("dead letters")
        .is_empty());
    let again = warehouse
        .replay_dead_letter(poison, "warehouse.record")
        .await
        .expect_err("gone");
    assert!(matches!(again, Error::NoSuchDeadLetter { .. }), "{again}");
    assert_eq!(
        changes(&warehouse, "warehouse.record").await,
        20,
        "handled exactly once"
    );
    bus.stop().await;
}

pub async fn a_permanent_error_dead_letters_at_once_and_can_be_discarded<B: TestBackend>(
    db: TestDb,
) {
    static ON: AtomicBool = AtomicBool::new(true);
    ON.store(true, SeqCst);
    let handler = Record::new(Then::FailFor {
        n: 5,
        switch: &ON,
        permanent: true,
    });
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    let id = publish(&orders, 5).await;
    drained(&bus).await;
    let dead = warehouse.dead_letters(0, 10).await.expect("dead letters");
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].attempts, 1, "a permanent error is not retried");
    assert_eq!(handler.calls.load(SeqCst), 1);
    assert!(warehouse
        .discard_dead_letter(id, "warehouse.record")
        .await
        .expect("discard"));
    assert!(!warehouse
        .discard_dead_letter(id, "warehouse.record")
        .await
        .expect("discard"));
    assert_eq!(changes(&warehouse, "warehouse.record").await, 0);
    bus.stop().await;
}

pub async fn bad_rows_become_dead_letters_and_nothing_else_is_lost<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let old = micros_ago(Duration::from_secs(60));

    // Written by hand: a topic nobody declares, and a payload that is not a Ping.
    let unknown = uuid_ago(Duration::from_secs(60));
    insert_outbox_row(&orders, unknown, "test.nobody", "{}", old)
        .await
        .expect("insert");
    let garbled = uuid_ago(Duration::from_secs(59));
    insert_outbox_row(&orders, garbled, "test.ping", "not json", old)
        .await
        .expect("insert");
    // An id that is not a UUID is refused by the table itself (longer than
    // 16 bytes: MySQL's BINARY(16) pads a shorter value into an id).
    let refused = execute(
        &orders,
        format!("INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, created_at_us) VALUES ('garbage-not-a-uuid', 'test.ping', '{{}}', 'garbage-not-a-uuid', {old})"),
    )
    .await
    .expect_err("a malformed id");
    assert!(
        refused
            .to_string()
            .to_lowercase()
            .contains("check constraint")
            || refused.to_string().contains("uuid")
            || refused
                .to_string()
                .contains("Data too long for column 'id'"),
        "{refused}"
    );

    let bus = bus(&db, &[&orders, &warehouse]).await;
    for n in 0..5 {
        publish(&orders, n).await;
    }
    drained(&bus).await;
    assert_eq!(
        changes(&warehouse, "warehouse.record").await,
        5,
        "good messages all handled"
    );

    let at_source = orders.dead_letters(0, 10).await.expect("dead letters");
    assert_eq!(at_source.len(), 1, "{at_source:?}");
    assert_eq!(
        (at_source[0].message_id, at_source[0].handler.as_str()),
        (unknown, "")
    );
    assert!(
        at_source[0].reason.contains("unknown topic `test.nobody`"),
        "{}",
        at_source[0].reason
    );

    let at_handler = warehouse.dead_letters(0, 10).await.expect("dead letters");
    assert_eq!(at_handler.len(), 1, "{at_handler:?}");
    assert_eq!(at_handler[0].message_id, garbled);
    assert!(
        at_handler[0].reason.contains("does not decode"),
        "{}",
        at_handler[0].reason
    );
    assert_eq!(
        at_handler[0].attempts, 1,
        "an undecodable payload is not retried"
    );

    // Replaying the unknown topic puts it back in the outbox; still unknown,
    // it is dead-lettered again rather than lost.
    let replayed = orders
        .replay_dead_letter(unknown, "")
        .await
        .expect("replay");
    assert_eq!(replayed, Replayed::Requeued);
    eventually(
        "the requeued message is dead-lettered again",
        WAIT,
        || async {
            orders
                .dead_letters(0, 10)
                .await
                .expect("dead letters")
                .len()
                == 1
                && orders.store_stats().await.expect("stats").outbox_pending == 0
        },
    )
    .await;
    bus.stop().await;
}

pub async fn retention_sweeps_old_rows_and_keeps_recent_duplicates_out<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let hour = Duration::from_secs(3600);
    let retention = Retention {
        inbox: Some(hour),
        outbox: Some(hour),
        interval: Duration::from_secs(60),
    };
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .retention(retention.clone())
        .start()
        .await
        .expect("orders");
    let warehouse = B::module(&db, "warehouse")
        .retention(retention.clone())
        .handler("warehouse.record", record::<Ping>(&handler))
        .start()
        .await
        .expect("warehouse");
    create_changes(&warehouse).await;

    // Two hours old: an inbox row and a delivered outbox row.
    let old = uuid_ago(2 * hour);
    let old_us = micros_ago(2 * hour);
    execute(
        &warehouse,
        format!("INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) VALUES ({}, 'warehouse.record', {old_us})", uuid_literal::<B>(old)),
    )
    .await
    .expect("old inbox row");
    insert_outbox_row(&orders, old, "test.ping", "{\"n\":1}", old_us)
        .await
        .expect("old outbox row");
    execute(
        &orders,
        format!("UPDATE tickbox_outbox SET delivered_at_us = {old_us}"),
    )
    .await
    .expect("delivered");
    // A pending row as old is never swept.
    let pending = uuid_ago(2 * hour);
    insert_outbox_row(&orders, pending, "test.ping", "{\"n\":2}", old_us)
        .await
        .expect("old pending row");

    // A recent message, handled now.
    let recent = tickbox::Envelope::encode(&Ping { n: 3 }).expect("encodes");
    assert_eq!(
        warehouse
            .deliver_to(recent.clone(), "warehouse.record")
            .await,
        Ok(Outcome::Handled)
    );

    let swept = warehouse.sweep_retention().await.expect("sweep");
    assert_eq!((swept.inbox_rows, swept.outbox_rows), (1, 0));
    let swept = orders.sweep_retention().await.expect("sweep");
    assert_eq!((swept.inbox_rows, swept.outbox_rows), (0, 1));
    assert_eq!(
        orders.store_stats().await.expect("stats").outbox_pending,
        1,
        "the pending row stays"
    );
    assert_eq!(
        inbox_rows(&warehouse, "warehouse.record").await,
        1,
        "the recent row stays"
    );
    assert_eq!(
        warehouse.deliver_to(recent, "warehouse.record").await,
        Ok(Outcome::Duplicate),
        "a recent duplicate is still skipped"
    );

    // A window shorter than the retries' horizon is refused at start.
    let short = B::module(&db, "short")
        .retention(Retention {
            inbox: Some(Duration::from_secs(1)),
            ..Retention::default()
        })
        .handler("short.record", record::<Ping>(&handler))
        .start()
        .await
        .expect("module starts");
    let refused = Bus::builder()
        .module(&orders)
        .module(&short)
        .start()
        .await
        .err()
        .expect("too short");
    assert!(
        matches!(refused, Error::RetentionTooShort { .. }),
        "{refused}"
    );
    assert!(refused.to_string().contains("short.record"), "{refused}");
    let unbounded = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .retry_policy(RetryPolicy {
            max_attempts: None,
            ..RetryPolicy::default()
        })
        .start()
        .await
        .err()
        .expect("unbounded retries with a window");
    assert!(unbounded.to_string().contains("unbounded"), "{unbounded}");
}

pub async fn stopping_with_deliveries_in_flight_loses_and_doubles_nothing<B: TestBackend>(
    db: TestDb,
) {
    let handler = Record::new(Then::Succeed).holding(Duration::from_millis(200));
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let first = db
        .bus()
        .module(&orders)
        .module(&warehouse)
        .max_concurrent_deliveries(2)
        .start()
        .await
        .expect("bus starts");
    for n in 0..20 {
        publish(&orders, n).await;
    }
    eventually("some deliveries are done", WAIT, || async {
        handler.calls.load(SeqCst) >= 2
    })
    .await;
    first.stop().await;
    assert_eq!(
        warehouse.metrics().mailbox_in_flight,
        0,
        "running deliveries finished before stop returned"
    );
    let handled_before = changes(&warehouse, "warehouse.record").await;
    assert!(
        handled_before < 20,
        "the stop came mid-way ({handled_before} handled)"
    );
    // In this process's bus, the unhandled messages stay pending in the
    // outbox; over a broker they were published, and wait in the queue.
    if !db.over_broker() {
        let pending = orders.store_stats().await.expect("stats").outbox_pending;
        assert!(
            pending >= 20 - handled_before,
            "unhandled messages stay pending"
        );
    }
    drop(first);

    let (orders, warehouse) = (orders.clone(), warehouse.clone());
    let restarted_orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders");
    let restarted_warehouse = B::module(&db, "warehouse")
        .handler("warehouse.record", record::<Ping>(&handler))
        .start()
        .await
        .expect("warehouse");
    drop((orders, warehouse));
    let second = bus(&db, &[&restarted_orders, &restarted_warehouse]).await;
    drained(&second).await;
    assert_eq!(
        changes(&restarted_warehouse, "warehouse.record").await,
        20,
        "none lost"
    );
    assert_eq!(
        count(&restarted_warehouse, "SELECT count(*) AS n FROM (SELECT message_id FROM changes GROUP BY message_id HAVING count(*) > 1) doubled").await,
        0,
        "none doubled"
    );
    assert_eq!(handler.calls.load(SeqCst), 20);
    second.stop().await;
}

pub async fn a_dead_process_claims_are_taken_over_when_they_expire<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    // A row claimed by a bus that died, its lease running 1.5 s more.
    let id = uuid_ago(Duration::from_secs(60));
    insert_outbox_row(
        &orders,
        id,
        "test.ping",
        "{\"n\":1}",
        micros_ago(Duration::from_secs(60)),
    )
    .await
    .expect("insert");
    let dead_bus = uuid_literal::<B>(uuid::Uuid::now_v7());
    let until = micros_ago(Duration::ZERO) + 1_500_000;
    execute(
        &orders,
        format!("UPDATE tickbox_outbox SET claimed_by = {dead_bus}, claimed_until_us = {until}"),
    )
    .await
    .expect("claim");

    let started = Instant::now();
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .claim_lease(Duration::from_millis(500))
        .scan_interval(Duration::from_millis(100))
        .start()
        .await
        .expect("bus starts");
    eventually("the expired claim is taken over", WAIT, || async {
        changes(&warehouse, "warehouse.record").await == 1
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(1400),
        "not before the claim expired ({:?})",
        started.elapsed()
    );
    drained(&bus).await;
    bus.stop().await;
}

pub async fn two_buses_on_one_set_of_databases_handle_each_message_once<B: TestBackend>(
    db: TestDb,
) {
    let handler = Record::new(Then::Succeed).holding(Duration::from_millis(5));
    let start = async || {
        let orders = B::module(&db, "orders")
            .publishes::<Ping>()
            .start()
            .await
            .expect("orders");
        let warehouse = B::module(&db, "warehouse")
            .handler("warehouse.record", record::<Ping>(&handler))
            .start()
            .await
            .expect("warehouse");
        let bus = Bus::builder()
            .module(&orders)
            .module(&warehouse)
            .claim_lease(Duration::from_millis(500))
            .scan_interval(Duration::from_millis(100))
            .max_concurrent_deliveries(4)
            .start()
            .await
            .expect("bus starts");
        (orders, warehouse, bus)
    };
    let (orders_a, warehouse_a, bus_a) = start().await;
    create_changes(&warehouse_a).await;
    let (orders_b, _warehouse_b, bus_b) = start().await;
    for n in 0..40 {
        publish(&orders_a, n).await;
        publish(&orders_b, 100 + n).await;
    }
    // Process A stops half-way: what it leaves is released and process B
    // takes it over.
    bus_a.stop().await;
    drained(&bus_b).await;
    assert_eq!(changes(&warehouse_a, "warehouse.record").await, 80);
    assert_eq!(
        count(&warehouse_a, "SELECT count(*) AS n FROM (SELECT message_id FROM changes GROUP BY message_id HAVING count(*) > 1) doubled").await,
        0,
        "each message handled once"
    );
    assert_eq!(inbox_rows(&warehouse_a, "warehouse.record").await, 80);
    drop(orders_b);
    bus_b.stop().await;
}

pub async fn messages_beyond_the_announcement_queue_are_delivered_without_waiting_for_a_lease<
    B: TestBackend,
>(
    db: TestDb,
) {
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    // Few messages in memory and a long lease: the 4,096-message queue of
    // announcements overflows, and rows claimed for this bus at commit must
    // be found by its own scan, not after the lease.
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .max_messages_in_memory(16)
        .claim_lease(Duration::from_secs(120))
        .scan_interval(Duration::from_millis(200))
        .start()
        .await
        .expect("bus starts");
    for batch in 0..45u64 {
        orders
            .transaction(async move |tx| {
                for n in 0..100 {
                    tx.publish(&Ping { n: batch * 100 + n })?;
                }
                Ok::<_, Error>(())
            })
            .await
            .expect("publish");
    }
    let idle = bus
        .wait_idle(Duration::from_secs(60))
        .await
        .expect("wait_idle");
    assert!(idle, "4,500 messages were not all delivered");
    assert_eq!(changes(&warehouse, "warehouse.record").await, 4500);
    assert_eq!(handler.calls.load(SeqCst), 4500, "each once");
    bus.stop().await;
}

pub async fn an_outbox_retention_of_zero_deletes_rows_as_they_are_delivered<B: TestBackend>(
    db: TestDb,
) {
    let handler = Record::new(Then::Succeed);
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .retention(Retention {
            outbox: Some(Duration::ZERO),
            ..Retention::default()
        })
        .start()
        .await
        .expect("orders");
    let warehouse = B::module(&db, "warehouse")
        .handler("warehouse.record", record::<Ping>(&handler))
        .start()
        .await
        .expect("warehouse");
    create_changes(&warehouse).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    for n in 0..5 {
        publish(&orders, n).await;
    }
    drained(&bus).await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 5);
    assert_eq!(
        count(&orders, "SELECT count(*) AS n FROM tickbox_outbox").await,
        0,
        "delivered rows are deleted, not kept"
    );
    assert_eq!(orders.metrics().outbox.delivered, 5);
    bus.stop().await;
}

/// A process restarted under the same instance name takes back at once the
/// claims its crashed predecessor left, instead of waiting out their lease.
pub async fn a_named_instance_takes_its_own_claims_back_at_once<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let named = || {
        Bus::builder()
            .module(&orders)
            .module(&warehouse)
            .instance("worker-1")
            .claim_lease(Duration::from_secs(120))
            .scan_interval(Duration::from_millis(100))
            .start()
    };
    let predecessor = named().await.expect("the first bus starts");
    let id = predecessor.id();
    predecessor.stop().await;

    // What the predecessor would leave had it been killed: a row it claimed
    // for two more minutes.
    let message = uuid_ago(Duration::from_secs(5));
    insert_outbox_row(
        &orders,
        message,
        "test.ping",
        "{\"n\":1}",
        micros_ago(Duration::from_secs(5)),
    )
    .await
    .expect("insert");
    let until = micros_ago(Duration::ZERO) + 120_000_000;
    execute(
        &orders,
        format!(
            "UPDATE tickbox_outbox SET claimed_by = {}, claimed_until_us = {until}",
            uuid_literal::<B>(id)
        ),
    )
    .await
    .expect("claim");

    let restarted = named().await.expect("the restarted bus starts");
    assert_eq!(restarted.id(), id, "the same name gives the same id");
    // Well within the claim's two minutes.
    eventually("the restarted bus takes its claim back", WAIT, || async {
        changes(&warehouse, "warehouse.record").await == 1
    })
    .await;
    drained(&restarted).await;
    restarted.stop().await;

    let blank = Bus::builder()
        .module(&orders)
        .instance("  ")
        .start()
        .await
        .err()
        .expect("an empty instance name is refused");
    assert!(blank.to_string().contains("instance"), "{blank}");
}

pub async fn transient_database_failures_are_told_from_permanent_ones<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let (orders, _warehouse) = pair::<B>(&db, &handler).await;

    // A writer holds its transaction open while a reader trips over it.
    let writer = hold_writer(&orders, 1).await;
    let transient = orders
        .read(async move |tx| {
            tx.conn().batch_execute(B::TRANSIENT_FAILURE).await?;
            Ok::<_, Error>(())
        })
        .await
        .expect_err("the database refuses");
    assert!(transient.is_transient(), "worth retrying: {transient}");
    writer.commit().await;

    let permanent = orders
        .read(async move |tx| {
            tx.conn()
                .batch_execute("SELECT * FROM no_such_table")
                .await?;
            Ok::<_, Error>(())
        })
        .await
        .expect_err("there is no such table");
    assert!(!permanent.is_transient(), "not worth retrying: {permanent}");
}
