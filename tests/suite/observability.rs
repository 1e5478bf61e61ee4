//! Observability: counters, gauges and latencies move exactly as deliveries
//! happen.

use super::{bus, drained, fast_retries, pair, publish};
use crate::support::*;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;
use tickbox::{Bus, Envelope, Outcome, RetryPolicy};

pub async fn counters_move_exactly_as_deliveries_happen<B: TestBackend>(db: TestDb) {
    static POISONED: AtomicBool = AtomicBool::new(true);
    POISONED.store(true, SeqCst);
    // Message 3 always fails (dead-lettered after 2 attempts); the others
    // succeed, and each of them is delivered a second time.
    let handler = Record::new(Then::FailFor {
        n: 3,
        switch: &POISONED,
        permanent: false,
    });
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .retry_policy(RetryPolicy {
            max_attempts: Some(2),
            ..fast_retries()
        })
        .duplicate_rate(1.0)
        .start()
        .await
        .expect("bus starts");
    for n in 0..5 {
        publish(&orders, n).await;
    }
    drained(&bus).await;
    let direct = Envelope::encode(&Ping { n: 9 }).expect("encodes");
    assert_eq!(
        warehouse
            .deliver_to(direct.clone(), "warehouse.record")
            .await,
        Ok(Outcome::Handled)
    );
    assert_eq!(
        warehouse.deliver_to(direct, "warehouse.record").await,
        Ok(Outcome::Duplicate)
    );

    let h = &warehouse.metrics().handlers[0];
    assert_eq!(h.handled, 5, "4 by the bus, 1 directly");
    assert_eq!(
        h.duplicates_skipped, 5,
        "4 injected, 1 direct (the dead letter is not redelivered)"
    );
    assert_eq!(h.failed, 2, "message 3, twice");
    assert_eq!(h.retried, 1, "message 3's second attempt");
    assert_eq!(h.dead_lettered, 1);
    assert_eq!(h.latency.count, 5);
    assert_eq!(h.end_to_end.count, 5);
    assert!(h.latency.sum_seconds > 0.0);
    let totals = bus.metrics();
    assert_eq!(totals.delivered, 5);
    assert_eq!(totals.duplicates_injected, 4);
    assert_eq!(totals.modules[0].outbox.delivered, 5, "orders' outbox");
    assert_eq!(totals.modules[0].outbox.published, 5, "orders' outbox");
    bus.stop().await;
}

pub async fn lag_rises_while_the_bus_is_stopped_and_returns_to_zero<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .metrics_interval(Duration::from_millis(50))
        .start()
        .await
        .expect("orders");
    let warehouse = B::module(&db, "warehouse")
        .handler("warehouse.record", record::<Ping>(&handler))
        .start()
        .await
        .expect("warehouse");
    create_changes(&warehouse).await;
    for n in 0..3 {
        publish(&orders, n).await;
    }
    eventually("the gauge shows the backlog", WAIT, || async {
        let outbox = orders.metrics().outbox;
        outbox.pending == 3 && outbox.lag_seconds > 0.0
    })
    .await;
    let first = orders.metrics().outbox.lag_seconds;
    eventually("the lag rises while nothing delivers", WAIT, || async {
        orders.metrics().outbox.lag_seconds > first + 0.1
    })
    .await;

    let bus = bus(&db, &[&orders, &warehouse]).await;
    eventually("the lag returns to zero once drained", WAIT, || async {
        let outbox = orders.metrics().outbox;
        outbox.pending == 0 && outbox.lag_seconds == 0.0
    })
    .await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 3);
    bus.stop().await;
}

pub async fn mailbox_depth_rises_under_a_slow_handler_and_falls_back<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed).holding(Duration::from_millis(300));
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders");
    let warehouse = B::module(&db, "warehouse")
        .pool_size(8)
        .handler("warehouse.record", record::<Ping>(&handler))
        .start()
        .await
        .expect("warehouse");
    create_changes(&warehouse).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    for n in 0..8 {
        publish(&orders, n).await;
    }
    eventually(
        "several deliveries are in the module at once",
        WAIT,
        || async {
            let m = warehouse.metrics();
            m.mailbox_queued + m.mailbox_in_flight >= 3
        },
    )
    .await;
    drained(&bus).await;
    let m = warehouse.metrics();
    assert_eq!(
        (m.mailbox_queued, m.mailbox_in_flight),
        (0, 0),
        "the mailbox emptied"
    );
    assert_eq!(m.handlers[0].handled, 8);
    bus.stop().await;
}

/// Log lines written by the subscriber of one test (its thread).
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned()
    }
}

/// With only warnings logged (no span fields), a failed delivery's line
/// still names its module, handler, topic, message and attempt.
pub async fn a_failed_delivery_is_logged_at_warn_level_with_what_identifies_it<B: TestBackend>(
    db: TestDb,
) {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _only_here = tracing::subscriber::set_default(subscriber);

    let handler = Record::new(Then::FailFirst(1));
    let (orders, warehouse) = pair::<B>(&db, &handler).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    let id = publish(&orders, 1).await;
    drained(&bus).await;
    bus.stop().await;

    let text = logs.text();
    let line = text
        .lines()
        .find(|line| line.contains("delivery failed"))
        .unwrap_or_else(|| panic!("no failed delivery logged:\n{text}"));
    for expected in [
        "module=warehouse".to_string(),
        "handler=warehouse.record".to_string(),
        format!("topic={}", <Ping as tickbox::Message>::TOPIC),
        format!("message_id={id}"),
        "attempt=1".to_string(),
    ] {
        assert!(
            line.contains(&expected),
            "`{expected}` missing from: {line}"
        );
    }
}
