//! The effects journal: an external call made through `Delivery::effect`
//! is recorded before and after it, so a redelivered message gets the
//! recorded result back instead of calling again, and an effect a crash
//! left unfinished is called again with the same key or reported unknown.
//!
//! A crash between the call and the journal's commit is played by a
//! panic inside the call (the journal then holds `started` with no
//! outcome, exactly as after a SIGKILL there); the process tests of
//! minishop do it with real processes and a real mail server.

use super::{bus, drained, fast_retries, publish};
use crate::support::*;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tickbox::testing::Session;
use tickbox::{
    Delivery, EffectPolicy, EffectRecord, EffectState, Envelope, FailureKind, Handler,
    HandlerError, HandlerOptions, ModuleHandle, Outcome, Replayed, Retention, RetryPolicy,
    Settlement, Tx,
};

const HANDLER: &str = "notifications.notify";
const EFFECT: &str = "send";

/// A handler that makes one external call (`send`) per message through
/// the journal, and can be told to fail around it.
#[derive(Clone)]
struct Notify {
    policy: EffectPolicy,
    /// Calls that reached the external system (the closure), per message.
    sent: Arc<Mutex<Vec<(u64, String)>>>,
    /// What `effect` returned to the handler, per delivery that got it.
    results: Arc<Mutex<Vec<(u64, String)>>>,
    /// The first n calls "send" and then crash before the outcome is
    /// recorded (a panic inside the call).
    crash_after_sending: Arc<AtomicU32>,
    /// The first n calls fail without sending (a transient error).
    fail_calls: Arc<AtomicU32>,
    /// Calls fail permanently while this is on.
    fail_permanently: Arc<AtomicBool>,
    /// The first n deliveries fail after the effect, before COMMIT.
    fail_after_effect: Arc<AtomicU32>,
    /// Deliveries of this message fail after the effect, every time.
    poison: Option<u64>,
    /// Calls the effect twice under one name.
    same_name_twice: bool,
}

impl Notify {
    fn new(policy: EffectPolicy) -> Self {
        Notify {
            policy,
            sent: Arc::default(),
            results: Arc::default(),
            crash_after_sending: Arc::default(),
            fail_calls: Arc::default(),
            fail_permanently: Arc::default(),
            fail_after_effect: Arc::default(),
            poison: None,
            same_name_twice: false,
        }
    }

    fn sent(&self) -> Vec<(u64, String)> {
        self.sent.lock().unwrap().clone()
    }

    fn results(&self) -> Vec<(u64, String)> {
        self.results.lock().unwrap().clone()
    }
}

/// Takes one from a countdown; true if it was above zero.
fn take(countdown: &AtomicU32) -> bool {
    countdown
        .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

impl<B: TestBackend> Handler<B> for Notify {
    type Message = Ping;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        ping: Ping,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        write_change(tx, delivery).await?;
        let n = ping.n;
        let call = |key: String| async move {
            if take(&self.fail_calls) {
                return Err(HandlerError::msg("the mail server said 421, try later"));
            }
            if self.fail_permanently.load(SeqCst) {
                return Err(HandlerError::permanent(HandlerError::msg(
                    "the mail server said 550, no such user",
                )));
            }
            self.sent.lock().unwrap().push((n, key.clone()));
            if take(&self.crash_after_sending) {
                panic!("crashed after sending, before the outcome was recorded");
            }
            Ok::<_, HandlerError>(format!("250 queued as {key}"))
        };
        let reply: String = delivery.effect(EFFECT, self.policy, call).await?;
        self.results.lock().unwrap().push((n, reply));
        if self.same_name_twice {
            let again = |_key: String| async { Ok::<_, HandlerError>(()) };
            delivery.effect(EFFECT, self.policy, again).await?;
        }
        if take(&self.fail_after_effect) || self.poison == Some(n) {
            return Err(HandlerError::msg("failed after the effect, before COMMIT"));
        }
        Ok(())
    }
}

fn within_an_hour() -> EffectPolicy {
    EffectPolicy::at_least_once_with_key(Duration::from_secs(3600))
}

async fn notifications<B: TestBackend>(db: &TestDb, handler: &Notify) -> ModuleHandle<B> {
    notifications_with(db, handler, HandlerOptions::new()).await
}

async fn notifications_with<B: TestBackend>(
    db: &TestDb,
    handler: &Notify,
    options: HandlerOptions,
) -> ModuleHandle<B> {
    let module = B::module(db, "notifications")
        .handler_with(HANDLER, handler.clone(), options)
        .start()
        .await
        .expect("notifications starts");
    create_changes(&module).await;
    module
}

/// The journal's entry of the `send` effect for message `id`.
async fn entry<B: TestBackend>(module: &ModuleHandle<B>, id: uuid::Uuid) -> EffectRecord {
    let all = module.effects(&[], 0, 1000).await.expect("effects list");
    all.into_iter()
        .find(|e| e.message_id == id && e.handler == HANDLER && e.effect == EFFECT)
        .unwrap_or_else(|| panic!("no journal entry for message {id}"))
}

fn ping(n: u64) -> Envelope {
    Envelope::encode(&Ping { n }).expect("encodes")
}

pub async fn a_recorded_result_comes_back_on_redelivery_without_calling_again<B: TestBackend>(
    db: TestDb,
) {
    let handler = Notify::new(within_an_hour());
    handler.fail_after_effect.store(1, SeqCst);
    let module = notifications::<B>(&db, &handler).await;
    let envelope = ping(1);

    let first = module.deliver_to(envelope.clone(), HANDLER).await;
    assert_eq!(
        first.expect_err("fails after the effect").kind,
        FailureKind::Handler
    );
    assert_eq!(
        changes(&module, HANDLER).await,
        0,
        "the handler's changes rolled back"
    );
    let recorded = entry(&module, envelope.id).await;
    assert_eq!(recorded.state, EffectState::Succeeded, "{recorded:?}");

    let second = module.deliver_to(envelope.clone(), HANDLER).await;
    assert_eq!(second, Ok(Outcome::Handled));
    let sent = handler.sent();
    assert_eq!(sent.len(), 1, "the external call was made once: {sent:?}");
    let results = handler.results();
    assert_eq!(results.len(), 2);
    assert_eq!(
        results[0], results[1],
        "the redelivery got the recorded result back"
    );
    assert_eq!(results[1].1, format!("250 queued as {}", sent[0].1));

    let recorded = entry(&module, envelope.id).await;
    assert_eq!(
        (recorded.state, recorded.calls),
        (EffectState::Succeeded, 1)
    );
    assert_eq!(recorded.key, sent[0].1, "the journal keeps the key given");
    assert_eq!(
        recorded.result.as_deref(),
        Some(format!("\"{}\"", results[0].1).as_str())
    );
    let counted = module.metrics().effects;
    assert_eq!(counted.len(), 1, "{counted:?}");
    let counted = &counted[0];
    assert_eq!(
        (counted.handler.as_str(), counted.effect.as_str()),
        (HANDLER, EFFECT)
    );
    assert_eq!(
        (
            counted.started,
            counted.succeeded,
            counted.reused,
            counted.failed,
            counted.unknown
        ),
        (1, 1, 1, 0, 0)
    );

    // Another message has another key.
    assert_eq!(
        module.deliver_to(ping(2), HANDLER).await,
        Ok(Outcome::Handled)
    );
    let sent = handler.sent();
    assert_eq!(sent.len(), 2);
    assert_ne!(
        sent[0].1, sent[1].1,
        "each message's effect has its own key"
    );
}

pub async fn an_effect_name_used_twice_in_one_delivery_is_a_clear_permanent_error<
    B: TestBackend,
>(
    db: TestDb,
) {
    let mut handler = Notify::new(within_an_hour());
    handler.same_name_twice = true;
    let module = notifications::<B>(&db, &handler).await;
    let failed = module
        .deliver_to(ping(1), HANDLER)
        .await
        .expect_err("the second use of the name fails");
    assert_eq!(failed.kind, FailureKind::Permanent, "{failed}");
    assert!(
        failed.reason.contains("used effect name `send` twice"),
        "{}",
        failed.reason
    );
    assert_eq!(handler.sent().len(), 1, "the first use called out once");
    assert_eq!(changes(&module, HANDLER).await, 0);
}

pub async fn an_effect_cut_short_is_called_again_with_the_same_key_within_its_window<
    B: TestBackend,
>(
    db: TestDb,
) {
    let handler = Notify::new(within_an_hour());
    handler.crash_after_sending.store(1, SeqCst);
    let module = notifications::<B>(&db, &handler).await;
    let envelope = ping(1);

    let crashed = module.deliver_to(envelope.clone(), HANDLER).await;
    assert_eq!(
        crashed.expect_err("the call panics").kind,
        FailureKind::Panic
    );
    let left = entry(&module, envelope.id).await;
    assert_eq!(
        (left.state, left.calls),
        (EffectState::Started, 1),
        "{left:?}"
    );

    assert_eq!(
        module.deliver_to(envelope.clone(), HANDLER).await,
        Ok(Outcome::Handled)
    );
    let sent = handler.sent();
    assert_eq!(sent.len(), 2, "called again: {sent:?}");
    assert_eq!(sent[0].1, sent[1].1, "with the same key");
    let done = entry(&module, envelope.id).await;
    assert_eq!((done.state, done.calls), (EffectState::Succeeded, 2));
    assert_eq!(changes(&module, HANDLER).await, 1);
}

pub async fn a_call_due_after_its_keys_window_is_refused_until_a_person_allows_it<
    B: TestBackend,
>(
    db: TestDb,
) {
    // A window of a microsecond has always passed by the next attempt.
    let handler = Notify::new(EffectPolicy::at_least_once_with_key(Duration::from_micros(
        1,
    )));
    handler.crash_after_sending.store(1, SeqCst);
    let module = notifications::<B>(&db, &handler).await;
    let envelope = ping(1);
    module
        .deliver_to(envelope.clone(), HANDLER)
        .await
        .expect_err("the call panics");

    for _ in 0..2 {
        let refused = module
            .deliver_to(envelope.clone(), HANDLER)
            .await
            .expect_err("not sent blind after the window");
        assert_eq!(refused.kind, FailureKind::Permanent, "{refused}");
        assert!(refused.reason.contains("window"), "{}", refused.reason);
        assert!(
            refused.reason.contains("effects retry"),
            "{}",
            refused.reason
        );
    }
    assert_eq!(handler.sent().len(), 1, "no call after the window");
    let unknown = entry(&module, envelope.id).await;
    assert_eq!(unknown.state, EffectState::Unknown, "{unknown:?}");
    assert!(
        unknown.error.as_deref().unwrap_or("").contains("window"),
        "{unknown:?}"
    );
    assert_eq!(
        module.store_stats().await.expect("stats").unknown_effects,
        vec![(HANDLER.to_string(), 1)]
    );

    let settled = module
        .settle_effect(envelope.id, HANDLER, EFFECT, Settlement::Retry)
        .await
        .expect("a person allows one more call");
    assert_eq!(settled.state, EffectState::Retry);
    assert_eq!(
        module.deliver_to(envelope.clone(), HANDLER).await,
        Ok(Outcome::Handled)
    );
    let sent = handler.sent();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].1, sent[1].1, "the retry uses the same key");
    let done = entry(&module, envelope.id).await;
    assert_eq!((done.state, done.calls), (EffectState::Succeeded, 2));
    assert!(module
        .store_stats()
        .await
        .expect("stats")
        .unknown_effects
        .is_empty());
}

pub async fn an_at_most_once_effect_cut_short_becomes_unknown_and_is_dead_lettered<
    B: TestBackend,
>(
    db: TestDb,
) {
    let handler = Notify::new(EffectPolicy::at_most_once());
    handler.crash_after_sending.store(1, SeqCst);
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let module = notifications::<B>(&db, &handler).await;
    let bus = bus(&db, &[&orders, &module]).await;
    let session = Session::start(&bus).allow_failures();
    let id = publish(&orders, 1).await;

    let report = session.wait().await;
    assert_eq!(report.dead_letters(HANDLER).len(), 1, "{report}");
    drained(&bus).await;
    let dead = module
        .dead_letter(id, HANDLER)
        .await
        .expect("read")
        .expect("dead letter");
    assert!(dead.reason.contains("unknown"), "{}", dead.reason);
    assert!(dead.reason.contains("effects done"), "{}", dead.reason);
    assert_eq!(handler.sent().len(), 1, "never called twice");
    let unknown = entry(&module, id).await;
    assert_eq!((unknown.state, unknown.calls), (EffectState::Unknown, 1));
    let counted = &module.metrics().effects[0];
    assert_eq!((counted.started, counted.unknown), (1, 1));

    // A person checks the mail server: it went out. Done, with the result.
    let settled = module
        .settle_effect(
            id,
            HANDLER,
            EFFECT,
            Settlement::Done {
                result: serde_json::json!("250 seen in the server's log"),
            },
        )
        .await
        .expect("settled");
    assert_eq!(settled.state, EffectState::Succeeded);
    let replayed = module
        .replay_dead_letter(id, HANDLER)
        .await
        .expect("replay");
    assert_eq!(replayed, Replayed::Delivered(Outcome::Handled));
    assert_eq!(handler.sent().len(), 1, "still called once");
    assert_eq!(
        handler.results(),
        vec![(1, "250 seen in the server's log".to_string())],
        "the handler got the settled result"
    );
    assert_eq!(changes(&module, HANDLER).await, 1);

    // Settled and succeeded: nothing more to settle.
    let again = module
        .settle_effect(id, HANDLER, EFFECT, Settlement::Retry)
        .await
        .expect_err("a succeeded effect cannot be settled");
    assert!(again.to_string().contains("nothing to settle"), "{again}");
    let missing = module
        .settle_effect(id, HANDLER, "no_such_effect", Settlement::Retry)
        .await
        .expect_err("no such effect");
    assert!(missing.to_string().contains("no such effect"), "{missing}");
    bus.stop().await;
}

pub async fn a_failed_call_follows_the_retry_policy<B: TestBackend>(db: TestDb) {
    let handler = Notify::new(EffectPolicy::at_most_once());
    handler.fail_calls.store(1, SeqCst);
    let module = notifications::<B>(&db, &handler).await;
    let envelope = ping(1);

    let failed = module
        .deliver_to(envelope.clone(), HANDLER)
        .await
        .expect_err("the call fails");
    assert_eq!(failed.kind, FailureKind::Handler);
    assert!(failed.reason.contains("421"), "{}", failed.reason);
    let recorded = entry(&module, envelope.id).await;
    assert_eq!(recorded.state, EffectState::Failed);
    assert!(recorded.error.as_deref().unwrap_or("").contains("421"));

    // A failed call did not happen: even at most once, it is called again.
    assert_eq!(
        module.deliver_to(envelope.clone(), HANDLER).await,
        Ok(Outcome::Handled)
    );
    let done = entry(&module, envelope.id).await;
    assert_eq!((done.state, done.calls), (EffectState::Succeeded, 2));
    assert_eq!(handler.sent().len(), 1, "one call went through");

    handler.fail_permanently.store(true, SeqCst);
    let failed = module
        .deliver_to(ping(2), HANDLER)
        .await
        .expect_err("the call fails for good");
    assert_eq!(failed.kind, FailureKind::Permanent, "{failed}");
    assert!(failed.reason.contains("550"), "{}", failed.reason);
    let recorded = module
        .effects(&[EffectState::Failed], 0, 10)
        .await
        .expect("list");
    assert_eq!(recorded.len(), 1, "{recorded:?}");
    assert!(recorded[0].error.as_deref().unwrap_or("").contains("550"));
}

pub async fn a_batch_that_falls_back_calls_no_effect_twice<B: TestBackend>(db: TestDb) {
    let mut handler = Notify::new(within_an_hour());
    handler.poison = Some(3);
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let module = notifications_with::<B>(&db, &handler, HandlerOptions::new().batch(8)).await;
    let session = Session::over(&[orders.clone(), module.clone()]).allow_failures();
    // Published before the bus starts, so that batches form.
    let mut ids = Vec::new();
    for n in 0..12 {
        ids.push(publish(&orders, n).await);
    }
    let bus = db
        .bus()
        .module(&orders)
        .module(&module)
        .retry_policy(RetryPolicy {
            max_attempts: Some(3),
            ..fast_retries()
        })
        .start()
        .await
        .expect("bus starts");
    let report = session.wait().await;
    assert_eq!(changes(&module, HANDLER).await, 11);
    assert_eq!(report.dead_letters(HANDLER).len(), 1, "{report}");
    assert!(module
        .dead_letter(ids[3], HANDLER)
        .await
        .expect("read")
        .is_some());
    drained(&bus).await;
    let mut sent: Vec<u64> = handler.sent().into_iter().map(|(n, _)| n).collect();
    sent.sort_unstable();
    assert_eq!(
        sent,
        (0..12).collect::<Vec<u64>>(),
        "each message called out once"
    );
    let counted = &module.metrics().effects[0];
    assert_eq!(counted.started, 12);
    assert!(
        counted.reused >= 2,
        "the poison message's retries reused its result: {counted:?}"
    );
    bus.stop().await;
}

pub async fn the_retention_sweep_removes_settled_effects_but_not_a_dead_letters<B: TestBackend>(
    db: TestDb,
) {
    let mut handler = Notify::new(within_an_hour());
    handler.poison = Some(2);
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let module = notifications::<B>(&db, &handler).await;
    let bus = db
        .bus()
        .module(&orders)
        .module(&module)
        .retry_policy(RetryPolicy {
            max_attempts: Some(1),
            ..fast_retries()
        })
        .start()
        .await
        .expect("bus starts");
    let session = Session::start(&bus).allow_failures();
    let handled = publish(&orders, 1).await;
    // Message 2 succeeds at its effect and is then dead-lettered: a replay
    // must find its effect recorded, however old.
    let dead = publish(&orders, 2).await;
    let report = session.wait().await;
    assert_eq!(report.handled(HANDLER).len(), 1, "{report}");
    assert_eq!(report.dead_letters(HANDLER).len(), 1, "{report}");
    bus.stop().await;
    module.close();

    // The module again, keeping processed rows for a millisecond.
    let module = B::module(&db, "notifications")
        .handler(HANDLER, handler.clone())
        .retention(Retention {
            inbox: Some(Duration::from_millis(1)),
            ..Retention::default()
        })
        .start()
        .await
        .expect("notifications starts again");
    assert_eq!(module.effects(&[], 0, 100).await.expect("list").len(), 2);
    eventually("the handled message's effect is swept", WAIT, || async {
        module.sweep_retention().await.expect("sweep");
        let left = module.effects(&[], 0, 100).await.expect("list");
        !left.iter().any(|e| e.message_id == handled)
    })
    .await;
    let left = module.effects(&[], 0, 100).await.expect("list");
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].message_id, dead, "the dead letter's effect is kept");
    assert_eq!(left[0].state, EffectState::Succeeded);
}
