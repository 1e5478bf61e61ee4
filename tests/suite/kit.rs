//! The test kit itself: a tracked session ends when the whole flow is done
//! — not earlier, even when the flow's last message is published by a
//! handler after a retry — fails on a handler's failure unless told to
//! allow it, and reports what is unfinished when its timeout passes.

use super::{fast_retries, publish};
use crate::support::*;
use futures_util::FutureExt;
use std::panic::AssertUnwindSafe;
use std::time::Duration;
use tickbox::testing::{Happened, Session};
use tickbox::{BusHandle, Envelope, ModuleHandle, RetryPolicy};

/// orders → Ping → warehouse.record (publishes Pong) → audit.record.
async fn chain<B: TestBackend>(
    db: &TestDb,
    warehouse: &Record,
    audit: &Record,
    retry_delay: Duration,
) -> (
    ModuleHandle<B>,
    ModuleHandle<B>,
    ModuleHandle<B>,
    BusHandle<B>,
) {
    let orders = B::module(db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let warehouse_module = B::module(db, "warehouse")
        .publishes::<Pong>()
        .handler(
            "warehouse.record",
            record::<Ping>(&warehouse.clone().publishing_pong()),
        )
        .start()
        .await
        .expect("warehouse starts");
    let audit_module = B::module(db, "audit")
        .handler("audit.record", record::<Pong>(audit))
        .start()
        .await
        .expect("audit starts");
    for module in [&warehouse_module, &audit_module] {
        create_changes(module).await;
    }
    let bus = db
        .bus()
        .module(&orders)
        .module(&warehouse_module)
        .module(&audit_module)
        .retry_policy(RetryPolicy {
            initial_delay: retry_delay,
            max_delay: retry_delay,
            jitter: 0.0,
            ..fast_retries()
        })
        .start()
        .await
        .expect("bus starts");
    (orders, warehouse_module, audit_module, bus)
}

pub async fn a_flow_whose_last_message_follows_a_retry_is_not_finished_early<B: TestBackend>(
    db: TestDb,
) {
    // The warehouse fails once and publishes Pong only on its retry, 300 ms
    // later; the audit handler takes its time. In between, nothing is
    // queued or running anywhere: a "queue empty" check would call the
    // flow done.
    let warehouse = Record::new(Then::FailFirst(1));
    let audit = Record::new(Then::Succeed).holding(Duration::from_millis(100));
    let (orders, warehouse_module, audit_module, bus) =
        chain::<B>(&db, &warehouse, &audit, Duration::from_millis(300)).await;

    let session = Session::start(&bus).allow_failures();
    publish(&orders, 7).await;
    let report = session.wait().await;

    // Read at once, no waiting: the whole flow has committed.
    assert_eq!(changes(&audit_module, "audit.record").await, 1);
    assert_eq!(changes(&warehouse_module, "warehouse.record").await, 1);
    assert_eq!(report.failures("warehouse.record").len(), 1, "{report}");
    assert_eq!(report.handled("warehouse.record").len(), 1);
    assert_eq!(report.handled("audit.record").len(), 1);
    let pong = report.published_one::<Pong>(|p| p.n == 7);
    assert_eq!(pong.n, 7);
    // In order: published, failed, handled, the cascade, its handling.
    let order: Vec<&Happened> = report.events.iter().map(|e| &e.happened).collect();
    assert!(
        matches!(
            order.as_slice(),
            [
                Happened::Published,
                Happened::Failed { .. },
                Happened::Published,
                Happened::Handled,
                Happened::Handled,
            ]
        ),
        "{report}"
    );
    bus.stop().await;
}

pub async fn a_handler_failure_fails_the_session_with_the_error_and_the_message<B: TestBackend>(
    db: TestDb,
) {
    let warehouse = Record::new(Then::FailFirst(1));
    let audit = Record::new(Then::Succeed);
    let (orders, _warehouse, _audit, bus) =
        chain::<B>(&db, &warehouse, &audit, Duration::from_secs(60)).await;
    let session = Session::start(&bus);
    let id = publish(&orders, 3).await;
    let failed = session
        .try_wait()
        .await
        .expect_err("the failure ends the session");
    let text = failed.to_string();
    assert!(text.contains("warehouse.record"), "{text}");
    assert!(text.contains("failure 1 of 1"), "{text}");
    assert!(text.contains(&id.to_string()), "{text}");
    assert!(text.contains("\"n\":3"), "{text}");
    bus.stop().await;
}

/// The kit's assertions fail at the test's own line, not inside the kit:
/// `wait` names the line that called it, and `published_one` panics there.
pub async fn the_kit_s_assertions_point_at_the_test_s_own_line<B: TestBackend>(db: TestDb) {
    let warehouse = Record::new(Then::FailFirst(1));
    let audit = Record::new(Then::Succeed);
    let (orders, _warehouse, _audit, bus) =
        chain::<B>(&db, &warehouse, &audit, Duration::from_secs(60)).await;
    let session = Session::start(&bus);
    publish(&orders, 5).await;
    let wait_line = line!() + 1;
    let waited = AssertUnwindSafe(session.wait()).catch_unwind().await;
    let message = panic_message(waited.expect_err("the handler's failure fails the wait"));
    let here = format!("{}:{wait_line}:", file!());
    assert!(message.contains(&here), "`{here}` not in: {message}");

    let report = session.report();
    let (location, _) = panic_location(|| {
        report.published_one::<Ping>(|_| false);
    });
    let asserted_at = format!("{}:{}", file!(), line!() - 2);
    assert!(
        location.starts_with(&asserted_at),
        "{location} is not {asserted_at}"
    );
    bus.stop().await;
}

pub async fn an_unfinished_flow_is_reported_with_what_it_waits_for<B: TestBackend>(db: TestDb) {
    // The audit fails and retries a minute later: the session's timeout
    // passes first.
    let warehouse = Record::new(Then::Succeed);
    let audit = Record::new(Then::FailFirst(1));
    let (orders, _warehouse, _audit, bus) =
        chain::<B>(&db, &warehouse, &audit, Duration::from_secs(60)).await;
    let session = Session::start(&bus)
        .allow_failures()
        .timeout(Duration::from_secs(3));
    publish(&orders, 1).await;
    let unfinished = session
        .try_wait()
        .await
        .expect_err("the audit never succeeds");
    assert_eq!(unfinished.outstanding.len(), 1, "{unfinished}");
    assert!(
        unfinished.outstanding[0].contains("test.pong")
            && unfinished.outstanding[0].contains("audit/audit.record"),
        "{unfinished}"
    );
    assert!(!unfinished.report.failures("audit.record").is_empty());
    bus.stop().await;
}

pub async fn injected_failures_and_duplicates_change_nothing_in_the_end<B: TestBackend>(
    db: TestDb,
) {
    let warehouse = Record::new(Then::Succeed);
    let audit = Record::new(Then::Succeed);
    let (orders, warehouse_module, audit_module, bus) =
        chain::<B>(&db, &warehouse, &audit, Duration::from_millis(1)).await;
    // Most attempts fail: were attempts used up (the kit's retry policy
    // allows five), about one delivery in three would be dead-lettered.
    let session = Session::start(&bus)
        .inject_failures(0.8)
        .inject_duplicates(1.0);
    for n in 0..10 {
        publish(&orders, n).await;
    }
    let report = session.wait().await;
    for handler in ["warehouse.record", "audit.record"] {
        assert!(
            report.dead_letters(handler).is_empty(),
            "injected failures alone never dead-letter a message: {report}"
        );
        assert!(
            !report.failures(handler).is_empty(),
            "failures were injected: {report}"
        );
    }
    assert_eq!(changes(&warehouse_module, "warehouse.record").await, 10);
    assert_eq!(changes(&audit_module, "audit.record").await, 10);
    assert_eq!(report.handled("audit.record").len(), 10);
    assert_eq!(report.published::<Pong>().len(), 10);
    assert!(
        !report.duplicates("warehouse.record").is_empty(),
        "every handled message is delivered again: {report}"
    );
    bus.stop().await;
}

pub async fn a_message_delivered_straight_to_a_handler_is_tracked_with_its_cascade<
    B: TestBackend,
>(
    db: TestDb,
) {
    let warehouse = Record::new(Then::Succeed);
    let audit = Record::new(Then::Succeed);
    let (_orders, warehouse_module, audit_module, bus) =
        chain::<B>(&db, &warehouse, &audit, Duration::from_millis(1)).await;
    let session = Session::start(&bus);
    let envelope = Envelope::encode(&Ping { n: 5 }).expect("encodes");
    let outcome = session
        .deliver_to(&warehouse_module, envelope, "warehouse.record")
        .await;
    assert_eq!(outcome, Ok(tickbox::Outcome::Handled));
    let report = session.wait().await;
    assert_eq!(report.handled("audit.record").len(), 1, "{report}");
    assert_eq!(changes(&audit_module, "audit.record").await, 1);
    bus.stop().await;
}
