//! Where the databases of one process live.

use crate::cli::{Args, BackendKind};
use crate::Res;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// The PostgreSQL server used without `--database-url` or `$TICKBOX_PG_URL`.
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The MariaDB/MySQL server used without `--database-url` or
/// `$TICKBOX_MYSQL_URL`.
const DEFAULT_MYSQL_URL: &str = "mysql://root@127.0.0.1:3306";

/// The databases of one process: SQLite files in a temporary directory,
/// PostgreSQL schemas, or MariaDB/MySQL databases; every module gets a
/// fresh one.
pub(crate) struct Place {
    /// SQLite: one file per module here; removed at the end.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) dir: tempfile::TempDir,
    /// PostgreSQL, MariaDB/MySQL: the server.
    pub(crate) server_url: Option<String>,
    /// Starts every database name of this process.
    prefix: String,
    /// PostgreSQL: the schemas created; MariaDB/MySQL: the databases
    /// created (dropped at the end).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) schemas: Mutex<Vec<String>>,
    /// Number of modules created, to make each name unique.
    created: AtomicU64,
}

impl Place {
    /// The place `args` describe: the temporary directory (in
    /// `--database-url` on SQLite) and the server.
    pub(crate) fn new(args: &Args) -> Res<Self> {
        let mut dir = tempfile::Builder::new();
        dir.prefix("tickbox-bench-");
        let dir = match (&args.database_url, args.backend) {
            (Some(parent), BackendKind::Sqlite) => dir.tempdir_in(parent)?,
            _ => dir.tempdir()?,
        };
        let server = match args.backend {
            BackendKind::Sqlite => None,
            BackendKind::Postgres => Some(("TICKBOX_PG_URL", DEFAULT_PG_URL)),
            BackendKind::Mysql => Some(("TICKBOX_MYSQL_URL", DEFAULT_MYSQL_URL)),
        };
        let server_url = server.map(|(variable, default)| {
            args.database_url
                .clone()
                .or_else(|| std::env::var(variable).ok())
                .unwrap_or_else(|| default.to_string())
        });
        Ok(Place {
            dir,
            server_url,
            prefix: format!("bench_{:08x}", fastrand::u32(..)),
            schemas: Mutex::new(Vec::new()),
            created: AtomicU64::new(0),
        })
    }

    /// A fresh, unique database name for a module: `{prefix}_{k}_{name}`.
    pub(crate) fn fresh(&self, name: &str) -> String {
        let k = self.created.fetch_add(1, Relaxed);
        format!("{}_{k}_{name}", self.prefix)
    }

    /// The PostgreSQL server's URL (only called on PostgreSQL).
    pub(crate) fn pg_url(&self) -> &str {
        self.server_url.as_deref().expect("a PostgreSQL place")
    }

    /// The MariaDB/MySQL server's URL (only called on MySQL).
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn mysql_url(&self) -> &str {
        self.server_url.as_deref().expect("a MariaDB/MySQL place")
    }
}
