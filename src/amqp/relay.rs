//! The relay: publishes outbox messages to the broker with publisher
//! confirms. A message counts as sent only once the broker has confirmed it
//! (and, being published `mandatory`, routed it to at least one queue); no
//! confirm in time, a nack, a closed channel or a lost connection leave it
//! pending in the outbox, and the bus publishes it again (the inbox absorbs
//! the duplicate).
//!
//! Publishes are pipelined: every message the dispatchers hand over is
//! published at once on the relay's one channel, without waiting for the
//! confirms of those before it, up to the window
//! ([`Amqp::publish_window`]); each then awaits its own confirm, which the
//! client resolves as the broker's (often `multiple`) acks come in. The
//! dispatchers mark the confirmed rows in batches. A key's messages still
//! come one at a time (the bus's key lanes hold the next until the one
//! before is confirmed), so a failure stops the key at the failed message.

use crate::amqp::fault::Fault;
use crate::amqp::link::{Caller, Link};
use crate::amqp::settings::Amqp;
use crate::amqp::{topology, wire};
use crate::error::Error;
use crate::message::Envelope;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::ShortString;
use lapin::{Channel, Confirmation};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, Semaphore};

/// Publishes the messages of a bus's outboxes.
pub(crate) struct Relay {
    /// Where and how.
    amqp: Amqp,
    /// The exchange every message goes to.
    exchange: ShortString,
    /// The connection and its confirm-mode channel, made on first use and
    /// again after a failure.
    slot: Mutex<Slot>,
    /// Room for publishes awaiting their confirm: `Amqp::publish_window`
    /// permits, each held from a message's publish to its confirm (or its
    /// failure). The relay publishes on one channel at a time, so this is
    /// the window of that channel.
    window: Semaphore,
    /// Publishes waiting for their confirm, per outbox (module).
    unconfirmed: HashMap<String, Unconfirmed>,
    /// The most publishes the window has held at once since the bus
    /// started: what shows that the window fills and holds.
    window_peak: AtomicUsize,
    /// Connections made again after one was lost.
    reconnects: AtomicU64,
    /// The relay as the maker of broker calls, named when one misses its
    /// deadline.
    caller: Arc<Caller>,
    /// Its calls that missed their deadline.
    timed_out: Arc<AtomicU64>,
}

/// The relay's connection, or when to try again.
#[derive(Default)]
struct Slot {
    /// The connection and its channel, while they work. Shared with the
    /// calls under way; the socket is shut when the last of them lets go.
    open: Option<(Arc<Link>, Channel)>,
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
    /// The broker refused this one message (a nack: a queue bound to the
    /// topic is at its length limit and rejects new messages, or the broker
    /// failed to store it). The channel stays open for the others.
    Nacked,
    /// The broker failed or refused.
    Fault(Fault),
}

impl Relay {
    /// A relay for the outboxes of `modules`; it connects on first use.
    pub(crate) fn new(amqp: Amqp, modules: &[String]) -> Self {
        let timed_out = Arc::new(AtomicU64::new(0));
        Relay {
            exchange: ShortString::from(amqp.exchange()),
            slot: Mutex::new(Slot {
                backoff: amqp.reconnect_min,
                ..Slot::default()
            }),
            window: Semaphore::new(amqp.publish_window),
            window_peak: AtomicUsize::new(0),
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
            caller: Caller::new("the relay".into(), "relay", timed_out.clone()),
            timed_out,
            amqp,
        }
    }

    /// The broker's URL without its password, for errors.
    pub(crate) fn redacted_url(&self) -> String {
        self.amqp.redacted_url()
    }

    /// Publishes one message of `module`'s outbox and waits for the broker's
    /// confirm, once there is room in the window. The room is taken before
    /// the channel, so a publish that waited goes out on the channel as it
    /// is then.
    pub(crate) async fn publish(&self, module: &str, envelope: &Envelope) -> Result<(), NotSent> {
        let Ok(_room) = self.window.acquire().await else {
            unreachable!("the window is never closed");
        };
        let held = self.amqp.publish_window - self.window.available_permits();
        self.window_peak.fetch_max(held, Relaxed);
        let (link, channel) = self.channel().await.map_err(NotSent::Fault)?;
        let unconfirmed = self.unconfirmed.get(module);
        unconfirmed.inspect(|n| n.add(1));
        let sent = self.confirm(module, &channel, envelope).await;
        unconfirmed.inspect(|n| n.add(-1));
        if let Err(NotSent::Fault(fault)) = &sent {
            if fault.is_lost() {
                self.forget(&link, fault).await;
            }
        }
        sent
    }

    /// Publishes and waits for the confirm, at most the confirm timeout:
    /// one timer per message, which the confirm needed anyway.
    async fn confirm(
        &self,
        module: &str,
        channel: &Channel,
        envelope: &Envelope,
    ) -> Result<(), NotSent> {
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
        #[cfg(feature = "opentelemetry")]
        let span = crate::trace::spans::send(
            self.exchange.as_str(),
            envelope.span_identity(),
            envelope.trace_context.as_ref(),
        );
        #[cfg(feature = "opentelemetry")]
        let published = tracing::Instrument::instrument(published, span.clone());
        let doing = Publishing {
            module,
            topic: &envelope.topic,
        };
        let sent = match self
            .caller
            .within(self.amqp.confirm_timeout, doing, published)
            .await
        {
            Err(fault) => Err(NotSent::Fault(fault)),
            Ok(Confirmation::Ack(None)) => Ok(()),
            Ok(Confirmation::Ack(Some(_))) => Err(NotSent::Unroutable),
            Ok(Confirmation::Nack(_)) => Err(NotSent::Nacked),
            Ok(Confirmation::NotRequested) => Err(NotSent::Fault(Fault::Refused(
                "the channel is not in confirm mode".into(),
            ))),
        };
        #[cfg(feature = "opentelemetry")]
        if let Err(not_sent) = &sent {
            let (error_type, reason) = match not_sent {
                NotSent::Unroutable => ("unroutable", "no queue is bound to the topic".into()),
                NotSent::Nacked => ("nacked", "the broker did not take it".into()),
                NotSent::Fault(
                    Fault::Unreachable(reason) | Fault::TimedOut(reason) | Fault::Refused(reason),
                ) => ("broker_fault", reason.clone()),
            };
            crate::trace::spans::failed(&span, error_type, &reason);
        }
        sent
    }

    /// The confirm-mode channel, connecting first if needed (no sooner than
    /// the backoff after a failed attempt).
    async fn channel(&self) -> Result<(Arc<Link>, Channel), Fault> {
        let mut slot = self.slot.lock().await;
        if let Some((link, channel)) = &slot.open {
            if channel.status().connected() {
                return Ok((link.clone(), channel.clone()));
            }
            // lapin has given the channel or its connection up (the broker
            // closed it, the heartbeat failed).
            if let Some((link, channel)) = slot.open.take() {
                tokio::spawn(async move { link.close(Some(channel), "reconnecting").await });
            }
        }
        if let Some(at) = slot.retry_at {
            if Instant::now() < at {
                return Err(Fault::Unreachable(
                    "waiting to connect to the broker again".into(),
                ));
            }
        }
        match self.connect().await {
            Ok((link, channel)) => {
                if slot.connected_before {
                    self.reconnects.fetch_add(1, Relaxed);
                    metrics::counter!("tickbox_amqp_reconnects_total", "role" => "relay")
                        .increment(1);
                    tracing::info!(broker = %self.redacted_url(), "the relay is connected to the broker again");
                }
                slot.connected_before = true;
                slot.retry_at = None;
                slot.backoff = self.amqp.reconnect_min;
                let link = Arc::new(link);
                slot.open = Some((link.clone(), channel.clone()));
                Ok((link, channel))
            }
            Err(fault) => {
                slot.retry_at = Some(Instant::now() + slot.backoff);
                slot.backoff = (slot.backoff * 2).min(self.amqp.reconnect_max);
                Err(fault)
            }
        }
    }

    /// A connection and a channel in confirm mode, the exchange declared.
    async fn connect(&self) -> Result<(Link, Channel), Fault> {
        let name = format!("tickbox relay {}", self.exchange);
        let link = Link::open(&self.amqp, &name, self.caller.clone()).await?;
        let ready = async {
            let channel = link.channel().await?;
            let confirms = channel.confirm_select(ConfirmSelectOptions::default());
            link.call("switching on publisher confirms", confirms)
                .await?;
            topology::declare_exchange(&link, &channel, &self.amqp).await?;
            Ok(channel)
        };
        match ready.await {
            Ok(channel) => Ok((link, channel)),
            Err(fault) => {
                link.give_up(None, &fault, "failed").await;
                Err(fault)
            }
        }
    }

    /// Gives the link up after `fault` if `failed` is still the relay's
    /// link (another publish may have replaced it already), so the next
    /// publish connects again.
    async fn forget(&self, failed: &Arc<Link>, fault: &Fault) {
        let mut slot = self.slot.lock().await;
        if slot
            .open
            .as_ref()
            .is_some_and(|(link, _)| Arc::ptr_eq(link, failed))
        {
            if let Some((link, channel)) = slot.open.take() {
                if let Fault::TimedOut(_) = fault {
                    // The broker does not answer: no goodbye.
                    link.shut();
                } else {
                    // Closing waits a little for the broker's answer: not
                    // with the slot held. The socket is shut whatever the
                    // answer.
                    tokio::spawn(async move { link.close(Some(channel), "reconnecting").await });
                }
            }
        }
    }

    /// Closes the relay's channel and connection, when the bus stops.
    pub(crate) async fn close(&self) {
        let open = self.slot.lock().await.open.take();
        if let Some((link, channel)) = open {
            link.close(Some(channel), "stopping").await;
        }
    }

    /// The messages waiting in `queue`, read from the broker now.
    pub(crate) async fn depth(&self, queue: &str) -> Result<u32, Fault> {
        let (link, channel) = self.channel().await?;
        let depth = topology::depth(&link, &channel, queue).await;
        if let Err(fault) = &depth {
            if fault.is_lost() {
                self.forget(&link, fault).await;
            }
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

    /// The most publishes that have awaited their confirm at once, and the
    /// window that bounds them.
    pub(crate) fn window(&self) -> (u64, u64) {
        (
            self.window_peak.load(Relaxed) as u64,
            self.amqp.publish_window as u64,
        )
    }

    /// Connections made again after one was lost.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Relaxed)
    }

    /// Its calls that got no answer from the broker in time.
    pub(crate) fn calls_timed_out(&self) -> u64 {
        self.timed_out.load(Relaxed)
    }
}

/// What a publish is doing, for a fault or the log: formatted only then.
struct Publishing<'a> {
    /// The outbox's module.
    module: &'a str,
    /// The message's topic.
    topic: &'a str,
}

impl fmt::Display for Publishing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "publishing a message of topic `{}` from the outbox of `{}`",
            self.topic, self.module
        )
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
            NotSent::Nacked => Error::BrokerUnreachable {
                url: relay.redacted_url(),
                reason: format!(
                    "the broker did not take a message of topic `{topic}` (nack): a queue bound \
                     to it may be at its length limit; the message stays in the outbox and is \
                     published again"
                ),
            },
            NotSent::Fault(fault) => fault.into_error(relay.redacted_url()),
        }
    }
}
