//! The catalog example as a child process, on SQLite, (feature
//! `postgres`, `TICKBOX_PG_URL`) on PostgreSQL and (feature `mysql`,
//! `TICKBOX_MYSQL_URL`) on MariaDB/MySQL: keyed runs through injected
//! failures and duplicates keep every copy right without ever meeting an
//! older change; unordered runs meet older changes and the storefront's
//! version check keeps the copy right anyway; runs killed with SIGKILL at
//! seeded random moments and resumed end with exact counts; and the two
//! safeguards ignore, and count, messages the inbox cannot recognise.
//!
//! Every figure checked comes from the example's `--json` line, which it
//! reads from the three databases at the end of a run.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest any single run may take (a debug build on a busy machine).
const RUN_TIMEOUT: Duration = Duration::from_secs(240);

/// Where a run keeps its three databases.
enum Place {
    /// A directory of SQLite files.
    Sqlite(tempfile::TempDir),
    /// Three schemas, `<prefix>_catalog` and so on, in the database
    /// `TICKBOX_PG_URL` names; dropped at the end.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres { url: String, prefix: String },
    /// Three databases, `<prefix>_catalog` and so on, on the MariaDB/MySQL
    /// server `TICKBOX_MYSQL_URL` names; dropped at the end.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Mysql { url: String, prefix: String },
}

impl Place {
    fn sqlite() -> Self {
        Place::Sqlite(tempfile::tempdir().expect("a temporary directory"))
    }

    /// Fresh schema names in the PostgreSQL database of `TICKBOX_PG_URL`,
    /// which must be set and reachable: the test fails otherwise.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    fn postgres() -> Self {
        let url = std::env::var("TICKBOX_PG_URL").expect(
            "the PostgreSQL catalog tests need TICKBOX_PG_URL, e.g. \
             postgres://postgres@127.0.0.1:5432/test",
        );
        Place::Postgres {
            url,
            prefix: format!("catalog_test_{:08x}", fastrand::u32(..)),
        }
    }

    /// Fresh database names on the MariaDB/MySQL server of
    /// `TICKBOX_MYSQL_URL`, which must be set and reachable.
    #[cfg(feature = "mysql")]
    fn mysql() -> Self {
        Place::Mysql {
            url: crate::support::mysql::server_url(),
            prefix: crate::support::mysql::new_prefix("catalog"),
        }
    }

    /// The example's arguments naming this place.
    fn args(&self) -> Vec<String> {
        match self {
            Place::Sqlite(dir) => vec!["--data-dir".into(), dir.path().display().to_string()],
            Place::Postgres { url, prefix } | Place::Mysql { url, prefix } => vec![
                "--database-url".into(),
                url.clone(),
                "--schema-prefix".into(),
                prefix.clone(),
            ],
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        #[cfg(feature = "mysql")]
        if let Place::Mysql { url, prefix } = self {
            crate::support::mysql::drop_databases(url, prefix);
        }
        if let Place::Postgres { url, prefix } = self {
            let drop = ["catalog", "storefront", "journeys"]
                .map(|module| format!("DROP SCHEMA IF EXISTS {prefix}_{module} CASCADE;"))
                .concat();
            let _ = Command::new("psql")
                .args([url.as_str(), "-qc", &drop])
                .output();
        }
    }
}

/// Starts the example at `place` with `args`, its output piped; its log
/// keeps the example's own progress lines (`planned`, …).
fn spawn(place: &Place, args: &[&str]) -> Child {
    Command::new(super::example("catalog"))
        .args(place.args())
        .args(args)
        .env("RUST_LOG", "error,catalog=info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the catalog example starts")
}

/// Waits for `child` to exit, for at most `timeout`; `None` if it is still
/// running.
fn wait_for(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a run that must end by itself; its output.
fn finish(mut child: Child, what: &str) -> Output {
    if wait_for(&mut child, RUN_TIMEOUT).is_none() {
        let _ = child.kill();
        let output = child.wait_with_output().expect("its output");
        panic!(
            "{what} did not end within {RUN_TIMEOUT:?}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    child.wait_with_output().expect("its output")
}

/// The `--json` line of a finished run, which must be its only line on
/// stdout; panics unless the run exited 0 and says `"ok": true`.
fn result_of(output: &Output, what: &str) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        stdout.lines().count(),
        1,
        "{what}: stdout is not one JSON line:\n{stdout}\nstderr:\n{stderr}"
    );
    let result: serde_json::Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("{what}: not JSON ({e}):\n{stdout}\nstderr:\n{stderr}"));
    assert!(
        output.status.success() && result["ok"] == serde_json::Value::Bool(true),
        "{what} failed ({}): {result}\nstderr:\n{stderr}",
        output.status
    );
    result
}

/// Runs the example to its end with `args` and `--json`; its checked result.
fn run(place: &Place, args: &[&str], what: &str) -> serde_json::Value {
    let mut args = args.to_vec();
    args.push("--json");
    let result = result_of(&finish(spawn(place, &args), what), what);
    eprintln!("{what}: {result}");
    result
}

/// A whole number in the result.
fn count(result: &serde_json::Value, key: &str) -> i64 {
    result[key]
        .as_i64()
        .unwrap_or_else(|| panic!("no number `{key}` in {result}"))
}

/// What every finished run over `planned` changes must show: each published
/// once, one journey row each (no event id twice, each matching its
/// change), every copy equal to the catalog's product, each change applied
/// or ignored as stale exactly once, nothing pending or dead-lettered.
fn assert_complete(result: &serde_json::Value, planned: i64) {
    let changes = count(result, "changes");
    assert_eq!(count(result, "planned"), planned, "{result}");
    assert_eq!(changes, planned, "every planned change published: {result}");
    assert_eq!(count(result, "journeys"), changes, "{result}");
    assert_eq!(count(result, "duplicate_journeys"), 0, "{result}");
    assert_eq!(count(result, "journey_mismatches"), 0, "{result}");
    assert_eq!(count(result, "mismatches"), 0, "{result}");
    assert_eq!(
        count(result, "applied") + count(result, "stale_ignored"),
        changes,
        "the storefront handled each change once: {result}"
    );
    assert_eq!(count(result, "pending"), 0, "{result}");
    assert_eq!(count(result, "dead_letters"), 0, "{result}");
}

/// What a run whose changes were all keyed must show besides: the
/// storefront never met a change older than its copy, and every journey's
/// sequence is its version.
fn assert_in_order(result: &serde_json::Value) {
    assert_eq!(result["keyed"], serde_json::Value::Bool(true), "{result}");
    assert_eq!(count(result, "stale_ignored"), 0, "{result}");
    assert_eq!(count(result, "sequence_mismatches"), 0, "{result}");
}

fn keyed_changes_arrive_in_order_through_failures_and_duplicates(place: Place) {
    let result = run(
        &place,
        &[
            "--products",
            "30",
            "--changes",
            "600",
            "--fail-rate",
            "0.3",
            "--duplicate-rate",
            "0.3",
        ],
        "a keyed run at --fail-rate 0.3 --duplicate-rate 0.3",
    );
    assert_complete(&result, 600);
    assert_in_order(&result);
    assert_eq!(count(&result, "applied"), 600, "{result}");
    let this_run = &result["this_run"];
    assert!(
        count(this_run, "failed_attempts") > 0 && count(this_run, "duplicates_injected") > 0,
        "failures and duplicates were injected: {result}"
    );
}

fn unordered_changes_meet_older_ones_and_the_version_check_keeps_the_copy_right(place: Place) {
    // Few products, many changes: a product's next change is often applied
    // while a failed one waits for its retry, which then arrives late.
    let result = run(
        &place,
        &[
            "--unordered",
            "--products",
            "5",
            "--changes",
            "400",
            "--fail-rate",
            "0.3",
        ],
        "an unordered run at --fail-rate 0.3",
    );
    assert_complete(&result, 400);
    assert_eq!(result["keyed"], serde_json::Value::Bool(false), "{result}");
    assert!(
        count(&result, "stale_ignored") > 0,
        "retries reordered some changes, and the storefront ignored the late ones: {result}"
    );
}

/// Starts a run and waits until it has recorded its plan (its `planned` log
/// line), so that a kill after it leaves changes to resume.
fn spawn_until_planned(place: &Place, args: &[&str]) -> Child {
    let mut child = spawn(place, args);
    let stderr = child.stderr.take().expect("piped stderr");
    let (planned, heard) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains("planned") {
                let _ = planned.send(());
            }
        }
    });
    if heard.recv_timeout(RUN_TIMEOUT).is_err() {
        let _ = child.kill();
        let output = child.wait_with_output().expect("its output");
        panic!(
            "the first run never recorded its plan: {}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout)
        );
    }
    child
}

fn killed_runs_resume_to_exact_counts(place: Place) {
    let seed = std::env::var("TICKBOX_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("catalog crash seed: {seed} (TICKBOX_CRASH_SEED={seed} replays it)");
    let mut rng = fastrand::Rng::with_seed(seed);
    let faults = ["--fail-rate", "0.2", "--duplicate-rate", "0.2"];
    let mut args = vec!["--products", "20", "--changes", "3000"];
    args.extend(faults);
    // The first run is killed while it publishes (after its plan is
    // recorded); each later one resumes and is killed at any moment, start
    // included, unless it finishes first.
    let mut child = spawn_until_planned(&place, &args);
    let mut kills = 0;
    let mut resumed = vec!["--resume"];
    resumed.extend(faults);
    for run in 1..=3 {
        let moment = Duration::from_millis(rng.u64(0..1500));
        match wait_for(&mut child, moment) {
            None => {
                child.kill().expect("SIGKILL");
                child.wait().expect("reaped");
                kills += 1;
            }
            Some(status) => {
                let output = child.wait_with_output().expect("its output");
                assert!(
                    status.success(),
                    "seed {seed}: run {run} ended by itself and failed its check: {}",
                    String::from_utf8_lossy(&output.stdout)
                );
            }
        }
        child = spawn(&place, &resumed);
    }
    let output = finish(child, "the last resumed run");
    assert!(
        output.status.success(),
        "seed {seed}: the last resumed run failed: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(kills >= 1, "seed {seed}: no run was killed");
    let result = run(&place, &["--resume"], "a final --resume");
    assert_complete(&result, 3000);
    assert_in_order(&result);
    eprintln!("seed {seed}: {kills} kills");
}

fn the_safeguards_ignore_and_count_what_the_inbox_cannot_recognise(place: Place) {
    // A fixed seed: 200 changes over 10 products give each product several.
    let result = run(
        &place,
        &[
            "--products",
            "10",
            "--changes",
            "200",
            "--seed",
            "7",
            "--fail-rate",
            "0.2",
            "--disturb",
            "3",
        ],
        "a run disturbed with 3 older changes and 3 repeated events",
    );
    assert_complete(&result, 200);
    assert_in_order(&result);
    let disturbance = &result["disturbance"];
    for key in [
        "stale_sent",
        "stale_ignored",
        "repeats_sent",
        "repeats_ignored",
    ] {
        assert_eq!(count(disturbance, key), 3, "`{key}`: {result}");
    }
    assert_eq!(count(&result, "injected_stale_ignored"), 3, "{result}");
    assert_eq!(count(&result, "injected_repeats_ignored"), 3, "{result}");
    // Counted durably, and still told apart from the published changes
    // by a later run.
    let again = run(&place, &["--resume"], "a --resume after the disturbance");
    assert_complete(&again, 200);
    assert_in_order(&again);
    assert_eq!(count(&again, "injected_stale_ignored"), 3, "{again}");
    assert_eq!(count(&again, "injected_repeats_ignored"), 3, "{again}");
    assert_eq!(again["disturbance"], serde_json::Value::Null, "{again}");
}

/// The tests above, on the backend `$place` makes a place on.
macro_rules! on_backend {
    ($place:expr) => {
        #[test]
        fn keyed_changes_arrive_in_order_through_failures_and_duplicates() {
            super::keyed_changes_arrive_in_order_through_failures_and_duplicates($place);
        }

        #[test]
        fn unordered_changes_meet_older_ones_and_the_version_check_keeps_the_copy_right() {
            super::unordered_changes_meet_older_ones_and_the_version_check_keeps_the_copy_right(
                $place,
            );
        }

        #[test]
        fn killed_runs_resume_to_exact_counts() {
            super::killed_runs_resume_to_exact_counts($place);
        }

        #[test]
        fn the_safeguards_ignore_and_count_what_the_inbox_cannot_recognise() {
            super::the_safeguards_ignore_and_count_what_the_inbox_cannot_recognise($place);
        }
    };
}

mod sqlite {
    use super::Place;
    on_backend!(Place::sqlite());
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::Place;
    on_backend!(Place::postgres());
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::Place;
    on_backend!(Place::mysql());
}
