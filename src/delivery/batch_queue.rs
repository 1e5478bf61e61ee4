//! Where deliveries to a batched handler wait for a transaction to take
//! them.

use crate::delivery::attempt::Attempt;
use crate::error::outcome::{DeliveryError, Outcome};
use tokio::sync::{mpsc, oneshot};

/// Where the deliveries to one batched handler wait for their transaction.
pub(crate) struct BatchQueue {
    sender: mpsc::UnboundedSender<Waiting>,
}

/// A delivery waiting for a batch, and where its outcome goes.
pub(crate) struct Waiting {
    pub(crate) attempt: Attempt,
    pub(crate) reply: oneshot::Sender<Result<Outcome, DeliveryError>>,
}

impl BatchQueue {
    /// A queue, and its receiving end for [`run_batches`]. Unbounded: the
    /// bus's limit on concurrent deliveries bounds it.
    pub(crate) fn new() -> (Self, mpsc::UnboundedReceiver<Waiting>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        (BatchQueue { sender }, receiver)
    }

    /// Queues a delivery and waits for the outcome of its transaction.
    pub(crate) async fn submit(&self, attempt: Attempt) -> Result<Outcome, DeliveryError> {
        let (reply, outcome) = oneshot::channel();
        if self.sender.send(Waiting { attempt, reply }).is_err() {
            return Err(DeliveryError::stopped("the module stopped taking batches"));
        }
        outcome.await.unwrap_or_else(|_| {
            Err(DeliveryError::stopped(
                "the module stopped before the batch ended",
            ))
        })
    }
}
