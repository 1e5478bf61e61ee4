//! What a module's database holds and who uses it: which of tickbox's
//! tables it has (to tell a module's database, an older one and a foreign
//! one apart before starting), which module started on it last, and how
//! large its tables are.

use crate::store::contract::Store;
use crate::store::dead_letters::DeadLetterStatements;
use crate::store::schema::Count;
use crate::store::sql::{sql, Sql};
use diesel::QueryResult;
use std::future::Future;

/// tickbox's tables, as [`CatalogStatements::count_tables`] counts them.
pub(crate) const TABLES: i64 = 10;

/// The version of tickbox's latest migration (the same on every backend):
/// a database that has not recorded it lacks what this version reads and
/// writes (a column added to a table, which [`TABLES`] does not see).
pub(crate) const LATEST_MIGRATION: &str = "20261209000000";

/// Their names, as the catalog lists them: a string literal for `concat!`,
/// the list of an `IN (…)`.
macro_rules! table_names {
    () => {
        "'tickbox_outbox', 'tickbox_inbox', 'tickbox_dead_letters', \
         'tickbox_subscriptions', 'tickbox_outbox_done', 'tickbox_schema_version', \
         'tickbox_key_sequences', 'tickbox_key_progress', 'tickbox_handlers', 'tickbox_modules'"
    };
}
pub(crate) use table_names;

/// A module's name, as recorded in `tickbox_modules`.
#[derive(diesel::QueryableByName)]
struct ModuleName {
    /// The name.
    #[diesel(sql_type = diesel::sql_types::Text)]
    name: String,
}

/// The catalog's statements. The defaults are written in the SQL that
/// SQLite and PostgreSQL share; a backend overrides what its dialect spells
/// otherwise, and states itself how its catalog lists tables
/// ([`CatalogStatements::count_tables`]).
pub trait CatalogStatements: Store + DeadLetterStatements {
    /// Records that module `name` starts on this database now.
    fn record_module_start(
        conn: &mut Self::Conn,
        name: &str,
        now_us: i64,
    ) -> impl Future<Output = QueryResult<()>> + Send {
        let statement = sql!(
            "INSERT INTO tickbox_modules (name, last_started_at_us) VALUES (?, ?) \
             ON CONFLICT (name) DO UPDATE SET last_started_at_us = excluded.last_started_at_us",
            name,
            now_us
        );
        async move { Self::execute(conn, statement).await.map(drop) }
    }

    /// The name of the module that started last on this database, if one
    /// has started since it was migrated.
    fn last_started_module(
        conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Option<String>>> + Send {
        let statement = Sql::plain(
            "SELECT name FROM tickbox_modules ORDER BY last_started_at_us DESC, name LIMIT 1",
        );
        async move {
            let rows: Vec<ModuleName> = Self::load(conn, statement).await?;
            Ok(rows.into_iter().next().map(|row| row.name))
        }
    }

    /// How many of tickbox's tables (`table_names!`) the database
    /// (PostgreSQL: the current schema) holds: [`TABLES`] when it is up to
    /// date, fewer when an older version of tickbox made them, none when it
    /// is not a module's database. Read from the backend's catalog.
    fn count_tables(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<i64>> + Send;

    /// Whether the database recorded tickbox's migration `version` (in
    /// `tickbox_schema_version`).
    fn has_migration(
        conn: &mut Self::Conn,
        version: &'static str,
    ) -> impl Future<Output = QueryResult<bool>> + Send {
        let statement = sql!(
            "SELECT count(*) AS n FROM tickbox_schema_version WHERE version = ?",
            version
        );
        async move { Ok(Count::of(Self::load(conn, statement).await?) > 0) }
    }

    /// Whether this connection to the database server is encrypted (TLS),
    /// as the server sees it; `None` where there is no server (SQLite).
    fn connection_encrypted(
        _conn: &mut Self::Conn,
    ) -> impl Future<Output = QueryResult<Option<bool>>> + Send {
        async { Ok(None) }
    }

    /// Counts the rows of the inbox and of the dead letters.
    fn table_sizes(conn: &mut Self::Conn) -> impl Future<Output = QueryResult<(i64, i64)>> + Send {
        async move {
            let inbox = Sql::plain("SELECT count(*) AS n FROM tickbox_inbox");
            let inbox = Count::of(Self::load(conn, inbox).await?);
            let dead = Self::count_dead_letters(conn).await?;
            Ok((inbox, dead))
        }
    }
}
