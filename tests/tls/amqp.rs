//! RabbitMQ over TLS, on the node `.ci/tls` starts (`tls@localhost`,
//! amqps on 127.0.0.1:5671, a client certificate required): delivery with
//! every connection seen encrypted by the broker, and a wrong CA or host
//! name refused with its reason.

use super::{amqps_url, tls_file, tls_node};
use crate::suite::{fast_retries, pair, publish};
use crate::support::*;
use std::time::Duration;
use tickbox::{Amqp, Bus, Error, Sqlite};

#[actix::test]
async fn messages_flow_over_amqps_and_the_broker_sees_every_connection_encrypted() {
    trace_init();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let namespace = format!("test.tls.{:08x}", fastrand::u32(..));
    /// The test's queues go, however it ends.
    struct Queues(String);
    impl Drop for Queues {
        fn drop(&mut self) {
            super::delete_tls_queues(&format!("tickbox.{}.", self.0));
        }
    }
    let _queues = Queues(namespace.clone());
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .amqp(Amqp::new(amqps_url("localhost", "ca.pem")).namespace(&namespace))
        .retry_policy(fast_retries())
        .scan_interval(Duration::from_millis(200))
        .start()
        .await
        .expect("the bus starts over amqps");
    let session = tickbox::testing::Session::start(&bus);
    for n in 0..20 {
        publish(&orders, n).await;
    }
    let report = session.wait().await;
    assert_eq!(report.handled("warehouse.record").len(), 20, "{report}");
    assert_eq!(changes(&warehouse, "warehouse.record").await, 20);
    // The relay's and the consumer's connections (named after the
    // namespace), as the broker lists them: each encrypted, with the
    // client certificate the tests' CA signed.
    let listed = tls_node(&[
        "-q",
        "list_connections",
        "client_properties",
        "ssl",
        "ssl_protocol",
        "peer_cert_subject",
    ]);
    let ours: Vec<&str> = listed
        .lines()
        .filter(|line| line.contains(&namespace))
        .collect();
    assert!(ours.len() >= 2, "relay and consumer connections:\n{listed}");
    for line in &ours {
        assert!(line.contains("\ttrue\ttlsv1."), "in clear: {line}");
        assert!(
            line.contains("CN=postgres"),
            "no client certificate: {line}"
        );
    }
    bus.stop().await;
}

/// Starts a bus over `url` and returns why the broker was refused.
async fn refusal(url: String) -> String {
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let started = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .amqp(Amqp::new(url).namespace(format!("test.tls.{:08x}", fastrand::u32(..))))
        .start()
        .await;
    let Err(error) = started else {
        panic!("a bus started over a broker whose certificate is wrong")
    };
    let Error::BrokerRefused { reason, .. } = &error else {
        panic!("a refused certificate, not: {error:?}");
    };
    assert!(!error.is_transient(), "{error}");
    assert!(
        !format!("{error} {error:?}").contains("guest:guest"),
        "{error:?}"
    );
    reason.clone()
}

#[actix::test]
async fn a_broker_certificate_from_an_unknown_ca_is_refused_naming_the_ca_file() {
    trace_init();
    let reason = refusal(amqps_url("localhost", "other-ca.pem")).await;
    assert!(
        reason.contains(&format!(
            "not signed by a CA in {}",
            tls_file("other-ca.pem")
        )),
        "{reason}"
    );
}

#[actix::test]
async fn a_broker_certificate_for_another_name_is_refused_naming_both() {
    trace_init();
    let reason = refusal(amqps_url("127.0.0.1", "ca.pem")).await;
    assert!(
        reason.contains("names localhost, not the host 127.0.0.1"),
        "{reason}"
    );
}
