//! A handler's consumer: takes messages from the handler's queue (at most
//! the prefetch at once), runs each through the inbox guard with the
//! handler's retry policy, and acknowledges it only after its transaction
//! committed — or after it was recorded as a duplicate or a dead letter.
//! A lost connection is made again with backoff; what was not acknowledged
//! comes again, and the inbox absorbs it.

use crate::amqp::acks::{Ack, Acks};
use crate::amqp::fault::Fault;
use crate::amqp::link::{Caller, Link};
use crate::amqp::settings::Amqp;
use crate::amqp::state::ConsumerStats;
use crate::amqp::topology::{self, HandlerQueue};
use crate::amqp::wire;
use crate::bus::transport::{Inbound, Pacing};
use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicQosOptions};
use lapin::types::{FieldTable, ShortString};
use lapin::Channel;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use tokio::task::JoinSet;
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

/// Consumes `queue`, handing each message to `inbound` (one handler of the
/// bus), until `stop` is cancelled, connecting again with backoff whenever
/// the broker is lost.
pub(crate) async fn run(
    amqp: Amqp,
    inbound: Arc<dyn Inbound>,
    queue: HandlerQueue,
    stats: Arc<ConsumerStats>,
    stop: CancellationToken,
    pacing: Pacing,
) {
    let caller = Caller::new(
        format!("the consumer of {}/{}", stats.module, stats.handler),
        "consumer",
        stats.timed_out.clone(),
    );
    let consumer = Consumer {
        caller,
        stats,
        inbound,
        stop,
        pacing,
        amqp,
        queue,
    };
    let mut backoff = consumer.amqp.reconnect_min;
    let mut connected_before = false;
    while !consumer.stop.is_cancelled() {
        match consumer.consume(&mut connected_before, &mut backoff).await {
            Ok(()) => break,
            Err(fault) => {
                // A missed deadline was told where it happened.
                let told = matches!(fault, Fault::TimedOut(_));
                let error = fault.into_error(consumer.amqp.redacted_url());
                if told {
                    tracing::debug!(queue = %consumer.queue.name, %error, retry_in = ?backoff, "consuming stopped; connecting again");
                } else {
                    tracing::warn!(queue = %consumer.queue.name, %error, retry_in = ?backoff, "consuming stopped; connecting again");
                }
            }
        }
        if consumer
            .stop
            .run_until_cancelled(sleep(backoff))
            .await
            .is_none()
        {
            break;
        }
        backoff = (backoff * 2).min(consumer.amqp.reconnect_max);
    }
    tracing::debug!(queue = %consumer.queue.name, "consumer stopped");
}

/// One handler's consumer.
struct Consumer {
    /// Where the broker is.
    amqp: Amqp,
    /// The handler, as the bus takes its messages.
    inbound: Arc<dyn Inbound>,
    /// Cancelled when the bus stops.
    stop: CancellationToken,
    /// How often the queue's depth is read, and how long stopping waits.
    pacing: Pacing,
    /// The handler's queue.
    queue: HandlerQueue,
    /// Its figures, for the bus's snapshot.
    stats: Arc<ConsumerStats>,
    /// The consumer as the maker of broker calls, named when one misses its
    /// deadline.
    caller: Arc<Caller>,
}

impl Consumer {
    /// Connects, declares the queue, and consumes until the bus stops
    /// (`Ok`) or the broker is lost. The connection is closed either way,
    /// and its socket released.
    async fn consume(
        &self,
        connected_before: &mut bool,
        backoff: &mut std::time::Duration,
    ) -> Result<(), Fault> {
        let name = format!("tickbox {}", self.queue.name);
        let link = Link::open(&self.amqp, &name, self.caller.clone()).await?;
        let channel = match link.channel().await {
            Ok(channel) => channel,
            Err(fault) => {
                link.give_up(None, &fault, "failed").await;
                return Err(fault);
            }
        };
        let ended = match self.subscribe(&link, &channel).await {
            Ok(deliveries) => {
                if *connected_before {
                    self.stats.reconnects.fetch_add(1, Relaxed);
                    metrics::counter!("tickbox_amqp_reconnects_total", "role" => "consumer")
                        .increment(1);
                    tracing::info!(queue = %self.queue.name, "consuming again");
                }
                *connected_before = true;
                *backoff = self.amqp.reconnect_min;
                self.take(&link, &channel, deliveries).await
            }
            Err(fault) => Err(fault),
        };
        match &ended {
            Ok(()) => link.close(Some(channel), "stopping").await,
            Err(fault) => link.give_up(Some(channel), fault, "reconnecting").await,
        }
        ended
    }

    /// Sets the prefetch, declares the exchange and the queue, and starts
    /// consuming.
    async fn subscribe(&self, link: &Link, channel: &Channel) -> Result<lapin::Consumer, Fault> {
        let qos = channel.basic_qos(self.amqp.prefetch, BasicQosOptions::default());
        link.call("setting the prefetch", qos).await?;
        topology::declare_exchange(link, channel, &self.amqp).await?;
        topology::declare_queue(link, channel, &self.amqp, &self.queue).await?;
        let consume = channel.basic_consume(
            ShortString::from(self.queue.name.as_str()),
            ShortString::from(""),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        );
        link.call(format!("consuming `{}`", self.queue.name), consume)
            .await
    }

    /// Takes deliveries and runs them through the handler until the bus
    /// stops (`Ok`) or the broker is lost. Every call to the broker in here
    /// runs within the call timeout: the acknowledgements of one flush
    /// under one timer, the queue's depth every scan interval (which also
    /// notices a silent broker while no message comes).
    async fn take(
        &self,
        link: &Link,
        channel: &Channel,
        mut deliveries: lapin::Consumer,
    ) -> Result<(), Fault> {
        let labels = [
            ("module", self.stats.module.clone()),
            ("handler", self.stats.handler.clone()),
        ];
        let in_flight = metrics::gauge!("tickbox_amqp_in_flight", &labels);
        let depth = metrics::gauge!("tickbox_amqp_queue_depth", &labels);
        let mut running: JoinSet<(u64, bool)> = JoinSet::new();
        let mut acks = Acks::default();
        let mut next_depth = Instant::now();
        let ended = loop {
            let ack_due = acks.due();
            tokio::select! {
                () = self.stop.cancelled() => break Ok(()),
                Some(joined) = running.join_next(), if !running.is_empty() => {
                    if let Ok((tag, ack)) = joined {
                        acks.finished(tag, ack, Instant::now());
                    }
                    self.count_in_flight(&running, &in_flight);
                }
                _ = tokio::time::sleep_until(ack_due.unwrap_or_else(Instant::now)), if ack_due.is_some() => {
                    let flush = send(channel, acks.flush(Instant::now(), false));
                    if let Err(fault) = link.call("acknowledging", flush).await {
                        break Err(fault);
                    }
                }
                _ = tokio::time::sleep_until(next_depth) => {
                    next_depth = Instant::now() + self.pacing.sample_every;
                    match topology::depth(link, channel, &self.queue.name).await {
                        Ok(n) => {
                            depth.set(f64::from(n));
                            self.stats.depth.store(u64::from(n), Relaxed);
                        }
                        Err(fault) => break Err(fault),
                    }
                }
                next = deliveries.next() => match next {
                    Some(Ok(delivery)) => {
                        acks.taken(delivery.delivery_tag);
                        running.spawn(handle(self.inbound.clone(), delivery));
                        self.count_in_flight(&running, &in_flight);
                    }
                    Some(Err(error)) => break Err(Fault::of("receiving", &error)),
                    None => break Err(Fault::Unreachable("the broker closed the consumer".into())),
                },
            }
        };
        if ended.is_ok() {
            // Stopping: take no more, let the running deliveries finish
            // (within the stop timeout) and acknowledge them; what is left
            // goes back to the queue when the connection closes.
            let cancel = channel.basic_cancel(deliveries.tag(), BasicCancelOptions::default());
            let _ = link.call("cancelling the consumer", cancel).await;
            let _ = tokio::time::timeout(self.pacing.drain_within, async {
                while let Some(joined) = running.join_next().await {
                    if let Ok((tag, ack)) = joined {
                        acks.finished(tag, ack, Instant::now());
                    }
                }
            })
            .await;
            let flush = send(channel, acks.flush(Instant::now(), true));
            let _ = link.call("acknowledging", flush).await;
        } else {
            // The channel is gone: running deliveries finish by themselves
            // (their acknowledgements fail, and the messages come again).
            running.detach_all();
        }
        in_flight.set(0.0);
        self.stats.in_flight.store(0, Relaxed);
        ended
    }

    /// Records how many messages are in delivery.
    fn count_in_flight(&self, running: &JoinSet<(u64, bool)>, gauge: &metrics::Gauge) {
        gauge.set(running.len() as f64);
        self.stats.in_flight.store(running.len(), Relaxed);
    }
}

/// Sends `acks` on the channel the deliveries came on.
async fn send(channel: &Channel, acks: Vec<Ack>) -> lapin::Result<()> {
    for Ack { tag, multiple } in acks {
        channel.basic_ack(tag, BasicAckOptions { multiple }).await?;
    }
    Ok(())
}

/// Runs one message from the queue through the handler; its delivery tag,
/// and whether it is to be acknowledged: handled, skipped as a duplicate,
/// or recorded as a dead letter. Not if the bus stops first: the broker
/// gives it again.
async fn handle(inbound: Arc<dyn Inbound>, delivery: Delivery) -> (u64, bool) {
    let done = match wire::envelope(&delivery) {
        Ok(envelope) => inbound.deliver(envelope).await,
        Err(undecodable) => {
            let reason = format!("undecodable AMQP message: {}", undecodable.reason);
            inbound.refuse(undecodable.envelope, reason).await
        }
    };
    (delivery.delivery_tag, done)
}
