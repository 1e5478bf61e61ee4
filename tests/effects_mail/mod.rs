//! Real e-mails through the effects journal: minishop sends each order's
//! confirmation to an SMTP server (`--smtp`), here a sink the test runs on
//! loopback in its own process (`support::smtp_sink`), which keeps every
//! e-mail it accepts, recorded before it replies 250; the test reads their
//! Message-IDs. The process is made to crash in its own code between
//! sending an e-mail and recording it (`--crash-at after-send`), or between
//! recording it and committing the delivery (`--crash-at after-journal`),
//! or is killed with SIGKILL at random moments; it is run again with
//! `--resume` until it finishes. Then what the sink received is held
//! against what minishop's journal says:
//!
//! - at least once with a key: exactly one distinct Message-ID per
//!   confirmed order, a crash after sending made up for by sending the
//!   same Message-ID again, a crash after recording by the journal's result;
//! - at most once: no Message-ID twice, and the e-mails sent and unknown
//!   add up to the confirmed orders.

use crate::processes::{finish, kill_runs_at_random, result_json, spawn, Place};
use crate::support::smtp_sink::SmtpSink;
use serde_json::Value;
use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::process::Output;
use std::time::Duration;

/// Orders each crash test places.
const ORDERS: &str = "30";

/// The chance of aborting at the crash point, per e-mail: high enough that
/// the first run aborts (the odds of 30 e-mails passing are 0.7^30, about
/// 2e-5), low enough that it sends some first.
const CRASH_RATE: &str = "0.3";

/// Runs with the crash point armed; after this many aborts the rest runs
/// without it, so a test takes a bounded number of runs.
const MOST_ABORTS: usize = 3;

/// SIGABRT, as `std::process::abort` ends a process.
const SIGABRT: i32 = 6;

/// A run's deadline: far beyond what it needs.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------
// The SMTP sink

/// The test support's SMTP sink, on a runtime of its own (the tests block
/// their thread on child processes).
struct MailServer {
    /// Dropped first: its tasks are aborted while the runtime still runs.
    sink: SmtpSink,
    _runtime: tokio::runtime::Runtime,
}

impl MailServer {
    /// Starts the sink on a free port of loopback; it listens when this
    /// returns.
    fn start() -> MailServer {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the SMTP sink's runtime");
        let sink = runtime.block_on(SmtpSink::start());
        MailServer {
            sink,
            _runtime: runtime,
        }
    }

    /// Its address, for `--smtp`.
    fn addr(&self) -> String {
        self.sink.addr().to_string()
    }

    /// The Message-IDs received so far, in order, repeats included; `-`
    /// for an e-mail without one.
    fn received(&self) -> Vec<String> {
        self.sink
            .received()
            .iter()
            .map(|mail| mail.message_id().unwrap_or_else(|| "-".into()))
            .collect()
    }
}

/// What the sink received, in numbers, each Message-ID checked to be one
/// minishop makes.
#[derive(Debug)]
struct Received {
    total: usize,
    distinct: usize,
}

fn count(received: &[String]) -> Received {
    for id in received {
        let key = id
            .strip_prefix('<')
            .and_then(|id| id.strip_suffix("@minishop.example>"));
        assert!(
            key.is_some_and(|key| uuid::Uuid::parse_str(key).is_ok()),
            "the sink received a Message-ID that is not <KEY@minishop.example>: {id}"
        );
    }
    let distinct: HashSet<&String> = received.iter().collect();
    Received {
        total: received.len(),
        distinct: distinct.len(),
    }
}

// ---------------------------------------------------------------------------
// Running minishop

/// The integer field `key` of a result.
fn field(result: &Value, key: &str) -> i64 {
    result[key]
        .as_i64()
        .unwrap_or_else(|| panic!("no integer `{key}` in {result}"))
}

/// Confirmed orders: placed and not rejected for want of stock.
fn confirmed(result: &Value) -> usize {
    let confirmed = field(result, "orders") - field(result, "rejected");
    assert!(confirmed > 0, "no order was confirmed: {result}");
    confirmed as usize
}

/// The final run's result, checked as every test needs it: it passed,
/// every order is confirmed once, nothing is pending, and every dead letter
/// is that of an e-mail unknown (at most once).
fn check_finished(output: &Output, what: &str) -> Value {
    let result = result_json(output, what);
    assert!(
        output.status.success() && result["ok"] == Value::Bool(true),
        "{what}: the final run did not pass: {result}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(field(&result, "pending"), 0, "{what}: {result}");
    assert_eq!(
        field(&result, "confirmations"),
        field(&result, "orders") - field(&result, "rejected"),
        "{what}: every order confirmed once: {result}"
    );
    assert_eq!(
        field(&result, "dead_letters"),
        field(&result, "effects_unknown"),
        "{what}: the only dead letters are those of unknown e-mails: {result}"
    );
    result
}

/// How a crash test went: the final result, the aborts, what the sink
/// received and how many orders were confirmed.
struct Crashed {
    result: Value,
    aborts: usize,
    received: Received,
    orders: usize,
}

impl Crashed {
    /// At least once with a key: every confirmed order's e-mail reached
    /// the server under a Message-ID of its own, and the journal knows it
    /// sent each.
    fn assert_each_order_emailed_under_its_own_id(&self) {
        let (result, orders) = (&self.result, self.orders);
        assert_eq!(
            self.received.distinct, orders,
            "one distinct Message-ID per confirmed order: {result}"
        );
        assert_eq!(field(result, "emails"), orders as i64, "{result}");
        assert_eq!(field(result, "emails_sent"), orders as i64, "{result}");
        assert_eq!(field(result, "effects_unknown"), 0, "{result}");
    }
}

/// Places the orders with the crash point `crash_at` armed, then runs
/// `--resume` after each abort (the point armed for the first
/// [`MOST_ABORTS`] aborts, not after) until a run finishes by itself.
/// Every run that ends other than by finishing must have aborted at the
/// point.
/// At least one run must have aborted.
fn crash_until_done(place: &Place, policy: &str, crash_at: &str) -> Crashed {
    let sink = MailServer::start();
    let addr = sink.addr();
    let (mut runs, mut aborts) = (0, 0);
    loop {
        let mut args = vec!["--smtp", &addr, "--email-policy", policy, "--json"];
        if runs == 0 {
            args.extend(["--orders", ORDERS]);
        } else {
            args.push("--resume");
        }
        if aborts < MOST_ABORTS {
            args.extend(["--crash-at", crash_at, "--crash-rate", CRASH_RATE]);
        }
        runs += 1;
        let what = format!("run {runs} ({args:?})");
        let output = finish(spawn(place, &args), RUN_TIMEOUT, &what);
        let stderr = String::from_utf8_lossy(&output.stderr);
        match output.status.signal() {
            None => {
                let result = check_finished(&output, &what);
                let received = count(&sink.received());
                let orders = confirmed(&result);
                eprintln!("{aborts} aborts in {runs} runs; {received:?}; {orders} orders");
                assert!(aborts >= 1, "the crash point never fired: {result}");
                return Crashed {
                    result,
                    aborts,
                    received,
                    orders,
                };
            }
            Some(SIGABRT) => {
                assert!(
                    stderr.contains(&format!("aborting on purpose (--crash-at {crash_at})")),
                    "{what} aborted, but not at the crash point\nstderr:\n{stderr}"
                );
                aborts += 1;
            }
            Some(signal) => panic!("{what} ended by signal {signal}\nstderr:\n{stderr}"),
        }
        assert!(runs < 50, "{runs} runs and still not finished");
    }
}

/// The notifications module's effect counters of this run (the final one),
/// from the result's metrics: (started, reused).
fn effect_counts(result: &Value) -> (u64, u64) {
    let modules = result["metrics"]["modules"].as_array().cloned();
    let notifications = modules
        .unwrap_or_default()
        .into_iter()
        .find(|m| m["module"] == "notifications")
        .unwrap_or_else(|| panic!("no notifications module in the metrics: {result}"));
    let effects = notifications["effects"].as_array().cloned();
    effects
        .unwrap_or_default()
        .iter()
        .fold((0, 0), |(s, r), e| {
            (
                s + e["started"].as_u64().unwrap_or(0),
                r + e["reused"].as_u64().unwrap_or(0),
            )
        })
}

// ---------------------------------------------------------------------------
// The tests

/// `--crash-at after-send`, at least once with a key: every e-mail cut
/// short is sent again with the same Message-ID, so the sink holds one
/// distinct Message-ID per confirmed order, and one repeat per abort.
fn resends_after_a_crash_after_sending(place: Place) {
    let run = crash_until_done(&place, "at-least-once-with-key", "after-send");
    run.assert_each_order_emailed_under_its_own_id();
    // Each abort came after the server accepted an e-mail the journal did
    // not know of: the next delivery sent it again, once.
    let received = &run.received;
    assert_eq!(
        received.total - received.distinct,
        run.aborts,
        "one repeat per abort after sending: {received:?}"
    );
}

/// `--crash-at after-journal`, at least once with a key: the journal
/// recorded each e-mail before the crash, so the redelivery gets the result
/// back without sending: no Message-ID twice.
fn reuses_the_journal_after_a_crash_after_recording(place: Place) {
    let run = crash_until_done(&place, "at-least-once-with-key", "after-journal");
    run.assert_each_order_emailed_under_its_own_id();
    assert_eq!(
        run.received.total, run.received.distinct,
        "no e-mail sent twice: the journal's result was used"
    );
    // The last abort's delivery was finished by the final run, from the
    // journal.
    let (_, reused) = effect_counts(&run.result);
    assert!(
        reused >= 1,
        "the final run reused no recorded e-mail: {}",
        run.result
    );
}

/// `--crash-at after-send`, at most once: an e-mail cut short is never sent
/// again; it becomes unknown, its delivery a dead letter, and the check
/// still passes, the e-mails sent and unknown adding up to the orders.
fn never_resends_at_most_once(place: Place) {
    let run = crash_until_done(&place, "at-most-once", "after-send");
    let (result, received, orders) = (&run.result, &run.received, run.orders);
    let (sent, unknown) = (
        field(result, "emails_sent") as usize,
        field(result, "effects_unknown") as usize,
    );
    eprintln!("{sent} sent, {unknown} unknown");
    assert_eq!(
        received.total, received.distinct,
        "an e-mail was sent twice"
    );
    assert_eq!(sent + unknown, orders, "{result}");
    // Each abort left exactly its own e-mail unknown (one e-mail at a time
    // while a crash point is armed), and the server had it.
    assert_eq!(
        unknown, run.aborts,
        "one unknown e-mail per abort: {result}"
    );
    assert_eq!(received.distinct, orders, "{received:?}: {result}");
    assert_eq!(field(result, "emails") as usize, sent, "{result}");
}

/// SIGKILL at seeded random moments while e-mails go out, then a resume;
/// then at least once: one distinct Message-ID per confirmed order; at
/// most once: none twice, and the sent and unknown add up to the orders.
fn survives_sigkill_sending(place: Place, policy: &str) {
    let sink = MailServer::start();
    let addr = sink.addr();
    let kills = 6;
    let args = ["--smtp", &addr, "--email-policy", policy];
    let (seed, _) = kill_runs_at_random(&place, &args, "40", kills, 50..2000);
    let what = format!("seed {seed}, after {kills} kills: the final --resume");
    let args = [
        "--smtp",
        &addr,
        "--email-policy",
        policy,
        "--resume",
        "--json",
    ];
    let output = finish(spawn(&place, &args), RUN_TIMEOUT, &what);
    let result = check_finished(&output, &what);
    let received = count(&sink.received());
    let orders = confirmed(&result);
    let (sent, unknown) = (
        field(&result, "emails_sent") as usize,
        field(&result, "effects_unknown") as usize,
    );
    eprintln!("{what}: {received:?}; {orders} orders, {sent} sent, {unknown} unknown");
    if policy == "at-most-once" {
        assert_eq!(
            received.total, received.distinct,
            "{what}: an e-mail sent twice"
        );
        assert_eq!(sent + unknown, orders, "{what}: {result}");
        // Every e-mail recorded as sent reached the sink; an unknown one
        // may or may not have.
        assert!(
            sent <= received.distinct && received.distinct <= orders,
            "{what}: {received:?}, {result}"
        );
        assert_eq!(field(&result, "emails") as usize, sent, "{what}: {result}");
    } else {
        assert_eq!(received.distinct, orders, "{what}: {received:?}, {result}");
        assert_eq!(sent, orders, "{what}: {result}");
        assert_eq!(unknown, 0, "{what}: {result}");
        assert_eq!(
            field(&result, "emails") as usize,
            orders,
            "{what}: {result}"
        );
    }
}

/// The tests, on one backend.
macro_rules! effects_mail {
    ($place:expr) => {
        #[test]
        fn a_crash_after_sending_sends_the_same_message_id_again() {
            resends_after_a_crash_after_sending($place);
        }

        #[test]
        fn a_crash_after_recording_sends_nothing_again() {
            reuses_the_journal_after_a_crash_after_recording($place);
        }

        #[test]
        fn at_most_once_a_crash_after_sending_leaves_the_email_unknown_never_twice() {
            never_resends_at_most_once($place);
        }

        #[test]
        fn sigkill_while_sending_at_least_once_leaves_one_message_id_per_order() {
            survives_sigkill_sending($place, "at-least-once-with-key");
        }

        #[test]
        fn sigkill_while_sending_at_most_once_sends_nothing_twice() {
            survives_sigkill_sending($place, "at-most-once");
        }
    };
}

mod sqlite {
    use super::*;
    effects_mail!(Place::sqlite());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    effects_mail!(Place::postgres("mail"));
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;
    effects_mail!(Place::mysql("mail"));
}
