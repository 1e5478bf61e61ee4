//! Faults: those the example injects (`--fail-rate`), and those it survives
//! in its own statements (a connection terminated under it, a busy
//! database).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tickbox::{Backend, Delivery, Handler, HandlerError, Tx};

/// Wraps a handler so that each call fails with probability `fail_rate`
/// after the handler did its work and before COMMIT: the inbox row, the
/// changes and any published message roll back, and the bus retries the
/// delivery.
pub struct Flaky<H> {
    inner: H,
    fail_rate: f64,
}

pub fn flaky<H>(inner: H, fail_rate: f64) -> Flaky<H> {
    Flaky { inner, fail_rate }
}

impl<B: Backend, H: Handler<B>> Handler<B> for Flaky<H> {
    type Message = H::Message;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        message: H::Message,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        self.inner.handle(tx, message, delivery).await?;
        if self.fail_rate > 0.0 && fastrand::f64() < self.fail_rate {
            return Err(HandlerError::msg(format!(
                "injected failure (--fail-rate {})",
                self.fail_rate
            )));
        }
        Ok(())
    }
}

/// Whether the run was asked to stop (see [`stop_retrying`]).
static STOPPING: AtomicBool = AtomicBool::new(false);

/// From now on [`retrying`] tries each statement once: the run was asked to
/// stop (Ctrl-C, SIGTERM), and a database out of reach must not hold the
/// process for a minute of retries.
pub fn stop_retrying() {
    STOPPING.store(true, Ordering::Relaxed);
}

/// Runs `op` again while it fails with a transient database error (a lost
/// or terminated connection, a busy database), with backoff, for up to a
/// minute — or until the run is asked to stop ([`stop_retrying`]).
/// Handlers need no such loop: the bus retries them.
pub async fn retrying<T, F, Fut>(what: &str, mut op: F) -> tickbox::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = tickbox::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut delay = Duration::from_millis(20);
    loop {
        match op().await {
            Err(error)
                if error.is_transient()
                    && Instant::now() < deadline
                    && !STOPPING.load(Ordering::Relaxed) =>
            {
                tracing::warn!(%error, "{what} failed; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            result => return result,
        }
    }
}
