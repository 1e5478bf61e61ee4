//! RabbitMQ's TLS knobs: an `amqps://` URL, and the query parameters
//! RabbitMQ's own URI specification gives TLS: `cacertfile` (a PEM file of
//! the CAs to trust; the operating system's roots without it), `certfile`
//! and `keyfile` (a client certificate, for a broker that asks for one).
//! The broker's certificate is always checked: its chain and its name.

use super::{TlsSettings, Verify};

/// What a broker URL asks of TLS: `None` for `amqp://` (in clear). Without
/// the `tls` feature, `amqps://` is refused, naming the feature.
pub(crate) fn settings(url: &str) -> Result<Option<TlsSettings>, String> {
    let query = url.split_once('?').map_or("", |(_, query)| query);
    let mut found = TlsSettings {
        verify: Verify::ChainAndName,
        root_cert: None,
        client_cert: None,
        client_key: None,
    };
    let mut named = None;
    for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
        // lapin ignores these parameters.
        let slot = match key.as_ref() {
            "cacertfile" => &mut found.root_cert,
            "certfile" => &mut found.client_cert,
            "keyfile" => &mut found.client_key,
            _ => continue,
        };
        *slot = Some(value.into_owned());
        named.get_or_insert(key.into_owned());
    }
    if !url.trim_start().starts_with("amqps://") {
        return match named {
            Some(key) => Err(format!(
                "`{key}` is a TLS parameter, but the URL is amqp:// (in clear): use amqps://"
            )),
            None => Ok(None),
        };
    }
    if !cfg!(feature = "tls") {
        return Err(super::refuse_without_tls("amqps://"));
    }
    Ok(Some(found))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "tls")]
    #[test]
    fn amqp_is_in_clear_and_amqps_verifies_chain_and_name() {
        assert_eq!(settings("amqp://guest:guest@h:5672/%2f").unwrap(), None);
        let tls = settings(
            "amqps://h/%2f?heartbeat=10&cacertfile=%2Ftmp%2Fca.pem&certfile=/c.pem&keyfile=/k.pem",
        )
        .unwrap()
        .unwrap();
        assert_eq!(tls.verify, Verify::ChainAndName);
        assert_eq!(tls.root_cert.as_deref(), Some("/tmp/ca.pem"));
        assert_eq!(tls.client_cert.as_deref(), Some("/c.pem"));
        assert_eq!(tls.client_key.as_deref(), Some("/k.pem"));
        let system = settings("amqps://h").unwrap().unwrap();
        assert_eq!(system.root_cert, None, "the system's roots");
    }

    #[test]
    fn a_tls_parameter_on_a_clear_url_is_refused() {
        let error = settings("amqp://h?cacertfile=/ca.pem").unwrap_err();
        assert!(error.contains("use amqps://"), "{error}");
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn without_the_feature_amqps_is_refused_naming_it() {
        let error = settings("amqps://h/%2f").unwrap_err();
        assert!(error.contains("`tls` feature"), "{error}");
    }
}
