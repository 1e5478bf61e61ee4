//! PostgreSQL's dead letter statements: the defaults.

use crate::store::dead_letters::DeadLetterStatements;
use crate::store::postgres::Postgres;

impl DeadLetterStatements for Postgres {}
