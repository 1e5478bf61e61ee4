//! Scheduled messages: committed with their transaction, delivered no
//! earlier than due and promptly after — by the bus's timer, not its
//! periodic scan — after a restart, by several processes sharing the
//! outbox (once per handler), and over the broker; cancelled while not yet
//! due; and a scheduled keyed message takes its place in its key when due.

use crate::support::*;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tickbox::{BusHandle, Delivery, Error, Handler, HandlerError, ModuleHandle, Tx};

const HANDLER: &str = "warehouse.stamp";

/// Longer than any of these tests: a delivery on time is the timer's work,
/// never the periodic scan's.
const NO_SCAN: Duration = Duration::from_secs(300);

/// How late a message may be delivered after its due time and still count
/// as prompt (a slow machine's transactions included).
const PROMPT: Duration = Duration::from_secs(2);

/// Records each `Ping` it handles (a change row in its transaction) and
/// when its handler ran, with the sequence of a keyed one.
#[derive(Clone, Default)]
struct Stamp {
    seen: Arc<Mutex<Vec<Seen>>>,
}

#[derive(Debug, Clone, Copy)]
struct Seen {
    n: u64,
    at: SystemTime,
    sequence: Option<i64>,
}

impl Stamp {
    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// When message `n` was first handled.
    fn first(&self, n: u64) -> Option<Seen> {
        self.seen().into_iter().find(|seen| seen.n == n)
    }
}

impl<B: TestBackend> Handler<B> for Stamp {
    type Message = Ping;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        ping: Ping,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        write_change(tx, delivery).await?;
        self.seen.lock().unwrap().push(Seen {
            n: ping.n,
            at: SystemTime::now(),
            sequence: delivery.sequence(),
        });
        Ok(())
    }
}

/// `orders` (publishes Ping) and `warehouse` (the [`Stamp`] handler),
/// opened as one process opens them.
async fn modules<B: TestBackend>(db: &TestDb, stamp: &Stamp) -> (ModuleHandle<B>, ModuleHandle<B>) {
    let orders = B::module(db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let warehouse = B::module(db, "warehouse")
        .handler(HANDLER, stamp.clone())
        .start()
        .await
        .expect("warehouse starts");
    create_changes(&warehouse).await;
    (orders, warehouse)
}

/// A bus over both, scanning every `scan`.
async fn bus<B: TestBackend>(
    db: &TestDb,
    orders: &ModuleHandle<B>,
    warehouse: &ModuleHandle<B>,
    scan: Duration,
) -> BusHandle<B> {
    db.bus()
        .module(orders)
        .module(warehouse)
        .retry_policy(crate::suite::fast_retries())
        .scan_interval(scan)
        .claim_lease(Duration::from_secs(2))
        .start()
        .await
        .expect("bus starts")
}

/// Changes `warehouse.stamp` committed for message `id`.
async fn changes_of<B: TestBackend>(warehouse: &ModuleHandle<B>, id: uuid::Uuid) -> i64 {
    count(
        warehouse,
        format!(
            "SELECT count(*) AS n FROM changes WHERE handler = '{HANDLER}' AND message_id = '{id}'"
        ),
    )
    .await
}

/// Asserts that message `n`, due at `due`, was first handled at or after
/// `due` and within [`PROMPT`] of it.
fn on_time(stamp: &Stamp, n: u64, due: SystemTime) {
    let seen = stamp
        .first(n)
        .unwrap_or_else(|| panic!("message {n} was handled"));
    let late = seen.at.duration_since(due).unwrap_or_else(|e| {
        panic!(
            "message {n} was handled {:?} before it was due",
            e.duration()
        )
    });
    assert!(
        late <= PROMPT,
        "message {n} was handled {late:?} after it was due"
    );
}

pub async fn a_scheduled_message_is_delivered_when_due_never_before<B: TestBackend>(db: TestDb) {
    let stamp = Stamp::default();
    let (orders, warehouse) = modules::<B>(&db, &stamp).await;
    let bus = bus(&db, &orders, &warehouse, NO_SCAN).await;

    let due = SystemTime::now() + Duration::from_secs(3);
    let (later, past, now) = orders
        .transaction(async move |tx| {
            let later = tx.publish_at(due, &Ping { n: 1 })?;
            let past =
                tx.publish_at(SystemTime::now() - Duration::from_secs(60), &Ping { n: 2 })?;
            let now = tx.publish(&Ping { n: 3 })?;
            Ok::<_, Error>((later, past, now))
        })
        .await
        .expect("publish commits");
    assert!(later > now, "a scheduled message's id carries its due time");

    eventually(
        "the immediate and the overdue message are handled",
        WAIT,
        || async {
            changes_of(&warehouse, now).await == 1 && changes_of(&warehouse, past).await == 1
        },
    )
    .await;
    assert!(
        stamp.first(1).is_none(),
        "the scheduled message waits for its time"
    );
    assert!(
        SystemTime::now() < due,
        "the machine was too slow to check the wait before the due time"
    );
    assert_eq!(
        orders.store_stats().await.expect("stats").outbox_scheduled,
        1,
        "the scheduled message waits in the outbox"
    );

    eventually("the scheduled message is handled", WAIT, || async {
        changes_of(&warehouse, later).await == 1
    })
    .await;
    on_time(&stamp, 1, due);
    crate::suite::drained(&bus).await;
    assert_eq!(changes(&warehouse, HANDLER).await, 3, "each message once");
    bus.stop().await;
}

pub async fn a_cancelled_message_is_never_delivered_and_a_due_one_is_not_cancelled<
    B: TestBackend,
>(
    db: TestDb,
) {
    let stamp = Stamp::default();
    let (orders, warehouse) = modules::<B>(&db, &stamp).await;
    let bus = bus(&db, &orders, &warehouse, Duration::from_millis(200)).await;

    let due = SystemTime::now() + Duration::from_millis(800);
    let (soon, tomorrow, within) = orders
        .transaction(async move |tx| {
            let soon = tx.publish_at(due, &Ping { n: 1 })?;
            let tomorrow = tx.publish_after(Duration::from_secs(86_400), &Ping { n: 2 })?;
            // Published and cancelled in one transaction: never written.
            let within = tx.publish_after(Duration::from_secs(60), &Ping { n: 3 })?;
            assert!(tx.cancel_scheduled(within).await?);
            Ok::<_, Error>((soon, tomorrow, within))
        })
        .await
        .expect("publish commits");

    let cancel = async |id: uuid::Uuid| {
        orders
            .transaction(async move |tx| tx.cancel_scheduled(id).await)
            .await
            .expect("cancel commits")
    };
    assert!(cancel(tomorrow).await, "a message not yet due is cancelled");
    assert!(!cancel(tomorrow).await, "a cancelled message is gone");
    assert!(!cancel(uuid::Uuid::now_v7()).await, "no such message");

    // A rolled-back cancellation cancels nothing.
    let rolled_back: Result<(), Error> = orders
        .transaction(async move |tx| {
            assert!(tx.cancel_scheduled(soon).await?);
            Err(Error::Config("changed its mind".into()))
        })
        .await;
    assert!(rolled_back.is_err());
    // A read-only transaction cannot cancel.
    let read_only = orders
        .read(async move |tx| tx.cancel_scheduled(soon).await)
        .await;
    assert!(
        matches!(read_only, Err(Error::CancelInReadOnly { .. })),
        "{read_only:?}"
    );

    eventually("the message left scheduled is handled", WAIT, || async {
        changes_of(&warehouse, soon).await == 1
    })
    .await;
    on_time(&stamp, 1, due);
    assert!(!cancel(soon).await, "a delivered message is not cancelled");
    crate::suite::drained(&bus).await;
    assert_eq!(changes(&warehouse, HANDLER).await, 1, "only the one left");
    for id in [tomorrow, within] {
        assert_eq!(
            count(
                &orders,
                format!(
                    "SELECT count(*) AS n FROM tickbox_outbox WHERE id = {}",
                    uuid_literal::<B>(id)
                )
            )
            .await,
            0,
            "a cancelled message leaves no row"
        );
    }
    assert!(
        stamp.seen().iter().all(|seen| seen.n == 1),
        "{:?}",
        stamp.seen()
    );
    bus.stop().await;
}

pub async fn a_scheduled_message_waits_through_a_stop_and_a_start<B: TestBackend>(db: TestDb) {
    let stamp = Stamp::default();

    // First life: publishes one message due while it is stopped and one due
    // after the next start, then stops before either is due.
    let (orders, warehouse) = modules::<B>(&db, &stamp).await;
    let first = bus(&db, &orders, &warehouse, NO_SCAN).await;
    let while_down = SystemTime::now() + Duration::from_millis(300);
    let after_start = SystemTime::now() + Duration::from_millis(2500);
    let (a, b) = orders
        .transaction(async move |tx| {
            let a = tx.publish_at(while_down, &Ping { n: 1 })?;
            let b = tx.publish_at(after_start, &Ping { n: 2 })?;
            Ok::<_, Error>((a, b))
        })
        .await
        .expect("publish commits");
    first.stop().await;
    drop((first, orders, warehouse));
    assert!(stamp.seen().is_empty(), "nothing was due before the stop");
    eventually("the first message is due", WAIT, || async {
        SystemTime::now() >= while_down
    })
    .await;

    // Second life: the first message is delivered by the start's scan, the
    // second by the timer the start's look ahead sets (no periodic scan).
    let (orders, warehouse) = modules::<B>(&db, &stamp).await;
    let second = bus(&db, &orders, &warehouse, NO_SCAN).await;
    eventually("both are handled", WAIT, || async {
        changes_of(&warehouse, a).await == 1 && changes_of(&warehouse, b).await == 1
    })
    .await;
    on_time(&stamp, 2, after_start);
    let first_seen = stamp.first(1).expect("handled");
    assert!(first_seen.at >= while_down);
    crate::suite::drained(&second).await;
    assert_eq!(changes(&warehouse, HANDLER).await, 2, "each once");
    second.stop().await;
}

pub async fn processes_sharing_the_outbox_deliver_each_scheduled_message_once<B: TestBackend>(
    db: TestDb,
) {
    const MESSAGES: u64 = 30;
    let stamp = Stamp::default();
    // Two processes (replicas): both serve warehouse.stamp; only the first
    // publishes, so the second learns of the messages by its scans.
    let (orders, warehouse) = modules::<B>(&db, &stamp).await;
    let one = bus(&db, &orders, &warehouse, Duration::from_millis(200)).await;
    let (orders_two, warehouse_two) = modules::<B>(&db, &stamp).await;
    let two = bus(&db, &orders_two, &warehouse_two, Duration::from_millis(200)).await;

    let start = SystemTime::now() + Duration::from_millis(1000);
    let mut due = Vec::new();
    for n in 0..MESSAGES {
        let at = start + Duration::from_millis(50 * n);
        due.push(at);
        orders
            .transaction(async move |tx| tx.publish_at(at, &Ping { n }))
            .await
            .expect("publish commits");
    }
    eventually("every scheduled message is handled", WAIT, || async {
        changes(&warehouse, HANDLER).await == MESSAGES as i64
    })
    .await;
    crate::suite::drained(&one).await;
    crate::suite::drained(&two).await;
    let doubled = count(
        &warehouse,
        format!(
            "SELECT count(*) AS n FROM (SELECT message_id FROM changes \
             WHERE handler = '{HANDLER}' GROUP BY message_id HAVING count(*) > 1) doubled"
        ),
    )
    .await;
    assert_eq!(doubled, 0, "no message is applied twice");
    assert_eq!(changes(&warehouse, HANDLER).await, MESSAGES as i64);
    for (n, at) in due.into_iter().enumerate() {
        on_time(&stamp, n as u64, at);
    }
    one.stop().await;
    two.stop().await;
}

pub async fn a_scheduled_keyed_message_takes_its_place_in_its_key_when_due<B: TestBackend>(
    db: TestDb,
) {
    let stamp = Stamp::default();
    let (orders, warehouse) = modules::<B>(&db, &stamp).await;
    let bus = bus(&db, &orders, &warehouse, NO_SCAN).await;
    let keyed = async |n: u64| {
        orders
            .transaction(async move |tx| tx.publish_keyed("order-7", &Ping { n }))
            .await
            .expect("publish commits")
    };

    keyed(1).await;
    let due = SystemTime::now() + Duration::from_secs(3);
    let timeout = orders
        .transaction(async move |tx| tx.publish_keyed_at("order-7", due, &Ping { n: 100 }))
        .await
        .expect("publish commits");
    // Committed after the scheduled one, and not held back by it.
    keyed(2).await;
    eventually(
        "the key's messages committed so far are handled",
        WAIT,
        || async { changes(&warehouse, HANDLER).await == 2 },
    )
    .await;
    assert!(
        SystemTime::now() < due,
        "the machine was too slow to check before the due time"
    );
    assert!(stamp.first(100).is_none());

    eventually("the scheduled one is handled", WAIT, || async {
        changes_of(&warehouse, timeout).await == 1
    })
    .await;
    on_time(&stamp, 100, due);
    keyed(3).await;
    eventually("the last is handled", WAIT, || async {
        changes(&warehouse, HANDLER).await == 4
    })
    .await;
    let sequence = |n: u64| stamp.first(n).and_then(|seen| seen.sequence);
    assert_eq!(
        [sequence(1), sequence(2), sequence(100), sequence(3)],
        [Some(1), Some(2), Some(3), Some(4)],
        "numbered when due: after the key's messages committed before then"
    );
    let order: Vec<u64> = stamp.seen().iter().map(|seen| seen.n).collect();
    assert_eq!(order, vec![1, 2, 100, 3], "handled in the key's order");
    crate::suite::drained(&bus).await;
    bus.stop().await;
}

pub async fn a_session_s_clock_tests_a_fifteen_minute_timeout_without_waiting_for_it<
    B: TestBackend,
>(
    db: TestDb,
) {
    let stamp = Stamp::default();
    let (orders, warehouse) = modules::<B>(&db, &stamp).await;
    let bus = bus(&db, &orders, &warehouse, NO_SCAN).await;
    let session = tickbox::testing::Session::start(&bus);
    let started = std::time::Instant::now();
    let timeout = orders
        .transaction(async move |tx| tx.publish_after(Duration::from_secs(15 * 60), &Ping { n: 1 }))
        .await
        .expect("publish commits");

    // Fourteen minutes on, it is not due: the bus, asked to look, leaves
    // it, while a message published then goes through.
    session.advance(Duration::from_secs(14 * 60));
    assert_eq!(
        orders.store_stats().await.expect("stats").outbox_scheduled,
        1,
        "not due after 14 minutes"
    );
    let marker = orders
        .transaction(async move |tx| tx.publish(&Ping { n: 2 }))
        .await
        .expect("publish commits");
    eventually(
        "the message published meanwhile is handled",
        WAIT,
        || async { changes_of(&warehouse, marker).await == 1 },
    )
    .await;
    assert!(stamp.first(1).is_none(), "the timeout waits for its time");

    // One more minute: due, and delivered at once.
    let before_due = SystemTime::now();
    session.advance(Duration::from_secs(60));
    let report = session.wait().await;
    assert_eq!(report.handled(HANDLER).len(), 2, "{report}");
    assert_eq!(changes_of(&warehouse, timeout).await, 1);
    let seen = stamp.first(1).expect("handled");
    assert!(
        seen.at >= before_due,
        "handled only once the clock reached it"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "a 15-minute timeout took {:?} to test",
        started.elapsed()
    );
    let lateness = bus
        .metrics()
        .modules
        .into_iter()
        .find(|m| m.module == "orders")
        .expect("orders' metrics")
        .outbox
        .lateness;
    assert_eq!(
        lateness.count, 1,
        "its lateness is measured on the session's clock"
    );
    assert!(lateness.sum_seconds < 30.0, "{lateness:?}");
    bus.stop().await;
}
