//! Encrypted, verified connections to real servers, with the CA and
//! certificates `.ci/tls` makes (in `TICKBOX_TLS_DIR`, default
//! `/tmp/tickbox-tls`): the server's certificate names `localhost` only, so
//! connecting to 127.0.0.1 with full verification meets "another name";
//! `other-ca.pem` signed nothing the servers present.

#[cfg(feature = "amqp")]
mod amqp;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;

/// A handful of the suite's delivery cases on backend `$backend`, on the
/// server at `$url` (`TestDb::$at`: `postgres_at`, `mysql_at`).
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! delivery_cases {
    ($backend:ty, $at:ident, $url:expr) => {
        macro_rules! case {
            ($name:ident) => {
                #[actix::test]
                async fn $name() {
                    crate::support::trace_init();
                    crate::suite::$name::<$backend>(crate::support::TestDb::$at($url)).await;
                }
            };
            ($area:ident :: $name:ident) => {
                #[actix::test]
                async fn $name() {
                    crate::support::trace_init();
                    crate::suite::$area::$name::<$backend>(crate::support::TestDb::$at($url)).await;
                }
            };
        }
        case!(rolled_back_publish_is_never_delivered_and_committed_one_is);
        case!(a_redelivered_message_is_skipped_and_counted);
        case!(a_handler_error_rolls_back_and_is_retried);
        case!(batches::waiting_messages_commit_together_in_batches_and_each_once);
        case!(ordering::order_holds_across_a_restart);
    };
}
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use delivery_cases;

/// A database server with TLS, as its tests reach it.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) trait TlsServer {
    /// The backend that talks to it.
    type Backend: crate::support::TestBackend;
    /// The URL's query for a session in clear.
    const CLEAR: &'static str;
    /// The URL's query that checks the chain against the CA file `ca` and
    /// the host's name.
    fn verify_full(ca: &str) -> String;
    /// The test's databases on the server at `host`, `query` added to its
    /// URL.
    fn db(host: &str, query: &str) -> crate::support::TestDb;
}

/// The cases every TLS database server passes alike: a certificate from an
/// unknown CA, or for another name, refused with the reason; a module in
/// clear saying so.
#[cfg(any(feature = "postgres", feature = "mysql"))]
macro_rules! refusal_cases {
    ($server:ty) => {
        #[actix::test]
        async fn a_certificate_from_an_unknown_ca_is_refused_naming_the_ca_file() {
            crate::support::trace_init();
            let other = crate::tls::tls_file("other-ca.pem");
            let db = <$server as crate::tls::TlsServer>::db(
                "localhost",
                &<$server as crate::tls::TlsServer>::verify_full(&other),
            );
            let reason =
                crate::tls::refusal::<<$server as crate::tls::TlsServer>::Backend>(db).await;
            assert!(
                reason.contains(&format!("not signed by a CA in {other}")),
                "{reason}"
            );
        }

        #[actix::test]
        async fn a_certificate_for_another_name_is_refused_naming_both() {
            crate::support::trace_init();
            let ca = crate::tls::tls_file("ca.pem");
            let db = <$server as crate::tls::TlsServer>::db(
                "127.0.0.1",
                &<$server as crate::tls::TlsServer>::verify_full(&ca),
            );
            let reason =
                crate::tls::refusal::<<$server as crate::tls::TlsServer>::Backend>(db).await;
            assert!(
                reason.contains("names localhost, not the host 127.0.0.1"),
                "{reason}"
            );
        }

        #[actix::test]
        async fn a_module_in_clear_says_so() {
            use crate::support::TestBackend;
            crate::support::trace_init();
            let db = <$server as crate::tls::TlsServer>::db(
                "127.0.0.1",
                <$server as crate::tls::TlsServer>::CLEAR,
            );
            let orders = <<$server as crate::tls::TlsServer>::Backend>::module(&db, "orders")
                .start()
                .await
                .expect("orders starts in clear");
            let stats = orders.store_stats().await.expect("figures");
            assert_eq!(stats.encrypted, Some(false));
            orders.close();
        }
    };
}
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) use refusal_cases;

/// The TLS node's URL at `host`, trusting `ca` (a file `.ci/tls` made),
/// with the tests' client certificate.
#[cfg(feature = "amqp")]
pub(crate) fn amqps_url(host: &str, ca: &str) -> String {
    format!(
        "amqps://guest:guest@{host}:5671/%2f?cacertfile={}&certfile={}&keyfile={}",
        tls_file(ca),
        tls_file("client.pem"),
        tls_file("client.key")
    )
}

/// `rabbitmqctl` on the TLS node.
#[cfg(feature = "amqp")]
pub(crate) fn tls_node(args: &[&str]) -> String {
    let mut all = vec!["-n", "tls@localhost"];
    all.extend_from_slice(args);
    crate::support::rabbitmqctl(&all)
}

/// Deletes the TLS node's queues whose names start with `prefix`, so that
/// runs do not pile them up (their exchanges are left: rabbitmqctl cannot
/// delete one, and an exchange holds nothing).
#[cfg(feature = "amqp")]
pub(crate) fn delete_tls_queues(prefix: &str) {
    for name in tls_node(&["-q", "list_queues", "name"]).lines() {
        if name.starts_with(prefix) {
            tls_node(&["-q", "delete_queue", name]);
        }
    }
}

/// Starts module `orders` of backend `B` on `db` (a URL whose TLS must
/// fail) and returns why it could not open its database: a refusal, never
/// a transient failure.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) async fn refusal<B: crate::support::TestBackend>(db: crate::support::TestDb) -> String {
    let error = B::module(&db, "orders")
        .start()
        .await
        .expect_err("the connection must fail");
    let tickbox::Error::BadDatabaseUrl { reason, .. } = &error else {
        panic!("a refused connection, not: {error:?}");
    };
    assert!(!error.is_transient(), "{error}");
    reason.clone()
}

/// A file `.ci/tls` made.
pub(crate) fn tls_file(name: &str) -> String {
    let dir = std::env::var("TICKBOX_TLS_DIR").unwrap_or_else(|_| "/tmp/tickbox-tls".into());
    let path = format!("{dir}/{name}");
    assert!(
        std::path::Path::new(&path).exists(),
        "{path} is missing: run .ci/tls first (it makes the tests' CA and certificates)"
    );
    path
}

/// The shared MariaDB server is reached in clear, and a module says so
/// (`SHOW STATUS LIKE 'Ssl_cipher'` through the module's own connection).
#[cfg(feature = "mysql")]
#[actix::test]
async fn a_mysql_module_in_clear_says_so() {
    use crate::support::{TestBackend, TestDb};
    crate::support::trace_init();
    let db = TestDb::mysql();
    let orders = <tickbox::Mysql as TestBackend>::module(&db, "orders")
        .start()
        .await
        .expect("orders starts");
    let stats = orders.store_stats().await.expect("figures");
    assert_eq!(stats.encrypted, Some(false));
    orders.close();
}
