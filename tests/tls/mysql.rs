//! MariaDB over TLS, against the second server `.ci/tls` starts (on 3307,
//! presenting the tests' certificate; `TICKBOX_MYSQL_TLS_URL`): delivery
//! cases over `ssl-mode=REQUIRED` and `VERIFY_IDENTITY`, every session seen
//! encrypted by the server, a wrong CA or host name refused with its
//! reason, and TLS asked of the shared server, which has none, refused.

use super::tls_file;
use crate::suite::{bus, drained, pair, publish};
use crate::support::*;
use std::time::Duration;
use tickbox::Mysql;

/// The TLS server's URL (`TICKBOX_MYSQL_TLS_URL`, default
/// `mysql://root@localhost:3307`) with its host replaced by `host` and
/// `query` added.
fn mysql_url(host: &str, query: &str) -> String {
    let base = std::env::var("TICKBOX_MYSQL_TLS_URL")
        .unwrap_or_else(|_| "mysql://root@localhost:3307".into());
    with_host(&base, host, query)
}

/// `url` with its host replaced by `host` and `query` added.
fn with_host(url: &str, host: &str, query: &str) -> String {
    let mut url = url::Url::parse(url).expect("a URL");
    url.set_host(Some(host)).expect("a host");
    let mut url = url.to_string();
    url.push(if url.contains('?') { '&' } else { '?' });
    url.push_str(query);
    url
}

/// Full verification against the tests' CA, at the name its certificate
/// gives.
pub(crate) fn verify_identity_url() -> String {
    mysql_url(
        "localhost",
        &format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={}", tls_file("ca.pem")),
    )
}

mod required {
    crate::tls::delivery_cases!(
        tickbox::Mysql,
        mysql_at,
        super::mysql_url("127.0.0.1", "ssl-mode=REQUIRED")
    );
}

mod verify_identity {
    crate::tls::delivery_cases!(tickbox::Mysql, mysql_at, super::verify_identity_url());
}

/// Sessions the server holds in the databases `databases`, other than
/// the one asking, and how many of them are in clear (no `Ssl_cipher`).
async fn sessions(orders: &tickbox::ModuleHandle<Mysql>, databases: &[String]) -> (i64, i64) {
    let names = databases
        .iter()
        .map(|name| format!("'{name}'"))
        .collect::<Vec<_>>()
        .join(", ");
    let of_test = format!(
        "FROM information_schema.PROCESSLIST p \
         JOIN performance_schema.threads t ON t.PROCESSLIST_ID = p.ID \
         LEFT JOIN performance_schema.status_by_thread s \
           ON s.THREAD_ID = t.THREAD_ID AND s.VARIABLE_NAME = 'Ssl_cipher' \
         WHERE p.ID <> CONNECTION_ID() AND p.DB IN ({names})"
    );
    let total = count(orders, format!("SELECT count(*) AS n {of_test}")).await;
    let clear = count(
        orders,
        format!("SELECT count(*) AS n {of_test} AND COALESCE(s.VARIABLE_VALUE, '') = ''"),
    )
    .await;
    (total, clear)
}

#[actix::test]
async fn the_server_sees_every_session_of_modules_and_their_bus_encrypted() {
    trace_init();
    let db = TestDb::mysql_at(verify_identity_url());
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Mysql>(&db, &handler).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    publish(&orders, 1).await;
    drained(&bus).await;
    // The pools' idle sessions: at least one in each module's database
    // besides the one asking.
    let databases = [db.schema("orders"), db.schema("warehouse")];
    let seen = std::cell::Cell::new((0, 0));
    let (seen_ref, orders_ref, databases_ref) = (&seen, &orders, &databases);
    eventually(
        "at least 2 sessions in the modules' databases",
        Duration::from_secs(20),
        move || async move {
            seen_ref.set(sessions(orders_ref, databases_ref).await);
            seen_ref.get().0 >= 2
        },
    )
    .await;
    let (total, clear) = seen.get();
    assert_eq!(clear, 0, "{clear} of {total} sessions in clear");
    for module in [&orders, &warehouse] {
        let stats = module.store_stats().await.expect("figures");
        assert_eq!(stats.encrypted, Some(true), "what `tickbox status` shows");
    }
    bus.stop().await;
}

/// The server, as the cases every TLS database server passes see it.
struct MariadbTls;

impl super::TlsServer for MariadbTls {
    type Backend = Mysql;
    const CLEAR: &'static str = "ssl-mode=DISABLED";

    fn verify_full(ca: &str) -> String {
        format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}")
    }

    fn db(host: &str, query: &str) -> TestDb {
        TestDb::mysql_at(mysql_url(host, query))
    }
}

super::refusal_cases!(MariadbTls);

/// Why a module at `url` could not open its database.
async fn refusal(url: String) -> String {
    super::refusal::<Mysql>(TestDb::mysql_at(url)).await
}

/// mysql_async 0.37 cannot check a chain without the name (its skip of
/// the name check no longer matches rustls's errors): `VERIFY_CA`, and
/// `REQUIRED` with a CA, are refused saying so, rather than refusing every
/// certificate for another name with a misleading reason.
#[actix::test]
async fn verify_ca_is_refused_with_the_reason_and_the_mode_to_use() {
    trace_init();
    let ca = tls_file("ca.pem");
    for (query, named) in [
        (
            format!("ssl-mode=VERIFY_CA&ssl-ca={ca}"),
            "ssl-mode=VERIFY_CA",
        ),
        (
            format!("ssl-mode=required&ssl-ca={ca}"),
            "ssl-mode=REQUIRED with ssl-ca",
        ),
    ] {
        let reason = refusal(mysql_url("localhost", &query)).await;
        assert!(reason.contains(named), "{reason}");
        assert!(reason.contains("use ssl-mode=VERIFY_IDENTITY"), "{reason}");
    }
}

#[actix::test]
async fn tls_asked_of_a_server_without_it_is_refused_saying_so() {
    trace_init();
    let shared = std::env::var("TICKBOX_MYSQL_URL")
        .expect("the MariaDB TLS tests need TICKBOX_MYSQL_URL, e.g. mysql://root@127.0.0.1:3306");
    let reason = refusal(with_host(&shared, "127.0.0.1", "ssl-mode=REQUIRED")).await;
    assert!(
        reason.contains("asks for TLS (ssl-mode=REQUIRED), and the server offers none"),
        "{reason}"
    );
}

/// The TLS server's URL as user `tickbox_x509` (whom `.ci/tls` makes to
/// require a client certificate), at full verification, with `query`
/// added.
fn x509_user_url(query: &str) -> String {
    let mut url = url::Url::parse(&verify_identity_url()).expect("a URL");
    url.set_username("tickbox_x509").expect("a user");
    format!("{url}{query}")
}

/// A user who must present a client certificate connects with the one the
/// URL names (`ssl-cert`, `ssl-key`), and is refused without it, saying so.
#[actix::test]
async fn a_user_who_must_present_a_certificate_connects_with_the_url_s() {
    trace_init();
    let with_certificate = x509_user_url(&format!(
        "&ssl-cert={}&ssl-key={}",
        tls_file("client.pem"),
        tls_file("client.key")
    ));
    let db = TestDb::mysql_at(with_certificate);
    let orders = <Mysql as TestBackend>::module(&db, "orders")
        .start()
        .await
        .expect("the server accepts the tests' client certificate");
    let me = "SELECT count(*) AS n FROM information_schema.SESSION_STATUS \
              WHERE VARIABLE_NAME = 'Ssl_cipher' AND VARIABLE_VALUE <> '' \
              AND CURRENT_USER() LIKE 'tickbox_x509@%'";
    assert_eq!(
        count(&orders, me).await,
        1,
        "an encrypted session as the user"
    );
    orders.close();

    let reason = refusal(x509_user_url("")).await;
    assert!(
        reason.contains("Access denied for user 'tickbox_x509'"),
        "{reason}"
    );
}
