//! The databases a command works on: which backend each URL is for, the
//! label that names it until its module's own name is read, the module
//! databases of a data directory, and attaching to one — no migrations, no
//! handler code, a small pool — so that the tool is safe to run beside the
//! application.
//!
//! On a server (PostgreSQL, MariaDB or MySQL) several modules share one
//! URL, each in a place of its own that `--schema` names: a PostgreSQL
//! schema, or a MariaDB/MySQL database (MySQL's databases are its
//! schemas). Both reach the library as `ModuleBuilder::schema`.

use std::path::Path;
use std::time::Duration;
use tickbox::{Backend, Module, ModuleBuilder, ModuleHandle, Retention};

/// Connections the tool holds per database: one command runs one statement
/// at a time.
const POOL_SIZE: usize = 2;

/// How long the tool waits for a connection before it gives up.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(10);

/// What ends the name of a module's SQLite database in a data directory.
const SQLITE_EXTENSION: &str = "db";

/// A database to attach to.
#[derive(Debug, PartialEq)]
pub(crate) struct Target {
    /// The URL or path as given (trimmed); printed only through
    /// `tickbox::redact::redact_url`.
    pub(crate) url: String,
    /// On a server: the schema (PostgreSQL) or database (MariaDB, MySQL)
    /// holding the module's tables.
    pub(crate) schema: Option<String>,
    /// The backend the URL is for.
    pub(crate) kind: Kind,
    /// What names the module until its database tells its name (and in the
    /// errors of attaching to it): the SQLite file's stem, or the server's
    /// schema or database name (read from the URL as `tickbox::redact::redact_url`
    /// shows it: a mistyped URL must not become a label).
    pub(crate) module: String,
}

/// Which backend a URL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
    /// MariaDB or MySQL (`mysql://`, one build for both).
    Mysql,
}

impl Kind {
    /// The backend of a URL: by its scheme, an SQLite path when it has
    /// none.
    fn of(url: &str) -> Kind {
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Kind::Postgres
        } else if lower.starts_with("mysql://") {
            Kind::Mysql
        } else {
            Kind::Sqlite
        }
    }

    /// Whether the backend is a server where `--schema` names a module's
    /// place (a schema, or a database) beside the URL.
    pub(crate) fn has_schemas(self) -> bool {
        self != Kind::Sqlite
    }

    /// The backend's name for people.
    pub(crate) fn product(self) -> &'static str {
        match self {
            Kind::Sqlite => "SQLite",
            Kind::Postgres => "PostgreSQL",
            Kind::Mysql => "MariaDB/MySQL",
        }
    }

    /// The cargo feature of the tool that supports the backend.
    pub(crate) fn feature(self) -> &'static str {
        match self {
            Kind::Sqlite => "sqlite",
            Kind::Postgres => "postgres",
            Kind::Mysql => "mysql",
        }
    }
}

/// What the usage errors say `--schema` applies to.
const SCHEMA_APPLIES: &str = "--schema applies to PostgreSQL (a schema) and MariaDB/MySQL (a \
     database) only";

impl Target {
    /// Works out the backend and a module label from the URL; the error is
    /// a usage error's message.
    pub(crate) fn new(url: &str, schema: Option<String>) -> Result<Target, String> {
        let trimmed = url.trim();
        let lower = trimmed.to_ascii_lowercase();
        let kind = Kind::of(trimmed);
        if kind == Kind::Sqlite && lower.contains("://") && !lower.starts_with("sqlite://") {
            return Err(format!(
                "`{}` is neither an SQLite path (or sqlite://PATH), a postgres:// URL nor a \
                 mysql:// URL",
                tickbox::redact::redact_url(trimmed)
            ));
        }
        if kind == Kind::Sqlite && schema.is_some() {
            return Err(format!(
                "{SCHEMA_APPLIES}; an SQLite module has its own file"
            ));
        }
        let module = match kind {
            Kind::Sqlite => {
                let path = trimmed
                    .strip_prefix("sqlite://")
                    .or_else(|| trimmed.strip_prefix("sqlite:"))
                    .unwrap_or(trimmed);
                let shown = tickbox::redact::redact_url(path);
                Path::new(&shown)
                    .file_stem()
                    .and_then(|stem| stem.to_str())
                    .filter(|stem| !stem.contains("***"))
                    .map(str::to_string)
            }
            Kind::Postgres | Kind::Mysql => schema.clone().or_else(|| database_name(trimmed)),
        }
        .filter(|name| !name.trim().is_empty())
        .unwrap_or_else(|| "module".to_string());
        Ok(Target {
            url: trimmed.to_string(),
            schema,
            kind,
            module,
        })
    }

    /// Where the database is, for people: the SQLite path, or the server's
    /// URL (its password hidden) and the schema (PostgreSQL) or database
    /// (MariaDB, MySQL).
    pub(crate) fn location(&self) -> String {
        let url = tickbox::redact::redact_url(&self.url);
        let place = match self.kind {
            Kind::Mysql => "database",
            Kind::Sqlite | Kind::Postgres => "schema",
        };
        match &self.schema {
            Some(schema) => format!("{url} {place} {schema}"),
            None => url,
        }
    }
}

/// The databases the command line names by URL: each `--database-url`, a
/// server's (PostgreSQL, MariaDB, MySQL) once per `--schema` if any is
/// given. The error is a usage error's message.
pub(crate) fn targets(urls: &[String], schemas: &[String]) -> Result<Vec<Target>, String> {
    let mut targets = Vec::new();
    for url in urls {
        if url.trim().is_empty() {
            return Err(
                "an empty --database-url: give an SQLite path, a postgres:// or a mysql:// URL"
                    .into(),
            );
        }
        let target = Target::new(url, None)?;
        if target.kind.has_schemas() && !schemas.is_empty() {
            for schema in schemas {
                targets.push(Target::new(url, Some(schema.clone()))?);
            }
        } else {
            targets.push(target);
        }
    }
    if !schemas.is_empty() && !targets.iter().any(|t| t.kind.has_schemas()) {
        return Err(format!(
            "{SCHEMA_APPLIES} (give a postgres:// or mysql:// --database-url); an SQLite \
             module has its own file"
        ));
    }
    Ok(targets)
}

/// The module databases of a data directory: every `NAME.db` file in it, by
/// name (the files beside them, `NAME.db-effects` and SQLite's `-wal` and
/// `-shm`, belong to them). The error says why there are none.
pub(crate) fn data_dir(dir: &Path) -> Result<Vec<Target>, String> {
    let shown = dir.display();
    let entries = std::fs::read_dir(dir)
        .map_err(|e| format!("cannot read the data directory {shown}: {e}"))?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|e| format!("cannot read the data directory {shown}: {e}"))?
            .path();
        if path.extension().is_some_and(|e| e == SQLITE_EXTENSION) && path.is_file() {
            files.push(path);
        }
    }
    if files.is_empty() {
        return Err(format!(
            "the data directory {shown} holds no module database (a NAME.{SQLITE_EXTENSION} file)"
        ));
    }
    files.sort();
    files
        .iter()
        .map(|path| {
            let path = path
                .to_str()
                .ok_or_else(|| format!("the file name {} is not UTF-8", path.display()))?;
            Target::new(path, None)
        })
        .collect()
}

/// The database named by a server's URL, read from the redacted URL: a
/// password that breaks the URL (a raw `/` in it) must not become the label
/// of error messages.
fn database_name(url: &str) -> Option<String> {
    let redacted = tickbox::redact::redact_url(url);
    let after_scheme = &redacted[redacted.find("://").map_or(0, |i| i + 3)..];
    let path = after_scheme.split_once('/').map(|(_, path)| path)?;
    let database = path.split(['?', '#']).next().unwrap_or_default();
    Some(database.to_string())
}

/// A backend the tool can attach to: what its module builder needs from the
/// target.
pub(crate) trait Open: Backend {
    /// A builder for the target's module, named `name`.
    fn builder(target: &Target, name: &str) -> ModuleBuilder<Self>;
}

#[cfg(feature = "sqlite")]
impl Open for tickbox::Sqlite {
    fn builder(target: &Target, name: &str) -> ModuleBuilder<Self> {
        Module::builder(name, target.url.clone())
    }
}

#[cfg(feature = "postgres")]
impl Open for tickbox::Postgres {
    fn builder(target: &Target, name: &str) -> ModuleBuilder<Self> {
        builder_on_server(target, name)
    }
}

#[cfg(feature = "mysql")]
impl Open for tickbox::Mysql {
    fn builder(target: &Target, name: &str) -> ModuleBuilder<Self> {
        builder_on_server(target, name)
    }
}

/// A builder for the target's module on a server that keeps each module in
/// a place of its own: the `--schema` given, through
/// `ModuleBuilder::schema` (a PostgreSQL schema, a MariaDB/MySQL
/// database), else the place the URL names.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn builder_on_server<B: tickbox::Schemas>(target: &Target, name: &str) -> ModuleBuilder<B> {
    let builder = Module::builder(name, target.url.clone());
    match &target.schema {
        Some(schema) => builder.schema(schema.clone()),
        None => builder,
    }
}

/// Attaches to the target's existing module database: no migrations (a
/// database without tickbox tables is refused), no handlers. The module is
/// named by the name its database records (the target's label when none
/// is recorded), so that every later message names it as the application
/// does. `retention` is the window a sweep uses.
pub(crate) async fn attach<B: Open>(
    target: &Target,
    retention: Option<Retention>,
) -> tickbox::Result<ModuleHandle<B>> {
    let attach = |name: &str| {
        let mut builder = B::builder(target, name)
            .pool_size(POOL_SIZE)
            .checkout_timeout(CHECKOUT_TIMEOUT);
        if let Some(retention) = retention.clone() {
            builder = builder.retention(retention);
        }
        builder.attach()
    };
    let module = attach(&target.module).await?;
    match module.recorded_name().await? {
        Some(name) if name != target.module => {
            module.close();
            attach(&name).await
        }
        _ => Ok(module),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(all: &[&str]) -> Vec<String> {
        all.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_postgres_url_is_one_module_per_schema() {
        let url = "postgres://u:p@h/shop";
        let all = targets(&strings(&[url]), &strings(&["a", "b"])).unwrap();
        let schemas: Vec<_> = all.iter().map(|t| t.schema.as_deref()).collect();
        assert_eq!(schemas, [Some("a"), Some("b")]);
        assert_eq!(all[1].module, "b");
        assert_eq!(all[1].location(), "postgres://u:***@h/shop schema b");

        let one = targets(&strings(&[url]), &strings(&["a"])).unwrap();
        assert_eq!(one.len(), 1);
        let none = targets(&strings(&[url, "x.db"]), &[]).unwrap();
        assert_eq!(none[0].module, "shop");
        assert_eq!(none[1].module, "x");
    }

    #[test]
    fn a_mysql_url_is_one_module_per_database() {
        let url = "mysql://root:p@h:3306";
        let all = targets(&strings(&[url]), &strings(&["shop_orders", "shop_stock"])).unwrap();
        assert!(all.iter().all(|t| t.kind == Kind::Mysql));
        assert_eq!(all[0].module, "shop_orders");
        assert_eq!(
            all[1].location(),
            "mysql://root:***@h:3306 database shop_stock"
        );

        let named = targets(
            &strings(&["mysql://h/shop_orders?prefer_socket=false"]),
            &[],
        )
        .unwrap();
        assert_eq!(named[0].module, "shop_orders");
        assert_eq!(named[0].schema, None);
        let bare = targets(&strings(&[url]), &[]).unwrap();
        assert_eq!(bare[0].module, "module");
    }

    #[test]
    fn a_schema_needs_a_server_url() {
        let error = targets(&strings(&["x.db", "y.db"]), &strings(&["a"])).unwrap_err();
        assert!(error.contains("MariaDB/MySQL (a database) only"), "{error}");
        let error = targets(&[], &strings(&["a", "b"])).unwrap_err();
        assert!(error.contains("PostgreSQL (a schema)"), "{error}");
        let mixed = targets(&strings(&["x.db", "postgres://h/db"]), &strings(&["a"])).unwrap();
        assert_eq!(mixed[0].schema, None);
        assert_eq!(mixed[1].schema.as_deref(), Some("a"));
    }

    #[test]
    fn a_data_dir_holds_one_database_per_module() {
        let dir = tempfile::tempdir().unwrap();
        for file in [
            "warehouse.db",
            "orders.db",
            "orders.db-effects",
            "orders.db-wal",
            "orders.db-shm",
            "notes.txt",
        ] {
            std::fs::write(dir.path().join(file), b"").unwrap();
        }
        std::fs::create_dir(dir.path().join("old.db")).unwrap();
        let all = data_dir(dir.path()).unwrap();
        let modules: Vec<_> = all.iter().map(|t| t.module.as_str()).collect();
        assert_eq!(modules, ["orders", "warehouse"]);
        assert!(all.iter().all(|t| t.kind == Kind::Sqlite));

        let empty = tempfile::tempdir().unwrap();
        let error = data_dir(empty.path()).unwrap_err();
        assert!(error.contains("holds no module database"), "{error}");
        let error = data_dir(&dir.path().join("missing")).unwrap_err();
        assert!(error.contains("cannot read the data directory"), "{error}");
    }
}
