//! Trace context (feature `opentelemetry`): one flow is one trace, from the
//! span that published its first message through every handler, whatever
//! carried the messages (the in-process hand-over, a scan of the outbox
//! after a restart, RabbitMQ), with spans named and attributed as
//! OpenTelemetry's messaging conventions say. The spans are read from the
//! SDK's in-memory exporter.

use super::{drained, fast_retries};
use crate::support::*;
use opentelemetry::trace::{SpanKind, Status, TraceId, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use tickbox::{
    BusHandle, Delivery, Handler, HandlerError, HandlerOptions, ModuleHandle, Outcome, Tx,
};
use tokio::sync::watch;
use tracing::Instrument;
use tracing_subscriber::layer::SubscriberExt;

/// Spans ended on this thread (the test's actix system), kept in memory
/// until the capture is dropped.
pub struct Capture {
    exporter: InMemorySpanExporter,
    _provider: SdkTracerProvider,
    _default: tracing::subscriber::DefaultGuard,
}

impl Capture {
    /// Sends this thread's `tracing` spans to OpenTelemetry, exported to
    /// memory.
    pub fn start() -> Self {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("tickbox-tests");
        let subscriber =
            tracing_subscriber::registry().with(tracing_opentelemetry::layer().with_tracer(tracer));
        Capture {
            exporter,
            _provider: provider,
            _default: tracing::subscriber::set_default(subscriber),
        }
    }

    /// The spans ended so far.
    pub fn spans(&self) -> Vec<SpanData> {
        self.exporter
            .get_finished_spans()
            .expect("the exporter reads")
    }

    /// Waits until `count` spans named `name` have ended, and returns the
    /// spans ended by then.
    pub async fn wait_for(&self, name: &str, count: usize) -> Vec<SpanData> {
        eventually(&format!("{count} spans `{name}` end"), WAIT, || async {
            named(&self.spans(), name).len() >= count
        })
        .await;
        self.spans()
    }
}

/// The spans named `name`.
pub fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|span| span.name == name).collect()
}

/// The value of attribute `key` of `span`, as text.
pub fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| match &kv.value {
            Value::String(s) => s.as_str().to_string(),
            other => other.to_string(),
        })
}

/// The span of `spans` whose attribute `key` is `value`.
fn with_attribute<'a>(spans: &[&'a SpanData], key: &str, value: &str) -> &'a SpanData {
    let found: Vec<_> = spans
        .iter()
        .filter(|span| attribute(span, key).as_deref() == Some(value))
        .collect();
    assert_eq!(found.len(), 1, "one span with {key} = {value}: {spans:#?}");
    found[0]
}

/// The `messaging.system` a handler's spans carry on this test database.
fn system(db: &TestDb) -> &'static str {
    if db.over_broker() {
        "rabbitmq"
    } else {
        "tickbox"
    }
}

/// `orders` publishes Ping; `warehouse` handles it (failing first, then
/// publishing Pong); `notifications` handles Pong.
async fn three_modules<B: TestBackend>(
    db: &TestDb,
    ping: &Record,
    pong: &Record,
) -> (ModuleHandle<B>, ModuleHandle<B>, ModuleHandle<B>) {
    let orders = B::module(db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let warehouse = B::module(db, "warehouse")
        .publishes::<Pong>()
        .handler("warehouse.record", record::<Ping>(ping))
        .start()
        .await
        .expect("warehouse starts");
    let notifications = B::module(db, "notifications")
        .handler("notifications.record", record::<Pong>(pong))
        .start()
        .await
        .expect("notifications starts");
    for module in [&orders, &warehouse, &notifications] {
        create_changes(module).await;
    }
    (orders, warehouse, notifications)
}

async fn bus_of<B: TestBackend>(db: &TestDb, modules: &[&ModuleHandle<B>]) -> BusHandle<B> {
    super::bus(db, modules).await
}

/// Publishes Ping `n` from `orders` inside the span `place_order`, and
/// returns that span's trace id and the message's id.
async fn place_order<B: TestBackend>(orders: &ModuleHandle<B>, n: u64) -> uuid::Uuid {
    let request = tracing::info_span!("place_order", n);
    orders
        .transaction(async move |tx| tx.publish(&Ping { n }))
        .instrument(request)
        .await
        .expect("publish commits")
}

/// Checks what every span of a message's life says of it.
fn assert_messaging(span: &SpanData, operation: &str, topic: &str, id: uuid::Uuid) {
    assert_eq!(
        attribute(span, "messaging.operation.type").as_deref(),
        Some(operation),
        "{span:#?}"
    );
    assert_eq!(
        attribute(span, "messaging.operation.name").as_deref(),
        Some(operation)
    );
    assert_eq!(
        attribute(span, "messaging.message.id"),
        Some(id.to_string()),
        "{span:#?}"
    );
    let destination = attribute(span, "messaging.destination.name").expect("a destination");
    assert!(destination.ends_with(topic), "{destination}");
}

/// One order is one trace: `place_order` → `create test.ping` →
/// `process test.ping` (a failure, then a retry) → `create test.pong` →
/// `process test.pong`; over the broker, a `send` span per message between
/// its `create` and its `process`. The outbox row keeps the context.
pub async fn one_flow_is_one_trace_from_the_publisher_through_every_handler<B: TestBackend>(
    db: TestDb,
) {
    let capture = Capture::start();
    let ping = Record::new(Then::FailFirst(1)).publishing_pong();
    let pong = Record::new(Then::Succeed);
    let (orders, warehouse, notifications) = three_modules::<B>(&db, &ping, &pong).await;
    let bus = bus_of(&db, &[&orders, &warehouse, &notifications]).await;

    let id = place_order(&orders, 1).await;
    drained(&bus).await;
    let spans = capture.wait_for("process test.pong", 1).await;
    bus.stop().await;

    let request = named(&spans, "place_order");
    assert_eq!(request.len(), 1);
    let trace = request[0].span_context.trace_id();
    assert_ne!(trace, TraceId::INVALID);

    // The first message's create span, a child of the request's.
    let create_ping = named(&spans, "create test.ping");
    assert_eq!(create_ping.len(), 1, "{spans:#?}");
    let create_ping = create_ping[0];
    assert_eq!(create_ping.span_kind, SpanKind::Producer);
    assert_eq!(create_ping.span_context.trace_id(), trace);
    assert_eq!(
        create_ping.parent_span_id,
        request[0].span_context.span_id()
    );
    assert_messaging(create_ping, "create", "test.ping", id);
    assert_eq!(
        attribute(create_ping, "messaging.system").as_deref(),
        Some("tickbox")
    );
    assert_eq!(
        attribute(create_ping, "messaging.message.conversation_id"),
        Some(id.to_string()),
        "the first message's id is its flow's correlation id"
    );

    // Its context is in the outbox row.
    let traceparent = format!("00-{}-{}-01", trace, create_ping.span_context.span_id());
    assert_eq!(
        count(
            &orders,
            format!(
                "SELECT count(*) AS n FROM tickbox_outbox WHERE trace_context = '{traceparent}'"
            )
        )
        .await,
        1,
        "the outbox row keeps the context of the span that created it"
    );

    // Two deliveries to the warehouse: the failure and the retry, each a
    // consumer span whose parent is the create span.
    let process_ping = named(&spans, "process test.ping");
    assert_eq!(process_ping.len(), 2, "{process_ping:#?}");
    for span in &process_ping {
        assert_eq!(span.span_kind, SpanKind::Consumer);
        assert_eq!(span.span_context.trace_id(), trace);
        assert_eq!(span.parent_span_id, create_ping.span_context.span_id());
        assert_messaging(span, "process", "test.ping", id);
        assert_eq!(
            attribute(span, "messaging.consumer.group.name").as_deref(),
            Some("warehouse.record")
        );
        assert_eq!(
            attribute(span, "messaging.system").as_deref(),
            Some(system(&db))
        );
    }
    let failed = with_attribute(&process_ping, "attempt", "1");
    assert_eq!(
        attribute(failed, "error.type").as_deref(),
        Some("Handler"),
        "{failed:#?}"
    );
    assert!(matches!(failed.status, Status::Error { .. }), "{failed:#?}");
    let retried = with_attribute(&process_ping, "attempt", "2");
    assert_eq!(attribute(retried, "error.type"), None);
    assert!(
        retried.events.iter().any(|event| event.name == "retry"),
        "{retried:#?}"
    );
    assert_eq!(attribute(retried, "outcome").as_deref(), Some("Handled"));

    // The warehouse's message, created in the retry's span.
    let create_pong = named(&spans, "create test.pong");
    assert_eq!(
        create_pong.len(),
        1,
        "the failed attempt failed before publishing"
    );
    let committed_pong = create_pong[0];
    assert_eq!(
        committed_pong.parent_span_id,
        retried.span_context.span_id(),
        "the Pong is created in the retry's span"
    );
    assert_eq!(committed_pong.span_context.trace_id(), trace);

    let process_pong = named(&spans, "process test.pong");
    assert_eq!(process_pong.len(), 1, "{process_pong:#?}");
    assert_eq!(process_pong[0].span_context.trace_id(), trace);
    assert_eq!(
        process_pong[0].parent_span_id,
        committed_pong.span_context.span_id()
    );
    assert_eq!(
        attribute(process_pong[0], "messaging.message.conversation_id"),
        Some(id.to_string()),
        "the whole flow is one conversation"
    );

    // Over the broker, each message was sent once, in its trace.
    let sends: Vec<&SpanData> = spans
        .iter()
        .filter(|span| span.name.starts_with("send "))
        .collect();
    if db.over_broker() {
        assert_eq!(sends.len(), 2, "{sends:#?}");
        for send in &sends {
            assert_eq!(send.span_kind, SpanKind::Producer);
            assert_eq!(send.span_context.trace_id(), trace);
            assert_eq!(
                attribute(send, "messaging.system").as_deref(),
                Some("rabbitmq")
            );
            let destination = attribute(send, "messaging.destination.name").expect("a destination");
            let routing_key = attribute(send, "messaging.rabbitmq.destination.routing_key")
                .expect("a routing key");
            assert!(
                destination.starts_with("tickbox.")
                    && destination.ends_with(&format!(":{routing_key}")),
                "`exchange:routing key`: {destination}"
            );
        }
        let send_ping = with_attribute(&sends, "messaging.message.id", &id.to_string());
        assert_eq!(send_ping.parent_span_id, create_ping.span_context.span_id());
    } else {
        assert!(sends.is_empty(), "{sends:#?}");
    }
    assert_eq!(pong.calls.load(SeqCst), 1);
}

/// A message published while no bus runs is found by the bus's first scan:
/// its context comes back from the outbox row, so its handler's span is
/// still the publishing span's child.
pub async fn the_context_comes_back_from_the_outbox_row_after_a_restart<B: TestBackend>(
    db: TestDb,
) {
    let capture = Capture::start();
    let ping = Record::new(Then::Succeed);
    let (orders, warehouse) = super::pair::<B>(&db, &ping).await;
    // No bus yet: the row waits in the outbox, as after a crash.
    let id = place_order(&orders, 1).await;
    assert_eq!(
        count(
            &orders,
            "SELECT count(*) AS n FROM tickbox_outbox WHERE trace_context IS NOT NULL"
        )
        .await,
        1
    );
    let bus = bus_of(&db, &[&orders, &warehouse]).await;
    drained(&bus).await;
    let spans = capture.wait_for("process test.ping", 1).await;
    bus.stop().await;

    let create = named(&spans, "create test.ping");
    let process = named(&spans, "process test.ping");
    assert_eq!((create.len(), process.len()), (1, 1), "{spans:#?}");
    assert_eq!(
        process[0].span_context.trace_id(),
        create[0].span_context.trace_id()
    );
    assert_eq!(process[0].parent_span_id, create[0].span_context.span_id());
    assert!(process[0].parent_span_is_remote, "read back from the row");
    assert_messaging(process[0], "process", "test.ping", id);
}

/// A message delivered again is skipped by the inbox: its span says so, and
/// the handler's work is never processed twice.
pub async fn a_duplicate_is_skipped_in_its_own_span<B: TestBackend>(db: TestDb) {
    let capture = Capture::start();
    let ping = Record::new(Then::Succeed);
    let (orders, warehouse) = super::pair::<B>(&db, &ping).await;
    let bus = db
        .bus()
        .module(&orders)
        .module(&warehouse)
        .retry_policy(fast_retries())
        .duplicate_rate(1.0)
        .start()
        .await
        .expect("bus starts");
    let id = place_order(&orders, 1).await;
    drained(&bus).await;
    let spans = capture.wait_for("process test.ping", 2).await;
    bus.stop().await;
    let create = named(&spans, "create test.ping")[0];
    let process = named(&spans, "process test.ping");
    assert_eq!(process.len(), 2, "{process:#?}");
    let handled = with_attribute(&process, "outcome", "Handled");
    let skipped = with_attribute(&process, "outcome", "Duplicate");
    for span in [handled, skipped] {
        assert_eq!(span.parent_span_id, create.span_context.span_id());
        assert_messaging(span, "process", "test.ping", id);
    }
    assert!(
        skipped
            .events
            .iter()
            .any(|event| event.name == "duplicate skipped"),
        "{skipped:#?}"
    );
    assert!(!handled
        .events
        .iter()
        .any(|event| event.name == "duplicate skipped"));
    assert_eq!(ping.calls.load(SeqCst), 1, "the work ran once");
}

/// A message its handler refuses for good is dead-lettered with its trace
/// context, which the dead letter keeps; the failed `process` span and the
/// dead letter's span are in the message's trace.
pub async fn a_dead_letter_keeps_its_trace<B: TestBackend>(db: TestDb) {
    let capture = Capture::start();
    let poison = Record::new(Then::FailFor {
        n: 2,
        switch: Box::leak(Box::new(std::sync::atomic::AtomicBool::new(true))),
        permanent: true,
    });
    let (orders, warehouse) = super::pair::<B>(&db, &poison).await;
    let bus = bus_of(&db, &[&orders, &warehouse]).await;
    let id = place_order(&orders, 2).await;
    eventually("the message is dead-lettered", WAIT, || async {
        !warehouse
            .dead_letters(0, 10)
            .await
            .expect("reads dead letters")
            .is_empty()
    })
    .await;
    let dead = warehouse
        .dead_letter(id, "warehouse.record")
        .await
        .expect("reads dead letters")
        .expect("the message's dead letter");
    let spans = capture.wait_for("dead_letter test.ping", 1).await;
    bus.stop().await;

    let create = named(&spans, "create test.ping")[0];
    let context = dead
        .trace_context
        .as_ref()
        .expect("the dead letter keeps its context");
    assert_eq!(
        context.trace_id(),
        create.span_context.trace_id().to_string()
    );
    assert_eq!(context.span_id(), create.span_context.span_id().to_string());
    let process = named(&spans, "process test.ping");
    assert_eq!(
        process.len(),
        1,
        "a permanent error is not retried: {process:#?}"
    );
    assert_eq!(
        attribute(process[0], "error.type").as_deref(),
        Some("Permanent")
    );
    assert!(matches!(process[0].status, Status::Error { .. }));
    let dead_span = named(&spans, "dead_letter test.ping")[0];
    assert_eq!(dead_span.parent_span_id, create.span_context.span_id());
    assert_eq!(
        attribute(dead_span, "messaging.consumer.group.name").as_deref(),
        Some("warehouse.record")
    );
    assert!(attribute(dead_span, "tickbox.dead_letter.reason")
        .expect("a reason")
        .contains("poison"));
}

/// Writes a change per message once its gate opens.
#[derive(Clone)]
struct Gated(Arc<watch::Sender<bool>>);

impl<B: TestBackend> Handler<B> for Gated {
    type Message = Ping;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        _: Ping,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let mut gate = self.0.subscribe();
        gate.wait_for(|open| *open).await?;
        write_change(tx, delivery).await
    }
}

/// Messages handled together in one batch: one `process` span for the
/// batch, linked to each message's `create` span; each message's own span
/// stays in its message's trace (a child of its `create` span), linked to
/// the batch's.
pub async fn a_batch_s_process_span_links_every_message_s_context<B: TestBackend>(db: TestDb) {
    let capture = Capture::start();
    let gate = Arc::new(watch::Sender::new(false));
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let warehouse = B::module(&db, "warehouse")
        .handler_with(
            "warehouse.batch",
            Gated(gate.clone()),
            HandlerOptions::new().batch(16),
        )
        .start()
        .await
        .expect("warehouse starts");
    create_changes(&warehouse).await;
    let bus = bus_of(&db, &[&orders, &warehouse]).await;
    // The first delivery holds the batch slot behind the gate; the others
    // wait together and go in one batch once it opens.
    let mut ids = Vec::new();
    for n in 0..6 {
        ids.push(place_order(&orders, n).await);
    }
    eventually("every delivery waits in the warehouse", WAIT, || async {
        warehouse.metrics().mailbox_in_flight == 6
    })
    .await;
    gate.send_replace(true);
    drained(&bus).await;
    let spans = capture.wait_for("process test.ping", 6).await;
    bus.stop().await;

    let creates = named(&spans, "create test.ping");
    assert_eq!(creates.len(), 6);
    let batches: Vec<&SpanData> = named(&spans, "process test.ping")
        .into_iter()
        .filter(|span| attribute(span, "messaging.batch.message_count").is_some())
        .collect();
    assert!(!batches.is_empty(), "a batch formed: {spans:#?}");
    let mut linked = 0;
    for batch in &batches {
        assert_eq!(batch.span_kind, SpanKind::Consumer);
        let size: usize = attribute(batch, "messaging.batch.message_count")
            .expect("a size")
            .parse()
            .expect("a number");
        assert_eq!(batch.links.links.len(), size, "{batch:#?}");
        for link in batch.links.iter() {
            let create = creates
                .iter()
                .find(|create| create.span_context.span_id() == link.span_context.span_id())
                .expect("each link is a message's create span");
            assert_eq!(create.span_context.trace_id(), link.span_context.trace_id());
            let message = named(&spans, "process test.ping")
                .into_iter()
                .find(|span| {
                    span.parent_span_id == create.span_context.span_id()
                        && span
                            .links
                            .iter()
                            .any(|l| l.span_context == batch.span_context)
                })
                .expect(
                    "each message of the batch has its own span in its trace, linked to the batch's",
                );
            assert_eq!(
                message.span_context.trace_id(),
                create.span_context.trace_id()
            );
            assert_eq!(
                attribute(message, "outcome").as_deref(),
                Some(format!("{:?}", Outcome::Handled).as_str())
            );
            linked += 1;
        }
    }
    assert!(linked >= 2, "a batch held several messages");
    assert_eq!(changes(&warehouse, "warehouse.batch").await, 6);
}

/// Calls one external effect per message.
#[derive(Clone)]
struct Notifying;

impl<B: TestBackend> Handler<B> for Notifying {
    type Message = Ping;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        _: Ping,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        let policy =
            tickbox::EffectPolicy::at_least_once_with_key(std::time::Duration::from_secs(60));
        let key: String = delivery
            .effect("notify", policy, |key: String| async move {
                Ok::<_, HandlerError>(key)
            })
            .await?;
        assert!(!key.is_empty());
        write_change(tx, delivery).await
    }
}

/// An external effect a handler makes is a span of its own inside the
/// delivery's `process` span.
pub async fn an_effect_is_a_span_inside_its_delivery<B: TestBackend>(db: TestDb) {
    let capture = Capture::start();
    let orders = B::module(&db, "orders")
        .publishes::<Ping>()
        .start()
        .await
        .expect("orders starts");
    let notifications = B::module(&db, "notifications")
        .handler("notifications.notify", Notifying)
        .start()
        .await
        .expect("notifications starts");
    create_changes(&notifications).await;
    let bus = bus_of(&db, &[&orders, &notifications]).await;
    place_order(&orders, 1).await;
    drained(&bus).await;
    let spans = capture.wait_for("effect notify", 1).await;
    bus.stop().await;

    let process = named(&spans, "process test.ping");
    let effect = named(&spans, "effect notify");
    assert_eq!((process.len(), effect.len()), (1, 1), "{spans:#?}");
    assert_eq!(effect[0].span_kind, SpanKind::Client);
    assert_eq!(effect[0].parent_span_id, process[0].span_context.span_id());
    assert_eq!(
        effect[0].span_context.trace_id(),
        process[0].span_context.trace_id()
    );
    assert_eq!(
        attribute(effect[0], "tickbox.effect.policy").as_deref(),
        Some("at-least-once-with-key")
    );
}
