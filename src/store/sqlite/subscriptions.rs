//! The subscriptions' statements on SQLite: lists of ids spelled as in
//! [`ids`](super::ids).

use super::ids::{id_rows, json_array};
use super::Sqlite;
use crate::store::contract::Store;
use crate::store::sql::sql;
use crate::store::subscriptions::{stop_serving_text, SubscriptionStatements};
use diesel::QueryResult;
use uuid::Uuid;

impl SubscriptionStatements for Sqlite {
    async fn stop_serving(
        conn: &mut Self::Conn,
        served: &[Uuid],
        now_us: i64,
    ) -> QueryResult<usize> {
        let statement = sql!(stop_serving_text!(id_rows), now_us, json_array(served));
        Self::execute(conn, statement).await
    }
}
