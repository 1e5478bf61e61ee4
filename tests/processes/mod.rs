//! Whole processes: the minishop example runs as a child process and is
//! killed with SIGKILL at seeded random moments, has its PostgreSQL or
//! MariaDB/MySQL connections killed under it, or runs as several processes over one
//! set of databases, each running some of the modules (`--modules`), also
//! many at once on fresh databases (`started_together`), or with its
//! orders timing out while the warehouse is away (`timeouts`). Every
//! run ends with the example's own check of the invariants, read from the
//! databases.
//!
//! `cargo test` builds the examples, so the binary is beside the test's.
//!
//! The helpers that run minishop (`Place`, `spawn`, `finish`,
//! `result_json`, …) serve the other process tests too (`effects_mail`).

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

/// The minishop binary built with this test.
pub(crate) fn minishop() -> PathBuf {
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

/// Where a run keeps its databases.
pub(crate) enum Place {
    Sqlite(tempfile::TempDir),
    Postgres {
        url: String,
        database: String,
    },
    /// On the MariaDB/MySQL server `TICKBOX_MYSQL_URL` names: one database
    /// per module, `<prefix>_<module>` (minishop's `--schema-prefix`).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Mysql {
        url: String,
        prefix: String,
    },
}

/// Connections the PostgreSQL process tests may hold at once with the rest
/// of the suite running beside them: several minishop processes, each with
/// three module pools and their listeners.
const NEEDED_CONNECTIONS: usize = 200;

impl Place {
    pub(crate) fn sqlite() -> Self {
        Place::Sqlite(tempfile::tempdir().expect("a temporary directory"))
    }

    /// A fresh PostgreSQL database beside the one `TICKBOX_PG_URL` names.
    #[allow(dead_code)]
    pub(crate) fn postgres(name: &str) -> Self {
        let base = std::env::var("TICKBOX_PG_URL").expect(
            "the PostgreSQL process tests need TICKBOX_PG_URL, e.g. postgres://postgres@127.0.0.1:5432/test",
        );
        let allowed: usize = psql(&base, "SHOW max_connections")
            .parse()
            .expect("max_connections is a number");
        assert!(
            allowed >= NEEDED_CONNECTIONS,
            "the PostgreSQL process tests run several minishop processes beside the suite and \
             need max_connections >= {NEEDED_CONNECTIONS} (this server allows {allowed}): \
             ALTER SYSTEM SET max_connections = 300, then restart PostgreSQL (.ci/run does)"
        );
        let database = format!("tickbox_{name}_{:08x}", fastrand::u32(..));
        psql(&base, &format!("CREATE DATABASE {database}"));
        let (server, _) = base.rsplit_once('/').expect("a URL ending in /database");
        Place::Postgres {
            url: format!("{server}/{database}"),
            database,
        }
    }

    /// New databases on the MariaDB/MySQL server `TICKBOX_MYSQL_URL` names,
    /// made by the run itself.
    #[cfg(feature = "mysql")]
    pub(crate) fn mysql(name: &str) -> Self {
        Place::Mysql {
            url: crate::support::mysql::server_url(),
            prefix: crate::support::mysql::new_prefix(name),
        }
    }

    /// Runs `SELECT count(*) FROM <rest>` in the orders module's database;
    /// 0 before its tables exist.
    fn count_orders_db(&self, rest: &str) -> i64 {
        self.count("orders", rest)
    }

    /// Whether a run placing orders has ended here: the other processes
    /// may then see the flow finished, so a restarted orders process must
    /// finish the work (`--resume`) rather than place new orders.
    fn a_placing_run_ended(&self) -> bool {
        self.count_orders_db("placing_runs WHERE ended_at_us IS NOT NULL") > 0
    }

    /// Runs `SELECT count(*) FROM <rest>` in `module`'s database; 0 before
    /// its tables exist.
    pub(crate) fn count(&self, module: &str, rest: &str) -> i64 {
        match self {
            Place::Sqlite(dir) => {
                use tickbox::diesel::{dsl::sql, sql_types::BigInt, Connection, RunQueryDsl};
                let path = dir
                    .path()
                    .join(format!("{module}.db"))
                    .display()
                    .to_string();
                let Ok(mut conn) = tickbox::diesel::SqliteConnection::establish(&path) else {
                    return 0;
                };
                tickbox::diesel::select(sql::<BigInt>(&format!("(SELECT count(*) FROM {rest})")))
                    .get_result::<i64>(&mut conn)
                    .unwrap_or(0)
            }
            Place::Postgres { url, .. } => {
                let sql =
                    format!("SET search_path TO minishop_{module}; SELECT count(*) FROM {rest}");
                let output = Command::new("psql")
                    .args([url, "-qtAc", &sql])
                    .output()
                    .expect("psql runs");
                String::from_utf8_lossy(&output.stdout)
                    .trim()
                    .parse()
                    .unwrap_or(0)
            }
            #[cfg(feature = "mysql")]
            Place::Mysql { url, prefix } => crate::support::mysql::count(
                plain(url),
                &format!("SELECT count(*) AS n FROM {prefix}_{module}.{rest}"),
            ),
            #[cfg(not(feature = "mysql"))]
            Place::Mysql { .. } => unreachable!("made with the `mysql` feature only"),
        }
    }

    /// Each row's one text column, `SELECT <column> AS t FROM <rest>` in
    /// `module`'s database.
    pub(crate) fn texts(&self, module: &str, column: &str, rest: &str) -> Vec<String> {
        match self {
            Place::Sqlite(dir) => {
                use tickbox::diesel::{sql_query, sql_types::Text, Connection, RunQueryDsl};
                #[derive(tickbox::diesel::QueryableByName)]
                struct Row {
                    #[diesel(sql_type = Text)]
                    t: String,
                }
                let path = dir
                    .path()
                    .join(format!("{module}.db"))
                    .display()
                    .to_string();
                let mut conn = tickbox::diesel::SqliteConnection::establish(&path)
                    .unwrap_or_else(|e| panic!("{path}: {e}"));
                let sql = format!("SELECT {column} AS t FROM {rest}");
                let rows: Vec<Row> = sql_query(&sql)
                    .load(&mut conn)
                    .unwrap_or_else(|e| panic!("{sql} in {path}: {e}"));
                rows.into_iter().map(|row| row.t).collect()
            }
            Place::Postgres { url, .. } => {
                let sql =
                    format!("SET search_path TO minishop_{module}; SELECT {column} FROM {rest}");
                psql(url, &sql).lines().map(String::from).collect()
            }
            #[cfg(feature = "mysql")]
            Place::Mysql { url, prefix } => crate::support::mysql::texts(
                plain(url),
                &format!("SELECT {column} AS t FROM {prefix}_{module}.{rest}"),
            ),
            #[cfg(not(feature = "mysql"))]
            Place::Mysql { .. } => unreachable!("made with the `mysql` feature only"),
        }
    }

    /// minishop's flags naming these databases.
    pub(crate) fn args(&self) -> Vec<String> {
        match self {
            Place::Sqlite(dir) => vec!["--data-dir".into(), dir.path().display().to_string()],
            Place::Postgres { url, .. } => vec!["--database-url".into(), url.clone()],
            Place::Mysql { url, prefix } => vec![
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
            crate::support::mysql::drop_databases(plain(url), prefix);
        }
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

/// `url` without its parameters (`?ssl-mode=…`): the server, as the tests
/// reach it to read what the examples wrote.
#[cfg(feature = "mysql")]
fn plain(url: &str) -> &str {
    url.split_once('?').map_or(url, |(server, _)| server)
}

/// Runs SQL with psql against `url`; panics with psql's words on failure.
pub(crate) fn psql(url: &str, sql: &str) -> String {
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

/// Starts minishop on `place` with `args`, its logs filtered to errors,
/// its stdout and stderr piped.
pub(crate) fn spawn(place: &Place, args: &[&str]) -> Child {
    Command::new(minishop())
        .args(place.args())
        .args(args)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("minishop starts")
}

/// Waits for the child to exit, for at most `timeout`; `None` if it is
/// still running.
pub(crate) fn wait_for(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
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

/// Polls `condition` until it holds, for at most `timeout`, while `child`
/// runs; panics naming `what` if the time passes or the child ends first.
pub(crate) fn await_while_running(
    child: &mut Child,
    what: &str,
    timeout: Duration,
    condition: impl Fn() -> bool,
) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < timeout,
            "{what}: not within {timeout:?}"
        );
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "{what}: the process ended first"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child that must finish by itself, and returns its output.
pub(crate) fn finish(mut child: Child, timeout: Duration, what: &str) -> Output {
    if wait_for(&mut child, timeout).is_none() {
        let _ = child.kill();
        let output = child.wait_with_output().expect("output");
        panic!(
            "{what} did not finish within {timeout:?}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    child.wait_with_output().expect("output")
}

/// The result line of a `--json` run, unchecked.
pub(crate) fn result_json(output: &Output, what: &str) -> serde_json::Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "{what}: the last line is not JSON ({e})\nstdout:\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

/// The result line of a `--json` run, checked: the run passed, every order
/// has one reservation, one confirmation and one e-mail, nothing is pending.
pub(crate) fn check_result(output: &Output, what: &str) -> serde_json::Value {
    let result = result_json(output, what);
    let field = |key: &str| {
        result[key]
            .as_i64()
            .unwrap_or_else(|| panic!("{what}: no `{key}` in {result}"))
    };
    assert!(
        output.status.success(),
        "{what} failed: {result}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        result["ok"],
        serde_json::Value::Bool(true),
        "{what}: {result}"
    );
    assert_eq!(field("pending"), 0, "{what}: {result}");
    let orders = field("orders");
    assert!(orders > 0, "{what}: {result}");
    for key in ["reservations", "confirmations", "emails"] {
        assert_eq!(
            field(key),
            orders,
            "{what}: every order has exactly one of `{key}`: {result}"
        );
    }
    // The saga ignores a message that does not fit its order: without
    // `--disturb`, one would be a duplicate the inbox let through.
    assert_eq!(
        field("saga_ignored"),
        0,
        "{what}: the inbox let a message through to the saga: {result}"
    );
    result
}

/// The seed of a test's random kill moments: `TICKBOX_CRASH_SEED`, or a
/// new one, printed so that a failure can be replayed.
pub(crate) fn crash_seed() -> u64 {
    let seed = std::env::var("TICKBOX_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    eprintln!("crash test seed: {seed} (TICKBOX_CRASH_SEED={seed} replays it)");
    seed
}

/// Runs minishop again and again with `args`, each run SIGKILLed at a
/// seeded random moment `moments` (ms) after it starts, until `kills`
/// kills: the first run places `orders` orders, and so does the run after
/// one that finished by itself (which must pass its check); the others
/// `--resume`. A run that finishes first halves the longest moment, so the
/// kills come however fast the machine is. Returns (seed, runs).
pub(crate) fn kill_runs_at_random(
    place: &Place,
    args: &[&str],
    orders: &str,
    kills: usize,
    moments: std::ops::Range<u64>,
) -> (u64, usize) {
    let seed = crash_seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let (mut killed, mut runs, mut add_orders) = (0, 0, true);
    let mut longest_ms = moments.end;
    // Until `kills` runs are killed and some orders exist to resume.
    while killed < kills || (add_orders && place.count_orders_db("orders") == 0) {
        runs += 1;
        assert!(
            runs <= 5 * kills + 10,
            "seed {seed}: only {killed} kills in {runs} runs"
        );
        let mut run_args = args.to_vec();
        if add_orders {
            run_args.extend(["--orders", orders]);
        } else {
            run_args.push("--resume");
        }
        let mut child = spawn(place, &run_args);
        let moment = Duration::from_millis(rng.u64(moments.start..longest_ms));
        match wait_for(&mut child, moment) {
            None => {
                child.kill().expect("SIGKILL");
                child.wait().expect("reaped");
                killed += 1;
                // The next run resumes what this one left, unless no order
                // exists yet (every run so far was killed while starting,
                // as on a busy machine): then the next one places them
                // again, and may live longer before its kill.
                add_orders = place.count_orders_db("orders") == 0;
                if add_orders {
                    longest_ms = (longest_ms * 2).min(moments.end * 8);
                }
            }
            Some(status) => {
                let output = child.wait_with_output().expect("output");
                assert!(
                    status.success(),
                    "seed {seed}: run {runs} ({run_args:?}) finished by itself and failed its \
                     check\nstdout:\n{}\nstderr:\n{}",
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                );
                add_orders = true;
                longest_ms = (longest_ms / 2).max(moments.start + 50);
            }
        }
    }
    (seed, runs)
}

/// SIGKILL at seeded random moments, at least 20 times, then a resume.
/// A moment is at most `latest_ms` after a run starts: long enough that
/// some runs, with nothing left to do, end by themselves first (and the next
/// places orders again).
fn survives_sigkill(place: Place, latest_ms: u64) {
    let kills = 20;
    let faults = ["--fail-rate", "0.1", "--duplicate-rate", "0.2"];
    let (seed, runs) = kill_runs_at_random(&place, &faults, "150", kills, 20..latest_ms);
    let output = finish(
        spawn(&place, &["--resume", "--json"]),
        Duration::from_secs(300),
        "the final --resume",
    );
    let result = check_result(&output, &format!("seed {seed}, after {kills} kills"));
    eprintln!("after {kills} kills in {runs} runs: {result}");
}

#[test]
fn sqlite_minishop_survives_sigkill_at_random_moments() {
    survives_sigkill(Place::sqlite(), 1200);
}

/// Kills every connection of the example's databases again and again while
/// it runs `orders` orders; the same process must finish with the
/// invariants holding.
#[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
fn survives_its_connections_being_killed(place: Place, orders: &str) {
    let mut child = spawn(&place, &["--orders", orders, "--json"]);

    // Once orders flow, kill the connections until the run ends.
    let started = Instant::now();
    let minute = Duration::from_secs(60);
    await_while_running(&mut child, "the example placing an order", minute, || {
        place.count_orders_db("orders") > 0
    });
    let (mut rounds, mut killed) = (0, 0);
    while wait_for(&mut child, Duration::from_millis(fastrand::u64(100..300))).is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the example did not finish"
        );
        killed += place.kill_connections();
        rounds += 1;
    }
    let output = child.wait_with_output().expect("output");
    let result = check_result(&output, "the run whose connections were killed");
    eprintln!("{rounds} rounds killed {killed} connections: {result}");
    assert!(
        rounds >= 5 && killed >= 5,
        "too few faults injected: {rounds} rounds, {killed} connections"
    );
}

impl Place {
    /// Ends every connection to the run's databases from the server's side
    /// (PostgreSQL: `pg_terminate_backend`, MariaDB/MySQL: `KILL`); how many.
    fn kill_connections(&self) -> u32 {
        match self {
            Place::Sqlite(_) => unreachable!("SQLite has no connections to kill"),
            Place::Postgres { database, .. } => {
                let base = std::env::var("TICKBOX_PG_URL").expect("TICKBOX_PG_URL");
                let kill_sql = format!(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE datname = '{database}' AND pid <> pg_backend_pid()"
                );
                psql(&base, &kill_sql).parse().expect("a count")
            }
            #[cfg(feature = "mysql")]
            Place::Mysql { url, prefix } => {
                crate::support::mysql::kill_connections(plain(url), prefix)
            }
            #[cfg(not(feature = "mysql"))]
            Place::Mysql { .. } => unreachable!("made with the `mysql` feature only"),
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;

    #[test]
    fn minishop_survives_sigkill_at_random_moments() {
        survives_sigkill(Place::postgres("crash"), 1200);
    }

    #[test]
    fn minishop_survives_its_connections_being_terminated() {
        survives_its_connections_being_killed(Place::postgres("terminate"), "1500");
    }
}

#[cfg(feature = "mysql")]
mod mysql {
    use super::*;

    /// A MariaDB run takes longer to start (it makes and opens three
    /// databases over the network; over a second on a busy machine even
    /// when they exist): moments up to 3 s, or every run is killed before
    /// it places an order.
    #[test]
    fn minishop_survives_sigkill_at_random_moments() {
        survives_sigkill(Place::mysql("crash"), 3000);
    }

    /// Fewer orders than on PostgreSQL: a new MariaDB connection costs
    /// more, and at a kill every 100-300 ms 500 orders already meet some
    /// hundreds of rounds.
    #[test]
    fn minishop_survives_its_connections_being_killed() {
        survives_its_connections_being_killed(Place::mysql("kill"), "500");
    }
}

// ---------------------------------------------------------------------------
// Several processes over one set of databases

/// The `--modules` of each process of a split. Every process running the
/// orders module places orders.
const DISJOINT_TWO: &[&str] = &["orders,warehouse", "notifications"];
const DISJOINT_THREE: &[&str] = &["orders", "warehouse", "notifications"];
const OVERLAPPING_TWO: &[&str] = &["orders,warehouse", "warehouse,notifications"];
const OVERLAPPING_THREE: &[&str] = &[
    "orders,warehouse",
    "warehouse,notifications",
    "notifications,orders",
];
const IDENTICAL_TWO: &[&str] = &["orders,warehouse,notifications"; 2];
/// Two processes of one module beside one of each other.
const ONE_MODULE_TWICE: &[&str] = &["orders", "warehouse", "warehouse", "notifications"];

/// Orders each placing process places.
const ORDERS_EACH: u64 = 100;

/// Starts the process running `modules`: new orders if it runs the orders
/// module (unless `resume`: only finishing what is pending), faults
/// injected, a deadline that names what is unfinished rather than hanging;
/// it waits for `placers` placing runs, however late they start.
fn spawn_part(place: &Place, modules: &str, placers: usize, resume: bool) -> Child {
    let orders = ORDERS_EACH.to_string();
    let placers = placers.to_string();
    let mut args = vec![
        "--modules",
        modules,
        "--placers",
        &placers,
        "--duplicate-rate",
        "0.1",
        "--fail-rate",
        "0.05",
        "--timeout",
        "240",
        "--json",
    ];
    if resume {
        args.push("--resume");
    } else if modules.contains("orders") {
        args.extend(["--orders", orders.as_str()]);
    }
    spawn(place, &args)
}

/// The processes of `split` that place orders: those running the orders
/// module.
pub(crate) fn placers(split: &[impl AsRef<str>]) -> usize {
    split
        .iter()
        .filter(|m| m.as_ref().contains("orders"))
        .count()
}

/// Runs `split` side by side: every process ends by itself with the whole
/// flow checked over the three databases, and the orders are exactly those
/// placed, each reserved, confirmed and e-mailed once.
fn share_the_work(place: Place, split: &[&str]) {
    let placing = placers(split);
    let children: Vec<Child> = split
        .iter()
        .map(|modules| spawn_part(&place, modules, placing, false))
        .collect();
    // Every process ends before any is checked, so that a failure shows
    // what the others said too (one that died at start leaves the rest
    // waiting for its handlers).
    let outputs: Vec<(String, Output)> = children
        .into_iter()
        .zip(split)
        .map(|(child, modules)| {
            let what = format!("the process running {modules} (of {split:?})");
            let output = finish(child, Duration::from_secs(300), &what);
            (what, output)
        })
        .collect();
    for (what, output) in &outputs {
        if !output.status.success() {
            let said: Vec<String> = outputs
                .iter()
                .map(|(what, output)| {
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    format!("{what} ({}):\n{}", output.status, tail.join("\n"))
                })
                .collect();
            eprintln!("what every process said last:\n{}", said.join("\n\n"));
        }
        let result = check_result(output, what);
        assert_eq!(
            result["orders"],
            placing as u64 * ORDERS_EACH,
            "{what}: every placed order and no other: {result}"
        );
    }
}

/// Kills `children` with SIGKILL, one at a time, at seeded random moments
/// (the first within `first_ms..early_ms` of the start, the others within
/// `first_ms..late_ms` of the previous), restarting each at once with
/// `respawn`, at most `most` times; stops as soon as any process has ended
/// by itself (it checked the flow: a restarted orders process would now
/// place orders it never saw). Returns the seed (`TICKBOX_CRASH_SEED`
/// replays it) and the kills, of which there is at least one.
fn sigkill_at_random(
    children: &mut [Child],
    most: usize,
    (first_ms, early_ms, late_ms): (u64, u64, u64),
    mut respawn: impl FnMut(usize) -> Child,
) -> (u64, usize) {
    let seed = crash_seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut kills = 0;
    while kills < most {
        let victim = rng.usize(..children.len());
        let last_ms = if kills == 0 { early_ms } else { late_ms };
        let moment = Duration::from_millis(rng.u64(first_ms..last_ms));
        if wait_for(&mut children[victim], moment).is_some()
            || children
                .iter_mut()
                .any(|child| child.try_wait().expect("try_wait").is_some())
        {
            break;
        }
        children[victim].kill().expect("SIGKILL");
        children[victim].wait().expect("reaped");
        kills += 1;
        children[victim] = respawn(victim);
    }
    assert!(
        kills > 0,
        "seed {seed}: the flow finished before the first kill"
    );
    (seed, kills)
}

/// Runs `split` side by side and kills its processes with SIGKILL at seeded
/// random moments, restarting each killed one at once; then every process
/// ends by itself with the flow checked.
///
/// A killed process is restarted as it was started (placing new orders if it
/// runs the orders module) while fewer placing runs are recorded than the
/// split has placers (no process deems the flow done before that) or none
/// has ended. Once one has, the others may see the flow finished and end,
/// and orders placed then would find no process left to serve them: it is
/// restarted with `--resume`. (A
/// run killed while placing holds the others back for its lease, 5 s, long
/// enough for its replacement to record its own run.)
fn share_the_work_through_sigkills(place: Place, split: &[&str]) {
    let placing = placers(split);
    let mut children: Vec<Child> = split
        .iter()
        .map(|modules| spawn_part(&place, modules, placing, false))
        .collect();
    let (seed, kills) = sigkill_at_random(&mut children, 8, (50, 400, 1500), |victim| {
        let resume =
            place.count_orders_db("placing_runs") >= placing as i64 && place.a_placing_run_ended();
        spawn_part(&place, split[victim], placing, resume)
    });
    let mut orders = None;
    for (child, modules) in children.into_iter().zip(split) {
        let what = format!("seed {seed}, after {kills} kills: the process running {modules}");
        let output = finish(child, Duration::from_secs(300), &what);
        let result = check_result(&output, &what);
        // Every process checked the same databases at the end.
        let counted = result["orders"].as_i64();
        assert_eq!(*orders.get_or_insert(counted), counted, "{what}: {result}");
    }
    eprintln!("seed {seed}: {split:?} finished after {kills} kills");
}

/// The splits, each a test, on one backend.
macro_rules! splits {
    ($place:expr) => {
        #[test]
        fn two_processes_with_disjoint_modules_share_the_work() {
            share_the_work($place, DISJOINT_TWO);
        }

        #[test]
        fn three_processes_one_module_each_share_the_work() {
            share_the_work($place, DISJOINT_THREE);
        }

        #[test]
        fn two_processes_with_overlapping_modules_share_the_work() {
            share_the_work($place, OVERLAPPING_TWO);
        }

        #[test]
        fn three_processes_with_overlapping_modules_share_the_work() {
            share_the_work($place, OVERLAPPING_THREE);
        }

        #[test]
        fn two_identical_processes_share_the_work() {
            share_the_work($place, IDENTICAL_TWO);
        }

        #[test]
        fn two_processes_of_one_module_share_the_work() {
            share_the_work($place, ONE_MODULE_TWICE);
        }

        #[test]
        fn three_processes_one_module_each_survive_sigkill() {
            share_the_work_through_sigkills($place, DISJOINT_THREE);
        }

        #[test]
        fn three_processes_with_overlapping_modules_survive_sigkill() {
            share_the_work_through_sigkills($place, OVERLAPPING_THREE);
        }
    };
}

mod started_together;
mod timeouts;

mod sqlite_split {
    use super::*;
    splits!(Place::sqlite());
}

#[cfg(feature = "postgres")]
mod postgres_split {
    use super::*;
    splits!(Place::postgres("split"));
}

#[cfg(feature = "mysql")]
mod mysql_split {
    use super::*;
    splits!(Place::mysql("split"));
}

/// A process whose partners never come gives up at `--timeout`, exit 1,
/// naming what is unfinished; it placed nothing it could not deliver.
#[test]
fn a_process_alone_times_out_naming_what_is_unfinished() {
    let cases = [
        (
            &["--modules", "warehouse"][..],
            "no run has placed orders yet",
        ),
        (
            &["--modules", "orders", "--orders", "10"][..],
            "warehouse.reserve_stock (start `minishop --modules warehouse`",
        ),
    ];
    for (args, expected) in cases {
        let place = Place::sqlite();
        let mut args = args.to_vec();
        args.extend(["--timeout", "2", "--json"]);
        let output = finish(
            spawn(&place, &args),
            Duration::from_secs(60),
            "a lone process",
        );
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let result: serde_json::Value =
            serde_json::from_str(stdout.lines().last().unwrap_or_default())
                .unwrap_or_else(|e| panic!("{args:?}: not JSON ({e}): {stdout}"));
        let unfinished = result["unfinished"].as_str().unwrap_or_default();
        assert!(unfinished.contains(expected), "{args:?}: {result}");
        assert_eq!(result["orders"], 0, "nothing placed: {result}");
    }
}

// ---------------------------------------------------------------------------
// Three processes over RabbitMQ, each with its own databases

mod traces;

/// minishop split over a RabbitMQ broker (`--transport amqp`): one process
/// per module, each with its own databases, sharing nothing but the broker.
/// Each is given the other two's databases with the check flags, so each
/// waits for and checks the whole flow.
#[cfg(feature = "amqp")]
mod amqp_split {
    use super::*;
    use crate::support::{broker_alone, broker_shared, rabbitmqctl};

    /// One module per process, in this order.
    const PARTS: [&str; 3] = ["orders", "warehouse", "notifications"];

    /// The three processes' databases and their namespace on the broker.
    struct Split {
        places: [Place; 3],
        namespace: String,
        orders: u64,
        /// The broker: the shared one, or the TLS node (`over_tls`).
        amqp_url: String,
        /// Where each process exports its spans (`--otlp-endpoint`), if
        /// anywhere.
        otlp_endpoint: Option<String>,
    }

    impl Split {
        /// Three SQLite data directories.
        fn sqlite(name: &str, orders: u64) -> Self {
            Split::new(
                [Place::sqlite(), Place::sqlite(), Place::sqlite()],
                name,
                orders,
            )
        }

        /// Three PostgreSQL databases.
        #[cfg(feature = "postgres")]
        fn postgres(name: &str, orders: u64) -> Self {
            let place = || Place::postgres("amqp");
            Split::new([place(), place(), place()], name, orders)
        }

        /// Databases on one MariaDB/MySQL server under one prefix: each
        /// process makes only its own module's, `<prefix>_<module>`, and
        /// finds the others' there (`--check-database-url` names the same
        /// server).
        #[cfg(feature = "mysql")]
        fn mysql(name: &str, orders: u64) -> Self {
            let prefix = crate::support::mysql::new_prefix("amqp");
            let place = || Place::Mysql {
                url: crate::support::mysql::server_url(),
                prefix: prefix.clone(),
            };
            Split::new([place(), place(), place()], name, orders)
        }

        /// Its own namespace on the broker, unique to this test run.
        fn new(places: [Place; 3], name: &str, orders: u64) -> Self {
            let namespace = format!("minishop-test.{name}.{:08x}", fastrand::u32(..));
            Split {
                places,
                namespace,
                orders,
                amqp_url: crate::support::amqp_url(),
                otlp_endpoint: None,
            }
        }

        /// The same, over TLS everywhere: amqps to the TLS node `.ci/tls`
        /// starts, each PostgreSQL database at `verify-full` (the server's
        /// certificate names `localhost`), and MariaDB's on the TLS server
        /// `.ci/tls` starts, at `VERIFY_IDENTITY`.
        #[cfg(feature = "tls")]
        fn over_tls(mut self) -> Self {
            self.amqp_url = crate::tls::amqps_url("localhost", "ca.pem");
            for place in &mut self.places {
                match place {
                    #[cfg(feature = "postgres")]
                    Place::Postgres { url, .. } => {
                        *url = format!(
                            "{}?sslmode=verify-full&sslrootcert={}",
                            url.replacen("@127.0.0.1:", "@localhost:", 1),
                            crate::tls::tls_file("ca.pem")
                        );
                    }
                    #[cfg(feature = "mysql")]
                    Place::Mysql { url, .. } => *url = crate::tls::mysql::verify_identity_url(),
                    _ => unreachable!("over TLS: PostgreSQL or MariaDB"),
                }
            }
            self
        }

        /// Starts the process running `PARTS[i]`, faults injected, with the
        /// other two processes' databases for its check.
        fn spawn(&self, i: usize) -> Child {
            self.spawn_placing(i, true)
        }

        /// Starts again the process running `PARTS[i]`, killed. The orders
        /// process places new orders only while no placing run has ended:
        /// once one has, the other two may see the flow finished and end,
        /// and new orders would find no process left to serve them; it
        /// then finishes the work with `--resume`.
        fn respawn(&self, i: usize) -> Child {
            self.spawn_placing(i, !self.places[0].a_placing_run_ended())
        }

        /// [`Split::spawn`], with new orders (`--orders`) if `placing`, else
        /// `--resume`.
        fn spawn_placing(&self, i: usize, placing: bool) -> Child {
            let orders = self.orders.to_string();
            let mut args: Vec<String> = [
                "--transport",
                "amqp",
                "--amqp-url",
                &self.amqp_url,
                "--amqp-namespace",
                &self.namespace,
                "--modules",
                PARTS[i],
                "--duplicate-rate",
                "0.1",
                "--fail-rate",
                "0.05",
                "--timeout",
                "240",
                "--json",
            ]
            .map(String::from)
            .to_vec();
            if let Some(endpoint) = &self.otlp_endpoint {
                args.extend(["--otlp-endpoint".to_string(), endpoint.clone()]);
            }
            if PARTS[i] == "orders" && placing {
                args.extend(["--orders".to_string(), orders]);
            } else if PARTS[i] == "orders" {
                args.push("--resume".to_string());
            }
            for (j, other) in self.places.iter().enumerate() {
                if j == i {
                    continue;
                }
                args.extend(match other {
                    Place::Sqlite(dir) => {
                        ["--check-data-dir".into(), dir.path().display().to_string()]
                    }
                    Place::Postgres { url, .. } | Place::Mysql { url, .. } => {
                        ["--check-database-url".into(), url.clone()]
                    }
                });
            }
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            spawn(&self.places[i], &args)
        }

        fn spawn_all(&self) -> Vec<Child> {
            (0..PARTS.len()).map(|i| self.spawn(i)).collect()
        }

        /// Orders in the orders process's database so far (0 before its
        /// tables exist).
        fn orders_placed(&self) -> i64 {
            self.places[0].count_orders_db("orders")
        }

        /// Waits, at most a minute, until the orders process has placed at
        /// least `n` orders: the flow runs.
        fn await_orders(&self, n: i64, children: &mut [Child]) {
            let started = Instant::now();
            while self.orders_placed() < n {
                assert!(
                    started.elapsed() < Duration::from_secs(60),
                    "the orders process never placed {n} orders"
                );
                for child in children.iter_mut() {
                    assert!(
                        child.try_wait().expect("try_wait").is_none(),
                        "a process exited before the flow ran"
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }

        /// Every process ends by itself with the whole flow checked over
        /// the three databases; each counted the same orders (`exact`:
        /// those placed by one undisturbed run). The results.
        fn finish(&self, children: Vec<Child>, exact: bool, what: &str) -> Vec<serde_json::Value> {
            let outputs: Vec<Output> = (children.into_iter().zip(PARTS))
                .map(|(child, part)| {
                    let what = format!("{what}: the process running {part}");
                    super::finish(child, Duration::from_secs(300), &what)
                })
                .collect();
            // What each of the three said, for a failure of any one.
            let all: String = (outputs.iter().zip(PARTS))
                .map(|(output, part)| {
                    let stdout = String::from_utf8_lossy(&output.stdout);
                    let last = stdout.lines().last().unwrap_or_default();
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    format!("\n{part} ({}): {last}\n{stderr}", output.status)
                })
                .collect();
            let mut orders = None;
            let mut results = Vec::new();
            for (output, part) in outputs.iter().zip(PARTS) {
                let what = format!("{what}: the process running {part}\n(the three:{all})");
                let result = check_result(output, &what);
                assert_eq!(result["transport"], "amqp", "{what}: {result}");
                assert_eq!(result["whole_flow"], true, "{what}: {result}");
                assert_drained_queues_are_empty(&result, &what);
                let counted = result["orders"].as_u64();
                if exact {
                    assert_eq!(counted, Some(self.orders), "{what}: {result}");
                }
                assert_eq!(*orders.get_or_insert(counted), counted, "{what}: {result}");
                results.push(result);
            }
            results
        }
    }

    /// The split's exchange and queues go with it.
    impl Drop for Split {
        fn drop(&mut self) {
            #[cfg(feature = "tls")]
            if self.amqp_url.starts_with("amqps://") {
                crate::tls::delete_tls_queues(&format!("tickbox.{}.", self.namespace));
                return;
            }
            crate::support::delete_from_broker(&format!("tickbox.{}", self.namespace));
        }
    }

    /// A run that says its queues drained reports each queue's depth as
    /// read after the drain: 0, or none when it could not be read (never a
    /// depth sampled while messages were still flowing).
    fn assert_drained_queues_are_empty(result: &serde_json::Value, what: &str) {
        if result["drained"] != true {
            return;
        }
        let consumers = result["amqp"]["consumers"]
            .as_array()
            .unwrap_or_else(|| panic!("{what}: the consumers' figures: {result}"));
        for consumer in consumers {
            let depth = &consumer["queue_depth"];
            assert!(
                depth.is_null() || *depth == 0,
                "{what}: drained, yet queue {} reported {depth} messages: {result}",
                consumer["queue"]
            );
        }
    }

    /// The broker's reconnects each process counted.
    fn reconnects(results: &[serde_json::Value]) -> Vec<u64> {
        results
            .iter()
            .map(|r| r["amqp"]["reconnects"].as_u64().unwrap_or(0))
            .collect()
    }

    fn share_the_work(split: Split) {
        let _broker = broker_shared();
        let children = split.spawn_all();
        split.finish(children, true, "three processes over amqp");
    }

    /// [`share_the_work`] on `backend` (`sqlite`, `postgres`, `mysql`),
    /// each process exporting its spans to `endpoint`.
    #[cfg(feature = "opentelemetry")]
    pub(super) fn share_the_work_exporting(backend: &str, orders: u64, endpoint: &str) {
        let mut split = match backend {
            #[cfg(feature = "postgres")]
            "postgres" => Split::postgres("traces", orders),
            #[cfg(feature = "mysql")]
            "mysql" => Split::mysql("traces", orders),
            _ => Split::sqlite("traces", orders),
        };
        split.otlp_endpoint = Some(endpoint.to_string());
        share_the_work(split);
    }

    /// Kills the processes with SIGKILL at seeded random moments and
    /// restarts each at once (the orders process places new orders again
    /// until a placing run has ended: [`Split::respawn`]); then each ends
    /// by itself with the flow checked.
    fn survive_sigkills(split: Split) {
        let _broker = broker_shared();
        let mut children = split.spawn_all();
        let (seed, kills) = sigkill_at_random(&mut children, 6, (100, 600, 2000), |victim| {
            split.respawn(victim)
        });
        split.finish(
            children,
            false,
            &format!("seed {seed}, after {kills} kills"),
        );
    }

    /// Injects `fault` into the broker once the flow runs; every process
    /// pauses, connects again by itself, and the flow finishes with nothing
    /// lost and nothing done twice.
    fn survive_broker_fault(split: Split, fault: impl FnOnce()) {
        // Other tests' buses must not see this broker fault.
        let _broker = broker_alone();
        let mut children = split.spawn_all();
        split.await_orders(100, &mut children);
        fault();
        let results = split.finish(children, true, "through a broker fault");
        let reconnects = reconnects(&results);
        assert!(
            reconnects.iter().all(|n| *n >= 1),
            "every process connected again: {reconnects:?}"
        );
    }

    fn restart_broker() {
        rabbitmqctl(&["stop_app"]);
        rabbitmqctl(&["start_app"]);
        rabbitmqctl(&["await_startup"]);
    }

    fn close_connections() {
        rabbitmqctl(&["close_all_connections", "test"]);
    }

    #[test]
    fn sqlite_three_processes_share_the_work_over_amqp() {
        share_the_work(Split::sqlite("share", 300));
    }

    #[test]
    fn sqlite_three_processes_over_amqp_survive_sigkill() {
        survive_sigkills(Split::sqlite("sigkill", 150));
    }

    #[test]
    fn sqlite_three_processes_over_amqp_survive_a_broker_restart() {
        survive_broker_fault(Split::sqlite("restart", 1000), restart_broker);
    }

    #[test]
    fn sqlite_three_processes_over_amqp_survive_their_connections_being_closed() {
        survive_broker_fault(Split::sqlite("close", 1000), close_connections);
    }

    /// Over TLS everywhere: amqps with a client certificate, PostgreSQL at
    /// `verify-full`.
    #[cfg(all(feature = "tls", feature = "postgres"))]
    #[test]
    fn postgres_three_processes_share_the_work_over_amqps_and_verified_postgres() {
        share_the_work(Split::postgres("tls", 300).over_tls());
    }

    /// Over TLS everywhere: amqps with a client certificate, MariaDB at
    /// `VERIFY_IDENTITY` on the TLS server.
    #[cfg(all(feature = "tls", feature = "mysql"))]
    #[test]
    fn mysql_three_processes_share_the_work_over_amqps_and_verified_mariadb() {
        share_the_work(Split::mysql("tls", 300).over_tls());
    }

    /// The TLS node restarts under three processes connected over amqps:
    /// each connects again (a new handshake) by itself.
    #[cfg(all(feature = "tls", feature = "postgres"))]
    #[test]
    fn postgres_three_processes_over_amqps_survive_a_restart_of_the_tls_node() {
        survive_broker_fault(Split::postgres("tlsrestart", 1000).over_tls(), || {
            crate::tls::tls_node(&["stop_app"]);
            crate::tls::tls_node(&["start_app"]);
            crate::tls::tls_node(&["await_startup"]);
        });
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_three_processes_share_the_work_over_amqp() {
        share_the_work(Split::postgres("share", 300));
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_three_processes_over_amqp_survive_sigkill() {
        survive_sigkills(Split::postgres("sigkill", 150));
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_three_processes_over_amqp_survive_a_broker_restart() {
        survive_broker_fault(Split::postgres("restart", 1000), restart_broker);
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn postgres_three_processes_over_amqp_survive_their_connections_being_closed() {
        survive_broker_fault(Split::postgres("close", 1000), close_connections);
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_three_processes_share_the_work_over_amqp() {
        share_the_work(Split::mysql("share", 300));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_three_processes_over_amqp_survive_sigkill() {
        survive_sigkills(Split::mysql("sigkill", 150));
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_three_processes_over_amqp_survive_a_broker_restart() {
        survive_broker_fault(Split::mysql("restart", 1000), restart_broker);
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn mysql_three_processes_over_amqp_survive_their_connections_being_closed() {
        survive_broker_fault(Split::mysql("close", 1000), close_connections);
    }
}
