//! minishop with `--otlp-endpoint` (feature `opentelemetry`), its spans
//! received by an OTLP/HTTP receiver on loopback: one order is one trace
//! from `place_order` through every handler, whether the messages go
//! through the shared databases or RabbitMQ, and across a SIGKILL and a
//! restart (the context comes back from the outbox row). Built without the
//! feature, minishop refuses the flag and nothing is exported.
#![cfg_attr(not(feature = "opentelemetry"), allow(dead_code, unused_imports))]

use super::*;
use crate::support::otlp_receiver::{OtlpReceiver, ReceivedSpan};
use std::collections::{HashMap, HashSet};

/// minishop's handlers.
const RESERVE_STOCK: &str = "warehouse.reserve_stock";
const CONFIRM_ORDER: &str = "orders.confirm_order";
const REJECT_ORDER: &str = "orders.reject_order";
const SEND_CONFIRMATION: &str = "notifications.send_confirmation";

/// The spans of a message's life.
fn is_messaging(span: &ReceivedSpan) -> bool {
    ["create ", "send ", "process ", "dead_letter "]
        .iter()
        .any(|prefix| span.name.starts_with(prefix))
}

/// A `process` span of a whole batch (its messages' spans are its
/// children).
fn is_batch(span: &ReceivedSpan) -> bool {
    span.attribute("messaging.batch.message_count").is_some()
}

/// Checks what a complete run's spans say: `orders` orders, each one trace
/// holding every span of its flow; each `process` span the child of the
/// `create` span of its message (or, in a batch, linked to it); a
/// duplicate skipped, never processed twice; the injected failures marked.
/// `services`: the processes the flow crosses (1, or 3 when split).
fn assert_one_trace_per_order(spans: &[ReceivedSpan], orders: usize, services: usize, what: &str) {
    let placed: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == "place_order").collect();
    assert_eq!(
        placed.len(),
        orders,
        "{what}: one place_order span per order"
    );
    let traces: HashSet<&str> = placed.iter().map(|s| s.trace_id.as_str()).collect();
    assert_eq!(traces.len(), orders, "{what}: each order its own trace");
    let by_id: HashMap<&str, &ReceivedSpan> =
        spans.iter().map(|s| (s.span_id.as_str(), s)).collect();

    let messaging: Vec<&ReceivedSpan> = spans.iter().filter(|s| is_messaging(s)).collect();
    // A batch's span is a trace of its own, linked to its messages' (the
    // conventions' way); each message's span in it stays in its order's.
    for span in messaging.iter().filter(|s| !is_batch(s)) {
        assert!(
            traces.contains(span.trace_id.as_str()),
            "{what}: a span outside every order's trace: {span:#?}"
        );
    }

    let process: Vec<&ReceivedSpan> = messaging
        .iter()
        .copied()
        .filter(|s| s.name.starts_with("process "))
        .collect();
    let create_of = |trace: &str, span_id: &str, message: Option<&str>| {
        let create = by_id
            .get(span_id)
            .unwrap_or_else(|| panic!("{what}: span {span_id} was never exported"));
        assert!(create.name.starts_with("create "), "{what}: {create:#?}");
        assert_eq!(create.trace_id, trace, "{what}: {create:#?}");
        if let Some(message) = message {
            assert_eq!(
                create.attribute("messaging.message.id"),
                Some(message),
                "{what}: the create span of another message: {create:#?}"
            );
        }
    };
    for span in &process {
        if is_batch(span) {
            assert!(!span.links.is_empty(), "{what}: {span:#?}");
            for (trace, linked) in &span.links {
                create_of(trace, linked, None);
            }
            continue;
        }
        let message = span.attribute("messaging.message.id");
        create_of(&span.trace_id, &span.parent_span_id, message);
        for (_, linked) in &span.links {
            let batch = by_id
                .get(linked.as_str())
                .unwrap_or_else(|| panic!("{what}: the batch of {span:#?} was never exported"));
            assert!(is_batch(batch), "{what}: linked to a batch: {batch:#?}");
        }
    }

    // The flow of each order, in its trace.
    let mut crossed = HashSet::new();
    for trace in &traces {
        let in_trace: Vec<&&ReceivedSpan> = process
            .iter()
            .filter(|s| s.trace_id == *trace && !is_batch(s))
            .collect();
        let groups: HashSet<&str> = in_trace
            .iter()
            .filter_map(|s| s.attribute("messaging.consumer.group.name"))
            .collect();
        assert!(
            groups.contains(RESERVE_STOCK)
                && (groups.contains(CONFIRM_ORDER) || groups.contains(REJECT_ORDER)),
            "{what}: trace {trace} misses the warehouse or the way back: {groups:?}"
        );
        if groups.contains(CONFIRM_ORDER) {
            assert!(
                groups.contains(SEND_CONFIRMATION),
                "{what}: trace {trace} misses the notification: {groups:?}"
            );
            let services: HashSet<&str> = in_trace.iter().map(|s| s.service.as_str()).collect();
            crossed.insert(services.len());
        }
    }
    assert!(
        crossed.contains(&services),
        "{what}: a confirmed order's trace crosses {services} processes: {crossed:?}"
    );

    // Each delivery's work was processed once; duplicates were skipped.
    let mut handled: HashMap<(&str, &str), usize> = HashMap::new();
    let mut duplicates = 0;
    for span in process.iter().filter(|s| !is_batch(s)) {
        let key = (
            span.attribute("messaging.message.id")
                .expect("a message id"),
            span.attribute("messaging.consumer.group.name")
                .expect("a consumer group"),
        );
        match span.attribute("outcome") {
            Some("Handled") => *handled.entry(key).or_default() += 1,
            Some("Duplicate") => {
                assert!(
                    span.events.iter().any(|e| e == "duplicate skipped"),
                    "{what}: {span:#?}"
                );
                duplicates += 1;
            }
            _ => {}
        }
    }
    for (key, times) in &handled {
        assert_eq!(*times, 1, "{what}: {key:?} processed {times} times");
    }
    assert!(
        duplicates > 0,
        "{what}: duplicates were injected, none shows"
    );
    let failed = process
        .iter()
        .filter(|s| s.attribute("error.type").is_some())
        .count();
    assert!(failed > 0, "{what}: failures were injected, none shows");
}

const ORDERS: usize = 30;

fn faults() -> [&'static str; 4] {
    ["--fail-rate", "0.1", "--duplicate-rate", "0.2"]
}

/// One process, every module, the local transport.
#[cfg(feature = "opentelemetry")]
#[test]
fn sqlite_one_process_exports_one_trace_per_order() {
    let receiver = OtlpReceiver::start();
    let place = Place::sqlite();
    let orders = ORDERS.to_string();
    let mut args = vec![
        "--orders",
        &orders,
        "--json",
        "--otlp-endpoint",
        &receiver.url,
    ];
    args.extend(faults());
    let output = finish(spawn(&place, &args), Duration::from_secs(300), "the run");
    check_result(&output, "the run");
    assert_one_trace_per_order(&receiver.spans(), ORDERS, 1, "one process");
}

/// A process running only the orders module places orders (their handlers
/// run nowhere yet) and is killed (SIGKILL) with their messages in its
/// outbox; a new process of
/// every module delivers them: each handler's span is the child of the
/// killed process's `create` span, its context read back from the row.
#[cfg(feature = "opentelemetry")]
#[test]
fn sqlite_the_trace_survives_a_sigkill_and_a_restart() {
    let place = Place::sqlite();
    // A first run records the handlers' subscriptions, so that a process
    // of the orders module alone places orders for them.
    let first = finish(
        spawn(&place, &["--orders", "1", "--json"]),
        Duration::from_secs(300),
        "the first run",
    );
    check_result(&first, "the first run");
    let killed = OtlpReceiver::start();
    let mut child = spawn(
        &place,
        &[
            "--modules",
            "orders",
            "--orders",
            "10",
            "--json",
            "--otlp-endpoint",
            &killed.url,
        ],
    );
    let started = Instant::now();
    while killed
        .spans()
        .iter()
        .filter(|s| s.name == "create orders.order_placed")
        .count()
        < 10
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the orders process never exported its ten create spans"
        );
        assert!(child.try_wait().expect("try_wait").is_none(), "it ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    let created: HashMap<String, ReceivedSpan> = killed
        .spans()
        .into_iter()
        .filter(|s| s.name == "create orders.order_placed")
        .map(|s| (s.span_id.clone(), s))
        .collect();

    let resumed = OtlpReceiver::start();
    let output = finish(
        spawn(
            &place,
            &["--resume", "--json", "--otlp-endpoint", &resumed.url],
        ),
        Duration::from_secs(300),
        "the resumed run",
    );
    check_result(&output, "the resumed run");
    let spans = resumed.spans();
    let mut continued = HashSet::new();
    for span in spans
        .iter()
        .filter(|s| s.name == "process orders.order_placed" && !is_batch(s))
    {
        let create = created
            .get(&span.parent_span_id)
            .unwrap_or_else(|| panic!("not a message of the killed process: {span:#?}"));
        assert_eq!(create.trace_id, span.trace_id, "{span:#?}");
        continued.insert(create.span_id.clone());
    }
    assert_eq!(
        continued.len(),
        created.len(),
        "every message the killed process created was processed in its trace"
    );
}

/// The three modules in three processes over RabbitMQ, on `backend`: the
/// trace goes through the broker and back.
#[cfg(all(feature = "amqp", feature = "opentelemetry"))]
fn three_services_over_amqp_export_one_trace_per_order(backend: &str) {
    let receiver = OtlpReceiver::start();
    super::amqp_split::share_the_work_exporting(backend, ORDERS as u64, &receiver.url);
    let what = format!("three processes over amqp on {backend}");
    assert_one_trace_per_order(&receiver.spans(), ORDERS, 3, &what);
}

#[cfg(all(feature = "amqp", feature = "opentelemetry"))]
#[test]
fn sqlite_three_services_over_amqp_export_one_trace_per_order() {
    three_services_over_amqp_export_one_trace_per_order("sqlite");
}

#[cfg(all(feature = "amqp", feature = "opentelemetry", feature = "postgres"))]
#[test]
fn postgres_three_services_over_amqp_export_one_trace_per_order() {
    three_services_over_amqp_export_one_trace_per_order("postgres");
}

#[cfg(all(feature = "amqp", feature = "opentelemetry", feature = "mysql"))]
#[test]
fn mysql_three_services_over_amqp_export_one_trace_per_order() {
    three_services_over_amqp_export_one_trace_per_order("mysql");
}

/// Without the `opentelemetry` feature, minishop refuses `--otlp-endpoint`
/// with a clear error, before doing anything, and exports nothing.
#[cfg(not(feature = "opentelemetry"))]
#[test]
fn without_the_feature_the_flag_is_refused_and_nothing_is_exported() {
    let receiver = OtlpReceiver::start();
    let place = Place::sqlite();
    let output = finish(
        spawn(&place, &["--orders", "5", "--otlp-endpoint", &receiver.url]),
        Duration::from_secs(60),
        "the run",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--otlp-endpoint needs the `opentelemetry` feature"),
        "{stderr}"
    );
    assert_eq!(place.count("orders", "orders"), 0, "it placed nothing");
    assert!(receiver.spans().is_empty(), "{:#?}", receiver.spans());
}
