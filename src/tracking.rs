//! What a module did, told to the test kit's sessions as it happens
//! (feature `testing`): each message its transactions published, how each
//! delivery to its handlers ended, each dead letter it recorded. Without
//! the feature the calls compile to nothing.
//!
//! The events are emitted where tickbox itself decides them, in an order a
//! session can rely on: a handler's published messages are told at its
//! transaction's COMMIT, before the delivery's outcome.

use crate::error::outcome::{DeliveryError, FailureKind, Outcome};
use crate::message::Envelope;
use std::sync::Arc;

/// What happened to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "testing"), allow(dead_code, unreachable_pub))]
pub enum Happened {
    /// A transaction of the module published it, and committed.
    Published,
    /// A handler's transaction committed with its inbox row.
    Handled,
    /// A handler found it in its inbox and skipped it.
    Duplicate,
    /// A handler's attempt failed and rolled back (the bus may retry it).
    Failed {
        /// What kind of failure.
        kind: FailureKind,
        /// The error, with its causes.
        error: String,
    },
    /// It was given up on and recorded as a dead letter.
    DeadLettered {
        /// Why.
        reason: String,
    },
}

/// One thing that happened to one message in one module.
#[derive(Debug, Clone)]
#[cfg_attr(not(feature = "testing"), allow(dead_code, unreachable_pub))]
pub struct Event {
    /// The module it happened in: the publisher, or the handler's module.
    pub module: String,
    /// The handler, for what happened in a delivery (`None` for
    /// [`Happened::Published`]; `Some("")` for a dead letter no handler
    /// could be chosen for).
    pub handler: Option<String>,
    /// The message.
    pub envelope: Arc<Envelope>,
    /// The delivery's attempt (0 for [`Happened::Published`]).
    pub attempt: u32,
    /// What happened.
    pub happened: Happened,
}

/// Something that watches modules: a test session.
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub(crate) trait Tracker: Send + Sync {
    /// Told each event as it happens.
    fn seen(&self, event: Event);

    /// Whether a handler's successful attempt is to fail anyway, rolled
    /// back just before COMMIT (failure injection).
    fn inject_failure(&self) -> bool;

    /// The probability of delivering a handled message once more.
    fn duplicate_rate(&self) -> f64;
}

/// The trackers watching one module.
#[derive(Default)]
pub(crate) struct Trackers {
    /// Dropped sessions leave a dead entry, removed when one is added.
    #[cfg(feature = "testing")]
    list: std::sync::RwLock<Vec<std::sync::Weak<dyn Tracker>>>,
    /// Whether a tracker was ever added: until then, events cost one load.
    #[cfg(feature = "testing")]
    watched: std::sync::atomic::AtomicBool,
}

impl Trackers {
    /// Starts telling `tracker` what happens.
    #[cfg(feature = "testing")]
    pub(crate) fn add(&self, tracker: std::sync::Weak<dyn Tracker>) {
        let mut list = self.list.write().unwrap_or_else(|p| p.into_inner());
        list.retain(|t| t.strong_count() > 0);
        list.push(tracker);
        self.watched
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The live trackers; empty (and without a lock) when there are none.
    #[cfg(feature = "testing")]
    fn live(&self) -> Vec<Arc<dyn Tracker>> {
        if !self.watched.load(std::sync::atomic::Ordering::Acquire) {
            return Vec::new();
        }
        let list = self.list.read().unwrap_or_else(|p| p.into_inner());
        list.iter().filter_map(std::sync::Weak::upgrade).collect()
    }

    /// Tells every tracker `event`, made only if one listens.
    #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
    fn tell(&self, event: impl Fn() -> Event) {
        #[cfg(feature = "testing")]
        for tracker in self.live() {
            tracker.seen(event());
        }
    }

    /// `module` committed these messages.
    pub(crate) fn published(&self, module: &str, envelopes: &[Arc<Envelope>]) {
        for envelope in envelopes {
            self.tell(|| Event {
                module: module.to_string(),
                handler: None,
                envelope: envelope.clone(),
                attempt: 0,
                happened: Happened::Published,
            });
        }
    }

    /// A delivery to `handler` of `module` ended with `result`. A keyed
    /// message that came before its predecessor did not run and is not
    /// told.
    pub(crate) fn delivered(
        &self,
        module: &str,
        handler: &str,
        attempt: u32,
        envelope: &Arc<Envelope>,
        result: &Result<Outcome, DeliveryError>,
    ) {
        let happened = match result {
            Ok(Outcome::Handled) => Happened::Handled,
            Ok(Outcome::Duplicate) => Happened::Duplicate,
            Err(error) if error.kind == FailureKind::Early => return,
            Err(error) => Happened::Failed {
                kind: error.kind,
                error: error.reason.clone(),
            },
        };
        self.tell(|| Event {
            module: module.to_string(),
            handler: Some(handler.to_string()),
            envelope: envelope.clone(),
            attempt,
            happened: happened.clone(),
        });
    }

    /// `module` recorded a dead letter of `envelope` for `handler`.
    pub(crate) fn dead_lettered(
        &self,
        module: &str,
        handler: &str,
        envelope: &Envelope,
        attempts: u32,
        reason: &str,
    ) {
        self.tell(|| Event {
            module: module.to_string(),
            handler: Some(handler.to_string()),
            envelope: Arc::new(envelope.clone()),
            attempt: attempts,
            happened: Happened::DeadLettered {
                reason: reason.to_string(),
            },
        });
    }

    /// Whether a tracker wants this successful attempt to fail.
    #[cfg(feature = "testing")]
    pub(crate) fn inject_failure(&self) -> bool {
        self.live().iter().any(|tracker| tracker.inject_failure())
    }

    /// The highest duplicate rate a tracker asks for (0 without one).
    #[cfg(feature = "testing")]
    pub(crate) fn duplicate_rate(&self) -> f64 {
        self.live()
            .iter()
            .map(|t| t.duplicate_rate())
            .fold(0.0, f64::max)
    }
}
