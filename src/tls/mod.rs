//! TLS: what a URL asks of encryption and verification, and (with the
//! `tls` feature) the rustls client configuration that gives it.
//!
//! Each server keeps its own ecosystem's knobs: `postgres` reads libpq's
//! `sslmode`, `sslrootcert`, `sslcert` and `sslkey`; `mysql` reads the
//! `mysql` client's `ssl-mode`, `ssl-ca`, `ssl-cert` and `ssl-key`; `amqp`
//! reads `amqps://` and RabbitMQ's `cacertfile`, `certfile` and `keyfile`. This file owns what
//! they share: how certificates are verified, where trusted roots come
//! from, and how a failed handshake is told in plain words.
//!
//! Without the `tls` feature a URL that asks for TLS is refused at start,
//! naming the feature ([`refuse_without_tls`]); a URL that only allows it
//! (libpq's default, `sslmode=prefer`) connects in clear, as before.

#[cfg(feature = "amqp")]
pub(crate) mod amqp;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;

/// How closely a server's certificate is checked, from least to most.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Encrypted, but any certificate is taken (libpq's `require` without a
    /// root certificate): protects against listening, not against a server
    /// in the middle. Never asked by `amqps://`.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    Nothing,
    /// The certificate must chain to a trusted root; its names are not
    /// checked (`verify-ca`). Never asked by `amqps://`.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    Chain,
    /// The certificate must chain to a trusted root and name the host
    /// connected to (`verify-full`, and what `amqps://` does).
    ChainAndName,
}

/// What one connection asks of TLS, whatever the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    /// How closely the server's certificate is checked.
    pub(crate) verify: Verify,
    /// A PEM file of the CAs to trust; `None` means the operating system's
    /// trusted roots.
    pub(crate) root_cert: Option<String>,
    /// A PEM file holding the client's certificate chain, for a server that
    /// asks for one.
    pub(crate) client_cert: Option<String>,
    /// The PEM file holding the client certificate's private key.
    pub(crate) client_key: Option<String>,
}

/// Shows whether module `module`'s newest connection to its database
/// server (`server`: `postgres`, `mysql`) is encrypted:
/// `tickbox_connection_encrypted{module, server}`, 1 or 0.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn report_encryption(module: &str, server: &'static str, encrypted: bool) {
    metrics::gauge!("tickbox_connection_encrypted", "module" => module.to_owned(), "server" => server)
        .set(if encrypted { 1.0 } else { 0.0 });
}

/// The refusal of a URL that asks for TLS (`what`, e.g. `sslmode=require`)
/// in a build without the `tls` feature. Called only by builds without it,
/// and tested directly so that a build with it checks the wording too.
#[cfg_attr(feature = "tls", allow(dead_code))]
pub(crate) fn refuse_without_tls(what: &str) -> String {
    format!(
        "the URL asks for TLS ({what}), which this build of tickbox does not include: \
         enable tickbox's `tls` feature"
    )
}

#[cfg(feature = "tls")]
mod config;
#[cfg(all(feature = "tls", feature = "mysql"))]
pub(crate) use config::system_root_certs;
#[cfg(feature = "tls")]
pub(crate) use config::{client_config, explain_handshake_failure};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_names_the_feature_and_what_asked() {
        let refusal = refuse_without_tls("sslmode=verify-full");
        assert!(refusal.contains("`tls` feature"), "{refusal}");
        assert!(refusal.contains("sslmode=verify-full"), "{refusal}");
    }
}
