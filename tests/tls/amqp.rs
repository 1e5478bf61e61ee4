//! RabbitMQ over TLS, on the node `.ci/tls` starts (`tls@localhost`,
//! amqps on 127.0.0.1:5671, a client certificate required): delivery with
//! every connection seen encrypted by the broker, and a wrong CA or host
//! name refused with its reason; an expired certificate too, presented by
//! an OpenSSL server of the test's own.

use super::{amqps_url, tls_file, tls_node};
use crate::suite::{fast_retries, pair, publish};
use crate::support::*;
use std::process::{Child, Command, Stdio};
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

/// An OpenSSL server on a port of its own, presenting a certificate the
/// tests' CA signed for `localhost` that expired on 2020-01-02; killed
/// when dropped.
struct ExpiredServer {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl ExpiredServer {
    fn start() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = |name: &str| dir.path().join(name).display().to_string();
        std::fs::write(path("index.txt"), "").expect("the CA's index");
        std::fs::write(path("serial"), "01\n").expect("the CA's serial");
        std::fs::write(path("san.ext"), "subjectAltName=DNS:localhost\n").expect("extensions");
        let config = format!(
            "[ca]\ndefault_ca = test\n[test]\ndatabase = {}\nnew_certs_dir = {}\nserial = {}\n\
             default_md = sha256\npolicy = any\n[any]\ncommonName = supplied\n",
            path("index.txt"),
            dir.path().display(),
            path("serial")
        );
        std::fs::write(path("ca.cnf"), config).expect("the CA's configuration");
        let openssl = |args: &[&str]| run_tool("openssl", args);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            &path("expired.key"),
            "-out",
            &path("expired.csr"),
        ]);
        // `openssl ca` is the one OpenSSL 3.0 command that sets both dates.
        openssl(&[
            "ca",
            "-batch",
            "-notext",
            "-config",
            &path("ca.cnf"),
            "-cert",
            &tls_file("ca.pem"),
            "-keyfile",
            &tls_file("ca.key"),
            "-startdate",
            "20200101000000Z",
            "-enddate",
            "20200102000000Z",
            "-extfile",
            &path("san.ext"),
            "-in",
            &path("expired.csr"),
            "-out",
            &path("expired.pem"),
        ]);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("openssl")
            .args(["s_server", "-quiet", "-accept"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-cert", &path("expired.pem"), "-key", &path("expired.key")])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("openssl s_server starts");
        let server = ExpiredServer {
            port,
            child,
            _dir: dir,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "openssl s_server never listened on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }
}

impl Drop for ExpiredServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[actix::test]
async fn an_expired_broker_certificate_is_refused_with_its_date() {
    trace_init();
    let server = ExpiredServer::start();
    let url = format!(
        "amqps://guest:guest@localhost:{}/%2f?cacertfile={}",
        server.port,
        tls_file("ca.pem")
    );
    let reason = refusal(url).await;
    assert!(
        reason.contains("the server's certificate expired on 2020-01-02"),
        "{reason}"
    );
}
