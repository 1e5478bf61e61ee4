//! PostgreSQL's ordering statements: the inbox guard's fixed-shape ones in
//! typed diesel, which keeps them prepared; the others are the defaults.

use crate::store::ordering::{
    advance_key_statement, start_key_statement, KeyScope, OrderingStatements,
};
use crate::store::postgres::Postgres;
use diesel::QueryResult;

impl OrderingStatements for Postgres {
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
        use diesel_async::RunQueryDsl;
        Ok(start_key_statement!(scope, sequence).execute(conn).await? == 1)
    }
}
