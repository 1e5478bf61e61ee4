//! What a bus needs to reach a RabbitMQ broker, and how long it waits for
//! it.
//!
//! | setting | default | why |
//! | --- | --- | --- |
//! | [`prefetch`](Amqp::prefetch) | 32 | enough to keep a handler busy without one consumer hoarding a queue |
//! | [`publish_window`](Amqp::publish_window) | 256 | RabbitMQ measured its gain from 20 to 200 publishes awaiting their confirm and none past 1,000; the relay's own measurements are in BENCHMARKS.md, "The relay, pipelined" |
//! | [`confirm_timeout`](Amqp::confirm_timeout) | 10 s | a broker that has not confirmed by then is blocked or gone; the message stays in the outbox |
//! | [`heartbeat`](Amqp::heartbeat) | 10 s | inside RabbitMQ's recommended 5–20 s: a silent connection is given up after about two intervals (20 s) instead of the 2 minutes of the broker's 60 s |
//! | [`call_deadline`](Amqp::call_deadline) | 10 s | RabbitMQ gives a client 10 s for its handshake (`handshake_timeout`); no other call of tickbox's needs longer |
//! | [`reconnect_backoff`](Amqp::reconnect_backoff) | 100 ms doubling to 5 s | a quick first retry after a blip, at most one attempt per 5 s against a broker that stays away |

use crate::amqp::topology::{self, QueueStatus};
use crate::error::{Error, Result};
use crate::redact::SecretUrl;
use lapin::uri::AMQPUri;
use std::str::FromStr;
use std::time::Duration;

/// The heartbeat when neither [`Amqp::heartbeat`] nor the URL sets one.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

/// The most publishes awaiting their confirm a bus accepts: RabbitMQ finds
/// nothing gained past 1,000, and each one holds its message in memory.
const LARGEST_PUBLISH_WINDOW: usize = 10_000;

/// The longest heartbeat, call deadline or confirm wait a bus accepts: past
/// that, a dead connection would go unnoticed for most of an hour.
const LONGEST_WAIT: Duration = Duration::from_secs(600);

/// The RabbitMQ transport of a bus ([`BusBuilder::amqp`](crate::BusBuilder::amqp)):
/// the broker's URL and the names tickbox declares there.
///
/// ```
/// use tickbox::Amqp;
///
/// let amqp = Amqp::new("amqp://guest:guest@127.0.0.1:5672/%2f")
///     .namespace("minishop")
///     .prefetch(64);
/// assert_eq!(amqp.exchange(), "tickbox.minishop");
/// ```
#[derive(Clone)]
pub struct Amqp {
    /// The broker's URL, secrets included; it shows itself redacted.
    pub(crate) url: SecretUrl,
    /// Prefixes every name tickbox declares, so that several applications
    /// (or test runs) share a broker without sharing queues.
    pub(crate) namespace: String,
    /// Unacknowledged messages a handler's consumer holds at once.
    pub(crate) prefetch: u16,
    /// Publishes the relay has sent on its channel and whose confirm has
    /// not come yet, at most: the pipeline's depth.
    pub(crate) publish_window: usize,
    /// How long a publish waits for the broker's confirm before it counts as
    /// not sent.
    pub(crate) confirm_timeout: Duration,
    /// The heartbeat asked for in [`Amqp::heartbeat`]; `None` leaves it to
    /// the URL's `heartbeat` parameter, or [`DEFAULT_HEARTBEAT`].
    pub(crate) heartbeat: Option<Duration>,
    /// How long any other call to the broker may take before its connection
    /// is given up.
    pub(crate) call_deadline: Duration,
    /// The first wait before connecting again; it doubles up to
    /// `reconnect_max`.
    pub(crate) reconnect_min: Duration,
    /// The longest wait between connection attempts.
    pub(crate) reconnect_max: Duration,
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp")
            .field("url", &self.url)
            .field("namespace", &self.namespace)
            .field("prefetch", &self.prefetch)
            .field("publish_window", &self.publish_window)
            .field("confirm_timeout", &self.confirm_timeout)
            .field("heartbeat", &self.heartbeat)
            .field("call_deadline", &self.call_deadline)
            .finish()
    }
}

impl Amqp {
    /// The broker at `url` (`amqp://user:password@host:port/vhost`, the
    /// virtual host URL-encoded: `%2f` is `/`). `amqps://` (feature `tls`)
    /// encrypts, checking the broker's certificate and name; the query
    /// parameters `cacertfile` (the CA to trust; the system's roots
    /// without it), `certfile` and `keyfile` (a client certificate) are
    /// RabbitMQ's own.
    pub fn new(url: impl Into<String>) -> Self {
        Amqp {
            url: SecretUrl::new(url),
            namespace: String::new(),
            prefetch: 32,
            publish_window: 256,
            confirm_timeout: Duration::from_secs(10),
            heartbeat: None,
            call_deadline: Duration::from_secs(10),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
        }
    }

    /// A prefix for the exchange and queue names (default: none), e.g. the
    /// application's name; letters, digits, `-`, `_` and `.`.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Messages a handler's consumer holds unacknowledged at once (default
    /// 32): in delivery, or waiting for a retry.
    pub fn prefetch(mut self, prefetch: u16) -> Self {
        self.prefetch = prefetch;
        self
    }

    /// Publishes the relay sends without waiting for their confirms
    /// (default 256, from 1 to 10,000): it publishes outbox messages back to
    /// back on its one channel and awaits their confirms together, and once
    /// this many are unconfirmed the next waits until one is confirmed,
    /// nacked or timed out. RabbitMQ's measurements put the useful window
    /// between 100 and 1,000; 1 publishes one message at a time.
    ///
    /// A message counts as sent only once confirmed, and only then is its
    /// outbox row marked delivered (the bus marks rows in batches). The
    /// messages of one ordering key still go one at a time, each published
    /// only once the one before is confirmed, so that a nack, a return or
    /// a confirm timeout stops the key at the failed message, which is
    /// published again before anything after it: were a key's later
    /// messages already on their way, they would reach the handler's queue
    /// first and wait at its consumer for the missing one, holding its
    /// prefetch, possibly until nothing else of the queue could come
    /// through. Different keys, and messages without a key, share the
    /// window.
    pub fn publish_window(mut self, window: usize) -> Self {
        self.publish_window = window;
        self
    }

    /// How long a publish waits for the broker's confirm (default 10 s, at
    /// most 10 min); after that the message counts as not sent and stays in
    /// the outbox, to be published again, and the relay gives up its
    /// connection and makes a new one. A broker that has not confirmed in
    /// 10 s is blocked (a resource alarm) or gone.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The AMQP heartbeat of tickbox's connections (default 10 s, whole
    /// seconds from 1 s to 10 min). Each side sends a heartbeat when it has
    /// sent nothing else for half the interval, and gives a connection up
    /// when it has heard nothing at all for two intervals: a broker gone
    /// silent (a dead host, a network that drops everything) is noticed
    /// after about 20 s with the default, where the broker's own proposal
    /// of 60 s would take 2 minutes. RabbitMQ recommends 5 to 20 s; below 5 s
    /// a busy broker or a paused process risks being taken for dead. A
    /// broker configured for a shorter heartbeat than this gets its way: the
    /// client agrees to the lower of the two.
    ///
    /// The broker's URL may set it too (`amqp://…/%2f?heartbeat=15`): either
    /// one is used, and the bus refuses to start if both are given and
    /// differ. The broker shows what was agreed:
    /// `rabbitmqctl list_connections client_properties timeout`.
    pub fn heartbeat(mut self, interval: Duration) -> Self {
        self.heartbeat = Some(interval);
        self
    }

    /// How long any call to the broker other than a publish's confirm may
    /// take (default 10 s, at most 10 min): connecting, opening a channel, switching on
    /// confirms, declaring and binding, setting the prefetch, consuming,
    /// acknowledging, cancelling, reading a queue's depth. A call without an
    /// answer by then gives up its connection, whose socket is closed, and
    /// the relay or the consumer connects again. RabbitMQ itself gives a
    /// client 10 s to finish its handshake (`handshake_timeout`); a broker
    /// that needs longer for anything else is as good as gone. Closing a
    /// channel or a connection waits at most 1 s before the socket is shut
    /// regardless.
    pub fn call_deadline(mut self, timeout: Duration) -> Self {
        self.call_deadline = timeout;
        self
    }

    /// The waits between attempts to connect again after the broker is lost
    /// (default from 100 ms, doubling up to 5 s).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max;
        self
    }

    /// The broker's URL with its password replaced by `***`: no
    /// password, nothing that might be one.
    pub fn redacted_url(&self) -> String {
        self.url.redacted()
    }

    /// The one exchange tickbox publishes to: `tickbox`, or
    /// `tickbox.<namespace>`. A topic exchange; a message's routing key is
    /// its topic.
    pub fn exchange(&self) -> String {
        if self.namespace.is_empty() {
            "tickbox".to_string()
        } else {
            format!("tickbox.{}", self.namespace)
        }
    }

    /// The durable quorum queue of handler `handler` of module `module`:
    /// `<exchange>.<module>.<handler>`. It outlives the process, so messages
    /// published while the handler's service is down wait for it there.
    pub fn queue(&self, module: &str, handler: &str) -> String {
        format!("{}.{module}.{handler}", self.exchange())
    }

    /// Reads the queue of handler `handler` of module `module` on the broker
    /// now: the messages waiting in it and its consumers. For operators'
    /// tools; it declares nothing (a queue that does not exist is an
    /// [`Error::BrokerRefused`](crate::Error::BrokerRefused) naming it).
    pub async fn queue_status(&self, module: &str, handler: &str) -> Result<QueueStatus> {
        topology::queue_status(self, module, handler).await
    }

    /// Checks the settings, at bus start.
    pub(crate) fn validate(&self) -> Result<()> {
        let url = self.redacted_url();
        let raw = self.url.expose();
        if !(raw.starts_with("amqp://") || raw.starts_with("amqps://")) {
            return Err(Error::Config(format!(
                "amqp: the broker URL must start with amqp:// or amqps:// (got {url})"
            )));
        }
        self.tls()?;
        let uri = self.parse()?;
        let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if !self.namespace.chars().all(allowed) {
            return Err(Error::Config(format!(
                "amqp: the namespace `{}` may hold only letters, digits, '-', '_' and '.'",
                self.namespace
            )));
        }
        if self.prefetch == 0 {
            return Err(Error::Config("amqp: prefetch must be at least 1".into()));
        }
        if !(1..=LARGEST_PUBLISH_WINDOW).contains(&self.publish_window) {
            return Err(Error::Config(format!(
                "amqp: the publish window must be from 1 to {LARGEST_PUBLISH_WINDOW} \
                 (got {}; RabbitMQ gains nothing past 1,000 unconfirmed publishes)",
                self.publish_window
            )));
        }
        for (what, wait) in [
            ("confirm timeout", self.confirm_timeout),
            ("call timeout", self.call_deadline),
        ] {
            if wait.is_zero() || wait > LONGEST_WAIT {
                return Err(Error::Config(format!(
                    "amqp: the {what} must be above zero and at most {LONGEST_WAIT:?} (got {wait:?})"
                )));
            }
        }
        if self.reconnect_min.is_zero() {
            return Err(Error::Config(
                "amqp: the reconnect backoff must be above zero".into(),
            ));
        }
        if self.reconnect_max < self.reconnect_min {
            return Err(Error::Config(
                "amqp: the longest reconnect wait is below the first".into(),
            ));
        }
        self.heartbeat_of(&uri)?;
        Ok(())
    }

    /// The heartbeat to ask for, in seconds: [`Amqp::heartbeat`], else the
    /// URL's `heartbeat` parameter, else [`DEFAULT_HEARTBEAT`].
    fn heartbeat_of(&self, uri: &AMQPUri) -> Result<u16> {
        let from_url = uri.query.heartbeat.map(|s| Duration::from_secs(s.into()));
        let interval = match (self.heartbeat, from_url) {
            (Some(set), Some(in_url)) if set != in_url => {
                return Err(Error::Config(format!(
                    "amqp: the heartbeat is set twice, to {set:?} (Amqp::heartbeat) and to \
                     {in_url:?} (the URL's heartbeat parameter): keep one"
                )))
            }
            (set, in_url) => set.or(in_url).unwrap_or(DEFAULT_HEARTBEAT),
        };
        if interval < Duration::from_secs(1)
            || interval > LONGEST_WAIT
            || interval.subsec_nanos() != 0
        {
            return Err(Error::Config(format!(
                "amqp: the heartbeat must be whole seconds from 1 s to {LONGEST_WAIT:?} \
                 (got {interval:?}; 5 to 20 s is RabbitMQ's advice, and 0 would leave a \
                 silent connection unnoticed for minutes)"
            )));
        }
        Ok(interval.as_secs() as u16)
    }

    /// What the URL asks of TLS: `None` for `amqp://`.
    pub(crate) fn tls(&self) -> Result<Option<crate::tls::TlsSettings>> {
        crate::tls::amqp::settings(self.url.expose())
            .map_err(|reason| Error::Config(format!("amqp: {}: {reason}", self.redacted_url())))
    }

    /// The broker's URL as the client takes it, asking for the heartbeat.
    /// Only after [`validate`](Self::validate) succeeded.
    pub(crate) fn uri(&self) -> Result<AMQPUri> {
        let mut uri = self.parse()?;
        uri.query.heartbeat = Some(self.heartbeat_of(&uri)?);
        Ok(uri)
    }

    /// The broker's URL as the client reads it. The client's reason for
    /// refusing one may quote it whole (`Invalid URL: '…'`): it is shown
    /// with the URL redacted.
    fn parse(&self) -> Result<AMQPUri> {
        AMQPUri::from_str(self.url.expose()).map_err(|reason| {
            let url = self.redacted_url();
            let reason = reason.replace(self.url.expose(), &url);
            Error::Config(format!("amqp: bad broker URL {url}: {reason}"))
        })
    }
}
