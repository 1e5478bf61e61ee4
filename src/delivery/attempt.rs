//! One attempt to deliver a message to one handler of a module, as the bus
//! asks for it.

use crate::message::Envelope;
use std::sync::Arc;

/// Run `envelope` through handler number `handler` of the module, for the
/// `attempt`-th time.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    /// The message.
    pub(crate) envelope: Arc<Envelope>,
    /// Index of the handler in its module.
    pub(crate) handler: usize,
    /// 1 for the first delivery to this handler, then 2, 3… on retries.
    pub(crate) attempt: u32,
}
