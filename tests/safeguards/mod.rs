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
//! minishop runs as a child process, with the process tests' helpers
//! (`processes::Place`, `spawn`, …).

use crate::processes::{finish, result_json, spawn, Place};
use serde_json::json;
use std::process::Output;
use std::time::Duration;

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

/// Runs minishop on `place` with `args` to its end, for at most three
/// minutes.
fn run_minishop(place: &Place, args: &[&str]) -> Output {
    finish(spawn(place, args), Duration::from_secs(180), "minishop")
}

/// The reason of every row of `module`'s `ignored_messages`, read straight
/// from its database, sorted.
fn ignored_reasons(place: &Place, module: &str) -> Vec<String> {
    let mut reasons = place.texts(module, "reason", "ignored_messages");
    reasons.sort();
    reasons
}

/// A disturbed run with injected duplicates and failures: every disturbing
/// message passes the inbox (handled, not skipped as a duplicate) and is
/// ignored by its handler with the expected reason; the databases hold
/// exactly those, and the flow itself is intact (the rejected order has no
/// reservation, confirmation or e-mail; every other order one of each).
fn disturbing_messages_are_ignored_and_counted(place: Place) {
    let orders = ORDERS.to_string();
    let args = [
        "--orders",
        &orders,
        "--disturb",
        "--duplicate-rate",
        "0.3",
        "--fail-rate",
        "0.1",
        "--json",
    ];
    let output = run_minishop(&place, &args);
    let result = result_json(&output, "the disturbed run");
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
        ignored_reasons(&place, "orders"),
        [
            "no such order",
            "the order is confirmed already",
            "the order is confirmed already",
            "the order is rejected already",
        ]
    );
    assert_eq!(
        ignored_reasons(&place, "warehouse"),
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
    disturbing_messages_are_ignored_and_counted(Place::postgres("safeguards"));
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_minishop_ignores_and_counts_messages_that_do_not_fit_their_order() {
    disturbing_messages_are_ignored_and_counted(Place::mysql("safeguards"));
}

/// `--disturb` delivers to every module's handlers, so it refuses a process
/// running only some of them: exit code 2, saying why, before any database
/// is touched.
#[test]
fn disturb_refuses_a_process_without_every_module() {
    let place = Place::sqlite();
    let output = run_minishop(&place, &["--modules", "orders", "--disturb"]);
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
