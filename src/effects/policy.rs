//! What an effect left unfinished by a crash may do on the next attempt.

use std::time::Duration;

/// How an effect is repeated when a delivery is retried after the effect
/// was started but its result was never recorded (the process stopped
/// during the call, or between the call and the journal's commit), and
/// whether it may be called again after it failed.
///
/// Pick per effect, after what the external system promises:
///
/// | the external system | policy |
/// | --- | --- |
/// | de-duplicates by an idempotency key for a while (a payment API's `Idempotency-Key`, a mail server or inbox that folds equal `Message-ID`s) | [`at_least_once_with_key`](Self::at_least_once_with_key) with that while as the window |
/// | does not, and a second call would do harm (an SMS, a letter) | [`at_most_once`](Self::at_most_once) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectPolicy {
    /// Called again, with the same key, whenever no result was recorded —
    /// but only within `window` of the first call: a call later than that
    /// is refused (the effect becomes [`Unknown`](crate::EffectState::Unknown)
    /// and the delivery is dead-lettered), never sent blind past the
    /// external system's de-duplication window.
    AtLeastOnceWithKey {
        /// How long the external system recognises a key it has seen.
        window: Duration,
    },
    /// Never called a second time without a recorded outcome: an effect
    /// found started but unfinished becomes
    /// [`Unknown`](crate::EffectState::Unknown), the delivery is
    /// dead-lettered, and a person settles it (the operator's tool:
    /// `effects done` or `effects retry`). An effect whose call returned
    /// an error is called again on the next attempt: return an error only
    /// when the call surely did not take effect, and panic (or return
    /// [`HandlerError::permanent`](crate::HandlerError::permanent)) when
    /// the external system cannot tell.
    AtMostOnce,
}

impl EffectPolicy {
    /// Called again with the same key within `window` of its first call.
    pub fn at_least_once_with_key(window: Duration) -> Self {
        EffectPolicy::AtLeastOnceWithKey { window }
    }

    /// Never called twice without a recorded outcome.
    pub fn at_most_once() -> Self {
        EffectPolicy::AtMostOnce
    }

    /// The policy's name, as the journal and the operator's tool show it:
    /// `at-least-once-with-key` or `at-most-once`.
    pub fn name(&self) -> &'static str {
        match self {
            EffectPolicy::AtLeastOnceWithKey { .. } => "at-least-once-with-key",
            EffectPolicy::AtMostOnce => "at-most-once",
        }
    }
}
