//! Tests of the `tickbox` operator's tool: every command, run as a separate
//! process against a module database that a test module created and filled,
//! and against the databases of an application of several modules at once,
//! on SQLite, with the `postgres` feature on PostgreSQL and with the `mysql`
//! feature on MariaDB or MySQL, through the same generic tests; and its help
//! and usage errors.
//!
//! The PostgreSQL tests need `TICKBOX_PG_URL`, the MariaDB/MySQL tests
//! `TICKBOX_MYSQL_URL` (the server: each test makes its own databases on it,
//! and drops them with the `mysql` client); without them they fail rather
//! than pass silently:
//!
//! ```text
//! TICKBOX_PG_URL=postgres://postgres@127.0.0.1:5432/test TICKBOX_MYSQL_URL=mysql://root@127.0.0.1:3306 \
//!     cargo test -p tickbox-cli --all-features
//! ```

mod application;
mod commands;
mod effects;
#[cfg(all(feature = "amqp", feature = "sqlite"))]
mod queues;
mod support;
mod usage;
