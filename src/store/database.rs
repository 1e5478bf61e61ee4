//! A module's database as the rest of tickbox uses it: connections from its
//! pool, calls within their deadlines, and this process's turn to write
//! where the database takes one writer at a time.

use crate::error::{Error, Result};
use crate::send_async_fn::SendAsyncFn;
use crate::store::backend::Backend;
use crate::store::deadline::{CallWatch, Deadlines};
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A module's connection pool, shared by its transactions, its deliveries
/// and the bus.
pub(crate) struct Database<B: Backend> {
    /// The module that owns the database, for error messages.
    module: Arc<str>,
    /// The pool every connection comes from.
    pool: B::Pool,
    /// One permit per writer the database takes at once, when it takes one
    /// (SQLite): this process's writers queue here, fairly, rather than
    /// sleep in the database's busy handler.
    write_gate: Option<Arc<Semaphore>>,
    /// How long calls may take.
    pub(crate) deadlines: Deadlines,
    /// The module's calls that are stuck or missed their deadline, shared
    /// by its pools (the module's and its effects journal's).
    pub(crate) watch: Arc<CallWatch>,
}

impl<B: Backend> Database<B> {
    /// Wraps the pool of module `module`, whose calls `watch` watches.
    pub(crate) fn new(
        module: Arc<str>,
        pool: B::Pool,
        deadlines: Deadlines,
        watch: Arc<CallWatch>,
    ) -> Self {
        let idle = pool.clone();
        watch.watch_pool(Box::new(move || B::close_idle(&idle)));
        Database {
            watch,
            module,
            pool,
            write_gate: B::ONE_WRITER.then(|| Arc::new(Semaphore::new(1))),
            deadlines,
        }
    }

    /// The module that owns the database.
    pub(crate) fn module(&self) -> &str {
        &self.module
    }

    /// Waits for this process's turn to write, where the database takes one
    /// writer at a time.
    pub(crate) async fn write_turn(&self) -> Option<OwnedSemaphorePermit> {
        match &self.write_gate {
            Some(gate) => gate.clone().acquire_owned().await.ok(),
            None => None,
        }
    }

    /// A connection from the pool, outside any transaction. The wait for a
    /// free one (or a new one) is bounded by the module's checkout timeout.
    pub(crate) async fn connection(&self) -> Result<B::Pooled> {
        B::checkout(&self.pool).await.map_err(|reason| Error::Pool {
            module: self.module.to_string(),
            reason,
        })
    }

    /// Runs one of tickbox's own calls, `f`, on a connection of the pool
    /// within the module's call deadline, which counts from the checkout
    /// on; `operation` names it in the logs. Past the deadline the
    /// connection is closed (with the pool's idle ones) and the call fails
    /// with [`Error::Deadline`].
    pub(crate) async fn call<T, F>(&self, operation: &str, f: F) -> Result<T>
    where
        for<'c> F: AsyncFnOnce(&'c mut B::Connection) -> Result<T>
            + SendAsyncFn<&'c mut B::Connection, Result<T>, Fut: Send>,
    {
        self.run(operation, None, f).await
    }

    /// Like [`Database::call`], for statements that write: taken in this
    /// process's turn to write.
    pub(crate) async fn write_call<T, F>(&self, operation: &str, f: F) -> Result<T>
    where
        for<'c> F: AsyncFnOnce(&'c mut B::Connection) -> Result<T>
            + SendAsyncFn<&'c mut B::Connection, Result<T>, Fut: Send>,
    {
        let turn = self.write_turn().await;
        self.run(operation, turn, f).await
    }

    /// Checks out a connection and runs `f` on it, within the call
    /// deadline; past it, gives the connection up.
    async fn run<T, F>(
        &self,
        operation: &str,
        _turn: Option<OwnedSemaphorePermit>,
        f: F,
    ) -> Result<T>
    where
        for<'c> F: AsyncFnOnce(&'c mut B::Connection) -> Result<T>
            + SendAsyncFn<&'c mut B::Connection, Result<T>, Fut: Send>,
    {
        // The connection lives outside the timed part, so that a call cut
        // short — by its deadline, or by a caller that stopped waiting —
        // leaves it here to be closed rather than to the pool.
        let mut conn = InFlight {
            db: self,
            conn: None,
        };
        let called = {
            let call = std::pin::pin!(async {
                let conn = conn.conn.insert(self.connection().await?);
                f(&mut **conn).await
            });
            self.watch
                .within(operation, self.deadlines.call, call)
                .await
        };
        if called.is_ok() {
            conn.returned();
        }
        called.and_then(|done| done)
    }

    /// Closes a connection for good instead of returning it to the pool: a
    /// call on it went past its deadline, or a transaction on it was
    /// abandoned half way. The idle connections of the module's pools are
    /// closed with it, since they most likely went the same (quiet) way;
    /// the pools open new ones as they are needed.
    pub(crate) fn give_up(&self, conn: B::Pooled) {
        B::discard(conn);
        self.watch.close_idle();
    }

    /// Closes the pool: idle connections now, the others when returned.
    pub(crate) fn close(&self) {
        B::close(&self.pool);
    }
}

/// A connection a call is using: closed for good if the call does not end
/// (its deadline passed, or its caller dropped it), returned to the pool
/// once it has.
struct InFlight<'a, B: Backend> {
    db: &'a Database<B>,
    conn: Option<B::Pooled>,
}

impl<B: Backend> InFlight<'_, B> {
    /// The call ended, well or not: the connection goes back to the pool.
    fn returned(mut self) {
        drop(self.conn.take());
    }
}

impl<B: Backend> Drop for InFlight<'_, B> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.db.give_up(conn);
        }
    }
}
