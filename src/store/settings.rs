//! Where and how a module opens its database.

use crate::redact::SecretUrl;
use crate::store::deadline::Deadlines;
use std::time::Duration;

/// Where and how a module opens its database.
#[derive(Debug, Clone)]
pub struct StoreSettings {
    /// The module that owns the database, for error messages.
    pub(crate) module: String,
    /// An SQLite path (or `sqlite://` URL) or a `postgres://` URL; it shows
    /// itself redacted.
    pub(crate) url: SecretUrl,
    /// PostgreSQL only: the schema holding the module's tables.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) schema: Option<String>,
    /// Connections in the module's pool.
    pub(crate) pool_size: usize,
    /// How long a checkout waits for a free connection.
    pub(crate) checkout_timeout: Duration,
    /// How long calls to the database may take.
    pub(crate) deadlines: Deadlines,
    /// The longest a transaction of this module may take, its handlers'
    /// own deadlines included: the server's limits on a session's statement
    /// and on its idleness inside a transaction are set just above it.
    pub(crate) longest_transaction: Duration,
    /// Run tickbox's migrations at open (false to attach to an existing
    /// database, as an operator's tool does).
    pub(crate) migrate: bool,
    /// The application's own migrations for this module's database, run
    /// after tickbox's.
    pub(crate) app_migrations: Option<MigrationSet>,
}

/// A set of embedded migrations (tickbox's, or the application's), as a
/// migration source diesel's harness can take (it takes its source by
/// value, and embedded migrations are not `Copy`).
#[derive(Clone, Copy)]
pub(crate) struct MigrationSet(pub(crate) &'static diesel_migrations::EmbeddedMigrations);

impl std::fmt::Debug for MigrationSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MigrationSet")
    }
}

impl<DB: diesel::backend::Backend> diesel::migration::MigrationSource<DB> for MigrationSet {
    fn migrations(
        &self,
    ) -> diesel::migration::Result<Vec<Box<dyn diesel::migration::Migration<DB>>>> {
        diesel::migration::MigrationSource::<DB>::migrations(self.0)
    }
}

/// Where a module's commits wake buses in other processes: a PostgreSQL
/// notification channel, one per outbox (per database and schema), and the
/// URL a bus's listener connects to. SQLite modules have none.
#[derive(Debug, Clone)]
pub struct WakeupChannel {
    /// The module's database URL, for the listener's own connection.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) url: SecretUrl,
    /// The channel name, at most 63 bytes, used as is (`pg_notify` takes it
    /// as text; `LISTEN` needs it quoted).
    pub(crate) channel: String,
}
