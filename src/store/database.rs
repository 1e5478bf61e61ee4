//! A module's database as the rest of tickbox uses it: connections from its
//! pool, and this process's turn to write where the database takes one
//! writer at a time.

use crate::error::{Error, Result};
use crate::store::backend::Backend;
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
}

impl<B: Backend> Database<B> {
    /// Wraps the pool of module `module`.
    pub(crate) fn new(module: Arc<str>, pool: B::Pool) -> Self {
        Database {
            module,
            pool,
            write_gate: B::ONE_WRITER.then(|| Arc::new(Semaphore::new(1))),
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

    /// A connection from the pool, outside any transaction.
    pub(crate) async fn connection(&self) -> Result<B::Pooled> {
        B::checkout(&self.pool).await.map_err(|reason| Error::Pool {
            module: self.module.to_string(),
            reason,
        })
    }

    /// A connection for statements that write, taken in this process's turn.
    pub(crate) async fn write_connection(&self) -> Result<WriteConnection<B>> {
        let turn = self.write_turn().await;
        Ok(WriteConnection {
            conn: self.connection().await?,
            _turn: turn,
        })
    }

    /// Closes the pool: idle connections now, the others when returned.
    pub(crate) fn close(&self) {
        B::close(&self.pool);
    }
}

/// A pooled connection holding this process's turn to write.
pub(crate) struct WriteConnection<B: Backend> {
    /// The connection.
    conn: B::Pooled,
    /// Released with the connection.
    _turn: Option<OwnedSemaphorePermit>,
}

impl<B: Backend> std::ops::Deref for WriteConnection<B> {
    type Target = B::Connection;
    fn deref(&self) -> &B::Connection {
        &self.conn
    }
}

impl<B: Backend> std::ops::DerefMut for WriteConnection<B> {
    fn deref_mut(&mut self) -> &mut B::Connection {
        &mut self.conn
    }
}
