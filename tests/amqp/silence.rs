//! The heartbeat and the call deadlines: what tickbox asks for is what the
//! broker keeps, and settings out of range are refused at start.

use super::namespace;
use crate::suite::{fast_retries, pair, publish};
use crate::support::*;
use std::time::Duration;
use tickbox::{Amqp, Bus, BusHandle, Error, ModuleHandle, Sqlite};

/// The broker's URL with `parameter` added to its query.
fn url_with(parameter: &str) -> String {
    let url = amqp_url();
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}{parameter}")
}

/// `orders` and `warehouse` on a bus over `amqp`, scanning every `scan`.
async fn bus(
    orders: &ModuleHandle<Sqlite>,
    warehouse: &ModuleHandle<Sqlite>,
    amqp: Amqp,
    scan: Option<Duration>,
) -> BusHandle<Sqlite> {
    let mut builder = Bus::builder()
        .module(orders)
        .module(warehouse)
        .amqp(amqp)
        .retry_policy(fast_retries());
    if let Some(scan) = scan {
        builder = builder.scan_interval(scan);
    }
    builder.start().await.expect("the bus starts")
}

/// Publishes message `n` and waits at most `within` until the handler has
/// handled `n + 1` messages.
async fn handled(
    orders: &ModuleHandle<Sqlite>,
    warehouse: &ModuleHandle<Sqlite>,
    n: u64,
    within: Duration,
) {
    publish(orders, n).await;
    eventually(&format!("message {n} is handled"), within, || async {
        changes(warehouse, "warehouse.record").await > n as i64
    })
    .await;
}

/// The heartbeat the broker agreed on for each connection whose name
/// contains `namespace` (`rabbitmqctl list_connections`).
fn heartbeats_agreed(namespace: &str) -> Vec<u32> {
    rabbitmqctl(&[
        "list_connections",
        "-q",
        "--no-table-headers",
        "client_properties",
        "timeout",
    ])
    .lines()
    .filter(|line| line.contains(namespace))
    .map(|line| {
        line.rsplit('\t')
            .next()
            .and_then(|timeout| timeout.trim().parse().ok())
            .unwrap_or_else(|| panic!("a timeout at the end of {line:?}"))
    })
    .collect()
}

#[actix::test]
async fn the_broker_keeps_the_heartbeat_tickbox_asks_for() {
    trace_init();
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let cases = [
        (Amqp::new(amqp_url()), 10),
        (Amqp::new(amqp_url()).heartbeat(Duration::from_secs(6)), 6),
        (Amqp::new(url_with("heartbeat=7")), 7),
        (
            Amqp::new(url_with("heartbeat=8")).heartbeat(Duration::from_secs(8)),
            8,
        ),
    ];
    for (n, (amqp, agreed)) in cases.into_iter().enumerate() {
        let namespace = namespace();
        let bus = bus(&orders, &warehouse, amqp.namespace(&*namespace), None).await;
        handled(&orders, &warehouse, n as u64, WAIT).await;
        assert_eq!(
            heartbeats_agreed(&namespace),
            [agreed, agreed],
            "the relay's and the consumer's heartbeat"
        );
        bus.stop().await;
    }
}

#[actix::test]
async fn a_heartbeat_or_call_timeout_out_of_range_is_refused_at_start() {
    trace_init();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let seconds = Duration::from_secs;
    let bad = [
        (Amqp::new(amqp_url()).heartbeat(Duration::ZERO), "heartbeat"),
        (
            Amqp::new(amqp_url()).heartbeat(Duration::from_millis(1500)),
            "whole seconds",
        ),
        (Amqp::new(amqp_url()).heartbeat(seconds(3600)), "heartbeat"),
        (Amqp::new(url_with("heartbeat=0")), "heartbeat"),
        (
            Amqp::new(url_with("heartbeat=30")).heartbeat(seconds(5)),
            "set twice",
        ),
        (
            Amqp::new(amqp_url()).call_timeout(Duration::ZERO),
            "call timeout",
        ),
        (
            Amqp::new(amqp_url()).call_timeout(seconds(86_400)),
            "call timeout",
        ),
        (
            Amqp::new(amqp_url()).confirm_timeout(seconds(86_400)),
            "confirm timeout",
        ),
    ];
    for (amqp, named) in bad {
        let shown = format!("{amqp:?}");
        let error = Bus::builder()
            .module(&orders)
            .module(&warehouse)
            .amqp(amqp)
            .start()
            .await
            .err()
            .expect("refused");
        assert!(
            matches!(&error, Error::Config(text) if text.contains(named)),
            "{shown}: {error}"
        );
    }
}
