//! Ordering keys: each handler receives a key's messages in commit order,
//! through failures, panics, duplicates and restarts, with several
//! processes and batched handlers; a dead letter parks only its key until it
//! is replayed or skipped.

use super::fast_retries;
use crate::support::*;
use diesel_async::SimpleAsyncConnection;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tickbox::testing::Session;
use tickbox::{
    BusHandle, Delivery, Handler, HandlerError, HandlerOptions, Message, ModuleHandle, Outcome,
    Replayed, Tx,
};

/// A change to one key: the key travels as the ordering key too.
#[derive(Debug, Serialize, Deserialize)]
struct Change {
    key: String,
    n: u64,
}
impl Message for Change {
    const TOPIC: &'static str = "test.change";
}

const HANDLER: &str = "copy.apply";

/// How the [`Apply`] handler misbehaves.
#[derive(Clone, Default)]
struct Disturb {
    /// Fail the first attempt of every message whose n is a multiple.
    fail_every: Option<u64>,
    /// Panic on the first attempt of every message whose n is a multiple.
    panic_every: Option<u64>,
    /// Fail (permanently) this key's message with this n while the switch
    /// is on.
    poison: Option<(&'static str, u64, &'static AtomicBool)>,
}

/// Records each message it handles with the order it ran in, and checks
/// the delivery's key and sequence.
#[derive(Clone)]
struct Apply {
    disturb: Disturb,
    /// Handler calls so far: the rows' `turn`.
    turns: Arc<AtomicU64>,
}

impl Apply {
    fn new(disturb: Disturb) -> Self {
        Apply {
            disturb,
            turns: Arc::new(AtomicU64::new(0)),
        }
    }
}

impl<B: TestBackend> Handler<B> for Apply {
    type Message = Change;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        change: Change,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        assert_eq!(delivery.ordering_key(), Some(change.key.as_str()));
        let sequence = delivery.sequence().expect("a keyed message has a sequence");
        let turn = self.turns.fetch_add(1, SeqCst);
        tx.conn()
            .batch_execute(&format!(
                "INSERT INTO seen (ordering_key, seq, n, turn) VALUES ('{}', {sequence}, {}, {turn})",
                change.key, change.n
            ))
            .await?;
        let first = delivery.attempt == 1;
        let multiple = |every: Option<u64>| every.is_some_and(|k| change.n.is_multiple_of(k));
        if first && multiple(self.disturb.fail_every) {
            return Err(HandlerError::msg("failing a first attempt"));
        }
        if first && multiple(self.disturb.panic_every) {
            panic!("panicking on a first attempt");
        }
        if let Some((key, n, switch)) = self.disturb.poison {
            if change.key == key && change.n == n && switch.load(SeqCst) {
                return Err(HandlerError::permanent(HandlerError::msg("poison")));
            }
        }
        Ok(())
    }
}

/// `catalog` publishes `Change`; `copy` applies it with `handler`.
async fn catalog_and_copy<B: TestBackend>(
    db: &TestDb,
    handler: &Apply,
    batched: bool,
) -> (ModuleHandle<B>, ModuleHandle<B>) {
    let catalog = B::module(db, "catalog")
        .publishes::<Change>()
        .start()
        .await
        .expect("catalog starts");
    let options = if batched {
        HandlerOptions::default().batch(16)
    } else {
        HandlerOptions::default()
    };
    let copy = copy_module::<B>(db, "copy", HANDLER, handler, options).await;
    (catalog, copy)
}

/// A module `name` with an [`Apply`] handler `handler_name` and its `seen`
/// table.
async fn copy_module<B: TestBackend>(
    db: &TestDb,
    name: &str,
    handler_name: &str,
    handler: &Apply,
    options: HandlerOptions,
) -> ModuleHandle<B> {
    let copy = B::module(db, name)
        .handler_with(handler_name, handler.clone(), options)
        .start()
        .await
        .expect("the copy starts");
    copy.transaction(async move |tx| {
        tx.conn()
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS seen (ordering_key TEXT NOT NULL, seq BIGINT NOT NULL, \
                 n BIGINT NOT NULL, turn BIGINT NOT NULL)",
            )
            .await?;
        Ok::<_, tickbox::Error>(())
    })
    .await
    .expect("create seen");
    copy
}

async fn start_bus<B: TestBackend>(
    db: &TestDb,
    modules: &[&ModuleHandle<B>],
    duplicates: f64,
) -> BusHandle<B> {
    modules
        .iter()
        .fold(db.bus(), |b, m| b.module(m))
        .retry_policy(fast_retries())
        .scan_interval(Duration::from_millis(200))
        .duplicate_rate(duplicates)
        .start()
        .await
        .expect("bus starts")
}

/// Publishes `rounds` changes of each key, interleaved, one transaction
/// each; every fifth round publishes two changes of a key in one
/// transaction. Returns how many changes each key got.
async fn publish_changes<B: TestBackend>(
    catalog: &ModuleHandle<B>,
    keys: &[&str],
    rounds: u64,
) -> BTreeMap<String, u64> {
    let mut published: BTreeMap<String, u64> = BTreeMap::new();
    for round in 0..rounds {
        for key in keys {
            let n = published.entry(key.to_string()).or_default();
            let twice = round % 5 == 4;
            let first = *n;
            let key = key.to_string();
            catalog
                .transaction(async move |tx| {
                    tx.publish_keyed(
                        &key,
                        &Change {
                            key: key.clone(),
                            n: first,
                        },
                    )?;
                    if twice {
                        tx.publish_keyed(
                            &key,
                            &Change {
                                key: key.clone(),
                                n: first + 1,
                            },
                        )?;
                    }
                    Ok::<_, tickbox::Error>(())
                })
                .await
                .expect("publish commits");
            *n += if twice { 2 } else { 1 };
        }
    }
    published
}

/// The rows the handler committed: per key, `(seq, n)` in the order the
/// handler ran them.
async fn seen<B: TestBackend>(copy: &ModuleHandle<B>) -> BTreeMap<String, Vec<(i64, i64)>> {
    let rows = copy
        .read(async move |tx| {
            Ok::<_, tickbox::Error>(
                B::keyed_rows(
                    tx.conn(),
                    "SELECT ordering_key, seq, n FROM seen ORDER BY turn".to_string(),
                )
                .await?,
            )
        })
        .await
        .expect("read seen");
    let mut by_key: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for row in rows {
        by_key
            .entry(row.ordering_key)
            .or_default()
            .push((row.seq, row.n));
    }
    by_key
}

/// Each key's messages were handled exactly once each, in order: sequence
/// 1, 2, 3… in the order the handler ran them, and n in publishing order.
fn assert_in_order(seen: &BTreeMap<String, Vec<(i64, i64)>>, expected: &BTreeMap<String, u64>) {
    for (key, count) in expected {
        let rows = seen.get(key).cloned().unwrap_or_default();
        let want: Vec<(i64, i64)> = (0..*count as i64).map(|n| (n + 1, n)).collect();
        assert_eq!(rows, want, "key {key}: (sequence, n) in the order handled");
    }
}

/// A session tracking what the modules do; the handlers' failures and
/// panics are part of these tests.
fn tracking<B: TestBackend>(modules: &[&ModuleHandle<B>]) -> Session<B> {
    let modules: Vec<ModuleHandle<B>> = modules.iter().map(|m| (*m).clone()).collect();
    Session::over(&modules).allow_failures()
}

/// Waits until the session's flow is done, then checks that `copy` applied
/// `total` changes.
async fn applied<B: TestBackend>(session: &Session<B>, copy: &ModuleHandle<B>, total: u64) {
    session.wait().await;
    assert_eq!(
        count(copy, "SELECT count(*) AS n FROM seen").await,
        total as i64,
        "changes applied"
    );
}

pub async fn interleaved_keys_arrive_in_order_through_failures_panics_and_duplicates<
    B: TestBackend,
>(
    db: TestDb,
) {
    let handler = Apply::new(Disturb {
        fail_every: Some(3),
        panic_every: Some(7),
        poison: None,
    });
    let (catalog, copy) = catalog_and_copy::<B>(&db, &handler, false).await;
    let bus = start_bus(&db, &[&catalog, &copy], 0.3).await;
    let session = tracking(&[&catalog, &copy]);
    let keys = ["a", "b", "c", "d", "e"];
    let published = publish_changes(&catalog, &keys, 12).await;
    let total: u64 = published.values().sum();
    applied(&session, &copy, total).await;
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"));
    assert_in_order(&seen(&copy).await, &published);
    let metrics = copy.metrics();
    assert!(metrics.handlers[0].failed > 0, "failures were injected");
    assert!(
        bus.metrics().duplicates_injected > 0,
        "duplicates were injected"
    );
    assert!(copy
        .dead_letters(0, 10)
        .await
        .expect("dead letters")
        .is_empty());
    bus.stop().await;
}

pub async fn a_poison_message_parks_only_its_key_and_replaying_it_restores_the_order<
    B: TestBackend,
>(
    db: TestDb,
) {
    static POISONED: AtomicBool = AtomicBool::new(true);
    POISONED.store(true, SeqCst);
    let handler = Apply::new(Disturb {
        poison: Some(("c", 3, &POISONED)),
        ..Disturb::default()
    });
    let (catalog, copy) = catalog_and_copy::<B>(&db, &handler, false).await;
    let bus = start_bus(&db, &[&catalog, &copy], 0.0).await;
    let session = tracking(&[&catalog, &copy]);
    let keys = ["a", "b", "c", "d"];
    let published = publish_changes(&catalog, &keys, 8).await;
    let per_key = published["c"];
    let total: u64 = published.values().sum();
    // Everything but c's fourth change (n = 3) onwards, which are dead
    // letters.
    applied(&session, &copy, total - (per_key - 3)).await;
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"));

    let seen_now = seen(&copy).await;
    let mut others = published.clone();
    others.remove("c");
    assert_in_order(&seen_now, &others);
    assert_eq!(
        seen_now["c"],
        [(1, 0), (2, 1), (3, 2)],
        "c stops before the poison"
    );
    let dead = copy.dead_letters(0, 100).await.expect("dead letters");
    assert_eq!(
        dead.len() as u64,
        per_key - 3,
        "the poison and every later change of c"
    );
    let head = dead
        .iter()
        .find(|d| d.parked_behind.is_none())
        .expect("the poison itself");
    assert_eq!(head.keyed.as_ref().map(|k| k.sequence), Some(4));
    assert!(dead
        .iter()
        .filter(|d| d.message_id != head.message_id)
        .all(|d| d.parked_behind == Some(head.message_id)
            && d.keyed.as_ref().is_some_and(|k| k.key == "c")));
    let stats = copy.store_stats().await.expect("stats");
    assert_eq!(stats.parked_keys, vec![(HANDLER.to_string(), 1)]);

    // A parked message cannot be replayed ahead of the one it waits for.
    let parked = dead
        .iter()
        .find(|d| d.parked_behind.is_some())
        .expect("a parked one");
    let refused = copy
        .replay_dead_letter(parked.message_id, HANDLER)
        .await
        .expect_err("parked behind the poison");
    assert!(refused.to_string().contains("parked"), "{refused}");

    // More changes of c while it is parked wait too; the other keys flow.
    let session = tracking(&[&catalog, &copy]);
    let later = publish_changes(&catalog, &["c", "a"], 1).await;
    assert_eq!(later.values().sum::<u64>(), 2);
    let report = session.wait().await;
    assert_eq!(report.handled(HANDLER).len(), 1, "a's new change: {report}");
    assert_eq!(
        report.dead_letters(HANDLER).len(),
        1,
        "c's, parked: {report}"
    );
    assert_eq!(
        count(
            &copy,
            "SELECT count(*) AS n FROM seen WHERE ordering_key = 'a'",
        )
        .await,
        published["a"] as i64 + 1
    );
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"));

    POISONED.store(false, SeqCst);
    let replayed = copy
        .replay_dead_letter(head.message_id, HANDLER)
        .await
        .expect("replay");
    assert_eq!(replayed, Replayed::Delivered(Outcome::Handled));
    let mut all = published.clone();
    *all.get_mut("c").expect("c") += 1;
    *all.get_mut("a").expect("a") += 1;
    // The later change of c (a publishing run of its own) has n = 0 again:
    // compare sequences, which run on.
    let seen_after = seen(&copy).await;
    let c: Vec<i64> = seen_after["c"].iter().map(|(seq, _)| *seq).collect();
    assert_eq!(
        c,
        (1..=all["c"] as i64).collect::<Vec<_>>(),
        "c in order after the replay"
    );
    assert!(copy
        .dead_letters(0, 100)
        .await
        .expect("dead letters")
        .is_empty());
    assert!(copy
        .store_stats()
        .await
        .expect("stats")
        .parked_keys
        .is_empty());
    bus.stop().await;
}

pub async fn skipping_a_parked_keys_dead_letter_lets_the_key_move_on<B: TestBackend>(db: TestDb) {
    static POISONED: AtomicBool = AtomicBool::new(true);
    POISONED.store(true, SeqCst);
    let handler = Apply::new(Disturb {
        poison: Some(("k", 1, &POISONED)),
        ..Disturb::default()
    });
    let (catalog, copy) = catalog_and_copy::<B>(&db, &handler, false).await;
    let bus = start_bus(&db, &[&catalog, &copy], 0.0).await;
    let session = tracking(&[&catalog, &copy]);
    publish_changes(&catalog, &["k"], 4).await;
    session.wait().await;
    assert_eq!(
        copy.dead_letters(0, 10).await.expect("dead letters").len(),
        3,
        "the poison and the ones after it"
    );
    assert_eq!(seen(&copy).await["k"], [(1, 0)]);
    let dead = copy.dead_letters(0, 10).await.expect("dead letters");
    let head = dead
        .iter()
        .find(|d| d.parked_behind.is_none())
        .expect("head");
    assert!(copy
        .skip_dead_letter(head.message_id, HANDLER)
        .await
        .expect("skip"));
    assert_eq!(
        seen(&copy).await["k"],
        [(1, 0), (3, 2), (4, 3)],
        "the key moves on without the skipped change, in order"
    );
    assert!(copy
        .dead_letters(0, 10)
        .await
        .expect("dead letters")
        .is_empty());
    // The skipped message, should it come again, is stale: skipped.
    let again = copy
        .deliver_to(head.envelope(), HANDLER)
        .await
        .expect("delivered");
    assert_eq!(again, Outcome::Duplicate);
    bus.stop().await;
}

pub async fn order_holds_across_a_restart<B: TestBackend>(db: TestDb) {
    let handler = Apply::new(Disturb {
        fail_every: Some(2),
        ..Disturb::default()
    });
    let (catalog, copy) = catalog_and_copy::<B>(&db, &handler, false).await;
    let keys = ["a", "b", "c"];
    let first = start_bus(&db, &[&catalog, &copy], 0.0).await;
    // Over the modules, so that the session follows the flow across both
    // buses.
    let session = tracking(&[&catalog, &copy]);
    let published = publish_changes(&catalog, &keys, 10).await;
    // Stop while deliveries are under way (every other one fails first).
    first.stop().await;
    let handled_before = count(&copy, "SELECT count(*) AS n FROM seen").await;
    let second = start_bus(&db, &[&catalog, &copy], 0.0).await;
    let total: u64 = published.values().sum();
    applied(&session, &copy, total).await;
    assert!(second.wait_idle(WAIT).await.expect("wait_idle"));
    assert!(
        (handled_before as u64) < total,
        "the first bus stopped with work left ({handled_before} of {total})"
    );
    assert_in_order(&seen(&copy).await, &published);
    second.stop().await;
}

pub async fn two_processes_sharing_the_outbox_keep_each_keys_order<B: TestBackend>(db: TestDb) {
    let handler = Apply::new(Disturb {
        fail_every: Some(4),
        ..Disturb::default()
    });
    let (catalog, copy) = catalog_and_copy::<B>(&db, &handler, false).await;
    // A second process: the same modules over the same databases.
    let (catalog_2, copy_2) = catalog_and_copy::<B>(&db, &handler, false).await;
    let one = start_bus(&db, &[&catalog, &copy], 0.0).await;
    let two = start_bus(&db, &[&catalog_2, &copy_2], 0.0).await;
    let session = tracking(&[&catalog, &copy, &catalog_2, &copy_2]);
    let keys = ["a", "b", "c", "d"];
    let (first_half, second_half) = tokio::join!(
        publish_changes(&catalog, &keys[..2], 10),
        publish_changes(&catalog_2, &keys[2..], 10),
    );
    let mut published = first_half;
    published.extend(second_half);
    let total: u64 = published.values().sum();
    applied(&session, &copy, total).await;
    assert!(one.wait_idle(WAIT).await.expect("wait_idle"));
    assert!(two.wait_idle(WAIT).await.expect("wait_idle"));
    assert_in_order(&seen(&copy).await, &published);
    one.stop().await;
    two.stop().await;
}

pub async fn a_batched_handler_receives_each_key_in_order<B: TestBackend>(db: TestDb) {
    let handler = Apply::new(Disturb {
        fail_every: Some(5),
        ..Disturb::default()
    });
    let (catalog, copy) = catalog_and_copy::<B>(&db, &handler, true).await;
    // Published before the bus starts, so that its first scan finds every
    // key's messages waiting at once and batches form (a bus that keeps up
    // with the publisher would deliver each message alone).
    let session = tracking(&[&catalog, &copy]);
    let keys = ["a", "b", "c", "d", "e", "f"];
    let published = publish_changes(&catalog, &keys, 8).await;
    let bus = start_bus(&db, &[&catalog, &copy], 0.2).await;
    let total: u64 = published.values().sum();
    applied(&session, &copy, total).await;
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"));
    assert_in_order(&seen(&copy).await, &published);
    assert!(
        copy.metrics().handlers[0].batches > 0,
        "some deliveries ran in batches"
    );
    bus.stop().await;
}

pub async fn concurrent_publishers_of_one_key_are_numbered_in_commit_order<B: TestBackend>(
    db: TestDb,
) {
    let handler = Apply::new(Disturb::default());
    let (catalog, copy) = catalog_and_copy::<B>(&db, &handler, false).await;
    let bus = start_bus(&db, &[&catalog, &copy], 0.0).await;
    let session = tracking(&[&catalog, &copy]);
    let publishers = (0..4).map(|p| {
        let catalog = catalog.clone();
        async move {
            for i in 0..10 {
                catalog
                    .transaction(async move |tx| {
                        tx.publish_keyed(
                            "hot",
                            &Change {
                                key: "hot".into(),
                                n: p * 100 + i,
                            },
                        )?;
                        // Unkeyed-looking work between the numbering and
                        // the commit would not change the order: the key's
                        // counter is taken at commit.
                        Ok::<_, tickbox::Error>(())
                    })
                    .await
                    .expect("publish commits");
            }
        }
    });
    futures_util::future::join_all(publishers).await;
    applied(&session, &copy, 40).await;
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"));
    let hot = &seen(&copy).await["hot"];
    let sequences: Vec<i64> = hot.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(
        sequences,
        (1..=40).collect::<Vec<_>>(),
        "numbered 1..40 without gaps, handled in that order"
    );
    // Each publisher's own changes keep its order too.
    for p in 0..4 {
        let mine: Vec<i64> = hot
            .iter()
            .map(|(_, n)| *n)
            .filter(|n| n / 100 == p)
            .collect();
        assert_eq!(mine, (0..10).map(|i| p * 100 + i).collect::<Vec<_>>());
    }
    bus.stop().await;
}

pub async fn a_handler_that_joins_later_starts_each_key_where_it_joins<B: TestBackend>(db: TestDb) {
    let handler = Apply::new(Disturb::default());
    let (catalog, copy) = catalog_and_copy::<B>(&db, &handler, false).await;
    let bus = start_bus(&db, &[&catalog, &copy], 0.0).await;
    let session = tracking(&[&catalog, &copy]);
    publish_changes(&catalog, &["k"], 3).await;
    applied(&session, &copy, 3).await;
    bus.stop().await;

    // A new handler joins: the key's next message starts the key for it
    // (its three earlier ones were published before it first started), and
    // it then follows the key in order.
    let late = copy_module::<B>(
        &db,
        "late",
        "late.apply",
        &Apply::new(Disturb {
            fail_every: Some(2),
            ..Disturb::default()
        }),
        HandlerOptions::default(),
    )
    .await;
    let bus = start_bus(&db, &[&catalog, &copy, &late], 0.0).await;
    let session = tracking(&[&catalog, &copy, &late]);
    for n in 3..8 {
        catalog
            .transaction(async move |tx| tx.publish_keyed("k", &Change { key: "k".into(), n }))
            .await
            .expect("publish commits");
    }
    applied(&session, &late, 5).await;
    assert_eq!(count(&copy, "SELECT count(*) AS n FROM seen").await, 8);
    assert!(bus.wait_idle(WAIT).await.expect("wait_idle"));
    assert_eq!(
        seen(&late).await["k"],
        [(4, 3), (5, 4), (6, 5), (7, 6), (8, 7)],
        "the late handler starts at the key's fourth message and keeps its order"
    );
    bus.stop().await;
}
