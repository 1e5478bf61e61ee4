//! Throw-away databases for one test: a fresh database per module (an
//! SQLite file in a temporary directory, a PostgreSQL schema), removed at
//! the end, the way each backend makes and removes them
//! ([`ScratchDatabases`](crate::store::scratch::ScratchDatabases)).

use crate::bus::builder::BusBuilder;
use crate::module::actor::Module;
use crate::module::builder::ModuleBuilder;
use crate::retry::RetryPolicy;
use crate::store::backend::Backend;
use crate::store::scratch::{scratch_name, ScratchModule};
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
    /// A temporary directory (SQLite's files) or a server's URL.
    place: String,
    /// The temporary directory, removed on drop.
    _directory: Option<tempfile::TempDir>,
    /// Makes this test's names unique.
    prefix: String,
    /// Where the backend of the place puts a module.
    scratch_module: fn(&str, &str, &str) -> ScratchModule,
    /// How it removes the test's databases.
    drop_scratch: fn(&str, &str) -> Result<(), String>,
}

impl TestDatabases {
    /// A fresh SQLite file per module, in a temporary directory.
    #[cfg(feature = "sqlite")]
    pub fn sqlite() -> Self {
        let directory = tempfile::tempdir().expect("a temporary directory");
        let place = directory.path().to_string_lossy().into_owned();
        let mut databases = Self::on::<crate::store::sqlite::Sqlite>(place);
        databases._directory = Some(directory);
        databases
    }

    /// A fresh schema per module (`t<random>_<module>`) on the PostgreSQL
    /// server at `url`, dropped with every table in it at the end.
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(url: impl Into<String>) -> Self {
        Self::on::<crate::store::postgres::Postgres>(url.into())
    }

    /// Fresh databases on the server at `url`, made and removed the way
    /// backend `B` does ([`TestDatabases::postgres`] is
    /// `on::<Postgres>(url)`).
    pub fn on<B: Backend>(url: impl Into<String>) -> Self {
        TestDatabases {
            place: url.into(),
            _directory: None,
            prefix: prefix(),
            scratch_module: B::scratch_module,
            drop_scratch: B::drop_scratch,
        }
    }

    /// The builder of module `name` in a database of its own (a small pool
    /// on a server, so that tests can run side by side on it). Ask for the
    /// backend the place holds (`Sqlite` for [`TestDatabases::sqlite`]):
    /// another fails when the module starts.
    pub fn module<B: Backend>(&self, name: &str) -> ModuleBuilder<B> {
        let scratch = (self.scratch_module)(&self.place, &self.prefix, name);
        let mut builder = Module::<B>::builder(name, scratch.url);
        if let Some(size) = scratch.pool_size {
            builder = builder.pool_size(size);
        }
        builder.settings.schema = scratch.schema;
        builder
    }

    /// The schema module `name` gets on PostgreSQL.
    pub fn schema(&self, name: &str) -> String {
        scratch_name(&self.prefix, name)
    }

    /// A bus builder for tests: [`fast_retries`], and a scan every 100 ms
    /// (what another process commits on SQLite is found that fast).
    pub fn bus<B: Backend>(&self) -> BusBuilder<B> {
        crate::bus::actor::Bus::builder()
            .retry_policy(fast_retries())
            .scan_interval(Duration::from_millis(100))
    }
}

/// A prefix no other test run shares.
fn prefix() -> String {
    format!("t{:08x}", fastrand::u32(..))
}

/// Drops the test's databases (all named after the prefix); a temporary
/// directory removes itself. A bus left running would hold locks: the drop
/// gives up after its deadline (the next run's names differ anyway).
impl Drop for TestDatabases {
    fn drop(&mut self) {
        if let Err(error) = (self.drop_scratch)(&self.place, &self.prefix) {
            tracing::warn!(%error, prefix = %self.prefix, "dropping a test's databases failed");
        }
    }
}
