//! The relay: publishes outbox messages to the broker with publisher
//! confirms. A message counts as sent only once the broker has confirmed it
//! (and, being published `mandatory`, routed it to at least one queue); no
//! confirm in time, a nack, a closed channel or a lost connection leave it
//! pending in the outbox, and the bus publishes it again (the inbox absorbs
//! the duplicate).

use crate::amqp::fault::Fault;
use crate::amqp::settings::Amqp;
use crate::amqp::{topology, wire};
use crate::error::Error;
use crate::message::Envelope;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{Channel, Confirmation, Connection};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Publishes the messages of a bus's outboxes.
pub(crate) struct Relay {
    /// Where and how.
    amqp: Amqp,
    /// The exchange every message goes to.
    exchange: ShortString,
    /// The connection and its confirm-mode channel, made on first use and
    /// again after a failure.
    link: Mutex<Link>,
    /// Publishes waiting for their confirm, per outbox (module).
    unconfirmed: HashMap<String, Unconfirmed>,
    /// Connections made again after one was lost.
    reconnects: AtomicU64,
}

/// The relay's connection, or when to try again.
#[derive(Default)]
struct Link {
    /// The connection and its channel, while they work.
    open: Option<(Connection, Channel)>,
    /// Connected at least once (a later connection is a reconnect).
    connected_before: bool,
    /// The last connection attempt failed: no new one before then.
    retry_at: Option<Instant>,
    /// The wait after the next failure.
    backoff: Duration,
}

/// One outbox's publishes waiting for their confirm: counted for the bus's
/// snapshot and exported, both set up once, off the publishing path.
struct Unconfirmed {
    /// The count.
    count: AtomicI64,
    /// `tickbox_amqp_unconfirmed{module}`.
    gauge: metrics::Gauge,
}

impl Unconfirmed {
    /// Adds `delta` to the count and exports it.
    fn add(&self, delta: i64) {
        let count = self.count.fetch_add(delta, Relaxed) + delta;
        self.gauge.set(count as f64);
    }
}

/// Why a message was not sent.
#[derive(Debug)]
pub(crate) enum NotSent {
    /// No queue is bound to its topic: no subscriber has declared one yet.
    Unroutable,
    /// The broker failed or refused.
    Fault(Fault),
}

impl Relay {
    /// A relay for the outboxes of `modules`; it connects on first use.
    pub(crate) fn new(amqp: Amqp, modules: &[String]) -> Self {
        Relay {
            exchange: ShortString::from(amqp.exchange()),
            link: Mutex::new(Link {
                backoff: amqp.reconnect_min,
                ..Link::default()
            }),
            unconfirmed: modules
                .iter()
                .map(|module| {
                    let unconfirmed = Unconfirmed {
                        count: AtomicI64::new(0),
                        gauge: metrics::gauge!("tickbox_amqp_unconfirmed", "module" => module.clone()),
                    };
                    (module.clone(), unconfirmed)
                })
                .collect(),
            reconnects: AtomicU64::new(0),
            amqp,
        }
    }

    /// The broker's URL without its password, for errors.
    pub(crate) fn redacted_url(&self) -> String {
        self.amqp.redacted_url()
    }

    /// Publishes one message of `module`'s outbox and waits for the broker's
    /// confirm.
    pub(crate) async fn publish(&self, module: &str, envelope: &Envelope) -> Result<(), NotSent> {
        let channel = self.channel().await.map_err(NotSent::Fault)?;
        let unconfirmed = self.unconfirmed.get(module);
        unconfirmed.inspect(|n| n.add(1));
        let sent = self.confirm(&channel, envelope).await;
        unconfirmed.inspect(|n| n.add(-1));
        if let Err(NotSent::Fault(Fault::Unreachable(_))) = &sent {
            self.forget(&channel).await;
        }
        sent
    }

    /// Publishes and waits for the confirm, at most the confirm timeout.
    async fn confirm(&self, channel: &Channel, envelope: &Envelope) -> Result<(), NotSent> {
        let published = async {
            channel
                .basic_publish(
                    self.exchange.clone(),
                    ShortString::from(envelope.topic.as_str()),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    envelope.payload.as_bytes(),
                    wire::properties(envelope),
                )
                .await?
                .await
        };
        match tokio::time::timeout(self.amqp.confirm_timeout, published).await {
            Err(_) => Err(NotSent::Fault(Fault::Unreachable(format!(
                "no publisher confirm within {:?}",
                self.amqp.confirm_timeout
            )))),
            Ok(Err(error)) => Err(NotSent::Fault(Fault::of("publishing", &error))),
            Ok(Ok(Confirmation::Ack(None))) => Ok(()),
            Ok(Ok(Confirmation::Ack(Some(_)))) => Err(NotSent::Unroutable),
            Ok(Ok(Confirmation::Nack(_))) => Err(NotSent::Fault(Fault::Unreachable(
                "the broker did not take the message (nack)".into(),
            ))),
            Ok(Ok(Confirmation::NotRequested)) => Err(NotSent::Fault(Fault::Refused(
                "the channel is not in confirm mode".into(),
            ))),
        }
    }

    /// The confirm-mode channel, connecting first if needed (no sooner than
    /// the backoff after a failed attempt).
    async fn channel(&self) -> Result<Channel, Fault> {
        let mut link = self.link.lock().await;
        if let Some((_, channel)) = &link.open {
            if channel.status().connected() {
                return Ok(channel.clone());
            }
            link.open = None;
        }
        if let Some(at) = link.retry_at {
            if Instant::now() < at {
                return Err(Fault::Unreachable(
                    "waiting to connect to the broker again".into(),
                ));
            }
        }
        match self.connect().await {
            Ok((connection, channel)) => {
                if link.connected_before {
                    self.reconnects.fetch_add(1, Relaxed);
                    metrics::counter!("tickbox_amqp_reconnects_total", "role" => "relay")
                        .increment(1);
                    tracing::info!(broker = %self.redacted_url(), "the relay is connected to the broker again");
                }
                link.connected_before = true;
                link.retry_at = None;
                link.backoff = self.amqp.reconnect_min;
                link.open = Some((connection, channel.clone()));
                Ok(channel)
            }
            Err(fault) => {
                link.retry_at = Some(Instant::now() + link.backoff);
                link.backoff = (link.backoff * 2).min(self.amqp.reconnect_max);
                Err(fault)
            }
        }
    }

    /// A connection and a channel in confirm mode, the exchange declared.
    async fn connect(&self) -> Result<(Connection, Channel), Fault> {
        let name = format!("tickbox relay {}", self.exchange);
        let connection = topology::connect(&self.amqp, &name).await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|e| Fault::of("opening a channel", &e))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| Fault::of("switching on publisher confirms", &e))?;
        topology::declare_exchange(&channel, &self.amqp).await?;
        Ok((connection, channel))
    }

    /// Drops the link if `failed` is its channel, so the next publish
    /// connects again.
    async fn forget(&self, failed: &Channel) {
        let mut link = self.link.lock().await;
        if link
            .open
            .as_ref()
            .is_some_and(|(_, channel)| channel.id() == failed.id())
        {
            if let Some((connection, channel)) = link.open.take() {
                // A broker that blocks publishers reads nothing more from
                // the connection, not even its close: do not wait for it.
                tokio::spawn(topology::close(connection, Some(channel), "reconnecting"));
            }
        }
    }

    /// Closes the relay's channel and connection, when the bus stops.
    pub(crate) async fn close(&self) {
        let open = self.link.lock().await.open.take();
        if let Some((connection, channel)) = open {
            topology::close(connection, Some(channel), "stopping").await;
        }
    }

    /// The messages waiting in `queue`, read from the broker now.
    pub(crate) async fn depth(&self, queue: &str) -> Result<u32, Fault> {
        let channel = self.channel().await?;
        let depth = topology::depth(&channel, queue).await;
        if depth.is_err() {
            self.forget(&channel).await;
        }
        depth
    }

    /// Publishes waiting for their confirm, per module.
    pub(crate) fn unconfirmed(&self) -> Vec<(String, i64)> {
        self.unconfirmed
            .iter()
            .map(|(module, n)| (module.clone(), n.count.load(Relaxed)))
            .collect()
    }

    /// Connections made again after one was lost.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Relaxed)
    }
}

impl NotSent {
    /// The error to report, naming the broker.
    pub(crate) fn into_error(self, relay: &Relay, topic: &str) -> Error {
        match self {
            NotSent::Unroutable => Error::BrokerUnreachable {
                url: relay.redacted_url(),
                reason: format!(
                    "no queue is bound to topic `{topic}` on exchange `{}` yet: the message \
                     stays in the outbox until a subscriber's service has declared its queue",
                    relay.exchange
                ),
            },
            NotSent::Fault(fault) => fault.into_error(relay.redacted_url()),
        }
    }
}
