//! MariaDB's and MySQL's TLS knobs, spelt as the `mysql` client and MySQL
//! Shell spell them, and (with the `tls` feature) the mysql_async options
//! that give them.
//!
//! | `ssl-mode` | encrypted | certificate checked |
//! | --- | --- | --- |
//! | `DISABLED` | never | — |
//! | `PREFERRED` (default) | never (see below) | — |
//! | `REQUIRED` | always | no (with `ssl-ca`: refused, as `VERIFY_CA`) |
//! | `VERIFY_CA` | refused (see below) | the chain |
//! | `VERIFY_IDENTITY` | always | the chain and the host's name |
//!
//! The mode's name is read in any case. `ssl-ca` names a PEM file of
//! trusted CAs (none: the operating system's store); `ssl-cert` and
//! `ssl-key` give a client certificate for a server that asks for one.
//!
//! `PREFERRED`, the `mysql` client's default, connects in clear: mysql_async
//! either demands TLS or does without, and cannot fall back. Name
//! `REQUIRED` or stronger to encrypt.
//!
//! `VERIFY_CA` (and `REQUIRED` with `ssl-ca`, which the `mysql` client
//! takes as `VERIFY_CA`) is refused at connection with the reason:
//! mysql_async 0.37 would skip the name check by looking for
//! `NotValidForName` in the text of rustls's error, which rustls 0.23 no
//! longer writes, so every certificate not naming the host would be
//! refused anyway. `VERIFY_IDENTITY` checks both.

use super::{TlsSettings, Verify};

/// The `mysql` client's `--ssl-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Never encrypted.
    Disabled,
    /// The client's default; in clear here (see the module's docs).
    Preferred,
    /// Always encrypted.
    Required,
    /// Always encrypted, the chain checked.
    VerifyCa,
    /// Always encrypted, the chain and the host's name checked.
    VerifyIdentity,
}

impl SslMode {
    /// The mode as the `mysql` client spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SslMode::Disabled => "DISABLED",
            SslMode::Preferred => "PREFERRED",
            SslMode::Required => "REQUIRED",
            SslMode::VerifyCa => "VERIFY_CA",
            SslMode::VerifyIdentity => "VERIFY_IDENTITY",
        }
    }

    /// Whether the mode demands an encrypted session.
    pub(crate) fn encrypts(self) -> bool {
        matches!(
            self,
            SslMode::Required | SslMode::VerifyCa | SslMode::VerifyIdentity
        )
    }
}

/// What a MariaDB or MySQL URL asks of TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MyTls {
    /// The URL's `ssl-mode` (`PREFERRED` when it names none).
    pub(crate) mode: SslMode,
    /// The CA file, client certificate and key the URL names, and the
    /// verification its mode asks for.
    pub(crate) settings: TlsSettings,
}

/// tickbox's TLS parameters, taken out of the URL before mysql_async reads
/// it (it refuses parameters it does not know).
const TLS_PARAMETERS: [&str; 4] = ["ssl-mode", "ssl-ca", "ssl-cert", "ssl-key"];

/// mysql_async's own TLS parameters, refused: one way to ask for TLS, the
/// one the `mysql` client knows.
const CLIENT_TLS_PARAMETERS: [&str; 4] = [
    "require_ssl",
    "verify_ca",
    "verify_identity",
    "built_in_roots",
];

/// Splits a MariaDB or MySQL URL into the URL mysql_async is given (the TLS
/// parameters taken out) and what it asks of TLS. Without the `tls`
/// feature, a URL that requires TLS is refused, naming the feature.
pub(crate) fn split_url(url: &str) -> Result<(String, MyTls), String> {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, query),
        None => (url, ""),
    };
    let mut kept = Vec::new();
    let mut mode = None;
    let mut root_cert = None;
    let mut client_cert = None;
    let mut client_key = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let key = pair.split_once('=').map_or(pair, |(key, _)| key);
        if CLIENT_TLS_PARAMETERS.contains(&key) {
            return Err(format!(
                "`{key}` is not read here: ask for TLS with `ssl-mode` (REQUIRED, VERIFY_CA, \
                 VERIFY_IDENTITY) and name a CA file with `ssl-ca`"
            ));
        }
        if !TLS_PARAMETERS.contains(&key) {
            kept.push(pair);
            continue;
        }
        let value = url::form_urlencoded::parse(pair.as_bytes())
            .next()
            .map(|(_, value)| value.into_owned())
            .unwrap_or_default();
        match key {
            "ssl-mode" => {
                mode = Some(match value.to_ascii_uppercase().as_str() {
                    "DISABLED" => SslMode::Disabled,
                    "PREFERRED" => SslMode::Preferred,
                    "REQUIRED" => SslMode::Required,
                    "VERIFY_CA" => SslMode::VerifyCa,
                    "VERIFY_IDENTITY" => SslMode::VerifyIdentity,
                    _ => {
                        return Err(format!(
                            "ssl-mode `{value}` is not one of DISABLED, PREFERRED, REQUIRED, \
                             VERIFY_CA, VERIFY_IDENTITY"
                        ))
                    }
                })
            }
            "ssl-ca" => root_cert = Some(value),
            "ssl-cert" => client_cert = Some(value),
            _ => client_key = Some(value),
        }
    }
    let mode = mode.unwrap_or(SslMode::Preferred);
    let verify = match mode {
        SslMode::VerifyIdentity => Verify::ChainAndName,
        SslMode::VerifyCa => Verify::Chain,
        // As the `mysql` client: a CA given makes `REQUIRED` check the chain.
        SslMode::Required if root_cert.is_some() => Verify::Chain,
        _ => Verify::Nothing,
    };
    if !cfg!(feature = "tls") && mode.encrypts() {
        return Err(super::refuse_without_tls(&format!(
            "ssl-mode={}",
            mode.name()
        )));
    }
    let rewritten = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((
        rewritten,
        MyTls {
            mode,
            settings: TlsSettings {
                verify,
                root_cert,
                client_cert,
                client_key,
            },
        },
    ))
}

/// The mysql_async TLS options `tls` asks for: `None` for a session in
/// clear. The files the URL names are read first through
/// [`super::client_config`], so that a missing or unreadable one is named
/// in plain words before any connection is tried; trusted roots are the
/// CA file's, or else the operating system's (never the roots mysql_async
/// carries built in).
#[cfg(feature = "tls")]
pub(crate) fn ssl_opts(tls: &MyTls) -> Result<Option<mysql_async::SslOpts>, String> {
    use mysql_async::{ClientIdentity, SslOpts};
    use std::path::PathBuf;
    if !tls.mode.encrypts() {
        return Ok(None);
    }
    let settings = &tls.settings;
    if settings.verify == Verify::Chain {
        return Err(format!(
            "ssl-mode={}{} checks the certificate's chain but not its name, which the \
             MariaDB/MySQL client tickbox uses (mysql_async 0.37) cannot do: use \
             ssl-mode=VERIFY_IDENTITY with the host name the certificate gives",
            tls.mode.name(),
            if tls.mode == SslMode::Required {
                " with ssl-ca"
            } else {
                ""
            }
        ));
    }
    super::client_config(settings)?;
    // Paths, or certificates (DER), as mysql_async takes them.
    let roots: Vec<_> = match (&settings.root_cert, settings.verify) {
        (Some(path), _) => vec![PathBuf::from(path).into()],
        // Nothing is verified: mysql_async still wants a root to build its
        // verifier with, which its built-in ones give.
        (None, Verify::Nothing) => Vec::new(),
        (None, _) => super::system_root_certs()?
            .iter()
            .map(|cert| cert.as_ref().to_vec().into())
            .collect(),
    };
    let mut opts = SslOpts::default()
        .with_disable_built_in_roots(!roots.is_empty())
        .with_root_certs(roots)
        .with_danger_accept_invalid_certs(settings.verify == Verify::Nothing);
    if let (Some(cert), Some(key)) = (&settings.client_cert, &settings.client_key) {
        opts = opts.with_client_identity(Some(ClientIdentity::new(
            PathBuf::from(cert).into(),
            PathBuf::from(key).into(),
        )));
    }
    Ok(Some(opts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, MyTls) {
        split_url(url).unwrap()
    }

    #[test]
    fn without_ssl_mode_the_session_is_in_clear_and_the_url_unchanged() {
        let (url, tls) = split("mysql://u@h:3306/db?prefer_socket=false");
        assert_eq!(url, "mysql://u@h:3306/db?prefer_socket=false");
        assert_eq!(tls.mode, SslMode::Preferred);
        assert!(!tls.mode.encrypts());
        assert_eq!(split("mysql://u@h/db").0, "mysql://u@h/db");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn the_tls_parameters_are_taken_out_and_the_others_kept() {
        let (url, tls) = split(
            "mysql://u:p@h:3307/db?prefer_socket=false&ssl-mode=verify_identity&ssl-ca=%2Ftmp%2Fca.pem&ssl-cert=/c.pem&ssl-key=/k.pem&tcp_keepalive=10000",
        );
        assert_eq!(
            url,
            "mysql://u:p@h:3307/db?prefer_socket=false&tcp_keepalive=10000"
        );
        assert_eq!(tls.mode, SslMode::VerifyIdentity);
        assert_eq!(tls.settings.verify, Verify::ChainAndName);
        assert_eq!(tls.settings.root_cert.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(tls.settings.client_cert.as_deref(), Some("/c.pem"));
        assert_eq!(tls.settings.client_key.as_deref(), Some("/k.pem"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn the_modes_verify_as_the_mysql_client_does() {
        let verify = |query: &str| split(&format!("mysql://h/db?{query}")).1.settings.verify;
        assert_eq!(verify("ssl-mode=REQUIRED"), Verify::Nothing);
        assert_eq!(verify("ssl-mode=REQUIRED&ssl-ca=/ca"), Verify::Chain);
        assert_eq!(verify("ssl-mode=VERIFY_CA"), Verify::Chain);
        assert_eq!(verify("ssl-mode=Verify_Identity"), Verify::ChainAndName);
        assert!(!split("mysql://h/db?ssl-mode=DISABLED").1.mode.encrypts());
    }

    #[test]
    fn an_unknown_mode_and_the_client_libraries_own_knobs_are_refused() {
        let error = split_url("mysql://h/db?ssl-mode=strict").unwrap_err();
        assert!(error.contains("VERIFY_IDENTITY"), "{error}");
        let error = split_url("mysql://h/db?require_ssl=true").unwrap_err();
        assert!(error.contains("ssl-mode"), "{error}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_the_feature_a_url_requiring_tls_is_refused_and_preferred_is_in_clear() {
        for mode in ["REQUIRED", "VERIFY_CA", "VERIFY_IDENTITY"] {
            let error = split_url(&format!("mysql://h/db?ssl-mode={mode}")).unwrap_err();
            assert!(error.contains("`tls` feature"), "{error}");
            assert!(error.contains(mode), "{error}");
        }
        assert!(split_url("mysql://h/db?ssl-mode=PREFERRED").is_ok());
        assert!(split_url("mysql://h/db?ssl-mode=disabled").is_ok());
    }
}
