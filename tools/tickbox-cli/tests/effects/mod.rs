//! `effects list`, `effects done`, `effects retry` and the unknown effects
//! of `status`, run as a separate process against a module whose handler
//! really made an at-most-once effect that a crash cut short: the first
//! call panics after "sending" (the journal keeps it `started`, as after a
//! SIGKILL), the retry finds it started, it becomes unknown and the
//! delivery is dead-lettered.

use crate::support::*;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tickbox::diesel_async::SimpleAsyncConnection as _;
use tickbox::{
    Backend, Bus, Delivery, EffectPolicy, Handler, HandlerError, HandlerOptions, ModuleHandle,
    RetryPolicy, Tx,
};
use uuid::Uuid;

const HANDLER: &str = "orders.notify";
const EFFECT: &str = "notify";

/// A handler that "sends" one notification per message through the
/// effects journal, at most once, and records the reply it got in the
/// table `cli_notified` in its own transaction.
#[derive(Clone, Default)]
struct Notify {
    /// While on, every call "sends" and then panics before its outcome is
    /// recorded: a crash cut it short.
    crash: Arc<AtomicBool>,
    /// Calls that reached the external system (the closure ran).
    calls: Arc<AtomicU32>,
}

impl<B: Backend> Handler<B> for Notify {
    type Message = CliPing;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        _message: CliPing,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let call = |key: String| async move {
            self.calls.fetch_add(1, SeqCst);
            if self.crash.load(SeqCst) {
                panic!("crashed after sending, before the outcome was recorded");
            }
            Ok::<_, HandlerError>(format!("sent with key {key}"))
        };
        let reply: String = delivery
            .effect(EFFECT, EffectPolicy::at_most_once(), call)
            .await?;
        tx.conn()
            .batch_execute(&format!(
                "INSERT INTO cli_notified (reply) VALUES ('{}')",
                reply.replace('\'', "''")
            ))
            .await?;
        Ok(())
    }
}

/// Retries after a few milliseconds, twice at most: an unknown effect is
/// dead-lettered at once.
fn quick_retries() -> RetryPolicy {
    RetryPolicy {
        initial_delay: Duration::from_millis(5),
        max_delay: Duration::from_millis(20),
        max_attempts: Some(2),
        ..RetryPolicy::default()
    }
}

/// The test's module with the notifying handler, and the table its handler
/// writes.
async fn notifier<B: CliBackend>(db: &Db, notify: &Notify) -> ModuleHandle<B> {
    let module = B::module(db)
        .publishes::<CliPing>()
        .handler_with(
            HANDLER,
            notify.clone(),
            HandlerOptions::new().retry(quick_retries()),
        )
        .start()
        .await
        .expect("the orders module starts");
    execute(
        &module,
        "CREATE TABLE cli_notified (reply TEXT NOT NULL)".into(),
    )
    .await;
    module
}

/// A bus over `module`, scanning its outbox often (SQLite has no wake-up).
async fn bus<B: CliBackend>(module: &ModuleHandle<B>) -> tickbox::BusHandle<B> {
    Bus::builder()
        .module(module)
        .scan_interval(Duration::from_millis(50))
        .start()
        .await
        .expect("the bus starts")
}

/// Publishes message `n` for each of `ns` and waits, with a bus running,
/// until each is a dead letter of the handler; the bus is stopped after.
async fn dead_lettered<B: CliBackend>(module: &ModuleHandle<B>, ns: &[u64]) -> Vec<Uuid> {
    let bus = bus(module).await;
    let mut ids = Vec::new();
    for &n in ns {
        let id = module
            .transaction(async move |tx| tx.publish(&CliPing::new(n)))
            .await
            .expect("publish");
        ids.push(id);
    }
    eventually("every message is dead-lettered", || async {
        let dead = module.dead_letters(0, 100).await.expect("dead letters");
        ids.iter().all(|id| {
            dead.iter()
                .any(|d| d.message_id == *id && d.handler == HANDLER)
        })
    })
    .await;
    bus.stop().await;
    ids
}

/// The replies the handler committed, in the database.
async fn replies<B: CliBackend>(module: &ModuleHandle<B>) -> Vec<String> {
    B::texts(module, "SELECT reply AS text FROM cli_notified").await
}

/// `--json effects list` with `args` after it.
async fn effects<B: CliBackend>(db: &Db, args: &[&str]) -> Vec<Value> {
    let mut all = vec!["--json", "effects", "list"];
    all.extend(args);
    match on::<B>(db, &all).await.json() {
        Value::Array(effects) => effects,
        other => panic!("an array: {other}"),
    }
}

/// The effect of message `id`, as `effects list --json` shows it.
async fn effect_of<B: CliBackend>(db: &Db, id: Uuid) -> Value {
    let all = effects::<B>(db, &[]).await;
    let id = id.to_string();
    all.into_iter()
        .find(|e| e["message_id"] == id.as_str())
        .unwrap_or_else(|| panic!("an effect for message {id}"))
}

async fn an_unknown_effect_is_listed_counted_and_settled_as_done<B: CliBackend>(db: Db) {
    let notify = Notify::default();
    notify.crash.store(true, SeqCst);
    let module = notifier::<B>(&db, &notify).await;
    let ids = dead_lettered(&module, &[1]).await;
    let id = ids[0].to_string();
    assert_eq!(notify.calls.load(SeqCst), 1, "called once, never again");

    // Listed: unknown, with why.
    let listed = effects::<B>(&db, &[]).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    let unknown = &listed[0];
    assert_eq!(unknown["message_id"], id.as_str(), "{unknown}");
    assert_eq!(unknown["handler"], HANDLER, "{unknown}");
    assert_eq!(unknown["effect"], EFFECT, "{unknown}");
    assert_eq!(unknown["state"], "unknown", "{unknown}");
    assert_eq!(unknown["policy"], "at-most-once", "{unknown}");
    assert_eq!(unknown["calls"], 1, "{unknown}");
    assert_eq!(unknown["result"], Value::Null, "{unknown}");
    let error = unknown["error"].as_str().expect("why it is unknown");
    assert!(error.contains("never recorded"), "{error}");
    let key = unknown["key"].as_str().expect("a key").to_string();
    assert_eq!(key.len(), 36, "a UUID: {key}");

    let list = on::<B>(&db, &["effects", "list"]).await;
    let out = list.ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("MODULE "), "{out}");
    for header in [
        "MESSAGE ID",
        "HANDLER",
        "EFFECT",
        "STATE",
        "POLICY",
        "CALLS",
        "KEY",
        "UPDATED (UTC)",
        "ERROR",
    ] {
        assert!(lines[0].contains(header), "{header}: {out}");
    }
    assert!(lines[1].starts_with("orders "), "{out}");
    assert!(lines[1].contains(&id), "{out}");
    for cell in [
        HANDLER,
        " notify ",
        " unknown ",
        " at-most-once ",
        " 1 ",
        &key,
        "call 1 was started",
    ] {
        assert!(lines[1].contains(cell), "`{cell}` in: {out}");
    }
    assert!(out.contains("\n1 effect\n"), "{out}");
    assert!(out.contains("`tickbox effects done MESSAGE_ID"), "{out}");

    // By state.
    assert_eq!(effects::<B>(&db, &["--state", "unknown"]).await.len(), 1);
    assert!(
        effects::<B>(&db, &["--state", "succeeded", "--state", "retry"])
            .await
            .is_empty()
    );
    let none = on::<B>(
        &db,
        &["effects", "list", "--state", "succeeded", "--state=retry"],
    )
    .await;
    assert_eq!(none.ok(), "no effects in state succeeded or retry\n");

    // Counted by `status`, per handler.
    let stats = status::<B>(&db).await;
    assert_eq!(
        stats["unknown_effects"],
        serde_json::json!([[HANDLER, 1]]),
        "{stats}"
    );
    assert_eq!(stats["dead_letters"], 1, "{stats}");
    let text = on::<B>(&db, &["status"]).await;
    assert!(
        text.ok()
            .contains("unknown effects  1 effect by handler `orders.notify`  (waiting"),
        "{text:#?}"
    );

    // Refused without --yes, and with a result that is not JSON: nothing
    // changes.
    on::<B>(&db, &["effects", "done", &id, HANDLER, EFFECT])
        .await
        .fails(2, "without --yes");
    on::<B>(
        &db,
        &[
            "effects", "done", &id, HANDLER, EFFECT, "--result", "{oops", "--yes",
        ],
    )
    .await
    .fails(2, "not valid JSON");
    on::<B>(
        &db,
        &[
            "effects", "done", &id, HANDLER, EFFECT, "--result", "ok", "--yes",
        ],
    )
    .await
    .fails(2, "a string needs its quotes");
    assert_eq!(effect_of::<B>(&db, ids[0]).await["state"], "unknown");
    assert_eq!(status::<B>(&db).await["dead_letters"], 1);

    // A person checked: it happened. Done, with the result; the dead letter
    // goes back in the outbox.
    let done = on::<B>(
        &db,
        &[
            "effects", "done", &id, HANDLER, EFFECT, "--result", "\"ok\"", "--yes",
        ],
    )
    .await;
    let out = done.ok();
    assert!(
        out.contains(&format!(
            "settled effect `notify` of handler `orders.notify` for message {id} as done"
        )),
        "{out}"
    );
    assert!(out.contains("now succeeded, with result \"ok\""), "{out}");
    assert!(out.contains(&format!("requeued message {id}")), "{out}");
    assert!(out.contains("back in the outbox as pending"), "{out}");
    let settled = effect_of::<B>(&db, ids[0]).await;
    assert_eq!(settled["state"], "succeeded", "{settled}");
    assert_eq!(settled["result"], "\"ok\"", "{settled}");
    assert_eq!(settled["calls"], 1, "{settled}");
    let stats = status::<B>(&db).await;
    assert_eq!(stats["dead_letters"], 0, "{stats}");
    assert_eq!(stats["outbox_pending"], 1, "requeued: {stats}");
    assert_eq!(stats["unknown_effects"], serde_json::json!([]), "{stats}");
    let text = on::<B>(&db, &["status"]).await;
    assert!(text.ok().contains("unknown effects  none\n"), "{text:#?}");

    // The application's bus delivers it: the handler gets the settled
    // result without calling, and commits.
    let bus = bus(&module).await;
    eventually("the handler commits the settled result", || async {
        replies(&module).await == ["ok"]
    })
    .await;
    eventually("the outbox is drained", || async {
        module.store_stats().await.expect("stats").outbox_pending == 0
    })
    .await;
    bus.stop().await;
    assert_eq!(notify.calls.load(SeqCst), 1, "never called again");
    let after = effect_of::<B>(&db, ids[0]).await;
    assert_eq!(
        (&after["state"], &after["calls"]),
        (&Value::from("succeeded"), &Value::from(1))
    );
    assert_eq!(status::<B>(&db).await["dead_letters"], 0);

    // A succeeded effect cannot be settled; an effect that does not exist
    // neither.
    for settle in ["done", "retry"] {
        let run = on::<B>(&db, &["effects", settle, &id, HANDLER, EFFECT, "--yes"]).await;
        run.fails(1, "nothing to settle");
        assert!(run.stderr.contains("effect `notify`"), "{run:#?}");
    }
    on::<B>(&db, &["effects", "retry", &id, HANDLER, "no_such", "--yes"])
        .await
        .fails(1, "no such effect");
    assert_eq!(effect_of::<B>(&db, ids[0]).await["state"], "succeeded");
}

async fn an_unknown_effect_settled_as_retry_is_called_again<B: CliBackend>(db: Db) {
    let notify = Notify::default();
    notify.crash.store(true, SeqCst);
    let module = notifier::<B>(&db, &notify).await;
    let ids = dead_lettered(&module, &[1, 2]).await;
    let (first, second) = (ids[0].to_string(), ids[1].to_string());
    assert_eq!(notify.calls.load(SeqCst), 2, "each called once");
    assert_eq!(
        status::<B>(&db).await["unknown_effects"],
        serde_json::json!([[HANDLER, 2]])
    );
    let text = on::<B>(&db, &["status"]).await;
    assert!(
        text.ok()
            .contains("unknown effects  2 effects by handler `orders.notify`"),
        "{text:#?}"
    );
    // The external system is up again.
    notify.crash.store(false, SeqCst);

    on::<B>(&db, &["effects", "retry", &first, HANDLER, EFFECT])
        .await
        .fails(2, "without --yes");
    assert_eq!(effect_of::<B>(&db, ids[0]).await["state"], "unknown");

    // The first: it did not go out. Retry, and its dead letter goes back.
    let json = on::<B>(
        &db,
        &[
            "--json", "effects", "retry", &first, HANDLER, EFFECT, "--yes",
        ],
    )
    .await
    .json();
    assert_eq!(json["settlement"], "retry", "{json}");
    assert_eq!(json["effect"]["state"], "retry", "{json}");
    assert_eq!(json["effect"]["calls"], 1, "{json}");
    assert_eq!(json["effect"]["message_id"], first.as_str(), "{json}");
    assert_eq!(json["requeued"], true, "{json}");
    assert_eq!(json["topic"], "cli.ping", "{json}");
    let key = json["effect"]["key"].as_str().expect("a key").to_string();
    let retrying = effects::<B>(&db, &["--state", "retry"]).await;
    assert_eq!(retrying.len(), 1, "{retrying:?}");
    assert_eq!(retrying[0]["message_id"], first.as_str());

    // The second's dead letter is gone already: settled, nothing requeued.
    on::<B>(&db, &["dead-letters", "discard", &second, HANDLER, "--yes"])
        .await
        .ok();
    let retry = on::<B>(&db, &["effects", "retry", &second, HANDLER, EFFECT, "-y"]).await;
    let out = retry.ok();
    assert!(
        out.contains(&format!(
            "settled effect `notify` of handler `orders.notify` for message {second} as retry"
        )),
        "{out}"
    );
    assert!(out.contains("calls it once more (call 2)"), "{out}");
    assert!(
        out.contains(&format!(
            "message {second} has no dead letter for handler `orders.notify`, so nothing was \
             requeued"
        )),
        "{out}"
    );
    assert!(!out.contains("requeued message"), "{out}");
    let stats = status::<B>(&db).await;
    assert_eq!(stats["dead_letters"], 0, "{stats}");
    assert_eq!(stats["outbox_pending"], 1, "only the first: {stats}");
    assert_eq!(stats["unknown_effects"], serde_json::json!([]), "{stats}");

    // The bus delivers the first again: the effect is called once more,
    // with the same key, and succeeds.
    let bus = bus(&module).await;
    eventually("the handler commits the new call's reply", || async {
        replies(&module).await.len() == 1
    })
    .await;
    eventually("the outbox is drained", || async {
        module.store_stats().await.expect("stats").outbox_pending == 0
    })
    .await;
    bus.stop().await;
    assert_eq!(replies(&module).await, [format!("sent with key {key}")]);
    assert_eq!(notify.calls.load(SeqCst), 3, "one more call");
    let called = effect_of::<B>(&db, ids[0]).await;
    assert_eq!(called["state"], "succeeded", "{called}");
    assert_eq!(called["calls"], 2, "{called}");
    assert_eq!(called["result"], format!("\"sent with key {key}\""));
    // The second, never delivered again, waits with its retry.
    let waiting = effect_of::<B>(&db, ids[1]).await;
    assert_eq!(
        (&waiting["state"], &waiting["calls"]),
        (&Value::from("retry"), &Value::from(1))
    );
}

/// A module whose handlers never made an effect: nothing listed, nothing
/// unknown.
async fn a_module_without_effects_has_none<B: CliBackend>(db: Db) {
    let _module = orders::<B>(&db).await;
    let list = on::<B>(&db, &["effects", "list"]).await;
    assert_eq!(list.ok(), "no effects\n");
    let unknown = on::<B>(&db, &["effects", "list", "--state", "unknown"]).await;
    assert_eq!(unknown.ok(), "no effects in state unknown\n");
    assert!(effects::<B>(&db, &[]).await.is_empty());
    let stats = status::<B>(&db).await;
    assert_eq!(stats["unknown_effects"], serde_json::json!([]), "{stats}");
    let text = on::<B>(&db, &["status"]).await;
    assert!(text.ok().contains("unknown effects  none\n"), "{text:#?}");
    let id = Uuid::now_v7().to_string();
    on::<B>(
        &db,
        &["effects", "retry", &id, "orders.ping", "send", "--yes"],
    )
    .await
    .fails(1, "no such effect");
}

/// Beside other modules, an effect is listed with its module and settled
/// in the journal of the module that runs its handler (`--module` chooses
/// when several run a handler of that name).
async fn an_effect_is_settled_in_the_module_that_runs_its_handler<B: CliBackend>(db: Db) {
    let notify = Notify::default();
    notify.crash.store(true, SeqCst);
    let module = notifier::<B>(&db, &notify).await;
    let id = dead_lettered(&module, &[1]).await[0].to_string();
    let _warehouse = B::module_at(&db, "warehouse", "warehouse")
        .handler("warehouse.ping", Accept)
        .start()
        .await
        .expect("warehouse starts");
    let with = |others: &[&str], args: &[&str]| {
        let mut all = B::places_args(&db, others);
        all.extend(args.iter().map(|a| a.to_string()));
        all
    };
    let all_of = |others: &'static [&'static str], args: &[&str]| {
        let args = with(others, args);
        let db = &db;
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            on::<B>(db, &args).await
        }
    };

    let listed = all_of(&["warehouse"], &["--json", "effects", "list"])
        .await
        .json();
    assert_eq!(listed[0]["module"], "orders", "{listed}");
    assert_eq!(listed[0]["message_id"], id.as_str(), "{listed}");
    all_of(
        &["warehouse"],
        &["effects", "done", &id, "nobody.notify", EFFECT, "--yes"],
    )
    .await
    .fails(
        1,
        "none of modules `orders`, `warehouse` runs handler `nobody.notify`",
    );

    // Another module runs a handler of the same name.
    let _billing = B::module_at(&db, "billing", "billing")
        .handler(HANDLER, Accept)
        .start()
        .await
        .expect("billing starts");
    all_of(
        &["warehouse", "billing"],
        &["effects", "done", &id, HANDLER, EFFECT, "--yes"],
    )
    .await
    .fails(
        2,
        "handler `orders.notify` runs in modules `orders`, `billing`",
    );
    let done = all_of(
        &["warehouse", "billing"],
        &[
            "--module", "orders", "--json", "effects", "done", &id, HANDLER, EFFECT, "--yes",
        ],
    )
    .await
    .json();
    assert_eq!(done["module"], "orders", "{done}");
    assert_eq!(done["requeued"], true, "{done}");
    assert_eq!(done["effect"]["state"], "succeeded", "{done}");
}

/// Instantiates the generic tests for one backend.
macro_rules! effects_tests {
    ($backend:ty, $db:expr) => {
        crate::support::backend_cases!(
            $backend,
            $db,
            [
                an_unknown_effect_is_listed_counted_and_settled_as_done,
                an_unknown_effect_settled_as_retry_is_called_again,
                a_module_without_effects_has_none,
                an_effect_is_settled_in_the_module_that_runs_its_handler,
            ]
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    effects_tests!(tickbox::Sqlite, super::Db::new());

    /// A module without a handler never opens its journal, so its
    /// companion file is never made; the tool, attached, does not make it
    /// either, and finds no effects.
    #[actix::test]
    async fn a_module_without_a_journal_file_has_no_effects() {
        use super::CliBackend as _;
        let db = super::Db::new();
        let _module = tickbox::Sqlite::module(&db)
            .publishes::<super::CliPing>()
            .start()
            .await
            .expect("the orders module starts");
        let journal = format!("{}-effects", tickbox::Sqlite::url(&db));
        assert!(!std::path::Path::new(&journal).exists(), "{journal}");
        let list = super::on::<tickbox::Sqlite>(&db, &["effects", "list"]).await;
        assert_eq!(list.ok(), "no effects\n");
        let status = super::status::<tickbox::Sqlite>(&db).await;
        assert_eq!(status["unknown_effects"], serde_json::json!([]));
        let id = uuid::Uuid::now_v7().to_string();
        super::on::<tickbox::Sqlite>(&db, &["effects", "done", &id, "h", "e", "--yes"])
            .await
            .fails(1, "no such effect");
        assert!(
            !std::path::Path::new(&journal).exists(),
            "the tool made {journal}"
        );
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    effects_tests!(tickbox::Postgres, super::Db::postgres());
}

#[cfg(feature = "mysql")]
mod mysql {
    effects_tests!(tickbox::Mysql, super::Db::mysql());
}
