//! Tests of the `tickbox` operator's tool: every command, run as a separate
//! process against a module database that a test module created and filled,
//! and against the databases of an application of several modules at once,
//! on SQLite and, with the `postgres` feature, on PostgreSQL; and its help
//! and usage errors.
//!
//! The PostgreSQL tests need `TICKBOX_PG_URL`; without it they fail rather
//! than pass silently:
//!
//! ```text
//! TICKBOX_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p tickbox-cli --all-features
//! ```

mod application;
mod commands;
mod effects;
#[cfg(all(feature = "amqp", feature = "sqlite"))]
mod queues;
mod support;
mod usage;
