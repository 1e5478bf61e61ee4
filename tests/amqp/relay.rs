//! The relay's pipeline against the real broker: publishes go out back to
//! back up to the window and never past it; a nack in the middle of a
//! stream stops only its key, which is published again from the failed
//! message and never reordered; a message no queue is bound to stays
//! pending until one is; and every message is handled once through the
//! inbox.

use super::{amqp, changes_and_distinct, namespace, over_broker, raw_connection};
use crate::suite::{fast_retries, pair, publish};
use crate::support::*;
use lapin::options::{BasicGetOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::Channel;
use std::collections::HashMap;
use std::time::Duration;
use tickbox::{Bus, ModuleHandle, Sqlite};
use uuid::Uuid;

/// The topic the test handler receives.
const TOPIC: &str = "test.ping";

/// Declares queue `name` bound to [`TOPIC`] on `exchange`, with
/// `arguments`.
async fn bound_queue(channel: &Channel, exchange: &str, name: &str, arguments: FieldTable) {
    channel
        .queue_declare(
            ShortString::from(name),
            QueueDeclareOptions::default(),
            arguments,
        )
        .await
        .expect("declared");
    channel
        .queue_bind(
            ShortString::from(name),
            ShortString::from(exchange),
            ShortString::from(TOPIC),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bound");
}

/// Takes every message waiting in `queue` and returns their message ids,
/// in the queue's order.
async fn take_all(channel: &Channel, queue: &str) -> Vec<Uuid> {
    let mut ids = Vec::new();
    while let Some(got) = channel
        .basic_get(ShortString::from(queue), BasicGetOptions { no_ack: true })
        .await
        .expect("basic.get")
    {
        let id = got
            .delivery
            .properties
            .message_id()
            .as_ref()
            .expect("tickbox gives every message an id");
        ids.push(id.as_str().parse().expect("a UUID"));
    }
    ids
}

/// The messages `warehouse.record` handled, in the order it committed them.
async fn handled_in_order(warehouse: &ModuleHandle<Sqlite>) -> Vec<Uuid> {
    warehouse
        .transaction(async move |tx| {
            use diesel_async::RunQueryDsl;
            #[derive(diesel::QueryableByName)]
            struct Row {
                #[diesel(sql_type = diesel::sql_types::Text)]
                message_id: String,
            }
            let rows: Vec<Row> = diesel::sql_query(
                "SELECT message_id FROM changes WHERE handler = 'warehouse.record' ORDER BY rowid",
            )
            .load(tx.conn())
            .await?;
            Ok::<_, tickbox::Error>(rows)
        })
        .await
        .expect("read the changes")
        .into_iter()
        .map(|row| row.message_id.parse().expect("a UUID"))
        .collect()
}

#[actix::test]
async fn the_relay_fills_its_publish_window_and_never_exceeds_it() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    // A backlog committed while no bus runs: the first scan hands the relay
    // far more messages than its window holds.
    let count = 300;
    for n in 0..count {
        publish(&orders, n).await;
    }
    let window = 8;
    let namespace = namespace();
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .amqp(amqp(&namespace).publish_window(window))
        .retry_policy(fast_retries())
        .scan_interval(Duration::from_millis(200))
        .start()
        .await
        .expect("the bus starts over the broker");
    eventually("every message is handled", WAIT, || async {
        changes(&warehouse, "warehouse.record").await >= count as i64
    })
    .await;
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"), "idle");
    let figures = bus.metrics().broker.expect("broker figures");
    assert_eq!(figures.publish_window, window as u64);
    assert_eq!(
        figures.unconfirmed_peak, window as u64,
        "the window filled and never overflowed: {figures:?}"
    );
    assert!(
        figures.unconfirmed.iter().all(|r| r.unconfirmed == 0),
        "{figures:?}"
    );
    let (all, distinct) = changes_and_distinct(&warehouse).await;
    assert_eq!((all, distinct), (count as i64, count as i64), "each once");
    assert_eq!(
        orders.store_stats().await.expect("stats").outbox_pending,
        0,
        "every row marked"
    );
    bus.stop().await;
}

#[actix::test]
async fn a_nack_in_the_middle_stops_only_its_key_which_resumes_in_order() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let namespace = namespace();
    let settings = amqp(&namespace);
    let exchange = settings.exchange();
    let (orders, warehouse, bus) = over_broker(&db, &handler, settings).await;

    // Beside the handler's queue, two more bound to the topic: one that
    // takes 5 messages and then rejects what comes (the broker nacks those
    // publishes, though the other queues take them), and one that keeps
    // everything the relay published, in the order it arrived.
    let connection = raw_connection().await;
    let channel = connection.create_channel().await.expect("a channel");
    let blocker = format!("{exchange}.blocker");
    let mut limited = FieldTable::default();
    limited.insert("x-max-length".into(), AMQPValue::LongLongInt(5));
    limited.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    bound_queue(&channel, &exchange, &blocker, limited).await;
    let observer = format!("{exchange}.observer");
    bound_queue(&channel, &exchange, &observer, FieldTable::default()).await;

    // Three keys, interleaved, ten messages each.
    let keys = ["a", "b", "c"];
    let mut published: HashMap<Uuid, (&str, usize)> = HashMap::new();
    for index in 0..10 {
        for key in keys {
            let n = published.len() as u64;
            let id = orders
                .transaction(async move |tx| tx.publish_keyed(key, &Ping { n }))
                .await
                .expect("publish commits");
            published.insert(id, (key, index));
        }
    }
    // Once a message has been published twice, a nack came and the relay
    // published it again.
    let arrived = std::cell::RefCell::new(Vec::new());
    eventually("a nacked message is published again", WAIT, || {
        let (channel, observer, arrived) = (&channel, &observer, &arrived);
        async move {
            let taken = take_all(channel, observer).await;
            let mut arrived = arrived.borrow_mut();
            arrived.extend(taken);
            let mut seen = std::collections::HashSet::new();
            !arrived.iter().all(|id| seen.insert(*id))
        }
    })
    .await;
    let mut arrived = arrived.into_inner();
    assert!(
        orders.store_stats().await.expect("stats").outbox_pending > 0,
        "the nacked messages wait in the outbox"
    );
    // The full queue goes: every publish is confirmed from now on.
    channel
        .queue_delete(
            ShortString::from(blocker.as_str()),
            QueueDeleteOptions::default(),
        )
        .await
        .expect("deleted");
    eventually("the outbox is empty", Duration::from_secs(60), || async {
        orders.store_stats().await.expect("stats").outbox_pending == 0
    })
    .await;
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"), "idle");
    arrived.extend(take_all(&channel, &observer).await);

    // On the wire: each key's messages in order, a resend repeating the
    // failed message and never one before it.
    let mut last: HashMap<&str, usize> = HashMap::new();
    for id in &arrived {
        let (key, index) = published[id];
        let before = last.insert(key, index);
        assert!(
            before.is_none_or(|before| before <= index),
            "key {key}: message {index} came after message {before:?}"
        );
    }
    let distinct: std::collections::HashSet<_> = arrived.iter().collect();
    assert_eq!(distinct.len(), published.len(), "every message published");
    assert!(arrived.len() > published.len(), "some were published again");

    // At the handler: each key in order, each message once.
    let handled = handled_in_order(&warehouse).await;
    assert_eq!(handled.len(), published.len(), "each message handled once");
    for key in keys {
        let order: Vec<usize> = handled
            .iter()
            .filter_map(|id| published.get(id).filter(|(k, _)| *k == key))
            .map(|(_, index)| *index)
            .collect();
        assert_eq!(order, (0..10).collect::<Vec<_>>(), "key {key}");
    }
    bus.stop().await;
}

#[actix::test]
async fn a_message_no_queue_is_bound_to_stays_pending_until_one_is() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, _warehouse) = pair::<Sqlite>(&db, &handler).await;
    let namespace = namespace();
    let settings = amqp(&namespace);
    let exchange = settings.exchange();
    // Only the publisher is on the bus: no queue is bound to its topic.
    let bus = Bus::builder()
        .module(&orders)
        .amqp(settings)
        .retry_policy(fast_retries())
        .scan_interval(Duration::from_millis(200))
        .stalled_after(Duration::from_millis(500))
        .start()
        .await
        .expect("the bus starts over the broker");
    let id = publish(&orders, 1).await;
    eventually(
        "the returned message is pending past the stall threshold",
        WAIT,
        || async {
            bus.metrics()
                .modules
                .iter()
                .any(|m| m.module == "orders" && m.outbox.stalled >= 1)
        },
    )
    .await;
    assert_eq!(
        orders.store_stats().await.expect("stats").outbox_pending,
        1,
        "returned, not sent"
    );
    // A queue is bound: the relay's next try is confirmed.
    let connection = raw_connection().await;
    let channel = connection.create_channel().await.expect("a channel");
    let late = format!("{exchange}.late");
    bound_queue(&channel, &exchange, &late, FieldTable::default()).await;
    eventually("the message is sent", WAIT, || async {
        orders.store_stats().await.expect("stats").outbox_pending == 0
    })
    .await;
    assert_eq!(take_all(&channel, &late).await, vec![id], "sent once");
    bus.stop().await;
}
