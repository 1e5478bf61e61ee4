//! What the tool's tests share: a module database a test module creates and
//! fills (by hand-written rows where a state is hard to reach otherwise), and
//! running the `tickbox` binary on it as a separate process.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tickbox::diesel;
use tickbox::diesel_async::SimpleAsyncConnection;
use tickbox::{
    Backend, Bus, Delivery, Handler, HandlerError, Message, ModuleBuilder, ModuleHandle, Tx,
};
use uuid::Uuid;

/// 2026-01-01T00:00:00Z in microseconds since the Unix epoch.
pub(crate) const NEW_YEAR_US: i64 = 1_767_225_600_000_000;

/// How long a test waits for a condition before failing.
pub(crate) const WAIT: Duration = Duration::from_secs(20);

pub(crate) const DAY: Duration = Duration::from_secs(24 * 3600);

/// The message the test module publishes and handles.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct CliPing {
    n: u64,
}

impl Message for CliPing {
    const TOPIC: &'static str = "cli.ping";
}

impl CliPing {
    pub(crate) fn new(n: u64) -> Self {
        CliPing { n }
    }
}

/// A handler that only succeeds: its inbox row shows it ran.
pub(crate) struct Accept;

/// A handler that refuses, for good, message number `n` while the switch is
/// on, and accepts every other.
pub(crate) struct Refuse {
    pub(crate) n: u64,
    pub(crate) switch: &'static std::sync::atomic::AtomicBool,
}

impl<B: Backend> Handler<B> for Refuse {
    type Message = CliPing;

    async fn handle(
        &self,
        _tx: &mut Tx<B>,
        message: CliPing,
        _delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        if message.n == self.n && self.switch.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(HandlerError::permanent(HandlerError::msg("refused")));
        }
        Ok(())
    }
}

impl<B: Backend> Handler<B> for Accept {
    type Message = CliPing;

    async fn handle(
        &self,
        _tx: &mut Tx<B>,
        _message: CliPing,
        _delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        Ok(())
    }
}

/// Where one test keeps its module database.
pub(crate) struct Db {
    /// SQLite: the directory of the database file, removed on drop.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) dir: tempfile::TempDir,
    /// PostgreSQL: the server URL.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) pg_url: Option<String>,
    /// MariaDB/MySQL: the server URL (no database: each module has its
    /// own, named by [`Db::schema`]).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) mysql_url: Option<String>,
    /// On a server: a schema (PostgreSQL) or database (MariaDB, MySQL) no
    /// other test uses.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) schema: String,
}

impl Db {
    pub(crate) fn new() -> Self {
        Db {
            dir: tempfile::tempdir().expect("a temporary directory"),
            pg_url: None,
            mysql_url: None,
            schema: format!("cli_{:08x}", fastrand::u32(..)),
        }
    }

    /// The PostgreSQL tests need `TICKBOX_PG_URL`; without it they fail.
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres() -> Self {
        let url = std::env::var("TICKBOX_PG_URL").expect(
            "the PostgreSQL tests need TICKBOX_PG_URL, e.g. postgres://postgres@127.0.0.1:5432/test",
        );
        let mut db = Db::new();
        db.pg_url = Some(url);
        db
    }

    /// The MariaDB/MySQL tests need `TICKBOX_MYSQL_URL` (the server; each
    /// module gets a database of its own on it); without it they fail.
    #[cfg(feature = "mysql")]
    pub(crate) fn mysql() -> Self {
        let url = std::env::var("TICKBOX_MYSQL_URL").expect(
            "the MariaDB/MySQL tests need TICKBOX_MYSQL_URL, e.g. mysql://root@127.0.0.1:3306",
        );
        let mut db = Db::new();
        db.mysql_url = Some(url);
        db
    }
}

/// On a server: drops the test's schemas or databases (its own and those
/// it makes beside it, named after it: `_empty`, one per module of an
/// application), so that a run leaves the server as it found it.
impl Drop for Db {
    fn drop(&mut self) {
        if let Some(url) = &self.mysql_url {
            drop_mysql_databases(url, &self.schema);
        }
        let Some(url) = &self.pg_url else { return };
        let sql = format!(
            "SET lock_timeout = '5s'; SET client_min_messages = warning; \
             DO $$ DECLARE s text; BEGIN \
             FOR s IN SELECT nspname FROM pg_namespace \
             WHERE nspname = '{0}' OR nspname LIKE '{0}\\_%' LOOP \
             EXECUTE format('DROP SCHEMA %I CASCADE', s); END LOOP; END $$;",
            self.schema
        );
        let _ = std::process::Command::new("psql")
            .args([url.as_str(), "-qc", &sql])
            .stdout(std::process::Stdio::null())
            .status();
    }
}

/// MariaDB/MySQL: drops the databases named `prefix` or `prefix_…` on the
/// server at `url`, with the server's own client (as PostgreSQL's are
/// dropped with psql).
fn drop_mysql_databases(url: &str, prefix: &str) {
    let Ok(url) = url::Url::parse(url) else {
        return;
    };
    let mut client = vec![
        "--protocol=tcp".to_string(),
        "-h".into(),
        url.host_str().unwrap_or("127.0.0.1").into(),
        "-P".into(),
        url.port().unwrap_or(3306).to_string(),
        "-u".into(),
        url.username().into(),
        "-N".into(),
        "-B".into(),
    ];
    if let Some(password) = url.password() {
        client.push(format!("--password={password}"));
    }
    let mysql = |sql: String| {
        std::process::Command::new("mysql")
            .args(&client)
            .args(["-e", &sql])
            .stderr(std::process::Stdio::null())
            .output()
            .ok()
    };
    let Some(listed) = mysql(format!(
        "SELECT schema_name FROM information_schema.schemata \
         WHERE schema_name = '{prefix}' OR schema_name LIKE '{prefix}\\_%'"
    )) else {
        return;
    };
    for database in String::from_utf8_lossy(&listed.stdout).lines() {
        mysql(format!("DROP DATABASE IF EXISTS `{database}`"));
    }
}

/// A backend the tool is tested on.
pub(crate) trait CliBackend: Backend {
    /// A builder for the test's module, `orders`.
    fn module(db: &Db) -> ModuleBuilder<Self>;

    /// The database URL to give the tool.
    fn url(db: &Db) -> String;

    /// Options to give the tool besides the URL (the schema).
    fn extra_args(db: &Db) -> Vec<String>;

    /// A builder for module `name` of an application of several, whose
    /// database is at `place`: SQLite `DIR/PLACE.db`, on a server the
    /// schema or database `<the test's schema>_PLACE` (so never named as
    /// the module).
    fn module_at(db: &Db, place: &str, name: &str) -> ModuleBuilder<Self>;

    /// The tool's options naming the databases at `places`: one
    /// --database-url each on SQLite, the server's URL and one --schema
    /// each on a server.
    fn places_args(db: &Db, places: &[&str]) -> Vec<String>;

    /// The tool's options naming every database of an application made
    /// with [`CliBackend::module_at`] at `places`: on SQLite its data
    /// directory (--data-dir), as minishop lays it out.
    fn application_args(db: &Db, places: &[&str]) -> Vec<String>;

    /// A UUID as an SQL literal.
    fn uuid_literal(id: Uuid) -> String;

    /// The `text` column of the rows `sql` selects, read on the module's
    /// database.
    async fn texts(module: &ModuleHandle<Self>, sql: &'static str) -> Vec<String>;
}

/// A row of `SELECT … AS text`.
#[derive(diesel::QueryableByName)]
struct Text {
    #[diesel(sql_type = diesel::sql_types::Text)]
    text: String,
}

/// [`CliBackend::texts`], for a backend whose connection diesel knows.
macro_rules! texts {
    ($module:expr, $sql:expr) => {{
        use tickbox::diesel_async::RunQueryDsl as _;
        $module
            .read(async move |tx| {
                let rows: Vec<Text> = diesel::sql_query($sql).load(tx.conn()).await?;
                Ok::<_, tickbox::Error>(rows.into_iter().map(|row| row.text).collect())
            })
            .await
            .expect("the query runs")
    }};
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

    fn module_at(db: &Db, place: &str, name: &str) -> ModuleBuilder<Self> {
        tickbox::Module::builder(name, sqlite_file(db, place))
    }

    fn places_args(db: &Db, places: &[&str]) -> Vec<String> {
        places
            .iter()
            .flat_map(|place| ["--database-url".to_string(), sqlite_file(db, place)])
            .collect()
    }

    fn application_args(db: &Db, _places: &[&str]) -> Vec<String> {
        let dir = db.dir.path().to_str().expect("a UTF-8 path");
        vec!["--data-dir".into(), dir.into()]
    }

    fn uuid_literal(id: Uuid) -> String {
        hex_literal(id)
    }

    async fn texts(module: &ModuleHandle<Self>, sql: &'static str) -> Vec<String> {
        texts!(module, sql)
    }
}

#[cfg(feature = "postgres")]
impl CliBackend for tickbox::Postgres {
    fn module(db: &Db) -> ModuleBuilder<Self> {
        on_server::module(Self::url(db), db)
    }

    fn url(db: &Db) -> String {
        db.pg_url.clone().expect("Db::postgres()")
    }

    fn extra_args(db: &Db) -> Vec<String> {
        on_server::extra_args(db)
    }

    fn module_at(db: &Db, place: &str, name: &str) -> ModuleBuilder<Self> {
        on_server::module_at(Self::url(db), db, place, name)
    }

    fn places_args(db: &Db, places: &[&str]) -> Vec<String> {
        on_server::places_args(Self::url(db), db, places)
    }

    fn application_args(db: &Db, places: &[&str]) -> Vec<String> {
        Self::places_args(db, places)
    }

    fn uuid_literal(id: Uuid) -> String {
        format!("'{id}'")
    }

    async fn texts(module: &ModuleHandle<Self>, sql: &'static str) -> Vec<String> {
        texts!(module, sql)
    }
}

/// MariaDB/MySQL: the server's URL without a database; each module's
/// database is named by `--schema` (`ModuleBuilder::schema`), as
/// PostgreSQL's schemas are.
#[cfg(feature = "mysql")]
impl CliBackend for tickbox::Mysql {
    fn module(db: &Db) -> ModuleBuilder<Self> {
        on_server::module(Self::url(db), db)
    }

    fn url(db: &Db) -> String {
        db.mysql_url.clone().expect("Db::mysql()")
    }

    fn extra_args(db: &Db) -> Vec<String> {
        on_server::extra_args(db)
    }

    fn module_at(db: &Db, place: &str, name: &str) -> ModuleBuilder<Self> {
        on_server::module_at(Self::url(db), db, place, name)
    }

    fn places_args(db: &Db, places: &[&str]) -> Vec<String> {
        on_server::places_args(Self::url(db), db, places)
    }

    fn application_args(db: &Db, places: &[&str]) -> Vec<String> {
        Self::places_args(db, places)
    }

    fn uuid_literal(id: Uuid) -> String {
        hex_literal(id)
    }

    async fn texts(module: &ModuleHandle<Self>, sql: &'static str) -> Vec<String> {
        texts!(module, sql)
    }
}

/// The modules and options of a server backend, where one URL holds every
/// module, each in the place `--schema` names (a PostgreSQL schema, a
/// MariaDB/MySQL database): the test's own, [`Db::schema`], or one named
/// after it per module of an application.
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod on_server {
    use super::Db;
    use tickbox::{ModuleBuilder, Schemas};

    /// The test's module, `orders`, in the test's place.
    pub(crate) fn module<B: Schemas>(url: String, db: &Db) -> ModuleBuilder<B> {
        tickbox::Module::builder("orders", url).schema(db.schema.clone())
    }

    /// `--schema` naming the test's place.
    pub(crate) fn extra_args(db: &Db) -> Vec<String> {
        vec!["--schema".into(), db.schema.clone()]
    }

    /// Module `name` in the place `<the test's schema>_PLACE`.
    pub(crate) fn module_at<B: Schemas>(
        url: String,
        db: &Db,
        place: &str,
        name: &str,
    ) -> ModuleBuilder<B> {
        tickbox::Module::builder(name, url).schema(place_of(db, place))
    }

    /// The server's URL and one `--schema` per place.
    pub(crate) fn places_args(url: String, db: &Db, places: &[&str]) -> Vec<String> {
        let mut args = vec!["--database-url".to_string(), url];
        for place in places {
            args.extend(["--schema".to_string(), place_of(db, place)]);
        }
        args
    }

    /// The schema or database of `place`.
    fn place_of(db: &Db, place: &str) -> String {
        format!("{}_{place}", db.schema)
    }
}

/// A UUID as a 16-byte hexadecimal literal (SQLite's BLOB, MariaDB's and
/// MySQL's BINARY(16)).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
fn hex_literal(id: Uuid) -> String {
    format!("x'{}'", id.simple())
}

/// SQLite: the path of the database file `PLACE.db` in the test's
/// directory.
#[cfg(feature = "sqlite")]
fn sqlite_file(db: &Db, place: &str) -> String {
    let path = db.dir.path().join(format!("{place}.db"));
    path.to_str().expect("a UTF-8 path").to_string()
}

// ---------------------------------------------------------------------------
// Helpers

/// What one run of the tool printed and how it exited.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// Asserts success and returns stdout.
    #[track_caller]
    pub(crate) fn ok(&self) -> &str {
        assert_eq!(self.code, 0, "expected success: {self:#?}");
        assert!(self.stderr.is_empty(), "nothing on stderr: {self:#?}");
        &self.stdout
    }

    /// Asserts success and parses stdout as one JSON document.
    #[track_caller]
    pub(crate) fn json(&self) -> Value {
        let out = self.ok();
        assert_eq!(out.lines().count(), 1, "one line of JSON: {self:#?}");
        serde_json::from_str(out).unwrap_or_else(|e| panic!("JSON ({e}): {self:#?}"))
    }

    /// Asserts the exit code, one `error: ` message on stderr containing
    /// `needle`, nothing on stdout and no panic.
    #[track_caller]
    pub(crate) fn fails(&self, code: i32, needle: &str) {
        assert_eq!(self.code, code, "exit code {code}: {self:#?}");
        assert!(self.stdout.is_empty(), "nothing on stdout: {self:#?}");
        assert!(self.stderr.starts_with("error: "), "{self:#?}");
        assert!(self.stderr.contains(needle), "`{needle}` in: {self:#?}");
        assert!(!self.stderr.contains("panicked"), "{self:#?}");
        assert!(!self.stderr.contains("{ "), "no Debug dump: {self:#?}");
    }
}

/// Runs the tool with `args` and without `TICKBOX_DATABASE_URL`.
pub(crate) async fn run_cli(args: Vec<String>) -> Run {
    run_cli_with_env(args, None).await
}

/// Runs the tool with `args` and `TICKBOX_DATABASE_URL` set to `env_url`
/// (or unset).
pub(crate) async fn run_cli_with_env(args: Vec<String>, env_url: Option<String>) -> Run {
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
pub(crate) async fn on<B: CliBackend>(db: &Db, args: &[&str]) -> Run {
    let mut all = vec!["--database-url".to_string(), B::url(db)];
    all.extend(B::extra_args(db));
    all.extend(args.iter().map(|a| a.to_string()));
    run_cli(all).await
}

/// `--json status`.
pub(crate) async fn status<B: CliBackend>(db: &Db) -> Value {
    on::<B>(db, &["--json", "status"]).await.json()
}

/// Runs SQL on the module's database in a transaction.
pub(crate) async fn execute<B: CliBackend>(module: &ModuleHandle<B>, sql: String) {
    module
        .transaction(async move |tx| {
            tx.conn().batch_execute(&sql).await?;
            Ok::<_, tickbox::Error>(())
        })
        .await
        .expect("SQL runs");
}

/// Writes an outbox row by hand; delivered at `delivered_at_us` if given.
pub(crate) async fn insert_outbox<B: CliBackend>(
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
pub(crate) async fn insert_inbox<B: CliBackend>(
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
pub(crate) struct Dead<'a> {
    pub(crate) id: Uuid,
    pub(crate) handler: &'a str,
    pub(crate) topic: &'a str,
    pub(crate) payload: &'a str,
    pub(crate) reason: &'a str,
    pub(crate) attempts: i32,
    pub(crate) created_at_us: i64,
    pub(crate) dead_at_us: i64,
}

impl Dead<'_> {
    /// A dead letter of a `cli.ping` message for `orders.ping`.
    pub(crate) fn ping(id: Uuid) -> Dead<'static> {
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
pub(crate) async fn insert_dead<B: CliBackend>(module: &ModuleHandle<B>, dead: &Dead<'_>) {
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
pub(crate) fn uuid_ago(ago: Duration) -> Uuid {
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
pub(crate) fn micros_ago(ago: Duration) -> i64 {
    (SystemTime::now() - ago)
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

/// Waits until `condition` holds, checking every 20 ms, for at most
/// [`WAIT`]; panics with `what` if it never does.
pub(crate) async fn eventually<F, Fut>(what: &str, mut condition: F)
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
pub(crate) async fn orders<B: CliBackend>(db: &Db) -> ModuleHandle<B> {
    B::module(db)
        .publishes::<CliPing>()
        .handler("orders.ping", Accept)
        .start()
        .await
        .expect("the orders module starts")
}

/// The test's module with a second handler of its own messages,
/// `orders.audit`: two subscriptions to its outbox.
pub(crate) async fn orders_with_audit<B: CliBackend>(db: &Db) -> ModuleHandle<B> {
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
pub(crate) async fn subscribe_and_stop<B: CliBackend>(module: &ModuleHandle<B>) {
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
pub(crate) async fn insert_done<B: CliBackend>(module: &ModuleHandle<B>, id: Uuid, handler: &str) {
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
pub(crate) async fn subscriptions<B: CliBackend>(db: &Db) -> Vec<Value> {
    match on::<B>(db, &["--json", "subscriptions"]).await.json() {
        Value::Array(all) => all,
        other => panic!("an array: {other}"),
    }
}

/// Instantiates generic tests for one backend: each `name` becomes an
/// actix test running `super::name::<Backend>(db)`.
macro_rules! backend_cases {
    ($backend:ty, $db:expr, [$($name:ident),* $(,)?]) => {
        $(
            #[actix::test]
            async fn $name() {
                super::$name::<$backend>($db).await;
            }
        )*
    };
}
pub(crate) use backend_cases;
