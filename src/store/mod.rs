//! Storage: what tickbox needs from a database (`contract::Store`, sealed
//! behind the public [`Backend`](crate::Backend)), each backend's SQL and
//! quirks in its own file, and what reads the same on both written once.

pub(crate) mod backend;
pub(crate) mod catalog;
pub(crate) mod contract;
pub(crate) mod database;
pub(crate) mod dead_letters;
pub(crate) mod deadline;
pub(crate) mod inbox;
pub(crate) mod journal;
pub(crate) mod migrations;
pub(crate) mod ordering;
pub(crate) mod pool;
pub(crate) mod queries;
pub(crate) mod retention;
pub(crate) mod schema;
pub(crate) mod settings;
pub(crate) mod sql;
pub(crate) mod statement;

#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;
