//! Setting up a bus over a set of started modules.

use crate::bus::actor::Bus;
use crate::bus::config::BusConfig;
use crate::bus::core::BusCore;
use crate::bus::dispatcher::Dispatcher;
use crate::bus::handle::BusHandle;
use crate::bus::route::{self, Route};
use crate::bus::transport::{Broker, HandlerId, HandlerInbound, Inbound, Pacing};
use crate::delivery::registry::HandlerIndex;
use crate::error::{Error, Result};
use crate::module::handle::ModuleHandle;
use crate::outbox::subscription;
use crate::retry::RetryPolicy;
use crate::store::backend::Backend;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Sets up a bus over a set of started modules.
///
/// ```no_run
/// # use tickbox::{Bus, ModuleHandle, Sqlite};
/// # async fn run(orders: ModuleHandle<Sqlite>, warehouse: ModuleHandle<Sqlite>) -> tickbox::Result<()> {
/// let bus = Bus::builder()
///     .module(&orders)
///     .module(&warehouse)
///     .max_concurrent_deliveries(64)
///     .start()
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `start` is called"]
pub struct BusBuilder<B: Backend> {
    modules: Vec<ModuleHandle<B>>,
    config: BusConfig,
}

impl<B: Backend> Default for BusBuilder<B> {
    fn default() -> Self {
        BusBuilder {
            modules: Vec::new(),
            config: BusConfig::default(),
        }
    }
}

impl<B: Backend> BusBuilder<B> {
    /// Adds a module: the bus delivers its outbox and routes messages to its
    /// handlers.
    pub fn module(mut self, module: &ModuleHandle<B>) -> Self {
        self.modules.push(module.clone());
        self
    }

    /// Handler attempts running at once over all modules (default 64). A
    /// slow handler holds one slot; the others keep flowing. First attempts
    /// to a batched handler ([`HandlerOptions::batch`](crate::HandlerOptions::batch))
    /// take no slot: they wait in the handler's queue, and its module runs
    /// at most as many batch transactions at once as half its pool (one on
    /// SQLite). Retries take a slot. Over a broker, publishing takes none:
    /// the relay's window of unconfirmed publishes bounds it
    /// (`Amqp::publish_window`, feature `amqp`).
    pub fn max_concurrent_deliveries(mut self, n: usize) -> Self {
        self.config.max_concurrent_deliveries = n;
        self
    }

    /// Messages per outbox held in memory at once, in delivery or waiting for
    /// a retry (default 2048). Bounds memory however large the backlog; the
    /// rest waits in the outbox table.
    pub fn max_messages_in_memory(mut self, n: usize) -> Self {
        self.config.max_messages_in_memory = n;
        self
    }

    /// How often the outbox tables are scanned for committed messages that
    /// nothing announced (default 2 s). At start the bus always scans once,
    /// which finishes the work of a crashed process.
    ///
    /// Commits of a module on this bus are announced in memory. On
    /// PostgreSQL, commits made where no bus delivers the module's outbox (in
    /// another process, or through a module on no bus) wake the bus through
    /// LISTEN/NOTIFY, so they do not wait for this scan either; the scan then
    /// only catches what a crash left behind or a notification lost while
    /// the listener reconnected. On SQLite, which has no notifications,
    /// another process's commits wait for this scan.
    pub fn scan_interval(mut self, interval: Duration) -> Self {
        self.config.scan_interval = interval;
        self
    }

    /// How long a delivered message waits to be marked delivered together
    /// with the messages delivered after it (default 10 ms; at most 512
    /// go in one mark, and a full batch goes at once). Nothing waits on
    /// the mark but the outbox's pending count and lag. Longer: fewer
    /// statements on a busy outbox, and more messages delivered again
    /// after a crash (the inbox skips them). Zero marks each message as
    /// soon as it is delivered. Must be shorter than
    /// [`stalled_after`](Self::stalled_after).
    pub fn mark_linger(mut self, linger: Duration) -> Self {
        self.config.mark_linger = linger;
        self
    }

    /// The backoff between attempts of a failing delivery.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.config.retry = policy;
        self
    }

    /// For demonstrations and tests: deliver each message a second time with
    /// this probability, to watch the inbox skip the duplicates (default 0).
    /// A test hook: it exists only with the `testing` feature, so no
    /// production build can turn it on.
    #[cfg(feature = "testing")]
    pub fn duplicate_rate(mut self, probability: f64) -> Self {
        self.config.duplicate_rate = probability;
        self
    }

    /// How long [`BusHandle::stop`] may take (default 30 s), even when
    /// every connection to the databases and the broker is dead: running
    /// deliveries may finish within its first three quarters, and the last
    /// quarter is left for marking what finished and giving up this bus's
    /// claims. A delivery still running then is not committed by this bus
    /// and is delivered again later (by the next start, or another process
    /// once the claim's lease runs out).
    pub fn stop_timeout(mut self, timeout: Duration) -> Self {
        self.config.stop_timeout = timeout;
        self
    }

    /// How long this bus's claim on an outbox row keeps other processes'
    /// buses from delivering it too (default 10 s). The claim is renewed
    /// while the delivery runs, so only the claims of a process that died
    /// expire; its messages are taken over after at most this long.
    pub fn claim_lease(mut self, lease: Duration) -> Self {
        self.config.claim_lease = lease;
        self
    }

    /// A stable name for this process's bus, the same across its restarts
    /// (e.g. `"orders-worker-1"`, or a pod's name in a StatefulSet). A bus's
    /// claims on outbox rows keep other processes away until their lease
    /// ([`BusBuilder::claim_lease`]) expires; with an instance name, a
    /// restarted process knows the claims its predecessor left as its own
    /// and takes them back at once instead of waiting out the lease.
    ///
    /// Two processes running at the same time must not share a name: each
    /// would take the other's claims, and messages would be delivered by
    /// both (the inbox still keeps every effect single, but the work is
    /// done twice). Without a name, each start is a new bus.
    pub fn instance(mut self, name: impl Into<String>) -> Self {
        self.config.instance = Some(name.into());
        self
    }

    /// How long a message may stay pending before the watchdog reports it
    /// (default 60 s): every scan interval the bus counts its outboxes'
    /// messages pending for longer (`tickbox_outbox_stalled`) and logs the
    /// oldest at warn level, with its id and what holds it up (a failing
    /// handler, another process's claim, a subscription no running process
    /// serves).
    pub fn stalled_after(mut self, threshold: Duration) -> Self {
        self.config.stalled_after = threshold;
        self
    }

    /// Sends the messages through a RabbitMQ broker instead of handing them
    /// to handlers in this process: the bus publishes every committed outbox
    /// message of its modules to the broker with publisher confirms (marking
    /// it delivered once confirmed), and each handler of its modules consumes
    /// its own durable quorum queue there, acknowledging a message after its
    /// transaction commits. Services then need to share nothing but the
    /// broker: each keeps its own database. What tickbox declares, and its
    /// names, are on [`Amqp`](crate::Amqp). The same as
    /// [`broker`](Self::broker), named for the broker tickbox ships with.
    ///
    /// [`BusBuilder::start`] connects and declares the topology first; it
    /// fails with [`Error::BrokerUnreachable`] (worth retrying: the broker is
    /// down or restarting) or [`Error::BrokerRefused`] (fix the credentials,
    /// the virtual host, or a queue declared elsewhere with other settings).
    /// Later losses of the broker pause delivery and resume by themselves.
    ///
    /// Every process publishing a topic must run over the same broker and
    /// namespace: a process delivering the same outbox in this process
    /// instead would leave the broker's subscribers without those messages.
    pub fn amqp(self, amqp: impl Into<Broker>) -> Self {
        self.broker(amqp)
    }

    /// Sends the messages through a message broker instead of handing them
    /// to handlers in this process; see [`amqp`](Self::amqp) for what that
    /// means and which errors starting then returns. `broker` is made from
    /// the broker's settings: with the `amqp` feature,
    /// [`Amqp`](crate::Amqp).
    pub fn broker(mut self, broker: impl Into<Broker>) -> Self {
        self.config.broker = Some(broker.into());
        self
    }

    /// Checks the configuration, records in each outbox's database which of
    /// its topics this bus's handlers subscribe to, and starts the bus
    /// actor, which begins with a scan of every outbox.
    ///
    /// Fails, with nothing started, when the configuration is invalid or a
    /// running process records one of this bus's handlers on another topic
    /// ([`Error::SubscriptionConflict`]).
    pub async fn start(self) -> Result<BusHandle<B>> {
        let config = self.config;
        let positive = |value: usize, what: &str| {
            if value == 0 {
                Err(Error::Config(format!("bus: {what} must be at least 1")))
            } else {
                Ok(())
            }
        };
        positive(
            config.max_concurrent_deliveries,
            "max_concurrent_deliveries",
        )?;
        positive(config.max_messages_in_memory, "max_messages_in_memory")?;
        if config.scan_interval.is_zero() {
            return Err(Error::Config(
                "bus: scan_interval must be above zero".into(),
            ));
        }
        if config.stalled_after.is_zero() {
            return Err(Error::Config(
                "bus: stalled_after must be above zero".into(),
            ));
        }
        if config.mark_linger >= config.stalled_after {
            return Err(Error::Config(format!(
                "bus: mark_linger ({:?}) must be shorter than stalled_after ({:?}): \
                 every delivered message would be reported stalled while it waits for its mark",
                config.mark_linger, config.stalled_after
            )));
        }
        if config.claim_lease < Duration::from_millis(300) {
            return Err(Error::Config(
                "bus: claim_lease must be at least 300 ms".into(),
            ));
        }
        #[cfg(feature = "testing")]
        if !(0.0..=1.0).contains(&config.duplicate_rate) {
            return Err(Error::Config(format!(
                "bus: duplicate_rate must be a probability between 0 and 1, not {}",
                config.duplicate_rate
            )));
        }
        config.retry.validate()?;
        if config
            .instance
            .as_deref()
            .is_some_and(|name| name.trim().is_empty())
        {
            return Err(Error::Config(
                "bus: instance must be a non-empty name".into(),
            ));
        }
        if self.modules.is_empty() {
            return Err(Error::Config("bus: add at least one module".into()));
        }

        let mut names = HashSet::new();
        for module in &self.modules {
            if !names.insert(module.name()) {
                return Err(Error::DuplicateModule(module.name().to_string()));
            }
        }
        let published: HashSet<&'static str> = self
            .modules
            .iter()
            .flat_map(|m| m.outbox().publishes.iter().copied())
            .collect();
        // A redelivery can come as late as the last retry, plus a lease to
        // expire and a scan to find the message.
        let slack = config.claim_lease + config.scan_interval;
        let over_broker = config.over_broker();
        let mut handlers: Vec<(ModuleHandle<B>, HandlerIndex)> = Vec::new();
        for module in &self.modules {
            for (index, entry) in module.handlers().indexed() {
                let policy = entry.retry.as_ref().unwrap_or(&config.retry);
                module
                    .retention()
                    .check(module.name(), &entry.name, policy, slack)?;
                let topic = entry.handler.topic();
                // Over a broker the topic may come from another service.
                if !over_broker && !published.contains(topic) {
                    return Err(Error::UnsubscribableTopic {
                        module: module.name().to_string(),
                        handler: entry.name.to_string(),
                        topic: topic.to_string(),
                    });
                }
                handlers.push((module.clone(), index));
            }
        }
        let ids: Vec<HandlerId> = handlers
            .iter()
            .map(|(module, index)| {
                let entry = module.handlers().get(*index);
                HandlerId {
                    module: module.shared_name(),
                    handler: entry.name.clone(),
                    topic: entry.handler.topic(),
                }
            })
            .collect();
        let transport = match &config.broker {
            Some(broker) => {
                let outboxes: Vec<Arc<str>> =
                    self.modules.iter().map(|m| m.shared_name()).collect();
                Some(broker.connect(&outboxes, &ids).await?)
            }
            None => None,
        };
        let routes = route::routes(transport.as_ref(), &published, &handlers);
        // The subscriptions of each outbox that this bus serves, recorded
        // where every process sees them.
        let now = crate::message::now_us();
        let alive_until =
            now.saturating_add(config.scan_interval.saturating_mul(3).as_micros() as i64);
        let mut served_by_module = Vec::new();
        for module in &self.modules {
            let served = route::served(transport.as_ref(), module, &handlers);
            let others = subscription::record(module.db(), &served, now, alive_until, true).await?;
            served_by_module.push((served, others));
        }
        let id = bus_id(config.instance.as_deref());
        for module in &self.modules {
            subscription::report_claimed_elsewhere(module.db(), id, now).await?;
        }
        let mut announcements = Vec::new();
        for module in &self.modules {
            match module.outbox().take_announcements() {
                Ok(taken) => announcements.push(taken),
                Err(error) => {
                    // Not started: the modules taken so far stay free.
                    for (module, taken) in self.modules.iter().zip(announcements) {
                        module.outbox().give_back_announcements(taken);
                    }
                    return Err(error);
                }
            }
        }
        let known_topics = published.iter().map(|t| t.to_string()).collect();
        let core = Arc::new(BusCore::new(
            id,
            known_topics,
            routes,
            config,
            transport.clone(),
        ));
        for module in &self.modules {
            // A module is on one bus at a time (take_announcements made
            // sure).
            module
                .outbox()
                .set_claimant(core.id, Some(core.config.claim_lease));
        }
        let dispatchers = self
            .modules
            .iter()
            .cloned()
            .zip(announcements)
            .zip(served_by_module)
            .map(|((module, announcements), (served, others))| {
                Dispatcher::new(core.clone(), module, announcements, served, others)
            })
            .collect();
        // Over a broker, each handler's consumer hands it its messages.
        let consumers = match &transport {
            Some(transport) => {
                let inbound = handlers
                    .iter()
                    .zip(ids)
                    .map(|((module, index), id)| {
                        Arc::new(HandlerInbound {
                            bus: core.clone(),
                            module: module.clone(),
                            route: Route::Handler {
                                module: module.clone(),
                                handler: *index,
                            },
                            id,
                        }) as Arc<dyn Inbound>
                    })
                    .collect();
                let pacing = Pacing {
                    sample_every: core.config.scan_interval,
                    drain_within: core.config.stop_timeout,
                };
                transport.consume(inbound, core.stop.child_token(), pacing)
            }
            None => Vec::new(),
        };
        let addr = Bus::start_with(core.clone(), dispatchers, consumers);
        Ok(BusHandle::new(core, self.modules, addr))
    }
}

/// The namespace of the ids of named buses (UUIDv5).
const INSTANCE_NAMESPACE: uuid::Uuid =
    uuid::Uuid::from_u128(0x7469_636b_626f_7800_8000_0000_0000_0002);

/// A bus's id: derived from its instance name, so that it stays the same
/// across restarts, or new on every start.
fn bus_id(instance: Option<&str>) -> uuid::Uuid {
    match instance {
        Some(name) => uuid::Uuid::new_v5(&INSTANCE_NAMESPACE, name.as_bytes()),
        None => uuid::Uuid::now_v7(),
    }
}
