//! PostgreSQL's TLS knobs, as libpq means them, and (with the `tls`
//! feature) the connector tokio-postgres negotiates TLS through.
//!
//! | `sslmode` | encrypted | certificate checked |
//! | --- | --- | --- |
//! | `disable` | never | — |
//! | `prefer` (default) | if the server offers it | no |
//! | `require` | always | no; the chain, if `sslrootcert` is given |
//! | `verify-ca` | always | the chain |
//! | `verify-full` | always | the chain and the host's name |
//!
//! `sslrootcert` names a PEM file of trusted CAs (`system`, or none: the
//! operating system's store — libpq would look in `~/.postgresql/root.crt`);
//! `sslrootcert=system` without an `sslmode` means `verify-full`, as in
//! libpq 16. `sslcert` and `sslkey` give a client certificate for a server
//! that asks for one.

use super::{TlsSettings, Verify};

/// libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Never encrypted.
    Disable,
    /// Encrypted when the server offers it, in clear otherwise.
    Prefer,
    /// Always encrypted.
    Require,
    /// Always encrypted, the chain checked.
    VerifyCa,
    /// Always encrypted, the chain and the host's name checked.
    VerifyFull,
}

impl SslMode {
    /// The mode as a URL spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// What a PostgreSQL URL asks of TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PgTls {
    /// The URL's `sslmode` (`prefer` when it names none).
    pub(crate) mode: SslMode,
    /// The CA file, client certificate and key the URL names, and the
    /// verification its mode asks for.
    pub(crate) settings: TlsSettings,
}

/// The URL's parameters that tokio-postgres does not know (it refuses
/// them), or knows otherwise (`sslmode`: only up to `require`).
const TLS_PARAMETERS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Splits a PostgreSQL URL into the URL tokio-postgres is given (its TLS
/// parameters taken out, `sslmode` set to what tokio-postgres should
/// negotiate) and what it asks of TLS. Without the `tls` feature, a URL
/// that requires TLS is refused, naming the feature.
pub(crate) fn split_url(url: &str) -> Result<(String, PgTls), String> {
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
        if !TLS_PARAMETERS.contains(&key) {
            kept.push(pair);
            continue;
        }
        let value = url::form_urlencoded::parse(pair.as_bytes())
            .next()
            .map(|(_, value)| value.into_owned())
            .unwrap_or_default();
        match key {
            "sslmode" => {
                mode = Some(match value.as_str() {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    // `allow` (clear first, TLS if refused) is libpq's
                    // too, but tokio-postgres cannot retry that way.
                    other => {
                        return Err(format!(
                            "sslmode `{other}` is not one of disable, prefer, require, verify-ca, verify-full"
                        ))
                    }
                })
            }
            "sslrootcert" => root_cert = Some(value),
            "sslcert" => client_cert = Some(value),
            _ => client_key = Some(value),
        }
    }
    let mode = mode.unwrap_or(if root_cert.as_deref() == Some("system") {
        SslMode::VerifyFull
    } else {
        SslMode::Prefer
    });
    let root_cert = root_cert.filter(|path| path != "system");
    let verify = match mode {
        SslMode::VerifyFull => Verify::ChainAndName,
        SslMode::VerifyCa => Verify::Chain,
        // As libpq: a root certificate given makes `require` check the chain.
        SslMode::Require if root_cert.is_some() => Verify::Chain,
        _ => Verify::Nothing,
    };
    let negotiate = match mode {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => "require",
    };
    if !cfg!(feature = "tls") && negotiate == "require" {
        return Err(super::refuse_without_tls(&format!(
            "sslmode={}",
            mode.name()
        )));
    }
    // `prefer` without TLS compiled in connects in clear, as tokio-postgres
    // does when it has no TLS to offer.
    kept.push(match negotiate {
        "disable" => "sslmode=disable",
        "prefer" => "sslmode=prefer",
        _ => "sslmode=require",
    });
    let rewritten = format!("{base}?{}", kept.join("&"));
    Ok((
        rewritten,
        PgTls {
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

#[cfg(feature = "tls")]
pub(crate) use connector::{PgConnector, PgTlsStream};

/// The connector tokio-postgres negotiates TLS through: rustls over
/// tokio's socket.
#[cfg(feature = "tls")]
mod connector {
    use std::future::Future;
    use std::io;
    use std::pin::Pin;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};
    use tokio_postgres::Socket;

    /// Makes one TLS connection per host tokio-postgres tries, and records
    /// whether a handshake succeeded (under `sslmode=prefer` a server may
    /// decline TLS, and the session is then in clear).
    #[derive(Clone)]
    pub(crate) struct PgConnector {
        /// The rustls configuration the URL asks for.
        config: Arc<rustls::ClientConfig>,
        /// Set once a handshake has succeeded: the session is encrypted.
        encrypted: Arc<AtomicBool>,
    }

    impl PgConnector {
        /// A connector for `config`.
        pub(crate) fn new(config: Arc<rustls::ClientConfig>) -> Self {
            PgConnector {
                config,
                encrypted: Arc::new(AtomicBool::new(false)),
            }
        }

        /// Whether the session it opened is encrypted.
        pub(crate) fn encrypted(&self) -> bool {
            self.encrypted.load(Ordering::Acquire)
        }
    }

    impl MakeTlsConnect<Socket> for PgConnector {
        type Stream = PgTlsStream;
        type TlsConnect = PgTlsConnect;
        type Error = io::Error;

        fn make_tls_connect(&mut self, host: &str) -> io::Result<PgTlsConnect> {
            let name = rustls::pki_types::ServerName::try_from(host.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
            Ok(PgTlsConnect {
                connector: tokio_rustls::TlsConnector::from(self.config.clone()),
                name,
                encrypted: self.encrypted.clone(),
            })
        }
    }

    /// One handshake with one host.
    pub(crate) struct PgTlsConnect {
        /// rustls, configured.
        connector: tokio_rustls::TlsConnector,
        /// The host, as its certificate must name it.
        name: rustls::pki_types::ServerName<'static>,
        /// The connector's record of success.
        encrypted: Arc<AtomicBool>,
    }

    impl TlsConnect<Socket> for PgTlsConnect {
        type Stream = PgTlsStream;
        type Error = io::Error;
        type Future = Pin<Box<dyn Future<Output = io::Result<PgTlsStream>> + Send>>;

        fn connect(self, socket: Socket) -> Self::Future {
            Box::pin(async move {
                let stream = self.connector.connect(self.name, socket).await?;
                self.encrypted.store(true, Ordering::Release);
                Ok(PgTlsStream(stream))
            })
        }
    }

    /// An encrypted session's stream. Offers no channel binding: SCRAM
    /// authenticates without it, as libpq's `channel_binding=prefer` does
    /// when the client cannot bind.
    pub(crate) struct PgTlsStream(tokio_rustls::client::TlsStream<Socket>);

    impl AsyncRead for PgTlsStream {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for PgTlsStream {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }

        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }

        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    impl TlsStream for PgTlsStream {
        fn channel_binding(&self) -> ChannelBinding {
            ChannelBinding::none()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> (String, PgTls) {
        split_url(url).unwrap()
    }

    #[test]
    fn without_sslmode_tls_is_preferred_and_nothing_is_verified() {
        let (url, tls) = split("postgres://u@h/db");
        assert_eq!(url, "postgres://u@h/db?sslmode=prefer");
        assert_eq!(tls.mode, SslMode::Prefer);
        assert_eq!(tls.settings.verify, Verify::Nothing);
    }

    #[cfg(feature = "tls")]
    #[test]
    fn the_tls_parameters_are_taken_out_and_the_others_kept() {
        let (url, tls) = split(
            "postgres://u:p@h:5433/db?application_name=x&sslmode=verify-full&sslrootcert=%2Ftmp%2Fca.pem&sslcert=/c.pem&sslkey=/k.pem&connect_timeout=3",
        );
        assert_eq!(
            url,
            "postgres://u:p@h:5433/db?application_name=x&connect_timeout=3&sslmode=require"
        );
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.settings.verify, Verify::ChainAndName);
        assert_eq!(tls.settings.root_cert.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(tls.settings.client_cert.as_deref(), Some("/c.pem"));
        assert_eq!(tls.settings.client_key.as_deref(), Some("/k.pem"));
    }

    #[cfg(feature = "tls")]
    #[test]
    fn the_modes_verify_as_libpq_does() {
        let verify = |query: &str| split(&format!("postgres://h/db?{query}")).1.settings.verify;
        assert_eq!(verify("sslmode=require"), Verify::Nothing);
        assert_eq!(verify("sslmode=require&sslrootcert=/ca"), Verify::Chain);
        assert_eq!(verify("sslmode=verify-ca"), Verify::Chain);
        assert_eq!(verify("sslmode=verify-full"), Verify::ChainAndName);
        assert_eq!(verify("sslrootcert=system"), Verify::ChainAndName);
        let (_, system) = split("postgres://h/db?sslrootcert=system");
        assert_eq!(system.settings.root_cert, None, "system: the OS store");
        assert_eq!(
            split("postgres://h/db?sslmode=disable").0,
            "postgres://h/db?sslmode=disable"
        );
    }

    #[test]
    fn an_unknown_mode_is_refused_with_the_known_ones() {
        let error = split_url("postgres://h/db?sslmode=strict").unwrap_err();
        assert!(error.contains("verify-full"), "{error}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_the_feature_a_url_requiring_tls_is_refused_and_prefer_is_in_clear() {
        for mode in ["require", "verify-ca", "verify-full"] {
            let error = split_url(&format!("postgres://h/db?sslmode={mode}")).unwrap_err();
            assert!(error.contains("`tls` feature"), "{error}");
            assert!(error.contains(mode), "{error}");
        }
        assert!(split_url("postgres://h/db?sslmode=prefer").is_ok());
        assert!(split_url("postgres://h/db").is_ok());
    }
}
