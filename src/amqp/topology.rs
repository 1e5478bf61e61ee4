//! What tickbox declares on the broker, every time it connects (declaring
//! is idempotent): one durable topic exchange, and for each handler one
//! durable quorum queue bound to it with the handler's topic as routing key.
//!
//! One topic exchange rather than one per topic: a new topic needs no new
//! exchange, topics are dotted names already, and a queue's binding says
//! exactly what its handler receives.

use crate::amqp::fault::Fault;
use crate::amqp::settings::Amqp;
use crate::error::Result;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use std::time::Duration;

/// How long connecting may take before the broker counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// AMQP's limit on exchange and queue names and routing keys, in bytes.
const MAX_NAME_BYTES: usize = 255;

/// A queue tickbox declares: a handler's.
#[derive(Debug, Clone)]
pub(crate) struct HandlerQueue {
    /// The queue's name.
    pub(crate) name: String,
    /// The topic bound to it.
    pub(crate) topic: &'static str,
}

/// Connects to the broker, asking for the heartbeat of `amqp`.
pub(crate) async fn connect(amqp: &Amqp, name: &str) -> Result<Connection, Fault> {
    let uri = amqp
        .uri()
        .map_err(|error| Fault::Refused(format!("connecting: {error}")))?;
    let properties = ConnectionProperties::default().with_connection_name(name.into());
    // A broker that takes the TCP connection but never answers the
    // handshake must not hold the caller for ever.
    match tokio::time::timeout(CONNECT_TIMEOUT, Connection::connect_uri(uri, properties)).await {
        Ok(connected) => connected.map_err(|e| Fault::of("connecting", &e)),
        Err(_) => Err(Fault::Unreachable(format!(
            "connecting: no answer to the handshake within {CONNECT_TIMEOUT:?}"
        ))),
    }
}

/// Checks that the names fit AMQP's limits.
pub(crate) fn check_names(amqp: &Amqp, queues: &[HandlerQueue]) -> Result<(), String> {
    let exchange = amqp.exchange();
    if exchange.len() > MAX_NAME_BYTES {
        return Err(format!(
            "the exchange name `{exchange}` is over {MAX_NAME_BYTES} bytes"
        ));
    }
    for queue in queues {
        if queue.name.len() > MAX_NAME_BYTES {
            return Err(format!(
                "the queue name `{}` is over {MAX_NAME_BYTES} bytes: shorten the namespace, module or handler name",
                queue.name
            ));
        }
        if queue.topic.len() > MAX_NAME_BYTES {
            return Err(format!(
                "the topic `{}` is over {MAX_NAME_BYTES} bytes",
                queue.topic
            ));
        }
    }
    Ok(())
}

/// Declares the exchange.
pub(crate) async fn declare_exchange(channel: &Channel, amqp: &Amqp) -> Result<(), Fault> {
    let exchange = amqp.exchange();
    channel
        .exchange_declare(
            ShortString::from(exchange.as_str()),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(|e| Fault::of(&format!("declaring the exchange `{exchange}`"), &e))
}

/// Declares a handler's queue and binds it to the exchange.
pub(crate) async fn declare_queue(
    channel: &Channel,
    amqp: &Amqp,
    queue: &HandlerQueue,
) -> Result<(), Fault> {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    channel
        .queue_declare(
            ShortString::from(queue.name.as_str()),
            QueueDeclareOptions {
                durable: true,
                ..QueueDeclareOptions::default()
            },
            arguments,
        )
        .await
        .map_err(|e| Fault::of(&format!("declaring the queue `{}`", queue.name), &e))?;
    channel
        .queue_bind(
            ShortString::from(queue.name.as_str()),
            ShortString::from(amqp.exchange().as_str()),
            ShortString::from(queue.topic),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .map_err(|e| Fault::of(&format!("binding the queue `{}`", queue.name), &e))
}

/// The messages waiting in a queue, read with a passive declare (which
/// changes nothing).
pub(crate) async fn depth(channel: &Channel, queue: &str) -> Result<u32, Fault> {
    status(channel, queue).await.map(|(messages, _)| messages)
}

/// The messages waiting in a queue and its consumers, read with a passive
/// declare.
pub(crate) async fn status(channel: &Channel, queue: &str) -> Result<(u32, u32), Fault> {
    channel
        .queue_declare(
            ShortString::from(queue),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map(|declared| (declared.message_count(), declared.consumer_count()))
        .map_err(|e| Fault::of(&format!("reading the queue `{queue}`"), &e))
}

/// Declares everything once at bus start, so that a broker that is
/// unreachable or refuses stops the start with a clear error.
pub(crate) async fn declare_all(amqp: &Amqp, queues: &[HandlerQueue]) -> Result<(), Fault> {
    check_names(amqp, queues).map_err(Fault::Refused)?;
    on_channel(amqp, "tickbox topology", async |channel| {
        declare_exchange(channel, amqp).await?;
        for queue in queues {
            declare_queue(channel, amqp, queue).await?;
        }
        Ok(())
    })
    .await
}

/// Connects, opens a channel, runs `work` on it, and closes both.
async fn on_channel<T>(
    amqp: &Amqp,
    name: &str,
    work: impl AsyncFnOnce(&Channel) -> Result<T, Fault>,
) -> Result<T, Fault> {
    let connection = connect(amqp, name).await?;
    let channel = match connection.create_channel().await {
        Ok(channel) => channel,
        Err(error) => {
            close(connection, None, "no channel").await;
            return Err(Fault::of("opening a channel", &error));
        }
    };
    let done = work(&channel).await;
    close(connection, Some(channel), "done").await;
    done
}

/// Closes `channel`, then its connection, giving up on each after a second
/// (a broker that blocks publishers reads nothing more, not even a close).
/// The channel goes first: lapin closes a dropped channel by itself, and if
/// its connection is closing by then, it reports a connection error.
pub(crate) async fn close(connection: Connection, channel: Option<Channel>, why: &'static str) {
    if let Some(channel) = channel.filter(|channel| channel.status().connected()) {
        let _ = tokio::time::timeout(CLOSE_TIMEOUT, channel.close(200, why.into())).await;
    }
    let _ = tokio::time::timeout(CLOSE_TIMEOUT, connection.close(200, why.into())).await;
}

/// How long closing a channel or a connection may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(1);

impl Amqp {
    /// Reads the queue of handler `handler` of module `module` on the broker
    /// now: the messages waiting in it and its consumers. For operators'
    /// tools; it declares nothing (a queue that does not exist is an
    /// [`Error::BrokerRefused`](crate::Error::BrokerRefused) naming it).
    pub async fn queue_status(&self, module: &str, handler: &str) -> Result<QueueStatus> {
        self.validate()?;
        let queue = self.queue(module, handler);
        let url = self.redacted_url();
        let read = on_channel(self, "tickbox queue status", async |channel| {
            status(channel, &queue).await
        })
        .await;
        let (messages, consumers) = read.map_err(|fault| fault.into_error(url))?;
        Ok(QueueStatus {
            queue,
            messages,
            consumers,
        })
    }
}

/// A handler's queue as the broker reports it ([`Amqp::queue_status`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct QueueStatus {
    /// The queue's name.
    pub queue: String,
    /// Messages waiting in it (not those delivered and not yet
    /// acknowledged).
    pub messages: u32,
    /// Consumers on it: the handler's running services.
    pub consumers: u32,
}
