//! Transient failures: which errors are worth trying again.
//!
//! A database says so by its error kind or its SQLSTATE, which are the same
//! on every backend that reports them; a backend that reports some failures
//! only in words lists those words itself
//! ([`Store::TRANSIENT_MESSAGES`](crate::store::contract::Store::TRANSIENT_MESSAGES)).

use crate::error::Error;
use diesel::result::{DatabaseErrorKind as Kind, Error as DieselError, SqlState, SqlStateClass};

impl Error {
    /// True for failures that may succeed when tried again: lost connections,
    /// calls past their deadline,
    /// serialization failures, deadlocks, a busy SQLite database, a server
    /// shutting down or out of connections, an exhausted pool, a database
    /// server or message broker out of reach (at start too: it may be
    /// starting; bound the tries, since a wrong address never succeeds).
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Database(e) => is_transient(e),
            Error::Pool { .. }
            | Error::Deadline { .. }
            | Error::DatabaseUnreachable { .. }
            | Error::BrokerUnreachable { .. } => true,
            _ => false,
        }
    }
}

/// Sorts diesel errors into retryable and permanent ones.
pub(crate) fn is_transient(error: &DieselError) -> bool {
    match error {
        DieselError::DatabaseError(kind, info) => {
            matches!(
                kind,
                Kind::SerializationFailure | Kind::ClosedConnection | Kind::UnableToSendCommand
            ) || info.sqlstate().is_some_and(is_transient_state)
                || reported_in_words(info.message())
        }
        DieselError::BrokenTransactionManager => true,
        _ => false,
    }
}

/// SQL's standard classes of failures that a later try may not meet:
/// a rolled-back transaction (serialization failure, deadlock), a broken
/// connection, a server short of resources (too many connections), and an
/// operator's shutdown or restart (`57P01`–`57P03`, not `57014`, a cancelled
/// statement).
fn is_transient_state(state: SqlState) -> bool {
    let class = state.class();
    class == SqlStateClass::TRANSACTION_ROLLBACK
        || class == SqlStateClass::CONNECTION_EXCEPTION
        || class.as_str() == "53"
        || state.as_str().starts_with("57P")
}

/// Whether an enabled backend reports this failure, in words, as transient.
fn reported_in_words(message: &str) -> bool {
    crate::store::TRANSIENT_MESSAGES
        .iter()
        .copied()
        .flatten()
        .any(|words| message.contains(words))
}
