//! Storage: everything tickbox says to a database, and the only place
//! that writes SQL.
//!
//! - `contract`: [`Store`](contract::Store), what a backend is —
//!   connections, transactions, notifications, and one way to run a
//!   statement ([`sql::Sql`]).
//! - One file per concept, each declaring that concept's statements as a
//!   trait of named operations, documented once: `outbox`, `subscriptions`,
//!   `inbox`, `ordering`, `journal`, `dead_letters`, `retention`,
//!   `catalog`, and `scratch` (a test's throw-away databases). A statement
//!   that reads the same in standard SQL on every backend is the trait's
//!   default; the rest each backend states.
//! - One folder per backend (`sqlite/`, `postgres/`): its `Store`, its
//!   connection quirks, and a file per concept implementing that concept's
//!   trait, overriding what its dialect spells differently.
//! - What every backend shares: `schema` (the tables and rows), `database`
//!   (a module's pool, its calls and write turn), `deadline`, `pool`,
//!   `settings`, `migrations`; `backend`: the public, sealed
//!   [`Backend`](crate::Backend) that gathers the traits.
//!
//! # Adding a backend
//!
//! A new folder beside `sqlite/` and `postgres/` with the same files: a
//! type implementing [`Backend`](crate::Backend) and `Store` in `mod.rs`,
//! and each concept trait in its file (copy nothing: only what its dialect
//! spells differently from a trait's default is stated); its migrations in
//! `migrations/<backend>/`; a Cargo feature; and its lines in the lists
//! below (module, public types, transient words, row bound). The test
//! suite then runs on it by one more `suite!` line in `tests/lib.rs`.

pub(crate) mod backend;
pub(crate) mod catalog;
pub(crate) mod contract;
pub(crate) mod database;
pub(crate) mod dead_letters;
pub(crate) mod deadline;
pub(crate) mod ids;
pub(crate) mod inbox;
pub(crate) mod journal;
pub(crate) mod migrations;
pub(crate) mod ordering;
pub(crate) mod outbox;
pub(crate) mod pool;
pub(crate) mod retention;
pub(crate) mod schema;
pub(crate) mod scratch;
pub(crate) mod settings;
pub(crate) mod sql;
pub(crate) mod subscriptions;

// The backends. Adding one is a folder of its own beside these and its
// lines in each list below; nothing else outside its folder names it.

#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

#[cfg(not(any(feature = "sqlite", feature = "postgres", feature = "mysql")))]
compile_error!(
    "tickbox needs a backend: enable the `sqlite`, `postgres` or `mysql` feature (or several)"
);

/// The backends' public types, re-exported by the crate root.
pub(crate) mod backends {
    #[cfg(feature = "mysql")]
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub use super::mysql::Mysql;
    #[cfg(feature = "postgres")]
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub use super::postgres::Postgres;
    #[cfg(feature = "sqlite")]
    #[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
    pub use super::sqlite::{Sqlite, SqliteConnection};
}

/// The words by which an enabled backend reports a failure worth retrying
/// when it gives no error code for it (see
/// [`Store::TRANSIENT_MESSAGES`](contract::Store::TRANSIENT_MESSAGES)).
pub(crate) const TRANSIENT_MESSAGES: &[&[&str]] = &[
    #[cfg(feature = "sqlite")]
    <sqlite::Sqlite as contract::Store>::TRANSIENT_MESSAGES,
    #[cfg(feature = "postgres")]
    <postgres::Postgres as contract::Store>::TRANSIENT_MESSAGES,
    #[cfg(feature = "mysql")]
    <mysql::Mysql as contract::Store>::TRANSIENT_MESSAGES,
];

/// A row an [`Sql`](sql::Sql) statement returns, readable on every enabled
/// backend (written out so that code generic over the backend can name it).
pub trait Row: Send + 'static + SqliteRow + PgRow + MysqlRow {}

impl<T: Send + 'static + SqliteRow + PgRow + MysqlRow> Row for T {}

/// Readable from SQLite (when the `sqlite` feature is on).
#[cfg(feature = "sqlite")]
pub trait SqliteRow: diesel::QueryableByName<diesel::sqlite::Sqlite> {}
#[cfg(feature = "sqlite")]
impl<T: diesel::QueryableByName<diesel::sqlite::Sqlite>> SqliteRow for T {}
#[cfg(not(feature = "sqlite"))]
pub trait SqliteRow {}
#[cfg(not(feature = "sqlite"))]
impl<T> SqliteRow for T {}

/// Readable from PostgreSQL (when the `postgres` feature is on).
#[cfg(feature = "postgres")]
pub trait PgRow: diesel::QueryableByName<diesel::pg::Pg> {}
#[cfg(feature = "postgres")]
impl<T: diesel::QueryableByName<diesel::pg::Pg>> PgRow for T {}
#[cfg(not(feature = "postgres"))]
pub trait PgRow {}
#[cfg(not(feature = "postgres"))]
impl<T> PgRow for T {}

/// Readable from MariaDB and MySQL (when the `mysql` feature is on).
#[cfg(feature = "mysql")]
pub trait MysqlRow: diesel::QueryableByName<diesel::mysql::Mysql> {}
#[cfg(feature = "mysql")]
impl<T: diesel::QueryableByName<diesel::mysql::Mysql>> MysqlRow for T {}
#[cfg(not(feature = "mysql"))]
pub trait MysqlRow {}
#[cfg(not(feature = "mysql"))]
impl<T> MysqlRow for T {}
