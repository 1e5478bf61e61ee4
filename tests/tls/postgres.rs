//! PostgreSQL over TLS: delivery cases over `sslmode=require` and
//! `verify-full`, every connection seen encrypted by the server, and a
//! wrong CA or host name refused with its reason.

use super::tls_file;
use crate::suite::{bus, drained, pair, publish};
use crate::support::*;
use std::time::Duration;
use tickbox::Postgres;

/// `TICKBOX_PG_URL` with its host replaced by `host` and `query` added.
pub(crate) fn pg_url(host: &str, query: &str) -> String {
    let base = std::env::var("TICKBOX_PG_URL").expect(
        "the PostgreSQL TLS tests need TICKBOX_PG_URL, e.g. postgres://postgres@127.0.0.1:5432/test",
    );
    let (scheme, rest) = base.split_once("://").expect("a URL");
    let (user, rest) = rest.rsplit_once('@').map_or(("", rest), |(u, r)| (u, r));
    let at = rest.find([':', '/', '?']).unwrap_or(rest.len());
    let separator = if rest.contains('?') { '&' } else { '?' };
    let user = if user.is_empty() {
        String::new()
    } else {
        format!("{user}@")
    };
    format!("{scheme}://{user}{host}{}{separator}{query}", &rest[at..])
}

/// Full verification against the tests' CA, at the name its certificate
/// gives.
fn verify_full_url() -> String {
    pg_url(
        "localhost",
        &format!("sslmode=verify-full&sslrootcert={}", tls_file("ca.pem")),
    )
}

mod require {
    crate::tls::delivery_cases!(
        tickbox::Postgres,
        postgres_at,
        super::pg_url("127.0.0.1", "sslmode=require")
    );
}

mod verify_full {
    crate::tls::delivery_cases!(tickbox::Postgres, postgres_at, super::verify_full_url());
}

/// Connections of `application` the server sees, and how many of them are
/// in clear.
async fn sessions_of(orders: &tickbox::ModuleHandle<Postgres>, application: &str) -> (i64, i64) {
    let total = count(
        orders,
        format!(
            "SELECT count(*) AS n FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = '{application}'"
        ),
    )
    .await;
    let clear = count(
        orders,
        format!(
            "SELECT count(*) AS n FROM pg_stat_activity a JOIN pg_stat_ssl s USING (pid) \
             WHERE a.application_name = '{application}' AND NOT s.ssl"
        ),
    )
    .await;
    (total, clear)
}

#[actix::test]
async fn the_server_sees_every_connection_of_modules_and_their_bus_encrypted() {
    trace_init();
    let application = format!("tickbox-tls-{:08x}", fastrand::u32(..));
    let url = format!("{}&application_name={application}", verify_full_url());
    let db = TestDb::postgres_at(url);
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Postgres>(&db, &handler).await;
    let bus = bus(&db, &[&orders, &warehouse]).await;
    publish(&orders, 1).await;
    drained(&bus).await;
    // Each module's pool, and the bus's listening connection per module
    // (it connects in the background): at least four sessions.
    let seen = std::cell::Cell::new((0, 0));
    let (seen_ref, orders_ref, application_ref) = (&seen, &orders, &application);
    eventually(
        "at least 4 sessions of the test's application",
        Duration::from_secs(20),
        move || async move {
            seen_ref.set(sessions_of(orders_ref, application_ref).await);
            seen_ref.get().0 >= 4
        },
    )
    .await;
    let (total, clear) = seen.get();
    assert_eq!(clear, 0, "{clear} of {total} sessions in clear");
    let stats = orders.store_stats().await.expect("figures");
    assert_eq!(stats.encrypted, Some(true), "what `tickbox status` shows");
    bus.stop().await;
}

/// The server, as the cases every TLS database server passes see it.
struct PostgresTls;

impl super::TlsServer for PostgresTls {
    type Backend = Postgres;
    const CLEAR: &'static str = "sslmode=disable";

    fn verify_full(ca: &str) -> String {
        format!("sslmode=verify-full&sslrootcert={ca}")
    }

    fn db(host: &str, query: &str) -> TestDb {
        TestDb::postgres_at(pg_url(host, query))
    }
}

super::refusal_cases!(PostgresTls);

/// Why a module at `url` could not open its database.
async fn refusal(url: String) -> String {
    super::refusal::<Postgres>(TestDb::postgres_at(url)).await
}

#[actix::test]
async fn verify_ca_checks_the_chain_but_not_the_name() {
    trace_init();
    let ca = tls_file("ca.pem");
    let db = TestDb::postgres_at(pg_url(
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={ca}"),
    ));
    let orders = <Postgres as TestBackend>::module(&db, "orders")
        .start()
        .await
        .expect("the chain is the tests' CA's; the name is not checked");
    orders.close();
    let other = tls_file("other-ca.pem");
    let reason = refusal(pg_url(
        "127.0.0.1",
        &format!("sslmode=verify-ca&sslrootcert={other}"),
    ))
    .await;
    assert!(reason.contains("not signed by a CA"), "{reason}");
}

/// The server asks every client for a certificate (`.ci/tls` gives it the
/// tests' CA as `ssl_ca_file`): a URL with `sslcert` and `sslkey` presents
/// the client's, and the server sees whose it is; without them, none.
#[actix::test]
async fn a_client_certificate_named_by_the_url_is_presented() {
    trace_init();
    let presented = "SELECT count(*) AS n FROM pg_stat_ssl \
                     WHERE pid = pg_backend_pid() AND client_dn = '/CN=postgres'";
    let ca = tls_file("ca.pem");
    let with_certificate = format!(
        "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
        tls_file("client.pem"),
        tls_file("client.key")
    );
    for (query, expected) in [
        (with_certificate, 1),
        (format!("sslmode=verify-full&sslrootcert={ca}"), 0),
    ] {
        let db = TestDb::postgres_at(pg_url("localhost", &query));
        let orders = <Postgres as TestBackend>::module(&db, "orders")
            .start()
            .await
            .expect("orders starts over TLS");
        assert_eq!(count(&orders, presented).await, expected, "{query}");
        orders.close();
    }
}

/// A client certificate the server cannot check (signed by a CA it does
/// not trust) is refused by the server, and the module says so.
#[actix::test]
async fn a_client_certificate_the_server_does_not_trust_is_refused() {
    trace_init();
    let ca = tls_file("ca.pem");
    let reason = refusal(pg_url(
        "localhost",
        &format!(
            "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
            tls_file("other-client.pem"),
            tls_file("other-client.key")
        ),
    ))
    .await;
    assert!(
        reason.contains("localhost:5432: the server refused the client certificate (UnknownCA)"),
        "{reason}"
    );
}

/// minishop, its three modules in one process, on PostgreSQL at
/// `sslmode=require`: the whole flow, checked by the example from its
/// databases.
#[test]
fn minishop_runs_its_whole_flow_over_sslmode_require() {
    use crate::processes::{check_result, finish, spawn, Place};
    let mut place = Place::postgres("tlsrequire");
    if let Place::Postgres { url, .. } = &mut place {
        url.push_str("?sslmode=require");
    }
    let what = "minishop over sslmode=require";
    let child = spawn(&place, &["--orders", "100", "--fail-rate", "0.1", "--json"]);
    let output = finish(child, Duration::from_secs(300), what);
    let result = check_result(&output, what);
    assert_eq!(result["orders"], 100, "{what}: {result}");
}
