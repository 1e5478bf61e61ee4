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

    /// A task tickbox runs in the background (opening a database, a
    /// transaction's own task) panicked or was cancelled.
    #[error("{what}: the task running it failed: {reason}")]
    Task {
        /// What the task was doing.
        what: String,
        /// The panic or cancellation.
        reason: String,
    },

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
    ReplayFailed(crate::DeliveryError),

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
        /// The broker's URL with any password removed.
        url: String,
        /// What failed.
        reason: String,
    },

    /// The message broker refused what tickbox asked (wrong credentials or
    /// virtual host, a queue declared elsewhere with other arguments, no
    /// permission): trying again does not help until it is fixed.
    #[error("the message broker at {url} refused: {reason}")]
    BrokerRefused {
        /// The broker's URL with any password removed.
        url: String,
        /// What it refused, and what to do.
        reason: String,
    },
}

/// `Result` with tickbox's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A database URL with its secrets replaced by `***`, for logs and
/// messages. tickbox's own errors never show a password.
///
/// The URL is parsed (with the `url` crate), not matched against a pattern,
/// and the password is masked wherever it sits:
///
/// - in the user info: `postgres://app:***@db:5432/shop`;
/// - in any query parameter whose name (case-insensitive) contains `pass`,
///   `pwd`, `secret`, `token`, `key`, `credential` or `auth` (so `password`,
///   `passwd`, `sslpassword`, `api_key`, `access_token`, `credentials`…):
///   `?password=***`. AMQP's `auth_mechanism`, which names a mechanism
///   (`PLAIN`, `EXTERNAL`) and never holds a secret, stays visible;
/// - in the fragment (`#***`), where a raw `#` inside a parameter's value
///   puts the rest of it;
/// - everywhere after the scheme (`postgres://***`) when the URL does not
///   parse, or when an `@` appears after its authority: a raw `/`, `?` or
///   `#` inside a password makes the parser put the rest of the secret in
///   the path, the query or the fragment.
///
/// The host, port, database and the other parameters stay readable.
/// A string without a scheme is either a PostgreSQL key=value connection
/// string (`host=db user=app password=secret dbname=shop`, values possibly
/// quoted), whose secret-named values are masked the same way, or a file
/// path, which is returned as it is; so are `sqlite://` URLs (SQLite has no
/// credentials, and a path is easier to read as typed).
///
/// ```
/// use tickbox::redact_url;
///
/// assert_eq!(redact_url("postgres://app:secret@db/shop"), "postgres://app:***@db/shop");
/// assert_eq!(
///     redact_url("postgres://app@db:5432/shop?password=secret&sslmode=require"),
///     "postgres://app@db:5432/shop?password=***&sslmode=require"
/// );
/// assert_eq!(redact_url("postgres://app:se/cret@db/shop"), "postgres://***");
/// assert_eq!(redact_url("host=db password='a b' dbname=shop"), "host=db password=*** dbname=shop");
/// assert_eq!(redact_url("data/orders.db"), "data/orders.db");
/// ```
pub fn redact_url(url: &str) -> String {
    let text = url.trim();
    let Some(scheme_end) = text.find("://") else {
        return redact_conninfo(text).unwrap_or_else(|| text.to_string());
    };
    let scheme = &text[..scheme_end];
    if !is_scheme(scheme) {
        // `://` in something that is not a URL: a key=value string holding
        // a URL as one of its values, or an unknown shape, of which only
        // the part before `://` is safe to show.
        return redact_conninfo(text).unwrap_or_else(|| format!("{scheme}://***"));
    }
    if scheme.eq_ignore_ascii_case("sqlite") {
        return text.to_string();
    }
    let hidden = || format!("{scheme}://***");
    let Ok(mut parsed) = url::Url::parse(text) else {
        return hidden();
    };
    // An `@` after the authority as the parser saw it means that the user
    // info went on past a `/`, `?` or `#`: part of a password would be
    // shown as a path, a query or a fragment.
    let after_scheme = &text[scheme_end + 3..];
    let authority_end = after_scheme
        .find(['/', '?', '#', '\\'])
        .unwrap_or(after_scheme.len());
    if after_scheme[authority_end..].contains('@') {
        return hidden();
    }
    if parsed.password().is_some() && parsed.set_password(Some("***")).is_err() {
        return hidden();
    }
    if let Some(query) = parsed.query().map(redact_query) {
        parsed.set_query(Some(&query));
    }
    // A database URL has no use for a fragment: one appears when a raw `#`
    // cut a secret parameter's value in two.
    if parsed.fragment().is_some() {
        parsed.set_fragment(Some("***"));
    }
    parsed.into()
}

/// A URL scheme: a letter, then letters, digits, `+`, `-` or `.`.
fn is_scheme(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
}

/// True when a parameter of that name may hold a secret.
fn is_secret_name(name: &str) -> bool {
    /// Words that mark a secret; `pass` covers `password`, `passwd` and
    /// `sslpassword`, `key` covers `api_key`, `token` `access_token`.
    const SECRET_WORDS: [&str; 7] = [
        "pass",
        "pwd",
        "secret",
        "token",
        "key",
        "credential",
        "auth",
    ];
    /// Names holding one of those words that never hold a secret.
    const NOT_SECRET: [&str; 1] = ["auth_mechanism"];
    let name = name.to_lowercase();
    SECRET_WORDS.iter().any(|word| name.contains(word)) && !NOT_SECRET.contains(&name.as_str())
}

/// A URL's query with the values of secret-named parameters masked; the
/// other parameters are kept as written.
fn redact_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| {
            let name = url::form_urlencoded::parse(pair.as_bytes())
                .next()
                .map(|(name, _)| name.into_owned())
                .unwrap_or_default();
            match pair.split_once('=') {
                Some((raw_name, _)) if is_secret_name(&name) => format!("{raw_name}=***"),
                _ => pair.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// A PostgreSQL key=value connection string (`host=db password=secret`,
/// a value possibly single-quoted, with `\` escapes, as libpq reads it)
/// with its secret-named values masked, and any URL among the other values
/// redacted; `None` when `text` does not start with a `key=value` pair (a
/// file path). Whatever follows a pair that does not parse is masked.
fn redact_conninfo(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let skip_space = |mut at: usize| {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    };
    let mut out = String::with_capacity(text.len());
    let mut pairs = 0;
    let mut at = 0;
    loop {
        let start = skip_space(at);
        out.push_str(&text[at..start]);
        if start == bytes.len() {
            break;
        }
        let mut name_end = start;
        while name_end < bytes.len()
            && (bytes[name_end].is_ascii_alphanumeric() || bytes[name_end] == b'_')
        {
            name_end += 1;
        }
        let name = &text[start..name_end];
        let equals = skip_space(name_end);
        let is_pair = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && bytes.get(equals) == Some(&b'=');
        if !is_pair {
            if pairs == 0 {
                return None;
            }
            out.push_str("***");
            return Some(out);
        }
        let value_start = skip_space(equals + 1);
        out.push_str(&text[start..value_start]);
        let mut end = value_start;
        if bytes.get(end) == Some(&b'\'') {
            end += 1;
            loop {
                match bytes.get(end) {
                    // An unterminated quote: libpq refuses the string, and
                    // what follows may all be the secret.
                    None => {
                        out.push_str("***");
                        return Some(out);
                    }
                    Some(b'\\') => end += 2,
                    Some(b'\'') => {
                        end += 1;
                        break;
                    }
                    Some(_) => end += 1,
                }
            }
        } else {
            while end < bytes.len() && !bytes[end].is_ascii_whitespace() {
                end += if bytes[end] == b'\\' { 2 } else { 1 };
            }
        }
        let end = end.min(bytes.len());
        let value = &text[value_start..end];
        if is_secret_name(name) {
            out.push_str("***");
        } else if value.contains("://") {
            out.push_str(&redact_url(value));
        } else {
            out.push_str(value);
        }
        pairs += 1;
        at = end;
    }
    Some(out)
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
    fn redacts_the_password_in_the_user_info() {
        assert_eq!(
            redact_url("postgres://bob:secret@db:5432/app"),
            "postgres://bob:***@db:5432/app"
        );
        assert_eq!(
            redact_url("postgresql://bob:secret@db/app?sslmode=require"),
            "postgresql://bob:***@db/app?sslmode=require"
        );
        assert_eq!(
            redact_url("postgres://:secret@db/app"),
            "postgres://:***@db/app"
        );
        assert_eq!(
            redact_url("postgres://bob:se%2Fc%3Fret@db/app"),
            "postgres://bob:***@db/app"
        );
        assert_eq!(
            redact_url("postgres://bob:p@ss@word@db/app"),
            "postgres://bob:***@db/app"
        );
        assert_eq!(
            redact_url("postgres://bob:sec ret@db/app"),
            "postgres://bob:***@db/app"
        );
        assert_eq!(
            redact_url("postgres://bob:secret@[::1]:5432/app"),
            "postgres://bob:***@[::1]:5432/app"
        );
        assert_eq!(
            redact_url("  postgres://bob:secret@db/app\n"),
            "postgres://bob:***@db/app"
        );
    }

    #[test]
    fn leaves_urls_without_secrets_as_they_are() {
        for url in [
            "postgres://bob@db/app",
            "postgres://db/app",
            "postgres://postgres@127.0.0.1:5432/test",
            "postgresql://bob@db:5432/app?sslmode=disable&application_name=shop&connect_timeout=5",
            "postgres:///app?host=/var/run/postgresql",
        ] {
            assert_eq!(redact_url(url), url);
        }
        assert_eq!(
            redact_url("postgres://bob:@db/app"),
            "postgres://bob@db/app"
        );
    }

    #[test]
    fn redacts_secret_named_query_parameters() {
        assert_eq!(
            redact_url("postgres://postgres@127.0.0.1:5432/nodb?password=S3cret!"),
            "postgres://postgres@127.0.0.1:5432/nodb?password=***"
        );
        assert_eq!(
            redact_url(
                "postgres://bob:one@db/app?sslmode=require&password=two&application_name=shop"
            ),
            "postgres://bob:***@db/app?sslmode=require&password=***&application_name=shop"
        );
        for name in [
            "password",
            "PASSWORD",
            "Password",
            "passwd",
            "pwd",
            "pass",
            "secret",
            "client_secret",
            "token",
            "access_token",
            "key",
            "api_key",
            "ApiKey",
            "sslpassword",
            "credentials",
            "auth",
            "authorization",
            "%70assword",
            "pass+word",
        ] {
            assert_eq!(
                redact_url(&format!("postgres://db/app?a=1&{name}=S3cret&b=2")),
                format!("postgres://db/app?a=1&{name}=***&b=2"),
                "{name}"
            );
        }
        assert_eq!(
            redact_url("postgres://db/app?password=&sslmode=disable"),
            "postgres://db/app?password=***&sslmode=disable"
        );
        // A name alone, without a value, holds nothing to hide.
        assert_eq!(
            redact_url("postgres://db/app?password"),
            "postgres://db/app?password"
        );
        assert_eq!(
            redact_url("postgres://db/app?password=S3#cret&sslmode=require"),
            "postgres://db/app?password=***#***"
        );
    }

    #[test]
    fn never_shows_a_password_holding_url_delimiters() {
        for secret in [
            "S3cret!",
            "S3/cret",
            "S3?cret",
            "S3#cret",
            "S3@cret",
            "S3:cret",
            "S3%2Fcret",
            "S3 cret",
            "S3=cret",
            "S3\\cret",
            "S3'cret",
            "S3;cret",
            "/S3cret",
            "S3cret/",
        ] {
            for url in [
                format!("postgres://bob:{secret}@db.example:5432/shop?sslmode=require"),
                format!("postgres://bob@db.example:5432/shop?password={secret}&sslmode=require"),
                format!("amqps://bob:{secret}@mq.example:5671/%2f"),
            ] {
                let shown = redact_url(&url);
                assert!(!shown.contains("cret"), "{url} -> {shown}");
                assert!(
                    shown.starts_with(&url[..url.find("://").unwrap() + 3]),
                    "{url} -> {shown}"
                );
            }
            let conninfo = format!(
                "host=db.example password='{}' dbname=shop",
                secret.replace('\\', "\\\\").replace('\'', "\\'")
            );
            let shown = redact_url(&conninfo);
            assert_eq!(
                shown, "host=db.example password=*** dbname=shop",
                "{conninfo}"
            );
        }
    }

    #[test]
    fn masks_everything_after_the_scheme_when_the_password_breaks_the_url() {
        for url in [
            // A raw `/` ends the authority: the rest is parsed as the path.
            "postgres://bob:se/cret@db:5432/app",
            "postgres://bob:1234/cret@db:5432/app",
            // A raw `?` starts the query, a raw `#` the fragment.
            "postgres://bob:se?cret@db/app",
            "postgres://bob:1234?cret@db/app",
            "postgres://bob:1234#cret@db/app",
            // Does not parse at all.
            "postgres://bob:secret@db:99999/app",
            "postgres://bob:secret@db:5432,db2:5433/app",
        ] {
            assert_eq!(redact_url(url), "postgres://***", "{url}");
        }
        assert_eq!(
            redact_url("postgresql://bob:se/cret@db/app?password=x"),
            "postgresql://***"
        );
        // Not a URL, whatever is before `://`.
        assert_eq!(
            redact_url("\"postgres://bob:secret@db/app\""),
            "\"postgres://***"
        );
    }

    #[test]
    fn redacts_amqp_urls_the_same_way() {
        assert_eq!(
            redact_url("amqp://guest:guest@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            redact_url(
                "amqps://app:S3cret@mq.internal:5671/shop?auth_mechanism=external&heartbeat=30"
            ),
            "amqps://app:***@mq.internal:5671/shop?auth_mechanism=external&heartbeat=30"
        );
        assert_eq!(
            redact_url(
                "amqps://mq.internal/%2f?heartbeat=10&password=S3cret&keyfile=/etc/mq/client.key"
            ),
            "amqps://mq.internal/%2f?heartbeat=10&password=***&keyfile=***"
        );
        assert_eq!(
            redact_url("amqp://guest:gu/est@127.0.0.1:5672/%2f"),
            "amqp://***"
        );
    }

    #[test]
    fn redacts_key_value_connection_strings() {
        assert_eq!(
            redact_url("host=db user=app password=secret dbname=shop"),
            "host=db user=app password=*** dbname=shop"
        );
        assert_eq!(
            redact_url("host=db password='a b c' dbname=shop"),
            "host=db password=*** dbname=shop"
        );
        assert_eq!(
            redact_url(r"password='it\'s \\ secret' host=db"),
            "password=*** host=db"
        );
        assert_eq!(
            redact_url("host = db  password = secret\tport=5432"),
            "host = db  password = ***\tport=5432"
        );
        assert_eq!(
            redact_url(r"PassWord=se\ cret sslpassword=x application_name='my shop'"),
            "PassWord=*** sslpassword=*** application_name='my shop'"
        );
        assert_eq!(
            redact_url("host=db dbname=shop sslmode=require"),
            "host=db dbname=shop sslmode=require"
        );
        // An unterminated quote or a broken pair: the rest may all be secret.
        assert_eq!(
            redact_url("host=db password='secret dbname=shop"),
            "host=db password=***"
        );
        assert_eq!(redact_url("host=db secret stuff"), "host=db ***");
        // A URL as one of the values.
        assert_eq!(
            redact_url("DATABASE_URL=postgres://bob:secret@db/app"),
            "DATABASE_URL=postgres://bob:***@db/app"
        );
        assert_eq!(redact_url("host=db password=a://b"), "host=db password=***");
    }

    #[test]
    fn leaves_sqlite_paths_as_they_are() {
        for path in [
            "data/orders.db",
            "minishop-data/orders.db",
            "/tmp/tickbox test/orders.db",
            "orders.db",
            ":memory:",
            "sqlite:orders.db",
            "sqlite://data/orders.db",
            "sqlite:///var/lib/shop/orders.db",
            "sqlite://my data/orders.db",
            r"C:\data\orders.db",
            "./data=1/orders.db",
        ] {
            assert_eq!(redact_url(path), path);
        }
    }
}
