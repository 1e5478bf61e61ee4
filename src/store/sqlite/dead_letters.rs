//! SQLite's dead letter statements: the defaults.

use crate::store::dead_letters::DeadLetterStatements;
use crate::store::sqlite::Sqlite;

impl DeadLetterStatements for Sqlite {}
