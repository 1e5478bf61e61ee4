//! Waiting until every message is delivered: until the bus is idle, for
//! at most `--timeout`, or until Ctrl-C; its progress, every two seconds,
//! on stderr.

use crate::report::Ending;
use std::time::{Duration, Instant};
use tickbox::{Backend, BusHandle};
use tokio_util::sync::CancellationToken;

/// Waits until the bus is idle (nothing in memory, nothing pending in any
/// outbox), until `timeout`, or until Ctrl-C.
pub async fn for_deliveries<B: Backend>(
    bus: &BusHandle<B>,
    timeout: Duration,
    stop: &CancellationToken,
) -> tickbox::Result<Ending> {
    let deadline = Instant::now() + timeout;
    loop {
        tokio::select! {
            idle = bus.wait_idle(Duration::from_secs(2)) => {
                if idle? {
                    return Ok(Ending::Finished);
                }
            }
            () = stop.cancelled() => return Ok(Ending::Interrupted),
        }
        if Instant::now() >= deadline {
            return Ok(Ending::TimedOut);
        }
        let metrics = bus.metrics();
        tracing::info!(
            handled = metrics.total(|h| h.handled),
            failed_attempts = metrics.total(|h| h.failed),
            "delivering"
        );
    }
}
