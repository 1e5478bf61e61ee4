//! The RabbitMQ transport against the real broker: bad settings, hostile
//! messages, and the broker's faults (every connection closed, a restart,
//! confirms that do not come). The suite's delivery tests also run over the
//! broker (`sqlite_amqp`, `postgres_amqp` in `lib.rs`).
//!
//! Tests that inject faults into the broker have it alone
//! ([`broker_alone`]); every other test using it holds it shared.
//!
//! `silence` breaks the network instead, through a proxy of its own
//! (`network`): a broker gone silent is noticed, left behind and
//! connected to again, and no socket is left over.

mod relay;
mod silence;

use crate::suite::{fast_retries, pair, publish};
use crate::support::*;
use lapin::options::{BasicPublishOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Connection, ConnectionProperties};
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use tickbox::{Amqp, Bus, BusHandle, Error, ModuleHandle, Sqlite};

/// A namespace no other test uses; what the test's buses declare in it is
/// deleted when it drops.
struct Namespace(String);

impl std::ops::Deref for Namespace {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        delete_from_broker(&amqp(self).exchange());
    }
}

fn namespace() -> Namespace {
    Namespace(format!("test.{:08x}", fastrand::u32(..)))
}

/// The broker settings of one test.
fn amqp(namespace: &str) -> Amqp {
    Amqp::new(amqp_url())
        .namespace(namespace)
        .confirm_timeout(Duration::from_secs(2))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
}

/// `orders` and `warehouse` on a bus over the broker.
async fn over_broker(
    db: &TestDb,
    handler: &Record,
    amqp: Amqp,
) -> (
    ModuleHandle<Sqlite>,
    ModuleHandle<Sqlite>,
    BusHandle<Sqlite>,
) {
    let (orders, warehouse) = pair::<Sqlite>(db, handler).await;
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .amqp(amqp)
        .retry_policy(fast_retries())
        .scan_interval(Duration::from_millis(200))
        .start()
        .await
        .expect("the bus starts over the broker");
    (orders, warehouse, bus)
}

/// A plain connection to the broker, for what tickbox would never send.
async fn raw_connection() -> Connection {
    Connection::connect(&amqp_url(), ConnectionProperties::default())
        .await
        .expect("the broker is reachable")
}

/// Changes of `warehouse.record` and distinct messages among them.
async fn changes_and_distinct(warehouse: &ModuleHandle<Sqlite>) -> (i64, i64) {
    let all = changes(warehouse, "warehouse.record").await;
    let distinct = count(
        warehouse,
        "SELECT count(DISTINCT message_id) AS n FROM changes WHERE handler = 'warehouse.record'",
    )
    .await;
    (all, distinct)
}

#[actix::test]
async fn an_unreachable_broker_fails_the_start_and_the_modules_stay_free() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let down = Amqp::new("amqp://guest:guest@127.0.0.1:1/%2f");
    let started = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .amqp(down)
        .start()
        .await;
    let Err(error) = started else {
        panic!("a bus over an unreachable broker started")
    };
    assert!(
        matches!(&error, Error::BrokerUnreachable { url, .. } if url.contains("127.0.0.1:1")),
        "{error}"
    );
    assert!(error.is_transient(), "worth retrying: {error}");
    // Nothing was taken: the same modules start a bus over the real broker.
    let namespace = namespace();
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .amqp(amqp(&namespace))
        .start()
        .await
        .expect("the modules are free");
    let session = tickbox::testing::Session::start(&bus);
    publish(&orders, 1).await;
    session.wait().await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 1);
    bus.stop().await;
}

#[actix::test]
async fn wrong_credentials_are_refused_without_showing_the_password() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let wrong = Amqp::new("amqp://guest:not-the-password@127.0.0.1:5672/%2f");
    let error = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .amqp(wrong)
        .start()
        .await
        .err()
        .expect("refused");
    assert!(matches!(error, Error::BrokerRefused { .. }), "{error}");
    assert!(!error.is_transient(), "{error}");
    let text = format!("{error} {error:?}");
    assert!(!text.contains("not-the-password"), "{text}");
    assert!(text.contains("***"), "{text}");
}

#[actix::test]
async fn bad_settings_are_configuration_errors() {
    trace_init();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let bad = [
        Amqp::new("http://127.0.0.1:5672"),
        Amqp::new("amqps://guest:guest@127.0.0.1:5671/%2f"),
        Amqp::new(amqp_url()).namespace("has space"),
        Amqp::new(amqp_url()).prefetch(0),
        Amqp::new(amqp_url()).publish_window(0),
        Amqp::new(amqp_url()).publish_window(100_000),
        Amqp::new(amqp_url()).namespace("x".repeat(300)),
    ];
    for amqp in bad {
        let shown = format!("{amqp:?}");
        let error = Bus::builder()
            .module(&orders)
            .module(&warehouse)
            .amqp(amqp)
            .start()
            .await
            .err()
            .expect("refused");
        assert!(
            matches!(error, Error::Config(_) | Error::BrokerRefused { .. }),
            "{shown}: {error}"
        );
    }
}

#[actix::test]
async fn a_queue_declared_elsewhere_with_other_settings_is_refused() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let namespace = namespace();
    let settings = amqp(&namespace);
    let queue = settings.queue("warehouse", "warehouse.record");
    // Someone declared the handler's queue as a classic, non-durable queue.
    let connection = raw_connection().await;
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .queue_declare(
            ShortString::from(queue.as_str()),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("declared");
    let error = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .amqp(settings)
        .start()
        .await
        .err()
        .expect("refused");
    let text = error.to_string();
    assert!(matches!(error, Error::BrokerRefused { .. }), "{text}");
    assert!(
        text.contains(&queue) && text.contains("other settings"),
        "{text}"
    );
    let channel = connection.create_channel().await.expect("a channel");
    channel
        .queue_delete(
            ShortString::from(queue.as_str()),
            QueueDeleteOptions::default(),
        )
        .await
        .expect("deleted");
}

#[actix::test]
async fn hostile_messages_on_a_queue_become_dead_letters_and_good_ones_flow() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let namespace = namespace();
    let settings = amqp(&namespace);
    let queue = settings.queue("warehouse", "warehouse.record");
    let (orders, warehouse, bus) = over_broker(&db, &handler, settings).await;

    // Straight onto the handler's queue (the default exchange routes by
    // queue name): no message id; a body that is not UTF-8; a message
    // routed by hand with another topic; a payload that is not a Ping.
    let connection = raw_connection().await;
    let channel = connection.create_channel().await.expect("a channel");
    let good_headers = |created: i64| {
        let mut headers = FieldTable::default();
        headers.insert(
            "tickbox-created-at-us".into(),
            AMQPValue::LongLongInt(created),
        );
        headers
    };
    let id = || ShortString::from(uuid::Uuid::now_v7().to_string());
    let hostile: Vec<(BasicProperties, Vec<u8>, &str)> = vec![
        (
            BasicProperties::default(),
            b"{\"n\":1}".to_vec(),
            "no message id",
        ),
        (
            BasicProperties::default()
                .with_message_id(id())
                .with_headers(good_headers(1)),
            vec![0xff, 0xfe, 0x00],
            "not UTF-8",
        ),
        (
            BasicProperties::default()
                .with_message_id(id())
                .with_headers(good_headers(1)),
            b"{\"n\":\"not a number\"}".to_vec(),
            "routed by hand",
        ),
    ];
    for (properties, body, _) in &hostile {
        channel
            .basic_publish(
                ShortString::from(""),
                ShortString::from(queue.as_str()),
                BasicPublishOptions::default(),
                body,
                properties.clone(),
            )
            .await
            .expect("published")
            .await
            .expect("confirmed");
    }
    // The good messages are a flow of their own; the hostile ones were
    // never published, so only the dead letters show them.
    let session = tickbox::testing::Session::start(&bus);
    for n in 0..5 {
        publish(&orders, n).await;
    }
    session.wait().await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 5);
    eventually("each hostile message is a dead letter", WAIT, || async {
        warehouse.store_stats().await.expect("stats").dead_letters == hostile.len() as i64
    })
    .await;
    let letters = warehouse.dead_letters(0, 10).await.expect("dead letters");
    let reasons: Vec<&str> = letters.iter().map(|l| l.reason.as_str()).collect();
    assert!(
        reasons.iter().any(|r| r.contains("no message id")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("UTF-8")), "{reasons:?}");
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("reached the queue of handler")),
        "{reasons:?}"
    );
    assert!(
        letters.iter().all(|l| l.handler == "warehouse.record"),
        "{letters:?}"
    );
    // Every one was acknowledged: nothing waits in the queue.
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"), "idle");
    let metrics = bus.metrics();
    let amqp = metrics.broker.expect("broker figures");
    assert_eq!(amqp.consumers.len(), 1, "{amqp:?}");
    assert_eq!(amqp.consumers[0].queue, queue);
    assert_eq!(amqp.consumers[0].in_flight, 0, "{amqp:?}");
    bus.stop().await;
}

/// Publishes `count` messages while `fault` runs once the first are
/// handled; then every message must be handled exactly once.
async fn survives(
    fault: impl FnOnce(),
    settle: impl AsyncFnOnce(&BusHandle<Sqlite>),
    count: u64,
) -> u64 {
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let namespace = namespace();
    let (orders, warehouse, bus) = over_broker(&db, &handler, amqp(&namespace)).await;
    for n in 0..count / 2 {
        publish(&orders, n).await;
    }
    eventually("the first messages are handled", WAIT, || async {
        changes(&warehouse, "warehouse.record").await > 0
    })
    .await;
    fault();
    // Commits go on while the broker is away: the messages wait in the
    // outbox.
    for n in count / 2..count {
        publish(&orders, n).await;
    }
    settle(&bus).await;
    eventually(
        "every message is handled",
        Duration::from_secs(60),
        || async { changes(&warehouse, "warehouse.record").await >= count as i64 },
    )
    .await;
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"), "idle");
    let (all, distinct) = changes_and_distinct(&warehouse).await;
    assert_eq!((all, distinct), (count as i64, count as i64), "each once");
    assert_eq!(
        orders.store_stats().await.expect("stats").outbox_pending,
        0,
        "nothing left in the outbox"
    );
    let reconnects = bus.metrics().broker.expect("broker figures").reconnects;
    assert!(handler.calls.load(SeqCst) >= count as u32);
    bus.stop().await;
    reconnects
}

#[actix::test]
async fn closing_every_connection_pauses_delivery_which_resumes_by_itself() {
    trace_init();
    let _broker = broker_alone();
    let reconnects = survives(
        || {
            rabbitmqctl(&["close_all_connections", "a test closes every connection"]);
        },
        async |_| {},
        200,
    )
    .await;
    assert!(reconnects >= 1, "the bus connected again ({reconnects})");
}

#[actix::test]
async fn a_broker_restart_pauses_delivery_which_resumes_by_itself() {
    trace_init();
    let _broker = broker_alone();
    /// Starts the broker again however the test ends.
    struct Restart;
    impl Drop for Restart {
        fn drop(&mut self) {
            rabbitmqctl(&["start_app"]);
            rabbitmqctl(&["await_startup"]);
        }
    }
    let _restart = Restart;
    let reconnects = survives(
        || {
            rabbitmqctl(&["stop_app"]);
        },
        async |_| {
            rabbitmqctl(&["start_app"]);
            rabbitmqctl(&["await_startup"]);
        },
        100,
    )
    .await;
    assert!(reconnects >= 1, "the bus connected again ({reconnects})");
}

#[actix::test]
async fn a_confirm_that_never_comes_leaves_the_message_to_be_published_again() {
    trace_init();
    let _broker = broker_alone();
    // With its memory alarm on, the broker blocks publishers: no confirm
    // comes, the relay gives up on each after the confirm timeout, and the
    // messages stay in the outbox until the alarm clears.
    /// Clears the alarm however the test ends.
    struct Alarm;
    impl Drop for Alarm {
        fn drop(&mut self) {
            rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"]);
        }
    }
    let _alarm = Alarm;
    let reconnects = survives(
        || {
            rabbitmqctl(&["set_vm_memory_high_watermark", "0"]);
        },
        async |bus| {
            eventually("the relay gives up on a confirm", WAIT, || async {
                bus.metrics().broker.expect("broker figures").reconnects >= 1
            })
            .await;
            rabbitmqctl(&["set_vm_memory_high_watermark", "0.4"]);
        },
        40,
    )
    .await;
    assert!(
        reconnects >= 1,
        "the relay gave up on the silent channel and connected again ({reconnects})"
    );
}
