//! The rustls client configuration for a [`TlsSettings`], and failed
//! handshakes told in plain words.

use super::{TlsSettings, Verify};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    AlertDescription, CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore,
    SignatureScheme,
};
use std::sync::{Arc, OnceLock};

/// The one cryptographic provider: ring. rustls 0.23.48 deprecated ring's
/// provider for lacking post-quantum key exchange (X25519MLKEM768, which
/// aws-lc-rs has); tickbox keeps ring for a build that needs no cmake, and
/// negotiates the classical groups (X25519, P-256, P-384).
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    PROVIDER
        .get_or_init(|| Arc::new(rustls::crypto::ring::default_provider()))
        .clone()
}

/// The operating system's trusted certificates, read once per process
/// (reading them takes milliseconds; a pool opens connections often).
pub(crate) fn system_root_certs() -> Result<Arc<Vec<CertificateDer<'static>>>, String> {
    static CERTS: OnceLock<Result<Arc<Vec<CertificateDer<'static>>>, String>> = OnceLock::new();
    CERTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            if found.certs.is_empty() {
                let why = found
                    .errors
                    .first()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default();
                return Err(format!(
                    "no trusted roots found in the system's store{why}: name a CA file in the URL"
                ));
            }
            Ok(Arc::new(found.certs))
        })
        .clone()
}

/// The operating system's trusted roots, as rustls keeps them.
fn system_roots() -> Result<Arc<RootCertStore>, String> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let mut roots = RootCertStore::empty();
            let (added, _) = roots.add_parsable_certificates(system_root_certs()?.iter().cloned());
            if added == 0 {
                return Err(
                    "no usable trusted roots in the system's store: name a CA file in the URL"
                        .into(),
                );
            }
            Ok(Arc::new(roots))
        })
        .clone()
}

/// The CAs of a PEM file.
fn file_roots(path: &str) -> Result<Arc<RootCertStore>, String> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("cannot read the CA file {path}: {e}"))?
    {
        let cert = cert.map_err(|e| format!("cannot read the CA file {path}: {e}"))?;
        roots
            .add(cert)
            .map_err(|e| format!("the CA file {path} holds a certificate rustls refuses: {e}"))?;
    }
    if roots.is_empty() {
        return Err(format!("the CA file {path} holds no certificate"));
    }
    Ok(Arc::new(roots))
}

/// The rustls configuration `settings` ask for: the roots they name (or the
/// system's), the verification they ask for, and the client's certificate
/// when they give one. Files are read on every call, so a renewed
/// certificate is used by the next connection.
pub(crate) fn client_config(settings: &TlsSettings) -> Result<Arc<ClientConfig>, String> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match settings.verify {
        Verify::Nothing => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
        Verify::Chain | Verify::ChainAndName => {
            let roots = match &settings.root_cert {
                Some(path) => file_roots(path)?,
                None => system_roots()?,
            };
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
                .build()
                .map_err(|e| format!("TLS: {e}"))?;
            if settings.verify == Verify::Chain {
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(ChainOnly(webpki)))
            } else {
                builder.with_webpki_verifier(webpki)
            }
        }
    };
    let config = match (&settings.client_cert, &settings.client_key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("cannot read the client certificate {cert}: {e}"))?;
            // The key's path may be shown; its contents never are.
            let key_der = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("cannot read the client key {key}: {e}"))?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| format!("the client certificate {cert} and key {key}: {e}"))?
        }
        (None, None) => builder.with_no_client_auth(),
        (Some(_), None) => return Err("a client certificate needs its key too".into()),
        (None, Some(_)) => return Err("a client key needs its certificate too".into()),
    };
    Ok(Arc::new(config))
}

/// Takes any certificate, still checking that the server holds its key
/// (the handshake's signatures): `Verify::Nothing`.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// Checks the chain as webpki does, but not the names: `Verify::Chain`.
/// webpki checks the chain before the names, so a name mismatch means the
/// chain was good.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            verified => verified,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The rustls error somewhere in `error`'s chain of causes (an I/O error
/// carries it inside, where `source()` does not reach).
fn rustls_cause<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(cause) = next {
        if let Some(tls) = cause.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        if let Some(inner) = cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls);
            }
        }
        next = cause.source();
    }
    None
}

/// Why a TLS handshake failed, in plain words, if `error` is one: an
/// unknown CA (naming where the roots came from), a certificate for
/// another name (naming both), an expired one (with the date). `None` when
/// the failure was not TLS's.
pub(crate) fn explain_handshake_failure(
    error: &(dyn std::error::Error + 'static),
    settings: &TlsSettings,
) -> Option<String> {
    let tls = rustls_cause(error)?;
    let roots = match &settings.root_cert {
        Some(path) => path.clone(),
        None => "the system's trusted roots".to_string(),
    };
    Some(match tls {
        rustls::Error::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer => {
                format!("the server's certificate is not signed by a CA in {roots}")
            }
            CertificateError::NotValidForNameContext {
                expected,
                presented,
            } => format!(
                "the server's certificate names {}, not the host {}",
                if presented.is_empty() {
                    "no host".to_string()
                } else {
                    presented
                        .iter()
                        .map(|name| bare_name(name))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                expected.to_str()
            ),
            CertificateError::NotValidForName => {
                "the server's certificate does not name the host connected to".to_string()
            }
            CertificateError::ExpiredContext { not_after, .. } => format!(
                "the server's certificate expired on {}",
                utc_date(not_after.as_secs())
            ),
            CertificateError::Expired => "the server's certificate has expired".to_string(),
            CertificateError::NotValidYetContext { not_before, .. } => format!(
                "the server's certificate is not valid before {}",
                utc_date(not_before.as_secs())
            ),
            other => format!("the server's certificate is refused: {other}"),
        },
        rustls::Error::AlertReceived(AlertDescription::CertificateRequired) => {
            "the server asks for a client certificate, and none was given".to_string()
        }
        rustls::Error::AlertReceived(
            alert @ (AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::UnsupportedCertificate),
        ) => format!("the server refused the client certificate ({alert:?})"),
        rustls::Error::AlertReceived(alert) => format!(
            "the server ended the TLS handshake ({alert:?}); if it asks for a client \
             certificate, give one"
        ),
        other => format!("the TLS handshake failed: {other}"),
    })
}

/// A name as rustls presents it (`DnsName("localhost")`), bare
/// (`localhost`).
fn bare_name(presented: &str) -> &str {
    match (presented.find('"'), presented.rfind('"')) {
        (Some(first), Some(last)) if first < last => &presented[first + 1..last],
        _ => presented,
    }
}

/// A Unix time as a UTC date and time, `YYYY-MM-DD HH:MM:SS UTC` (the
/// civil-from-days algorithm of Howard Hinnant's date library).
fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presented_names_are_shown_bare() {
        assert_eq!(bare_name("DnsName(\"localhost\")"), "localhost");
        assert_eq!(bare_name("127.0.0.1"), "127.0.0.1");
    }

    #[test]
    fn unix_times_read_as_utc_dates() {
        assert_eq!(utc_date(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc_date(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_date(1_798_761_599), "2026-12-31 23:59:59 UTC");
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let settings = TlsSettings {
            verify: Verify::ChainAndName,
            root_cert: Some("/nonexistent/ca.pem".into()),
            client_cert: None,
            client_key: None,
        };
        let error = client_config(&settings).unwrap_err();
        assert!(error.contains("/nonexistent/ca.pem"), "{error}");
    }

    #[test]
    fn a_client_certificate_needs_its_key() {
        let settings = TlsSettings {
            verify: Verify::Nothing,
            root_cert: None,
            client_cert: Some("/tmp/client.pem".into()),
            client_key: None,
        };
        let error = client_config(&settings).unwrap_err();
        assert!(error.contains("needs its key"), "{error}");
    }
}
