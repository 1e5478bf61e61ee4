//! What a bus needs to reach a RabbitMQ broker.

use crate::error::{redact_url, Error, Result};
use std::str::FromStr;
use std::time::Duration;

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
    /// The broker's URL, secrets included.
    pub(crate) url: String,
    /// Prefixes every name tickbox declares, so that several applications
    /// (or test runs) share a broker without sharing queues.
    pub(crate) namespace: String,
    /// Unacknowledged messages a handler's consumer holds at once.
    pub(crate) prefetch: u16,
    /// How long a publish waits for the broker's confirm before it counts as
    /// not sent.
    pub(crate) confirm_timeout: Duration,
    /// The first wait before connecting again; it doubles up to
    /// `reconnect_max`.
    pub(crate) reconnect_min: Duration,
    /// The longest wait between connection attempts.
    pub(crate) reconnect_max: Duration,
}

impl std::fmt::Debug for Amqp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Amqp")
            .field("url", &redact_url(&self.url))
            .field("namespace", &self.namespace)
            .field("prefetch", &self.prefetch)
            .field("confirm_timeout", &self.confirm_timeout)
            .finish()
    }
}

impl Amqp {
    /// The broker at `url` (`amqp://user:password@host:port/vhost`, the
    /// virtual host URL-encoded: `%2f` is `/`).
    pub fn new(url: impl Into<String>) -> Self {
        Amqp {
            url: url.into(),
            namespace: String::new(),
            prefetch: 32,
            confirm_timeout: Duration::from_secs(10),
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

    /// How long a publish waits for the broker's confirm (default 10 s);
    /// after that the message counts as not sent and stays in the outbox, to
    /// be published again.
    pub fn confirm_timeout(mut self, timeout: Duration) -> Self {
        self.confirm_timeout = timeout;
        self
    }

    /// The waits between attempts to connect again after the broker is lost
    /// (default from 100 ms, doubling up to 5 s).
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max;
        self
    }

    /// The broker's URL with any password removed.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
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

    /// Checks the settings, at bus start.
    pub(crate) fn validate(&self) -> Result<()> {
        let url = self.redacted_url();
        if !(self.url.starts_with("amqp://") || self.url.starts_with("amqps://")) {
            return Err(Error::Config(format!(
                "amqp: the broker URL must start with amqp:// (got {url})"
            )));
        }
        if self.url.starts_with("amqps://") {
            return Err(Error::Config(format!(
                "amqp: {url}: TLS (amqps://) is not built into this tickbox; use amqp://"
            )));
        }
        if let Err(reason) = lapin::uri::AMQPUri::from_str(&self.url) {
            return Err(Error::Config(format!(
                "amqp: bad broker URL {url}: {reason}"
            )));
        }
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
        if self.confirm_timeout.is_zero() || self.reconnect_min.is_zero() {
            return Err(Error::Config(
                "amqp: the confirm timeout and the reconnect backoff must be above zero".into(),
            ));
        }
        if self.reconnect_max < self.reconnect_min {
            return Err(Error::Config(
                "amqp: the longest reconnect wait is below the first".into(),
            ));
        }
        Ok(())
    }
}
