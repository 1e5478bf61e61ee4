//! What tickbox declares on the broker, every time it connects (declaring
//! is idempotent): one durable topic exchange, and for each handler one
//! durable quorum queue bound to it with the handler's topic as routing key.
//!
//! One topic exchange rather than one per topic: a new topic needs no new
//! exchange, topics are dotted names already, and a queue's binding says
//! exactly what its handler receives.
//!
//! Also the work behind [`Amqp::queue_status`], which calls
//! [`queue_status`].

use crate::amqp::fault::Fault;
use crate::amqp::link::{Caller, Link};
use crate::amqp::settings::Amqp;
use crate::error::Result;
use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Channel, ExchangeKind};
use std::sync::Arc;

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

/// Declares the exchange on `link`'s `channel`.
pub(crate) async fn declare_exchange(
    link: &Link,
    channel: &Channel,
    amqp: &Amqp,
) -> Result<(), Fault> {
    let exchange = amqp.exchange();
    let declare = channel.exchange_declare(
        ShortString::from(exchange.as_str()),
        ExchangeKind::Topic,
        ExchangeDeclareOptions {
            durable: true,
            ..ExchangeDeclareOptions::default()
        },
        FieldTable::default(),
    );
    link.call(format!("declaring the exchange `{exchange}`"), declare)
        .await
}

/// Declares a handler's queue on `link`'s `channel` and binds it to the
/// exchange.
pub(crate) async fn declare_queue(
    link: &Link,
    channel: &Channel,
    amqp: &Amqp,
    queue: &HandlerQueue,
) -> Result<(), Fault> {
    let mut arguments = FieldTable::default();
    arguments.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("quorum".into()),
    );
    let declare = channel.queue_declare(
        ShortString::from(queue.name.as_str()),
        QueueDeclareOptions {
            durable: true,
            ..QueueDeclareOptions::default()
        },
        arguments,
    );
    link.call(format!("declaring the queue `{}`", queue.name), declare)
        .await?;
    let bind = channel.queue_bind(
        ShortString::from(queue.name.as_str()),
        ShortString::from(amqp.exchange().as_str()),
        ShortString::from(queue.topic),
        QueueBindOptions::default(),
        FieldTable::default(),
    );
    link.call(format!("binding the queue `{}`", queue.name), bind)
        .await
}

/// The messages waiting in a queue, read with a passive declare (which
/// changes nothing) on `link`'s `channel`.
pub(crate) async fn depth(link: &Link, channel: &Channel, queue: &str) -> Result<u32, Fault> {
    status(link, channel, queue)
        .await
        .map(|(messages, _)| messages)
}

/// The messages waiting in a queue and its consumers, read with a passive
/// declare on `link`'s `channel`.
pub(crate) async fn status(
    link: &Link,
    channel: &Channel,
    queue: &str,
) -> Result<(u32, u32), Fault> {
    let declare = channel.queue_declare(
        ShortString::from(queue),
        QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        },
        FieldTable::default(),
    );
    link.call(format!("reading the queue `{queue}`"), declare)
        .await
        .map(|declared| (declared.message_count(), declared.consumer_count()))
}

/// Declares everything once at bus start, so that a broker that is
/// unreachable or refuses stops the start with a clear error.
pub(crate) async fn declare_all(amqp: &Amqp, queues: &[HandlerQueue]) -> Result<(), Fault> {
    check_names(amqp, queues).map_err(Fault::Refused)?;
    on_channel(amqp, "tickbox topology", async |link, channel| {
        declare_exchange(link, channel, amqp).await?;
        for queue in queues {
            declare_queue(link, channel, amqp, queue).await?;
        }
        Ok(())
    })
    .await
}

/// Connects as `name`, opens a channel, runs `work` on it, and closes both.
/// Its calls' missed deadlines are logged, and counted only in the exported
/// counter (`role` `topology`): no bus runs yet to show them.
async fn on_channel<T>(
    amqp: &Amqp,
    name: &str,
    work: impl AsyncFnOnce(&Link, &Channel) -> Result<T, Fault>,
) -> Result<T, Fault> {
    let caller = Caller::new(name.to_string(), "topology", Arc::default());
    let link = Link::open(amqp, name, caller).await?;
    let channel = match link.channel().await {
        Ok(channel) => channel,
        Err(fault) => {
            link.give_up(None, &fault, "no channel").await;
            return Err(fault);
        }
    };
    let done = work(&link, &channel).await;
    match &done {
        Ok(_) => link.close(Some(channel), "done").await,
        Err(fault) => link.give_up(Some(channel), fault, "failed").await,
    }
    done
}

/// The work behind [`Amqp::queue_status`], which calls it for `amqp`.
pub(crate) async fn queue_status(amqp: &Amqp, module: &str, handler: &str) -> Result<QueueStatus> {
    amqp.validate()?;
    let queue = amqp.queue(module, handler);
    let url = amqp.redacted_url();
    let read = on_channel(amqp, "tickbox queue status", async |link, channel| {
        status(link, channel, &queue).await
    })
    .await;
    let (messages, consumers) = read.map_err(|fault| fault.into_error(url))?;
    Ok(QueueStatus {
        queue,
        messages,
        consumers,
    })
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
