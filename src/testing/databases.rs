//! Throw-away databases for one test: a fresh SQLite file per module in a
//! temporary directory, or a fresh PostgreSQL schema per module, dropped at
//! the end.

use crate::bus::builder::BusBuilder;
use crate::module::actor::Module;
use crate::module::builder::ModuleBuilder;
use crate::retry::RetryPolicy;
use crate::store::backend::Backend;
use std::time::Duration;

/// Retries that take milliseconds, for tests of retries and dead letters:
/// 1 ms, doubling up to 20 ms, five attempts.
pub fn fast_retries() -> RetryPolicy {
    RetryPolicy {
        max_attempts: Some(5),
        initial_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(20),
        ..RetryPolicy::default()
    }
}

/// Where one test keeps its modules' databases: each module gets a fresh
/// one, and all of them are removed when this is dropped.
///
/// ```no_run
/// # async fn example() -> tickbox::Result<()> {
/// use tickbox::{testing::TestDatabases, Sqlite};
///
/// let dbs = TestDatabases::sqlite();
/// let orders = dbs.module::<Sqlite>("orders").start().await?;
/// let bus = dbs.bus::<Sqlite>().module(&orders).start().await?;
/// # let _ = bus; Ok(()) }
/// ```
pub struct TestDatabases {
    /// Where they are.
    place: Place,
    /// Makes this test's names unique.
    prefix: String,
}

/// SQLite files or PostgreSQL schemas.
enum Place {
    /// A temporary directory of SQLite files, removed on drop.
    Sqlite(tempfile::TempDir),
    /// Schemas on the PostgreSQL server at this URL, dropped on drop.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    Postgres(String),
}

impl TestDatabases {
    /// A fresh SQLite file per module, in a temporary directory.
    pub fn sqlite() -> Self {
        TestDatabases {
            place: Place::Sqlite(tempfile::tempdir().expect("a temporary directory")),
            prefix: prefix(),
        }
    }

    /// A fresh schema per module (`t<random>_<module>`) on the PostgreSQL
    /// server at `url`, dropped with every table in it at the end.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(url: impl Into<String>) -> Self {
        TestDatabases {
            place: Place::Postgres(url.into()),
            prefix: prefix(),
        }
    }

    /// The builder of module `name` in a database of its own (a small pool
    /// on PostgreSQL, so that tests can run side by side on one server).
    /// Ask for the backend the place holds (`Sqlite` for
    /// [`TestDatabases::sqlite`]): another fails when the module starts.
    pub fn module<B: Backend>(&self, name: &str) -> ModuleBuilder<B> {
        match &self.place {
            Place::Sqlite(dir) => {
                let path = dir.path().join(format!("{name}.db"));
                Module::<B>::builder(name, path.to_string_lossy())
            }
            Place::Postgres(url) => {
                let mut builder = Module::<B>::builder(name, url.clone()).pool_size(4);
                builder.settings.schema = Some(self.schema(name));
                builder
            }
        }
    }

    /// The schema module `name` gets on PostgreSQL.
    pub fn schema(&self, name: &str) -> String {
        format!("{}_{name}", self.prefix).to_lowercase()
    }

    /// A bus builder for tests: [`fast_retries`], and a scan every 100 ms
    /// (what another process commits on SQLite is found that fast).
    pub fn bus<B: Backend>(&self) -> BusBuilder<B> {
        crate::bus::actor::Bus::builder()
            .retry_policy(fast_retries())
            .scan_interval(Duration::from_millis(100))
    }
}

/// How long dropping a test's schemas may take: the statement's own lock
/// timeout (5 s) and the connection's time.
#[cfg(feature = "postgres")]
const DROP_DEADLINE: Duration = Duration::from_secs(15);

/// A prefix no other test run shares.
fn prefix() -> String {
    format!("t{:08x}", fastrand::u32(..))
}

/// Drops the PostgreSQL schemas (all named after the prefix); the SQLite
/// directory removes itself. A bus left running would hold locks: after
/// five seconds the drop gives up (the next run's names differ anyway).
impl Drop for TestDatabases {
    fn drop(&mut self) {
        #[cfg(feature = "postgres")]
        if let Place::Postgres(url) = &self.place {
            let sql = format!(
                "SET lock_timeout = '5s'; SET client_min_messages = warning; \
                 DO $$DECLARE s text; BEGIN \
                 FOR s IN SELECT nspname FROM pg_namespace WHERE nspname LIKE '{}\\_%' LOOP \
                 EXECUTE format('DROP SCHEMA %I CASCADE', s); END LOOP; END$$;",
                self.prefix
            );
            let url = url.clone();
            // Its own thread and runtime: a drop cannot await, and may run
            // inside another runtime.
            let dropped = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                // Within a deadline: a server out of reach must not hold
                // the test (its schemas are left for later).
                let dropping = async {
                    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .map_err(|e| e.to_string())?;
                    tokio::spawn(connection);
                    client.batch_execute(&sql).await.map_err(|e| e.to_string())
                };
                runtime.block_on(async {
                    tokio::time::timeout(DROP_DEADLINE, dropping)
                        .await
                        .unwrap_or_else(|_| Err(format!("no answer within {DROP_DEADLINE:?}")))
                })
            })
            .join();
            if let Ok(Err(error)) = dropped {
                tracing::warn!(%error, prefix = %self.prefix, "dropping a test's schemas failed");
            }
        }
    }
}
