//! A broker, or the network to it, gone silent: connections stay open and
//! nothing comes back. tickbox's heartbeat and its deadline on every call
//! notice it; the relay and the consumers give their connections up and
//! make new ones once the network answers again; and every socket given up
//! is closed — none is left behind, however often it happens.

use super::{changes_and_distinct, namespace};
use crate::suite::{fast_retries, pair, publish};
use crate::support::fault_proxy::{sockets_to, FaultProxy, Mode};
use crate::support::*;
use std::time::Duration;
use tickbox::{Amqp, Bus, BusHandle, Error, ModuleHandle, Sqlite};
use tokio::time::Instant;

/// The broker's address.
fn broker_address() -> std::net::SocketAddr {
    use std::net::ToSocketAddrs;
    let url = url::Url::parse(&amqp_url()).expect("the broker's URL");
    let host = url.host_str().expect("a host");
    (host, url.port().unwrap_or(5672))
        .to_socket_addrs()
        .expect("the broker's host resolves")
        .next()
        .expect("an address")
}

/// The broker's URL, with its host and port replaced by loopback `port`.
fn url_to(port: u16) -> String {
    let mut url = url::Url::parse(&amqp_url()).expect("the broker's URL");
    url.set_host(Some("127.0.0.1")).expect("a host");
    url.set_port(Some(port)).expect("a port");
    url.to_string()
}

/// The broker's URL with `parameter` added to its query.
fn url_with(parameter: &str) -> String {
    let url = amqp_url();
    let joint = if url.contains('?') { '&' } else { '?' };
    format!("{url}{joint}{parameter}")
}

/// Settings that give a silent broker up within seconds.
fn impatient(url: String, namespace: &str) -> Amqp {
    Amqp::new(url)
        .namespace(namespace)
        .call_deadline(Duration::from_secs(1))
        .confirm_timeout(Duration::from_secs(2))
        .heartbeat(Duration::from_secs(5))
        .reconnect_backoff(Duration::from_millis(50), Duration::from_millis(500))
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
async fn connections_given_up_release_their_sockets() {
    trace_init();
    let _broker = broker_alone();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let namespace = namespace();

    // A port that takes the connection and never speaks AMQP: each start
    // gives its attempt up after the call timeout, and closes it.
    let silent = FaultProxy::start(broker_address()).await;
    silent.set(Mode::Blackhole);
    for _ in 0..3 {
        let error = Bus::builder()
            .module(&orders)
            .module(&warehouse)
            .amqp(impatient(url_to(silent.port()), &namespace))
            .start()
            .await
            .err()
            .expect("nobody answers on the silent port");
        assert!(
            matches!(&error, Error::BrokerUnreachable { reason, .. } if reason.contains("connecting")),
            "{error}"
        );
    }
    eventually("the attempts' sockets are closed", WAIT, || async {
        sockets_to(silent.port()) == 0
    })
    .await;

    // Through a proxy: the relay's connection and the consumer's.
    let proxy = FaultProxy::start(broker_address()).await;
    let settings = impatient(url_to(proxy.port()), &namespace);
    let bus = bus(
        &orders,
        &warehouse,
        settings,
        Some(Duration::from_millis(200)),
    )
    .await;
    let mut n = 0;
    handled(&orders, &warehouse, n, WAIT).await;
    let baseline = 2;
    eventually(
        "the relay and the consumer hold a socket each",
        WAIT,
        || async { sockets_to(proxy.port()) == baseline },
    )
    .await;

    // The broker closes every connection, three times: each is made again,
    // and the closed ones' sockets go.
    for _ in 0..3 {
        rabbitmqctl(&["close_all_connections", "a test closes every connection"]);
        n += 1;
        handled(&orders, &warehouse, n, WAIT).await;
    }
    eventually("closed connections leave no socket", WAIT, || async {
        sockets_to(proxy.port()) == baseline
    })
    .await;
    let reconnects = bus.metrics().broker.expect("broker figures").reconnects;
    assert!(reconnects >= 3, "connected again ({reconnects})");

    // The network goes silent: the open connections answer nothing, new
    // ones are taken and never answered. The relay (publishing) and the
    // consumer (reading its queue's depth) miss their deadlines, give their
    // connections up, and their attempts to connect again miss theirs.
    let taken = proxy.accepted();
    proxy.set(Mode::Blackhole);
    n += 1;
    publish(&orders, n).await;
    eventually("attempts to connect go unanswered", WAIT, || async {
        proxy.accepted() >= taken + 4
    })
    .await;
    let timed_out = bus
        .metrics()
        .broker
        .expect("broker figures")
        .calls_timed_out;
    assert!(timed_out >= 4, "calls past their deadline: {timed_out}");

    // It answers again, for new connections only.
    proxy.set(Mode::Pass);
    n += 1;
    handled(&orders, &warehouse, n, Duration::from_secs(30)).await;
    eventually("connections given up leave no socket", WAIT, || async {
        sockets_to(proxy.port()) == baseline
    })
    .await;
    eventually("every message is handled once", WAIT, || async {
        changes_and_distinct(&warehouse).await == (n as i64 + 1, n as i64 + 1)
    })
    .await;

    bus.stop().await;
    eventually("a stopped bus holds no socket", WAIT, || async {
        sockets_to(proxy.port()) == 0
    })
    .await;
}

#[actix::test]
async fn a_silent_network_is_noticed_and_left_behind_with_the_default_settings() {
    trace_init();
    // The faults are the proxy's, not the broker's.
    let _broker = broker_shared();
    let db = TestDb::new();
    let handler = Record::new(Then::Succeed);
    let (orders, warehouse) = pair::<Sqlite>(&db, &handler).await;
    let namespace = namespace();
    let proxy = FaultProxy::start(broker_address()).await;
    let settings = Amqp::new(url_to(proxy.port())).namespace(&*namespace);
    let bus = bus(&orders, &warehouse, settings, None).await;
    let mut n = 0;
    handled(&orders, &warehouse, n, WAIT).await;
    let baseline = 2;
    eventually(
        "the relay and the consumer hold a socket each",
        WAIT,
        || async { sockets_to(proxy.port()) == baseline },
    )
    .await;
    assert_eq!(
        heartbeats_agreed(&namespace),
        [10, 10],
        "the default heartbeat"
    );

    // Silent for 25 s, as a network that drops everything for a while.
    let silent_until = Instant::now() + Duration::from_secs(25);
    proxy.set(Mode::Blackhole);
    n += 1;
    publish(&orders, n).await;
    eventually(
        "the relay and the consumer give their connections up",
        Duration::from_secs(25),
        || async {
            bus.metrics()
                .broker
                .expect("broker figures")
                .calls_timed_out
                >= 2
        },
    )
    .await;
    // The fault lasts its time; nothing here waits for tickbox.
    tokio::time::sleep_until(silent_until).await;

    // New work is handled within 30 s of the network's return.
    proxy.set(Mode::Pass);
    n += 1;
    handled(&orders, &warehouse, n, Duration::from_secs(30)).await;
    eventually("connections given up leave no socket", WAIT, || async {
        sockets_to(proxy.port()) == baseline
    })
    .await;
    bus.stop().await;
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
async fn a_heartbeat_or_call_deadline_out_of_range_is_refused_at_start() {
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
            Amqp::new(amqp_url()).call_deadline(Duration::ZERO),
            "call timeout",
        ),
        (
            Amqp::new(amqp_url()).call_deadline(seconds(86_400)),
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
