//! Deadlines on database calls: a connection that goes quiet (a failover
//! that moved the server's address, a NAT entry that expired, a host that
//! died without a word) never holds tickbox up for long.
//!
//! Nothing in the network tells a client that its peer went silent: the
//! socket stays open and a query waits for an answer that never comes. So
//! every call tickbox makes to a module's database runs against a deadline:
//!
//! - **tickbox's own statements** (claims, marks, scans, subscriptions, the
//!   gauges, the operator's queries) within the module's call deadline;
//! - **a transaction** of application code or of a handler, from BEGIN to
//!   COMMIT, within the module's transaction deadline, or the handler's own
//!   ([`HandlerOptions::deadline`](crate::HandlerOptions::deadline));
//! - **opening** the database (connecting and migrating) within the
//!   module's migration deadline.
//!
//! Half way to its deadline a call is reported (a warning naming the
//! module, the operation and how long it has waited, and the
//! `tickbox_database_calls_stuck` gauge). At its deadline it is given up:
//! its connection is closed, never returned to the pool (the same path is
//! likely dead for its idle siblings too, so the pool's idle connections
//! are closed with it), and the call fails with [`Error::Deadline`], a
//! transient failure — a delivery is retried, a scan or a mark runs again.
//!
//! The server lets go too: see the PostgreSQL backend's session settings.

use crate::error::{Error, Result};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long a module's database calls may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadlines {
    /// One of tickbox's own calls: a claim, a mark, a scan page, the
    /// subscriptions' upkeep, a gauge's reading, an operator's query.
    pub(crate) call: Duration,
    /// A transaction of application code or of a handler (unless the
    /// handler sets its own), from BEGIN to COMMIT.
    pub(crate) transaction: Duration,
    /// Opening the database: connecting, and running tickbox's and the
    /// application's migrations (an index on a big table takes a while).
    pub(crate) migration: Duration,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            // tickbox's statements are short and indexed: a healthy server
            // answers in milliseconds, a loaded one in well under a second.
            call: Duration::from_secs(10),
            // Generous for a handler's own work, short enough that a process
            // recovers within half a minute of the network's return.
            transaction: Duration::from_secs(30),
            migration: Duration::from_secs(300),
        }
    }
}

impl Deadlines {
    /// Checks the settings; `Err` names the bad one.
    pub(crate) fn validate(&self, module: &str) -> Result<()> {
        for (name, value) in [
            ("call deadline", self.call),
            ("transaction deadline", self.transaction),
            ("migration deadline", self.migration),
        ] {
            if value < MIN_DEADLINE {
                return Err(Error::Config(format!(
                    "module `{module}`: the {name} of {value:?} is below the least of {MIN_DEADLINE:?}"
                )));
            }
        }
        Ok(())
    }
}

/// The least deadline a setting may have: below it, healthy calls on a busy
/// machine would be cut.
pub(crate) const MIN_DEADLINE: Duration = Duration::from_millis(100);

/// Watches one module's database calls — its pool's and its effects
/// journal's: how many are stuck now, how many missed their deadline; and
/// closes the idle connections of all its pools when one call misses (they
/// share the path to the server, which went quiet). Shared by everything
/// that calls the module's databases.
pub(crate) struct CallWatch {
    /// The module that owns the databases, for the logs.
    module: Arc<str>,
    /// Calls past half their deadline and still waiting.
    stuck: AtomicI64,
    /// Calls given up at their deadline since the module started.
    missed: AtomicU64,
    stuck_gauge: metrics::Gauge,
    missed_counter: metrics::Counter,
    /// Closes the idle connections of one of the module's pools, each.
    idle_closers: Mutex<Vec<IdleCloser>>,
}

/// Closes the idle connections of a pool.
type IdleCloser = Box<dyn Fn() + Send + Sync>;

/// Counts a call as stuck while it lives: dropped however the call ends —
/// finished, past its deadline, or dropped by its caller.
struct Stuck<'a>(&'a CallWatch);

impl<'a> Stuck<'a> {
    fn new(watch: &'a CallWatch) -> Self {
        watch.stuck.fetch_add(1, Relaxed);
        watch.stuck_gauge.increment(1.0);
        Stuck(watch)
    }
}

impl Drop for Stuck<'_> {
    fn drop(&mut self) {
        self.0.stuck.fetch_sub(1, Relaxed);
        self.0.stuck_gauge.decrement(1.0);
    }
}

/// What a database's calls look like now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct CallMetrics {
    /// Calls waiting longer than half their deadline now: the database, or
    /// the network to it, is not answering.
    pub stuck: i64,
    /// Calls given up at their deadline (their connections closed) since
    /// the module started.
    pub deadlines_missed: u64,
}

impl CallWatch {
    pub(crate) fn new(module: Arc<str>) -> Self {
        let labels = [("module", module.to_string())];
        CallWatch {
            stuck: AtomicI64::new(0),
            missed: AtomicU64::new(0),
            stuck_gauge: metrics::gauge!("tickbox_database_calls_stuck", &labels),
            missed_counter: metrics::counter!("tickbox_database_deadlines_missed_total", &labels),
            idle_closers: Mutex::new(Vec::new()),
            module,
        }
    }

    /// Registers one of the module's pools, by what closes its idle
    /// connections.
    pub(crate) fn watch_pool(&self, close_idle: IdleCloser) {
        self.idle_closers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(close_idle);
    }

    /// Closes the idle connections of every pool of the module.
    pub(crate) fn close_idle(&self) {
        for close in self
            .idle_closers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
        {
            close();
        }
    }

    /// The figures now.
    pub(crate) fn snapshot(&self) -> CallMetrics {
        CallMetrics {
            stuck: self.stuck.load(Relaxed),
            deadlines_missed: self.missed.load(Relaxed),
        }
    }

    /// Runs `call` within `deadline`: warns half way, and at the deadline
    /// drops it and fails with [`Error::Deadline`]. The caller closes the
    /// connection the call was using.
    ///
    /// The common case costs one timer, cancelled when the call returns.
    /// The call comes pinned where its caller keeps it (`std::pin::pin!`),
    /// so that its future, which may be large (a delivery's), is not moved
    /// into this one's: a task's future is copied whole when it is spawned.
    pub(crate) async fn within<F: Future>(
        &self,
        operation: &str,
        deadline: Duration,
        mut call: Pin<&mut F>,
    ) -> Result<F::Output> {
        let warn_after = deadline / 2;
        if let Ok(done) = tokio::time::timeout(warn_after, &mut call).await {
            return Ok(done);
        }
        let stuck = Stuck::new(self);
        tracing::warn!(
            module = %self.module,
            operation,
            waited = ?warn_after,
            ?deadline,
            "a database call has had no answer for a while; the connection may have gone quiet"
        );
        let late = tokio::time::timeout(deadline - warn_after, &mut call).await;
        drop(stuck);
        match late {
            Ok(done) => {
                tracing::info!(module = %self.module, operation, "the slow database call finished");
                Ok(done)
            }
            Err(_) => {
                self.missed.fetch_add(1, Relaxed);
                self.missed_counter.increment(1);
                let error = Error::Deadline {
                    module: self.module.to_string(),
                    operation: operation.to_string(),
                    deadline,
                };
                tracing::warn!(module = %self.module, operation, ?deadline, "{error}");
                Err(error)
            }
        }
    }
}
