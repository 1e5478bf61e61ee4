//! Whole processes behind a network that goes quiet: minishop runs as a
//! child process and reaches its PostgreSQL server, or its RabbitMQ broker,
//! through the test's fault proxy (`support::fault_proxy`), which
//! blackholes, resets and slows its connections while it places orders at a
//! steady pace (`--order-interval`).
//!
//! A blackhole is the fault that hangs a process without deadlines: no
//! socket is closed, no error comes, and the connections open during it
//! never carry a byte again (the proxy is faithful to what the real fault
//! leaves behind). After each heal the process must commit new work within
//! [`RECOVERY_LIMIT`], read from the databases directly (never through the
//! proxy); at the end it must finish exact (its own check of the
//! invariants), leave no session idle in transaction on the server, and
//! hold no more sockets than it did while it ran undisturbed. Asked to
//! stop (SIGTERM) during a blackhole, it must exit within its stop
//! deadline, and a `--resume` afterwards must finish exact.
//!
//! Each test prints what it measured (`--nocapture` shows it), and a
//! failure says what was observed: how late the work came, if it came.

use crate::processes::{check_result, minishop, psql, Place};
use crate::support::fault_proxy::{FaultProxy, Mode};
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, ToSocketAddrs};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How soon after the network heals the process must commit new work.
const RECOVERY_LIMIT: Duration = Duration::from_secs(30);

/// How long a test keeps watching once [`RECOVERY_LIMIT`] has passed
/// without the work, to say how late it came, if it came at all: to 100 s
/// after the heal, beyond the minute and a half a RabbitMQ connection took
/// to recover from a blackhole before deadlines (issue 23).
const WATCH_LATE_WORK: Duration = Duration::from_secs(70);

/// How long the network stays quiet: longer than any single statement or
/// checkout needs, shorter than minishop's own minute of retrying a failed
/// statement (`faults::retrying`).
const BLACKHOLE: Duration = Duration::from_secs(25);

/// How long every connection is reset, new ones included.
const RESET: Duration = Duration::from_secs(2);

/// The delay each chunk takes each way during the latency phase, and for
/// how long.
const LATENCY: Duration = Duration::from_millis(50);
const LATENCY_PHASE: Duration = Duration::from_secs(10);

/// The longest a SIGTERM may take to end the process: minishop's own stop
/// deadline (40 s, `STOP_DEADLINE` in examples/minishop/shutdown.rs: the
/// bus's stop timeout of 30 s, which bounds `BusHandle::stop`, and 10 s for
/// recording the run's end and the report; past it minishop quits as a
/// second Ctrl-C would), plus 5 s for a slow machine to end the process.
const STOP_DEADLINE: Duration = Duration::from_secs(40 + 5);

/// The pace of the orders.
const ORDER_INTERVAL_MS: &str = "50";

/// Orders placed on PostgreSQL: about a minute of placing when nothing
/// stalls, so that orders keep coming for the whole test (a stall — a
/// blackhole, a slow recovery — only makes it last longer).
const ORDERS: u64 = 1200;

/// Work committed before the faults start: every module has handled
/// messages, the pools are warm.
const WARM_CONFIRMATIONS: i64 = 30;

/// How long a run may take to finish by itself once the faults are over.
const FINISH_WITHIN: Duration = Duration::from_secs(150);

/// How long the socket counts are sampled, each time (the largest count
/// seen is kept: the pools lend and return connections all the time).
const SOCKET_WINDOW: Duration = Duration::from_secs(3);

/// Sockets the process may hold at the end beyond its undisturbed count:
/// its pools may have grown since (a backlog after a heal runs more
/// deliveries at once than the steady pace did), at most to their size.
/// minishop opens three modules, each with a pool of 8 connections on
/// PostgreSQL (tickbox's default) of which the steady pace uses few; a
/// blackhole that leaked its connections would leave every pool's dead
/// ones, and every connection attempt made into the quiet network, on top.
const POOL_GROWTH: usize = 3 * 8;

// ---------------------------------------------------------------------------
// The network

/// The fault proxy, on a runtime of its own (the tests block their thread
/// on child processes).
struct Network {
    /// Dropped first: its tasks are aborted while the runtime still runs.
    proxy: FaultProxy,
    _runtime: tokio::runtime::Runtime,
    /// When the test started, for the timestamps it prints.
    started: Instant,
}

impl Network {
    /// A proxy to `upstream`, in `Pass`.
    fn start(upstream: SocketAddr) -> Network {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("the proxy's runtime");
        let proxy = runtime.block_on(FaultProxy::start(upstream));
        Network {
            proxy,
            _runtime: runtime,
            started: Instant::now(),
        }
    }

    fn set(&self, mode: Mode) {
        self.say(&format!("network: {mode:?}"));
        self.proxy.set(mode);
    }

    /// Prints `what` with the seconds since the test started.
    fn say(&self, what: &str) {
        eprintln!("[{:6.1} s] {what}", self.started.elapsed().as_secs_f64());
    }

    /// The proxy's counts, for messages.
    fn counts(&self) -> String {
        format!(
            "the proxy accepted {} connections, {} open now, {} of them left dead by a blackhole",
            self.proxy.accepted(),
            self.proxy.open(),
            self.proxy.open_dead()
        )
    }
}

/// The address of `url`'s host and port (`default_port` if it names none).
fn server_addr(url: &str, default_port: u16) -> SocketAddr {
    let parsed = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    let host = parsed.host_str().expect("a host in the URL");
    (host, parsed.port().unwrap_or(default_port))
        .to_socket_addrs()
        .expect("the server's address resolves")
        .next()
        .expect("an address")
}

/// `url` with its host and port replaced by the proxy's.
fn through(url: &str, proxy: &FaultProxy) -> String {
    let mut parsed = url::Url::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
    parsed.set_host(Some("127.0.0.1")).expect("a host");
    parsed.set_port(Some(proxy.port())).expect("a port");
    parsed.to_string()
}

// ---------------------------------------------------------------------------
// The process

/// minishop running as a child process, its output read as it comes (a
/// pipe never fills and blocks it); killed if the test ends first.
struct Shop {
    child: Option<Child>,
    pid: u32,
    /// The last lines of its stderr.
    stderr: Arc<Mutex<VecDeque<String>>>,
    stderr_reader: Option<JoinHandle<()>>,
    stdout_reader: Option<JoinHandle<Vec<u8>>>,
}

/// Lines of stderr kept for a failure's message.
const STDERR_LINES: usize = 60;

impl Shop {
    fn spawn(args: &[&str]) -> Shop {
        let mut child = Command::new(minishop())
            .args(args)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("minishop starts");
        let pid = child.id();
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let lines = stderr.clone();
        let err = child.stderr.take().expect("stderr");
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                let mut lines = lines.lock().unwrap_or_else(|p| p.into_inner());
                if lines.len() == STDERR_LINES {
                    lines.pop_front();
                }
                lines.push_back(line);
            }
        });
        let mut out = child.stdout.take().expect("stdout");
        let stdout_reader = std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = out.read_to_end(&mut bytes);
            bytes
        });
        Shop {
            child: Some(child),
            pid,
            stderr,
            stderr_reader: Some(stderr_reader),
            stdout_reader: Some(stdout_reader),
        }
    }

    fn child(&mut self) -> &mut Child {
        self.child.as_mut().expect("the process is running")
    }

    /// Its exit status, if it has ended.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child().try_wait().expect("try_wait")
    }

    /// Fails the test, with its last words, if it has ended.
    fn assert_running(&mut self, when: &str) {
        if let Some(status) = self.exited() {
            panic!(
                "minishop exited {when} ({status})\nstderr:\n{}",
                self.stderr_tail()
            );
        }
    }

    fn stderr_tail(&self) -> String {
        let lines = self.stderr.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// Sockets the process holds now: the entries of /proc/<pid>/fd that
    /// link to `socket:[…]`.
    fn sockets(&self) -> usize {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", self.pid)) else {
            return 0;
        };
        fds.filter_map(Result::ok)
            .filter_map(|fd| std::fs::read_link(fd.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("socket:"))
            .count()
    }

    /// The most sockets the process held over [`SOCKET_WINDOW`], sampled
    /// every 50 ms.
    fn peak_sockets(&mut self, when: &str) -> usize {
        let until = Instant::now() + SOCKET_WINDOW;
        let mut peak = 0;
        while Instant::now() < until {
            self.assert_running(when);
            peak = peak.max(self.sockets());
            std::thread::sleep(Duration::from_millis(50));
        }
        peak
    }

    /// Sends SIGTERM, as a service manager asks a process to stop.
    fn terminate(&mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -TERM {} failed", self.pid);
    }

    /// Waits at most `timeout` for the process to end by itself; its
    /// status, or `None` if it still runs.
    fn wait_for(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.exited() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    fn kill(&mut self) {
        let child = self.child();
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Its output, once it has ended.
    fn output(mut self, status: ExitStatus) -> Output {
        self.child = None;
        let stdout = self
            .stdout_reader
            .take()
            .expect("stdout reader")
            .join()
            .unwrap_or_default();
        let _ = self.stderr_reader.take().expect("stderr reader").join();
        Output {
            status,
            stdout,
            stderr: self.stderr_tail().into_bytes(),
        }
    }

    /// Waits for the process to finish by itself, at most `timeout`, and
    /// returns its output; kills it and fails the test otherwise.
    fn finish(mut self, timeout: Duration, what: &str) -> Output {
        match self.wait_for(timeout) {
            Some(status) => self.output(status),
            None => {
                self.kill();
                panic!(
                    "{what} did not finish within {timeout:?}\nstderr:\n{}",
                    self.stderr_tail()
                );
            }
        }
    }
}

impl Drop for Shop {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

// ---------------------------------------------------------------------------
// What the databases show, read directly

/// Runs `sql` with psql at `url`; `None` if it fails (before the tables
/// exist).
fn try_psql(url: &str, sql: &str) -> Option<String> {
    let output = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-qtAc", sql])
        .output()
        .expect("psql runs");
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The moment now, in µs since the epoch, as minishop stamps its orders.
fn now_us() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch");
    i64::try_from(since.as_micros()).expect("fits")
}

/// What the process has committed: all orders, and of those placed after a
/// moment, the confirmed ones and those e-mailed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Work {
    orders: i64,
    confirmed_since: i64,
    emailed_since: i64,
}

impl Work {
    /// Reads the orders and notifications schemas at `url`; zeros before
    /// their tables exist.
    fn read(url: &str, since_us: i64) -> Work {
        let sql = format!(
            "SELECT (SELECT count(*) FROM minishop_orders.orders), \
                    (SELECT count(*) FROM minishop_orders.orders \
                     WHERE status = 'confirmed' AND placed_at_us > {since_us}), \
                    (SELECT count(*) FROM minishop_notifications.sent_emails e \
                     JOIN minishop_orders.orders o ON o.id = e.order_id \
                     WHERE o.placed_at_us > {since_us})"
        );
        let Some(row) = try_psql(url, &sql) else {
            return Work {
                orders: 0,
                confirmed_since: 0,
                emailed_since: 0,
            };
        };
        let numbers: Vec<i64> = row
            .split('|')
            .map(|n| n.parse().expect("a count"))
            .collect();
        Work {
            orders: numbers[0],
            confirmed_since: numbers[1],
            emailed_since: numbers[2],
        }
    }
}

/// Waits, at most a minute, until the process has confirmed
/// [`WARM_CONFIRMATIONS`] orders.
fn await_warm(shop: &mut Shop, url: &str, net: &Network) {
    let started = Instant::now();
    loop {
        let work = Work::read(url, 0);
        if work.confirmed_since >= WARM_CONFIRMATIONS {
            net.say(&format!("warm: {work:?}"));
            return;
        }
        shop.assert_running("before it confirmed its first orders");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "minishop confirmed too few orders within a minute of its start: {work:?}\n\
             stderr:\n{}",
            shop.stderr_tail()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Keeps the network in `mode` for `how_long`, checking that the process
/// lives on.
fn hold(shop: &mut Shop, net: &Network, mode: Mode, how_long: Duration) {
    net.set(mode);
    let until = Instant::now() + how_long;
    while Instant::now() < until {
        shop.assert_running(&format!("while the network was in {mode:?}"));
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// How long after a heal each kind of new work first showed.
struct Recovery {
    new_order: Option<Duration>,
    confirmed: Option<Duration>,
    emailed: Option<Duration>,
}

/// Heals the network (`Pass`) after `fault`, then measures how long until
/// the process commits new work: a new order row, an order placed after
/// the heal confirmed, and its e-mail (over RabbitMQ: the whole flow, three
/// trips through the broker). Asserts each within [`RECOVERY_LIMIT`]; past
/// it, keeps watching for [`WATCH_LATE_WORK`] to say how late it came.
fn heal_and_measure(shop: &mut Shop, url: &str, net: &Network, fault: &str) {
    // Over PostgreSQL nothing commits through a quiet proxy: the count
    // before the heal is the count at the heal.
    let before = Work::read(url, 0);
    let healed_us = now_us();
    net.set(Mode::Pass);
    let healed = Instant::now();
    let mut recovery = Recovery {
        new_order: None,
        confirmed: None,
        emailed: None,
    };
    let mut last = before;
    while healed.elapsed() < RECOVERY_LIMIT + WATCH_LATE_WORK {
        let work = Work::read(url, healed_us);
        let at = healed.elapsed();
        if work.orders > before.orders {
            recovery.new_order.get_or_insert(at);
        }
        if work.confirmed_since > 0 {
            recovery.confirmed.get_or_insert(at);
        }
        if work.emailed_since > 0 {
            recovery.emailed.get_or_insert(at);
        }
        last = work;
        if recovery.emailed.is_some() && recovery.new_order.is_some() {
            break;
        }
        if shop.exited().is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let shown = |at: Option<Duration>| match at {
        Some(at) => format!("{:.1} s", at.as_secs_f64()),
        None => format!(
            "none within {:.0} s",
            healed.elapsed().as_secs_f64().floor()
        ),
    };
    let measured = format!(
        "after {fault}, healed: a new order row {}, an order placed since confirmed {}, \
         e-mailed {} (orders {} at the heal, {} at the end of watching; {})",
        shown(recovery.new_order),
        shown(recovery.confirmed),
        shown(recovery.emailed),
        before.orders,
        last.orders,
        net.counts()
    );
    net.say(&measured);
    let late = [recovery.new_order, recovery.confirmed, recovery.emailed]
        .iter()
        .any(|at| at.is_none_or(|at| at > RECOVERY_LIMIT));
    if late {
        let status = shop.exited();
        panic!(
            "the process did not commit new work within {RECOVERY_LIMIT:?} of the heal — \
             {measured}; {}; the database's sessions: {}\nstderr:\n{}",
            status.map_or("it is still running".into(), |s| format!("it exited ({s})")),
            sessions(url),
            shop.stderr_tail()
        );
    }
}

/// The sessions of the database at `url` (but the one asking), counted by
/// state: `idle in transaction` ones hold their locks.
fn sessions(url: &str) -> String {
    let sql = "SELECT coalesce(string_agg(n || ' ' || state, ', '), 'none') FROM \
               (SELECT coalesce(state, '?') AS state, count(*) AS n FROM pg_stat_activity \
                WHERE datname = current_database() AND pid <> pg_backend_pid() \
                GROUP BY 1 ORDER BY 1) AS s";
    try_psql(url, sql).unwrap_or_else(|| "unknown".into())
}

/// Waits, at most 5 s, until no session of `database` is idle in a
/// transaction (a session whose client stopped mid-transaction holds its
/// locks until the server ends it); fails the test otherwise, naming them.
fn assert_no_session_idle_in_transaction(base_url: &str, database: &str, net: &Network) {
    let sessions = format!(
        "SELECT pid || ' ' || state || ' for ' || \
                round(extract(epoch FROM now() - state_change)) || ' s: ' || left(query, 80) \
         FROM pg_stat_activity WHERE datname = '{database}' AND state = 'idle in transaction'"
    );
    let started = Instant::now();
    loop {
        let idle = psql(base_url, &sessions);
        if idle.is_empty() {
            let all = psql(
                base_url,
                &format!("SELECT count(*) FROM pg_stat_activity WHERE datname = '{database}'"),
            );
            net.say(&format!(
                "no session idle in transaction ({all} sessions of the database left)"
            ));
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "sessions of {database} left idle in transaction after the run (their locks \
             held):\n{idle}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The final socket count against the undisturbed one (see
/// [`POOL_GROWTH`]).
fn assert_no_leaked_sockets(steady: usize, last: usize, net: &Network) {
    net.say(&format!(
        "sockets: {steady} while undisturbed, {last} at the end (at most {} allowed); {}",
        steady + POOL_GROWTH,
        net.counts()
    ));
    assert!(
        last <= steady + POOL_GROWTH,
        "the process holds {last} sockets after the faults, {steady} while it ran undisturbed: \
         more than its pools can grow by ({POOL_GROWTH}); connections left for dead were kept \
         ({})",
        net.counts()
    );
}

/// The counts of a run's result, without its metrics.
fn summary(result: &serde_json::Value) -> String {
    [
        "ok",
        "orders",
        "reservations",
        "confirmations",
        "emails",
        "pending",
        "dead_letters",
    ]
    .iter()
    .map(|key| format!("{key} {}", result[key]))
    .collect::<Vec<_>>()
    .join(", ")
}

/// The result of a run that placed `orders` orders and finished by
/// itself: passed its check, every order placed once.
fn assert_exact(output: &Output, orders: u64, what: &str) -> serde_json::Value {
    let result = check_result(output, what);
    assert_eq!(
        result["orders"].as_u64(),
        Some(orders),
        "{what}: every order placed, once: {result}"
    );
    result
}

// ---------------------------------------------------------------------------
// The tests

/// minishop on PostgreSQL through the proxy: a blackhole, a reset and
/// latency, each healed; after each heal new work within the limit; at the
/// end exact, no session idle in transaction, no socket leaked.
#[test]
fn postgres_minishop_recovers_from_a_blackhole_a_reset_and_latency() {
    let place = Place::postgres("quiet");
    let Place::Postgres { url, database } = &place else {
        unreachable!()
    };
    let base = std::env::var("TICKBOX_PG_URL").expect("TICKBOX_PG_URL");
    let net = Network::start(server_addr(&base, 5432));
    let proxied = through(url, &net.proxy);
    let orders = ORDERS.to_string();
    let mut shop = Shop::spawn(&[
        "--database-url",
        &proxied,
        "--orders",
        &orders,
        "--order-interval",
        ORDER_INTERVAL_MS,
        "--json",
    ]);
    await_warm(&mut shop, url, &net);
    // Undisturbed: the pools hold what the steady pace needs.
    let steady = shop.peak_sockets("while it ran undisturbed");
    net.say(&format!("sockets while undisturbed: {steady}"));

    hold(&mut shop, &net, Mode::Blackhole, BLACKHOLE);
    heal_and_measure(&mut shop, url, &net, "a 25 s blackhole");

    hold(&mut shop, &net, Mode::Reset, RESET);
    heal_and_measure(&mut shop, url, &net, "resets for 2 s");

    let before = Work::read(url, 0);
    hold(&mut shop, &net, Mode::Latency(LATENCY), LATENCY_PHASE);
    let during = Work::read(url, 0).orders - before.orders;
    net.say(&format!(
        "{during} orders placed under {LATENCY:?} of latency"
    ));
    // A slow network is not a dead one: deadlines must not give up on it.
    assert!(
        during > 0,
        "no order committed in {LATENCY_PHASE:?} of {LATENCY:?} latency each way; {}\nstderr:\n{}",
        net.counts(),
        shop.stderr_tail()
    );
    heal_and_measure(&mut shop, url, &net, "10 s of 50 ms latency");

    // Like with like: the process still places orders at the same pace,
    // as it did when the steady count was taken.
    let last = shop.peak_sockets("before it finished placing orders (raise ORDERS)");
    let output = shop.finish(FINISH_WITHIN, "minishop after the faults");
    let result = assert_exact(&output, ORDERS, "minishop after the faults");
    net.say(&format!("finished exact: {}", summary(&result)));
    assert_no_session_idle_in_transaction(&base, database, &net);
    assert_no_leaked_sockets(steady, last, &net);
}

/// minishop on PostgreSQL through the proxy, asked to stop (SIGTERM) during
/// a blackhole: it exits within its stop deadline; a `--resume` over the
/// healed network then finishes exact.
#[test]
fn postgres_minishop_stops_in_time_during_a_blackhole_and_resumes_exact() {
    let place = Place::postgres("quiet_stop");
    let Place::Postgres { url, database } = &place else {
        unreachable!()
    };
    let base = std::env::var("TICKBOX_PG_URL").expect("TICKBOX_PG_URL");
    let net = Network::start(server_addr(&base, 5432));
    let proxied = through(url, &net.proxy);
    // More orders than it will place: it is stopped.
    let mut shop = Shop::spawn(&[
        "--database-url",
        &proxied,
        "--orders",
        "1000000",
        "--order-interval",
        ORDER_INTERVAL_MS,
        "--json",
    ]);
    await_warm(&mut shop, url, &net);
    // Long enough for statements to be caught in the quiet network.
    hold(&mut shop, &net, Mode::Blackhole, Duration::from_secs(5));
    net.say("SIGTERM");
    let asked = Instant::now();
    shop.terminate();
    let stopped = match shop.wait_for(STOP_DEADLINE + WATCH_LATE_WORK) {
        Some(status) => {
            let took = asked.elapsed();
            net.say(&format!(
                "exited {:.1} s after SIGTERM ({status})",
                took.as_secs_f64()
            ));
            let output = shop.output(status);
            let json = String::from_utf8_lossy(&output.stdout).into_owned();
            (took <= STOP_DEADLINE && status.code() == Some(130))
                .then_some(())
                .ok_or(format!(
                    "the process took {:.1} s to exit after SIGTERM ({status}; the deadline is \
                 {STOP_DEADLINE:?})\nstdout:\n{json}\nstderr:\n{}",
                    took.as_secs_f64(),
                    String::from_utf8_lossy(&output.stderr)
                ))
        }
        None => {
            let tail = shop.stderr_tail();
            shop.kill();
            net.say("still running: killed");
            Err(format!(
                "the process had not exited {:.0} s after SIGTERM (the deadline is \
                 {STOP_DEADLINE:?}): killed it\nstderr:\n{tail}",
                asked.elapsed().as_secs_f64()
            ))
        }
    };

    // The network heals; what the stopped run left, a resume finishes.
    // Run whether or not the stop was in time: a failure says both.
    net.set(Mode::Pass);
    let resumed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let resumed = Shop::spawn(&["--database-url", &proxied, "--resume", "--json"]);
        let output = resumed.finish(FINISH_WITHIN, "the --resume after the stop");
        let result = check_result(&output, "the --resume after the stop");
        net.say(&format!("the resume finished exact: {}", summary(&result)));
        assert_no_session_idle_in_transaction(&base, database, &net);
    }));
    match (stopped, resumed) {
        (Ok(()), Ok(())) => {}
        (Err(stop), Ok(())) => panic!("{stop}\n(the --resume afterwards finished exact)"),
        (Ok(()), Err(resume)) => std::panic::resume_unwind(resume),
        (Err(stop), Err(resume)) => panic!(
            "{stop}\n\nthen the --resume failed too (the database's sessions: {}): {}",
            sessions(url),
            panic_message(resume.as_ref())
        ),
    }
}

/// What a caught panic said.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<String>(), panic.downcast_ref::<&str>()) {
        (Some(message), _) => message.clone(),
        (None, Some(message)) => message.to_string(),
        (None, None) => "a panic without a message".into(),
    }
}

/// minishop over RabbitMQ through the proxy (its databases on PostgreSQL,
/// reached directly): a blackhole between it and the broker, healed; the
/// whole flow handled again within the limit; at the end exact, no socket
/// leaked.
#[cfg(feature = "amqp")]
#[test]
fn amqp_minishop_recovers_from_a_blackhole_between_it_and_the_broker() {
    use crate::support::{amqp_url, broker_shared, delete_from_broker};

    /// The run's exchange and queues go with it.
    struct Namespace(String);
    impl Drop for Namespace {
        fn drop(&mut self) {
            delete_from_broker(&format!("tickbox.{}", self.0));
        }
    }

    /// Orders placed: a blackhole to the broker does not stall placing
    /// (orders commit in the database, their messages wait in the outbox),
    /// so the placing must outlast the blackhole and the recovery.
    const ORDERS_OVER_AMQP: u64 = 1400;

    let _broker = broker_shared();
    let namespace = Namespace(format!("minishop-test.quiet.{:08x}", fastrand::u32(..)));
    let place = Place::postgres("quiet_amqp");
    let Place::Postgres { url, .. } = &place else {
        unreachable!()
    };
    let broker = amqp_url();
    let net = Network::start(server_addr(&broker, 5672));
    let proxied = through(&broker, &net.proxy);
    let orders = ORDERS_OVER_AMQP.to_string();
    let mut shop = Shop::spawn(&[
        "--database-url",
        url,
        "--transport",
        "amqp",
        "--amqp-url",
        &proxied,
        "--amqp-namespace",
        &namespace.0,
        "--orders",
        &orders,
        "--order-interval",
        ORDER_INTERVAL_MS,
        "--json",
    ]);
    await_warm(&mut shop, url, &net);
    let steady = shop.peak_sockets("while it ran undisturbed");
    net.say(&format!("sockets while undisturbed: {steady}"));

    hold(&mut shop, &net, Mode::Blackhole, BLACKHOLE);
    heal_and_measure(&mut shop, url, &net, "a 25 s blackhole");

    let last = shop.peak_sockets("before it finished placing orders (raise ORDERS)");
    let output = shop.finish(FINISH_WITHIN, "minishop over amqp after the blackhole");
    let result = assert_exact(
        &output,
        ORDERS_OVER_AMQP,
        "minishop over amqp after the blackhole",
    );
    assert_eq!(result["transport"], "amqp", "{result}");
    net.say(&format!("finished exact: {}", summary(&result)));
    assert_no_leaked_sockets(steady, last, &net);
}
