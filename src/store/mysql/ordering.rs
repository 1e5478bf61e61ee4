//! MySQL's ordering statements: a key's progress starts with a plain insert
//! whose duplicate-key error means "it has progress already", an operator's
//! skip and the handlers' first start are upserts spelled
//! `ON DUPLICATE KEY UPDATE`, and `keys` (a reserved word here) is quoted;
//! the others are the defaults.

use super::{check_width, Mysql, NAME_BYTES};
use crate::store::contract::Store;
use crate::store::ordering::{advance_key_statement, KeyScope, OrderingStatements, ParkedKeys};
use crate::store::sql::{sql, Sql};
use diesel::result::{DatabaseErrorKind, Error};
use diesel::QueryResult;

impl OrderingStatements for Mysql {
    async fn advance_key(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> QueryResult<bool> {
        use diesel_async::RunQueryDsl;
        Ok(advance_key_statement!(scope, sequence)
            .execute(conn)
            .await?
            == 1)
    }

    async fn start_key(
        conn: &mut Self::Conn,
        scope: KeyScope<'_>,
        sequence: i64,
    ) -> QueryResult<bool> {
        // With the connection reporting found rows, an upsert that changes
        // nothing counts 1 as an insert does: a plain insert's duplicate-key
        // error tells instead. It does not end the transaction on these
        // servers; the delivery's inbox row already keeps other deliveries
        // of this message from racing it.
        let statement = sql!(
            "INSERT INTO tickbox_key_progress (handler, publisher, topic, ordering_key, last_seq) \
             VALUES (?, ?, ?, ?, ?)",
            scope.handler,
            scope.publisher,
            scope.topic,
            scope.key,
            sequence
        );
        match Self::execute(conn, statement).await {
            Ok(inserted) => Ok(inserted == 1),
            Err(Error::DatabaseError(DatabaseErrorKind::UniqueViolation, _)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn record_handler_starts(
        conn: &mut Self::Conn,
        handlers: &[&str],
        now_us: i64,
    ) -> QueryResult<()> {
        for handler in handlers {
            check_width("handler name", handler, NAME_BYTES)?;
        }
        for handler in handlers {
            let statement = sql!(
                "INSERT INTO tickbox_handlers (handler, first_started_at_us) VALUES (?, ?) \
                 ON DUPLICATE KEY UPDATE handler = handler",
                *handler,
                now_us
            );
            Self::execute(conn, statement).await?;
        }
        Ok(())
    }

    async fn skip_to(conn: &mut Self::Conn, scope: KeyScope<'_>, sequence: i64) -> QueryResult<()> {
        let statement = sql!(
            "INSERT INTO tickbox_key_progress (handler, publisher, topic, ordering_key, last_seq) \
             VALUES (?, ?, ?, ?, ?) \
             ON DUPLICATE KEY UPDATE last_seq = GREATEST(last_seq, VALUES(last_seq))",
            scope.handler,
            scope.publisher,
            scope.topic,
            scope.key,
            sequence
        );
        Self::execute(conn, statement).await.map(drop)
    }

    async fn parked_keys(conn: &mut Self::Conn) -> QueryResult<Vec<ParkedKeys>> {
        Self::load(
            conn,
            Sql::plain(
                "SELECT handler, count(*) AS `keys` FROM (SELECT DISTINCT handler, \
                 key_publisher, topic, ordering_key FROM tickbox_dead_letters \
                 WHERE ordering_key IS NOT NULL) parked GROUP BY handler ORDER BY handler",
            ),
        )
        .await
    }
}
