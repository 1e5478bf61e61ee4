//! Several processes over one set of databases: every handler, in whichever
//! process, receives every message. Each "process" here is a bus with its
//! own handles to the same databases, exactly what a second process holds
//! (they share nothing but the databases); the SIGKILL tests run real
//! processes (`tests/processes`).

use crate::suite::publish;
use crate::support::*;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;
use tickbox::testing::Session;
use tickbox::{Bus, BusHandle, Error, ModuleHandle};

/// The subscriber modules a process can run; each has one handler
/// `<module>.record` on `Ping`.
const SUBSCRIBERS: [&str; 2] = ["warehouse", "journeys"];

/// One process: its own handle of `orders` (which publishes Ping), the
/// subscriber modules it runs, and its bus.
struct Process<B: TestBackend> {
    orders: ModuleHandle<B>,
    subscribers: Vec<ModuleHandle<B>>,
    bus: BusHandle<B>,
}

async fn process<B: TestBackend>(db: &TestDb, runs: &[&str], handler: &Record) -> Process<B> {
    let orders = B::module(db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let mut subscribers = Vec::new();
    for name in runs {
        let module = B::module(db, name)
            .handler(format!("{name}.record"), record::<Ping>(handler))
            .start()
            .await
            .expect("subscriber starts");
        create_changes(&module).await;
        subscribers.push(module);
    }
    let bus = subscribers
        .iter()
        .fold(Bus::builder().module(&orders), |b, m| b.module(m))
        .retry_policy(crate::suite::fast_retries())
        .scan_interval(Duration::from_millis(100))
        .claim_lease(Duration::from_millis(500))
        .start()
        .await
        .expect("bus starts");
    Process {
        orders,
        subscribers,
        bus,
    }
}

/// A handle of a subscriber module for reading, opened beside the processes.
async fn reader<B: TestBackend>(db: &TestDb, name: &str) -> ModuleHandle<B> {
    let module = B::module(db, name).start().await.expect("reader starts");
    create_changes(&module).await;
    module
}

/// Changes of `<name>.record` and how many messages it handled twice.
async fn handled<B: TestBackend>(module: &ModuleHandle<B>) -> (i64, i64) {
    let handler = format!("{}.record", module.name());
    let changes = changes(module, &handler).await;
    let doubled = count(
        module,
        format!(
            "SELECT count(*) AS n FROM (SELECT message_id FROM changes \
             WHERE handler = '{handler}' GROUP BY message_id HAVING count(*) > 1) doubled"
        ),
    )
    .await;
    (changes, doubled)
}

async fn pending<B: TestBackend>(orders: &ModuleHandle<B>) -> i64 {
    orders.store_stats().await.expect("stats").outbox_pending
}

/// Runs `sets` as processes (started in order), publishes `n` messages from
/// each process in turn, and checks every subscribed handler handled each
/// exactly once and the outbox is empty.
async fn every_handler_gets_every_message<B: TestBackend>(db: TestDb, sets: &[&[&str]]) {
    let handler = Record::new(Then::Succeed);
    let mut processes = Vec::new();
    for runs in sets {
        processes.push(process::<B>(&db, runs, &handler).await);
    }
    // One session over every process's modules follows each message to
    // whichever process handles it.
    let watched: Vec<ModuleHandle<B>> = processes
        .iter()
        .flat_map(|p| std::iter::once(&p.orders).chain(&p.subscribers))
        .cloned()
        .collect();
    let session = Session::over(&watched);
    let n = 30;
    for i in 0..n {
        let from = &processes[i as usize % processes.len()];
        publish(&from.orders, i).await;
    }
    session.wait().await;
    let readers: Vec<ModuleHandle<B>> = {
        let mut readers = Vec::new();
        for name in SUBSCRIBERS
            .iter()
            .filter(|name| sets.iter().any(|set| set.contains(name)))
        {
            readers.push(reader::<B>(&db, name).await);
        }
        readers
    };
    let orders = &processes[0].orders;
    eventually(
        "the outbox records every message finished",
        WAIT,
        || async { pending(orders).await == 0 },
    )
    .await;
    for module in &readers {
        assert_eq!(
            handled(module).await,
            (n as i64, 0),
            "{}: every message handled, none twice",
            module.name()
        );
    }
    assert!(
        orders
            .dead_letters(0, 10)
            .await
            .expect("dead letters")
            .is_empty(),
        "nothing dead-lettered"
    );
    // Every subscription is recorded in the publisher's database.
    let recorded = orders.subscriptions().await.expect("subscriptions");
    let names: Vec<(&str, &str)> = recorded
        .iter()
        .map(|s| (s.module.as_str(), s.handler.as_str()))
        .collect();
    let expected: Vec<(&str, String)> = readers
        .iter()
        .map(|m| (m.name(), format!("{}.record", m.name())))
        .collect();
    assert_eq!(names.len(), expected.len(), "{recorded:?}");
    for (module, handler) in &expected {
        assert!(names.contains(&(module, handler.as_str())), "{recorded:?}");
    }
    for process in processes {
        process.bus.stop().await;
        drop(process.subscribers);
    }
}

pub async fn processes_with_disjoint_handlers_each_get_every_message<B: TestBackend>(db: TestDb) {
    // The second process runs only the other handler: before tickbox kept
    // subscriptions, whichever bus claimed a row marked it delivered when
    // *its* handlers were done, and the other handler never saw it.
    every_handler_gets_every_message::<B>(db, &[&["journeys"], &["warehouse"]]).await;
}

pub async fn processes_with_overlapping_handlers_each_get_every_message<B: TestBackend>(
    db: TestDb,
) {
    every_handler_gets_every_message::<B>(db, &[&["warehouse"], &["warehouse", "journeys"]]).await;
}

pub async fn three_processes_one_only_publishing_each_get_every_message<B: TestBackend>(
    db: TestDb,
) {
    every_handler_gets_every_message::<B>(db, &[&[], &["warehouse"], &["journeys"]]).await;
}

pub async fn replicas_with_identical_handlers_each_get_every_message_once<B: TestBackend>(
    db: TestDb,
) {
    every_handler_gets_every_message::<B>(
        db,
        &[&["warehouse", "journeys"], &["warehouse", "journeys"]],
    )
    .await;
}

pub async fn a_late_subscriber_gets_what_commits_after_it_subscribed<B: TestBackend>(db: TestDb) {
    let handler = Record::new(Then::Succeed);
    let first = process::<B>(&db, &["warehouse"], &handler).await;
    for n in 0..10 {
        publish(&first.orders, n).await;
    }
    let warehouse = reader::<B>(&db, "warehouse").await;
    eventually("the first ten are delivered", WAIT, || async {
        pending(&first.orders).await == 0 && handled(&warehouse).await.0 == 10
    })
    .await;

    let late = process::<B>(&db, &["journeys"], &handler).await;
    for n in 10..25 {
        publish(&first.orders, n).await;
    }
    let journeys = reader::<B>(&db, "journeys").await;
    eventually("the later fifteen reach both handlers", WAIT, || async {
        pending(&first.orders).await == 0
            && handled(&warehouse).await.0 == 25
            && handled(&journeys).await.0 == 15
    })
    .await;
    assert_eq!(
        handled(&warehouse).await,
        (25, 0),
        "nothing lost for the first"
    );
    assert_eq!(
        handled(&journeys).await,
        (15, 0),
        "the late handler gets what committed after it subscribed"
    );
    late.bus.stop().await;
    first.bus.stop().await;
}

pub async fn a_stopped_subscriber_keeps_its_messages_until_it_returns_or_is_retired<
    B: TestBackend,
>(
    db: TestDb,
) {
    let handler = Record::new(Then::Succeed);
    let main = process::<B>(&db, &["warehouse"], &handler).await;
    let side = process::<B>(&db, &["journeys"], &handler).await;
    let warehouse = reader::<B>(&db, "warehouse").await;
    let journeys = reader::<B>(&db, "journeys").await;

    // journeys' process stops: its messages wait for it.
    side.bus.stop().await;
    for n in 0..5 {
        publish(&main.orders, n).await;
    }
    eventually(
        "warehouse handles its five and records them done",
        WAIT,
        || async {
            handled(&warehouse).await.0 == 5 && owes_nothing(&main.orders, "warehouse").await
        },
    )
    .await;
    assert_eq!(pending(&main.orders).await, 5, "kept for journeys");
    let recorded = main.orders.subscriptions().await.expect("subscriptions");
    let owed = recorded
        .iter()
        .find(|s| s.module == "journeys")
        .expect("journeys' subscription stays");
    assert!(owed.oldest_pending_us.is_some(), "{owed:?}");
    assert!(!owed.is_alive(now_us()), "its process stopped: {owed:?}");
    let served = recorded
        .iter()
        .find(|s| s.module == "warehouse")
        .expect("warehouse's subscription");
    assert_eq!(served.oldest_pending_us, None, "warehouse owes nothing");

    // It comes back and catches up.
    let side = process::<B>(&db, &["journeys"], &handler).await;
    eventually("journeys catches up", WAIT, || async {
        handled(&journeys).await.0 == 5 && pending(&main.orders).await == 0
    })
    .await;

    // It stops for good: a running subscription cannot be retired, a
    // stopped one can, and its messages are released.
    let in_use = main
        .orders
        .retire_subscription("journeys", "journeys.record")
        .await
        .expect_err("journeys still runs");
    assert!(
        matches!(in_use, Error::SubscriptionInUse { .. }),
        "{in_use}"
    );
    side.bus.stop().await;
    for n in 5..12 {
        publish(&main.orders, n).await;
    }
    eventually(
        "warehouse handles the next seven and records them done",
        WAIT,
        || async {
            handled(&warehouse).await.0 == 12 && owes_nothing(&main.orders, "warehouse").await
        },
    )
    .await;
    assert_eq!(pending(&main.orders).await, 7, "kept for journeys");
    let released = main
        .orders
        .retire_subscription("journeys", "journeys.record")
        .await
        .expect("a stopped subscription is retired");
    assert_eq!(released, 7, "the messages only journeys owed are delivered");
    assert_eq!(pending(&main.orders).await, 0);
    let unknown = main
        .orders
        .retire_subscription("journeys", "journeys.record")
        .await
        .expect_err("already retired");
    assert!(
        matches!(unknown, Error::NoSuchSubscription { .. }),
        "{unknown}"
    );
    // The others are unaffected: later messages flow as before.
    publish(&main.orders, 12).await;
    eventually("warehouse still gets new messages", WAIT, || async {
        handled(&warehouse).await.0 == 13 && pending(&main.orders).await == 0
    })
    .await;
    assert_eq!(handled(&journeys).await, (5, 0));
    assert_eq!(handled(&warehouse).await, (13, 0));
    main.bus.stop().await;
}

pub async fn a_handler_on_another_topic_in_a_running_process_is_refused<B: TestBackend>(
    db: TestDb,
) {
    let handler = Record::new(Then::Succeed);
    let running = process::<B>(&db, &["warehouse"], &handler).await;
    // Another release of the code subscribes the same handler to Pong.
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .publishes::<Pong>()
        .start()
        .await
        .expect("orders");
    let warehouse = B::module(&db, "warehouse")
        .handler("warehouse.record", record::<Pong>(&handler))
        .start()
        .await
        .expect("warehouse");
    let refused = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .start()
        .await
        .err()
        .expect("the conflicting bus is refused");
    assert!(
        matches!(refused, Error::SubscriptionConflict { .. }),
        "{refused}"
    );
    let text = refused.to_string();
    assert!(
        text.contains("warehouse.record")
            && text.contains("test.pong")
            && text.contains("test.ping"),
        "the error names the handler and both topics: {text}"
    );
    // Nothing is lost: the running process keeps delivering.
    for n in 0..5 {
        publish(&running.orders, n).await;
    }
    let reader = reader::<B>(&db, "warehouse").await;
    eventually("the running process delivers", WAIT, || async {
        handled(&reader).await.0 == 5 && pending(&running.orders).await == 0
    })
    .await;
    assert_eq!(handler.calls.load(SeqCst), 5);
    running.bus.stop().await;
}

pub async fn a_database_migrated_by_a_newer_tickbox_is_refused<B: TestBackend>(db: TestDb) {
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders");
    execute(
        &orders,
        "INSERT INTO tickbox_schema_version (version) VALUES ('20991231000000')".into(),
    )
    .await
    .expect("a later tickbox migration recorded");
    orders.close();
    let refused = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect_err("a newer schema is refused");
    assert!(matches!(refused, Error::SchemaVersion { .. }), "{refused}");
    assert!(
        refused.to_string().contains("20991231000000"),
        "the error names the unknown migration: {refused}"
    );
}

/// Processes starting together on a new database: one migrates, the others
/// wait for it and find the tables made (none fails on "table already
/// exists").
pub async fn processes_starting_together_on_a_new_database_migrate_once<B: TestBackend>(
    db: TestDb,
) {
    let starts = (0..8).map(|_| B::module(&db, "orders").publishes::<Ping>().start());
    let opened = futures_util::future::join_all(starts).await;
    let mut modules = Vec::new();
    for module in opened {
        modules.push(module.expect("every process starts"));
    }
    let applied = count(
        &modules[0],
        "SELECT count(*) AS n FROM __diesel_schema_migrations",
    )
    .await;
    let distinct = count(
        &modules[0],
        "SELECT count(DISTINCT version) AS n FROM __diesel_schema_migrations",
    )
    .await;
    assert!(applied > 0, "the migrations were recorded");
    assert_eq!(applied, distinct, "each migration was applied once");
    for module in &modules {
        publish(module, 1).await;
    }
    assert_eq!(
        count(&modules[0], "SELECT count(*) AS n FROM tickbox_outbox").await,
        8
    );
}

/// A process that opens a database without migrating (a tool, a process
/// attaching) while another makes it sees all of tickbox's tables or none
/// of them: the error of a database not there yet, never one of a
/// half-made database (taken for an older version's) or a missing table.
pub async fn a_database_being_made_is_never_seen_half_made<B: TestBackend>(db: TestDb) {
    let not_there = B::module(&db, "orders")
        .attach()
        .await
        .expect_err("nothing to attach to yet");
    let making = B::module(&db, "orders").publishes::<Ping>().start();
    let attaching = async {
        let deadline = std::time::Instant::now() + WAIT;
        let mut early = 0;
        loop {
            match B::module(&db, "orders").attach().await {
                Ok(module) => {
                    module.close();
                    return early;
                }
                Err(e) if std::mem::discriminant(&e) == std::mem::discriminant(&not_there) => {}
                Err(Error::NotATickboxDatabase { .. }) => {}
                Err(e) => panic!("attached to a half-made database: {e}"),
            }
            early += 1;
            assert!(
                std::time::Instant::now() < deadline,
                "the database was not made within {WAIT:?}"
            );
            tokio::task::yield_now().await;
        }
    };
    let (made, early) = tokio::join!(making, attaching);
    made.expect("the making process starts").close();
    eprintln!("{early} attaches before the database was made");
}

/// Whether `module`'s subscription to `outbox` owes no message: its bus has
/// recorded its part of each (a handler commits before that).
async fn owes_nothing<B: TestBackend>(outbox: &ModuleHandle<B>, module: &str) -> bool {
    let recorded = outbox.subscriptions().await.expect("subscriptions");
    recorded
        .iter()
        .filter(|s| s.module == module)
        .all(|s| s.oldest_pending_us.is_none())
}

fn now_us() -> i64 {
    micros_ago(Duration::ZERO)
}

/// The application's own migrations for a module's tables, given to its
/// builder.
const APP_MIGRATIONS: tickbox::diesel_migrations::EmbeddedMigrations = {
    use tickbox::diesel_migrations;
    diesel_migrations::embed_migrations!("tests/app_migrations")
};

/// Application migrations whose version is one of tickbox's.
const CLASHING_MIGRATIONS: tickbox::diesel_migrations::EmbeddedMigrations = {
    use tickbox::diesel_migrations;
    diesel_migrations::embed_migrations!("tests/app_migrations_clashing")
};

/// Application migrations whose version is that of a tickbox migration
/// that only PostgreSQL's and MySQL's databases hold (on SQLite, the
/// effects journal's lives in a file of its own).
const CLASHING_ON_POSTGRES: tickbox::diesel_migrations::EmbeddedMigrations = {
    use tickbox::diesel_migrations;
    diesel_migrations::embed_migrations!("tests/app_migrations_clashing_postgres_only")
};

/// A module runs the application's migrations at start, once however many
/// processes start together, and an application's migration is never taken
/// for a newer tickbox's.
pub async fn a_module_runs_the_applications_own_migrations<B: TestBackend>(db: TestDb) {
    let starts = (0..4).map(|_| {
        B::module(&db, "orders")
            .publishes::<Ping>()
            .migrations(&APP_MIGRATIONS)
            .start()
    });
    let mut modules = Vec::new();
    for module in futures_util::future::join_all(starts).await {
        modules.push(module.expect("every process starts and migrates"));
    }
    execute(
        &modules[0],
        "INSERT INTO app_things (id, note) VALUES (1, 'made by the application''s migration')"
            .into(),
    )
    .await
    .expect("the application's table exists");
    assert_eq!(
        count(
            &modules[0],
            "SELECT count(*) AS n FROM __diesel_schema_migrations WHERE version = '20261204120000'",
        )
        .await,
        1,
        "recorded once, where the diesel CLI records it"
    );
    for module in &modules {
        module.close();
    }
    // Started again, with or without them: the application's version is
    // not taken for a newer tickbox's.
    for with_app in [true, false] {
        let builder = B::module(&db, "orders").publishes::<Ping>();
        let builder = if with_app {
            builder.migrations(&APP_MIGRATIONS)
        } else {
            builder
        };
        let module = builder.start().await.expect("starts again");
        assert_eq!(
            count(&module, "SELECT count(*) AS n FROM app_things").await,
            1
        );
        module.close();
    }
    // One whose version is tickbox's would be taken as applied: refused.
    let clashing = B::module(&db, "orders")
        .migrations(&CLASHING_MIGRATIONS)
        .start()
        .await
        .expect_err("a clashing version is refused");
    assert!(
        clashing.to_string().contains("2026-12-01-000000_clash"),
        "{clashing}"
    );
}

/// A folder name is refused on every backend if it is on one: the version
/// of a tickbox migration that only PostgreSQL's and MySQL's databases hold
/// is refused on SQLite too, with an error naming the folder (either
/// backend's: the first in name order holding the version) and saying how
/// to name it.
pub async fn a_migration_with_a_version_of_tickbox_on_any_backend_is_refused<B: TestBackend>(
    db: TestDb,
) {
    let refused = B::module(&db, "orders")
        .migrations(&CLASHING_ON_POSTGRES)
        .start()
        .await
        .expect_err("the version of tickbox's PostgreSQL-only migration is refused");
    let message = refused.to_string();
    for expected in [
        "`2026-12-06-000000_clash`",
        "YYYY-MM-DD-HHMMSS_name",
        "2026-12-01-000000",
    ] {
        assert!(message.contains(expected), "{expected} in: {message}");
    }
    assert!(
        ["postgres", "mysql"]
            .iter()
            .any(|folder| message
                .contains(&format!("`migrations/{folder}/2026-12-06-000000_effects`"))),
        "tickbox's effects migration named in: {message}"
    );
}

/// On a server whose DDL commits at once (MariaDB, MySQL), a process killed
/// in the middle of a migration leaves the statements before the kill done
/// and the migration unrecorded: the next start runs it again from its
/// first statement, over tables, columns and indexes already there, and
/// must start. Shown at its worst: every migration's work done and none
/// recorded.
#[cfg_attr(not(feature = "mysql"), allow(dead_code))]
pub async fn a_migration_cut_short_runs_again_over_its_own_work<B: TestBackend>(db: TestDb) {
    let first = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("a new database is made and migrated");
    let migrations = count(
        &first,
        "SELECT count(*) AS n FROM __diesel_schema_migrations",
    )
    .await;
    assert!(migrations > 0, "the migrations are recorded");
    // What a kill after each migration's DDL and before its record leaves.
    execute(&first, "DELETE FROM __diesel_schema_migrations".into())
        .await
        .expect("the records go");
    first.close();
    let again = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("the migrations run again over their own work");
    assert_eq!(
        count(
            &again,
            "SELECT count(*) AS n FROM __diesel_schema_migrations"
        )
        .await,
        migrations,
        "every migration ran again and is recorded once"
    );
    // The module works: it publishes.
    publish(&again, 1).await;
    again.close();
}
