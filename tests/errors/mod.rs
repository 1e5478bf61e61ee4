//! Errors that say what is wrong, and show no secret.
//!
//! `secrets`: a URL of any shape — mistyped, missing part of its `://`, a
//! connection string, user info without a scheme, a lone word that may be
//! a password — through every place that takes one (the SQLite and
//! PostgreSQL module builders, the broker's settings, the examples'
//! command lines): its password appears in no error (Display, Debug) and
//! in no usage message. `opening`: a database that cannot be opened says
//! why — a server refusing the connection, a directory that does not
//! exist. `broker` (the `amqp` feature): a login the broker refuses is
//! reported by tickbox alone, in its own words.

#[cfg(feature = "amqp")]
mod broker;
mod opening;
mod secrets;

/// A URL's secret in every shape a person may type it in; each holds
/// `s3cret`, whatever its case.
pub(crate) const HOSTILE: [&str; 7] = [
    "amqp//guest:s3cret@h",
    "postgres//u:S3cret@h/db",
    "postgres:/u:S3cret@h",
    "host=h password=S3cret",
    "u:S3cret@h",
    "S3cret",
    "mysql://u:S3cret@h",
];

/// Fails the test if `shown` holds the secret of [`HOSTILE`].
#[track_caller]
pub(crate) fn assert_hidden(what: &str, shown: &str) {
    assert!(
        !shown.to_lowercase().contains("s3cret"),
        "{what} shows the secret: {shown}"
    );
}
