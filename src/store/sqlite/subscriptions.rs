//! The subscriptions' statements on SQLite: lists of ids spelled as in
//! [`ids`](super::ids).

use super::ids::id_rows;
use super::Sqlite;
use crate::store::subscriptions::{stop_serving_text, SubscriptionStatements};

impl SubscriptionStatements for Sqlite {
    const STOP_SERVING: &'static str = stop_serving_text!(id_rows);
}
