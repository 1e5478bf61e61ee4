//! Checks around migrations that read the same on every backend: a
//! database migrated by a newer tickbox is refused, and so are application
//! migrations whose version is one of tickbox's on any backend.

/// Refuses a database migrated by a newer tickbox: a migration applied there
/// that this build does not know means that version records things this one
/// would not honour (and, across processes, could lose messages by).
pub(crate) fn refuse_newer_migrations<DB, H, S>(
    conn: &mut H,
    known: &S,
    module: &str,
) -> crate::error::Result<()>
where
    DB: diesel::backend::Backend,
    H: diesel::Connection<Backend = DB>,
    S: diesel::migration::MigrationSource<DB>,
    for<'a> diesel::query_builder::SqlQuery: diesel::query_dsl::LoadQuery<'a, H, SchemaVersionRow>,
{
    use diesel::RunQueryDsl;
    let known: std::collections::HashSet<String> = versions(known, module)?
        .into_iter()
        .map(|(version, _)| version)
        .collect();
    let applied: Vec<SchemaVersionRow> =
        diesel::sql_query("SELECT version FROM tickbox_schema_version").load(conn)?;
    let unknown: Vec<String> = applied
        .into_iter()
        .map(|row| row.version)
        .filter(|v| !known.contains(v))
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(crate::error::Error::SchemaVersion {
        module: module.to_string(),
        reason: format!(
            "was migrated by a newer version of tickbox (migrations {} are unknown to this one); upgrade this process to that version",
            unknown.join(", ")
        ),
    })
}

/// tickbox's own migrations on every backend, whether compiled in or not:
/// (folder under `migrations/`, its migrations), listed by `build.rs`.
const EVERY_BACKEND: &[(&str, diesel_migrations::EmbeddedMigrations)] =
    include!(concat!(env!("OUT_DIR"), "/every_backend_migrations.rs"));

/// Refuses application migrations that share a version with one of
/// tickbox's own, on any backend: diesel records both in one table, so
/// such a migration would be taken as applied and never run. Every
/// backend's versions are reserved on every backend, so a folder name
/// accepted on one is accepted on all.
pub(crate) fn refuse_clashing_versions<DB: diesel::backend::Backend>(
    app: &dyn diesel::migration::MigrationSource<DB>,
    module: &str,
) -> crate::error::Result<()> {
    // Each reserved version, with the first of tickbox's migrations having it.
    let mut reserved = std::collections::BTreeMap::new();
    for (folder, migrations) in EVERY_BACKEND {
        for (version, name) in versions::<DB>(migrations, module)? {
            reserved
                .entry(version)
                .or_insert_with(|| format!("migrations/{folder}/{name}"));
        }
    }
    let clashing: Vec<String> = versions(app, module)?
        .into_iter()
        .filter_map(|(version, name)| {
            let ours = reserved.get(&version)?;
            Some(format!("`{name}` has the version of tickbox's `{ours}`"))
        })
        .collect();
    if clashing.is_empty() {
        return Ok(());
    }
    let timestamps: std::collections::BTreeSet<&str> = reserved
        .values()
        .filter_map(|ours| ours.rsplit('/').next()?.split('_').next())
        .collect();
    Err(crate::error::Error::Config(format!(
        "module `{module}`: the application's migration {} (diesel records both in one table, \
         so it would take the application's as applied and never run it). Rename the folder as \
         diesel names migrations, YYYY-MM-DD-HHMMSS_name at the date and time it is written \
         (`diesel migration generate name`): tickbox reserves the versions of its own migrations \
         on every backend, all at midnight ({})",
        clashing.join("; "),
        timestamps.into_iter().collect::<Vec<_>>().join(", ")
    )))
}

/// The (version, name) of every migration of `source`.
fn versions<DB: diesel::backend::Backend>(
    source: &dyn diesel::migration::MigrationSource<DB>,
    module: &str,
) -> crate::error::Result<Vec<(String, String)>> {
    let migrations = source
        .migrations()
        .map_err(|e| crate::error::Error::Migration {
            module: module.to_string(),
            reason: e.to_string(),
        })?;
    Ok(migrations
        .iter()
        .map(|m| (m.name().version().to_string(), m.name().to_string()))
        .collect())
}

/// A row of `tickbox_schema_version`.
#[derive(diesel::QueryableByName)]
pub(crate) struct SchemaVersionRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    version: String,
}

// Any backend reads the names; SQLite is the default one.
#[cfg(all(test, feature = "sqlite"))]
mod tests {
    use super::*;

    /// A database that lacks tickbox's latest migration is refused when a
    /// tool attaches to it: keep the latest's version named.
    #[test]
    fn the_latest_migration_is_the_one_attaching_checks_for() {
        let latest = EVERY_BACKEND
            .iter()
            .flat_map(|(_, migrations)| {
                versions::<diesel::sqlite::Sqlite>(migrations, "tickbox").expect("names")
            })
            .map(|(version, _)| version)
            .max()
            .expect("tickbox has migrations");
        assert_eq!(latest, crate::store::catalog::LATEST_MIGRATION);
        for (folder, migrations) in EVERY_BACKEND {
            if *folder == "sqlite-effects" {
                continue;
            }
            let names = versions::<diesel::sqlite::Sqlite>(migrations, "tickbox").expect("names");
            assert!(
                names.iter().any(|(version, _)| version == &latest),
                "migrations/{folder} lacks migration {latest}"
            );
        }
    }

    /// The documentation tells applications that every version tickbox
    /// reserves is at midnight, so a folder named at the time it was
    /// written never clashes: keep it true.
    #[test]
    fn every_migration_of_tickbox_is_named_at_midnight() {
        for (folder, migrations) in EVERY_BACKEND {
            let names = versions::<diesel::sqlite::Sqlite>(migrations, "tickbox").expect("names");
            assert!(!names.is_empty(), "migrations/{folder} holds no migration");
            for (version, name) in names {
                assert!(
                    version.ends_with("000000"),
                    "migrations/{folder}/{name}: name tickbox's migrations at midnight \
                     (YYYY-MM-DD-000000_name); applications are told those are the versions \
                     tickbox reserves"
                );
            }
        }
    }
}
