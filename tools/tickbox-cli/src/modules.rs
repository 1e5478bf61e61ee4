//! The modules a command sees: every database the command line names,
//! attached and named by its module's own name (as its database records
//! it), narrowed by `--module`; and choosing the one module whose database
//! holds the row a command acts on.

use crate::target::{self, Kind, Target};
use crate::{Command, Failure};
use clap::error::ErrorKind;
use tickbox::{ModuleHandle, Retention};

/// A module's attached database, on its backend.
pub(crate) enum Handle {
    #[cfg(feature = "sqlite")]
    Sqlite(ModuleHandle<tickbox::Sqlite>),
    #[cfg(feature = "postgres")]
    Postgres(ModuleHandle<tickbox::Postgres>),
    #[cfg(feature = "mysql")]
    Mysql(ModuleHandle<tickbox::Mysql>),
}

/// Runs `$body` with `$module` bound to the `ModuleHandle` of a [`Handle`],
/// whatever its backend.
macro_rules! on_module {
    ($handle:expr, $module:ident => $body:expr) => {
        match $handle {
            #[cfg(feature = "sqlite")]
            $crate::modules::Handle::Sqlite($module) => $body,
            #[cfg(feature = "postgres")]
            $crate::modules::Handle::Postgres($module) => $body,
            #[cfg(feature = "mysql")]
            $crate::modules::Handle::Mysql($module) => $body,
        }
    };
}
pub(crate) use on_module;

/// One module of the application, attached.
pub(crate) struct Attached {
    /// The module's name: the one its database records, else the target's
    /// label.
    pub(crate) name: String,
    /// Where its database is, for messages.
    pub(crate) location: String,
    /// Its database.
    pub(crate) handle: Handle,
}

/// The modules a command sees.
pub(crate) struct Modules {
    /// In the order the command line gave their databases.
    pub(crate) all: Vec<Attached>,
    /// Whether the command line names one module (one database, or
    /// `--module`): `status` and `sweep` then print one JSON object rather
    /// than an array.
    pub(crate) single: bool,
}

impl Modules {
    /// Attaches to every target, names each module, refuses a module given
    /// twice and keeps only `--module`'s, if given. `single`: the command
    /// line names one database.
    pub(crate) async fn attach(
        targets: &[&Target],
        single: bool,
        only: Option<&str>,
        retention: Option<Retention>,
        command: &Command,
    ) -> Result<Modules, Failure> {
        let mut all: Vec<Attached> = Vec::with_capacity(targets.len());
        let mut given: Vec<&Target> = Vec::with_capacity(targets.len());
        for &target in targets {
            // The same database given twice is one module.
            if given.contains(&target) {
                continue;
            }
            given.push(target);
            let attached = attach(target, retention.clone(), command).await?;
            if let Some(twin) = all.iter().find(|a| a.name == attached.name) {
                return Err(command.usage_error(
                    ErrorKind::ArgumentConflict,
                    format!(
                        "module `{}` is given twice: {} and {}; give each module's database once",
                        attached.name, twin.location, attached.location
                    ),
                ));
            }
            all.push(attached);
        }
        let single = single || only.is_some();
        let Some(only) = only else {
            return Ok(Modules { all, single });
        };
        let names = names(&all);
        all.retain(|a| a.name == only);
        if all.is_empty() {
            return Err(Failure::Failed(format!(
                "no module `{only}` among the databases given (modules {names})"
            )));
        }
        Ok(Modules { all, single })
    }

    /// The names of the modules, for messages: `` `orders`, `warehouse` ``.
    pub(crate) fn names(&self) -> String {
        names(&self.all)
    }

    /// Where a command looked for a row, for its "not found" message: the
    /// database of module `orders`, or the databases of modules `orders`,
    /// `warehouse`.
    pub(crate) fn scope(&self) -> String {
        match self.all.as_slice() {
            [one] => format!("the database of module `{}`", one.name),
            _ => format!("the databases of modules {}", self.names()),
        }
    }

    /// The module whose database holds the row a command acts on, with
    /// what it found there, among `holders` (the modules found to hold it):
    /// the only holder. None holds it: `absent`; several do: a usage error
    /// asking for `--module`, saying what they hold (`what`).
    pub(crate) fn choose<'a, T>(
        holders: Vec<(&'a Attached, T)>,
        what: &str,
        absent: impl FnOnce() -> Failure,
        command: &Command,
    ) -> Result<(&'a Attached, T), Failure> {
        if holders.len() > 1 {
            return Err(command.usage_error(
                ErrorKind::ArgumentConflict,
                format!(
                    "{what} in modules {}: choose one with --module NAME",
                    names_of(holders.iter().map(|(module, _)| *module))
                ),
            ));
        }
        holders.into_iter().next().ok_or_else(absent)
    }
}

/// The names of `all`, for messages: `` `orders`, `warehouse` ``.
fn names(all: &[Attached]) -> String {
    names_of(all.iter())
}

/// The names of the modules of `all`, for messages.
fn names_of<'a>(all: impl Iterator<Item = &'a Attached>) -> String {
    all.map(|a| format!("`{}`", a.name))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Attaches to one target with the backend of its URL.
async fn attach(
    target: &Target,
    retention: Option<Retention>,
    command: &Command,
) -> Result<Attached, Failure> {
    let handle = match target.kind {
        #[cfg(feature = "sqlite")]
        Kind::Sqlite => attach_as(target, retention, command, Handle::Sqlite).await?,
        #[cfg(feature = "postgres")]
        Kind::Postgres => attach_as(target, retention, command, Handle::Postgres).await?,
        #[cfg(feature = "mysql")]
        Kind::Mysql => attach_as(target, retention, command, Handle::Mysql).await?,
        // A backend this build lacks.
        #[allow(unreachable_patterns)]
        kind => return Err(not_built(target, kind)),
    };
    let name = on_module!(&handle, module => module.name().to_string());
    Ok(Attached {
        name,
        location: target.location(),
        handle,
    })
}

/// Attaches to the target on backend `B`, whose handles `wrap` makes a
/// [`Handle`].
async fn attach_as<B: target::Open>(
    target: &Target,
    retention: Option<Retention>,
    command: &Command,
    wrap: fn(ModuleHandle<B>) -> Handle,
) -> Result<Handle, Failure> {
    target::attach::<B>(target, retention)
        .await
        .map(wrap)
        .map_err(|error| attach_failure(error, command))
}

/// The failure of a target whose backend this binary was built without,
/// saying how to build one with it.
fn not_built(target: &Target, kind: Kind) -> Failure {
    let (product, feature) = (kind.product(), kind.feature());
    Failure::Failed(format!(
        "`{}` needs {product} support, which this tickbox binary was built without; \
         rebuild it with `--features {feature}` \
         (cargo build --release -p tickbox-cli --features {feature})",
        tickbox::redact::redact_url(&target.url)
    ))
}

/// A `tickbox::Error` from attaching, as the tool reports it: the only
/// configuration attaching can refuse is what the command line gave it (a
/// malformed schema or database name), a usage error.
fn attach_failure(error: tickbox::Error, command: &Command) -> Failure {
    match error {
        tickbox::Error::Config(reason) => command.usage_error(ErrorKind::InvalidValue, reason),
        other => other.into(),
    }
}
