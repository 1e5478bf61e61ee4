//! MySQL's subscription statements: the upsert of a subscription, spelled
//! `ON DUPLICATE KEY UPDATE`, and lists of ids spelled as in
//! [`ids`](super::ids).

use super::ids::{id_rows, join_ids};
use super::{check_width, Mysql, NAME_BYTES};
use crate::store::contract::Store;
use crate::store::ids::IdLists;
use crate::store::schema::SubscriptionRow;
use crate::store::sql::sql;
use crate::store::subscriptions::{
    stop_serving_text, subscription_columns, SubscriptionStatements,
};
use diesel::QueryResult;
use uuid::Uuid;

impl SubscriptionStatements for Mysql {
    async fn record_subscriptions(
        conn: &mut Self::Conn,
        rows: Vec<SubscriptionRow>,
    ) -> QueryResult<()> {
        // One statement per row: a bus has few handlers.
        for row in rows {
            check_width("module name", &row.module, NAME_BYTES)?;
            check_width("handler name", &row.handler, NAME_BYTES)?;
            check_width("topic", &row.topic, NAME_BYTES)?;
            let statement = sql!(
                concat!(
                    "INSERT INTO tickbox_subscriptions (",
                    subscription_columns!(),
                    ") VALUES (?, ?, ?, ?, ?, ?, ?) \
                     ON DUPLICATE KEY UPDATE module = VALUES(module), \
                     handler = VALUES(handler), topic = VALUES(topic), \
                     seen_at_us = VALUES(seen_at_us), \
                     alive_until_us = VALUES(alive_until_us)"
                ),
                row.id,
                row.module,
                row.handler,
                row.topic,
                row.subscribed_at_us,
                row.seen_at_us,
                row.alive_until_us
            );
            Self::execute(conn, statement).await?;
        }
        Ok(())
    }

    // Unused: the list is joined, below.
    const STOP_SERVING: &'static str = stop_serving_text!(id_rows);

    async fn stop_serving(
        conn: &mut Self::Conn,
        served: &[Uuid],
        now_us: i64,
    ) -> QueryResult<usize> {
        let statement = sql!(
            concat!(
                "UPDATE tickbox_subscriptions",
                join_ids!("tickbox_subscriptions.id"),
                "SET alive_until_us = ?"
            ),
            Self::id_rows(served),
            now_us
        );
        Self::execute(conn, statement).await
    }
}
