//! Tests of the `tickbox` operator's tool (src/bin/tickbox.rs): every
//! command, run as a separate process against a module database that a test
//! module created and filled, on SQLite and, with the `postgres` feature, on
//! PostgreSQL (`TICKBOX_PG_URL`, e.g. postgres://postgres@127.0.0.1:5432/test;
//! without it the PostgreSQL tests fail rather than pass silently).

use diesel_async::SimpleAsyncConnection;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tickbox::{Backend, Bus, Handler, HandlerError, Message, ModuleBuilder, ModuleHandle, Tx};
use uuid::Uuid;

/// 2026-01-01T00:00:00Z in microseconds since the Unix epoch.
const NEW_YEAR_US: i64 = 1_767_225_600_000_000;

/// How long a test waits for a condition before failing.
const WAIT: Duration = Duration::from_secs(20);

const DAY: Duration = Duration::from_secs(24 * 3600);

/// The message the test module publishes and handles.
#[derive(Debug, Serialize, Deserialize)]
struct CliPing {
    n: u64,
}

impl Message for CliPing {
    const TOPIC: &'static str = "cli.ping";
}

/// A handler that only succeeds: its inbox row shows it ran.
struct Accept;

impl<B: Backend> Handler<B> for Accept {
    type Message = CliPing;

    async fn handle(&self, _tx: &mut Tx<B>, _message: CliPing) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Where one test keeps its module database.
struct Db {
    /// SQLite: the directory of the database file, removed on drop.
    dir: tempfile::TempDir,
    /// PostgreSQL: the server URL.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pg_url: Option<String>,
    /// PostgreSQL: a schema no other test uses.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    schema: String,
}

impl Db {
    fn new() -> Self {
        Db {
            dir: tempfile::tempdir().expect("a temporary directory"),
            pg_url: None,
            schema: format!("cli_{:08x}", fastrand::u32(..)),
        }
    }

    /// The PostgreSQL tests need `TICKBOX_PG_URL`; without it they fail.
    #[cfg(feature = "postgres")]
    fn postgres() -> Self {
        let url = std::env::var("TICKBOX_PG_URL").expect(
            "the PostgreSQL tests need TICKBOX_PG_URL, e.g. postgres://postgres@127.0.0.1:5432/test",
        );
        Db {
            pg_url: Some(url),
            ..Db::new()
        }
    }
}

/// A backend the tool is tested on.
trait CliBackend: Backend {
    /// A builder for the test's module, `orders`.
    fn module(db: &Db) -> ModuleBuilder<Self>;

    /// The database URL to give the tool.
    fn url(db: &Db) -> String;

    /// Options to give the tool besides the URL (the schema).
    fn extra_args(db: &Db) -> Vec<String>;

    /// A UUID as an SQL literal.
    fn uuid_literal(id: Uuid) -> String;
}

#[cfg(feature = "sqlite")]
impl CliBackend for tickbox::Sqlite {
    fn module(db: &Db) -> ModuleBuilder<Self> {
        tickbox::Module::builder("orders", Self::url(db))
    }

    fn url(db: &Db) -> String {
        let path = db.dir.path().join("orders.db");
        path.to_str().expect("a UTF-8 path").to_string()
    }

    fn extra_args(_db: &Db) -> Vec<String> {
        Vec::new()
    }

    fn uuid_literal(id: Uuid) -> String {
        format!("x'{}'", id.simple())
    }
}

#[cfg(feature = "postgres")]
impl CliBackend for tickbox::Postgres {
    fn module(db: &Db) -> ModuleBuilder<Self> {
        tickbox::Module::builder("orders", Self::url(db)).schema(db.schema.clone())
    }

    fn url(db: &Db) -> String {
        db.pg_url.clone().expect("Db::postgres()")
    }

    fn extra_args(db: &Db) -> Vec<String> {
        vec!["--schema".into(), db.schema.clone()]
    }

    fn uuid_literal(id: Uuid) -> String {
        format!("'{id}'")
    }
}

// ---------------------------------------------------------------------------
// Helpers

/// What one run of the tool printed and how it exited.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts success and returns stdout.
    #[track_caller]
    fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "expected success: {self:#?}");
        assert!(self.stderr.is_empty(), "nothing on stderr: {self:#?}");
        &self.stdout
    }

    /// Asserts success and parses stdout as one JSON document.
    #[track_caller]
    fn json(&self) -> Value {
        let out = self.ok();
        assert_eq!(out.lines().count(), 1, "one line of JSON: {self:#?}");
        serde_json::from_str(out).unwrap_or_else(|e| panic!("JSON ({e}): {self:#?}"))
    }

    /// Asserts the exit code, one `error: ` message on stderr containing
    /// `needle`, nothing on stdout and no panic.
    #[track_caller]
    fn fails(&self, code: i32, needle: &str) {
        assert_eq!(self.code, code, "exit code {code}: {self:#?}");
        assert!(self.stdout.is_empty(), "nothing on stdout: {self:#?}");
        assert!(self.stderr.starts_with("error: "), "{self:#?}");
        assert!(self.stderr.contains(needle), "`{needle}` in: {self:#?}");
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        assert!(!self.stderr.contains("{ "), "no Debug dump: {self:#?}");
    }
}

/// Runs the tool with `args` and without `TICKBOX_DATABASE_URL`.
async fn run_cli(args: Vec<String>) -> Run {
    run_cli_with_env(args, None).await
}

/// Runs the tool with `args` and `TICKBOX_DATABASE_URL` set to `env_url`
/// (or unset).
async fn run_cli_with_env(args: Vec<String>, env_url: Option<String>) -> Run {
    let output = tokio::task::spawn_blocking(move || {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tickbox"));
        command.args(&args).env_remove("TICKBOX_DATABASE_URL");
        if let Some(url) = env_url {
            command.env("TICKBOX_DATABASE_URL", url);
        }
        command.output().expect("the tickbox binary runs")
    })
    .await
    .expect("the blocking task");
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8(output.stdout).expect("UTF-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("UTF-8 stderr"),
    }
}

/// Runs the tool on the test's database: `--database-url URL [--schema S]`
/// followed by `args`.
async fn on<B: CliBackend>(db: &Db, args: &[&str]) -> Run {
    let mut all = vec!["--database-url".to_string(), B::url(db)];
    all.extend(B::extra_args(db));
    all.extend(args.iter().map(|a| a.to_string()));
    run_cli(all).await
}

/// `--json status`.
async fn status<B: CliBackend>(db: &Db) -> Value {
    on::<B>(db, &["--json", "status"]).await.json()
}

/// Runs SQL on the module's database in a transaction.
async fn execute<B: CliBackend>(module: &ModuleHandle<B>, sql: String) {
    module
        .transaction(async move |tx| {
            tx.conn().batch_execute(&sql).await?;
            Ok::<_, tickbox::Error>(())
        })
        .await
        .expect("SQL runs");
}

/// Writes an outbox row by hand; delivered at `delivered_at_us` if given.
async fn insert_outbox<B: CliBackend>(
    module: &ModuleHandle<B>,
    id: Uuid,
    created_at_us: i64,
    delivered_at_us: Option<i64>,
) {
    let delivered = delivered_at_us.map_or("NULL".to_string(), |us| us.to_string());
    let id = B::uuid_literal(id);
    execute(
        module,
        format!(
            "INSERT INTO tickbox_outbox (id, topic, payload, correlation_id, created_at_us, delivered_at_us) \
             VALUES ({id}, 'cli.ping', '{{\"n\":1}}', {id}, {created_at_us}, {delivered})"
        ),
    )
    .await;
}

/// Writes an inbox row by hand.
async fn insert_inbox<B: CliBackend>(
    module: &ModuleHandle<B>,
    message_id: Uuid,
    handler: &str,
    processed_at_us: i64,
) {
    execute(
        module,
        format!(
            "INSERT INTO tickbox_inbox (message_id, handler, processed_at_us) VALUES ({}, '{handler}', {processed_at_us})",
            B::uuid_literal(message_id)
        ),
    )
    .await;
}

/// A dead letter to write by hand.
struct Dead<'a> {
    id: Uuid,
    handler: &'a str,
    topic: &'a str,
    payload: &'a str,
    reason: &'a str,
    attempts: i32,
    created_at_us: i64,
    dead_at_us: i64,
}

impl Dead<'_> {
    /// A dead letter of a `cli.ping` message for `orders.ping`.
    fn ping(id: Uuid) -> Dead<'static> {
        Dead {
            id,
            handler: "orders.ping",
            topic: "cli.ping",
            payload: "{\"n\":7}",
            reason: "handler failed: stock service unavailable",
            attempts: 10,
            created_at_us: micros_ago(Duration::from_secs(60)),
            dead_at_us: micros_ago(Duration::from_secs(30)),
        }
    }
}

/// Writes a dead letter by hand, as the bus would have.
async fn insert_dead<B: CliBackend>(module: &ModuleHandle<B>, dead: &Dead<'_>) {
    let id = B::uuid_literal(dead.id);
    execute(
        module,
        format!(
            "INSERT INTO tickbox_dead_letters (message_id, handler, topic, payload, correlation_id, \
             causation_id, created_at_us, attempts, reason, dead_at_us) \
             VALUES ({id}, '{}', '{}', '{}', {id}, NULL, {}, {}, '{}', {})",
            dead.handler,
            dead.topic,
            dead.payload,
            dead.created_at_us,
            dead.attempts,
            dead.reason,
            dead.dead_at_us
        ),
    )
    .await;
}

/// A UUIDv7 of `ago` in the past.
fn uuid_ago(ago: Duration) -> Uuid {
    let since = (SystemTime::now() - ago)
        .duration_since(UNIX_EPOCH)
        .expect("after 1970");
    Uuid::new_v7(uuid::Timestamp::from_unix(
        uuid::NoContext,
        since.as_secs(),
        since.subsec_nanos(),
    ))
}

/// Microseconds since the Unix epoch, `ago` in the past.
fn micros_ago(ago: Duration) -> i64 {
    (SystemTime::now() - ago)
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// Waits until `condition` holds, checking every 20 ms, for at most
/// [`WAIT`]; panics with `what` if it never does.
async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + WAIT;
    while !condition().await {
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {WAIT:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The test's module, started (which creates its tables).
async fn orders<B: CliBackend>(db: &Db) -> ModuleHandle<B> {
    B::module(db)
        .publishes::<CliPing>()
        .handler("orders.ping", Accept)
        .start()
        .await
        .expect("the orders module starts")
}

/// The test's module with a second handler of its own messages,
/// `orders.audit`: two subscriptions to its outbox.
async fn orders_with_audit<B: CliBackend>(db: &Db) -> ModuleHandle<B> {
    B::module(db)
        .publishes::<CliPing>()
        .handler("orders.ping", Accept)
        .handler("orders.audit", Accept)
        .start()
        .await
        .expect("the orders module starts")
}

/// Starts a bus over `module`, which records its handlers' subscriptions in
/// its outbox, and stops it: the subscriptions stay, recorded as stopped,
/// as those of an application that stopped.
async fn subscribe_and_stop<B: CliBackend>(module: &ModuleHandle<B>) {
    let bus = Bus::builder()
        .module(module)
        .start()
        .await
        .expect("the bus starts");
    bus.stop().await;
    eventually("the subscriptions are recorded as stopped", || async {
        let now = micros_ago(Duration::ZERO);
        let recorded = module.subscriptions().await.expect("subscriptions");
        !recorded.is_empty() && recorded.iter().all(|s| !s.is_alive(now))
    })
    .await;
}

/// Records that handler `handler` of the test's module is done with message
/// `id` (as a bus does when another subscription still owes it).
async fn insert_done<B: CliBackend>(module: &ModuleHandle<B>, id: Uuid, handler: &str) {
    execute(
        module,
        format!(
            "INSERT INTO tickbox_outbox_done (message_id, subscription) \
             SELECT {}, id FROM tickbox_subscriptions WHERE handler = '{handler}'",
            B::uuid_literal(id)
        ),
    )
    .await;
}

/// The subscriptions as `--json subscriptions` lists them.
async fn subscriptions<B: CliBackend>(db: &Db) -> Vec<Value> {
    match on::<B>(db, &["--json", "subscriptions"]).await.json() {
        Value::Array(all) => all,
        other => panic!("an array: {other}"),
    }
}

// ---------------------------------------------------------------------------
// The tests, generic over the backend

async fn status_counts_what_the_tables_hold<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;

    let empty = status::<B>(&db).await;
    assert_eq!(empty["backend"], B::NAME);
    assert_eq!(empty["outbox_pending"], 0);
    assert_eq!(empty["oldest_pending_us"], Value::Null);
    assert_eq!(empty["lag_seconds"], Value::Null);
    assert_eq!(empty["inbox_rows"], 0);
    assert_eq!(empty["dead_letters"], 0);
    let text = on::<B>(&db, &["status"]).await;
    assert!(text.ok().contains("nothing pending"), "{text:#?}");

    // Two pending messages, the oldest 90 s old; one delivered.
    let oldest_us = micros_ago(Duration::from_secs(90));
    insert_outbox(&module, uuid_ago(Duration::from_secs(90)), oldest_us, None).await;
    insert_outbox(&module, Uuid::now_v7(), micros_ago(Duration::ZERO), None).await;
    insert_outbox(
        &module,
        Uuid::now_v7(),
        micros_ago(Duration::ZERO),
        Some(micros_ago(Duration::ZERO)),
    )
    .await;
    for handler in ["orders.ping", "orders.audit", "orders.mail"] {
        insert_inbox(&module, Uuid::now_v7(), handler, micros_ago(Duration::ZERO)).await;
    }
    insert_dead(&module, &Dead::ping(Uuid::now_v7())).await;
    insert_dead(&module, &Dead::ping(Uuid::now_v7())).await;

    let stats = status::<B>(&db).await;
    assert_eq!(stats["outbox_pending"], 2, "{stats}");
    assert_eq!(stats["oldest_pending_us"], oldest_us, "{stats}");
    let lag = stats["lag_seconds"].as_f64().expect("a lag");
    assert!((90.0..3600.0).contains(&lag), "lag {lag}");
    assert_eq!(stats["inbox_rows"], 3, "{stats}");
    assert_eq!(stats["dead_letters"], 2, "{stats}");

    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(out.contains("outbox pending   2 messages"), "{out}");
    assert!(out.contains("outbox lag       1m "), "{out}");
    assert!(out.contains("inbox rows       3"), "{out}");
    assert!(out.contains("dead letters     2"), "{out}");

    // The URL can come from the environment instead of the flag.
    let mut args = B::extra_args(&db);
    args.extend(["--json".to_string(), "status".to_string()]);
    let from_env = run_cli_with_env(args, Some(B::url(&db))).await.json();
    assert_eq!(from_env["outbox_pending"], 2, "{from_env}");
}

/// Outbox rows can hold any timestamp (a bad clock, a hand-written row):
/// `status` reports a lag for each without overflowing, a huge one in days
/// and a future one as none.
async fn status_shows_a_sane_lag_for_any_timestamp<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    // `status` takes the oldest pending message to be the one with the
    // lowest id (ids are UUIDv7s): first the i64::MIN one, then, once that
    // is gone, the i64::MAX one.
    insert_outbox(&module, uuid_ago(DAY), i64::MIN, None).await;
    insert_outbox(&module, Uuid::now_v7(), i64::MAX, None).await;

    // The oldest is i64::MIN: some 292,000 years ago.
    let stats = status::<B>(&db).await;
    assert_eq!(stats["outbox_pending"], 2, "{stats}");
    assert_eq!(stats["oldest_pending_us"], i64::MIN, "{stats}");
    let lag = stats["lag_seconds"].as_f64().expect("a lag");
    assert!(lag.is_finite() && lag > 9.0e12, "lag {lag}");
    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(out.contains("outbox lag       106751991d "), "{out}");
    assert!(out.contains("-290308-12-21T19:59:05Z"), "{out}");

    // The oldest is i64::MAX: published in the future, so no lag.
    execute(
        &module,
        format!(
            "DELETE FROM tickbox_outbox WHERE created_at_us = {}",
            i64::MIN
        ),
    )
    .await;
    let stats = status::<B>(&db).await;
    assert_eq!(stats["outbox_pending"], 1, "{stats}");
    assert_eq!(stats["oldest_pending_us"], i64::MAX, "{stats}");
    assert_eq!(stats["lag_seconds"], 0.0, "{stats}");
    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(out.contains("outbox lag       0s "), "{out}");
    assert!(
        out.contains("294247-01-10T04:00:54Z, in the future"),
        "{out}"
    );
}

async fn dead_letters_are_listed_and_shown<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let empty = on::<B>(&db, &["dead-letters", "list"]).await;
    assert_eq!(empty.ok(), "no dead letters\n");
    assert_eq!(
        on::<B>(&db, &["--json", "dead-letters", "list"])
            .await
            .json(),
        serde_json::json!([])
    );

    let long_reason = format!(
        "handler failed: {}\nsecond line END-OF-REASON",
        "the warehouse refused the reservation ".repeat(3)
    );
    let first = Dead {
        payload: "{\"n\":1,\"note\":\"fragile\"}",
        reason: &long_reason,
        attempts: 10,
        dead_at_us: NEW_YEAR_US,
        ..Dead::ping(uuid_ago(DAY))
    };
    let unknown = Dead {
        handler: "",
        topic: "cli.unknown",
        payload: "{\"n\":2}",
        reason: "no module on the bus declares topic cli.unknown",
        attempts: 1,
        dead_at_us: NEW_YEAR_US + 1_000_000,
        ..Dead::ping(uuid_ago(DAY))
    };
    let garbled = Dead {
        payload: "not json at all",
        reason: "cannot decode payload",
        attempts: 1,
        dead_at_us: NEW_YEAR_US + 2_000_000,
        ..Dead::ping(uuid_ago(DAY))
    };
    for dead in [&first, &unknown, &garbled] {
        insert_dead(&module, dead).await;
    }
    let (first_id, unknown_id, garbled_id) = (
        first.id.to_string(),
        unknown.id.to_string(),
        garbled.id.to_string(),
    );

    // The table.
    let list = on::<B>(&db, &["dead-letters", "list"]).await;
    let out = list.ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("MESSAGE ID"), "{out}");
    for header in ["HANDLER", "TOPIC", "ATTEMPTS", "DEAD AT (UTC)", "REASON"] {
        assert!(lines[0].contains(header), "{out}");
    }
    assert!(lines[1].starts_with(&first_id), "oldest first: {out}");
    assert!(lines[1].contains("orders.ping"), "{out}");
    assert!(lines[1].contains("2026-01-01T00:00:00Z"), "{out}");
    assert!(lines[1].contains(" 10 "), "{out}");
    assert!(lines[1].contains("handler failed: the warehouse"), "{out}");
    assert!(lines[1].ends_with("..."), "a long reason is cut: {out}");
    assert!(!out.contains("END-OF-REASON"), "{out}");
    assert!(lines[2].starts_with(&unknown_id), "{out}");
    assert!(lines[2].contains(" - "), "no handler shows as -: {out}");
    assert!(lines[2].contains("cli.unknown"), "{out}");
    assert!(lines[2].contains("2026-01-01T00:00:01Z"), "{out}");
    assert!(lines[3].starts_with(&garbled_id), "{out}");
    assert!(out.ends_with("\n3 dead letters\n"), "{out}");

    let json = on::<B>(&db, &["--json", "dead-letters", "list"])
        .await
        .json();
    let all = json.as_array().expect("an array");
    assert_eq!(all.len(), 3);
    assert_eq!(all[0]["message_id"], first_id.as_str());
    assert_eq!(all[0]["handler"], "orders.ping");
    assert_eq!(all[0]["reason"], long_reason.as_str());
    assert_eq!(all[0]["dead_at_us"], NEW_YEAR_US);
    assert_eq!(all[1]["handler"], "");
    assert_eq!(all[2]["payload"], "not json at all");

    // Paging.
    let page = on::<B>(
        &db,
        &[
            "--json",
            "dead-letters",
            "list",
            "--offset",
            "1",
            "--limit",
            "1",
        ],
    )
    .await
    .json();
    assert_eq!(page.as_array().map(Vec::len), Some(1), "{page}");
    assert_eq!(page[0]["message_id"], unknown_id.as_str());
    let page = on::<B>(&db, &["dead-letters", "list", "--offset=1", "--limit=1"]).await;
    let out = page.ok();
    assert!(out.contains(&unknown_id), "{out}");
    assert!(
        !out.contains(&first_id) && !out.contains(&garbled_id),
        "{out}"
    );
    assert!(
        out.contains("dead letters 2-2 of 3; next page: --offset 2 --limit 1"),
        "{out}"
    );
    let past = on::<B>(&db, &["dead-letters", "list", "--offset", "9"]).await;
    assert!(past.ok().contains("there are 3"), "{past:#?}");

    // One in full: the payload pretty-printed, the whole reason.
    let show = on::<B>(&db, &["dead-letters", "show", &first_id, "orders.ping"]).await;
    let out = show.ok();
    assert!(
        out.contains(&format!("message id       {first_id}")),
        "{out}"
    );
    assert!(out.contains("handler          orders.ping"), "{out}");
    assert!(out.contains("topic            cli.ping"), "{out}");
    assert!(out.contains("attempts         10"), "{out}");
    assert!(
        out.contains("dead at          2026-01-01T00:00:00.000000Z"),
        "{out}"
    );
    assert!(out.contains("END-OF-REASON"), "{out}");
    assert!(out.contains("payload (JSON)"), "{out}");
    assert!(
        out.contains(
            "payload (JSON)\n    {\n      \"n\": 1,\n      \"note\": \"fragile\"\n    }\n"
        ),
        "pretty, in the stored key order: {out}"
    );

    // The dead letter without a handler, written as -, '' or an empty
    // argument (what the shell makes of '').
    for handler in ["-", "''", ""] {
        let show = on::<B>(&db, &["dead-letters", "show", &unknown_id, handler]).await;
        let out = show.ok();
        assert!(out.contains("topic            cli.unknown"), "{out}");
        assert!(out.contains("handler          - (none"), "{out}");
    }
    let json = on::<B>(&db, &["--json", "dead-letters", "show", &unknown_id, "-"])
        .await
        .json();
    assert_eq!(json["message_id"], unknown_id.as_str());
    assert_eq!(json["topic"], "cli.unknown");
    assert_eq!(json["payload"], "{\"n\":2}");
    assert_eq!(json["attempts"], 1);

    let show = on::<B>(&db, &["dead-letters", "show", &garbled_id, "orders.ping"]).await;
    let out = show.ok();
    assert!(out.contains("not valid JSON"), "{out}");
    assert!(out.contains("    not json at all\n"), "{out}");

    // Not there: the wrong handler, an unknown id.
    on::<B>(&db, &["dead-letters", "show", &first_id, "orders.other"])
        .await
        .fails(1, "no dead letter for message");
    let missing = Uuid::now_v7().to_string();
    on::<B>(&db, &["dead-letters", "show", &missing, "-"])
        .await
        .fails(1, &missing);
    on::<B>(&db, &["dead-letters", "show", "not-a-uuid", "-"])
        .await
        .fails(2, "not a message id");
}

async fn replay_requeues_and_the_bus_redelivers<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let failed = Dead::ping(uuid_ago(Duration::from_secs(60)));
    // A message whose topic nobody declared when it was published; the
    // module declares it now.
    let unknown = Dead {
        handler: "",
        reason: "no module on the bus declares topic cli.ping",
        ..Dead::ping(uuid_ago(Duration::from_secs(60)))
    };
    insert_dead(&module, &failed).await;
    insert_dead(&module, &unknown).await;
    let before = status::<B>(&db).await;
    assert_eq!(before["outbox_pending"], 0, "{before}");
    assert_eq!(before["dead_letters"], 2, "{before}");

    let failed_id = failed.id.to_string();
    let replay = on::<B>(&db, &["dead-letters", "replay", &failed_id, "orders.ping"]).await;
    let out = replay.ok();
    assert!(
        out.contains(&format!("requeued message {failed_id}")),
        "{out}"
    );
    assert!(out.contains("back in the outbox as pending"), "{out}");
    assert!(out.contains("next outbox scan"), "{out}");
    let after = status::<B>(&db).await;
    assert_eq!(after["outbox_pending"], 1, "pending +1: {after}");
    assert_eq!(after["dead_letters"], 1, "dead letters -1: {after}");
    assert!(
        after["lag_seconds"].as_f64().expect("a lag") >= 60.0,
        "{after}"
    );

    let unknown_id = unknown.id.to_string();
    let json = on::<B>(&db, &["--json", "dead-letters", "replay", &unknown_id, "-"])
        .await
        .json();
    assert_eq!(json["requeued"], true, "{json}");
    assert_eq!(json["message_id"], unknown_id.as_str());
    assert_eq!(json["handler"], "");
    assert_eq!(json["topic"], "cli.ping");
    let after = status::<B>(&db).await;
    assert_eq!(after["outbox_pending"], 2, "{after}");
    assert_eq!(after["dead_letters"], 0, "{after}");

    // Replayed once; a second replay finds nothing.
    on::<B>(&db, &["dead-letters", "replay", &failed_id, "orders.ping"])
        .await
        .fails(1, "no dead letter for message");

    // The application's bus delivers both on its scan.
    let bus = Bus::builder()
        .module(&module)
        .start()
        .await
        .expect("bus starts");
    eventually("the requeued messages are handled", || async {
        let stats = module.store_stats().await.expect("stats");
        stats.outbox_pending == 0 && stats.inbox_rows == 2
    })
    .await;
    bus.stop().await;
    let done = status::<B>(&db).await;
    assert_eq!(done["outbox_pending"], 0, "{done}");
    assert_eq!(done["inbox_rows"], 2, "{done}");
    assert_eq!(done["dead_letters"], 0, "{done}");
}

async fn discard_requires_yes<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let dead = Dead::ping(Uuid::now_v7());
    let unknown = Dead {
        handler: "",
        ..Dead::ping(Uuid::now_v7())
    };
    insert_dead(&module, &dead).await;
    insert_dead(&module, &unknown).await;
    let id = dead.id.to_string();

    on::<B>(&db, &["dead-letters", "discard", &id, "orders.ping"])
        .await
        .fails(2, "--yes");
    assert_eq!(status::<B>(&db).await["dead_letters"], 2, "nothing deleted");

    let discard = on::<B>(
        &db,
        &["dead-letters", "discard", &id, "orders.ping", "--yes"],
    )
    .await;
    let out = discard.ok();
    assert!(
        out.contains(&format!("discarded the dead letter of message {id}")),
        "{out}"
    );
    let after = status::<B>(&db).await;
    assert_eq!(after["dead_letters"], 1, "{after}");
    assert_eq!(after["outbox_pending"], 0, "not requeued: {after}");

    on::<B>(&db, &["dead-letters", "discard", &id, "orders.ping", "-y"])
        .await
        .fails(1, "no dead letter for message");

    let unknown_id = unknown.id.to_string();
    let json = on::<B>(
        &db,
        &[
            "--json",
            "dead-letters",
            "discard",
            "--yes",
            &unknown_id,
            "''",
        ],
    )
    .await
    .json();
    assert_eq!(json["discarded"], true, "{json}");
    assert_eq!(json["handler"], "");
    assert_eq!(status::<B>(&db).await["dead_letters"], 0);
}

async fn sweep_deletes_old_rows_and_keeps_recent_ones<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let old_us = micros_ago(2 * 7 * DAY);
    let now_us = micros_ago(Duration::ZERO);
    // Two weeks old: two inbox rows, a delivered and a pending outbox row.
    insert_inbox(&module, uuid_ago(2 * 7 * DAY), "orders.ping", old_us).await;
    insert_inbox(&module, uuid_ago(2 * 7 * DAY), "orders.audit", old_us).await;
    insert_outbox(&module, uuid_ago(2 * 7 * DAY), old_us, Some(old_us)).await;
    insert_outbox(&module, uuid_ago(2 * 7 * DAY), old_us, None).await;
    // Recent: an inbox row and a delivered outbox row.
    insert_inbox(&module, Uuid::now_v7(), "orders.ping", now_us).await;
    insert_outbox(&module, Uuid::now_v7(), now_us, Some(now_us)).await;
    // Dead letters are never swept.
    insert_dead(
        &module,
        &Dead {
            dead_at_us: old_us,
            ..Dead::ping(uuid_ago(2 * 7 * DAY))
        },
    )
    .await;

    let kept = on::<B>(
        &db,
        &[
            "--json",
            "sweep",
            "--inbox-retention",
            "never",
            "--outbox-retention",
            "never",
        ],
    )
    .await
    .json();
    assert_eq!(
        kept,
        serde_json::json!({
            "inbox_rows": 0,
            "outbox_rows": 0,
            "inbox_retention_seconds": null,
            "outbox_retention_seconds": null,
        })
    );
    assert_eq!(status::<B>(&db).await["inbox_rows"], 3);

    // The default retention, seven days.
    let sweep = on::<B>(&db, &["sweep"]).await;
    let out = sweep.ok();
    assert!(
        out.contains("inbox   deleted 2 rows processed more than 7d ago"),
        "{out}"
    );
    assert!(
        out.contains("outbox  deleted 1 row delivered more than 7d ago"),
        "{out}"
    );
    let after = status::<B>(&db).await;
    assert_eq!(after["inbox_rows"], 1, "the recent row stays: {after}");
    assert_eq!(after["outbox_pending"], 1, "the pending row stays: {after}");
    assert_eq!(after["dead_letters"], 1, "{after}");
    let stats = module.store_stats().await.expect("stats");
    assert_eq!(stats.inbox_rows, 1);

    let again = on::<B>(
        &db,
        &[
            "sweep",
            "--json",
            "--inbox-retention=30d",
            "--outbox-retention",
            "1h30m",
        ],
    )
    .await
    .json();
    assert_eq!(
        again,
        serde_json::json!({
            "inbox_rows": 0,
            "outbox_rows": 0,
            "inbox_retention_seconds": 30 * 24 * 3600,
            "outbox_retention_seconds": 5400,
        })
    );
    on::<B>(&db, &["sweep", "--inbox-retention", "7"])
        .await
        .fails(2, "missing unit");
}

async fn subscriptions_lists_a_stopped_one_with_what_it_owes<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let none = on::<B>(&db, &["subscriptions"]).await;
    assert!(
        none.ok().starts_with("no subscriptions recorded"),
        "{none:#?}"
    );
    assert!(subscriptions::<B>(&db).await.is_empty());

    // An application ran with the handler and stopped; since then two
    // messages were published, the oldest 90 s ago.
    let started_us = micros_ago(Duration::ZERO);
    subscribe_and_stop(&module).await;
    let oldest_us = micros_ago(Duration::from_secs(90));
    insert_outbox(&module, uuid_ago(Duration::from_secs(90)), oldest_us, None).await;
    insert_outbox(&module, Uuid::now_v7(), micros_ago(Duration::ZERO), None).await;

    let list = on::<B>(&db, &["subscriptions"]).await;
    let out = list.ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("MODULE"), "{out}");
    for header in [
        "HANDLER",
        "TOPIC",
        "STATE",
        "SUBSCRIBED SINCE (UTC)",
        "OLDEST OWED",
    ] {
        assert!(lines[0].contains(header), "{out}");
    }
    assert!(lines[1].starts_with("orders "), "{out}");
    assert!(lines[1].contains(" orders.ping "), "{out}");
    assert!(lines[1].contains(" cli.ping "), "{out}");
    assert!(lines[1].contains(" stopped, last seen "), "{out}");
    // 90 s and a bit: `1m 30s ago`, `1m 31s ago`, ...
    assert!(lines[1].ends_with(" ago"), "{out}");
    assert!(
        lines[1].contains("  1m "),
        "the oldest owed message's age: {out}"
    );
    assert!(
        out.contains("\n1 subscription: 0 alive, 1 stopped\n"),
        "{out}"
    );
    assert!(
        out.contains("tickbox subscriptions retire MODULE HANDLER --yes"),
        "{out}"
    );
    // `subscriptions list` is the same command.
    let again = on::<B>(&db, &["subscriptions", "list"]).await;
    assert!(again.ok().contains(" stopped, last seen "), "{again:#?}");

    let all = subscriptions::<B>(&db).await;
    assert_eq!(all.len(), 1, "{all:?}");
    let one = &all[0];
    assert_eq!(one["module"], "orders", "{one}");
    assert_eq!(one["handler"], "orders.ping", "{one}");
    assert_eq!(one["topic"], "cli.ping", "{one}");
    assert_eq!(one["alive"], false, "{one}");
    assert_eq!(one["oldest_pending_us"], oldest_us, "{one}");
    let lag = one["lag_seconds"].as_f64().expect("a lag");
    assert!((90.0..3600.0).contains(&lag), "lag {lag}");
    let subscribed = one["subscribed_at_us"].as_i64().expect("a time");
    assert!(subscribed >= started_us, "{one}");
    let alive_until = one["alive_until_us"].as_i64().expect("a time");
    assert!(alive_until <= micros_ago(Duration::ZERO), "{one}");
}

async fn subscriptions_retire_finishes_only_what_it_alone_owed<B: CliBackend>(db: Db) {
    let module = orders_with_audit::<B>(&db).await;
    subscribe_and_stop(&module).await;
    // Three pending messages, owed to both handlers, except that
    // `orders.audit` is done with the first two.
    let ids = [90, 60, 0].map(|s| uuid_ago(Duration::from_secs(s)));
    let newest_us = micros_ago(Duration::ZERO);
    for (id, age) in ids.iter().zip([90, 60, 0]) {
        let created = if age == 0 {
            newest_us
        } else {
            micros_ago(Duration::from_secs(age))
        };
        insert_outbox(&module, *id, created, None).await;
    }
    insert_done(&module, ids[0], "orders.audit").await;
    insert_done(&module, ids[1], "orders.audit").await;
    let before = subscriptions::<B>(&db).await;
    assert_eq!(before.len(), 2, "{before:?}");
    assert_eq!(before[0]["handler"], "orders.audit", "sorted: {before:?}");
    assert_eq!(before[0]["oldest_pending_us"], newest_us, "{before:?}");

    // Without --yes: refused, nothing changes.
    let refused = on::<B>(&db, &["subscriptions", "retire", "orders", "orders.ping"]).await;
    refused.fails(2, "without --yes");
    assert!(refused.stderr.contains("orders.ping"), "{refused:#?}");
    assert_eq!(subscriptions::<B>(&db).await.len(), 2);
    assert_eq!(module.store_stats().await.expect("stats").outbox_pending, 3);

    // Unknown: a clear failure.
    let unknown = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.gone", "--yes"],
    )
    .await;
    unknown.fails(
        1,
        "records no subscription of handler `orders.gone` of module `orders`",
    );
    assert!(
        unknown
            .stderr
            .contains("`tickbox subscriptions` lists them"),
        "{unknown:#?}"
    );
    on::<B>(
        &db,
        &["subscriptions", "retire", "billing", "orders.ping", "--yes"],
    )
    .await
    .fails(1, "of module `billing`");

    // Retired: the two messages only it still owed are finished; the third
    // stays pending for `orders.audit`.
    let retire = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "--yes"],
    )
    .await;
    let out = retire.ok();
    assert!(
        out.contains(
            "retired the subscription of handler `orders.ping` of module `orders` (topic cli.ping)"
        ),
        "{out}"
    );
    assert!(
        out.contains("2 messages that only it still owed were marked delivered"),
        "{out}"
    );
    let stats = module.store_stats().await.expect("stats");
    assert_eq!(stats.outbox_pending, 1, "{stats:?}");
    assert_eq!(stats.oldest_pending_us, Some(newest_us), "{stats:?}");
    let left = subscriptions::<B>(&db).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["handler"], "orders.audit", "{left:?}");
    assert_eq!(left[0]["oldest_pending_us"], newest_us, "{left:?}");
    assert_eq!(status::<B>(&db).await["outbox_pending"], 1);

    // Once retired, it is unknown.
    on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "-y"],
    )
    .await
    .fails(1, "records no subscription of handler `orders.ping`");

    // The last subscription of its topic: nobody else owes its message, so
    // it is finished too.
    let text = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.audit", "--yes"],
    )
    .await;
    let out = text.ok();
    assert!(
        out.contains("1 message that only it still owed was marked delivered"),
        "{out}"
    );
    assert!(
        out.contains("No subscription of topic cli.ping is left"),
        "{out}"
    );
    assert_eq!(module.store_stats().await.expect("stats").outbox_pending, 0);
    assert!(subscriptions::<B>(&db).await.is_empty());
}

/// `--json subscriptions retire`.
async fn subscriptions_retire_with_json<B: CliBackend>(db: Db) {
    let module = orders_with_audit::<B>(&db).await;
    subscribe_and_stop(&module).await;
    let id = uuid_ago(Duration::from_secs(10));
    insert_outbox(&module, id, micros_ago(Duration::from_secs(10)), None).await;
    insert_done(&module, id, "orders.ping").await;
    let json = on::<B>(
        &db,
        &[
            "--json",
            "subscriptions",
            "retire",
            "--yes",
            "orders",
            "orders.audit",
        ],
    )
    .await
    .json();
    assert_eq!(
        json,
        serde_json::json!({
            "module": "orders",
            "handler": "orders.audit",
            "topic": "cli.ping",
            "retired": true,
            "finished": 1,
            "topic_subscriptions_left": 1,
        })
    );
    let stats = module.store_stats().await.expect("stats");
    assert_eq!(stats.outbox_pending, 0, "{stats:?}");
    let left = subscriptions::<B>(&db).await;
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["handler"], "orders.ping", "{left:?}");
    assert_eq!(left[0]["oldest_pending_us"], Value::Null, "{left:?}");
}

async fn subscriptions_retire_is_refused_while_a_process_serves_it<B: CliBackend>(db: Db) {
    let module = orders::<B>(&db).await;
    let bus = Bus::builder()
        .module(&module)
        .start()
        .await
        .expect("the bus starts");

    let list = on::<B>(&db, &["subscriptions"]).await;
    let out = list.ok();
    assert!(out.contains(" alive, seen "), "{out}");
    assert!(
        out.contains("\n1 subscription: 1 alive, 0 stopped\n"),
        "{out}"
    );
    let all = subscriptions::<B>(&db).await;
    assert_eq!(all[0]["alive"], true, "{all:?}");
    assert_eq!(all[0]["oldest_pending_us"], Value::Null, "{all:?}");
    assert_eq!(all[0]["lag_seconds"], Value::Null, "{all:?}");
    let text = on::<B>(&db, &["status"]).await;
    assert!(
        text.ok()
            .contains("subscriptions    1: 1 alive, 0 stopped\n"),
        "{text:#?}"
    );

    let refused = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "--yes"],
    )
    .await;
    refused.fails(
        1,
        "handler `orders.ping` of module `orders` is still served by a running process",
    );
    assert!(refused.stderr.contains("stop that process"), "{refused:#?}");
    assert_eq!(subscriptions::<B>(&db).await.len(), 1, "still recorded");

    // Once its process stops, it can be retired.
    bus.stop().await;
    eventually("the subscription is recorded as stopped", || async {
        let now = micros_ago(Duration::ZERO);
        let recorded = module.subscriptions().await.expect("subscriptions");
        recorded.iter().all(|s| !s.is_alive(now))
    })
    .await;
    let retire = on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "--yes"],
    )
    .await;
    assert!(
        retire
            .ok()
            .contains("0 messages that only it still owed were marked delivered"),
        "{retire:#?}"
    );
    assert!(subscriptions::<B>(&db).await.is_empty());
}

async fn status_shows_subscriptions_and_stalled_messages<B: CliBackend>(db: Db) {
    let module = orders_with_audit::<B>(&db).await;
    let empty = status::<B>(&db).await;
    assert_eq!(empty["stalled"], 0, "{empty}");
    assert_eq!(empty["stalled_after_seconds"], 60, "{empty}");
    assert_eq!(empty["subscriptions_alive"], 0, "{empty}");
    assert_eq!(empty["subscriptions_stopped"], 0, "{empty}");
    assert_eq!(empty["subscription_lag_seconds"], Value::Null, "{empty}");
    assert_eq!(empty["lagging_subscription"], Value::Null, "{empty}");
    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(
        out.contains("outbox stalled   0 messages pending longer than 1m\n"),
        "{out}"
    );
    assert!(out.contains("subscriptions    none recorded"), "{out}");

    // Both handlers subscribed, then their process stopped; three messages
    // are pending, 90 s, 30 s and no time old; `orders.audit` is done with
    // the oldest, so `orders.ping` is owed the oldest message.
    subscribe_and_stop(&module).await;
    let ninety = uuid_ago(Duration::from_secs(90));
    let oldest_us = micros_ago(Duration::from_secs(90));
    insert_outbox(&module, ninety, oldest_us, None).await;
    let thirty_us = micros_ago(Duration::from_secs(30));
    insert_outbox(&module, uuid_ago(Duration::from_secs(30)), thirty_us, None).await;
    insert_outbox(&module, Uuid::now_v7(), micros_ago(Duration::ZERO), None).await;
    insert_done(&module, ninety, "orders.audit").await;

    let stats = status::<B>(&db).await;
    assert_eq!(stats["outbox_pending"], 3, "{stats}");
    assert_eq!(stats["stalled"], 1, "pending for over 60 s: {stats}");
    assert_eq!(stats["subscriptions_alive"], 0, "{stats}");
    assert_eq!(stats["subscriptions_stopped"], 2, "{stats}");
    let lag = stats["subscription_lag_seconds"].as_f64().expect("a lag");
    assert!((90.0..3600.0).contains(&lag), "lag {lag}");
    assert_eq!(
        stats["lagging_subscription"],
        serde_json::json!({ "module": "orders", "handler": "orders.ping" })
    );

    let text = on::<B>(&db, &["status"]).await;
    let out = text.ok();
    assert!(
        out.contains("outbox stalled   1 message pending longer than 1m"),
        "{out}"
    );
    assert!(
        out.contains("subscriptions    2: 0 alive, 2 stopped  (see `tickbox subscriptions`)\n"),
        "{out}"
    );
    assert!(out.contains("subscription lag 1m "), "{out}");
    assert!(
        out.contains("(handler `orders.ping` of module `orders`, stopped)\n"),
        "{out}"
    );

    // Another threshold counts other messages.
    let shorter = on::<B>(&db, &["--json", "status", "--stalled-after", "20s"])
        .await
        .json();
    assert_eq!(shorter["stalled"], 2, "{shorter}");
    assert_eq!(shorter["stalled_after_seconds"], 20, "{shorter}");
    let longer = on::<B>(&db, &["status", "--stalled-after=1h"]).await;
    assert!(
        longer
            .ok()
            .contains("outbox stalled   0 messages pending longer than 1h\n"),
        "{longer:#?}"
    );
    on::<B>(&db, &["status", "--stalled-after", "0s"])
        .await
        .fails(2, "above zero");

    // `orders.ping` retired: the oldest message is finished, and
    // `orders.audit`, owed the 30 s old one, lags most.
    on::<B>(
        &db,
        &["subscriptions", "retire", "orders", "orders.ping", "--yes"],
    )
    .await
    .ok();
    let after = status::<B>(&db).await;
    assert_eq!(after["outbox_pending"], 2, "{after}");
    assert_eq!(after["stalled"], 0, "{after}");
    assert_eq!(after["subscriptions_stopped"], 1, "{after}");
    let lag = after["subscription_lag_seconds"].as_f64().expect("a lag");
    assert!((30.0..90.0).contains(&lag), "lag {lag}");
    assert_eq!(
        after["lagging_subscription"],
        serde_json::json!({ "module": "orders", "handler": "orders.audit" })
    );
}

/// Instantiates the generic tests for one backend.
macro_rules! cli_tests {
    ($backend:ty, $db:expr) => {
        macro_rules! case {
            ($name:ident) => {
                #[actix::test]
                async fn $name() {
                    super::$name::<$backend>($db).await;
                }
            };
        }

        case!(status_counts_what_the_tables_hold);
        case!(status_shows_a_sane_lag_for_any_timestamp);
        case!(dead_letters_are_listed_and_shown);
        case!(replay_requeues_and_the_bus_redelivers);
        case!(discard_requires_yes);
        case!(sweep_deletes_old_rows_and_keeps_recent_ones);
        case!(subscriptions_lists_a_stopped_one_with_what_it_owes);
        case!(subscriptions_retire_finishes_only_what_it_alone_owed);
        case!(subscriptions_retire_with_json);
        case!(subscriptions_retire_is_refused_while_a_process_serves_it);
        case!(status_shows_subscriptions_and_stalled_messages);
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    cli_tests!(tickbox::Sqlite, super::Db::new());

    /// A missing file and a file without tickbox tables.
    #[actix::test]
    async fn bad_databases_fail_with_clear_errors() {
        let db = super::Db::new();
        let missing = db.dir.path().join("missing.db");
        let missing = missing.to_str().expect("UTF-8").to_string();
        let run = super::run_cli(vec![
            "--database-url".into(),
            missing.clone(),
            "status".into(),
        ])
        .await;
        run.fails(1, "cannot open the database");
        assert!(run.stderr.contains(&missing), "{run:#?}");
        assert!(run.stderr.contains("no database file there"), "{run:#?}");
        assert!(!std::path::Path::new(&missing).exists(), "not created");

        let empty = db.dir.path().join("empty.db");
        std::fs::write(&empty, b"").expect("an empty file");
        let empty = format!("sqlite://{}", empty.to_str().expect("UTF-8"));
        for command in [&["status"][..], &["dead-letters", "list"], &["sweep"]] {
            let mut args = vec!["--database-url".to_string(), empty.clone()];
            args.extend(command.iter().map(|c| c.to_string()));
            super::run_cli(args).await.fails(1, "has no tickbox tables");
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    cli_tests!(tickbox::Postgres, super::Db::postgres());

    /// An unreachable server, and schemas without tickbox tables.
    #[actix::test]
    async fn bad_databases_fail_with_clear_errors() {
        let db = super::Db::postgres();
        let run = super::run_cli(vec![
            "--database-url".into(),
            "postgres://tickbox:hunter2@127.0.0.1:1/nowhere".into(),
            "status".into(),
        ])
        .await;
        run.fails(1, "cannot open the database");
        assert!(run.stderr.contains("127.0.0.1:1"), "{run:#?}");
        assert!(!run.stderr.contains("hunter2"), "password shown: {run:#?}");

        // A schema that does not exist, and one that exists but is empty.
        let url = db.pg_url.clone().expect("a URL");
        let other = super::orders::<tickbox::Postgres>(&db).await;
        let empty = format!("{}_empty", db.schema);
        super::execute(&other, format!("CREATE SCHEMA {empty}")).await;
        for schema in [format!("{}_never", db.schema), empty] {
            let run = super::run_cli(vec![
                "--database-url".into(),
                url.clone(),
                "--schema".into(),
                schema.clone(),
                "dead-letters".into(),
                "list".into(),
            ])
            .await;
            run.fails(1, "has no tickbox tables");
            assert!(run.stderr.contains(&schema), "{run:#?}");
        }

        // A schema name PostgreSQL would need quoted is a usage error.
        let run = super::run_cli(vec![
            "--database-url".into(),
            url,
            "--schema".into(),
            "Orders-Module".into(),
            "status".into(),
        ])
        .await;
        run.fails(2, "schema name `Orders-Module`");
        assert!(
            run.stderr.contains("Usage: tickbox [OPTIONS] status"),
            "{run:#?}"
        );
    }
}

#[cfg(feature = "postgres")]
mod postgres_passwords {
    use super::run_cli;

    /// The test server's URL with another database and path, e.g.
    /// `postgres://postgres@127.0.0.1:5432/nodb_x?password=S3cret!`.
    fn server_url(path: &str, query: Option<&str>) -> (url::Url, String) {
        let server = super::Db::postgres().pg_url.expect("a URL");
        let mut url = url::Url::parse(&server).expect("TICKBOX_PG_URL parses");
        url.set_path(path);
        url.set_query(query);
        (url.clone(), url.to_string())
    }

    /// A password in the URL's query is never printed, by any command, in
    /// text or with --json, and the error still names the host and the
    /// database.
    #[actix::test]
    async fn a_password_in_the_query_is_never_shown() {
        let (url, text) = server_url("/nodb_x", Some("password=S3cret!"));
        let host = format!(
            "{}:{}",
            url.host_str().expect("a host"),
            url.port().unwrap_or(5432)
        );
        for command in [
            &["status"][..],
            &["--json", "status"],
            &["dead-letters", "list"],
            &["--json", "dead-letters", "list"],
            &["--json", "sweep"],
        ] {
            let mut args = vec!["--database-url".to_string(), text.clone()];
            args.extend(command.iter().map(|c| c.to_string()));
            let run = run_cli(args).await;
            run.fails(1, "cannot open the database of module `nodb_x`");
            assert!(!run.stderr.contains("S3cret"), "password shown: {run:#?}");
            assert!(run.stderr.contains(&host), "{command:?}: {run:#?}");
            assert!(
                run.stderr.contains("/nodb_x?password=***"),
                "{command:?}: {run:#?}"
            );
        }
        // The same URL from the environment.
        let run = super::run_cli_with_env(vec!["--json".into(), "status".into()], Some(text)).await;
        run.fails(1, "cannot open the database");
        assert!(!run.stderr.contains("S3cret"), "password shown: {run:#?}");
    }

    /// A raw `/` in a password breaks the URL: nothing after the scheme is
    /// shown, not even as the module's name.
    #[actix::test]
    async fn a_password_that_breaks_the_url_is_never_shown() {
        let (url, _) = server_url("/nodb_x", None);
        let text = format!(
            "postgres://postgres:S3/cret@{}:{}/nodb_x",
            url.host_str().expect("a host"),
            url.port().unwrap_or(5432)
        );
        for command in [&["status"][..], &["--json", "status"]] {
            let mut args = vec!["--database-url".to_string(), text.clone()];
            args.extend(command.iter().map(|c| c.to_string()));
            let run = run_cli(args).await;
            assert_eq!(run.code, 1, "{run:#?}");
            assert!(run.stdout.is_empty(), "{run:#?}");
            assert!(!run.stderr.contains("cret"), "password shown: {run:#?}");
            assert!(run.stderr.contains("postgres://***"), "{run:#?}");
        }
    }
}

/// A PostgreSQL URL given to a binary built without PostgreSQL support.
#[cfg(not(feature = "postgres"))]
#[actix::test]
async fn a_postgres_url_needs_the_postgres_feature() {
    run_cli(vec![
        "--database-url".into(),
        "postgres://postgres@127.0.0.1:5432/test".into(),
        "status".into(),
    ])
    .await
    .fails(1, "--features postgres");
}

/// Help pages, the version, and usage errors (exit 2) that never touch a
/// database.
#[actix::test]
async fn help_and_usage_errors() {
    let args = |line: &str| {
        line.split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };

    for line in ["--help", "-h", "help"] {
        let help = run_cli(args(line)).await;
        let out = help.ok();
        assert!(out.starts_with("tickbox "), "{out}");
        for part in [
            "Usage: tickbox [OPTIONS] <COMMAND>",
            "Commands:",
            "status",
            "dead-letters list",
            "dead-letters show",
            "dead-letters replay",
            "dead-letters discard",
            "subscriptions [list]",
            "subscriptions retire",
            "sweep",
            "--database-url URL",
            "[env: TICKBOX_DATABASE_URL]",
            "--schema NAME",
            "--json",
            "Examples:",
            "Exit status:",
        ] {
            assert!(out.contains(part), "`{part}` in {out}");
        }
    }
    for (line, usage) in [
        ("help status", "Usage: tickbox [OPTIONS] status"),
        ("status --help", "Usage: tickbox [OPTIONS] status"),
        (
            "help dead-letters",
            "dead-letters <list|show|replay|discard>",
        ),
        ("dead-letters list -h", "[--offset N] [--limit N]"),
        ("help dead-letters show", "show MESSAGE_ID HANDLER"),
        ("dead-letters replay --help", "replay MESSAGE_ID HANDLER"),
        (
            "help dead-letters discard",
            "discard MESSAGE_ID HANDLER --yes",
        ),
        ("sweep --help", "[--inbox-retention DURATION]"),
        ("status --help", "status [--stalled-after DURATION]"),
        ("help subscriptions", "subscriptions [list|retire]"),
        ("subscriptions --help", "subscriptions [list|retire]"),
        ("subscriptions list -h", "subscriptions [list]"),
        (
            "help subscriptions retire",
            "subscriptions retire MODULE HANDLER --yes",
        ),
    ] {
        let help = run_cli(args(line)).await;
        let out = help.ok();
        assert!(out.starts_with("Usage: "), "{line}: {out}");
        assert!(out.contains(usage), "{line}: `{usage}` in {out}");
        assert!(out.contains("Examples:"), "{line}: {out}");
        assert!(out.contains("Exit status:"), "{line}: {out}");
    }
    let discard = run_cli(args("help dead-letters discard")).await;
    assert!(discard.ok().contains("--yes"));
    let show = run_cli(args("help dead-letters show")).await;
    assert!(
        show.ok().contains("- or ''"),
        "the empty handler is documented"
    );
    let sweep = run_cli(args("help sweep")).await;
    assert!(sweep.ok().contains("[default: 7d]"));
    let status = run_cli(args("help status")).await;
    assert!(status.ok().contains("[default: 60s"));
    let retire = run_cli(args("help subscriptions retire")).await;
    assert!(retire.ok().contains("-y, --yes"));

    let version = run_cli(args("--version")).await;
    assert_eq!(
        version.ok(),
        format!("tickbox {}\n", env!("CARGO_PKG_VERSION"))
    );

    let id = Uuid::now_v7().to_string();
    for (line, needle) in [
        ("", "no command given"),
        (
            "--database-url x.db frobnicate",
            "unknown command `frobnicate`",
        ),
        (
            "--database-url x.db status --verbose",
            "unknown option `--verbose`",
        ),
        ("status", "TICKBOX_DATABASE_URL"),
        ("--database-url", "--database-url needs a value"),
        (
            "--database-url x.db status extra",
            "unexpected argument `extra`",
        ),
        (
            "--database-url x.db status --yes",
            "--yes does not apply to `status`",
        ),
        ("--database-url x.db dead-letters", "needs a subcommand"),
        (
            "--database-url x.db dead-letters purge",
            "unknown subcommand",
        ),
        (
            "--database-url x.db dead-letters show",
            "MESSAGE_ID and HANDLER",
        ),
        (
            "--database-url x.db dead-letters show 42 h",
            "not a message id",
        ),
        (
            "--database-url x.db dead-letters list --limit many",
            "--limit",
        ),
        (
            "--database-url x.db sweep --inbox-retention 0s",
            "above zero",
        ),
        (
            "--database-url x.db sweep --outbox-retention 3y",
            "unknown unit",
        ),
        ("--database-url x.db --schema s status", "PostgreSQL only"),
        (
            "--database-url mysql://h/db status",
            "neither an SQLite path",
        ),
        ("help frobnicate", "no help for `frobnicate`"),
        (
            "--database-url x.db subscriptions purge",
            "unknown subcommand `subscriptions purge`",
        ),
        (
            "--database-url x.db subscriptions retire orders",
            "MODULE and HANDLER",
        ),
        (
            "--database-url x.db subscriptions --offset 3",
            "--offset does not apply to `subscriptions list`",
        ),
        (
            "--database-url x.db status --stalled-after never",
            "--stalled-after `never`",
        ),
        (
            "--database-url x.db sweep --stalled-after 1m",
            "--stalled-after does not apply to `sweep`",
        ),
    ] {
        let run = run_cli(args(line)).await;
        run.fails(2, needle);
        assert!(run.stderr.contains("\nUsage: tickbox"), "{line}: {run:#?}");
        assert!(run.stderr.contains("Run `tickbox help"), "{line}: {run:#?}");
    }
    let discard = run_cli(args(&format!(
        "--database-url x.db dead-letters discard {id} orders.ping"
    )))
    .await;
    discard.fails(2, "without --yes");
    let retire = run_cli(args(
        "--database-url x.db subscriptions retire orders orders.ping",
    ))
    .await;
    retire.fails(2, "without --yes");
    assert!(
        !std::path::Path::new("x.db").exists(),
        "no database was touched"
    );
}
