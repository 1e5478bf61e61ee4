//! An application of several modules, each with its own database, seen by
//! one command: every module's rows with its module's name (the name its
//! database records, not the file's or the schema's), and the commands that
//! act on one row finding the module whose database holds it.

use crate::support::*;
use serde_json::Value;
use std::time::Duration;
use tickbox::{Bus, ModuleHandle};

/// The application's modules' databases, in the order the PostgreSQL
/// tests name their schemas.
const PLACES: [&str; 3] = ["orders", "warehouse", "notifications"];

/// The application: orders publishes `cli.ping` and handles it itself,
/// warehouse handles it too, notifications has no handler.
struct Shop<B: CliBackend> {
    orders: ModuleHandle<B>,
    warehouse: ModuleHandle<B>,
    notifications: ModuleHandle<B>,
}

impl<B: CliBackend> Shop<B> {
    async fn start(db: &Db) -> Self {
        let start = |place: &str| B::module_at(db, place, place);
        Shop {
            orders: start("orders")
                .publishes::<CliPing>()
                .handler("orders.ping", Accept)
                .start()
                .await
                .expect("orders starts"),
            warehouse: start("warehouse")
                .handler("warehouse.ping", Accept)
                .start()
                .await
                .expect("warehouse starts"),
            notifications: start("notifications")
                .start()
                .await
                .expect("notifications starts"),
        }
    }
}

/// Runs the tool on every module of the application: `args` after the
/// options naming their databases.
async fn on_shop<B: CliBackend>(db: &Db, args: &[&str]) -> Run {
    let mut all = B::application_args(db, &PLACES);
    all.extend(args.iter().map(|a| a.to_string()));
    run_cli(all).await
}

/// The `module` of each object of a JSON array, sorted.
fn modules_of(array: &Value) -> Vec<String> {
    let mut modules: Vec<String> = array
        .as_array()
        .unwrap_or_else(|| panic!("an array: {array}"))
        .iter()
        .map(|o| o["module"].as_str().expect("a module").to_string())
        .collect();
    modules.sort();
    modules
}

async fn one_command_sees_every_module<B: CliBackend>(db: Db) {
    let shop = Shop::<B>::start(&db).await;
    let stock = Dead {
        handler: "warehouse.ping",
        dead_at_us: NEW_YEAR_US,
        ..Dead::ping(uuid_ago(DAY))
    };
    let mail = Dead {
        handler: "notifications.mail",
        dead_at_us: NEW_YEAR_US + 1_000_000,
        ..Dead::ping(uuid_ago(DAY))
    };
    insert_dead(&shop.warehouse, &stock).await;
    insert_dead(&shop.notifications, &mail).await;
    let (stock_id, mail_id) = (stock.id.to_string(), mail.id.to_string());

    // The dead letters of every module, oldest first, each with its module.
    let list = on_shop::<B>(&db, &["dead-letters", "list"]).await;
    let out = list.ok();
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines[0].starts_with("MODULE "), "{out}");
    assert!(lines[1].starts_with("warehouse "), "{out}");
    assert!(lines[1].contains(&stock_id), "{out}");
    assert!(lines[2].starts_with("notifications "), "{out}");
    assert!(lines[2].contains(&mail_id), "{out}");
    assert!(out.ends_with("\n2 dead letters\n"), "{out}");
    let json = on_shop::<B>(&db, &["--json", "dead-letters", "list"])
        .await
        .json();
    assert_eq!(json[0]["module"], "warehouse", "{json}");
    assert_eq!(json[0]["message_id"], stock_id.as_str(), "{json}");
    assert_eq!(json[1]["module"], "notifications", "{json}");
    assert_eq!(json[1]["handler"], "notifications.mail", "{json}");
    // A page of them.
    let page = on_shop::<B>(
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
    assert_eq!(modules_of(&page), ["notifications"], "{page}");

    // The status of every module, named by its module.
    let status = on_shop::<B>(&db, &["--json", "status"]).await.json();
    assert_eq!(
        modules_of(&status),
        ["notifications", "orders", "warehouse"],
        "{status}"
    );
    for module in status.as_array().expect("an array") {
        let expected = if module["module"] == "orders" { 0 } else { 1 };
        assert_eq!(module["dead_letters"], expected, "{module}");
    }
    let text = on_shop::<B>(&db, &["status"]).await;
    let out = text.ok();
    for module in PLACES {
        assert!(
            out.contains(&format!("module           {module}\nbackend")),
            "{module}: {out}"
        );
    }
    assert_eq!(out.matches("dead letters     1").count(), 2, "{out}");

    // One module of them.
    let warehouse = on_shop::<B>(&db, &["--module", "warehouse", "--json", "status"])
        .await
        .json();
    assert_eq!(warehouse["module"], "warehouse", "one object: {warehouse}");
    assert_eq!(warehouse["dead_letters"], 1, "{warehouse}");
    let only = on_shop::<B>(
        &db,
        &[
            "--module",
            "notifications",
            "--json",
            "dead-letters",
            "list",
        ],
    )
    .await
    .json();
    assert_eq!(modules_of(&only), ["notifications"], "{only}");

    // A dead letter is found in its module's database and replayed into
    // that module's outbox.
    let shown = on_shop::<B>(
        &db,
        &[
            "--json",
            "dead-letters",
            "show",
            &stock_id,
            "warehouse.ping",
        ],
    )
    .await
    .json();
    assert_eq!(shown["module"], "warehouse", "{shown}");
    let replayed = on_shop::<B>(
        &db,
        &[
            "--json",
            "dead-letters",
            "replay",
            &stock_id,
            "warehouse.ping",
        ],
    )
    .await
    .json();
    assert_eq!(replayed["module"], "warehouse", "{replayed}");
    assert_eq!(replayed["requeued"], true, "{replayed}");
    let stats = shop.warehouse.store_stats().await.expect("stats");
    assert_eq!((stats.outbox_pending, stats.dead_letters), (1, 0));
    let gone = on_shop::<B>(&db, &["dead-letters", "show", &stock_id, "warehouse.ping"]).await;
    gone.fails(1, "no dead letter for message");
    for module in PLACES {
        assert!(gone.stderr.contains(&format!("`{module}`")), "{gone:#?}");
    }
}

async fn a_row_several_modules_hold_needs_the_module<B: CliBackend>(db: Db) {
    let shop = Shop::<B>::start(&db).await;
    let twin = Dead {
        handler: "audit",
        ..Dead::ping(uuid_ago(DAY))
    };
    insert_dead(&shop.orders, &twin).await;
    insert_dead(&shop.notifications, &twin).await;
    let id = twin.id.to_string();

    let ambiguous = on_shop::<B>(&db, &["dead-letters", "discard", &id, "audit", "--yes"]).await;
    ambiguous.fails(2, "choose one with --module NAME");
    for module in ["`orders`", "`notifications`"] {
        assert!(ambiguous.stderr.contains(module), "{ambiguous:#?}");
    }
    assert!(
        ambiguous
            .stderr
            .contains("Usage: tickbox dead-letters discard"),
        "{ambiguous:#?}"
    );
    let discarded = on_shop::<B>(
        &db,
        &[
            "--module",
            "notifications",
            "--json",
            "dead-letters",
            "discard",
            &id,
            "audit",
            "--yes",
        ],
    )
    .await
    .json();
    assert_eq!(discarded["module"], "notifications", "{discarded}");
    // Now only orders holds one.
    let discarded = on_shop::<B>(
        &db,
        &["--json", "dead-letters", "discard", &id, "audit", "--yes"],
    )
    .await
    .json();
    assert_eq!(discarded["module"], "orders", "{discarded}");

    // A module no database records.
    on_shop::<B>(&db, &["--module", "billing", "status"])
        .await
        .fails(1, "no module `billing` among the databases given");
}

async fn subscriptions_are_retired_in_the_outbox_that_records_them<B: CliBackend>(db: Db) {
    let shop = Shop::<B>::start(&db).await;
    let bus = Bus::builder()
        .module(&shop.orders)
        .module(&shop.warehouse)
        .module(&shop.notifications)
        .start()
        .await
        .expect("the bus starts");
    bus.stop().await;
    eventually("the subscriptions are recorded as stopped", || async {
        let now = micros_ago(Duration::ZERO);
        let recorded = shop.orders.subscriptions().await.expect("subscriptions");
        recorded.len() == 2 && recorded.iter().all(|s| !s.is_alive(now))
    })
    .await;

    let listed = on_shop::<B>(&db, &["--json", "subscriptions"]).await.json();
    let all = listed.as_array().expect("an array");
    assert_eq!(all.len(), 2, "{listed}");
    assert!(all.iter().all(|s| s["outbox"] == "orders"), "{listed}");
    let text = on_shop::<B>(&db, &["subscriptions"]).await;
    assert!(
        text.ok()
            .lines()
            .any(|line| line.starts_with("orders  warehouse  warehouse.ping ")),
        "{text:#?}"
    );

    let retired = on_shop::<B>(
        &db,
        &[
            "--json",
            "subscriptions",
            "retire",
            "warehouse",
            "warehouse.ping",
            "--yes",
        ],
    )
    .await
    .json();
    assert_eq!(retired["outbox"], "orders", "{retired}");
    assert_eq!(retired["retired"], true, "{retired}");
    on_shop::<B>(
        &db,
        &[
            "subscriptions",
            "retire",
            "warehouse",
            "warehouse.ping",
            "--yes",
        ],
    )
    .await
    .fails(1, "no outbox among modules");
}

/// Two databases recording the same module: the tool cannot tell which is
/// the module's.
async fn a_module_given_twice_is_refused<B: CliBackend>(db: Db) {
    for (place, name) in [("orders", "orders"), ("orders_copy", "orders")] {
        B::module_at(&db, place, name)
            .start()
            .await
            .expect("the module starts");
    }
    let mut args = B::places_args(&db, &["orders", "orders_copy"]);
    args.push("status".into());
    let run = run_cli(args).await;
    run.fails(2, "module `orders` is given twice");
    // The same database named twice is one module.
    let mut args = B::places_args(&db, &["orders", "orders"]);
    args.extend(["--json".into(), "status".into()]);
    let status = run_cli(args).await.json();
    assert_eq!(modules_of(&status), ["orders"], "{status}");
}

/// Instantiates the generic tests for one backend.
macro_rules! application_tests {
    ($backend:ty, $db:expr) => {
        crate::support::backend_cases!(
            $backend,
            $db,
            [
                one_command_sees_every_module,
                a_row_several_modules_hold_needs_the_module,
                subscriptions_are_retired_in_the_outbox_that_records_them,
                a_module_given_twice_is_refused,
            ]
        );
    };
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;

    application_tests!(tickbox::Sqlite, Db::new());

    /// A module is named by the name its database records, whatever its
    /// file is called; a data directory's other files are not modules.
    #[actix::test]
    async fn a_module_is_named_by_its_database() {
        let db = Db::new();
        tickbox::Sqlite::module_at(&db, "ledger", "billing")
            .handler("billing.ping", Accept)
            .start()
            .await
            .expect("billing starts");
        std::fs::write(db.dir.path().join("notes.txt"), "not a module").expect("a file");
        let mut args = tickbox::Sqlite::application_args(&db, &[]);
        args.extend(["--json".into(), "status".into()]);
        let status = run_cli(args).await.json();
        assert_eq!(modules_of(&status), ["billing"], "{status}");
    }

    /// A data directory without module databases.
    #[actix::test]
    async fn an_empty_data_dir_is_a_clear_error() {
        let db = Db::new();
        let mut args = tickbox::Sqlite::application_args(&db, &[]);
        args.push("status".into());
        run_cli(args)
            .await
            .fails(1, "holds no module database (a NAME.db file)");
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    application_tests!(tickbox::Postgres, Db::postgres());
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;

    application_tests!(tickbox::Mysql, Db::mysql());
}

/// The old forms: the environment's database stands in for the command
/// line's, never beside a data directory.
#[cfg(feature = "sqlite")]
#[actix::test]
async fn the_environment_names_a_database_only_when_none_is_given() {
    let db = Db::new();
    let _shop = Shop::<tickbox::Sqlite>::start(&db).await;
    let elsewhere = Db::new();
    tickbox::Sqlite::module_at(&elsewhere, "billing", "billing")
        .start()
        .await
        .expect("billing starts");
    let billing = elsewhere.dir.path().join("billing.db");
    let billing = billing.to_str().expect("UTF-8").to_string();
    let alone = run_cli_with_env(
        vec!["--json".into(), "status".into()],
        Some(billing.clone()),
    )
    .await
    .json();
    assert_eq!(alone["module"], "billing", "one object: {alone}");
    let mut args = tickbox::Sqlite::application_args(&db, &[]);
    args.extend(["--json".into(), "status".into()]);
    let beside = run_cli_with_env(args, Some(billing)).await.json();
    assert_eq!(
        modules_of(&beside),
        ["notifications", "orders", "warehouse"],
        "{beside}"
    );
}
