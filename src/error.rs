//! The crate's one error type.

use std::fmt;

/// What went wrong, for every fallible operation in tickbox.
///
/// Configuration mistakes are reported when a module or the bus starts, with a
/// message that says what to fix; database errors keep diesel's error as their
/// source. [`Error::is_transient`] tells a retryable failure from a permanent
/// one.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A setting is invalid (an empty name, a zero pool size, a bad rate…).
    #[error("invalid configuration: {0}")]
    Config(String),

    /// The database URL or path could not be used to open a database.
    #[error("cannot open the database of module `{module}` at {url}: {reason}")]
    BadDatabaseUrl {
        /// The module whose database it is.
        module: String,
        /// The URL with any password removed.
        url: String,
        /// Why it could not be opened.
        reason: String,
    },

    /// The database opened but holds no tickbox tables.
    #[error("the database of module `{module}` at {url} has no tickbox tables; is it a tickbox module's database (and, on PostgreSQL, the right schema)?")]
    NotATickboxDatabase {
        /// The module whose database it was meant to be.
        module: String,
        /// The URL with any password removed.
        url: String,
    },

    /// Two handlers of one module share a name; the name is part of the
    /// inbox key, so it must be unique within its module.
    #[error("module `{module}` has two handlers named `{handler}`; handler names are inbox keys and must be unique within a module")]
    DuplicateHandler {
        /// The module.
        module: String,
        /// The repeated handler name.
        handler: String,
    },

    /// Two modules given to one bus share a name.
    #[error("two modules are named `{0}`; module names must be unique on a bus")]
    DuplicateModule(String),

    /// A handler subscribes to a topic that no module on the bus publishes.
    #[error("handler `{handler}` of module `{module}` subscribes to topic `{topic}`, but no module on the bus publishes it; declare it with `.publishes::<T>()` on the publishing module or fix the topic name")]
    UnsubscribableTopic {
        /// The subscribing module.
        module: String,
        /// The subscribing handler.
        handler: String,
        /// The topic nobody publishes.
        topic: String,
    },

    /// A message was published with a topic its module did not declare.
    #[error("module `{module}` cannot publish topic `{topic}`: it was not declared with `.publishes::<T>()`")]
    UnknownTopic {
        /// The publishing module.
        module: String,
        /// The undeclared topic.
        topic: String,
    },

    /// A message's JSON payload is larger than the module allows.
    #[error("message of topic `{topic}` is {size} bytes, over the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The message's topic.
        topic: String,
        /// Its encoded size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },

    /// A message could not be encoded as JSON.
    #[error("cannot encode message of topic `{topic}`: {source}")]
    Encode {
        /// The message's topic.
        topic: String,
        /// The serde error.
        source: serde_json::Error,
    },

    /// A module's inbox retention is shorter than the time a message can
    /// still be redelivered to one of its handlers: a late duplicate would
    /// find its inbox row gone and be processed twice.
    #[error("module `{module}`: inbox retention of {retention:?} is shorter than the redelivery horizon {horizon} of handler `{handler}`; raise the retention, or lower the retry policy's max_attempts or delays")]
    RetentionTooShort {
        /// The module.
        module: String,
        /// The handler whose retries outlast the window.
        handler: String,
        /// The configured window.
        retention: std::time::Duration,
        /// How long redeliveries can go on (or "unbounded").
        horizon: String,
    },

    /// No dead letter exists for that message and handler.
    #[error(
        "module `{module}` has no dead letter for message {message_id} and handler `{handler}`"
    )]
    NoSuchDeadLetter {
        /// The module.
        module: String,
        /// The message id.
        message_id: uuid::Uuid,
        /// The handler.
        handler: String,
    },

    /// A replayed dead letter failed again; it stays a dead letter.
    #[error("replay failed: {0}")]
    ReplayFailed(crate::DeliveryError),

    /// The module was already attached to a bus.
    #[error("module `{0}` is already attached to a bus; a module belongs to one bus")]
    AlreadyAttached(String),

    /// A database query failed.
    #[error("database error: {0}")]
    Database(#[from] diesel::result::Error),

    /// Running the embedded migrations failed.
    #[error("migrations failed for module `{module}`: {reason}")]
    Migration {
        /// The module whose database it is.
        module: String,
        /// The migration harness's message.
        reason: String,
    },

    /// No connection could be taken from the module's pool.
    #[error("connection pool of module `{module}`: {reason}")]
    Pool {
        /// The module whose pool it is.
        module: String,
        /// Why no connection was available.
        reason: String,
    },

    /// The bus or module is shutting down or has stopped.
    #[error("{0} has stopped")]
    Stopped(&'static str),
}

/// `Result` with tickbox's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// True for failures that may succeed when tried again: lost connections,
    /// serialization failures, deadlocks, a busy SQLite database, an exhausted
    /// pool.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Database(e) => is_transient_db(e),
            Error::Pool { .. } => true,
            _ => false,
        }
    }
}

/// Sorts diesel errors into retryable and permanent ones.
pub(crate) fn is_transient_db(error: &diesel::result::Error) -> bool {
    use diesel::result::{DatabaseErrorKind as Kind, Error as E};
    match error {
        E::DatabaseError(kind, info) => match kind {
            Kind::SerializationFailure | Kind::ClosedConnection | Kind::UnableToSendCommand => true,
            _ => {
                let message = info.message();
                message.contains("database is locked")
                    || message.contains("database is busy")
                    || message.contains("deadlock detected")
                    || message.contains("terminating connection")
                    || message.contains("connection closed")
            }
        },
        E::BrokenTransactionManager => true,
        _ => false,
    }
}

/// A database URL with its password replaced by `***`, for logs and
/// messages. tickbox's own errors never show a password.
///
/// ```
/// assert_eq!(tickbox::redact_url("postgres://app:secret@db/shop"), "postgres://app:***@db/shop");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => match rest[..at].find(':') {
            Some(colon) => format!(
                "{}://{}:***{}",
                &url[..scheme_end],
                &rest[..colon],
                &rest[at..]
            ),
            None => url.to_string(),
        },
        None => url.to_string(),
    }
}

/// A short text for a caught panic payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

/// Formats an error with its chain of sources, for logs and dead letters.
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("postgres://bob:secret@db:5432/app"),
            "postgres://bob:***@db:5432/app"
        );
        assert_eq!(redact_url("postgres://bob@db/app"), "postgres://bob@db/app");
        assert_eq!(redact_url("data/orders.db"), "data/orders.db");
    }
}
