//! RabbitMQ: each run's namespace and its clean-up, and the raw AMQP
//! baseline — lapin publishing with confirms and consuming with acks, no
//! database — the broker's own limit for this workload.

use crate::cli::Args;
use crate::clock::Clock;
use crate::measure::{produce, wait_handled, RunResult, Stamp};
use crate::place::Place;
use crate::workload::{Work, HANDLER};
use crate::{BoxError, Res};
use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Confirmation, Connection, ConnectionProperties, ExchangeKind};
use std::sync::atomic::Ordering::Relaxed;
use tickbox::{Amqp, Message};

/// The settings of a tickbox bus over the broker, in a namespace of its
/// own (unique in the process, and across processes by the place's random
/// prefix).
pub(crate) fn settings(place: &Place, args: &Args) -> Amqp {
    let amqp = Amqp::new(args.amqp_url.clone())
        .namespace(place.fresh("amqp"))
        .prefetch(args.amqp_prefetch);
    match args.amqp_publish_window {
        Some(window) => amqp.publish_window(window),
        None => amqp,
    }
}

/// Connects to the broker as tickbox does: over TLS for an `amqps://`
/// URL, trusting the CA file its `cacertfile` names (beside the system's
/// roots) and presenting the client certificate of `certfile` and
/// `keyfile`, RabbitMQ's own URI parameters.
async fn connect(url: &str) -> Res<Connection> {
    let mut tls = lapin::tcp::OwnedTLSConfig::default();
    let (mut cert, mut key) = (None, None);
    for (name, value) in url::Url::parse(url)?.query_pairs() {
        match name.as_ref() {
            "cacertfile" => tls.cert_chain = Some(std::fs::read_to_string(value.as_ref())?),
            "certfile" => cert = Some(std::fs::read(value.as_ref())?),
            "keyfile" => key = Some(std::fs::read(value.as_ref())?),
            _ => {}
        }
    }
    if let (Some(pem), Some(key)) = (cert, key) {
        tls.identity = Some(lapin::tcp::OwnedIdentity::PKCS8 { pem, key });
    }
    let runtime = lapin::runtime::default_runtime()?;
    Ok(Connection::connect_with_config(url, ConnectionProperties::default(), tls, runtime).await?)
}

/// Deletes a run's queues and exchange, so that runs do not accumulate on
/// the broker; a failure is a warning (the run's figures stand).
pub(crate) async fn delete(url: &str, exchange: &str, queues: &[String]) {
    let deleted = async {
        let connection = connect(url).await?;
        let channel = connection.create_channel().await?;
        for queue in queues {
            channel
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await?;
        }
        channel
            .exchange_delete(exchange.into(), ExchangeDeleteOptions::default())
            .await?;
        let _ = connection.close(200, "deleted".into()).await;
        Ok::<_, BoxError>(())
    }
    .await;
    if let Err(e) = deleted {
        eprintln!(
            "warning: deleting exchange {exchange} and its queues on {} failed: {e}",
            tickbox::redact::redact_url(url)
        );
    }
}

/// Deletes what a tickbox bus declared for the bench's one handler of
/// module `consumer`.
pub(crate) async fn delete_bus_topology(amqp: &Amqp, url: &str, consumer: &str) {
    delete(url, &amqp.exchange(), &[amqp.queue(consumer, HANDLER)]).await;
}

/// The raw AMQP baseline: `--raw-in-flight` publisher tasks, each
/// publishing a message (persistent, mandatory, to a durable topic exchange)
/// and awaiting its confirm before the next, on one confirm-mode channel
/// (as tickbox's relay publishes); one consumer on a durable quorum queue
/// with `--amqp-prefetch`, acknowledging each message. No database. The
/// latency is from the publish to the acknowledgement sent.
pub(crate) async fn run_raw(place: &Place, args: &Args, offset: u64) -> Res<RunResult> {
    let namespace = place.fresh("raw");
    let exchange = format!("tickbox.{namespace}");
    let queue = format!("{exchange}.ledger.record");
    let result = raw(args, offset, &exchange, &queue).await;
    delete(&args.amqp_url, &exchange, std::slice::from_ref(&queue)).await;
    result
}

/// The raw run on `exchange` and `queue`, declared here.
async fn raw(args: &Args, offset: u64, exchange: &str, queue: &str) -> Res<RunResult> {
    let url = args.amqp_url.as_str();
    let publisher = connect(url).await?;
    let consumer = connect(url).await?;
    let out = publisher.create_channel().await?;
    out.confirm_select(ConfirmSelectOptions::default()).await?;
    out.exchange_declare(
        exchange.into(),
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    )
    .await?;
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    out.queue_declare(
        queue.into(),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        arguments,
    )
    .await?;
    out.queue_bind(
        queue.into(),
        exchange.into(),
        Work::TOPIC.into(),
        QueueBindOptions::default(),
        FieldTable::default(),
    )
    .await?;
    let input = consumer.create_channel().await?;
    input
        .basic_qos(args.amqp_prefetch, BasicQosOptions::default())
        .await?;
    let mut deliveries = input
        .basic_consume(
            queue.into(),
            "bench raw".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;

    let clock = Clock::new(offset, args.messages, true);
    let consuming = {
        let (clock, total) = (clock.clone(), args.messages);
        tokio::spawn(async move {
            while let Some(delivery) = deliveries.next().await {
                let delivery = delivery?;
                let work: Work = serde_json::from_slice(&delivery.data)?;
                delivery.acker.ack(BasicAckOptions::default()).await?;
                clock.handler_committed_index(work.n);
                if clock.handled.fetch_add(1, Relaxed) + 1 >= total {
                    break;
                }
            }
            Ok::<_, BoxError>(())
        })
    };

    let exchange = ShortString::from(exchange);
    let publish = move |n: u64| {
        let (out, exchange) = (out.clone(), exchange.clone());
        async move {
            let id = uuid::Uuid::now_v7().to_string();
            let payload = serde_json::to_vec(&Work { n })?;
            let confirmation = out
                .basic_publish(
                    exchange,
                    Work::TOPIC.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &payload,
                    BasicProperties::default()
                        .with_message_id(id.into())
                        .with_content_type("application/json".into())
                        .with_delivery_mode(2),
                )
                .await?
                .await?;
            if !matches!(confirmation, Confirmation::Ack(None)) {
                return Err(format!("raw publish not confirmed: {confirmation:?}").into());
            }
            Ok(())
        }
    };
    // Stamped before the publish: the consumer may have the message before
    // the confirm comes back.
    let produced = produce(
        args,
        &clock,
        args.rate,
        (args.raw_in_flight, Stamp::Before),
        publish,
    )
    .await?;
    let seconds = wait_handled(&clock, args.messages, || clock.handled.load(Relaxed)).await?;
    consuming.await??;
    let _ = publisher.close(200, "done".into()).await;
    let _ = consumer.close(200, "done".into()).await;
    Ok(RunResult::new("raw amqp", args, &clock, seconds, produced))
}
