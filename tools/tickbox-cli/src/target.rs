//! The database a command works on: which backend its URL is for, the name
//! that labels its errors, and attaching to it — no migrations, no handler
//! code, a small pool — so that the tool is safe to run beside the
//! application.

use std::path::Path;
use std::time::Duration;
use tickbox::{Backend, Module, ModuleBuilder, ModuleHandle, Retention};

/// Connections the tool holds: one command runs one statement at a time.
const POOL_SIZE: usize = 2;

/// How long the tool waits for a connection before it gives up.
const CHECKOUT_TIMEOUT: Duration = Duration::from_secs(10);

/// The database to attach to.
#[derive(Debug, PartialEq)]
pub(crate) struct Target {
    /// The URL or path as given (trimmed); printed only through
    /// `tickbox::redact_url`.
    pub(crate) url: String,
    /// PostgreSQL: the schema holding the module's tables.
    pub(crate) schema: Option<String>,
    /// The backend the URL is for.
    pub(crate) kind: Kind,
    /// The module name, which only labels error messages: the SQLite file's
    /// stem, or the PostgreSQL schema or database name (read from the URL
    /// as `tickbox::redact_url` shows it: a mistyped URL must not become a
    /// label).
    pub(crate) module: String,
}

/// Which backend a URL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Sqlite,
    Postgres,
}

impl Target {
    /// Works out the backend and a module label from the URL; the error is
    /// a usage error's message.
    pub(crate) fn new(url: &str, schema: Option<String>) -> Result<Target, String> {
        let trimmed = url.trim();
        let lower = trimmed.to_ascii_lowercase();
        let kind = if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            Kind::Postgres
        } else {
            Kind::Sqlite
        };
        if kind == Kind::Sqlite && lower.contains("://") && !lower.starts_with("sqlite://") {
            return Err(format!(
                "`{}` is neither an SQLite path (or sqlite://PATH) nor a postgres:// URL",
                tickbox::redact_url(trimmed)
            ));
        }
        if kind == Kind::Sqlite && schema.is_some() {
            return Err(
                "--schema applies to PostgreSQL only; an SQLite module has its own file".into(),
            );
        }
        let module = match kind {
            Kind::Sqlite => {
                let path = trimmed
                    .strip_prefix("sqlite://")
                    .or_else(|| trimmed.strip_prefix("sqlite:"))
                    .unwrap_or(trimmed);
                let shown = tickbox::redact_url(path);
                Path::new(&shown)
                    .file_stem()
                    .and_then(|stem| stem.to_str())
                    .filter(|stem| !stem.contains("***"))
                    .map(str::to_string)
            }
            Kind::Postgres => schema.clone().or_else(|| database_name(trimmed)),
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
}

/// The database named by a PostgreSQL URL, read from the redacted URL: a
/// password that breaks the URL (a raw `/` in it) must not become the label
/// of error messages.
fn database_name(url: &str) -> Option<String> {
    let redacted = tickbox::redact_url(url);
    let after_scheme = &redacted[redacted.find("://").map_or(0, |i| i + 3)..];
    let path = after_scheme.split_once('/').map(|(_, path)| path)?;
    let database = path.split(['?', '#']).next().unwrap_or_default();
    Some(database.to_string())
}

/// A backend the tool can attach to: what its module builder needs from the
/// target.
pub(crate) trait Open: Backend {
    /// A builder for the target's module.
    fn builder(target: &Target) -> ModuleBuilder<Self>;
}

#[cfg(feature = "sqlite")]
impl Open for tickbox::Sqlite {
    fn builder(target: &Target) -> ModuleBuilder<Self> {
        Module::builder(target.module.clone(), target.url.clone())
    }
}

#[cfg(feature = "postgres")]
impl Open for tickbox::Postgres {
    fn builder(target: &Target) -> ModuleBuilder<Self> {
        let builder = Module::builder(target.module.clone(), target.url.clone());
        match &target.schema {
            Some(schema) => builder.schema(schema.clone()),
            None => builder,
        }
    }
}

/// Attaches to the target's existing module database: no migrations (a
/// database without tickbox tables is refused), no handlers. `retention` is
/// the window a sweep uses.
pub(crate) async fn attach<B: Open>(
    target: &Target,
    retention: Option<Retention>,
) -> tickbox::Result<ModuleHandle<B>> {
    let mut builder = B::builder(target)
        .pool_size(POOL_SIZE)
        .checkout_timeout(CHECKOUT_TIMEOUT);
    if let Some(retention) = retention {
        builder = builder.retention(retention);
    }
    builder.attach().await
}
