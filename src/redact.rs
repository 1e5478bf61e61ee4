//! Secrets kept out of everything tickbox shows: errors (Display and
//! Debug), logs, settings' Debug output.

/// A database or broker URL with its secrets replaced by `***`, for logs
/// and messages: every error, log line and `Debug` output of tickbox shows
/// a URL only through this function.
///
/// It is conservative: what it cannot read as a URL, a connection string
/// or a file path is hidden, since a mistyped URL is where a password is
/// most likely to be.
///
/// - **A URL** (`scheme://…`) is parsed (with the `url` crate), not matched
///   against a pattern, and the password is masked wherever it sits: in the
///   user info (`postgres://app:***@db:5432/shop`); in any query parameter
///   whose name (case-insensitive) contains `pass`, `pwd`, `secret`,
///   `token`, `key`, `credential` or `auth` (`?password=***`; AMQP's
///   `auth_mechanism`, which names a mechanism, stays visible); in the
///   fragment (`#***`), where a raw `#` inside a parameter's value puts the
///   rest of it. Everything after the scheme is hidden (`postgres://***`)
///   when the URL does not parse, or when an `@` appears after its
///   authority (a raw `/`, `?` or `#` inside a password makes the parser
///   put the rest of the secret in the path, the query or the fragment).
///   The host, port, database and the other parameters stay readable.
/// - **A key=value connection string** (`host=db user=app password=secret
///   dbname=shop`, values possibly quoted, as libpq reads it) has its
///   secret-named values masked the same way.
/// - **A file path** (an SQLite database, possibly as `sqlite:PATH` or
///   `sqlite://PATH`) is shown as typed, if it reads as one: a `/`, a `\`
///   or a `.` in it, and no `@` or `:` (but for a Windows drive, `C:\`).
/// - **Anything else** — a URL missing part of its `://`
///   (`amqp//guest:secret@host`, `postgres:/app:secret@db`), user info
///   without a scheme (`app:secret@db`), a lone word (which may be a
///   password pasted in the wrong place) — shows only the well-known
///   scheme it starts with, if any, followed by `***` (`amqp//***`), or
///   just `***`.
///
/// ```
/// use tickbox::redact::redact_url;
///
/// assert_eq!(redact_url("postgres://app:secret@db/shop"), "postgres://app:***@db/shop");
/// assert_eq!(
///     redact_url("postgres://app@db:5432/shop?password=secret&sslmode=require"),
///     "postgres://app@db:5432/shop?password=***&sslmode=require"
/// );
/// assert_eq!(redact_url("postgres://app:se/cret@db/shop"), "postgres://***");
/// assert_eq!(redact_url("host=db password='a b' dbname=shop"), "host=db password=*** dbname=shop");
/// assert_eq!(redact_url("data/orders.db"), "data/orders.db");
/// assert_eq!(redact_url("amqp//guest:secret@mq"), "amqp//***");
/// assert_eq!(redact_url("app:secret@db"), "***");
/// assert_eq!(redact_url("secret"), "***");
/// ```
pub fn redact_url(url: &str) -> String {
    let text = url.trim();
    if text.is_empty() {
        return String::new();
    }
    let Some(scheme_end) = text.find("://") else {
        return redact_conninfo(text).unwrap_or_else(|| redact_path(text));
    };
    let scheme = &text[..scheme_end];
    if !is_scheme(scheme) {
        // `://` in something that is not a URL: a key=value string holding
        // a URL as one of its values, or an unknown shape.
        return redact_conninfo(text).unwrap_or_else(|| hidden(text));
    }
    if scheme.eq_ignore_ascii_case("sqlite") {
        return redact_path(text);
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

/// Schemes shown in front of `***` when the rest of a text is hidden: a
/// scheme alone tells a reader what the text was meant to be.
const KNOWN_SCHEMES: [&str; 7] = [
    "postgres",
    "postgresql",
    "sqlite",
    "amqp",
    "amqps",
    "mysql",
    "mariadb",
];

/// `text`, a file path or an `sqlite:` URL, as it is if it reads as a file
/// path; hidden otherwise.
fn redact_path(text: &str) -> String {
    let lower = text.to_ascii_lowercase();
    let path = ["sqlite://", "sqlite:"]
        .iter()
        .find(|prefix| lower.starts_with(*prefix))
        .map_or(text, |prefix| &text[prefix.len()..]);
    if is_file_path(path) {
        text.to_string()
    } else {
        hidden(text)
    }
}

/// Whether `path` reads as a file path and nothing else: SQLite's
/// `:memory:`, or a `/`, `\` or `.` in it, and no `@` nor `:` (but for a
/// Windows drive), which user info and URLs have.
fn is_file_path(path: &str) -> bool {
    if path == ":memory:" {
        return true;
    }
    let bytes = path.as_bytes();
    let drive = bytes.len() > 2
        && bytes[0].is_ascii_alphabetic()
        && bytes[1] == b':'
        && matches!(bytes[2], b'/' | b'\\');
    let rest = if drive { &path[2..] } else { path };
    rest.contains(['/', '\\', '.'])
        && !rest.contains(['@', ':'])
        && !rest.chars().any(char::is_control)
}

/// What may be shown of a text that is none of a URL, a connection string
/// or a file path: the well-known scheme it starts with (after any quotes)
/// and the `:` and `/` after it, then `***`; or only `***`.
fn hidden(text: &str) -> String {
    let rest = text.trim_start_matches(['"', '\'']);
    let word_end = rest
        .find(|c: char| !c.is_ascii_alphanumeric())
        .unwrap_or(rest.len());
    let separators = rest[word_end..].len() - rest[word_end..].trim_start_matches([':', '/']).len();
    let known = KNOWN_SCHEMES
        .iter()
        .any(|scheme| scheme.eq_ignore_ascii_case(&rest[..word_end]));
    if known && separators > 0 {
        let shown = text.len() - rest.len() + word_end + separators;
        format!("{}***", &text[..shown])
    } else {
        "***".to_string()
    }
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
    /// Names holding one of those words that never hold a secret: the
    /// path of a client key file (RabbitMQ's `keyfile`, libpq's `sslkey`)
    /// names where the key is, not the key.
    const NOT_SECRET: [&str; 3] = ["auth_mechanism", "keyfile", "sslkey"];
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

/// A database or broker URL as given, secrets included, where tickbox
/// keeps one (a module's settings, the broker's): it shows itself
/// (`Display`, `Debug`) only through [`redact_url`], so that no log line
/// and no `{:?}` of the settings holding it can print a password;
/// [`SecretUrl::expose`] gives the text itself, to connect with.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SecretUrl(String);

impl SecretUrl {
    /// Keeps `url` as given.
    pub(crate) fn new(url: impl Into<String>) -> Self {
        SecretUrl(url.into())
    }

    /// The URL itself, secrets included: only to connect with, never to
    /// show.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }

    /// The URL as it may be shown.
    pub(crate) fn redacted(&self) -> String {
        redact_url(&self.0)
    }
}

impl std::fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.redacted(), f)
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
            "amqps://mq.internal/%2f?heartbeat=10&password=***&keyfile=/etc/mq/client.key"
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

    #[test]
    fn hides_what_reads_as_neither_a_url_a_connection_string_nor_a_path() {
        for (text, shown) in [
            ("amqp//guest:s3cret@127.0.0.1", "amqp//***"),
            ("postgres//u:S3cret@h/db", "postgres//***"),
            ("postgres:/u:S3cret@h", "postgres:/***"),
            ("postgres:u:S3cret@h/db", "postgres:***"),
            ("POSTGRESQL:///u:S3cret@h", "POSTGRESQL://***"),
            ("'amqp//guest:s3cret@h'", "'amqp//***"),
            ("u:S3cret@h", "***"),
            ("u:S3cret@h/db", "***"),
            ("S3cret@h", "***"),
            ("S3cret", "***"),
            ("pg//u:S3cret@h/db", "***"),
            ("u:S3cret@h://db", "***"),
            ("sqlite://u:S3cret@h/db", "sqlite://***"),
            ("sqlite:u:S3cret@h", "sqlite:***"),
            ("data/u:S3cret@h.db", "***"),
        ] {
            assert_eq!(redact_url(text), shown, "{text}");
        }
        assert_eq!(
            redact_url("mysql://u:S3cret@h"),
            "mysql://u:***@h",
            "a URL of any scheme"
        );
        assert_eq!(redact_url("  "), "");
    }

    #[test]
    fn a_secret_url_shows_itself_redacted() {
        let url = SecretUrl::new("postgres://bob:S3cret@db/app");
        assert_eq!(url.expose(), "postgres://bob:S3cret@db/app");
        assert_eq!(url.to_string(), "postgres://bob:***@db/app");
        assert_eq!(format!("{url:?}"), "\"postgres://bob:***@db/app\"");
        let hostile = SecretUrl::new("amqp//guest:S3cret@mq");
        assert!(!format!("{hostile} {hostile:?}").contains("S3cret"));
    }
}
