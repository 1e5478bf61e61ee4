//! One attempt to deliver a message to one handler of a module, as the bus
//! asks for it.

use crate::delivery::registry::HandlerIndex;
use crate::message::Envelope;
use std::sync::Arc;

/// Run `envelope` through handler `handler` of the module, for the
/// `attempt`-th time.
#[derive(Debug, Clone)]
pub(crate) struct Attempt {
    /// The message.
    pub(crate) envelope: Arc<Envelope>,
    /// The handler, among its module's.
    pub(crate) handler: HandlerIndex,
    /// 1 for the first delivery to this handler, then 2, 3… on retries.
    pub(crate) attempt: u32,
}
