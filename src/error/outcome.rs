//! How a delivery ends: handled, skipped as a duplicate, or failed (and
//! why, so the bus knows whether to retry).

use crate::error::Error;
use std::fmt;

/// How a delivery ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The handler ran and its transaction committed with the inbox row.
    Handled,
    /// The inbox already held the message: the handler was skipped.
    Duplicate,
}

/// Why a delivery failed. Nothing of it was committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryError {
    /// What kind of failure it was.
    pub kind: FailureKind,
    /// A description, with the error's chain of causes.
    pub reason: String,
    /// The database failed in a way that may pass (a lost connection, a
    /// serialization failure, a busy database).
    pub transient: bool,
    /// For [`FailureKind::Parked`]: the dead letter's message id the key is
    /// parked behind.
    pub parked_behind: Option<uuid::Uuid>,
}

/// The kinds of delivery failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FailureKind {
    /// The handler returned an error that a retry may fix.
    Handler,
    /// The handler returned an error marked permanent.
    Permanent,
    /// The handler panicked.
    Panic,
    /// The payload does not decode into the handler's message type.
    Undecodable,
    /// The database failed (begin, inbox insert, outbox insert or commit).
    Database,
    /// The module or its runtime stopped before the delivery finished.
    Stopped,
    /// The delivery named a handler the module does not have, or one that
    /// subscribes to another topic.
    NoSuchHandler,
    /// The message broker did not take a message the relay published (it
    /// is unreachable, refused it, or no queue is bound to its topic yet):
    /// published again, without end, until it does.
    Broker,
    /// A keyed message came before an earlier message of its key was done
    /// with by this handler (it is on its way, or retrying elsewhere): tried
    /// again shortly, without using up an attempt.
    Early,
    /// A keyed message whose key is parked for this handler behind a dead
    /// letter ([`DeliveryError::parked_behind`]): recorded as a dead letter
    /// parked behind it, and delivered when that one is replayed or
    /// skipped.
    Parked,
    /// A failure the test kit's session injected
    /// ([`Session::inject_failures`](crate::testing::Session::inject_failures)),
    /// after the handler's work and before COMMIT: rolled back and tried
    /// again like a handler's error, but without using up an attempt, so
    /// that injected failures alone never dead-letter a message.
    Injected,
}

impl DeliveryError {
    pub(crate) fn new(kind: FailureKind, reason: impl fmt::Display) -> Self {
        DeliveryError {
            kind,
            reason: reason.to_string(),
            transient: false,
            parked_behind: None,
        }
    }

    /// A keyed message whose key is parked behind dead letter `head`.
    pub(crate) fn parked(head: uuid::Uuid, reason: impl fmt::Display) -> Self {
        DeliveryError {
            parked_behind: Some(head),
            ..Self::new(FailureKind::Parked, reason)
        }
    }

    pub(crate) fn database(error: Error) -> Self {
        DeliveryError {
            transient: error.is_transient(),
            ..Self::new(FailureKind::Database, error)
        }
    }

    /// A publish the broker did not confirm.
    #[cfg(feature = "amqp")]
    pub(crate) fn broker(error: Error) -> Self {
        DeliveryError {
            transient: true,
            ..Self::new(FailureKind::Broker, error)
        }
    }

    /// Whether this failure uses up one of the retry policy's attempts:
    /// transient database failures, the broker's failures, stops and
    /// failures a test session injected do not.
    pub fn counts_as_attempt(&self) -> bool {
        match self.kind {
            FailureKind::Database => !self.transient,
            FailureKind::Stopped
            | FailureKind::Broker
            | FailureKind::Early
            | FailureKind::Injected => false,
            _ => true,
        }
    }

    pub(crate) fn stopped(reason: impl fmt::Display) -> Self {
        Self::new(FailureKind::Stopped, reason)
    }

    /// False when no retry can succeed (a permanent error, an undecodable
    /// payload).
    pub fn is_retryable(&self) -> bool {
        !matches!(
            self.kind,
            FailureKind::Permanent
                | FailureKind::Undecodable
                | FailureKind::NoSuchHandler
                | FailureKind::Parked
        )
    }
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.reason)
    }
}

impl std::error::Error for DeliveryError {}
