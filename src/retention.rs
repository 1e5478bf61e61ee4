//! Retention: the inbox and the outbox do not grow forever.
//!
//! Inbox rows are the duplicate-detection window: a message redelivered after
//! its row is gone would be processed again. So the window must outlast every
//! redelivery — the bus refuses to start when a handler's retry policy can go
//! on longer than its module's window.

use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use serde::Serialize;
use std::time::Duration;

/// How long a module keeps processed inbox rows and delivered outbox rows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// Inbox rows older than this are deleted; `None` keeps them forever.
    /// This is the duplicate-detection window. Settled entries of the
    /// effects journal are kept as long, except those of dead-lettered
    /// messages, which are kept until the dead letter is gone.
    pub inbox: Option<Duration>,
    /// Delivered outbox rows older than this are deleted; `None` keeps them.
    /// Zero deletes each row as soon as it is delivered, instead of marking
    /// it: no history to inspect, but one cheap delete per message rather
    /// than an update (on PostgreSQL an update of the row rewrites it and its
    /// index entries). Undelivered rows are never deleted.
    pub outbox: Option<Duration>,
    /// How often the bus runs the sweep.
    pub interval: Duration,
}

impl Default for Retention {
    /// Seven days for both, swept every minute.
    fn default() -> Self {
        Retention {
            inbox: Some(Duration::from_secs(7 * 24 * 3600)),
            outbox: Some(Duration::from_secs(7 * 24 * 3600)),
            interval: Duration::from_secs(60),
        }
    }
}

impl Retention {
    /// Keeps every row forever.
    pub fn forever() -> Self {
        Retention {
            inbox: None,
            outbox: None,
            ..Retention::default()
        }
    }

    /// Checks that the inbox window outlasts the redeliveries of a handler
    /// with this retry policy. `slack` covers the rest of the redelivery
    /// path (claim leases, scans).
    pub(crate) fn check(
        &self,
        module: &str,
        handler: &str,
        policy: &RetryPolicy,
        slack: Duration,
    ) -> Result<()> {
        let Some(window) = self.inbox else {
            return Ok(());
        };
        let too_short = |horizon: String| Error::RetentionTooShort {
            module: module.to_string(),
            handler: handler.to_string(),
            retention: window,
            horizon,
        };
        match policy.horizon() {
            None => Err(too_short("unbounded (max_attempts is None)".into())),
            Some(horizon) if window < horizon + slack => {
                Err(too_short(format!("{:?}", horizon + slack)))
            }
            Some(_) => Ok(()),
        }
    }
}

/// What one retention sweep deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Inbox rows deleted.
    pub inbox_rows: u64,
    /// Delivered outbox rows deleted.
    pub outbox_rows: u64,
    /// Settled effects deleted from the effects journal (with the inbox's
    /// window; effects of dead-lettered messages are kept).
    pub effect_rows: u64,
}
