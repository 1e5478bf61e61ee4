//! Delivery: a message meets a handler. The inbox guard runs each attempt
//! in a transaction that records `(message id, handler)` before COMMIT;
//! batched handlers run several in one; every attempt ends in an
//! outcome ([`crate::error::outcome`]).

pub(crate) mod attempt;
pub(crate) mod batch;
pub(crate) mod batch_queue;
pub(crate) mod effect;
pub(crate) mod guard;
pub(crate) mod handler;
pub(crate) mod registry;
