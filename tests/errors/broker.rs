//! A login the broker refuses is reported by tickbox alone.

use super::assert_hidden;
use crate::support::{amqp_url, broker_shared, trace_init, TestBackend, TestDb};
use std::sync::{Arc, Mutex};
use tickbox::{Amqp, Bus, Error, Sqlite};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// The broker's URL with a password it refuses.
fn wrong_password() -> String {
    let url = url::Url::parse(&amqp_url()).expect("the broker's URL");
    let mut wrong = url.clone();
    wrong
        .set_password(Some("S3cret-wrong"))
        .expect("a password");
    wrong.to_string()
}

/// Every event of the thread it is installed on: level, target, fields.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<(tracing::Level, String, String)>>>);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Captured {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Fields(String);
        impl tracing::field::Visit for Fields {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.push_str(&format!(" {}={value:?}", field.name()));
            }
        }
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        let meta = event.metadata();
        self.0.lock().expect("the events").push((
            *meta.level(),
            meta.target().to_string(),
            fields.0,
        ));
    }
}

/// tickbox's error says what to fix and is all tickbox says: it logs
/// nothing of its own about the refusal, and nothing with the password.
#[actix::test]
async fn a_refused_login_is_one_clear_error_and_nothing_else_from_tickbox() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let orders = Sqlite::module(&db, "orders")
        .start()
        .await
        .expect("orders starts");
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _thread = tracing::subscriber::set_default(subscriber);
    let error = Bus::builder()
        .module(&orders)
        .amqp(Amqp::new(wrong_password()))
        .start()
        .await
        .err()
        .expect("refused");
    assert!(matches!(error, Error::BrokerRefused { .. }), "{error}");
    assert!(!error.is_transient(), "{error}");
    assert!(
        error
            .to_string()
            .contains("check the user name and password"),
        "the error says what to fix: {error}"
    );
    assert_hidden("the error", &format!("{error} {error:?}"));
    let events = captured.0.lock().expect("the events").clone();
    for (level, target, fields) in &events {
        assert_hidden("an event", fields);
        assert!(
            !(target.starts_with("tickbox") && *level <= tracing::Level::WARN),
            "tickbox logged {level} {target}:{fields}"
        );
    }
}

/// What a user of minishop sees: tickbox's error, and no line of lapin's
/// (which logs the refusal at error level itself, see README "Logging").
#[test]
fn minishop_reports_a_refused_login_in_tickboxs_words_only() {
    let _broker = broker_shared();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = std::process::Command::new(crate::processes::minishop())
        .args(["--transport", "amqp", "--amqp-url", &wrong_password()])
        .args(["--orders", "1", "--timeout", "60", "--data-dir"])
        .arg(dir.path())
        .env_remove("RUST_LOG")
        .output()
        .expect("minishop runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refused") && stderr.contains("check the user name and password"),
        "{stderr}"
    );
    assert!(!stderr.contains("lapin"), "only tickbox speaks: {stderr}");
    assert!(!stderr.contains("ERROR"), "only tickbox speaks: {stderr}");
    assert_hidden("minishop", &stderr);
}
