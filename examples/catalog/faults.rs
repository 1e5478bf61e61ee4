//! Faults: the handler failures the example injects (`--fail-rate`), and
//! the database's passing failures its own transactions outlast.

use std::future::Future;
use std::time::{Duration, Instant};
use tickbox::{Backend, Delivery, Handler, HandlerError, Tx};

/// A handler that fails, with probability `fail_rate`, after the wrapped
/// handler did its work and before COMMIT: its changes and its inbox row
/// roll back, and the bus delivers the message again later.
pub struct FailAfterWork<H> {
    /// The handler doing the work.
    pub inner: H,
    /// The probability of failing each call.
    pub fail_rate: f64,
}

impl<B: Backend, H: Handler<B>> Handler<B> for FailAfterWork<H> {
    type Message = H::Message;

    async fn handle(
        &self,
        tx: &mut Tx<B>,
        message: H::Message,
        delivery: &Delivery,
    ) -> Result<(), HandlerError> {
        self.inner.handle(tx, message, delivery).await?;
        if fastrand::f64() < self.fail_rate {
            return Err(HandlerError::msg(format!(
                "injected failure after the work (--fail-rate {})",
                self.fail_rate
            )));
        }
        Ok(())
    }
}

/// Runs `op` again while it fails in a way worth retrying (a busy
/// database, a lost connection), with backoff, for up to a minute.
/// Handlers need no such loop: the bus retries them.
pub async fn retrying<T, F, Fut>(what: &str, mut op: F) -> tickbox::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = tickbox::Result<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut delay = Duration::from_millis(10);
    loop {
        match op().await {
            Err(error) if error.is_transient() && Instant::now() < deadline => {
                tracing::warn!(%error, "{what} failed; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(1));
            }
            result => return result,
        }
    }
}
