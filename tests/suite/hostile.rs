//! Hostile outbox rows, written straight into the table as a broken program
//! or a careless operator might, before a run and during it: each must end
//! as a dead letter (or be delivered, where it is odd but readable) while
//! good messages keep flowing — never block the outbox, never sit pending
//! in silence.

use crate::suite::publish;
use crate::support::*;
use std::sync::atomic::AtomicBool;
use std::time::Duration;
use tickbox::{Bus, ModuleHandle};

/// A hostile row and what must become of it.
struct Hostile {
    what: &'static str,
    id: uuid::Uuid,
    sql: String,
    /// Where it must end: a dead letter whose reason contains this, at the
    /// outbox's module (`at_source`) or at the handler; or, with `None`,
    /// delivered to the handler.
    dead: Option<(&'static str, bool)>,
}

/// Every malformed column the backend's schema admits, and odd but valid
/// values. `n` numbers the rows (payloads of valid ones carry it).
fn hostile_rows<B: TestBackend>(n: u64) -> Vec<Hostile> {
    let sqlite = B::NAME == "sqlite";
    let mut rows = Vec::new();
    let mut row = |what: &'static str,
                   id: uuid::Uuid,
                   topic: String,
                   payload: String,
                   created_at: String,
                   claim: Option<(String, String)>,
                   dead: Option<(&'static str, bool)>| {
        let literal = uuid_literal::<B>(id);
        let (claimed_by, claimed_until) = claim.unwrap_or(("NULL".into(), "NULL".into()));
        rows.push(Hostile {
            what,
            id,
            sql: format!(
                "INSERT INTO tickbox_outbox \
                 (id, topic, payload, correlation_id, created_at_us, claimed_by, claimed_until_us) \
                 VALUES ({literal}, {topic}, {payload}, {literal}, {created_at}, {claimed_by}, {claimed_until})"
            ),
            dead,
        });
    };
    let ping = |k: u64| format!("'{{\"n\": {}}}'", n * 100 + k);
    let topic = || "'test.ping'".to_string();
    let now = micros_ago(Duration::ZERO).to_string();
    let new_id = || uuid::Uuid::now_v7();

    row(
        "a nil id",
        if n == 0 {
            uuid::Uuid::nil()
        } else {
            uuid::Uuid::max()
        },
        topic(),
        ping(1),
        now.clone(),
        None,
        None,
    );
    row(
        "an empty topic",
        new_id(),
        "''".into(),
        ping(2),
        now.clone(),
        None,
        Some(("unknown topic", true)),
    );
    row(
        "a payload that is not JSON",
        new_id(),
        topic(),
        "'{oops'".into(),
        now.clone(),
        None,
        Some(("does not decode", false)),
    );
    row(
        "a payload of another shape",
        new_id(),
        topic(),
        "'{\"m\": \"x\"}'".into(),
        now.clone(),
        None,
        Some(("does not decode", false)),
    );
    row(
        "the largest creation time",
        new_id(),
        topic(),
        ping(3),
        i64::MAX.to_string(),
        None,
        None,
    );
    row(
        "the smallest creation time",
        new_id(),
        topic(),
        ping(4),
        i64::MIN.to_string(),
        None,
        None,
    );
    row(
        "a claim far in the future by no running bus",
        new_id(),
        topic(),
        ping(5),
        now.clone(),
        Some((
            uuid_literal::<B>(uuid::Uuid::now_v7()),
            i64::MAX.to_string(),
        )),
        None,
    );
    if sqlite {
        // SQLite stores any value in any column.
        row(
            "a payload that is not UTF-8",
            new_id(),
            topic(),
            "CAST(x'7b22ff7d' AS TEXT)".into(),
            now.clone(),
            None,
            Some(("payload is not valid UTF-8", true)),
        );
        row(
            "a topic that is not UTF-8",
            new_id(),
            "CAST(x'74ff' AS TEXT)".into(),
            ping(6),
            now.clone(),
            None,
            Some(("topic is not valid UTF-8", true)),
        );
        row(
            "a payload stored as a blob",
            new_id(),
            topic(),
            "x'c3'".into(),
            now.clone(),
            None,
            Some(("payload is not valid UTF-8", true)),
        );
        row(
            "a topic stored as a number",
            new_id(),
            "42".into(),
            ping(7),
            now.clone(),
            None,
            Some(("unknown topic", true)),
        );
        row(
            "a creation time that is text",
            new_id(),
            topic(),
            ping(8),
            "'yesterday'".into(),
            None,
            Some(("created_at_us is not an integer", true)),
        );
        row(
            "a creation time that is a real",
            new_id(),
            topic(),
            ping(9),
            "1.5".into(),
            None,
            Some(("created_at_us is not an integer", true)),
        );
        row(
            "a claim that is not an id, until a text",
            new_id(),
            topic(),
            ping(10),
            now.clone(),
            Some(("x'01'".into(), "'later'".into())),
            None,
        );
    } else {
        row(
            "a payload of a megabyte",
            new_id(),
            topic(),
            format!(
                "'{{\"n\": {}, \"pad\": \"{}\"}}'",
                n * 100 + 11,
                "x".repeat(1 << 20)
            ),
            now.clone(),
            None,
            None,
        );
        row(
            "a topic with a newline and quotes",
            new_id(),
            match B::NAME {
                "postgres" => "E'test.\\n\"ping\"'".into(),
                // MySQL reads backslash escapes in any string literal.
                _ => "'test.\\n\"ping\"'".into(),
            },
            ping(12),
            now.clone(),
            None,
            Some(("unknown topic", true)),
        );
    }
    rows
}

pub async fn hostile_rows_end_as_dead_letters_while_good_messages_flow<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = crate::suite::pair::<B>(&db, &handler).await;
    let before = hostile_rows::<B>(0);
    for row in &before {
        execute(&orders, row.sql.clone())
            .await
            .unwrap_or_else(|e| panic!("inserting {}: {e}", row.what));
    }
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .retry_policy(crate::suite::fast_retries())
        .scan_interval(Duration::from_millis(100))
        .start()
        .await
        .expect("bus starts");
    // Good messages and more hostile rows, interleaved, while the bus runs.
    let during = hostile_rows::<B>(1);
    for (i, row) in during.iter().enumerate() {
        publish(&orders, 10_000 + i as u64).await;
        execute(&orders, row.sql.clone())
            .await
            .unwrap_or_else(|e| panic!("inserting {}: {e}", row.what));
    }
    let good = during.len() as i64;
    let rows: Vec<&Hostile> = before.iter().chain(&during).collect();
    let delivered = rows.iter().filter(|r| r.dead.is_none()).count() as i64;
    eventually("every row delivered or dead-lettered", WAIT, || async {
        orders.store_stats().await.expect("stats").outbox_pending == 0
    })
    .await;
    assert_eq!(
        changes(&warehouse, "warehouse.record").await,
        good + delivered,
        "every good message and every odd-but-valid row handled once"
    );
    let at_source = orders.dead_letters(0, 100).await.expect("dead letters");
    let at_handler = warehouse.dead_letters(0, 100).await.expect("dead letters");
    for row in &rows {
        let Some((reason, source)) = row.dead else {
            continue;
        };
        let letters = if source { &at_source } else { &at_handler };
        let letter = letters
            .iter()
            .find(|d| d.message_id == row.id)
            .unwrap_or_else(|| panic!("{} is not a dead letter: {letters:?}", row.what));
        assert!(
            letter.reason.contains(reason),
            "{}: reason `{}` does not say `{reason}`",
            row.what,
            letter.reason
        );
    }
    let dead = rows.iter().filter(|r| r.dead.is_some()).count();
    assert_eq!(
        at_source.len() + at_handler.len(),
        dead,
        "only the hostile rows are dead letters"
    );
    bus.stop().await;
}

pub async fn a_stalled_message_is_counted_and_named<B: TestBackend>(db: TestDb) {
    static FAILING: AtomicBool = AtomicBool::new(true);
    FAILING.store(true, std::sync::atomic::Ordering::SeqCst);
    let handler = Record::new(Then::FailWhile(&FAILING));
    let (orders, warehouse) = crate::suite::pair::<B>(&db, &handler).await;
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .retry_policy(crate::suite::fast_retries())
        .scan_interval(Duration::from_millis(100))
        .stalled_after(Duration::from_millis(300))
        .start()
        .await
        .expect("bus starts");
    publish(&orders, 1).await;
    let stalled = |m: &ModuleHandle<B>| m.metrics().outbox.stalled;
    eventually(
        "the failing message is counted as stalled",
        WAIT,
        || async { stalled(&orders) == 1 },
    )
    .await;
    FAILING.store(false, std::sync::atomic::Ordering::SeqCst);
    eventually("once handled, nothing is stalled", WAIT, || async {
        stalled(&orders) == 0 && orders.store_stats().await.expect("stats").outbox_pending == 0
    })
    .await;
    assert_eq!(changes(&warehouse, "warehouse.record").await, 1);
    bus.stop().await;
}
