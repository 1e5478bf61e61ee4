//! The Prometheus endpoint: served over HTTP, named by the conventions, and
//! accepted by `promtool check metrics`.

use crate::support::*;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use tickbox::{Bus, Delivery, EffectPolicy, Handler, HandlerError, Sqlite, Tx};

/// Sends a mail through the effects journal.
struct Mail;

impl Handler<Sqlite> for Mail {
    type Message = Ping;

    async fn handle(
        &self,
        _tx: &mut Tx<Sqlite>,
        _ping: Ping,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let policy = EffectPolicy::at_most_once();
        delivery
            .effect("mail", policy, |_key: String| async {
                Ok::<_, HandlerError>(())
            })
            .await
    }
}

/// A free local port (bound then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// GET over plain HTTP/1.0, without a client library.
fn http_get(port: u16) -> String {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("request");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(
        head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200"),
        "{head}"
    );
    body.to_string()
}

/// `promtool check metrics` on the text; its findings on failure.
fn promtool_check(exposition: &str) -> Result<(), String> {
    let mut child = match Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => panic!("promtool is needed (Debian: apt-get install prometheus): {e}"),
    };
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(exposition.as_bytes())
        .expect("write");
    let output = child.wait_with_output().expect("promtool runs");
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }
}

#[actix::test]
async fn the_prometheus_endpoint_passes_promtool() {
    trace_init();
    let port = free_port();
    let exporter = tickbox::install_prometheus(([127, 0, 0, 1], port).into()).expect("installs");
    let db = TestDb::new();
    let handler = Record::new(Then::FailFirst(1));
    let orders = Sqlite::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders");
    let warehouse = Sqlite::module(&db, "warehouse")
        .handler("warehouse.record", record::<Ping>(&handler))
        .start()
        .await
        .expect("warehouse");
    create_changes(&warehouse).await;
    let notifications = Sqlite::module(&db, "notifications")
        .handler("notifications.mail", Mail)
        .start()
        .await
        .expect("notifications");
    let bus = Bus::builder()
        .module(&orders)
        .module(&warehouse)
        .module(&notifications)
        .retry_policy(crate::suite::fast_retries())
        .start()
        .await
        .expect("bus");
    let session = tickbox::testing::Session::start(&bus).allow_failures();
    orders
        .transaction(async move |tx| tx.publish(&Ping { n: 1 }))
        .await
        .expect("publish");
    let report = session.wait().await;
    assert_eq!(report.handled("warehouse.record").len(), 1, "{report}");
    assert_eq!(report.handled("notifications.mail").len(), 1, "{report}");

    let body = tokio::task::spawn_blocking(move || http_get(port))
        .await
        .expect("GET");
    let labels = r#"module="warehouse",handler="warehouse.record",topic="test.ping""#;
    for line in [
        format!("tickbox_inbox_handled_total{{{labels}}} 1"),
        format!("tickbox_inbox_failed_total{{{labels}}} 1"),
        format!("tickbox_inbox_retried_total{{{labels}}} 1"),
        format!("tickbox_handler_duration_seconds_count{{{labels}}} 1"),
        format!("tickbox_end_to_end_seconds_count{{{labels}}} 1"),
        format!("tickbox_inbox_batches_total{{{labels}}} 0"),
        format!("tickbox_inbox_batch_fallbacks_total{{{labels}}} 0"),
        "# TYPE tickbox_handler_duration_seconds histogram".to_string(),
        "# TYPE tickbox_inbox_handled_total counter".to_string(),
        "# TYPE tickbox_outbox_pending gauge".to_string(),
        r#"tickbox_effects_total{module="notifications",handler="notifications.mail",effect="mail",event="started"} 1"#.to_string(),
        r#"tickbox_effects_total{module="notifications",handler="notifications.mail",effect="mail",event="succeeded"} 1"#.to_string(),
        "# TYPE tickbox_effects_total counter".to_string(),
        "# TYPE tickbox_unknown_effects gauge".to_string(),
    ] {
        assert!(body.contains(&line), "missing `{line}` in:\n{body}");
    }
    assert!(exporter.render().contains("tickbox_inbox_handled_total"));

    // Whether each module's connection to its database server is
    // encrypted: 1 for a module at `verify-full`, 0 for one in clear.
    #[cfg(all(feature = "postgres", feature = "tls"))]
    for (name, query, value) in [
        (
            "encrypted_probe",
            format!(
                "sslmode=verify-full&sslrootcert={}",
                crate::tls::tls_file("ca.pem")
            ),
            1,
        ),
        ("clear_probe", "sslmode=disable".to_string(), 0),
    ] {
        let db = TestDb::postgres_at(crate::tls::postgres::pg_url("localhost", &query));
        let module = <tickbox::Postgres as TestBackend>::module(&db, name)
            .start()
            .await
            .expect(name);
        let line =
            format!(r#"tickbox_connection_encrypted{{module="{name}",server="postgres"}} {value}"#);
        let body = exporter.render();
        assert!(body.contains(&line), "missing `{line}` in:\n{body}");
        module.close();
    }
    if let Err(findings) = promtool_check(&body) {
        panic!("promtool check metrics failed:\n{findings}\n--- exposition ---\n{body}");
    }

    // A scheduled message: the gauge of those waiting and the histogram of
    // how late they were delivered.
    orders
        .transaction(async move |tx| {
            tx.publish_after(std::time::Duration::from_millis(100), &Ping { n: 2 })
        })
        .await
        .expect("publish");
    eventually("the scheduled message is delivered", WAIT, || async {
        bus.metrics()
            .modules
            .iter()
            .any(|m| m.module == "orders" && m.outbox.lateness.count == 1)
    })
    .await;
    let body = tokio::task::spawn_blocking(move || http_get(port))
        .await
        .expect("GET");
    for line in [
        r#"tickbox_scheduled_lateness_seconds_count{module="orders"} 1"#,
        "# TYPE tickbox_scheduled_lateness_seconds histogram",
        "# TYPE tickbox_outbox_scheduled gauge",
    ] {
        assert!(body.contains(line), "missing `{line}` in:\n{body}");
    }
    if let Err(findings) = promtool_check(&body) {
        panic!("promtool check metrics failed:\n{findings}\n--- exposition ---\n{body}");
    }
    bus.stop().await;
}
