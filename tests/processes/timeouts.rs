//! Saga timeouts through SIGKILLs: minishop's `--confirm-within`, each
//! order's `OrderTimedOut` scheduled in the transaction that places it, on
//! every backend.
//!
//! First the warehouse is away: the orders process places orders that
//! nobody answers and is killed (SIGKILL) again and again at seeded moments
//! around their deadlines, each time started again with `--resume`, until
//! every order has timed out and been cancelled. Then the warehouse comes
//! back beside a process placing new orders, which once they are settled
//! is killed around their deadlines, as their timeouts come: the
//! warehouse's late answers to the cancelled orders are ignored, the new
//! orders are confirmed and their timeouts ignored. Both
//! processes end by themselves with minishop's check passed, and the test
//! counts from the databases: every order confirmed and e-mailed, rejected
//! or cancelled, never cancelled and e-mailed, none cancelled before its
//! deadline, each timeout handled once, and for each order exactly one
//! message ignored by the saga (its timeout, or the warehouse's late answer).

use super::*;
use std::collections::HashSet;
use std::time::{SystemTime, UNIX_EPOCH};

/// Faults beside the kills: duplicates for the inbox to skip, failures
/// before COMMIT for the bus to retry.
const FAULTS: [&str; 4] = ["--duplicate-rate", "0.2", "--fail-rate", "0.1"];

/// Orders of each placing run.
const ORDERS: &str = "30";

/// How far from a deadline a kill falls, either way (ms).
const AROUND_MS: i64 = 300;

/// How long a step of the test may take to show.
const MINUTE: Duration = Duration::from_secs(60);

/// Runs of the orders process at most, while the warehouse is away (every
/// second run at least cancels an order).
const MOST_RUNS: usize = 30;

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

impl Place {
    /// `SELECT <expression> FROM orders WHERE <filter>` in the orders
    /// database, an integer read as text; `None` for NULL.
    fn orders_number(&self, expression: &str, filter: &str) -> Option<i64> {
        let text = match self {
            Place::Mysql { .. } => "CHAR",
            _ => "TEXT",
        };
        let column = format!("CAST(COALESCE({expression}, -1) AS {text})");
        let rest = format!("orders WHERE {filter}");
        let texts = self.texts("orders", &column, &rest);
        let number: i64 = texts
            .first()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or_else(|| panic!("`{column}` from {rest}: {texts:?}"));
        (number >= 0).then_some(number)
    }

    /// The earliest deadline of the orders `filter` selects (µs since the
    /// Unix epoch).
    fn next_deadline_us(&self, filter: &str) -> Option<i64> {
        self.orders_number(
            "min(confirm_by_us)",
            &format!("confirm_by_us IS NOT NULL AND {filter}"),
        )
    }
}

/// Waits until the wall clock reads `at_us`, then kills `child` (SIGKILL);
/// how it ended, if it ended by itself first.
fn kill_at(child: &mut Child, at_us: i64) -> Option<ExitStatus> {
    let wait = Duration::from_micros(at_us.saturating_sub(now_us()).max(0) as u64);
    if let Some(status) = wait_for(child, wait) {
        return Some(status);
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    None
}

/// The test, on `place`.
fn orders_time_out_through_sigkills(place: Place) {
    let seed = crash_seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let around = |rng: &mut fastrand::Rng| rng.i64(-AROUND_MS..=AROUND_MS) * 1000;

    // A first run of every module records the flow's subscriptions, so
    // that the orders process places orders for a warehouse not running.
    let first = finish(
        spawn(&place, &["--orders", "1", "--json"]),
        Duration::from_secs(300),
        "the first run",
    );
    check_result(&first, "the first run");

    // The warehouse away: the orders process places orders nobody answers,
    // each due to time out a second after it is placed, and is killed
    // around their deadlines until none is left waiting.
    let mut args = vec!["--modules", "orders,notifications", "--confirm-within", "1"];
    args.extend(FAULTS);
    let (mut runs, mut kills) = (0, 0);
    loop {
        let waiting = place.count_orders_db("orders WHERE status = 'placed'");
        if runs > 0 && waiting == 0 {
            break;
        }
        runs += 1;
        assert!(
            runs <= MOST_RUNS,
            "seed {seed}: {waiting} orders still waiting after {kills} kills"
        );
        let mut run_args = args.clone();
        run_args.extend(if runs == 1 {
            ["--orders", ORDERS].as_slice()
        } else {
            ["--resume"].as_slice()
        });
        let mut child = spawn(&place, &run_args);
        let what = format!("seed {seed}: run {runs} of the orders process, warehouse away");
        if runs == 1 {
            let placing = format!("{what}, placing an order");
            await_while_running(&mut child, &placing, MINUTE, || {
                place.count_orders_db("orders WHERE confirm_by_us IS NOT NULL") > 0
            });
        }
        // Around the next deadline of an order still waiting; if it passed
        // while this run started, around the run's first cancellations.
        let moment = match place.next_deadline_us("status = 'placed'") {
            Some(deadline) if deadline > now_us() => deadline + around(&mut rng),
            _ => {
                let cancelling = format!("{what}, cancelling an order");
                await_while_running(&mut child, &cancelling, MINUTE, || {
                    place.count_orders_db("orders WHERE status = 'placed'") != waiting
                });
                now_us() + rng.i64(0..AROUND_MS) * 1000
            }
        };
        // Without the warehouse the flow cannot finish: the run never
        // ends by itself.
        if let Some(status) = kill_at(&mut child, moment) {
            let output = child.wait_with_output().expect("output");
            panic!(
                "{what} ended by itself ({status})\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        kills += 1;
    }
    let timed_out = place.count_orders_db("orders WHERE status = 'cancelled'");
    let with_deadline = place.count_orders_db("orders WHERE confirm_by_us IS NOT NULL");
    assert!(
        timed_out > 0 && timed_out == with_deadline,
        "seed {seed}: with the warehouse away every order times out: {timed_out} of \
         {with_deadline} cancelled"
    );

    // The warehouse back, and a run placing new orders with ten seconds
    // each (between processes over one set of databases, a message waits
    // for the next scan of its outbox, up to two seconds, so an order
    // takes up to four): the warehouse answers in time, and once every new order is
    // settled the run is killed around their deadlines, when their
    // timeouts come, and started again with `--resume`; everyone waits
    // for the three placing runs so far.
    let placers = ["--placers", "3", "--timeout", "240", "--json"];
    let mut warehouse_args = vec!["--modules", "warehouse"];
    warehouse_args.extend(FAULTS.iter().chain(&placers));
    let warehouse = spawn(&place, &warehouse_args);
    let mut args = vec![
        "--modules",
        "orders,notifications",
        "--confirm-within",
        "10",
    ];
    args.extend(FAULTS.iter().chain(&placers));
    let mut placing = args.clone();
    placing.extend(["--orders", ORDERS]);
    let placed_from_us = now_us();
    let mut orders = spawn(&place, &placing);
    let new_orders = format!("orders WHERE placed_at_us > {placed_from_us}");
    let settling = format!("seed {seed}: the new orders placed and settled");
    await_while_running(&mut orders, &settling, 2 * MINUTE, || {
        place.count_orders_db(&new_orders) >= ORDERS.parse().expect("a number")
            && place.count_orders_db(&format!("{new_orders} AND status = 'placed'")) == 0
    });
    let answered = place.count_orders_db(&format!("{new_orders} AND status <> 'cancelled'"));
    assert!(
        answered > 0,
        "seed {seed}: with the warehouse back no new order was answered within ten seconds"
    );
    args.push("--resume");
    for _ in 0..2 {
        let upcoming = format!(
            "placed_at_us > {placed_from_us} AND confirm_by_us > {}",
            now_us() + AROUND_MS * 1000
        );
        let Some(deadline) = place.next_deadline_us(&upcoming) else {
            break;
        };
        // A run that finished by itself first (its last timeouts came)
        // is the last one.
        if kill_at(&mut orders, deadline + around(&mut rng)).is_some() {
            break;
        }
        kills += 1;
        orders = spawn(&place, &args);
    }

    let what = format!("seed {seed}, after {kills} kills");
    let output = finish(orders, Duration::from_secs(300), "the last orders process");
    let result = result_json(&output, &what);
    let warehouse = finish(warehouse, Duration::from_secs(300), "the warehouse");
    let warehouse_result = result_json(&warehouse, &what);
    for (output, result) in [(&output, &result), (&warehouse, &warehouse_result)] {
        assert!(
            output.status.success() && result["ok"] == true,
            "{what}: {result}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        assert_eq!(result["pending"], 0, "{what}: {result}");
    }
    let field = |key: &str| {
        result[key]
            .as_i64()
            .unwrap_or_else(|| panic!("{what}: no `{key}` in {result}"))
    };

    // Every order ends one way, from the databases.
    let all = place.count_orders_db("orders");
    assert_eq!(field("orders"), all, "{what}: {result}");
    let count = |status: &str| place.count_orders_db(&format!("orders WHERE status = '{status}'"));
    let (confirmed, rejected, cancelled) =
        (count("confirmed"), count("rejected"), count("cancelled"));
    assert_eq!(confirmed + rejected + cancelled, all, "{what}: {result}");
    assert_eq!(field("timed_out"), cancelled, "{what}: {result}");
    assert!(
        cancelled >= timed_out,
        "{what}: the first orders stay cancelled"
    );
    assert!(
        confirmed > 0,
        "{what}: no order was confirmed in time: {result}"
    );
    let emails: HashSet<String> = place
        .texts("notifications", "order_id", "sent_emails")
        .into_iter()
        .collect();
    assert_eq!(
        emails.len() as i64,
        confirmed,
        "{what}: an e-mail per confirmed order"
    );
    let cancelled_ids = place.texts("orders", "id", "orders WHERE status = 'cancelled'");
    let both: Vec<&String> = cancelled_ids
        .iter()
        .filter(|id| emails.contains(*id))
        .collect();
    assert!(both.is_empty(), "{what}: cancelled and e-mailed: {both:?}");
    let early = place.count_orders_db(
        "orders WHERE status = 'cancelled' AND (confirm_by_us IS NULL OR cancelled_at_us < confirm_by_us)",
    );
    assert_eq!(early, 0, "{what}: orders cancelled before their deadline");

    // Each timeout handled once, and for each order with a deadline one
    // message ignored: its timeout, or the warehouse's answer that came
    // after it.
    let with_deadline = place.count_orders_db("orders WHERE confirm_by_us IS NOT NULL");
    let handled = place.count(
        "orders",
        "tickbox_inbox WHERE handler = 'orders.time_out_order'",
    );
    assert_eq!(handled, with_deadline, "{what}: each timeout handled once");
    assert_eq!(
        field("saga_ignored"),
        with_deadline,
        "{what}: one message ignored per order with a deadline: {result}"
    );
    eprintln!("{what} in {runs} runs with the warehouse away: {result}");
}

#[test]
fn sqlite_orders_time_out_through_sigkills() {
    orders_time_out_through_sigkills(Place::sqlite());
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_orders_time_out_through_sigkills() {
    orders_time_out_through_sigkills(Place::postgres("timeouts"));
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_orders_time_out_through_sigkills() {
    orders_time_out_through_sigkills(Place::mysql("timeouts"));
}
