//! The handlers' second safeguards, beyond the inbox: minishop's orders saga
//! and its warehouse are idempotent in their own right. `minishop --disturb`
//! delivers, straight to the handlers and each under a new message id (so
//! the inbox cannot catch it), messages that do not fit their order: a
//! second `StockReserved` for a confirmed order, one for a rejected order,
//! one for an order nobody placed, a `StockShort` for a confirmed order,
//! and an `OrderPlaced` again for an order reserved and for one found short.
//! Each must be ignored and recorded, once, in its module's database; the
//! duplicates the bus injects meanwhile must be caught by the inbox and
//! never reach those counts.
//!
//! `cargo test` builds the examples, so the binary is beside the test's.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Orders the disturbed run places besides the two it disturbs.
const ORDERS: i64 = 100;

/// Each disturbing message, and why its handler must ignore it.
const EXPECTED: [(&str, &str); 6] = [
    (
        "StockReserved again for a confirmed order",
        "the order is confirmed already",
    ),
    (
        "StockReserved for a rejected order",
        "the order is rejected already",
    ),
    ("StockReserved for an order nobody placed", "no such order"),
    (
        "StockShort for a confirmed order",
        "the order is confirmed already",
    ),
    (
        "OrderPlaced again for an order reserved",
        "the order was reserved already",
    ),
    (
        "OrderPlaced again for an order found short",
        "the order was found short already",
    ),
];

/// The minishop binary built with this test.
fn minishop() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile_dir.join("examples").join("minishop");
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test`, which builds the examples",
        path.display()
    );
    path
}

/// Runs minishop with `args` to its end, for at most three minutes.
fn run_minishop(args: &[String]) -> Output {
    let mut child = Command::new(minishop())
        .args(args)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("minishop starts");
    let deadline = Instant::now() + Duration::from_secs(180);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let output = child.wait_with_output().expect("its output");
            panic!(
                "minishop {args:?} did not finish within 3 minutes\nstderr:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("its output")
}

/// The databases of one disturbed run.
enum Place {
    /// One SQLite file per module in a directory of its own.
    Sqlite(tempfile::TempDir),
    /// A database of its own beside the one `TICKBOX_PG_URL` names, one
    /// schema per module.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres { url: String, database: String },
}

impl Place {
    fn sqlite() -> Self {
        Place::Sqlite(tempfile::tempdir().expect("a temporary directory"))
    }

    /// A new database on the server `TICKBOX_PG_URL` names: the test fails
    /// without the variable or the server.
    #[cfg(feature = "postgres")]
    fn postgres() -> Self {
        let base = std::env::var("TICKBOX_PG_URL").expect(
            "the PostgreSQL tests need TICKBOX_PG_URL, e.g. postgres://postgres@127.0.0.1:5432/test",
        );
        let database = format!("tickbox_safeguards_{:08x}", fastrand::u32(..));
        psql(&base, &format!("CREATE DATABASE {database}"));
        let (server, _) = base.rsplit_once('/').expect("a URL ending in /database");
        Place::Postgres {
            url: format!("{server}/{database}"),
            database,
        }
    }

    /// minishop's flags naming these databases.
    fn args(&self) -> Vec<String> {
        match self {
            Place::Sqlite(dir) => vec!["--data-dir".into(), dir.path().display().to_string()],
            Place::Postgres { url, .. } => vec!["--database-url".into(), url.clone()],
        }
    }

    /// The reason of every row of `module`'s `ignored_messages`, read
    /// straight from its database, sorted.
    fn ignored_reasons(&self, module: &str) -> Vec<String> {
        let sql = "SELECT reason FROM ignored_messages ORDER BY reason";
        let mut reasons: Vec<String> = match self {
            Place::Sqlite(dir) => {
                use diesel::{sql_query, sql_types::Text, Connection, RunQueryDsl};
                #[derive(diesel::QueryableByName)]
                struct Row {
                    #[diesel(sql_type = Text)]
                    reason: String,
                }
                let path = dir.path().join(format!("{module}.db"));
                let mut conn = diesel::SqliteConnection::establish(&path.display().to_string())
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                let rows: Vec<Row> = sql_query(sql)
                    .load(&mut conn)
                    .unwrap_or_else(|e| panic!("{sql} in {}: {e}", path.display()));
                rows.into_iter().map(|row| row.reason).collect()
            }
            Place::Postgres { url, .. } => {
                let sql = format!("SET search_path TO minishop_{module}; {sql}");
                psql(url, &sql).lines().map(String::from).collect()
            }
        };
        reasons.sort();
        reasons
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if let Place::Postgres { database, .. } = self {
            if let Ok(base) = std::env::var("TICKBOX_PG_URL") {
                let _ = Command::new("psql")
                    .args([
                        base.as_str(),
                        "-qc",
                        &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
                    ])
                    .output();
            }
        }
    }
}

/// Runs SQL with psql against `url`; panics with psql's words on failure.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn psql(url: &str, sql: &str) -> String {
    let output = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qtAc", sql])
        .output()
        .expect("psql runs");
    assert!(
        output.status.success(),
        "psql `{sql}` failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// The JSON line a `--json` run ends with.
fn result_line(output: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "the last line is not JSON ({e})\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// A disturbed run with injected duplicates and failures: every disturbing
/// message passes the inbox (handled, not skipped as a duplicate) and is
/// ignored by its handler with the expected reason; the databases hold
/// exactly those, and the flow itself is intact (the rejected order has no
/// reservation, confirmation or e-mail; every other order one of each).
fn disturbing_messages_are_ignored_and_counted(place: Place) {
    let mut args = place.args();
    let orders = ORDERS.to_string();
    args.extend(
        [
            "--orders",
            &orders,
            "--disturb",
            "--duplicate-rate",
            "0.3",
            "--fail-rate",
            "0.1",
            "--json",
        ]
        .map(String::from),
    );
    let output = run_minishop(&args);
    let result = result_line(&output);
    assert!(
        output.status.success() && result["ok"] == true,
        "the disturbed run failed its check: {result}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );

    // Its two orders besides those placed: one confirmed, one rejected.
    let settled = ORDERS + 1;
    for (key, expected) in [
        ("orders", ORDERS + 2),
        ("reservations", settled),
        ("confirmations", settled),
        ("emails", settled),
        ("rejected", 1),
        ("pending", 0),
        ("dead_letters", 0),
        ("saga_ignored", 4),
        ("warehouse_ignored", 2),
    ] {
        assert_eq!(result[key], expected, "`{key}`: {result}");
    }
    assert_eq!(
        result["ignored"],
        json!({
            "orders": {
                "no such order": 1,
                "the order is confirmed already": 2,
                "the order is rejected already": 1,
            },
            "warehouse": {
                "the order was found short already": 1,
                "the order was reserved already": 1,
            },
        }),
        "{result}"
    );
    // The injected duplicates were there, and the inbox took them all:
    // none reached the counts above.
    let skipped = result["this_run"]["duplicates_skipped"].as_u64();
    assert!(skipped > Some(0), "no duplicate was injected: {result}");

    let disturbed = result["disturbed"]
        .as_array()
        .expect("`disturbed` lists them");
    let seen: Vec<(&str, &str, &str)> = disturbed
        .iter()
        .map(|d| {
            let text = |key: &str| d[key].as_str().unwrap_or("(none)");
            (text("what"), text("outcome"), text("ignored"))
        })
        .collect();
    let expected: Vec<(&str, &str, &str)> = EXPECTED
        .iter()
        .map(|(what, reason)| (*what, "handled", *reason))
        .collect();
    assert_eq!(seen, expected, "{result}");

    // Recorded durably, in each module's own database.
    assert_eq!(
        place.ignored_reasons("orders"),
        [
            "no such order",
            "the order is confirmed already",
            "the order is confirmed already",
            "the order is rejected already",
        ]
    );
    assert_eq!(
        place.ignored_reasons("warehouse"),
        [
            "the order was found short already",
            "the order was reserved already",
        ]
    );
}

#[test]
fn sqlite_minishop_ignores_and_counts_messages_that_do_not_fit_their_order() {
    disturbing_messages_are_ignored_and_counted(Place::sqlite());
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_minishop_ignores_and_counts_messages_that_do_not_fit_their_order() {
    disturbing_messages_are_ignored_and_counted(Place::postgres());
}

/// `--disturb` delivers to every module's handlers, so it refuses a process
/// running only some of them: exit code 2, saying why, before any database
/// is touched.
#[test]
fn disturb_refuses_a_process_without_every_module() {
    let place = Place::sqlite();
    let mut args = place.args();
    args.extend(["--modules", "orders", "--disturb"].map(String::from));
    let output = run_minishop(&args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "stderr:\n{stderr}");
    assert!(
        stderr.contains("--disturb delivers messages to the handlers of all three modules"),
        "stderr:\n{stderr}"
    );
    let Place::Sqlite(dir) = &place else {
        unreachable!()
    };
    let files = std::fs::read_dir(dir.path())
        .expect("the data directory")
        .count();
    assert_eq!(files, 0, "no database was created");
}
