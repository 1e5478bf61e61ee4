//! The crate's one error type.

pub(crate) mod outcome;

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
    /// A setting is invalid (an empty name, a zero pool size, a bad rate…),
    /// found when a module or bus starts.
    #[error("invalid configuration: {0}")]
    Config(String),

    /// A message was published in a read-only transaction
    /// ([`ModuleHandle::read`](crate::ModuleHandle::read)), which cannot
    /// write the outbox.
    #[error("module `{module}`: cannot publish `{topic}` from a read-only transaction; publish in ModuleHandle::transaction")]
    ReadOnly {
        /// The module whose transaction it was.
        module: String,
        /// The topic of the message.
        topic: String,
    },

    /// A scheduled message was cancelled in a read-only transaction
    /// ([`ModuleHandle::read`](crate::ModuleHandle::read)), which cannot
    /// write the outbox.
    #[error("module `{module}`: cannot cancel scheduled message {message_id} from a read-only transaction; cancel it in ModuleHandle::transaction")]
    CancelInReadOnly {
        /// The module whose transaction it was.
        module: String,
        /// The scheduled message.
        message_id: uuid::Uuid,
    },

    /// A task tickbox runs in the background (opening a database, a
    /// transaction's own task) panicked or was cancelled.
    #[error("{what}: the task running it failed: {reason}")]
    Task {
        /// What the task was doing.
        what: String,
        /// The panic or cancellation.
        reason: String,
    },

    /// The database URL or path could not be used to open a database: it
    /// is not a URL for the backend, the server refused the login or has no
    /// such database, the file cannot be opened. (A server out of reach is
    /// [`Error::DatabaseUnreachable`], a missing directory
    /// [`Error::MissingDirectory`].)
    #[error("cannot open the database of module `{module}` at {url}: {reason}")]
    BadDatabaseUrl {
        /// The module whose database it is.
        module: String,
        /// The URL with its password replaced by `***`: no
        /// password, nothing that might be one.
        url: String,
        /// Why it could not be opened.
        reason: String,
    },

    /// The server holding a PostgreSQL module's database could not be
    /// reached when the module opened: nothing listens at its address (the
    /// connection was refused), the host name does not resolve, no route
    /// leads there, or the server did not answer within the connection
    /// attempt's limit.
    ///
    /// Transient ([`Error::is_transient`]): a server still starting, or
    /// failing over, is reached on a later try, so an application starting
    /// beside its database may try again with a backoff. A wrong host or
    /// port fails the same way every time: bound the tries, then show this
    /// error.
    #[error("cannot reach the database server of module `{module}` at {address}: {reason}")]
    DatabaseUnreachable {
        /// The module whose database it is.
        module: String,
        /// Where the server was looked for, as the URL names it: `host:port`
        /// (several, comma-separated, when the URL lists several hosts), or
        /// a Unix socket's directory and port.
        address: String,
        /// What happened, with the operating system's reason (e.g. `the
        /// server refused the connection (Connection refused (os error
        /// 111))`).
        reason: String,
    },

    /// The directory meant to hold an SQLite module's database file does
    /// not exist: tickbox creates the file, never its directories.
    #[error("cannot open the database of module `{module}` at {path}: the directory {directory} does not exist; create it, or fix the path")]
    MissingDirectory {
        /// The module whose database it is.
        module: String,
        /// The database file's path, with any password replaced by `***`.
        path: String,
        /// The directory that does not exist, shown the same way.
        directory: String,
    },

    /// The database opened but holds no tickbox tables.
    #[error("the database of module `{module}` at {url} has no tickbox tables; is it a tickbox module's database (and, on PostgreSQL, the right schema)?")]
    NotATickboxDatabase {
        /// The module whose database it was meant to be.
        module: String,
        /// The URL with its password replaced by `***`.
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

    /// The database's tickbox tables were made by another version of
    /// tickbox than this one: by a newer one (this process would not honour
    /// what that version records, so it refuses to start), or by an older
    /// one that a tool cannot use until the application has migrated it.
    #[error("the database of module `{module}` {reason}")]
    SchemaVersion {
        /// The module whose database it is.
        module: String,
        /// What differs and what to do.
        reason: String,
    },

    /// Two processes disagree about a handler: a running process records
    /// the same handler (module and name) on another topic in the
    /// publishing module's database.
    #[error("handler `{handler}` of module `{module}` subscribes to `{topic}` here, but a running process records it in the outbox of module `{outbox}` as subscribed to `{recorded}`; run one version of the handler (stop the other process first), or give the handler a new name")]
    SubscriptionConflict {
        /// The outbox whose database records the subscription.
        outbox: String,
        /// The subscribing module.
        module: String,
        /// The handler.
        handler: String,
        /// The topic this process subscribes it to.
        topic: String,
        /// The topic the running process recorded.
        recorded: String,
    },

    /// No such subscription is recorded in the outbox's database.
    #[error("the outbox of module `{outbox}` records no subscription of handler `{handler}` of module `{module}`")]
    NoSuchSubscription {
        /// The outbox.
        outbox: String,
        /// The subscribing module.
        module: String,
        /// The handler.
        handler: String,
    },

    /// A subscription a running process still serves cannot be retired: it
    /// would miss messages, and its process records it again anyway.
    #[error("handler `{handler}` of module `{module}` is still served by a running process (it said so {seen_seconds} s ago); stop that process, or remove the handler from it, before retiring its subscription")]
    SubscriptionInUse {
        /// The subscribing module.
        module: String,
        /// The handler.
        handler: String,
        /// Seconds since a running bus last said it serves it.
        seen_seconds: i64,
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

    /// An effect in a module's journal cannot be read or settled as asked.
    #[error("effect `{effect}` of handler `{handler}` for message {message_id}: {reason}")]
    Effect {
        /// The message whose delivery made the effect.
        message_id: uuid::Uuid,
        /// The handler.
        handler: String,
        /// The effect's name.
        effect: String,
        /// What is wrong.
        reason: String,
    },

    /// A replayed dead letter failed again; it stays a dead letter.
    #[error("replay failed: {0}")]
    ReplayFailed(crate::error::outcome::DeliveryError),

    /// The module is on a running bus.
    #[error(
        "module `{0}` is on a running bus; a module joins one bus at a time (stop that bus first)"
    )]
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

    /// A database call got no answer within its deadline (see
    /// [`ModuleBuilder::call_deadline`](crate::ModuleBuilder::call_deadline)):
    /// the database, or the network to it, went quiet. The call's connection
    /// was closed, never returned to the pool; what the call was part of is
    /// tried again (transient).
    #[error("module `{module}`: {operation} had no answer within its deadline of {deadline:?}; its connection was closed")]
    Deadline {
        /// The module whose database it is.
        module: String,
        /// What the call was doing.
        operation: String,
        /// The deadline it missed.
        deadline: std::time::Duration,
    },

    /// The bus or module is shutting down or has stopped.
    #[error("{0} has stopped")]
    Stopped(&'static str),

    /// The message broker could not be reached or dropped the connection (it
    /// is down, restarting, or the network failed): worth trying again.
    #[error("the message broker at {url} is unreachable: {reason}")]
    BrokerUnreachable {
        /// The broker's URL with its password replaced by `***`.
        url: String,
        /// What failed.
        reason: String,
    },

    /// The message broker refused what tickbox asked (wrong credentials or
    /// virtual host, a queue declared elsewhere with other arguments, no
    /// permission): trying again does not help until it is fixed.
    #[error("the message broker at {url} refused: {reason}")]
    BrokerRefused {
        /// The broker's URL with its password replaced by `***`.
        url: String,
        /// What it refused, and what to do.
        reason: String,
    },
}

/// `Result` with tickbox's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

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
