//! Checks around migrations that read the same on both backends: a
//! database migrated by a newer tickbox is refused, and so are application
//! migrations whose version is one of tickbox's.

/// Refuses a database migrated by a newer tickbox: a migration applied there
/// that this build does not know means that version records things this one
/// would not honour (and, across processes, could lose messages by).
pub(crate) fn refuse_newer_migrations<DB, H, S>(
    conn: &mut H,
    known: &S,
    module: &str,
) -> crate::Result<()>
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
    Err(crate::Error::SchemaVersion {
        module: module.to_string(),
        reason: format!(
            "was migrated by a newer version of tickbox (migrations {} are unknown to this one); upgrade this process to that version",
            unknown.join(", ")
        ),
    })
}

/// Refuses application migrations that share a version with one of
/// tickbox's: diesel records both in one table, so such a migration would be
/// taken as applied and never run.
pub(crate) fn refuse_clashing_versions<DB: diesel::backend::Backend>(
    tickbox: &dyn diesel::migration::MigrationSource<DB>,
    app: &dyn diesel::migration::MigrationSource<DB>,
    module: &str,
) -> crate::Result<()> {
    let ours: std::collections::HashSet<String> = versions(tickbox, module)?
        .into_iter()
        .map(|(version, _)| version)
        .collect();
    let clashing: Vec<String> = versions(app, module)?
        .into_iter()
        .filter(|(version, _)| ours.contains(version))
        .map(|(_, name)| name)
        .collect();
    if clashing.is_empty() {
        return Ok(());
    }
    Err(crate::Error::Config(format!(
        "module `{module}`: the application's migrations {} have the version of a tickbox migration \
         (diesel would take them as applied and never run them); rename their folders to another \
         date and time",
        clashing.join(", ")
    )))
}

/// The (version, name) of every migration of `source`.
fn versions<DB: diesel::backend::Backend>(
    source: &dyn diesel::migration::MigrationSource<DB>,
    module: &str,
) -> crate::Result<Vec<(String, String)>> {
    let migrations = source.migrations().map_err(|e| crate::Error::Migration {
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
