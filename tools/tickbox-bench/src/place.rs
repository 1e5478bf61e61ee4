//! Where the databases of one process live.

use crate::cli::{Args, BackendKind};
use crate::Res;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

/// The PostgreSQL server used without `--database-url` or `$TICKBOX_PG_URL`.
const DEFAULT_PG_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The databases of one process: SQLite files in a temporary directory, or
/// PostgreSQL schemas; every module gets a fresh one.
pub(crate) struct Place {
    /// SQLite: one file per module here; removed at the end.
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))]
    pub(crate) dir: tempfile::TempDir,
    /// PostgreSQL: the server.
    pub(crate) pg_url: Option<String>,
    /// Starts every database name of this process.
    prefix: String,
    /// PostgreSQL: the schemas created (dropped at the end).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) schemas: Mutex<Vec<String>>,
    /// Number of modules created, to make each name unique.
    created: AtomicU64,
}

impl Place {
    /// The place `args` describe: the temporary directory (in
    /// `--database-url` on SQLite) and the PostgreSQL server.
    pub(crate) fn new(args: &Args) -> Res<Self> {
        let mut dir = tempfile::Builder::new();
        dir.prefix("tickbox-bench-");
        let dir = match (&args.database_url, args.backend) {
            (Some(parent), BackendKind::Sqlite) => dir.tempdir_in(parent)?,
            _ => dir.tempdir()?,
        };
        let pg_url = (args.backend == BackendKind::Postgres).then(|| {
            args.database_url
                .clone()
                .or_else(|| std::env::var("TICKBOX_PG_URL").ok())
                .unwrap_or_else(|| DEFAULT_PG_URL.to_string())
        });
        Ok(Place {
            dir,
            pg_url,
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
        self.pg_url.as_deref().expect("a PostgreSQL place")
    }
}
