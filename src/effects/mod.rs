//! External effects: a journal that makes a real e-mail or API call as
//! safe as the database work around it.
//!
//! A handler's database changes commit together with its inbox row, so a
//! redelivered message changes nothing twice. An external call is outside
//! that transaction: a crash after the call and before COMMIT would repeat
//! it. [`Delivery::effect`](crate::Delivery::effect) closes that gap with a
//! journal in the module's own database (`tickbox_effects`):
//!
//! 1. before the call, the effect is recorded as **started**, in a short
//!    transaction of its own that commits at once;
//! 2. the call runs with the effect's idempotency key;
//! 3. its outcome is recorded: **succeeded** with the result, or
//!    **failed** with the error.
//!
//! A later delivery of the message finds the entry: a succeeded effect
//! hands its result back without calling; a started one (cut short by a
//! crash) is called again with the same key or becomes **unknown**, as the
//! effect's [`EffectPolicy`](crate::EffectPolicy) says; an unknown one
//! waits for a person to settle it
//! ([`ModuleHandle::settle_effect`](crate::ModuleHandle::settle_effect),
//! the operator's tool's `effects` commands).
//!
//! The journal lives beside the module's tables but commits on its own
//! connections: on SQLite in a companion file (`<database file>-effects`),
//! because an SQLite write transaction holds its whole file and the
//! delivery's is open during the call; on PostgreSQL in the module's schema,
//! through two connections of its own. Settled entries are swept with the
//! inbox's retention window, except those of messages that have a dead
//! letter (a replay must still find them).

pub(crate) mod counters;
pub(crate) mod journal;
pub(crate) mod policy;
pub(crate) mod record;
pub(crate) mod scope;
pub(crate) mod state;
